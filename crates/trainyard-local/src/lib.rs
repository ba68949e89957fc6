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
//! runs/TASK_ID/aN/REPLICA/         state.json, events.jsonl, log, stop.json, ray-state.json (the head's)
//! runs/TASK_ID/aN/REPLICA/scratch/ tmp/, root/, run/ (the runtime dir): the replica's scratch file system
//!                                  (scratch.img beside it), mounted where only its sandbox sees it
//! runs/TASK_ID/aN/REPLICA/rootfs/  where a registry image's root is mounted (an overlay of it), seen by the
//!                                  sandbox only; an empty dir on the host
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
//! The files: `config` (the backend's settings and what `up` reports), `layout` (every path of an attempt),
//! `plan` (pure: each replica's name, GPUs, place on the network, env, mounts and job), `prepare` (what the
//! machine holds resolved, the attempt's dirs and files written, supervisors started), `pool` (supervisors
//! started ahead of need), `files` (ownership,
//! passages, uid slots), `ray` and `ssh` (their commands and material), `outcome` (pure: progress and the
//! verdict from what supervisors wrote), `progress` (reads those files and carries out the decisions), and,
//! run by each replica's supervisor, `supervisor`, `sandbox` (bubblewrap's command line), `seccomp`, `netns`
//! and `netlink` (its network), `procs`, `metrics`, `spawn`, `logfile`, `runtime_dir`, `scratch`,
//! `root_image` (the image's root as a file system of its own) and `clock`.
//! This file holds the backend's state and the `Backend` implementation.

pub(crate) use trainyard_runtime::clock;
mod config;
mod files;
mod layout;
mod logfile;
pub mod metrics;
pub mod netlink;
pub mod netns;
mod outcome;
mod plan;
mod pool;
mod prepare;
pub mod procs;
mod progress;
mod ray;
mod records;
pub mod root_image;
mod runtime_dir;
pub mod sandbox;
mod scratch;
pub mod seccomp;
mod spawn;
pub(crate) mod ssh;
pub mod supervisor;

pub use config::*;
pub use files::make_passage;
use files::*;
use layout::AttemptLayout;
use outcome::{Fetch, Fetched, LOG_TAIL_BYTES, Progress, Pull, Pulling, Recorded, Seen};
use plan::{Launched, Replica};
pub use prepare::PRECHECK_PY;
pub use ray::RAY_PROBE_PY;
use ray::*;
use ssh::*;

use sandbox::{Mount, RUNTIME_DIR};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use supervisor::{Event, Phase, ReplicaJob, ReplicaState, StopRequest};
use trainyard_core::lifecycle::Reason;
use trainyard_core::spec::TaskType;
use trainyard_runtime::*;

#[derive(Debug)]
enum Stage {
    /// Waiting for its image from a registry; nothing of it is made yet.
    Fetching(Box<Fetching>),
    /// Its network, dirs and files are being made, and its supervisors started, by a thread of its own.
    Preparing,
    /// Waiting for the image.
    Pulling {
        pulling: Pulling,
        jobs: Vec<ReplicaJob>,
    },
    Running,
}

/// What an attempt waiting for a registry image keeps until it can be prepared.
#[derive(Debug)]
struct Fetching {
    spec: LaunchSpec,
    replicas: Vec<Replica>,
    f: Fetch,
    access: trainyard_images::Access,
}

#[derive(Debug)]
struct Run {
    dir: PathBuf,
    l: Launched,
    stage: Stage,
    /// The registry image it runs (kept for replicas added later).
    pulled: Option<plan::Pulled>,
    children: Vec<std::process::Child>,
    /// What was decided so far.
    p: Progress,
    /// How far each replica's `events.jsonl` was read.
    offsets: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<AttemptKey, Run>,
    /// Finished attempts whose outcome is re-reported when launched again (a restart in between).
    replay: Vec<Observation>,
}

