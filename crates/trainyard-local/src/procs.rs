//! Processes on this machine: liveness that survives PID reuse, the processes inside a sandbox's PID
//! namespace, signals, and the replica's cgroup (v2, or v1 memory + cpu) where the host lets us make one.

use std::path::{Path, PathBuf};

/// The start time of a process in clock ticks since boot (field 22 of `/proc/PID/stat`): with the PID it
/// names one process for good, even after the PID is reused.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process (pid, start ticks) still runs (a zombie counts as gone).
pub fn alive(pid: u32, ticks: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some(close) = stat.rfind(')') else { return false };
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next().unwrap_or("X");
    state != "Z" && state != "X" && start_ticks(pid) == Some(ticks)
}

/// The PID namespace of a process, as the kernel names it (`pid:[4026532xyz]`).
fn pid_ns(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The children of a process (needs `CONFIG_PROC_CHILDREN`, present on every common kernel).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// The PID namespace of the sandbox bubblewrap process `bwrap_pid` started (its child's), once it exists.
pub fn sandbox_ns(bwrap_pid: u32) -> Option<PathBuf> {
    let mine = pid_ns(std::process::id());
    children(bwrap_pid).into_iter().filter_map(pid_ns).find(|ns| Some(ns) != mine.as_ref())
}

/// The sandbox's init (pid 1 inside) as a host pid: the child of bubblewrap process `bwrap_pid` in a PID
/// namespace of its own.
pub fn sandbox_init(bwrap_pid: u32) -> Option<u32> {
    let mine = pid_ns(std::process::id());
    children(bwrap_pid).into_iter().find(|&c| pid_ns(c).is_some_and(|ns| Some(&ns) != mine.as_ref()))
}

/// Processes inside the sandbox started by bubblewrap process `bwrap_pid`: everything in its child's PID
/// namespace, as (host pid, pid inside). The namespace's init (pid 1 inside) comes first.
pub fn sandbox_processes(bwrap_pid: u32) -> Vec<(u32, u32)> {
    sandbox_ns(bwrap_pid).map(|ns| ns_processes(&ns)).unwrap_or_default()
}

/// Every process in a PID namespace, as (host pid, pid inside), init (pid 1 inside) first.
pub fn ns_processes(ns: &Path) -> Vec<(u32, u32)> {
    let ns = ns.to_owned();
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return found };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid_ns(pid).as_ref() != Some(&ns) {
            continue;
        }
        let inner = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("NSpid:"))
                    .and_then(|l| l.split_whitespace().last()?.parse().ok())
            })
            .unwrap_or(0);
        found.push((pid, inner));
    }
    found.sort_by_key(|&(_, inner)| inner);
    found
}

/// Whether a process has a handler for a signal (its `SigCgt` mask in `/proc/PID/status`).
pub fn catches(pid: u32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    (1..=64).contains(&sig) && mask & (1u64 << (sig - 1)) != 0
}

/// Moves the calling thread into the network namespace of a process (to read a sandbox's loopback).
pub fn enter_netns_of(pid: u32) -> std::io::Result<()> {
    let fd = rustix::fs::open(
        format!("/proc/{pid}/ns/net").as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&fd),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}

/// Sends a signal to one process; a process that is already gone is not an error.
pub fn signal(pid: u32, sig: i32) {
    let (Some(pid), Some(sig)) = (rustix::process::Pid::from_raw(pid as i32), signal_of(sig)) else { return };
    let _ = rustix::process::kill_process(pid, sig);
}

fn signal_of(sig: i32) -> Option<rustix::process::Signal> {
    use rustix::process::Signal;
    Some(match sig {
        2 => Signal::INT,
        9 => Signal::KILL,
        10 => Signal::USR1,
        12 => Signal::USR2,
        15 => Signal::TERM,
        _ => return None,
    })
}

pub use trainyard_runtime::replica::{SIGINT, SIGKILL, SIGTERM, SIGUSR1, SIGUSR2};

/// A replica's cgroup: CPU and memory limits, and whether the OOM killer fired in it.
#[derive(Debug)]
pub enum Cgroup {
    V2(PathBuf),
    V1 { memory: PathBuf, cpu: Option<PathBuf>, pids: Option<PathBuf> },
}

const CG: &str = "/sys/fs/cgroup";

