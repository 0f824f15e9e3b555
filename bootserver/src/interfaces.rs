//! The host's network interfaces and their IPv4 addresses, read from the kernel over
//! rtnetlink (an `RTM_GETLINK` and an `RTM_GETADDR` dump): what the start-up check
//! ([`crate::preflight`]) compares the configuration with. The container image has no
//! `ip` binary, and the answer must be the kernel's own, so the bootserver asks the kernel
//! itself; the parsing is a pure function over the bytes, tested here.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SocketType};

/// An IPv4 address with its prefix length, as `ip addr` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ipv4Net {
    /// The address.
    pub address: Ipv4Addr,
    /// The prefix length.
    pub prefix: u8,
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Interface names and their IPv4 addresses (an interface without one maps to an empty
/// list).
pub type Interfaces = BTreeMap<String, Vec<Ipv4Net>>;

/// Why the interfaces could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InterfacesError {
    /// The netlink socket failed.
    #[error("rtnetlink: {0}")]
    Socket(#[from] rustix::io::Errno),
    /// The kernel's answer could not be parsed.
    #[error("rtnetlink: malformed answer: {0}")]
    Malformed(&'static str),
    /// The kernel answered with an error.
    #[error("rtnetlink: the kernel answered error {0}")]
    Kernel(i32),
}

const NLMSG_HEADER: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const AF_INET: u8 = 2;
const IFLA_IFNAME: u16 = 3;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `struct ifinfomsg`.
const IFINFOMSG: usize = 16;
/// `struct ifaddrmsg`.
const IFADDRMSG: usize = 8;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const AF_INET6: u8 = 10;
/// `struct ndmsg`.
const NDMSG: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// Neighbour states whose link-layer address was resolved (reachable, stale, delay,
/// probe, no ARP, permanent); incomplete and failed ones are not.
const NUD_RESOLVED: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A dump request: the netlink header and a zeroed family message with `family` set.
fn dump_request(kind: u16, family: u8, body_len: usize, sequence: u32) -> Vec<u8> {
    let len = NLMSG_HEADER + body_len;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(0).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    out.extend_from_slice(&sequence.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.resize(len, 0);
    out
}

/// One netlink message of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_seq`.
    pub sequence: u32,
    /// What follows the header.
    pub payload: &'a [u8],
}

/// Splits a datagram into its messages.
pub fn messages(datagram: &[u8]) -> Result<Vec<Message<'_>>, InterfacesError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HEADER <= datagram.len() {
        let len = u32_at(datagram, at).ok_or(InterfacesError::Malformed("header"))? as usize;
        let kind = u16_at(datagram, at + 4).ok_or(InterfacesError::Malformed("header"))?;
        let sequence = u32_at(datagram, at + 8).ok_or(InterfacesError::Malformed("header"))?;
        if len < NLMSG_HEADER || at + len > datagram.len() {
            return Err(InterfacesError::Malformed("message length"));
        }
        out.push(Message {
            kind,
            sequence,
            payload: &datagram[at + NLMSG_HEADER..at + len],
        });
        at += align4(len);
    }
    Ok(out)
}

/// The route attributes after a family message of `fixed` bytes: (type, value) pairs.
fn attributes(payload: &[u8], fixed: usize) -> Result<Vec<(u16, &[u8])>, InterfacesError> {
    let mut out = Vec::new();
    let mut at = fixed;
    while at + 4 <= payload.len() {
        let len = u16_at(payload, at).ok_or(InterfacesError::Malformed("attribute"))? as usize;
        // The upper bits of the type are flags (nested, byte order).
        let kind = u16_at(payload, at + 2).ok_or(InterfacesError::Malformed("attribute"))? & 0x3fff;
        if len < 4 || at + len > payload.len() {
            return Err(InterfacesError::Malformed("attribute length"));
        }
        out.push((kind, &payload[at + 4..at + len]));
        at += align4(len);
    }
    Ok(out)
}

