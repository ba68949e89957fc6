//! An image's root as an erofs image (`rootfs.erofs`, [`crate::store::ROOT_IMAGE`]), made with `mkfs.erofs`
//! once the layers are applied.
//!
//! Why: a sandbox that binds the image's entries from `rootfs/` shows their host path in its
//! `/proc/self/mountinfo` (a bind mount's root field is its path inside its file system, here the data dir's).
//! A file system of the image's own shows `/usr` as `/usr`. The local backend mounts this file read-only in
//! each replica's private mount namespace and binds the entries from there; where it cannot (no file here, a
//! kernel without erofs), it binds from `rootfs/` as before.
//!
//! The tree is copied as the unpacker left it: owners (the unpacking uid), modes, modification times to the
//! nanosecond, hard links, symlinks and FIFOs; no extended attributes (the unpacker writes none, and the host's
//! security labels are not the image's), uncompressed (a second copy of the bytes, written once: compressing
//! them would cost the pull far more than the disk it saves). `rootfs/` stays: the server reads the image
//! there (its accounts, its entries and mount points for the sandbox's options).
//!
//! Where the image cannot be made (no `mkfs.erofs`, not enough room, the tool failed), the image is still
//! ready and runs with the bind; the server log says so, once for a missing tool and once per image
//! otherwise, and the image is not tried again until the server restarts.

use crate::store::{ROOT_IMAGE, Store};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where `mkfs.erofs` is looked for: the system's dirs, never the server's own `PATH`.
const SYSTEM_DIRS: &[&str] = &["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Room kept on the cache's disk beyond the erofs image's own size (its metadata, rounding).
const ROOM_SLACK_BYTES: u64 = 64 << 20;

/// `mkfs.erofs`, looked for once.
fn mkfs() -> Result<&'static Path, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            SYSTEM_DIRS
                .iter()
                .map(|d| Path::new(d).join("mkfs.erofs"))
                .find(|p| p.is_file())
                .ok_or_else(|| "mkfs.erofs is not installed (apt-get install erofs-utils)".to_owned())
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// Makes `to` (a new file) an erofs image of the tree at `root`, as the module says; `to` is removed again
/// when that fails.
pub fn make_root_image(root: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::{Command, Stdio};
    let tool = mkfs()?;
    // Created here, the server's own (mode 0600): only the supervisors, as root, open it.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let out = Command::new(tool)
        .args(["--quiet", "-x-1"])
        .arg(to)
        .arg(root)
        .env_clear()
        .env("PATH", SYSTEM_DIRS.join(":"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let made = match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("mkfs.erofs: {} ({})", String::from_utf8_lossy(&o.stderr).trim(), o.status)),
        Err(e) => Err(format!("mkfs.erofs: {e}")),
    };
    if made.is_err() {
        let _ = std::fs::remove_file(to);
    }
    made
}

/// [`make_root_image`] for an image of `store`, once its disk has room for a copy of `rootfs_bytes` beside
/// the bytes it keeps free.
fn make_with_room(store: &Store, root: &Path, to: &Path, rootfs_bytes: u64) -> Result<(), String> {
    if let Ok(fs) = rustix::fs::statvfs(&store.dir) {
        let free = fs.f_bavail.saturating_mul(fs.f_frsize);
        let need = rootfs_bytes
            .saturating_add(rootfs_bytes / 16)
            .saturating_add(ROOM_SLACK_BYTES)
            .saturating_add(store.unpack.limits.reserve_bytes);
        if need > free {
            return Err(format!(
                "the image cache's disk has {free} bytes free, and a copy of the image's {rootfs_bytes} needs \
                 about {need} with what this machine keeps free"
            ));
        }
    }
    make_root_image(root, to)
}

/// Images whose erofs image could not be made (by digest): not tried again by this process.
static FAILED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn failed() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    FAILED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Says in the server log that `shown` runs with its root bound from the cache, and why: once for a missing
/// tool, once per image otherwise.
fn without(shown: &str, digest: &str, why: &str) {
    static NO_TOOL_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let no_tool = mkfs().is_err();
    if no_tool && NO_TOOL_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let which = if no_tool { "registry images run".to_owned() } else { format!("image {shown} runs") };
    eprintln!(
        "trainyard: {which} with the root bound from the image cache, so a sandbox's /proc/self/mountinfo names \
         the cache's path: {why}"
    );
    failed().insert(digest.to_owned());
}

/// For a pull that unpacked `rootfs` in `work` (under `tmp/`, moved into the cache whole): makes
/// `work/rootfs.erofs`. Err: the image goes without one (said in the log).
pub(crate) fn make_for_pull(store: &Store, work: &Path, rootfs_bytes: u64, shown: &str, digest: &str) {
    if !store.unpack.root_images {
        return;
    }
    if let Err(why) = make_with_room(store, &work.join("rootfs"), &work.join(ROOT_IMAGE), rootfs_bytes) {
        without(shown, digest, &why);
    }
}

/// Whether an image in the cache still needs its erofs image: it has none, and this process did not fail to
/// make it before.
pub(crate) fn wanted(store: &Store, digest: &str) -> bool {
    store.unpack.root_images && !store.root_image(digest).exists() && !failed().contains(digest)
}

/// For an image already in the cache without an erofs image (pulled before they were made, or where one
/// could not be made then): makes it under `tmp/` and renames it into place, unless it is not
/// [`wanted`].
pub(crate) fn make_for_cached(store: &Store, digest: &str, rootfs_bytes: u64, shown: &str) {
    if !wanted(store, digest) {
        return;
    }
    if let Err(why) = mkfs() {
        return without(shown, digest, &why);
    }
    let work = match store.scratch("erofs") {
        Ok(w) => w,
        Err(e) => return without(shown, digest, &e.message),
    };
    let tmp = work.join(ROOT_IMAGE);
    let made = make_with_room(store, &store.rootfs(digest), &tmp, rootfs_bytes).and_then(|()| {
        std::fs::rename(&tmp, store.root_image(digest))
            .map_err(|e| format!("cannot move the erofs image into the cache: {e}"))
    });
    let _ = std::fs::remove_dir_all(&work);
    if let Err(why) = made {
        without(shown, digest, &why);
    }
}
