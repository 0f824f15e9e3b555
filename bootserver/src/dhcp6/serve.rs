//! The DHCPv6 sockets and their loop: receive, unwrap relay envelopes ([`relay`]),
//! decode, decide ([`Responder6::decide`]), make leases durable through the v4 server's
//! commit thread (one log, records in the order decided), then send.
//!
//! Two sockets on port 547: one bound to the multicast group `ff02::1:2` on the
//! provisioning interface (what clients send to), one bound to the server's own address
//! (what relays send to, and clients that unicast). Which one a message came in on is how
//! the decision knows it was unicast (RFC 8415 §16: without Server Unicast, a client must
//! not unicast; it is told `UseMulticast`). Replies leave from the unicast socket: to the
//! client's link-local address and port 546, or to the relay on 547 inside Relay-Reply
//! envelopes.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use dhcproto::v6::{Message, MessageType};
use dhcproto::{Encodable, Encoder};
use tokio::net::UdpSocket;

use super::decide::{Arrival, Decision6, Responder6};
use super::relay::{self, RelayHop};
use crate::dhcp::commit::{Committer, NoAck};
use crate::dhcp::now_unix;
use crate::dhcp::serve::{COMMIT_TIMEOUT, panic_message};
use crate::leases::{Lease, Leases, Ticket};
use crate::metrics::{Metrics, Service};

/// The server and relay port.
pub const SERVER_PORT: u16 = 547;
/// The client port.
pub const CLIENT_PORT: u16 = 546;
/// All_DHCP_Relay_Agents_and_Servers (RFC 8415 §7.1).
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
/// The PXE boot-service port. UEFI PXEv6 that took a proxy offer (an Advertise with the
/// `PXEClient` class and no address) asks that server for its boot file with a Request
/// sent here, unicast from the address the network's server gave it, and takes the answer
/// only from this port (edk2's `PxeBcRequestBootService`).
pub const BOOT_SERVICE_PORT: u16 = 4011;
/// The largest UDP payload over IPv6 without jumbograms.
pub const MAX_DATAGRAM: usize = 65_527;

