//! [`AddressBook`]: the one owner of who holds which address.
//!
//! Every address the DHCP server has handed out, offered, or had declined has exactly one
//! [`Slot`], and a slot names at most one client. What a client holds is a view of the
//! slots (`clients`), changed only together with them by the transitions below, so the two
//! directions cannot disagree: there is no way to offer an address while the book records
//! it as someone else's, or to drop one client's hold while removing another's.
//!
//! A slot held by a client carries up to two things:
//! - the client's **lease** on that address (only once it is durable on disk: the book
//!   learns it from [`AddressBook::committed`], which the commit thread calls after the
//!   write and sync succeeded);
//! - a **claim**: an offer not yet requested ([`Claim::Offered`], held for
//!   [`OFFER_HOLD`](crate::dhcp::allocate::OFFER_HOLD)), or REQUESTs being made durable
//!   ([`Claim::Committing`], held until each is answered, whatever the clock says).
//!
//! A client has at most one lease and at most one claim; when both exist they may be on
//! different addresses (a client moving to another subnet: its old lease stays until the new
//! one is durable). An address is *taken* for other clients while its lease has not expired,
//! while it is claimed, or while it is declined. Expired leases and lapsed offers stay in the
//! book (a returning client gets its old address back) until another client needs the
//! address; the next transition that touches the address evicts them.
//!
//! The transitions are pure (no I/O, the time is an argument) and [`AddressBook::check`]
//! verifies every invariant; the property test in `dhcp/invariants.rs` drives random
//! interleavings of clients, lapses, restarts and commit outcomes through the real
//! decision code and checks them after each step.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use super::record::Record;
use super::{ClientKey, Index, Lease};
use crate::backend::MacAddr;

#[cfg(test)]
mod tests;
mod views;

/// What holds an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// A client: its lease on this address, its claim, or both.
    Held(Holding),
    /// Declined by a client (someone unknown answers on it): out of the pool until then.
    Declined {
        /// Seconds since the Unix epoch.
        until: u64,
    },
}

/// A client's hold on one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The client.
    pub key: ClientKey,
    /// The hardware address of the request that made the hold.
    pub mac: MacAddr,
    /// When the client's durable lease on this address ends (seconds since the Unix epoch),
    /// if it has one here.
    pub lease: Option<u64>,
    /// An offer or REQUESTs in flight.
    pub claim: Option<Claim>,
    /// Which holding of the address this is (each new one gets a new number): a REQUEST
    /// accepted for an earlier one (before a release or a decline) is not this one's.
    pub incarnation: Ticket,
}

/// Names the holding a REQUEST was accepted for ([`AddressBook::begin_commit`]); its
/// lease is taken by [`AddressBook::committed`] only while that holding lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// A hold that is not (yet) a durable lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Offered; nobody else is offered the address until then.
    Offered {
        /// Seconds since the Unix epoch.
        until: u64,
    },
    /// REQUESTs accepted and waiting for their lease to be durable: nobody else may have
    /// the address until each is answered, however long the disk takes.
    Committing {
        /// How many.
        requests: u32,
        /// An offer sent meanwhile (a DISCOVER while a REQUEST was being written) holds
        /// until then if the writes fail.
        offered_until: Option<u64>,
    },
}

impl Holding {
    /// Whether this keeps the address from other clients at `now`.
    fn takes(&self, now: u64) -> bool {
        self.lease.is_some_and(|end| end > now)
            || match self.claim {
                Some(Claim::Offered { until }) => until > now,
                Some(Claim::Committing { .. }) => true,
                None => false,
            }
    }

    fn is_empty(&self) -> bool {
        self.lease.is_none() && self.claim.is_none()
    }
}

impl Slot {
    /// Whether this keeps the address from `key` at `now`.
    pub fn blocks(&self, key: &ClientKey, now: u64) -> bool {
        match self {
            Self::Held(h) => h.key != *key && h.takes(now),
            Self::Declined { until } => *until > now,
        }
    }
}

