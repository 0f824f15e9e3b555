//! The decision: from one validated [`Request`] plus the machine backend and the address
//! book, what to do: reply (and which lease to make durable first), release, decline, or
//! drop with a [`DropReason`]. The book's transitions happen here, under its lock, so that
//! one decision sees and leaves a consistent book; nothing else is written (the socket loop
//! persists what was decided). The fuzz target and the property test call this function.
//!
//! Invariants it keeps (checked by `dhcp/invariants.rs` over random interleavings):
//! - no address is offered to a client while another client holds it (a lease that has not
//!   expired, an offer that has not lapsed or was not reclaimed, a REQUEST being made
//!   durable, a decline), nor while it is another Machine's reservation;
//! - a REQUEST is acknowledged only for the address the client holds (its reservation,
//!   lease or claim) or, holding none, for a free address of the pool; the ACK waits for
//!   the lease to be durable, and the address stays the client's meanwhile.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dhcproto::v4::{DhcpOption, MessageType};

use super::DropReason;
use super::allocate::{Client, Cursors, OFFER_HOLD, Offer, Pool};
use super::limits::{Source, Sources};
use super::reply::{self, Reply};
use super::settings::{DhcpMode, Subnet, UnknownMachines};
use super::wire::Request;
use crate::backend::{MachineBackend, MachineRecord};
use crate::boot::{self, ClientKind};
use crate::config::Settings;
use crate::identity::PxeExchanges;
use crate::leases::book::Refused;
use crate::leases::{ClientKey, Lease, LeaseError, Leases, Ticket};

/// How long a declined address (in use by someone unknown) is kept out of the pool.
pub const DECLINE_HOLD: Duration = Duration::from_secs(600);

/// What to do with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send nothing.
    Drop(DropReason),
    /// Send this reply to this address, after making `commit` durable when set.
    Reply {
        /// The reply.
        reply: Reply,
        /// Where to.
        to: SocketAddrV4,
        /// A lease to make durable before sending (ACK), and the ticket the book gave its
        /// REQUEST: the book holds the address for the client until the commit thread
        /// answers.
        commit: Option<(Lease, Ticket)>,
        /// The offered address was taken back from the oldest offer nobody requested.
        reclaimed: bool,
    },
    /// The client gave its lease back (RELEASE): the book has it free; persist it.
    Release {
        /// The client.
        key: ClientKey,
        /// The address.
        ip: Ipv4Addr,
    },
    /// An address is in use by someone unknown (DECLINE): the book keeps it out of the pool
    /// until `until`; persist it.
    Decline {
        /// The address.
        ip: Ipv4Addr,
        /// Seconds since the Unix epoch.
        until: u64,
    },
}

/// The state of a REQUEST (RFC 2131 §4.3.2), from its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestState {
    /// Answering an offer: server identifier present.
    Selecting,
    /// Rebooted with a remembered address: requested address, no `ciaddr`.
    InitReboot(Ipv4Addr),
    /// Extending a lease: `ciaddr` set.
    Renewing(Ipv4Addr),
}

fn request_state(request: &Request) -> Option<RequestState> {
    if request.server_id.is_some() {
        return Some(RequestState::Selecting);
    }
    match (request.requested_ip, request.ciaddr.is_unspecified()) {
        (Some(ip), true) => Some(RequestState::InitReboot(ip)),
        (_, false) => Some(RequestState::Renewing(request.ciaddr)),
        (None, true) => None,
    }
}

/// One request with what is known about its client.
struct Context<'a> {
    request: &'a Request,
    key: ClientKey,
    kind: ClientKind,
    machine: Option<Arc<MachineRecord>>,
    now: u64,
}

impl Context<'_> {
    fn client(&self) -> Client<'_> {
        Client {
            key: &self.key,
            mac: self.request.mac,
            machine: self.machine.as_deref(),
        }
    }
}

/// Decides replies. Shared by the socket tasks.
pub struct Responder {
    settings: Arc<Settings>,
    backend: Arc<dyn MachineBackend>,
    leases: Arc<Leases>,
    cursors: Mutex<Cursors>,
    /// Which clients each relay and port was given a pool address ([`super::limits`]).
    sources: Mutex<Sources>,
    /// The PXE boot-server exchanges answered: the evidence that vouches for a machine's
    /// address in proxy mode ([`crate::identity`]).
    exchanges: Arc<PxeExchanges>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

fn store_failed(error: LeaseError) -> DropReason {
    tracing::error!(%error, "the address book cannot answer; request dropped");
    DropReason::LeaseStore
}

fn refused(refusal: Refused) -> DropReason {
    match refusal {
        Refused::Taken => DropReason::PoolExhausted,
        Refused::CommitInFlight => DropReason::CommitInFlight,
    }
}

impl Responder {
    /// A responder over these settings, machines and leases.
    pub fn new(
        settings: Arc<Settings>,
        backend: Arc<dyn MachineBackend>,
        leases: Arc<Leases>,
    ) -> Self {
        Self {
            settings,
            backend,
            leases,
            cursors: Mutex::default(),
            sources: Mutex::default(),
            exchanges: Arc::default(),
        }
    }

