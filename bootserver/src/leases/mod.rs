//! Address state of the DHCP server: who holds which address ([`book::AddressBook`], the
//! one owner, in memory) and the lease log that makes leases durable ([`FileStore`]).
//!
//! **Who a lease belongs to.** A lease is keyed by a [`ClientKey`]: the client identifier
//! (option 61) when the client sends one (RFC 2131 §4.2), else its hardware address. An
//! identifier of type 1 (Ethernet) with six bytes *is* a hardware address, and is keyed as
//! that address: firmware that sends no option 61 and an iPXE that sends `01:<mac>` are one
//! client, as RFC 2132 §9.14 suggests. Each lease also records the MAC (`chaddr`) of the
//! request that made it, which is what reservations and the HTTP configuration route check.
//!
//! A DHCPv6 client's lease is keyed by its identity association ([`ClientKey::Ia`]: DUID
//! and IAID, RFC 8415 §12) and holds an IPv6 address; v4 and v6 leases live in one book and
//! one log, and a key of one family never holds an address of the other.
//!
//! **One owner.** The DHCP decision reads and changes the [`book::AddressBook`] only; the
//! log persists what the book decided. [`Leases`] holds both: [`Leases::persist`] writes
//! records and only then tells the book that a lease is durable (or that it is not), so the
//! book shows a lease only once it is on disk, and the ACK that promises it is sent after
//! that. Releases and declines change the book first (the safe direction: an address freed
//! too early on disk comes back as held after a restart, never the other way round).
//!
//! **Reads fail closed.** A panic while the book's lock is held may have left it half
//! changed: the lock is poisoned and every call answers [`LeaseError::Poisoned`]; the DHCP
//! service stops so that the process restarts and reads the log again, rather than guess.
//!
//! **Durable means durable.** [`LeaseLog::append`] returns only after the records are on
//! disk (`fdatasync`), and each call gets the result of its own records. A write that fails
//! leaves the log as it was (truncated back to its last whole record). The log format and
//! how a damaged log is replayed are in [`record`] and [`FileStore`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::MacAddr;

pub mod book;
mod file;
pub mod record;

pub use book::{AddressBook, Ticket};
pub use file::FileStore;
pub use record::Record;

/// Who a lease belongs to.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    /// A client known by its hardware address (no option 61, or option 61 of type 1 with
    /// six bytes).
    Hardware(MacAddr),
    /// A client known by its client identifier (option 61), 1 to 255 bytes.
    Id(Box<[u8]>),
    /// A DHCPv6 client's identity association for non-temporary addresses (IA_NA): its
    /// DUID (option 1, at most 130 bytes) and the IAID it chose.
    Ia {
        /// The client's DUID.
        duid: Box<[u8]>,
        /// The identity association's ID.
        iaid: u32,
    },
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

impl ClientKey {
    /// Whether this is a DHCPv6 client's key (which holds IPv6 addresses only).
    pub fn is_v6(&self) -> bool {
        matches!(self, Self::Ia { .. })
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hardware(mac) => write!(f, "{mac}"),
            Self::Id(id) => {
                f.write_str("id:")?;
                hex(f, id)
            }
            Self::Ia { duid, iaid } => {
                f.write_str("duid:")?;
                hex(f, duid)?;
                write!(f, "/iaid:{iaid:08x}")
            }
        }
    }
}

fn hex(f: &mut std::fmt::Formatter<'_>, bytes: &[u8]) -> std::fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
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
    pub ip: IpAddr,
    /// When it ends, in seconds since the Unix epoch.
    pub expires_unix: u64,
}

impl Lease {
    /// The address, if it is an IPv4 one (every lease of a v4 client's key is).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        match self.ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        }
    }
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

/// Errors of the lease log and the address book.
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
    /// A write failed and the log could not be cut back to its last whole record: nothing
    /// is appended until it can be (every append tries again first).
    #[error("lease log {path} holds a partial record that could not be cut off: {source}")]
    Damaged {
        /// The log.
        path: std::path::PathBuf,
        /// Why the cut failed.
        #[source]
        source: std::io::Error,
    },
    /// A thread panicked while holding the book's or the log's lock: the state cannot be
    /// trusted until the log is read again (a restart).
    #[error("the lease state's lock is poisoned (a thread panicked while holding it)")]
    Poisoned,
    /// Storing panicked; nothing of that call may be taken as durable.
    #[error("storing leases panicked")]
    Panicked,
}

