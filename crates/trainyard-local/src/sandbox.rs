//! The bubblewrap command line of one replica: the image root read-only (a registry image's entries bound
//! from a file system of its own where the supervisor mounted one, see [`super::root_image`]), the
//! replica's scratch as `/tmp` and `/root`, its runtime dir at `/run/trainyard`, volumes read-write and
//! datasets and models read-only at their mount paths, and every namespace of its own.
//!
//! The sandbox is what a container runtime gives an unprivileged container: bubblewrap itself runs as the
//! attempt's unprivileged host uid (the supervisor drops to it), makes a user namespace in which that uid is
//! [`INNER_UID`], drops every capability, forbids further user namespaces, and loads the seccomp filter
//! ([`super::seccomp`]) before the command's first instruction; PID, IPC, UTS and cgroup namespaces are new,
//! and the network namespace is the replica's own (entered by the supervisor before bubblewrap starts).
//! `/proc/sys` is read-only (bubblewrap covers it) and the kernel's sensitive `/proc` and `/sys` files are
//! masked; `/sys/fs/cgroup` shows the replica's own cgroups only.
//!
//! A mount path that does not exist in the image (say `/mnt/data` in an image without it) cannot be
//! created inside a read-only bind, so the directories on the way to it are *carved*: each becomes a tmpfs
//! holding read-only binds of the image's entries, plus the new mount point, and is made read-only again
//! once every mount is in place.
//!
//! The `host` image is an allow-list view of this machine ([`HOST_VIEW`]: the system directories, never
//! `/home`, `/root`, `/srv` or `/var`), with the shadow files and SSH host keys masked and Trainyard's own
//! data dir hidden should it lie under one of them.

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

pub use trainyard_runtime::replica::RUNTIME_DIR;

/// The uid and gid a replica's processes have inside their user namespace (the attempt's host uid outside).
/// Not 0: a user namespace that maps one uid cannot switch users, and sshd runs only as a plain user then.
pub const INNER_UID: u32 = 1000;

/// The user's name inside replicas (in the sandbox's `/etc/passwd`, home `/root`).
pub const INNER_USER: &str = "trainyard";

/// Top-level entries of an image that the sandbox provides itself (or that belong to the host only).
const OWN_TOP_LEVEL: &[&str] = &["proc", "dev", "sys", "tmp", "root", "run", "lost+found"];

/// What a replica of the `host` image sees of this machine: its system directories only.
pub const HOST_VIEW: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt"];

/// Files of the host's `/etc` that no replica reads, even where their mode would let it.
const HOST_MASKED_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/security/opasswd",
];

/// Kernel files a container runtime masks: kernel memory, key and timer listings, and hardware details.
const PROC_MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kallsyms",
];
/// Dirs a container runtime masks, and the virtual block devices: a loop device's `loop/backing_file` names
/// the file behind it, and every replica's scratch is one, under the data dir and named by its task and
/// replica.
const PROC_MASKED_DIRS: &[&str] =
    &["/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/devices/virtual/block"];

/// What the sandbox of one replica holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The image's root file system (`/` for `host`): read on the host for its entries and mount points, and
    /// bound from unless the supervisor mounted it as a file system of its own ([`Start::root_from`]).
    pub root: PathBuf,
    /// A registry image's root (in the image cache): the supervisor mounts it as a file system of its own in
    /// its own mount namespace and the sandbox binds the root's entries from there, so its mounts name no
    /// path of the image cache (see [`super::root_image`]).
    #[serde(default)]
    pub mount_root: bool,
    /// The root is this machine's: show [`HOST_VIEW`] only.
    #[serde(default)]
    pub host_view: bool,
    pub hostname: String,
    /// Writable dirs on the host: bound at `/tmp` and `/root`.
    pub tmp: PathBuf,
    pub home: PathBuf,
    /// The replica's runtime dir on the host, bound at [`RUNTIME_DIR`].
    pub runtime: PathBuf,
    /// The attempt's hosts file, bound at `/etc/hosts`.
    pub hosts: PathBuf,
    /// The attempt's `/etc/passwd` and `/etc/group` (the image's, plus [`INNER_USER`]).
    #[serde(default)]
    pub passwd: Option<PathBuf>,
    #[serde(default)]
    pub group: Option<PathBuf>,
    /// The attempt's `/etc/resolv.conf`, when it has egress.
    #[serde(default)]
    pub resolv: Option<PathBuf>,
    /// Host paths hidden (an empty tmpfs over them) should the view show them: Trainyard's data dir.
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    /// Volumes, datasets, models and shared storage, in order.
    pub mounts: Vec<Mount>,
    /// Who the replica's processes are inside (the image's `User`, or Trainyard's own user).
    #[serde(default)]
    pub inner: Inner,
    /// Where the command starts (the image's `WorkingDir`; `/root` when it names none).
    #[serde(default)]
    pub workdir: Option<String>,
    /// The replica's copy of the task's working directory (in its scratch), bound at [`WORKSPACE`] in place
    /// of anything the image has there.
    #[serde(default)]
    pub workspace: Option<PathBuf>,
}

