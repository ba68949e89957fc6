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
//!   backend's programs and protocol (see `pods.rs` and [`pre_stop_script`]).

pub use super::names::{
    ATTEMPT_LABEL, GROUP_ANNOTATION, GROUP_LABEL, INSTANCE_LABEL, KF_JOB_NAME_LABEL, KF_REPLICA_INDEX_LABEL,
    KF_REPLICA_TYPE_LABEL, KUEUE_QUEUE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, MANAGED_SELECTOR,
    METRICS_ANNOTATION, METRICS_INTERVAL_ANNOTATION, PULL_TOLERANCE_ANNOTATION, ROLE_LABEL,
    TASK_ID_ANNOTATION, TASK_LABEL, TASK_NAME_ANNOTATION, VOLCANO_GROUP_ANNOTATION, base64,
    instance_selector, is_dns_subdomain, is_label_key, is_label_value, label_value, shell_quote,
};
use super::names::{collapse_dashes, fnv1a};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use trainyard_core::spec::{CheckpointSignal, ResourceType, TaskSpec, TaskType};
use trainyard_runtime::{AttemptKey, LaunchSpec, ReplicaPlan};

/// The longest job name: KubeRay refuses RayJob names over 47 characters (`MaxRayJobNameLength`, its
/// RayCluster adds `-xxxxx`), and `<job>-worker-4094` (the most workers a task may have) then stays within a
/// 63-character DNS label, as pod and Service names must.
pub const JOB_NAME_MAX: usize = 47;

/// The runtime dir inside every replica: the same path as on the local backend, an `emptyDir` here shared
/// by the init container, the command and the `preStop` hook (the checkpoint files live there).
pub const RUNTIME_DIR: &str = trainyard_runtime::replica::RUNTIME_DIR;
/// The PyTorch master's port, as on the local backend: declared as the `pytorchjob-port` of the `pytorch`
/// container, from which the operator sets `MASTER_PORT`.
pub const MASTER_PORT: u16 = trainyard_runtime::replica::MASTER_PORT;
/// Where the SSH Secret is mounted.
pub const SSH_DIR: &str = "/etc/trainyard/ssh";
/// Where sshd's host key and the authorized key are copied for an image that runs as a user of its own (the
/// Secret's files are root's), in the replica's runtime dir.
pub const SSH_USER_DIR: &str = "/run/trainyard/sshd";
/// sshd's port in pods of an image that runs as a user of its own: without capabilities, not below 1024.
pub const SSH_USER_PORT: u16 = 2222;

/// How long a RayJob's Ray cluster stays after its entrypoint ended (when debug retention does not keep it
/// longer), so that the driver's last output is read from the head's dashboard before the head goes.
pub const DRIVER_DRAIN_S: u32 = 10;

/// The kept log of a RayJob's driver (its entrypoint's output), a replica of the attempt beside its pods.
pub fn driver_replica_name(job: &str) -> String {
    format!("{job}-driver")
}

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
    /// Pods get the PriorityClass of their task's resource type ([`priority_class`]).
    pub priority_classes: bool,
    /// Each attempt gets a NetworkPolicy letting into its pods only its own pods and these ([`network_policy`]);
    /// None: no policy.
    pub network_policy: Option<Vec<Peer>>,
    /// How replicas fetch a task's working directory from the server (an init container); None: tasks with
    /// one cannot run here.
    pub workdir: Option<WorkdirFetch>,
}

/// How an attempt's replicas fetch its working directory: an init container of `image` (one with the
/// `trainyard` binary: the server's own) runs `trainyard workdir fetch` against `server` with the attempt's
/// token, into the pod's `emptyDir` at [`WORKSPACE`], where the task's command then starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkdirFetch {
    pub image: String,
    /// The server's URL as pods reach it (`http://trainyard.trainyard-system.svc:8080`).
    pub server: String,
}

/// Where a replica's copy of its working directory is, and where its command starts.
pub const WORKSPACE: &str = "/workspace";
/// The Secret key of the attempt's working-directory token.
pub const WORKDIR_TOKEN_KEY: &str = "workdir-token";

/// Who besides an attempt's own pods may open connections to them, where its NetworkPolicy is enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Every pod of a namespace (KubeRay's operator, which submits a RayJob's entrypoint to its head; a
    /// monitoring stack).
    Namespace(String),
    /// Addresses in a range (the API server's, whose pod proxy the log and metrics followers use).
    Cidr(String),
}