/// Why the DHCPv6 service cannot run.
#[derive(Debug, thiserror::Error)]
pub enum Dhcp6Error {
    /// A socket could not be opened or set up.
    #[error("DHCPv6 socket ({what}): {source}")]
    Socket {
        /// Which socket and step.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The interface's MAC (for the server DUID) could not be read.
    #[error("reading the MAC of {interface} for the DHCPv6 server DUID: {source}")]
    InterfaceMac {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The two sockets of a DHCPv6 server.
#[derive(Debug)]
pub struct Sockets6 {
    /// Bound to `[ff02::1:2%interface]:547`.
    pub multicast: UdpSocket,
    /// Bound to `[server address]:547`; replies leave from it.
    pub unicast: UdpSocket,
}

/// The MAC of `interface` (`/sys/class/net/<interface>/address`).
pub fn interface_mac(interface: &str) -> Result<[u8; 6], Dhcp6Error> {
    let err = |source| Dhcp6Error::InterfaceMac {
        interface: interface.to_owned(),
        source,
    };
    let text =
        std::fs::read_to_string(format!("/sys/class/net/{interface}/address")).map_err(err)?;
    let mac: Vec<u8> = text
        .trim()
        .split(':')
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    mac.try_into().map_err(|_| {
        err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{:?} is not a MAC address", text.trim()),
        ))
    })
}

/// Opens both sockets on `interface`, the unicast one on `server_address` and `port`.
pub fn open_sockets(
    interface: &str,
    server_address: Ipv6Addr,
    port: u16,
) -> Result<Sockets6, Dhcp6Error> {
    let open = |what: &str, bind: SocketAddrV6, join: bool| -> Result<UdpSocket, Dhcp6Error> {
        let err = |source| Dhcp6Error::Socket {
            what: format!("{what} on {interface}"),
            source,
        };
        let socket = socket2::Socket::new(
            socket2::Domain::IPV6,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .map_err(err)?;
        socket.set_only_v6(true).map_err(err)?;
        socket.set_reuse_address(true).map_err(err)?;
        socket
            .bind_device(Some(interface.as_bytes()))
            .map_err(err)?;
        if join {
            let index = rustix::net::netdevice::name_to_index(&socket, interface)
                .map_err(|e| err(e.into()))?;
            socket.join_multicast_v6(&ALL_SERVERS, index).map_err(err)?;
            socket
                .bind(&SocketAddr::V6(SocketAddrV6::new(ALL_SERVERS, bind.port(), 0, index)).into())
                .map_err(err)?;
        } else {
            socket.bind(&SocketAddr::V6(bind).into()).map_err(err)?;
        }
        socket.set_nonblocking(true).map_err(err)?;
        UdpSocket::from_std(socket.into()).map_err(err)
    };
    Ok(Sockets6 {
        multicast: open(
            "multicast group ff02::1:2",
            SocketAddrV6::new(ALL_SERVERS, port, 0, 0),
            true,
        )?,
        unicast: open(
            "server address",
            SocketAddrV6::new(server_address, port, 0, 0),
            false,
        )?,
    })
}

/// What to send for one datagram, once its leases are durable.
#[derive(Debug)]
pub struct Outgoing {
    /// The encoded reply, in its relays' envelopes.
    pub bytes: Vec<u8>,
    /// Where to.
    pub to: SocketAddrV6,
    /// Its type (metrics).
    pub kind: MessageType,
}

/// What one datagram comes to.
#[derive(Debug)]
pub enum Handled {
    /// Send `reply` once `commits` are durable; queue `records` first.
    Reply {
        /// The reply.
        reply: Outgoing,
        /// Leases it promises.
        commits: Vec<(Lease, Ticket)>,
        /// Releases and declines.
        records: Vec<crate::leases::Record>,
    },
    /// Not answered.
    Drop(&'static str),
}

/// Unwraps, decodes and decides one datagram from `from` (catching a panic of any step):
/// the received message's type, and what to do. `unicast`: it came in on the unicast
/// socket. `link`: the server's own address on the provisioning link.
pub fn handle(
    responder: &Responder6,
    datagram: &[u8],
    from: SocketAddrV6,
    unicast: bool,
    link: Ipv6Addr,
    now: u64,
) -> (Option<MessageType>, Handled) {
    let handled = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let relayed = match relay::unwrap(datagram) {
            Ok(relayed) => relayed,
            Err(_) => return (None, Handled::Drop("malformed_relay")),
        };
        let message = match super::wire::decode(relayed.client) {
            Ok(message) => message,
            Err(_) => return (None, Handled::Drop("malformed")),
        };
        let kind = message.msg_type();
        let innermost = relayed.hops.last();
        let arrival = Arrival {
            source: innermost.map_or(*from.ip(), |h| h.peer),
            link: innermost
                .map(|h| h.link)
                .filter(|l| !l.is_unspecified() && !is_link_local(*l))
                .unwrap_or(link),
            link_layer: relayed.client_link_layer(),
            unicast: unicast && relayed.hops.is_empty(),
        };
        let handled = match responder.decide(&message, &arrival, now) {
            Decision6::Drop(reason) => Handled::Drop(reason.as_str()),
            Decision6::Reply {
                reply,
                commits,
                records,
            } => match outgoing(&reply, &relayed.hops, from) {
                Some(reply) => Handled::Reply {
                    reply,
                    commits,
                    records,
                },
                None => Handled::Drop("encode"),
            },
        };
        (Some(kind), handled)
    }));
    handled.unwrap_or_else(|panic| {
        tracing::error!(%from, len = datagram.len(), panic = panic_message(panic.as_ref()), "DHCPv6: a panic while handling a message; dropped it");
        (None, Handled::Drop(PANIC))
    })
}

/// The drop reason of a message whose handling panicked.
const PANIC: &str = "panic";

fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The reply's bytes and destination: straight back to the client's port 546, or to the
/// outermost relay's port 547 inside Relay-Reply envelopes (RFC 8415 §19).
fn outgoing(reply: &Message, hops: &[RelayHop], from: SocketAddrV6) -> Option<Outgoing> {
    let mut bytes = Vec::new();
    reply.encode(&mut Encoder::new(&mut bytes)).ok()?;
    let (bytes, port) = if hops.is_empty() {
        (bytes, CLIENT_PORT)
    } else {
        (relay::wrap(hops, &bytes).ok()?, SERVER_PORT)
    };
    Some(Outgoing {
        bytes,
        to: SocketAddrV6::new(*from.ip(), port, 0, from.scope_id()),
        kind: reply.msg_type(),
    })
}

