//! The names Trainyard's objects on Kubernetes carry: the labels and annotations it sets and reads, the ones
//! of the operators and queues it works with, and the grammar of label keys, label values and DNS names
//! (with the encodings a value needs on its way into one).

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

/// Label keys an operator or Trainyard itself sets: a task's label never replaces them.
pub(super) fn reserved_label(key: &str) -> bool {
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

pub use trainyard_core::kube_names::{is_dns_subdomain, is_label_key, is_label_value};

pub(super) fn collapse_dashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out.trim_matches('-').to_owned()
}

pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
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