    /// The PXE exchanges this responder answered (shared with the HTTP server, which
    /// vouches for script and credential requests by them).
    pub fn exchanges(&self) -> Arc<PxeExchanges> {
        self.exchanges.clone()
    }

    /// Decides what to do with one request that arrived on `port` from `from` at `now`
    /// (seconds since the Unix epoch).
    pub fn decide(&self, request: &Request, from: SocketAddrV4, port: u16, now: u64) -> Decision {
        match self.try_decide(request, from, port, now) {
            Ok(decision) => decision,
            Err(reason) => Decision::Drop(reason),
        }
    }

    fn try_decide(
        &self,
        request: &Request,
        from: SocketAddrV4,
        port: u16,
        now: u64,
    ) -> Result<Decision, DropReason> {
        let context = Context {
            request,
            key: request.client_key(),
            kind: boot::classify(&request.hints),
            machine: self.backend.machine_by_mac(&request.mac),
            now,
        };
        if port == self.settings.dhcp.proxy_port {
            return self.boot_server(&context, from);
        }
        match self.settings.dhcp.mode {
            DhcpMode::Off => Err(DropReason::DhcpOff),
            DhcpMode::Proxy => self.proxy(&context),
            DhcpMode::Full => self.full(&context),
        }
    }

    /// Whether to give a network-booting client a boot file at all.
    fn boots(&self, client: ClientKind, machine: Option<&MachineRecord>) -> bool {
        client.is_network_boot()
            && match machine {
                Some(m) => boot::architecture_matches(m.architecture, client),
                None => self.settings.dhcp.unknown_machines == UnknownMachines::Discover,
            }
    }

    fn reply(&self, request: &Request, kind: MessageType) -> Reply {
        Reply::to(request, kind, self.settings.server_address)
    }

    /// The client's subnet: the relay's link selection (RFC 3527), option 118 (RFC 3011),
    /// `giaddr`, else the subnet of our own address.
    fn subnet_for(&self, request: &Request) -> Result<&Subnet, DropReason> {
        let link_selection = request
            .relay_agent_info
            .as_ref()
            .and_then(|r| r.link_selection)
            .filter(|_| request.relayed());
        let selector = link_selection
            .or(request.subnet_selection)
            .or_else(|| request.relayed().then_some(request.giaddr));
        let subnets = &self.settings.dhcp.subnets;
        match selector {
            Some(ip) => subnets
                .iter()
                .find(|s| s.contains(ip))
                .ok_or(DropReason::UnknownSubnet),
            None => subnets
                .iter()
                .find(|s| s.contains(self.settings.server_address))
                .or_else(|| subnets.first())
                .ok_or(DropReason::UnknownSubnet),
        }
    }

    /// A reply that gives `ip`: OFFER or ACK with the subnet's options and the boot file.
    fn grant(
        &self,
        context: &Context<'_>,
        kind: MessageType,
        subnet: &Subnet,
        ip: Ipv4Addr,
    ) -> Reply {
        let machine = context.machine.as_deref();
        let mut reply = self.reply(context.request, kind);
        reply.message.set_yiaddr(ip);
        if kind == MessageType::Ack {
            reply.message.set_ciaddr(context.request.ciaddr);
        }
        reply::add_config(&mut reply, subnet, machine);
        reply::add_lease_times(&mut reply, subnet.lease_seconds);
        if self.boots(context.kind, machine) {
            reply::add_boot(
                &mut reply,
                &self.settings,
                context.kind,
                &context.request.mac,
            );
        }
        reply
    }

    fn nak(&self, request: &Request, why: String) -> Decision {
        let mut nak = self.reply(request, MessageType::Nak);
        nak.message.opts_mut().insert(DhcpOption::Message(why));
        let to = reply::nak_destination(request, &mut nak, self.settings.dhcp.port);
        Decision::Reply {
            reply: nak,
            to,
            commit: None,
            reclaimed: false,
        }
    }