/// This process's cgroup for a v1 controller (`memory`, `cpu`), or the v2 one for `""`, from
/// `/proc/self/cgroup`: new cgroups are made below it, so limits nest inside whatever holds Trainyard.
fn current(controller: &str) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let hit =
            if controller.is_empty() { list.is_empty() } else { list.split(',').any(|c| c == controller) };
        if hit {
            let base =
                if controller.is_empty() { Path::new(CG).to_owned() } else { Path::new(CG).join(controller) };
            // The server's own cgroup (`weigh_server`) is not where Trainyard's cgroups go: its parent is.
            let path = path.strip_suffix(SERVER_CGROUP).and_then(|p| p.strip_suffix('/')).unwrap_or(path);
            return base.join(path.trim_start_matches('/'));
        }
    }
    if controller.is_empty() { Path::new(CG).to_owned() } else { Path::new(CG).join(controller) }
}

/// The cgroup (next to the replicas') that supervisors move to once their sandbox runs.
pub const SUPERVISORS_CGROUP: &str = "supervisors";

/// The name of a waiting pooled supervisor's cgroups, before its pid.
pub const POOL_CGROUP_PREFIX: &str = "pool-";

/// The dirs under which [`Cgroup::enter_new`] makes cgroups (`trainyard/` in each hierarchy it uses).
pub fn cgroup_parents() -> Vec<PathBuf> {
    let mut dirs = vec![current("").join("trainyard")];
    for ctl in ["memory", "cpu", "pids"] {
        dirs.push(current(ctl).join("trainyard"));
    }
    dirs.retain(|d| d.starts_with(CG) && d.is_dir());
    dirs
}

/// CPU weight of one busy process in a cgroup: cgroup v1's default `cpu.shares` and v2's `cpu.weight`.
const V1_SHARES_PER_CPU: u64 = 1024;
const V2_WEIGHT_PER_CPU: u64 = 100;

/// The file a cgroup's CPU weight is in and the weight of one busy process per CPU of this machine, within
/// the bounds the kernel takes (cgroup v2 or v1).
fn weight_of_every_cpu(v2: bool) -> (&'static str, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    if v2 {
        ("cpu.weight", (cpus * V2_WEIGHT_PER_CPU).clamp(1, 10_000))
    } else {
        ("cpu.shares", (cpus * V1_SHARES_PER_CPU).clamp(2, 262_144))
    }
}

/// Gives the cgroup every replica shares (`trainyard/`) the CPU weight of one busy process per CPU of this
/// machine, as Kubernetes gives its pods' parent cgroup the weight of the CPUs it may hand out. With the
/// default weight (one process's worth) all replicas together, their sandboxes' start included, had a third
/// of the machine against two busy processes outside it (local-bench with two `yes` running: a gang's
/// replicas first printed 3.3 s after its submission at the median, 34 s at worst; 240 and 299 ms with it).
pub fn weigh_replicas_together() -> Result<(), String> {
    let fail = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let v2 = Path::new(CG).join("cgroup.controllers").exists();
    let (file, weight) = weight_of_every_cpu(v2);
    let parent = if v2 {
        v2_parent()?
    } else {
        let parent = current("cpu").join("trainyard");
        if !parent.starts_with(Path::new(CG).join("cpu")) || !Path::new(CG).join("cpu/cpu.shares").exists() {
            return Err("this host has no cgroup v1 cpu controller".into());
        }
        make_cgroup_dir(&parent).map_err(|e| fail("cannot create a cgroup", e))?;
        parent
    };
    std::fs::write(parent.join(file), weight.to_string()).map_err(|e| fail(&format!("cannot set {file}"), e))
}

/// The cgroup the server moves into when it finds itself in the root one (`weigh_server`), beside
/// `trainyard/`.
pub const SERVER_CGROUP: &str = "trainyard-server";

