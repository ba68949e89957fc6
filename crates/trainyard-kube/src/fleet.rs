//! Several Kubernetes clusters behind one backend: each catalog cluster names the kubeconfig context that
//! reaches it (`clusters: {gpu-east: {region: east, context: east-admin}}`), and a cluster that names none is
//! the default context's (`--kube-context`, else the kubeconfig's current one). One [`KubeBackend`] per context;
//! an attempt is launched where its task is placed, and everything else about it goes to the member whose
//! watches know it. The members share the data dir (an attempt's logs and metrics are its own files).

use super::backend::KubeBackend;
use trainyard_core::Catalog;
use trainyard_runtime::{
    AttemptKey, Backend, BackendError, LaunchSpec, LogChunk, MetricPoint, Observation, StopCause,
};

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct KubeFleet {
    /// The default context's backend first, then one per other context named in the catalog.
    members: Vec<KubeBackend>,
}

impl KubeFleet {
    /// One cluster: every catalog cluster is the default context's.
    pub fn single(backend: KubeBackend) -> KubeFleet {
        KubeFleet { members: vec![backend] }
    }

    /// The default context's backend, then the others.
    pub fn new(default: KubeBackend, others: Vec<KubeBackend>) -> KubeFleet {
        KubeFleet { members: std::iter::once(default).chain(others).collect() }
    }

    /// The members, the default one first.
    pub fn members(&self) -> &[KubeBackend] {
        &self.members
    }

    /// Whether this server follows and scrapes the pods of every cluster ([`KubeBackend::capture`]).
    pub fn capture(&self, on: bool) {
        for m in &self.members {
            m.capture(on);
        }
    }

    /// The contexts the catalog's clusters name beyond the default one (what [`KubeFleet::new`] needs).
    pub fn other_contexts(catalog: &Catalog, default: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = catalog
            .clusters
            .values()
            .filter_map(|c| c.context.clone())
            .filter(|c| Some(c.as_str()) != default)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Which member serves a catalog cluster: the one whose context it names; the default one when it names
    /// none or the default's. None: it names a context this server did not connect to.
    pub fn member_of(&self, catalog: &Catalog, cluster: &str) -> Option<usize> {
        let Some(context) = catalog.clusters.get(cluster).and_then(|c| c.context.as_deref()) else {
            return Some(0);
        };
        if self.members[0].context() == Some(context) {
            return Some(0);
        }
        self.members.iter().position(|m| m.context() == Some(context))
    }

    fn for_cluster(&self, spec: &LaunchSpec) -> Result<&KubeBackend, BackendError> {
        let cluster = &spec.task.spec.placement.cluster;
        match self.member_of(&spec.catalog, cluster) {
            Some(i) => Ok(&self.members[i]),
            None => Err(BackendError(format!(
                "cluster {cluster} names the kubeconfig context {:?}, which this server has not connected to \
                 (contexts are connected when Trainyard starts: restart it after adding one)",
                spec.catalog.clusters.get(cluster).and_then(|c| c.context.clone()).unwrap_or_default()
            ))),
        }
    }

    /// The backend that knows an attempt (its watches saw its objects, or it launched it), else the default.
    fn for_key(&self, key: &AttemptKey) -> &KubeBackend {
        self.members.iter().find(|b| b.knows(key)).unwrap_or(&self.members[0])
    }
}

impl Backend for KubeFleet {
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        self.for_cluster(spec)?.launch(spec).await
    }

    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        self.for_cluster(spec)?.scale(spec).await
    }

    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        self.for_key(key).stop(key, cause).await
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        let mut out = Vec::new();
        for m in &self.members {
            out.extend(m.poll(now_ms).await);
        }
        out
    }

    fn admits(&self, catalog: &Catalog, cluster: &str) -> bool {
        self.member_of(catalog, cluster)
            .and_then(|i| self.members.get(i))
            .is_some_and(|m| m.admits(catalog, cluster))
    }

    async fn alive(&self) -> Vec<AttemptKey> {
        let mut out = Vec::new();
        for m in &self.members {
            out.extend(m.alive().await);
        }
        out
    }

    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)> {
        self.for_key(key).replicas(key).await
    }

    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, max: usize) -> LogChunk {
        self.for_key(key).read_log(key, replica, offset, max).await
    }

    async fn read_metrics(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint> {
        self.for_key(key).read_metrics(key, since_ms).await
    }
}
