//! What the book answers: who holds an address, a client's lease and claim, counts, and
//! the check of every invariant.

use std::net::IpAddr;

use super::{AddressBook, Claim, Holding, Slot};
use crate::leases::{ClientKey, Lease};

impl AddressBook {
    /// What holds `ip`.
    pub fn slot(&self, ip: IpAddr) -> Option<&Slot> {
        self.slots.get(&ip)
    }

    /// Whether `ip` is someone else's than `key`'s at `now`.
    pub fn taken_from(&self, ip: IpAddr, key: &ClientKey, now: u64) -> bool {
        self.slots.get(&ip).is_some_and(|s| s.blocks(key, now))
    }

    /// The client's durable lease (expired or not).
    pub fn lease_of(&self, key: &ClientKey) -> Option<Lease> {
        self.lease_at(self.clients.get(key)?.leased?)
    }

    /// The address claimed for the client (offered and not lapsed, or being committed).
    pub fn claim_of(&self, key: &ClientKey, now: u64) -> Option<IpAddr> {
        let ip = self.clients.get(key)?.claimed?;
        match self.slots.get(&ip)? {
            Slot::Held(Holding {
                claim: Some(Claim::Offered { until }),
                ..
            }) if *until > now => Some(ip),
            Slot::Held(Holding {
                claim: Some(Claim::Committing { .. }),
                ..
            }) => Some(ip),
            _ => None,
        }
    }

    /// The durable lease on `ip`, expired or not.
    pub fn lease_at(&self, ip: IpAddr) -> Option<Lease> {
        match self.slots.get(&ip)? {
            Slot::Held(h) => h.lease.map(|expires_unix| Lease {
                key: h.key.clone(),
                mac: h.mac,
                ip,
                expires_unix,
            }),
            Slot::Declined { .. } => None,
        }
    }

    /// What the log must hold for `ip` to restore this book's view of it: its lease, or
    /// its decline.
    pub fn durable_record_at(&self, ip: IpAddr) -> Option<crate::leases::Record> {
        match self.slots.get(&ip)? {
            Slot::Held(_) => self.lease_at(ip).map(crate::leases::Record::Commit),
            Slot::Declined { until } => Some(crate::leases::Record::Decline {
                ip,
                until_unix: *until,
            }),
        }
    }

    /// How many durable leases have not expired at `now`.
    pub fn active_leases(&self, now: u64) -> usize {
        self.clients
            .values()
            .filter_map(|c| c.leased)
            .filter(|ip| {
                matches!(self.slots.get(ip), Some(Slot::Held(h)) if h.lease.is_some_and(|e| e > now))
            })
            .count()
    }

    /// How many addresses have a slot (held, remembered or declined).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the book is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Checks every invariant of the book; the error says which one broke.
    pub fn check(&self) -> Result<(), String> {
        for (ip, slot) in &self.slots {
            let Slot::Held(h) = slot else { continue };
            if h.is_empty() {
                return Err(format!("{ip}: an empty slot"));
            }
            if h.key.is_v6() != ip.is_ipv6() {
                return Err(format!(
                    "{ip}: held by {}, a key of the other family",
                    h.key
                ));
            }
            let Some(c) = self.clients.get(&h.key) else {
                return Err(format!("{ip}: held by {} whom the view lacks", h.key));
            };
            if h.lease.is_some() != (c.leased == Some(*ip)) {
                return Err(format!("{ip}: lease and view of {} disagree", h.key));
            }
            if h.claim.is_some() != (c.claimed == Some(*ip)) {
                return Err(format!("{ip}: claim and view of {} disagree", h.key));
            }
            let listed = match h.claim {
                Some(Claim::Offered { until }) => self.offers.contains(&(until, *ip)),
                _ => !self.offers.iter().any(|(_, o)| o == ip),
            };
            if !listed {
                return Err(format!("{ip}: offer list and slot disagree"));
            }
        }
        for (key, c) in &self.clients {
            if c.is_empty() {
                return Err(format!("{key}: an empty view"));
            }
            for ip in [c.leased, c.claimed].into_iter().flatten() {
                match self.slots.get(&ip) {
                    Some(Slot::Held(h)) if h.key == *key => {}
                    _ => return Err(format!("{key}: the view names {ip}, which is not theirs")),
                }
            }
        }
        for (until, ip) in &self.offers {
            match self.slots.get(ip) {
                Some(Slot::Held(Holding {
                    claim: Some(Claim::Offered { until: u }),
                    ..
                })) if u == until => {}
                _ => return Err(format!("{ip}: listed as offered until {until}, not so")),
            }
        }
        Ok(())
    }
}
