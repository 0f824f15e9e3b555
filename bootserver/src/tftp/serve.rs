//! The TFTP socket loop and transfers.

use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use super::packet::{self, Limits, Reply, Requested, error_code};
use super::{Refusal, TftpError, resolve};
use crate::dhcp::serve::panic_message;
use crate::metrics::{Metrics, Service};

/// Transfers at once; beyond that requests get "server busy" (counted).
pub const MAX_TRANSFERS: usize = 256;
/// Retransmissions of one window before a transfer is given up.
const MAX_RETRIES: u32 = 5;

/// A request the server will serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The resolved file, inside the root.
    pub path: PathBuf,
    /// The options asked for.
    pub options: Requested,
}

/// A request refused: the reason (a metric label) and the TFTP error to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The metric label.
    pub reason: &'static str,
    /// The TFTP error code.
    pub code: u16,
    /// The error message.
    pub message: &'static str,
}

/// Decides one datagram sent to the server port: parse, then confine the path to `root`
/// (canonical).
pub fn accept(root: &Path, datagram: &[u8]) -> Result<Accepted, Refused> {
    let request = packet::parse_request(datagram).map_err(|m| Refused {
        reason: m.as_str(),
        code: m.error_code(),
        message: match m {
            packet::Malformed::Write => "read-only server",
            _ => "malformed request",
        },
    })?;
    let path = resolve(root, request.path()).map_err(|r| Refused {
        reason: r.as_str(),
        code: match r {
            Refusal::OutsideRoot => error_code::ACCESS,
            Refusal::NotFound => error_code::NOT_FOUND,
        },
        message: match r {
            Refusal::OutsideRoot => "access violation",
            Refusal::NotFound => "file not found",
        },
    })?;
    Ok(Accepted {
        path,
        options: request.options,
    })
}

/// Removes a client from the active set when its transfer ends, however it ends.
struct ActiveGuard {
    active: Arc<Mutex<HashSet<SocketAddr>>>,
    peer: SocketAddr,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if let Ok(mut active) = self.active.lock() {
            active.remove(&self.peer);
        }
    }
}

/// Serves TFTP on `addr` until the future is dropped. Bind to the interface's address, not
/// 0.0.0.0: each transfer opens its own socket on the same address.
pub async fn serve(addr: SocketAddr, root: &Path, metrics: Arc<Metrics>) -> Result<(), TftpError> {
    let root = std::fs::canonicalize(root).map_err(|source| TftpError::Root {
        path: root.to_owned(),
        source,
    })?;
    let socket = UdpSocket::bind(addr)
        .await
        .map_err(|source| TftpError::Server { addr, source })?;
    let limits = Limits::default();
    let slots = Arc::new(Semaphore::new(MAX_TRANSFERS));
    let active: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let mut buf = vec![0u8; 2048];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(error) => {
                tracing::warn!(%error, "TFTP receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let datagram = buf.get(..len).unwrap_or_default();
        let accepted = match std::panic::catch_unwind(AssertUnwindSafe(|| accept(&root, datagram)))
        {
            Ok(a) => a,
            Err(panic) => {
                tracing::error!(%peer, panic = panic_message(panic.as_ref()), "TFTP: a panic while reading a request; dropped it");
                metrics.panic(Service::Tftp);
                continue;
            }
        };
        let accepted = match accepted {
            Ok(a) => a,
            Err(refused) => {
                metrics.tftp_refused(refused.reason);
                tracing::info!(%peer, reason = refused.reason, "TFTP request refused");
                let _ = socket
                    .send_to(&packet::encode_error(refused.code, refused.message), peer)
                    .await;
                continue;
            }
        };
        // A retransmitted request while its transfer runs: the transfer answers it.
        let fresh = active.lock().map(|mut a| a.insert(peer)).unwrap_or(false);
        if !fresh {
            continue;
        }
        let guard = ActiveGuard {
            active: active.clone(),
            peer,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics.tftp_refused("busy");
            let _ = socket
                .send_to(
                    &packet::encode_error(error_code::UNDEFINED, "server busy"),
                    peer,
                )
                .await;
            continue;
        };
        metrics.tftp_transfers.inc();
        tracing::debug!(%peer, path = %accepted.path.display(), "TFTP transfer");
        let metrics = metrics.clone();
        let local = addr.ip();
        tokio::spawn(async move {
            let run = transfer(local, peer, accepted, limits, &metrics);
            match AssertUnwindSafe(run).catch_unwind().await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::info!(%peer, %error, "TFTP transfer ended early"),
                Err(panic) => {
                    tracing::error!(%peer, panic = panic_message(panic.as_ref()), "TFTP: a panic in a transfer; it was dropped");
                    metrics.panic(Service::Tftp);
                }
            }
            drop(guard);
            drop(permit);
        });
    }
}

/// Why a transfer ended early.
#[derive(Debug, thiserror::Error)]
enum TransferError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no acknowledgement after {MAX_RETRIES} retransmissions")]
    TimedOut,
    #[error("the client sent an error")]
    ClientAborted,
}

