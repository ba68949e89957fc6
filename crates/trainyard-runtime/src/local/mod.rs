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

pub mod metrics;
pub mod netlink;
pub mod netns;
pub mod procs;
pub mod sandbox;
pub mod seccomp;
pub mod supervisor;

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

/// The precheck program, written into every replica's runtime dir when the precheck is on.
pub const PRECHECK_PY: &str = include_str!("precheck.py");

/// Reads a Ray cluster's nodes and pending demand from its GCS (the head waits on it; autoscaling reads it).
pub const RAY_PROBE_PY: &str = include_str!("ray_probe.py");

/// The first of a Ray node's ports (GCS, client server, raylet, agents, workers up to +99). Every node has a
/// network namespace of its own, so every node of every cluster uses the same ones.
const RAY_BASE_PORT: u16 = 30_000;

/// How often the preset metrics are sampled when the task configures no interval of its own.
pub const PRESET_INTERVAL_S: u64 = 10;

/// The gid every sandbox runs with (never a group of the host's users), and the first of the attempts'
/// uids: above the ranges distributions hand out to users and to containers (systemd's container range
/// ends at 1,879,048,191).
pub const SANDBOX_GID: u32 = 1_900_000_000;
pub const UID_BASE: u32 = 1_900_000_001;
/// How many attempts may run at once on one machine (each holds a uid).
pub const UID_SLOTS: u32 = 1_000_000;

/// Where torchrun's store listens in every PyTorchJob (each replica has its own network namespace).
pub const MASTER_PORT: u16 = 29_500;

/// How the local backend runs.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Where attempts live (`runs/` in the data dir).
    pub runs_dir: PathBuf,
    /// Default homes of volumes, datasets and models without a `path` in the catalog.
    pub data_dir: PathBuf,
    /// The supervisor: our own binary and the arguments before the replica dir (`trainyard supervise`).
    pub supervisor: (PathBuf, Vec<String>),
    pub bwrap: PathBuf,
    /// Between SIGTERM and SIGKILL on every stop path.
    pub grace_s: u64,
    /// `PATH` inside replicas of the `host` image: this server's, less what the sandbox hides.
    pub host_path: String,
    /// After a PyTorchJob's master succeeded, how long its workers may take to end by themselves.
    pub workers_after_master_ms: u64,
    /// iproute2's `ip`, for the replicas' network; None: each replica alone in an empty network namespace
    /// (replicas of one task cannot reach each other then).
    pub ip: Option<PathBuf>,
    /// The replicas' addresses (every attempt on a segment of its own, so all use the same range).
    pub network: netns::Range,
    /// Processes, scratch and log size per replica.
    pub limits: supervisor::Limits,
    /// Host paths a `host` replica never sees (the data dir).
    pub hide: Vec<PathBuf>,
    /// Replicas reach beyond their attempt (off unless the admin turns it on).
    pub egress: Option<netns::Egress>,
}

impl LocalConfig {
    pub fn new(data_dir: &Path, supervisor: (PathBuf, Vec<String>), bwrap: PathBuf) -> LocalConfig {
        LocalConfig {
            runs_dir: data_dir.join("runs"),
            data_dir: data_dir.to_owned(),
            supervisor,
            bwrap,
            grace_s: 5,
            workers_after_master_ms: 10_000,
            host_path: sandbox_path(&std::env::var_os("PATH").unwrap_or_default()),
            ip: netns::find_ip().ok(),
            network: netns::Range::default(),
            limits: supervisor::Limits::default(),
            hide: vec![data_dir.to_owned()],
            egress: None,
        }
    }
}

/// Files and dirs this process creates are its own (mode 0600/0700) unless it says otherwise.
pub fn private_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

/// Whether this process can give replicas identities of their own (it must be root to switch uids, make
/// network namespaces and cgroups).
pub fn isolation_ready() -> Result<(), String> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err("the local backend runs every replica as a uid of its own in its own network namespace, which \
             needs root: start `trainyard up` as root (or use `--backend fake`)"
            .to_owned())
    }
}

/// What the sandboxes enforce on this host, and what they cannot, one line each for `up`'s start-up output.
pub fn describe_isolation(cfg: &LocalConfig) -> Vec<String> {
    let mut out = vec![format!(
        "each attempt runs as a uid of its own ({UID_BASE} and up, group {SANDBOX_GID}) in a user namespace, \
         without capabilities, with no_new_privs and a seccomp filter"
    )];
    let range = cfg.network;
    out.push(match &cfg.ip {
        Some(_) => format!(
            "each task's replicas share a bridge of their own in {}/{}; nothing else is reachable (not this \
             machine, not other tasks){}",
            std::net::Ipv4Addr::from(range.base),
            range.prefix,
            match &cfg.egress {
                None => ", and no egress (--sandbox-egress)".to_owned(),
                Some(e) => format!(
                    "; egress ON: the internet through this machine, never private, loopback or link-local \
                     ranges{} (IP forwarding is on, nftables table inet trainyard)",
                    if e.allow.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " except {}",
                            e.allow
                                .iter()
                                .map(|r| format!("{}/{}", std::net::Ipv4Addr::from(r.base), r.prefix))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                ),
            }
        ),
        None => "NOT networked: iproute2 (ip) is missing, so each replica runs alone in an empty network \
                 namespace and replicas of one task cannot reach each other (apt-get install iproute2)"
            .to_owned(),
    });
    let cg = Path::new("/sys/fs/cgroup");
    let v2 = cg.join("cgroup.controllers").exists();
    let limits = format!(
        "{} processes, {} MiB of scratch and a {} KiB log (rotated) per replica",
        cfg.limits.pids_max,
        cfg.limits.scratch_mib,
        cfg.limits.log_bytes / 1024
    );
    if !v2 && !cg.join("memory/cgroup.procs").exists() {
        out.push(format!(
            "limits: CPU, memory and process counts are NOT enforced (no usable cgroup file system); {}",
            "scratch and log limits are"
        ));
    } else if !v2 && !cg.join("pids/cgroup.procs").exists() {
        out.push(format!(
            "limits: CPU and memory per replica; the number of processes is NOT limited (no pids cgroup); {limits}"
        ));
    } else {
        out.push(format!("limits: CPU and memory as the instance spec says; {limits}"));
    }
    out.push(format!(
        "the `host` image shows /{} of this machine, without its shadow files, SSH host keys or the data dir",
        sandbox::HOST_VIEW.join(", /")
    ));
    out
}

