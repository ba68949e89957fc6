//! The supervisor's end of a replica: the stop protocol (the exit checkpoint, SIGTERM, the grace period,
//! SIGKILL), the signals to the sandbox's processes, and how the sandbox's end is told apart from a kill on the
//! host. A child module of `supervisor`.

use super::*;

pub(super) fn read_stop(dir: &Path) -> Option<StopRequest> {
    serde_json::from_slice(&std::fs::read(dir.join("stop.json")).ok()?).ok()
}

/// Signal + request file, wait for `checkpoint-done` or exit, then SIGTERM, grace, SIGKILL of every process
/// in the sandbox. Each step is an event with its duration.
pub(super) fn stop_protocol(
    sup: &mut Sup,
    job: &ReplicaJob,
    child: &mut Child,
    ns: &mut Option<PathBuf>,
    req: &StopRequest,
) {
    let runtime = sup.runtime_dir();
    let name = job.name.clone();
    let exited = |child: &mut Child| matches!(child.try_wait(), Ok(Some(_)));
    let bwrap = child.id();
    let mut user_processes =
        || sandbox_processes(ns, bwrap).into_iter().filter(|&(_, inner)| inner != 1).collect::<Vec<_>>();
    if req.checkpoint {
        let t0 = Instant::now();
        if let Some(rt) = &runtime {
            let _ =
                rt.create("checkpoint-requested", now_ms().to_string().as_bytes(), Some((job.uid, job.gid)));
        }
        // The notice goes to the processes that handle it (a trap in a shell, a handler in Python): one
        // that does not would just die of it, and take the replica with it before anything was saved.
        let mut told = std::collections::BTreeSet::new();
        let mut tell = |told: &mut std::collections::BTreeSet<u32>| {
            for (pid, _) in user_processes().into_iter().filter(|&(pid, _)| procs::catches(pid, req.signal)) {
                if told.insert(pid) {
                    procs::signal(pid, req.signal);
                }
            }
        };
        tell(&mut told);
        let first = told.len();
        sup.event(
            Reason::CheckpointRequested,
            format!(
                "{name}: sent {} to {first} process{} that handle it and wrote {RUNTIME_DIR}/checkpoint-requested; waiting up to {} s",
                trainyard_core::failure::signal_name(req.signal),
                if first == 1 { "" } else { "es" },
                req.checkpoint_timeout_s
            ),
        );
        let deadline = Duration::from_secs(req.checkpoint_timeout_s);
        loop {
            if runtime.as_ref().is_some_and(|rt| rt.exists("checkpoint-done")) {
                sup.event(
                    Reason::CheckpointDone,
                    format!("{name}: checkpoint reported done after {:.1} s", t0.elapsed().as_secs_f64()),
                );
                break;
            }
            if exited(child) {
                sup.event(
                    Reason::CheckpointDone,
                    format!("{name}: exited {:.1} s after the notice", t0.elapsed().as_secs_f64()),
                );
                return;
            }
            // Processes that start (or install their handler) while the checkpoint is awaited get the notice
            // too: a stop in the seconds before torchrun starts its workers must still reach them.
            tell(&mut told);
            if t0.elapsed() >= deadline {
                sup.event(
                    Reason::CheckpointTimedOut,
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
                Reason::Terminated,
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
    kill_sandbox(ns, child);
    let why = if req.grace_s == 0 {
        // A failed node gives no grace: its replicas are gone at once.
        format!("{name}: killed with SIGKILL at once (no grace period)")
    } else {
        format!("{name}: still running {} s after SIGTERM; killed with SIGKILL", req.grace_s)
    };
    sup.event(Reason::Killed, why);
}

/// Whether the sandbox's init (`pid`, bubblewrap's child) ended before the command it started, which only a
/// signal from the host does (inside its namespace nothing can kill it). When the command ends, the init
/// tells bubblewrap so and bubblewrap exits at once, leaving the init unreaped: it comes to this process (a
/// child subreaper) and is reaped here. When the init is killed first, bubblewrap reaps it itself, and it
/// is no child of this process. Called once bubblewrap has been reaped and the sandbox killed.
pub(super) fn init_killed(pid: u32) -> bool {
    use rustix::process::{Pid, WaitOptions, waitpid};
    let Some(pid) = Pid::from_raw(pid as i32) else { return false };
    loop {
        match waitpid(Some(pid), WaitOptions::empty()) {
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return e == rustix::io::Errno::CHILD,
        }
    }
}

/// The processes in the sandbox started by bubblewrap process `bwrap`, its PID namespace looked for first
/// while it is not known yet.
fn sandbox_processes(ns: &mut Option<PathBuf>, bwrap: u32) -> Vec<(u32, u32)> {
    if ns.is_none() {
        *ns = procs::sandbox_ns(bwrap);
    }
    ns.as_deref().map(procs::ns_processes).unwrap_or_default()
}

/// SIGKILL to everything in the sandbox: its namespace's init, which takes every process in it along. A
/// sandbox whose namespace was never found (bubblewrap still setting it up) goes with bubblewrap itself: it
/// runs with `--die-with-parent`, so what it started dies with it.
pub(super) fn kill_sandbox(ns: &mut Option<PathBuf>, child: &mut Child) {
    let inside = sandbox_processes(ns, child.id());
    if ns.is_none() {
        let _ = child.kill();
    }
    for (pid, _) in inside {
        procs::signal(pid, procs::SIGKILL);
    }
}
