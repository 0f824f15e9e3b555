//! What the DHCPv6 server answers (RFC 8415 §16, §18.3), decided over the address book
//! the v4 server uses: one owner per address, whatever the family. Pure: the message, where
//! it came from, the time and the book in; the reply, the leases to make durable first
//! and the records to write out. The serving loop sends a reply that promises addresses
//! only after its leases are on disk, as for v4.
//!
//! Implemented: Solicit → Advertise (or Reply with Rapid Commit, RFC 8415 §18.3.1),
//! Request, Renew, Rebind, Release, Decline, Confirm, Information-Request; IA_NA, several per
//! message; the checks of §16 (client and server identifiers), UseMulticast for messages
//! unicast to us (we never send Server Unicast). Deliberately not: IA_TA and IA_PD (a
//! provisioning network hands out no temporary addresses or prefixes; their IAs are left
//! out of the reply, which RFC 8415 §18.3 allows for IA_TA and answers IA_PD with
//! NoPrefixAvail), Reconfigure, authentication (§20: unused in practice; identity is
//! [`crate::identity`]'s job).

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, IANA, Message, MessageType, OptionCode, Status, StatusCode,
    UnknownOption,
};

use super::boot::{self as boot6, PXE_ENTERPRISE};
use super::identify;
use super::settings::{Dhcp6Mode, Dhcp6Settings, Subnet6};
use crate::backend::{MacAddr, MachineBackend, MachineRecord};
use crate::boot::{self, BootFiles, ClientKind};
use crate::dhcp::allocate::OFFER_HOLD;
use crate::dhcp::decide::DECLINE_HOLD;
use crate::dhcp::settings::UnknownMachines;
use crate::leases::book::{AddressBook, Refused};
use crate::leases::{ClientKey, Lease, Leases, Record, Ticket};

/// Option 59 (RFC 5970): the boot file URL.
pub const OPTION_BOOTFILE_URL: u16 = 59;
/// The longest DUID (RFC 8415 §11.1: 128 octets and the type).
pub const MAX_DUID_LEN: usize = 130;
/// How many pool addresses a client's own probe tries before the oldest offer is reclaimed.
pub const PROBES: u32 = 64;

/// Where a client message came from, as the serving loop saw it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// The client's source address (a relayed message: the innermost relay's peer address).
    pub source: Ipv6Addr,
    /// An address on the client's link: the innermost relay's link address, else the
    /// server's own address on the interface the message came in on.
    pub link: Ipv6Addr,
    /// The innermost relay's client link-layer address option (79), if any.
    pub link_layer: Option<&'a [u8]>,
    /// Sent straight to one of our unicast addresses (not to the multicast group, not
    /// through a relay).
    pub unicast: bool,
}

/// What to do with a message.
#[derive(Debug)]
pub enum Decision6 {
    /// Send `reply` once every commit is durable (none durable: send nothing, the client
    /// retransmits); write `records` (releases, declines) first.
    Reply {
        /// The reply.
        reply: Message,
        /// Leases this reply promises, with the tickets of their claims in the book.
        commits: Vec<(Lease, Ticket)>,
        /// Records to write before replying (their failure costs no address: the book
        /// already has the address free or out of the pool).
        records: Vec<Record>,
    },
    /// No answer.
    Drop(Drop6),
}

/// Why a message gets no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop6 {
    /// DHCPv6 is off.
    Off,
    /// A message type a server does not answer (Advertise, Reply, Reconfigure, unknown).
    NotForServers,
    /// Identifiers missing, too long, or present where RFC 8415 §16 forbids them.
    Malformed,
    /// Its Server Identifier is another server's.
    OtherServer,
    /// Multicast-only message unicast to us (RFC 8415 §16: discard).
    Unicast,
    /// A network-boot client no Machine has, with discovery off.
    UnknownBootClient,
    /// In proxy mode: not a network-boot client.
    NotBooting,
    /// No configured prefix covers the client's link.
    UnknownLink,
    /// A Confirm or Rebind about addresses this server cannot judge.
    NothingToSay,
    /// The client's earlier Request is still being made durable.
    CommitInFlight,
    /// The book's lock is poisoned.
    LeaseStore,
}

