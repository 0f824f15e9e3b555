//! Which address a client gets: its reservation, its lease, the address it was offered,
//! the address it asks for, or the next free one of the pool; and the offers held meanwhile.
//!
//! Every answer reads the lease store, whose reads can fail: an error goes up to the
//! decision, which drops the request rather than guess that an address is free.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::backend::{MacAddr, MachineBackend, MachineRecord};
use crate::config::Subnet;
use crate::leases::{ClientKey, LeaseError, LeaseStore};

/// How long an offered address is held for the client that was offered it.
pub const OFFER_HOLD: Duration = Duration::from_secs(30);

/// Addresses offered but not yet requested (or requested and being made durable).
#[derive(Debug, Default)]
pub struct Offers {
    by_key: HashMap<ClientKey, (Ipv4Addr, u64)>,
    by_ip: HashMap<Ipv4Addr, ClientKey>,
    /// Per subnet: where the next pool scan starts, so that allocation is O(1) amortised.
    cursor: HashMap<Ipv4Addr, u32>,
    /// Holds made, to sweep expired ones periodically.
    holds: u64,
}

impl Offers {
    /// Holds `ip` for `key` until `until`.
    pub fn hold(&mut self, key: &ClientKey, ip: Ipv4Addr, until: u64, now: u64) {
        self.forget(key);
        self.by_key.insert(key.clone(), (ip, until));
        self.by_ip.insert(ip, key.clone());
        self.holds += 1;
        // Expired holds are swept now and then: amortised O(1) per hold.
        if self.holds.is_multiple_of(4096) {
            self.by_key.retain(|_, (_, until)| *until > now);
            let by_key = &self.by_key;
            self.by_ip.retain(|_, key| by_key.contains_key(key));
        }
    }

    /// Drops the client's hold.
    pub fn forget(&mut self, key: &ClientKey) {
        if let Some((ip, _)) = self.by_key.remove(key) {
            self.by_ip.remove(&ip);
        }
    }

    /// The address held for a client, if the hold has not expired.
    pub fn held_for(&self, key: &ClientKey, now: u64) -> Option<Ipv4Addr> {
        self.by_key
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(ip, _)| *ip)
    }

    fn held_by_other(&self, ip: Ipv4Addr, key: &ClientKey, now: u64) -> bool {
        self.by_ip.get(&ip).is_some_and(|holder| {
            holder != key
                && self
                    .by_key
                    .get(holder)
                    .is_some_and(|(_, until)| *until > now)
        })
    }
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

/// One subnet's pool, as seen by one request.
pub struct Pool<'a> {
    /// The subnet.
    pub subnet: &'a Subnet,
    /// Leases.
    pub leases: &'a dyn LeaseStore,
    /// Machines (reservations).
    pub backend: &'a dyn MachineBackend,
    /// Offers held.
    pub offers: &'a mut Offers,
    /// Seconds since the Unix epoch.
    pub now: u64,
}

impl std::fmt::Debug for Pool<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("subnet", &self.subnet.network)
            .finish_non_exhaustive()
    }
}

impl Pool<'_> {
    fn reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> bool {
        self.backend
            .reserved_by(ip)
            .is_some_and(|m| !m.macs.contains(&mac))
    }

    /// The Machine's reservation, when it lies on this subnet: a Machine moved to another
    /// network gets an address of the network it is on, never one it cannot use.
    fn reservation(&self, client: &Client<'_>) -> Option<Ipv4Addr> {
        client
            .machine
            .and_then(|m| m.ipv4)
            .filter(|ip| self.subnet.contains(*ip))
    }

    /// Whether `ip` may be given to the client now.
    fn usable(&self, ip: Ipv4Addr, client: &Client<'_>) -> Result<bool, LeaseError> {
        let taken = self
            .leases
            .by_ip(ip)?
            .is_some_and(|b| b.blocks(client.key, self.now));
        Ok(!taken
            && !self.offers.held_by_other(ip, client.key, self.now)
            && !self.reserved_for_other(ip, client.mac))
    }

    /// What we know the client holds on this subnet: its reservation, its lease (even
    /// expired, while nobody else took the address), or the address it was offered.
    pub fn record(&self, client: &Client<'_>) -> Result<Option<Ipv4Addr>, LeaseError> {
        if let Some(ip) = self.reservation(client) {
            return Ok(Some(ip));
        }
        if let Some(lease) = self.leases.by_client(client.key)?
            && self.subnet.contains(lease.ip)
        {
            return Ok(Some(lease.ip));
        }
        Ok(self
            .offers
            .held_for(client.key, self.now)
            .filter(|ip| self.subnet.contains(*ip)))
    }

    /// The address for a client: its reservation, its current lease, the address held for
    /// it, the address it asks for, or the next free one of the pool.
    pub fn choose(
        &mut self,
        client: &Client<'_>,
        requested: Option<Ipv4Addr>,
    ) -> Result<Option<Ipv4Addr>, LeaseError> {
        if let Some(ip) = self.reservation(client) {
            return Ok(Some(ip));
        }
        if let Some(lease) = self.leases.by_client(client.key)?
            && self.subnet.contains(lease.ip)
            && !self.reserved_for_other(lease.ip, client.mac)
            && !self.offers.held_by_other(lease.ip, client.key, self.now)
        {
            return Ok(Some(lease.ip));
        }
        if let Some(ip) = self.offers.held_for(client.key, self.now)
            && self.subnet.contains(ip)
        {
            return Ok(Some(ip));
        }
        if let Some(ip) = requested
            && self.subnet.in_pool(ip)
            && self.usable(ip, client)?
        {
            return Ok(Some(ip));
        }
        let (first, last) = (u32::from(self.subnet.pool.0), u32::from(self.subnet.pool.1));
        let size = last - first + 1;
        let start = self
            .offers
            .cursor
            .get(&self.subnet.network)
            .copied()
            .unwrap_or(first);
        for step in 0..size {
            let candidate = first + (start.saturating_sub(first) + step) % size;
            let ip = Ipv4Addr::from(candidate);
            if self.usable(ip, client)? {
                self.offers
                    .cursor
                    .insert(self.subnet.network, candidate.wrapping_add(1));
                return Ok(Some(ip));
            }
        }
        Ok(None)
    }
}
