//! The local backend: every admitted replica becomes a sandboxed process tree on this machine, watched by a
//! supervisor process of our own binary (see [`supervisor`]).
//!
//! Layout under the runs dir (kept after the attempt ends, except the scratch dirs):
//!
//! ```text
//! runs/TASK_ID/aN/launch.json      what was launched (no env: hidden values never reach the disk)
//! runs/TASK_ID/aN/outcome.json     the observation that ended the attempt, once it ended
//! runs/TASK_ID/aN/hosts            every replica's hostname and address, bound at /etc/hosts
//! runs/TASK_ID/aN/passwd, group    the sandbox's users (the image's and `trainyard`)
//! runs/TASK_ID/aN/ssh/             the attempt's key pair and host key (passwordless SSH)
//! runs/TASK_ID/aN/REPLICA/         state.json, events.jsonl, log, stop.json, runtime/, scratch/
//! ```
//!
//! The server only reads what supervisors write, so a restarted server rebuilds its view from these files
//! ([`LocalBackend::new`] reattaches to every attempt without an outcome) and the training goes on.
//!
//! Ownership: the data dir and everything on the way to a replica's own dirs is `root:SANDBOX_GID` mode
//! 0710 (the sandboxes' bubblewrap, running as their uid with that gid, may pass through, nobody may list);
//! logs, state and keys are root's, 0600/0644 in those dirs; a replica's scratch and runtime dir belong to
//! the attempt's uid ([`UID_BASE`] + a slot no live attempt holds). Volumes Trainyard creates are
//! `root:SANDBOX_GID` 2770, so the next attempts (other uids) can write what earlier ones wrote.
//!
//! The files: `config` (the backend's settings and what `up` reports), `prepare` (an attempt's dirs, files and
//! supervisor jobs), `files` (ownership, passages, uid slots), `ray` and `ssh` (their commands and material),
//! `outcome` (progress and the verdict from what supervisors wrote), and, run by each replica's supervisor,
//! `supervisor`, `sandbox` (bubblewrap's command line), `seccomp`, `netns` and `netlink` (its network),
//! `procs`, `metrics`, `spawn`, `logfile`, `runtime_dir`, `scratch` and `clock`. This file holds the backend's state and the `Backend` implementation.

mod clock;
mod config;
mod files;
mod logfile;
pub mod metrics;
pub mod netlink;
pub mod netns;
mod outcome;
mod prepare;
pub mod procs;
mod ray;
mod runtime_dir;
pub mod sandbox;
mod scratch;
pub mod seccomp;
mod spawn;
mod ssh;
pub mod supervisor;

pub use config::*;
pub use files::make_passage;
use files::*;
use outcome::*;
pub use prepare::PRECHECK_PY;
pub use ray::RAY_PROBE_PY;
use ray::*;
use ssh::*;

use crate::*;
use sandbox::{Mount, RUNTIME_DIR, SandboxPlan};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use supervisor::{Event, Phase, ReplicaJob, ReplicaState, StopRequest};
use trainyard_core::failure::{Exit, classify};
use trainyard_core::spec::TaskType;

/// One replica as launched (saved in `launch.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Replica {
    name: String,
    role: String,
    node: String,
    /// GPU indices handed to it.
    devices: Vec<u32>,
    /// Its place in the attempt's network range (its address, its port on the bridge); kept for its life.
    #[serde(default)]
    slot: usize,
}

/// What was launched, without the env.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Launched {
    task_id: String,
    attempt: i64,
    /// The attempt's host uid (its replicas' processes and their own dirs).
    #[serde(default)]
    uid: u32,
    /// The attempt has a network of its own (more than one replica, or autoscaling).
    #[serde(default)]
    networked: bool,
    task_type: String,
    image: String,
    replicas: Vec<Replica>,
    mount_paths: Vec<String>,
    checkpoint: Option<(u64, i32)>,
    precheck: bool,
    /// Image pull tolerance: -1 never trips, 0 fails at once, N retries.
    pull_tolerance: i64,
    /// RayJob: the first of each node's ports (every node has a network namespace of its own).
    #[serde(default)]
    ray_base: u16,
    /// RayJob shared storage dir, removed when the attempt ends if asked.
    #[serde(default)]
    cleanup: Option<PathBuf>,
    /// RayJob autoscaling.
    #[serde(default)]
    autoscale: Option<Autoscale>,
}

