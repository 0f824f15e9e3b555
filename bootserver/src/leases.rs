//! The DHCP lease store: every lease indexed in memory (by MAC and by address), made
//! durable in an append-only log with group commit.
//!
//! Durability: [`LeaseStore::commit`] returns only after the record is on disk
//! (`fdatasync`), and the server sends the ACK only after that, so no acknowledged lease is
//! lost by a crash (`kill -9`, power loss) and a restarted server never offers a leased
//! address to someone else. Concurrent commits share one write and one sync: a caller
//! queues its record; the first caller without a flush in progress writes and syncs
//! everything queued, the others wait for it (group commit). Thousands of leases per second
//! cost a few hundred syncs.
//!
//! The log: fixed 24-byte records `kind u8 | mac [u8;6] | pad u8 | ip u32 | expires u64 |
//! crc32 u32` (big-endian). A torn record at the end (crash mid-write) fails its CRC and is
//! cut off when the log is opened. When the log holds more than four times the live
//! records, it is rewritten (compacted) to a temporary file that replaces it atomically.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// One lease (or, with an all-zero MAC, a declined address held out of the pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The client's MAC.
    pub mac: [u8; 6],
    /// The address.
    pub ip: Ipv4Addr,
    /// When it ends, in seconds since the Unix epoch.
    pub expires_unix: u64,
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
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A thread panicked while holding the store's lock.
    #[error("the lease store's lock is poisoned (a thread panicked while writing)")]
    Poisoned,
}

/// What the DHCP server needs from a lease store.
pub trait LeaseStore: Send + Sync {
    /// The lease of a MAC.
    fn by_mac(&self, mac: [u8; 6]) -> Option<Lease>;
    /// The lease (or decline) of an address.
    fn by_ip(&self, ip: Ipv4Addr) -> Option<Lease>;
    /// How many leases have not expired at `now_unix`.
    fn active(&self, now_unix: u64) -> usize;
    /// Stores a lease durably (replacing the MAC's previous one).
    fn commit(&self, lease: Lease) -> Result<(), LeaseError>;
    /// Removes a MAC's lease durably.
    fn release(&self, mac: [u8; 6]) -> Result<(), LeaseError>;
    /// Holds an address out of the pool until `until_unix`, durably.
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError>;
}

const DECLINED: [u8; 6] = [0; 6];

/// The in-memory index.
#[derive(Debug, Default)]
struct Index {
    by_mac: HashMap<[u8; 6], Lease>,
    by_ip: HashMap<Ipv4Addr, Lease>,
}

impl Index {
    fn apply(&mut self, record: &Record) {
        match record.kind {
            Kind::Commit => {
                if let Some(old) = self.by_mac.insert(record.lease.mac, record.lease)
                    && old.ip != record.lease.ip
                    && self.by_ip.get(&old.ip).is_some_and(|l| l.mac == old.mac)
                {
                    self.by_ip.remove(&old.ip);
                }
                // An address moving to a new MAC takes it from the old one.
                if let Some(prev) = self.by_ip.insert(record.lease.ip, record.lease)
                    && prev.mac != record.lease.mac
                {
                    self.by_mac.remove(&prev.mac);
                }
            }
            Kind::Release => {
                if let Some(old) = self.by_mac.remove(&record.lease.mac)
                    && self.by_ip.get(&old.ip).is_some_and(|l| l.mac == old.mac)
                {
                    self.by_ip.remove(&old.ip);
                }
            }
            Kind::Decline => {
                if let Some(prev) = self.by_ip.insert(record.lease.ip, record.lease)
                    && prev.mac != DECLINED
                {
                    self.by_mac.remove(&prev.mac);
                }
            }
        }
    }

    fn live(&self) -> usize {
        self.by_ip.len()
    }
}

