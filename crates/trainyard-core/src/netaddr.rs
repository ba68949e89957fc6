//! Which addresses the server must not reach on a member's behalf (an alarm webhook, a registry host the
//! catalog does not list) unless an admin allows them: this machine, its networks and the cloud's metadata
//! service, however the address is written.

use std::net::{IpAddr, Ipv4Addr};

/// A network in CIDR notation (`10.1.0.0/16`, `fd00::/8`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix_len: u8,
}

impl Net {
    /// Parses `ADDR/LEN` or a single address.
    pub fn parse(s: &str) -> Result<Net, String> {
        let (addr, len) = s.trim().split_once('/').map_or((s.trim(), None), |(a, l)| (a, Some(l)));
        let addr: IpAddr =
            addr.parse().map_err(|_| format!("{s:?} is not an address or ADDR/LEN network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be a number from 0 to {max}"))?,
        };
        Ok(Net { addr, prefix_len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix_len)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// The IPv4 address an IPv6 address stands for, when it stands for one: IPv4-mapped (`::ffff:a.b.c.d`),
/// NAT64 (`64:ff9b::a.b.c.d` and the local-use `64:ff9b:1::/48`, which a NAT64 gateway translates to that IPv4
/// address) and 6to4 (`2002:AABB:CCDD::/48`, which a 6to4 relay delivers to `AA.BB.CC.DD`).
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let o = v6.octets();
    let low32 = || IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return low32();
    }
    if s[0] == 0x2002 {
        return IpAddr::V4(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    ip
}

/// Why an address is not reached on a member's behalf by default (the kind of address, in words), or None
/// for a public one. Loopback, link-local (cloud metadata services), private and carrier-grade NAT,
/// unspecified, broadcast, multicast, the benchmarking range (the sandboxes' uplinks live there), and
/// IPv6's unique-local and site-local ranges; an IPv6 address that stands for an IPv4 one is judged as it.
pub fn restricted(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_link_local() {
                Some("link-local")
            } else if a.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
                // 10/8, 172.16/12, 192.168/16, and the carrier-grade NAT range 100.64/10.
                Some("private")
            } else if a.is_unspecified() || o[0] == 0 || a.is_broadcast() {
                Some("unspecified")
            } else if a.is_multicast() {
                Some("multicast")
            } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
                // 198.18/15: where the sandboxes' uplinks take their addresses.
                Some("benchmarking (sandbox uplink)")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let first = a.segments()[0];
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if a.is_multicast() {
                Some("multicast")
            } else if first & 0xffc0 == 0xfe80 || first & 0xffc0 == 0xfec0 {
                Some("link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private")
            } else {
                None
            }
        }
    }
}

/// This machine's own addresses, from the kernel's tables as Linux shows them in `/proc/net/fib_trie`
/// (IPv4: the entries marked `/32 host LOCAL`) and `/proc/net/if_inet6` (IPv6: 32 hex digits first on each
/// line). A webhook or registry at one of them is this machine, whatever range it is in.
pub fn own_addresses(fib_trie: &str, if_inet6: &str) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim_start_matches([' ', '|', '-', '+', '`']);
        if let Ok(a) = t.trim().parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.trim() == "/32 host LOCAL"
            && let Some(a) = last
        {
            out.push(IpAddr::V4(a));
        }
    }
    for line in if_inet6.lines() {
        let Some(hex) = line.split_whitespace().next().filter(|h| h.len() == 32) else { continue };
        if let Ok(n) = u128::from_str_radix(hex, 16) {
            out.push(IpAddr::V6(std::net::Ipv6Addr::from(n)));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_that_stand_for_internal_ipv4_ones_are_internal() {
        for (a, what) in [
            ("127.0.0.1", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("10.1.2.3", Some("private")),
            ("100.64.0.1", Some("private")),
            ("198.18.0.1", Some("benchmarking (sandbox uplink)")),
            ("198.19.255.1", Some("benchmarking (sandbox uplink)")),
            ("::ffff:127.0.0.1", Some("loopback")),
            // NAT64: the well-known prefix and the local-use one.
            ("64:ff9b::7f00:1", Some("loopback")),
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("64:ff9b:1::a00:1", Some("private")),
            // 6to4: 2002:7f00:0001::/48 is 127.0.0.1's.
            ("2002:7f00:1::1", Some("loopback")),
            ("2002:a9fe:a9fe::", Some("link-local")),
            ("fd00::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("::1", Some("loopback")),
            // Public ones, however written.
            ("93.184.216.34", None),
            ("64:ff9b::5db8:d822", None),
            ("2002:5db8:d822::1", None),
            ("2606:4700::1111", None),
            ("198.20.0.1", None),
        ] {
            assert_eq!(restricted(ip(a)), what, "{a}");
        }
    }

    #[test]
    fn own_addresses_from_the_kernels_tables() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 10.0.0.0/24 2 0 2\n        |-- 10.0.0.5\n           /32 host LOCAL\n        |-- 10.0.0.255\n           /32 link BROADCAST\n     |-- 127.0.0.1\n        /32 host LOCAL\nLocal:\n     |-- 10.0.0.5\n        /32 host LOCAL\n";
        let v6 = "00000000000000000000000000000001 01 80 10 80       lo\nfe800000000000000000000000000001 02 40 20 80     eth0\n";
        assert_eq!(own_addresses(fib, v6), [ip("10.0.0.5"), ip("127.0.0.1"), ip("::1"), ip("fe80::1")]);
    }
}
