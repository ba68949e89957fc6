//! The backend trait: what turns an admitted attempt into running replicas, stops them, and reports what
//! happened. One implementation per execution engine: `fake` (here: scripted, for tests and simulation),
//! `local` (sandboxed processes on this machine) and `kubernetes` (one PyTorchJob or RayJob object per
//! attempt) behind the same calls, so the control loop never knows which one runs.
//!
//! The contract, for every backend:
//! - Calls are keyed by [`AttemptKey`] and idempotent: launching a launched attempt or stopping a stopped one
//!   changes nothing, because the control loop repeats itself after a restart or a lost answer.
//! - Backends never decide: they run what was admitted and report [`Observation`]s in the order they
//!   happened; the control loop turns them into lifecycle transitions.
//! - `alive` lists what still runs, so a restarted control loop reattaches instead of starting twice.

#![forbid(unsafe_code)]

pub mod archive;
pub mod clock;
pub mod fake;
pub mod metrics;
pub mod replica;
pub mod ssh;

use serde::Serialize;
use trainyard_core::demand::Resources;
use trainyard_core::lifecycle::Reason;
use trainyard_core::spec::TrainingTask;

/// One attempt of one task.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct AttemptKey {
    pub task_id: String,
    pub attempt: i64,
}

/// One replica to start: its role, rank and node, and what it may use there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReplicaPlan {
    /// `master`, `worker` or `head`.
    pub role: String,
    /// Index within its role.
    pub index: u32,
    /// `RANK`: 0 for the master (or head), then the workers in order.
    pub rank: u32,
    pub node: String,
    pub resources: Resources,
}

/// Everything a backend needs to start an attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchSpec {
    pub key: AttemptKey,
    pub task_name: String,
    pub owner: String,
    pub task: TrainingTask,
    pub replicas: Vec<ReplicaPlan>,
    /// Which of the task's instance-spec choices (`compute.instanceSpecs`) the placement took.
    pub option: usize,
    /// The catalog at launch: images, volume, dataset and model homes, node devices.
    #[serde(skip)]
    pub catalog: std::sync::Arc<trainyard_core::Catalog>,
    /// Credentials for the registries the task's image comes from (opened from their sealed form for this
    /// launch; never written anywhere by a backend).
    #[serde(skip)]
    pub registry_logins: std::sync::Arc<std::collections::BTreeMap<String, RegistryLogin>>,
    /// With a working directory (`spec.environment.workdir`): the token with which this attempt's replicas
    /// fetch it from the server (a backend whose replicas cannot read the server's disk); never logged.
    #[serde(skip)]
    pub workdir_token: Option<Token>,
}

/// A credential a backend hands to a replica: shown as `Token(..)` wherever it would be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl LaunchSpec {
    /// The catalog entry of the instance spec the placement took, and how many units of it each replica has;
    /// None when the catalog no longer has it.
    pub fn instance_spec(&self) -> Option<(&trainyard_core::catalog::InstanceSpec, u32)> {
        let choice = self.task.spec.compute.instance_specs.get(self.option)?;
        Some((self.catalog.instance_specs.get(&choice.spec)?, choice.count_per_node.max(1)))
    }
}

/// A registry's basic credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryLogin {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryLogin({}, ****)", self.username)
    }
}

/// Why an attempt is being stopped; decides whether the exit checkpoint notice is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum StopCause {
    Preempted,
    UserStop,
    Deleted,
    NodeFailed,
}

/// Something that happened to an attempt, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Observation {
    /// Images are in place and processes are starting (or the precheck is).
    Started { key: AttemptKey, precheck: bool },
    /// The precheck passed; `cmd` runs now.
    PrecheckPassed { key: AttemptKey, message: String },
    /// Every replica ended: success, or a classified failure.
    Finished { key: AttemptKey, reason: Reason, message: String },
    /// A stop finished: every process of the attempt is gone and its resources are free. `cause` is the one
    /// the stop was asked with (None: not known, as for a stop recorded before causes were kept).
    Stopped { key: AttemptKey, cause: Option<StopCause>, message: String },
    /// An informative event (a figure, a step of a stop), with no change of status.
    Note { key: AttemptKey, reason: Reason, message: String },
    /// The attempt's replicas are not all running yet, and why, in the backend's words (a cluster's scheduler
    /// finding no room, a pull, a volume being attached): the task's wait while it starts. Each replaces the
    /// last; a backend says it again when the reason changes, never once the attempt has started.
    Waiting { key: AttemptKey, message: String },
    /// A node looks broken for this task (a failed precheck, a hardware error in a replica's log): with node
    /// replacement on, the next attempt avoids it.
    NodeSuspect { key: AttemptKey, node: String, message: String },
    /// An autoscaling RayJob has work waiting that about this many more workers would take.
    ScaleUp { key: AttemptKey, workers: u32, message: String },
    /// An autoscaling RayJob's worker has been idle past the idle timeout.
    ScaleDown { key: AttemptKey, replica: String, message: String },
}

impl Observation {
    pub fn key(&self) -> &AttemptKey {
        match self {
            Observation::Started { key, .. }
            | Observation::PrecheckPassed { key, .. }
            | Observation::Finished { key, .. }
            | Observation::Stopped { key, .. }
            | Observation::Note { key, .. }
            | Observation::Waiting { key, .. }
            | Observation::NodeSuspect { key, .. }
            | Observation::ScaleUp { key, .. }
            | Observation::ScaleDown { key, .. } => key,
        }
    }
}

/// A backend could not take a request (the request itself was fine: it is retried on the next tick).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError(pub String);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackendError {}

/// An execution engine.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// Starts every replica of the attempt. Idempotent.
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError>;
    /// Makes a running attempt's replicas those of `spec` (autoscaling): starts the new ones, stops the ones
    /// no longer listed. Idempotent.
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError>;
    /// Starts the stop path (checkpoint notice when enabled, then termination). Idempotent.
    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError>;
    /// What happened since the last call, in order. `now_ms` is the control loop's clock.
    async fn poll(&self, now_ms: u64) -> Vec<Observation>;
    /// Attempts that still hold processes or resources.
    async fn alive(&self) -> Vec<AttemptKey>;
    /// The replicas of an attempt, as (name, role), for as long as its logs are kept.
    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)>;
    /// A replica's log from byte `offset`, at most `max` bytes.
    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, max: usize) -> LogChunk;
    /// The metrics samples of an attempt's replicas taken after `since_ms`, oldest first per replica.
    async fn read_metrics(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint>;
    /// Whether the backend's cluster admits the tasks placed on catalog cluster `cluster` itself (Kueue, or
    /// Volcano's gang admission): Trainyard then admits them once, without its quota or placement, launches
    /// them unplaced and shows the cluster's wait as theirs. None do by default.
    fn admits(&self, _catalog: &trainyard_core::Catalog, _cluster: &str) -> bool {
        false
    }
}

/// One metrics sample of one replica: a preset resource metric (`trainyard_*`) or a scraped one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricPoint {
    pub replica: String,
    pub at_ms: u64,
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: f64,
}

/// Part of a replica's log: lines as `TIMESTAMP O|E TEXT` (stdout or stderr).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LogChunk {
    pub data: Vec<u8>,
    /// Where the next read starts.
    pub next: u64,
    /// The replica has ended: nothing more will be written.
    pub ended: bool,
    /// There is no such replica (or its log was never written).
    pub missing: bool,
}
