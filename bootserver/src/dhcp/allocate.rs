//! Which address a client gets: its reservation, its lease, the address it was offered,
//! the address it asks for, or the next free one of the pool, read from the
//! [`AddressBook`], the one owner of who holds what.
//!
//! A Machine's reservation is its own unless the book holds it for another client (a lease
//! made before the reservation): then the Machine is given a pool address until that lease
//! ends, rather than the same address as someone else (as Kea does). When a pool is
//! exhausted by offers nobody requested (a flood of DISCOVERs from made-up MACs), the oldest
//! such offer is reclaimed for the new client.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::settings::Subnet;
use crate::backend::{MacAddr, MachineBackend, MachineRecord};
use crate::leases::book::{Refused, Slot};
use crate::leases::{AddressBook, ClientKey, Ticket};

/// How long an offered address is held for the client that was offered it.
pub const OFFER_HOLD: Duration = Duration::from_secs(30);

/// Where each pool's next scan starts, so that allocation is O(1) amortised, and when a
/// whole scan last found nothing. Hints only: who holds an address is the book's.
#[derive(Debug, Default)]
pub struct Cursors {
    next: HashMap<Ipv4Addr, u32>,
    /// The second a scan of the whole pool last came back empty: within that second the
    /// next request goes straight to reclaiming an offer (a flood of DISCOVERs would
    /// otherwise scan the whole pool each time).
    exhausted_at: HashMap<Ipv4Addr, u64>,
}

/// The client asking.
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    /// Its lease key.
    pub key: &'a ClientKey,
    /// Its `chaddr`.
    pub mac: MacAddr,
    /// The Machine that has this MAC.
    pub machine: Option<&'a MachineRecord>,
}

/// An address for an OFFER.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Free, or already the client's.
    Free(Ipv4Addr),
    /// Taken back from the oldest offer nobody requested (the pool was exhausted).
    Reclaimed(Ipv4Addr),
}

impl Offer {
    /// The address.
    pub fn ip(self) -> Ipv4Addr {
        match self {
            Self::Free(ip) | Self::Reclaimed(ip) => ip,
        }
    }
}

/// One subnet's pool, as seen by one request. It owns the request's view of the address
/// book: every hold, claim, release and decline of the decision goes through it.
pub struct Pool<'a> {
    subnet: &'a Subnet,
    book: &'a mut AddressBook,
    backend: &'a dyn MachineBackend,
    cursors: &'a mut Cursors,
    now: u64,
    /// What a server of a pair may bind where, now.
    bindings: Bindings,
}

/// In a pair: where a server may make new bindings and extend leases now
/// ([`crate::ha::pair::Pair`] decides). Alone: its whole pool, and nobody's partner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bindings {
    /// New bindings and extensions in its own part of the pool.
    pub own: bool,
    /// Offers and extensions of leases of the partner's part (never new bindings there).
    pub partners_leases: bool,
    /// New bindings in the partner's part (it took the part, long enough ago).
    pub partners_new: bool,
}

impl Default for Bindings {
    fn default() -> Self {
        Self {
            own: true,
            partners_leases: true,
            partners_new: false,
        }
    }
}

impl std::fmt::Debug for Pool<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("subnet", &self.subnet.network)
            .finish_non_exhaustive()
    }
}

impl<'a> Pool<'a> {
    /// `subnet`'s pool at `now` (seconds since the Unix epoch), over the book swept of the
    /// offers and declines that have lapsed by then, the backend's reservations and the
    /// scan cursors.
    pub fn new(
        subnet: &'a Subnet,
        book: &'a mut AddressBook,
        backend: &'a dyn MachineBackend,
        cursors: &'a mut Cursors,
        now: u64,
    ) -> Self {
        book.sweep(now);
        Self {
            subnet,
            book,
            backend,
            cursors,
            now,
            bindings: Bindings::default(),
        }
    }

    /// In a pair: what this server may bind where now. A client whose lease may not be
    /// extended here is not offered it again but an address this server may give: a
    /// client whose ACK from the partner never came (the partner died after writing it)
    /// would else ask here for an address nobody may give it until the lease ends (found
    /// by the `kill -9` test of a pair: ten minutes of retries).
    pub fn bindings(mut self, bindings: Bindings) -> Self {
        self.bindings = bindings;
        self
    }

    /// Whether a new binding of `ip` may be made here: in the pool's part this server may
    /// bind in now.
    fn may_bind(&self, ip: Ipv4Addr) -> bool {
        bindable(self.subnet, self.bindings, ip)
    }

    /// The addresses a scan for a new binding runs over: this server's part, or the
    /// pair's whole pool once it may bind in the partner's part too.
    fn bindable_range(&self) -> (Ipv4Addr, Ipv4Addr) {
        match self.subnet.pair_pool {
            Some(whole) if self.bindings.partners_new => whole,
            _ => self.subnet.pool,
        }
    }