impl Drop6 {
    /// For metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NotForServers => "not_for_servers",
            Self::Malformed => "malformed",
            Self::OtherServer => "other_server",
            Self::Unicast => "unicast",
            Self::UnknownBootClient => "unknown_boot_client",
            Self::NotBooting => "not_booting",
            Self::UnknownLink => "unknown_link",
            Self::NothingToSay => "nothing_to_say",
            Self::CommitInFlight => "commit_in_flight",
            Self::LeaseStore => "lease_store",
        }
    }
}

/// One message being answered: what it says, who sent it, on which prefix, from where, when.
#[derive(Clone, Copy)]
struct Exchange<'e> {
    message: &'e Message,
    client: &'e Client<'e>,
    subnet: &'e Subnet6,
    arrival: &'e Arrival<'e>,
    now: u64,
}

/// Who is asking.
struct Client<'m> {
    duid: &'m [u8],
    mac: Option<MacAddr>,
    machine: Option<Arc<MachineRecord>>,
    kind: ClientKind,
}

impl Client<'_> {
    fn key(&self, iaid: u32) -> ClientKey {
        ClientKey::Ia {
            duid: Box::from(self.duid),
            iaid,
        }
    }

    /// The MAC a lease records: the client's, else none (all zeros) when nothing yields one.
    fn lease_mac(&self) -> MacAddr {
        self.mac.unwrap_or(MacAddr([0; 6]))
    }
}

/// How the boot URL is made.
#[derive(Debug, Clone)]
pub struct BootSettings6 {
    /// The x86-64 UEFI iPXE file name.
    pub uefi_x64: String,
    /// `http://[addr]:port`.
    pub http_base: String,
}

/// The DHCPv6 responder: settings, machines and the shared lease state.
pub struct Responder6 {
    settings: Arc<Dhcp6Settings>,
    boot: BootSettings6,
    backend: Arc<dyn MachineBackend>,
    leases: Arc<Leases>,
}

impl std::fmt::Debug for Responder6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder6")
            .field("mode", &self.settings.mode)
            .finish_non_exhaustive()
    }
}

fn option_data(message: &Message, code: OptionCode) -> Option<&[u8]> {
    match message.opts().get(code)? {
        DhcpOption::ClientId(id) | DhcpOption::ServerId(id) => Some(id),
        _ => None,
    }
}

fn ianas(message: &Message) -> impl Iterator<Item = &IANA> {
    message.opts().iter().filter_map(|o| match o {
        DhcpOption::IANA(ia) => Some(ia),
        _ => None,
    })
}

fn addresses(ia: &IANA) -> impl Iterator<Item = Ipv6Addr> + '_ {
    ia.opts.iter().filter_map(|o| match o {
        DhcpOption::IAAddr(a) => Some(a.addr),
        _ => None,
    })
}

fn status(status: Status, msg: &str) -> DhcpOption {
    DhcpOption::StatusCode(StatusCode {
        status,
        msg: msg.to_owned(),
    })
}

/// FNV-1a of the key: where a client's probe of the pool starts, the same after a restart.
fn probe_start(duid: &[u8], iaid: u32) -> u128 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in duid.iter().chain(iaid.to_be_bytes().iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u128::from(hash)
}

/// One IA's outcome.
enum IaAnswer {
    /// The address, offered (Advertise) or being committed.
    Address(Ipv6Addr, Option<Ticket>),
    /// A status for the IA (NoAddrsAvail, NoBinding).
    Status(Status, &'static str),
    /// These addresses are not for this link: lifetimes 0.
    NotOnLink(Vec<Ipv6Addr>),
}

impl Responder6 {
    /// A responder over these settings, machines and leases.
    pub fn new(
        settings: Arc<Dhcp6Settings>,
        boot: BootSettings6,
        backend: Arc<dyn MachineBackend>,
        leases: Arc<Leases>,
    ) -> Self {
        Self {
            settings,
            boot,
            backend,
            leases,
        }
    }

    /// This server's DUID (its Server Identifier).
    pub fn server_duid(&self) -> &[u8] {
        &self.settings.server_duid
    }

    /// Decides what to answer `message` ([module docs](self)).
    pub fn decide(&self, message: &Message, arrival: &Arrival<'_>, now: u64) -> Decision6 {
        self.decided(message, arrival, now)
            .unwrap_or_else(Decision6::Drop)
    }

