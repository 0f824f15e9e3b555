//! The address kubelet registers as the Node's `InternalIP` (`--node-ip`).
//!
//! Left to itself, kubelet looks its own host name up in DNS and, when that fails, takes the
//! address of the default route's interface. On a provisioning network where nothing answers
//! for the machine's name, each lookup waits out the resolver's timeouts: measured on the
//! testbed, 10 s before a rebooted Node turned Ready and 20 s before a new one registered
//! (long enough for kubelet's CSINode set-up to give up and restart it). The agent knows
//! the better answer without DNS: the address this machine reaches the API server from,
//! which is also where the API server reaches the kubelet.
//!
//! Dual stack: when the interface of that address also has a global address of the other
//! family (a provisioning network with DHCPv4 and DHCPv6), kubelet gets both
//! (`--node-ip=<toward the API server>,<other>`, the pair kubelet accepts without a cloud
//! provider), and the Node lists both `InternalIP`s, the API server's family first.

use std::fmt;
use std::net::{IpAddr, SocketAddr, UdpSocket};

/// The Node's addresses as kubelet's `--node-ip` takes them: the one toward the API server,
/// then the other family's on the same interface, if any. Stored as that flag's value (one
/// address is written exactly as a lone `IpAddr` was).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeIps {
    /// The address toward the API server.
    pub primary: IpAddr,
    /// The other family's global address on the same interface (dual stack).
    pub other: Option<IpAddr>,
}

impl NodeIps {
    /// One address, no dual stack.
    pub fn single(primary: IpAddr) -> Self {
        Self {
            primary,
            other: None,
        }
    }
}

impl fmt::Display for NodeIps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.other {
            Some(other) => write!(f, "{},{other}", self.primary),
            None => write!(f, "{}", self.primary),
        }
    }
}

impl From<NodeIps> for String {
    fn from(ips: NodeIps) -> Self {
        ips.to_string()
    }
}

impl TryFrom<String> for NodeIps {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let parse = |s: &str| {
            s.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("not a node address: {s:?}"))
        };
        match text.split_once(',') {
            None => Ok(Self::single(parse(&text)?)),
            Some((first, second)) => {
                let (primary, other) = (parse(first)?, parse(second)?);
                if primary.is_ipv4() == other.is_ipv4() {
                    return Err(format!("two node addresses of one family: {text:?}"));
                }
                Ok(Self {
                    primary,
                    other: Some(other),
                })
            }
        }
    }
}

/// Whether kubelet may register `ip` as a Node address: neither loopback, link-local nor
/// unspecified (a ULA such as fd00::/8 is a provisioning network's global address).
fn registrable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_loopback() || v4.is_link_local() || v4.is_unspecified()),
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unicast_link_local()
                || v6.is_unspecified()
                || v6.is_multicast())
        }
    }
}

/// The Node's addresses given the one toward the API server and every `(interface,
/// address)` of the machine: the other family's first registrable address on the
/// interface that holds `primary`.
pub fn with_other_family(primary: IpAddr, addresses: &[(String, IpAddr)]) -> NodeIps {
    let interface = addresses
        .iter()
        .find(|(_, ip)| *ip == primary)
        .map(|(name, _)| name);
    let other = interface.and_then(|interface| {
        addresses
            .iter()
            .filter(|(name, _)| name == interface)
            .map(|(_, ip)| *ip)
            .find(|ip| ip.is_ipv4() != primary.is_ipv4() && registrable(*ip))
    });
    NodeIps { primary, other }
}

