//! Replica networks: every replica in a network namespace of its own, with one address on a segment that
//! only the replicas of its attempt share.
//!
//! ```text
//!   switch namespace ty-<attempt>           replica namespaces (no names)
//!   ┌───────────────────────────────┐        ┌──────────────────────────┐
//!   │ sw1 ── sw0 (veth pair)        │  ┌─────┤ eth0 10.213.0.2/16, lo   │  macvlan links on sw0,
//!   │         ├─────────────────────┼──┘     └──────────────────────────┘  in bridge mode
//!   │         └─────────────────────┼──┐     ┌──────────────────────────┐
//!   │                               │  └─────┤ eth0 10.213.0.3/16, lo   │
//!   └───────────────────────────────┘        └──────────────────────────┘
//! ```
//!
//! The segment lives in a namespace of its own, not the host's, and without egress nothing in it has an
//! address or a route: a replica reaches its attempt's other replicas and nothing else (not the host's
//! loopback, not the API, not other tasks, not the machine's network). Since attempts never share a segment,
//! every attempt uses the same range. Inside a replica, ports below 1024 may be bound (sshd listens on 22), as
//! in a container.
//!
//! Each replica's `eth0` is a macvlan link in bridge mode on the switch's `sw0`: the kernel delivers
//! between the links on one lower link directly, and sends the rest down `sw0` to its peer `sw1`, where the
//! switch's own address is when egress is on. A macvlan link rather than a veth pair on a bridge: one link
//! per replica instead of two, no bridge port, and above all no bridge, whose removal holds the kernel's
//! network lock through an RCU barrier (~17 ms, measured) that every replica of every attempt starting
//! meanwhile waits on (`net-bench`).
//!
//! The switch namespace is named (a bind mount under `/run/netns`) from launch until the attempt ends. A
//! replica's namespace never has a name: its supervisor makes it and keeps a file descriptor of it, so the
//! namespace (and its link) goes away by itself with the last process in it, however the supervisor ends.
//!
//! The plumbing: iproute2's `ip` (batched) and `nft` for an attempt's switch, once per attempt; netlink from
//! the supervisor for each replica ([`super::netlink`]), so a gang's start does not wait on programs.
//!
//! **Egress** is off unless the admin turns it on (`trainyard up --sandbox-egress`). Then `sw1` gets the
//! range's first address as the replicas' gateway, and the switch namespace an uplink: a veth pair to the host
//! (`tyu…` on the host side) with a /30 of its own from [`DEFAULT_UPLINKS`]; the switch masquerades the
//! replicas behind its uplink address, and the host (one nftables table per server, `inet trainyard_HASH`
//! named by its data dir, matching the server's uplinks by their interface group: a second server's table
//! never touches them; `egress.rs`, a child module) forwards and masquerades what comes from an uplink, except to this machine itself (its input hook drops everything from
//! an uplink), to another attempt's uplink, and to private, loopback, link-local (cloud metadata), shared and
//! multicast ranges, unless the admin allows a network (`--sandbox-egress-allow CIDR`).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[path = "egress.rs"]
mod egress;
use egress::nft;
pub use egress::*;

/// The replicas' addresses unless the admin picks another range (`trainyard up --sandbox-network`).
pub const DEFAULT_RANGE: &str = "10.213.0.0/16";

/// The switch's end of its segment, the lower link of every replica's `eth0`.
const SEGMENT: &str = "sw0";

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
    pub address: std::net::Ipv4Addr,
    pub prefix: u8,
    /// The default route, when the attempt has egress.
    #[serde(default)]
    pub gateway: Option<std::net::Ipv4Addr>,
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

/// Runs a host-side tool with a fixed, empty environment and `input` on its stdin; Err holds what it said.
fn feed(mut c: Command, input: &str) -> Result<(), String> {
    c.env_clear().stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("cannot run {:?}: {e}", c.get_program()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()) }
}

/// Runs `ip [-n NS] -batch -` with `lines`.
fn ip_batch(ip: &Path, ns: Option<&str>, lines: &str) -> Result<(), String> {
    let mut c = Command::new(ip);
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    c.args(["-batch", "-"]);
    feed(c, lines).map_err(|e| format!("ip {}: {e}", lines.trim().replace('\n', "; ")))
}