/// The sandbox's `/etc/resolv.conf` with egress: the host's, without nameservers on its loopback; when
/// those were all it had (systemd-resolved's stub), the upstream servers it resolves through.
fn resolv_conf() -> String {
    let keep = |text: &str| -> String {
        text.lines()
            .filter(|l| {
                let mut w = l.split_whitespace();
                !(w.next() == Some("nameserver")
                    && w.next()
                        .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                        .is_some_and(|a| a.is_loopback()))
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let has_server = |t: &str| t.lines().any(|l| l.trim_start().starts_with("nameserver"));
    let host = keep(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    if has_server(&host) {
        return host;
    }
    let upstream = keep(&std::fs::read_to_string("/run/systemd/resolve/resolv.conf").unwrap_or_default());
    if has_server(&upstream) { upstream } else { host }
}

/// The attempts' uid slots, claimed machine-wide: every Trainyard server on this machine takes its attempts'
/// uids (and with them their egress uplinks) from the same files, so no two live attempts share one.
mod slots {
    use std::io::Write;
    use std::path::Path;

    /// A file per claimed slot, naming the attempt dir that holds it; under `/run`, so a reboot clears them.
    const DIR: &str = "/run/trainyard/slots";

    /// Whether the attempt in `dir` may still run: it was launched, has no outcome, and either no replica has
    /// started yet or a supervisor of it is alive (one whose server went away for good holds nothing).
    fn live(dir: &Path) -> bool {
        if !dir.join("launch.json").exists() || dir.join("outcome.json").exists() {
            return false;
        }
        let states: Vec<super::ReplicaState> = std::fs::read_dir(dir)
            .map(|d| d.flatten().filter_map(|e| super::read_state(&e.path())).collect())
            .unwrap_or_default();
        states.is_empty()
            || states.iter().any(|s| {
                s.phase != super::Phase::Exited && super::procs::alive(s.supervisor_pid, s.supervisor_ticks)
            })
    }

    /// The slot `attempt` holds already (prepared before a restart), or the lowest free one, taking over
    /// slots whose attempt ended without giving them back.
    pub fn claim(attempt: &Path) -> Result<u32, String> {
        let fail = |e: std::io::Error| format!("cannot claim a sandbox uid in {DIR}: {e}");
        std::fs::create_dir_all(DIR).map_err(fail)?;
        let lock = std::fs::File::create(Path::new(DIR).join(".lock")).map_err(fail)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| fail(e.into()))?;
        let me = attempt.to_string_lossy().into_owned();
        let held: std::collections::BTreeMap<u32, String> = std::fs::read_dir(DIR)
            .map_err(fail)?
            .flatten()
            .filter_map(|e| {
                let slot = e.file_name().to_str()?.parse().ok()?;
                Some((slot, std::fs::read_to_string(e.path()).ok()?))
            })
            .collect();
        if let Some((&slot, _)) = held.iter().find(|(_, h)| **h == me) {
            return Ok(slot);
        }
        let free = (0..super::UID_SLOTS).find(|s| held.get(s).is_none_or(|h| !live(Path::new(h))));
        let slot = free.ok_or("every sandbox uid is taken: too many attempts run at once on this machine")?;
        let mut f = std::fs::File::create(Path::new(DIR).join(slot.to_string())).map_err(fail)?;
        f.write_all(me.as_bytes()).map_err(fail)?;
        Ok(slot)
    }

    /// Gives a slot back (if `attempt` still holds it).
    pub fn release(slot: u32, attempt: &Path) {
        let path = Path::new(DIR).join(slot.to_string());
        if std::fs::read_to_string(&path).is_ok_and(|h| Path::new(&h) == attempt) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Sets a path's owner and mode (a link is never followed).
fn own(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<(), String> {
    use rustix::fs::{FileType, Gid, Mode, OFlags, Uid};
    let fail = |e: rustix::io::Errno| format!("{}: {e}", path.display());
    // Through a descriptor of the file itself: a path someone swaps for a link between a check and the
    // change (a dir in a shared volume) is never followed.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        if e == rustix::io::Errno::LOOP { format!("{} is a symbolic link", path.display()) } else { fail(e) }
    })?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).map_err(fail)?.st_mode);
    if kind != FileType::Directory && kind != FileType::RegularFile {
        return Err(format!("{} is neither a directory nor a file", path.display()));
    }
    rustix::fs::fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(fail)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(fail)
}

/// Gives a tree the server just wrote (nothing else has touched it yet) to the attempt's uid.
fn own_tree(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        for e in std::fs::read_dir(path).map_err(|e| e.to_string())?.flatten() {
            own_tree(&e.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Makes a dir on the way to the replicas' own dirs: the sandboxes pass through, nobody lists it.
pub fn make_passage(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    own(path, 0, SANDBOX_GID, 0o710)
}

/// A volume dir Trainyard keeps (under the data dir): created shared by the sandboxes' group; one that
/// exists keeps its owner and mode unless it still is a plain root dir.
fn volume_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    if meta.uid() == 0 && meta.gid() != SANDBOX_GID {
        own(path, 0, SANDBOX_GID, 0o2770)?;
    }
    Ok(())
}

/// A `PATH` as a `host` replica sees it: the directories the sandbox replaces (`/root`, `/tmp`, `/run`)
/// left out, and the usual system directories when nothing is left.
pub fn sandbox_path(path: &std::ffi::OsStr) -> String {
    let hidden = ["/root", "/tmp", "/run", "/proc", "/dev"];
    let dirs: Vec<String> = std::env::split_paths(path)
        .filter(|d| d.is_absolute() && !hidden.iter().any(|h| d.starts_with(h)))
        .map(|d| d.display().to_string())
        .collect();
    if dirs.is_empty() {
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
    } else {
        dirs.join(":")
    }
}

/// `bwrap` on the PATH, or what to install.
pub fn find_bwrap() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("bwrap")).find(|p| p.is_file()).ok_or_else(|| {
        "bubblewrap (bwrap) is not installed; the local backend runs every replica in it. Install it with \
         `apt-get install bubblewrap` (Debian, Ubuntu) or `dnf install bubblewrap` (Fedora)"
            .to_owned()
    })
}

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
    /// RayJob: the first of the cluster's ports (node i uses base + 100·i onwards).
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

    /// A dataset's or model's dir: one under the data dir is made readable by the sandboxes (an admin's own
    /// path is left as the admin set it).
    fn data_asset_dir(&self, path: &Path, kind: &str, ours: bool) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        if !ours {
            let _ = std::fs::create_dir_all(path);
            return Ok(());
        }
        make_passage(&self.cfg.data_dir.join(kind))?;
        std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
        if meta.uid() == 0 && meta.gid() != SANDBOX_GID && meta.is_dir() {
            own(path, 0, SANDBOX_GID, 0o2750)?;
        }
        Ok(())
    }

    /// Builds the attempt's directories, files and supervisor jobs.
    fn prepare(
        &self,
        spec: &LaunchSpec,
        inner: &Inner,
        ray_base: Option<u16>,
    ) -> Result<(PathBuf, Launched, Vec<ReplicaJob>), String> {
        let task = &spec.task;
        let s = &task.spec;
        let catalog = &spec.catalog;
        let dir = attempt_dir(&self.cfg.runs_dir, &spec.key);
        for d in [&self.cfg.runs_dir, dir.parent().unwrap_or(&dir), &dir] {
            make_passage(d)?;
        }
        let ray = s.task_type == TaskType::RayJob;
        // A running attempt being resized keeps its uid and its replicas' places.
        let have: Vec<Replica> = inner.runs.get(&spec.key).map(|r| r.l.replicas.clone()).unwrap_or_default();
        // An attempt prepared before a restart but never started keeps the uid its dirs belong to.
        let uid = match inner.runs.get(&spec.key) {
            Some(run) => run.l.uid,
            None => UID_BASE + slots::claim(&dir)?,
        };
        let gid = SANDBOX_GID;

        // Replicas: names, GPUs.
        let mut used = Self::gpus_in_use(inner);
        let mut replicas = Vec::new();
        for p in &spec.replicas {
            let node = catalog.nodes.get(&p.node);
            let free: Vec<u32> = node
                .map(|n| n.devices())
                .unwrap_or_default()
                .into_iter()
                .filter(|d| !used.get(&p.node).is_some_and(|u| u.contains(d)))
                .collect();
            let devices: Vec<u32> = free.into_iter().take(p.resources.gpus as usize).collect();
            used.entry(p.node.clone()).or_default().extend(devices.iter().copied());
            let name = format!("{}-{}-{}", spec.task_name, p.role, p.index);
            let slot = have.iter().find(|r| r.name == name).map(|r| r.slot);
            replicas.push(Replica {
                name,
                role: p.role.clone(),
                node: p.node.clone(),
                devices,
                slot: slot.unwrap_or(0),
            });
        }
        // Places on the network: kept ones stay, new ones take the lowest free.
        let mut taken: BTreeSet<usize> = have.iter().map(|r| r.slot).collect();
        for r in replicas.iter_mut() {
            if !have.iter().any(|h| h.name == r.name) {
                let free = (0..).find(|i| !taken.contains(i)).unwrap_or(0);
                taken.insert(free);
                r.slot = free;
            }
        }
        let master = replicas.first().map(|r| r.name.clone()).unwrap_or_default();
        let autoscaling = s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).is_some_and(|a| a.enabled);
        let egress = self.cfg.egress.as_ref().filter(|_| self.cfg.ip.is_some());
        let networked = self.cfg.ip.is_some() && (replicas.len() > 1 || autoscaling || egress.is_some());
        let switch = netns::attempt_name(&spec.key.task_id, spec.key.attempt);
        let uplink = match egress {
            Some(e) => Some(
                netns::Uplink::for_slot(e, &self.cfg.network, &switch, uid - UID_BASE)
                    .ok_or("every egress uplink is taken: too many attempts with egress run at once")?,
            ),
            None => None,
        };
        let address = |r: &Replica| -> Result<std::net::Ipv4Addr, String> {
            if !networked {
                return Ok(std::net::Ipv4Addr::LOCALHOST);
            }
            self.cfg.network.address(r.slot).ok_or_else(|| {
                format!("the replicas' network range holds {} replicas per task", self.cfg.network.capacity())
            })
        };
        if networked && let Some(ip) = &self.cfg.ip {
            netns::create_switch(ip, &switch, egress.zip(uplink.as_ref()))
                .map_err(|e| format!("cannot make the attempt's network: {e}"))?;
        }

        // Mounts.
        let home_of = |kind: &str, name: &str, path: Option<&String>| -> PathBuf {
            path.map_or_else(|| self.cfg.data_dir.join(kind).join(name), PathBuf::from)
        };
        let mut mounts = Vec::new();
        for v in &s.environment.volumes {
            let own_path = catalog.volumes.get(&v.volume).and_then(|x| x.path.as_ref());
            let src = home_of("volumes", &v.volume, own_path);
            if own_path.is_none() {
                make_passage(&self.cfg.data_dir.join("volumes"))?;
                volume_dir(&src)?;
            } else {
                let _ = std::fs::create_dir_all(&src);
            }
            mounts.push(Mount { src, dst: v.mount_path.clone().into(), read_only: v.read_only });
        }
        for d in &s.environment.datasets {
            let own_path = catalog.datasets.get(&d.dataset).and_then(|x| x.path.as_ref());
            let src = home_of("datasets", &d.dataset, own_path);
            self.data_asset_dir(&src, "datasets", own_path.is_none())?;
            mounts.push(Mount { src, dst: d.mount_path.clone().into(), read_only: true });
        }
        for m in &s.environment.models {
            let own_path = catalog.models.get(&m.model).and_then(|x| x.path.as_ref());
            let src = home_of("models", &m.model, own_path);
            self.data_asset_dir(&src, "models", own_path.is_none())?;
            mounts.push(Mount { src, dst: m.mount_path.clone().into(), read_only: true });
        }
        let shared = s.ray.as_ref().and_then(|r| r.shared_storage.as_ref());
        if let Some(sh) = shared {
            let own_path = catalog.volumes.get(&sh.volume).and_then(|x| x.path.as_ref());
            let vol = home_of("volumes", &sh.volume, own_path);
            if own_path.is_none() {
                make_passage(&self.cfg.data_dir.join("volumes"))?;
            }
            volume_dir(&vol)?;
            // Inside a volume other tasks write to: made fresh, never a link someone planted.
            let src = vol.join(format!("ray-{}", spec.task_name));
            match std::fs::symlink_metadata(&src) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{} is not a directory", src.display())),
                Err(_) => {
                    std::fs::create_dir(&src).map_err(|e| format!("cannot create {}: {e}", src.display()))?
                }
            }
            own(&src, uid, gid, 0o2770)?;
            mounts.push(Mount { src, dst: "/tmp/ray".into(), read_only: false });
        }
        let mount_paths: Vec<String> = mounts.iter().map(|m| m.dst.display().to_string()).collect();

        // The hosts file: every replica's name at its address (written in place: running replicas bind it).
        let mut hosts = String::from("127.0.0.1 localhost\n::1 localhost ip6-localhost\n");
        for r in &replicas {
            hosts.push_str(&format!("{} {}\n", address(r)?, r.name));
        }
        std::fs::write(dir.join("hosts"), hosts).map_err(|e| e.to_string())?;
        own(&dir.join("hosts"), 0, 0, 0o644)?;

        let ssh = s.advanced.passwordless_ssh;
        if ssh {
            make_keys(&dir.join("ssh"))?;
        }

        let precheck = s.advanced.precheck.as_ref().filter(|p| p.enabled && !ray);
        let checkpoint = s
            .advanced
            .exit_checkpoint
            .as_ref()
            .filter(|c| c.enabled && !ray)
            .map(|c| (u64::from(c.timeout_seconds.min(600)), signal_number(c.signal)));
        let image = s.environment.image.clone();
        let host_view = image == "host";
        let root = if host_view {
            Some(PathBuf::from("/"))
        } else {
            catalog.images.get(&image).and_then(|i| i.rootfs.as_ref()).map(PathBuf::from)
        };
        let master_port = MASTER_PORT;
        let autoscale = s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).filter(|a| a.enabled);
        let ray_base = match ray_base {
            Some(b) => b,
            None if ray => RAY_BASE_PORT,
            None => 0,
        };
        let ray_env = if ray { ray_job_config(s)? } else { None };
        let shared_dir = shared.map(|sh| {
            let vol =
                home_of("volumes", &sh.volume, catalog.volumes.get(&sh.volume).and_then(|x| x.path.as_ref()));
            (vol.join(format!("ray-{}", spec.task_name)), sh.cleanup_on_exit)
        });
        let world = spec.replicas.len();
        let procs_per_node = s.pytorch.as_ref().and_then(|p| p.procs_per_node);
        // The sandbox's users: the image's, and the one replicas run as.
        let image_file =
            |name: &str| root.as_ref().and_then(|r| std::fs::read_to_string(r.join("etc").join(name)).ok());
        let (passwd, group) = (dir.join("passwd"), dir.join("group"));
        std::fs::write(&passwd, sandbox::identity_file(image_file("passwd").as_deref(), true))
            .map_err(|e| e.to_string())?;
        std::fs::write(&group, sandbox::identity_file(image_file("group").as_deref(), false))
            .map_err(|e| e.to_string())?;
        own(&passwd, 0, 0, 0o644)?;
        own(&group, 0, 0, 0o644)?;
        // With egress, names resolve through the host's upstream servers (a resolver on the host's loopback
        // is out of reach, as the host is).
        let resolv = if uplink.is_some() {
            let path = dir.join("resolv.conf");
            std::fs::write(&path, resolv_conf()).map_err(|e| e.to_string())?;
            own(&path, 0, 0, 0o644)?;
            Some(path)
        } else {
            None
        };
        let head_address =
            replicas.first().map(&address).transpose()?.unwrap_or(std::net::Ipv4Addr::LOCALHOST);

        let mut jobs = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            let rdir = dir.join(&r.name);
            let (scratch, runtime) = (rdir.join("scratch"), rdir.join("runtime"));
            let (tmp, home) = (scratch.join("tmp"), scratch.join("root"));
            // A replica that already runs (the attempt is being resized) has its dirs, and they are its own
            // now: nothing of the server's is written into them again.
            let fresh = !rdir.exists();
            if fresh {
                make_passage(&rdir)?;
                for d in [&scratch, &tmp, &home, &runtime] {
                    std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
                }
                // Hostfiles list every replica with its slots.
                let slots = procs_per_node.unwrap_or(1).max(1);
                let hostfile: String =
                    replicas.iter().map(|r| format!("{} slots={slots}\n", r.name)).collect();
                let names: String = replicas.iter().map(|r| format!("{}\n", r.name)).collect();
                std::fs::write(home.join("hostfile"), hostfile).map_err(|e| e.to_string())?;
                std::fs::write(home.join("hostfile.hostname"), names).map_err(|e| e.to_string())?;
                if ssh {
                    ssh_material(&dir.join("ssh"), &home, &runtime, &replicas)?;
                }
                if precheck.is_some() {
                    std::fs::write(runtime.join("precheck.py"), PRECHECK_PY).map_err(|e| e.to_string())?;
                }
            }
            let resources = spec.replicas.get(i).map(|p| p.resources).unwrap_or_default();
            let mut env: Vec<(String, String)> = vec![
                (
                    "PATH".into(),
                    if image == "host" {
                        self.cfg.host_path.clone()
                    } else {
                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
                    },
                ),
                ("HOME".into(), "/root".into()),
                ("LANG".into(), "C.UTF-8".into()),
                ("HOSTNAME".into(), r.name.clone()),
            ];
            for e in &s.environment.env {
                env.push((e.name.clone(), e.value.clone()));
            }
            if let Some(p) = precheck {
                for e in &p.env {
                    env.push((e.name.clone(), e.value.clone()));
                }
            }
            let rank = spec.replicas.get(i).map_or(0, |p| p.rank);
            let platform: Vec<(&str, String)> = vec![
                ("X_USER_NAME", spec.owner.clone()),
                ("X_ORG_NAME", task.metadata.project_group.clone()),
                ("X_TENANT_ID", task.metadata.project_group.clone()),
                ("X_REGION", s.placement.region.clone()),
                ("X_CLUSTER", s.placement.cluster.clone()),
                ("TASK_UUID", spec.key.task_id.clone()),
                ("TRAINYARD_TASK_NAME", spec.task_name.clone()),
                ("TRAINYARD_REPLICA", r.name.clone()),
                ("TRAINYARD_ROLE", r.role.clone()),
                ("TRAINYARD_ATTEMPT", spec.key.attempt.to_string()),
                ("TRAINYARD_NODE", r.node.clone()),
                ("TRAINYARD_RUNTIME_DIR", RUNTIME_DIR.into()),
                ("CUDA_VISIBLE_DEVICES", r.devices.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
            ];
            env.extend(platform.into_iter().map(|(k, v)| (k.to_owned(), v)));
            if !ray {
                let nproc = procs_per_node.unwrap_or(resources.gpus.max(1) as u32).max(1);
                for (k, v) in [
                    ("MASTER_ADDR", master.clone()),
                    ("MASTER_PORT", master_port.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("RANK", rank.to_string()),
                    // torchrun reads its options from PET_* variables.
                    ("PET_MASTER_ADDR", master.clone()),
                    ("PET_MASTER_PORT", master_port.to_string()),
                    ("PET_NNODES", world.to_string()),
                    ("PET_NODE_RANK", rank.to_string()),
                    ("PET_NPROC_PER_NODE", nproc.to_string()),
                ] {
                    env.push((k.to_owned(), v));
                }
            } else {
                env.push(("RAY_ADDRESS".into(), format!("{head_address}:{}", ray_base + 1)));
                env.push(("RAY_USAGE_STATS_ENABLED".into(), "0".into()));
                env.push(("TRAINYARD_ENTRYPOINT".into(), s.environment.cmd.clone()));
                if let Some(cfg) = &ray_env {
                    // The driver's job config, as Ray's own job submission hands it over: the runtime env.
                    env.push(("RAY_JOB_CONFIG_JSON_ENV_VAR".into(), cfg.clone()));
                }
                if r.role == "head" && fresh {
                    std::fs::write(runtime.join("ray_probe.py"), RAY_PROBE_PY).map_err(|e| e.to_string())?;
                    if autoscale.is_some() {
                        env.push(("TRAINYARD_RAY_AUTOSCALE".into(), "1".into()));
                    }
                }
            }
            let keep_s = s
                .ray
                .as_ref()
                .and_then(|r| r.debug.as_ref())
                .filter(|d| d.enabled)
                .map_or(0, |d| d.retention_seconds);
            if fresh {
                for d in [&scratch, &tmp, &home, &runtime] {
                    own(d, uid, gid, 0o700)?;
                }
                own_tree(&home, uid, gid)?;
                own_tree(&runtime, uid, gid)?;
            }
            let cmd = if ray {
                let at = RayAt { base: ray_base, me: address(r)?, head: head_address };
                ray_command(r, &resources, &at, replicas.len(), keep_s)
            } else {
                s.environment.cmd.clone()
            };
            let precheck_cmd = precheck.map(|p| {
                let mut c = format!(
                    "python3 {RUNTIME_DIR}/precheck.py --out {RUNTIME_DIR}/precheck.json --timeout-s {}",
                    p.timeout_seconds
                );
                if let Some(t) = p.min_gemm_tflops {
                    c.push_str(&format!(" --min-gemm-gflops {}", t * 1000.0));
                }
                if let Some(g) = p.min_allreduce_gbps {
                    c.push_str(&format!(" --min-allreduce-gbps {g}"));
                }
                c
            });
            jobs.push(ReplicaJob {
                name: r.name.clone(),
                bwrap: self.cfg.bwrap.clone(),
                sandbox: SandboxPlan {
                    // An image without a root file system here: its pull fails (and is retried) in `advance`.
                    root: root
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(format!("/nonexistent/trainyard-image/{image}"))),
                    host_view,
                    hostname: r.name.clone(),
                    tmp,
                    home,
                    runtime,
                    hosts: dir.join("hosts"),
                    passwd: Some(passwd.clone()),
                    group: Some(group.clone()),
                    resolv: resolv.clone(),
                    hide: self.cfg.hide.clone(),
                    mounts: mounts.clone(),
                },
                uid,
                gid,
                net: networked.then(|| netns::ReplicaNet {
                    switch: switch.clone(),
                    name: format!("{switch}-{}", r.slot),
                    index: r.slot,
                    address: address(r).unwrap_or(std::net::Ipv4Addr::LOCALHOST),
                    prefix: self.cfg.network.prefix,
                    gateway: uplink.as_ref().map(|u| u.gateway),
                }),
                limits: self.cfg.limits,
                env,
                cmd,
                precheck: precheck_cmd,
                sshd: ssh,
                millicpu: resources.vcpus.max(1) * 1000,
                memory_mib: resources.memory_mib.max(64),
                monitor: metrics::MonitorJob {
                    endpoints: s
                        .advanced
                        .metrics
                        .as_ref()
                        .filter(|m| m.enabled)
                        .map(|m| m.endpoints.iter().map(|e| (e.port as u16, e.path.clone())).collect())
                        .unwrap_or_default(),
                    interval_s: s
                        .advanced
                        .metrics
                        .as_ref()
                        .filter(|m| m.enabled)
                        .map_or(PRESET_INTERVAL_S, |m| u64::from(m.interval_seconds)),
                    gpus: r.devices.clone(),
                },
            });
        }
        let l = Launched {
            task_id: spec.key.task_id.clone(),
            attempt: spec.key.attempt,
            uid,
            networked,
            task_type: s.task_type.to_string(),
            image,
            replicas,
            mount_paths,
            checkpoint,
            precheck: precheck.is_some(),
            pull_tolerance: s.advanced.image_pull_tolerance,
            ray_base,
            cleanup: shared_dir.filter(|(_, clean)| *clean).map(|(dir, _)| dir),
            autoscale: autoscale.map(|a| Autoscale {
                idle_timeout_s: u64::from(a.idle_timeout_seconds),
                step: if a.mode == trainyard_core::spec::AutoscalingMode::Conservative {
                    1
                } else {
                    a.max_workers
                },
                worker_vcpus: spec
                    .replicas
                    .iter()
                    .find(|p| p.role == "worker")
                    .map_or(1, |p| p.resources.vcpus.max(1)),
            }),
        };
        let bytes = serde_json::to_vec_pretty(&l).map_err(|e| e.to_string())?;
        supervisor::write_atomic(&dir.join("launch.json"), &bytes).map_err(|e| e.to_string())?;
        Ok((dir, l, jobs))
    }

    fn spawn(&self, dir: &Path, jobs: &[ReplicaJob]) -> Vec<std::process::Child> {
        let _ = std::fs::write(dir.join("spawned"), b"");
        let mut children = Vec::new();
        for job in jobs {
            let (exe, args) = &self.cfg.supervisor;
            let mut c = std::process::Command::new(exe);
            // A fixed environment: nothing of the server's (its token, a preload) reaches the supervisor.
            c.args(args)
                .arg(dir.join(&job.name))
                .env_clear()
                .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            std::os::unix::process::CommandExt::process_group(&mut c, 0);
            match c.spawn() {
                Ok(mut child) => {
                    if let Some(mut stdin) = child.stdin.take() {
                        let _ = std::io::Write::write_all(
                            &mut stdin,
                            &serde_json::to_vec(job).unwrap_or_default(),
                        );
                    }
                    children.push(child);
                }
                Err(e) => {
                    let rdir = dir.join(&job.name);
                    let _ = std::fs::write(rdir.join("log"), format!("cannot start the supervisor: {e}\n"));
                    ReplicaState::ended(supervisor::ExitRecord { code: Some(127), ..Default::default() })
                        .write(&rdir);
                }
            }
        }
        children
    }

    fn available_images(spec: &LaunchSpec) -> String {
        let mut names: Vec<&str> = vec!["host"];
        names.extend(
            spec.catalog
                .images
                .iter()
                .filter(|(n, i)| *n != "host" && i.rootfs.is_some())
                .map(|(n, _)| n.as_str()),
        );
        names.join(", ")
    }

    /// The replicas of an attempt, by name and role (from its `launch.json`).
    pub fn replica_names(&self, key: &AttemptKey) -> Vec<(String, String)> {
        std::fs::read(attempt_dir(&self.cfg.runs_dir, key).join("launch.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Launched>(&b).ok())
            .map(|l| l.replicas.into_iter().map(|r| (r.name, r.role)).collect())
            .unwrap_or_default()
    }
}

/// The runtime env of a RayJob as Ray's driver reads it from `RAY_JOB_CONFIG_JSON_ENV_VAR`.
fn ray_job_config(s: &trainyard_core::spec::TaskSpec) -> Result<Option<String>, String> {
    let Some(text) =
        s.ray.as_ref().and_then(|r| r.runtime_env_yaml.as_ref()).filter(|t| !t.trim().is_empty())
    else {
        return Ok(None);
    };
    let env = trainyard_core::parse::yaml_to_value(text).map_err(|e| format!("the Ray runtime env: {e}"))?;
    Ok(Some(serde_json::json!({ "runtime_env": env }).to_string()))
}

/// Ports of a Ray node whose ports start at `base`: (node manager, object manager, metrics,
/// dashboard agent HTTP, dashboard agent gRPC, runtime env agent, first and last worker port).
fn ray_node_ports(base: u16) -> String {
    let o = base;
    format!(
        "--node-manager-port={} --object-manager-port={} --metrics-export-port={} --dashboard-agent-listen-port={} --dashboard-agent-grpc-port={} --runtime-env-agent-port={} --min-worker-port={} --max-worker-port={}",
        o + 10,
        o + 11,
        o + 12,
        o + 13,
        o + 14,
        o + 15,
        o + 20,
        o + 99
    )
}

/// A RayJob replica's command. The head starts Ray, waits for every worker, then runs the entrypoint in its
/// own sandbox (a driver must see its node's raylet): the entrypoint's output is the head's log and its exit
/// status the task's. Workers join the head and run until stopped.
/// Where a Ray node is: its cluster's first port, its own address and the head's.
struct RayAt {
    base: u16,
    me: std::net::Ipv4Addr,
    head: std::net::Ipv4Addr,
}

fn ray_command(
    r: &Replica,
    res: &trainyard_core::Resources,
    at: &RayAt,
    nodes: usize,
    keep_s: u32,
) -> String {
    let (base, me, head) = (at.base, at.me, at.head);
    let gcs = base + 1;
    let common = format!(
        "--block --disable-usage-stats --node-ip-address={me} --temp-dir=/tmp/ray/{} --num-cpus={} --num-gpus={} --memory={} {}",
        short(&r.name),
        res.vcpus.max(1),
        res.gpus,
        res.memory_mib * 1024 * 1024,
        ray_node_ports(base)
    );
    if r.role != "head" {
        // A custom resource names the replica, so idle Ray nodes can be matched to replicas.
        return format!(
            "until python3 -c 'import socket; socket.create_connection((\"{head}\", {gcs}), 1)' 2>/dev/null; do sleep 0.2; done\nexec ray start --address={head}:{gcs} --resources='{{\"TY:{}\": 1}}' {common}",
            r.name
        );
    }
    let keep = if keep_s > 0 {
        format!("echo \"trainyard: debug mode keeps the Ray cluster for {keep_s} s\"\nsleep {keep_s}\n")
    } else {
        String::new()
    };
    format!(
        r#"ray start --head --port={gcs} --ray-client-server-port={client} --include-dashboard=false {common} > {RUNTIME_DIR}/ray-head.log 2>&1 &
ray_pid=$!
python3 - {RUNTIME_DIR} {head}:{gcs} {nodes} $ray_pid <<'PY' || {{ tail -20 {RUNTIME_DIR}/ray-head.log >&2; exit 1; }}
import os, sys, time
sys.path.insert(0, sys.argv[1])
import ray_probe
addr, need, head, t0 = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), time.time()
while time.time() - t0 < 600:
    try:
        os.kill(head, 0)
    except ProcessLookupError:
        sys.exit("trainyard: the Ray head did not start; the end of its log follows")
    try:
        n = sum(1 for x in ray_probe.probe(addr, 2.0, 10)["nodes"] if x["alive"])
    except Exception:
        n = 0
    if n >= need:
        print(f"trainyard: the Ray cluster is up with {{n}} nodes after {{time.time() - t0:.1f}} s", flush=True)
        sys.exit(0)
    time.sleep(0.3)
sys.exit("trainyard: the Ray cluster did not come up within 600 s")
PY
if [ -n "${{TRAINYARD_RAY_AUTOSCALE:-}}" ]; then
python3 - {RUNTIME_DIR} {head}:{gcs} <<'PY' &
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import ray_probe
out = os.path.join(sys.argv[1], "ray-state.json")
while True:
    try:
        state = ray_probe.probe(sys.argv[2], 2.0, 1000)
        with open(out + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(out + ".tmp", out)
    except Exception as e:
        print("trainyard: the Ray probe failed:", e, file=sys.stderr, flush=True)
    time.sleep(2)
PY
fi
bash -c "$TRAINYARD_ENTRYPOINT"
code=$?
echo "trainyard: the entrypoint exited with code $code"
{keep}kill -TERM $ray_pid 2>/dev/null
for _ in $(seq 1 100); do kill -0 $ray_pid 2>/dev/null || break; sleep 0.1; done
exit $code
"#,
        client = base + 2,
    )
}

/// Ray puts Unix sockets under its temp dir; keep the path short.
fn short(name: &str) -> String {
    let h = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
    format!("{:x}", h & 0xffff_ffff)
}

fn keygen(path: &Path) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "trainyard", "-f"])
        .arg(path)
        .output()
        .map_err(|e| format!("passwordless SSH needs ssh-keygen (apt-get install openssh-client): {e}"))?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

