//! A scripted backend: each attempt starts, (optionally) passes its precheck, runs for a set time and ends
//! as scripted, on the control loop's clock. It does what the real backends do at their interface and
//! nothing else, for control-loop tests and the simulator.

use crate::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Where the fake backends of several servers on one store keep their runs, as a cluster keeps its jobs
/// (`trainyard up --backend fake` with `TRAINYARD_FAKE_CLUSTER`): a server that starts leading launches what
/// the store says runs, and finds the runs the last leader launched going on, on the same timeline, rather
/// than starting them again. Launches are counted there, so that a test sees each attempt launched once.
pub trait SharedRuns: Send + Sync + std::fmt::Debug {
    /// The run of an attempt some server launched, if there is one.
    fn find(&self, key: &AttemptKey) -> Option<SharedRun>;
    /// A run launched now: recorded, and its launch counted.
    fn launched(&self, key: &AttemptKey, run: &SharedRun);
    /// A run that moved on (started, asked to stop).
    fn update(&self, key: &AttemptKey, run: &SharedRun);
}

/// A run as the shared place keeps it: its timeline, on the servers' (wall) clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SharedRun {
    pub launched_at: u64,
    pub started_at: Option<u64>,
    pub stop_at: Option<u64>,
}

/// How one attempt behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// From launch until `Started`.
    pub start_ms: u64,
    /// From `Started` until it ends.
    pub run_ms: u64,
    /// How it ends: `Completed` for success, or a failure reason.
    pub outcome: Reason,
    /// From a stop request until `Stopped` (the checkpoint window).
    pub stop_ms: u64,
}

impl Default for Script {
    fn default() -> Self {
        Script { start_ms: 0, run_ms: 60_000, outcome: Reason::Completed, stop_ms: 0 }
    }
}

#[derive(Debug, Clone)]
struct Run {
    script: Script,
    launched_at: Option<u64>,
    started_at: Option<u64>,
    stop_at: Option<u64>,
    /// Why it is being stopped.
    stop_cause: Option<StopCause>,
    precheck: bool,
    done: bool,
    nodes: Vec<String>,
    /// Every replica it ever had, as (name, role), named as the real backends name them.
    replicas: Vec<(String, String)>,
    /// How it ended, as reported (kept to be reported again after a `restart`).
    ended: Option<Observation>,
    /// Since a `restart`: a started attempt says `Started` again, an ended one says how it ended when launched
    /// again.
    restarted: bool,
}

impl Run {
    fn shared(&self) -> SharedRun {
        SharedRun {
            launched_at: self.launched_at.unwrap_or(0),
            started_at: self.started_at,
            stop_at: self.stop_at,
        }
    }
}

/// The replicas of a launch, as (name, role).
fn replica_names(spec: &LaunchSpec) -> Vec<(String, String)> {
    spec.replicas
        .iter()
        .map(|r| (format!("{}-{}-{}", spec.task_name, r.role, r.index), r.role.clone()))
        .collect()
}

#[derive(Debug, Default)]
struct Inner {
    scripts: BTreeMap<String, Vec<Script>>,
    default: Script,
    runs: BTreeMap<AttemptKey, Run>,
    launches: u64,
    specs: Vec<LaunchSpec>,
    /// The clock of the last poll: the fake's "now" for launches and stops between polls.
    now_ms: u64,
    /// Launches still to refuse, per task (a backend that cannot take the attempt now).
    refusals: BTreeMap<String, u32>,
    /// Requests (launch, scale, stop) still to be lost (see `lose_requests`).
    to_lose: u32,
    /// Launches asked for an attempt that was running at the time (see `launches_while_alive`).
    launches_while_alive: Vec<AttemptKey>,
    /// Observations to report at the next poll, ahead of the rest (ends said again after a restart).
    replay: Vec<Observation>,
    /// Where the runs are shared with other servers' fake backends, if they are.
    shared: Option<std::sync::Arc<dyn SharedRuns>>,
}