    fn full(&self, context: &Context<'_>) -> Result<Decision, DropReason> {
        let request = context.request;
        let machine = context.machine.as_deref();
        // An unknown machine that wants to network-boot is not ours to boot: stay silent so
        // that it moves on to its next boot device (unless discovery is on).
        if context.kind.is_network_boot() && machine.is_none() && !self.boots(context.kind, None) {
            return Err(DropReason::UnknownBootClient);
        }
        let subnet = self.subnet_for(request)?;
        let mut book = self.leases.book().map_err(store_failed)?;
        book.sweep(context.now);
        // Scan cursors are hints: after a panic caught while the lock was held, go on.
        let mut cursors = self
            .cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut pool = Pool {
            subnet,
            book: &mut book,
            backend: self.backend.as_ref(),
            cursors: &mut cursors,
            now: context.now,
        };
        let client = context.client();
        let key = &context.key;
        let now = context.now;
        // A client that is no Machine of ours counts against the limits of the relay and
        // port it is behind while it holds an address; one that holds none (or only a lease
        // that has expired) may get one only within them.
        let limited = if matches!(
            request.message_type,
            MessageType::Discover | MessageType::Request
        ) && machine.is_none()
        {
            Source::of(request, self.settings.dhcp.limits)
        } else {
            Vec::new()
        };
        if !limited.is_empty() {
            let book = &*pool.book;
            let holds = |k: &ClientKey| {
                book.claim_of(k, now).is_some()
                    || book.lease_of(k).is_some_and(|l| l.expires_unix > now)
            };
            let mut sources = self
                .sources
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !holds(key)
                && let Some(source) = sources.refusing(&limited, key, holds)
            {
                tracing::debug!(client = %key, source = source.kind(), "source at its limit of pool addresses; request dropped");
                return Err(DropReason::SourceLimit);
            }
        }
        let given = |sources: &Mutex<Sources>| {
            if !limited.is_empty() {
                sources
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .given(&limited, key);
            }
        };
        match request.message_type {
            MessageType::Discover => {
                let offer = pool
                    .choose_offer(&client, request.requested_ip)
                    .ok_or(DropReason::PoolExhausted)?;
                pool.take_reservation(&client, offer.ip());
                pool.book
                    .offer(
                        key,
                        request.mac,
                        offer.ip(),
                        now,
                        now + OFFER_HOLD.as_secs(),
                    )
                    .map_err(refused)?;
                given(&self.sources);
                Ok(Decision::Reply {
                    reply: self.grant(context, MessageType::Offer, subnet, offer.ip()),
                    to: reply::destination(request, self.settings.dhcp.port),
                    commit: None,
                    reclaimed: matches!(offer, Offer::Reclaimed(_)),
                })
            }
            MessageType::Request => {
                let Some(state) = request_state(request) else {
                    return Err(DropReason::NoAddress);
                };
                let asked = match state {
                    RequestState::Selecting => {
                        if request.server_id != Some(self.settings.server_address) {
                            // The client chose another server's offer.
                            pool.book.withdraw_offer(key);
                            return Err(DropReason::OtherServer);
                        }
                        request
                            .requested_ip
                            .or_else(|| {
                                (!request.ciaddr.is_unspecified()).then_some(request.ciaddr)
                            })
                            .ok_or(DropReason::NoAddress)?
                    }
                    RequestState::InitReboot(ip) | RequestState::Renewing(ip) => {
                        if matches!(state, RequestState::InitReboot(_)) && !subnet.contains(ip) {
                            // RFC 2131 §4.3.2: on the wrong network (moved to another
                            // rack): NAK at once, so it starts over.
                            return Ok(self.nak(
                                request,
                                format!(
                                    "{ip} is not on this network ({}/{})",
                                    subnet.network, subnet.prefix
                                ),
                            ));
                        }
                        // Without a record of this client, another server may own it.
                        if pool.record(&client).is_none() {
                            return Err(DropReason::UnknownClient);
                        }
                        ip
                    }
                };
                if !pool.acceptable(&client, asked) {
                    return Ok(self.nak(request, format!("{asked} is not available to {key}")));
                }
                // The address is the client's until the commit thread answers: no other
                // client may be offered it while the lease is being made durable.
                pool.take_reservation(&client, asked);
                let ticket = match pool.book.begin_commit(key, request.mac, asked, now) {
                    Ok(ticket) => ticket,
                    Err(Refused::Taken) => {
                        return Ok(self.nak(request, format!("{asked} is not available to {key}")));
                    }
                    Err(Refused::CommitInFlight) => return Err(DropReason::CommitInFlight),
                };
                given(&self.sources);
                Ok(Decision::Reply {
                    reply: self.grant(context, MessageType::Ack, subnet, asked),
                    to: reply::destination(request, self.settings.dhcp.port),
                    commit: Some((
                        Lease {
                            key: key.clone(),
                            mac: request.mac,
                            ip: asked,
                            expires_unix: now + u64::from(subnet.lease_seconds),
                        },
                        ticket,
                    )),
                    reclaimed: false,
                })
            }
            MessageType::Release => {
                let ip = request.ciaddr;
                if !pool.book.release(key, ip) {
                    return Err(DropReason::NotHeld);
                }
                Ok(Decision::Release {
                    key: key.clone(),
                    ip,
                })
            }
            MessageType::Decline => {
                // Only the address the client was given: nobody else may knock addresses
                // out of the pool.
                let ip = request.requested_ip.ok_or(DropReason::NotHeld)?;
                if pool.record(&client) != Some(ip) || !subnet.in_pool(ip) {
                    return Err(DropReason::NotHeld);
                }
                let until = now + DECLINE_HOLD.as_secs();
                pool.book.decline(ip, until);
                Ok(Decision::Decline { ip, until })
            }
            MessageType::Inform => {
                let mut reply = self.reply(request, MessageType::Ack);
                reply.message.set_ciaddr(request.ciaddr);
                reply::add_config(&mut reply, subnet, machine);
                Ok(Decision::Reply {
                    reply,
                    to: reply::destination(request, self.settings.dhcp.port),
                    commit: None,
                    reclaimed: false,
                })
            }
            _ => Err(DropReason::MessageType),
        }
    }

