//! DHCP: a full server (pools, reservations, durable leases) or a ProxyDHCP beside another
//! server (boot information only, never an address), on dhcproto.
//!
//! [`Responder::decide`] turns one request into a [`Decision`] from memory only (the backend
//! cache, the lease index, the allocator); the socket loop in [`serve`] does the I/O and
//! makes a lease durable before it sends the ACK that promises it.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode, UnknownOption};
use dhcproto::{Decodable, Decoder, Encodable};
use tokio::net::UdpSocket;

use crate::backend::{MacAddr, MachineBackend, MachineRecord};
use crate::boot::{self, BootFiles, ClientHints, ClientKind};
use crate::config::{DhcpMode, Settings, Subnet, UnknownMachines};
use crate::leases::{Lease, LeaseStore};
use crate::metrics::Metrics;

/// How long an offered address is held for the client that was offered it.
const OFFER_HOLD: Duration = Duration::from_secs(30);
/// How long a declined address (in use by someone unknown) is kept out of the pool.
const DECLINE_HOLD: Duration = Duration::from_secs(600);

/// Errors of the DHCP service.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    /// A socket could not be set up.
    #[error("DHCP socket on {what}: {source}")]
    Socket {
        /// Which socket.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send nothing; the reason is for the debug log and metrics.
    Drop(&'static str),
    /// Send this reply to this address, after making `commit` durable when set.
    Reply {
        /// The reply.
        message: Box<Message>,
        /// Where to.
        to: SocketAddrV4,
        /// A lease to make durable before sending (ACK).
        commit: Option<Lease>,
    },
    /// Release the client's lease (RELEASE).
    Release(MacAddr),
    /// Keep an address out of the pool (DECLINE).
    Decline(Ipv4Addr),
}

/// The client hints of a request.
pub fn hints(message: &Message) -> ClientHints {
    let opts = message.opts();
    ClientHints {
        architecture: match opts.get(OptionCode::ClientSystemArchitecture) {
            Some(DhcpOption::ClientSystemArchitecture(a)) => Some(u16::from(*a)),
            _ => None,
        },
        vendor_class: match opts.get(OptionCode::ClassIdentifier) {
            Some(DhcpOption::ClassIdentifier(v)) => Some(v.clone()),
            _ => None,
        },
        user_class: match opts.get(OptionCode::UserClass) {
            Some(DhcpOption::UserClass(v)) => Some(v.clone()),
            _ => None,
        },
        ipxe_options: opts.get(OptionCode::Unknown(175)).is_some(),
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Addresses offered but not yet requested.
#[derive(Debug, Default)]
struct Offers {
    by_mac: HashMap<MacAddr, (Ipv4Addr, u64)>,
    by_ip: HashMap<Ipv4Addr, MacAddr>,
    /// Per subnet: where the next pool scan starts, so that allocation is O(1) amortised.
    cursor: HashMap<Ipv4Addr, u32>,
    /// Holds made, to sweep expired ones periodically.
    holds: u64,
}

impl Offers {
    fn hold(&mut self, mac: MacAddr, ip: Ipv4Addr, until: u64, now: u64) {
        self.forget(mac);
        self.by_mac.insert(mac, (ip, until));
        self.by_ip.insert(ip, mac);
        self.holds += 1;
        // Expired holds are swept now and then: amortised O(1) per hold.
        if self.holds.is_multiple_of(4096) {
            self.by_mac.retain(|_, (_, until)| *until > now);
            let by_mac = &self.by_mac;
            self.by_ip.retain(|_, mac| by_mac.contains_key(mac));
        }
    }

    fn forget(&mut self, mac: MacAddr) {
        if let Some((ip, _)) = self.by_mac.remove(&mac) {
            self.by_ip.remove(&ip);
        }
    }

    fn held_by_other(&self, ip: Ipv4Addr, mac: MacAddr, now: u64) -> bool {
        self.by_ip.get(&ip).is_some_and(|holder| {
            *holder != mac
                && self
                    .by_mac
                    .get(holder)
                    .is_some_and(|(_, until)| *until > now)
        })
    }
}

/// Decides replies. Shared by the socket tasks.
pub struct Responder {
    settings: Arc<Settings>,
    backend: Arc<dyn MachineBackend>,
    leases: Arc<dyn LeaseStore>,
    offers: Mutex<Offers>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder over these settings, machines and leases.
    pub fn new(
        settings: Arc<Settings>,
        backend: Arc<dyn MachineBackend>,
        leases: Arc<dyn LeaseStore>,
    ) -> Self {
        Self {
            settings,
            backend,
            leases,
            offers: Mutex::default(),
        }
    }

    /// Decides what to do with one request that arrived on `port` from `from`.
    pub fn decide(&self, message: &Message, from: SocketAddrV4, port: u16) -> Decision {
        if message.opcode() != Opcode::BootRequest {
            return Decision::Drop("not a BOOTREQUEST");
        }
        let Some(mac) = MacAddr::from_slice(message.chaddr()).filter(|_| message.hlen() == 6)
        else {
            return Decision::Drop("no Ethernet hardware address");
        };
        let Some(kind) = message.opts().msg_type() else {
            return Decision::Drop("no message type");
        };
        let client = boot::classify(&hints(message));
        let machine = self.backend.machine_by_mac(&mac);
        if port == self.settings.proxy_port {
            return self.proxy_boot_server(message, mac, client, machine.as_deref(), from);
        }
        match self.settings.dhcp_mode {
            DhcpMode::Off => Decision::Drop("DHCP is off"),
            DhcpMode::Proxy => self.proxy(message, kind, mac, client, machine.as_deref()),
            DhcpMode::Full => self.full(message, kind, mac, client, machine.as_deref()),
        }
    }

    /// Whether to give a network-booting client a boot file at all.
    fn boots(&self, client: ClientKind, machine: Option<&MachineRecord>) -> bool {
        client.is_network_boot()
            && match machine {
                Some(m) => boot::architecture_matches(m.architecture, client),
                None => self.settings.unknown_machines == UnknownMachines::Discover,
            }
    }

    fn files(&self) -> (String, String) {
        (
            self.settings.uefi_boot_file.clone(),
            self.settings.http_base(),
        )
    }

    /// Adds the boot file (BOOTP `file` and option 67, `siaddr`) and, for HTTP boot, the
    /// echoed vendor class.
    fn add_boot(&self, reply: &mut Message, client: ClientKind, mac: &MacAddr) {
        let (uefi, base) = self.files();
        let files = BootFiles {
            uefi_x64: &uefi,
            http_base: &base,
        };
        let Some(file) = boot::boot_file(client, &files, mac) else {
            return;
        };
        reply.set_siaddr(self.settings.server_address);
        reply.set_fname_str(&file.name);
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::BootfileName(file.name.into_bytes()));
        opts.insert(DhcpOption::TFTPServerName(
            self.settings.server_address.to_string().into_bytes(),
        ));
        opts.insert(DhcpOption::ClassIdentifier(if file.echo_http_client {
            b"HTTPClient".to_vec()
        } else {
            b"PXEClient".to_vec()
        }));
        if client == ClientKind::Ipxe || client.is_network_boot() {
            // Option 175 with no-pxedhcp (176 = 1): iPXE does not wait for ProxyDHCP offers.
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::Unknown(175),
                vec![176, 1, 1],
            )));
        }
    }

    fn reply(&self, request: &Message, kind: MessageType) -> Message {
        let mut reply = Message::default();
        reply
            .set_opcode(Opcode::BootReply)
            .set_htype(request.htype())
            .set_xid(request.xid())
            .set_flags(request.flags())
            .set_giaddr(request.giaddr())
            .set_chaddr(request.chaddr());
        reply.opts_mut().insert(DhcpOption::MessageType(kind));
        reply
            .opts_mut()
            .insert(DhcpOption::ServerIdentifier(self.settings.server_address));
        reply
    }

    /// RFC 2131 4.1: relay, then a client that has an address, then broadcast.
    fn destination(&self, request: &Message) -> SocketAddrV4 {
        let giaddr = request.giaddr();
        if !giaddr.is_unspecified() {
            return SocketAddrV4::new(giaddr, self.settings.dhcp_port);
        }
        let ciaddr = request.ciaddr();
        if !ciaddr.is_unspecified() && !request.flags().broadcast() {
            return SocketAddrV4::new(ciaddr, 68);
        }
        SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
    }

    /// The subnet a request belongs to: the relay's, else the one our address is in.
    fn subnet_for(&self, request: &Message) -> Option<&Subnet> {
        let anchor = if request.giaddr().is_unspecified() {
            self.settings.server_address
        } else {
            request.giaddr()
        };
        self.settings
            .subnets
            .iter()
            .find(|s| s.contains(anchor))
            .or_else(|| self.settings.subnets.first())
    }

    fn is_reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> bool {
        self.backend
            .reserved_by(ip)
            .is_some_and(|m| !m.macs.contains(&mac))
    }

    /// Whether `ip` may be given to `mac` now.
    fn usable(&self, ip: Ipv4Addr, mac: MacAddr, offers: &Offers, now: u64) -> bool {
        let leased_to_other = self
            .leases
            .by_ip(ip)
            .is_some_and(|l| MacAddr(l.mac) != mac && l.expires_unix > now);
        !leased_to_other
            && !offers.held_by_other(ip, mac, now)
            && !self.is_reserved_for_other(ip, mac)
    }

    /// The address for a client: its reservation, its current lease, the address it asks
    /// for, or the next free one of the pool.
    fn choose(
        &self,
        subnet: &Subnet,
        mac: MacAddr,
        machine: Option<&MachineRecord>,
        requested: Option<Ipv4Addr>,
        offers: &mut Offers,
        now: u64,
    ) -> Option<Ipv4Addr> {
        if let Some(ip) = machine.and_then(|m| m.ipv4) {
            return Some(ip);
        }
        if let Some(lease) = self.leases.by_mac(mac.0)
            && subnet.contains(lease.ip)
            && !self.is_reserved_for_other(lease.ip, mac)
        {
            return Some(lease.ip);
        }
        if let Some((ip, _)) = offers.by_mac.get(&mac) {
            return Some(*ip);
        }
        if let Some(ip) = requested
            && subnet.in_pool(ip)
            && self.usable(ip, mac, offers, now)
        {
            return Some(ip);
        }
        let (first, last) = (u32::from(subnet.pool.0), u32::from(subnet.pool.1));
        let size = last - first + 1;
        let start = offers.cursor.get(&subnet.network).copied().unwrap_or(first);
        for step in 0..size {
            let candidate = first + (start.saturating_sub(first) + step) % size;
            let ip = Ipv4Addr::from(candidate);
            if self.usable(ip, mac, offers, now) {
                offers.cursor.insert(subnet.network, candidate + 1);
                return Some(ip);
            }
        }
        None
    }

    fn add_config(&self, reply: &mut Message, subnet: &Subnet, machine: Option<&MachineRecord>) {
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::SubnetMask(subnet.mask()));
        if let Some(gw) = subnet.gateway {
            opts.insert(DhcpOption::Router(vec![gw]));
        }
        if !subnet.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServer(subnet.dns.clone()));
        }
        if let Some(domain) = &subnet.domain {
            opts.insert(DhcpOption::DomainName(domain.clone()));
        }
        if let Some(hostname) = machine.and_then(|m| m.hostname.clone()) {
            opts.insert(DhcpOption::Hostname(hostname));
        }
    }

    fn add_lease_times(reply: &mut Message, seconds: u32) {
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::AddressLeaseTime(seconds));
        opts.insert(DhcpOption::Renewal(seconds / 2));
        opts.insert(DhcpOption::Rebinding(seconds / 8 * 7));
    }

    fn full(
        &self,
        request: &Message,
        kind: MessageType,
        mac: MacAddr,
        client: ClientKind,
        machine: Option<&MachineRecord>,
    ) -> Decision {
        // An unknown machine that wants to network-boot is not ours to boot: stay silent so
        // that it moves on to its next boot device (unless discovery is on).
        if client.is_network_boot() && machine.is_none() && !self.boots(client, None) {
            return Decision::Drop("unknown network-boot client");
        }
        let Some(subnet) = self.subnet_for(request) else {
            return Decision::Drop("no subnet");
        };
        let now = now_unix();
        let requested = match request.opts().get(OptionCode::RequestedIpAddress) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        };
        let server_id = match request.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
            _ => None,
        };
        let Ok(mut offers) = self.offers.lock() else {
            return Decision::Drop("allocator lock poisoned");
        };
        match kind {
            MessageType::Discover => {
                let Some(ip) = self.choose(subnet, mac, machine, requested, &mut offers, now)
                else {
                    return Decision::Drop("pool exhausted");
                };
                offers.hold(mac, ip, now + OFFER_HOLD.as_secs(), now);
                let mut reply = self.reply(request, MessageType::Offer);
                reply.set_yiaddr(ip);
                self.add_config(&mut reply, subnet, machine);
                Self::add_lease_times(&mut reply, subnet.lease_seconds);
                if self.boots(client, machine) {
                    self.add_boot(&mut reply, client, &mac);
                }
                Decision::Reply {
                    to: self.destination(request),
                    message: Box::new(reply),
                    commit: None,
                }
            }
            MessageType::Request => {
                if server_id.is_some_and(|id| id != self.settings.server_address) {
                    // The client chose another server's offer.
                    offers.forget(mac);
                    return Decision::Drop("request for another server");
                }
                let asked = requested.or_else(|| {
                    let c = request.ciaddr();
                    (!c.is_unspecified()).then_some(c)
                });
                let Some(asked) = asked else {
                    return Decision::Drop("request without an address");
                };
                let ours = self.settings.subnets.iter().any(|s| s.contains(asked));
                let expected = self.choose(subnet, mac, machine, Some(asked), &mut offers, now);
                if expected != Some(asked) || !subnet.contains(asked) {
                    if !ours {
                        return Decision::Drop("request for an address outside our subnets");
                    }
                    let mut nak = self.reply(request, MessageType::Nak);
                    nak.opts_mut().insert(DhcpOption::Message(format!(
                        "{asked} is not available to {mac}"
                    )));
                    return Decision::Reply {
                        to: SocketAddrV4::new(Ipv4Addr::BROADCAST, 68),
                        message: Box::new(nak),
                        commit: None,
                    };
                }
                // Keep holding the address while the lease is being made durable (the
                // index learns it only then): no other client may be offered it meanwhile.
                offers.hold(mac, asked, now + OFFER_HOLD.as_secs(), now);
                let mut reply = self.reply(request, MessageType::Ack);
                reply.set_yiaddr(asked);
                reply.set_ciaddr(request.ciaddr());
                self.add_config(&mut reply, subnet, machine);
                Self::add_lease_times(&mut reply, subnet.lease_seconds);
                if self.boots(client, machine) {
                    self.add_boot(&mut reply, client, &mac);
                }
                Decision::Reply {
                    to: self.destination(request),
                    message: Box::new(reply),
                    commit: Some(Lease {
                        mac: mac.0,
                        ip: asked,
                        expires_unix: now + u64::from(subnet.lease_seconds),
                    }),
                }
            }
            MessageType::Release => {
                offers.forget(mac);
                Decision::Release(mac)
            }
            MessageType::Decline => match requested {
                Some(ip) if subnet.contains(ip) => {
                    offers.forget(mac);
                    Decision::Decline(ip)
                }
                _ => Decision::Drop("decline without an address of ours"),
            },
            MessageType::Inform => {
                let mut reply = self.reply(request, MessageType::Ack);
                self.add_config(&mut reply, subnet, machine);
                let ciaddr = request.ciaddr();
                let to = if ciaddr.is_unspecified() {
                    self.destination(request)
                } else {
                    SocketAddrV4::new(ciaddr, 68)
                };
                Decision::Reply {
                    to,
                    message: Box::new(reply),
                    commit: None,
                }
            }
            _ => Decision::Drop("message type a server does not answer"),
        }
    }

    /// ProxyDHCP on port 67: answer network-boot DISCOVERs (and REQUESTs) with boot
    /// information only; never an address.
    fn proxy(
        &self,
        request: &Message,
        kind: MessageType,
        mac: MacAddr,
        client: ClientKind,
        machine: Option<&MachineRecord>,
    ) -> Decision {
        if !self.boots(client, machine) {
            return Decision::Drop("proxy: not a network-boot client we boot");
        }
        let reply_kind = match kind {
            MessageType::Discover => MessageType::Offer,
            MessageType::Request => MessageType::Ack,
            _ => return Decision::Drop("proxy: message type not answered"),
        };
        let mut reply = self.reply(request, reply_kind);
        reply.set_yiaddr(Ipv4Addr::UNSPECIFIED);
        self.add_boot(&mut reply, client, &mac);
        add_pxe_discovery_control(&mut reply, client);
        Decision::Reply {
            to: SocketAddrV4::new(Ipv4Addr::BROADCAST, 68),
            message: Box::new(reply),
            commit: None,
        }
    }

    /// The PXE boot server on port 4011: the client has an address and asks us directly.
    fn proxy_boot_server(
        &self,
        request: &Message,
        mac: MacAddr,
        client: ClientKind,
        machine: Option<&MachineRecord>,
        from: SocketAddrV4,
    ) -> Decision {
        if !self.boots(client, machine) {
            return Decision::Drop("boot server: not a network-boot client we boot");
        }
        let mut reply = self.reply(request, MessageType::Ack);
        reply.set_ciaddr(request.ciaddr());
        self.add_boot(&mut reply, client, &mac);
        add_pxe_discovery_control(&mut reply, client);
        Decision::Reply {
            to: from,
            message: Box::new(reply),
            commit: None,
        }
    }
}

