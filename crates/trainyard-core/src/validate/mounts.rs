//! Where a task mounts things: each mount path on its own (absolute, clean, clear of the directories the
//! image and the platform need), then all of them together (no two at one path; one inside another is
//! warned about).

use super::context::{Place, V};
use super::limits::*;
use super::references::Mount;
use crate::grammar::describe_bad_chars;
use crate::problem::{Code, Report, field};
use crate::spec::{TaskType, TrainingTask};

/// Directories of the image (or of the platform) that a mount must not cover.
pub const PROTECTED_PATHS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/workspace",
];
/// Files the platform writes under `/root` for passwordless SSH.
pub const PLATFORM_ROOT_PATHS: &[&str] =
    &["/root", "/root/.ssh", "/root/hostfile", "/root/hostfile.hostname"];
/// Where mounts belong.
pub const RECOMMENDED_MOUNT_ROOTS: &[&str] = &["/volume", "/mnt"];
/// Ray's shared storage mount point.
pub const RAY_SHARED_PATH: &str = "/tmp/ray";

impl V<'_> {
    /// Checks the mount paths of `all` (the task's volumes, datasets and models, as declared) and how they
    /// and a RayJob's shared storage sit with each other.
    pub(super) fn mounts<'t>(&mut self, t: &'t TrainingTask, place: &Place, all: &[Mount<'t>]) {
        let is_ray = place.task_type == Some(TaskType::RayJob);
        if all.len() > MOUNTS_MAX {
            self.report.error(
                "spec.environment",
                Code::TooLong,
                format!("has {} mounts in all; at most {MOUNTS_MAX}", all.len()),
            );
        }

        let mut valid = Vec::with_capacity(all.len());
        for m in all {
            let mp = field(&m.path, "mountPath");
            if check_mount_path(&mut self.report, &mp, m.mount_path, is_ray) {
                valid.push(Mount { path: mp, what: m.what, name: m.name, mount_path: m.mount_path });
            }
        }
        // Ray's shared storage is one more mount, at a fixed path.
        if is_ray && let Some(ss) = t.spec.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
            valid.push(Mount {
                path: "spec.ray.sharedStorage".to_owned(),
                what: "volume",
                name: &ss.volume,
                mount_path: RAY_SHARED_PATH,
            });
        }
        self.mount_conflicts(&valid);
    }

    /// Each mount is compared with those before it and reported once: against the first mount at the same
    /// path, or else against the first mount it lies inside (or that lies inside it).
    fn mount_conflicts(&mut self, valid: &[Mount]) {
        for j in 0..valid.len() {
            let Mount { path: pj, what: wj, name: nj, mount_path: mj } = &valid[j];
            if let Some(Mount { path: pi, what: wi, name: ni, .. }) =
                valid[..j].iter().find(|m| m.mount_path == *mj)
            {
                if wi == wj && ni == nj {
                    self.report.error(
                        pj,
                        Code::Duplicate,
                        format!("{wj} \"{nj}\" is already mounted at {mj} by {pi}; mount it once"),
                    );
                } else {
                    self.report.error(
                        pj,
                        Code::PathConflict,
                        format!("{mj} is already used by {pi} ({wi} \"{ni}\"); choose another path"),
                    );
                }
            } else if let Some((outer, inner, inner_path)) =
                valid[..j].iter().find_map(|m| nested(m.mount_path, mj, &m.path, pj))
            {
                self.report.warning(
                    inner_path,
                    Code::PathConflict,
                    format!("{inner} lies inside {outer}, which is mounted too; the inner mount hides part of the outer one"),
                );
            }
        }
    }
}

/// When one mount path lies inside the other: (outer, inner, field path of the inner).
fn nested<'p>(a: &'p str, b: &'p str, pa: &'p str, pb: &'p str) -> Option<(&'p str, &'p str, &'p str)> {
    let under = |inner: &str, outer: &str| {
        inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'/'
    };
    if under(b, a) {
        Some((a, b, pb))
    } else if under(a, b) {
        Some((b, a, pa))
    } else {
        None
    }
}

/// Checks a mount path; returns whether it is well-formed (so conflict checks can use it).
pub fn check_mount_path(r: &mut Report, path: &str, mount: &str, is_ray: bool) -> bool {
    if mount.is_empty() {
        r.error(path, Code::Empty, "give the path inside the container, like /mnt/data");
        return false;
    }
    if !mount.starts_with('/') {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" is not absolute; start it with /, like /mnt/{mount}"),
        );
        return false;
    }
    if mount.len() > MOUNT_PATH_MAX {
        r.error(path, Code::TooLong, format!("is {} bytes; at most {MOUNT_PATH_MAX}", mount.len()));
        return false;
    }
    if let Some(bad) = describe_bad_chars(mount, |c| !(c.is_control() || matches!(c, ':' | ',' | '\\'))) {
        r.error(path, Code::InvalidPath, format!("{mount:?} contains {bad}; remove them"));
        return false;
    }
    if mount.contains("//") {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" contains //; write {}", collapse_slashes(mount)),
        );
        return false;
    }
    if mount.len() > 1 && mount.ends_with('/') {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" ends with /; write {}", mount.trim_end_matches('/')),
        );
        return false;
    }
    if mount.split('/').any(|seg| seg == "." || seg == "..") {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" contains . or .. segments; write the plain absolute path"),
        );
        return false;
    }
    let under =
        |root: &str| mount == root || (mount.starts_with(root) && mount.as_bytes()[root.len()] == b'/');
    if mount == "/" {
        r.error(path, Code::ProtectedPath, "cannot mount over /; use a directory under /mnt or /volume");
        return false;
    }
    if let Some(root) = PROTECTED_PATHS.iter().find(|p| under(p)) {
        r.error(
            path,
            Code::ProtectedPath,
            if mount == *root {
                format!("{mount} is a directory the image needs; mount under /mnt or /volume instead")
            } else {
                format!(
                    "{mount} is inside {root}, which the image needs; mount under /mnt or /volume instead"
                )
            },
        );
        return false;
    }
    if PLATFORM_ROOT_PATHS.contains(&mount) || under("/root/.ssh") {
        r.error(
            path,
            Code::ProtectedPath,
            format!("{mount} is where the platform writes SSH keys and host files; choose another path"),
        );
        return false;
    }
    if is_ray && under(RAY_SHARED_PATH) {
        r.error(
            path,
            Code::ProtectedPath,
            format!(
                "{RAY_SHARED_PATH} is Ray's own directory (shared storage mounts there); choose another path"
            ),
        );
        return false;
    }
    if !RECOMMENDED_MOUNT_ROOTS.iter().any(|p| under(p) && mount != *p) {
        r.warning(
            path,
            Code::UnusualPath,
            if RECOMMENDED_MOUNT_ROOTS.contains(&mount) {
                format!("mount in a directory of its own under {mount}, like {mount}/data, so mounts cannot cover each other")
            } else {
                format!("{mount} is outside /mnt and /volume; a separate directory there cannot hide the image's own files")
            },
        );
    }
    true
}

fn collapse_slashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}