impl std::str::FromStr for Peer {
    type Err = String;
    /// `namespace:NAME` or a CIDR (`10.0.0.0/24`, `fd00::/64`).
    fn from_str(s: &str) -> Result<Peer, String> {
        if let Some(ns) = s.strip_prefix("namespace:") {
            return if is_dns_subdomain(ns) && !ns.contains('.') && ns.len() <= 63 {
                Ok(Peer::Namespace(ns.to_owned()))
            } else {
                Err(format!("{ns:?} is not a namespace name"))
            };
        }
        match trainyard_core::netaddr::Net::parse(s) {
            Ok(_) => Ok(Peer::Cidr(s.to_owned())),
            Err(_) => Err(format!("{s:?} is neither namespace:NAME nor a CIDR (10.0.0.0/24)")),
        }
    }
}

/// The PriorityClass of a task's pods, by its resource type: the order in which the cluster takes them when it
/// must (the kubelet's evictions under node pressure, the cluster scheduler's preemptions for other workloads):
/// capacity lent to the task (Idle, Spot) before capacity it pays for (Ondemand) before its reserved quota.
/// Every class has `preemptionPolicy: Never`: Trainyard's scheduler preempts, never the cluster's on its behalf.
pub fn priority_class(task: &TaskSpec) -> &'static str {
    PRIORITY_CLASSES.iter().find(|(t, ..)| *t == task.compute.resource_type).map_or("trainyard-spot", |c| c.1)
}

/// (resource type, PriorityClass name, value). Below Kubernetes' own system classes (2 000 000 000) and the
/// values clusters commonly give their critical add-ons, above the default 0 of pods without a class.
pub const PRIORITY_CLASSES: [(ResourceType, &str, i32); 4] = [
    (ResourceType::Reserved, "trainyard-reserved", 100_000),
    (ResourceType::Ondemand, "trainyard-ondemand", 80_000),
    (ResourceType::Spot, "trainyard-spot", 40_000),
    (ResourceType::Idle, "trainyard-idle", 10_000),
];

/// The cluster-scoped PriorityClass objects the pods name (made once per server start).
pub fn priority_class_objects() -> Vec<Value> {
    PRIORITY_CLASSES
        .iter()
        .map(|(t, name, value)| {
            json!({
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                "value": value,
                "globalDefault": false,
                "preemptionPolicy": "Never",
                "description": format!("Trainyard tasks on {} capacity", t.as_str()),
            })
        })
        .collect()
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
            priority_classes: true,
            network_policy: Some(Vec::new()),
            workdir: None,
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
    /// A `kubernetes.io/dockerconfigjson` Secret with the registry logins the task may pull its image with
    /// (the pods' `imagePullSecrets`); None when it has none.
    pub pull_secret: Option<Value>,
    /// `scheduling.volcano.sh/v1beta1` PodGroup when gang = Volcano.
    pub pod_group: Option<Value>,
    /// A headless `v1` Service publishing the master before it is ready, for the precheck (see
    /// [`precheck_service_name`]); None without a precheck.
    pub precheck_service: Option<Value>,
    /// `networking.k8s.io/v1` NetworkPolicy: only the attempt's own pods (and the configured peers) reach its
    /// pods ([`Ctx::network_policy`]); None when the settings ask for none.
    pub network_policy: Option<Value>,
}