/// How the image cache reaches the registries a task's image may come from.
fn access(spec: &LaunchSpec) -> trainyard_images::Access {
    trainyard_images::Access {
        registries: spec.catalog.registries.clone(),
        credentials: spec
            .registry_logins
            .iter()
            .map(|(host, l)| {
                (
                    host.clone(),
                    trainyard_images::Credential {
                        username: l.username.clone(),
                        password: l.password.clone(),
                    },
                )
            })
            .collect(),
    }
}

/// The digest a task's earlier attempt resolved its image to (`runs/TASK/image.json`), so that every attempt
/// of a task runs the same bytes; None when the task's image is another now.
fn pinned_image(runs_dir: &Path, task_id: &str, reference: &str) -> Option<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs_dir.join(task_id).join("image.json")).ok()?).ok()?;
    (v["reference"].as_str() == Some(reference)).then(|| v["pinned"].as_str().map(str::to_owned)).flatten()
}

fn pin_image(runs_dir: &Path, task_id: &str, reference: &str, image: &trainyard_images::Image) {
    let v = serde_json::json!({"reference": reference, "pinned": image.pinned(), "digest": image.digest});
    let _ = write_atomic(&runs_dir.join(task_id).join("image.json"), v.to_string().as_bytes());
}

/// The local backend. Cloning shares the state.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    cfg: Arc<LocalConfig>,
    inner: Arc<Mutex<Inner>>,
    /// Supervisors started ahead of need.
    pool: Arc<pool::SupervisorPool>,
}