/// Where a client's lease and claim are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ClientSlots {
    leased: Option<IpAddr>,
    claimed: Option<IpAddr>,
}

impl ClientSlots {
    fn is_empty(&self) -> bool {
        self.leased.is_none() && self.claimed.is_none()
    }
}

/// Why a transition was refused. The book is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The address is someone else's (lease, claim or decline) at this time.
    #[error("the address is held by someone else")]
    Taken,
    /// The client has REQUESTs for another address in flight: one at a time.
    #[error("the client's REQUEST for another address is still being made durable")]
    CommitInFlight,
    /// A v4 client's key and a v6 address, or the other way round.
    #[error("the address is not of the client's family")]
    OtherFamily,
}

/// The book: slots by address, and what each client holds as a view of them.
#[derive(Debug, Default, Clone)]
pub struct AddressBook {
    slots: HashMap<IpAddr, Slot>,
    clients: HashMap<ClientKey, ClientSlots>,
    /// Offers not yet requested, by when they lapse: the oldest is reclaimed first when a
    /// pool runs out, and lapsed ones are swept from the front.
    offers: BTreeSet<(u64, IpAddr)>,
    /// The incarnation of the next holding.
    next_incarnation: u64,
}

impl AddressBook {
    /// A book of what a lease log holds (after a restart: leases and declines, no claims).
    pub fn from_durable(index: &Index) -> Self {
        let mut book = Self::default();
        for record in index.records() {
            match record {
                Record::Commit(lease) => {
                    book.clients.entry(lease.key.clone()).or_default().leased = Some(lease.ip);
                    let incarnation = book.new_incarnation();
                    book.slots.insert(
                        lease.ip,
                        Slot::Held(Holding {
                            key: lease.key,
                            mac: lease.mac,
                            lease: Some(lease.expires_unix),
                            claim: None,
                            incarnation,
                        }),
                    );
                }
                Record::Decline { ip, until_unix } => {
                    book.slots.insert(ip, Slot::Declined { until: until_unix });
                }
                Record::Release { .. } => {}
            }
        }
        book
    }

    fn new_incarnation(&mut self) -> Ticket {
        self.next_incarnation += 1;
        Ticket(self.next_incarnation)
    }

    /// Makes `ip` free for `key`: refuses if someone else holds it at `now`, otherwise
    /// evicts whatever stale slot it has (another client's expired lease or lapsed offer, an
    /// expired decline). Returns the key's own holding, if the slot is the key's.
    fn make_room(&mut self, ip: IpAddr, key: &ClientKey, now: u64) -> Result<(), Refused> {
        match self.slots.get(&ip) {
            None => Ok(()),
            Some(slot) if slot.blocks(key, now) => Err(Refused::Taken),
            Some(Slot::Held(h)) if h.key == *key => Ok(()),
            Some(_) => {
                self.evict(ip);
                Ok(())
            }
        }
    }

    /// Removes the slot of `ip` and the view of its holder.
    fn evict(&mut self, ip: IpAddr) {
        if let Some(Slot::Held(h)) = self.slots.remove(&ip) {
            if let Some(Claim::Offered { until }) = h.claim {
                self.offers.remove(&(until, ip));
            }
            self.unlink(&h.key, ip);
        }
    }

    /// Forgets that `key` holds anything at `ip` (the slot itself is handled by the caller).
    fn unlink(&mut self, key: &ClientKey, ip: IpAddr) {
        if let Some(c) = self.clients.get_mut(key) {
            if c.leased == Some(ip) {
                c.leased = None;
            }
            if c.claimed == Some(ip) {
                c.claimed = None;
            }
            if c.is_empty() {
                self.clients.remove(key);
            }
        }
    }

