//! What the watches have seen, per attempt, and what of it has been reported. Level-triggered: every watch
//! event marks its attempt dirty, and `poll` reads the dirty attempts' objects afresh ([`super::status::assess`])
//! and reports what changed since the last report. A restarted server starts with nothing reported, so it
//! reports each attempt's present once (the control loop ignores what it already knows).

use super::status::{Assessment, JobKind, JobView, PodView, assess};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use trainyard_core::lifecycle::Reason;
use trainyard_runtime::{AttemptKey, Observation, StopCause};

/// What is known of one attempt.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) namespace: String,
    pub(super) job_name: String,
    pub(super) kind: Option<JobKind>,
    /// The job object as last seen; None when it was never seen or is gone.
    pub(super) job: Option<JobView>,
    pub(super) pods: BTreeMap<String, PodView>,
    /// Settings read back from the job's annotations (or set at launch).
    pub(super) precheck: bool,
    pub(super) pull_tolerance: i64,
    pub(super) mount_paths: Vec<String>,
    /// Debug retention: the job is left for the operator's TTL instead of deleted once it ends.
    pub(super) retain: bool,
    /// The metrics endpoints of its pods.
    pub(super) scrape: Option<super::capture::Scrape>,
    /// Launched by this process and not yet seen by the watch: alive meanwhile.
    pub(super) launched: bool,
    /// Pulls that failed so far, and the last waiting reason per pod (a new pull is a new `ErrImagePull`).
    pub(super) pulls: u32,
    pub(super) pull_state: BTreeMap<String, String>,
    pub(super) stop: Option<StopCause>,
    pub(super) sent: Sent,
    /// The attempt's SSH keys, when it has them (kept for a scale, which applies the objects again).
    pub(super) ssh: Option<super::objects::SshKeys>,
    /// Pods whose `preStop` hook asked for the exit checkpoint, and whether its end (done, timed out, or the
    /// container's own end) was reported.
    pub(super) checkpoint: BTreeMap<String, bool>,
    /// Every pod the job asks for has run: the start-up deadline is behind it.
    pub(super) all_started: bool,
    /// The last warning the cluster gave about the job or its pods (a `ClusterEvent`), for the reason of a
    /// start that did not come.
    pub(super) warning: Option<String>,
    /// The first of its pods the cluster took away (a drain, an eviction), as last seen with that mark.
    pub(super) disrupted: Option<PodView>,
    /// The cluster refused to make its pods as they are (the namespace's Pod Security): its words. Nothing but
    /// a change of the task, its image's catalog entry or the namespace makes them, so the attempt ends at once.
    pub(super) refused: Option<String>,
    /// The wait last reported while it starts.
    pub(super) waiting: Option<String>,
    /// A shrink applied only once the pods that stay all run ([`held_until`]).
    pub(super) held_shrink: Option<HeldShrink>,
    /// It ended preempted by the cluster (Kueue's eviction): Trainyard stops it, as it stops an attempt it
    /// preempts itself, and it is kept until then.
    pub(super) preempted: bool,
    /// With Kueue: when its job was first seen let go (admitted), the start-up deadline's origin.
    pub(super) released_ms: Option<u64>,
}

/// A PyTorchJob's shrink, held back: the training operator counts a worker it removes (deleted, so it ends
/// Failed, or terminating) as a failed replica, and fails the job when fewer of the replicas that stay are
/// running than it expects. Applied while a worker that stays still starts, it would end the attempt.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HeldShrink {
    /// The objects to apply, with the replicas after the shrink.
    pub(super) objs: super::objects::AttemptObjects,
    /// Workers after the shrink.
    pub(super) workers: u32,
}

/// The pods that stay after a shrink to `workers` workers (the master and workers 0 to `workers` - 1) and do
/// not run yet: the shrink waits for them.
pub(super) fn held_until(a: &Attempt, workers: u32) -> Vec<String> {
    std::iter::once(format!("{}-master-0", a.job_name))
        .chain((0..workers).map(|i| format!("{}-worker-{i}", a.job_name)))
        .filter(|name| !a.pods.get(name).is_some_and(|p| p.phase == "Running" && !p.deleting))
        .collect()
}

/// When the attempt's pods must all run by: `deadline_ms` after its job's creation, or with Kueue after Kueue
/// let the job go (first seen unsuspended); None before that.
fn start_deadline(a: &Attempt, kueue: bool, deadline_ms: u64) -> Option<u64> {
    let from = if kueue { a.released_ms } else { a.job.as_ref().and_then(|j| j.created_ms) };
    from.map(|c| c.saturating_add(deadline_ms))
}

