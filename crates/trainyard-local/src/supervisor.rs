//! The supervisor: one small process of our own binary per replica (`trainyard supervise DIR`). It starts
//! the replica's sandbox (the precheck first when asked), keeps its output in a log file with timestamps,
//! records on disk what happened (pid, start, phase, exit status, signal, OOM kill), and runs the stop
//! protocol when the server asks for it by writing `stop.json`. It runs in a process group of its own, so
//! killing or restarting the server touches neither the training nor the record of how it ended.
//!
//! Files in the replica dir (the server reads them; only the supervisor writes them):
//! - `state.json`: [`ReplicaState`], replaced atomically on every change;
//! - `events.jsonl`: [`Event`]s, appended (precheck figures, every step of a stop with its duration);
//! - `log`: `2026-11-30T04:00:00.123Z O text` per line (`O` stdout, `E` stderr); at
//!   [`Limits::log_bytes`] it is rotated to `log.1` (the older `log.1` dropped), `log.base` says at which
//!   offset of the whole output `log` starts, and a `LogRotated` event says what was dropped.
//!
//! The supervisor runs as root on the host, so it never trusts what the replica can write: the runtime dir
//! is the only place both write, and the supervisor reaches into it only through a directory descriptor,
//! never following a link, never blocking on a FIFO, reading at most a bounded size ([`super::runtime_dir::RuntimeDir`]).
//! bubblewrap starts with a fixed environment as the attempt's unprivileged uid; the replica's variables
//! reach the sandbox through a sealed memory file that only the sandbox's first shell reads.

use super::clock::now_ms;
use super::logfile::{LogFile, append_log};
use super::netns;
use super::procs::{self, Cgroup};
pub use super::records::{
    DEFAULT_LOG_BYTES, DEFAULT_PIDS_MAX, DEFAULT_SCRATCH_INODES, DEFAULT_SCRATCH_MIB, Event, ExitRecord,
    Limits, Phase, PooledJob, ReplicaJob, ReplicaState, StopRequest,
};
use super::runtime_dir::{RAY_STATE, RuntimeDir};

/// How often the Ray head's `ray-state.json` is copied out of its runtime dir.
const RAY_STATE_COPY_EVERY: Duration = Duration::from_millis(500);
use super::sandbox::{RUNTIME_DIR, Start};
use super::scratch::{
    HostsCopy, POOL_SCRATCH_ENV, Premade, SCRATCH_IMAGE, ScratchFs, mount_scratch, premake, watch_scratch,
};
use super::spawn::{Identity, memfd, spawn_as};
#[path = "stop.rs"]
mod stop;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stop::{init_killed, kill_sandbox, read_stop, stop_protocol};
use trainyard_core::lifecycle::Reason;

/// The longest precheck result kept (it becomes an event).
const PRECHECK_MESSAGE_MAX_CHARS: usize = 2_000;

struct Sup {
    dir: PathBuf,
    state: ReplicaState,
    events: std::fs::File,
    /// The running sandbox's bwrap pid (0 between phases), for the metrics monitor.
    sandbox: Arc<std::sync::atomic::AtomicU32>,
    /// The replica's network namespace, kept open for every phase.
    netns: Option<OwnedFd>,
    /// The replica's cgroup dirs, shown read-only inside.
    cgroups: Vec<(PathBuf, String)>,
    /// Set by the scratch watcher when the replica used more scratch than it may.
    evict: Arc<Mutex<Option<String>>>,
    /// The supervisor has left the replica's cgroups (see [`Cgroup::step_out`]).
    stepped_out: bool,
    /// The replica's scratch file system, when it has one of its own.
    scratch: Option<Arc<ScratchFs>>,
    /// Where the image's root is mounted as a file system of its own, when it is.
    root_from: Option<PathBuf>,
}

impl Sup {
    /// The replica's runtime dir: in its scratch file system when it has one (reached through that file
    /// system's root: it is mounted where only the sandbox sees it), in the scratch dir otherwise.
    fn runtime_dir(&self) -> Option<RuntimeDir> {
        match &self.scratch {
            Some(fs) => RuntimeDir::open_at(&fs.root, super::runtime_dir::RUNTIME_IN_SCRATCH),
            None => RuntimeDir::open(&self.dir),
        }
    }
    fn save(&self) {
        self.state.write(&self.dir);
    }
    fn event(&mut self, reason: Reason, message: String) {
        let e = Event { at_ms: now_ms(), reason, message };
        if let Ok(mut line) = serde_json::to_vec(&e) {
            line.push(b'\n');
            let _ = self.events.write_all(&line);
        }
    }
}

