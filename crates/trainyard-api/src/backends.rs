//! The backends this server can drive, as one type: the binary chooses one at start (`trainyard up
//! --backend`), and the control loop and the server hold it without generics over the backend (their futures
//! stay `Send`). The control crate knows only the trait.

use trainyard_kube::KubeFleet;
use trainyard_local::LocalBackend;
use trainyard_runtime::fake::FakeBackend;
use trainyard_runtime::{
    AttemptKey, Backend, BackendError, LaunchSpec, LogChunk, MetricPoint, Observation, StopCause,
};

/// Every backend this build has, as one type, so the control loop and the server need no generics over the
/// backend (and their futures stay `Send`).
#[derive(Debug, Clone)]
pub enum AnyBackend {
    Fake(FakeBackend),
    Local(LocalBackend),
    Kube(KubeFleet),
}

impl AnyBackend {
    /// This server stopped leading: what its backend holds in memory for the runs is let go. The fake
    /// backend's runs are dropped from this process (the next leader launches them again, or, in a fake
    /// cluster the servers share, finds them going on); the local
    /// backend's supervisors and the cluster's jobs run on, for the next leader to reattach to, and this
    /// server stops following their logs (the leader keeps them, in the store).
    pub fn stand_by(&self) {
        match self {
            AnyBackend::Fake(f) => f.abandon(),
            AnyBackend::Kube(k) => k.capture(false),
            AnyBackend::Local(_) => {}
        }
    }

    /// This server leads: the cluster's pods' logs and metrics are followed from where the last leader left
    /// them.
    pub fn lead(&self) {
        if let AnyBackend::Kube(k) = self {
            k.capture(true);
        }
    }

    /// The name shown to users (`trainyard up` prints it).
    pub fn name(&self) -> &'static str {
        match self {
            AnyBackend::Fake(_) => "fake",
            AnyBackend::Local(_) => "local",
            AnyBackend::Kube(_) => "kubernetes",
        }
    }

    /// The registry images this machine keeps (the local backend's cache; none elsewhere), most recently
    /// used first.
    pub fn cached_images(&self) -> Vec<trainyard_images::Cached> {
        match self {
            AnyBackend::Local(b) => b.cached_images(),
            _ => Vec::new(),
        }
    }

    /// Removes every cached image that no attempt runs or is about to run.
    pub fn prune_images(&self) -> trainyard_images::Collected {
        match self {
            AnyBackend::Local(b) => b.prune_images(),
            _ => trainyard_images::Collected::default(),
        }
    }
}

impl Backend for AnyBackend {
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        match self {
            AnyBackend::Fake(b) => b.launch(spec).await,
            AnyBackend::Local(b) => b.launch(spec).await,
            AnyBackend::Kube(b) => b.launch(spec).await,
        }
    }
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        match self {
            AnyBackend::Fake(b) => b.scale(spec).await,
            AnyBackend::Local(b) => b.scale(spec).await,
            AnyBackend::Kube(b) => b.scale(spec).await,
        }
    }
    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        match self {
            AnyBackend::Fake(b) => b.stop(key, cause).await,
            AnyBackend::Local(b) => b.stop(key, cause).await,
            AnyBackend::Kube(b) => b.stop(key, cause).await,
        }
    }
    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        match self {
            AnyBackend::Fake(b) => b.poll(now_ms).await,
            AnyBackend::Local(b) => b.poll(now_ms).await,
            AnyBackend::Kube(b) => b.poll(now_ms).await,
        }
    }
    fn admits(&self, catalog: &trainyard_core::Catalog, cluster: &str) -> bool {
        match self {
            AnyBackend::Fake(b) => b.admits(catalog, cluster),
            AnyBackend::Local(b) => b.admits(catalog, cluster),
            AnyBackend::Kube(b) => b.admits(catalog, cluster),
        }
    }
    async fn alive(&self) -> Vec<AttemptKey> {
        match self {
            AnyBackend::Fake(b) => b.alive().await,
            AnyBackend::Local(b) => b.alive().await,
            AnyBackend::Kube(b) => b.alive().await,
        }
    }
    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)> {
        match self {
            AnyBackend::Fake(b) => b.replicas(key).await,
            AnyBackend::Local(b) => b.replicas(key).await,
            AnyBackend::Kube(b) => b.replicas(key).await,
        }
    }
    async fn read_metrics(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint> {
        match self {
            AnyBackend::Fake(b) => b.read_metrics(key, since_ms).await,
            AnyBackend::Local(b) => b.read_metrics(key, since_ms).await,
            AnyBackend::Kube(b) => b.read_metrics(key, since_ms).await,
        }
    }
    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, max: usize) -> LogChunk {
        match self {
            AnyBackend::Fake(b) => b.read_log(key, replica, offset, max).await,
            AnyBackend::Local(b) => b.read_log(key, replica, offset, max).await,
            AnyBackend::Kube(b) => b.read_log(key, replica, offset, max).await,
        }
    }
}
