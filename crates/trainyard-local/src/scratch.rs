//! A replica's scratch: a file system of its own (an ext4 image on a loop device, sized to the replica's
//! limits, so a full scratch is the replica's problem and never the data dir's), and the watcher that
//! measures it and asks for an eviction over the limit (as the kubelet evicts a pod over its ephemeral
//! storage). Where no file system can be made (no loop devices, no `mkfs.ext4`), the watcher alone limits it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the scratch dirs are measured (walked) when the scratch has no file system of its own.
pub const SCRATCH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// How often the scratch's own file system's counts are read.
pub const SCRATCH_FS_CHECK_EVERY: Duration = Duration::from_millis(500);

/// The scratch file system's image, in the replica's dir.
pub(super) const SCRATCH_IMAGE: &str = "scratch.img";

/// Inodes of the scratch file system: a little over the limit, so that a replica that fills it is seen over
/// its limit and evicted (as without a file system of its own), not left failing its writes.
fn image_inodes(limit: u64) -> u64 {
    limit.saturating_add(limit / 16).saturating_add(64)
}

/// Bytes of the scratch image beyond the replica's limit: room for `inodes` inodes (256 bytes each) and the
/// file system's own blocks, so that the replica can write about its limit. The image is sparse: what the
/// file system never writes takes no space on the host.
fn image_bytes(limit_mib: u64, inodes: u64) -> u64 {
    let limit = limit_mib.saturating_mul(1024 * 1024);
    limit
        .saturating_add(image_inodes(inodes).saturating_mul(256))
        .saturating_add(limit / 64)
        .saturating_add(8 << 20)
}

/// A replica's scratch file system, mounted in the spawner's mount namespace (see
/// [`super::spawn::on_spawner`]): the host never sees it, and it goes when the supervisor and its sandbox
/// are gone, however they end. The supervisor reaches it through a descriptor of its root.
#[derive(Debug)]
pub(super) struct ScratchFs {
    pub(super) root: std::os::fd::OwnedFd,
    /// Blocks and inodes in use when it was made (the file system's own, and what the server put there).
    base: (u64, u64),
}

impl ScratchFs {
    /// Bytes and inodes the replica has used in it: cheap enough to ask often.
    fn used(&self) -> Option<(u64, u64)> {
        let st = rustix::fs::fstatvfs(&self.root).ok()?;
        let blocks = st.f_blocks.saturating_sub(st.f_bfree);
        let inodes = st.f_files.saturating_sub(st.f_ffree);
        Some((
            blocks.saturating_sub(self.base.0).saturating_mul(st.f_frsize),
            inodes.saturating_sub(self.base.1),
        ))
    }
}

/// Makes the replica's scratch a file system of its own: `image` (sparse, created here) formatted with what
/// `content` holds (the scratch dir: the server put the replica's dirs and files there, owners kept), then
/// mounted over `scratch` in the spawner's mount namespace (no set-uid, no devices). Err says why not; the scratch is then
/// the dir as it is, on the data dir's disk.
pub(super) fn mount_scratch(
    content: &Path,
    scratch: &Path,
    image: &Path,
    limit_mib: u64,
    limit_inodes: u64,
) -> Result<ScratchFs, String> {
    let made = (|| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(image)
            .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
        f.set_len(image_bytes(limit_mib, limit_inodes))
            .map_err(|e| format!("cannot size {}: {e}", image.display()))?;
        drop(f);
        // No journal (the scratch does not outlive its replica), lazy tables (formatting takes milliseconds),
        // no blocks kept for root.
        run(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1,nodiscard", "-N"])
            .arg(image_inodes(limit_inodes).to_string())
            .arg("-d")
            .arg(content)
            .arg(image))?;
        let (scratch, image) = (scratch.to_owned(), image.to_owned());
        super::spawn::on_spawner(move |s| -> Result<ScratchFs, String> {
            s.mounts.clone()?;
            run(std::process::Command::new("mount")
                .args(["-o", "loop,nosuid,nodev,noatime"])
                .arg(&image)
                .arg(&scratch))?;
            use rustix::fs::{Mode, OFlags};
            let root = rustix::fs::open(
                &scratch,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("cannot open {}: {e}", scratch.display()))?;
            let st =
                rustix::fs::fstatvfs(&root).map_err(|e| format!("cannot read {}: {e}", scratch.display()))?;
            let base = (st.f_blocks.saturating_sub(st.f_bfree), st.f_files.saturating_sub(st.f_ffree));
            Ok(ScratchFs { root, base })
        })
        .unwrap_or_else(|| Err("the spawner is gone".into()))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(image);
    }
    made
}

