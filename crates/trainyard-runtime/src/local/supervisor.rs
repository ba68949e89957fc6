//! The supervisor: one small process of our own binary per replica (`trainyard supervise DIR`). It starts
//! the replica's sandbox (the precheck first when asked), keeps its output in a log file with timestamps,
//! records on disk what happened (pid, start, phase, exit status, signal, OOM kill), and runs the stop
//! protocol when the server asks for it by writing `stop.json`. It runs in a process group of its own, so
//! killing or restarting the server touches neither the training nor the record of how it ended.
//!
//! Files in the replica dir (the server reads them; only the supervisor writes them):
//! - `state.json`: [`ReplicaState`], replaced atomically on every change;
//! - `events.jsonl`: [`Event`]s, appended (precheck figures, every step of a stop with its duration);
//! - `log`: `2026-11-30T04:00:00.123Z O text` per line (`O` stdout, `E` stderr).

use super::procs::{self, Cgroup};
use super::sandbox::{RUNTIME_DIR, SandboxPlan};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the supervisor is told to run, on its stdin (never on disk: it holds the env, hidden values too).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaJob {
    pub name: String,
    pub bwrap: PathBuf,
    pub sandbox: SandboxPlan,
    pub env: Vec<(String, String)>,
    /// Run with `bash -c` inside the sandbox.
    pub cmd: String,
    /// The precheck's command line inside the sandbox, when it is on.
    pub precheck: Option<String>,
    /// Start the image's sshd (passwordless SSH) before the command.
    pub sshd: bool,
    pub millicpu: u64,
    pub memory_mib: u64,
    /// Preset and custom metrics.
    #[serde(default)]
    pub monitor: super::metrics::MonitorJob,
}

/// What the stop protocol does, from `stop.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopRequest {
    /// Send the checkpoint notice first.
    pub checkpoint: bool,
    pub checkpoint_timeout_s: u64,
    pub signal: i32,
    /// Between SIGTERM and SIGKILL.
    pub grace_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Starting,
    Prechecking,
    Running,
    Exited,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    /// Ended by the stop protocol, not by itself.
    pub stopped: bool,
    /// The precheck failed (the command never ran).
    pub precheck_failed: bool,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaState {
    pub supervisor_pid: u32,
    pub supervisor_ticks: u64,
    pub phase: Phase,
    pub sandbox_pid: Option<u32>,
    pub started_ms: u64,
    pub exit: Option<ExitRecord>,
    /// The precheck's one-line result.
    pub precheck: Option<String>,
}

impl ReplicaState {
    /// The record of a replica that ended without a supervisor of its own (it could not start, or it was
    /// stopped before its image was there).
    pub fn ended(exit: ExitRecord) -> ReplicaState {
        ReplicaState {
            supervisor_pid: 0,
            supervisor_ticks: 0,
            phase: Phase::Exited,
            sandbox_pid: None,
            started_ms: now_ms(),
            exit: Some(ExitRecord { at_ms: now_ms(), ..exit }),
            precheck: None,
        }
    }

    /// Writes `state.json` into a replica dir, atomically.
    pub fn write(&self, replica_dir: &Path) {
        let _ = write_atomic(&replica_dir.join("state.json"), &serde_json::to_vec(self).unwrap_or_default());
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    pub reason: String,
    pub message: String,
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a Unix time in milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

struct Sup {
    dir: PathBuf,
    state: ReplicaState,
    events: std::fs::File,
    /// The running sandbox's bwrap pid (0 between phases), for the metrics monitor.
    sandbox: Arc<std::sync::atomic::AtomicU32>,
}

impl Sup {
    fn save(&self) {
        self.state.write(&self.dir);
    }
    fn event(&mut self, reason: &str, message: String) {
        let e = Event { at_ms: now_ms(), reason: reason.to_owned(), message };
        if let Ok(mut line) = serde_json::to_vec(&e) {
            line.push(b'\n');
            let _ = self.events.write_all(&line);
        }
    }
}

/// `trainyard supervise DIR`: runs one replica to its end. The exit code is 0 whenever the outcome was
/// recorded (the replica's own status is in `state.json`).
pub fn main(dir: &Path) -> i32 {
    let mut input = String::new();
    if std::io::Read::read_to_string(&mut std::io::stdin(), &mut input).is_err() {
        return 2;
    }
    let Ok(job) = serde_json::from_str::<ReplicaJob>(&input) else { return 2 };
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
    };
    sup.save();
    let stop_monitor = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (dir, job, pid, stop) =
            (dir.to_owned(), job.monitor.clone(), sup.sandbox.clone(), stop_monitor.clone());
        std::thread::spawn(move || super::metrics::monitor(&dir, &job, &pid, &stop))
    };
    let cgroup = match Cgroup::create(&cgroup_name(dir), job.millicpu, job.memory_mib) {
        Ok(cg) => Some(cg),
        Err(why) => {
            sup.event(
                "LimitsNotEnforced",
                format!("{}: CPU and memory limits are not enforced: {why}", job.name),
            );
            None
        }
    };
    let log = match std::fs::OpenOptions::new().create(true).append(true).open(dir.join("log")) {
        Ok(f) => Arc::new(Mutex::new(f)),
        Err(_) => return 2,
    };