/// Where a replica sees its copy of the task's working directory.
pub const WORKSPACE: &str = "/workspace";

/// The user a replica's processes are inside their user namespace: the image's `User` when it names one
/// other than root, else Trainyard's [`INNER_USER`] at [`INNER_UID`]. Outside, it is always the attempt's
/// unprivileged host uid (one uid is mapped; root inside is never given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inner {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub group: String,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner { uid: INNER_UID, gid: INNER_UID, name: INNER_USER.to_owned(), group: INNER_USER.to_owned() }
    }
}

impl Inner {
    /// The user an image's `User` names (`name`, `uid`, `name:group`, `uid:gid`), looked up in the image's
    /// `/etc/passwd` and `/etc/group`. Root (or nothing) is Trainyard's own user: a sandbox is never root.
    pub fn of_image(user: Option<&str>, passwd: Option<&str>, group: Option<&str>) -> Result<Inner, String> {
        let Some(spec) = user.map(str::trim).filter(|u| !u.is_empty()) else { return Ok(Inner::default()) };
        let (u, g) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let entries = |text: Option<&str>| -> Vec<(String, u32, Option<u32>)> {
            text.unwrap_or("")
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    Some((
                        f.first()?.to_string(),
                        f.get(2)?.parse().ok()?,
                        f.get(3).and_then(|x| x.parse().ok()),
                    ))
                })
                .collect()
        };
        let (users, groups) = (entries(passwd), entries(group));
        let (uid, name, primary) = match u.parse::<u32>() {
            Ok(uid) => match users.iter().find(|x| x.1 == uid) {
                Some(x) => (uid, x.0.clone(), x.2),
                None => (uid, INNER_USER.to_owned(), None),
            },
            Err(_) => match users.iter().find(|x| x.0 == u) {
                Some(x) => (x.1, x.0.clone(), x.2),
                None => return Err(format!("the image's User \"{u}\" is not in its /etc/passwd")),
            },
        };
        if uid == 0 {
            return Ok(Inner::default());
        }
        let gid = match g {
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => groups
                    .iter()
                    .find(|x| x.0 == g)
                    .map(|x| x.1)
                    .ok_or_else(|| format!("the image's User group \"{g}\" is not in its /etc/group"))?,
            },
            None => primary.unwrap_or(uid),
        };
        // Group 0 would be root's group inside: the user's own id instead.
        let gid = if gid == 0 { uid } else { gid };
        let group = groups.iter().find(|x| x.1 == gid).map_or_else(|| name.clone(), |x| x.0.clone());
        Ok(Inner { uid, gid, name, group })
    }
}

/// What only the supervisor knows when it starts bubblewrap.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// The fd holding the seccomp program.
    pub seccomp_fd: Option<i32>,
    /// The replica's cgroup dirs: (host path, name under `/sys/fs/cgroup`).
    pub cgroups: Vec<(PathBuf, String)>,
    /// Whether the process already is in the replica's network namespace; if not, bubblewrap makes an
    /// empty one (loopback only), never the host's.
    pub in_netns: bool,
    /// Where the image's root is mounted as a file system of its own ([`SandboxPlan::mount_root`], in the
    /// mount namespace bubblewrap starts in): its entries are bound from there. None: from
    /// [`SandboxPlan::root`].
    pub root_from: Option<PathBuf>,
}

fn arg(v: &mut Vec<OsString>, parts: &[&dyn AsRef<std::ffi::OsStr>]) {
    v.extend(parts.iter().map(|p| p.as_ref().to_owned()));
}

