//! What an attempt's job object and pods say, as a verdict: pure, so every rule is tested without a cluster.
//! The watch side turns API objects into [`JobView`] and [`PodView`]; [`assess`] reads them the way the
//! local backend reads its supervisors' records, with the same failure classes
//! ([`trainyard_core::failure::classify`]).

use trainyard_core::failure::{Exit, classify};
use trainyard_core::lifecycle::Reason;

/// The name of the precheck's init container (the objects and the verdict agree on it).
pub const PRECHECK_CONTAINER: &str = "trainyard-precheck";
/// The name of the init container that fetches the working directory.
pub const WORKDIR_CONTAINER: &str = "trainyard-workdir";
/// Exit code of `trainyard workdir fetch` when the server has no such working directory (collected).
const FETCH_NOT_FOUND: i32 = 3;
/// Exit code of the precheck when the image has no torch: no fault of the node.
const PRECHECK_NO_TORCH: i32 = 3;

/// Which operator runs the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    PyTorch,
    Ray,
}

/// A job object's status, as far as the verdict needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    /// Conditions that are `True`, by type (PyTorchJob: Created, Running, Restarting, Succeeded, Failed,
    /// Suspended), with their messages.
    pub conditions: Vec<(String, String)>,
    /// RayJob: `status.jobStatus` (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED).
    pub ray_job_status: Option<String>,
    /// RayJob: `status.jobDeploymentStatus` (Initializing, Running, Complete, Failed, ...).
    pub ray_deployment_status: Option<String>,
    /// RayJob: `status.message` or `status.reason`.
    pub message: Option<String>,
    /// The object is being deleted.
    pub deleting: bool,
    /// When the job was made (its `creationTimestamp`), in ms since the epoch: the start-up deadline counts
    /// from there, whichever server watches.
    pub created_ms: Option<u64>,
    /// The pods its spec asks for (every replica of every role).
    pub expected_pods: usize,
}

impl JobView {
    /// Its operator considers it over.
    pub fn ended(&self) -> bool {
        self.condition("Succeeded").is_some()
            || self.condition("Failed").is_some()
            || matches!(self.ray_job_status.as_deref(), Some("SUCCEEDED" | "FAILED" | "STOPPED"))
            || matches!(self.ray_deployment_status.as_deref(), Some("Complete" | "Failed"))
    }

    fn condition(&self, kind: &str) -> Option<&str> {
        self.conditions.iter().find(|(t, _)| t == kind).map(|(_, m)| m.as_str())
    }
}

/// How one container is, as its pod's status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Waiting { reason: String, message: String },
    Running,
    Terminated { exit_code: i32, signal: Option<i32>, reason: String, message: String },
}

/// One pod of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    /// `master`, `worker` or `head`.
    pub role: String,
    /// The node it was bound to (empty while pending).
    pub node: String,
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: String,
    /// Init containers by name (the precheck is one).
    pub init: Vec<(String, ContainerState)>,
    /// The main containers by name.
    pub containers: Vec<(String, ContainerState)>,
    pub deleting: bool,
    /// The scheduler's word when it cannot place the pod (`PodScheduled` False, `Unschedulable`).
    pub unschedulable: Option<String>,
    /// The cluster is taking the pod away, or took it (`DisruptionTarget` True: an eviction, a preemption, a
    /// taint's; or the kubelet's eviction under node pressure, status reason `Evicted`): its reason and message.
    pub disrupted: Option<String>,
}

impl PodView {
    fn precheck(&self) -> Option<&ContainerState> {
        self.init.iter().find(|(n, _)| n == PRECHECK_CONTAINER).map(|(_, s)| s)
    }

    /// A main container that ran or runs.
    pub fn started(&self) -> bool {
        self.phase == "Running"
            || self
                .containers
                .iter()
                .any(|(_, s)| matches!(s, ContainerState::Running | ContainerState::Terminated { .. }))
    }