fn make_keys(ssh: &Path) -> Result<(), String> {
    std::fs::create_dir_all(ssh).map_err(|e| e.to_string())?;
    keygen(&ssh.join("id_ed25519"))?;
    keygen(&ssh.join("host_ed25519"))
}

/// The attempt's keys and each replica's sshd: port 22 in the replica's own network namespace, the user the
/// replicas run as, keys in its home (scratch, which the server just made).
fn ssh_material(ssh: &Path, home: &Path, runtime: &Path, replicas: &[Replica]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let io = |e: std::io::Error| e.to_string();
    let dot = home.join(".ssh");
    std::fs::create_dir_all(&dot).map_err(io)?;
    std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519"), dot.join("id_ed25519")).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519.pub"), dot.join("id_ed25519.pub")).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519.pub"), dot.join("authorized_keys")).map_err(io)?;
    let mut config = String::new();
    for r in replicas {
        config.push_str(&format!(
            "Host {name}\n  HostName {name}\n  Port 22\n  User {user}\n  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            name = r.name,
            user = sandbox::INNER_USER,
        ));
    }
    std::fs::write(dot.join("config"), config).map_err(io)?;
    let sdir = runtime.join("ssh");
    std::fs::create_dir_all(&sdir).map_err(io)?;
    std::fs::copy(ssh.join("host_ed25519"), sdir.join("host_ed25519")).map_err(io)?;
    std::fs::set_permissions(sdir.join("host_ed25519"), std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    let sshd = format!(
        "Port 22\nListenAddress 0.0.0.0\nHostKey {RUNTIME_DIR}/ssh/host_ed25519\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nAuthorizedKeysFile /root/.ssh/authorized_keys\nStrictModes no\nUsePAM no\nPidFile none\nSetEnv TRAINYARD_SSH=1\n"
    );
    std::fs::write(sdir.join("sshd_config"), sshd).map_err(io)?;
    Ok(())
}

