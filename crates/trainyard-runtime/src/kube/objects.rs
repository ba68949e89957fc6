//! What an admitted attempt is on Kubernetes: a pure function from a [`LaunchSpec`] to the objects to apply
//! (one `kubeflow.org/v1` PyTorchJob or `ray.io/v1` RayJob, the attempt's Secrets, a Service for the
//! precheck, a Volcano PodGroup). No IO: the client side applies them with server-side apply.
//!
//! The same semantics as the local backend, mapped onto what the operators do themselves:
//! - Names: the job is [`job_name`]; the training operator names pods and their headless Services
//!   `<job>-master-0` and `<job>-worker-<i>`; KubeRay names its RayCluster `<job>-<5 chars>`.
//! - Env: the platform variables of [`trainyard_core::platform_env`] that no operator sets. The training
//!   operator (v1.9.x, `pkg/controller.v1/pytorch/envvar.go` and `master.go`) sets in every container of
//!   every replica: `MASTER_ADDR` and `PET_MASTER_ADDR` (`<job>-master-0`), `MASTER_PORT` and
//!   `PET_MASTER_PORT` (the `pytorchjob-port` of the `pytorch` container), `WORLD_SIZE` (replicas ×
//!   `spec.nprocPerNode` when that is a number), `RANK` and `PET_NODE_RANK` (0 for the master, index + 1 for
//!   workers), `PET_NNODES` (replicas), `PET_NPROC_PER_NODE` (`spec.nprocPerNode`, defaulted to `auto`) and
//!   `PYTHONUNBUFFERED`. We never list those names. KubeRay sets `RAY_ADDRESS` in Ray containers and hands the
//!   runtime env to `ray job submit`, so `RAY_ADDRESS` and `RAY_JOB_CONFIG_JSON_ENV_VAR` are not ours either.
//!   `HOSTNAME` is the pod's name (the container runtime sets it) and `CUDA_VISIBLE_DEVICES` is left to the
//!   GPU device plugin, which shows each container only its own GPUs.
//! - Hidden values never appear in the job: they are in the attempt's Secret, read through `secretKeyRef`.
//! - The precheck is an init container; the exit checkpoint is a `preStop` hook; both run the local
//!   backend's programs and protocol (see [`precheck_container`] and [`pre_stop_script`]).

use crate::{AttemptKey, LaunchSpec, ReplicaPlan};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use trainyard_core::platform_env as pe;
use trainyard_core::spec::{CheckpointSignal, TaskSpec, TaskType};

/// Labels every object Trainyard makes carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "trainyard";
pub const TASK_LABEL: &str = "trainyard.dev/task";
pub const ATTEMPT_LABEL: &str = "trainyard.dev/attempt";
pub const GROUP_LABEL: &str = "trainyard.dev/group";
/// The replica's role (`master`, `worker`, `head`) on pod templates.
pub const ROLE_LABEL: &str = "trainyard.dev/role";
/// The raw task id and group, when the label value had to be changed to be valid.
pub const TASK_ID_ANNOTATION: &str = "trainyard.dev/task-id";
pub const GROUP_ANNOTATION: &str = "trainyard.dev/group-name";
/// For a watcher that rebuilds its view from the API server: the task's name and its image pull tolerance.
pub const TASK_NAME_ANNOTATION: &str = "trainyard.dev/task-name";
pub const PULL_TOLERANCE_ANNOTATION: &str = "trainyard.dev/image-pull-tolerance";
/// On pod templates: the custom metrics endpoints (JSON `[{"port":8000,"path":"/metrics"}]`) and how often
/// to scrape them, for the watcher that scrapes through the API server's pod proxy.
pub const METRICS_ANNOTATION: &str = "trainyard.dev/metrics-endpoints";
pub const METRICS_INTERVAL_ANNOTATION: &str = "trainyard.dev/metrics-interval-s";

/// Selects every object Trainyard made.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=trainyard";
/// Which Trainyard server made an object: two servers on one cluster (staging and production, or tests
/// running side by side) each watch and manage only their own objects.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Selects every object the Trainyard server named `instance` made.
pub fn instance_selector(instance: &str) -> String {
    format!("{MANAGED_SELECTOR},{INSTANCE_LABEL}={}", label_value(instance))
}

/// Kueue's queue label and Volcano's pod group annotation.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";

/// The training operator's pod labels (v1.9.x `pkg/apis/kubeflow.org/v1/common_types.go`).
pub const KF_JOB_NAME_LABEL: &str = "training.kubeflow.org/job-name";
pub const KF_REPLICA_TYPE_LABEL: &str = "training.kubeflow.org/replica-type";
pub const KF_REPLICA_INDEX_LABEL: &str = "training.kubeflow.org/replica-index";

/// The longest job name: KubeRay refuses RayJob names over 47 characters (`MaxRayJobNameLength`, its
/// RayCluster adds `-xxxxx`), and `<job>-worker-4094` (the most workers a task may have) then stays within a
/// 63-character DNS label, as pod and Service names must.
pub const JOB_NAME_MAX: usize = 47;

/// The runtime dir inside every replica: the same path as on the local backend, an `emptyDir` here shared
/// by the init container, the command and the `preStop` hook (the checkpoint files live there).
pub const RUNTIME_DIR: &str = crate::local::sandbox::RUNTIME_DIR;
/// The PyTorch master's port, as on the local backend: declared as the `pytorchjob-port` of the `pytorch`
/// container, from which the operator sets `MASTER_PORT`.
pub const MASTER_PORT: u16 = crate::local::MASTER_PORT;
/// Where the SSH Secret is mounted.
pub const SSH_DIR: &str = "/etc/trainyard/ssh";