/// Moves this process (the server) out of the root cgroup into `trainyard-server/`, with the CPU weight of one
/// busy process per CPU, as the replicas have together. In the root cgroup the kernel groups processes by
/// session (autogroup): a server started from a shell shared one process's weight with whatever else that
/// session ran, and with two busy processes there its threads waited 2.5 times as long for a CPU as they
/// ran (`perf sched timehist`, local-bench), up to 100 ms at a time; a gang's launch waited on it (its files
/// written, its start observed). A server in a cgroup of someone else's (a systemd unit, a container) stays
/// there: its weight is theirs to set. `Ok(false)`: not in the root cgroup, nothing done.
pub fn weigh_server() -> Result<bool, String> {
    let fail = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let v2 = Path::new(CG).join("cgroup.controllers").exists();
    let (weight_file, weight) = weight_of_every_cpu(v2);
    let root = if v2 { PathBuf::from(CG) } else { Path::new(CG).join("cpu") };
    let has_cpu_controller = v2 || root.join(weight_file).exists();
    if !has_cpu_controller || current(if v2 { "" } else { "cpu" }) != root {
        return Ok(false);
    }
    let dir = root.join(SERVER_CGROUP);
    if v2 {
        let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
    }
    make_cgroup_dir(&dir).map_err(|e| fail("cannot create a cgroup", e))?;
    std::fs::write(dir.join(weight_file), weight.to_string())
        .map_err(|e| fail("cannot set its weight", e))?;
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| fail("cannot move into it", e))?;
    Ok(true)
}

/// cgroup v2: `trainyard/` under this process's cgroup, made if missing, with the controllers the replicas'
/// limits need turned on above it.
fn v2_parent() -> Result<PathBuf, String> {
    let here = current("");
    let parent = here.join("trainyard");
    make_cgroup_dir(&parent).map_err(|e| format!("cannot create a cgroup: {e}"))?;
    let _ = std::fs::write(here.join("cgroup.subtree_control"), "+cpu +memory +pids");
    Ok(parent)
}