/// What every DHCPv6 socket of a server shares.
#[derive(Debug, Clone)]
pub struct Shared6 {
    /// Replies leave from it (the unicast socket).
    pub sender: Arc<UdpSocket>,
    /// The server's address on the provisioning link.
    pub link: Ipv6Addr,
    /// The decisions.
    pub responder: Arc<Responder6>,
    /// The book (to give back the claims of a shed Reply).
    pub leases: Arc<Leases>,
    /// The v4 server's commit thread: one log, records in the order decided.
    pub committer: Committer,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// Answers DHCPv6 on `socket` (`unicast`: the server-address socket). Returns only if the
/// socket fails for good.
pub async fn serve(
    socket: Arc<UdpSocket>,
    unicast: bool,
    shared: Shared6,
) -> Result<(), Dhcp6Error> {
    let Shared6 {
        sender,
        link,
        responder,
        leases,
        committer,
        metrics,
    } = shared;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (datagram, from) = receive(&socket, &mut buf).await;
        let (kind, handled) = handle(&responder, datagram, from, unicast, link, now_unix());
        if let Some(kind) = kind {
            metrics.dhcp6_message(false, kind);
        }
        let (reply, commits, records) = match handled {
            Handled::Drop(reason) => {
                if reason == PANIC {
                    metrics.panic(Service::Dhcp);
                }
                metrics.dhcp6_dropped(reason);
                tracing::debug!(%from, reason, "DHCPv6 message not answered");
                continue;
            }
            Handled::Reply {
                reply,
                commits,
                records,
            } => (reply, commits, records),
        };
        for record in records {
            if committer.record(record).is_err() {
                tracing::warn!(
                    "the commit queue is full; a DHCPv6 release or decline was not written"
                );
            }
        }
        if commits.is_empty() {
            send(&sender, &reply, &metrics).await;
            continue;
        }
        let mut waits = Vec::new();
        let mut commits = commits.into_iter();
        while let Some((lease, ticket)) = commits.next() {
            let Ok(durable) = committer.submit(lease.clone(), ticket) else {
                // Shed: no Reply (the client retransmits), and the book's hold on this and
                // every lease of the reply not queued is given back at once, as v4 does; the
                // ones queued already become durable and are the client's.
                metrics.dhcp6_dropped("overloaded");
                for (lease, ticket) in std::iter::once((lease, ticket)).chain(commits.by_ref()) {
                    if let Err(error) = leases.abandon(&lease, ticket) {
                        tracing::error!(%error, "the address book cannot answer");
                    }
                }
                waits.clear();
                break;
            };
            waits.push(durable);
        }
        if waits.is_empty() {
            continue;
        }
        let (sender, metrics) = (sender.clone(), metrics.clone());
        // Each Reply in a task of its own, sent once every lease it promises is durable.
        tokio::spawn(async move {
            for durable in waits {
                match tokio::time::timeout(COMMIT_TIMEOUT, durable).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(NoAck::Withdrawn))) => {
                        metrics.dhcp6_dropped("withdrawn");
                        return;
                    }
                    // A pair serves no DHCPv6 (refused in the settings); were it to, this
                    // is a lease only the partner's taking it could make acknowledgeable.
                    Ok(Ok(Err(NoAck::NotTakenByPartner))) => {
                        metrics.dhcp6_dropped("unreplicated");
                        return;
                    }
                    Ok(Ok(Err(NoAck::Failed(error)))) => {
                        tracing::error!(%error, "storing a DHCPv6 lease failed; no Reply sent");
                        metrics.dhcp6_dropped("commit_failed");
                        return;
                    }
                    Ok(Err(_)) | Err(_) => {
                        metrics.dhcp6_dropped("commit_timeout");
                        return;
                    }
                }
            }
            send(&sender, &reply, &metrics).await;
            tracing::info!(to = %reply.to, "DHCPv6 Reply: address leased");
        });
    }
}

/// Opens the PXE boot-service socket, `[server address]:4011` ([`BOOT_SERVICE_PORT`]).
pub fn open_boot_service(interface: &str, address: Ipv6Addr) -> Result<UdpSocket, Dhcp6Error> {
    let err = |source| Dhcp6Error::Socket {
        what: format!("PXE boot service [{address}]:{BOOT_SERVICE_PORT} on {interface}"),
        source,
    };
    let socket = socket2::Socket::new(
        socket2::Domain::IPV6,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .map_err(err)?;
    socket.set_only_v6(true).map_err(err)?;
    socket
        .bind_device(Some(interface.as_bytes()))
        .map_err(err)?;
    socket
        .bind(&SocketAddr::V6(SocketAddrV6::new(address, BOOT_SERVICE_PORT, 0, 0)).into())
        .map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    UdpSocket::from_std(socket.into()).map_err(err)
}

/// Answers PXE boot-service Requests on `socket` (proxy mode): the answer is a proxy Reply
/// (boot options, no address), sent back from port 4011 to the port the Request came
/// from. Nothing here is durable.
pub async fn serve_boot_service(
    socket: UdpSocket,
    address: Ipv6Addr,
    responder: Arc<Responder6>,
    metrics: Arc<Metrics>,
) -> Result<(), Dhcp6Error> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (datagram, from) = receive(&socket, &mut buf).await;
        match boot_service(&responder, datagram, from, address, now_unix()) {
            Ok(reply) => {
                tracing::info!(%from, "PXE boot-service Request answered with the boot options");
                send(&socket, &reply, &metrics).await;
            }
            Err(reason) => {
                metrics.dhcp6_dropped(reason);
                tracing::debug!(%from, reason, "PXE boot-service message not answered");
            }
        }
    }
}

