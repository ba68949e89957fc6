//! An attempt's progress and verdict, decided from what its supervisors wrote: started, precheck passed,
//! autoscaling's requests, the outcome as replicas end, the image pull's retries, and the record kept once
//! it ended. Pure: the caller (`progress.rs`) reads the files and acts on what comes out.

use super::plan::{Autoscale, Launched, Replica};
use super::supervisor::{Phase, ReplicaState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use trainyard_core::failure::{Exit, classify};
use trainyard_core::lifecycle::Reason;
use trainyard_runtime::{AttemptKey, Observation, StopCause};

/// How much of an ended replica's log its failure is classified by.
pub(super) const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// Between reports of the same pending Ray demand.
const DEMAND_REPORT_EVERY_MS: u64 = 5_000;

/// What the backend has decided about a running attempt so far (kept between polls).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Progress {
    pub(super) started: bool,
    pub(super) prechecked: bool,
    /// Stopped, and why.
    pub(super) stop: Option<StopCause>,
    /// The outcome decided while replicas are still ending: (reason, message).
    pub(super) verdict: Option<(Reason, String)>,
    /// When the remaining replicas are told to stop (grace after the master's success, debug retention).
    pub(super) stop_others_at: Option<u64>,
    pub(super) stopped_others: bool,
    /// Replicas taken away by autoscaling: their end is not a failure.
    pub(super) removed: BTreeSet<String>,
    /// Autoscaling: when demand was last reported, and the idle workers already reported.
    pub(super) demand_reported_ms: u64,
    pub(super) idle_reported: BTreeSet<String>,
}

/// What the supervisors wrote, as read at one poll.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Each replica's state in launch order (None: its supervisor wrote none yet).
    pub(super) states: Vec<(Replica, Option<ReplicaState>)>,
    /// Replicas whose supervisor is gone without recording how the replica ended.
    pub(super) lost: BTreeSet<String>,
    /// The end of each ended replica's log, without timestamps (what its failure is classified by).
    pub(super) tails: BTreeMap<String, String>,
    /// The Ray head's view of its cluster (`ray-state.json`), when the attempt autoscales.
    pub(super) ray_state: Option<serde_json::Value>,
}

impl Seen {
    /// The replicas whose log tails [`step`] reads: those that ended, while no outcome is decided.
    pub(super) fn wants_tails(p: &Progress) -> bool {
        p.verdict.is_none() && p.stop.is_none()
    }
}

/// What the caller does after a [`step`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Step {
    /// Tell every replica to stop (SIGTERM, then the grace).
    pub(super) stop_all: bool,
    /// Every replica ended: the attempt's outcome is the last observation pushed.
    pub(super) ended: bool,
}

fn key_of(l: &Launched) -> AttemptKey {
    AttemptKey { task_id: l.task_id.clone(), attempt: l.attempt }
}