/// The variable that gives a pooled supervisor the server's scratch limits (`MIB:INODES`), so that it makes
/// its replica's scratch file system while it waits (see [`Premade`]).
pub const POOL_SCRATCH_ENV: &str = "TRAINYARD_POOL_SCRATCH";

/// A scratch file system a pooled supervisor made while it waited for a replica, mounted at
/// `RUNS_DIR/-/PID.mnt` in its spawner's mount namespace: formatting and mounting (20 ms or more a replica)
/// are then off the replica's start, which only copies what the server put in the scratch dir into it and
/// moves the mount over the scratch dir.
#[derive(Debug)]
pub(super) struct Premade {
    fs: ScratchFs,
    image: PathBuf,
    at: PathBuf,
    limits: (u64, u64),
}

/// Makes a [`Premade`] scratch file system in the pool's dir (`RUNS_DIR/-`) for the given limits.
pub(super) fn premake(pool_dir: &Path, limit_mib: u64, limit_inodes: u64) -> Result<Premade, String> {
    let pid = std::process::id();
    std::fs::create_dir_all(pool_dir).map_err(|e| format!("cannot create {}: {e}", pool_dir.display()))?;
    let (image, at) = (pool_dir.join(format!("{pid}.img")), pool_dir.join(format!("{pid}.mnt")));
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_dir(&at);
    std::fs::create_dir(&at).map_err(|e| format!("cannot create {}: {e}", at.display()))?;
    let empty = pool_dir.join(format!("{pid}.empty"));
    let _ = std::fs::remove_dir(&empty);
    std::fs::create_dir(&empty).map_err(|e| format!("cannot create {}: {e}", empty.display()))?;
    let fs = mount_scratch(&empty, &at, &image, limit_mib, limit_inodes);
    let _ = std::fs::remove_dir(&empty);
    match fs {
        Ok(fs) => Ok(Premade { fs, image, at, limits: (limit_mib, limit_inodes) }),
        Err(e) => {
            let _ = std::fs::remove_dir(&at);
            Err(e)
        }
    }
}

impl Premade {
    /// Makes this file system the replica's scratch: what the server put in `scratch` copied in (owners and
    /// modes kept), the image moved to `image`, the mount moved over `scratch`. Err (limits that differ, or a
    /// step that failed) leaves nothing mounted and nothing of the image; the caller makes one as usual.
    pub(super) fn adopt(
        self,
        scratch: &Path,
        image: &Path,
        limit_mib: u64,
        limit_inodes: u64,
    ) -> Result<ScratchFs, String> {
        if self.limits != (limit_mib, limit_inodes) {
            self.discard();
            return Err("the pooled scratch was made for other limits".into());
        }
        let adopted = (|| {
            copy_into(scratch, &self.fs.root)?;
            std::fs::rename(&self.image, image)
                .map_err(|e| format!("cannot move {}: {e}", self.image.display()))?;
            let (from, to) = (self.at.clone(), scratch.to_owned());
            super::spawn::on_spawner(move |_| rustix::mount::mount_move(&from, &to))
                .ok_or("the spawner is gone")?
                .map_err(|e| format!("cannot move the scratch's mount: {e}"))
        })();
        match adopted {
            Ok(()) => {
                let _ = std::fs::remove_dir(&self.at);
                Ok(self.fs)
            }
            Err(e) => {
                let _ = std::fs::remove_file(image);
                self.discard();
                Err(e)
            }
        }
    }

    /// Unmounts it and deletes its image (a pooled supervisor with no replica to run).
    pub(super) fn discard(self) {
        let Premade { fs, image, at, .. } = self;
        drop(fs);
        let target = at.clone();
        let _ = super::spawn::on_spawner(move |_| {
            rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH)
        });
        let _ = std::fs::remove_file(&image);
        let _ = std::fs::remove_dir(&at);
    }
}

