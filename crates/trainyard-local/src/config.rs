//! How the local backend is set up on this machine: its configuration, the uid and gid ranges of the
//! sandboxes, and what `trainyard up` reports about them.

use super::*;

/// How often the preset metrics are sampled when the task configures no interval of its own.
pub const PRESET_INTERVAL_S: u64 = 10;

/// The gid every sandbox runs with (never a group of the host's users), and the first of the attempts'
/// uids: above the ranges distributions hand out to users and to containers (systemd's container range
/// ends at 1,879,048,191).
pub const SANDBOX_GID: u32 = 1_900_000_000;
pub const UID_BASE: u32 = 1_900_000_001;
/// The uid and gid that unpack registry images and own their files: none of the sandboxes' (below
/// [`UID_BASE`], above systemd's container range), so no replica runs as the owner of an image's files, and
/// the unpacking never runs as root.
pub const IMAGE_UNPACK_ID: u32 = 1_899_999_999;
/// How many attempts may run at once on one machine (each holds a uid).
pub const UID_SLOTS: u32 = 1_000_000;

pub use trainyard_runtime::replica::MASTER_PORT;

/// Idle supervisors kept ready by default: a gang of this many replicas starts without waiting for any
/// supervisor to start (about 10 MB of memory each while idle).
pub const DEFAULT_SUPERVISOR_POOL: usize = 8;

/// How the local backend runs.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Where attempts live (`runs/` in the data dir).
    pub runs_dir: PathBuf,
    /// Default homes of volumes, datasets and models without a `path` in the catalog.
    pub data_dir: PathBuf,
    /// The supervisor: our own binary and the arguments before the replica dir (`trainyard supervise`).
    pub supervisor: (PathBuf, Vec<String>),
    pub bwrap: PathBuf,
    /// Between SIGTERM and SIGKILL on every stop path.
    pub grace_s: u64,
    /// `PATH` inside replicas of the `host` image: this server's, less what the sandbox hides.
    pub host_path: String,
    /// After a PyTorchJob's master succeeded, how long its workers may take to end by themselves.
    pub workers_after_master_ms: u64,
    /// iproute2's `ip`, for the replicas' network; None: each replica alone in an empty network namespace
    /// (replicas of one task cannot reach each other then).
    pub ip: Option<PathBuf>,
    /// The replicas' addresses (every attempt on a segment of its own, so all use the same range).
    pub network: netns::Range,
    /// Processes, scratch and log size per replica.
    pub limits: supervisor::Limits,
    /// Idle supervisors kept ready for replicas (see `pool`); 0: each is started when needed.
    pub supervisor_pool: usize,
    /// Host paths a `host` replica never sees (the data dir).
    pub hide: Vec<PathBuf>,
    /// Replicas reach beyond their attempt (off unless the admin turns it on).
    pub egress: Option<netns::Egress>,
    /// The cache of registry images (None: only `host` and images with a root file system here run).
    pub images: Option<trainyard_images::Images>,
    /// The size the image cache is kept under (least recently used images not in use go first).
    pub image_cache_max_bytes: u64,
    /// Whether supervisors mount registry images' roots as file systems of their own (see
    /// [`crate::root_image`]); Err: why not here (see [`crate::root_image::probe`]), and the sandboxes bind
    /// the roots from the image cache.
    pub image_roots: Result<(), String>,
    /// Where the server keeps uploaded working directories (`workdirs/` in the data dir).
    pub workdirs: PathBuf,
}

/// The image cache's default size limit.
pub const IMAGE_CACHE_MAX_BYTES: u64 = 100 << 30;

impl LocalConfig {
    pub fn new(data_dir: &Path, supervisor: (PathBuf, Vec<String>), bwrap: PathBuf) -> LocalConfig {
        LocalConfig {
            runs_dir: data_dir.join("runs"),
            data_dir: data_dir.to_owned(),
            supervisor,
            bwrap,
            grace_s: 5,
            workers_after_master_ms: 10_000,
            host_path: sandbox_path(&std::env::var_os("PATH").unwrap_or_default()),
            ip: netns::find_ip().ok(),
            network: netns::Range::default(),
            limits: supervisor::Limits::default(),
            supervisor_pool: DEFAULT_SUPERVISOR_POOL,
            hide: vec![data_dir.to_owned()],
            egress: None,
            images: None,
            image_cache_max_bytes: IMAGE_CACHE_MAX_BYTES,
            image_roots: Ok(()),
            workdirs: data_dir.join("workdirs"),
        }
    }
}