/// Whether the attempt has a worker a shrink to `workers` removes.
pub(super) fn removes_a_worker(a: &Attempt, workers: u32) -> bool {
    let prefix = format!("{}-worker-", a.job_name);
    a.pods
        .keys()
        .any(|n| n.strip_prefix(&prefix).and_then(|i| i.parse::<u32>().ok()).is_some_and(|i| i >= workers))
}

/// What has been reported of an attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Sent {
    pub(super) started: bool,
    pub(super) precheck_passed: bool,
    pub(super) finished: bool,
}

impl Attempt {
    pub(super) fn new(namespace: &str, job_name: &str) -> Attempt {
        Attempt {
            namespace: namespace.to_owned(),
            job_name: job_name.to_owned(),
            kind: None,
            job: None,
            pods: BTreeMap::new(),
            precheck: false,
            pull_tolerance: -1,
            mount_paths: Vec::new(),
            retain: false,
            scrape: None,
            launched: false,
            pulls: 0,
            pull_state: BTreeMap::new(),
            stop: None,
            sent: Sent::default(),
            ssh: None,
            checkpoint: BTreeMap::new(),
            all_started: false,
            warning: None,
            disrupted: None,
            refused: None,
            waiting: None,
            held_shrink: None,
            preempted: false,
            released_ms: None,
        }
    }

    /// Objects of it exist (or were just created).
    fn exists(&self) -> bool {
        self.launched || self.job.is_some() || !self.pods.is_empty()
    }
}

/// A deletion the backend owes the cluster: an ended attempt's job (its pods and secrets go with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cleanup {
    /// The attempt: its pods are selected by it when they go at once.
    pub(super) key: AttemptKey,
    pub(super) namespace: String,
    pub(super) job_name: String,
    pub(super) kind: JobKind,
    /// Delete its pods at once (their node is gone; nothing would run the exit hook).
    pub(super) now: bool,
}

/// A node that cannot run its replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeDown {
    pub(super) why: String,
    /// When it was first seen down (the caller's clock, ms).
    pub(super) since_ms: u64,
    /// Deleted from the cluster: its replicas are gone for good.
    pub(super) gone: bool,
    /// Past its grace: its attempts fail.
    pub(super) failed: bool,
}

/// Everything the watches have seen.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) attempts: HashMap<AttemptKey, Attempt>,
    pub(super) dirty: BTreeSet<AttemptKey>,
    /// Nodes whose Ready condition is not True, and nodes that were deleted.
    pub(super) nodes_down: BTreeMap<String, NodeDown>,
    /// How long a node may be NotReady before its attempts fail (a deleted node fails them at once): a node
    /// that misses a few heartbeats and comes back takes nothing down.
    pub(super) node_grace_ms: u64,
    /// How long an attempt's pods may take to be all running, from its job's creation (0: no deadline).
    pub(super) start_deadline_ms: u64,
    /// Kueue admits the jobs (they are made suspended): a suspended job waits for it until it has run.
    pub(super) kueue: bool,
    /// When the attempts were last looked over for a passed start-up deadline.
    pub(super) deadlines_checked_ms: u64,
    /// Observations decided outside a poll (a stop of an attempt that has nothing left).
    pub(super) out: Vec<Observation>,
    pub(super) cleanups: Vec<Cleanup>,
    /// Held shrinks whose pods now all run, to apply: (attempt, namespace, shrink).
    pub(super) shrinks: Vec<(AttemptKey, String, HeldShrink)>,
    /// The watches have listed everything once (jobs, pods): before that `alive` is not to be trusted.
    pub(super) synced_jobs: bool,
    pub(super) synced_pods: bool,
    /// The job kinds whose watch has listed once.
    pub(super) synced_kinds: std::collections::HashSet<JobKind>,
    /// Jobs and pods by (namespace, name): what a Kubernetes event is about.
    pub(super) by_object: HashMap<(String, String), AttemptKey>,
    /// The cluster's nodes as catalog nodes (None until the node watch listed them), and a count of changes.
    pub(super) inventory: Option<BTreeMap<String, trainyard_core::catalog::Node>>,
    pub(super) inventory_version: u64,
    /// The nodes as the node watch has them (allocatable as capacity), and their allocatable CPU and memory
    /// exactly; `inventory` is these less what pods Trainyard did not make hold ([`State::effective`]).
    pub(super) raw_nodes: BTreeMap<String, (trainyard_core::catalog::Node, (u64, u64))>,
    /// Pods Trainyard did not make (DaemonSets, other workloads), by uid: (node, CPU millicores, memory bytes).
    pub(super) foreign: HashMap<String, (String, u64, u64)>,
    /// Their sum per node.
    pub(super) foreign_used: HashMap<String, (u64, u64)>,
}