fn read_state(replica_dir: &Path) -> Option<ReplicaState> {
    serde_json::from_slice(&std::fs::read(replica_dir.join(layout::STATE_JSON)).ok()?).ok()
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
    /// Whether an attempt of this server may still run (its replicas outlive the server).
    pub fn attempts_live(&self) -> bool {
        files::slots::any_live_under(&self.cfg.runs_dir)
    }

    pub fn new(cfg: LocalConfig) -> std::io::Result<LocalBackend> {
        std::fs::create_dir_all(&cfg.runs_dir)?;
        files::spread_subdirs(&cfg.runs_dir);
        // Networks of attempts that are gone for good (a crash, a deleted data dir) go now.
        if let Some(ip) = &cfg.ip {
            switches::sweep(ip);
        }
        let mut inner = Inner::default();
        let mut ended = Vec::new();
        for task in std::fs::read_dir(&cfg.runs_dir)?.flatten() {
            for attempt in std::fs::read_dir(task.path())?.flatten() {
                let dir = attempt.path();
                let layout = AttemptLayout::at(&dir);
                if layout.outcome_json().exists() {
                    ended.push(dir);
                    continue;
                }
                let Some(l) = std::fs::read(layout.launch_json())
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
                        let at = std::fs::read_to_string(layout.replica(&r.name).events_offset())
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .unwrap_or(0);
                        (r.name.clone(), at)
                    })
                    .collect();
                // Never spawned (still waiting for its image): the env went with the old server, so the control
                // loop launches it again.
                if !layout.spawned().exists() {
                    continue;
                }
                let stage = Stage::Running;
                inner.runs.insert(key, Run::new(dir, l, stage, Vec::new(), offsets));
            }
        }
        // Scratch an ended replica left when the server stopped between moving it aside and deleting it.
        std::thread::spawn(move || {
            for dir in ended {
                progress::delete_scratch_left_in(&dir);
            }
        });
        // Pooled supervisors killed while they waited left their cgroups; then the pool is filled.
        pool::sweep();
        pool::sweep_scratch(&cfg.runs_dir.join("-"));
        if let Err(why) = procs::weigh_replicas_together() {
            eprintln!("trainyard: replicas keep the default CPU weight together: {why}");
        }
        if let Err(why) = procs::weigh_server() {
            eprintln!("trainyard: the server keeps the root cgroup's CPU weight: {why}");
        }
        let scratch = Some((cfg.limits.scratch_mib, cfg.limits.scratch_inodes));
        let pool =
            Arc::new(pool::SupervisorPool::new(&cfg.supervisor, &cfg.runs_dir, cfg.supervisor_pool, scratch));
        pool.fill();
        Ok(LocalBackend { cfg: Arc::new(cfg), inner: Arc::new(Mutex::new(inner)), pool })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for LocalBackend {
    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let mut inner = self.lock();
        let Some(run) = inner.runs.get(&spec.key) else { return Ok(()) };
        if run.p.stop.is_some() || run.p.verdict.is_some() || !matches!(run.stage, Stage::Running) {
            return Ok(());
        }
        let (base, have, uid) = (run.l.ray_base, run.l.replicas.clone(), run.l.uid);
        let pulled = run.pulled.clone();
        let replicas =
            plan::place_replicas(spec, &have, plan::gpus_in_use(inner.runs.values().map(|r| &r.l)));
        let uid = (uid >= UID_BASE).then_some(uid);
        let (_, mut l, jobs) =
            self.prepare(spec, replicas, uid, Some(base), pulled.as_ref()).map_err(BackendError)?;
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
            run.p.removed.insert(r.name.clone());
            l.replicas.push(r.clone());
        }
        run.stop_replicas(|r| run.p.removed.contains(&r.name), &req).map_err(BackendError)?;
        run.l = l;
        let bytes = serde_json::to_vec_pretty(&run.l).map_err(|e| BackendError(e.to_string()))?;
        let launch = AttemptLayout::at(&run.dir).launch_json();
        write_atomic(&launch, &bytes).map_err(|e| {
            BackendError(format!("cannot record the attempt's replicas in {}: {e}", launch.display()))
        })?;
        let children = self.spawn(&run.dir, &new);
        run.children.extend(children);
        Ok(())
    }

    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let mut inner = self.lock();
        if inner.runs.contains_key(&spec.key) {
            return Ok(());
        }
        let layout = AttemptLayout::new(&self.cfg.runs_dir, &spec.key);
        if let Ok(bytes) = std::fs::read(layout.outcome_json()) {
            // It ended while nobody listened: say so again.
            if let Ok(r) = serde_json::from_slice::<Recorded>(&bytes) {
                inner.replay.push(r.observation(spec.key.clone()));
            }
            return Ok(());
        }
        if layout.spawned().exists() {
            // Supervisors were started by an earlier server and are gone without a record: a lost attempt.
            inner.replay.push(Observation::Finished {
                key: spec.key.clone(),
                reason: Reason::NodeFailed,
                message: "the replicas of this attempt were lost (the machine restarted?)".into(),
            });
            return Ok(());
        }
        // GPUs are handed out here, under the lock, so that attempts prepared at the same time never share
        // one; the rest (the network, dirs and files, the supervisors) is done off the caller's path: the
        // control loop's tick does not wait for it, and the next polls see the attempt start.
        let replicas = plan::place_replicas(spec, &[], plan::gpus_in_use(inner.runs.values().map(|r| &r.l)));
        let mut l = Launched::preparing(&spec.key, replicas.clone());
        // A registry image: pulled first (the polls follow the pull), the attempt prepared once it is here.
        if let plan::ImageSource::Registry(reference) = plan::image_source(spec)
            && let Some(images) = &self.cfg.images
        {
            for d in [&self.cfg.runs_dir, layout.dir.parent().unwrap_or(&layout.dir), &layout.dir] {
                make_passage(d).map_err(BackendError)?;
            }
            let reference =
                pinned_image(&self.cfg.runs_dir, &spec.key.task_id, &reference).unwrap_or(reference);
            let access = access(spec);
            images.start(&reference, &access);
            l.image = spec.task.spec.environment.image.clone();
            l.pull_tolerance = spec.task.spec.advanced.image_pull_tolerance;
            let fetching = Fetching { spec: spec.clone(), replicas, f: Fetch::new(reference), access };
            let stage = Stage::Fetching(Box::new(fetching));
            inner.runs.insert(spec.key.clone(), Run::new(layout.dir, l, stage, Vec::new(), BTreeMap::new()));
            return Ok(());
        }
        inner
            .runs
            .insert(spec.key.clone(), Run::new(layout.dir, l, Stage::Preparing, Vec::new(), BTreeMap::new()));
        drop(inner);
        self.start_preparing(spec.clone(), replicas, None, true);
        Ok(())
    }

    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        let mut inner = self.lock();
        let grace = self.cfg.grace_s;
        let Some(run) = inner.runs.get_mut(key) else { return Ok(()) };
        if run.p.stop.is_some() {
            return Ok(());
        }
        run.p.stop = Some(cause);
        if matches!(run.stage, Stage::Fetching(_)) {
            // Nothing was made yet: the replicas are recorded stopped, and the next poll reports it.
            for r in &run.l.replicas {
                let dir = run.dir.join(&r.name);
                let _ = make_passage(&dir);
                ReplicaState::ended(supervisor::ExitRecord { stopped: true, ..Default::default() })
                    .write(&dir);
            }
            run.stage = Stage::Running;
            return Ok(());
        }
        if matches!(run.stage, Stage::Preparing) {
            // Nothing starts once it is prepared; the next poll after that reports it stopped.
            return Ok(());
        }
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
        run.stop_replicas(|_| true, &req).map_err(BackendError)
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        // The caller's clock (the server's: wall-clock milliseconds, as supervisors stamp their records).
        let now = now_ms;
        let mut inner = self.lock();
        let mut out: Vec<Observation> = std::mem::take(&mut inner.replay);
        let mut ended = Vec::new();
        let mut pulled = false;
        for (key, run) in inner.runs.iter_mut() {
            let before = out.len();
            let fetching = matches!(run.stage, Stage::Fetching(_));
            let over = self.advance(run, now, &mut out);
            // An image came into the cache: it is brought under its size limit after this poll.
            pulled |= fetching && run.pulled.is_some();
            if over {
                if let Some(last) = out[before..].last() {
                    self.finish(run, last);
                }
                ended.push(key.clone());
            }
        }
        for key in ended {
            inner.runs.remove(&key);
        }
        if pulled {
            self.collect_images(&inner);
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
        let layout = AttemptLayout::new(&self.cfg.runs_dir, key);
        let mut out = Vec::new();
        for (replica, _) in self.replica_names(key) {
            let Ok(text) = std::fs::read_to_string(layout.replica(&replica).metrics()) else {
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
        let layout = AttemptLayout::new(&self.cfg.runs_dir, key);
        let rl = layout.replica(replica);
        let rdir = rl.dir.clone();
        // Read `ended` first: a replica that ended before the read has its whole log on disk.
        let ended =
            read_state(&rdir).is_some_and(|s| s.phase == Phase::Exited) || layout.outcome_json().exists();
        // Offsets count the replica's whole output; `log` starts at `log.base`, and the rotated `log.1` holds
        // what came just before it (anything older was dropped: a read from there starts at `log.1`).
        let base = logfile::log_base(&rdir);
        let old_len = std::fs::metadata(rl.rotated_log()).map_or(0, |m| m.len());
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
            && let Ok(f) = std::fs::File::open(rl.log())
        {
            let _ = f.take((max - data.len()) as u64).read_to_end(&mut data);
        }
        // Hand out whole lines only (the rest comes with the next read), unless one line exceeds `max`.
        let whole = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole > 0 {
            data.truncate(whole);
        }
        let next = offset + data.len() as u64;
        let end = base + std::fs::metadata(rl.log()).map_or(0, |m| m.len());
        let more = end > next;
        LogChunk { data, next, ended: ended && !more, missing: false }
    }
}
