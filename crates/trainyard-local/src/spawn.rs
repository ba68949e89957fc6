//! How the supervisor starts processes on the host: bubblewrap as the attempt's uid in the replica's network
//! namespace with only the descriptors it reads, and helpers under the same lock.

use super::*;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Mutex;

/// The environment of every process the supervisor starts on the host: fixed, nothing of the replica's.
pub(super) const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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

/// The thread every sandbox starts from, with what it has entered.
pub(super) struct Spawner {
    /// The network namespace the thread is in (the replica's, once it has one).
    netns: Option<OwnedFd>,
    /// The thread's own mount namespace (Err: why it has none): the replica's scratch file system is mounted
    /// there, seen by the sandboxes it starts and by nothing on the host, and gone with them and the
    /// supervisor, however they end.
    pub(super) mounts: Result<(), String>,
}

type Job = Box<dyn FnOnce(&mut Spawner) + Send>;

/// Runs `f` on the spawner: one thread that lives as long as the supervisor. A thread's network and mount
/// namespaces are its own and a child starts in its parent thread's; and bubblewrap's `--die-with-parent`
/// fires when the thread that started it ends, not the process. The thread makes its mount namespace first
/// (a copy of the host's, receiving the host's later mounts, sending none back).
pub(super) fn on_spawner<T: Send + 'static>(f: impl FnOnce(&mut Spawner) -> T + Send + 'static) -> Option<T> {
    static SPAWNER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::spawn(move || {
            let mut spawner = Spawner { netns: None, mounts: own_mount_namespace() };
            for job in rx {
                job(&mut spawner);
            }
        });
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    let job: Job = Box::new(move |s: &mut Spawner| {
        let _ = reply.send(f(s));
    });
    tx.lock().unwrap_or_else(|e| e.into_inner()).send(job).ok()?;
    answer.recv().ok()
}

/// Gives this thread a mount namespace of its own whose mounts never reach the host's.
pub(super) fn own_mount_namespace() -> Result<(), String> {
    use rustix::mount::{MountPropagationFlags as P, mount_change};
    // A thread's own mount namespace is sound: nothing of this thread's is shared with the others but the
    // file table, which NEWNS leaves alone.
    #[allow(deprecated)]
    rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNS)
        .map_err(|e| format!("cannot make a mount namespace: {e}"))?;
    mount_change("/", P::DOWNSTREAM | P::REC).map_err(|e| format!("cannot keep its mounts off the host: {e}"))
}

/// Starts bubblewrap (on the spawner, see [`on_spawner`]) in the replica's network namespace as the attempt's
/// unprivileged uid with the sandboxes' gid and no supplementary groups (`no_new_privs` is the supervisor's
/// since its start), with only the descriptors it reads open besides its pipes.
pub(super) fn spawn_as(c: Command, id: Identity<'_>) -> std::io::Result<Child> {
    use rustix::io::{FdFlags, fcntl_setfd};
    let mut c = c;
    c.uid(id.uid).gid(id.gid);
    let netns = match id.netns {
        Some(ns) => Some(ns.try_clone()?),
        None => None,
    };
    let keep: Vec<OwnedFd> = id.keep.into();
    on_spawner(move |s| {
        if let Some(ns) = &netns
            && s.netns.as_ref().is_none_or(|c| !same_file(c, ns))
        {
            netns::enter(ns).map_err(std::io::Error::other)?;
            s.netns = Some(ns.try_clone()?);
        }
        let _only_child = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // The supervisor's allocator turned transparent huge pages off for this process (see
        // `SupervisorPool::command`), and children inherit that: the task's own memory keeps them. The
        // allocator's heap is not advised for them, so it stays on small pages.
        let _ = rustix::thread::disable_transparent_huge_pages(false);
        for fd in &keep {
            fcntl_setfd(fd, FdFlags::empty())?;
        }
        let child = c.spawn();
        for fd in &keep {
            let _ = fcntl_setfd(fd, FdFlags::CLOEXEC);
        }
        child
    })
    .unwrap_or_else(|| Err(std::io::Error::other("the spawner is gone")))
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