/// Copies the tree under `src` (the server's, on the host) into the directory `dst`: dirs, regular files and
/// links, owners and modes kept.
fn copy_into(src: &Path, dst: &std::os::fd::OwnedFd) -> Result<(), String> {
    use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};
    use std::os::unix::fs::MetadataExt;
    let fail = |what: &Path, e: &dyn std::fmt::Display| format!("cannot copy {}: {e}", what.display());
    let entries = std::fs::read_dir(src).map_err(|e| fail(src, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| fail(src, &e))?;
        let (path, name) = (entry.path(), entry.file_name());
        let meta = std::fs::symlink_metadata(&path).map_err(|e| fail(&path, &e))?;
        let owner = (Some(Uid::from_raw(meta.uid())), Some(Gid::from_raw(meta.gid())));
        let mode = Mode::from_raw_mode(meta.mode() & 0o7777);
        if meta.is_dir() {
            rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(0o700)).map_err(|e| fail(&path, &e))?;
            let sub = rustix::fs::openat(
                dst,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fail(&path, &e))?;
            copy_into(&path, &sub)?;
            rustix::fs::fchown(&sub, owner.0, owner.1).map_err(|e| fail(&path, &e))?;
            rustix::fs::fchmod(&sub, mode).map_err(|e| fail(&path, &e))?;
        } else if meta.is_file() {
            let bytes = std::fs::read(&path).map_err(|e| fail(&path, &e))?;
            let fd = rustix::fs::openat(
                dst,
                &name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| fail(&path, &e))?;
            rustix::fs::fchown(&fd, owner.0, owner.1).map_err(|e| fail(&path, &e))?;
            rustix::fs::fchmod(&fd, mode).map_err(|e| fail(&path, &e))?;
            std::io::Write::write_all(&mut std::fs::File::from(fd), &bytes).map_err(|e| fail(&path, &e))?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| fail(&path, &e))?;
            rustix::fs::symlinkat(&target, dst, &name).map_err(|e| fail(&path, &e))?;
            rustix::fs::chownat(dst, &name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| fail(&path, &e))?;
        }
    }
    Ok(())
}