/// Makes a cgroup dir that the replica's sandbox (another uid) can bind and read: its limits are shown to it
/// read-only at `/sys/fs/cgroup`.
fn make_cgroup_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    for d in [dir.parent(), Some(dir)].into_iter().flatten() {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

impl Cgroup {
    /// Makes `trainyard/NAME` with the limits and moves this process into it (so everything it starts is
    /// inside from the first instruction). Err says why limits cannot be enforced here.
    pub fn create(name: &str, millicpu: u64, memory_mib: u64, pids_max: u64) -> Result<Cgroup, String> {
        let cg = Cgroup::enter_new(name)?;
        if let Err(why) = cg.limit(millicpu, memory_mib, pids_max) {
            // Not left behind with this process in it: nothing would remove it.
            cg.remove();
            return Err(why);
        }
        Ok(cg)
    }

    /// Makes `trainyard/NAME` in each controller and moves this process into it, with no limits yet.
    /// Moving a process between cgroups waits on the kernel (an RCU grace period, 10-15 ms on cgroup v1): a
    /// pooled supervisor does it while it waits for a replica, then takes the replica's name and limits
    /// ([`Cgroup::rename`], [`Cgroup::limit`]).
    pub fn enter_new(name: &str) -> Result<Cgroup, String> {
        let cg = Path::new(CG);
        let me = std::process::id().to_string();
        let fail = |what: &str, e: std::io::Error| format!("{what}: {e}");
        if cg.join("cgroup.controllers").exists() {
            let parent = v2_parent()?;
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpu +memory +pids");
            let dir = parent.join(name);
            make_cgroup_dir(&dir).map_err(|e| fail("cannot create a cgroup", e))?;
            std::fs::write(dir.join("cgroup.procs"), &me).map_err(|e| fail("cannot enter the cgroup", e))?;
            return Ok(Cgroup::V2(dir));
        }
        let mem_root = cg.join("memory");
        if !mem_root.join("cgroup.procs").exists() {
            return Err("this host has no usable cgroup file system".into());
        }
        let memory = current("memory").join("trainyard").join(name);
        make_cgroup_dir(&memory).map_err(|e| fail("cannot create a memory cgroup", e))?;
        std::fs::write(memory.join("cgroup.procs"), &me)
            .map_err(|e| fail("cannot enter the memory cgroup", e))?;
        let cpu = (|| {
            let dir = current("cpu").join("trainyard").join(name);
            make_cgroup_dir(&dir).ok()?;
            std::fs::write(dir.join("cgroup.procs"), &me).ok()?;
            Some(dir)
        })();
        let pids = (|| -> Option<PathBuf> {
            if !cg.join("pids").join("cgroup.procs").exists() {
                return None;
            }
            let dir = current("pids").join("trainyard").join(name);
            make_cgroup_dir(&dir).ok()?;
            std::fs::write(dir.join("cgroup.procs"), &me).ok()?;
            Some(dir)
        })();
        Ok(Cgroup::V1 { memory, cpu, pids })
    }

    /// Sets the replica's CPU, memory and process limits. A controller whose limit cannot be set is left
    /// out on cgroup v1 (CPU, processes: `limits_pids` says which); memory is required.
    pub fn limit(&self, millicpu: u64, memory_mib: u64, pids_max: u64) -> Result<(), String> {
        let bytes = (memory_mib * 1024 * 1024).to_string();
        let period = 100_000u64;
        let quota = (millicpu * period / 1000).max(1000);
        let fail = |what: &str, e: std::io::Error| format!("{what}: {e}");
        match self {
            Cgroup::V2(dir) => {
                std::fs::write(dir.join("memory.max"), &bytes)
                    .map_err(|e| fail("cannot set memory.max", e))?;
                std::fs::write(dir.join("cpu.max"), format!("{quota} {period}"))
                    .map_err(|e| fail("cannot set cpu.max", e))?;
                let weight = (millicpu * V2_WEIGHT_PER_CPU / 1000).clamp(1, 10_000);
                std::fs::write(dir.join("cpu.weight"), weight.to_string())
                    .map_err(|e| fail("cannot set cpu.weight", e))?;
                std::fs::write(dir.join("pids.max"), pids_max.to_string())
                    .map_err(|e| fail("cannot set pids.max", e))?;
            }
            Cgroup::V1 { memory, cpu, pids } => {
                std::fs::write(memory.join("memory.limit_in_bytes"), &bytes)
                    .map_err(|e| fail("cannot set memory.limit_in_bytes", e))?;
                // Best effort, as the controller itself is (some hosts refuse CFS quotas). Under contention
                // replicas share their parent's CPU by size, as the limit is: one CPU's weight per CPU.
                if let Some(dir) = cpu {
                    let shares = (millicpu * V1_SHARES_PER_CPU / 1000).clamp(2, 262_144);
                    let _ = std::fs::write(dir.join("cpu.shares"), shares.to_string());
                    let _ = std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())
                        .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()));
                }
                if let Some(dir) = pids {
                    std::fs::write(dir.join("pids.max"), pids_max.to_string())
                        .map_err(|e| fail("cannot set pids.max", e))?;
                }
            }
        }
        Ok(())
    }

    /// The same cgroups under another name (cgroup v1 renames a cgroup in place; v2 cannot, and answers
    /// Err, with the cgroups unchanged).
    pub fn rename(self, name: &str) -> Result<Cgroup, (Cgroup, String)> {
        let moved = |dir: &PathBuf| dir.with_file_name(name);
        let Cgroup::V1 { memory, cpu, pids } = self else {
            return Err((self, "cgroup v2 does not rename cgroups".into()));
        };
        let dirs: Vec<&PathBuf> = std::iter::once(&memory).chain(cpu.iter()).chain(pids.iter()).collect();
        for (k, dir) in dirs.iter().enumerate() {
            if let Err(e) = std::fs::rename(dir, moved(dir)) {
                // Put back what was renamed, so the cgroups keep one name.
                for done in &dirs[..k] {
                    let _ = std::fs::rename(moved(done), done);
                }
                let why = format!("cannot rename {}: {e}", dir.display());
                return Err((
                    Cgroup::V1 { memory: memory.clone(), cpu: cpu.clone(), pids: pids.clone() },
                    why,
                ));
            }
        }
        Ok(Cgroup::V1 {
            memory: moved(&memory),
            cpu: cpu.as_ref().map(moved),
            pids: pids.as_ref().map(moved),
        })
    }

    /// Whether the number of processes is limited.
    pub fn limits_pids(&self) -> bool {
        !matches!(self, Cgroup::V1 { pids: None, .. })
    }

    /// The cgroup's dirs with the name each has under `/sys/fs/cgroup` inside the sandbox.
    pub fn dirs(&self) -> Vec<(PathBuf, String)> {
        match self {
            Cgroup::V2(dir) => vec![(dir.clone(), String::new())],
            Cgroup::V1 { memory, cpu, pids } => std::iter::once((memory.clone(), "memory".to_owned()))
                .chain(cpu.iter().map(|d| (d.clone(), "cpu".to_owned())))
                .chain(pids.iter().map(|d| (d.clone(), "pids".to_owned())))
                .collect(),
        }
    }

    /// Removes the cgroups named `name` wherever [`Cgroup::create`] makes them, when they are empty (a
    /// supervisor that was killed leaves its own behind).
    /// Whatever is still in them is killed first (the attempt is over: nothing of it may outlive it), and the
    /// removal is tried again while the killed processes are reaped, for up to 10 s. Only the unified and the
    /// v1 memory and pids hierarchies are read for processes: on v1 a supervisor stays in its replica's CPU
    /// cgroup (see [`Cgroup::step_out`]), and a pooled one lives on after its replica.
    pub fn remove_named(name: &str) {
        let cg = Path::new(CG);
        let mut dirs = vec![(current("").join("trainyard").join(name), true)];
        for ctl in ["memory", "cpu", "pids"] {
            dirs.push((current(ctl).join("trainyard").join(name), ctl != "cpu"));
        }
        dirs.retain(|(d, _)| d.starts_with(cg) && d.is_dir());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            for (d, kill) in &dirs {
                if let Some(procs) =
                    kill.then(|| std::fs::read_to_string(d.join("cgroup.procs")).ok()).flatten()
                {
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                        signal(pid, SIGKILL);
                    }
                }
                let _ = std::fs::remove_dir(d);
            }
            dirs.retain(|(d, _)| d.is_dir());
            if dirs.is_empty() || std::time::Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Whether the OOM killer killed a process in this cgroup.
    pub fn oom_killed(&self) -> bool {
        let (file, key) = match self {
            Cgroup::V2(dir) => (dir.join("memory.events"), "oom_kill"),
            Cgroup::V1 { memory, .. } => (memory.join("memory.oom_control"), "oom_kill"),
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| {
                // `oom_kill N`, not `oom_kill_disable 0` (cgroup v1 lists both).
                s.lines()
                    .find(|l| l.split_whitespace().next() == Some(key))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .is_some_and(|n| n > 0)
    }

    /// Moves this process (the supervisor) out of the replica's memory and process limits into
    /// `trainyard/supervisors`, so that what the sandbox does never weighs on the supervisor's memory, and the
    /// OOM killer of a replica over its limit finds no supervisor to pick. The sandbox started before stays
    /// (a child's cgroup is its own from its start). On cgroup v1 the CPU controller keeps the supervisor in
    /// the replica's cgroup: its little CPU counts against the replica's share.
    pub fn step_out(&self) -> Result<(), String> {
        let me = std::process::id().to_string();
        let out = |dir: &Path| -> Result<(), String> {
            let to = dir.parent().ok_or("a cgroup without a parent")?.join(SUPERVISORS_CGROUP);
            make_cgroup_dir(&to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
            std::fs::write(to.join("cgroup.procs"), &me)
                .map_err(|e| format!("cannot enter {}: {e}", to.display()))
        };
        match self {
            Cgroup::V2(dir) => out(dir),
            Cgroup::V1 { memory, pids, .. } => {
                out(memory)?;
                pids.as_deref().map_or(Ok(()), out)
            }
        }
    }

    /// Moves this process back into the replica's cgroups (before it starts another sandbox there).
    pub fn step_in(&self) -> Result<(), String> {
        let me = std::process::id().to_string();
        for (dir, _) in self.dirs() {
            std::fs::write(dir.join("cgroup.procs"), &me)
                .map_err(|e| format!("cannot enter {}: {e}", dir.display()))?;
        }
        Ok(())
    }

    /// Leaves the cgroup and removes it (best effort).
    pub fn remove(&self) {
        let me = std::process::id().to_string();
        let dirs: Vec<&PathBuf> = match self {
            Cgroup::V2(dir) => vec![dir],
            Cgroup::V1 { memory, cpu, pids } => {
                std::iter::once(memory).chain(cpu.iter()).chain(pids.iter()).collect()
            }
        };
        for dir in dirs {
            if let Some(root) = dir.parent().and_then(Path::parent) {
                let _ = std::fs::write(root.join("cgroup.procs"), &me);
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}