    /// ProxyDHCP on port 67: answer network-boot DISCOVERs (and REQUESTs) with boot
    /// information only; never an address.
    fn proxy(&self, context: &Context<'_>) -> Result<Decision, DropReason> {
        if !self.boots(context.kind, context.machine.as_deref()) {
            return Err(DropReason::NotOurBootClient);
        }
        let reply_kind = match context.request.message_type {
            MessageType::Discover => MessageType::Offer,
            MessageType::Request => MessageType::Ack,
            _ => return Err(DropReason::MessageType),
        };
        let mut reply = self.reply(context.request, reply_kind);
        if context.kind == ClientKind::Ipxe {
            // iPXE gets its script's URL only on port 4011: an offer without a boot file
            // makes it send a ProxyDHCP REQUEST there, from the address the other server
            // gave it and with its MAC, which is what vouches for that address when it
            // fetches its script ([`crate::identity`]).
            reply::add_proxy_offer_without_boot(&mut reply);
        } else {
            reply::add_boot(
                &mut reply,
                &self.settings,
                context.kind,
                &context.request.mac,
            );
            reply::add_pxe_discovery_control(&mut reply, context.kind);
        }
        let to = if context.request.relayed() {
            reply::destination(context.request, self.settings.dhcp.port)
        } else {
            SocketAddrV4::new(Ipv4Addr::BROADCAST, 68)
        };
        Ok(Decision::Reply {
            reply,
            to,
            commit: None,
            reclaimed: false,
        })
    }

    /// The PXE boot server on port 4011: the client has an address and asks us directly.
    fn boot_server(
        &self,
        context: &Context<'_>,
        from: SocketAddrV4,
    ) -> Result<Decision, DropReason> {
        if !self.boots(context.kind, context.machine.as_deref()) {
            return Err(DropReason::NotOurBootClient);
        }
        // The client asks from the address it was given, and says so in `ciaddr`: the
        // pairing of that address with its MAC is what proxy mode vouches by. A request
        // whose source is not its `ciaddr` pairs nothing.
        let ciaddr = context.request.ciaddr;
        if !ciaddr.is_unspecified() && *from.ip() == ciaddr {
            self.exchanges
                .record(context.request.mac, ciaddr, context.now);
            tracing::debug!(mac = %context.request.mac, ip = %ciaddr, "PXE boot-server exchange");
        }
        let mut reply = self.reply(context.request, MessageType::Ack);
        reply.message.set_ciaddr(context.request.ciaddr);
        reply::add_boot(
            &mut reply,
            &self.settings,
            context.kind,
            &context.request.mac,
        );
        reply::add_pxe_discovery_control(&mut reply, context.kind);
        Ok(Decision::Reply {
            reply,
            to: from,
            commit: None,
            reclaimed: false,
        })
    }
}
