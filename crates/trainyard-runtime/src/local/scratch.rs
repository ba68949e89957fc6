//! A replica's scratch, measured: what it holds on disk, and the watcher that asks for an eviction over the
//! limit (as the kubelet evicts a pod over its ephemeral storage).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the scratch dirs are measured.
pub const SCRATCH_CHECK_EVERY: Duration = Duration::from_secs(5);

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