/// The fake backend. Cloning shares the same state, so a test can keep a handle while the control loop
/// owns another, and a "restarted" control loop finds the attempts still alive.
#[derive(Debug, Clone, Default)]
pub struct FakeBackend {
    inner: std::sync::Arc<Mutex<Inner>>,
}

impl FakeBackend {
    pub fn new(default: Script) -> Self {
        let b = FakeBackend::default();
        b.lock().default = default;
        b
    }

    /// A fake backend whose runs are kept in `shared` with other servers' (see [`SharedRuns`]).
    pub fn shared(default: Script, shared: std::sync::Arc<dyn SharedRuns>) -> Self {
        let b = FakeBackend::new(default);
        b.lock().shared = Some(shared);
        b
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic in a test while holding the lock poisons it; the state is still consistent for the rest.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scripts the next attempts of a task, in order; later attempts use the default.
    pub fn script(&self, task_id: &str, scripts: Vec<Script>) {
        self.lock().scripts.insert(task_id.to_owned(), scripts);
    }

    /// Refuses the next `n` launches of a task with a [`BackendError`], as a backend that is down would.
    pub fn refuse_launches(&self, task_id: &str, n: u32) {
        self.lock().refusals.insert(task_id.to_owned(), n);
    }

    /// How many launches were accepted (a second launch of one attempt does not count).
    pub fn launches(&self) -> u64 {
        self.lock().launches
    }

    /// Every launch accepted, in order (what a real backend would have been given).
    pub fn launched(&self) -> Vec<LaunchSpec> {
        self.lock().specs.clone()
    }

    /// Every attempt with a replica on `node` fails at the next poll, as when the machine is lost.
    pub fn fail_node(&self, node: &str) {
        let mut inner = self.lock();
        for run in inner.runs.values_mut().filter(|r| !r.done && r.nodes.iter().any(|n| n == node)) {
            run.script.outcome = Reason::NodeFailed;
            run.script.start_ms = 0;
            run.script.run_ms = 0;
        }
    }

    /// The next `n` requests (launch, scale, stop) fail and change nothing, as when the backend cannot be
    /// reached, or the server died between committing a decision and acting on it.
    pub fn lose_requests(&self, n: u32) {
        self.lock().to_lose = n;
    }

    /// The backend restarted and forgot what it had reported: as the local backend does from its files, a
    /// started attempt reports `Started` again at the next poll, and an ended one reports how it ended when it
    /// is launched again. Attempts keep running.
    pub fn restart(&self) {
        for run in self.lock().runs.values_mut() {
            run.restarted = true;
        }
    }

    /// Forgets every run: they were this process's simulation, and a server that stops leading hands them to
    /// the next leader, which launches them again (as reattaching, for a backend whose runs live elsewhere).
    pub fn abandon(&self) {
        self.lock().runs.clear();
    }

    /// Launches asked for an attempt while it was running (the control loop should only relaunch what it
    /// knows is gone).
    pub fn launches_while_alive(&self) -> Vec<AttemptKey> {
        self.lock().launches_while_alive.clone()
    }

    /// Spends one lost request, if any are left to lose.
    fn lost(&self) -> Result<(), BackendError> {
        let mut inner = self.lock();
        if inner.to_lose == 0 {
            return Ok(());
        }
        inner.to_lose -= 1;
        Err(BackendError("fake backend: request lost".into()))
    }
}

impl Backend for FakeBackend {
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        self.lost()?;
        let mut inner = self.lock();
        if let Some(run) = inner.runs.get_mut(&spec.key) {
            let replay = if run.done && run.restarted { run.ended.clone() } else { None };
            run.restarted &= !run.done;
            let alive = !run.done;
            if alive {
                inner.launches_while_alive.push(spec.key.clone());
            }
            inner.replay.extend(replay);
            return Ok(());
        }
        let precheck = spec.task.spec.advanced.precheck.as_ref().is_some_and(|p| p.enabled);
        if let Some(found) = inner.shared.as_ref().and_then(|s| s.find(&spec.key)) {
            // Launched by another server, and going on: taken over where it stands (it says Started again,
            // harmlessly, and ends on its own timeline).
            let script = inner.default.clone();
            inner.runs.insert(
                spec.key.clone(),
                Run {
                    script,
                    launched_at: Some(found.launched_at),
                    started_at: found.started_at,
                    stop_at: found.stop_at,
                    stop_cause: None,
                    precheck,
                    done: false,
                    nodes: spec.replicas.iter().map(|r| r.node.clone()).collect(),
                    replicas: replica_names(spec),
                    ended: None,
                    restarted: true,
                },
            );
            return Ok(());
        }
        if let Some(n) = inner.refusals.get_mut(&spec.key.task_id).filter(|n| **n > 0) {
            *n -= 1;
            return Err(BackendError("the fake backend was told to refuse this launch".into()));
        }
        let script = {
            let default = inner.default.clone();
            inner
                .scripts
                .get_mut(&spec.key.task_id)
                .filter(|s| !s.is_empty())
                .map(|s| s.remove(0))
                .unwrap_or(default)
        };
        let now = inner.now_ms;
        if let Some(shared) = &inner.shared {
            shared.launched(&spec.key, &SharedRun { launched_at: now, started_at: None, stop_at: None });
        }
        inner.runs.insert(
            spec.key.clone(),
            Run {
                script,
                launched_at: Some(now),
                started_at: None,
                stop_at: None,
                stop_cause: None,
                precheck,
                done: false,
                nodes: spec.replicas.iter().map(|r| r.node.clone()).collect(),
                replicas: replica_names(spec),
                ended: None,
                restarted: false,
            },
        );
        inner.launches += 1;
        inner.specs.push(spec.clone());
        Ok(())
    }

