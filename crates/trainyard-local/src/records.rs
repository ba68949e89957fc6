//! The records a replica's supervisor and the server share: the job the supervisor is sent (on its stdin),
//! the stop request (`stop.json`), the replica's state (`state.json`) and events (`events.jsonl`), and the
//! limits a replica runs under. The files themselves are described in `supervisor.rs`.

use super::clock::now_ms;
use super::files::write_atomic;
use super::netns::ReplicaNet;
use super::sandbox::SandboxPlan;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use trainyard_core::lifecycle::Reason;

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
    /// The attempt's unprivileged host uid, and the gid every sandbox shares (it opens the data dir's path
    /// to the replica's own dirs, and the volumes).
    pub uid: u32,
    pub gid: u32,
    /// The replica's place on its attempt's network; None: an empty network namespace of its own.
    #[serde(default)]
    pub net: Option<ReplicaNet>,
    #[serde(default)]
    pub limits: Limits,
}

/// What one replica may use beyond CPU and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Processes and threads in its cgroup (a fork bomb stops here).
    pub pids_max: u64,
    /// Its scratch (`/tmp`, `/root` and its runtime dir), checked every
    /// [`super::scratch::SCRATCH_CHECK_EVERY`]; over it, the replica is ended as the kubelet evicts a pod over
    /// its ephemeral storage.
    pub scratch_mib: u64,
    /// Files, dirs and links its scratch may hold (inodes of the data dir's disk, which every tenant shares).
    #[serde(default = "default_scratch_inodes")]
    pub scratch_inodes: u64,
    /// Its log file; then the log rotates.
    pub log_bytes: u64,
}

/// Defaults of [`Limits`] (`trainyard up` can change them).
pub const DEFAULT_PIDS_MAX: u64 = 4096;
pub const DEFAULT_SCRATCH_MIB: u64 = 50 * 1024;
pub const DEFAULT_LOG_BYTES: u64 = 64 * 1024 * 1024;
pub const DEFAULT_SCRATCH_INODES: u64 = 100_000;

fn default_scratch_inodes() -> u64 {
    DEFAULT_SCRATCH_INODES
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pids_max: DEFAULT_PIDS_MAX,
            scratch_mib: DEFAULT_SCRATCH_MIB,
            scratch_inodes: DEFAULT_SCRATCH_INODES,
            log_bytes: DEFAULT_LOG_BYTES,
        }
    }
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
    /// The sandbox itself was killed from outside (bubblewrap ended by a signal nobody in the sandbox can
    /// send): the machine's doing, not the task's.
    #[serde(default)]
    pub killed_outside: bool,
    /// Ended for using more than a limit allows (scratch): what it used.
    #[serde(default)]
    pub evicted: Option<String>,
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
    pub reason: Reason,
    pub message: String,
}

/// What a pooled supervisor is sent when a replica is given to it: the replica's dir and its job.
#[derive(Debug, Serialize, Deserialize)]
pub struct PooledJob {
    pub dir: PathBuf,
    pub job: ReplicaJob,
}