/// Option 43, sub-option 6 (PXE_DISCOVERY_CONTROL) = 8: "the boot file in this offer is the
/// one; download it", so PXE firmware does not go through boot-server discovery.
fn add_pxe_discovery_control(reply: &mut Message, client: ClientKind) {
    if !client.is_http_boot() && client != ClientKind::Ipxe {
        reply
            .opts_mut()
            .insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
    }
}

/// Decodes a datagram; `None` when it is not a DHCP message.
pub fn decode(datagram: &[u8]) -> Option<Message> {
    Message::decode(&mut Decoder::new(datagram)).ok()
}

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
    socket.set_nonblocking(true).map_err(err)?;
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    socket.bind(&addr.into()).map_err(err)?;
    UdpSocket::from_std(socket.into()).map_err(err)
}

/// Answers DHCP on one socket until the task is dropped.
pub async fn serve(
    socket: UdpSocket,
    port: u16,
    responder: Arc<Responder>,
    leases: Arc<dyn LeaseStore>,
    metrics: Arc<Metrics>,
) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 1500];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(error) => {
                tracing::warn!(%error, "DHCP receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let SocketAddr::V4(from) = from else {
            continue;
        };
        let Some(request) = buf.get(..len).and_then(decode) else {
            metrics.dhcp_dropped("malformed");
            tracing::debug!(%from, len, "malformed DHCP packet dropped");
            continue;
        };
        let kind = request.opts().msg_type();
        metrics.dhcp_received(kind);
        let decision = responder.decide(&request, from, port);
        match decision {
            Decision::Drop(reason) => {
                metrics.dhcp_dropped(reason);
                tracing::debug!(%from, reason, "DHCP request not answered");
            }
            Decision::Release(mac) => {
                let leases = leases.clone();
                tokio::task::spawn_blocking(move || {
                    if let Err(error) = leases.release(mac.0) {
                        tracing::warn!(%error, %mac, "releasing a lease failed");
                    }
                });
            }
            Decision::Decline(ip) => {
                let leases = leases.clone();
                let until = now_unix() + DECLINE_HOLD.as_secs();
                tracing::warn!(%ip, "client declined an address: it is in use by someone else");
                tokio::task::spawn_blocking(move || {
                    if let Err(error) = leases.decline(ip, until) {
                        tracing::warn!(%error, %ip, "recording a declined address failed");
                    }
                });
            }
            Decision::Reply {
                message,
                to,
                commit,
            } => {
                let socket = socket.clone();
                let leases = leases.clone();
                let metrics = metrics.clone();
                // Each reply in its own task: concurrent ACKs share one durable write.
                tokio::spawn(async move {
                    if let Some(lease) = commit {
                        let stored =
                            tokio::task::spawn_blocking(move || leases.commit(lease)).await;
                        match stored {
                            Ok(Ok(())) => {}
                            Ok(Err(error)) => {
                                tracing::error!(%error, "storing a lease failed; no ACK sent");
                                metrics.dhcp_dropped("lease store failed");
                                return;
                            }
                            Err(error) => {
                                tracing::error!(%error, "lease store task failed; no ACK sent");
                                metrics.dhcp_dropped("lease store failed");
                                return;
                            }
                        }
                    }
                    send(&socket, &message, to, &metrics).await;
                });
            }
        }
    }
}

async fn send(socket: &UdpSocket, message: &Message, to: SocketAddrV4, metrics: &Metrics) {
    let bytes = match message.to_vec() {
        Ok(b) => b,
        Err(error) => {
            tracing::error!(%error, "encoding a DHCP reply failed");
            return;
        }
    };
    match socket.send_to(&bytes, to).await {
        Ok(_) => metrics.dhcp_sent(message.opts().msg_type()),
        Err(error) => tracing::warn!(%error, %to, "sending a DHCP reply failed"),
    }
}
