//! Everything that can go wrong in a SpreadPolicy reconcile, one variant per
//! step, each with the CamelCase reason used for Events and metrics.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the caches are not filled yet: {0}")]
    CacheNotReady(String),
    #[error("the policy changed since it was read")]
    Stale,
    #[error("updating the finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    #[error("writing {workload}: {source}")]
    Write {
        workload: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing pod {pod}: {source}")]
    PodWrite {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating status: {0}")]
    Status(#[source] kube::Error),
    #[error("reporting an unreadable policy: {0}")]
    ReportInvalid(#[source] kube::Error),
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::CacheNotReady(_) => "CacheNotReady",
            Error::Stale => "Stale",
            Error::Finalizer(_) => "FinalizerUpdateFailed",
            Error::Write { .. } => "WriteFailed",
            Error::PodWrite { .. } => "PodWriteFailed",
            Error::Status(_) => "StatusUpdateFailed",
            Error::ReportInvalid(_) => "ReportInvalidFailed",
        }
    }
}

impl crate::controller::reconcile::ReconcileError for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }

    fn is_stale(&self) -> bool {
        matches!(self, Error::Stale)
    }
}