/// An `RTM_NEWLINK` payload: (interface index, name).
pub fn parse_link(payload: &[u8]) -> Result<Option<(u32, String)>, InterfacesError> {
    let index = u32_at(payload, 4).ok_or(InterfacesError::Malformed("ifinfomsg"))?;
    if payload.len() < IFINFOMSG {
        return Err(InterfacesError::Malformed("ifinfomsg"));
    }
    let name = attributes(payload, IFINFOMSG)?
        .into_iter()
        .find(|(kind, _)| *kind == IFLA_IFNAME)
        .map(|(_, value)| {
            let value = value.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(value).into_owned()
        });
    Ok(name.map(|name| (index, name)))
}

/// An `RTM_NEWADDR` payload: (interface index, address) for IPv4; `None` for another
/// family.
pub fn parse_address(payload: &[u8]) -> Result<Option<(u32, Ipv4Net)>, InterfacesError> {
    if payload.len() < IFADDRMSG {
        return Err(InterfacesError::Malformed("ifaddrmsg"));
    }
    if payload[0] != AF_INET {
        return Ok(None);
    }
    let prefix = payload[1];
    let index = u32_at(payload, 4).ok_or(InterfacesError::Malformed("ifaddrmsg"))?;
    let attrs = attributes(payload, IFADDRMSG)?;
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on a
    // point-to-point link and the same as IFA_LOCAL elsewhere.
    let address = [IFA_LOCAL, IFA_ADDRESS]
        .iter()
        .find_map(|want| attrs.iter().find(|(kind, _)| kind == want))
        .and_then(|(_, value)| <[u8; 4]>::try_from(*value).ok())
        .map(Ipv4Addr::from);
    Ok(address.map(|address| (index, Ipv4Net { address, prefix })))
}

/// Sends one dump request and collects its messages' payloads of type `answer`.
fn dump(
    socket: &rustix::fd::OwnedFd,
    (kind, family): (u16, u8),
    body_len: usize,
    answer: u16,
    sequence: u32,
) -> Result<Vec<Vec<u8>>, InterfacesError> {
    let request = dump_request(kind, family, body_len, sequence);
    rustix::net::sendto(
        socket,
        &request,
        rustix::net::SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let (received, _) = rustix::net::recv(socket, &mut buf[..], RecvFlags::empty())?;
        let datagram = buf.get(..received).unwrap_or_default();
        for message in messages(datagram)? {
            if message.sequence != sequence {
                continue;
            }
            match message.kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = u32_at(message.payload, 0)
                        .ok_or(InterfacesError::Malformed("error message"))?
                        as i32;
                    if code != 0 {
                        return Err(InterfacesError::Kernel(code));
                    }
                }
                k if k == answer => out.push(message.payload.to_vec()),
                _ => {}
            }
        }
    }
}

/// Every interface of this network namespace with its IPv4 addresses.
pub fn read() -> Result<Interfaces, InterfacesError> {
    let socket = rustix::net::socket(
        AddressFamily::NETLINK,
        SocketType::RAW,
        // Protocol 0 is NETLINK_ROUTE (rustix has no constant for a zero protocol).
        None,
    )?;
    let mut names = BTreeMap::new();
    for payload in dump(&socket, (RTM_GETLINK, AF_INET), IFINFOMSG, RTM_NEWLINK, 1)? {
        if let Some((index, name)) = parse_link(&payload)? {
            names.insert(index, name);
        }
    }
    let mut out: Interfaces = names.values().map(|n| (n.clone(), Vec::new())).collect();
    for payload in dump(&socket, (RTM_GETADDR, AF_INET), IFADDRMSG, RTM_NEWADDR, 2)? {
        if let Some((index, net)) = parse_address(&payload)?
            && let Some(name) = names.get(&index)
        {
            out.entry(name.clone()).or_default().push(net);
        }
    }
    for addresses in out.values_mut() {
        addresses.sort();
    }
    Ok(out)
}