    /// Drops the key's claim on `ip` if it is an offer (a claim being committed stays); the
    /// slot goes when nothing is left of it.
    fn drop_offer(&mut self, key: &ClientKey, ip: IpAddr) {
        let Some(Slot::Held(h)) = self.slots.get_mut(&ip) else {
            return;
        };
        if h.key != *key {
            return;
        }
        let Some(Claim::Offered { until }) = h.claim else {
            return;
        };
        h.claim = None;
        self.offers.remove(&(until, ip));
        let empty = h.is_empty();
        if let Some(c) = self.clients.get_mut(key)
            && c.claimed == Some(ip)
        {
            c.claimed = None;
        }
        if empty {
            self.slots.remove(&ip);
            self.unlink(key, ip);
        }
    }

    /// Drops a lease from a slot (the address the client leased before its new one).
    fn drop_lease(&mut self, key: &ClientKey, ip: IpAddr) {
        let Some(Slot::Held(h)) = self.slots.get_mut(&ip) else {
            return;
        };
        if h.key != *key {
            return;
        }
        h.lease = None;
        let empty = h.is_empty();
        if let Some(c) = self.clients.get_mut(key)
            && c.leased == Some(ip)
        {
            c.leased = None;
        }
        if empty {
            self.slots.remove(&ip);
            self.unlink(key, ip);
        }
    }

    /// Moves the key's claim to `ip` (its previous offer elsewhere is dropped; REQUESTs in
    /// flight elsewhere refuse). Returns the key's holding at `ip`, created if needed.
    fn claim_slot(
        &mut self,
        key: &ClientKey,
        mac: MacAddr,
        ip: IpAddr,
        now: u64,
    ) -> Result<&mut Holding, Refused> {
        if key.is_v6() != ip.is_ipv6() {
            return Err(Refused::OtherFamily);
        }
        let previous = self.clients.get(key).and_then(|c| c.claimed);
        let committing_elsewhere = previous.filter(|other| *other != ip).is_some_and(|other| {
            matches!(
                self.slots.get(&other),
                Some(Slot::Held(Holding {
                    claim: Some(Claim::Committing { .. }),
                    ..
                }))
            )
        });
        if committing_elsewhere {
            return Err(Refused::CommitInFlight);
        }
        self.make_room(ip, key, now)?;
        if let Some(other) = previous.filter(|other| *other != ip) {
            self.drop_offer(key, other);
        }
        self.clients.entry(key.clone()).or_default().claimed = Some(ip);
        if !self.slots.contains_key(&ip) {
            let incarnation = self.new_incarnation();
            self.slots.insert(
                ip,
                Slot::Held(Holding {
                    key: key.clone(),
                    mac,
                    lease: None,
                    claim: None,
                    incarnation,
                }),
            );
        }
        let slot = self.slots.get_mut(&ip).ok_or(Refused::Taken)?;
        match slot {
            Slot::Held(h) => Ok(h),
            // make_room evicted any slot that is not the key's.
            Slot::Declined { .. } => Err(Refused::Taken),
        }
    }

    /// Offers `ip` to the client until `until` (an OFFER). A claim being committed on the
    /// same address stays as it is.
    pub fn offer(
        &mut self,
        key: &ClientKey,
        mac: MacAddr,
        ip: IpAddr,
        now: u64,
        until: u64,
    ) -> Result<(), Refused> {
        let holding = self.claim_slot(key, mac, ip, now)?;
        let old = holding.claim;
        if let Some(Claim::Committing { requests, .. }) = old {
            holding.claim = Some(Claim::Committing {
                requests,
                offered_until: Some(until),
            });
            return Ok(());
        }
        holding.claim = Some(Claim::Offered { until });
        if let Some(Claim::Offered { until: old }) = old {
            self.offers.remove(&(old, ip));
        }
        self.offers.insert((until, ip));
        Ok(())
    }

