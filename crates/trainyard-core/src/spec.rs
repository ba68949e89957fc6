//! The `TrainingTask` document: one shape for the console, the CLI and the API, in YAML or JSON.
//!
//! The types here are plain data. Decoding (with every problem reported at once) lives in
//! [`crate::decode`] and [`crate::parse`](mod@crate::parse); the rules in
//! [`crate::validate`](mod@crate::validate). Serialisation uses serde with the same field names, so a task
//! written out reads back unchanged.

use crate::{decode_struct, string_enum};
use serde::Serialize;
use std::collections::BTreeMap;

/// The only `apiVersion` this version of Trainyard reads.
pub const API_VERSION: &str = "trainyard.dev/v1";
/// The only `kind` of document a task file holds.
pub const KIND: &str = "TrainingTask";

/// Defaults that the document may leave out. Each is a named constant so the docs and the console can
/// show them.
pub mod defaults {
    pub const PRIORITY: u32 = 5;
    pub const IMAGE_PULL_TOLERANCE: i64 = 3;
    pub const MAX_RESUBMISSIONS: u32 = 3;
    pub const EXIT_CHECKPOINT_TIMEOUT_S: u32 = 300;
    pub const PRECHECK_TIMEOUT_S: u32 = 300;
    pub const METRICS_INTERVAL_S: u32 = 15;
    pub const RAY_DEBUG_RETENTION_S: u32 = 600;
    pub const RAY_IDLE_TIMEOUT_S: u32 = 60;
}

string_enum! {
    /// What runs: a PyTorch job (1 master + N workers) or a Ray job (1 head + N workers + an entrypoint).
    pub enum TaskType {
        PyTorchJob = "PyTorchJob",
        RayJob = "RayJob",
    }
}

string_enum! {
    /// Which capacity the task runs on, and so how it is admitted and whether it can be preempted.
    pub enum ResourceType {
        /// The project group's reserved quota; never preempted by another group.
        Reserved = "Reserved",
        /// Pool capacity nobody reserved; not preempted.
        Ondemand = "Ondemand",
        /// Any free capacity; preempted first.
        Spot = "Spot",
        /// Capacity reserved by other groups and unused now; preempted when its owner needs it.
        Idle = "Idle",
    }
}

string_enum! {
    /// The signal sent to every replica's process group to ask for a checkpoint before exit.
    pub enum CheckpointSignal {
        Sigusr1 = "SIGUSR1",
        Sigusr2 = "SIGUSR2",
        Sigterm = "SIGTERM",
        Sigint = "SIGINT",
    }
}

string_enum! {
    /// How eagerly Ray's autoscaler adds workers.
    pub enum AutoscalingMode {
        Default = "Default",
        Aggressive = "Aggressive",
        Conservative = "Conservative",
    }
}

string_enum! {
    /// What an alarm subscription fires on.
    pub enum AlarmEvent {
        Failed = "failed",
        Succeeded = "succeeded",
        Stopped = "stopped",
        Preempted = "preempted",
        Resubmitted = "resubmitted",
        NodeReplaced = "nodeReplaced",
        PrecheckFailed = "precheckFailed",
        QueuedTooLong = "queuedTooLong",
    }
}

/// A training task document.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingTask {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: TaskSpec,
}
decode_struct!(TrainingTask {
    api_version: String = "apiVersion",
    kind: String = "kind",
    metadata: Metadata = "metadata",
    spec: TaskSpec = "spec",
});

/// Basic information: naming, ownership, visibility, labels.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// The platform appends a unique suffix to make the task name.
    pub name_prefix: String,
    pub project_group: String,
    /// Visible to the project group's members; otherwise only to the owner, admins and explicit shares.
    pub public: bool,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}
decode_struct!(Metadata {
    name_prefix: String = "namePrefix",
    project_group: String = "projectGroup",
    public: bool = "public" default false,
    labels: BTreeMap<String, String> = "labels",
    description: Option<String> = "description",
});