/// An `RTM_NEWNEIGH` payload: an IPv6 neighbour whose link-layer address is resolved, as
/// (address, MAC); `None` for another family, an unresolved entry or a non-Ethernet one.
pub fn parse_neighbour(payload: &[u8]) -> Result<Option<(Ipv6Addr, [u8; 6])>, InterfacesError> {
    if payload.len() < NDMSG {
        return Err(InterfacesError::Malformed("ndmsg"));
    }
    let state = u16_at(payload, 8).ok_or(InterfacesError::Malformed("ndmsg"))?;
    if payload[0] != AF_INET6 || state & NUD_RESOLVED == 0 {
        return Ok(None);
    }
    let attrs = attributes(payload, NDMSG)?;
    let value = |want: u16| {
        attrs
            .iter()
            .find(|(kind, _)| *kind == want)
            .map(|(_, v)| *v)
    };
    let address = value(NDA_DST).and_then(|v| <[u8; 16]>::try_from(v).ok());
    let mac = value(NDA_LLADDR).and_then(|v| <[u8; 6]>::try_from(v).ok());
    Ok(address.zip(mac).map(|(a, m)| (Ipv6Addr::from(a), m)))
}

/// The resolved IPv6 neighbours of this network namespace (the kernel's neighbour
/// discovery table, which no file in `/proc` shows).
pub fn ipv6_neighbours() -> Result<Vec<(Ipv6Addr, [u8; 6])>, InterfacesError> {
    let socket = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    let mut out = Vec::new();
    for payload in dump(&socket, (RTM_GETNEIGH, AF_INET6), NDMSG, RTM_NEWNEIGH, 3)? {
        if let Some(entry) = parse_neighbour(&payload)? {
            out.push(entry);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(align4(out.len()), 0);
        out
    }

    fn message(kind: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(
            &u32::try_from(NLMSG_HEADER + payload.len())
                .unwrap()
                .to_ne_bytes(),
        );
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&sequence.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(align4(out.len()), 0);
        out
    }

    fn link(index: u32, name: &str) -> Vec<u8> {
        let mut payload = vec![0u8; IFINFOMSG];
        payload[4..8].copy_from_slice(&index.to_ne_bytes());
        payload.extend(attribute(4, &1500u32.to_ne_bytes())); // IFLA_MTU, skipped
        let mut name = name.as_bytes().to_vec();
        name.push(0);
        payload.extend(attribute(IFLA_IFNAME, &name));
        payload
    }

    fn address(family: u8, index: u32, prefix: u8, attrs: &[(u16, [u8; 4])]) -> Vec<u8> {
        let mut payload = vec![family, prefix, 0, 0];
        payload.extend_from_slice(&index.to_ne_bytes());
        for (kind, value) in attrs {
            payload.extend(attribute(*kind, value));
        }
        payload
    }

    #[test]
    fn a_dump_is_split_into_messages_and_parsed() {
        let mut datagram = message(RTM_NEWLINK, 1, &link(7, "br0"));
        datagram.extend(message(RTM_NEWLINK, 1, &link(1, "lo")));
        datagram.extend(message(NLMSG_DONE, 1, &0i32.to_ne_bytes()));
        let parsed = messages(&datagram).unwrap();
        assert_eq!(
            parsed.iter().map(|m| m.kind).collect::<Vec<_>>(),
            [RTM_NEWLINK, RTM_NEWLINK, NLMSG_DONE]
        );
        assert_eq!(
            parse_link(parsed[0].payload).unwrap(),
            Some((7, "br0".to_owned()))
        );
        assert_eq!(
            parse_link(parsed[1].payload).unwrap(),
            Some((1, "lo".to_owned()))
        );
    }

    #[test]
    fn addresses_prefer_the_local_attribute() {
        let cases = [
            (
                "ordinary: both the same",
                address(
                    AF_INET,
                    3,
                    24,
                    &[(IFA_ADDRESS, [10, 99, 0, 1]), (IFA_LOCAL, [10, 99, 0, 1])],
                ),
                Some((
                    3,
                    Ipv4Net {
                        address: Ipv4Addr::new(10, 99, 0, 1),
                        prefix: 24,
                    },
                )),
            ),
            (
                "point-to-point: IFA_ADDRESS is the peer",
                address(
                    AF_INET,
                    4,
                    32,
                    &[(IFA_ADDRESS, [10, 0, 0, 2]), (IFA_LOCAL, [10, 0, 0, 1])],
                ),
                Some((
                    4,
                    Ipv4Net {
                        address: Ipv4Addr::new(10, 0, 0, 1),
                        prefix: 32,
                    },
                )),
            ),
            (
                "only IFA_ADDRESS",
                address(AF_INET, 5, 16, &[(IFA_ADDRESS, [192, 0, 2, 1])]),
                Some((
                    5,
                    Ipv4Net {
                        address: Ipv4Addr::new(192, 0, 2, 1),
                        prefix: 16,
                    },
                )),
            ),
            ("IPv6 is not ours", address(10, 5, 64, &[]), None),
        ];
        for (case, payload, expected) in cases {
            assert_eq!(parse_address(&payload).unwrap(), expected, "{case}");
        }
    }

    fn neighbour(family: u8, state: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut p = vec![family, 0, 0, 0];
        p.extend_from_slice(&7u32.to_ne_bytes());
        p.extend_from_slice(&state.to_ne_bytes());
        p.extend_from_slice(&[0, 1]);
        for (kind, value) in attrs {
            p.extend(attribute(*kind, value));
        }
        p
    }

    #[test]
    fn only_resolved_ipv6_neighbours_name_their_hardware() {
        let ip: Ipv6Addr = "fd00:99::150".parse().unwrap();
        let mac = [0x52, 0x54, 0, 0x66, 0, 1];
        let entry = |state| {
            neighbour(
                AF_INET6,
                state,
                &[(NDA_DST, &ip.octets()), (NDA_LLADDR, &mac)],
            )
        };
        assert_eq!(
            parse_neighbour(&entry(0x02)).unwrap(),
            Some((ip, mac)),
            "reachable"
        );
        assert_eq!(
            parse_neighbour(&entry(0x04)).unwrap(),
            Some((ip, mac)),
            "stale"
        );
        assert_eq!(parse_neighbour(&entry(0x01)).unwrap(), None, "incomplete");
        assert_eq!(parse_neighbour(&entry(0x20)).unwrap(), None, "failed");
        assert_eq!(
            parse_neighbour(&neighbour(
                AF_INET,
                0x02,
                &[(NDA_DST, &[10, 0, 0, 1]), (NDA_LLADDR, &mac)]
            ))
            .unwrap(),
            None
        );
        assert!(parse_neighbour(&entry(0x02)[..8]).is_err());
    }

    #[test]
    fn this_host_lists_its_ipv6_neighbours() {
        // The dump itself works here (its entries depend on the host).
        assert!(ipv6_neighbours().is_ok());
    }

    #[test]
    fn truncated_answers_are_errors_not_panics() {
        let whole = message(RTM_NEWLINK, 1, &link(7, "br0"));
        for cut in 1..whole.len() {
            let _ = messages(&whole[..cut]);
        }
        let mut bad_length = whole.clone();
        bad_length[0..4].copy_from_slice(&9999u32.to_ne_bytes());
        assert!(messages(&bad_length).is_err());
        let payload = link(7, "br0");
        for cut in 0..payload.len() {
            let _ = parse_link(&payload[..cut]);
        }
        assert!(parse_address(&[AF_INET, 24]).is_err());
    }

    #[test]
    fn this_host_has_a_loopback_interface() {
        let interfaces = read().unwrap();
        assert!(
            interfaces
                .get("lo")
                .is_some_and(|a| a.iter().any(|n| n.address == Ipv4Addr::LOCALHOST)),
            "{interfaces:?}"
        );
    }
}
