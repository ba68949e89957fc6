//! The bubblewrap command line of one replica: the image root read-only, the replica's scratch as `/tmp`
//! and `/root`, its runtime dir at `/run/trainyard`, volumes read-write and datasets and models read-only at
//! their mount paths, its own PID, UTS and IPC namespaces, and its hostname.
//!
//! A mount path that does not exist in the image (say `/mnt/data` in an image without it) cannot be
//! created inside a read-only bind, so the directories on the way to it are *carved*: each becomes a tmpfs
//! holding read-only binds of the image's entries, plus the new mount point, and is made read-only again
//! once every mount is in place.

use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// One bind mount into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub read_only: bool,
}

/// Where the runtime dir appears inside every replica (`TRAINYARD_RUNTIME_DIR`).
pub const RUNTIME_DIR: &str = "/run/trainyard";

/// Top-level entries of an image that the sandbox provides itself (or that belong to the host only).
const OWN_TOP_LEVEL: &[&str] = &["proc", "dev", "sys", "tmp", "root", "run", "lost+found"];

/// What the sandbox of one replica holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The image's root file system (`/` for `host`).
    pub root: PathBuf,
    pub hostname: String,
    /// Writable dirs on the host: bound at `/tmp` and `/root`.
    pub tmp: PathBuf,
    pub home: PathBuf,
    /// The replica's runtime dir on the host, bound at [`RUNTIME_DIR`].
    pub runtime: PathBuf,
    /// The attempt's hosts file, bound at `/etc/hosts`.
    pub hosts: PathBuf,
    /// Volumes, datasets, models and shared storage, in order.
    pub mounts: Vec<Mount>,
}

fn arg(v: &mut Vec<OsString>, parts: &[&dyn AsRef<std::ffi::OsStr>]) {
    v.extend(parts.iter().map(|p| p.as_ref().to_owned()));
}

impl SandboxPlan {
    /// The bwrap arguments before the command. Reads the image's directories (to bind their entries and to
    /// carve around missing mount points).
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        arg(&mut a, &[&"--die-with-parent", &"--unshare-pid", &"--unshare-uts", &"--unshare-ipc"]);
        arg(&mut a, &[&"--hostname", &self.hostname]);
        arg(&mut a, &[&"--tmpfs", &"/"]);
        // Mount points that need a directory the image lacks.
        let mut targets: Vec<PathBuf> = self.mounts.iter().map(|m| m.dst.clone()).collect();
        targets.push(PathBuf::from("/etc/hosts"));
        let missing: Vec<PathBuf> =
            targets.into_iter().filter(|t| !self.root.join(strip_root(t)).exists()).collect();
        let mut carved = Vec::new();
        let top: Vec<PathBuf> = read_dir_sorted(&self.root);
        for entry in top {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if OWN_TOP_LEVEL.contains(&name.as_str()) {
                continue;
            }
            carve(&self.root, &Path::new("/").join(&name), &missing, &mut a, &mut carved);
        }
        arg(&mut a, &[&"--proc", &"/proc", &"--dev", &"/dev", &"--tmpfs", &"/run"]);
        arg(&mut a, &[&"--bind", &self.tmp, &"/tmp", &"--bind", &self.home, &"/root"]);
        arg(&mut a, &[&"--bind", &self.runtime, &RUNTIME_DIR]);
        arg(&mut a, &[&"--ro-bind", &self.hosts, &"/etc/hosts"]);
        if Path::new("/sys").exists() {
            arg(&mut a, &[&"--ro-bind", &"/sys", &"/sys"]);
        }
        for m in &self.mounts {
            let how = if m.read_only { "--ro-bind" } else { "--bind" };
            arg(&mut a, &[&how, &m.src, &m.dst]);
        }
        for dir in carved.iter().rev() {
            arg(&mut a, &[&"--remount-ro", dir]);
        }
        arg(&mut a, &[&"--remount-ro", &"/", &"--chdir", &"/root"]);
        a
    }
}

fn strip_root(p: &Path) -> &Path {
    p.strip_prefix("/").unwrap_or(p)
}

fn read_dir_sorted(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Binds `inside` (a path in the sandbox) from the image read-only, or, when a missing mount point lies
/// below it, makes it a tmpfs and binds its entries one by one.
fn carve(root: &Path, inside: &Path, missing: &[PathBuf], a: &mut Vec<OsString>, carved: &mut Vec<PathBuf>) {
    let src = root.join(strip_root(inside));
    let Ok(meta) = std::fs::symlink_metadata(&src) else { return };
    if meta.file_type().is_symlink() {
        if let Ok(target) = std::fs::read_link(&src) {
            arg(a, &[&"--symlink", &target, &inside]);
        }
        return;
    }
    let below = meta.is_dir() && missing.iter().any(|m| m.starts_with(inside) && m != inside);
    if !below {
        arg(a, &[&"--ro-bind", &src, &inside]);
        return;
    }
    arg(a, &[&"--tmpfs", &inside]);
    carved.push(inside.to_owned());
    for entry in read_dir_sorted(&src) {
        if let Some(name) = entry.file_name() {
            carve(root, &inside.join(name), missing, a, carved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(root: &Path, mounts: Vec<Mount>) -> SandboxPlan {
        SandboxPlan {
            root: root.to_owned(),
            hostname: "t-master-0".into(),
            tmp: "/x/tmp".into(),
            home: "/x/home".into(),
            runtime: "/x/run".into(),
            hosts: "/x/hosts".into(),
            mounts,
        }
    }

    fn joined(a: &[OsString]) -> String {
        a.iter().map(|s| s.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn binds_the_image_and_carves_around_missing_mount_points() {
        let dir = std::env::temp_dir().join(format!("ty-sandbox-{}", std::process::id()));
        let root = dir.join("root");
        for d in ["usr/bin", "etc", "mnt/existing", "opt/tool"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("etc/hosts"), "").unwrap();
        let _ = std::os::unix::fs::symlink("usr/bin", root.join("bin"));
        let mounts = vec![
            Mount { src: "/data/ds".into(), dst: "/mnt/data".into(), read_only: true },
            Mount { src: "/data/vol".into(), dst: "/mnt/existing".into(), read_only: false },
        ];
        let a = joined(&plan(&root, mounts).args());
        let r = root.display();
        assert!(a.contains("--symlink usr/bin /bin"), "{a}");
        assert!(a.contains(&format!("--ro-bind {r}/usr /usr")), "{a}");
        assert!(a.contains(&format!("--ro-bind {r}/etc /etc")), "{a}");
        // /mnt is carved: a tmpfs with the image's entries bound in, the new mount point made by bwrap.
        assert!(a.contains("--tmpfs /mnt"), "{a}");
        assert!(a.contains(&format!("--ro-bind {r}/mnt/existing /mnt/existing")), "{a}");
        assert!(a.contains("--ro-bind /data/ds /mnt/data"), "{a}");
        assert!(a.contains("--bind /data/vol /mnt/existing"), "{a}");
        assert!(a.find("--bind /data/vol").unwrap() < a.find("--remount-ro /mnt").unwrap(), "{a}");
        assert!(a.ends_with("--remount-ro / --chdir /root"), "{a}");
        assert!(a.contains("--hostname t-master-0"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