impl State {
    pub(super) fn attempt(&mut self, key: &AttemptKey, namespace: &str, job_name: &str) -> &mut Attempt {
        self.dirty.insert(key.clone());
        self.attempts.entry(key.clone()).or_insert_with(|| {
            self.by_object.insert((namespace.to_owned(), job_name.to_owned()), key.clone());
            Attempt::new(namespace, job_name)
        })
    }

    /// A pod of an attempt, as last seen.
    pub(super) fn pod(&mut self, key: &AttemptKey, namespace: &str, pod: PodView) {
        self.by_object.insert((namespace.to_owned(), pod.name.clone()), key.clone());
        let job_name = super::objects::job_name(key);
        let a = self.attempt(key, namespace, &job_name);
        // Kept when the pod is gone: the job's failure may be read after the evicted pod was deleted.
        if a.disrupted.is_none() && pod.disrupted.is_some() {
            a.disrupted = Some(pod.clone());
        }
        // A container that ends while its exit checkpoint is awaited ends the wait, as the local supervisor
        // says it (the hook, killed with the container, cannot).
        let ended = |p: &PodView| {
            p.containers.first().and_then(|(_, s)| match s {
                crate::status::ContainerState::Terminated { exit_code, .. } => Some(*exit_code),
                _ => None,
            })
        };
        let note = match (a.checkpoint.get(&pod.name), ended(&pod)) {
            (Some(false), Some(code)) if a.pods.get(&pod.name).and_then(ended).is_none() => {
                a.checkpoint.insert(pod.name.clone(), true);
                Some(format!("{}: exited (code {code}) after the checkpoint notice", pod.name))
            }
            _ => None,
        };
        a.pods.insert(pod.name.clone(), pod);
        if let Some(message) = note {
            self.out.push(Observation::Note { key: key.clone(), reason: Reason::CheckpointDone, message });
        }
    }

    /// A line of a pod's `preStop` hook (see [`super::objects::hook_line`]), taken only while a stop Trainyard
    /// asked for is under way (a program's own output cannot pass for it), and each end of a checkpoint once.
    pub(super) fn hook_said(&mut self, key: &AttemptKey, pod: &str, reason: Reason, message: String) {
        let Some(a) = self.attempts.get_mut(key).filter(|a| a.stop.is_some()) else { return };
        if reason == Reason::CheckpointRequested {
            a.checkpoint.entry(pod.to_owned()).or_insert(false);
        } else if a.checkpoint.insert(pod.to_owned(), true) == Some(true) {
            return;
        }
        self.out.push(Observation::Note { key: key.clone(), reason, message });
    }

    /// A pod of an attempt is gone.
    pub(super) fn pod_gone(&mut self, key: &AttemptKey, namespace: &str, name: &str) {
        self.by_object.remove(&(namespace.to_owned(), name.to_owned()));
        if let Some(a) = self.attempts.get_mut(key) {
            a.pods.remove(name);
            self.dirty.insert(key.clone());
        }
    }

    /// An attempt that has nothing left and nothing more to say.
    fn forget(&mut self, key: &AttemptKey) {
        if let Some(a) = self.attempts.remove(key) {
            self.by_object.remove(&(a.namespace.clone(), a.job_name));
            for name in a.pods.into_keys() {
                self.by_object.remove(&(a.namespace.clone(), name));
            }
        }
    }

    /// A node's catalog entry: its allocatable less what the pods Trainyard did not make request there, so
    /// that Trainyard never places a replica where the cluster has no room for it.
    pub(super) fn effective(&self, name: &str) -> Option<trainyard_core::catalog::Node> {
        let (node, (cpu, mem)) = self.raw_nodes.get(name)?;
        let (used_cpu, used_mem) = self.foreign_used.get(name).copied().unwrap_or((0, 0));
        let mut n = node.clone();
        n.vcpus = (cpu.saturating_sub(used_cpu) / 1000) as u32;
        n.memory_mib = mem.saturating_sub(used_mem) / (1024 * 1024);
        Some(n)
    }