/// One poll of a running attempt: observations into `out`, what to do next as the result.
/// `workers_after_master_ms`: how long a PyTorchJob's workers may run on after its master succeeded.
pub(super) fn step(
    p: &mut Progress,
    l: &Launched,
    seen: &Seen,
    now: u64,
    workers_after_master_ms: u64,
    out: &mut Vec<Observation>,
) -> Step {
    let key = key_of(l);
    let states = &seen.states;
    let phases: Vec<Option<Phase>> = states
        .iter()
        .filter(|(r, _)| r.role != "submitter")
        .map(|(_, s)| s.as_ref().map(|s| s.phase))
        .collect();
    if !p.started && phases.iter().all(|ph| ph.is_some_and(|ph| ph != Phase::Starting)) {
        p.started = true;
        out.push(Observation::Started { key: key.clone(), precheck: l.precheck });
    }
    if l.precheck && p.started && !p.prechecked && phases.iter().all(|ph| matches!(ph, Some(Phase::Running)))
    {
        p.prechecked = true;
        let figures: Vec<String> = states.iter().filter_map(|(_, s)| s.as_ref()?.precheck.clone()).collect();
        out.push(Observation::PrecheckPassed {
            key: key.clone(),
            message: format!("every replica passed the precheck: {}", figures.join("; ")),
        });
    }
    if p.started
        && p.stop.is_none()
        && p.verdict.is_none()
        && let (Some(a), Some(state)) = (&l.autoscale, &seen.ray_state)
    {
        autoscale(p, &key, a, state, now, out);
    }
    if p.verdict.is_none() && p.stop.is_none() {
        decide(p, l, seen, now, workers_after_master_ms, out);
    }
    let mut next = Step::default();
    if !p.stopped_others && p.stop_others_at.is_some_and(|at| now >= at) {
        p.stopped_others = true;
        next.stop_all = true;
    }
    let all_ended = states
        .iter()
        .all(|(r, s)| s.as_ref().is_some_and(|s| s.phase == Phase::Exited) || seen.lost.contains(&r.name));
    if !all_ended {
        return next;
    }
    out.push(match (p.stop, &p.verdict) {
        (Some(StopCause::NodeFailed), _) => Observation::Finished {
            key,
            reason: Reason::NodeFailed,
            message: "a node of this attempt failed; every replica was killed".into(),
        },
        (Some(cause), _) => {
            Observation::Stopped { key, cause: Some(cause), message: "every replica ended".into() }
        }
        (None, Some((reason, message))) => {
            Observation::Finished { key, reason: *reason, message: message.clone() }
        }
        (None, None) => Observation::Finished {
            key,
            reason: Reason::UserError,
            message: "every replica ended but none decided the outcome".into(),
        },
    });
    next.ended = true;
    next
}

/// The outcome as replicas end: the master (Ray's head) decides success, the first failure decides failure.
fn decide(
    p: &mut Progress,
    l: &Launched,
    seen: &Seen,
    now: u64,
    workers_after_master_ms: u64,
    out: &mut Vec<Observation>,
) {
    let key = key_of(l);
    let ray = l.task_type == "RayJob";
    if let Some(name) = seen.states.iter().map(|(r, _)| &r.name).find(|n| seen.lost.contains(*n)) {
        p.verdict = Some((
            Reason::NodeFailed,
            format!("the supervisor of {name} is gone without recording how the replica ended"),
        ));
    }
    let mut ended: Vec<(&Replica, &ReplicaState)> = seen
        .states
        .iter()
        .filter_map(|(r, s)| s.as_ref().filter(|s| s.phase == Phase::Exited).map(|s| (r, s)))
        .collect();
    ended.sort_by_key(|(_, s)| s.exit.as_ref().map_or(0, |e| e.at_ms));
    for (r, s) in ended {
        let Some(e) = &s.exit else { continue };
        if e.stopped || p.verdict.is_some() {
            continue;
        }
        if e.precheck_failed {
            let message = s.precheck.clone().unwrap_or_default();
            p.verdict = Some((Reason::PrecheckFailed, format!("{}: {message}", r.name)));
            // Exit 3: the image has no torch, which is no fault of the node.
            if e.code != Some(3) {
                out.push(Observation::NodeSuspect {
                    key: key.clone(),
                    node: r.node.clone(),
                    message: format!("node {} failed the precheck of {}", r.node, r.name),
                });
            }
            continue;
        }
        if e.killed_outside {
            // Nothing in the sandbox can signal bubblewrap or the sandbox's init: the machine (or its admin)
            // killed it. bubblewrap reports a killed init as 128 + the signal.
            let signal = e.signal.or(e.code.filter(|c| (129..160).contains(c)).map(|c| c - 128));
            p.verdict = Some((
                Reason::NodeFailed,
                format!(
                    "{}: its sandbox was killed from outside, by {}",
                    r.name,
                    trainyard_core::failure::signal_name(signal.unwrap_or(9))
                ),
            ));
            continue;
        }
        if let Some(why) = &e.evicted {
            p.verdict = Some((Reason::UserError, format!("{}: {why}", r.name)));
            continue;
        }
        let exit = Exit { code: e.code, signal: e.signal, oom_killed: e.oom_killed };
        let paths: Vec<&str> = l.mount_paths.iter().map(String::as_str).collect();
        let tail = seen.tails.get(&r.name).map_or("", String::as_str);
        let (reason, message) = classify(&r.name, &exit, tail, &paths);
        let decides = if ray { r.role == "head" } else { r.role == "master" };
        if reason == Reason::NodeFailed {
            out.push(Observation::NodeSuspect {
                key: key.clone(),
                node: r.node.clone(),
                message: format!("node {}: {message}", r.node),
            });
        }
        if reason != Reason::Completed {
            p.verdict = Some((reason, message));
        } else if decides {
            p.verdict = Some((Reason::Completed, message));
            // Ray's workers have nothing left to do once the head (and its entrypoint, and the debug
            // retention) ended; a PyTorchJob's workers get a moment to end by themselves.
            let wait = if ray { 0 } else { workers_after_master_ms };
            p.stop_others_at = Some(now + wait);
        } else if ray {
            p.verdict = Some((Reason::UserError, format!("{} ended before the entrypoint did", r.name)));
        }
    }
    if let Some((reason, _)) = &p.verdict
        && *reason != Reason::Completed
    {
        p.stop_others_at = Some(now);
    }
}

