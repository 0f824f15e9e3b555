//! The socket loop: receive, validate ([`wire::parse`]), decide ([`Responder::decide`]),
//! act. A panic while deciding is caught, logged and counted, and only that request is
//! dropped. Replies that wait for a durable lease run as tasks, at most
//! [`MAX_IN_FLIGHT`] at once; beyond that requests are shed (counted, and the address the
//! book held for them is given back), and a lease commit that takes longer than
//! [`COMMIT_TIMEOUT`] sends no ACK (the client retransmits; the book keeps the address for
//! it until the commit thread answers).
//!
//! The receive buffer holds the largest UDP datagram there is ([`MAX_DATAGRAM`]): a client
//! may announce (option 57) and send messages far beyond 1,500 bytes, over jumbo frames or
//! fragmented, and a datagram is never cut short silently.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use dhcproto::v4::MessageType;
use futures::FutureExt;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use super::Decision;
use super::commit::{Committer, NoAck};
use super::decide::Responder;
use super::reply::Reply;
use super::{DhcpError, DropReason, now_unix, wire};
use crate::config::Settings;
use crate::leases::{LeaseError, Leases, Record};
use crate::metrics::{Metrics, Service};

/// The largest UDP payload over IPv4 (65,535 bytes less the IP and UDP headers).
pub const MAX_DATAGRAM: usize = 65_507;
/// Replies (with their lease commits) in flight at once, per socket.
pub const MAX_IN_FLIGHT: usize = 1024;
/// The receive buffer asked for on each DHCP socket.
pub const RECV_BUFFER_BYTES: usize = 4 << 20;
/// The longest wait for a lease to become durable before the ACK is given up. Clients
/// retransmit after about 4 s.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(3);

/// Opens a UDP socket for DHCP on `port`, bound to the interface when one is configured,
/// allowed to broadcast.
pub fn open_socket(settings: &Settings, port: u16) -> Result<UdpSocket, DhcpError> {
    let what = format!(
        "port {port}{}",
        settings
            .interface
            .as_deref()
            .map(|i| format!(" of {i}"))
            .unwrap_or_default()
    );
    let err = |source| DhcpError::Socket {
        what: what.clone(),
        source,
    };
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    socket.set_broadcast(true).map_err(err)?;
    if let Some(interface) = &settings.interface {
        socket
            .bind_device(Some(interface.as_bytes()))
            .map_err(err)?;
    }
    // The default buffer (~200 KiB, a few hundred datagrams) overflows within milliseconds
    // when a burst of clients meets a busy core. With CAP_NET_ADMIN the size is forced past
    // net.core.rmem_max; without (the Deployment does not grant it), the kernel caps it
    // there: the log says which, and what to raise.
    let forced =
        rustix::net::sockopt::set_socket_recv_buffer_size_force(&socket, RECV_BUFFER_BYTES).is_ok();
    let plain_error = if forced {
        None
    } else {
        socket.set_recv_buffer_size(RECV_BUFFER_BYTES).err()
    };
    let reported = socket.recv_buffer_size().ok();
    match receive_buffer(RECV_BUFFER_BYTES, forced, reported) {
        ReceiveBuffer::Capped { asked, granted } => tracing::warn!(
            %what,
            asked,
            granted,
            error = plain_error.map(|e| e.to_string()),
            "DHCP receive buffer: {granted} of the {asked} bytes asked; net.core.rmem_max caps it and this process lacks CAP_NET_ADMIN to go past it (the Deployment does not grant it): a burst of clients may overflow the buffer; set net.core.rmem_max to at least {asked} on this host (sysctl)"
        ),
        ReceiveBuffer::Forced { bytes } => tracing::info!(
            %what,
            bytes,
            "DHCP receive buffer: {bytes} bytes, forced past net.core.rmem_max with CAP_NET_ADMIN"
        ),
        ReceiveBuffer::Granted { bytes } => tracing::info!(
            %what,
            bytes,
            "DHCP receive buffer: {bytes} bytes, within net.core.rmem_max"
        ),
        ReceiveBuffer::Unknown => tracing::warn!(
            %what,
            "DHCP receive buffer: its size could not be read back"
        ),
    }
    socket.set_nonblocking(true).map_err(err)?;
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    socket.bind(&addr.into()).map_err(err)?;
    UdpSocket::from_std(socket.into()).map_err(err)
}

/// What a DHCP socket's receive buffer became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiveBuffer {
    /// Forced to the size asked, past `net.core.rmem_max` (`SO_RCVBUFFORCE`, CAP_NET_ADMIN).
    Forced {
        /// Bytes.
        bytes: usize,
    },
    /// The size asked, which `net.core.rmem_max` allows.
    Granted {
        /// Bytes.
        bytes: usize,
    },
    /// Less than asked: `net.core.rmem_max` caps it and it could not be forced.
    Capped {
        /// Bytes asked.
        asked: usize,
        /// Bytes granted.
        granted: usize,
    },
    /// The size could not be read back.
    Unknown,
}

