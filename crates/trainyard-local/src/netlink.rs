//! Just enough rtnetlink to wire a replica's network namespace from the supervisor, without starting a
//! program per step: make the switch's veth pair, make a macvlan link on it in a replica's namespace, give
//! that link an address, bring links up, add a default route. Each request asks for an acknowledgement; the
//! kernel's error comes back as an `io::Error`.
//!
//! A netlink socket belongs to the network namespace of the thread that opened it, so a thread that entered
//! a namespace opens the socket for it and the socket keeps working there whatever the thread does next.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_NUM_TX_QUEUES: u16 = 31;
const IFLA_NUM_RX_QUEUES: u16 = 32;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFLA_MACVLAN_MODE: u16 = 1;
const MACVLAN_MODE_BRIDGE: u32 = 4;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const NLA_F_NESTED: u16 = 0x8000;

const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const IFF_UP: u32 = 0x1;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;

/// The loopback device's index in every network namespace.
pub const LOOPBACK_INDEX: i32 = 1;

/// A message being built: the header's length is filled in by [`Msg::finish`].
struct Msg(Vec<u8>);

impl Msg {
    fn new(ty: u16, flags: u16, seq: u32) -> Msg {
        let mut b = Vec::with_capacity(256);
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        Msg(b)
    }

    /// `struct ifinfomsg`.
    fn ifinfo(&mut self, index: i32, flags: u32, change: u32) -> &mut Msg {
        self.0.extend_from_slice(&[AF_UNSPEC, 0, 0, 0]);
        self.0.extend_from_slice(&index.to_ne_bytes());
        self.0.extend_from_slice(&flags.to_ne_bytes());
        self.0.extend_from_slice(&change.to_ne_bytes());
        self
    }

    fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Msg {
        let len = 4 + data.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.pad();
        self
    }

    fn name(&mut self, ty: u16, name: &str) -> &mut Msg {
        let mut z = name.as_bytes().to_vec();
        z.push(0);
        self.attr(ty, &z)
    }

    /// One transmit and one receive queue. Without it a veth gets one per possible CPU and the kernel cuts
    /// them back to one once the link is registered, waiting out an RCU grace period twice while it holds
    /// the network lock that every other replica's set-up waits on.
    fn one_queue(&mut self) -> &mut Msg {
        self.attr(IFLA_NUM_TX_QUEUES, &1u32.to_ne_bytes()).attr(IFLA_NUM_RX_QUEUES, &1u32.to_ne_bytes())
    }

    /// Opens a nested attribute; returns where its length goes.
    fn nest(&mut self, ty: u16) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(&0u16.to_ne_bytes());
        self.0.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

/// A route netlink socket in the calling thread's network namespace.
#[derive(Debug)]
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Netlink {
    pub fn open() -> io::Result<Netlink> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        // Protocol 0 of the netlink family is NETLINK_ROUTE.
        let fd =
            rustix::net::socket_with(AddressFamily::NETLINK, SocketType::RAW, SocketFlags::CLOEXEC, None)?;
        Ok(Netlink { fd, seq: 0 })
    }