impl Run {
    fn new(
        dir: PathBuf,
        l: Launched,
        stage: Stage,
        children: Vec<std::process::Child>,
        offsets: BTreeMap<String, u64>,
    ) -> Run {
        Run {
            dir,
            l,
            stage,
            children,
            started: false,
            prechecked: false,
            stop: None,
            verdict: None,
            stop_others_at: None,
            stopped_others: false,
            offsets,
            removed: BTreeSet::new(),
            demand_reported_ms: 0,
            idle_reported: BTreeSet::new(),
        }
    }

    fn key(&self) -> AttemptKey {
        AttemptKey { task_id: self.l.task_id.clone(), attempt: self.l.attempt }
    }

    fn stop_replicas(&self, which: impl Fn(&Replica) -> bool, req: &StopRequest) {
        for r in self.l.replicas.iter().filter(|r| which(r)) {
            let path = self.dir.join(&r.name).join("stop.json");
            if !path.exists() {
                let _ = supervisor::write_atomic(&path, &serde_json::to_vec(req).unwrap_or_default());
            }
        }
    }

    /// Collects new supervisor events as notes.
    fn drain_events(&mut self, out: &mut Vec<Observation>) {
        let key = self.key();
        for r in &self.l.replicas {
            let rdir = self.dir.join(&r.name);
            let at = self.offsets.get(&r.name).copied().unwrap_or(0);
            let Ok(mut f) = std::fs::File::open(rdir.join("events.jsonl")) else { continue };
            if f.metadata().map_or(0, |m| m.len()) <= at || f.seek(std::io::SeekFrom::Start(at)).is_err() {
                continue;
            }
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in buf[..complete].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                if let Ok(e) = serde_json::from_slice::<Event>(line) {
                    out.push(Observation::Note { key: key.clone(), reason: e.reason, message: e.message });
                }
            }
            let next = at + complete as u64;
            self.offsets.insert(r.name.clone(), next);
            let _ = std::fs::write(rdir.join("events.offset"), next.to_string());
        }
    }
}