/// Decides what the buffer became from the size asked, whether forcing it succeeded and
/// the size the kernel reports (`SO_RCVBUF`, which Linux reports doubled: half is its
/// bookkeeping).
pub fn receive_buffer(asked: usize, forced: bool, reported: Option<usize>) -> ReceiveBuffer {
    let Some(reported) = reported else {
        return ReceiveBuffer::Unknown;
    };
    let granted = reported / 2;
    if forced {
        ReceiveBuffer::Forced { bytes: granted }
    } else if granted >= asked {
        ReceiveBuffer::Granted { bytes: granted }
    } else {
        ReceiveBuffer::Capped { asked, granted }
    }
}

/// Validates and decides one datagram, catching a panic of either step: the request's
/// message type (when it could be read) and the decision.
pub fn handle(
    responder: &Responder,
    datagram: &[u8],
    from: SocketAddr,
    port: u16,
    now: u64,
) -> (Option<MessageType>, Decision) {
    let SocketAddr::V4(from) = from else {
        return (None, Decision::Drop(wire::Malformed::NotIpv4.into()));
    };
    let decided = std::panic::catch_unwind(AssertUnwindSafe(|| {
        wire::parse(datagram).map(|request| {
            let kind = request.message_type;
            (kind, responder.decide(&request, from, port, now))
        })
    }));
    match decided {
        Ok(Ok((kind, decision))) => (Some(kind), decision),
        Ok(Err(malformed)) => (None, Decision::Drop(malformed.into())),
        Err(panic) => {
            tracing::error!(%from, len = datagram.len(), panic = panic_message(panic.as_ref()), "DHCP: a panic while handling a request; dropped it");
            (None, Decision::Drop(DropReason::Panic))
        }
    }
}

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

/// Answers DHCP on one socket. Returns only when the address book can no longer answer.
/// Every socket of a server shares one `committer`, so that records reach the log in the
/// order they were decided.
pub async fn serve(
    socket: UdpSocket,
    port: u16,
    responder: Arc<Responder>,
    leases: Arc<Leases>,
    committer: Committer,
    metrics: Arc<Metrics>,
) -> Result<(), DhcpError> {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(error) => {
                tracing::warn!(%error, "DHCP receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let datagram = buf.get(..len).unwrap_or_default();
        let (kind, decision) = handle(&responder, datagram, from, port, now_unix());
        if let Some(kind) = kind {
            metrics.dhcp_received(Some(kind));
        }
        if decision == Decision::Drop(DropReason::Panic) {
            metrics.panic(Service::Dhcp);
        }
        match decision {
            Decision::Drop(DropReason::LeaseStore) => {
                metrics.dhcp_dropped(DropReason::LeaseStore);
                // A store that cannot answer stays so: stop, so the process restarts and
                // reads the log again, rather than drop every request from now on.
                if let Err(error @ LeaseError::Poisoned) = leases.active(0) {
                    return Err(DhcpError::LeaseStore(error));
                }
            }
            Decision::Drop(reason) => {
                metrics.dhcp_dropped(reason);
                tracing::debug!(%from, reason = reason.as_str(), "DHCP request not answered");
            }
            Decision::Release { key, ip } => {
                if committer
                    .record(Record::Release { key, ip: ip.into() })
                    .is_err()
                {
                    // The book has the address free already; on disk the lease stays until
                    // it expires (after a restart it is held a little longer: safe).
                    tracing::warn!(%ip, "the commit queue is full; a release was not written");
                }
            }
            Decision::Decline { ip, until } => {
                tracing::warn!(%ip, "client declined an address: it is in use by someone else");
                if committer
                    .record(Record::Decline {
                        ip: ip.into(),
                        until_unix: until,
                    })
                    .is_err()
                {
                    tracing::warn!(%ip, "the commit queue is full; a decline was not written");
                }
            }
            Decision::Reply {
                reply,
                to,
                commit: None,
                reclaimed,
            } => {
                if reclaimed {
                    metrics.dhcp_offers_reclaimed.inc();
                }
                // Nothing to wait for (an OFFER, an INFORM's ACK, a NAK): answered in line,
                // without a task of its own (the send waits only if the socket's send buffer
                // is full).
                if let Err(panic) = AssertUnwindSafe(send(&socket, &reply, to, &metrics))
                    .catch_unwind()
                    .await
                {
                    tracing::error!(
                        panic = panic_message(panic.as_ref()),
                        "DHCP: a panic while sending a reply"
                    );
                    metrics.panic(Service::Dhcp);
                    metrics.dhcp_dropped(DropReason::Panic);
                }
            }
            Decision::Reply {
                reply,
                to,
                commit: Some((lease, ticket)),
                ..
            } => {
                // The lease is queued now, in the order the requests came. Shed, the book's
                // hold for it is given back at once.
                let queued = match in_flight.clone().try_acquire_owned() {
                    Ok(permit) => committer
                        .submit(lease.clone(), ticket)
                        .map(|durable| (permit, durable))
                        .ok(),
                    Err(_) => None,
                };
                let Some((permit, durable)) = queued else {
                    metrics.dhcp_dropped(DropReason::Overloaded);
                    if let Err(error) = leases.abandon(&lease, ticket) {
                        tracing::error!(%error, "the address book cannot answer");
                    }
                    continue;
                };
                let (socket, task_metrics) = (socket.clone(), metrics.clone());
                let (mac, ip) = (lease.mac, lease.ip);
                // Each ACK in a task of its own, waiting for the commit thread.
                let task = async move {
                    let stored = tokio::time::timeout(COMMIT_TIMEOUT, durable).await;
                    let failed = match stored {
                        Ok(Ok(Ok(()))) => None,
                        Ok(Ok(Err(NoAck::Withdrawn))) => {
                            // Released or declined while being written: not the client's.
                            task_metrics.dhcp_dropped(DropReason::Withdrawn);
                            return;
                        }
                        Ok(Ok(Err(NoAck::NotTakenByPartner))) => {
                            // Only the partner's taking it could make it acknowledgeable:
                            // the client keeps the lease it has until then.
                            task_metrics.dhcp_dropped(DropReason::Unreplicated);
                            return;
                        }
                        Ok(Ok(Err(NoAck::Failed(error)))) => {
                            Some((DropReason::CommitFailed, error))
                        }
                        Ok(Err(_)) => Some((
                            DropReason::CommitFailed,
                            "the commit thread stopped".to_owned(),
                        )),
                        Err(_) => Some((DropReason::CommitTimeout, "timed out".to_owned())),
                    };
                    if let Some((reason, error)) = failed {
                        tracing::error!(%error, "storing a lease failed; no ACK sent");
                        task_metrics.dhcp_dropped(reason);
                        return;
                    }
                    send(&socket, &reply, to, &task_metrics).await;
                    // One line per lease given: `kubectl unbounded logs` finds a machine's
                    // boots by its MAC and address.
                    tracing::info!(%mac, %ip, "DHCP ACK: address leased");
                };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
                        tracing::error!(
                            panic = panic_message(panic.as_ref()),
                            "DHCP: a panic while sending a reply"
                        );
                        metrics.panic(Service::Dhcp);
                        metrics.dhcp_dropped(DropReason::Panic);
                    }
                    drop(permit);
                });
            }
        }
    }
}