    /// The inventory's entries of `names` as [`State::effective`] has them now; true when one changed (the
    /// version is then bumped).
    pub(super) fn refresh_nodes<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> bool {
        let mut changed = false;
        for name in names {
            let now = self.effective(name);
            let Some(inv) = self.inventory.as_mut() else { return false };
            match now {
                Some(n) if inv.get(name) != Some(&n) => {
                    inv.insert(name.to_owned(), n);
                    changed = true;
                }
                None if inv.remove(name).is_some() => changed = true,
                _ => {}
            }
        }
        if changed {
            self.inventory_version += 1;
        }
        changed
    }

    /// A pod Trainyard did not make, as it holds its node now (None: it holds nothing any more); true when
    /// the inventory changed.
    pub(super) fn foreign_pod(&mut self, uid: &str, claim: Option<(String, u64, u64)>) -> bool {
        let old = match &claim {
            Some(c) => self.foreign.insert(uid.to_owned(), c.clone()),
            None => self.foreign.remove(uid),
        };
        if old == claim {
            return false;
        }
        let mut nodes = Vec::new();
        if let Some((node, cpu, mem)) = old {
            let u = self.foreign_used.entry(node.clone()).or_default();
            *u = (u.0.saturating_sub(cpu), u.1.saturating_sub(mem));
            nodes.push(node);
        }
        if let Some((node, cpu, mem)) = claim {
            let u = self.foreign_used.entry(node.clone()).or_default();
            *u = (u.0 + cpu, u.1 + mem);
            nodes.push(node);
        }
        let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
        self.refresh_nodes(names)
    }

    /// Every pod Trainyard did not make, as a (re)listing has them; true when the inventory changed.
    pub(super) fn foreign_pods(&mut self, all: HashMap<String, (String, u64, u64)>) -> bool {
        self.foreign_used.clear();
        for (node, cpu, mem) in all.values() {
            let u = self.foreign_used.entry(node.clone()).or_default();
            *u = (u.0 + cpu, u.1 + mem);
        }
        self.foreign = all;
        let names: Vec<String> = self.raw_nodes.keys().cloned().collect();
        self.refresh_nodes(names.iter().map(String::as_str))
    }

    /// A Kubernetes event about `(namespace, name)`, reported with its attempt's observations; a warning is
    /// kept as the attempt's last, for the reason of a start that does not come.
    pub(super) fn cluster_event(&mut self, namespace: &str, name: &str, message: String) {
        if let Some(key) = self.by_object.get(&(namespace.to_owned(), name.to_owned())).cloned()
            && let Some(a) = self.attempts.get_mut(&key)
        {
            if message.starts_with("Warning ") {
                a.warning = Some(message.clone());
                if message.contains("violates PodSecurity") && a.refused.is_none() {
                    a.refused = Some(message.clone());
                }
                // Read again: the warning may be the wait's reason, or end it.
                self.dirty.insert(key.clone());
            }
            self.out.push(Observation::Note { key, reason: Reason::ClusterEvent, message });
        }
    }

    /// Attempts whose start-up deadline has passed with pods still not running are read again (at most once a
    /// second: the deadline is in seconds, and there may be many attempts).
    fn expire_starts(&mut self, now_ms: u64) {
        if self.start_deadline_ms == 0 || now_ms < self.deadlines_checked_ms.saturating_add(1000) {
            return;
        }
        self.deadlines_checked_ms = now_ms;
        for (key, a) in &self.attempts {
            let late = start_deadline(a, self.kueue, self.start_deadline_ms).is_some_and(|d| now_ms >= d);
            if late && !a.all_started && !a.sent.finished && a.stop.is_none() {
                self.dirty.insert(key.clone());
            }
        }
    }

    /// A node went down (`down`: why; `gone`: it was deleted) or came back, at `now_ms`.
    pub(super) fn node(&mut self, name: &str, down: Option<String>, gone: bool, now_ms: u64) {
        match down {
            Some(why) => {
                let d = self.nodes_down.entry(name.to_owned()).or_insert(NodeDown {
                    why: why.clone(),
                    since_ms: now_ms,
                    gone,
                    failed: false,
                });
                d.why = why;
                d.gone |= gone;
            }
            None => {
                self.nodes_down.remove(name);
            }
        }
    }

