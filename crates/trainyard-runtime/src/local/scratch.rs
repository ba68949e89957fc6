//! A replica's scratch: a file system of its own (an ext4 image on a loop device, sized to the replica's
//! limits, so a full scratch is the replica's problem and never the data dir's), and the watcher that
//! measures it and asks for an eviction over the limit (as the kubelet evicts a pod over its ephemeral
//! storage). Where no file system can be made (no loop devices, no `mkfs.ext4`), the watcher alone limits it.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the scratch dirs are measured.
pub const SCRATCH_CHECK_EVERY: Duration = Duration::from_secs(5);

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

/// Makes the replica's scratch a file system of its own: `image` (sparse, created here) formatted with what
/// `scratch` holds (the server put the replica's dirs and files there, owners kept), then mounted over
/// `scratch` (no set-uid, no devices). Err says why not; `scratch` is then as it was.
pub(super) fn mount_scratch(
    scratch: &Path,
    image: &Path,
    limit_mib: u64,
    limit_inodes: u64,
) -> Result<(), String> {
    use std::process::{Command, Stdio};
    let run = |c: &mut Command| -> Result<(), String> {
        c.env_clear().env("PATH", super::supervisor::HOST_PATH).stdin(Stdio::null()).stdout(Stdio::null());
        let out = super::spawn::spawn_helper(c.stderr(Stdio::piped()))
            .map_err(|e| format!("{}: {e}", c.get_program().to_string_lossy()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {}",
                c.get_program().to_string_lossy(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let made = (|| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(image)
            .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
        f.set_len(image_bytes(limit_mib, limit_inodes))
            .map_err(|e| format!("cannot size {}: {e}", image.display()))?;
        drop(f);
        // No journal (the scratch does not outlive a crash), lazy tables (formatting takes milliseconds), no
        // blocks kept for root.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1,nodiscard", "-N"])
            .arg(image_inodes(limit_inodes).to_string())
            .arg("-d")
            .arg(scratch)
            .arg(image))?;
        run(Command::new("mount").args(["-o", "loop,nosuid,nodev,noatime"]).arg(image).arg(scratch))?;
        // The file system's root is the platform's (the sandbox binds its dirs, never it).
        std::fs::set_permissions(scratch, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .map_err(|e| format!("cannot set the mode of {}: {e}", scratch.display()))
    })();
    if made.is_err() {
        unmount_scratch(scratch);
        let _ = std::fs::remove_file(image);
    }
    made
}

/// Unmounts a replica's scratch file system (detached at once; the kernel lets it go, and its loop device,
/// when nothing uses it any more). Nothing happens where it is not mounted.
pub fn unmount_scratch(scratch: &Path) {
    let _ = rustix::mount::unmount(
        scratch,
        rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
    );
}

/// Measures what the replica may write (`dirs`: its scratch and its runtime dir) every
/// [`SCRATCH_CHECK_EVERY`] and asks for the replica's end when they hold more than `limit_mib` (space
/// allocated on disk, links not followed, each inode counted once) or more than `limit_inodes` entries.
pub(super) fn watch_scratch(
    dirs: &[std::path::PathBuf],
    limit_mib: u64,
    limit_inodes: u64,
    evict: &Mutex<Option<String>>,
    stop: &std::sync::atomic::AtomicBool,
) {
    let mut last = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() < SCRATCH_CHECK_EVERY {
            continue;
        }
        last = Instant::now();
        let (used, inodes) = dirs.iter().map(|d| disk_usage(d)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        if let Some(why) = over(used, inodes, limit_mib, limit_inodes) {
            if let Ok(mut e) = evict.lock() {
                *e = Some(why);
            }
            return;
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
}