impl SandboxPlan {
    /// The bwrap arguments before the command. Reads the image's directories (to bind their entries and to
    /// carve around missing mount points).
    pub fn args(&self, start: &Start) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let (uid, gid) = (self.inner.uid.to_string(), self.inner.gid.to_string());
        arg(&mut a, &[&"--die-with-parent", &"--unshare-user", &"--uid", &uid, &"--gid", &gid]);
        arg(&mut a, &[&"--disable-userns", &"--cap-drop", &"ALL"]);
        arg(&mut a, &[&"--unshare-pid", &"--unshare-uts", &"--unshare-ipc", &"--unshare-cgroup"]);
        if !start.in_netns {
            arg(&mut a, &[&"--unshare-net"]);
        }
        arg(&mut a, &[&"--hostname", &self.hostname]);
        arg(&mut a, &[&"--tmpfs", &"/"]);
        // Mount points that need a directory the image lacks.
        let mut targets: Vec<PathBuf> = self.mounts.iter().map(|m| m.dst.clone()).collect();
        targets.push(PathBuf::from("/etc/hosts"));
        if self.passwd.is_some() {
            targets.push(PathBuf::from("/etc/passwd"));
        }
        if self.group.is_some() {
            targets.push(PathBuf::from("/etc/group"));
        }
        if self.resolv.is_some() {
            targets.push(PathBuf::from("/etc/resolv.conf"));
        }
        // Resolved as the sandbox will (inside the image), never on the host: a link in the image to a host
        // path is missing here, and its mount point is made in its place.
        let missing: Vec<PathBuf> = targets
            .into_iter()
            .filter(|t| {
                !trainyard_images::unpack::exists_in_root(&self.root, &strip_root(t).to_string_lossy())
            })
            .collect();
        let mut carved = Vec::new();
        let top: Vec<PathBuf> = read_dir_sorted(&self.root);
        for entry in top {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if OWN_TOP_LEVEL.contains(&name.as_str())
                || (self.host_view && !HOST_VIEW.contains(&name.as_str()))
                || (self.workspace.is_some() && name == WORKSPACE[1..])
            {
                continue;
            }
            let image = Image { root: &self.root, from: start.root_from.as_deref().unwrap_or(&self.root) };
            carve(&image, &Path::new("/").join(&name), &missing, &mut a, &mut carved);
        }
        let mut masked_dirs: Vec<PathBuf> = Vec::new();
        if self.host_view {
            for f in HOST_MASKED_FILES.iter().map(PathBuf::from).chain(ssh_host_keys()) {
                if f.exists() {
                    arg(&mut a, &[&"--ro-bind", &"/dev/null", &f]);
                }
            }
            for h in &self.hide {
                if HOST_VIEW.iter().any(|top| h.starts_with(Path::new("/").join(top))) && h.is_dir() {
                    arg(&mut a, &[&"--tmpfs", h]);
                    masked_dirs.push(h.clone());
                }
            }
        }
        arg(&mut a, &[&"--proc", &"/proc", &"--dev", &"/dev", &"--tmpfs", &"/run"]);
        for f in PROC_MASKED_FILES {
            if Path::new(f).exists() {
                arg(&mut a, &[&"--ro-bind", &"/dev/null", f]);
            }
        }
        arg(&mut a, &[&"--bind", &self.tmp, &"/tmp", &"--bind", &self.home, &"/root"]);
        arg(&mut a, &[&"--bind", &self.runtime, &RUNTIME_DIR]);
        if let Some(w) = &self.workspace {
            arg(&mut a, &[&"--bind", w, &WORKSPACE]);
        }
        arg(&mut a, &[&"--ro-bind", &self.hosts, &"/etc/hosts"]);
        if let Some(p) = &self.passwd {
            arg(&mut a, &[&"--ro-bind", p, &"/etc/passwd"]);
        }
        if let Some(g) = &self.group {
            arg(&mut a, &[&"--ro-bind", g, &"/etc/group"]);
        }
        if let Some(r) = &self.resolv {
            arg(&mut a, &[&"--ro-bind", r, &"/etc/resolv.conf"]);
        }
        if Path::new("/sys").exists() {
            arg(&mut a, &[&"--ro-bind", &"/sys", &"/sys"]);
            // The host's cgroup tree names every other task; the replica sees its own cgroups only.
            if Path::new("/sys/fs/cgroup").is_dir() {
                arg(&mut a, &[&"--tmpfs", &"/sys/fs/cgroup"]);
                for (host, name) in &start.cgroups {
                    let inside = Path::new("/sys/fs/cgroup").join(name);
                    arg(&mut a, &[&"--ro-bind", host, &inside]);
                }
                masked_dirs.push(PathBuf::from("/sys/fs/cgroup"));
            }
        }
        for d in PROC_MASKED_DIRS.iter().map(PathBuf::from).chain(host_net_dirs()) {
            if d.is_dir() {
                arg(&mut a, &[&"--tmpfs", &d]);
                masked_dirs.push(d);
            }
        }
        for m in &self.mounts {
            let how = if m.read_only { "--ro-bind" } else { "--bind" };
            arg(&mut a, &[&how, &m.src, &m.dst]);
        }
        for dir in carved.iter().rev().chain(masked_dirs.iter()) {
            arg(&mut a, &[&"--remount-ro", dir]);
        }
        if let Some(fd) = start.seccomp_fd {
            arg(&mut a, &[&"--seccomp", &fd.to_string()]);
        }
        let workdir = self.workdir.as_deref().unwrap_or("/root");
        arg(&mut a, &[&"--remount-ro", &"/", &"--chdir", &workdir]);
        a
    }
}

