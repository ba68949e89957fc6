//! Egress, when the admin turns it on: the attempts' uplinks and this server's host nftables table (one per
//! server, named by its data dir, matching the server's own uplinks by their interface group), installed at
//! start and removed at stop. A child module of `netns`.

use super::*;

/// Where attempts' uplinks take their /30s when egress is on (a benchmarking range, RFC 2544: never on a
/// real network).
pub const DEFAULT_UPLINKS: &str = "198.18.0.0/16";

/// Destinations a replica never reaches through egress unless the admin allows them: this-network,
/// private, shared (CGNAT), loopback, link-local (cloud metadata services), benchmarking (the uplinks
/// themselves), multicast and reserved ranges.
const EGRESS_BLOCKED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
];

/// Egress, as the admin set it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// Where uplinks take their /30s.
    pub uplinks: Range,
    /// Networks replicas may reach although [`EGRESS_BLOCKED`] lists them.
    pub allow: Vec<Range>,
    /// nftables' `nft`.
    pub nft: PathBuf,
    /// This server's host table ([`table_name`]).
    pub table: String,
    /// The interface group of this server's uplinks ([`link_group`]): its table matches them by it, never
    /// another server's (the `tyu` prefix is every server's).
    #[serde(default)]
    pub group: u32,
}

/// The host nftables table of the server whose data dir is `data_dir`: `trainyard_` and 8 hex digits of a
/// hash of the dir's path (FNV-1a), the same at every start.
pub fn table_name(data_dir: &Path) -> String {
    format!("trainyard_{:08x}", dir_hash(data_dir))
}

/// The interface group of the uplinks of the server whose data dir is `data_dir`: the same hash as its
/// table's name, in 31 bits (iproute2 reads a group as a signed number), never 0 (every interface's default).
pub fn link_group(data_dir: &Path) -> u32 {
    (dir_hash(data_dir) & 0x7fff_ffff).max(1)
}

/// FNV-1a of a path.
fn dir_hash(data_dir: &Path) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data_dir.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The table every server shared before each had its own: removed when a server installs its own.
const LEGACY_TABLE: &str = "trainyard";

/// One attempt's way out: its uplink and the replicas' gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uplink {
    /// The host side's name.
    pub host_if: String,
    pub host_addr: std::net::Ipv4Addr,
    pub switch_addr: std::net::Ipv4Addr,
    /// The switch's address on the segment (`sw1`'s): the replicas' default route.
    pub gateway: std::net::Ipv4Addr,
    pub prefix: u8,
}

impl Uplink {
    /// The uplink of the attempt in `slot` (the uid slot: no two live attempts share one), or None when the
    /// uplink range is full.
    pub fn for_slot(egress: &Egress, range: &Range, switch: &str, slot: u32) -> Option<Uplink> {
        let blocks = (1u32 << (32 - egress.uplinks.prefix)) / 4;
        (slot < blocks).then(|| {
            let block = egress.uplinks.base + 4 * slot;
            Uplink {
                host_if: format!("tyu{}", switch.trim_start_matches("ty-")),
                host_addr: std::net::Ipv4Addr::from(block + 1),
                switch_addr: std::net::Ipv4Addr::from(block + 2),
                gateway: std::net::Ipv4Addr::from(range.base + 1),
                prefix: range.prefix,
            }
        })
    }
}

impl Range {
    fn cidr(&self) -> String {
        format!("{}/{}", std::net::Ipv4Addr::from(self.base), self.prefix)
    }
}

/// `nft` on the PATH, or what to install.
pub fn find_nft() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("nft"))
        .find(|p| p.is_file())
        .ok_or_else(|| "egress needs nftables (nft): apt-get install nftables".to_owned())
}

/// Runs `nft -f -` with `rules`, in the namespace `ns` when given (a thread enters it; the child starts there).
pub(super) fn nft(nft: &Path, ns: Option<&OwnedFd>, rules: &str) -> Result<(), String> {
    let run = || -> Result<(), String> {
        if let Some(ns) = ns {
            enter(ns)?;
        }
        let mut c = Command::new(nft);
        c.args(["-f", "-"]);
        feed(c, rules).map_err(|e| format!("nft: {e}"))
    };
    std::thread::scope(|s| s.spawn(run).join().unwrap_or_else(|_| Err("the nft thread panicked".into())))
}