async fn send(socket: &UdpSocket, reply: &Reply, to: SocketAddrV4, metrics: &Metrics) {
    let bytes = match reply.encode() {
        Ok(b) => b,
        Err(error) => {
            tracing::error!(%error, "encoding a DHCP reply failed");
            metrics.dhcp_dropped(DropReason::Encode);
            return;
        }
    };
    match socket.send_to(&bytes, to).await {
        Ok(_) => metrics.dhcp_sent(reply.kind()),
        Err(error) => tracing::warn!(%error, %to, "sending a DHCP reply failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_buffer_is_described_as_the_kernel_set_it() {
        let asked = RECV_BUFFER_BYTES;
        let cases = [
            (
                "forced with CAP_NET_ADMIN",
                true,
                Some(2 * asked),
                ReceiveBuffer::Forced { bytes: asked },
            ),
            (
                "rmem_max large enough",
                false,
                Some(2 * asked),
                ReceiveBuffer::Granted { bytes: asked },
            ),
            (
                "capped at Debian's default rmem_max",
                false,
                Some(2 * 212_992),
                ReceiveBuffer::Capped {
                    asked,
                    granted: 212_992,
                },
            ),
            ("unreadable", false, None, ReceiveBuffer::Unknown),
        ];
        for (case, forced, reported, expected) in cases {
            assert_eq!(receive_buffer(asked, forced, reported), expected, "{case}");
        }
    }

    #[tokio::test]
    async fn dhcp_sockets_get_a_large_receive_buffer() {
        let settings = Settings::parse(
            "serverAddress: 10.99.0.1\ndhcp:\n  subnets:\n    - {subnet: 10.99.0.0/24, pool: [10.99.0.100, 10.99.0.199]}\n",
        )
        .unwrap();
        let socket = open_socket(&settings, 0).unwrap();
        let size = socket2::SockRef::from(&socket).recv_buffer_size().unwrap();
        let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Forced past rmem_max with CAP_NET_ADMIN (root here); capped at it otherwise.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let root = status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        let expected = if root {
            RECV_BUFFER_BYTES
        } else {
            RECV_BUFFER_BYTES.min(rmem_max)
        };
        assert!(
            size >= expected,
            "receive buffer {size} bytes, expected at least {expected}"
        );
    }
}