/// Everything about how the task runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    #[serde(rename = "type")]
    pub task_type: TaskType,
    pub placement: Placement,
    pub environment: Environment,
    pub compute: Compute,
    pub advanced: Advanced,
    /// PyTorchJob-only settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<PyTorchSettings>,
    /// RayJob-only settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ray: Option<RaySettings>,
}
decode_struct!(TaskSpec {
    task_type: TaskType = "type",
    placement: Placement = "placement",
    environment: Environment = "environment",
    compute: Compute = "compute",
    advanced: Advanced = "advanced" default Advanced::default(),
    pytorch: Option<PyTorchSettings> = "pytorch",
    ray: Option<RaySettings> = "ray",
});

/// Region and cluster: where the task runs, and so which pools, images and storage it can use.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Placement {
    pub region: String,
    pub cluster: String,
}
decode_struct!(Placement { region: String = "region", cluster: String = "cluster" });

/// The runtime environment of every replica.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Environment {
    /// A catalog image name (`host`, a registered image) or an image reference.
    pub image: String,
    pub env: Vec<EnvVar>,
    pub volumes: Vec<VolumeMount>,
    pub datasets: Vec<DatasetMount>,
    pub models: Vec<ModelMount>,
    /// Run with `bash -c`. For a RayJob, the entrypoint.
    pub cmd: String,
    /// The id of an uploaded working directory of the task's project group (`trainyard submit --workdir`
    /// uploads one and sets it): each replica starts in a read-write copy of it at `/workspace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}
decode_struct!(Environment {
    image: String = "image",
    env: Vec<EnvVar> = "env",
    volumes: Vec<VolumeMount> = "volumes",
    datasets: Vec<DatasetMount> = "datasets",
    models: Vec<ModelMount> = "models",
    cmd: String = "cmd",
    workdir: Option<String> = "workdir",
});

/// One environment variable. A hidden value is write-only: never shown back, never logged.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    pub hidden: bool,
}
decode_struct!(EnvVar {
    name: String = "name",
    value: String = "value",
    hidden: bool = "hidden" default false,
});

/// A storage volume mounted read-write (or read-only on request).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub volume: String,
    pub mount_path: String,
    pub read_only: bool,
}
decode_struct!(VolumeMount {
    volume: String = "volume",
    mount_path: String = "mountPath",
    read_only: bool = "readOnly" default false,
});

/// A dataset, always mounted read-only.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DatasetMount {
    pub dataset: String,
    pub mount_path: String,
    /// Present so that `readOnly: false` can be refused with a clear message rather than ignored.
    pub read_only: bool,
}
decode_struct!(DatasetMount {
    dataset: String = "dataset",
    mount_path: String = "mountPath",
    read_only: bool = "readOnly" default true,
});

/// A model, always mounted read-only.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelMount {
    pub model: String,
    pub mount_path: String,
    pub read_only: bool,
}
decode_struct!(ModelMount {
    model: String = "model",
    mount_path: String = "mountPath",
    read_only: bool = "readOnly" default true,
});

/// Compute resources: resource type, pool, replicas, instance specs, and how the task competes for them.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compute {
    pub resource_type: ResourceType,
    pub pool: String,
    /// PyTorchJob: workers beside the one master. RayJob: workers beside the one head (the starting count
    /// when autoscaling).
    pub workers: u32,
    /// Tried in order; the first that can be admitted wins.
    pub instance_specs: Vec<InstanceSpecChoice>,
    /// Only ever run on capacity that cannot be preempted.
    pub guarantee: bool,
    /// Orders tasks within the project group; higher first.
    pub priority: u32,
    /// Reserved only: let the part beyond the reserved quota run on idle capacity (preemptible).
    pub idle_supplement: bool,
}
decode_struct!(Compute {
    resource_type: ResourceType = "resourceType",
    pool: String = "pool",
    workers: u32 = "workers" default 0,
    instance_specs: Vec<InstanceSpecChoice> = "instanceSpecs",
    guarantee: bool = "guarantee" default false,
    priority: u32 = "priority" default defaults::PRIORITY,
    idle_supplement: bool = "idleSupplement" default false,
});

/// One instance spec and how many of it each replica takes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpecChoice {
    pub spec: String,
    pub count_per_node: u32,
}
decode_struct!(InstanceSpecChoice {
    spec: String = "spec",
    count_per_node: u32 = "countPerNode" default 1,
});

