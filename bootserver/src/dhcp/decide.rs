//! The decision: from one validated [`Request`] plus the machine backend and the address
//! book, what to do: reply (and which lease to make durable first), release, decline, or
//! drop with a [`DropReason`]. The book's transitions happen here, under its lock, so that
//! one decision sees and leaves a consistent book; nothing else is written (the socket loop
//! persists what was decided). The fuzz target and the property test call this function.
//!
//! A decision is a chain of steps over one [`Context`] (the request and what is known about
//! its client), each a function that returns what it decided, in this order:
//!
//! | step | function | decides |
//! |---|---|---|
//! | classify | [`Responder::classify`] | the client's kind (PXE, iPXE, HTTP boot, OS) and its Machine |
//! | route | [`Responder::route`] | boot server (port 4011), ProxyDHCP or full server, or drop (`dhcp.mode: off`) |
//! | admit | [`Responder::admit`] | a network-boot client we do not boot is not answered (full mode) |
//! | subnet | [`Responder::subnet_for`] | the client's subnet (link selection, option 118, `giaddr`, ours) |
//! | limits | [`Responder::limited_sources`] | the relay and port the client counts against, or drop at the limit |
//! | pool | [`Responder::assign`] | what the address book does for this message ([`Assignment`]), through [`Pool`] |
//! | boot options | [`Responder::boot_options`] | which boot options the reply carries ([`BootOptions`]), the same for all three routes |
//! | reply | [`Responder::reply_for`], [`Responder::proxy`], [`Responder::boot_server`] | the reply and where it goes |
//!
//! Addresses come from [`Pool`] (`allocate.rs`); replies are built by `reply.rs`.
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

use super::allocate::{Bindings, Client, Cursors, Offer, Pool};
use super::limits::{Source, Sources};
use super::reply::{self, BootOptions, Reply};
use super::settings::{DhcpMode, Subnet, UnknownMachines};
use super::wire::Request;
use super::{Decision, DropReason};
use crate::backend::{MachineBackend, MachineRecord};
use crate::boot::{self, ClientKind};
use crate::config::Settings;
use crate::ha::pair::{Pair, answerer};
use crate::ha::parts::{Half, Part};
use crate::identity::PxeExchanges;
use crate::leases::book::Refused;
use crate::leases::{ClientKey, Lease, LeaseError, Leases, Ticket};

/// How long a declined address (in use by someone unknown) is kept out of the pool.
pub const DECLINE_HOLD: Duration = Duration::from_secs(600);

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

/// One request with what is known about its client (the classify step's decision).
#[derive(Debug)]
pub struct Context<'a> {
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

/// Which path a request takes (the route step's decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Port 4011: the PXE boot server; the client has an address and asks us directly.
    BootServer,
    /// `dhcp.mode: proxy` on port 67: boot information only, never an address.
    Proxy,
    /// `dhcp.mode: full`: addresses and boot information.
    Full,
}

/// What the address book does for one message (the pool step's decision).
#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// DISCOVER: this address is held for the client as an offer.
    Offered(Offer),
    /// REQUEST: this address is the client's; its lease is being made durable.
    Acknowledged(Ipv4Addr, Ticket),
    /// REQUEST for an address the client may not have: DHCPNAK, saying why.
    Refused(String),
    /// RELEASE: the client's lease of this address is given back.
    Released(Ipv4Addr),
    /// DECLINE: this address is kept out of the pool until `until`.
    Declined(Ipv4Addr, u64),
    /// INFORM: the client has an address; it gets the subnet's options.
    Informed,
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
    /// With `ha:`: the pair's state, fed by its shells, and this server's half.
    pair: Option<(Arc<Mutex<Pair>>, Half)>,
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
        // A v4 client's key is never given a v6 address here: as good as taken.
        Refused::Taken | Refused::OtherFamily => DropReason::PoolExhausted,
        Refused::CommitInFlight => DropReason::CommitInFlight,
    }
}