/// The name of a pooled supervisor's cgroups while it waits (see the backend's `pool`).
pub fn pool_cgroup_name(pid: u32) -> String {
    format!("{}{pid}", procs::POOL_CGROUP_PREFIX)
}

/// `trainyard supervise DIR`: runs one replica to its end, its job read from standard input. The exit code
/// is 0 whenever the outcome was recorded (the replica's own status is in `state.json`).
///
/// `trainyard supervise RUNS_DIR/-`: a pooled supervisor (see the backend's `pool`; the runs dir in its command
/// line says whose it is). It enters cgroups of its own first,
/// then waits for a [`PooledJob`] on standard input, takes the replica's cgroup name and limits, and runs it
/// as above; standard input closed with nothing sent (the server is gone, or has no use for it) ends it.
pub fn main(dir: &Path) -> i32 {
    // Nothing this process starts gains privileges by exec (bubblewrap is not set-uid here).
    let _ = rustix::thread::set_no_new_privs(true);
    // The sandbox's init (bubblewrap's child, pid 1 inside) comes to this process when bubblewrap leaves it
    // unreaped, which is how the supervisor tells the command's own end from the init killed on the host
    // (see `init_killed`).
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let pooled = dir.file_name().is_some_and(|n| n == "-");
    let waiting = pooled.then(|| Cgroup::enter_new(&pool_cgroup_name(std::process::id())));
    // A pooled supervisor makes its replica's scratch file system while it waits, with the server's limits.
    let premade = pooled
        .then(|| std::env::var(POOL_SCRATCH_ENV).ok())
        .flatten()
        .and_then(|v| {
            let (mib, inodes) = v.split_once(':')?;
            Some((mib.parse().ok()?, inodes.parse().ok()?))
        })
        .and_then(|(mib, inodes)| premake(dir, mib, inodes).ok());
    let mut input = String::new();
    let read = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input);
    if !pooled {
        let Ok(job) = serde_json::from_str::<ReplicaJob>(&input) else { return 2 };
        return run(dir, job, None, None);
    }
    let sent = read.ok().and_then(|_| serde_json::from_str::<PooledJob>(&input).ok());
    let Some(PooledJob { dir, job }) = sent else {
        if let Some(Ok(cg)) = waiting {
            cg.remove();
        }
        if let Some(p) = premade {
            p.discard();
        }
        return if input.trim().is_empty() { 0 } else { 2 };
    };
    // The replica's name and limits on the cgroups it is in already; where that cannot be done (cgroup v2
    // renames nothing), they go and the replica's are made as an unpooled supervisor makes them.
    let ready = match waiting {
        Some(Ok(cg)) => match cg.rename(&cgroup_name(&dir)) {
            Ok(cg) => match cg.limit(job.millicpu, job.memory_mib, job.limits.pids_max) {
                Ok(()) => Some(cg),
                Err(_) => {
                    cg.remove();
                    None
                }
            },
            Err((cg, _)) => {
                cg.remove();
                None
            }
        },
        Some(Err(_)) | None => None,
    };
    run(&dir, job, ready, premade)
}