/// A RayJob's autoscaling, as the backend applies it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Autoscale {
    idle_timeout_s: u64,
    /// Most workers asked for at once (Conservative: 1).
    step: u32,
    /// vCPUs of one worker, to turn pending CPU demand into workers.
    worker_vcpus: u64,
}

#[derive(Debug)]
enum Stage {
    /// Waiting for the image; `tries` failed pulls so far.
    Pulling {
        tries: u32,
        next_at_ms: u64,
        jobs: Vec<ReplicaJob>,
        available: String,
    },
    Running,
}

#[derive(Debug)]
struct Run {
    dir: PathBuf,
    l: Launched,
    stage: Stage,
    children: Vec<std::process::Child>,
    started: bool,
    prechecked: bool,
    stop: Option<StopCause>,
    /// The outcome decided while replicas are still ending: (reason, message).
    verdict: Option<(Reason, String)>,
    /// When the remaining replicas are told to stop (grace after the master's success, debug retention).
    stop_others_at: Option<u64>,
    stopped_others: bool,
    offsets: BTreeMap<String, u64>,
    /// Replicas taken away by autoscaling: their end is not a failure.
    removed: BTreeSet<String>,
    /// Autoscaling: when demand was last reported, and the idle workers already reported.
    demand_reported_ms: u64,
    idle_reported: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<AttemptKey, Run>,
    /// Finished attempts whose outcome is re-reported when launched again (a restart in between).
    replay: Vec<Observation>,
}

/// The local backend. Cloning shares the state.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    cfg: Arc<LocalConfig>,
    inner: Arc<Mutex<Inner>>,
}

fn attempt_dir(runs: &Path, key: &AttemptKey) -> PathBuf {
    runs.join(&key.task_id).join(format!("a{}", key.attempt))
}

fn signal_number(s: trainyard_core::spec::CheckpointSignal) -> i32 {
    use trainyard_core::spec::CheckpointSignal as S;
    match s {
        S::Sigusr1 => procs::SIGUSR1,
        S::Sigusr2 => procs::SIGUSR2,
        S::Sigterm => procs::SIGTERM,
        S::Sigint => procs::SIGINT,
    }
}

fn read_state(dir: &Path) -> Option<ReplicaState> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

