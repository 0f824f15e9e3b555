//! A relay-mode DHCP client for many simulated clients at once (the boot storm and the
//! crash check): one UDP socket on port 67 of the relay address, giaddr set, replies
//! dispatched to the waiting client by transaction id. Messages carry option 61 as
//! perfdhcp's do (`01` and the MAC), so that a server keys both the same way.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dhcproto::v4::{self, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum DhcpClientError {
    /// Socket trouble.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// Encoding failed.
    #[error("encoding: {0}")]
    Encode(#[source] dhcproto::error::EncodeError),
    /// No answer after every attempt.
    #[error("no {0} after every attempt")]
    NoAnswer(&'static str),
    /// The server said no.
    #[error("NAK")]
    Nak,
}

/// What a client got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Its address.
    pub ip: Ipv4Addr,
    /// The boot file named (option 67 or the `file` field), if any.
    pub boot_file: Option<String>,
    /// The next server (siaddr), or the server identifier when siaddr is unset.
    pub next_server: Ipv4Addr,
}

/// A MAC as `aa:bb:…`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:…` (or perfdhcp's client identifier `01aabb…`).
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    let hex = match hex.len() {
        14 if hex.starts_with("01") => &hex[2..],
        12 => &hex[..],
        _ => return None,
    };
    let mut mac = [0u8; 6];
    for (i, byte) in mac.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(mac)
}

/// A DISCOVER or REQUEST as a relay forwards it; `pxe` adds what a BIOS PXE ROM sends.
pub fn message(
    mac: &[u8; 6],
    xid: u32,
    relay: Ipv4Addr,
    pxe: bool,
    request: Option<(Ipv4Addr, Ipv4Addr)>,
) -> Message {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(xid)
        .set_hops(1)
        .set_flags(Flags::default())
        .set_giaddr(relay)
        .set_chaddr(mac);
    let opts = m.opts_mut();
    let mut id = vec![1u8];
    id.extend_from_slice(mac);
    opts.insert(DhcpOption::ClientIdentifier(id));
    match request {
        None => {
            opts.insert(DhcpOption::MessageType(MessageType::Discover));
        }
        Some((ip, server)) => {
            opts.insert(DhcpOption::MessageType(MessageType::Request));
            opts.insert(DhcpOption::RequestedIpAddress(ip));
            opts.insert(DhcpOption::ServerIdentifier(server));
        }
    }
    if pxe {
        opts.insert(DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
        ));
        opts.insert(DhcpOption::ClientSystemArchitecture(
            v4::Architecture::X86_Bios,
        ));
        opts.insert(DhcpOption::ParameterRequestList(vec![
            OptionCode::SubnetMask,
            OptionCode::Router,
            OptionCode::TFTPServerName,
            OptionCode::BootfileName,
        ]));
    }
    m
}

/// The lease an ACK (or OFFER) describes.
pub fn lease_of(reply: &Message) -> Lease {
    let boot_file = match reply.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(name)) => Some(String::from_utf8_lossy(name).into_owned()),
        _ => reply
            .fname_str()
            .and_then(Result::ok)
            .map(|s| s.trim_end_matches('\0').to_owned())
            .filter(|s| !s.is_empty()),
    };
    let server_id = match reply.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
        _ => None,
    };
    let next_server = if reply.siaddr().is_unspecified() {
        server_id.unwrap_or(Ipv4Addr::UNSPECIFIED)
    } else {
        reply.siaddr()
    };
    Lease {
        ip: reply.yiaddr(),
        boot_file,
        next_server,
    }
}

type Waiters = Mutex<HashMap<u32, oneshot::Sender<Message>>>;

