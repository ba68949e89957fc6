//! The one way the supervisor and the server touch a replica's runtime dir, which the replica writes too.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The most the supervisor reads of a file the replica wrote.
pub const RUNTIME_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// The replica's runtime dir, as the supervisor may touch it: through a descriptor of the directory (its
/// parent is the supervisor's and never the replica's), creating only fresh files and never following a link
/// or opening anything but a regular file.
#[derive(Debug)]
pub struct RuntimeDir {
    fd: OwnedFd,
}

/// Where a replica's runtime dir is in its dir: in its scratch, whose file system holds it (the scratch
/// dir is the platform's; the runtime dir in it the replica's).
pub const RUNTIME_IN_REPLICA_DIR: &str = "scratch/run";

/// The Ray head's view of its cluster, written by the head into its runtime dir; its supervisor copies it
/// into the replica dir, where the server reads it (at most [`RUNTIME_FILE_MAX_BYTES`]).
pub const RAY_STATE: &str = "ray-state.json";

/// Where the runtime dir is in the scratch.
pub const RUNTIME_IN_SCRATCH: &str = "run";

impl RuntimeDir {
    pub fn open(replica_dir: &Path) -> Option<RuntimeDir> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            replica_dir.join(RUNTIME_IN_REPLICA_DIR),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Some(RuntimeDir { fd })
    }

    /// The runtime dir `name` under the directory `dir` (a link is not followed).
    pub fn open_at(dir: impl AsFd, name: &str) -> Option<RuntimeDir> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Some(RuntimeDir { fd })
    }

    /// Whether `name` exists (whatever it is; a link is not followed).
    pub fn exists(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Replaces `name` with a new file holding `bytes`, owned by `owner` (whatever was there is removed,
    /// never written through).
    pub fn create(&self, name: &str, bytes: &[u8], owner: Option<(u32, u32)>) -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let _ = rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty());
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        if let Some((uid, gid)) = owner {
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )?;
        }
        std::fs::File::from(fd).write_all(bytes)
    }

    /// Reads `name` when it is a regular file (at most [`RUNTIME_FILE_MAX_BYTES`]).
    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        read_regular_at(&self.fd, name)
    }
}

/// Reads a regular file under a directory descriptor without following a link or blocking on a FIFO.
fn read_regular_at(dir: impl AsFd, name: &str) -> Option<Vec<u8>> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return None;
    }
    let mut buf = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::from(fd), RUNTIME_FILE_MAX_BYTES),
        &mut buf,
    )
    .ok()?;
    Some(buf)
}