/// The last `max` bytes of a replica's log, without the timestamps.
fn log_tail(dir: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(dir.join("log")) else { return String::new() };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .lines()
        .map(|l| l.splitn(3, ' ').nth(2).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

impl LocalBackend {
    /// Opens the runs dir and reattaches to every attempt that has not ended.
    pub fn new(cfg: LocalConfig) -> std::io::Result<LocalBackend> {
        std::fs::create_dir_all(&cfg.runs_dir)?;
        // Networks of attempts that are gone for good (a crash, a deleted data dir) go now.
        if let Some(ip) = &cfg.ip {
            switches::sweep(ip);
        }
        let mut inner = Inner::default();
        for task in std::fs::read_dir(&cfg.runs_dir)?.flatten() {
            for attempt in std::fs::read_dir(task.path())?.flatten() {
                let dir = attempt.path();
                if dir.join("outcome.json").exists() {
                    continue;
                }
                let Some(l) = std::fs::read(dir.join("launch.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Launched>(&b).ok())
                else {
                    continue;
                };
                let key = AttemptKey { task_id: l.task_id.clone(), attempt: l.attempt };
                let offsets = l
                    .replicas
                    .iter()
                    .map(|r| {
                        let at = std::fs::read_to_string(dir.join(&r.name).join("events.offset"))
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .unwrap_or(0);
                        (r.name.clone(), at)
                    })
                    .collect();
                // Never spawned (still waiting for its image): the env went with the old server, so the control
                // loop launches it again.
                if !dir.join("spawned").exists() {
                    continue;
                }
                let stage = Stage::Running;
                inner.runs.insert(key, Run::new(dir, l, stage, Vec::new(), offsets));
            }
        }
        Ok(LocalBackend { cfg: Arc::new(cfg), inner: Arc::new(Mutex::new(inner)) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// GPU indices in use per node by attempts that hold them.
    fn gpus_in_use(inner: &Inner) -> BTreeMap<String, BTreeSet<u32>> {
        let mut used: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for run in inner.runs.values() {
            for r in &run.l.replicas {
                used.entry(r.node.clone()).or_default().extend(r.devices.iter().copied());
            }
        }
        used
    }
}

impl Backend for LocalBackend {
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let mut inner = self.lock();
        let Some(run) = inner.runs.get(&spec.key) else { return Ok(()) };
        if run.stop.is_some() || run.verdict.is_some() || !matches!(run.stage, Stage::Running) {
            return Ok(());
        }
        let (base, have) = (run.l.ray_base, run.l.replicas.clone());
        let (_, mut l, jobs) = self.prepare(spec, &inner, Some(base)).map_err(BackendError)?;
        let run = inner.runs.get_mut(&spec.key).expect("checked above");
        // Replicas that stay keep what they were given (their GPUs above all).
        for r in l.replicas.iter_mut() {
            if let Some(old) = have.iter().find(|o| o.name == r.name) {
                *r = old.clone();
            }
        }
        let known: BTreeSet<&str> = have.iter().map(|r| r.name.as_str()).collect();
        let wanted: BTreeSet<String> = l.replicas.iter().map(|r| r.name.clone()).collect();
        let new: Vec<ReplicaJob> = jobs.into_iter().filter(|j| !known.contains(j.name.as_str())).collect();
        for j in &new {
            run.offsets.insert(j.name.clone(), 0);
        }
        // Replicas leaving: stopped like any stop, and remembered so their end is no failure.
        let req = StopRequest {
            checkpoint: false,
            checkpoint_timeout_s: 0,
            signal: procs::SIGTERM,
            grace_s: self.cfg.grace_s,
        };
        for r in have.iter().filter(|r| !wanted.contains(&r.name)) {
            run.removed.insert(r.name.clone());
            l.replicas.push(r.clone());
        }
        run.stop_replicas(|r| run.removed.contains(&r.name), &req);
        run.l = l;
        let bytes = serde_json::to_vec_pretty(&run.l).map_err(|e| BackendError(e.to_string()))?;
        let _ = write_atomic(&run.dir.join("launch.json"), &bytes);
        let children = self.spawn(&run.dir, &new);
        run.children.extend(children);
        Ok(())
    }

    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let mut inner = self.lock();
        if inner.runs.contains_key(&spec.key) {
            return Ok(());
        }
        let dir = attempt_dir(&self.cfg.runs_dir, &spec.key);
        if let Ok(bytes) = std::fs::read(dir.join("outcome.json")) {
            // It ended while nobody listened: say so again.
            if let Ok(r) = serde_json::from_slice::<Recorded>(&bytes) {
                inner.replay.push(r.observation(spec.key.clone()));
            }
            return Ok(());
        }
        if dir.join("spawned").exists() {
            // Supervisors were started by an earlier server and are gone without a record: a lost attempt.
            inner.replay.push(Observation::Finished {
                key: spec.key.clone(),
                reason: Reason::NodeFailed,
                message: "the replicas of this attempt were lost (the machine restarted?)".into(),
            });
            return Ok(());
        }
        let (dir, l, jobs) = match self.prepare(spec, &inner, None) {
            Ok(prepared) => prepared,
            Err(why) => {
                // Ended as the machine's failure, with its reason, and recorded: not tried again on every tick
                // without a word. The fault-tolerance budget decides whether another attempt follows.
                let obs = Observation::Finished {
                    key: spec.key.clone(),
                    reason: Reason::NodeFailed,
                    message: format!("the attempt could not be prepared on this machine: {why}"),
                };
                let _ = write_atomic(
                    &dir.join("outcome.json"),
                    &serde_json::to_vec(&Recorded::from(&obs)).unwrap_or_default(),
                );
                if let Some(ip) = &self.cfg.ip {
                    let switch = netns::attempt_name(&spec.key.task_id, spec.key.attempt);
                    netns::delete_switch(ip, &switch);
                    switches::forget(&switch);
                }
                inner.replay.push(obs);
                return Ok(());
            }
        };
        // The pull: `host` and registered root file systems are here at once; anything else is retried (or
        // fails) as the image pull tolerance says, on the next polls.
        let (stage, children) = if jobs.first().is_some_and(|j| j.sandbox.root.is_dir()) {
            let children = self.spawn(&dir, &jobs);
            (Stage::Running, children)
        } else {
            (
                Stage::Pulling { tries: 0, next_at_ms: 0, jobs, available: Self::available_images(spec) },
                Vec::new(),
            )
        };
        let offsets = l.replicas.iter().map(|r| (r.name.clone(), 0)).collect();
        inner.runs.insert(spec.key.clone(), Run::new(dir, l, stage, children, offsets));
        Ok(())
    }

    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        let mut inner = self.lock();
        let grace = self.cfg.grace_s;
        let Some(run) = inner.runs.get_mut(key) else { return Ok(()) };
        if run.stop.is_some() {
            return Ok(());
        }
        run.stop = Some(cause);
        if let Stage::Pulling { jobs, .. } = &mut run.stage {
            // Nothing runs yet; the next poll reports it stopped.
            jobs.clear();
            for r in &run.l.replicas {
                ReplicaState::ended(supervisor::ExitRecord { stopped: true, ..Default::default() })
                    .write(&run.dir.join(&r.name));
            }
            run.stage = Stage::Running;
            return Ok(());
        }
        let checkpoint = match cause {
            StopCause::NodeFailed => None,
            _ => run.l.checkpoint,
        };
        let req = StopRequest {
            checkpoint: checkpoint.is_some(),
            checkpoint_timeout_s: checkpoint.map_or(0, |c| c.0),
            signal: checkpoint.map_or(procs::SIGTERM, |c| c.1),
            grace_s: if cause == StopCause::NodeFailed { 0 } else { grace },
        };
        run.stop_replicas(|_| true, &req);
        Ok(())
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        // The caller's clock (the server's: wall-clock milliseconds, as supervisors stamp their records).
        let now = now_ms;
        let mut inner = self.lock();
        let mut out: Vec<Observation> = std::mem::take(&mut inner.replay);
        let mut ended = Vec::new();
        for (key, run) in inner.runs.iter_mut() {
            let before = out.len();
            if self.advance(run, now, &mut out) {
                if let Some(last) = out[before..].last() {
                    self.finish(run, last);
                }
                ended.push(key.clone());
            }
        }
        for key in ended {
            inner.runs.remove(&key);
        }
        out
    }

    async fn alive(&self) -> Vec<AttemptKey> {
        self.lock().runs.keys().cloned().collect()
    }

    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)> {
        self.replica_names(key)
    }

    async fn read_metrics(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint> {
        let dir = attempt_dir(&self.cfg.runs_dir, key);
        let mut out = Vec::new();
        for (replica, _) in self.replica_names(key) {
            let Ok(text) = std::fs::read_to_string(dir.join(&replica).join("metrics.jsonl")) else {
                continue;
            };
            for line in text.lines() {
                if let Ok(p) = serde_json::from_str::<metrics::Point>(line)
                    && p.t > since_ms
                {
                    out.push(MetricPoint {
                        replica: replica.clone(),
                        at_ms: p.t,
                        name: p.n,
                        labels: p.l,
                        value: p.v,
                    });
                }
            }
        }
        out
    }

    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, max: usize) -> LogChunk {
        if !self.replica_names(key).iter().any(|(n, _)| n == replica) {
            return LogChunk { ended: true, missing: true, ..LogChunk::default() };
        }
        let rdir = attempt_dir(&self.cfg.runs_dir, key).join(replica);
        // Read `ended` first: a replica that ended before the read has its whole log on disk.
        let ended = read_state(&rdir).is_some_and(|s| s.phase == Phase::Exited)
            || attempt_dir(&self.cfg.runs_dir, key).join("outcome.json").exists();
        // Offsets count the replica's whole output; `log` starts at `log.base`, and the rotated `log.1` holds
        // what came just before it (anything older was dropped: a read from there starts at `log.1`).
        let base = logfile::log_base(&rdir);
        let old_len = std::fs::metadata(rdir.join("log.1")).map_or(0, |m| m.len());
        let offset = offset.max(base.saturating_sub(old_len));
        let (file, at) =
            if offset < base { ("log.1", offset + old_len - base) } else { ("log", offset - base) };
        let mut data = Vec::new();
        if let Ok(mut f) = std::fs::File::open(rdir.join(file))
            && f.seek(std::io::SeekFrom::Start(at)).is_ok()
        {
            let _ = f.by_ref().take(max as u64).read_to_end(&mut data);
        }
        // The rest of `log.1` was read: go on into `log`.
        if file == "log.1"
            && offset + (data.len() as u64) == base
            && data.len() < max
            && let Ok(f) = std::fs::File::open(rdir.join("log"))
        {
            let _ = f.take((max - data.len()) as u64).read_to_end(&mut data);
        }
        // Hand out whole lines only (the rest comes with the next read), unless one line exceeds `max`.
        let whole = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole > 0 {
            data.truncate(whole);
        }
        let next = offset + data.len() as u64;
        let end = base + std::fs::metadata(rdir.join("log")).map_or(0, |m| m.len());
        let more = end > next;
        LogChunk { data, next, ended: ended && !more, missing: false }
    }
}
