//! API objects read into the views the verdict works on, and the labels and annotations that tie objects to
//! attempts.

use super::status::{ContainerState, JobKind, JobView, PodView};
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;
use std::collections::BTreeMap;
use trainyard_runtime::AttemptKey;

use super::objects::{ATTEMPT_LABEL, PULL_TOLERANCE_ANNOTATION, TASK_ID_ANNOTATION, TASK_LABEL};
/// Annotations on the job that a restarted server reads its settings back from (beside the objects' own).
pub const ANN_PRECHECK: &str = "trainyard.dev/precheck";
pub const ANN_MOUNTS: &str = "trainyard.dev/mount-paths";
pub const ANN_RETAIN: &str = "trainyard.dev/retain";
pub const ANN_METRICS: &str = "trainyard.dev/metrics";

/// The job kinds' API resources.
pub fn job_resource(kind: JobKind) -> ApiResource {
    match kind {
        JobKind::PyTorch => ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kubeflow.org", "v1", "PyTorchJob"),
            "pytorchjobs",
        ),
        JobKind::Ray => {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("ray.io", "v1", "RayJob"), "rayjobs")
        }
    }
}

/// The attempt an object belongs to: the raw task id from the annotation when there is one (a label value
/// may have been shortened), else the label.
pub fn key_of(meta: &ObjectMeta) -> Option<AttemptKey> {
    let labels = meta.labels.as_ref()?;
    let task_id = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TASK_ID_ANNOTATION))
        .or_else(|| labels.get(TASK_LABEL))?
        .clone();
    let attempt = labels.get(ATTEMPT_LABEL)?.parse().ok()?;
    Some(AttemptKey { task_id, attempt })
}

fn annotation<'a>(meta: &'a ObjectMeta, name: &str) -> Option<&'a str> {
    meta.annotations.as_ref().and_then(|a| a.get(name)).map(String::as_str)
}

/// Settings kept on the job: precheck, pull tolerance, mounts, retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    pub precheck: bool,
    pub pull_tolerance: i64,
    pub mount_paths: Vec<String>,
    pub retain: bool,
    /// The metrics endpoints to scrape on every pod.
    pub scrape: Option<super::capture::Scrape>,
}

pub fn job_settings(meta: &ObjectMeta) -> JobSettings {
    JobSettings {
        precheck: annotation(meta, ANN_PRECHECK) == Some("true"),
        pull_tolerance: annotation(meta, PULL_TOLERANCE_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1),
        mount_paths: annotation(meta, ANN_MOUNTS)
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default(),
        retain: annotation(meta, ANN_RETAIN) == Some("true"),
        scrape: annotation(meta, ANN_METRICS).and_then(|v| serde_json::from_str(v).ok()),
    }
}

/// The kind of a job object, by its apiVersion and kind.
pub fn kind_of(obj: &DynamicObject) -> Option<JobKind> {
    let t = obj.types.as_ref()?;
    match (t.api_version.as_str(), t.kind.as_str()) {
        ("kubeflow.org/v1", "PyTorchJob") => Some(JobKind::PyTorch),
        ("ray.io/v1", "RayJob") => Some(JobKind::Ray),
        _ => None,
    }
}