    /// The first main container that ended badly, as an [`Exit`] with its reason.
    fn failed_exit(&self) -> Option<(Exit, String)> {
        self.containers.iter().find_map(|(_, s)| match s {
            ContainerState::Terminated { exit_code, signal, reason, message } if *exit_code != 0 => Some((
                Exit { code: Some(*exit_code), signal: *signal, oom_killed: reason == "OOMKilled" },
                message.clone(),
            )),
            _ => None,
        })
    }

    /// Image pull trouble: the waiting reason and message of the first container stuck on its image.
    pub fn pull_trouble(&self) -> Option<(&str, &str)> {
        self.init.iter().chain(&self.containers).find_map(|(_, s)| match s {
            ContainerState::Waiting { reason, message } if is_pull_reason(reason) => {
                Some((reason.as_str(), message.as_str()))
            }
            _ => None,
        })
    }
}

/// Whether every pod the job asks for exists and has had its main container run.
pub fn all_started(job: &JobView, pods: &[PodView]) -> bool {
    job.expected_pods > 0 && pods.len() >= job.expected_pods && pods.iter().all(PodView::started)
}

/// Waiting reasons of a container that mean its pod spec cannot run as it is (a Secret or key it names is
/// missing, a bad command): a spec error, not something a wait or another node fixes.
fn spec_waiting_reason(reason: &str) -> bool {
    matches!(reason, "CreateContainerConfigError" | "CreateContainerError" | "InvalidImageName")
}

/// Why an attempt's pods were not all running by its start-up deadline, in the cluster's words, and its class:
/// a spec error Trainyard or the user must fix (a claim that does not exist, a pod the namespace's Pod Security
/// refuses, a container config that cannot be made) is a `UserError`, resubmitting would meet it again;
/// anything else (no node with room, an untolerated taint, a pull or a mount that does not end) is
/// `StartTimedOut`, an infrastructure failure that is resubmitted elsewhere. `warning`: the last warning the
/// cluster gave about the job or its pods (an operator that cannot create them says so only there).
pub fn not_started(
    job: &JobView,
    pods: &[PodView],
    warning: Option<&str>,
    deadline_s: u64,
) -> (Reason, String) {
    let within = format!("not every replica was running within the start-up deadline ({deadline_s} s)");
    match why_not_started(job, pods, warning, true) {
        (class, Some(why)) => (class, format!("{within}: {why}")),
        (class, None) => (class, within),
    }
}

/// What an attempt whose pods are not all running waits for now, in the cluster's words (the task's wait
/// while it starts); None when every pod it asks for runs or ran.
pub fn waiting(job: &JobView, pods: &[PodView], warning: Option<&str>) -> Option<String> {
    if all_started(job, pods) {
        return None;
    }
    let why = why_not_started(job, pods, warning, false).1;
    Some(why.unwrap_or_else(|| "its pods are starting".to_owned()))
}

/// The first reason found, master (or head) first: a pod the scheduler cannot place, then a container
/// waiting, then pods never made (`over`: the wait is over; else they are not made yet); with its class should
/// the wait end here.
fn why_not_started(
    job: &JobView,
    pods: &[PodView],
    warning: Option<&str>,
    over: bool,
) -> (Reason, Option<String>) {
    let mut ordered: Vec<&PodView> = pods.iter().filter(|p| !p.started()).collect();
    ordered.sort_by_key(|p| (!matches!(p.role.as_str(), "master" | "head"), p.name.clone()));
    for p in &ordered {
        if let Some(why) = &p.unschedulable {
            let class = if why.contains("persistentvolumeclaim") && why.contains("not found") {
                Reason::UserError
            } else {
                Reason::StartTimedOut
            };
            return (class, Some(format!("{} is Unschedulable: {why}", p.name)));
        }
    }
    for p in &ordered {
        let waiting = p.init.iter().chain(&p.containers).find_map(|(c, s)| match s {
            ContainerState::Waiting { reason, message } if !reason.is_empty() => Some((c, reason, message)),
            _ => None,
        });
        if let Some((c, reason, message)) = waiting {
            let class = if spec_waiting_reason(reason) { Reason::UserError } else { Reason::StartTimedOut };
            let message = if message.is_empty() { String::new() } else { format!(": {message}") };
            return (class, Some(format!("{} ({c}) is waiting on {reason}{message}", p.name)));
        }
    }
    let missing = job.expected_pods.saturating_sub(pods.len());
    if missing > 0 {
        let class = if warning.is_some_and(|w| w.contains("PodSecurity") || w.contains("forbidden")) {
            Reason::UserError
        } else {
            Reason::StartTimedOut
        };
        let expected = job.expected_pods;
        let why = match (over, warning) {
            (true, w) => {
                format!(
                    "{missing} of {expected} pods were never made: {}",
                    w.unwrap_or("the cluster said nothing about it")
                )
            }
            (false, Some(w)) => format!("{missing} of {expected} pods are not made yet: {w}"),
            (false, None) => format!("{missing} of {expected} pods are not made yet"),
        };
        return (class, Some(why));
    }
    (Reason::StartTimedOut, ordered.first().map(|p| format!("{} is {}", p.name, p.phase)))
}