    /// Nodes down past their grace (or deleted) take their attempts down: those are read again.
    fn expire_nodes(&mut self, now_ms: u64) {
        let grace = self.node_grace_ms;
        let mut expired = Vec::new();
        for (name, d) in self.nodes_down.iter_mut() {
            if !d.failed && (d.gone || now_ms.saturating_sub(d.since_ms) >= grace) {
                d.failed = true;
                expired.push(name.clone());
            }
        }
        for name in expired {
            for (key, a) in &self.attempts {
                if a.pods.values().any(|p| p.node == name) {
                    self.dirty.insert(key.clone());
                }
            }
        }
    }

    /// Attempts that hold objects on the cluster and have not ended (as far as was reported).
    pub(super) fn alive(&self) -> Vec<AttemptKey> {
        let mut out: Vec<AttemptKey> = self
            .attempts
            .iter()
            // A preempted attempt is alive until its stop: its job and pods are still there.
            .filter(|(_, a)| a.exists() && (!a.sent.finished || a.stop.is_some() || a.preempted))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }

    /// Reports what changed in the dirty attempts.
    pub(super) fn poll(&mut self, now_ms: u64) -> Vec<Observation> {
        self.expire_nodes(now_ms);
        self.expire_starts(now_ms);
        let mut out = std::mem::take(&mut self.out);
        let synced = self.synced_jobs && self.synced_pods;
        let dirty = std::mem::take(&mut self.dirty);
        for key in dirty {
            let Some(a) = self.attempts.get_mut(&key) else { continue };
            if let Some(h) = &a.held_shrink {
                if a.stop.is_some() || a.sent.finished {
                    a.held_shrink = None;
                } else if held_until(a, h.workers).is_empty() {
                    let h = a.held_shrink.take().expect("checked above");
                    self.shrinks.push((key.clone(), a.namespace.clone(), h));
                }
            }
            let gone = synced && a.job.is_none() && a.pods.is_empty() && !a.launched;
            if let Some(cause) = a.stop {
                if gone {
                    out.push(Observation::Stopped {
                        key: key.clone(),
                        cause: Some(cause),
                        message: "the job and its pods are gone".to_owned(),
                    });
                    self.forget(&key);
                }
                continue;
            }
            if a.sent.finished {
                // A preempted attempt is kept until Trainyard stops it (its stop ends in `Stopped`).
                if gone && !a.preempted {
                    self.forget(&key);
                }
                continue;
            }
            let Some(kind) = a.kind else {
                // Pods seen before their job: nothing to say until the job is.
                if gone {
                    self.forget(&key);
                }
                continue;
            };
            let Some(job) = &a.job else {
                if gone {
                    // The job went away without a stop (deleted by hand, or its TTL): it ended unseen.
                    out.push(Observation::Finished {
                        key: key.clone(),
                        reason: Reason::NodeFailed,
                        message: format!("job {}/{} disappeared before it ended", a.namespace, a.job_name),
                    });
                    self.forget(&key);
                }
                continue;
            };
            let mut pods: Vec<PodView> = a.pods.values().cloned().collect();
            // A pod the cluster took away and that is gone by now still names the failure it caused.
            if let Some(d) = a.disrupted.as_ref().filter(|d| !a.pods.contains_key(&d.name)) {
                pods.push(d.clone());
            }
            let mounts: Vec<&str> = a.mount_paths.iter().map(String::as_str).collect();
            let mut verdict = assess(kind, job, &pods, a.precheck, &mounts, self.kueue);
            let operator_ended = job.ended();
            a.all_started |= crate::status::all_started(job, &pods);
            // With Kueue the start is counted from its admission (the job let go), not from the job's creation:
            // the wait in Kueue's queue is the task's queue wait.
            if self.kueue && a.released_ms.is_none() && crate::status::suspended(job).is_none() {
                a.released_ms = Some(now_ms);
            }
            let deadline = start_deadline(a, self.kueue, self.start_deadline_ms);
            let mut late = false;
            if verdict.ended.is_none()
                && !a.all_started
                && self.start_deadline_ms > 0
                && deadline.is_some_and(|d| now_ms >= d)
            {
                late = true;
                verdict.ended = Some(crate::status::not_started(
                    job,
                    &pods,
                    a.warning.as_deref(),
                    self.start_deadline_ms / 1000,
                ));
            }
            if verdict.ended.is_none()
                && !a.all_started
                && let Some(why) = &a.refused
            {
                late = true;
                verdict.ended = Some((
                    Reason::UserError,
                    format!(
                        "the cluster refuses to make its pods as they are: {why} (an image that runs as a user of \
                         its own, the catalog's runAsUser, passes Pod Security `restricted`)"
                    ),
                ));
            }
            let down = pods
                .iter()
                .find_map(|p| self.nodes_down.get(&p.node).filter(|d| d.failed).map(|d| (p, &d.why)));
            let mut now = false;
            if verdict.ended.is_none()
                && let Some((p, why)) = down
            {
                now = true;
                verdict.suspects.push((p.node.clone(), format!("node {} {why}", p.node)));
                verdict.ended = Some((
                    Reason::NodeFailed,
                    format!("{} lost its node {}: the node {why}", p.name, p.node),
                ));
            }
            // The task's wait while it starts, said again when it changes.
            let wait = match crate::status::suspended(job).filter(|_| self.kueue) {
                Some(_) => Some(match a.warning.as_deref() {
                    Some(w) => format!("Kueue has not admitted the job yet: {w}"),
                    None => "Kueue has not admitted the job yet".to_owned(),
                }),
                None => crate::status::waiting(job, &pods, a.warning.as_deref()),
            };
            if verdict.ended.is_none() {
                pull_failures(&key, a, &pods, &mut verdict, &mut out);
            }
            if verdict.ended.is_none() && !verdict.started && !a.sent.started {
                if let Some(message) = wait.filter(|w| a.waiting.as_ref() != Some(w)) {
                    a.waiting = Some(message.clone());
                    out.push(Observation::Waiting { key: key.clone(), message });
                }
            }
            // A job its operator ended cleans up after itself (running pods at once, the rest after its TTL,
            // the logs readable meanwhile); one that ended by Trainyard's verdict (a pull given up, a lost node)
            // still has pods waiting or running, and is deleted.
            report(&key, a, verdict, &mut out);
            // A start that did not come: its pods (pending, or never made) go at once, their quota with them.
            let now = now || late;
            // A preempted attempt's job goes with Trainyard's stop, which follows.
            if a.sent.finished && !a.preempted && ((!a.retain && !operator_ended) || now) {
                self.cleanups.push(Cleanup {
                    key: key.clone(),
                    namespace: a.namespace.clone(),
                    job_name: a.job_name.clone(),
                    kind,
                    now,
                });
            }
        }
        out
    }
}