/// A store without persistence, for tests and for ProxyDHCP (which keeps no leases).
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
    fn by_mac(&self, mac: [u8; 6]) -> Option<Lease> {
        self.with(|i| i.by_mac.get(&mac).copied()).ok().flatten()
    }
    fn by_ip(&self, ip: Ipv4Addr) -> Option<Lease> {
        self.with(|i| i.by_ip.get(&ip).copied()).ok().flatten()
    }
    fn active(&self, now_unix: u64) -> usize {
        self.with(|i| {
            i.by_mac
                .values()
                .filter(|l| l.expires_unix > now_unix)
                .count()
        })
        .unwrap_or(0)
    }
    fn commit(&self, lease: Lease) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::commit(lease)))
    }
    fn release(&self, mac: [u8; 6]) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::release(mac)))
    }
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError> {
        self.with(|i| i.apply(&Record::decline(ip, until_unix)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Commit = 1,
    Release = 2,
    Decline = 3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    kind: Kind,
    lease: Lease,
}

const RECORD_LEN: usize = 24;

impl Record {
    fn commit(lease: Lease) -> Self {
        Self {
            kind: Kind::Commit,
            lease,
        }
    }
    fn release(mac: [u8; 6]) -> Self {
        Self {
            kind: Kind::Release,
            lease: Lease {
                mac,
                ip: Ipv4Addr::UNSPECIFIED,
                expires_unix: 0,
            },
        }
    }
    fn decline(ip: Ipv4Addr, until_unix: u64) -> Self {
        Self {
            kind: Kind::Decline,
            lease: Lease {
                mac: DECLINED,
                ip,
                expires_unix: until_unix,
            },
        }
    }

    fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0] = self.kind as u8;
        b[1..7].copy_from_slice(&self.lease.mac);
        b[8..12].copy_from_slice(&u32::from(self.lease.ip).to_be_bytes());
        b[12..20].copy_from_slice(&self.lease.expires_unix.to_be_bytes());
        let crc = crc32(&b[..20]);
        b[20..24].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn decode(b: &[u8; RECORD_LEN]) -> Option<Self> {
        let crc = u32::from_be_bytes([b[20], b[21], b[22], b[23]]);
        if crc32(&b[..20]) != crc {
            return None;
        }
        let kind = match b[0] {
            1 => Kind::Commit,
            2 => Kind::Release,
            3 => Kind::Decline,
            _ => return None,
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&b[1..7]);
        let ip = Ipv4Addr::from(u32::from_be_bytes([b[8], b[9], b[10], b[11]]));
        let mut expires = [0u8; 8];
        expires.copy_from_slice(&b[12..20]);
        Some(Self {
            kind,
            lease: Lease {
                mac,
                ip,
                expires_unix: u64::from_be_bytes(expires),
            },
        })
    }
}

/// CRC-32 (IEEE), bitwise: records are tiny and the sync dominates.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xedb8_8320 & mask);
        }
    }
    !crc
}

/// The state behind the lock.
#[derive(Debug)]
struct Log {
    index: Index,
    /// Records queued for the next flush.
    queued: Vec<u8>,
    /// Sequence number of the last record queued.
    queued_seq: u64,
    /// Sequence number up to which records are durable.
    durable_seq: u64,
    /// Whether a thread is writing and syncing now.
    flushing: bool,
    /// The error of the last flush, for the callers that waited on it.
    failed: Option<String>,
    /// Records in the file.
    records_in_file: usize,
    file: File,
}

/// The durable store: an append-only log with an in-memory index and group commit.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    log: Mutex<Log>,
    flushed: Condvar,
    syncs: AtomicU64,
}