/// Autoscaling: turns the head's view of Ray (pending demand, idle nodes) into scale requests; the control
/// loop decides within the bounds, through the scheduler.
fn autoscale(
    p: &mut Progress,
    key: &AttemptKey,
    a: &Autoscale,
    state: &serde_json::Value,
    now: u64,
    out: &mut Vec<Observation>,
) {
    let pending = state["pending"].as_array().cloned().unwrap_or_default();
    if !pending.is_empty() && now >= p.demand_reported_ms + DEMAND_REPORT_EVERY_MS {
        let cpus: f64 = pending.iter().map(|p| p["CPU"].as_f64().unwrap_or(0.0)).sum();
        let workers = ((cpus / a.worker_vcpus as f64).ceil() as u32).clamp(1, a.step.max(1));
        p.demand_reported_ms = now;
        out.push(Observation::ScaleUp {
            key: key.clone(),
            workers,
            message: format!("{} Ray tasks or actors are waiting for {cpus} CPUs in all", pending.len()),
        });
    }
    for node in state["nodes"].as_array().cloned().unwrap_or_default() {
        let Some(replica) = node["resources_total"]
            .as_object()
            .and_then(|r| r.keys().find_map(|k| k.strip_prefix("TY:").map(str::to_owned)))
        else {
            continue;
        };
        let idle_s = node["idle_s"].as_f64().unwrap_or(0.0);
        let idle = node["alive"].as_bool() == Some(true) && node["status"] == "IDLE";
        if !idle {
            p.idle_reported.remove(&replica);
        } else if idle_s >= a.idle_timeout_s as f64
            && !p.removed.contains(&replica)
            && p.idle_reported.insert(replica.clone())
        {
            out.push(Observation::ScaleDown {
                key: key.clone(),
                message: format!(
                    "{replica} has been idle for {idle_s:.0} s (idle timeout {} s)",
                    a.idle_timeout_s
                ),
                replica,
            });
        }
    }
}

/// Where an image pull stands.
/// An attempt waiting for its image from a registry: what the pull tolerance has counted so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fetch {
    /// What is pulled: the task's image, or the digest an earlier attempt of the task resolved it to.
    pub(super) reference: String,
    /// Failed pulls so far.
    pub(super) tries: u32,
    /// A failure was counted and the next pull waits until `next_at_ms`.
    pub(super) backing_off: bool,
    pub(super) next_at_ms: u64,
    /// When the first look was, and when progress was last said (0: never).
    pub(super) started_ms: u64,
    pub(super) noted_ms: u64,
}