impl AttemptObjects {
    /// Every object, the job last (what it references exists when its pods start).
    pub fn all(&self) -> Vec<&Value> {
        let mut v: Vec<&Value> = [
            &self.network_policy,
            &self.pull_secret,
            &self.secret,
            &self.ssh_secret,
            &self.pod_group,
            &self.precheck_service,
        ]
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

/// The Secret with the registry logins the attempt's pods pull their image with.
pub fn pull_secret_name(job: &str) -> String {
    format!("{job}-pull")
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
    if task.environment.workdir.is_some() {
        if s.workdir.is_none() {
            problems.push(
                "the task has a working directory, and this server was not told how pods fetch one \
                 (--kube-workdir-image and --kube-workdir-url)"
                    .to_owned(),
            );
        }
        if spec.workdir_token.is_none() {
            problems
                .push("the task has a working directory, and the launch carries no token to fetch it".into());
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
    let pull_secret = ctx.pull_secret();
    let pod_group = match &s.gang {
        Gang::Volcano { queue } => Some(ctx.pod_group(queue.as_deref())),
        _ => None,
    };
    let precheck_service = ctx.precheck().map(|_| ctx.precheck_service());
    let network_policy = s.network_policy.as_ref().map(|peers| ctx.network_policy(peers));
    Ok(AttemptObjects { job, secret, ssh_secret, pull_secret, pod_group, precheck_service, network_policy })
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

/// The Secret key of a hidden task variable and of a hidden precheck variable (they may share a name).
pub(super) fn env_key(name: &str) -> String {
    format!("env.{name}")
}
pub(super) fn precheck_key(name: &str) -> String {
    format!("precheck.{name}")
}

/// What building one attempt's objects needs; its pods are built in `pods.rs`.
pub(super) struct Ctx<'a> {
    pub(super) spec: &'a LaunchSpec,
    pub(super) s: &'a KubeSettings,
    pub(super) name: &'a str,
    pub(super) image: String,
    pub(super) ssh: bool,
    pub(super) by_role: &'a BTreeMap<String, Vec<&'a ReplicaPlan>>,
}

impl Ctx<'_> {
    pub(super) fn task(&self) -> &TaskSpec {
        &self.spec.task.spec
    }

    /// The labels of every object of the attempt.
    pub(super) fn labels(&self) -> serde_json::Map<String, Value> {
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

    pub(super) fn annotations(&self) -> serde_json::Map<String, Value> {
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

    pub(super) fn metadata(&self, name: &str) -> Value {
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
    pub(super) fn nproc(&self) -> u32 {
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
        // The Ray cluster outlives its entrypoint by at least the driver's drain: the last of its output is
        // read from the head's dashboard after the job has ended (see `capture::follow_driver`).
        let keep_s =
            ray.debug.as_ref().filter(|d| d.enabled).map_or(0, |d| d.retention_seconds).max(DRIVER_DRAIN_S);
        // The driver starts in the working directory, as the command of every other replica does.
        let entrypoint = match task.environment.workdir {
            Some(_) => format!("cd {WORKSPACE} || exit 1\n{}", task.environment.cmd),
            None => task.environment.cmd.clone(),
        };
        let mut spec = json!({
            "entrypoint": format!("bash -c {}", shell_quote(&entrypoint)),
            // HTTPMode: the operator submits the entrypoint to the head's job API itself, so the attempt is
            // exactly the pods Trainyard placed and admitted (K8sJobMode adds a submitter pod outside the
            // admission, 500m CPU and 256Mi placed by the cluster; SidecarMode grows the head pod by as
            // much). The driver's output stays in the Ray cluster's job logs (the dashboard's job API).
            "submissionMode": "HTTPMode",
            // The driver's submission id is the job's name, so that its output can be read from the head's
            // dashboard by a name known before the operator submits it.
            "jobId": self.name,
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
        // Token auth, where the catalog says the image's Ray has it (2.52 or later; KubeRay refuses it without
        // the version): KubeRay makes the cluster's token (a Secret named as the RayCluster) and gives it to
        // every Ray process and to its own dashboard client, so that no other pod that reaches the head can
        // submit jobs to it or read its output.
        let image = self.spec.catalog.images.get(&task.environment.image);
        if let Some(version) = image.filter(|i| i.ray_token_auth()).and_then(|i| i.ray_version.clone()) {
            spec["rayClusterSpec"]["rayVersion"] = version.into();
            spec["rayClusterSpec"]["authOptions"] = json!({"mode": "token"});
        }
        if let Some(text) = ray.runtime_env_yaml.as_ref().filter(|t| !t.trim().is_empty()) {
            spec["runtimeEnvYAML"] = text.clone().into();
        }
        if matches!(self.s.gang, Gang::Kueue { .. }) {
            spec["suspend"] = true.into();
        }
        json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": self.job_metadata(), "spec": spec})
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
        if let Some(t) = &self.spec.workdir_token {
            data.insert(WORKDIR_TOKEN_KEY.to_owned(), base64(t.0.as_bytes()));
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

    /// The registry logins the launch carries (those the task's group may pull its image with, see the control
    /// plane's `registry_logins::granted`: its registry's and that registry's mirrors'), as the kubelet reads
    /// them from `imagePullSecrets`. The Secret lives in the attempt's namespace and goes with its job.
    pub(super) fn pull_secret(&self) -> Option<Value> {
        let logins = &self.spec.registry_logins;
        if logins.is_empty() {
            return None;
        }
        let auths: serde_json::Map<String, Value> = logins
            .iter()
            .map(|(host, l)| {
                let pair = format!("{}:{}", l.username, l.password);
                (
                    host.clone(),
                    json!({"username": l.username, "password": l.password, "auth": base64(pair.as_bytes())}),
                )
            })
            .collect();
        let config = json!({"auths": auths}).to_string();
        Some(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": self.metadata(&pull_secret_name(self.name)),
            "data": {".dockerconfigjson": base64(config.as_bytes())},
        }))
    }

    fn ssh_secret(&self, k: &SshKeys) -> Value {
        let (_, names) = self.hostfiles();
        // As root: port 22 and root's keys, as on the local backend. As the image's own user (an image the
        // catalog gives a `runAsUser`, its pods without capabilities): sshd runs as that user on a port it may
        // bind, with its host key and the authorized key copied where the user owns them
        // ([`SSH_USER_DIR`]), and logins are as that user (the same on every replica).
        let user = self.run_as_user().is_some();
        let port = if user { SSH_USER_PORT } else { 22 };
        let login = if user { String::new() } else { "  User root\n".to_owned() };
        let mut config = String::new();
        for n in &names {
            config.push_str(&format!(
                "Host {n}\n  HostName {n}\n  Port {port}\n{login}  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            ));
        }
        let (host_key, authorized) = if user {
            (format!("{SSH_USER_DIR}/host_ed25519"), format!("{SSH_USER_DIR}/authorized_keys"))
        } else {
            (format!("{SSH_DIR}/host_ed25519"), "/root/.ssh/authorized_keys".to_owned())
        };
        // The local backend's sshd settings, with the host key where the Secret is mounted.
        let sshd = format!(
            "Port {port}\nListenAddress 0.0.0.0\nHostKey {host_key}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nAuthorizedKeysFile {authorized}\nStrictModes no\nUsePAM no\nPidFile none\nSetEnv TRAINYARD_SSH=1\n"
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

    /// The attempt's NetworkPolicy: its pods take connections from each other (torchrun's rendezvous, NCCL,
    /// SSH, Ray's GCS and object transfers) and from `peers`, and from nothing else: no pod of another task or
    /// group reaches its Ray dashboard, GCS or sshd. What they open themselves is left alone (datasets,
    /// registries, the internet, as the cluster allows). A CNI that enforces NetworkPolicy is the cluster's.
    fn network_policy(&self, peers: &[Peer]) -> Value {
        let key = &self.spec.key;
        let own = json!({"matchLabels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            INSTANCE_LABEL: label_value(&self.s.instance),
            TASK_LABEL: label_value(&key.task_id),
            ATTEMPT_LABEL: label_value(&key.attempt.to_string()),
        }});
        let mut from = vec![json!({"podSelector": own})];
        for p in peers {
            from.push(match p {
                Peer::Namespace(ns) => {
                    json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}})
                }
                Peer::Cidr(c) => json!({"ipBlock": {"cidr": c}}),
            });
        }
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self.metadata(self.name),
            "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": from}]},
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
/// `$RUNTIME_DIR/checkpoint-done` up to the timeout, then sends SIGTERM to every process of the container but
/// its first (whose end would end the hook's own exec before it returns, a failed hook to the kubelet); the
/// kubelet's SIGTERM to that one and, after `terminationGracePeriodSeconds` (timeout + grace), SIGKILL follow.
/// Each step is a `trainyard:` line in the container's log, which the log's follower turns into events
/// ([`hook_line`]).
pub fn pre_stop_script(timeout_s: u64, signal: CheckpointSignal) -> String {
    let (num, name) = match signal {
        CheckpointSignal::Sigusr1 => (trainyard_runtime::replica::SIGUSR1, "USR1"),
        CheckpointSignal::Sigusr2 => (trainyard_runtime::replica::SIGUSR2, "USR2"),
        CheckpointSignal::Sigterm => (trainyard_runtime::replica::SIGTERM, "TERM"),
        CheckpointSignal::Sigint => (trainyard_runtime::replica::SIGINT, "INT"),
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
  [ "$pid" = "$$" ] || [ "$pid" = 1 ] || kill -s TERM "$pid" 2>/dev/null
done
exit 0
"#
    )
}

/// What a line of the `preStop` hook ([`pre_stop_script`]'s `say`, written into the container's log) reports,
/// as the event the local supervisor would record for the same step: (reason, "POD: what happened").
pub fn hook_line(text: &str) -> Option<(trainyard_core::lifecycle::Reason, String)> {
    use trainyard_core::lifecycle::Reason;
    let said = text.strip_prefix("trainyard: ")?;
    let (_, what) = said.split_once(": ")?;
    let reason = if what.starts_with("sent SIG") && what.contains("checkpoint-requested") {
        Reason::CheckpointRequested
    } else if what.starts_with("checkpoint reported done after ") {
        Reason::CheckpointDone
    } else if what.starts_with("no checkpoint-done within ") {
        Reason::CheckpointTimedOut
    } else {
        return None;
    };
    Some((reason, said.trim_end().to_owned()))
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