/// Scan cursors and source counts are hints and tallies: after a panic caught while one of
/// their locks was held, go on with what they hold.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            pair: None,
        }
    }

    /// This server as one of a pair (`ha:`): `pair` says what the pair's state allows.
    /// Without `ha:` in the settings the pair is ignored.
    pub fn with_pair(mut self, pair: Arc<Mutex<Pair>>) -> Self {
        self.pair = self.settings.ha.as_ref().map(|ha| (pair, ha.half));
        self
    }

    /// The PXE exchanges this responder answered (shared with the HTTP server, which
    /// vouches for script and credential requests by them).
    pub fn exchanges(&self) -> Arc<PxeExchanges> {
        self.exchanges.clone()
    }

    /// Decides what to do with one request that arrived on `port` from `from` at `now`
    /// (seconds since the Unix epoch).
    pub fn decide(&self, request: &Request, from: SocketAddrV4, port: u16, now: u64) -> Decision {
        let context = self.classify(request, now);
        let decided = match self.route(port) {
            Ok(Route::BootServer) => self.boot_server(&context, from),
            Ok(Route::Proxy) => self.proxy(&context),
            Ok(Route::Full) => self.full(&context),
            Err(reason) => Err(reason),
        };
        decided.unwrap_or_else(Decision::Drop)
    }

    /// Step 1: who is asking (its kind, from the request's hints; its Machine, by MAC).
    pub fn classify<'a>(&self, request: &'a Request, now: u64) -> Context<'a> {
        Context {
            request,
            key: request.client_key(),
            kind: boot::classify(&request.hints),
            machine: self.backend.machine_by_mac(&request.mac),
            now,
        }
    }

    /// Step 2: the path, by the port the request came to and the DHCP mode.
    pub fn route(&self, port: u16) -> Result<Route, DropReason> {
        if port == self.settings.dhcp.proxy_port {
            return Ok(Route::BootServer);
        }
        match self.settings.dhcp.mode {
            DhcpMode::Off => Err(DropReason::DhcpOff),
            DhcpMode::Proxy => Ok(Route::Proxy),
            DhcpMode::Full => Ok(Route::Full),
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

    /// The boot-option step, the same for the three routes: nothing for a client we do not
    /// boot; for iPXE in proxy mode, an offer that sends it to port 4011; else the boot file
    /// (with PXE_DISCOVERY_CONTROL where we are not the address's server).
    pub fn boot_options(&self, context: &Context<'_>, route: Route) -> BootOptions {
        if !self.boots(context.kind, context.machine.as_deref()) {
            return BootOptions::None;
        }
        match route {
            Route::Full => BootOptions::File {
                discovery_control: false,
            },
            // iPXE gets its script's URL only on port 4011: an offer without a boot file
            // makes it send a ProxyDHCP REQUEST there, from the address the other server
            // gave it and with its MAC, which is what vouches for that address when it
            // fetches its script ([`crate::identity`]).
            Route::Proxy if context.kind == ClientKind::Ipxe => BootOptions::AskBootServer,
            Route::Proxy | Route::BootServer => BootOptions::File {
                discovery_control: true,
            },
        }
    }

    fn reply(&self, request: &Request, kind: MessageType) -> Reply {
        Reply::to(request, kind, self.settings.server_address)
    }

    /// Step 3 (full mode): an unknown machine that wants to network-boot is not ours to
    /// boot: stay silent so that it moves on to its next boot device (unless discovery is
    /// on).
    pub fn admit(&self, context: &Context<'_>) -> Result<(), DropReason> {
        if let Some((pair, half)) = &self.pair {
            let pair = lock(pair);
            if !pair.serves() {
                return Err(DropReason::PairRecovering);
            }
            // A DISCOVER is the partner's to answer while the pair is up, unless the
            // client says it has waited too long; everything else names its server or
            // its address.
            let request = context.request;
            let id = request.client_id.as_deref().unwrap_or(&request.mac.0);
            if request.message_type == MessageType::Discover
                && !pair.answers(answerer(id), *half, request.secs)
            {
                return Err(DropReason::PartnersClient);
            }
        }
        if context.kind.is_network_boot()
            && context.machine.is_none()
            && self.boot_options(context, Route::Full) == BootOptions::None
        {
            return Err(DropReason::UnknownBootClient);
        }
        Ok(())
    }

    /// Step 4: the client's subnet: the relay's link selection (RFC 3527), option 118
    /// (RFC 3011), `giaddr`, else the subnet of our own address.
    pub fn subnet_for(&self, request: &Request) -> Result<&Subnet, DropReason> {
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

    /// Step 5: the sources (relay, relay port) and their limits a client that is no Machine of ours counts
    /// against while it holds an address; one that holds none (or only a lease that has
    /// expired) may get one only within their limits.
    pub fn limited_sources(
        &self,
        context: &Context<'_>,
        pool: &Pool<'_>,
    ) -> Result<Vec<(Source, u32)>, DropReason> {
        let request = context.request;
        if !matches!(
            request.message_type,
            MessageType::Discover | MessageType::Request
        ) || context.machine.is_some()
        {
            return Ok(Vec::new());
        }
        let limited = Source::of(request, self.settings.dhcp.limits);
        if limited.is_empty() {
            return Ok(limited);
        }
        let key = &context.key;
        let holds = |k: &ClientKey| pool.holds_address(k);
        if !holds(key)
            && let Some(source) = lock(&self.sources).refusing(&limited, key, holds)
        {
            tracing::debug!(client = %key, source = source.kind(), "source at its limit of pool addresses; request dropped");
            return Err(DropReason::SourceLimit);
        }
        Ok(limited)
    }

    /// Step 6: what the address book does for this message.
    pub fn assign(
        &self,
        context: &Context<'_>,
        pool: &mut Pool<'_>,
    ) -> Result<Assignment, DropReason> {
        let request = context.request;
        let client = context.client();
        match request.message_type {
            MessageType::Discover => {
                let offer = pool
                    .choose_offer(&client, request.requested_ip)
                    .ok_or(DropReason::PoolExhausted)?;
                pool.hold_offer(&client, offer).map_err(refused)?;
                Ok(Assignment::Offered(offer))
            }
            MessageType::Request => self.assign_requested(context, pool),
            // In a pair a released address stays the client's until its lease ends: the
            // partner may extend that lease up to the expiry it knows, so the owner must not
            // give the address to another client before then (found by the pair's property
            // test). The client loses nothing: asking again, it gets the same address.
            MessageType::Release if self.pair.is_some() => Err(DropReason::ReleaseKeptInPair),
            MessageType::Release => {
                let ip = request.ciaddr;
                if !pool.release(&context.key, ip) {
                    return Err(DropReason::NotHeld);
                }
                Ok(Assignment::Released(ip))
            }
            MessageType::Decline => {
                // Only the address the client was given: nobody else may knock addresses
                // out of the pool.
                let ip = request.requested_ip.ok_or(DropReason::NotHeld)?;
                if pool.record(&client) != Some(ip) || !pool.subnet().in_pool(ip) {
                    return Err(DropReason::NotHeld);
                }
                let until = context.now + DECLINE_HOLD.as_secs();
                pool.decline(ip, until);
                Ok(Assignment::Declined(ip, until))
            }
            MessageType::Inform => Ok(Assignment::Informed),
            _ => Err(DropReason::MessageType),
        }
    }

    /// A REQUEST (RFC 2131 §4.3.2): the address it asks for, if the client may have it.
    fn assign_requested(
        &self,
        context: &Context<'_>,
        pool: &mut Pool<'_>,
    ) -> Result<Assignment, DropReason> {
        let request = context.request;
        let client = context.client();
        let key = &context.key;
        let subnet = pool.subnet();
        let state = request_state(request).ok_or(DropReason::NoAddress)?;
        let asked = match state {
            RequestState::Selecting => {
                if request.server_id != Some(self.settings.server_address) {
                    // The client chose another server's offer.
                    pool.withdraw_offer(key);
                    return Err(DropReason::OtherServer);
                }
                request
                    .requested_ip
                    .or_else(|| (!request.ciaddr.is_unspecified()).then_some(request.ciaddr))
                    .ok_or(DropReason::NoAddress)?
            }
            RequestState::InitReboot(ip) | RequestState::Renewing(ip) => {
                if matches!(state, RequestState::InitReboot(_)) && !subnet.contains(ip) {
                    // On the wrong network (moved to another rack): NAK at once, so that
                    // it starts over.
                    return Ok(Assignment::Refused(format!(
                        "{ip} is not on this network ({}/{})",
                        subnet.network, subnet.prefix
                    )));
                }
                // Without a record of this client, another server may own it.
                if pool.record(&client).is_none() {
                    return Err(DropReason::UnknownClient);
                }
                ip
            }
        };
        let not_available = || Assignment::Refused(format!("{asked} is not available to {key}"));
        if !pool.acceptable(&client, asked) {
            return Ok(not_available());
        }
        if let Some(held_back) = pool.unextendable(&client, asked) {
            return Err(held_back);
        }
        // The address is the client's until the commit thread answers: no other client may
        // be offered it while the lease is being made durable.
        match pool.begin_commit(&client, asked) {
            Ok(ticket) => Ok(Assignment::Acknowledged(asked, ticket)),
            Err(Refused::Taken | Refused::OtherFamily) => Ok(not_available()),
            Err(Refused::CommitInFlight) => Err(DropReason::CommitInFlight),
        }
    }

    /// What this server may bind where at `now`: as one of a pair, what the pair's state
    /// allows ([`Pair::allocates_in`], [`Pair::extends_partners_leases`]); alone, its pool.
    fn bindings(&self, now: u64) -> Bindings {
        let Some((pair, _)) = self.pair.as_ref() else {
            return Bindings::default();
        };
        let pair = lock(pair);
        Bindings {
            own: pair.allocates_in(Part::Own, now),
            partners_leases: pair.extends_partners_leases(),
            partners_new: pair.allocates_in(Part::Partners, now),
        }
    }

    /// The full server: the steps, in order.
    fn full(&self, context: &Context<'_>) -> Result<Decision, DropReason> {
        self.admit(context)?;
        let subnet = self.subnet_for(context.request)?;
        let mut book = self.leases.book().map_err(store_failed)?;
        let mut cursors = lock(&self.cursors);
        let mut pool = Pool::new(
            subnet,
            &mut book,
            self.backend.as_ref(),
            &mut cursors,
            context.now,
        )
        .bindings(self.bindings(context.now));
        let limited = self.limited_sources(context, &pool)?;
        let assignment = self.assign(context, &mut pool)?;
        if !limited.is_empty()
            && matches!(
                assignment,
                Assignment::Offered(_) | Assignment::Acknowledged(..)
            )
        {
            lock(&self.sources).given(&limited, &context.key);
        }
        Ok(self.reply_for(context, subnet, assignment))
    }

    /// Step 8 (full mode): the reply to an assignment, with the boot options step's.
    pub fn reply_for(
        &self,
        context: &Context<'_>,
        subnet: &Subnet,
        assignment: Assignment,
    ) -> Decision {
        let request = context.request;
        let to = reply::destination(request, self.settings.dhcp.port);
        match assignment {
            Assignment::Offered(offer) => Decision::Reply {
                reply: self.grant(context, MessageType::Offer, subnet, offer.ip()),
                to,
                commit: None,
                reclaimed: matches!(offer, Offer::Reclaimed(_)),
            },
            Assignment::Acknowledged(ip, ticket) => Decision::Reply {
                reply: self.grant(context, MessageType::Ack, subnet, ip),
                to,
                commit: Some((
                    Lease {
                        key: context.key.clone(),
                        mac: request.mac,
                        ip: ip.into(),
                        expires_unix: context.now + u64::from(subnet.lease_seconds),
                    },
                    ticket,
                )),
                reclaimed: false,
            },
            Assignment::Refused(why) => self.nak(request, why),
            Assignment::Released(ip) => Decision::Release {
                key: context.key.clone(),
                ip,
            },
            Assignment::Declined(ip, until) => Decision::Decline { ip, until },
            Assignment::Informed => {
                let mut reply = self.reply(request, MessageType::Ack);
                reply.message.set_ciaddr(request.ciaddr);
                reply::add_config(&mut reply, subnet, context.machine.as_deref());
                Decision::Reply {
                    reply,
                    to,
                    commit: None,
                    reclaimed: false,
                }
            }
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
        let mut reply = self.reply(context.request, kind);
        reply.message.set_yiaddr(ip);
        if kind == MessageType::Ack {
            reply.message.set_ciaddr(context.request.ciaddr);
        }
        reply::add_config(&mut reply, subnet, context.machine.as_deref());
        reply::add_lease_times(&mut reply, subnet.lease_seconds);
        self.add_boot_options(&mut reply, context, Route::Full);
        reply
    }

    fn add_boot_options(&self, reply: &mut Reply, context: &Context<'_>, route: Route) {
        reply::add_boot_options(
            reply,
            self.boot_options(context, route),
            &self.settings,
            context.kind,
            &context.request.mac,
        );
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

    /// ProxyDHCP on port 67: answer network-boot DISCOVERs (and REQUESTs) with boot
    /// information only; never an address.
    pub fn proxy(&self, context: &Context<'_>) -> Result<Decision, DropReason> {
        if self.boot_options(context, Route::Proxy) == BootOptions::None {
            return Err(DropReason::NotOurBootClient);
        }
        let reply_kind = match context.request.message_type {
            MessageType::Discover => MessageType::Offer,
            MessageType::Request => MessageType::Ack,
            _ => return Err(DropReason::MessageType),
        };
        let mut reply = self.reply(context.request, reply_kind);
        self.add_boot_options(&mut reply, context, Route::Proxy);
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
    pub fn boot_server(
        &self,
        context: &Context<'_>,
        from: SocketAddrV4,
    ) -> Result<Decision, DropReason> {
        if self.boot_options(context, Route::BootServer) == BootOptions::None {
            return Err(DropReason::NotOurBootClient);
        }
        // The client asks from the address it was given, and says so in `ciaddr`: the
        // pairing of that address with its MAC is what proxy mode vouches by. A request
        // whose source is not its `ciaddr` pairs nothing.
        let ciaddr = context.request.ciaddr;
        if !ciaddr.is_unspecified() && *from.ip() == ciaddr {
            self.exchanges
                .record(context.request.mac, ciaddr.into(), context.now);
            tracing::debug!(mac = %context.request.mac, ip = %ciaddr, "PXE boot-server exchange");
        }
        let mut reply = self.reply(context.request, MessageType::Ack);
        reply.message.set_ciaddr(context.request.ciaddr);
        self.add_boot_options(&mut reply, context, Route::BootServer);
        Ok(Decision::Reply {
            reply,
            to: from,
            commit: None,
            reclaimed: false,
        })
    }
}
