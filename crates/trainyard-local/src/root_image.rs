//! A registry image's root as a file system of its own in each sandbox.
//!
//! bubblewrap binds the image's entries (`/usr`, `/etc`, ...) into the sandbox, and a bind mount's line in
//! `/proc/self/mountinfo` names its source's path inside its file system: bound from the image cache's
//! `rootfs/`, every line named that dir under the data dir. So the supervisor first mounts the image's root as
//! a file system of its own: a read-only overlay (no upper layer, no set-uid, no devices) whose lower layers
//! are the image's root and an empty dir, both named by descriptor (`lowerdir=/proc/self/fd/A:/proc/self/fd/B`:
//! the kernel shows an overlay's layers as they were given), at [`ROOT_MOUNT`] in the replica's dir, in its
//! spawner's mount namespace (the sandboxes see it, the host does not, and it goes with the supervisor however
//! it ends). bubblewrap binds the entries from there ([`super::sandbox::Start::root_from`]), and a line reads
//! `/usr /usr ... - overlay trainyard-image ro,lowerdir=/proc/self/fd/3:/proc/self/fd/4,...`.
//!
//! An overlay costs nothing at pull time (the image is not copied) and shares the cache's pages. Its lower
//! layers' overlay attributes (`trusted.overlay.*`) could change what it shows, but the unpacker writes no
//! extended attributes, and redirects are not followed (`redirect_dir=nofollow`). Where no overlay can be
//! mounted, the sandbox binds from `rootfs/` as before: `up` says so at start-up ([`probe`]), and a replica
//! whose mount failed anyway has a `LimitsNotEnforced` event.

use std::os::fd::AsRawFd;
use std::path::Path;

/// Where a replica's image root is mounted, in its dir (an empty dir on the host: the mount is in the
/// supervisor's own mount namespace). It is also the overlay's empty lower layer.
pub(super) const ROOT_MOUNT: &str = "rootfs";

/// What the sandbox's mountinfo shows as the overlay's source.
const SOURCE: &str = "trainyard-image";

/// Mounts `root` (a dir) read-only as an overlay of its own at `at` (an empty dir) in the calling thread's
/// mount namespace.
fn mount_here(root: &Path, at: &Path) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    use rustix::mount::MountFlags;
    let open = |p: &Path| {
        rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open {}: {e}", p.display()))
    };
    let (lower, empty) = (open(root)?, open(at)?);
    let options = format!(
        "lowerdir=/proc/self/fd/{}:/proc/self/fd/{},redirect_dir=nofollow",
        lower.as_raw_fd(),
        empty.as_raw_fd()
    );
    let options = std::ffi::CString::new(options).map_err(|e| e.to_string())?;
    let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    rustix::mount::mount(SOURCE, at, "overlay", flags, options.as_c_str())
        .map_err(|e| format!("cannot mount an overlay of the image's root: {e}"))
}

/// Mounts `root` at `at` on the spawner (see [`super::spawn::on_spawner`]).
pub(super) fn mount_root(root: &Path, at: &Path) -> Result<(), String> {
    match std::fs::create_dir(at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", at.display())),
    }
    let (root, at) = (root.to_owned(), at.to_owned());
    super::spawn::on_spawner(move |s| -> Result<(), String> {
        s.mounts.clone()?;
        mount_here(&root, &at)
    })
    .unwrap_or_else(|| Err("the spawner is gone".into()))
}

/// Whether registry images' roots can be mounted as file systems of their own here, as the supervisors
/// mount them: a thread with a mount namespace of its own mounts a new dir under `work`. Err says why not (the
/// sandboxes bind the roots from the cache then).
pub fn probe(work: &Path) -> Result<(), String> {
    let dir = work.join(format!(".overlay-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tried = (|| {
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let (root, at) = (dir.join("root"), dir.join("mnt"));
        for d in [&root, &at] {
            std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        std::thread::spawn(move || {
            super::spawn::own_mount_namespace()?;
            mount_here(&root, &at)?;
            let _ = rustix::mount::unmount(&at, rustix::mount::UnmountFlags::DETACH);
            Ok(())
        })
        .join()
        .unwrap_or_else(|_| Err("the probe's thread panicked".into()))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    tried
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A root mounted as the supervisors mount it: the files as the tree has them, read-only, and a mount
    /// whose line names no path of the host.
    #[test]
    fn a_root_mounts_read_only_with_its_files_and_names_no_host_path() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ty-root-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (root, at) = (dir.join("rootfs"), dir.join("mnt"));
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(root.join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            root.join("usr/bin/tool"),
            std::os::unix::fs::PermissionsExt::from_mode(0o751),
        )
        .unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        rustix::fs::chown(root.join("usr/bin/tool"), Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        let (root2, at2) = (root.clone(), at.clone());
        let seen = std::thread::spawn(move || {
            crate::spawn::own_mount_namespace().unwrap();
            mount_here(&root2, &at2).unwrap();
            let tool = std::fs::metadata(at2.join("usr/bin/tool")).unwrap();
            let line = std::fs::read_to_string("/proc/thread-self/mountinfo")
                .unwrap()
                .lines()
                .find(|l| l.split(' ').nth(4) == Some(&*at2.to_string_lossy()))
                .map(str::to_owned);
            let written = std::fs::write(at2.join("usr/bin/new"), b"x").is_ok();
            (tool, std::fs::read_link(at2.join("bin")).unwrap(), line, written)
        })
        .join()
        .unwrap();
        let (tool, link, line, written) = seen;
        assert_eq!((tool.mode() & 0o7777, tool.uid(), tool.len()), (0o751, 4242, 10));
        assert_eq!(link, Path::new("usr/bin"));
        assert!(!written && !root.join("usr/bin/new").exists(), "read-only");
        let line = line.expect("mounted");
        let (_, fs) = line.split_once(" - ").unwrap_or_else(|| panic!("{line}"));
        assert!(fs.starts_with("overlay trainyard-image ro,lowerdir=/proc/self/fd/"), "{line}");
        assert!(!fs.contains(&*dir.to_string_lossy()), "{line}");
        assert!(line.contains(" ro,nosuid,nodev"), "{line}");
        assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&*at.to_string_lossy()));
        assert_eq!(probe(&dir), Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
