//! Everything that can go wrong in a RolloutStrategy reconcile, one variant per step, each with
//! the CamelCase reason used for Events and metrics. A hook that fails is not an error here: it
//! is a state the machine records.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the caches are not filled yet: {0}")]
    CacheNotReady(String),
    #[error("reading the strategy: {0}")]
    Read(#[source] kube::Error),
    #[error("observing the Deployment and hook Jobs: {0}")]
    Observe(#[source] kube::Error),
    #[error("updating the finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    #[error("writing the Deployment: {0}")]
    Deployment(#[source] kube::Error),
    #[error("the Deployment changed while it was written; trying again")]
    Conflict,
    /// The revision hold (config/admission) refused the manager's own unpause: either the API
    /// server has not seen the strategy's new phase yet (it clears up), or the manager runs
    /// under another identity than the one the hold exempts.
    #[error(
        "the revision hold refused to unpause the Deployment (is the manager's identity the one named in config/admission/revision_hold.yaml?): {0}"
    )]
    Held(String),
    /// The API server refused a write for good (a 4xx other than conflict or throttling).
    #[error("the API server refused a write (HTTP {code}): {message}")]
    Refused { code: u16, message: String },
    #[error("creating hook Job {job}: {source}")]
    CreateJob {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("building hook Job: {0}")]
    BuildJob(String),
    /// A webhook call the machine asked for could not be built: the spec changed between the
    /// decision and the write (the hook removed, its URL no longer allowed). Decided again on
    /// the next round, from the new spec.
    #[error("building the webhook call: {0}")]
    BuildCall(String),
    #[error("deleting hook Job {job}: {source}")]
    DeleteJob {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the annotations or labels of the strategy: {0}")]
    Annotation(#[source] kube::Error),
    #[error("updating status: {0}")]
    Status(#[source] kube::Error),
    #[error("reporting an unreadable strategy: {0}")]
    ReportInvalid(#[source] kube::Error),
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::CacheNotReady(_) => "CacheNotReady",
            Error::Read(_) => "ReadFailed",
            Error::Observe(_) => "ObserveFailed",
            Error::Finalizer(_) => "FinalizerUpdateFailed",
            Error::Deployment(_) => "DeploymentWriteFailed",
            Error::Conflict => "Conflict",
            Error::Held(_) => "HeldByAdmission",
            Error::Refused { .. } => "WriteRejected",
            Error::CreateJob { .. } => "JobCreateFailed",
            Error::BuildJob(_) => "JobBuildFailed",
            Error::BuildCall(_) => "WebhookCallBuildFailed",
            Error::DeleteJob { .. } => "JobDeleteFailed",
            Error::Annotation(_) => "AnnotationUpdateFailed",
            Error::Status(_) => "StatusUpdateFailed",
            Error::ReportInvalid(_) => "ReportInvalidFailed",
        }
    }
}

impl crate::controller::reconcile::ReconcileError for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }

    /// A conflict: the newer object is already on its way.
    fn is_stale(&self) -> bool {
        matches!(self, Error::Conflict)
    }
}
