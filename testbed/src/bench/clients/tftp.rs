//! A lock-step TFTP client (RFC 1350 with the blksize option, RFC 2348), as a PXE ROM
//! fetches its boot file: one block at a time, the last packet sent again after each
//! timeout.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::net::UdpSocket;

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TftpClientError {
    /// Socket trouble.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent an ERROR packet.
    #[error("server error {code}: {message}")]
    Server {
        /// The TFTP error code.
        code: u16,
        /// Its message.
        message: String,
    },
    /// Nothing arrived after every attempt.
    #[error("timed out waiting for block {0}")]
    Timeout(u16),
    /// A packet that makes no sense here.
    #[error("unexpected packet: {0}")]
    Unexpected(String),
}

/// The read request for `file` in octet mode asking for `blksize`.
pub fn read_request(file: &str, blksize: u16) -> Vec<u8> {
    let mut packet = vec![0, 1];
    for part in [file, "octet", "blksize", &blksize.to_string()] {
        packet.extend_from_slice(part.as_bytes());
        packet.push(0);
    }
    packet
}

fn ack(block: u16) -> Vec<u8> {
    let b = block.to_be_bytes();
    vec![0, 4, b[0], b[1]]
}

/// What a packet from the server is.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// DATA with its block number and payload.
    Data(u16, &'a [u8]),
    /// OACK with the block size it accepted (512 when it names none).
    OptionAck(u16),
    /// ERROR.
    Error(u16, String),
    /// Anything else.
    Other,
}

/// Reads a server packet.
pub fn parse_reply(packet: &[u8]) -> Reply<'_> {
    let word = |at: usize| {
        packet
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    match word(0) {
        Some(3) => match (word(2), packet.get(4..)) {
            (Some(block), Some(data)) => Reply::Data(block, data),
            _ => Reply::Other,
        },
        Some(5) => Reply::Error(
            word(2).unwrap_or(0),
            String::from_utf8_lossy(packet.get(4..).unwrap_or_default())
                .trim_end_matches('\0')
                .to_owned(),
        ),
        Some(6) => {
            let fields: Vec<&[u8]> = packet
                .get(2..)
                .unwrap_or_default()
                .split(|b| *b == 0)
                .collect();
            let blksize = fields
                .chunks(2)
                .find(|pair| {
                    pair.first()
                        .is_some_and(|k| k.eq_ignore_ascii_case(b"blksize"))
                })
                .and_then(|pair| pair.get(1))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .unwrap_or(512);
            Reply::OptionAck(blksize)
        }
        _ => Reply::Other,
    }
}

/// Fetches `file` from `server`, from an ephemeral port of `local`; returns its size.
pub async fn fetch(
    server: SocketAddrV4,
    local: Ipv4Addr,
    file: &str,
    blksize: u16,
    timeout: Duration,
    attempts: u32,
) -> Result<u64, TftpClientError> {
    let socket = UdpSocket::bind(SocketAddrV4::new(local, 0)).await?;
    let mut last = read_request(file, blksize);
    let mut to: SocketAddr = server.into();
    let mut transfer: Option<SocketAddr> = None;
    let mut size: u64 = 0;
    let mut expected: u16 = 1;
    let mut block_size = 512usize;
    let mut buf = vec![0u8; usize::from(blksize) + 4];
    socket.send_to(&last, to).await?;
    let mut tries = 1;
    loop {
        let (len, from) = match tokio::time::timeout(timeout, socket.recv_from(&mut buf)).await {
            Ok(received) => received?,
            Err(_) => {
                if tries >= attempts {
                    return Err(TftpClientError::Timeout(expected));
                }
                tries += 1;
                socket.send_to(&last, to).await?;
                continue;
            }
        };
        if transfer.is_some_and(|t| t != from) {
            continue; // another transfer's packet
        }
        let packet = buf.get(..len).unwrap_or_default();
        match parse_reply(packet) {
            Reply::OptionAck(accepted) if transfer.is_none() => {
                transfer = Some(from);
                to = from;
                block_size = usize::from(accepted);
                last = ack(0);
            }
            Reply::Data(block, data) if block == expected => {
                if transfer.is_none() {
                    // The server ignored the options: 512-byte blocks.
                    transfer = Some(from);
                    to = from;
                }
                size += data.len() as u64;
                last = ack(block);
                if data.len() < block_size {
                    socket.send_to(&last, to).await?;
                    return Ok(size);
                }
                expected = expected.wrapping_add(1);
            }
            // A duplicate: our ACK was lost; the resend below answers it.
            Reply::Data(..) | Reply::OptionAck(_) => {}
            Reply::Error(code, message) => return Err(TftpClientError::Server { code, message }),
            Reply::Other => {
                return Err(TftpClientError::Unexpected(format!(
                    "{:02x?}",
                    &packet[..len.min(8)]
                )));
            }
        }
        tries = 1;
        socket.send_to(&last, to).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_asks_for_the_block_size() {
        assert_eq!(
            read_request("undionly.kpxe", 1468),
            b"\0\x01undionly.kpxe\0octet\0blksize\x001468\0".to_vec()
        );
    }

    #[test]
    fn replies_are_read() {
        assert_eq!(parse_reply(b"\0\x03\0\x02abc"), Reply::Data(2, b"abc"));
        assert_eq!(
            parse_reply(b"\0\x06blksize\x001468\0"),
            Reply::OptionAck(1468)
        );
        assert_eq!(parse_reply(b"\0\x06tsize\x0042\0"), Reply::OptionAck(512));
        assert_eq!(
            parse_reply(b"\0\x05\0\x01File not found\0"),
            Reply::Error(1, "File not found".into())
        );
        assert_eq!(parse_reply(b"\0"), Reply::Other);
        assert_eq!(parse_reply(b"\0\x03\0"), Reply::Other);
    }
}