/// A job object's status.
pub fn job_view(obj: &DynamicObject) -> JobView {
    let status = obj.data.get("status").unwrap_or(&Value::Null);
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| c.get("status").and_then(Value::as_str) == Some("True"))
                .filter_map(|c| Some((text(c, "type")?, text(c, "message").unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default();
    JobView {
        conditions,
        ray_job_status: text(status, "jobStatus"),
        ray_deployment_status: text(status, "jobDeploymentStatus"),
        message: text(status, "message").or_else(|| text(status, "reason")),
        deleting: obj.metadata.deletion_timestamp.is_some(),
        created_ms: obj.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond().max(0) as u64),
        expected_pods: expected_pods(obj.data.get("spec").unwrap_or(&Value::Null)),
    }
}

/// The pods a job's spec asks for: a PyTorchJob's replicas of every type, a RayJob's head and workers.
fn expected_pods(spec: &Value) -> usize {
    let count = |v: &Value| v.get("replicas").and_then(Value::as_u64).unwrap_or(1) as usize;
    if let Some(specs) = spec.get("pytorchReplicaSpecs").and_then(Value::as_object) {
        return specs.values().map(count).sum();
    }
    if let Some(cluster) = spec.get("rayClusterSpec") {
        let workers: usize = cluster.get("workerGroupSpecs").and_then(Value::as_array).map_or(0, |gs| {
            gs.iter().map(|g| g.get("replicas").and_then(Value::as_u64).unwrap_or(0) as usize).sum()
        });
        return 1 + workers;
    }
    0
}

fn container_state(s: &ContainerStatus) -> ContainerState {
    let state = s.state.as_ref();
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return ContainerState::Terminated {
            exit_code: t.exit_code,
            signal: t.signal.filter(|s| *s != 0),
            reason: t.reason.clone().unwrap_or_default(),
            message: t.message.clone().unwrap_or_default(),
        };
    }
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return ContainerState::Running;
    }
    let w = state.and_then(|s| s.waiting.as_ref());
    ContainerState::Waiting {
        reason: w.and_then(|w| w.reason.clone()).unwrap_or_default(),
        message: w.and_then(|w| w.message.clone()).unwrap_or_default(),
    }
}

/// A pod's role: the training operator's replica type or KubeRay's node type.
fn role_of(meta: &ObjectMeta) -> String {
    let labels = meta.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(|v| v.to_ascii_lowercase());
    get(super::objects::ROLE_LABEL)
        .or_else(|| get("training.kubeflow.org/replica-type"))
        .or_else(|| get("ray.io/node-type"))
        .unwrap_or_default()
}

pub fn pod_view(p: &Pod) -> PodView {
    let status = p.status.as_ref();
    let states = |list: Option<&Vec<ContainerStatus>>| -> Vec<(String, ContainerState)> {
        list.map(|l| l.iter().map(|s| (s.name.clone(), container_state(s))).collect()).unwrap_or_default()
    };
    PodView {
        name: p.metadata.name.clone().unwrap_or_default(),
        role: role_of(&p.metadata),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        init: states(status.and_then(|s| s.init_container_statuses.as_ref())),
        containers: states(status.and_then(|s| s.container_statuses.as_ref())),
        deleting: p.metadata.deletion_timestamp.is_some(),
        unschedulable: status.and_then(|s| s.conditions.as_ref()).and_then(|cs| {
            cs.iter()
                .find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
                .map(|c| c.message.clone().unwrap_or_default())
        }),
        disrupted: disrupted(p),
    }
}

/// Why the cluster is taking a pod away, if it is: its `DisruptionTarget` condition, or the kubelet's eviction.
fn disrupted(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?;
    let target = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True"));
    if let Some(c) = target {
        let reason = c.reason.as_deref().unwrap_or("DisruptionTarget");
        return Some(match c.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("{reason}: {m}"),
            None => reason.to_owned(),
        });
    }
    (status.reason.as_deref() == Some("Evicted"))
        .then(|| format!("Evicted: {}", status.message.as_deref().unwrap_or("by the kubelet")))
}

/// Why a node cannot run its replicas, if it cannot: its Ready condition is not True.
pub fn node_down(n: &Node) -> Option<String> {
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "is NotReady ({}{})",
            c.reason.as_deref().unwrap_or("no reason given"),
            c.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        )),
        // A node that never reported is not down: it has not come up yet.
        None => None,
    }
}

/// The label naming a node's pool; nodes without it are in `default`.
pub const POOL_LABEL: &str = "trainyard.dev/pool";
/// The label naming a node's GPU model (NVIDIA's GPU feature discovery sets it).
pub const GPU_MODEL_LABEL: &str = "nvidia.com/gpu.product";
/// The label AMD's node labeller gives a node's GPU model.
pub const AMD_GPU_MODEL_LABEL: &str = "amd.com/gpu.product-name";

/// The extended resources a node's GPUs are counted from, in order: whole GPUs of the common device plugins,
/// then MIG slices (`nvidia.com/mig-1g.10gb`, of a node under the `mixed` strategy: its largest count). A spec's
/// `gpuResource` names which one its pods request.
const GPU_RESOURCES: [&str; 4] = ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "habana.ai/gaudi"];