    let mut exit = ExitRecord::default();
    if let Some(pre) = &job.precheck {
        sup.state.phase = Phase::Prechecking;
        sup.save();
        let out = run_phase(&mut sup, &job, pre, &log, &cgroup);
        let result = std::fs::read_to_string(dir.join("runtime").join("precheck.json")).ok();
        let message = result
            .as_deref()
            .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "the precheck wrote no result".to_owned());
        sup.state.precheck = Some(message.clone());
        if out.code != Some(0) {
            exit = ExitRecord { precheck_failed: !out.stopped, ..out };
        } else {
            sup.event("PrecheckResult", format!("{}: {message}", job.name));
        }
    }
    if sup.state.exit.is_none() && exit == ExitRecord::default() {
        sup.state.phase = Phase::Running;
        sup.save();
        exit = run_phase(&mut sup, &job, &job.cmd, &log, &cgroup);
    }
    stop_monitor.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = monitor.join();
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

/// The shell that starts the replica inside the sandbox: ignores the checkpoint signals itself (so only the
/// user's processes answer them), starts sshd when asked, then runs the command.
fn wrapper(sshd: bool) -> String {
    let mut s = String::from("trap '' USR1 USR2\n");
    if sshd {
        s.push_str(&format!(
            "if [ -x /usr/sbin/sshd ]; then mkdir -p /run/sshd && /usr/sbin/sshd -f {RUNTIME_DIR}/ssh/sshd_config -E {RUNTIME_DIR}/ssh/sshd.log || echo 'trainyard: sshd did not start' >&2; else echo 'trainyard: passwordless SSH is on but the image has no /usr/sbin/sshd' >&2; fi\n"
        ));
    }
    s.push_str("bash -c \"$TRAINYARD_CMD\"\n");
    s
}

