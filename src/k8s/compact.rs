//! A compact, read-only string map for what the watch caches keep of every object (labels,
//! selectors, a few annotations). A `BTreeMap<String, String>` costs a 544-byte node however
//! few its entries, plus one allocation per key and per value: with thousands of workloads
//! that was most of what the caches held (`make bench`'s `cache_cost`). A [`StrMap`] keeps its
//! entries sorted by key in one string and their boundaries in one slice: two allocations
//! whatever its size, none when empty.

use std::collections::BTreeMap;
use std::fmt;

/// A sorted, immutable map of strings in two allocations (module docs). Built from any
/// iterator of pairs; a key given twice keeps its last value, as a `BTreeMap` would.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StrMap {
    /// Keys and values, one after the other, in the order of the keys.
    text: Box<str>,
    /// Where each key and each value ends in `text`: `ends[2i]` the end of key `i`,
    /// `ends[2i + 1]` the end of its value.
    ends: Box<[u32]>,
}

impl StrMap {
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The entries in the order of their keys.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, v) = self.entry(mid);
            match k.cmp(key) {
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The same entries as a `BTreeMap`, for the API types that want one.
    pub fn to_btree(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The same entries but those `keep` refuses.
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> Self {
        self.iter().filter(|(k, _)| keep(k)).collect()
    }

    fn entry(&self, i: usize) -> (&str, &str) {
        let start = if i == 0 {
            0
        } else {
            self.ends[2 * i - 1] as usize
        };
        let key_end = self.ends[2 * i] as usize;
        let end = self.ends[2 * i + 1] as usize;
        (&self.text[start..key_end], &self.text[key_end..end])
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for StrMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        let pairs: Vec<(K, V)> = pairs.into_iter().collect();
        if pairs.is_empty() {
            return Self::default();
        }
        let sorted: BTreeMap<&str, &str> = pairs
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .collect();
        let mut text = String::with_capacity(sorted.iter().map(|(k, v)| k.len() + v.len()).sum());
        let mut ends = Vec::with_capacity(2 * sorted.len());
        for (k, v) in &sorted {
            text.push_str(k);
            ends.push(offset(text.len()));
            text.push_str(v);
            ends.push(offset(text.len()));
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }
}

/// An offset into the text: a map's labels and annotations are far below 4 GiB (the API server
/// refuses an object over 1.5 MiB).
fn offset(n: usize) -> u32 {
    u32::try_from(n).expect("a map of strings under 4 GiB")
}

impl From<&BTreeMap<String, String>> for StrMap {
    fn from(m: &BTreeMap<String, String>) -> Self {
        m.iter().collect()
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for StrMap {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<BTreeMap<String, String>> for StrMap {
    fn from(m: BTreeMap<String, String>) -> Self {
        (&m).into()
    }
}

/// Printed as a map, as a `BTreeMap` would be (the fingerprints of the SpreadPolicy
/// controller's views hash their Debug form).
impl fmt::Debug for StrMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Something labels can be looked up in: a label selector matches either kind of map.
pub trait Lookup {
    fn lookup(&self, key: &str) -> Option<&str>;
}

impl Lookup for StrMap {
    fn lookup(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

impl Lookup for BTreeMap<String, String> {
    fn lookup(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_reads_back_what_it_was_built_from_in_key_order() {
        let m: StrMap = [("tier", "web"), ("app", "shop"), ("a", "")]
            .into_iter()
            .collect();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            [("a", ""), ("app", "shop"), ("tier", "web")]
        );
        assert_eq!(m.get("app"), Some("shop"));
        assert_eq!(m.get("a"), Some(""));
        assert_eq!(m.get("tie"), None);
        assert_eq!(m.get("zzz"), None);
        assert!(m.contains_key("tier"));
        assert_eq!(
            format!("{m:?}"),
            r#"{"a": "", "app": "shop", "tier": "web"}"#
        );
    }

    #[test]
    fn a_map_and_its_btreemap_agree() {
        let b: BTreeMap<String, String> = [("x".into(), "1".into()), ("ü".into(), "ß".into())]
            .into_iter()
            .collect();
        let m = StrMap::from(&b);
        assert_eq!(m.to_btree(), b);
        assert_eq!(format!("{m:?}"), format!("{b:?}"));
        assert_eq!(m.lookup("ü"), b.lookup("ü"));
        assert_eq!(m.filtered(|k| k == "x").to_btree().len(), 1);
    }

    #[test]
    fn an_empty_map_allocates_nothing_and_equals_the_default() {
        let m: StrMap = std::iter::empty::<(String, String)>().collect();
        assert_eq!(m, StrMap::default());
        assert!(m.is_empty());
        assert_eq!(m.iter().count(), 0);
        assert_eq!(m.get(""), None);
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value() {
        let m: StrMap = [("k", "1"), ("k", "2")].into_iter().collect();
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("k"), Some("2"));
    }
}