impl FileStore {
    /// Opens (or creates) the log at `path` and replays it; a torn tail is cut off.
    pub fn open(path: &Path) -> Result<Self, LeaseError> {
        let io = |action, source| LeaseError::Io {
            action,
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| io("opening", e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| io("reading", e))?;
        let mut index = Index::default();
        let mut good = 0usize;
        for chunk in bytes.chunks_exact(RECORD_LEN) {
            let Ok(raw) = <&[u8; RECORD_LEN]>::try_from(chunk) else {
                break;
            };
            let Some(record) = Record::decode(raw) else {
                break;
            };
            index.apply(&record);
            good += 1;
        }
        let good_len = (good * RECORD_LEN) as u64;
        if good_len != bytes.len() as u64 {
            tracing::warn!(path = %path.display(), kept = good, dropped_bytes = bytes.len() as u64 - good_len, "lease log had a torn or corrupt tail; cut off");
            file.set_len(good_len).map_err(|e| io("truncating", e))?;
            file.sync_all().map_err(|e| io("syncing", e))?;
        }
        Ok(Self {
            path: path.to_owned(),
            log: Mutex::new(Log {
                index,
                queued: Vec::new(),
                queued_seq: 0,
                durable_seq: 0,
                flushing: false,
                failed: None,
                records_in_file: good,
                file,
            }),
            flushed: Condvar::new(),
            syncs: AtomicU64::new(0),
        })
    }

    /// How many times the log was synced (group commit makes this far fewer than commits).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The size of the log file in bytes.
    pub fn file_len(&self) -> Result<u64, LeaseError> {
        std::fs::metadata(&self.path)
            .map(|m| m.len())
            .map_err(|source| LeaseError::Io {
                action: "reading the size of",
                path: self.path.clone(),
                source,
            })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Log>, LeaseError> {
        self.log.lock().map_err(|_| LeaseError::Poisoned)
    }

    /// Applies a record in memory, queues it, and returns once it is durable.
    fn append(&self, record: Record) -> Result<(), LeaseError> {
        let mut log = self.lock()?;
        log.index.apply(&record);
        log.queued.extend_from_slice(&record.encode());
        log.queued_seq += 1;
        let mine = log.queued_seq;
        loop {
            if log.durable_seq >= mine {
                return match &log.failed {
                    Some(message) => Err(self.flush_error(message)),
                    None => Ok(()),
                };
            }
            if !log.flushing {
                log = self.flush(log)?;
                continue;
            }
            log = self.flushed.wait(log).map_err(|_| LeaseError::Poisoned)?;
        }
    }

    fn flush_error(&self, message: &str) -> LeaseError {
        LeaseError::Io {
            action: "appending to",
            path: self.path.clone(),
            source: std::io::Error::other(message.to_owned()),
        }
    }

    /// Writes and syncs everything queued, without the lock held during the I/O.
    fn flush<'a>(
        &'a self,
        mut log: MutexGuard<'a, Log>,
    ) -> Result<MutexGuard<'a, Log>, LeaseError> {
        log.flushing = true;
        let batch = std::mem::take(&mut log.queued);
        let upto = log.queued_seq;
        let records = batch.len() / RECORD_LEN;
        let file = log.file.try_clone().map_err(|source| LeaseError::Io {
            action: "opening",
            path: self.path.clone(),
            source,
        });
        drop(log);
        let result = file.and_then(|mut file| {
            file.write_all(&batch)
                .and_then(|()| file.sync_data())
                .map_err(|source| LeaseError::Io {
                    action: "appending to",
                    path: self.path.clone(),
                    source,
                })
        });
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let mut log = self.lock()?;
        log.flushing = false;
        log.durable_seq = upto;
        match result {
            Ok(()) => {
                log.failed = None;
                log.records_in_file += records;
            }
            Err(error) => log.failed = Some(error.to_string()),
        }
        self.flushed.notify_all();
        let needs_compaction =
            log.records_in_file > 10_000 && log.records_in_file > 4 * log.index.live().max(1);
        if needs_compaction && log.queued.is_empty() {
            log = self.compact_locked(log)?;
        }
        Ok(log)
    }

    /// Rewrites the log with only the live records.
    pub fn compact(&self) -> Result<(), LeaseError> {
        let mut log = self.lock()?;
        while log.flushing {
            log = self.flushed.wait(log).map_err(|_| LeaseError::Poisoned)?;
        }
        if !log.queued.is_empty() {
            log = self.flush(log)?;
        }
        self.compact_locked(log).map(drop)
    }

    fn compact_locked<'a>(
        &'a self,
        mut log: MutexGuard<'a, Log>,
    ) -> Result<MutexGuard<'a, Log>, LeaseError> {
        let io = |action, source| LeaseError::Io {
            action,
            path: self.path.clone(),
            source,
        };
        let mut bytes = Vec::with_capacity(log.index.live() * RECORD_LEN);
        for lease in log.index.by_ip.values() {
            let record = if lease.mac == DECLINED {
                Record::decline(lease.ip, lease.expires_unix)
            } else {
                Record::commit(*lease)
            };
            bytes.extend_from_slice(&record.encode());
        }
        let tmp = self.path.with_extension("compacting");
        let mut file = File::create(&tmp).map_err(|e| io("creating a compacted copy of", e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io("writing a compacted copy of", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io("replacing", e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("syncing the directory of", e))?;
        }
        log.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| io("reopening", e))?;
        log.records_in_file = bytes.len() / RECORD_LEN;
        Ok(log)
    }
}