/// A node's GPUs, as (count, model) from its allocatable resources and labels.
fn node_gpus(
    alloc: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    labels: &BTreeMap<String, String>,
) -> (u32, Option<String>) {
    let count = |k: &str| alloc.get(k).and_then(|q| q.0.parse::<u32>().ok()).unwrap_or(0);
    let gpus = GPU_RESOURCES.iter().map(|r| count(r)).find(|n| *n > 0).unwrap_or_else(|| {
        alloc.keys().filter(|k| k.starts_with("nvidia.com/mig-")).map(|k| count(k)).max().unwrap_or(0)
    });
    let model = (gpus > 0).then(|| {
        labels
            .get(GPU_MODEL_LABEL)
            .or_else(|| labels.get(AMD_GPU_MODEL_LABEL))
            .cloned()
            .unwrap_or_else(|| "GPU".to_owned())
    });
    (gpus, model)
}

/// A Node object as a catalog node: its pool and GPU model from its labels, its allocatable resources as
/// its capacity, cordoned as not schedulable.
pub fn catalog_node(n: &Node) -> Option<(String, trainyard_core::catalog::Node)> {
    let name = n.metadata.name.clone()?;
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let alloc = n.status.as_ref().and_then(|s| s.allocatable.clone().or_else(|| s.capacity.clone()));
    let alloc = alloc.unwrap_or_default();
    let vcpus = alloc.get("cpu").and_then(|q| cpu_millis(&q.0)).map_or(0, |m| (m / 1000) as u32);
    let memory_mib = alloc.get("memory").and_then(|q| bytes(&q.0)).map_or(0, |b| b / (1024 * 1024));
    let (gpus, gpu_model) = node_gpus(&alloc, &labels);
    let schedulable =
        !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) && node_down(n).is_none();
    Some((
        name,
        trainyard_core::catalog::Node {
            pool: labels.get(POOL_LABEL).cloned().unwrap_or_else(|| "default".to_owned()),
            schedulable,
            failed: false,
            gpu_model,
            gpus,
            gpu_devices: Vec::new(),
            vcpus,
            memory_mib,
        },
    ))
}

/// A node's allocatable CPU (millicores) and memory (bytes), as the scheduler counts its room.
pub fn node_room(n: &Node) -> (u64, u64) {
    let alloc = n.status.as_ref().and_then(|s| s.allocatable.clone().or_else(|| s.capacity.clone()));
    let alloc = alloc.unwrap_or_default();
    (
        alloc.get("cpu").and_then(|q| cpu_millis(&q.0)).unwrap_or(0),
        alloc.get("memory").and_then(|q| bytes(&q.0)).unwrap_or(0),
    )
}

/// What a pod holds of its node as the scheduler counts it: (node, CPU millicores, memory bytes) of its
/// requests (a container's limit where it requests nothing: Kubernetes defaults the request to it), the larger
/// of its containers' sum and its largest init container, plus its overhead. None for a pod on no node yet, or
/// one that has ended.
pub fn pod_claim(p: &Pod) -> Option<(String, u64, u64)> {
    let spec = p.spec.as_ref()?;
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    if matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")) {
        return None;
    }
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let get = |k: &str| {
            r.and_then(|r| r.requests.as_ref().and_then(|m| m.get(k)).or_else(|| r.limits.as_ref()?.get(k)))
                .map(|q| q.0.clone())
        };
        (
            get("cpu").and_then(|q| cpu_millis(&q)).unwrap_or(0),
            get("memory").and_then(|q| bytes(&q)).unwrap_or(0),
        )
    };
    let (mut cpu, mut mem) = spec.containers.iter().map(of).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    for (c, m) in spec.init_containers.iter().flatten().map(of) {
        cpu = cpu.max(c);
        mem = mem.max(m);
    }
    if let Some(o) = &spec.overhead {
        cpu += o.get("cpu").and_then(|q| cpu_millis(&q.0)).unwrap_or(0);
        mem += o.get("memory").and_then(|q| bytes(&q.0)).unwrap_or(0);
    }
    Some((node, cpu, mem))
}

/// A CPU quantity in millicores: `4`, `3500m`, `0.5`.
pub fn cpu_millis(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = q.parse().ok()?;
    (v >= 0.0).then_some((v * 1000.0).round() as u64)
}

