//! IPv6 router advertisements for a provisioning link without a router.
//!
//! iPXE waits about 13 s for IPv6 autoconfiguration when no router advertisement arrives
//! (measured, TESTBED-NOTES.md). An advertisement with router lifetime 0 (we are not a
//! default router), no prefix and neither the managed nor the other-configuration flag tells
//! it at once that there is nothing to configure. It is sent every few seconds to all nodes
//! and at once in answer to a router solicitation. Turn it off (`routerAdvertisements: false`)
//! on a link that has a real IPv6 router.
//!
//! With `dhcp6.mode: full` the advertisement also sends hosts to DHCPv6 (see
//! [`advertisement`]): clients, iPXE among them, start DHCPv6 only after an advertisement
//! with the managed or other-configuration flag.

use std::io::Read;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::dhcp6::settings::{Dhcp6Mode, Dhcp6Settings, Subnet6};

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

/// Managed address configuration (M): addresses come from DHCPv6.
const FLAG_MANAGED: u8 = 0x80;
/// Other configuration (O): other settings (boot file URL, DNS) come from DHCPv6.
const FLAG_OTHER: u8 = 0x40;
const OPTION_SOURCE_LINK_LAYER: u8 = 1;
const OPTION_PREFIX_INFORMATION: u8 = 3;
/// On-link (L): hosts reach the prefix directly; a DHCPv6 address has no prefix length.
const PREFIX_ON_LINK: u8 = 0x80;