/// Advanced options.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advanced {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precheck: Option<Precheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_tolerance: Option<FaultTolerance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_checkpoint: Option<ExitCheckpoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsMonitor>,
    /// -1: never give up; 0: fail on the first failed pull; N: allow N retries with backoff.
    pub image_pull_tolerance: i64,
    pub passwordless_ssh: bool,
    pub alarms: Vec<AlarmSubscription>,
}
impl Default for Advanced {
    fn default() -> Self {
        Advanced {
            precheck: None,
            fault_tolerance: None,
            exit_checkpoint: None,
            metrics: None,
            image_pull_tolerance: defaults::IMAGE_PULL_TOLERANCE,
            passwordless_ssh: false,
            alarms: Vec::new(),
        }
    }
}
decode_struct!(Advanced {
    precheck: Option<Precheck> = "precheck",
    fault_tolerance: Option<FaultTolerance> = "faultTolerance",
    exit_checkpoint: Option<ExitCheckpoint> = "exitCheckpoint",
    metrics: Option<MetricsMonitor> = "metrics",
    image_pull_tolerance: i64 = "imagePullTolerance" default defaults::IMAGE_PULL_TOLERANCE,
    passwordless_ssh: bool = "passwordlessSsh" default false,
    alarms: Vec<AlarmSubscription> = "alarms",
});

/// Resource precheck (PyTorchJob): process-group init, GEMM and all-reduce checks before `cmd`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Precheck {
    pub enabled: bool,
    /// Extra variables for the precheck program only.
    pub env: Vec<EnvVar>,
    /// Fail when a GPU's GEMM throughput is below this, in TFLOP/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_gemm_tflops: Option<f64>,
    /// Fail when all-reduce bus bandwidth is below this, in GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_allreduce_gbps: Option<f64>,
    pub timeout_seconds: u32,
}
decode_struct!(Precheck {
    enabled: bool = "enabled" default true,
    env: Vec<EnvVar> = "env",
    min_gemm_tflops: Option<f64> = "minGemmTflops",
    min_allreduce_gbps: Option<f64> = "minAllreduceGbps",
    timeout_seconds: u32 = "timeoutSeconds" default defaults::PRECHECK_TIMEOUT_S,
});

/// Fault tolerance and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultTolerance {
    pub enabled: bool,
    /// Automatic resubmissions after a failure; 0 disables them. Manual resubmissions and restarts caused
    /// by node replacement do not count.
    pub max_resubmissions: u32,
    /// Exclude a node after a hardware-class failure and place the attempt again without it.
    pub node_replacement: bool,
}
decode_struct!(FaultTolerance {
    enabled: bool = "enabled" default true,
    max_resubmissions: u32 = "maxResubmissions" default defaults::MAX_RESUBMISSIONS,
    node_replacement: bool = "nodeReplacement" default true,
});

/// Exit checkpoint notification (PyTorchJob).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitCheckpoint {
    pub enabled: bool,
    /// How long to wait for every replica to report its checkpoint (or exit); at most 600.
    pub timeout_seconds: u32,
    pub signal: CheckpointSignal,
}
decode_struct!(ExitCheckpoint {
    enabled: bool = "enabled" default true,
    timeout_seconds: u32 = "timeoutSeconds" default defaults::EXIT_CHECKPOINT_TIMEOUT_S,
    signal: CheckpointSignal = "signal" default CheckpointSignal::Sigusr1,
});

/// Custom metrics scraped from the training code.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsMonitor {
    pub enabled: bool,
    pub endpoints: Vec<MetricsEndpoint>,
    pub interval_seconds: u32,
}
decode_struct!(MetricsMonitor {
    enabled: bool = "enabled" default true,
    endpoints: Vec<MetricsEndpoint> = "endpoints",
    interval_seconds: u32 = "intervalSeconds" default defaults::METRICS_INTERVAL_S,
});

/// One Prometheus endpoint in every replica.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct MetricsEndpoint {
    pub port: u32,
    pub path: String,
}
decode_struct!(MetricsEndpoint {
    port: u32 = "port",
    path: String = "path" default "/metrics".to_owned(),
});