/// Where leases are made durable: an append-only log of [`Record`]s.
pub trait LeaseLog: Send + Sync + std::fmt::Debug {
    /// What the log holds now (every record applied in order).
    fn durable(&self) -> Result<Index, LeaseError>;
    /// Appends `records` in order and returns once they are durable. An error means none of
    /// them is (the log is left as it was), and is this call's own: never another caller's.
    fn append(&self, records: &[Record]) -> Result<(), LeaseError>;
}

/// A log kept in memory, for ProxyDHCP (which keeps no leases), tests and fuzzing. It can be
/// told to fail appends (a full disk, on demand; the real one is tested with a small tmpfs).
#[derive(Debug, Default)]
pub struct MemoryLog {
    index: Mutex<Index>,
    failing: std::sync::atomic::AtomicBool,
}

impl MemoryLog {
    /// Makes every append fail (`true`) or succeed again.
    pub fn set_failing(&self, failing: bool) {
        self.failing
            .store(failing, std::sync::atomic::Ordering::SeqCst);
    }
}

impl LeaseLog for MemoryLog {
    fn durable(&self) -> Result<Index, LeaseError> {
        Ok(self.index.lock().map_err(|_| LeaseError::Poisoned)?.clone())
    }
    fn append(&self, records: &[Record]) -> Result<(), LeaseError> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LeaseError::Io {
                action: "appending to",
                path: "(memory)".into(),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            });
        }
        let mut index = self.index.lock().map_err(|_| LeaseError::Poisoned)?;
        for record in records {
            index.apply(record);
        }
        Ok(())
    }
}

/// The address book and the log that persists it, shared by the DHCP sockets, the commit
/// thread and the HTTP routes.
#[derive(Debug)]
pub struct Leases {
    book: Mutex<AddressBook>,
    log: Arc<dyn LeaseLog>,
    health: LogHealth,
}

/// How the log's writes went, for metrics and readiness.
#[derive(Debug, Default)]
struct LogHealth {
    /// The last write failed.
    failing: AtomicBool,
    /// Writes that failed.
    failed_writes: AtomicU64,
}

impl Leases {
    /// The book of what `log` holds.
    pub fn open(log: Arc<dyn LeaseLog>) -> Result<Self, LeaseError> {
        let book = AddressBook::from_durable(&log.durable()?);
        Ok(Self {
            book: Mutex::new(book),
            log,
            health: LogHealth::default(),
        })
    }

    /// Leases kept in memory only (ProxyDHCP, tests).
    pub fn in_memory() -> Self {
        Self {
            book: Mutex::default(),
            log: Arc::new(MemoryLog::default()),
            health: LogHealth::default(),
        }
    }

    /// The book, locked.
    pub fn book(&self) -> Result<MutexGuard<'_, AddressBook>, LeaseError> {
        self.book.lock().map_err(|_| LeaseError::Poisoned)
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn LeaseLog> {
        &self.log
    }

    /// Writes `records` durably, then tells the book whether each commit among them is
    /// durable: the result is this call's own. On success, says for each record whether the
    /// book took it: a commit is refused when the client released or declined the address
    /// while it was being written (its ACK must not go out).
    ///
    /// Each commit carries the ticket its REQUEST got from [`AddressBook::begin_commit`].
    pub fn persist(&self, writes: &[(Record, Option<Ticket>)]) -> Result<Vec<bool>, LeaseError> {
        let records: Vec<Record> = writes.iter().map(|(r, _)| r.clone()).collect();
        let written = self.append(&records);
        let mut book = self.book()?;
        let taken = writes
            .iter()
            .map(|(record, ticket)| match (record, ticket) {
                (Record::Commit(lease), Some(ticket)) if written.is_ok() => {
                    book.committed(lease, *ticket)
                }
                (Record::Commit(lease), Some(ticket)) => {
                    book.commit_failed(lease, *ticket);
                    false
                }
                // A commit without a ticket was accepted by no REQUEST: nothing to tell.
                (Record::Commit(_), None) => false,
                (Record::Release { .. } | Record::Decline { .. }, _) => true,
            })
            .collect();
        written.map(|()| taken)
    }