impl LocalBackend {
    /// One attempt's progress: returns true when it ended (its outcome is in `out`).
    fn advance(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) -> bool {
        let key = run.key();
        if let Stage::Pulling { tries, next_at_ms, jobs, available } = &mut run.stage {
            if now < *next_at_ms {
                return false;
            }
            if jobs.first().is_some_and(|j| j.sandbox.root.is_dir()) {
                let jobs = std::mem::take(jobs);
                if *tries > 0 {
                    out.push(Observation::Note {
                        key: key.clone(),
                        reason: "ImagePulled".into(),
                        message: format!("image {} is here after {tries} failed pulls", run.l.image),
                    });
                }
                run.children = self.spawn(&run.dir, &jobs);
                run.stage = Stage::Running;
                return false;
            }
            *tries += 1;
            let tol = run.l.pull_tolerance;
            let why =
                format!("image {} is not available on this machine (available: {available})", run.l.image);
            if tol == 0 || (tol > 0 && i64::from(*tries) > tol) {
                let allowed =
                    if tol == 0 { "no retries allowed".to_owned() } else { format!("{tol} retries allowed") };
                out.push(Observation::Finished {
                    key,
                    reason: Reason::ImagePullFailed,
                    message: format!("{why}; gave up after {tries} pulls ({allowed})"),
                });
                return true;
            }
            let backoff = (1000u64 << (*tries - 1).min(5)).min(30_000);
            *next_at_ms = now + backoff;
            out.push(Observation::Note {
                key,
                reason: "ImagePullBackOff".into(),
                message: format!("{why}; pull {tries} failed, next try in {} s", backoff / 1000),
            });
            return false;
        }
        for c in &mut run.children {
            let _ = c.try_wait();
        }
        run.drain_events(out);
        let states: Vec<(Replica, Option<ReplicaState>)> =
            run.l.replicas.iter().map(|r| (r.clone(), read_state(&run.dir.join(&r.name)))).collect();
        // A supervisor that died without recording an exit (the machine restarted, someone killed it).
        let lost: Vec<&str> = states
            .iter()
            .filter(|(_, s)| match s {
                Some(s) => {
                    s.phase != Phase::Exited
                        && s.supervisor_pid != 0
                        && !procs::alive(s.supervisor_pid, s.supervisor_ticks)
                }
                None => false,
            })
            .map(|(r, _)| r.name.as_str())
            .collect();
        let trainers = |st: &[(Replica, Option<ReplicaState>)]| -> Vec<Option<Phase>> {
            st.iter()
                .filter(|(r, _)| r.role != "submitter")
                .map(|(_, s)| s.as_ref().map(|s| s.phase))
                .collect()
        };
        let phases = trainers(&states);
        if !run.started && phases.iter().all(|p| p.is_some_and(|p| p != Phase::Starting)) {
            run.started = true;
            out.push(Observation::Started { key: key.clone(), precheck: run.l.precheck });
        }
        if run.l.precheck
            && run.started
            && !run.prechecked
            && phases.iter().all(|p| matches!(p, Some(Phase::Running)))
        {
            run.prechecked = true;
            let figures: Vec<String> =
                states.iter().filter_map(|(_, s)| s.as_ref()?.precheck.clone()).collect();
            out.push(Observation::PrecheckPassed {
                key: key.clone(),
                message: format!("every replica passed the precheck: {}", figures.join("; ")),
            });
        }

        if run.started && run.stop.is_none() && run.verdict.is_none() {
            self.autoscale(run, now, out);
        }
        // Decide the outcome as replicas end.
        let ray = run.l.task_type == "RayJob";
        if run.verdict.is_none() && run.stop.is_none() {
            if let Some(name) = lost.first() {
                run.verdict = Some((
                    Reason::NodeFailed,
                    format!("the supervisor of {name} is gone without recording how the replica ended"),
                ));
            }
            let mut ended: Vec<&(Replica, Option<ReplicaState>)> =
                states.iter().filter(|(_, s)| s.as_ref().is_some_and(|s| s.phase == Phase::Exited)).collect();
            ended.sort_by_key(|(_, s)| s.as_ref().and_then(|s| s.exit.as_ref()).map_or(0, |e| e.at_ms));
            for (r, s) in ended {
                let Some(e) = s.as_ref().and_then(|s| s.exit.clone()) else { continue };
                if e.stopped || run.verdict.is_some() {
                    continue;
                }
                if e.precheck_failed {
                    let message = s.as_ref().and_then(|s| s.precheck.clone()).unwrap_or_default();
                    run.verdict = Some((Reason::PrecheckFailed, format!("{}: {message}", r.name)));
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
                    // Nothing in the sandbox can signal bubblewrap: the machine (or its admin) killed it.
                    run.verdict = Some((
                        Reason::NodeFailed,
                        format!(
                            "{}: its sandbox was killed from outside, by {}",
                            r.name,
                            trainyard_core::failure::signal_name(e.signal.unwrap_or(9))
                        ),
                    ));
                    continue;
                }
                if let Some(why) = &e.evicted {
                    run.verdict = Some((Reason::UserError, format!("{}: {why}", r.name)));
                    continue;
                }
                let exit = Exit { code: e.code, signal: e.signal, oom_killed: e.oom_killed };
                let paths: Vec<&str> = run.l.mount_paths.iter().map(String::as_str).collect();
                let (reason, message) =
                    classify(&r.name, &exit, &log_tail(&run.dir.join(&r.name), 16 * 1024), &paths);
                let decides = if ray { r.role == "head" } else { r.role == "master" };
                if reason == Reason::NodeFailed {
                    out.push(Observation::NodeSuspect {
                        key: key.clone(),
                        node: r.node.clone(),
                        message: format!("node {}: {message}", r.node),
                    });
                }
                if reason != Reason::Completed {
                    run.verdict = Some((reason, message));
                } else if decides {
                    run.verdict = Some((Reason::Completed, message));
                    // Ray's workers have nothing left to do once the head (and its entrypoint, and the debug
                    // retention) ended; a PyTorchJob's workers get a moment to end by themselves.
                    let wait = if ray { 0 } else { self.cfg.workers_after_master_ms };
                    run.stop_others_at = Some(now + wait);
                } else if ray {
                    run.verdict =
                        Some((Reason::UserError, format!("{} ended before the entrypoint did", r.name)));
                }
            }
            if let Some((reason, _)) = &run.verdict
                && *reason != Reason::Completed
            {
                run.stop_others_at = Some(now);
            }
        }
        if !run.stopped_others && run.stop_others_at.is_some_and(|at| now >= at) {
            run.stopped_others = true;
            let req = StopRequest {
                checkpoint: false,
                checkpoint_timeout_s: 0,
                signal: procs::SIGTERM,
                grace_s: self.cfg.grace_s,
            };
            run.stop_replicas(|_| true, &req);
        }
        let all_ended = states.iter().all(|(r, s)| {
            s.as_ref().is_some_and(|s| s.phase == Phase::Exited) || lost.contains(&r.name.as_str())
        });
        if !all_ended {
            return false;
        }
        let finished = match (run.stop, &run.verdict) {
            (Some(StopCause::NodeFailed), _) => Observation::Finished {
                key,
                reason: Reason::NodeFailed,
                message: "a node of this attempt failed; every replica was killed".into(),
            },
            (Some(_), _) => Observation::Stopped { key, message: "every replica ended".into() },
            (None, Some((reason, message))) => {
                Observation::Finished { key, reason: *reason, message: message.clone() }
            }
            (None, None) => Observation::Finished {
                key,
                reason: Reason::UserError,
                message: "every replica ended but none decided the outcome".into(),
            },
        };
        out.push(finished);
        true
    }