impl LeaseStore for FileStore {
    fn by_mac(&self, mac: [u8; 6]) -> Option<Lease> {
        self.lock().ok()?.index.by_mac.get(&mac).copied()
    }
    fn by_ip(&self, ip: Ipv4Addr) -> Option<Lease> {
        self.lock().ok()?.index.by_ip.get(&ip).copied()
    }
    fn active(&self, now_unix: u64) -> usize {
        self.lock().map_or(0, |log| {
            log.index
                .by_mac
                .values()
                .filter(|l| l.expires_unix > now_unix)
                .count()
        })
    }
    fn commit(&self, lease: Lease) -> Result<(), LeaseError> {
        self.append(Record::commit(lease))
    }
    fn release(&self, mac: [u8; 6]) -> Result<(), LeaseError> {
        self.append(Record::release(mac))
    }
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError> {
        self.append(Record::decline(ip, until_unix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn lease(n: u32, ip: u32) -> Lease {
        let b = n.to_be_bytes();
        Lease {
            mac: [0x52, 0x54, b[0], b[1], b[2], b[3]],
            ip: Ipv4Addr::from(0x0a00_0000 + ip),
            expires_unix: 4_000_000_000,
        }
    }

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn commit_release_decline_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        store.commit(lease(1, 10)).unwrap();
        store.commit(lease(2, 11)).unwrap();
        // The same MAC moves to a new address: the old one is free again.
        store.commit(lease(1, 12)).unwrap();
        assert_eq!(store.by_ip(lease(1, 10).ip), None);
        store.release(lease(2, 0).mac).unwrap();
        store.decline(Ipv4Addr::new(10, 0, 0, 99), 123).unwrap();
        drop(store);

        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_mac(lease(1, 0).mac), Some(lease(1, 12)));
        assert_eq!(
            store.by_ip(lease(1, 12).ip).map(|l| l.mac),
            Some(lease(1, 0).mac)
        );
        assert_eq!(store.by_mac(lease(2, 0).mac), None);
        assert_eq!(store.by_ip(lease(2, 11).ip), None);
        let declined = store.by_ip(Ipv4Addr::new(10, 0, 0, 99)).unwrap();
        assert_eq!((declined.mac, declined.expires_unix), (DECLINED, 123));
        assert_eq!(store.active(0), 1);
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        store.commit(lease(1, 1)).unwrap();
        store.commit(lease(2, 2)).unwrap();
        drop(store);
        // A crash mid-write: half a record, then garbage.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&Record::commit(lease(3, 3)).encode()[..10])
            .unwrap();
        drop(file);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.file_len().unwrap(), 2 * RECORD_LEN as u64);
        assert_eq!(store.by_mac(lease(3, 0).mac), None);
        store.commit(lease(4, 4)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_mac(lease(4, 0).mac), Some(lease(4, 4)));
        assert_eq!(store.by_mac(lease(1, 0).mac), Some(lease(1, 1)));
    }

    #[test]
    fn concurrent_commits_share_syncs_and_all_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = Arc::new(FileStore::open(&path).unwrap());
        let started = std::time::Instant::now();
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000u32 {
                        let n = t * 10_000 + i;
                        store.commit(lease(n, n)).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let elapsed = started.elapsed();
        let syncs = store.syncs();
        eprintln!(
            "16000 commits in {elapsed:?} ({:.0}/s) with {syncs} syncs",
            16_000.0 / elapsed.as_secs_f64()
        );
        assert!(
            syncs < 16_000,
            "group commit: {syncs} syncs for 16000 commits"
        );
        drop(store);
        let store = FileStore::open(&path).unwrap();
        for t in 0..8u32 {
            for i in 0..2_000u32 {
                let n = t * 10_000 + i;
                assert_eq!(store.by_mac(lease(n, 0).mac), Some(lease(n, n)));
            }
        }
    }

    #[test]
    fn compaction_keeps_the_state_and_shrinks_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        for round in 0..5 {
            for n in 0..100 {
                store.commit(lease(n, n + round * 1000)).unwrap();
            }
        }
        assert_eq!(store.file_len().unwrap(), 500 * RECORD_LEN as u64);
        store.compact().unwrap();
        assert_eq!(store.file_len().unwrap(), 100 * RECORD_LEN as u64);
        store.commit(lease(500, 5)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_mac(lease(7, 0).mac), Some(lease(7, 4007)));
        assert_eq!(store.by_mac(lease(500, 0).mac), Some(lease(500, 5)));
        assert_eq!(store.active(0), 101);
    }
}