    /// Records the partner of a pair wrote, taken into the book
    /// ([`AddressBook::replicated`]) at `now`, and what the book took made durable here too;
    /// says for each record whether the book took it. The log gets what the book now
    /// holds, never a record it refused: the log's last record of an address is what a
    /// restart believes, and a refused or older copy arriving late (a catch-up after an
    /// interruption) would give the address back to a client whose lease ended (found by
    /// the pair's property test). The book takes the records first: until they are on
    /// disk they only keep more addresses from other clients; if the write fails, the
    /// caller does not acknowledge them to the partner.
    pub fn replicate(&self, records: &[Record], now: u64) -> Result<Vec<bool>, LeaseError> {
        let (taken, news) = {
            let mut book = self.book()?;
            let mut taken = Vec::with_capacity(records.len());
            let mut news = Vec::new();
            for record in records {
                // The addresses the record may change here: its own, and (for a commit)
                // the client's other one. What each then holds goes to the log.
                let touched: Vec<IpAddr> = match record {
                    Record::Commit(lease) => std::iter::once(lease.ip)
                        .chain(
                            book.lease_of(&lease.key)
                                .map(|l| l.ip)
                                .filter(|ip| *ip != lease.ip),
                        )
                        .collect(),
                    Record::Release { .. } | Record::Decline { .. } => Vec::new(),
                };
                let before: Vec<Option<Record>> = touched
                    .iter()
                    .map(|ip| book.durable_record_at(*ip))
                    .collect();
                let took = book.replicated(record, now);
                taken.push(took);
                if !took {
                    continue;
                }
                match record {
                    Record::Commit(_) => {
                        for (ip, before) in touched.iter().zip(before) {
                            let after = book.durable_record_at(*ip);
                            if after != before
                                && let Some(after) = after
                            {
                                news.push(after);
                            }
                        }
                    }
                    Record::Release { .. } | Record::Decline { .. } => news.push(record.clone()),
                }
            }
            (taken, news)
        };
        self.append(&news)?;
        Ok(taken)
    }

    /// Appends `records` to the log durably (a panicking log is a failed write) and keeps
    /// the log's health: whether the last write failed, and how many did.
    fn append(&self, records: &[Record]) -> Result<(), LeaseError> {
        let written =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.log.append(records)))
                .unwrap_or(Err(LeaseError::Panicked));
        self.health
            .failing
            .store(written.is_err(), Ordering::Relaxed);
        if written.is_err() {
            self.health.failed_writes.fetch_add(1, Ordering::Relaxed);
        }
        written
    }

    /// A REQUEST accepted in the book will not be written after all (the commit queue was
    /// full): its claim ends.
    pub fn abandon(&self, lease: &Lease, ticket: Ticket) -> Result<(), LeaseError> {
        self.book()?.commit_failed(lease, ticket);
        Ok(())
    }

    /// Whether the log's last write failed, and how many writes failed so far.
    pub fn log_health(&self) -> (bool, u64) {
        (
            self.health.failing.load(Ordering::Relaxed),
            self.health.failed_writes.load(Ordering::Relaxed),
        )
    }

    /// The durable lease on `ip`, expired or not.
    pub fn lease_at(&self, ip: impl Into<IpAddr>) -> Result<Option<Lease>, LeaseError> {
        Ok(self.book()?.lease_at(ip.into()))
    }

    /// How many durable leases have not expired at `now_unix`.
    pub fn active(&self, now_unix: u64) -> Result<usize, LeaseError> {
        Ok(self.book()?.active_leases(now_unix))
    }
}

/// What a lease log holds: the state its records add up to, kept by the log to seed the
/// book after a restart and to compact itself (never read by a DHCP decision).
#[derive(Debug, Default, Clone)]
pub struct Index {
    by_key: HashMap<ClientKey, Lease>,
    by_ip: HashMap<IpAddr, Binding>,
}

impl Index {
    pub fn apply(&mut self, record: &Record) {
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
            Record::Release { key, ip } => {
                // A release names the address it gives back (older logs do not: 0.0.0.0),
                // so that one written after the client's next lease cannot end that lease.
                let releases = self
                    .by_key
                    .get(key)
                    .is_some_and(|old| ip.is_unspecified() || old.ip == *ip);
                if releases
                    && let Some(old) = self.by_key.remove(key)
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

    pub fn live(&self) -> usize {
        self.by_ip.len()
    }

    /// Every record needed to rebuild this index (compaction).
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        self.by_ip.iter().map(|(ip, binding)| match binding {
            Binding::Leased(lease) => Record::Commit(lease.clone()),
            Binding::Declined { until_unix } => Record::Decline {
                ip: *ip,
                until_unix: *until_unix,
            },
        })
    }

    pub fn by_client(&self, key: &ClientKey) -> Option<Lease> {
        self.by_key.get(key).cloned()
    }

    pub fn by_ip(&self, ip: impl Into<IpAddr>) -> Option<Binding> {
        self.by_ip.get(&ip.into()).cloned()
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
        let ip = IpAddr::from([10, 0, 0, 5]);
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