/// Runs one sandboxed command to its end (or through the stop protocol), with its output in the log.
fn run_phase(
    sup: &mut Sup,
    job: &ReplicaJob,
    cmd: &str,
    log: &Arc<Mutex<std::fs::File>>,
    cgroup: &Option<Cgroup>,
) -> ExitRecord {
    let script = wrapper(job.sshd && sup.state.phase == Phase::Running);
    let mut c = Command::new(&job.bwrap);
    c.args(job.sandbox.args())
        .args(["bash", "-c", &script])
        .env_clear()
        .envs(job.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("TRAINYARD_CMD", cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let mut child = match c.spawn() {
        Ok(child) => child,
        Err(e) => {
            append_log(
                log,
                'E',
                &format!("trainyard: cannot start the sandbox ({}): {e}", job.bwrap.display()),
            );
            return ExitRecord { code: Some(127), ..ExitRecord::default() };
        }
    };
    // The sandbox's PID namespace names its processes for every signal from here on (never bubblewrap's own
    // process: killing it would orphan the sandbox). It exists within milliseconds unless bwrap failed.
    let t0 = Instant::now();
    let ns = loop {
        if let Some(ns) = procs::sandbox_ns(child.id()) {
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
            let mut r = std::io::BufReader::new(s);
            let mut line = Vec::new();
            while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&line);
                append_log(&log, tag, text.trim_end_matches(['\n', '\r']));
                line.clear();
            }
        })
    })
    .collect();
    let mut stopped = false;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if !stopped && let Some(req) = read_stop(&sup.dir) {
            stopped = true;
            stop_protocol(sup, job, &mut child, ns.as_deref(), &req);
            if let Ok(status) = child.wait() {
                break status;
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
    use std::os::unix::process::ExitStatusExt;
    ExitRecord {
        code: status.code(),
        signal: status.signal(),
        oom_killed: cgroup.as_ref().is_some_and(Cgroup::oom_killed),
        stopped,
        ..ExitRecord::default()
    }
}

fn read_stop(dir: &Path) -> Option<StopRequest> {
    serde_json::from_slice(&std::fs::read(dir.join("stop.json")).ok()?).ok()
}

fn append_log(log: &Arc<Mutex<std::fs::File>>, tag: char, text: &str) {
    let line = format!("{} {tag} {text}\n", rfc3339_ms(now_ms()));
    if let Ok(mut f) = log.lock() {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Signal + request file, wait for `checkpoint-done` or exit, then SIGTERM, grace, SIGKILL of every process
/// in the sandbox. Each step is an event with its duration.
fn stop_protocol(sup: &mut Sup, job: &ReplicaJob, child: &mut Child, ns: Option<&Path>, req: &StopRequest) {
    let runtime = sup.dir.join("runtime");
    let name = job.name.clone();
    let exited = |child: &mut Child| matches!(child.try_wait(), Ok(Some(_)));
    let in_sandbox = || ns.map(procs::ns_processes).unwrap_or_default();
    let user_processes = || in_sandbox().into_iter().filter(|&(_, inner)| inner != 1);
    if req.checkpoint {
        let t0 = Instant::now();
        let _ = std::fs::write(runtime.join("checkpoint-requested"), now_ms().to_string());
        for (pid, _) in user_processes() {
            procs::signal(pid, req.signal);
        }
        sup.event(
            "CheckpointRequested",
            format!(
                "{name}: sent {} and wrote {RUNTIME_DIR}/checkpoint-requested; waiting up to {} s",
                trainyard_core::failure::signal_name(req.signal),
                req.checkpoint_timeout_s
            ),
        );
        let deadline = Duration::from_secs(req.checkpoint_timeout_s);
        loop {
            if runtime.join("checkpoint-done").exists() {
                sup.event(
                    "CheckpointDone",
                    format!("{name}: checkpoint reported done after {:.1} s", t0.elapsed().as_secs_f64()),
                );
                break;
            }
            if exited(child) {
                sup.event(
                    "CheckpointDone",
                    format!("{name}: exited {:.1} s after the notice", t0.elapsed().as_secs_f64()),
                );
                return;
            }
            if t0.elapsed() >= deadline {
                sup.event(
                    "CheckpointTimedOut",
                    format!("{name}: no checkpoint-done within {} s; terminating", req.checkpoint_timeout_s),
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // SIGTERM to every process of the command (again to any that appear: the sandbox may still be starting),
    // until the sandbox is gone or the grace period is over; then SIGKILL of everything in it.
    let t1 = Instant::now();
    let grace = Duration::from_secs(req.grace_s);
    let mut termed = std::collections::BTreeSet::new();
    loop {
        if exited(child) {
            sup.event(
                "Terminated",
                format!("{name}: ended {:.1} s after SIGTERM", t1.elapsed().as_secs_f64()),
            );
            return;
        }
        if t1.elapsed() >= grace {
            break;
        }
        for (pid, _) in user_processes() {
            if termed.insert(pid) {
                procs::signal(pid, procs::SIGTERM);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killing the namespace's init takes every process in the sandbox with it.
    for (pid, _) in in_sandbox() {
        procs::signal(pid, procs::SIGKILL);
    }
    let why = if req.grace_s == 0 {
        // A failed node gives no grace: its replicas are gone at once.
        format!("{name}: killed with SIGKILL at once (no grace period)")
    } else {
        format!("{name}: still running {} s after SIGTERM; killed with SIGKILL", req.grace_s)
    };
    sup.event("Killed", why);
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps() {
        assert_eq!(super::rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339_ms(1_796_012_345_678), "2026-11-30T04:19:05.678Z");
        assert_eq!(super::rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