    /// Autoscaling: turns the head's view of Ray (pending demand, idle nodes) into scale requests; the
    /// control loop decides within the bounds, through the scheduler.
    fn autoscale(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) {
        let Some(a) = run.l.autoscale.clone() else { return };
        let Some(head) = run.l.replicas.iter().find(|r| r.role == "head") else { return };
        // Written by the replica: read through the runtime dir's descriptor, never following a link.
        let Some(bytes) =
            supervisor::RuntimeDir::open(&run.dir.join(&head.name)).and_then(|rt| rt.read("ray-state.json"))
        else {
            return;
        };
        let Ok(state) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return };
        let key = run.key();
        let pending = state["pending"].as_array().cloned().unwrap_or_default();
        if !pending.is_empty() && now >= run.demand_reported_ms + 5_000 {
            let cpus: f64 = pending.iter().map(|p| p["CPU"].as_f64().unwrap_or(0.0)).sum();
            let workers = ((cpus / a.worker_vcpus as f64).ceil() as u32).clamp(1, a.step.max(1));
            run.demand_reported_ms = now;
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
                run.idle_reported.remove(&replica);
            } else if idle_s >= a.idle_timeout_s as f64
                && !run.removed.contains(&replica)
                && run.idle_reported.insert(replica.clone())
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

