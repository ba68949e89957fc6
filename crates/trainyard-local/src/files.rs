//! The files and dirs the server makes for sandboxes: ownership and modes set without following links,
//! the passages through the data dir, volume dirs, the sandbox's resolver file, and the machine-wide uid
//! slots.

use super::*;

/// Replaces a file in one step (written beside it, then renamed over it).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// The sandbox's `/etc/resolv.conf` with egress: the host's, without nameservers on its loopback; when
/// those were all it had (systemd-resolved's stub), the upstream servers it resolves through.
pub(super) fn resolv_conf() -> String {
    let keep = |text: &str| -> String {
        text.lines()
            .filter(|l| {
                let mut w = l.split_whitespace();
                !(w.next() == Some("nameserver")
                    && w.next()
                        .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                        .is_some_and(|a| a.is_loopback()))
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let has_server = |t: &str| t.lines().any(|l| l.trim_start().starts_with("nameserver"));
    let host = keep(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    if has_server(&host) {
        return host;
    }
    let upstream = keep(&std::fs::read_to_string("/run/systemd/resolve/resolv.conf").unwrap_or_default());
    if has_server(&upstream) { upstream } else { host }
}

/// The attempts' uid slots, claimed machine-wide: every Trainyard server on this machine takes its attempts'
/// uids (and with them their egress uplinks) from the same files, so no two live attempts share one.
pub(super) mod slots {
    use std::io::Write;
    use std::path::Path;

    /// A file per claimed slot, naming the attempt dir that holds it; under `/run`, so a reboot clears them.
    const DIR: &str = "/run/trainyard/slots";

    /// How long a claim counts as live before its attempt has a launch.json.
    const PREPARING: std::time::Duration = std::time::Duration::from_secs(60);

    /// Whether the attempt in `dir` may still run: it was launched, has no outcome, and either no replica has
    /// started yet or a supervisor of it is alive (one whose server went away for good holds nothing).
    pub(crate) fn live(dir: &Path) -> bool {
        if !dir.join("launch.json").exists() || dir.join("outcome.json").exists() {
            return false;
        }
        let states: Vec<super::ReplicaState> = std::fs::read_dir(dir)
            .map(|d| d.flatten().filter_map(|e| super::read_state(&e.path())).collect())
            .unwrap_or_default();
        states.is_empty()
            || states.iter().any(|s| {
                s.phase != super::Phase::Exited && super::procs::alive(s.supervisor_pid, s.supervisor_ticks)
            })
    }

    /// The slot `attempt` holds already (prepared before a restart), or the lowest free one, taking over
    /// slots whose attempt ended without giving them back.
    pub fn claim(attempt: &Path) -> Result<u32, String> {
        let fail = |e: std::io::Error| format!("cannot claim a sandbox uid in {DIR}: {e}");
        std::fs::create_dir_all(DIR).map_err(fail)?;
        let lock = std::fs::File::create(Path::new(DIR).join(".lock")).map_err(fail)?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| fail(e.into()))?;
        let me = attempt.to_string_lossy().into_owned();
        // (holder, claimed within the last PREPARING): an attempt is prepared in milliseconds, and until its
        // launch.json is written it counts as live by its claim's age alone.
        let held: std::collections::BTreeMap<u32, (String, bool)> = std::fs::read_dir(DIR)
            .map_err(fail)?
            .flatten()
            .filter_map(|e| {
                let slot = e.file_name().to_str()?.parse().ok()?;
                let fresh = e
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < PREPARING);
                Some((slot, (std::fs::read_to_string(e.path()).ok()?, fresh)))
            })
            .collect();
        if let Some((&slot, _)) = held.iter().find(|(_, (h, _))| *h == me) {
            return Ok(slot);
        }
        let free = (0..super::UID_SLOTS)
            .find(|s| held.get(s).is_none_or(|(h, fresh)| !fresh && !live(Path::new(h))));
        let slot = free.ok_or("every sandbox uid is taken: too many attempts run at once on this machine")?;
        let mut f = std::fs::File::create(Path::new(DIR).join(slot.to_string())).map_err(fail)?;
        f.write_all(me.as_bytes()).map_err(fail)?;
        Ok(slot)
    }

    /// Whether an attempt under `runs_dir` holds a slot and may still run.
    pub fn any_live_under(runs_dir: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(DIR) else { return false };
        rd.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).any(|holder| {
            let holder = Path::new(&holder);
            holder.starts_with(runs_dir) && live(holder)
        })
    }

    /// Gives a slot back (if `attempt` still holds it).
    pub fn release(slot: u32, attempt: &Path) {
        let path = Path::new(DIR).join(slot.to_string());
        if std::fs::read_to_string(&path).is_ok_and(|h| Path::new(&h) == attempt) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Sets a path's owner and mode (a link is never followed).
pub(super) fn own(path: &Path, uid: u32, gid: u32, mode: u32) -> Result<(), String> {
    use rustix::fs::{FileType, Gid, Mode, OFlags, Uid};
    let fail = |e: rustix::io::Errno| format!("{}: {e}", path.display());
    // Through a descriptor of the file itself: a path someone swaps for a link between a check and the
    // change (a dir in a shared volume) is never followed.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        if e == rustix::io::Errno::LOOP { format!("{} is a symbolic link", path.display()) } else { fail(e) }
    })?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).map_err(fail)?.st_mode);
    if kind != FileType::Directory && kind != FileType::RegularFile {
        return Err(format!("{} is neither a directory nor a file", path.display()));
    }
    rustix::fs::fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(fail)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(fail)
}