    /// Accepts a REQUEST for `ip` (its ACK will be sent once the lease is durable): the
    /// address is the client's until [`AddressBook::committed`] or
    /// [`AddressBook::commit_failed`] answers with the ticket returned here.
    pub fn begin_commit(
        &mut self,
        key: &ClientKey,
        mac: MacAddr,
        ip: IpAddr,
        now: u64,
    ) -> Result<Ticket, Refused> {
        let holding = self.claim_slot(key, mac, ip, now)?;
        let ticket = holding.incarnation;
        let old = holding.claim;
        holding.mac = mac;
        holding.claim = Some(match old {
            Some(Claim::Committing {
                requests,
                offered_until,
            }) => Claim::Committing {
                requests: requests.saturating_add(1),
                offered_until,
            },
            Some(Claim::Offered { until }) => Claim::Committing {
                requests: 1,
                offered_until: Some(until),
            },
            None => Claim::Committing {
                requests: 1,
                offered_until: None,
            },
        });
        if let Some(Claim::Offered { until }) = old {
            self.offers.remove(&(until, ip));
        }
        Ok(ticket)
    }

    /// The client chose another server's offer: its offer here ends.
    pub fn withdraw_offer(&mut self, key: &ClientKey) {
        if let Some(claimed) = self.clients.get(key).and_then(|c| c.claimed) {
            self.drop_offer(key, claimed);
        }
    }

    /// One REQUEST's lease is durable: the client's lease is now `lease` (its lease on
    /// another address, if any, ends). Returns false, changing nothing, when the book has no
    /// such REQUEST in flight (the client released or declined the address meanwhile).
    pub fn committed(&mut self, lease: &Lease, ticket: Ticket) -> bool {
        let Some(Slot::Held(h)) = self.slots.get_mut(&lease.ip) else {
            return false;
        };
        let Some(Claim::Committing {
            requests,
            offered_until,
        }) = h
            .claim
            .filter(|_| h.key == lease.key && h.incarnation == ticket)
        else {
            return false;
        };
        // An offer sent meanwhile still holds if it outlives the lease.
        h.claim = match (requests > 1, offered_until) {
            (true, _) => Some(Claim::Committing {
                requests: requests - 1,
                offered_until,
            }),
            (false, Some(until)) if until > lease.expires_unix => Some(Claim::Offered { until }),
            (false, _) => None,
        };
        if let Some(Claim::Offered { until }) = h.claim {
            self.offers.insert((until, lease.ip));
        }
        h.lease = Some(lease.expires_unix);
        h.mac = lease.mac;
        let client = self.clients.entry(lease.key.clone()).or_default();
        let previous = client.leased.replace(lease.ip);
        if client.claimed == Some(lease.ip) && h.claim.is_none() {
            client.claimed = None;
        }
        if let Some(old) = previous.filter(|old| *old != lease.ip) {
            self.drop_lease(&lease.key, old);
        }
        true
    }

    /// One REQUEST's lease could not be made durable (no ACK was sent): its claim ends (or
    /// goes back to the offer sent meanwhile).
    pub fn commit_failed(&mut self, lease: &Lease, ticket: Ticket) {
        let Some(Slot::Held(h)) = self.slots.get_mut(&lease.ip) else {
            return;
        };
        let Some(Claim::Committing {
            requests,
            offered_until,
        }) = h
            .claim
            .filter(|_| h.key == lease.key && h.incarnation == ticket)
        else {
            return;
        };
        if requests > 1 {
            h.claim = Some(Claim::Committing {
                requests: requests - 1,
                offered_until,
            });
            return;
        }
        if let Some(until) = offered_until {
            h.claim = Some(Claim::Offered { until });
            self.offers.insert((until, lease.ip));
            return;
        }
        h.claim = None;
        let empty = h.is_empty();
        if let Some(c) = self.clients.get_mut(&lease.key)
            && c.claimed == Some(lease.ip)
        {
            c.claimed = None;
        }
        if empty {
            self.slots.remove(&lease.ip);
            self.unlink(&lease.key, lease.ip);
        }
    }