/// Every address of every interface (`getifaddrs`); empty when it cannot be read.
#[allow(unsafe_code)] // getifaddrs/freeifaddrs: the list is read once and freed here
pub fn interface_addresses() -> Vec<(String, IpAddr)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head this function owns and frees below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut entry = head;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed; each
        // sockaddr is read as the type its family names, and the name is NUL-terminated.
        let (next, found) = unsafe {
            let e = &*entry;
            let address = if e.ifa_addr.is_null() {
                None
            } else {
                match i32::from((*e.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(e.ifa_addr as *const libc::sockaddr_in);
                        Some(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(e.ifa_addr as *const libc::sockaddr_in6);
                        Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            let name = (!e.ifa_name.is_null()).then(|| {
                std::ffi::CStr::from_ptr(e.ifa_name)
                    .to_string_lossy()
                    .into_owned()
            });
            (e.ifa_next, address.zip(name))
        };
        if let Some((ip, name)) = found {
            out.push((name, ip));
        }
        entry = next;
    }
    // SAFETY: the head getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The host and port of an `https://host[:port][/…]` URL (443 when no port is given); an
/// IPv6 host is written in brackets.
pub fn host_and_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 443,
            None => return None,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (authority, 443),
        }
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// The local address the kernel would send from to reach `server`: a UDP socket connected
/// to it (connecting a UDP socket only picks the route; nothing is sent).
pub fn source_address(server: SocketAddr) -> Option<IpAddr> {
    let unspecified: SocketAddr = if server.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(unspecified).ok()?;
    socket.connect(server).ok()?;
    let local = socket.local_addr().ok()?.ip();
    (!local.is_unspecified()).then_some(local)
}

/// Why this machine cannot yet reach `url` (`http(s)://[v6]:port/…`) from an address of
/// its own: the kernel would send from a link-local address, or has no route. On an IPv6
/// provisioning network that is the time between the router advertisement (the prefix is
/// on-link) and the DHCPv6 address (leased, then tentative for a second): a request sent
/// then comes from an address that vouches for no Machine and is refused. `None` when the
/// source is the machine's own, or the URL names a host name or an IPv4 address.
pub fn not_yet_addressed(url: &str) -> Option<&'static str> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?.strip_prefix('[')?.strip_suffix(']')?;
    let server: std::net::Ipv6Addr = host.parse().ok()?;
    let port = parsed.port_or_known_default()?;
    let source = source_address(SocketAddr::from((server, port)));
    (!is_own_source(source))
        .then_some("no IPv6 address of its own yet toward it (DHCPv6 not done, or the address still tentative)")
}

/// Whether a request from `source` speaks for this machine: an address, not link-local.
fn is_own_source(source: Option<IpAddr>) -> bool {
    match source {
        Some(IpAddr::V6(v6)) => !v6.is_unicast_link_local(),
        Some(IpAddr::V4(_)) => true,
        None => false,
    }
}

/// This machine's addresses toward the API server at `server_url` (a host name is resolved
/// first), with the other family's for dual stack, or `None` when they cannot be told:
/// kubelet then finds one itself, as before.
pub async fn toward(server_url: &str) -> Option<NodeIps> {
    let (host, port) = host_and_port(server_url)?;
    let server = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()?
        .next()?;
    let primary = source_address(server)?;
    Some(with_other_family(primary, &interface_addresses()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_host_and_port_from_its_url() {
        let table = [
            ("https://10.99.0.1:6443", Some(("10.99.0.1", 6443))),
            ("https://10.99.0.1:6443/", Some(("10.99.0.1", 6443))),
            ("https://api.example.net", Some(("api.example.net", 443))),
            ("https://[fd00::1]:6443/path", Some(("fd00::1", 6443))),
            ("https://[fd00::1]", Some(("fd00::1", 443))),
            ("http://10.99.0.1:6443", None),
            ("https://:6443", None),
            ("https://10.99.0.1:port", None),
            ("https://user@10.99.0.1:6443", None),
            ("https://[fd00::1]x", None),
            ("", None),
        ];
        for (url, want) in table {
            let got = host_and_port(url);
            assert_eq!(got.as_ref().map(|(h, p)| (h.as_str(), *p)), want, "{url}");
        }
    }

    #[tokio::test]
    async fn the_address_toward_a_loopback_server_is_loopback() {
        // The kernel's own route lookup, as on a machine; loopback is the only network a
        // test may use.
        // Loopback's ::1 is no Node address: no dual stack here.
        assert_eq!(
            toward("https://127.0.0.1:6443").await,
            Some(NodeIps::single(IpAddr::from([127, 0, 0, 1])))
        );
        assert_eq!(
            toward("https://localhost:6443")
                .await
                .map(|ips| ips.primary.is_loopback()),
            Some(true)
        );
        assert_eq!(toward("https://").await, None);
    }

    #[test]
    fn a_link_local_or_missing_source_is_not_the_machines_own() {
        assert!(!is_own_source(None));
        assert!(!is_own_source(Some(ip("fe80::5054:ff:fe99:1"))));
        assert!(is_own_source(Some(ip("fd00:99::21"))));
        assert!(is_own_source(Some(ip("10.99.0.21"))));
        // Loopback is this machine's own; host names and IPv4 are not judged.
        assert_eq!(not_yet_addressed("http://[::1]:8080"), None);
        assert_eq!(not_yet_addressed("https://[::1]"), None);
        assert_eq!(not_yet_addressed("http://10.99.0.1:8080"), None);
        assert_eq!(not_yet_addressed("http://bootserver.example:8080"), None);
        assert_eq!(not_yet_addressed("not a url"), None);
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_other_family_comes_from_the_same_interface_and_only_a_registrable_address() {
        let addresses: Vec<(String, IpAddr)> = [
            ("lo", "127.0.0.1"),
            ("lo", "::1"),
            ("enp1s0", "10.99.0.21"),
            ("enp1s0", "fe80::5054:ff:fe99:1"),
            ("enp1s0", "fd00:99::21"),
            ("enp2s0", "192.0.2.9"),
            ("enp2s0", "2001:db8::9"),
        ]
        .iter()
        .map(|(name, a)| ((*name).to_owned(), ip(a)))
        .collect();
        // v4 toward the API server: its interface's ULA, not the link-local, not another NIC's.
        assert_eq!(
            with_other_family(ip("10.99.0.21"), &addresses),
            NodeIps {
                primary: ip("10.99.0.21"),
                other: Some(ip("fd00:99::21"))
            }
        );
        // v6 toward the API server: the v4 of the same interface.
        assert_eq!(
            with_other_family(ip("fd00:99::21"), &addresses).other,
            Some(ip("10.99.0.21"))
        );
        // A v6-only interface (its link-local does not count): single stack.
        let v6_only = [
            ("enp1s0".to_owned(), ip("fe80::1")),
            ("enp1s0".to_owned(), ip("fd00:99::21")),
        ];
        assert_eq!(
            with_other_family(ip("fd00:99::21"), &v6_only),
            NodeIps::single(ip("fd00:99::21"))
        );
        // An address no interface lists (the table read failed): single stack.
        assert_eq!(
            with_other_family(ip("10.0.0.1"), &[]),
            NodeIps::single(ip("10.0.0.1"))
        );
    }

    #[test]
    fn node_ips_are_kept_as_kubelets_flag_value_and_one_reads_as_before() {
        let dual = NodeIps {
            primary: ip("fd00:99::21"),
            other: Some(ip("10.99.0.21")),
        };
        assert_eq!(dual.to_string(), "fd00:99::21,10.99.0.21");
        let json = serde_json::to_string(&dual).unwrap();
        assert_eq!(json, r#""fd00:99::21,10.99.0.21""#);
        assert_eq!(serde_json::from_str::<NodeIps>(&json).unwrap(), dual);
        // What an agent before dual stack stored: a lone address.
        let single: NodeIps = serde_json::from_str(r#""10.99.0.21""#).unwrap();
        assert_eq!(single, NodeIps::single(ip("10.99.0.21")));
        assert_eq!(serde_json::to_string(&single).unwrap(), r#""10.99.0.21""#);
        for bad in [r#""10.0.0.1,10.0.0.2""#, r#""x""#, r#""10.0.0.1,""#] {
            assert!(serde_json::from_str::<NodeIps>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn this_machines_interfaces_are_read() {
        // Loopback is always there (tests run with `lo` up).
        let addresses = interface_addresses();
        assert!(
            addresses
                .iter()
                .any(|(name, ip)| name == "lo" && *ip == ip_loopback()),
            "{addresses:?}"
        );
    }

    fn ip_loopback() -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }
}