/// Runs one replica to its end (see [`main`]). `ready`: cgroups already entered, with the replica's name
/// and limits, and `premade`, a scratch file system (a pooled supervisor's).
fn run(dir: &Path, job: ReplicaJob, ready: Option<Cgroup>, premade: Option<Premade>) -> i32 {
    let Ok(events) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("events.jsonl"))
    else {
        return 2;
    };
    let pid = std::process::id();
    let mut sup = Sup {
        dir: dir.to_owned(),
        state: ReplicaState {
            supervisor_pid: pid,
            supervisor_ticks: procs::start_ticks(pid).unwrap_or(0),
            phase: Phase::Starting,
            sandbox_pid: None,
            started_ms: now_ms(),
            exit: None,
            precheck: None,
        },
        events,
        sandbox: Arc::default(),
        netns: None,
        cgroups: Vec::new(),
        evict: Arc::default(),
        stepped_out: false,
        scratch: None,
        root_from: None,
    };
    sup.save();
    // The replica's network namespace is made while its cgroups are: both wait mostly on the kernel (moving
    // a process between cgroups and making a namespace take machine-wide locks), not on each other.
    let net = job.net.clone().map(|net| std::thread::spawn(move || netns::create_replica(&net)));
    // So is its scratch's file system (formatting and mounting wait on the disk).
    let scratch_fs = {
        let (scratch, image, limits) = (dir.join("scratch"), dir.join(SCRATCH_IMAGE), job.limits);
        std::thread::spawn(move || {
            let (mib, inodes) = (limits.scratch_mib, limits.scratch_inodes);
            // A pooled supervisor's, made while it waited; else one made now.
            premade
                .and_then(|p| p.adopt(&scratch, &image, mib, inodes).ok())
                .map_or_else(|| mount_scratch(&scratch, &scratch, &image, mib, inodes), Ok)
        })
    };
    // And the image's root, as a file system of its own.
    let root_fs = job.sandbox.mount_root.then(|| {
        let (root, at) = (job.sandbox.root.clone(), dir.join(super::root_image::ROOT_MOUNT));
        std::thread::spawn(move || super::root_image::mount_root(&root, &at).map(|()| at))
    });
    let made = match ready {
        Some(cg) => Ok(cg),
        None => Cgroup::create(&cgroup_name(dir), job.millicpu, job.memory_mib, job.limits.pids_max),
    };
    let cgroup = match made {
        Ok(cg) => {
            sup.cgroups = cg.dirs();
            if !cg.limits_pids() {
                sup.event(
                    Reason::LimitsNotEnforced,
                    format!(
                        "{}: the number of processes is not limited (this host has no pids cgroup)",
                        job.name
                    ),
                );
            }
            Some(cg)
        }
        Err(why) => {
            sup.event(
                Reason::LimitsNotEnforced,
                format!("{}: CPU, memory and process limits are not enforced: {why}", job.name),
            );
            None
        }
    };
    if let Some(net) = net {
        match net.join().unwrap_or_else(|_| Err("the network setup thread panicked".into())) {
            Ok(fd) => sup.netns = Some(fd),
            Err(why) => sup.event(
                Reason::NetworkNotReady,
                format!(
                    "{}: no address on the attempt's network, so it reaches no other replica: {why}",
                    job.name
                ),
            ),
        }
    }
    match scratch_fs.join().unwrap_or_else(|_| Err("the scratch setup thread panicked".into())) {
        Ok(fs) => sup.scratch = Some(Arc::new(fs)),
        Err(why) => sup.event(
            Reason::LimitsNotEnforced,
            format!(
                "{}: its scratch has no file system of its own, so its limits are checked every {} s only: {why}",
                job.name,
                super::scratch::SCRATCH_CHECK_EVERY.as_secs()
            ),
        ),
    }
    if let Some(root_fs) = root_fs {
        match root_fs.join().unwrap_or_else(|_| Err("the image root's mount thread panicked".into())) {
            Ok(at) => sup.root_from = Some(at),
            Err(why) => sup.event(
                Reason::LimitsNotEnforced,
                format!(
                    "{}: its image's root is bound from the image cache, not mounted as a file system of its \
                     own, so its /proc/self/mountinfo names the cache's path: {why}",
                    job.name
                ),
            ),
        }
    }
    let stop_monitor = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (dir, job, pid, stop) =
            (dir.to_owned(), job.monitor.clone(), sup.sandbox.clone(), stop_monitor.clone());
        std::thread::spawn(move || super::metrics::monitor(&dir, &job, &pid, &stop))
    };
    let watcher = {
        // The runtime dir is in the scratch.
        let dirs = vec![dir.join("scratch")];
        let (limits, evict, stop, fs) =
            (job.limits, sup.evict.clone(), stop_monitor.clone(), sup.scratch.clone());
        let mut hosts = HostsCopy::new(dir);
        std::thread::spawn(move || {
            let (mib, inodes) = (limits.scratch_mib, limits.scratch_inodes);
            watch_scratch(fs.as_deref(), &dirs, mib, inodes, &evict, &stop, &mut hosts)
        })
    };
    let Ok(log) = LogFile::open(dir, job.limits.log_bytes) else { return 2 };
    let log = Arc::new(Mutex::new(log));

    let mut exit = ExitRecord::default();
    if let Some(pre) = &job.precheck {
        sup.state.phase = Phase::Prechecking;
        sup.save();
        let out = run_phase(&mut sup, &job, pre, &log, &cgroup);
        let result = sup.runtime_dir().and_then(|rt| rt.read("precheck.json"));
        let message = result
            .as_deref()
            .and_then(|r| serde_json::from_slice::<serde_json::Value>(r).ok())
            // Written inside the sandbox, so the task could make it anything: one bounded line in the events.
            .and_then(|v| v["message"].as_str().map(|m| m.chars().take(PRECHECK_MESSAGE_MAX_CHARS).collect()))
            .unwrap_or_else(|| "the precheck wrote no result".to_owned());
        sup.state.precheck = Some(message.clone());
        if out.code != Some(0) {
            let failed = !out.stopped && !out.killed_outside && out.evicted.is_none();
            exit = ExitRecord { precheck_failed: failed, ..out };
        } else {
            sup.event(Reason::PrecheckResult, format!("{}: {message}", job.name));
        }
    }
    if sup.state.exit.is_none() && exit == ExitRecord::default() {
        sup.state.phase = Phase::Running;
        sup.save();
        exit = run_phase(&mut sup, &job, &job.cmd, &log, &cgroup);
    }
    stop_monitor.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = monitor.join();
    let _ = watcher.join();
    let events = log.lock().map(|mut l| l.take_events()).unwrap_or_default();
    for (reason, message) in events {
        sup.event(reason, format!("{}: {message}", job.name));
    }
    if let Some(cg) = &cgroup {
        exit.oom_killed |= cg.oom_killed();
        cg.remove();
    }
    exit.at_ms = now_ms();
    sup.state.phase = Phase::Exited;
    sup.state.exit = Some(exit);
    sup.save();
    0
}