    /// The client gives its lease on `ip` back (RELEASE): the address is free, its REQUESTs
    /// for it still in flight will not be acknowledged ([`AddressBook::committed`] refuses
    /// them), and its offer elsewhere goes too. Returns whether it held a lease there (if
    /// not, nothing changes).
    pub fn release(&mut self, key: &ClientKey, ip: IpAddr) -> bool {
        let held = self.clients.get(key).is_some_and(|c| c.leased == Some(ip));
        if !held {
            return false;
        }
        self.evict(ip);
        if let Some(claimed) = self.clients.get(key).and_then(|c| c.claimed) {
            self.drop_offer(key, claimed);
        }
        true
    }

    /// A Machine's reservation held under another of its own identities (its firmware and
    /// its OS send different client identifiers): the address goes to the identity asking
    /// now. `same_machine` says whether the holder's MAC is one of the Machine's.
    pub fn hand_over(
        &mut self,
        ip: IpAddr,
        key: &ClientKey,
        same_machine: impl Fn(MacAddr) -> bool,
    ) {
        if let Some(Slot::Held(h)) = self.slots.get(&ip)
            && h.key != *key
            && same_machine(h.mac)
        {
            self.evict(ip);
        }
    }

    /// `ip` is in use by someone unknown (DECLINE): out of the pool until `until`, whoever
    /// held it.
    pub fn decline(&mut self, ip: IpAddr, until: u64) {
        self.evict(ip);
        self.slots.insert(ip, Slot::Declined { until });
    }

    /// A record the partner of a pair wrote (docs/bootserver.md, "Two bootservers on one
    /// network"): its lease, release or decline. A lease takes its address unless another
    /// client holds it here at `now` (the pair's parts keep that from happening outside a
    /// Machine's reservation, which is one Machine's); for the same client the later
    /// expiry wins, and its claims stay. Returns whether the book took it.
    pub fn replicated(&mut self, record: &Record, now: u64) -> bool {
        let lease = match record {
            Record::Commit(lease) => lease,
            Record::Release { key, ip } => return self.release(key, *ip),
            // A decline the partner heard keeps the address from new clients here too, but
            // never takes it from a client this server promised it to (found by the pair's
            // property test: a late copy ended a REQUEST being written).
            Record::Decline { ip, until_unix } => {
                let held = self.slots.get(ip).is_some_and(|slot| match slot {
                    Slot::Held(h) => h.takes(now),
                    Slot::Declined { .. } => false,
                });
                if *until_unix <= now || held {
                    return false;
                }
                self.decline(*ip, *until_unix);
                return true;
            }
        };
        if lease.key.is_v6() != lease.ip.is_ipv6() {
            return false;
        }
        // A lease older than the one this book holds for the client elsewhere (a catch-up
        // carried a record the book has moved past) does not move the client back: its
        // address is held from everyone until it ends (found by the pair's `kill -9` test:
        // a restarted server's own commit, never acknowledged, moved its client away from
        // the address the partner had given it since, and its renewal would have been
        // refused).
        if let Some(newer) = self.lease_of(&lease.key)
            && newer.ip != lease.ip
            && newer.expires_unix > lease.expires_unix
        {
            return self.hold_older(lease, now);
        }
        if self.make_room(lease.ip, &lease.key, now).is_err() {
            return false;
        }
        match self.slots.get_mut(&lease.ip) {
            Some(Slot::Held(h)) if h.key == lease.key => {
                h.lease = Some(
                    h.lease
                        .map_or(lease.expires_unix, |end| end.max(lease.expires_unix)),
                );
                h.mac = lease.mac;
            }
            _ => {
                let incarnation = self.new_incarnation();
                self.slots.insert(
                    lease.ip,
                    Slot::Held(Holding {
                        key: lease.key.clone(),
                        mac: lease.mac,
                        lease: Some(lease.expires_unix),
                        claim: None,
                        incarnation,
                    }),
                );
            }
        }
        let previous = self
            .clients
            .entry(lease.key.clone())
            .or_default()
            .leased
            .replace(lease.ip);
        if let Some(old) = previous.filter(|old| *old != lease.ip) {
            // Which of its two ACKs the client took last, the two servers cannot tell (a
            // lease's expiry is no clock of the pair): its other address is kept from
            // everyone until that lease would have ended (found by the pair's property
            // test, where a record arriving late freed the address its client used).
            // An offer made there ends too (held as long); a REQUEST being written there
            // keeps the slot, and its own outcome decides.
            let (end, committing) = match self.slots.get(&old) {
                Some(Slot::Held(h)) if h.key == lease.key => {
                    let offered = match h.claim {
                        Some(Claim::Offered { until }) => Some(until),
                        _ => None,
                    };
                    (
                        h.lease.max(offered),
                        matches!(h.claim, Some(Claim::Committing { .. })),
                    )
                }
                _ => (None, false),
            };
            if committing {
                self.drop_lease(&lease.key, old);
            } else if end.is_some() {
                self.evict(old);
                if let Some(until) = end.filter(|end| *end > now) {
                    self.slots.insert(old, Slot::Declined { until });
                }
            }
        }
        true
    }

