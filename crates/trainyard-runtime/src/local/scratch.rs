//! A replica's scratch, measured: what it holds on disk, and the watcher that asks for an eviction over the
//! limit (as the kubelet evicts a pod over its ephemeral storage).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the scratch dirs are measured.
pub const SCRATCH_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Measures the scratch dirs every [`SCRATCH_CHECK_EVERY`] and asks for the replica's end when they hold
/// more than `limit_mib` (space allocated on disk, links not followed, each inode counted once).
pub(super) fn watch_scratch(
    dir: &Path,
    limit_mib: u64,
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
        let used = disk_usage(dir);
        if used > limit_mib * 1024 * 1024 {
            if let Ok(mut e) = evict.lock() {
                *e = Some(format!(
                    "its scratch (/tmp and /root) holds {} MiB, over its limit of {limit_mib} MiB",
                    used / (1024 * 1024)
                ));
            }
            return;
        }
    }
}

/// Bytes allocated under `dir`, without following links (hard links counted once).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}