/// Files and dirs this process creates are its own (mode 0600/0700) unless it says otherwise.
pub fn private_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

/// Whether this process can give replicas identities of their own (it must be root to switch uids, make
/// network namespaces and cgroups).
pub fn isolation_ready() -> Result<(), String> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err("the local backend runs every replica as a uid of its own in its own network namespace, which \
             needs root: start `trainyard up` as root (or use `--backend fake`)"
            .to_owned())
    }
}

/// What the sandboxes enforce on this host, and what they cannot, one line each for `up`'s start-up output.
pub fn describe_isolation(cfg: &LocalConfig) -> Vec<String> {
    let mut out = vec![format!(
        "each attempt runs as a uid of its own ({UID_BASE} and up, group {SANDBOX_GID}) in a user namespace, \
         without capabilities, with no_new_privs and a seccomp filter"
    )];
    let range = cfg.network;
    out.push(match &cfg.ip {
        Some(_) => format!(
            "each task's replicas share a network segment of their own in {}/{}; nothing else is reachable (not this \
             machine, not other tasks){}",
            std::net::Ipv4Addr::from(range.base),
            range.prefix,
            match &cfg.egress {
                None => ", and no egress (--sandbox-egress)".to_owned(),
                Some(e) => format!(
                    "; egress ON: the internet through this machine, never private, loopback or link-local \
                     ranges{} (IP forwarding is on, nftables table inet {})",
                    if e.allow.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " except {}",
                            e.allow
                                .iter()
                                .map(|r| format!("{}/{}", std::net::Ipv4Addr::from(r.base), r.prefix))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                    e.table
                ),
            }
        ),
        None => "NOT networked: iproute2 (ip) is missing, so each replica runs alone in an empty network \
                 namespace and replicas of one task cannot reach each other (apt-get install iproute2)"
            .to_owned(),
    });
    let cg = Path::new("/sys/fs/cgroup");
    let v2 = cg.join("cgroup.controllers").exists();
    let limits = format!(
        "{} processes, {} MiB of scratch and a {} KiB log (rotated) per replica",
        cfg.limits.pids_max,
        cfg.limits.scratch_mib,
        cfg.limits.log_bytes / 1024
    );
    if !v2 && !cg.join("memory/cgroup.procs").exists() {
        out.push(format!(
            "limits: CPU, memory and process counts are NOT enforced (no usable cgroup file system); {}",
            "scratch and log limits are"
        ));
    } else if !v2 && !cg.join("pids/cgroup.procs").exists() {
        out.push(format!(
            "limits: CPU and memory per replica; the number of processes is NOT limited (no pids cgroup); {limits}"
        ));
    } else {
        out.push(format!("limits: CPU and memory as the instance spec says; {limits}"));
    }
    out.push(format!(
        "the `host` image shows /{} of this machine, without its shadow files, SSH host keys or the data dir",
        sandbox::HOST_VIEW.join(", /")
    ));
    if cfg.images.is_some() {
        out.push(match &cfg.image_roots {
            Ok(()) => "registry images' roots are file systems of their own (read-only overlays), so a \
                       sandbox's mounts name no path of the image cache"
                .to_owned(),
            Err(why) => format!(
                "registry images' roots are bound from the image cache, so a sandbox's /proc/self/mountinfo \
                 names the cache's path: {why}"
            ),
        });
    }
    out
}

/// A `PATH` as a `host` replica sees it: the directories the sandbox replaces (`/root`, `/tmp`, `/run`)
/// left out, and the usual system directories when nothing is left.
pub fn sandbox_path(path: &std::ffi::OsStr) -> String {
    let hidden = ["/root", "/tmp", "/run", "/proc", "/dev"];
    let dirs: Vec<String> = std::env::split_paths(path)
        .filter(|d| d.is_absolute() && !hidden.iter().any(|h| d.starts_with(h)))
        .map(|d| d.display().to_string())
        .collect();
    if dirs.is_empty() {
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
    } else {
        dirs.join(":")
    }
}

/// `bwrap` on the PATH, or what to install.
pub fn find_bwrap() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("bwrap")).find(|p| p.is_file()).ok_or_else(|| {
        "bubblewrap (bwrap) is not installed; the local backend runs every replica in it. Install it with \
         `apt-get install bubblewrap` (Debian, Ubuntu) or `dnf install bubblewrap` (Fedora)"
            .to_owned()
    })
}