/// An alarm subscription delivered by webhook.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AlarmSubscription {
    pub events: Vec<AlarmEvent>,
    pub webhook: String,
    /// For `queuedTooLong`: how long in the queue before it fires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_threshold_seconds: Option<u32>,
}
decode_struct!(AlarmSubscription {
    events: Vec<AlarmEvent> = "events",
    webhook: String = "webhook",
    queued_threshold_seconds: Option<u32> = "queuedThresholdSeconds",
});

/// PyTorchJob settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchSettings {
    /// Processes per replica for torchrun's `--nproc_per_node`; by default the replica's GPU count (1 on CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub procs_per_node: Option<u32>,
}
decode_struct!(PyTorchSettings {
    procs_per_node: Option<u32> = "procsPerNode",
});

/// RayJob settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RaySettings {
    pub head: RayHead,
    /// Ray's runtime env, as YAML text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_env_yaml: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_storage: Option<SharedStorage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug: Option<RayDebug>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
}
decode_struct!(RaySettings {
    head: RayHead = "head" default RayHead::default(),
    runtime_env_yaml: Option<String> = "runtimeEnvYaml",
    shared_storage: Option<SharedStorage> = "sharedStorage",
    debug: Option<RayDebug> = "debug",
    autoscaling: Option<Autoscaling> = "autoscaling",
});

/// The Ray head: always one replica.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RayHead {
    /// Defaults to the instance spec chosen for the workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_spec: Option<InstanceSpecChoice>,
}
decode_struct!(RayHead {
    instance_spec: Option<InstanceSpecChoice> = "instanceSpec",
});

/// One multi-pod read-write volume mounted at `/tmp/ray` in every replica.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedStorage {
    pub volume: String,
    /// Delete what this task wrote there when it ends.
    pub cleanup_on_exit: bool,
}
decode_struct!(SharedStorage {
    volume: String = "volume",
    cleanup_on_exit: bool = "cleanupOnExit" default false,
});

/// Keep the Ray cluster for a while after the job ends, for troubleshooting.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RayDebug {
    pub enabled: bool,
    pub retention_seconds: u32,
}
decode_struct!(RayDebug {
    enabled: bool = "enabled" default true,
    retention_seconds: u32 = "retentionSeconds" default defaults::RAY_DEBUG_RETENTION_S,
});

/// Ray autoscaling of the worker count.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    pub enabled: bool,
    pub min_workers: u32,
    pub max_workers: u32,
    pub idle_timeout_seconds: u32,
    pub mode: AutoscalingMode,
}
decode_struct!(Autoscaling {
    enabled: bool = "enabled" default true,
    min_workers: u32 = "minWorkers" default 0,
    max_workers: u32 = "maxWorkers",
    idle_timeout_seconds: u32 = "idleTimeoutSeconds" default defaults::RAY_IDLE_TIMEOUT_S,
    mode: AutoscalingMode = "mode" default AutoscalingMode::Default,
});

impl TrainingTask {
    /// Whether any env value (the task's or its precheck's) is hidden.
    pub fn has_hidden_values(&self) -> bool {
        let precheck = self.spec.advanced.precheck.iter().flat_map(|p| &p.env);
        self.spec.environment.env.iter().chain(precheck).any(|v| v.hidden)
    }

    /// A copy with every hidden env value replaced, for showing back to a person.
    pub fn masked(&self) -> TrainingTask {
        let mut t = self.clone();
        let mask = |vars: &mut Vec<EnvVar>| {
            for v in vars.iter_mut().filter(|v| v.hidden) {
                v.value = HIDDEN_VALUE_MASK.to_owned();
            }
        };
        mask(&mut t.spec.environment.env);
        if let Some(p) = t.spec.advanced.precheck.as_mut() {
            mask(&mut p.env);
        }
        t
    }
}

/// What a hidden value is shown as.
pub const HIDDEN_VALUE_MASK: &str = "******";

impl TaskSpec {
    /// Total replicas started at once: master + workers, or head + workers.
    pub fn replicas(&self) -> u32 {
        1 + self.compute.workers
    }
}