    /// Holds the address of a client's older lease from everyone until it ends (see
    /// [`AddressBook::replicated`]); says whether the book took it: not when it has ended,
    /// or another client holds the address here.
    fn hold_older(&mut self, lease: &Lease, now: u64) -> bool {
        if lease.expires_unix <= now {
            return false;
        }
        match self.slots.get(&lease.ip) {
            None => {}
            Some(Slot::Declined { until }) if *until >= lease.expires_unix => return true,
            Some(Slot::Declined { .. }) => {}
            // Its own holding there (a REQUEST being written): that outcome decides.
            Some(Slot::Held(h)) if h.key == lease.key => return true,
            Some(slot) if slot.blocks(&lease.key, now) => return false,
            Some(Slot::Held(_)) => self.evict(lease.ip),
        }
        self.slots.insert(
            lease.ip,
            Slot::Declined {
                until: lease.expires_unix,
            },
        );
        true
    }

    /// The oldest offer nobody requested whose address lies in `first..=last` and is
    /// `eligible`: taken from its client (a pool exhausted by offers gives them back,
    /// oldest first).
    pub fn reclaim_oldest_offer(
        &mut self,
        first: IpAddr,
        last: IpAddr,
        eligible: impl Fn(IpAddr) -> bool,
    ) -> Option<IpAddr> {
        let range = first..=last;
        let leased =
            |ip: &IpAddr| matches!(self.slots.get(ip), Some(Slot::Held(h)) if h.lease.is_some());
        let &(_, ip) = self
            .offers
            .iter()
            .find(|(_, ip)| range.contains(ip) && !leased(ip) && eligible(*ip))?;
        let key = match self.slots.get(&ip) {
            Some(Slot::Held(h)) => h.key.clone(),
            _ => return None,
        };
        self.drop_offer(&key, ip);
        Some(ip)
    }

    /// Drops offers that lapsed by `now` (and the slots left empty): memory stays bounded by
    /// the addresses in use, not by the clients ever seen.
    pub fn sweep(&mut self, now: u64) {
        while let Some(&(until, ip)) = self.offers.first() {
            if until > now {
                break;
            }
            let key = match self.slots.get(&ip) {
                Some(Slot::Held(h)) => h.key.clone(),
                _ => {
                    self.offers.pop_first();
                    continue;
                }
            };
            self.drop_offer(&key, ip);
            // drop_offer removed the entry; if it did not (a stale entry), remove it here.
            self.offers.remove(&(until, ip));
        }
    }
}
