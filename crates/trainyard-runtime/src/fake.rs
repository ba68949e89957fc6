//! A scripted backend: each attempt starts, (optionally) passes its precheck, runs for a set time and ends
//! as scripted, on the control loop's clock. It does what the real backends do at their interface and
//! nothing else, for control-loop tests and the simulator.

use crate::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

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
}

impl Backend for FakeBackend {
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let mut inner = self.lock();
        if inner.runs.contains_key(&spec.key) {
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
        let precheck = spec.task.spec.advanced.precheck.as_ref().is_some_and(|p| p.enabled);
        let now = inner.now_ms;
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
            },
        );
        inner.launches += 1;
        inner.specs.push(spec.clone());
        Ok(())
    }

    /// The fake's replicas are not real: a new shape is remembered as launched.
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
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
        let mut inner = self.lock();
        let now = inner.now_ms;
        if let Some(run) = inner.runs.get_mut(key)
            && run.stop_at.is_none()
            && !run.done
        {
            run.stop_cause = Some(cause);
            run.stop_at = Some(now + run.script.stop_ms);
        }
        Ok(())
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        let mut inner = self.lock();
        inner.now_ms = inner.now_ms.max(now_ms);
        let mut out = Vec::new();
        for (key, run) in inner.runs.iter_mut().filter(|(_, r)| !r.done) {
            let launched = *run.launched_at.get_or_insert(now_ms);
            if let Some(at) = run.stop_at {
                if now_ms >= at {
                    run.done = true;
                    out.push(Observation::Stopped {
                        key: key.clone(),
                        cause: run.stop_cause,
                        message: "every process ended".into(),
                    });
                }
                continue;
            }
            if run.started_at.is_none() && now_ms >= launched + run.script.start_ms {
                run.started_at = Some(now_ms);
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
                out.push(Observation::Finished { key: key.clone(), reason: run.script.outcome, message });
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

    async fn read_log(&self, _key: &AttemptKey, _replica: &str, _offset: u64, _max: usize) -> LogChunk {
        LogChunk { ended: true, missing: true, ..LogChunk::default() }
    }
}