    /// The fake's replicas are not real: a new shape is remembered as launched.
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        self.lost()?;
        let mut inner = self.lock();
        if let Some(run) = inner.runs.get_mut(&spec.key) {
            run.nodes = spec.replicas.iter().map(|r| r.node.clone()).collect();
            for r in replica_names(spec) {
                if !run.replicas.contains(&r) {
                    run.replicas.push(r);
                }
            }
        }
        inner.specs.push(spec.clone());
        Ok(())
    }

    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        self.lost()?;
        let mut inner = self.lock();
        let now = inner.now_ms;
        let inner = &mut *inner;
        if let Some(run) = inner.runs.get_mut(key)
            && run.stop_at.is_none()
            && !run.done
        {
            run.stop_cause = Some(cause);
            run.stop_at = Some(now + run.script.stop_ms);
            if let Some(shared) = &inner.shared {
                shared.update(key, &run.shared());
            }
        }
        Ok(())
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        let mut inner = self.lock();
        inner.now_ms = inner.now_ms.max(now_ms);
        let mut out = std::mem::take(&mut inner.replay);
        let shared = inner.shared.clone();
        for (key, run) in inner.runs.iter_mut().filter(|(_, r)| !r.done) {
            let launched = *run.launched_at.get_or_insert(now_ms);
            // Whatever it reports from here on is news to whoever polls after a restart.
            let restarted = std::mem::take(&mut run.restarted);
            if let Some(at) = run.stop_at {
                if now_ms >= at {
                    run.done = true;
                    let stopped = Observation::Stopped {
                        key: key.clone(),
                        cause: run.stop_cause,
                        message: "every process ended".into(),
                    };
                    run.ended = Some(stopped.clone());
                    out.push(stopped);
                }
                continue;
            }
            if restarted && run.started_at.is_some() {
                out.push(Observation::Started { key: key.clone(), precheck: run.precheck });
                if run.precheck {
                    out.push(Observation::PrecheckPassed {
                        key: key.clone(),
                        message: "fake precheck".into(),
                    });
                }
            }
            if run.started_at.is_none() && now_ms >= launched + run.script.start_ms {
                run.started_at = Some(now_ms);
                if let Some(shared) = &shared {
                    shared.update(key, &run.shared());
                }
                out.push(Observation::Started { key: key.clone(), precheck: run.precheck });
                if run.precheck {
                    out.push(Observation::PrecheckPassed {
                        key: key.clone(),
                        message: "fake precheck".into(),
                    });
                }
            }
            if let Some(started) = run.started_at
                && now_ms >= started + run.script.run_ms
            {
                run.done = true;
                let message = match run.script.outcome {
                    Reason::Completed => "fake backend: scripted success (nothing was run)".to_owned(),
                    other => format!("fake backend: scripted failure {other}"),
                };
                let finished =
                    Observation::Finished { key: key.clone(), reason: run.script.outcome, message };
                run.ended = Some(finished.clone());
                out.push(finished);
            }
        }
        out
    }

    async fn alive(&self) -> Vec<AttemptKey> {
        self.lock().runs.iter().filter(|(_, r)| !r.done).map(|(k, _)| k.clone()).collect()
    }

    /// The fake runs nothing, so it names no replicas and keeps no logs.
    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)> {
        self.lock().runs.get(key).map(|r| r.replicas.clone()).unwrap_or_default()
    }

    async fn read_metrics(&self, _key: &AttemptKey, _since_ms: u64) -> Vec<MetricPoint> {
        Vec::new()
    }

    /// A fake replica runs no process: its log is there and empty, and ends with its run.
    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, _max: usize) -> LogChunk {
        let inner = self.lock();
        match inner.runs.get(key).filter(|r| r.replicas.iter().any(|(n, _)| n == replica)) {
            Some(run) => LogChunk { next: offset, ended: run.done, ..LogChunk::default() },
            None => LogChunk { ended: true, missing: true, ..LogChunk::default() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake's calls never wait: one poll of the future finishes them.
    fn now<T>(f: impl std::future::Future<Output = T>) -> T {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => unreachable!("the fake backend never waits"),
        }
    }

    fn spec(task_id: &str) -> LaunchSpec {
        LaunchSpec {
            key: AttemptKey { task_id: task_id.into(), attempt: 0 },
            task_name: task_id.into(),
            owner: "alice".into(),
            task: TrainingTask::default(),
            replicas: Vec::new(),
            option: 0,
            catalog: Default::default(),
            registry_logins: Default::default(),
            workdir_token: None,
        }
    }

    #[test]
    fn lost_requests_change_nothing_and_the_next_ones_go_through() {
        let b = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
        b.lose_requests(1);
        assert!(now(b.launch(&spec("t"))).is_err());
        assert!(now(b.alive()).is_empty());
        now(b.launch(&spec("t"))).unwrap();
        assert_eq!(now(b.alive()), [spec("t").key]);
        now(b.launch(&spec("t"))).unwrap();
        assert_eq!(b.launches_while_alive(), [spec("t").key], "a launch of a running attempt is noted");
    }

    #[test]
    fn after_a_restart_a_running_attempt_says_started_again_and_an_ended_one_its_end_when_launched() {
        let b = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
        now(b.launch(&spec("running"))).unwrap();
        now(b.launch(&spec("ended"))).unwrap();
        now(b.poll(0));
        now(b.stop(&spec("ended").key, StopCause::UserStop)).unwrap();
        let first = now(b.poll(10));
        assert!(matches!(&first[..], [Observation::Stopped { .. }]), "{first:?}");
        b.restart();
        let again = now(b.poll(20));
        assert!(
            matches!(&again[..], [Observation::Started { key, .. }] if key.task_id == "running"),
            "{again:?}"
        );
        assert!(now(b.poll(30)).is_empty(), "said once");
        now(b.launch(&spec("ended"))).unwrap();
        assert_eq!(now(b.poll(40)), first, "the end, again");
        now(b.launch(&spec("ended"))).unwrap();
        assert!(now(b.poll(50)).is_empty(), "said once");
    }
}