/// Waiting reasons that mean the image could not be pulled.
pub fn is_pull_reason(reason: &str) -> bool {
    matches!(reason, "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull")
}

/// What an attempt's objects say now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assessment {
    /// A main container runs or ran (or, with a precheck, the precheck started).
    pub started: bool,
    /// Every pod's precheck ended well.
    pub precheck_passed: bool,
    /// How the attempt ended, once it has.
    pub ended: Option<(Reason, String)>,
    /// Nodes that look broken for this attempt (a failed precheck that was not about the image).
    pub suspects: Vec<(String, String)>,
}

/// Whether a job is suspended (its pods deleted, or never made), in its operator's words: a PyTorchJob's
/// `Suspended` condition, a RayJob's deployment status.
pub fn suspended(job: &JobView) -> Option<String> {
    if let Some(m) = job.condition("Suspended") {
        return Some(if m.is_empty() { "the PyTorchJob is suspended".to_owned() } else { m.to_owned() });
    }
    matches!(job.ray_deployment_status.as_deref(), Some("Suspending" | "Suspended")).then(|| {
        job.message.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| "the RayJob is suspended".to_owned())
    })
}

/// Reads a job and its pods. `precheck`: the attempt has a precheck init container. `mount_paths`: the task's
/// mounts, so a missing file under one is named as a data problem. `kueue`: Kueue admits the job (it is made
/// suspended and Kueue lifts that), so a suspended job is one that waits for Kueue until it has run.
pub fn assess(
    kind: JobKind,
    job: &JobView,
    pods: &[PodView],
    precheck: bool,
    mount_paths: &[&str],
    kueue: bool,
) -> Assessment {
    let mut a = Assessment {
        started: pods.iter().any(|p| {
            p.started()
                || (precheck
                    && p.precheck().is_some_and(|s| {
                        matches!(s, ContainerState::Running | ContainerState::Terminated { .. })
                    }))
        }),
        ..Assessment::default()
    };
    // A replica that could not make its working directory: gone from the server (collected while the task
    // waited) is the task's to send again; anything else (the server out of reach, a broken stream) is the
    // start's, resubmitted.
    if let Some((p, code, message)) = pods.iter().find_map(|p| {
        p.init.iter().find_map(|(n, s)| match s {
            ContainerState::Terminated { exit_code, message, .. }
                if n == WORKDIR_CONTAINER && *exit_code != 0 =>
            {
                Some((p, *exit_code, message.trim()))
            }
            _ => None,
        })
    }) {
        let reason = if code == FETCH_NOT_FOUND { Reason::UserError } else { Reason::StartTimedOut };
        a.started = true;
        a.ended = Some((
            reason,
            format!("{}: fetching its working directory failed (exit code {code}): {message}", p.name),
        ));
        return a;
    }
    if precheck {
        let checks: Vec<_> = pods.iter().filter_map(|p| p.precheck().map(|s| (p, s))).collect();
        a.precheck_passed = !checks.is_empty()
            && checks.iter().all(|(_, s)| matches!(s, ContainerState::Terminated { exit_code: 0, .. }));
        if let Some((p, code, message)) = checks.iter().find_map(|(p, s)| match s {
            ContainerState::Terminated { exit_code, message, .. } if *exit_code != 0 => {
                Some((p, *exit_code, message))
            }
            _ => None,
        }) {
            let why = if message.is_empty() {
                format!("the precheck exited with code {code}")
            } else {
                message.clone()
            };
            if code != PRECHECK_NO_TORCH && !p.node.is_empty() {
                a.suspects
                    .push((p.node.clone(), format!("node {} failed the precheck of {}", p.node, p.name)));
            }
            a.ended = Some((Reason::PrecheckFailed, format!("{}: {why}", p.name)));
            return a;
        }
    }
    a.ended = match kind {
        JobKind::PyTorch => pytorch_end(job, pods, mount_paths),
        JobKind::Ray => ray_end(job, pods, mount_paths),
    };
    // Trainyard never suspends a job itself: one that is suspended was suspended by someone else (a person,
    // another controller) or, once it had run, evicted by Kueue. Its pods are gone or going: the attempt is
    // over, by the cluster's doing. Kueue's eviction is its preemption (for a job of higher priority, or its
    // quota reclaimed): the attempt is preempted, back in the queue at no cost to its retry budget; any other
    // suspension is a disruption.
    if a.ended.is_none()
        && let Some(why) = suspended(job).filter(|_| !kueue || a.started)
    {
        a.ended = Some(if kueue {
            (Reason::Preempted, format!("Kueue evicted the job: {why}"))
        } else {
            (Reason::Disrupted, format!("the job was suspended by someone other than Trainyard: {why}"))
        });
    }
    if a.ended.is_some() {
        a.started = true;
    }
    a
}

