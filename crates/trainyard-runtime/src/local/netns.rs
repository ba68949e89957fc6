//! Replica networks: every replica in a network namespace of its own, with one address on a bridge that only
//! the replicas of its attempt share.
//!
//! ```text
//!   switch namespace ty-<attempt>           replica namespaces ty-<attempt>-<i>
//!   ┌──────────────────────────────┐        ┌──────────────────────────┐
//!   │ br0 ── v0 ───────────────────┼────────┤ eth0 10.213.0.2/16, lo   │
//!   │    └── v1 ───────────────────┼────────┤ eth0 10.213.0.3/16, lo   │
//!   └──────────────────────────────┘        └──────────────────────────┘
//! ```
//!
//! The bridge lives in a namespace of its own, not the host's, and nothing in it has an address or a route:
//! a replica reaches its attempt's other replicas and nothing else (not the host's loopback, not the API,
//! not other tasks, not the machine's network). Since attempts never share a segment, every attempt uses the
//! same range. Inside a replica, ports below 1024 may be bound (sshd listens on 22), as in a container.
//!
//! The switch namespace is named (a bind mount under `/run/netns`) from launch until the attempt ends. A
//! replica's namespace is named only while its supervisor sets it up: the supervisor keeps a file descriptor
//! of it and removes the name, so the namespace (and its veth pair) goes away by itself with the last process
//! in it, however the supervisor ends.
//!
//! The plumbing is iproute2's `ip` (a few batched calls per replica).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The replicas' addresses unless the admin picks another range (`trainyard up --sandbox-network`).
pub const DEFAULT_RANGE: &str = "10.213.0.0/16";

/// Where iproute2 keeps named network namespaces.
const NETNS_DIR: &str = "/run/netns";

/// An IPv4 range, `a.b.c.d/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub base: u32,
    pub prefix: u8,
}

impl Range {
    pub fn parse(text: &str) -> Result<Range, String> {
        let bad = || format!("{text:?} is not an IPv4 range like {DEFAULT_RANGE}");
        let (addr, len) = text.split_once('/').ok_or_else(bad)?;
        let ip: std::net::Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        if !(8..=24).contains(&prefix) {
            return Err(format!(
                "{text:?}: the prefix must be between /8 and /24, to hold a gang's replicas"
            ));
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(Range { base: u32::from(ip) & mask, prefix })
    }

    /// How many replicas one attempt may have in this range (`.0`, `.1` and the broadcast address unused).
    pub fn capacity(&self) -> u32 {
        (1u32 << (32 - self.prefix)) - 3
    }

    /// The address of replica `index`, or None past the range's end.
    pub fn address(&self, index: usize) -> Option<std::net::Ipv4Addr> {
        let i = u32::try_from(index).ok()?;
        (i < self.capacity()).then(|| std::net::Ipv4Addr::from(self.base + 2 + i))
    }
}

impl Default for Range {
    fn default() -> Range {
        Range::parse(DEFAULT_RANGE).expect("the default range parses")
    }
}

/// One replica's place on its attempt's network, as the supervisor sets it up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaNet {
    /// The attempt's switch namespace.
    pub switch: String,
    /// The replica's namespace while it is set up.
    pub name: String,
    /// The replica's index: its port on the bridge is `v<index>`.
    pub index: usize,
    pub address: std::net::Ipv4Addr,
    pub prefix: u8,
}

/// A short, stable name for an attempt's namespaces (interface and namespace names are short).
pub fn attempt_name(task_id: &str, attempt: i64) -> String {
    let h = format!("{task_id}/{attempt}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("ty-{:012x}", h & 0xffff_ffff_ffff)
}

/// `ip` on the PATH, or what to install.
pub fn find_ip() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join("ip"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "iproute2 (ip) is not installed; the local backend gives every replica a network namespace with \
             it. Install it with `apt-get install iproute2`"
                .to_owned()
        })
}

