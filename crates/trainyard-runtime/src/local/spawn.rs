//! How the supervisor starts processes on the host: bubblewrap as the attempt's uid in the replica's network
//! namespace with only the descriptors it reads, and helpers under the same lock.

use super::*;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Mutex;

/// A sealed memory file holding `bytes`, for bubblewrap to read (`--seccomp FD`, the env).
pub(super) fn memfd(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    std::io::Seek::rewind(&mut f)?;
    let fd = OwnedFd::from(f);
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(fd)
}

/// Who the sandbox's first process is.
pub(super) struct Identity<'a> {
    /// The replica's network namespace.
    pub(super) netns: Option<&'a OwnedFd>,
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// Descriptors bubblewrap must inherit (the seccomp filter, the env, its options), under the numbers its
    /// arguments name.
    pub(super) keep: [OwnedFd; 3],
}

/// Every process the supervisor starts goes through here, so descriptors meant for one child reach no other.
pub(super) static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// Starts bubblewrap in the replica's network namespace as the attempt's unprivileged uid with the
/// sandboxes' gid and no supplementary groups (`no_new_privs` is the supervisor's since its start), with only
/// the descriptors it reads open besides its pipes.
///
/// The start happens on one thread that lives as long as the supervisor: a thread's network namespace is its
/// own and a child starts in its parent thread's; and bubblewrap's `--die-with-parent` fires when the thread
/// that started it ends, not the process.
pub(super) fn spawn_as(c: Command, id: Identity<'_>) -> std::io::Result<Child> {
    use rustix::io::{FdFlags, fcntl_setfd};
    static SPAWNER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> =
        std::sync::OnceLock::new();
    let mut c = c;
    c.uid(id.uid).gid(id.gid);
    let netns = match id.netns {
        Some(ns) => Some(ns.try_clone()?),
        None => None,
    };
    let keep: Vec<OwnedFd> = id.keep.into();
    let (reply, answer) = std::sync::mpsc::channel();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::spawn(move || {
            let mut current: Option<OwnedFd> = None;
            for mut req in rx {
                let result = (|| {
                    if let Some(ns) = &req.netns
                        && current.as_ref().is_none_or(|c| !same_file(c, ns))
                    {
                        netns::enter(ns).map_err(std::io::Error::other)?;
                        current = Some(ns.try_clone()?);
                    }
                    let _only_child = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                    // The supervisor's allocator turned transparent huge pages off for this process (see
                    // `SupervisorPool::command`), and children inherit that: the task's own memory keeps
                    // them. The allocator's heap is not advised for them, so it stays on small pages.
                    let _ = rustix::thread::disable_transparent_huge_pages(false);
                    for fd in &req.keep {
                        fcntl_setfd(fd, FdFlags::empty())?;
                    }
                    let child = req.cmd.spawn();
                    for fd in &req.keep {
                        let _ = fcntl_setfd(fd, FdFlags::CLOEXEC);
                    }
                    child
                })();
                let _ = req.reply.send(result);
            }
        });
        Mutex::new(tx)
    });
    let req = SpawnRequest { cmd: c, netns, keep, reply };
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(req)
        .map_err(|_| std::io::Error::other("no spawner"))?;
    answer.recv().map_err(|_| std::io::Error::other("the spawner is gone"))?
}

pub(super) struct SpawnRequest {
    cmd: Command,
    netns: Option<OwnedFd>,
    keep: Vec<OwnedFd>,
    reply: std::sync::mpsc::Sender<std::io::Result<Child>>,
}

pub(super) fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Runs a host-side helper (`nvidia-smi`) under the same lock as the sandbox's start.
pub fn spawn_helper(c: &mut Command) -> std::io::Result<std::process::Output> {
    let child = {
        let _only_child = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        c.spawn()?
    };
    child.wait_with_output()
}