/// A memory quantity in bytes: `4Gi`, `512Mi`, `1G`, `1e9`, `17179869184`.
pub fn bytes(q: &str) -> Option<u64> {
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (num, factor) =
        SUFFIXES.iter().find_map(|(s, f)| q.strip_suffix(s).map(|n| (n, *f))).unwrap_or((q, 1.0));
    let v: f64 = num.parse().ok()?;
    (v >= 0.0).then_some((v * factor) as u64)
}

/// The job a Kueue Workload was made for, by Kueue's naming of it (`<kind>-<job>-<5 hex digits>`, the kind in
/// lower case): what Kueue says on the Workload (why it holds the job) is said of the job.
pub fn workload_job(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("pytorchjob-").or_else(|| name.strip_prefix("rayjob-"))?;
    let (job, hash) = rest.rsplit_once('-')?;
    (hash.len() == 5 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(job)
}

#[cfg(test)]
mod tests {
    /// Kueue names a job's Workload `<kind>-<job>-<hash>`: its events reach the job's attempt.
    #[test]
    fn a_workload_names_its_job() {
        assert_eq!(super::workload_job("pytorchjob-ty-1a2b-a0-3f9c1"), Some("ty-1a2b-a0"));
        assert_eq!(super::workload_job("rayjob-ty-1a2b-a3-00aa9"), Some("ty-1a2b-a3"));
        assert_eq!(super::workload_job("pytorchjob-ty-1a2b-a0"), None, "no hash");
        assert_eq!(super::workload_job("jobset-x-3f9c1"), None);
    }

    /// What a pod holds of its node: requests (a limit where nothing is requested), the larger of the
    /// containers' sum and the largest init container, and nothing once it ended or while it is unbound.
    #[test]
    fn a_pods_claim_on_its_node() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent"},
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}],
            },
            "status": {"phase": "Running"},
        }))
        .unwrap();
        assert_eq!(pod_claim(&pod), Some(("n1".into(), 2000, (128 + 1024) << 20)));
        let mut ended = pod.clone();
        ended.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(pod_claim(&ended), None);
        let mut unbound = pod;
        unbound.spec.as_mut().unwrap().node_name = None;
        assert_eq!(pod_claim(&unbound), None);
    }

    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis("4"), Some(4000));
        assert_eq!(cpu_millis("3500m"), Some(3500));
        assert_eq!(cpu_millis("0.5"), Some(500));
        assert_eq!(cpu_millis("x"), None);
        assert_eq!(bytes("4Gi"), Some(4 << 30));
        assert_eq!(bytes("512Mi"), Some(512 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("17179869184"), Some(17_179_869_184));
        assert_eq!(bytes("-1"), None);
    }

    #[test]
    fn a_node_object_as_a_catalog_node() {
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1", "labels": {POOL_LABEL: "a100", GPU_MODEL_LABEL: "A100"}},
            "spec": {"unschedulable": true},
            "status": {
                "allocatable": {"cpu": "31500m", "memory": "125Gi", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap();
        let (name, c) = catalog_node(&n).unwrap();
        assert_eq!(name, "gpu-1");
        assert_eq!((c.pool.as_str(), c.gpu_model.as_deref(), c.gpus), ("a100", Some("A100"), 8));
        assert_eq!((c.vcpus, c.memory_mib), (31, 125 * 1024));
        assert!(!c.schedulable, "cordoned");

        // AMD GPUs and their model label; MIG slices of a node under the mixed strategy; no GPU at all.
        let node = |alloc: serde_json::Value, labels: serde_json::Value| -> (u32, Option<String>) {
            let n: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"allocatable": alloc},
            }))
            .unwrap();
            let (_, c) = catalog_node(&n).unwrap();
            (c.gpus, c.gpu_model)
        };
        let amd = node(
            serde_json::json!({"cpu": "96", "memory": "1Ti", "amd.com/gpu": "8"}),
            serde_json::json!({AMD_GPU_MODEL_LABEL: "MI300X"}),
        );
        assert_eq!(amd, (8, Some("MI300X".to_owned())));
        let mig = node(
            serde_json::json!({"cpu": "96", "nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "2"}),
            serde_json::json!({}),
        );
        assert_eq!(mig, (14, Some("GPU".to_owned())));
        assert_eq!(node(serde_json::json!({"cpu": "4", "rdma/hca": "1"}), serde_json::json!({})), (0, None));
    }
}