    /// Why the client's lease on `ip` may not be extended here now, if it may not: a lease
    /// of the partner's part the partner cannot hear of first, or of this server's part
    /// while it holds neither the part's fence nor an answering partner (the partner may
    /// take the part). The request goes unanswered: the client keeps its address until its
    /// lease ends (its own timers), then starts over. A Machine's reservation is nobody's
    /// part: one Machine is one client.
    pub fn unextendable(&self, client: &Client<'_>, ip: Ipv4Addr) -> Option<super::DropReason> {
        if client.machine.is_some_and(|m| m.ipv4 == Some(ip)) {
            return None;
        }
        if self.subnet.in_partners_part(ip) && !self.bindings.partners_leases {
            Some(super::DropReason::PartnersLease)
        } else if self.subnet.in_pool(ip) && !self.bindings.own {
            Some(super::DropReason::NoFence)
        } else {
            None
        }
    }

    /// The subnet.
    pub fn subnet(&self) -> &'a Subnet {
        self.subnet
    }

    /// The client's durable lease, expired or not.
    pub fn lease_of(&self, client: &Client<'_>) -> Option<crate::leases::Lease> {
        self.book.lease_of(client.key)
    }

    /// Whether a client holds an address now: an offer that has not lapsed or a lease that
    /// has not expired (what the per-source limits count).
    pub fn holds_address(&self, key: &ClientKey) -> bool {
        self.book.claim_of(key, self.now).is_some()
            || self
                .book
                .lease_of(key)
                .is_some_and(|l| l.expires_unix > self.now)
    }

    /// Holds `offer`'s address for the client for [`OFFER_HOLD`] (a reservation held under
    /// another identity of the same Machine passes to this one first).
    pub fn hold_offer(&mut self, client: &Client<'_>, offer: Offer) -> Result<(), Refused> {
        self.take_reservation(client, offer.ip());
        self.book.offer(
            client.key,
            client.mac,
            offer.ip().into(),
            self.now,
            self.now + OFFER_HOLD.as_secs(),
        )
    }

    /// The client chose another server's offer: ours goes back to the pool.
    pub fn withdraw_offer(&mut self, key: &ClientKey) {
        self.book.withdraw_offer(key);
    }

    /// Holds `ip` for the client while its lease is made durable: no other client may be
    /// offered it until the commit thread answers.
    pub fn begin_commit(&mut self, client: &Client<'_>, ip: Ipv4Addr) -> Result<Ticket, Refused> {
        self.take_reservation(client, ip);
        self.book
            .begin_commit(client.key, client.mac, ip.into(), self.now)
    }

    /// The client gives back its lease of `ip`; false when it holds none.
    pub fn release(&mut self, key: &ClientKey, ip: Ipv4Addr) -> bool {
        self.book.release(key, ip.into())
    }

    /// `ip` is in use by someone unknown: out of the pool until `until`.
    pub fn decline(&mut self, ip: Ipv4Addr, until: u64) {
        self.book.decline(ip.into(), until);
    }

    fn reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> bool {
        self.backend
            .reserved_by(ip.into())
            .is_some_and(|m| !m.macs.contains(&mac))
    }

    /// Whether `ip` may be the client's now: nobody else holds it and it is not another
    /// Machine's reservation.
    fn open_to(&self, ip: Ipv4Addr, client: &Client<'_>) -> bool {
        !self.book.taken_from(ip.into(), client.key, self.now)
            && !self.reserved_for_other(ip, client.mac)
    }

    /// The Machine's reservation, when it lies on this subnet and no other client holds it
    /// (another identity of the same Machine does not count: its firmware and its OS send
    /// different client identifiers). A Machine moved to another network gets an address
    /// of the network it is on.
    fn reservation(&self, client: &Client<'_>) -> Option<Ipv4Addr> {
        let machine = client.machine?;
        let ip = machine.ipv4.filter(|ip| self.subnet.contains(*ip))?;
        let same_machine = matches!(
            self.book.slot(ip.into()),
            Some(Slot::Held(h)) if machine.macs.contains(&h.mac)
        );
        (same_machine || !self.book.taken_from(ip.into(), client.key, self.now)).then_some(ip)
    }

    /// Before `ip` is offered or acknowledged to the client: a reservation held under
    /// another identity of the same Machine passes to this one.
    fn take_reservation(&mut self, client: &Client<'_>, ip: Ipv4Addr) {
        if let Some(machine) = client.machine
            && machine.ipv4 == Some(ip)
        {
            self.book
                .hand_over(ip.into(), client.key, |mac| machine.macs.contains(&mac));
        }
    }

    /// What the client holds on this subnet: its reservation, its lease (even expired,
    /// while nobody else took the address), or the address claimed for it.
    pub fn record(&self, client: &Client<'_>) -> Option<Ipv4Addr> {
        self.reservation(client)
            .or_else(|| {
                self.book
                    .lease_of(client.key)
                    .and_then(|l| l.ipv4())
                    .filter(|ip| self.subnet.contains(*ip))
            })
            .or_else(|| {
                self.book
                    .claim_of(client.key, self.now)
                    .and_then(v4)
                    .filter(|ip| self.subnet.contains(*ip))
            })
    }

    /// The address the client should have, if it has one already: its reservation, its
    /// lease, or the address claimed for it (each only while it is still open to it).
    fn current(&self, client: &Client<'_>) -> Option<Ipv4Addr> {
        if let Some(ip) = self.reservation(client) {
            return Some(ip);
        }
        // In a pair partner's part only a lease that outlasts an offer's hold is the
        // client's: once it ends the address is the partner's to give again, whatever this
        // book remembers (an expired lease, a REQUEST of ours still being written), and an
        // offer made here must not outlive it.
        let live_partners_lease = |ip: Ipv4Addr| {
            self.book.lease_of(client.key).is_some_and(|l| {
                l.ip == IpAddr::V4(ip) && l.expires_unix >= self.now + OFFER_HOLD.as_secs()
            })
        };
        let ours = |ip: &Ipv4Addr| !self.subnet.in_partners_part(*ip) || live_partners_lease(*ip);
        let lease = self
            .book
            .lease_of(client.key)
            .and_then(|l| l.ipv4())
            .filter(ours);
        let claim = self
            .book
            .claim_of(client.key, self.now)
            .and_then(v4)
            .filter(ours);
        [lease, claim]
            .into_iter()
            .flatten()
            .find(|ip| self.subnet.contains(*ip) && self.open_to(*ip, client))
    }

    /// Whether a REQUEST for `asked` may be acknowledged: it is the address the client
    /// has, or (having none) a free address of the pool.
    pub fn acceptable(&self, client: &Client<'_>, asked: Ipv4Addr) -> bool {
        if !self.subnet.contains(asked) {
            return false;
        }
        if self.current(client) == Some(asked) {
            return true;
        }
        match self.offerable_current(client) {
            Some(_) => false,
            None => self.may_bind(asked) && self.open_to(asked, client),
        }
    }

    /// The client's current address ([`Pool::current`]) unless it is a lease that may not
    /// be extended here now ([`Pool::unextendable`]): then the client may move to an
    /// address this server may bind.
    fn offerable_current(&self, client: &Client<'_>) -> Option<Ipv4Addr> {
        self.current(client)
            .filter(|ip| self.unextendable(client, *ip).is_none())
    }

    /// The address to offer: the client's own, the one it asks for, the next free one of
    /// the pool, or the oldest offer nobody requested.
    pub fn choose_offer(
        &mut self,
        client: &Client<'_>,
        requested: Option<Ipv4Addr>,
    ) -> Option<Offer> {
        if let Some(ip) = self.offerable_current(client) {
            return Some(Offer::Free(ip));
        }
        if let Some(ip) = client.machine.and_then(|m| m.ipv4)
            && self.subnet.contains(ip)
        {
            tracing::warn!(%ip, client = %client.key, "a Machine's reservation is held by another client; offering a pool address until that ends");
        }
        if let Some(ip) = requested
            && self.may_bind(ip)
            && self.open_to(ip, client)
        {
            return Some(Offer::Free(ip));
        }
        let network = self.subnet.network;
        let scanned_empty = self.cursors.exhausted_at.get(&network) == Some(&self.now);
        if !scanned_empty {
            if let Some(ip) = self.scan(client) {
                return Some(Offer::Free(ip));
            }
            self.cursors.exhausted_at.insert(network, self.now);
        }
        let mac = client.mac;
        let backend = self.backend;
        let others_reservation = |ip: IpAddr| {
            backend
                .reserved_by(ip)
                .is_some_and(|m| !m.macs.contains(&mac))
        };
        let (subnet, bindings) = (self.subnet, self.bindings);
        let (first, last) = self.bindable_range();
        self.book
            .reclaim_oldest_offer(first.into(), last.into(), |ip| {
                v4(ip).is_some_and(|ip| bindable(subnet, bindings, ip)) && !others_reservation(ip)
            })
            .and_then(v4)
            .map(Offer::Reclaimed)
    }

    /// The next address of the pool open to the client, from where the last scan ended.
    fn scan(&mut self, client: &Client<'_>) -> Option<Ipv4Addr> {
        let (first, last) = self.bindable_range();
        let (first, last) = (u32::from(first), u32::from(last));
        let size = last - first + 1;
        let start = self
            .cursors
            .next
            .get(&self.subnet.network)
            .copied()
            .unwrap_or(first);
        for step in 0..size {
            let candidate = first + (start.saturating_sub(first) + step) % size;
            let ip = Ipv4Addr::from(candidate);
            if self.may_bind(ip) && self.open_to(ip, client) {
                self.cursors
                    .next
                    .insert(self.subnet.network, candidate.wrapping_add(1));
                return Some(ip);
            }
        }
        None
    }
}

/// Whether a new binding of `ip` may be made on `subnet` with `bindings`.
fn bindable(subnet: &Subnet, bindings: Bindings, ip: Ipv4Addr) -> bool {
    subnet.in_pool(ip) && bindings.own || subnet.in_partners_part(ip) && bindings.partners_new
}

/// The address if it is an IPv4 one (a v4 client's key holds nothing else).
fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(_) => None,
    }
}
