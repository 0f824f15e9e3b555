//! The DHCP lease store: every lease indexed in memory (by client and by address), made
//! durable in an append-only log with group commit ([`FileStore`]).
//!
//! **Who a lease belongs to.** A lease is keyed by a [`ClientKey`]: the client identifier
//! (option 61) when the client sends one (RFC 2131 §4.2), else its hardware address. An
//! identifier of type 1 (Ethernet) with six bytes *is* a hardware address, and is keyed as
//! that address: firmware that sends no option 61 and an iPXE that sends `01:<mac>` are one
//! client, as RFC 2132 §9.14 suggests. Each lease also records the MAC (`chaddr`) of the
//! request that made it, which is what reservations and the HTTP configuration route check.
//!
//! **Reads fail closed.** Reads return `Result`: a store that cannot answer (its lock
//! poisoned by a panic elsewhere) makes the DHCP server drop the request and count it; it
//! never guesses that an address is free.
//!
//! Durability: [`LeaseStore::commit`] returns only after the record is on disk
//! (`fdatasync`), and the server sends the ACK only after that, so no acknowledged lease is
//! lost by a crash (`kill -9`, power loss) and a restarted server never offers a leased
//! address to someone else. The log format is in [`record`].

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use crate::backend::MacAddr;

mod file;
pub mod record;

pub use file::FileStore;
use record::Record;

/// Who a lease belongs to.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    /// A client known by its hardware address (no option 61, or option 61 of type 1 with
    /// six bytes).
    Hardware(MacAddr),
    /// A client known by its client identifier (option 61), 1 to 255 bytes.
    Id(Box<[u8]>),
}

impl ClientKey {
    /// The key of a request: its client identifier (option 61) when present, else its
    /// hardware address.
    pub fn of(client_id: Option<&[u8]>, chaddr: MacAddr) -> Self {
        match client_id {
            None => Self::Hardware(chaddr),
            Some(&[1, a, b, c, d, e, g]) => Self::Hardware(MacAddr([a, b, c, d, e, g])),
            Some(id) => Self::Id(Box::from(id)),
        }
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hardware(mac) => write!(f, "{mac}"),
            Self::Id(id) => {
                f.write_str("id:")?;
                for b in id.iter() {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// One lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The client.
    pub key: ClientKey,
    /// The hardware address of the request that made the lease.
    pub mac: MacAddr,
    /// The address.
    pub ip: Ipv4Addr,
    /// When it ends, in seconds since the Unix epoch.
    pub expires_unix: u64,
}

/// What holds an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// A client's lease.
    Leased(Lease),
    /// Declined by a client (someone unknown uses it): out of the pool until then.
    Declined {
        /// Seconds since the Unix epoch.
        until_unix: u64,
    },
}

impl Binding {
    /// Whether this keeps `ip` from `key` at `now_unix`.
    pub fn blocks(&self, key: &ClientKey, now_unix: u64) -> bool {
        match self {
            Self::Leased(lease) => lease.key != *key && lease.expires_unix > now_unix,
            Self::Declined { until_unix } => *until_unix > now_unix,
        }
    }
}

/// Errors of the lease store.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The log could not be read or written.
    #[error("{action} lease log {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The log.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A thread panicked while holding the store's lock: the index cannot be trusted until
    /// the log is read again (a restart).
    #[error("the lease store's lock is poisoned (a thread panicked while holding it)")]
    Poisoned,
    /// Storing panicked; nothing of that call may be taken as durable.
    #[error("storing leases panicked")]
    Panicked,
}

/// What the DHCP server needs from a lease store.
pub trait LeaseStore: Send + Sync {
    /// The lease of a client.
    fn by_client(&self, key: &ClientKey) -> Result<Option<Lease>, LeaseError>;
    /// What holds an address.
    fn by_ip(&self, ip: Ipv4Addr) -> Result<Option<Binding>, LeaseError>;
    /// How many leases have not expired at `now_unix`.
    fn active(&self, now_unix: u64) -> Result<usize, LeaseError>;
    /// Stores a lease durably (replacing the client's previous one, and taking the address
    /// from whoever held it).
    fn commit(&self, lease: Lease) -> Result<(), LeaseError>;
    /// Stores several leases, in order, with as few durable writes as the store can (one,
    /// for the file store); an error means none may be taken as durable.
    fn commit_all(&self, leases: Vec<Lease>) -> Result<(), LeaseError> {
        leases.into_iter().try_for_each(|lease| self.commit(lease))
    }
    /// Removes a client's lease durably.
    fn release(&self, key: &ClientKey) -> Result<(), LeaseError>;
    /// Holds an address out of the pool until `until_unix`, durably.
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError>;
}

/// The in-memory index.
#[derive(Debug, Default)]
pub(crate) struct Index {
    by_key: HashMap<ClientKey, Lease>,
    by_ip: HashMap<Ipv4Addr, Binding>,
}

impl Index {
    pub(crate) fn apply(&mut self, record: &Record) {
        match record {
            Record::Commit(lease) => {
                if let Some(old) = self.by_key.insert(lease.key.clone(), lease.clone())
                    && old.ip != lease.ip
                    && matches!(self.by_ip.get(&old.ip), Some(Binding::Leased(l)) if l.key == old.key)
                {
                    self.by_ip.remove(&old.ip);
                }
                // An address moving to another client takes it from the old one.
                if let Some(Binding::Leased(prev)) =
                    self.by_ip.insert(lease.ip, Binding::Leased(lease.clone()))
                    && prev.key != lease.key
                {
                    self.by_key.remove(&prev.key);
                }
            }
            Record::Release(key) => {
                if let Some(old) = self.by_key.remove(key)
                    && matches!(self.by_ip.get(&old.ip), Some(Binding::Leased(l)) if l.key == old.key)
                {
                    self.by_ip.remove(&old.ip);
                }
            }
            Record::Decline { ip, until_unix } => {
                let declined = Binding::Declined {
                    until_unix: *until_unix,
                };
                if let Some(Binding::Leased(prev)) = self.by_ip.insert(*ip, declined) {
                    self.by_key.remove(&prev.key);
                }
            }
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.by_ip.len()
    }

    /// Every record needed to rebuild this index (compaction).
    pub(crate) fn records(&self) -> impl Iterator<Item = Record> + '_ {
        self.by_ip.iter().map(|(ip, binding)| match binding {
            Binding::Leased(lease) => Record::Commit(lease.clone()),
            Binding::Declined { until_unix } => Record::Decline {
                ip: *ip,
                until_unix: *until_unix,
            },
        })
    }