/// The master first, then the workers in order: the first failed pod names the failure. A pod the cluster took
/// away (a drain, an eviction) names it first, whatever its exit code: the task did not fail, its node was taken.
fn failure_of(pods: &[PodView], mount_paths: &[&str]) -> Option<(Reason, String)> {
    let mut ordered: Vec<&PodView> = pods.iter().collect();
    ordered.sort_by_key(|p| (!matches!(p.role.as_str(), "master" | "head"), p.name.clone()));
    if let Some(p) = ordered.iter().find(|p| p.disrupted.is_some()) {
        let why = p.disrupted.as_deref().unwrap_or_default();
        let node = if p.node.is_empty() { String::new() } else { format!(" on {}", p.node) };
        return Some((Reason::Disrupted, format!("{}{node} was taken away by the cluster: {why}", p.name)));
    }
    ordered.iter().find_map(|p| {
        let (exit, message) = p.failed_exit()?;
        Some(classify(&p.name, &exit, &message, mount_paths))
    })
}

fn pytorch_end(job: &JobView, pods: &[PodView], mount_paths: &[&str]) -> Option<(Reason, String)> {
    if let Some(m) = job.condition("Succeeded") {
        return Some((
            Reason::Completed,
            if m.is_empty() { "every replica ended well".to_owned() } else { m.to_owned() },
        ));
    }
    let m = job.condition("Failed")?;
    Some(
        failure_of(pods, mount_paths)
            .unwrap_or_else(|| (Reason::UserError, format!("the PyTorchJob failed: {m}"))),
    )
}

fn ray_end(job: &JobView, pods: &[PodView], mount_paths: &[&str]) -> Option<(Reason, String)> {
    let status = job.ray_job_status.as_deref().unwrap_or("");
    let deployment = job.ray_deployment_status.as_deref().unwrap_or("");
    let message = job.message.clone().unwrap_or_default();
    match (status, deployment) {
        ("SUCCEEDED", _) => Some((Reason::Completed, "the entrypoint ended well".to_owned())),
        // KubeRay refused the spec (it never makes a Ray cluster of it): the task's to fix, not a wait.
        (_, "ValidationFailed") => {
            Some((Reason::UserError, format!("KubeRay refused the RayJob: {message}")))
        }
        ("FAILED" | "STOPPED", _) | (_, "Failed") => {
            Some(failure_of(pods, mount_paths).unwrap_or_else(|| {
                (Reason::UserError, format!("the RayJob failed: {message}").trim_end_matches(": ").to_owned())
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