    fn decided(
        &self,
        message: &Message,
        arrival: &Arrival<'_>,
        now: u64,
    ) -> Result<Decision6, Drop6> {
        use MessageType as M;
        if self.settings.mode == Dhcp6Mode::Off {
            return Err(Drop6::Off);
        }
        let kind = message.msg_type();
        let client_id = option_data(message, OptionCode::ClientId);
        let server_id = option_data(message, OptionCode::ServerId);
        if client_id.is_some_and(|id| id.is_empty() || id.len() > MAX_DUID_LEN)
            || server_id.is_some_and(|id| id.is_empty() || id.len() > MAX_DUID_LEN)
        {
            return Err(Drop6::Malformed);
        }
        let ours = server_id.map(|id| id == self.settings.server_duid.as_slice());
        // RFC 8415 §16: which identifiers each message must and must not carry.
        match (kind, client_id.is_some(), ours) {
            (M::Solicit | M::Confirm | M::Rebind, true, None) => {}
            (M::Request | M::Renew | M::Release | M::Decline, true, Some(true)) => {}
            (M::InformationRequest, _, None | Some(true)) => {}
            (M::Request | M::Renew | M::Release | M::Decline, true, Some(false))
            | (M::InformationRequest, _, Some(false)) => return Err(Drop6::OtherServer),
            (
                M::Solicit
                | M::Confirm
                | M::Rebind
                | M::Request
                | M::Renew
                | M::Release
                | M::Decline,
                _,
                _,
            ) => return Err(Drop6::Malformed),
            _ => return Err(Drop6::NotForServers),
        }
        if kind == M::InformationRequest && ianas(message).next().is_some() {
            return Err(Drop6::Malformed);
        }
        if arrival.unicast {
            match kind {
                // We never sent Server Unicast: the client must use multicast (§18.4).
                M::Request | M::Renew | M::Release | M::Decline => {
                    let mut reply = self.reply_to(message, M::Reply);
                    reply
                        .opts_mut()
                        .insert(status(Status::UseMulticast, "send to ff02::1:2"));
                    return Ok(Decision6::Reply {
                        reply,
                        commits: Vec::new(),
                        records: Vec::new(),
                    });
                }
                M::InformationRequest => {}
                _ => return Err(Drop6::Unicast),
            }
        }
        let client = self.identify(message, arrival, client_id.unwrap_or_default());
        let boots = self.boots(&client);
        if self.settings.mode == Dhcp6Mode::Proxy {
            return self.proxy(message, &client, boots);
        }
        if client.kind.is_network_boot() && client.machine.is_none() && !boots {
            return Err(Drop6::UnknownBootClient);
        }
        if kind == M::InformationRequest {
            let mut reply = self.reply_to(message, M::Reply);
            self.add_config(&mut reply, message, &client, boots, arrival);
            return Ok(Decision6::Reply {
                reply,
                commits: Vec::new(),
                records: Vec::new(),
            });
        }
        let subnet = self
            .settings
            .subnets
            .iter()
            .find(|s| s.contains(arrival.link))
            .ok_or(Drop6::UnknownLink)?;
        let mut book = self.leases.book().map_err(|_| Drop6::LeaseStore)?;
        let exchange = Exchange {
            message,
            client: &client,
            subnet,
            arrival,
            now,
        };
        match kind {
            M::Solicit => {
                let rapid = self.settings.rapid_commit
                    && message.opts().get(OptionCode::RapidCommit).is_some();
                self.assign(&mut book, exchange, rapid)
            }
            M::Request => self.assign(&mut book, exchange, true),
            M::Renew | M::Rebind => self.extend(&mut book, exchange),
            M::Release => Ok(self.release(&mut book, message, &client)),
            M::Decline => Ok(self.decline(&mut book, message, &client, now)),
            M::Confirm => self.confirm(message, subnet),
            _ => Err(Drop6::NotForServers),
        }
    }