/// Gives a tree the server just wrote (nothing else has touched it yet) to the attempt's uid.
pub(super) fn own_tree(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        for e in std::fs::read_dir(path).map_err(|e| e.to_string())?.flatten() {
            own_tree(&e.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Asks the filesystem to place each new subdirectory of `dir` (a task's runs) away from the others, as it
/// places top-level dirs (ext4's `FS_TOPDIR_FL`, `chattr +T`; other filesystems ignore or refuse it, which
/// is fine). Each task's files then go to a block group of their own. Without that they all went to the
/// runs dir's group, and on ext4 without a journal every new inode there was looked for past each inode
/// deleted in the last 30 s (the state files replaced, the scratch of ended attempts): with replicas
/// starting and ending, a sixth of the machine's busy CPU during `local-bench` (perf, `find_inode_bit`).
pub(super) fn spread_subdirs(dir: &Path) {
    use rustix::fs::{IFlags, ioctl_getflags, ioctl_setflags};
    let Ok(d) = std::fs::File::open(dir) else { return };
    if let Ok(flags) = ioctl_getflags(&d)
        && !flags.contains(IFlags::TOPDIR)
    {
        let _ = ioctl_setflags(&d, flags | IFlags::TOPDIR);
    }
}

/// Makes a dir on the way to the replicas' own dirs: the sandboxes pass through, nobody lists it.
pub fn make_passage(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    own(path, 0, SANDBOX_GID, 0o710)
}

/// A volume, dataset or model dir Trainyard keeps (under the data dir): shared with the sandboxes' group at
/// `mode` (volumes writable, 2770; datasets and models readable, 2750); one that exists keeps its owner and
/// mode unless it still is a plain root dir.
pub(super) fn storage_dir(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    if meta.uid() == 0 && meta.gid() != SANDBOX_GID {
        own(path, 0, SANDBOX_GID, mode)?;
    }
    Ok(())
}

/// The attempts' switch namespaces, recorded machine-wide with the attempt each belongs to, so that a start
/// removes those whose attempt is gone for good (its data dir deleted, its server never back).
pub(super) mod switches {
    use std::path::Path;

    const DIR: &str = "/run/trainyard/switches";

    pub fn record(name: &str, attempt: &Path) {
        if std::fs::create_dir_all(DIR).is_ok() {
            let _ = std::fs::write(Path::new(DIR).join(name), attempt.to_string_lossy().as_bytes());
        }
    }

    pub fn forget(name: &str) {
        let _ = std::fs::remove_file(Path::new(DIR).join(name));
    }

    /// Removes the switch namespaces whose attempts no longer run (ended, or every supervisor gone); returns
    /// how many.
    pub fn sweep(ip: &Path) -> usize {
        let mut removed = 0;
        for e in std::fs::read_dir(DIR).into_iter().flatten().flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            let holder = std::fs::read_to_string(e.path()).unwrap_or_default();
            if !super::slots::live(Path::new(&holder)) {
                super::super::netns::delete_switch(ip, &name);
                forget(&name);
                removed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_dir_asks_ext4_to_spread_its_subdirs() {
        let dir = std::env::temp_dir().join(format!("trainyard-spread-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        spread_subdirs(&dir);
        spread_subdirs(&dir); // Again, as each start does: no harm.
        let d = std::fs::File::open(&dir).unwrap();
        const EXT4_SUPER_MAGIC: i64 = 0xEF53;
        // `f_type`'s integer type differs between platforms.
        #[allow(clippy::unnecessary_cast)]
        let on_ext4 = rustix::fs::fstatfs(&d).is_ok_and(|s| s.f_type as i64 == EXT4_SUPER_MAGIC);
        let flags = rustix::fs::ioctl_getflags(&d);
        std::fs::remove_dir(&dir).unwrap();
        if on_ext4 {
            assert!(flags.unwrap().contains(rustix::fs::IFlags::TOPDIR));
        } else {
            eprintln!("{} is not on ext4: nothing to check", dir.display());
        }
    }
}