    fn finish(&self, run: &Run, outcome: &Observation) {
        let _ = supervisor::write_atomic(
            &run.dir.join("outcome.json"),
            &serde_json::to_vec(&Recorded::from(outcome)).unwrap_or_default(),
        );
        if run.l.uid >= UID_BASE {
            slots::release(run.l.uid - UID_BASE, &run.dir);
        }
        // The container's local disk goes with the attempt, and so do its network and any cgroup a killed
        // supervisor left; logs and events stay.
        for r in &run.l.replicas {
            let _ = std::fs::remove_dir_all(run.dir.join(&r.name).join("scratch"));
            supervisor::remove_cgroups(&run.dir.join(&r.name));
        }
        if run.l.networked
            && let Some(ip) = &self.cfg.ip
        {
            netns::delete_switch(ip, &netns::attempt_name(&run.l.task_id, run.l.attempt));
        }
        if let Some(dir) = &run.l.cleanup {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An outcome as kept in `outcome.json`, to be reported again after a restart.
#[derive(Debug, Serialize, Deserialize)]
struct Recorded {
    stopped: bool,
    reason: String,
    message: String,
}

impl From<&Observation> for Recorded {
    fn from(o: &Observation) -> Recorded {
        match o {
            Observation::Stopped { message, .. } => {
                Recorded { stopped: true, reason: String::new(), message: message.clone() }
            }
            Observation::Finished { reason, message, .. } => {
                Recorded { stopped: false, reason: reason.to_string(), message: message.clone() }
            }
            _ => Recorded { stopped: false, reason: String::new(), message: String::new() },
        }
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
        let _ = supervisor::write_atomic(&run.dir.join("launch.json"), &bytes);
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
                let key = spec.key.clone();
                let obs = if r.stopped {
                    Observation::Stopped { key, message: r.message }
                } else {
                    let reason = Reason::from_name(&r.reason).unwrap_or(Reason::UserError);
                    Observation::Finished { key, reason, message: r.message }
                };
                inner.replay.push(obs);
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
        let (dir, l, jobs) = self.prepare(spec, &inner, None).map_err(BackendError)?;
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
        let _ = now_ms;
        let now = supervisor::now_ms();
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
        let base: u64 = std::fs::read_to_string(rdir.join("log.base"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
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