/// Runs a host tool with the supervisor's fixed environment; Err holds what it said.
fn run(c: &mut std::process::Command) -> Result<(), String> {
    use std::process::Stdio;
    c.env_clear().env("PATH", super::spawn::HOST_PATH).stdin(Stdio::null()).stdout(Stdio::null());
    let out = super::spawn::spawn_helper(c.stderr(Stdio::piped()))
        .map_err(|e| format!("{}: {e}", c.get_program().to_string_lossy()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", c.get_program().to_string_lossy(), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Measures what the replica may write (`dirs`: its scratch, with its runtime dir) and asks for the
/// replica's end when it holds more than `limit_mib` (space allocated on disk, links not followed, each
/// inode counted once) or more than `limit_inodes` entries: its file system's counts every
/// [`SCRATCH_FS_CHECK_EVERY`] when it has one (they cost one call), the dirs walked every
/// [`SCRATCH_CHECK_EVERY`] otherwise.
pub(super) fn watch_scratch(
    fs: Option<&ScratchFs>,
    dirs: &[std::path::PathBuf],
    limit_mib: u64,
    limit_inodes: u64,
    evict: &Mutex<Option<String>>,
    stop: &std::sync::atomic::AtomicBool,
    hosts: &mut HostsCopy,
) {
    let every = if fs.is_some() { SCRATCH_FS_CHECK_EVERY } else { SCRATCH_CHECK_EVERY };
    let mut last = Instant::now();
    let mut last_hosts = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last_hosts.elapsed() >= SCRATCH_FS_CHECK_EVERY {
            last_hosts = Instant::now();
            hosts.refresh(fs);
        }
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        let (used, inodes) = match fs.and_then(ScratchFs::used) {
            Some(u) => u,
            None => dirs.iter().map(|d| disk_usage(d)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        };
        if let Some(why) = over(used, inodes, limit_mib, limit_inodes) {
            if let Ok(mut e) = evict.lock() {
                *e = Some(why);
            }
            return;
        }
    }
}

/// Keeps a replica's copy of its attempt's hosts file (`scratch/etc/hosts`, see `ReplicaLayout::etc`) the
/// same as the attempt's: a resize rewrites the attempt's with the new replicas' names, and a running replica
/// sees them. Written in place (the sandbox binds the file), through the scratch file system's root when it
/// has one (the host does not see that file system).
pub(super) struct HostsCopy {
    src: PathBuf,
    /// The copy by its host path, when the scratch has no file system of its own.
    dst: PathBuf,
    seen: Option<(std::time::SystemTime, u64)>,
}

impl HostsCopy {
    /// For the replica whose dir is `replica_dir` (`runs/TASK/aN/REPLICA`).
    pub(super) fn new(replica_dir: &Path) -> HostsCopy {
        let attempt = replica_dir.parent().unwrap_or(replica_dir);
        HostsCopy { src: attempt.join("hosts"), dst: replica_dir.join("scratch/etc/hosts"), seen: None }
    }

    /// Copies the attempt's file when it changed since the last look.
    pub(super) fn refresh(&mut self, fs: Option<&ScratchFs>) {
        let Ok(meta) = std::fs::metadata(&self.src) else { return };
        let now = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len());
        if self.seen == Some(now) || meta.len() > 1 << 20 {
            return;
        }
        let Ok(bytes) = std::fs::read(&self.src) else { return };
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = match fs {
            Some(fs) => rustix::fs::openat(&fs.root, "etc/hosts", flags, Mode::empty()),
            None => rustix::fs::open(&self.dst, flags, Mode::empty()),
        };
        let Ok(fd) = opened else { return };
        if std::io::Write::write_all(&mut std::fs::File::from(fd), &bytes).is_ok() {
            self.seen = Some(now);
        }
    }
}

/// Why a scratch holding `bytes` in `inodes` entries is over its limits, if it is.
fn over(bytes: u64, inodes: u64, limit_mib: u64, limit_inodes: u64) -> Option<String> {
    if bytes > limit_mib.saturating_mul(1024 * 1024) {
        return Some(format!(
            "its scratch (/tmp, /root and {}) holds {} MiB, over its limit of {limit_mib} MiB",
            super::sandbox::RUNTIME_DIR,
            bytes / (1024 * 1024)
        ));
    }
    if inodes > limit_inodes {
        return Some(format!(
            "its scratch (/tmp, /root and {}) holds {inodes} files and dirs, over its limit of {limit_inodes}",
            super::sandbox::RUNTIME_DIR
        ));
    }
    None
}

/// Bytes allocated under `dir` and the entries there, without following links (hard links counted once).
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let (mut total, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (total, inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_entries_both_count() {
        assert_eq!(over(10 << 20, 10, 16, 100), None);
        assert!(over(17 << 20, 10, 16, 100).unwrap().contains("17 MiB, over its limit of 16 MiB"));
        assert!(over(0, 101, 16, 100).unwrap().contains("101 files and dirs, over its limit of 100"));
        let d = std::env::temp_dir().join(format!("ty-scratch-count-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for i in 0..50 {
            std::fs::write(d.join("sub").join(format!("f{i}")), "").unwrap();
        }
        std::fs::hard_link(d.join("sub/f0"), d.join("again")).unwrap();
        let (_, inodes) = disk_usage(&d);
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(inodes, 51, "50 files and the dir; a hard link counted once");
    }

    #[test]
    fn a_replicas_hosts_copy_follows_the_attempts_in_place() {
        use std::os::unix::fs::MetadataExt;
        let attempt = std::env::temp_dir().join(format!("ty-hosts-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&attempt);
        let replica = attempt.join("t-master-0");
        std::fs::create_dir_all(replica.join("scratch/etc")).unwrap();
        std::fs::write(attempt.join("hosts"), "10.0.0.1 t-master-0\n").unwrap();
        std::fs::write(replica.join("scratch/etc/hosts"), "10.0.0.1 t-master-0\n").unwrap();
        let ino = std::fs::metadata(replica.join("scratch/etc/hosts")).unwrap().ino();
        let mut copy = HostsCopy::new(&replica);
        copy.refresh(None);
        // A resize adds a replica: the running one's copy says so, in the same file (the sandbox binds it).
        std::fs::write(attempt.join("hosts"), "10.0.0.1 t-master-0\n10.0.0.2 t-worker-0\n").unwrap();
        copy.refresh(None);
        let copied = std::fs::read_to_string(replica.join("scratch/etc/hosts")).unwrap();
        let same = std::fs::metadata(replica.join("scratch/etc/hosts")).unwrap().ino() == ino;
        let _ = std::fs::remove_dir_all(&attempt);
        assert_eq!(copied, "10.0.0.1 t-master-0\n10.0.0.2 t-worker-0\n");
        assert!(same, "written in place");
    }
}