    /// Sends one request and reads the answers up to its acknowledgement; returns the payloads of any
    /// messages that came before it (a GET's answer).
    fn call(&mut self, build: impl FnOnce(u32) -> Vec<u8>) -> io::Result<Vec<Vec<u8>>> {
        self.seq += 1;
        let seq = self.seq;
        let msg = build(seq);
        rustix::net::send(&self.fd, &msg, rustix::net::SendFlags::empty())?;
        let mut data = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let (n, _) = rustix::net::recv(&self.fd, &mut buf[..], rustix::net::RecvFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let len = u32_at(&buf, at) as usize;
                let (ty, mseq) = (u16_at(&buf, at + 4), u32_at(&buf, at + 8));
                if len < 16 || at + len > n {
                    return Err(io::Error::other("a truncated netlink answer"));
                }
                if mseq == seq {
                    match ty {
                        NLMSG_ERROR => {
                            let code =
                                i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap_or_default());
                            return if code == 0 {
                                Ok(data)
                            } else {
                                Err(io::Error::from_raw_os_error(-code))
                            };
                        }
                        NLMSG_DONE => return Ok(data),
                        _ => data.push(buf[at + 16..at + len].to_vec()),
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// The index of the link called `name`.
    pub fn index(&mut self, name: &str) -> io::Result<i32> {
        let answers = self.call(|seq| {
            let mut m = Msg::new(RTM_GETLINK, 0, seq);
            m.ifinfo(0, 0, 0).name(IFLA_IFNAME, name);
            m.finish()
        })?;
        let info =
            answers.first().filter(|a| a.len() >= 16).ok_or_else(|| io::Error::other("no such link"))?;
        Ok(i32::from_ne_bytes(info[4..8].try_into().unwrap_or_default()))
    }

    /// Brings a link up.
    pub fn up(&mut self, index: i32) -> io::Result<()> {
        self.call(|seq| {
            let mut m = Msg::new(RTM_NEWLINK, 0, seq);
            m.ifinfo(index, IFF_UP, IFF_UP);
            m.finish()
        })
        .map(drop)
    }

    /// Makes a veth pair, both ends here and up: the switch's segment (see [`super::netns`]).
    pub fn veth_pair(&mut self, name: &str, peer: &str) -> io::Result<()> {
        self.call(|seq| {
            let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, seq);
            m.ifinfo(0, IFF_UP, IFF_UP).name(IFLA_IFNAME, name).one_queue();
            let info = m.nest(IFLA_LINKINFO);
            m.name(IFLA_INFO_KIND, "veth");
            let data = m.nest(IFLA_INFO_DATA);
            let p = m.nest(VETH_INFO_PEER);
            // Up once both ends exist (the peer is made first, and a veth without its peer cannot open).
            m.ifinfo(0, 0, 0).name(IFLA_IFNAME, peer).one_queue();
            m.end(p);
            m.end(data);
            m.end(info);
            m.finish()
        })?;
        let peer = self.index(peer)?;
        self.up(peer)
    }

    /// Makes a macvlan link in bridge mode on `lower` (a link here), called `name` in the namespace
    /// `peer_ns`: it reaches every other macvlan link on `lower` directly, and the rest through `lower`.
    pub fn macvlan(&mut self, name: &str, lower: i32, peer_ns: &impl AsFd) -> io::Result<()> {
        let ns = peer_ns.as_fd().as_raw_fd() as u32;
        self.call(|seq| {
            let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, seq);
            m.ifinfo(0, 0, 0)
                .name(IFLA_IFNAME, name)
                .attr(IFLA_LINK, &lower.to_ne_bytes())
                .attr(IFLA_NET_NS_FD, &ns.to_ne_bytes());
            let info = m.nest(IFLA_LINKINFO);
            m.name(IFLA_INFO_KIND, "macvlan");
            let data = m.nest(IFLA_INFO_DATA);
            m.attr(IFLA_MACVLAN_MODE, &MACVLAN_MODE_BRIDGE.to_ne_bytes());
            m.end(data);
            m.end(info);
            m.finish()
        })
        .map(drop)
    }

    /// Gives a link an IPv4 address.
    pub fn address(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        self.call(|seq| {
            let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, seq);
            m.0.extend_from_slice(&[AF_INET, prefix, 0, RT_SCOPE_UNIVERSE]);
            m.0.extend_from_slice(&(index as u32).to_ne_bytes());
            m.attr(IFA_LOCAL, &addr.octets()).attr(IFA_ADDRESS, &addr.octets());
            m.finish()
        })
        .map(drop)
    }

    /// Adds the default route through `gateway`.
    pub fn default_route(&mut self, gateway: Ipv4Addr) -> io::Result<()> {
        self.call(|seq| {
            let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, seq);
            m.0.extend_from_slice(&[
                AF_INET,
                0,
                0,
                0,
                RT_TABLE_MAIN,
                RTPROT_BOOT,
                RT_SCOPE_UNIVERSE,
                RTN_UNICAST,
            ]);
            m.0.extend_from_slice(&0u32.to_ne_bytes());
            m.attr(RTA_GATEWAY, &gateway.octets());
            m.finish()
        })
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_laid_out_as_the_kernel_reads_them() {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE, 7);
        m.ifinfo(3, IFF_UP, IFF_UP).name(IFLA_IFNAME, "v1");
        let nest = m.nest(IFLA_LINKINFO);
        m.name(IFLA_INFO_KIND, "veth");
        m.end(nest);
        let b = m.finish();
        assert_eq!(u32_at(&b, 0) as usize, b.len(), "the header holds the whole length");
        assert_eq!(u16_at(&b, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&b, 6), NLM_F_CREATE | NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32_at(&b, 8), 7);
        assert_eq!(i32::from_ne_bytes(b[20..24].try_into().unwrap()), 3, "ifi_index");
        // IFLA_IFNAME "v1\0" padded to 8 bytes, then the nest holding "veth\0" padded to 12.
        assert_eq!((u16_at(&b, 32), u16_at(&b, 34)), (7, IFLA_IFNAME));
        assert_eq!(&b[36..39], b"v1\0");
        assert_eq!((u16_at(&b, 40), u16_at(&b, 42)), (4 + 12, IFLA_LINKINFO | NLA_F_NESTED));
        assert_eq!((u16_at(&b, 44), u16_at(&b, 46)), (9, IFLA_INFO_KIND));
        assert_eq!(b.len() % 4, 0);
    }
}