/// Makes the attempt's switch namespace with its segment, and its uplink when egress is on (idempotent: an
/// existing one is kept).
pub fn create_switch(ip: &Path, switch: &str, egress: Option<(&Egress, &Uplink)>) -> Result<(), String> {
    if Path::new(NETNS_DIR).join(switch).exists() {
        return Ok(());
    }
    add_switch_namespace(switch)?;
    let made = (|| {
        let Some((egress, up)) = egress else { return Ok(()) };
        ip_batch(
            ip,
            None,
            &format!(
                "link add {host} type veth peer name up0 netns {switch}\nlink set {host} group {g}\naddr add {h}/30 dev {host}\nlink set {host} up\n",
                host = up.host_if,
                g = egress.group,
                h = up.host_addr
            ),
        )?;
        ip_batch(
            ip,
            Some(switch),
            &format!(
                "addr add {s}/30 dev up0\nlink set up0 up\naddr add {g}/{p} dev sw1\nroute add default via {h}\n",
                s = up.switch_addr,
                g = up.gateway,
                p = up.prefix,
                h = up.host_addr
            ),
        )?;
        let fd = open_named(switch)?;
        // The switch routes the replicas out and hides them behind its uplink address.
        sysctl_in(&fd, "/proc/sys/net/ipv4/ip_forward", "1")?;
        nft(
            &egress.nft,
            Some(&fd),
            "table ip trainyard {\n  chain postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    oifname \"up0\" masquerade\n  }\n}\n",
        )
    })();
    made.inspect_err(|_| {
        let _ = ip_batch(ip, None, &format!("netns delete {switch}\n"));
    })
}

/// Makes the named namespace `switch` with its segment (the veth pair `sw0`, `sw1`), up: what `ip netns add`
/// and `ip link add sw0 type veth peer name sw1` do, without starting them (a gang's start waits for it). As
/// iproute2 has it, the names' dir is a mount point with shared propagation, so a name made here is seen from
/// every mount namespace, and a name is a file with the namespace bind-mounted on it, made from a thread that
/// made the namespace its own.
fn add_switch_namespace(switch: &str) -> Result<(), String> {
    use rustix::mount::{
        MountPropagationFlags, UnmountFlags, mount_bind, mount_bind_recursive, mount_change,
    };
    let dir = Path::new(NETNS_DIR);
    let step = |what: &str, e: std::io::Error| format!("{what}: {e}");
    std::fs::create_dir_all(dir).map_err(|e| step("cannot make the namespaces' dir", e))?;
    let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
    if mount_change(dir, shared).is_err() {
        // Not a mount point yet: bound onto itself first.
        mount_bind_recursive(dir, dir)
            .map_err(|e| step("cannot make the namespaces' dir a mount", e.into()))?;
        mount_change(dir, shared).map_err(|e| step("cannot share the namespaces' dir", e.into()))?;
    }
    let path = dir.join(switch);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(&path)
        .map_err(|e| step(&format!("cannot name the namespace {switch}"), e))?;
    let made = std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            // As in `create_replica`: a network namespace of this thread's own is sound.
            #[allow(deprecated)]
            rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNET)
                .map_err(|e| step("cannot make a network namespace", e.into()))?;
            mount_bind("/proc/thread-self/ns/net", &path)
                .map_err(|e| step(&format!("cannot name the namespace {switch}"), e.into()))?;
            no_ipv6_on_new_links(true);
            let mut nl = super::netlink::Netlink::open().map_err(|e| step("netlink", e))?;
            nl.veth_pair(SEGMENT, "sw1").map_err(|e| step("cannot make the segment", e))
        })
        .join()
        .unwrap_or_else(|_| Err("the switch setup thread panicked".into()))
    });
    made.inspect_err(|_| {
        let _ = rustix::mount::unmount(&path, UnmountFlags::DETACH);
        let _ = std::fs::remove_file(&path);
    })
}

fn open_named(name: &str) -> Result<OwnedFd, String> {
    rustix::fs::open(
        Path::new(NETNS_DIR).join(name),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("cannot open the network namespace {name}: {e}"))
}

/// Removes the attempt's switch namespace (and with it the segment, every replica's link on it, and the
/// uplink).
pub fn delete_switch(ip: &Path, switch: &str) {
    let path = Path::new(NETNS_DIR).join(switch);
    if !path.exists() {
        return;
    }
    // What `ip netns delete` does, without starting it: the name's bind mount goes, then the name (the
    // namespace itself goes with its last user).
    match rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => {
            let _ = std::fs::remove_file(&path);
        }
        Err(_) => {
            let _ = ip_batch(ip, None, &format!("netns delete {switch}\n"));
        }
    }
}