    /// Who the client is: its DUID, its MAC ([`identify::client_mac`]), its Machine, its
    /// kind (the v4 classification over v6 options).
    fn identify<'m>(
        &self,
        message: &'m Message,
        arrival: &Arrival<'_>,
        duid: &'m [u8],
    ) -> Client<'m> {
        let mac = identify::client_mac(arrival.link_layer, Some(duid), arrival.source)
            .map(|(mac, _)| mac);
        Client {
            duid,
            mac,
            machine: mac.and_then(|m| self.backend.machine_by_mac(&m)),
            kind: boot::classify(&boot6::hints(message)),
        }
    }

    /// Whether the client gets a boot file: as v4 decides it.
    fn boots(&self, client: &Client<'_>) -> bool {
        client.kind.is_network_boot()
            && client.kind != ClientKind::BiosPxe
            && match client.machine.as_deref() {
                Some(m) => boot::architecture_matches(m.architecture, client.kind),
                None => self.settings.unknown_machines == UnknownMachines::Discover,
            }
    }

    fn reply_to(&self, message: &Message, kind: MessageType) -> Message {
        let mut reply = Message::new_with_id(kind, message.xid());
        reply
            .opts_mut()
            .insert(DhcpOption::ServerId(self.settings.server_duid.clone()));
        if let Some(DhcpOption::ClientId(id)) = message.opts().get(OptionCode::ClientId) {
            reply.opts_mut().insert(DhcpOption::ClientId(id.clone()));
        }
        reply
    }

    /// Boot options (59, and 16 for HTTP boot, which UEFI requires echoed) and DNS.
    fn add_config(
        &self,
        reply: &mut Message,
        message: &Message,
        client: &Client<'_>,
        boots: bool,
        arrival: &Arrival<'_>,
    ) {
        if boots && let Some(url) = self.boot_url(client) {
            reply
                .opts_mut()
                .insert(DhcpOption::Unknown(UnknownOption::new(
                    OptionCode::from(OPTION_BOOTFILE_URL),
                    url.into_bytes(),
                )));
            if matches!(
                client.kind,
                ClientKind::UefiX64Http | ClientKind::UefiArm64Http
            ) {
                reply
                    .opts_mut()
                    .insert(boot6::vendor_class(PXE_ENTERPRISE, b"HTTPClient"));
            }
        }
        let wants_dns = match message.opts().get(OptionCode::ORO) {
            Some(DhcpOption::ORO(oro)) => oro.opts.contains(&OptionCode::DomainNameServers),
            _ => false,
        };
        if wants_dns
            && let Some(subnet) = self
                .settings
                .subnets
                .iter()
                .find(|s| s.contains(arrival.link))
            && !subnet.dns.is_empty()
        {
            reply
                .opts_mut()
                .insert(DhcpOption::DomainNameServers(subnet.dns.clone()));
        }
    }

    fn boot_url(&self, client: &Client<'_>) -> Option<String> {
        let files = BootFiles {
            uefi_x64: &self.boot.uefi_x64,
            http_base: &self.boot.http_base,
        };
        // A client with no MAC gets the discovery script's kind of URL: iPXE's script
        // route needs a MAC, so such a client gets the firmware file only.
        let mac = client.mac.unwrap_or(MacAddr([0; 6]));
        if client.mac.is_none() && client.kind == ClientKind::Ipxe {
            return None;
        }
        boot6::boot_file_url(client.kind, &files, &mac, self.settings.server_address)
    }

    /// Proxy mode: boot options to network-boot clients, no addresses (UEFI PXEv6 takes
    /// an Advertise with its vendor class and no IA address as a proxy offer).
    fn proxy(
        &self,
        message: &Message,
        client: &Client<'_>,
        boots: bool,
    ) -> Result<Decision6, Drop6> {
        if !boots {
            return Err(if client.kind.is_network_boot() {
                Drop6::UnknownBootClient
            } else {
                Drop6::NotBooting
            });
        }
        let kind = match message.msg_type() {
            MessageType::Solicit => MessageType::Advertise,
            MessageType::Request | MessageType::InformationRequest => MessageType::Reply,
            _ => return Err(Drop6::NotBooting),
        };
        let mut reply = self.reply_to(message, kind);
        // The class that marks a proxy offer: `PXEClient` for PXE; HTTP boot gets its own
        // class echoed by `add_config` (one vendor class, never both).
        if kind == MessageType::Advertise && !client.kind.is_http_boot() {
            reply
                .opts_mut()
                .insert(boot6::vendor_class(PXE_ENTERPRISE, b"PXEClient"));
        }
        let arrival = Arrival {
            source: Ipv6Addr::UNSPECIFIED,
            link: Ipv6Addr::UNSPECIFIED,
            link_layer: None,
            unicast: false,
        };
        self.add_config(&mut reply, message, client, boots, &arrival);
        Ok(Decision6::Reply {
            reply,
            commits: Vec::new(),
            records: Vec::new(),
        })
    }

    /// Solicit and Request: an address for each IA_NA, offered (Advertise) or committed.
    fn assign(
        &self,
        book: &mut AddressBook,
        exchange: Exchange<'_>,
        commit: bool,
    ) -> Result<Decision6, Drop6> {
        let Exchange {
            message,
            client,
            subnet,
            arrival,
            now,
        } = exchange;
        let rapid = commit && message.msg_type() == MessageType::Solicit;
        let kind = match (message.msg_type(), commit) {
            (MessageType::Solicit, false) => MessageType::Advertise,
            _ => MessageType::Reply,
        };
        let mut answers = Vec::new();
        for ia in ianas(message) {
            let key = client.key(ia.id);
            let hinted: Vec<Ipv6Addr> = addresses(ia).collect();
            let answer = match self.choose(book, &key, client, subnet, &hinted, now) {
                None => IaAnswer::Status(Status::NoAddrsAvail, "no address is free"),
                Some(ip) if commit => {
                    match book.begin_commit(&key, client.lease_mac(), ip.into(), now) {
                        Ok(ticket) => IaAnswer::Address(ip, Some(ticket)),
                        Err(Refused::CommitInFlight) => return Err(Drop6::CommitInFlight),
                        Err(Refused::Taken | Refused::OtherFamily) => {
                            IaAnswer::Status(Status::NoAddrsAvail, "no address is free")
                        }
                    }
                }
                Some(ip) => match book.offer(
                    &key,
                    client.lease_mac(),
                    ip.into(),
                    now,
                    now + OFFER_HOLD.as_secs(),
                ) {
                    Ok(()) => IaAnswer::Address(ip, None),
                    Err(Refused::CommitInFlight) => return Err(Drop6::CommitInFlight),
                    Err(Refused::Taken | Refused::OtherFamily) => {
                        IaAnswer::Status(Status::NoAddrsAvail, "no address is free")
                    }
                },
            };
            answers.push((ia.id, key, answer));
        }
        let mut reply = self.reply_to(message, kind);
        if rapid {
            reply.opts_mut().insert(DhcpOption::RapidCommit);
        }
        if kind == MessageType::Advertise && answers.is_empty() {
            // A Solicit with no IA_NA (an information-only client that solicits): status
            // only, so that the client does not take this as an offer of addresses.
            reply
                .opts_mut()
                .insert(status(Status::NoAddrsAvail, "no address was asked for"));
        }
        let commits = self.add_answers(&mut reply, subnet, client, answers, now);
        self.add_config(&mut reply, message, client, self.boots(client), arrival);
        Ok(Decision6::Reply {
            reply,
            commits,
            records: Vec::new(),
        })
    }

    /// The address for an IA: the key's own (lease or claim), else a hinted pool address
    /// free for it, else its probe of the pool, else the oldest offer nobody requested.
    fn choose(
        &self,
        book: &mut AddressBook,
        key: &ClientKey,
        client: &Client<'_>,
        subnet: &Subnet6,
        hinted: &[Ipv6Addr],
        now: u64,
    ) -> Option<Ipv6Addr> {
        let open = |book: &AddressBook, ip: Ipv6Addr| {
            !book.taken_from(ip.into(), key, now) && !self.reserved_for_other(ip, client)
        };
        if let Some(machine) = client.machine.as_deref()
            && let Some(ip) = machine.ipv6.filter(|ip| subnet.contains(*ip))
        {
            // Held under another identity of the same Machine (its firmware's DUID, then its
            // OS's): the address passes to the one asking now, as a v4 reservation does.
            book.hand_over(ip.into(), key, |mac| machine.macs.contains(&mac));
            if !book.taken_from(ip.into(), key, now) {
                return Some(ip);
            }
            tracing::warn!(%ip, machine = %machine.name, "a Machine's IPv6 reservation is held by another client; giving a pool address until that ends");
        }
        let own = [book.lease_of(key).map(|l| l.ip), book.claim_of(key, now)];
        if let Some(ip) = own
            .into_iter()
            .flatten()
            .filter_map(v6)
            .find(|ip| subnet.contains(*ip) && open(book, *ip))
        {
            return Some(ip);
        }
        if let Some(ip) = hinted
            .iter()
            .copied()
            .find(|ip| subnet.in_pool(*ip) && open(book, *ip))
        {
            return Some(ip);
        }
        // Pools are at most a /8's worth (prefixes are 8 bits or longer): no overflow.
        let size = subnet.pool_span() + 1;
        let first = u128::from(subnet.pool.0);
        let start = probe_start(client.duid, key_iaid(key)) % size;
        for step in 0..u128::from(PROBES).min(size) {
            let ip = Ipv6Addr::from(first + (start + step) % size);
            if open(book, ip) {
                return Some(ip);
            }
        }
        book.reclaim_oldest_offer(subnet.pool.0.into(), subnet.pool.1.into(), |_| true)
            .and_then(v6)
    }

    /// Whether `ip` is another Machine's reservation (never given out; a client with no
    /// MAC is no Machine's).
    fn reserved_for_other(&self, ip: Ipv6Addr, client: &Client<'_>) -> bool {
        self.backend
            .reserved_by(ip.into())
            .is_some_and(|m| client.mac.is_none_or(|mac| !m.macs.contains(&mac)))
    }

    /// Renew and Rebind: each IA's lease extended where the book has it as the key's.
    fn extend(&self, book: &mut AddressBook, exchange: Exchange<'_>) -> Result<Decision6, Drop6> {
        let Exchange {
            message,
            client,
            subnet,
            arrival,
            now,
        } = exchange;
        let kind = message.msg_type();
        let mut answers = Vec::new();
        for ia in ianas(message) {
            let key = client.key(ia.id);
            let asked: Vec<Ipv6Addr> = addresses(ia).collect();
            let (on_link, off_link): (Vec<_>, Vec<_>) =
                asked.iter().partition(|ip| subnet.contains(**ip));
            let held = book
                .lease_of(&key)
                .and_then(|l| v6(l.ip))
                .filter(|ip| on_link.contains(ip) && !book.taken_from((*ip).into(), &key, now));
            let answer = match held {
                Some(ip) => match book.begin_commit(&key, client.lease_mac(), ip.into(), now) {
                    Ok(ticket) => IaAnswer::Address(ip, Some(ticket)),
                    Err(Refused::CommitInFlight) => return Err(Drop6::CommitInFlight),
                    Err(Refused::Taken | Refused::OtherFamily) => {
                        IaAnswer::Status(Status::NoBinding, "no binding for this IA")
                    }
                },
                None if !off_link.is_empty() => IaAnswer::NotOnLink(off_link),
                // Rebind: the client may have lost its server; a lease it lost with
                // the book (a restart with an empty disk) is restored when the address
                // is free for it, as v4 does for INIT-REBOOT.
                None if kind == MessageType::Rebind => match on_link.iter().copied().find(|ip| {
                    subnet.in_pool(*ip)
                        && !book.taken_from((*ip).into(), &key, now)
                        && !self.reserved_for_other(*ip, client)
                }) {
                    Some(ip) => match book.begin_commit(&key, client.lease_mac(), ip.into(), now) {
                        Ok(ticket) => IaAnswer::Address(ip, Some(ticket)),
                        Err(Refused::CommitInFlight) => return Err(Drop6::CommitInFlight),
                        Err(_) => IaAnswer::Status(Status::NoBinding, "no binding for this IA"),
                    },
                    None => IaAnswer::Status(Status::NoBinding, "no binding for this IA"),
                },
                None => IaAnswer::Status(Status::NoBinding, "no binding for this IA"),
            };
            answers.push((ia.id, key, answer));
        }
        if answers.is_empty() {
            return Err(Drop6::NothingToSay);
        }
        let mut reply = self.reply_to(message, MessageType::Reply);
        let commits = self.add_answers(&mut reply, subnet, client, answers, now);
        self.add_config(&mut reply, message, client, self.boots(client), arrival);
        Ok(Decision6::Reply {
            reply,
            commits,
            records: Vec::new(),
        })
    }

    /// The IA options of a reply, and the leases they promise.
    fn add_answers(
        &self,
        reply: &mut Message,
        subnet: &Subnet6,
        client: &Client<'_>,
        answers: Vec<(u32, ClientKey, IaAnswer)>,
        now: u64,
    ) -> Vec<(Lease, Ticket)> {
        let preferred = subnet.preferred_seconds;
        let valid = subnet.valid_seconds;
        let mut commits = Vec::new();
        for (iaid, key, answer) in answers {
            let mut opts = DhcpOptions::new();
            let (t1, t2) = match answer {
                IaAnswer::Address(ip, ticket) => {
                    opts.insert(DhcpOption::IAAddr(IAAddr {
                        addr: ip,
                        preferred_life: preferred,
                        valid_life: valid,
                        opts: DhcpOptions::new(),
                    }));
                    if let Some(ticket) = ticket {
                        commits.push((
                            Lease {
                                key,
                                mac: client.lease_mac(),
                                ip: ip.into(),
                                expires_unix: now + u64::from(valid),
                            },
                            ticket,
                        ));
                    }
                    (preferred / 2, preferred / 5 * 4)
                }
                IaAnswer::Status(code, why) => {
                    opts.insert(status(code, why));
                    (0, 0)
                }
                IaAnswer::NotOnLink(ips) => {
                    for ip in ips {
                        opts.insert(DhcpOption::IAAddr(IAAddr {
                            addr: ip,
                            preferred_life: 0,
                            valid_life: 0,
                            opts: DhcpOptions::new(),
                        }));
                    }
                    (0, 0)
                }
            };
            reply.opts_mut().insert(DhcpOption::IANA(IANA {
                id: iaid,
                t1,
                t2,
                opts,
            }));
        }
        commits
    }

    /// Release: each address the key holds goes back; the reply says Success, and
    /// NoBinding for IAs without one (RFC 8415 §18.3.7).
    fn release(&self, book: &mut AddressBook, message: &Message, client: &Client<'_>) -> Decision6 {
        let mut reply = self.reply_to(message, MessageType::Reply);
        let mut records = Vec::new();
        for ia in ianas(message) {
            let key = client.key(ia.id);
            let mut released = false;
            for ip in addresses(ia) {
                if book.release(&key, ip.into()) {
                    records.push(Record::Release {
                        key: key.clone(),
                        ip: ip.into(),
                    });
                    released = true;
                }
            }
            if !released {
                let mut opts = DhcpOptions::new();
                opts.insert(status(Status::NoBinding, "no binding for this IA"));
                reply.opts_mut().insert(DhcpOption::IANA(IANA {
                    id: ia.id,
                    t1: 0,
                    t2: 0,
                    opts,
                }));
            }
        }
        reply.opts_mut().insert(status(Status::Success, "released"));
        Decision6::Reply {
            reply,
            commits: Vec::new(),
            records,
        }
    }

    /// Decline: each address the key holds is in use by someone else; it leaves the pool
    /// for [`DECLINE_HOLD`] (only the holder may decline: anyone else could empty the pool).
    fn decline(
        &self,
        book: &mut AddressBook,
        message: &Message,
        client: &Client<'_>,
        now: u64,
    ) -> Decision6 {
        let mut reply = self.reply_to(message, MessageType::Reply);
        let mut records = Vec::new();
        let until = now + DECLINE_HOLD.as_secs();
        for ia in ianas(message) {
            let key = client.key(ia.id);
            for ip in addresses(ia) {
                let holds = book.lease_of(&key).is_some_and(|l| l.ip == IpAddr::V6(ip))
                    || book.claim_of(&key, now) == Some(IpAddr::V6(ip));
                if holds {
                    book.decline(ip.into(), until);
                    records.push(Record::Decline {
                        ip: ip.into(),
                        until_unix: until,
                    });
                }
            }
        }
        reply.opts_mut().insert(status(Status::Success, "declined"));
        Decision6::Reply {
            reply,
            commits: Vec::new(),
            records,
        }
    }

    /// Confirm: whether the client's addresses are on its link (RFC 8415 §18.3.3); no
    /// answer when it names none.
    fn confirm(&self, message: &Message, subnet: &Subnet6) -> Result<Decision6, Drop6> {
        let asked: Vec<Ipv6Addr> = ianas(message).flat_map(addresses).collect();
        if asked.is_empty() {
            return Err(Drop6::NothingToSay);
        }
        let mut reply = self.reply_to(message, MessageType::Reply);
        reply
            .opts_mut()
            .insert(if asked.iter().all(|ip| subnet.contains(*ip)) {
                status(Status::Success, "on link")
            } else {
                status(Status::NotOnLink, "not on this link")
            });
        Ok(Decision6::Reply {
            reply,
            commits: Vec::new(),
            records: Vec::new(),
        })
    }
}

fn v6(ip: IpAddr) -> Option<Ipv6Addr> {
    match ip {
        IpAddr::V6(ip) => Some(ip),
        IpAddr::V4(_) => None,
    }
}

fn key_iaid(key: &ClientKey) -> u32 {
    match key {
        ClientKey::Ia { iaid, .. } => *iaid,
        _ => 0,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