/// Cluster-side gang admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Gang {
    /// Trainyard's scheduler is the only admitter: pods go straight to the default scheduler.
    #[default]
    Off,
    /// A Volcano PodGroup with `minMember` = every replica; pods scheduled by Volcano.
    Volcano { queue: Option<String> },
    /// Kueue admits the job from this LocalQueue (the job is created suspended, Kueue unsuspends it).
    Kueue { local_queue: String },
}

/// How attempts map onto one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// Namespace of the attempt (the caller resolves it per project group).
    pub namespace: String,
    /// The server's instance name (the `app.kubernetes.io/instance` label of its objects).
    pub instance: String,
    pub gang: Gang,
    /// Catalog image name -> the OCI reference pods pull in this cluster, over the catalog image's own
    /// `reference` (a cluster may pull the same image through a registry of its own). An image name that is
    /// not a catalog entry is an image reference already and is pulled as it is.
    pub images: BTreeMap<String, String>,
    /// Between SIGTERM and SIGKILL (after the exit checkpoint, when there is one), as the local backend's
    /// `grace_s`.
    pub grace_s: u64,
    /// How long a finished PyTorchJob and its pods are kept (`runPolicy.ttlSecondsAfterFinished`), for the
    /// logs and for debugging (running ones are deleted when the job ends: `cleanPodPolicy: Running`); 0
    /// deletes every pod when the job ends (`cleanPodPolicy: All`).
    pub keep_finished_s: u32,
}

impl Default for KubeSettings {
    fn default() -> KubeSettings {
        KubeSettings {
            namespace: "default".into(),
            instance: "trainyard".into(),
            gang: Gang::Off,
            images: BTreeMap::new(),
            grace_s: 5,
            keep_finished_s: 600,
        }
    }
}

/// The attempt's passwordless SSH keys (the caller generates them, once per attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshKeys {
    /// The replicas' identity: OpenSSH private key text and its `.pub` line.
    pub private_key: String,
    pub public_key: String,
    /// Every replica's sshd host key (OpenSSH private key text).
    pub host_key: String,
}

/// Everything to apply for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptObjects {
    /// `kubeflow.org/v1` PyTorchJob or `ray.io/v1` RayJob.
    pub job: Value,
    /// `v1` Secret with the attempt's hidden env values (None if none).
    pub secret: Option<Value>,
    /// Passwordless SSH keys and configuration, when the task asks for SSH.
    pub ssh_secret: Option<Value>,
    /// `scheduling.volcano.sh/v1beta1` PodGroup when gang = Volcano.
    pub pod_group: Option<Value>,
    /// A headless `v1` Service publishing the master before it is ready, for the precheck (see
    /// [`precheck_service_name`]); None without a precheck.
    pub precheck_service: Option<Value>,
}

impl AttemptObjects {
    /// Every object, the job last (what it references exists when its pods start).
    pub fn all(&self) -> Vec<&Value> {
        let mut v: Vec<&Value> = [&self.secret, &self.ssh_secret, &self.pod_group, &self.precheck_service]
            .into_iter()
            .flatten()
            .collect();
        v.push(&self.job);
        v
    }
}

/// The job's name: `ty-<task>-a<attempt>`, a DNS-1035 label (a letter first, as Service and RayCluster names
/// need) of at most [`JOB_NAME_MAX`] characters. A task id that is not already lowercase letters, digits and
/// dashes, or is too long, is shortened and followed by a hash of the whole id, so that names stay distinct.
pub fn job_name(key: &AttemptKey) -> String {
    let attempt = format!("-a{}", key.attempt.max(0));
    let budget = JOB_NAME_MAX - "ty-".len() - attempt.len();
    let clean: String = key
        .task_id
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' })
        .collect();
    let clean = collapse_dashes(&clean);
    let id = if clean == key.task_id && !clean.is_empty() && clean.len() <= budget {
        clean
    } else {
        let hash = format!("{:08x}", fnv1a(key.task_id.as_bytes()) as u32);
        let keep = budget - hash.len() - 1;
        let head: String = clean.chars().take(keep).collect();
        let head = head.trim_end_matches('-');
        if head.is_empty() { hash } else { format!("{head}-{hash}") }
    };
    format!("ty-{id}{attempt}")
}

/// Selects one attempt's objects (its job, Secrets, pod group, and the pods the operators make from them).
pub fn attempt_selector(key: &AttemptKey) -> String {
    format!(
        "{MANAGED_SELECTOR},{TASK_LABEL}={},{ATTEMPT_LABEL}={}",
        label_value(&key.task_id),
        label_value(&key.attempt.to_string())
    )
}

/// The Secret with the attempt's hidden values.
pub fn env_secret_name(job: &str) -> String {
    format!("{job}-env")
}

/// The Secret with the attempt's SSH keys.
pub fn ssh_secret_name(job: &str) -> String {
    format!("{job}-ssh")
}

/// The precheck's rendezvous address. The operator's per-pod Services are headless without
/// `publishNotReadyAddresses`, so `<job>-master-0` only resolves once the master pod is Ready, which is
/// after its init containers: a precheck in init containers rendezvousing there would wait for itself.
/// This Service selects the same pod and publishes it as soon as it has an address.
pub fn precheck_service_name(job: &str) -> String {
    format!("{job}-precheck")
}