/// The host's part of egress, replaced atomically (one nftables transaction): forwarding on, and this
/// server's table that keeps uplinks off this machine and off the blocked ranges. Answers whether forwarding
/// was off before (so that the last server to stop may turn it off again).
pub fn install_host_rules(egress: &Egress) -> Result<bool, String> {
    let allowed: Vec<String> = egress.allow.iter().map(Range::cidr).collect();
    let allow_rule = if allowed.is_empty() {
        String::new()
    } else {
        format!("    iifgroup {group} ip daddr {{ {} }} accept\n", allowed.join(", "), group = egress.group)
    };
    // Matched by this server's interface group: another server's uplinks are its own table's. Forwarding
    // from this server's uplinks to any uplink (this server's or another's) is refused.
    let rules = format!(
        "table inet {LEGACY_TABLE} {{}}\n\
         delete table inet {LEGACY_TABLE}\n\
         table inet {table} {{}}\n\
         delete table inet {table}\n\
         table inet {table} {{\n\
         \x20 chain input {{\n    type filter hook input priority -10; policy accept;\n    iifgroup {group} drop\n  }}\n\
         \x20 chain forward {{\n    type filter hook forward priority -10; policy accept;\n\
         \x20   iifgroup {group} oifname \"tyu*\" drop\n{allow_rule}\
         \x20   iifgroup {group} ip daddr {{ {blocked} }} drop\n\
         \x20   iifgroup {group} meta nfproto ipv6 drop\n\
         \x20   oifgroup {group} ct state established,related accept\n\
         \x20   oifgroup {group} drop\n  }}\n\
         \x20 chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n\
         \x20   ip saddr {uplinks} oifname != \"tyu*\" masquerade\n  }}\n}}\n",
        blocked = EGRESS_BLOCKED
            .iter()
            .map(|b| b.to_string())
            .chain(local_networks())
            .collect::<Vec<_>>()
            .join(", "),
        uplinks = egress.uplinks.cidr(),
        table = egress.table,
        group = egress.group,
    );
    nft(&egress.nft, None, &rules)?;
    let was_off = std::fs::read_to_string(FORWARDING).is_ok_and(|v| v.trim() == "0");
    std::fs::write(FORWARDING, "1").map_err(|e| format!("cannot turn forwarding on: {e}"))?;
    Ok(was_off)
}

const FORWARDING: &str = "/proc/sys/net/ipv4/ip_forward";

/// Removes this server's host table, and turns forwarding off again when it was off before this server
/// turned it on and no other server's table is left. Called at stop only when no attempt of this server
/// with an uplink still runs (its replicas outlive the server, and the table is what keeps them off this
/// machine).
pub fn remove_host_rules(egress: &Egress, forwarding_was_off: bool) -> Result<(), String> {
    nft(&egress.nft, None, &format!("table inet {t} {{}}\ndelete table inet {t}\n", t = egress.table))?;
    let out = Command::new(&egress.nft)
        .args(["list", "tables"])
        .output()
        .map_err(|e| format!("nft list tables: {e}"))?;
    let others =
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim().starts_with("table inet trainyard"));
    if forwarding_was_off && !others {
        std::fs::write(FORWARDING, "0").map_err(|e| format!("cannot turn forwarding off: {e}"))?;
    }
    Ok(())
}

/// Another server's uplinks in this server's uplink range, if any: an interface of another group (another
/// server's, see [`link_group`]) with a network inside `egress.uplinks`. Two servers taking /30s from one range
/// would give two uplinks one address, and one of them would lose its way out.
pub fn uplinks_of_others(egress: &Egress) -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let group_of = |iface: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/netdev_group"))
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    uplink_routes(&routes).into_iter().find_map(|(iface, net)| {
        let (base, prefix) = (egress.uplinks.base, u32::from(egress.uplinks.prefix));
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        (net & mask == base & mask && group_of(&iface).is_some_and(|g| g != egress.group)).then_some(iface)
    })
}

/// The uplinks' connected networks in a routing table (`/proc/net/route`): (interface, network).
pub(super) fn uplink_routes(text: &str) -> Vec<(String, u32)> {
    let hex = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::from_be);
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let iface = f.first().filter(|i| i.starts_with("tyu"))?;
            Some(((*iface).to_owned(), hex(f.get(1)?)?))
        })
        .collect()
}

/// The IPv4 networks this machine is directly on (its LAN: other machines there are not the internet), from
/// the kernel's routing table.
fn local_networks() -> Vec<String> {
    connected_networks(&std::fs::read_to_string("/proc/net/route").unwrap_or_default())
}

pub(super) fn connected_networks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Iface Destination Gateway Flags ... Mask: a route without a gateway is a connected network.
        let (Some(dest), Some(gw), Some(mask)) = (f.get(1), f.get(2), f.get(7)) else { continue };
        // The kernel prints each address's network-order bytes read as a native word.
        let hex = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::from_be);
        let (Some(dest), Some(gw), Some(mask)) = (hex(dest), hex(gw), hex(mask)) else { continue };
        if gw != 0 || mask == 0 || f.first().is_some_and(|i| i.starts_with("tyu")) {
            continue;
        }
        out.push(format!("{}/{}", std::net::Ipv4Addr::from(dest & mask), mask.count_ones()));
    }
    out
}