fn cgroup_name(dir: &Path) -> String {
    // runs/TASK/aN/REPLICA -> TASK-aN-REPLICA: unique per replica and attempt.
    let parts: Vec<String> = dir
        .iter()
        .rev()
        .take(3)
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    parts.join("-")
}

/// Removes the cgroups of a replica whose supervisor did not (it was killed), once they are empty.
pub fn remove_cgroups(replica_dir: &Path) {
    Cgroup::remove_named(&cgroup_name(replica_dir));
}

/// The shell that starts the replica inside the sandbox: reads the replica's variables from `env_fd` (a
/// NUL-separated `NAME=value` list: they never are bubblewrap's own), catches the checkpoint signals while
/// it runs (a handler, not "ignore": an ignored signal stays ignored across exec, and the user's command
/// must receive them), starts sshd when asked, then becomes the command.
fn wrapper(sshd: bool, env_fd: i32) -> String {
    let mut s = String::from("trap : USR1 USR2\n");
    s.push_str(&format!(
        "while IFS= read -r -d '' kv; do export \"$kv\" 2>/dev/null || true; done <&{env_fd}\nexec {env_fd}<&-\n"
    ));
    // Files in shared volumes stay writable by the group's next attempts (they run as other uids).
    s.push_str("umask 0002\n");
    if sshd {
        s.push_str(&format!(
            "if [ -x /usr/sbin/sshd ]; then /usr/sbin/sshd -f {RUNTIME_DIR}/ssh/sshd_config -E {RUNTIME_DIR}/ssh/sshd.log || echo 'trainyard: sshd did not start' >&2; else echo 'trainyard: passwordless SSH is on but the image has no /usr/sbin/sshd' >&2; fi\n"
        ));
    }
    s.push_str("exec bash -c \"$TRAINYARD_CMD\"\n");
    s
}

