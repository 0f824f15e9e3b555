//! IPv6 router advertisements for a provisioning link without a router.
//!
//! iPXE waits about 13 s for IPv6 autoconfiguration when no router advertisement arrives
//! (measured, TESTBED-NOTES.md). An advertisement with router lifetime 0 (we are not a
//! default router), no prefix and neither the managed nor the other-configuration flag tells
//! it at once that there is nothing to configure. It is sent every few seconds to all nodes
//! and at once in answer to a router solicitation. Turn it off (`routerAdvertisements: false`)
//! on a link that has a real IPv6 router.

use std::io::Read;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Errors of the advertiser.
#[derive(Debug, thiserror::Error)]
pub enum RaError {
    /// The interface is unknown or has no usable hardware address.
    #[error("interface {interface}: {message}")]
    Interface {
        /// The interface.
        interface: String,
        /// What is wrong.
        message: String,
    },
    /// The raw ICMPv6 socket could not be set up.
    #[error("ICMPv6 socket on {interface}: {source}")]
    Socket {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;
/// How often an unsolicited advertisement goes out.
const INTERVAL: Duration = Duration::from_secs(3);

/// The advertisement: ICMPv6 type 134, hop limit 64, no flags, router lifetime 0, and the
/// source link-layer address option. The kernel fills in the checksum.
pub fn advertisement(mac: [u8; 6]) -> Vec<u8> {
    let mut packet = vec![
        ROUTER_ADVERTISEMENT,
        0, // code
        0,
        0,  // checksum (kernel)
        64, // current hop limit
        0,  // M and O flags off: no DHCPv6
        0,
        0, // router lifetime 0: not a default router
        0,
        0,
        0,
        0, // reachable time
        0,
        0,
        0,
        0, // retransmission timer
    ];
    packet.extend_from_slice(&[1, 1]); // source link-layer address, 8 bytes
    packet.extend_from_slice(&mac);
    packet
}

fn read_sys(interface: &str, file: &str) -> Result<String, RaError> {
    std::fs::read_to_string(format!("/sys/class/net/{interface}/{file}"))
        .map(|s| s.trim().to_owned())
        .map_err(|e| RaError::Interface {
            interface: interface.to_owned(),
            message: format!("reading {file}: {e}"),
        })
}

/// Starts advertising on `interface` from a thread of its own; returns once the socket is
/// set up (errors are reported, not fatal to the caller).
pub fn start(interface: &str) -> Result<(), RaError> {
    let index: u32 = read_sys(interface, "ifindex")?
        .parse()
        .map_err(|_| RaError::Interface {
            interface: interface.to_owned(),
            message: "no interface index".into(),
        })?;
    let mac: crate::backend::MacAddr =
        read_sys(interface, "address")?
            .parse()
            .map_err(|e| RaError::Interface {
                interface: interface.to_owned(),
                message: format!("{e}"),
            })?;
    let err = |source| RaError::Socket {
        interface: interface.to_owned(),
        source,
    };
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).map_err(err)?;
    socket
        .bind_device(Some(interface.as_bytes()))
        .map_err(err)?;
    // Neighbour discovery requires hop limit 255 (RFC 4861 6.1.2).
    socket.set_multicast_hops_v6(255).map_err(err)?;
    socket.set_unicast_hops_v6(255).map_err(err)?;
    socket.set_multicast_if_v6(index).map_err(err)?;
    socket
        .join_multicast_v6(&Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2), index)
        .map_err(err)?;
    socket.set_read_timeout(Some(INTERVAL)).map_err(err)?;
    let packet = advertisement(mac.0);
    let all_nodes = SockAddr::from(SocketAddrV6::new(
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        0,
        0,
        index,
    ));
    let name = interface.to_owned();
    std::thread::Builder::new()
        .name("router-advertisements".into())
        .spawn(move || advertise(&socket, &packet, &all_nodes, &name))
        .map_err(err)?;
    Ok(())
}

fn advertise(socket: &Socket, packet: &[u8], all_nodes: &SockAddr, interface: &str) {
    let mut buf = [0u8; 1500];
    let mut last_sent: Option<Instant> = None;
    let mut failures = 0u32;
    loop {
        if last_sent.is_none_or(|t| t.elapsed() >= INTERVAL) {
            match socket.send_to(packet, all_nodes) {
                Ok(_) => failures = 0,
                Err(error) => {
                    failures += 1;
                    // The link-local address may still be tentative (DAD); say so once.
                    if failures == 1 {
                        tracing::warn!(%error, interface, "sending a router advertisement failed; retrying");
                    }
                }
            }
            last_sent = Some(Instant::now());
        }
        // A raw ICMPv6 socket delivers the ICMPv6 message without the IPv6 header. A
        // solicitation gets an answer at once; a timeout just loops.
        let mut reader = socket;
        if let Ok(len) = reader.read(&mut buf)
            && len > 0
            && buf[0] == ROUTER_SOLICITATION
        {
            let _ = socket.send_to(packet, all_nodes);
            last_sent = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertisement_is_not_a_default_router_and_names_its_link_address() {
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        let packet = advertisement(mac);
        assert_eq!(packet[0], ROUTER_ADVERTISEMENT);
        assert_eq!(packet[5], 0, "no managed or other-configuration flag");
        assert_eq!(&packet[6..8], &[0, 0], "router lifetime 0");
        assert_eq!(&packet[16..18], &[1, 1], "source link-layer address option");
        assert_eq!(&packet[18..], &mac);
        assert_eq!(packet.len() % 8, 0, "options end on an 8-byte boundary");
    }
}