impl Fetch {
    pub(super) fn new(reference: String) -> Fetch {
        Fetch { reference, tries: 0, backing_off: false, next_at_ms: 0, started_ms: 0, noted_ms: 0 }
    }
}

/// What to do about an attempt waiting for a registry image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fetched {
    Wait,
    /// Pull again (the backoff is over, or nobody is pulling it).
    Retry,
    /// The image is ready: prepare the attempt.
    Ready(trainyard_images::Image),
    /// The attempt ended (the observation was pushed).
    GaveUp,
}

/// After `tries` failed pulls under tolerance `tol` (-1 never spent, 0 no retries, N retries): None when the
/// tolerance is spent (with why), else the wait before the next pull (1 s doubling to 30 s).
fn next_pull(tries: u32, tol: i64) -> Result<u64, String> {
    if tol == 0 {
        return Err("the image pull tolerance allows no retries".to_owned());
    }
    if tol > 0 && i64::from(tries) > tol {
        return Err(format!("gave up after {tries} pulls ({tol} retries allowed)"));
    }
    Ok((1000u64 << (tries.max(1) - 1).min(5)).min(30_000))
}

/// How often an attempt's pull progress becomes an event.
pub(super) const PULL_PROGRESS_EVERY_MS: u64 = 5_000;

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// One look at a registry pull (`look`, from the image cache) for an attempt: progress said now and then,
/// the image handed over once ready, and a failure counted against the image pull tolerance: a failure that
/// another try cannot mend (not found, unauthorized, an image that cannot run here) ends the attempt at once;
/// the others are retried with backoff unless the tolerance is spent (`0`: none, `-1`: never spent).
pub(super) fn fetch(
    f: &mut Fetch,
    l: &Launched,
    look: trainyard_images::Look,
    now: u64,
    out: &mut Vec<Observation>,
) -> Fetched {
    use trainyard_images::{Look, Phase};
    let key = key_of(l);
    if f.started_ms == 0 {
        f.started_ms = now;
    }
    match look {
        Look::Unknown => Fetched::Retry,
        Look::Pulling { phase, done, total } => {
            if now.saturating_sub(f.noted_ms) >= PULL_PROGRESS_EVERY_MS && now > f.started_ms {
                f.noted_ms = now;
                let what = match phase {
                    Phase::Resolving => "resolving its reference".to_owned(),
                    Phase::Downloading if total > 0 => format!(
                        "{} of {} of layers ({}%)",
                        mib(done),
                        mib(total),
                        (done.min(total) * 100) / total
                    ),
                    Phase::Downloading => format!("{} of layers", mib(done)),
                    Phase::Unpacking => format!("{} of layers fetched; unpacking", mib(done)),
                };
                let message = format!("pulling image {}: {what}", f.reference);
                // The task's wait while it starts, too (`starting` in its view), as the Kubernetes backend says
                // a pod's waiting reason.
                out.push(Observation::Waiting { key: key.clone(), message: message.clone() });
                out.push(Observation::Note { key, reason: Reason::ImagePulling, message });
            }
            Fetched::Wait
        }
        Look::Ready(image) => {
            let secs = now.saturating_sub(f.started_ms) as f64 / 1000.0;
            let retried =
                if f.tries > 0 { format!(" after {} failed pulls", f.tries) } else { String::new() };
            out.push(Observation::Note {
                key,
                reason: Reason::ImagePulled,
                message: format!(
                    "image {} is {} (every attempt of this task runs these bytes); ready in {secs:.1} s{retried}",
                    f.reference,
                    image.digest
                ),
            });
            Fetched::Ready(image)
        }
        Look::Failed(e) => {
            if f.backing_off {
                if now < f.next_at_ms {
                    return Fetched::Wait;
                }
                f.backing_off = false;
                return Fetched::Retry;
            }
            f.tries += 1;
            let tries = f.tries;
            let backoff = match next_pull(tries, l.pull_tolerance) {
                Ok(wait) if e.class.retryable() => wait,
                spent => {
                    let why = spent.err().unwrap_or_else(|| "another try would fail the same way".to_owned());
                    out.push(Observation::Finished {
                        key,
                        reason: Reason::ImagePullFailed,
                        message: format!("{e}; {why}"),
                    });
                    return Fetched::GaveUp;
                }
            };
            f.backing_off = true;
            f.next_at_ms = now + backoff;
            let message = format!("{e}; pull {tries} failed, next try in {} s", backoff / 1000);
            out.push(Observation::Waiting { key: key.clone(), message: message.clone() });
            out.push(Observation::Note { key, reason: Reason::ImagePullBackOff, message });
            Fetched::Wait
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pulling {
    /// Failed pulls so far.
    pub(super) tries: u32,
    pub(super) next_at_ms: u64,
    /// The images this machine has, for the message.
    pub(super) available: String,
}

/// What to do about an attempt waiting for its image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pull {
    /// Not yet time to look again.
    Wait,
    /// The image is here: start the supervisors.
    Start,
    /// The tolerance is spent: the attempt ended (the observation was pushed).
    GaveUp,
    /// Another try later (a note was pushed).
    BackOff,
}

/// One look at the image: `here`, whether its root file system is on this machine now.
pub(super) fn pull(pl: &mut Pulling, l: &Launched, here: bool, now: u64, out: &mut Vec<Observation>) -> Pull {
    let key = key_of(l);
    if now < pl.next_at_ms {
        return Pull::Wait;
    }
    if here {
        if pl.tries > 0 {
            out.push(Observation::Note {
                key,
                reason: Reason::ImagePulled,
                message: format!("image {} is here after {} failed pulls", l.image, pl.tries),
            });
        }
        return Pull::Start;
    }
    pl.tries += 1;
    let tries = pl.tries;
    let why = format!("image {} is not available on this machine (available: {})", l.image, pl.available);
    let backoff = match next_pull(tries, l.pull_tolerance) {
        Ok(wait) => wait,
        Err(_) => {
            let tol = l.pull_tolerance;
            let allowed =
                if tol == 0 { "no retries allowed".to_owned() } else { format!("{tol} retries allowed") };
            out.push(Observation::Finished {
                key,
                reason: Reason::ImagePullFailed,
                message: format!("{why}; gave up after {tries} pulls ({allowed})"),
            });
            return Pull::GaveUp;
        }
    };
    pl.next_at_ms = now + backoff;
    out.push(Observation::Note {
        key,
        reason: Reason::ImagePullBackOff,
        message: format!("{why}; pull {tries} failed, next try in {} s", backoff / 1000),
    });
    Pull::BackOff
}

/// An outcome as kept in `outcome.json`, to be reported again after a restart.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Recorded {
    stopped: bool,
    /// Why it was stopped (absent in records written before causes were kept).
    #[serde(default)]
    cause: Option<StopCause>,
    reason: String,
    message: String,
}

impl Recorded {
    /// The observation that ended the attempt, said again.
    pub(super) fn observation(self, key: AttemptKey) -> Observation {
        if self.stopped {
            Observation::Stopped { key, cause: self.cause, message: self.message }
        } else {
            let reason = Reason::from_name(&self.reason).unwrap_or(Reason::UserError);
            Observation::Finished { key, reason, message: self.message }
        }
    }
}

impl From<&Observation> for Recorded {
    fn from(o: &Observation) -> Recorded {
        match o {
            Observation::Stopped { cause, message, .. } => {
                Recorded { stopped: true, cause: *cause, reason: String::new(), message: message.clone() }
            }
            Observation::Finished { reason, message, .. } => {
                Recorded { stopped: false, cause: None, reason: reason.to_string(), message: message.clone() }
            }
            _ => Recorded { stopped: false, cause: None, reason: String::new(), message: String::new() },
        }
    }
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