/// The advertisement: ICMPv6 type 134, hop limit 64, router lifetime 0 (never a default
/// router), the source link-layer address option, and what `dhcp6` asks of hosts:
///
/// - mode `full`: M and O set, and a Prefix Information option (RFC 4861 §4.6.2) per
///   subnet, on-link but without autonomous configuration (A=0): addresses come from
///   DHCPv6 only, so that each has one owner, the address book.
/// - mode `proxy`: no flags and no prefix, as with `off`. Another DHCPv6 server owns the
///   addresses and usually a real router advertises the link; operators with such a router
///   set `routerAdvertisements: false`, so that hosts hear one voice only.
/// - mode `off`: no flags and no prefix: nothing to configure.
///
/// The kernel fills in the checksum.
pub fn advertisement(mac: [u8; 6], dhcp6: &Dhcp6Settings) -> Vec<u8> {
    let (flags, prefixes): (u8, &[Subnet6]) = match dhcp6.mode {
        Dhcp6Mode::Full => (FLAG_MANAGED | FLAG_OTHER, &dhcp6.subnets),
        Dhcp6Mode::Off | Dhcp6Mode::Proxy => (0, &[]),
    };
    let mut packet = vec![
        ROUTER_ADVERTISEMENT,
        0, // code
        0,
        0,  // checksum (kernel)
        64, // current hop limit
        flags,
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
    packet.extend_from_slice(&[OPTION_SOURCE_LINK_LAYER, 1]); // 8 bytes
    packet.extend_from_slice(&mac);
    for subnet in prefixes {
        packet.extend_from_slice(&[
            OPTION_PREFIX_INFORMATION,
            4, // 32 bytes
            subnet.prefix_len,
            PREFIX_ON_LINK, // A=0: no SLAAC
        ]);
        packet.extend_from_slice(&subnet.valid_seconds.to_be_bytes());
        packet.extend_from_slice(&subnet.preferred_seconds.to_be_bytes());
        packet.extend_from_slice(&[0; 4]); // reserved
        packet.extend_from_slice(&subnet.network.octets());
    }
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

/// Starts advertising on `interface` what `dhcp6` asks of hosts ([`advertisement`]) from a
/// thread of its own; returns once the socket is set up (errors are reported, not fatal to
/// the caller).
pub fn start(interface: &str, dhcp6: &Dhcp6Settings) -> Result<(), RaError> {
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
    let packet = advertisement(mac.0, dhcp6);
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
    use std::net::Ipv6Addr;

    use super::*;
    use crate::dhcp::settings::UnknownMachines;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

    /// The advertisement before DHCPv6 existed, byte for byte.
    const PLAIN: [u8; 24] = [
        134, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0x52, 0x54, 0, 1, 2, 3,
    ];

    fn subnet(network: Ipv6Addr, prefix_len: u8, preferred: u32, valid: u32) -> Subnet6 {
        Subnet6 {
            network,
            prefix_len,
            pool: (network, network),
            dns: Vec::new(),
            preferred_seconds: preferred,
            valid_seconds: valid,
        }
    }

    fn dhcp6(mode: Dhcp6Mode) -> Dhcp6Settings {
        Dhcp6Settings {
            mode,
            server_address: Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1),
            server_duid: Vec::new(),
            rapid_commit: true,
            subnets: vec![
                subnet(
                    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0),
                    64,
                    3600,
                    7200,
                ),
                subnet(
                    Ipv6Addr::new(0xfd00, 0xa, 0xb, 0, 0, 0, 0, 0),
                    48,
                    0x0102_0304,
                    0x0a0b_0c0d,
                ),
            ],
            unknown_machines: UnknownMachines::Ignore,
        }
    }

    #[test]
    fn advertisement_is_not_a_default_router_and_names_its_link_address() {
        let packet = advertisement(MAC, &dhcp6(Dhcp6Mode::Off));
        assert_eq!(packet[0], ROUTER_ADVERTISEMENT);
        assert_eq!(packet[5], 0, "no managed or other-configuration flag");
        assert_eq!(&packet[6..8], &[0, 0], "router lifetime 0");
        assert_eq!(&packet[16..18], &[1, 1], "source link-layer address option");
        assert_eq!(&packet[18..], &MAC);
        assert_eq!(packet.len() % 8, 0, "options end on an 8-byte boundary");
    }

    #[test]
    fn off_and_proxy_send_the_plain_advertisement_even_with_subnets() {
        // Proxy: another DHCPv6 server (and usually a router) owns the link.
        for mode in [Dhcp6Mode::Off, Dhcp6Mode::Proxy] {
            assert_eq!(advertisement(MAC, &dhcp6(mode)), PLAIN, "{mode:?}");
        }
    }

    #[test]
    fn full_sends_hosts_to_dhcpv6_with_each_prefix_on_link_and_no_slaac() {
        let packet = advertisement(MAC, &dhcp6(Dhcp6Mode::Full));
        assert_eq!(packet[5], 0xc0, "M and O set, nothing else");
        assert_eq!(&packet[6..8], &[0, 0], "router lifetime still 0");
        // Header and source link-layer option as before; two 32-byte prefix options follow.
        assert_eq!(&packet[..5], &PLAIN[..5]);
        assert_eq!(&packet[6..24], &PLAIN[6..]);
        assert_eq!(packet.len(), 24 + 2 * 32);

        let first = &packet[24..56];
        assert_eq!(
            &first[..2],
            &[3, 4],
            "prefix information, 4 units of 8 bytes"
        );
        assert_eq!(first[2], 64, "prefix length");
        assert_eq!(first[3], 0x80, "L=1, A=0");
        assert_eq!(&first[4..8], &7200u32.to_be_bytes(), "valid lifetime");
        assert_eq!(&first[8..12], &3600u32.to_be_bytes(), "preferred lifetime");
        assert_eq!(&first[12..16], &[0; 4], "reserved");
        assert_eq!(
            &first[16..],
            &[0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );

        let second = &packet[56..];
        assert_eq!(&second[..4], &[3, 4, 48, 0x80]);
        assert_eq!(&second[4..8], &[0x0a, 0x0b, 0x0c, 0x0d], "valid lifetime");
        assert_eq!(&second[8..12], &[1, 2, 3, 4], "preferred lifetime");
        assert_eq!(
            &second[16..],
            &[0xfd, 0, 0, 0xa, 0, 0xb, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