/// Where the host's `/sys` lists the host's network interfaces (a view of the host's network namespace,
/// whatever the replica's own is): `/sys/class/net`, and the `net` dir of each device it links to
/// (`/sys/devices/virtual/net` and each network card's). Each is masked with an empty directory.
fn host_net_dirs() -> Vec<PathBuf> {
    let class = Path::new("/sys/class/net");
    let mut dirs = vec![class.to_owned(), PathBuf::from("/sys/devices/virtual/net")];
    for link in read_dir_sorted(class) {
        // `../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0`: its parent is a `net` dir under `/sys`.
        let Ok(dev) = std::fs::canonicalize(&link) else { continue };
        if let Some(net) = dev.parent().filter(|p| p.starts_with("/sys/devices") && p.ends_with("net"))
            && !dirs.iter().any(|d| d == net)
        {
            dirs.push(net.to_owned());
        }
    }
    dirs
}

/// The host's SSH host keys (private and public), masked in the `host` view.
fn ssh_host_keys() -> Vec<PathBuf> {
    read_dir_sorted(Path::new("/etc/ssh"))
        .into_iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ssh_host_")))
        .collect()
}

/// The sandbox's `/etc/passwd` or `/etc/group`: the image's entries (without any that claims the inner
/// user's id or name) and the inner user's own, whose home is `/root`.
pub fn identity_file(image_file: Option<&str>, passwd: bool, inner: &Inner) -> String {
    let (name, id) = if passwd { (&inner.name, inner.uid) } else { (&inner.group, inner.gid) };
    let id_s = id.to_string();
    let mut out = String::new();
    for line in image_file.unwrap_or("").lines() {
        let mut f = line.split(':');
        let (n, i) = (f.next().unwrap_or(""), f.nth(1).unwrap_or(""));
        if line.trim().is_empty() || n == name || i == id_s {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if passwd {
        out.push_str(&format!("{name}:x:{id}:{}:Trainyard task:/root:/bin/bash\n", inner.gid));
    } else {
        out.push_str(&format!("{name}:x:{id}:\n"));
    }
    out
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

/// An image's root: where it is read (on the host) and where its entries are bound from (the same tree,
/// mounted as a file system of its own where it could be).
struct Image<'a> {
    root: &'a Path,
    from: &'a Path,
}

/// Binds `inside` (a path in the sandbox) from the image read-only, or, when a missing mount point lies
/// below it, makes it a tmpfs and binds its entries one by one.
fn carve(
    image: &Image,
    inside: &Path,
    missing: &[PathBuf],
    a: &mut Vec<OsString>,
    carved: &mut Vec<PathBuf>,
) {
    let src = image.root.join(strip_root(inside));
    let Ok(meta) = std::fs::symlink_metadata(&src) else { return };
    if meta.file_type().is_symlink() && missing.iter().any(|m| m == inside) {
        // A mount point whose link leads nowhere in the image: the mount's own file takes its place.
        return;
    }
    if meta.file_type().is_symlink() {
        if let Ok(target) = std::fs::read_link(&src) {
            arg(a, &[&"--symlink", &target, &inside]);
        }
        return;
    }
    let below = meta.is_dir() && missing.iter().any(|m| m.starts_with(inside) && m != inside);
    if !below {
        arg(a, &[&"--ro-bind", &image.from.join(strip_root(inside)), &inside]);
        return;
    }
    arg(a, &[&"--tmpfs", &inside]);
    carved.push(inside.to_owned());
    for entry in read_dir_sorted(&src) {
        if let Some(name) = entry.file_name() {
            carve(image, &inside.join(name), missing, a, carved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(root: &Path, mounts: Vec<Mount>) -> SandboxPlan {
        SandboxPlan {
            root: root.to_owned(),
            mount_root: false,
            hostname: "t-master-0".into(),
            tmp: "/x/tmp".into(),
            home: "/x/home".into(),
            runtime: "/x/run".into(),
            hosts: "/x/hosts".into(),
            passwd: None,
            group: None,
            resolv: None,
            hide: Vec::new(),
            host_view: false,
            mounts,
            inner: Inner::default(),
            workdir: None,
            workspace: None,
        }
    }

    #[test]
    fn an_images_user_is_who_its_processes_are_but_never_root() {
        let passwd = "root:x:0:0::/root:/bin/bash\nalice:x:1001:1002::/home/alice:/bin/bash\n";
        let group = "root:x:0:\nstaff:x:1002:\nvideo:x:44:\n";
        let of = |u: Option<&str>| Inner::of_image(u, Some(passwd), Some(group));
        assert_eq!(of(None).unwrap(), Inner::default());
        assert_eq!(of(Some("root")).unwrap(), Inner::default());
        assert_eq!(of(Some("0:0")).unwrap(), Inner::default());
        let alice = Inner { uid: 1001, gid: 1002, name: "alice".into(), group: "staff".into() };
        assert_eq!(of(Some("alice")).unwrap(), alice);
        assert_eq!(of(Some("1001")).unwrap(), alice);
        assert_eq!(
            of(Some("alice:video")).unwrap(),
            Inner { gid: 44, group: "video".into(), ..alice.clone() }
        );
        assert_eq!(of(Some("alice:0")).unwrap().gid, 1001, "never root's group");
        let nobody_here = of(Some("4242:4242")).unwrap();
        assert_eq!((nobody_here.uid, nobody_here.gid, nobody_here.name.as_str()), (4242, 4242, INNER_USER));
        assert!(of(Some("bob")).unwrap_err().contains("not in its /etc/passwd"));
        assert!(of(Some("alice:nogroup")).unwrap_err().contains("not in its /etc/group"));
        let mut p = plan(Path::new("/img"), Vec::new());
        p.inner = alice.clone();
        p.workdir = Some("/app".into());
        let a = p
            .args(&Start::default())
            .iter()
            .map(|x| x.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        assert!(a.contains("--uid 1001 --gid 1002"), "{a}");
        assert!(a.ends_with("--chdir /app"), "{a}");
        let f = identity_file(Some(passwd), true, &alice);
        assert_eq!(f.lines().filter(|l| l.starts_with("alice:")).count(), 1);
        assert!(f.contains("alice:x:1001:1002:Trainyard task:/root:/bin/bash"), "{f}");
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
        let a = joined(&plan(&root, mounts).args(&Start::default()));
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
        // The root mounted as a file system of its own: the same entries and carving (read from the root),
        // each bound from the mount, and the root's own path named nowhere.
        let start = Start { root_from: Some("/x/rootfs".into()), ..Start::default() };
        let mounts = vec![Mount { src: "/data/ds".into(), dst: "/mnt/data".into(), read_only: true }];
        let a = joined(&plan(&root, mounts).args(&start));
        assert!(a.contains("--symlink usr/bin /bin"), "{a}");
        assert!(a.contains("--ro-bind /x/rootfs/usr /usr"), "{a}");
        assert!(a.contains("--ro-bind /x/rootfs/etc /etc"), "{a}");
        assert!(a.contains("--tmpfs /mnt"), "{a}");
        assert!(a.contains("--ro-bind /x/rootfs/mnt/existing /mnt/existing"), "{a}");
        assert!(!a.contains(&r.to_string()), "{a}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
