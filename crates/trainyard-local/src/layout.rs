//! Where an attempt's files are on disk: one place that names every path under `runs/TASK/aN/`, so that the
//! code that writes them (`prepare`, the supervisor) and the code that reads them (`outcome`, the log and
//! metrics readers) agree. Pure: it computes paths and touches nothing.

use crate::AttemptKey;
use std::path::{Path, PathBuf};

/// A replica's state in its dir, written by its supervisor ([`super::supervisor::ReplicaState`]).
pub(super) const STATE_JSON: &str = "state.json";

/// An attempt's directory, `runs/TASK_ID/aN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AttemptLayout {
    pub(super) dir: PathBuf,
}

impl AttemptLayout {
    pub(super) fn new(runs: &Path, key: &AttemptKey) -> AttemptLayout {
        AttemptLayout { dir: runs.join(&key.task_id).join(format!("a{}", key.attempt)) }
    }

    pub(super) fn at(dir: &Path) -> AttemptLayout {
        AttemptLayout { dir: dir.to_owned() }
    }

    /// What was launched (no env).
    pub(super) fn launch_json(&self) -> PathBuf {
        self.dir.join("launch.json")
    }
    /// The observation that ended the attempt, once it ended.
    pub(super) fn outcome_json(&self) -> PathBuf {
        self.dir.join("outcome.json")
    }
    /// Present once supervisors were started: a later server that finds no outcome knows they were.
    pub(super) fn spawned(&self) -> PathBuf {
        self.dir.join("spawned")
    }
    /// Every replica's hostname and address, bound at `/etc/hosts`.
    pub(super) fn hosts(&self) -> PathBuf {
        self.dir.join("hosts")
    }
    pub(super) fn passwd(&self) -> PathBuf {
        self.dir.join("passwd")
    }
    pub(super) fn group(&self) -> PathBuf {
        self.dir.join("group")
    }
    /// With egress only.
    pub(super) fn resolv(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }
    /// The attempt's key pair and host key.
    pub(super) fn ssh(&self) -> PathBuf {
        self.dir.join("ssh")
    }
    pub(super) fn replica(&self, name: &str) -> ReplicaLayout {
        ReplicaLayout { dir: self.dir.join(name) }
    }
}

/// A replica's directory, `runs/TASK_ID/aN/REPLICA`: what its supervisor writes, and the dirs its sandbox
/// writes (scratch and runtime, the attempt uid's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReplicaLayout {
    pub(super) dir: PathBuf,
}

impl ReplicaLayout {
    /// The replica's local disk (gone with the attempt): `/tmp` and `/root` inside.
    pub(super) fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }
    pub(super) fn tmp(&self) -> PathBuf {
        self.scratch().join("tmp")
    }
    pub(super) fn home(&self) -> PathBuf {
        self.scratch().join("root")
    }
    /// The replica's copy of the task's working directory, bound at `/workspace`.
    pub(super) fn workspace(&self) -> PathBuf {
        self.scratch().join("workspace")
    }
    /// Shared with the sandbox at [`super::sandbox::RUNTIME_DIR`]; in the scratch, whose file system holds
    /// it (see [`super::runtime_dir::RUNTIME_IN_REPLICA_DIR`]).
    pub(super) fn runtime(&self) -> PathBuf {
        self.dir.join(super::runtime_dir::RUNTIME_IN_REPLICA_DIR)
    }
    /// The replica's copies of the attempt's `hosts`, `passwd`, `group` and `resolv.conf`, bound at `/etc/...`:
    /// in its scratch, whose file system of its own then names no host path in the sandbox's
    /// `/proc/self/mountinfo` (a bind's line names its source's path inside its file system).
    pub(super) fn etc(&self) -> PathBuf {
        self.scratch().join("etc")
    }
    /// The scratch file system's image (see `scratch::mount_scratch`).
    pub(super) fn scratch_image(&self) -> PathBuf {
        self.dir.join(super::scratch::SCRATCH_IMAGE)
    }
    pub(super) fn events(&self) -> PathBuf {
        self.dir.join("events.jsonl")
    }
    /// How far the server has read `events.jsonl` (kept across restarts).
    pub(super) fn events_offset(&self) -> PathBuf {
        self.dir.join("events.offset")
    }
    pub(super) fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    pub(super) fn rotated_log(&self) -> PathBuf {
        self.dir.join("log.1")
    }
    pub(super) fn metrics(&self) -> PathBuf {
        self.dir.join("metrics.jsonl")
    }
    /// The server's request to stop.
    pub(super) fn stop_json(&self) -> PathBuf {
        self.dir.join("stop.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_an_attempt_and_its_replicas() {
        let key = AttemptKey { task_id: "t1".into(), attempt: 3 };
        let a = AttemptLayout::new(Path::new("/d/runs"), &key);
        assert_eq!(a.dir, Path::new("/d/runs/t1/a3"));
        assert_eq!(a.launch_json(), Path::new("/d/runs/t1/a3/launch.json"));
        assert_eq!(a.outcome_json(), Path::new("/d/runs/t1/a3/outcome.json"));
        let r = a.replica("x-master-0");
        assert_eq!(r.tmp(), Path::new("/d/runs/t1/a3/x-master-0/scratch/tmp"));
        assert_eq!(r.home(), Path::new("/d/runs/t1/a3/x-master-0/scratch/root"));
        assert_eq!(r.runtime(), Path::new("/d/runs/t1/a3/x-master-0/scratch/run"));
        assert_eq!(AttemptLayout::at(&a.dir), a);
    }
}