/// Sends one file: an OACK first when options were negotiated (acknowledged by ACK 0),
/// then windows of DATA blocks, each window retransmitted until a block of it is
/// acknowledged. Block numbers roll over to 0 after 65535 (files above 32 MiB at 512 bytes).
async fn transfer(
    local: IpAddr,
    peer: SocketAddr,
    accepted: Accepted,
    limits: Limits,
    metrics: &Metrics,
) -> Result<(), TransferError> {
    let file = tokio::fs::File::open(&accepted.path).await?;
    let size = file.metadata().await?.len();
    let negotiated = packet::negotiate(&accepted.options, &limits, size);
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    // Connected: datagrams from any other address or port never reach this transfer.
    socket.connect(peer).await?;
    let timeout = negotiated.timeout;
    // Window entries: (absolute block number, packet).
    let mut window: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    if !negotiated.oack.is_empty() {
        window.push_back((0, packet::encode_oack(&negotiated.oack)));
        let acked = send_and_wait(&socket, &window, timeout).await?;
        window.retain(|(n, _)| *n > acked);
    }
    let blksize = usize::from(negotiated.blksize);
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut next: u64 = 1;
    let mut read_all = false;
    loop {
        while window.len() < usize::from(negotiated.windowsize) && !read_all {
            let mut data = vec![0u8; blksize];
            let mut filled = 0;
            while filled < blksize {
                let n = reader.read(&mut data[filled..]).await?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            data.truncate(filled);
            metrics.tftp_bytes.inc_by(filled as u64);
            read_all = filled < blksize;
            window.push_back((next, packet::encode_data(next as u16, &data)));
            next += 1;
        }
        if window.is_empty() {
            return Ok(());
        }
        let acked = send_and_wait(&socket, &window, timeout).await?;
        window.retain(|(n, _)| *n > acked);
    }
}

/// Sends the window and waits for an ACK of one of its blocks; returns the absolute number
/// of the block acknowledged (the client has everything up to it, RFC 7440). ACKs of
/// earlier blocks (duplicates) are ignored, so a late ACK never doubles the traffic.
async fn send_and_wait(
    socket: &UdpSocket,
    window: &VecDeque<(u64, Vec<u8>)>,
    timeout: Duration,
) -> Result<u64, TransferError> {
    let mut buf = [0u8; 1024];
    for _ in 0..=MAX_RETRIES {
        for (_, packet) in window {
            socket.send(packet).await?;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let received = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await;
            let Ok(received) = received else {
                break; // retransmit
            };
            // ICMP errors (the client went away) surface here: give up on the transfer.
            let len = received?;
            match packet::parse_reply(buf.get(..len).unwrap_or_default()) {
                Reply::Ack(block) => {
                    if let Some((n, _)) = window.iter().find(|(n, _)| *n as u16 == block) {
                        return Ok(*n);
                    }
                }
                Reply::Error => return Err(TransferError::ClientAborted),
                Reply::Other => {}
            }
        }
    }
    Err(TransferError::TimedOut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    /// A window-16 transfer of a file that needs more than 65,536 blocks of 512 bytes:
    /// block numbers roll over to 0 and the file arrives whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn block_numbers_roll_over_in_a_long_windowed_transfer() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..65_600u32 * 512).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("big"), &content).unwrap();
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = tokio::spawn({
            let root = dir.path().to_owned();
            async move { serve(addr, &root, Arc::new(Metrics::default())).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client
            .send_to(
                b"\x00\x01big\x00octet\x00blksize\x00512\x00windowsize\x0016\x00",
                addr,
            )
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let (len, transfer) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!(
            &buf[..len],
            b"\x00\x06blksize\x00512\x00windowsize\x0016\x00"
        );
        client.send_to(&[0, 4, 0, 0], transfer).await.unwrap();
        let mut received = Vec::new();
        let mut expected: u16 = 1;
        let mut in_window = 0;
        loop {
            let (len, _) =
                tokio::time::timeout(Duration::from_secs(10), client.recv_from(&mut buf))
                    .await
                    .expect("a DATA packet")
                    .unwrap();
            assert_eq!(&buf[..2], &[0, 3]);
            let block = u16::from_be_bytes([buf[2], buf[3]]);
            if block != expected {
                continue; // a retransmission
            }
            received.extend_from_slice(&buf[4..len]);
            in_window += 1;
            let last = len - 4 < 512;
            if in_window == 16 || last {
                client
                    .send_to(&[0, 4, buf[2], buf[3]], transfer)
                    .await
                    .unwrap();
                in_window = 0;
            }
            expected = expected.wrapping_add(1);
            if last {
                break;
            }
        }
        assert!(expected < 200, "block numbers rolled over ({expected})");
        assert!(
            received == content,
            "{} of {} bytes",
            received.len(),
            content.len()
        );
        server.abort();
    }
}