/// The objects of one admitted attempt, or every reason it cannot be mapped.
pub fn attempt_objects(
    spec: &LaunchSpec,
    s: &KubeSettings,
    ssh: Option<&SshKeys>,
) -> Result<AttemptObjects, Vec<String>> {
    let mut problems = Vec::new();
    let task = &spec.task.spec;
    let name = job_name(&spec.key);
    let image = resolve_image(spec, s).map_err(|e| problems.push(e)).ok();
    let ssh_keys = match (task.advanced.passwordless_ssh, ssh) {
        (true, None) => {
            problems.push("passwordless SSH is on but no SSH keys were given".to_owned());
            None
        }
        (true, Some(k)) => Some(k),
        (false, _) => None,
    };
    for (what, claim) in claims(task) {
        if !is_dns_subdomain(claim) {
            problems.push(format!(
                "{what} {claim:?}: a catalog entry's name is its PersistentVolumeClaim's name, and this one is \
                 not a valid Kubernetes name (lowercase letters, digits, '-' and '.')"
            ));
        }
    }
    let lead = if task.task_type == TaskType::RayJob { "head" } else { "master" };
    let by_role = group_replicas(&spec.replicas);
    match by_role.get(lead).map(Vec::len) {
        Some(1) => {}
        n => {
            problems.push(format!("the attempt needs exactly one {lead} replica, it has {}", n.unwrap_or(0)))
        }
    }
    for (role, rs) in &by_role {
        if role != lead && role != "worker" {
            problems.push(format!("replica role {role:?} is neither {lead} nor worker"));
        }
        if rs.iter().any(|r| r.resources != rs[0].resources) {
            problems.push(format!(
                "the {role} replicas differ in resources, but one pod template holds every replica of a role"
            ));
        }
    }
    let Some(image) = image.filter(|_| problems.is_empty()) else { return Err(problems) };

    let ctx = Ctx { spec, s, name: &name, image, ssh: ssh_keys.is_some(), by_role: &by_role };
    let job = match task.task_type {
        TaskType::PyTorchJob => ctx.pytorch_job(),
        TaskType::RayJob => ctx.ray_job(),
    };
    let secret = ctx.env_secret();
    let ssh_secret = ssh_keys.map(|k| ctx.ssh_secret(k));
    let pod_group = match &s.gang {
        Gang::Volcano { queue } => Some(ctx.pod_group(queue.as_deref())),
        _ => None,
    };
    let precheck_service = ctx.precheck().map(|_| ctx.precheck_service());
    Ok(AttemptObjects { job, secret, ssh_secret, pod_group, precheck_service })
}

/// The OCI reference of the task's image.
fn resolve_image(spec: &LaunchSpec, s: &KubeSettings) -> Result<String, String> {
    let image = &spec.task.spec.environment.image;
    if let Some(reference) = s.images.get(image) {
        return Ok(reference.clone());
    }
    if image == trainyard_core::catalog::HOST_IMAGE {
        return Err("the `host` image is this machine's own system: it does not exist in a cluster".into());
    }
    if let Some(reference) = spec.catalog.images.get(image).and_then(|i| i.reference.as_ref()) {
        return Ok(reference.clone());
    }
    if spec.catalog.images.contains_key(image) {
        return Err(format!(
            "catalog image {image:?} has no image reference (its catalog entry's `reference`, or this cluster's Kubernetes settings)"
        ));
    }
    Ok(image.clone())
}

/// Every PVC the task mounts, as (what, claim name).
fn claims(task: &TaskSpec) -> Vec<(&'static str, &str)> {
    let env = &task.environment;
    let mut out: Vec<(&'static str, &str)> = Vec::new();
    out.extend(env.volumes.iter().map(|v| ("volume", v.volume.as_str())));
    out.extend(env.datasets.iter().map(|d| ("dataset", d.dataset.as_str())));
    out.extend(env.models.iter().map(|m| ("model", m.model.as_str())));
    if let Some(sh) = task.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
        out.push(("volume", sh.volume.as_str()));
    }
    out
}

/// Replicas by role, each in index order.
fn group_replicas(replicas: &[ReplicaPlan]) -> BTreeMap<String, Vec<&ReplicaPlan>> {
    let mut by: BTreeMap<String, Vec<&ReplicaPlan>> = BTreeMap::new();
    for r in replicas {
        by.entry(r.role.clone()).or_default().push(r);
    }
    for rs in by.values_mut() {
        rs.sort_by_key(|r| r.index);
    }
    by
}

/// Where one env variable's value comes from.
enum Source {
    Value(String),
    /// A key of the attempt's env Secret.
    Secret(String),
    /// A field of the pod (`metadata.name`, `spec.nodeName`, a label).
    Field(String),
}

/// An env list where the last value of a name wins (as inside the local sandbox), in first-seen order.
#[derive(Default)]
struct Env(Vec<(String, Source)>);

impl Env {
    fn set(&mut self, name: &str, src: Source) {
        self.0.retain(|(n, _)| n != name);
        self.0.push((name.to_owned(), src));
    }
    fn value(&mut self, name: &str, v: impl Into<String>) {
        self.set(name, Source::Value(v.into()));
    }
    fn render(&self, secret: &str) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|(n, src)| match src {
                    Source::Value(v) => json!({"name": n, "value": v}),
                    Source::Secret(key) => {
                        json!({"name": n, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
                    }
                    Source::Field(path) => json!({"name": n, "valueFrom": {"fieldRef": {"fieldPath": path}}}),
                })
                .collect(),
        )
    }
}