/// One boot-service datagram: a Request to us (not relayed; unicast by design, so no
/// `UseMulticast`), answered as in proxy mode, back to where it came from.
fn boot_service(
    responder: &Responder6,
    datagram: &[u8],
    from: SocketAddrV6,
    link: Ipv6Addr,
    now: u64,
) -> Result<Outgoing, &'static str> {
    if datagram.first() != Some(&u8::from(MessageType::Request)) {
        return Err("not_a_boot_service_request");
    }
    match handle(responder, datagram, from, false, link, now).1 {
        Handled::Reply { mut reply, .. } => {
            reply.to = from;
            Ok(reply)
        }
        Handled::Drop(reason) => Err(reason),
    }
}

/// The next IPv6 datagram on `socket` and its sender. A failed receive is logged and waited
/// out briefly (a socket error must not spin the loop).
async fn receive<'b>(socket: &UdpSocket, buf: &'b mut [u8]) -> (&'b [u8], SocketAddrV6) {
    loop {
        match socket.recv_from(buf).await {
            Ok((len, SocketAddr::V6(from))) => return (buf.get(..len).unwrap_or_default(), from),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "DHCPv6 receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn send(socket: &UdpSocket, reply: &Outgoing, metrics: &Metrics) {
    match socket.send_to(&reply.bytes, SocketAddr::V6(reply.to)).await {
        Ok(_) => metrics.dhcp6_message(true, reply.kind),
        Err(error) => {
            tracing::warn!(%error, to = %reply.to, "sending a DHCPv6 reply failed");
            metrics.dhcp6_dropped("send_failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::backend::StaticBackend;
    use crate::config::Settings;
    use crate::dhcp6::decide::BootSettings6;
    use crate::dhcp6::settings::Dhcp6File;
    use crate::leases::Leases;
    use dhcproto::{Decodable, Decoder};

    fn responder() -> Responder6 {
        let settings = Settings::parse("serverAddress: 10.99.0.1\ndhcp: {mode: off}\n").unwrap();
        let file: Dhcp6File = serde_saphyr::from_str(
            "mode: full\nserverAddress: fd00:99::1\nsubnets:\n- prefix: fd00:99::/64\n  pool: [fd00:99::100, fd00:99::1ff]\n- prefix: fd00:98::/64\n  pool: [fd00:98::100, fd00:98::1ff]\n",
        )
        .unwrap();
        let dhcp6 = file
            .validate(settings.dhcp.unknown_machines, Some("br0"))
            .unwrap()
            .with_interface_mac([2, 0, 0, 0, 0, 1]);
        Responder6::new(
            Arc::new(dhcp6),
            BootSettings6 {
                uefi_x64: "snponly.efi".into(),
                http_base: "http://[fd00:99::1]:8080".into(),
            },
            Arc::new(StaticBackend::new(Vec::new())),
            Arc::new(Leases::in_memory()),
        )
    }

    /// A Solicit with Rapid Commit from client `n`.
    fn solicit(n: u8) -> Vec<u8> {
        use dhcproto::v6::{DhcpOption, DhcpOptions, IANA};
        let mut m = Message::new_with_id(MessageType::Solicit, [n, 0, 1]);
        m.opts_mut()
            .insert(DhcpOption::ClientId(vec![0, 2, 0, 0, 1, 0x57, n]));
        m.opts_mut().insert(DhcpOption::RapidCommit);
        m.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: DhcpOptions::new(),
        }));
        let mut bytes = Vec::new();
        m.encode(&mut Encoder::new(&mut bytes)).unwrap();
        bytes
    }

    fn address_of(reply: &[u8]) -> Option<Ipv6Addr> {
        use dhcproto::v6::DhcpOption;
        let m = Message::decode(&mut Decoder::new(reply)).ok()?;
        m.opts().iter().find_map(|o| match o {
            DhcpOption::IANA(ia) => ia.opts.iter().find_map(|o| match o {
                DhcpOption::IAAddr(a) => Some(a.addr),
                _ => None,
            }),
            _ => None,
        })
    }

    const LINK: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);

    #[test]
    fn a_direct_client_is_answered_on_port_546_of_its_link_local_address() {
        let from = SocketAddrV6::new("fe80::5054:ff:fe00:1".parse().unwrap(), 546, 0, 7);
        let (kind, handled) = handle(&responder(), &solicit(1), from, false, LINK, 1_000);
        assert_eq!(kind, Some(MessageType::Solicit));
        let Handled::Reply { reply, commits, .. } = handled else {
            panic!("{handled:?}");
        };
        assert_eq!(reply.to, SocketAddrV6::new(*from.ip(), CLIENT_PORT, 0, 7));
        assert_eq!(reply.kind, MessageType::Reply);
        assert_eq!(commits.len(), 1);
        assert!(address_of(&reply.bytes).is_some_and(|a| a.segments()[1] == 0x99));
    }

    #[test]
    fn a_relayed_client_is_answered_through_its_relay_with_its_links_prefix() {
        let hop = RelayHop {
            hop_count: 0,
            link: "fd00:98::1".parse().unwrap(),
            peer: "fe80::5054:ff:fe00:2".parse().unwrap(),
            interface_id: Some(b"port7".to_vec()),
            link_layer: None,
        };
        // A Relay-Forward: the same envelope layout a Relay-Reply has, with type 12.
        let mut forward = relay::wrap(std::slice::from_ref(&hop), &solicit(2)).unwrap();
        forward[0] = 12;
        let from = SocketAddrV6::new("fd00:99::2".parse().unwrap(), 547, 0, 0);
        let (_, handled) = handle(&responder(), &forward, from, true, LINK, 1_000);
        let Handled::Reply { reply, .. } = handled else {
            panic!("{handled:?}");
        };
        assert_eq!(reply.to, SocketAddrV6::new(*from.ip(), SERVER_PORT, 0, 0));
        // Read back as if forwarded (unwrap takes Relay-Forwards only).
        let mut as_forward = reply.bytes.clone();
        as_forward[0] = 12;
        let back = relay::unwrap(&as_forward).unwrap();
        assert_eq!(back.hops[0].interface_id.as_deref(), Some(&b"port7"[..]));
        assert_eq!(reply.bytes[0], 13, "a Relay-Reply");
        // The relay's link address chose the prefix, and unicast through a relay is fine.
        assert!(address_of(back.client).is_some_and(|a| a.segments()[1] == 0x98));
    }

    #[test]
    fn the_boot_service_answers_a_request_to_us_from_port_4011_back_to_its_port() {
        let r = responder();
        let from = SocketAddrV6::new("fd00:99::1d6".parse().unwrap(), BOOT_SERVICE_PORT, 0, 0);
        // A Solicit has no business on port 4011.
        assert_eq!(
            boot_service(&r, &solicit(3), from, LINK, 1_000).err(),
            Some("not_a_boot_service_request")
        );
        // A Request naming another server is not ours (full-mode responder: the decision
        // of what to put in is `decide`'s, tested there; here, where the answer goes).
        let mut request = Message::decode(&mut Decoder::new(&solicit(3))).unwrap();
        request.set_msg_type(MessageType::Request);
        request
            .opts_mut()
            .insert(dhcproto::v6::DhcpOption::ServerId(vec![
                0, 3, 0, 1, 2, 0, 0, 0, 0, 9,
            ]));
        let mut bytes = Vec::new();
        request.encode(&mut Encoder::new(&mut bytes)).unwrap();
        assert_eq!(
            boot_service(&r, &bytes, from, LINK, 1_000).err(),
            Some("other_server")
        );
        let mut ours = request.clone();
        ours.opts_mut().remove(dhcproto::v6::OptionCode::ServerId);
        ours.opts_mut()
            .insert(dhcproto::v6::DhcpOption::ServerId(r.server_duid().to_vec()));
        let mut bytes = Vec::new();
        ours.encode(&mut Encoder::new(&mut bytes)).unwrap();
        let reply = boot_service(&r, &bytes, from, LINK, 1_000).unwrap();
        assert_eq!(reply.to, from, "back to port 4011, not 546");
        assert_eq!(reply.kind, MessageType::Reply);
    }

    #[test]
    fn damaged_datagrams_are_dropped_with_their_reason() {
        let from = SocketAddrV6::new("fe80::1".parse().unwrap(), 546, 0, 1);
        let r = responder();
        assert!(matches!(
            handle(&r, &[12, 0, 1], from, false, LINK, 0).1,
            Handled::Drop("malformed_relay")
        ));
        assert!(matches!(
            handle(&r, &[1], from, false, LINK, 0).1,
            Handled::Drop("malformed")
        ));
    }
}