    pub(crate) fn by_client(&self, key: &ClientKey) -> Option<Lease> {
        self.by_key.get(key).cloned()
    }

    pub(crate) fn by_ip(&self, ip: Ipv4Addr) -> Option<Binding> {
        self.by_ip.get(&ip).cloned()
    }

    pub(crate) fn active(&self, now_unix: u64) -> usize {
        self.by_key
            .values()
            .filter(|l| l.expires_unix > now_unix)
            .count()
    }
}

/// A store without persistence, for tests, fuzzing and ProxyDHCP (which keeps no leases).
#[derive(Debug, Default)]
pub struct MemoryStore {
    index: Mutex<Index>,
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut Index) -> T) -> Result<T, LeaseError> {
        let mut index = self.index.lock().map_err(|_| LeaseError::Poisoned)?;
        Ok(f(&mut index))
    }
}

impl LeaseStore for MemoryStore {
    fn by_client(&self, key: &ClientKey) -> Result<Option<Lease>, LeaseError> {
        self.with(|i| i.by_client(key))
    }
    fn by_ip(&self, ip: Ipv4Addr) -> Result<Option<Binding>, LeaseError> {
        self.with(|i| i.by_ip(ip))
    }
    fn active(&self, now_unix: u64) -> Result<usize, LeaseError> {
        self.with(|i| i.active(now_unix))
    }
    fn commit(&self, lease: Lease) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::Commit(lease)))
    }
    fn release(&self, key: &ClientKey) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::Release(key.clone())))
    }
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::Decline { ip, until_unix }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_keys_follow_option_61() {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
        let other = MacAddr([0x52, 0x54, 0, 0, 0, 2]);
        assert_eq!(ClientKey::of(None, mac), ClientKey::Hardware(mac));
        // Type 1 with six bytes is a hardware address, whichever chaddr carries it.
        assert_eq!(
            ClientKey::of(Some(&[1, 0x52, 0x54, 0, 0, 0, 1]), other),
            ClientKey::Hardware(mac)
        );
        // Anything else is an opaque identifier (a DUID, a name).
        let duid = [255, 0, 0, 0, 1, 0, 4, 9, 9];
        assert_eq!(
            ClientKey::of(Some(&duid), mac),
            ClientKey::Id(Box::from(&duid[..]))
        );
        assert_eq!(
            ClientKey::of(Some(&[1, 2, 3]), mac),
            ClientKey::Id(Box::from(&[1u8, 2, 3][..]))
        );
    }

    #[test]
    fn the_index_moves_addresses_between_clients() {
        let a = ClientKey::Id(Box::from(&b"a"[..]));
        let b = ClientKey::Id(Box::from(&b"b"[..]));
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        let lease = |key: &ClientKey, ip| Lease {
            key: key.clone(),
            mac,
            ip,
            expires_unix: 100,
        };
        let mut index = Index::default();
        index.apply(&Record::Commit(lease(&a, ip)));
        assert!(index.by_ip(ip).unwrap().blocks(&b, 50));
        assert!(!index.by_ip(ip).unwrap().blocks(&a, 50));
        assert!(!index.by_ip(ip).unwrap().blocks(&b, 100), "expired");
        // b takes the address (a reservation moved): a has no lease any more.
        index.apply(&Record::Commit(lease(&b, ip)));
        assert_eq!(index.by_client(&a), None);
        index.apply(&Record::Decline {
            ip,
            until_unix: 200,
        });
        assert_eq!(index.by_client(&b), None);
        assert!(index.by_ip(ip).unwrap().blocks(&a, 150));
        assert_eq!(index.live(), 1);
    }
}