/// The Secret key of a hidden task variable and of a hidden precheck variable (they may share a name).
fn env_key(name: &str) -> String {
    format!("env.{name}")
}
fn precheck_key(name: &str) -> String {
    format!("precheck.{name}")
}

struct Ctx<'a> {
    spec: &'a LaunchSpec,
    s: &'a KubeSettings,
    name: &'a str,
    image: String,
    ssh: bool,
    by_role: &'a BTreeMap<String, Vec<&'a ReplicaPlan>>,
}

impl Ctx<'_> {
    fn task(&self) -> &TaskSpec {
        &self.spec.task.spec
    }

    /// The labels of every object of the attempt.
    fn labels(&self) -> serde_json::Map<String, Value> {
        let key = &self.spec.key;
        let group = &self.spec.task.metadata.project_group;
        let mut m = serde_json::Map::new();
        m.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        m.insert(INSTANCE_LABEL.into(), label_value(&self.s.instance).into());
        m.insert(TASK_LABEL.into(), label_value(&key.task_id).into());
        m.insert(ATTEMPT_LABEL.into(), label_value(&key.attempt.to_string()).into());
        m.insert(GROUP_LABEL.into(), label_value(group).into());
        m
    }

    fn annotations(&self) -> serde_json::Map<String, Value> {
        let key = &self.spec.key;
        let group = &self.spec.task.metadata.project_group;
        let mut m = serde_json::Map::new();
        if label_value(&key.task_id) != key.task_id {
            m.insert(TASK_ID_ANNOTATION.into(), key.task_id.clone().into());
        }
        if label_value(group) != *group {
            m.insert(GROUP_ANNOTATION.into(), group.clone().into());
        }
        m
    }

    fn metadata(&self, name: &str) -> Value {
        let mut md = json!({"name": name, "namespace": self.s.namespace, "labels": self.labels()});
        let ann = self.annotations();
        if !ann.is_empty() {
            md["annotations"] = Value::Object(ann);
        }
        md
    }

    fn pytorch_job(&self) -> Value {
        let mut specs = serde_json::Map::new();
        for (role, kind) in [("master", "Master"), ("worker", "Worker")] {
            let Some(rs) = self.by_role.get(role) else { continue };
            specs.insert(
                kind.into(),
                json!({"replicas": rs.len(), "restartPolicy": "Never", "template": self.pod_template(role, rs)}),
            );
        }
        let mut run_policy = json!({
            // Finished pods stay while the job is kept (their logs, `kubectl exec` for debugging).
            // Replicas still running when the job ends (a worker failed) are deleted at once; ended ones are
            // kept until the TTL, for their logs.
            "cleanPodPolicy": if self.s.keep_finished_s > 0 { "Running" } else { "All" },
            "ttlSecondsAfterFinished": self.s.keep_finished_s,
            // Trainyard's fault tolerance resubmits; the operator never restarts a replica.
            "backoffLimit": 0,
        });
        if matches!(self.s.gang, Gang::Kueue { .. }) {
            run_policy["suspend"] = true.into();
        }
        json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": self.job_metadata(),
            "spec": {
                "pytorchReplicaSpecs": specs,
                "runPolicy": run_policy,
                // Always a number: the operator's default, `auto`, is every CPU on a CPU-only node.
                "nprocPerNode": self.nproc().to_string(),
            }
        })
    }

    /// torchrun's processes per replica, as on the local backend: the task's, else the replica's GPUs (1 on
    /// CPU).
    fn nproc(&self) -> u32 {
        let gpus = self.by_role.get("master").and_then(|r| r.first()).map_or(0, |r| r.resources.gpus);
        self.task().pytorch.as_ref().and_then(|p| p.procs_per_node).unwrap_or(gpus.max(1) as u32).max(1)
    }

    fn job_metadata(&self) -> Value {
        let mut md = self.metadata(self.name);
        let a = &mut md["annotations"];
        if a.is_null() {
            *a = json!({});
        }
        a[TASK_NAME_ANNOTATION] = self.spec.task_name.clone().into();
        a[PULL_TOLERANCE_ANNOTATION] = self.task().advanced.image_pull_tolerance.to_string().into();
        if let Gang::Kueue { local_queue } = &self.s.gang {
            md["labels"][KUEUE_QUEUE_LABEL] = local_queue.clone().into();
        }
        md
    }

    fn ray_job(&self) -> Value {
        let task = self.task();
        let ray = task.ray.clone().unwrap_or_default();
        let head = self.by_role.get("head").map(Vec::as_slice).unwrap_or_default();
        let workers = self.by_role.get("worker").map(Vec::as_slice).unwrap_or_default();
        let n = workers.len();
        let keep_s = ray.debug.as_ref().filter(|d| d.enabled).map_or(0, |d| d.retention_seconds);
        let mut spec = json!({
            "entrypoint": format!("bash -c {}", shell_quote(&task.environment.cmd)),
            // HTTPMode: the operator submits the entrypoint to the head's job API itself, so the attempt is
            // exactly the pods Trainyard placed and admitted (K8sJobMode adds a submitter pod outside the
            // admission, 500m CPU and 256Mi placed by the cluster; SidecarMode grows the head pod by as
            // much). The driver's output stays in the Ray cluster's job logs (the dashboard's job API).
            "submissionMode": "HTTPMode",
            "shutdownAfterJobFinishes": true,
            // Debug mode keeps the Ray cluster for its retention after the entrypoint ended.
            "ttlSecondsAfterFinished": keep_s,
            "rayClusterSpec": {
                // Trainyard's scheduler scales the workers (it admits every one), so Ray's autoscaler is off
                // and the group's bounds are the count Trainyard decided.
                "enableInTreeAutoscaling": false,
                "headGroupSpec": {
                    "rayStartParams": {"dashboard-host": "0.0.0.0"},
                    "template": self.pod_template("head", head),
                },
                "workerGroupSpecs": [{
                    "groupName": "worker",
                    "replicas": n,
                    "minReplicas": n,
                    "maxReplicas": n,
                    "rayStartParams": {},
                    "template": self.pod_template("worker", workers),
                }],
            },
        });
        if let Some(text) = ray.runtime_env_yaml.as_ref().filter(|t| !t.trim().is_empty()) {
            spec["runtimeEnvYAML"] = text.clone().into();
        }
        if matches!(self.s.gang, Gang::Kueue { .. }) {
            spec["suspend"] = true.into();
        }
        json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": self.job_metadata(), "spec": spec})
    }

    /// The pod template of every replica of `role` (identical replicas share it).
    fn pod_template(&self, role: &str, replicas: &[&ReplicaPlan]) -> Value {
        let task = self.task();
        let ray = task.task_type == TaskType::RayJob;
        let mut labels = self.labels();
        for (k, v) in &self.spec.task.metadata.labels {
            if is_label_key(k) && is_label_value(v) && !reserved_label(k) {
                labels.insert(k.clone(), v.clone().into());
            }
        }
        labels.insert(ROLE_LABEL.into(), role.into());
        let mut annotations = self.annotations();
        if let Some(m) = task.advanced.metrics.as_ref().filter(|m| m.enabled && !m.endpoints.is_empty()) {
            let eps: Vec<Value> =
                m.endpoints.iter().map(|e| json!({"port": e.port, "path": e.path})).collect();
            annotations.insert(METRICS_ANNOTATION.into(), Value::Array(eps).to_string().into());
            annotations.insert(METRICS_INTERVAL_ANNOTATION.into(), m.interval_seconds.to_string().into());
        }
        let mut pod = json!({
            "restartPolicy": "Never",
            "containers": [self.main_container(role, replicas)],
            "volumes": self.volumes(),
        });
        // Trainyard's scheduler chose the nodes: the pods of this role go to those and no others.
        let nodes: BTreeSet<&str> = replicas.iter().map(|r| r.node.as_str()).collect();
        if !nodes.is_empty() {
            pod["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": nodes.into_iter().collect::<Vec<_>>(),
                }]}],
            }}});
        }
        let checkpoint = self.checkpoint();
        pod["terminationGracePeriodSeconds"] = (checkpoint.map_or(0, |c| c.0) + self.s.grace_s).into();
        if !ray && let Some(init) = self.precheck_container(role, replicas) {
            pod["initContainers"] = json!([init]);
        }
        if let Gang::Volcano { .. } = self.s.gang {
            pod["schedulerName"] = "volcano".into();
            annotations.insert(VOLCANO_GROUP_ANNOTATION.into(), self.name.into());
        }
        let mut md = json!({"labels": labels});
        if !annotations.is_empty() {
            md["annotations"] = Value::Object(annotations);
        }
        json!({"metadata": md, "spec": pod})
    }

    /// The exit checkpoint: (timeout in s, at most 10 minutes; signal). A RayJob has none (as locally).
    fn checkpoint(&self) -> Option<(u64, CheckpointSignal)> {
        let task = self.task();
        task.advanced
            .exit_checkpoint
            .as_ref()
            .filter(|c| c.enabled && task.task_type != TaskType::RayJob)
            .map(|c| (u64::from(c.timeout_seconds.min(600)), c.signal))
    }

    fn precheck(&self) -> Option<&trainyard_core::spec::Precheck> {
        let task = self.task();
        task.advanced.precheck.as_ref().filter(|p| p.enabled && task.task_type != TaskType::RayJob)
    }

    fn resources(replicas: &[&ReplicaPlan]) -> Value {
        let r = replicas.first().map(|r| r.resources).unwrap_or_default();
        // The same floors as the local backend's cgroups (one CPU, 64 MiB).
        let mut list =
            json!({"cpu": r.vcpus.max(1).to_string(), "memory": format!("{}Mi", r.memory_mib.max(64))});
        if r.gpus > 0 {
            list["nvidia.com/gpu"] = r.gpus.to_string().into();
        }
        json!({"requests": list.clone(), "limits": list})
    }

    /// Defaults, the task's env (hidden values from the Secret), then the platform's.
    fn env(&self, role: &str) -> Env {
        let (spec, task) = (self.spec, self.task());
        let mut env = Env::default();
        for (k, v) in pe::DEFAULTS {
            env.value(k, *v);
        }
        for e in &task.environment.env {
            let src =
                if e.hidden { Source::Secret(env_key(&e.name)) } else { Source::Value(e.value.clone()) };
            env.set(&e.name, src);
        }
        let meta = &spec.task.metadata;
        env.value(pe::X_USER_NAME, &spec.owner);
        env.value(pe::X_ORG_NAME, &meta.project_group);
        env.value(pe::X_TENANT_ID, &meta.project_group);
        env.value(pe::X_REGION, &task.placement.region);
        env.value(pe::X_CLUSTER, &task.placement.cluster);
        env.value(pe::TASK_UUID, &spec.key.task_id);
        env.value("TRAINYARD_TASK_NAME", &spec.task_name);
        env.set("TRAINYARD_REPLICA", Source::Field("metadata.name".into()));
        env.value("TRAINYARD_ROLE", role);
        env.value("TRAINYARD_ATTEMPT", spec.key.attempt.to_string());
        env.set("TRAINYARD_NODE", Source::Field("spec.nodeName".into()));
        env.value("TRAINYARD_RUNTIME_DIR", RUNTIME_DIR);
        env
    }

    fn mounts(&self) -> Vec<Value> {
        let task = self.task();
        let env = &task.environment;
        let mut m = vec![json!({"name": "trainyard-runtime", "mountPath": RUNTIME_DIR})];
        for (i, v) in env.volumes.iter().enumerate() {
            m.push(
                json!({"name": format!("volume-{i}"), "mountPath": v.mount_path, "readOnly": v.read_only}),
            );
        }
        for (i, d) in env.datasets.iter().enumerate() {
            m.push(json!({"name": format!("dataset-{i}"), "mountPath": d.mount_path, "readOnly": true}));
        }
        for (i, d) in env.models.iter().enumerate() {
            m.push(json!({"name": format!("model-{i}"), "mountPath": d.mount_path, "readOnly": true}));
        }
        if task.task_type == TaskType::RayJob {
            let mut ray = json!({"name": "ray-tmp", "mountPath": "/tmp/ray"});
            if task.ray.as_ref().and_then(|r| r.shared_storage.as_ref()).is_some() {
                // The task's own directory in the shared volume, as on the local backend.
                ray["subPath"] = format!("ray-{}", self.spec.task_name).into();
            }
            m.push(ray);
        }
        if self.ssh {
            m.push(json!({"name": "trainyard-ssh", "mountPath": SSH_DIR, "readOnly": true}));
        }
        m
    }

    fn volumes(&self) -> Vec<Value> {
        let task = self.task();
        let env = &task.environment;
        let claim = |name: &str, claim: &str, ro: bool| json!({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": ro}});
        let mut v = vec![json!({"name": "trainyard-runtime", "emptyDir": {}})];
        for (i, m) in env.volumes.iter().enumerate() {
            v.push(claim(&format!("volume-{i}"), &m.volume, m.read_only));
        }
        for (i, m) in env.datasets.iter().enumerate() {
            v.push(claim(&format!("dataset-{i}"), &m.dataset, true));
        }
        for (i, m) in env.models.iter().enumerate() {
            v.push(claim(&format!("model-{i}"), &m.model, true));
        }
        if task.task_type == TaskType::RayJob {
            // Ray's sockets, logs and spilled objects: the task's shared volume when it has one, else the
            // pod's own disk (shared by its containers, as KubeRay's log collectors expect).
            match task.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
                Some(sh) => v.push(claim("ray-tmp", &sh.volume, false)),
                None => v.push(json!({"name": "ray-tmp", "emptyDir": {}})),
            }
        }
        if self.ssh {
            v.push(json!({"name": "trainyard-ssh", "secret": {
                "secretName": ssh_secret_name(self.name), "defaultMode": 0o400,
            }}));
        }
        v
    }

    fn main_container(&self, role: &str, replicas: &[&ReplicaPlan]) -> Value {
        let task = self.task();
        let ray = task.task_type == TaskType::RayJob;
        let secret = env_secret_name(self.name);
        let mut c = json!({
            "name": if ray { format!("ray-{role}") } else { "pytorch".to_owned() },
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "env": self.env(role).render(&secret),
            "resources": Self::resources(replicas),
            "volumeMounts": self.mounts(),
        });
        if ray {
            // KubeRay writes the container's command itself (`ray start` with the group's parameters).
            return c;
        }
        c["command"] = json!(["bash", "-c", self.wrapper(), "trainyard", task.environment.cmd]);
        c["ports"] = json!([{"name": "pytorchjob-port", "containerPort": MASTER_PORT, "protocol": "TCP"}]);
        if let Some((timeout_s, sig)) = self.checkpoint() {
            c["lifecycle"] =
                json!({"preStop": {"exec": {"command": ["bash", "-c", pre_stop_script(timeout_s, sig)]}}});
        }
        c
    }

    /// The shell that starts a PyTorchJob replica, then becomes `bash -c "$1"` (the task's cmd): the local
    /// sandbox's first shell, plus what the operators leave to us (hostfiles, sshd, `WORLD_SIZE`).
    fn wrapper(&self) -> String {
        let mut s = String::from(
            "# Catch the checkpoint signals until the command runs (a handler, not \"ignore\": exec resets it).\n\
             trap : USR1 USR2\n\
             # Files in shared volumes stay writable by the group's later attempts.\n\
             umask 0002\n",
        );
        // The operator's WORLD_SIZE is replicas x nprocPerNode; Trainyard's (the local backend's, the product's)
        // is the number of replicas, which the operator also sets as PET_NNODES.
        s.push_str("if [ -n \"${PET_NNODES:-}\" ]; then export WORLD_SIZE=\"$PET_NNODES\"; fi\n");
        let (hostfile, names) = self.hostfiles();
        s.push_str(&format!(
            "printf '%s\\n' {} > /root/hostfile 2>/dev/null || true\nprintf '%s\\n' {} > /root/hostfile.hostname 2>/dev/null || true\n",
            hostfile.iter().map(|l| shell_quote(l)).collect::<Vec<_>>().join(" "),
            names.join(" "),
        ));
        if self.ssh {
            s.push_str(&format!(
                "mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh\n\
                 for f in id_ed25519 id_ed25519.pub authorized_keys config; do cp {SSH_DIR}/$f /root/.ssh/$f; done\n\
                 chmod 600 /root/.ssh/id_ed25519\n\
                 if [ -x /usr/sbin/sshd ]; then /usr/sbin/sshd -f {SSH_DIR}/sshd_config -E {RUNTIME_DIR}/sshd.log || echo 'trainyard: sshd did not start' >&2; else echo 'trainyard: passwordless SSH is on but the image has no /usr/sbin/sshd' >&2; fi\n"
            ));
        }
        s.push_str("exec bash -c \"$1\"\n");
        s
    }

    /// Pod DNS names of the job, as the operator names pods and their headless Services: (MPI-style
    /// hostfile lines with slots, names only).
    fn hostfiles(&self) -> (Vec<String>, Vec<String>) {
        let mut names = Vec::new();
        for role in ["master", "worker"] {
            for r in self.by_role.get(role).map(Vec::as_slice).unwrap_or_default() {
                names.push(format!("{}-{role}-{}", self.name, r.index));
            }
        }
        let slots = self.task().pytorch.as_ref().and_then(|p| p.procs_per_node).unwrap_or(1).max(1);
        (names.iter().map(|n| format!("{n} slots={slots}")).collect(), names)
    }

    /// The precheck as an init container: the local backend's program (`precheck.py`, inline with
    /// `python3 -c`) and options. The operator sets the distributed variables only in regular containers, so
    /// they are set here: the rendezvous at [`precheck_service_name`] on `MASTER_PORT` (+1, by the program),
    /// `RANK` from the pod's replica index. It writes its JSON result to the termination message, where the
    /// watcher reads it (`status.initContainerStatuses[].state.terminated.message`); exit codes as locally.
    fn precheck_container(&self, role: &str, replicas: &[&ReplicaPlan]) -> Option<Value> {
        let p = self.precheck()?;
        let mut env = self.env(role);
        for e in &p.env {
            let src =
                if e.hidden { Source::Secret(precheck_key(&e.name)) } else { Source::Value(e.value.clone()) };
            env.set(&e.name, src);
        }
        env.value(pe::MASTER_ADDR, precheck_service_name(self.name));
        env.value(pe::MASTER_PORT, MASTER_PORT.to_string());
        env.value(pe::WORLD_SIZE, self.spec.replicas.len().to_string());
        env.set(
            "TRAINYARD_REPLICA_INDEX",
            Source::Field(format!("metadata.labels['{KF_REPLICA_INDEX_LABEL}']")),
        );
        let mut cmd = format!("--out /dev/termination-log --timeout-s {}", p.timeout_seconds);
        if let Some(t) = p.min_gemm_tflops {
            cmd.push_str(&format!(" --min-gemm-gflops {}", t * 1000.0));
        }
        if let Some(g) = p.min_allreduce_gbps {
            cmd.push_str(&format!(" --min-allreduce-gbps {g}"));
        }
        // RANK: 0 for the master, index + 1 for workers (as the operator numbers them).
        let offset = if role == "master" { 0 } else { 1 };
        let script =
            format!("export RANK=$((TRAINYARD_REPLICA_INDEX + {offset}))\nexec python3 -c \"$1\" {cmd}\n");
        Some(json!({
            "name": super::status::PRECHECK_CONTAINER,
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["bash", "-c", script, "precheck", crate::local::PRECHECK_PY],
            "env": env.render(&env_secret_name(self.name)),
            // Init containers' requests do not add to the pod's: the same GPUs serve the command after.
            "resources": Self::resources(replicas),
            "volumeMounts": self.mounts(),
        }))
    }

    fn precheck_service(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata(&precheck_service_name(self.name)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": {KF_JOB_NAME_LABEL: self.name, KF_REPLICA_TYPE_LABEL: "master"},
                "ports": [{"name": "precheck", "port": MASTER_PORT + 1, "protocol": "TCP"}],
            }
        })
    }

    /// The hidden values of the task and its precheck; None when there are none.
    fn env_secret(&self) -> Option<Value> {
        let task = self.task();
        let mut data = BTreeMap::new();
        for e in task.environment.env.iter().filter(|e| e.hidden) {
            data.insert(env_key(&e.name), base64(e.value.as_bytes()));
        }
        if let Some(p) = self.precheck() {
            for e in p.env.iter().filter(|e| e.hidden) {
                data.insert(precheck_key(&e.name), base64(e.value.as_bytes()));
            }
        }
        if data.is_empty() {
            return None;
        }
        Some(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": self.metadata(&env_secret_name(self.name)),
            "data": data,
        }))
    }

    fn ssh_secret(&self, k: &SshKeys) -> Value {
        let (_, names) = self.hostfiles();
        let mut config = String::new();
        for n in &names {
            config.push_str(&format!(
                "Host {n}\n  HostName {n}\n  Port 22\n  User root\n  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            ));
        }
        // The local backend's sshd settings, with the host key where the Secret is mounted.
        let sshd = format!(
            "Port 22\nListenAddress 0.0.0.0\nHostKey {SSH_DIR}/host_ed25519\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nAuthorizedKeysFile /root/.ssh/authorized_keys\nStrictModes no\nUsePAM no\nPidFile none\nSetEnv TRAINYARD_SSH=1\n"
        );
        let public = format!("{}\n", k.public_key.trim_end());
        let files: BTreeMap<&str, &str> = [
            ("id_ed25519", k.private_key.as_str()),
            ("id_ed25519.pub", public.as_str()),
            ("authorized_keys", public.as_str()),
            ("host_ed25519", k.host_key.as_str()),
            ("config", config.as_str()),
            ("sshd_config", sshd.as_str()),
        ]
        .into_iter()
        .collect();
        let data: BTreeMap<&str, String> =
            files.into_iter().map(|(n, t)| (n, base64(t.as_bytes()))).collect();
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": self.metadata(&ssh_secret_name(self.name)),
            "data": data,
        })
    }

    fn pod_group(&self, queue: Option<&str>) -> Value {
        let mut spec = json!({"minMember": self.spec.replicas.len()});
        if let Some(q) = queue {
            spec["queue"] = q.into();
        }
        json!({
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": self.metadata(self.name),
            "spec": spec,
        })
    }
}

