//! The address kubelet registers as the Node's `InternalIP` (`--node-ip`).
//!
//! Left to itself, kubelet looks its own host name up in DNS and, when that fails, takes the
//! address of the default route's interface. On a provisioning network where nothing answers
//! for the machine's name, each lookup waits out the resolver's timeouts: measured on the
//! testbed, 10 s before a rebooted Node turned Ready and 20 s before a new one registered
//! (long enough for kubelet's CSINode set-up to give up and restart it). The agent knows
//! the better answer without DNS: the address this machine reaches the API server from,
//! which is also where the API server reaches the kubelet.

use std::net::{IpAddr, SocketAddr, UdpSocket};

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

/// This machine's address toward the API server at `server_url` (a host name is resolved
/// first), or `None` when it cannot be told: kubelet then finds one itself, as before.
pub async fn toward(server_url: &str) -> Option<IpAddr> {
    let (host, port) = host_and_port(server_url)?;
    let server = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()?
        .next()?;
    source_address(server)
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
        assert_eq!(
            toward("https://127.0.0.1:6443").await,
            Some(IpAddr::from([127, 0, 0, 1]))
        );
        assert_eq!(
            toward("https://localhost:6443")
                .await
                .map(|ip| ip.is_loopback()),
            Some(true)
        );
        assert_eq!(toward("https://").await, None);
    }
}