/// The relay socket and the clients waiting on it.
#[derive(Debug)]
pub struct Relay {
    socket: Arc<UdpSocket>,
    relay: Ipv4Addr,
    server: SocketAddrV4,
    waiting: Arc<Waiters>,
    receiver: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl Relay {
    /// Binds port 67 of `relay` and starts dispatching replies.
    pub async fn bind(relay: Ipv4Addr, server: Ipv4Addr) -> Result<Self, DhcpClientError> {
        let socket = Arc::new(UdpSocket::bind(SocketAddrV4::new(relay, 67)).await?);
        let waiting: Arc<Waiters> = Arc::default();
        let receiver = {
            let socket = socket.clone();
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1500];
                while let Ok((len, _)) = socket.recv_from(&mut buf).await {
                    let Some(reply) = buf
                        .get(..len)
                        .and_then(|b| Message::decode(&mut Decoder::new(b)).ok())
                    else {
                        continue;
                    };
                    let waiter = waiting
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&reply.xid());
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(reply);
                    }
                }
            })
        };
        Ok(Self {
            socket,
            relay,
            server: SocketAddrV4::new(server, 67),
            waiting,
            receiver,
        })
    }

    /// Sends `message` and waits for the reply with its xid, sending again after each
    /// `timeout` (as PXE ROMs do), `attempts` times in all.
    async fn exchange(
        &self,
        message: &Message,
        timeout: Duration,
        attempts: u32,
        what: &'static str,
    ) -> Result<Message, DhcpClientError> {
        let bytes = message.to_vec().map_err(DhcpClientError::Encode)?;
        for _ in 0..attempts {
            let (tx, rx) = oneshot::channel();
            self.waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(message.xid(), tx);
            self.socket.send_to(&bytes, self.server).await?;
            if let Ok(Ok(reply)) = tokio::time::timeout(timeout, rx).await {
                return Ok(reply);
            }
        }
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&message.xid());
        Err(DhcpClientError::NoAnswer(what))
    }

    /// DISCOVER, OFFER, REQUEST, ACK for one client.
    pub async fn dora(
        &self,
        mac: &[u8; 6],
        xid: u32,
        pxe: bool,
        timeout: Duration,
        attempts: u32,
    ) -> Result<Lease, DhcpClientError> {
        let offer = self
            .exchange(
                &message(mac, xid, self.relay, pxe, None),
                timeout,
                attempts,
                "OFFER",
            )
            .await?;
        if offer.opts().msg_type() != Some(MessageType::Offer) {
            return Err(DhcpClientError::NoAnswer("OFFER"));
        }
        let server = match offer.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => *s,
            _ => *self.server.ip(),
        };
        let ack = self
            .exchange(
                &message(mac, xid, self.relay, pxe, Some((offer.yiaddr(), server))),
                timeout,
                attempts,
                "ACK",
            )
            .await?;
        match ack.opts().msg_type() {
            Some(MessageType::Ack) => {
                let mut lease = lease_of(&ack);
                if lease.boot_file.is_none() {
                    lease.boot_file = lease_of(&offer).boot_file;
                }
                Ok(lease)
            }
            Some(MessageType::Nak) => Err(DhcpClientError::Nak),
            _ => Err(DhcpClientError::NoAnswer("ACK")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_read_from_both_notations() {
        let mac = [0x00, 0x0c, 0x01, 0x02, 0x03, 0x04];
        assert_eq!(parse_mac("01000c01020304"), Some(mac));
        assert_eq!(parse_mac("00:0c:01:02:03:04"), Some(mac));
        assert_eq!(format_mac(&mac), "00:0c:01:02:03:04");
        assert_eq!(parse_mac("02000c01020304"), None);
        assert_eq!(parse_mac("zz:0c:01:02:03:04"), None);
    }

    #[test]
    fn a_pxe_discover_is_relayed_with_the_client_identifier() {
        let mac = [2, 0, 0, 0, 0, 7];
        let m = message(&mac, 7, Ipv4Addr::new(10, 97, 0, 2), true, None);
        let bytes = m.to_vec().unwrap_or_default();
        let back = Message::decode(&mut Decoder::new(&bytes)).unwrap_or_default();
        assert_eq!(back.giaddr(), Ipv4Addr::new(10, 97, 0, 2));
        assert_eq!(back.opts().msg_type(), Some(MessageType::Discover));
        assert_eq!(
            back.opts().get(OptionCode::ClientIdentifier),
            Some(&DhcpOption::ClientIdentifier(vec![1, 2, 0, 0, 0, 0, 7]))
        );
        assert!(back.opts().get(OptionCode::ClassIdentifier).is_some());
        let request = message(
            &mac,
            7,
            Ipv4Addr::new(10, 97, 0, 2),
            false,
            Some((Ipv4Addr::new(10, 97, 1, 5), Ipv4Addr::new(10, 97, 0, 1))),
        );
        assert_eq!(
            request.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 97, 1, 5)))
        );
        assert!(request.opts().get(OptionCode::ClassIdentifier).is_none());
    }

    #[test]
    fn the_boot_file_comes_from_option_67_or_the_file_field() {
        let mut reply = Message::default();
        reply.set_yiaddr(Ipv4Addr::new(10, 97, 1, 9));
        reply.set_siaddr(Ipv4Addr::new(10, 97, 0, 1));
        reply.set_fname_str("undionly.kpxe");
        let lease = lease_of(&reply);
        assert_eq!(lease.boot_file.as_deref(), Some("undionly.kpxe"));
        assert_eq!(lease.next_server, Ipv4Addr::new(10, 97, 0, 1));
        reply
            .opts_mut()
            .insert(DhcpOption::BootfileName(b"http://x/boot.ipxe".to_vec()));
        assert_eq!(
            lease_of(&reply).boot_file.as_deref(),
            Some("http://x/boot.ipxe")
        );
    }
}