/// Counts new image pulls that failed; past the tolerance (-1: never) the attempt fails.
fn pull_failures(
    key: &AttemptKey,
    a: &mut Attempt,
    pods: &[PodView],
    v: &mut Assessment,
    out: &mut Vec<Observation>,
) {
    for p in pods {
        let now = p.pull_trouble().map(|(reason, _)| reason.to_owned()).unwrap_or_default();
        let before = a.pull_state.insert(p.name.clone(), now.clone()).unwrap_or_default();
        if now.is_empty() || now == before || now == "ImagePullBackOff" {
            continue;
        }
        a.pulls += 1;
        let message = p.pull_trouble().map(|(_, m)| m.to_owned()).unwrap_or_default();
        out.push(Observation::Note {
            key: key.clone(),
            reason: Reason::ImagePullBackOff,
            message: format!("{}: pull {} failed: {message}", p.name, a.pulls),
        });
        if a.pull_tolerance >= 0 && i64::from(a.pulls) > a.pull_tolerance {
            let allowed = match a.pull_tolerance {
                0 => "no retries allowed".to_owned(),
                n => format!("{n} retries allowed"),
            };
            v.ended = Some((
                Reason::ImagePullFailed,
                format!("{}: {message}; gave up after {} pulls ({allowed})", p.name, a.pulls),
            ));
            return;
        }
    }
}

/// Turns a verdict into the observations not reported yet.
fn report(key: &AttemptKey, a: &mut Attempt, v: Assessment, out: &mut Vec<Observation>) {
    if v.started && !a.sent.started {
        a.sent.started = true;
        out.push(Observation::Started { key: key.clone(), precheck: a.precheck });
    }
    if a.precheck && v.precheck_passed && !a.sent.precheck_passed {
        a.sent.precheck_passed = true;
        out.push(Observation::PrecheckPassed {
            key: key.clone(),
            message: "every replica passed".to_owned(),
        });
    }
    if let Some((reason, message)) = v.ended {
        for (node, message) in v.suspects {
            out.push(Observation::NodeSuspect { key: key.clone(), node, message });
        }
        a.sent.finished = true;
        a.preempted = reason == Reason::Preempted;
        out.push(Observation::Finished { key: key.clone(), reason, message });
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