/// Runs one sandboxed command to its end (or through the stop protocol), with its output in the log.
fn run_phase(
    sup: &mut Sup,
    job: &ReplicaJob,
    cmd: &str,
    log: &Arc<Mutex<LogFile>>,
    cgroup: &Option<Cgroup>,
) -> ExitRecord {
    let fail = |log: &Arc<Mutex<LogFile>>, why: String| {
        append_log(log, 'E', &format!("trainyard: cannot start the sandbox: {why}"));
        ExitRecord { code: Some(127), ..ExitRecord::default() }
    };
    let seccomp = match memfd("trainyard-seccomp", &super::seccomp::filter_bytes()) {
        Ok(fd) => fd,
        Err(e) => return fail(log, format!("cannot hold the seccomp filter: {e}")),
    };
    let mut env_bytes = Vec::new();
    for (k, v) in job.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([("TRAINYARD_CMD", cmd)]) {
        env_bytes.extend_from_slice(k.as_bytes());
        env_bytes.push(b'=');
        env_bytes.extend_from_slice(v.as_bytes());
        env_bytes.push(0);
    }
    let env = match memfd("trainyard-env", &env_bytes) {
        Ok(fd) => fd,
        Err(e) => return fail(log, format!("cannot hold the environment: {e}")),
    };
    let start = Start {
        seccomp_fd: Some(seccomp.as_raw_fd()),
        cgroups: sup.cgroups.clone(),
        in_netns: sup.netns.is_some(),
        root_from: sup.root_from.clone(),
    };
    // bubblewrap reads its options from a sealed memory file, not its command line: the sandbox's pid 1 is a
    // fork of it, and its command line (readable by every process inside) would name the host's paths.
    let mut options = Vec::new();
    for a in job.sandbox.args(&start) {
        options.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str()));
        options.push(0);
    }
    let options = match memfd("trainyard-sandbox", &options) {
        Ok(fd) => fd,
        Err(e) => return fail(log, format!("cannot hold the sandbox's options: {e}")),
    };
    let script = wrapper(job.sshd && sup.state.phase == Phase::Running, env.as_raw_fd());
    let mut c = Command::new(&job.bwrap);
    c.arg("--args")
        .arg(options.as_raw_fd().to_string())
        .args(["bash", "-c", &script])
        .env_clear()
        .env("PATH", super::spawn::HOST_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let id =
        Identity { netns: sup.netns.as_ref(), uid: job.uid, gid: job.gid, keep: [seccomp, env, options] };
    // The sandbox starts in the replica's cgroups, where the supervisor is until its first sandbox runs.
    if sup.stepped_out
        && let Some(cg) = cgroup
        && let Err(e) = cg.step_in()
    {
        return fail(log, e);
    }
    sup.stepped_out = false;
    let mut child = match spawn_as(c, id) {
        Ok(child) => child,
        Err(e) => return fail(log, format!("{}: {e}", job.bwrap.display())),
    };
    // The sandbox's PID namespace names its processes for every signal from here on (never bubblewrap's own
    // process, but for want of the namespace: see `stop_protocol`). It exists within milliseconds unless bwrap
    // failed or the machine is loaded (it once took 9 s); until it is found it is looked for again.
    let t0 = Instant::now();
    let mut init = None;
    let mut ns = loop {
        if let Some(ns) = procs::sandbox_ns(child.id()) {
            init = procs::sandbox_init(child.id());
            break Some(ns);
        }
        if matches!(child.try_wait(), Ok(Some(_))) || t0.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    sup.state.sandbox_pid = Some(child.id());
    sup.sandbox.store(child.id(), std::sync::atomic::Ordering::Relaxed);
    sup.save();
    // Off the sandbox's start (a move between cgroups waits on the kernel): the supervisor leaves the
    // replica's limits, which are the sandbox's alone from here on.
    if let Some(cg) = cgroup {
        match cg.step_out() {
            Ok(()) => sup.stepped_out = true,
            Err(e) => sup.event(
                Reason::LimitsNotEnforced,
                format!("{}: the supervisor stays in the replica's cgroup: {e}", job.name),
            ),
        }
    }
    let readers: Vec<_> = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .zip(['O', 'E'])
    .filter_map(|(s, tag)| s.map(|s| (s, tag)))
    .map(|(s, tag)| {
        let log = log.clone();
        std::thread::spawn(move || {
            each_line(s, MAX_LINE_BYTES, |line| {
                let text = String::from_utf8_lossy(line);
                append_log(&log, tag, text.trim_end_matches(['\n', '\r']));
            })
        })
    })
    .collect();
    let mut stopped = false;
    let mut evicted = None;
    let (mut copied_at, mut copied) = (Instant::now(), None::<Vec<u8>>);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if ns.is_none() {
            ns = procs::sandbox_ns(child.id());
            init = procs::sandbox_init(child.id());
        }
        if evicted.is_none()
            && let Some(why) = sup.evict.lock().ok().and_then(|mut e| e.take())
        {
            // Over a limit: the whole sandbox goes at once, as an evicted pod's containers do.
            sup.event(Reason::Evicted, format!("{}: {why}; ended", job.name));
            kill_sandbox(&mut ns, &mut child);
            evicted = Some(why);
        }
        let rotated = log.lock().map(|mut l| l.take_events()).unwrap_or_default();
        for (reason, message) in rotated {
            sup.event(reason, format!("{}: {message}", job.name));
        }
        if !stopped && let Some(req) = read_stop(&sup.dir) {
            stopped = true;
            stop_protocol(sup, job, &mut child, &mut ns, &req);
            if let Ok(status) = child.wait() {
                break status;
            }
        }
        // The Ray head's view of its cluster, for the server's autoscaling: copied out of the runtime dir (the
        // server does not see the scratch's file system).
        if copied_at.elapsed() >= RAY_STATE_COPY_EVERY {
            copied_at = Instant::now();
            if let Some(b) = sup.runtime_dir().and_then(|rt| rt.read(RAY_STATE))
                && copied.as_ref() != Some(&b)
            {
                let _ = super::files::write_atomic(&sup.dir.join(RAY_STATE), &b);
                copied = Some(b);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    sup.sandbox.store(0, std::sync::atomic::Ordering::Relaxed);
    // Whatever is left in the sandbox goes with it (killing its init takes every process in it along).
    if let Some(ns) = &ns {
        for (pid, _) in procs::ns_processes(ns) {
            procs::signal(pid, procs::SIGKILL);
        }
    }
    for r in readers {
        let _ = r.join();
    }
    let init_killed = init.is_some_and(init_killed);
    use std::os::unix::process::ExitStatusExt;
    let oom_killed = cgroup.as_ref().is_some_and(Cgroup::oom_killed);
    ExitRecord {
        code: status.code(),
        signal: status.signal(),
        oom_killed,
        stopped,
        // bubblewrap passes the command's end on as an exit code (128 + signal); bubblewrap itself ended by
        // a signal, or the sandbox's init ended before the command (not by the OOM killer's hand, which may
        // pick either as both are in the replica's cgroup) means someone on the host killed the sandbox.
        killed_outside: (status.signal().is_some() || init_killed)
            && !stopped
            && evicted.is_none()
            && !oom_killed,
        evicted,
        ..ExitRecord::default()
    }
}

/// The longest piece of a replica's output kept as one log line: a longer line (a process printing
/// gigabytes without a newline) is logged in pieces of this size, so the supervisor never holds more.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Calls `f` with each line read from `r` (its newline included), a line longer than `max` bytes in pieces
/// of `max`: what is held at once is bounded whatever the output.
fn each_line(r: impl std::io::Read, max: usize, mut f: impl FnMut(&[u8])) {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(r);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match std::io::Read::take(&mut r, max as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => f(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_the_cap_is_logged_in_pieces_and_nothing_is_lost() {
        // A 1 MiB line without a newline, then short lines.
        let mut out = vec![b'x'; 1 << 20];
        out.extend_from_slice(b"\nshort\r\nlast");
        let mut pieces: Vec<Vec<u8>> = Vec::new();
        each_line(&out[..], 4096, |l| pieces.push(l.to_vec()));
        assert!(pieces.iter().all(|p| p.len() <= 4096), "no piece over the cap");
        assert_eq!(pieces.concat(), out, "every byte, in order");
        assert_eq!(pieces.len(), (1 << 20) / 4096 + 1 + 2);
        assert_eq!(pieces[pieces.len() - 2], b"short\r\n");
        assert_eq!(pieces[pieces.len() - 1], b"last");
    }
}
