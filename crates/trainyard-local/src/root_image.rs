//! A registry image's root as a file system of its own in each sandbox.
//!
//! bubblewrap binds the image's entries (`/usr`, `/etc`, ...) into the sandbox, and a bind mount's line in
//! `/proc/self/mountinfo` names its source's path inside its file system: bound from the image cache's
//! `rootfs/`, every line named that dir under the data dir. The cache also keeps each image's root as an erofs
//! image (`trainyard_images::make_root_image`); the supervisor mounts it read-only, without set-uid or
//! devices, at [`ROOT_MOUNT`] in the replica's dir, in its spawner's mount namespace (the sandboxes see it,
//! the host does not, and it goes with the supervisor however it ends), and bubblewrap binds the entries from
//! there ([`super::sandbox::Start::root_from`]). A line then reads `/usr /usr ... - erofs /proc/self/fd/N`.
//!
//! The file is mounted as itself where the kernel reads erofs from files (Linux 6.12 and later), with the
//! source named by its descriptor (`/proc/self/fd/N`), so not even the source names a path; elsewhere through
//! a loop device (`mount -o loop`: the source is `/dev/loopN`, though the loop device's `backing_file` in
//! `/sys` names the file). Where neither works, the sandbox binds from `rootfs/` as before: `up` says so at
//! start-up ([`probe`]), and a replica whose mount failed anyway has a `LimitsNotEnforced` event.

use std::os::fd::AsRawFd;
use std::path::Path;

/// Where a replica's image root is mounted, in its dir (an empty dir on the host: the mount is in the
/// supervisor's own mount namespace).
pub(super) const ROOT_MOUNT: &str = "rootfs";

/// Mounts the erofs image `image` read-only at `at` in the calling thread's mount namespace: the file itself
/// where the kernel can, else through a loop device.
fn mount_here(image: &Path, at: &Path) -> Result<(), String> {
    use rustix::mount::MountFlags;
    let file = std::fs::File::open(image).map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    let source = format!("/proc/self/fd/{}", file.as_raw_fd());
    let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    let Err(direct) = rustix::mount::mount(source.as_str(), at, "erofs", flags, None) else { return Ok(()) };
    super::scratch::run(
        std::process::Command::new("mount")
            .args(["-t", "erofs", "-o", "loop,ro,nosuid,nodev"])
            .arg(image)
            .arg(at),
    )
    .map_err(|looped| format!("erofs from the file: {direct}; through a loop device: {looped}"))
}

/// Mounts `image` at `at` on the spawner (see [`super::spawn::on_spawner`]).
pub(super) fn mount_root(image: &Path, at: &Path) -> Result<(), String> {
    match std::fs::create_dir(at) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", at.display())),
    }
    let (image, at) = (image.to_owned(), at.to_owned());
    super::spawn::on_spawner(move |s| -> Result<(), String> {
        s.mounts.clone()?;
        mount_here(&image, &at)
    })
    .unwrap_or_else(|| Err("the spawner is gone".into()))
}

/// Whether registry images' roots can be mounted as file systems of their own here, as the supervisors
/// mount them: `mkfs.erofs` makes an image of an empty dir in a new dir under `work`, and a thread with a
/// mount namespace of its own mounts it. Err says why not (the sandboxes bind the roots from the cache then).
pub fn probe(work: &Path) -> Result<(), String> {
    let dir = work.join(format!(".erofs-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tried = (|| {
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let (root, image, at) = (dir.join("root"), dir.join("root.erofs"), dir.join("mnt"));
        for d in [&root, &at] {
            std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        trainyard_images::make_root_image(&root, &image)?;
        std::thread::spawn(move || {
            super::spawn::own_mount_namespace()?;
            mount_here(&image, &at)?;
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

    /// An image mounted as the supervisors mount it: the files as the tree had them, read-only, and a mount
    /// whose line names no path of the host.
    #[test]
    fn a_root_image_mounts_read_only_with_its_files_and_names_no_host_path() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ty-root-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (root, image, at) = (dir.join("rootfs"), dir.join("rootfs.erofs"), dir.join("mnt"));
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
        trainyard_images::make_root_image(&root, &image).unwrap();
        let (image2, at2) = (image.clone(), at.clone());
        let seen = std::thread::spawn(move || {
            crate::spawn::own_mount_namespace().unwrap();
            mount_here(&image2, &at2).unwrap();
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
        assert!(!written, "read-only");
        let line = line.expect("mounted");
        let (_, source) = line.split_once(" - erofs ").unwrap_or_else(|| panic!("{line}"));
        assert!(source.starts_with("/proc/self/fd/") || source.starts_with("/dev/loop"), "{line}");
        assert!(line.contains(" ro,nosuid,nodev"), "{line}");
        assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&*at.to_string_lossy()));
        assert_eq!(probe(&dir), Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