/// The `preStop` hook: the local supervisor's stop protocol, run inside the container before the kubelet's
/// SIGTERM. It writes `$RUNTIME_DIR/checkpoint-requested` (milliseconds since the epoch), sends the
/// checkpoint signal to the processes that handle it (one that does not would just die of it), waits for
/// `$RUNTIME_DIR/checkpoint-done` up to the timeout, then sends SIGTERM to every process of the container;
/// the kubelet's SIGTERM and, after `terminationGracePeriodSeconds` (timeout + grace), SIGKILL follow. Each
/// step is a `trainyard:` line in the container's log (the watcher turns them into events).
pub fn pre_stop_script(timeout_s: u64, signal: CheckpointSignal) -> String {
    let (num, name) = match signal {
        CheckpointSignal::Sigusr1 => (crate::local::procs::SIGUSR1, "USR1"),
        CheckpointSignal::Sigusr2 => (crate::local::procs::SIGUSR2, "USR2"),
        CheckpointSignal::Sigterm => (crate::local::procs::SIGTERM, "TERM"),
        CheckpointSignal::Sigint => (crate::local::procs::SIGINT, "INT"),
    };
    format!(
        r#"rt={RUNTIME_DIR}; sig={num}; timeout={timeout_s}
say() {{ echo "trainyard: $HOSTNAME: $*" > /proc/1/fd/1 2>/dev/null || true; }}
catches() {{
  local k v m=
  while read -r k v; do [ "$k" = SigCgt: ] && {{ m=$v; break; }}; done 2>/dev/null < "/proc/$1/status"
  [ -n "$m" ] && (( (16#$m >> (sig - 1)) & 1 ))
}}
t0=$SECONDS
date +%s%3N > "$rt/checkpoint-requested"
told=0
for p in /proc/[0-9]*; do
  pid=${{p#/proc/}}
  [ "$pid" = "$$" ] && continue
  if catches "$pid" && kill -s {name} "$pid" 2>/dev/null; then told=$((told + 1)); fi
done
say "sent SIG{name} to $told process(es) that handle it and wrote $rt/checkpoint-requested; waiting up to $timeout s"
while :; do
  if [ -e "$rt/checkpoint-done" ]; then say "checkpoint reported done after $((SECONDS - t0)) s"; break; fi
  if (( SECONDS - t0 >= timeout )); then say "no checkpoint-done within $timeout s; terminating"; break; fi
  sleep 0.2
done
for p in /proc/[0-9]*; do
  pid=${{p#/proc/}}
  [ "$pid" = "$$" ] || kill -s TERM "$pid" 2>/dev/null
done
exit 0
"#
    )
}

/// Label keys an operator or Trainyard itself sets: a task's label never replaces them.
fn reserved_label(key: &str) -> bool {
    let prefix = key.split_once('/').map(|(p, _)| p);
    // The instance label decides which server manages the pods: a task naming another would hand its pods
    // over. Kubernetes' own prefixes are the system's.
    key == MANAGED_BY_LABEL
        || key == INSTANCE_LABEL
        || prefix.is_some_and(|p| {
            p == "kubernetes.io" || p.ends_with(".kubernetes.io") || p == "k8s.io" || p.ends_with(".k8s.io")
        })
        || matches!(
            prefix,
            Some(
                "trainyard.dev"
                    | "training.kubeflow.org"
                    | "ray.io"
                    | "kueue.x-k8s.io"
                    | "scheduling.k8s.io"
                    | "volcano.sh"
                    | "scheduling.volcano.sh"
            )
        )
}

/// `s` as a label value: itself when valid; otherwise its allowed characters, shortened, then a hash of the
/// whole of `s` (so two different ids stay two different values).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        return s.to_owned();
    }
    let clean: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    let hash = format!("{:08x}", fnv1a(s.as_bytes()) as u32);
    let head: String = clean.chars().take(63 - hash.len() - 1).collect();
    let head = head.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if head.is_empty() { hash } else { format!("{head}-{hash}") }
}

/// A valid label value: at most 63 characters, alphanumerics with `-_.` inside, or empty.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_label_name(v)
}

fn is_label_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// A valid label key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn is_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(k),
    }
}

/// A DNS-1123 subdomain (object names such as a PVC's): lowercase alphanumerics, `-` and `.`, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
                && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn collapse_dashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out.trim_matches('-').to_owned()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// `s` as one single-quoted shell word.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Standard base64 with padding (Secret `data`).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