/// Makes the replica's namespace, wires it to the attempt's segment, and returns a file descriptor of it (it
/// has no name: the descriptor and the processes in it keep it alive). Done with netlink from one thread: it
/// makes the namespace its own, opens a netlink socket there, enters the switch's and opens another, makes the
/// link from there and sets it up from inside.
pub fn create_replica(net: &ReplicaNet) -> Result<OwnedFd, String> {
    use super::netlink::{LOOPBACK_INDEX, Netlink};
    let switch = open_named(&net.switch)?;
    let wire = || -> Result<OwnedFd, String> {
        let step = |what: &str, e: std::io::Error| format!("{what}: {e}");
        // Only CLONE_FILES and CLONE_FS make unshare unsound (they change what other threads' descriptors and
        // paths mean); a network namespace of this thread's own does not.
        #[allow(deprecated)]
        rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNET)
            .map_err(|e| step("cannot make a network namespace", e.into()))?;
        let ns = rustix::fs::open(
            "/proc/thread-self/ns/net",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| step("cannot open the new namespace", e.into()))?;
        // Ports below 1024 may be bound, as in a container (sshd listens on 22).
        std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
            .map_err(|e| step("cannot allow low ports", e))?;
        no_ipv6_on_new_links(false);
        let mut inside = Netlink::open().map_err(|e| step("netlink", e))?;
        enter(&switch)?;
        let mut sw = Netlink::open().map_err(|e| step("netlink", e))?;
        let segment = sw.index(SEGMENT).map_err(|e| step("the attempt's segment", e))?;
        sw.macvlan("eth0", segment, &ns).map_err(|e| {
            // An unknown link kind: the kernel was built without macvlan.
            let hint = if e.kind() == std::io::ErrorKind::Unsupported {
                " (this kernel has no macvlan links)"
            } else {
                ""
            };
            format!("cannot make the replica's link: {e}{hint}")
        })?;
        inside.up(LOOPBACK_INDEX).map_err(|e| step("lo", e))?;
        let eth = inside.index("eth0").map_err(|e| step("eth0", e))?;
        inside.address(eth, net.address, net.prefix).map_err(|e| step("eth0's address", e))?;
        inside.up(eth).map_err(|e| step("eth0", e))?;
        if let Some(gateway) = net.gateway {
            inside.default_route(gateway).map_err(|e| step("the default route", e))?;
        }
        Ok(ns)
    };
    std::thread::scope(|s| {
        s.spawn(wire).join().unwrap_or_else(|_| Err("the network setup thread panicked".into()))
    })
}

/// Turns IPv6 off for the links made from now on in this thread's network namespace (and with `all`, for
/// those it has: the switch's loopback). Replicas talk over IPv4 (the hosts file, `MASTER_ADDR`) and egress
/// drops IPv6; a link with IPv6 on has the kernel run address configuration for it when it comes up
/// (duplicate address detection, router and multicast listener messages), work that takes the kernel's
/// network lock, which a gang's other replicas wait on to make their links. A replica's loopback keeps `::1`
/// (it exists before this), so programs that listen on `::` or `::1` still do. Without IPv6 in the kernel
/// there is nothing to turn off.
fn no_ipv6_on_new_links(all: bool) {
    let confs: &[&str] = if all { &["default", "all"] } else { &["default"] };
    for c in confs {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{c}/disable_ipv6"), "1");
    }
}

/// Writes a per-namespace setting from a thread that enters the namespace (`/proc/sys/net` shows the
/// namespace of the reader).
fn sysctl_in(ns: &OwnedFd, path: &str, value: &str) -> Result<(), String> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            enter(ns).map_err(|e| format!("cannot enter the namespace: {e}"))?;
            std::fs::write(path, value).map_err(|e| format!("cannot set {path}: {e}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the namespace setup thread panicked".to_owned()))
    })
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
    use super::egress::{connected_networks, uplink_routes};
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
    #[cfg(target_endian = "little")]
    fn connected_networks_from_the_routing_table() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     tyu0123456789ab\t000012C6\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n";
        assert_eq!(connected_networks(table), vec!["192.0.2.0/24".to_owned()]);
        // The uplinks' own networks are read apart: 198.18.0.0/30 on the uplink.
        assert_eq!(uplink_routes(table), vec![("tyu0123456789ab".to_owned(), 0xC612_0000)]);
    }

    #[test]
    fn each_server_has_its_own_table_and_link_group() {
        let (a, b) = (Path::new("/var/lib/trainyard"), Path::new("/srv/trainyard"));
        assert_ne!(table_name(a), table_name(b));
        assert_ne!(link_group(a), link_group(b));
        assert_eq!(link_group(a), link_group(a), "the same at every start");
        assert!(link_group(a) > 0 && link_group(a) <= i32::MAX as u32, "a group iproute2 takes");
    }

    #[test]
    fn attempt_names_fit_the_kernel_limits() {
        let n = attempt_name("01J9ZK3Q4T5V6W7X8Y9Z0ABCDE", 12);
        assert_eq!(n.len(), 15);
        assert_ne!(n, attempt_name("01J9ZK3Q4T5V6W7X8Y9Z0ABCDE", 13));
    }
}
