//! The thin layer between the controllers and the API server: field-manager
//! names, server-side apply helpers, condition bookkeeping and the labels and
//! annotations ballast writes. Nothing here decides anything.

/// Implements `kube::Resource` for a type that stands for objects of kind `K` but keeps less of
/// them (a cache's trimmed object, a write's answer): its kind, group, version and plural are
/// `K`'s, its metadata is its own `metadata` field.
///
/// `resource_as!(Trimmed as Deployment)` for one kind; `resource_as!(<K> Partial<K>)` for a type
/// generic over the kind it stands for.
macro_rules! resource_as {
    (<$k:ident> $ty:ty) => {
        impl<$k: kube::Resource<DynamicType = ()>> kube::Resource for $ty {
            $crate::k8s::resource_as!(@body $k);
        }
    };
    ($ty:ty as $k:ty) => {
        impl kube::Resource for $ty {
            $crate::k8s::resource_as!(@body $k);
        }
    };
    (@body $k:ty) => {
        type DynamicType = ();
        type Scope = <$k as kube::Resource>::Scope;

        fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::kind(dt)
        }
        fn group(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::group(dt)
        }
        fn version(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::version(dt)
        }
        fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
            <$k as kube::Resource>::plural(dt)
        }
        fn meta(&self) -> &kube::api::ObjectMeta {
            &self.metadata
        }
        fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
            &mut self.metadata
        }
    };
}
pub(crate) use resource_as;

pub mod apply;
pub mod compact;
pub mod conditions;
pub mod decode;
pub mod digest;
pub mod finalizer;
pub mod lenient;
pub mod written;

/// Field manager of every write the SpreadPolicy controller makes.
pub const SPREAD_POLICY_MANAGER: &str = "ballast.dev/spread-policy";
/// Field manager of every write the RolloutStrategy controller makes.
pub const ROLLOUT_STRATEGY_MANAGER: &str = "ballast.dev/rollout-strategy";

/// The annotation `kubectl apply` (client-side) keeps a copy of the whole object in: no decision
/// reads it, and no cache keeps it.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A resourceVersion as a number, to tell which of two versions of one object is newer: etcd's
/// are numbers, but the API makes no promise, so one that is not compares nothing (`None`).
/// Both controllers remember the version their own writes were answered with this way.
pub fn version_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}
