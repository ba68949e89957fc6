//! Supervisors started ahead of need. Starting a replica's supervisor costs, before any of the replica's own
//! work: executing this (large) binary, and moving the new process into its cgroups, which on cgroup v1
//! waits for an RCU grace period (10-15 ms, measured). A pooled supervisor (`trainyard supervise RUNS_DIR/-`,
//! the runs dir naming its server) has done
//! both while it waited; given a replica (a `PooledJob` on its standard input), it renames
//! its cgroups to the replica's and sets the limits, both quick. The pool is refilled off the launch path,
//! after each launch that took from it.
//!
//! Idle pooled supervisors are the server's children, run as root with the same fixed environment as any
//! supervisor; they hold nothing of any task. When the server ends, their standard input closes and they
//! leave their cgroups and exit. Cgroups named `pool-PID` whose supervisor was killed are removed at
//! the next start ([`sweep`]): removing a cgroup still holding a process fails, so a live pool (another
//! server's) is left alone.

use super::procs::cgroup_parents;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::procs::POOL_CGROUP_PREFIX as CGROUP_PREFIX;

/// Idle supervisors, ready for replicas.
#[derive(Debug)]
pub struct SupervisorPool {
    exe: std::path::PathBuf,
    args: Vec<String>,
    /// `RUNS_DIR/-`, a pooled supervisor's argument.
    marker: std::path::PathBuf,
    size: usize,
    /// The replicas' scratch limits (MiB, inodes): pooled supervisors make a scratch file system for them
    /// while they wait.
    scratch: Option<(u64, u64)>,
    idle: Mutex<Vec<Child>>,
    filling: AtomicBool,
}

impl SupervisorPool {
    /// A pool of up to `size` idle supervisors (`exe args RUNS_DIR/-`); empty until [`SupervisorPool::fill`].
    pub fn new(
        supervisor: &(std::path::PathBuf, Vec<String>),
        runs_dir: &Path,
        size: usize,
        scratch: Option<(u64, u64)>,
    ) -> Self {
        SupervisorPool {
            exe: supervisor.0.clone(),
            args: supervisor.1.clone(),
            marker: runs_dir.join("-"),
            size,
            scratch,
            idle: Mutex::new(Vec::new()),
            filling: AtomicBool::new(false),
        }
    }

    /// A supervisor's command line, its environment fixed: nothing of the server's (its token, a preload)
    /// reaches it, and its allocator keeps to small pages. `dir`: the replica dir, or `RUNS_DIR/-` for a
    /// pooled one.
    pub fn command(exe: &Path, args: &[String], dir: &Path) -> Command {
        let mut c = Command::new(exe);
        c.args(args)
            .arg(dir)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            // The allocator's heap stays on small pages: it would ask for transparent huge pages, and then
            // every thread's first allocation faults in a zeroed 2 MiB page. For a supervisor (a few MiB, a
            // handful of threads) that was ~12 ms of CPU a replica, a third of its CPU, all of it at the
            // gang's start (`perf`, local-bench). The sandbox gets huge pages back (see `spawn`).
            .env("MIMALLOC_ALLOW_THP", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        c
    }

    /// An idle supervisor that is still alive, if any.
    pub fn take(&self) -> Option<Child> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut child) = idle.pop() {
            if matches!(child.try_wait(), Ok(None)) {
                return Some(child);
            }
        }
        None
    }

    /// Starts idle supervisors until the pool is full, on a thread of its own (one at a time).
    pub fn fill(self: &std::sync::Arc<Self>) {
        if self.size == 0 || self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = self.clone();
        std::thread::spawn(move || {
            loop {
                let have = pool.idle.lock().unwrap_or_else(|e| e.into_inner()).len();
                if have >= pool.size {
                    break;
                }
                let mut c = Self::command(&pool.exe, &pool.args, &pool.marker);
                if let Some((mib, inodes)) = pool.scratch {
                    c.env(super::scratch::POOL_SCRATCH_ENV, format!("{mib}:{inodes}"));
                }
                match c.spawn() {
                    Ok(child) => pool.idle.lock().unwrap_or_else(|e| e.into_inner()).push(child),
                    Err(_) => break,
                }
            }
            pool.filling.store(false, Ordering::Release);
        });
    }
}

impl Drop for SupervisorPool {
    fn drop(&mut self) {
        // Their standard input closes with their handles: each leaves its cgroups and exits; reaped here.
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner()));
        std::thread::spawn(move || {
            for mut child in idle {
                drop(child.stdin.take());
                let _ = child.wait();
            }
        });
    }
}

/// Removes the scratch images pooled supervisors made and left when they were killed while they waited (their
/// mounts went with them), in the pool's dir (`RUNS_DIR/-`). Called before this server's pool starts.
pub fn sweep_scratch(pool_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(pool_dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        match path.extension().and_then(|x| x.to_str()) {
            Some("img") => {
                let _ = std::fs::remove_file(&path);
            }
            Some("mnt" | "empty") => {
                let _ = std::fs::remove_dir(&path);
            }
            _ => {}
        }
    }
}

/// Removes the cgroups of pooled supervisors that were killed while they waited (best effort; a cgroup
/// with a process in it is not removed).
pub fn sweep() {
    for base in cgroup_parents() {
        let Ok(entries) = std::fs::read_dir(&base) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(CGROUP_PREFIX) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}