/// Runs `ip [-n NS] -batch -` with `lines`.
fn ip_batch(ip: &Path, ns: Option<&str>, lines: &str) -> Result<(), String> {
    let mut c = Command::new(ip);
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    c.args(["-batch", "-"]).env_clear().stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("cannot run {}: {e}", ip.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(lines.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            lines.trim().replace('\n', "; "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Makes the attempt's switch namespace with its bridge (idempotent: an existing one is kept).
pub fn create_switch(ip: &Path, switch: &str) -> Result<(), String> {
    if Path::new(NETNS_DIR).join(switch).exists() {
        return Ok(());
    }
    ip_batch(ip, None, &format!("netns add {switch}\n"))?;
    ip_batch(ip, Some(switch), "link add br0 type bridge\nlink set br0 up\n").inspect_err(|_| {
        let _ = ip_batch(ip, None, &format!("netns delete {switch}\n"));
    })
}

/// Removes the attempt's switch namespace (and with it the bridge and the host ends of every veth pair).
pub fn delete_switch(ip: &Path, switch: &str) {
    if Path::new(NETNS_DIR).join(switch).exists() {
        let _ = ip_batch(ip, None, &format!("netns delete {switch}\n"));
    }
}

/// Makes the replica's namespace, wires it to the bridge, and returns a file descriptor of it (its name is
/// removed again: the descriptor and the processes in it keep it alive).
pub fn create_replica(ip: &Path, net: &ReplicaNet) -> Result<OwnedFd, String> {
    let name = &net.name;
    if Path::new(NETNS_DIR).join(name).exists() {
        let _ = ip_batch(ip, None, &format!("netns delete {name}\n"));
    }
    ip_batch(ip, None, &format!("netns add {name}\n"))?;
    let result = (|| {
        let port = format!("v{}", net.index);
        ip_batch(
            ip,
            Some(&net.switch),
            &format!(
                "link add {port} type veth peer name eth0 netns {name}\nlink set {port} master br0 up\n"
            ),
        )?;
        ip_batch(
            ip,
            Some(name),
            &format!("link set lo up\naddr add {}/{} dev eth0\nlink set eth0 up\n", net.address, net.prefix),
        )?;
        let fd = rustix::fs::open(
            Path::new(NETNS_DIR).join(name),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open the network namespace {name}: {e}"))?;
        allow_low_ports(&fd)?;
        Ok(fd)
    })();
    let _ = ip_batch(ip, None, &format!("netns delete {name}\n"));
    result
}

/// Lets unprivileged processes in the namespace bind ports below 1024 (a per-namespace setting, written from
/// a thread that enters it: `/proc/sys/net` shows the namespace of the reader).
fn allow_low_ports(ns: &OwnedFd) -> Result<(), String> {
    let fd = ns.try_clone().map_err(|e| e.to_string())?;
    std::thread::spawn(move || -> Result<(), String> {
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&fd),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| format!("cannot enter the replica's network namespace: {e}"))?;
        std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
            .map_err(|e| format!("cannot allow low ports in the replica's network namespace: {e}"))
    })
    .join()
    .map_err(|_| "the namespace setup thread panicked".to_owned())?
}

/// Enters a network namespace on this thread only (the metrics monitor reads the replica's own loopback).
pub fn enter(ns: &OwnedFd) -> Result<(), String> {
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(ns),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = Range::parse("10.213.7.9/16").unwrap();
        assert_eq!(r.address(0), Some("10.213.0.2".parse().unwrap()));
        assert_eq!(r.address(300), Some("10.213.1.46".parse().unwrap()));
        assert_eq!(r.capacity(), 65_533);
        assert_eq!(Range::parse("192.168.5.0/24").unwrap().address(253), None);
        assert!(Range::parse("10.0.0.0/30").unwrap_err().contains("prefix"));
        assert!(Range::parse("10.0.0/16").is_err());
        assert!(Range::parse("nonsense").is_err());
    }

    #[test]
    fn attempt_names_fit_the_kernel_limits() {
        let n = attempt_name("01J9ZK3Q4T5V6W7X8Y9Z0ABCDE", 12);
        assert_eq!(n.len(), 15);
        assert_ne!(n, attempt_name("01J9ZK3Q4T5V6W7X8Y9Z0ABCDE", 13));
    }
}
