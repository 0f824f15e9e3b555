//! [`FileStore`]: the durable lease store, an append-only log with an in-memory index and
//! group commit.
//!
//! Concurrent commits share one write and one sync: a caller queues its record; the first
//! caller without a flush in progress writes and syncs everything queued, the others wait
//! for it. Thousands of leases per second cost a few hundred syncs. When the log holds more
//! than four times the live records, it is rewritten (compacted) to a temporary file that
//! replaces it atomically.
//!
//! Reads never wait for the log: the index has a lock of its own, taken for writing only
//! while one record is applied (under the log's lock, so that the index and the log see
//! records in the same order). Compaction snapshots the live records under the log's lock
//! and writes, syncs and renames the copy without it, marked as a flush in progress so that
//! no append writes to the old file meanwhile; commits queued during it are written to the
//! new file after it. A DHCP packet that only reads (every candidate address while
//! allocating) is never held up by a sync or a compaction.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use super::record::{MAGIC_V2, Record, V1_RECORD_LEN};
use super::{Binding, ClientKey, Index, Lease, LeaseError, LeaseStore};

/// The state behind the log's lock.
#[derive(Debug)]
struct Log {
    /// Records queued for the next flush, encoded.
    queued: Vec<u8>,
    queued_records: usize,
    /// Sequence number of the last record queued.
    queued_seq: u64,
    /// Sequence number up to which records are durable.
    durable_seq: u64,
    /// Whether a thread is writing and syncing (or compacting) now.
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
    /// Written only under `log`'s lock; read without it.
    index: RwLock<Index>,
    log: Mutex<Log>,
    flushed: Condvar,
    syncs: AtomicU64,
}

/// What the replay of a log found.
struct Replay {
    index: Index,
    records: usize,
    /// Bytes of intact records (with the header); the rest is a torn tail.
    good_len: usize,
    /// Whether the log is of version 1 (to be rewritten).
    v1: bool,
}

fn replay(bytes: &[u8]) -> Replay {
    let mut index = Index::default();
    let mut records = 0;
    if let Some(mut rest) = bytes.strip_prefix(&MAGIC_V2[..]) {
        while let Some((record, len)) = Record::decode_v2(rest) {
            index.apply(&record);
            records += 1;
            rest = &rest[len..];
        }
        let good_len = bytes.len() - rest.len();
        return Replay {
            index,
            records,
            good_len,
            v1: false,
        };
    }
    if MAGIC_V2.starts_with(bytes) {
        // Empty, or a header torn while the log was created.
        return Replay {
            index,
            records: 0,
            good_len: 0,
            v1: false,
        };
    }
    for chunk in bytes.chunks_exact(V1_RECORD_LEN) {
        let Some(record) = <&[u8; V1_RECORD_LEN]>::try_from(chunk)
            .ok()
            .and_then(Record::decode_v1)
        else {
            break;
        };
        index.apply(&record);
        records += 1;
    }
    Replay {
        index,
        records,
        good_len: records * V1_RECORD_LEN,
        v1: true,
    }
}

impl FileStore {
    /// Opens (or creates) the log at `path` and replays it; a torn tail is cut off and a
    /// log of version 1 is rewritten as version 2.
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
        let replay = replay(&bytes);
        if replay.good_len != bytes.len() {
            tracing::warn!(path = %path.display(), kept = replay.records, dropped_bytes = bytes.len() - replay.good_len, "lease log had a torn or corrupt tail; cut off");
            file.set_len(replay.good_len as u64)
                .map_err(|e| io("truncating", e))?;
            file.sync_all().map_err(|e| io("syncing", e))?;
        }
        if replay.good_len == 0 && !replay.v1 {
            file.write_all(MAGIC_V2)
                .and_then(|()| file.sync_all())
                .map_err(|e| io("writing the header of", e))?;
        }
        let store = Self {
            path: path.to_owned(),
            index: RwLock::new(replay.index),
            log: Mutex::new(Log {
                queued: Vec::new(),
                queued_records: 0,
                queued_seq: 0,
                durable_seq: 0,
                flushing: false,
                failed: None,
                records_in_file: replay.records,
                file,
            }),
            flushed: Condvar::new(),
            syncs: AtomicU64::new(0),
        };
        if replay.v1 {
            tracing::info!(path = %path.display(), records = replay.records, "lease log of version 1: rewriting it as version 2");
            store.compact()?;
        }
        Ok(store)
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

    fn read_index(&self) -> Result<RwLockReadGuard<'_, Index>, LeaseError> {
        self.index.read().map_err(|_| LeaseError::Poisoned)
    }

    /// Applies a record in memory, queues it, and returns once it is durable.
    fn append(&self, record: Record) -> Result<(), LeaseError> {
        self.append_all(std::iter::once(record))
    }

    /// Applies records in memory, queues them, and returns once they are durable (one write
    /// and one sync, unless a flush is already under way).
    fn append_all(&self, records: impl IntoIterator<Item = Record>) -> Result<(), LeaseError> {
        let mut log = self.lock()?;
        {
            let mut index = self.index.write().map_err(|_| LeaseError::Poisoned)?;
            for record in records {
                index.apply(&record);
                record.encode_v2(&mut log.queued);
                log.queued_records += 1;
                log.queued_seq += 1;
            }
        }
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
        let records = std::mem::take(&mut log.queued_records);
        let upto = log.queued_seq;
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
        let live = self.read_index()?.live();
        let needs_compaction =
            log.records_in_file > 10_000 && log.records_in_file > 4 * live.max(1);
        if needs_compaction && log.queued.is_empty() {
            log = self.compact_locked(log)?;
        }
        Ok(log)
    }

    /// Rewrites the log with only the live records.
    pub fn compact(&self) -> Result<(), LeaseError> {
        let mut log = self.lock()?;
        // The snapshot must be exactly what the log holds: nothing queued, no flush running
        // (a flush can let others queue while it compacts).
        while log.flushing || !log.queued.is_empty() {
            log = if log.flushing {
                self.flushed.wait(log).map_err(|_| LeaseError::Poisoned)?
            } else {
                self.flush(log)?
            };
        }
        self.compact_locked(log).map(drop)
    }

    /// Snapshots the live records under the log's lock (nothing queued, no flush running)
    /// and writes the copy without it.
    fn compact_locked<'a>(
        &'a self,
        mut log: MutexGuard<'a, Log>,
    ) -> Result<MutexGuard<'a, Log>, LeaseError> {
        let mut bytes = MAGIC_V2.to_vec();
        let mut records = 0;
        for record in self.read_index()?.records() {
            record.encode_v2(&mut bytes);
            records += 1;
        }
        log.flushing = true;
        drop(log);
        let written = self.write_compacted(&bytes);
        let mut log = self.lock()?;
        log.flushing = false;
        self.flushed.notify_all();
        log.file = written?;
        log.records_in_file = records;
        Ok(log)
    }

    /// Replaces the log by `bytes` (a temporary file, synced, renamed over it) and opens it.
    fn write_compacted(&self, bytes: &[u8]) -> Result<File, LeaseError> {
        let io = |action, source| LeaseError::Io {
            action,
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("compacting");
        let mut file = File::create(&tmp).map_err(|e| io("creating a compacted copy of", e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io("writing a compacted copy of", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io("replacing", e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("syncing the directory of", e))?;
        }
        OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| io("reopening", e))
    }
}

impl LeaseStore for FileStore {
    fn by_client(&self, key: &ClientKey) -> Result<Option<Lease>, LeaseError> {
        Ok(self.read_index()?.by_client(key))
    }
    fn by_ip(&self, ip: Ipv4Addr) -> Result<Option<Binding>, LeaseError> {
        Ok(self.read_index()?.by_ip(ip))
    }
    fn active(&self, now_unix: u64) -> Result<usize, LeaseError> {
        Ok(self.read_index()?.active(now_unix))
    }
    fn commit(&self, lease: Lease) -> Result<(), LeaseError> {
        self.append(Record::Commit(lease))
    }
    fn commit_all(&self, leases: Vec<Lease>) -> Result<(), LeaseError> {
        self.append_all(leases.into_iter().map(Record::Commit))
    }
    fn release(&self, key: &ClientKey) -> Result<(), LeaseError> {
        self.append(Record::Release(key.clone()))
    }
    fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), LeaseError> {
        self.append(Record::Decline { ip, until_unix })
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::encode_v1;
    use super::*;
    use crate::backend::MacAddr;
    use std::sync::Arc;

    fn mac(n: u32) -> MacAddr {
        let b = n.to_be_bytes();
        MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
    }

    fn lease(n: u32, ip: u32) -> Lease {
        Lease {
            key: ClientKey::Hardware(mac(n)),
            mac: mac(n),
            ip: Ipv4Addr::from(0x0a00_0000 + ip),
            expires_unix: 4_000_000_000,
        }
    }

    fn key(n: u32) -> ClientKey {
        ClientKey::Hardware(mac(n))
    }

    #[test]
    fn commit_release_decline_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        store.commit(lease(1, 10)).unwrap();
        store.commit(lease(2, 11)).unwrap();
        // The same client moves to a new address: the old one is free again.
        store.commit(lease(1, 12)).unwrap();
        assert_eq!(store.by_ip(lease(1, 10).ip).unwrap(), None);
        store.release(&key(2)).unwrap();
        store.decline(Ipv4Addr::new(10, 0, 0, 99), 123).unwrap();
        // A client known by an identifier, from another MAC.
        let by_id = Lease {
            key: ClientKey::Id(Box::from(&b"\x00client-7"[..])),
            mac: mac(7),
            ip: Ipv4Addr::new(10, 0, 0, 77),
            expires_unix: 4_000_000_000,
        };
        store.commit(by_id.clone()).unwrap();
        drop(store);

        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_client(&key(1)).unwrap(), Some(lease(1, 12)));
        assert_eq!(
            store.by_ip(lease(1, 12).ip).unwrap(),
            Some(Binding::Leased(lease(1, 12)))
        );
        assert_eq!(store.by_client(&key(2)).unwrap(), None);
        assert_eq!(store.by_ip(lease(2, 11).ip).unwrap(), None);
        assert_eq!(
            store.by_ip(Ipv4Addr::new(10, 0, 0, 99)).unwrap(),
            Some(Binding::Declined { until_unix: 123 })
        );
        assert_eq!(store.by_client(&by_id.key).unwrap(), Some(by_id));
        assert_eq!(store.active(0).unwrap(), 2);
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        store.commit(lease(1, 1)).unwrap();
        store.commit(lease(2, 2)).unwrap();
        let intact = store.file_len().unwrap();
        drop(store);
        // A crash mid-write: part of a record.
        let mut torn = Vec::new();
        Record::Commit(lease(3, 3)).encode_v2(&mut torn);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&torn[..10]).unwrap();
        drop(file);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.file_len().unwrap(), intact);
        assert_eq!(store.by_client(&key(3)).unwrap(), None);
        store.commit(lease(4, 4)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_client(&key(4)).unwrap(), Some(lease(4, 4)));
        assert_eq!(store.by_client(&key(1)).unwrap(), Some(lease(1, 1)));
    }

    #[test]
    fn a_version_1_log_is_read_and_rewritten_as_version_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let ip = |n| Ipv4Addr::new(10, 0, 0, n);
        let mut v1 = Vec::new();
        v1.extend(encode_v1(1, mac(1).0, ip(1), 4_000_000_000));
        v1.extend(encode_v1(1, mac(2).0, ip(2), 4_000_000_000));
        v1.extend(encode_v1(2, mac(2).0, Ipv4Addr::UNSPECIFIED, 0));
        v1.extend(encode_v1(3, [0; 6], ip(3), 55));
        v1.extend(&encode_v1(1, mac(4).0, ip(4), 1)[..7]); // torn
        std::fs::write(&path, &v1).unwrap();

        let store = FileStore::open(&path).unwrap();
        let check = |store: &FileStore| {
            assert_eq!(
                store.by_client(&key(1)).unwrap(),
                Some(Lease {
                    ip: ip(1),
                    ..lease(1, 0)
                })
            );
            assert_eq!(store.by_client(&key(2)).unwrap(), None);
            assert_eq!(
                store.by_ip(ip(3)).unwrap(),
                Some(Binding::Declined { until_unix: 55 })
            );
            assert_eq!(store.by_client(&key(4)).unwrap(), None);
        };
        check(&store);
        drop(store);
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(MAGIC_V2), "rewritten as version 2");
        let store = FileStore::open(&path).unwrap();
        check(&store);
        store.commit(lease(5, 5)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_client(&key(5)).unwrap(), Some(lease(5, 5)));
    }

    #[test]
    fn a_torn_header_is_an_empty_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        std::fs::write(&path, &MAGIC_V2[..3]).unwrap();
        let store = FileStore::open(&path).unwrap();
        store.commit(lease(1, 1)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_client(&key(1)).unwrap(), Some(lease(1, 1)));
    }

    #[test]
    fn a_poisoned_store_refuses_to_answer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(&dir.path().join("leases.log")).unwrap());
        store.commit(lease(1, 1)).unwrap();
        let poisoner = store.clone();
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.index.write().unwrap();
            panic!("a panic while the lock is held");
        })
        .join();
        assert!(matches!(
            store.by_ip(lease(1, 1).ip),
            Err(LeaseError::Poisoned)
        ));
        assert!(matches!(
            store.by_client(&key(2)),
            Err(LeaseError::Poisoned)
        ));
        assert!(matches!(store.active(0), Err(LeaseError::Poisoned)));
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
                assert_eq!(store.by_client(&key(n)).unwrap(), Some(lease(n, n)));
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
        let before = store.file_len().unwrap();
        store.compact().unwrap();
        let after = store.file_len().unwrap();
        assert_eq!(
            after - MAGIC_V2.len() as u64,
            (before - MAGIC_V2.len() as u64) / 5
        );
        store.commit(lease(500, 5)).unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        assert_eq!(store.by_client(&key(7)).unwrap(), Some(lease(7, 4007)));
        assert_eq!(store.by_client(&key(500)).unwrap(), Some(lease(500, 5)));
        assert_eq!(store.active(0).unwrap(), 101);
    }

    #[test]
    fn reads_do_not_wait_for_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(&dir.path().join("leases.log")).unwrap());
        store.commit(lease(1, 1)).unwrap();
        // The log's lock held as through a sync or a compaction: a read still answers.
        let _held = store.log.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = store.clone();
        std::thread::spawn(move || {
            let _ = tx.send((reader.by_ip(lease(1, 1).ip), reader.by_client(&key(1))));
        });
        let (by_ip, by_client) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a read waited for the log's lock");
        assert_eq!(by_ip.unwrap(), Some(Binding::Leased(lease(1, 1))));
        assert_eq!(by_client.unwrap(), Some(lease(1, 1)));
    }

    #[test]
    fn commits_during_compactions_all_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = Arc::new(FileStore::open(&path).unwrap());
        let writers: Vec<_> = (0..4u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for round in 0..3 {
                        for i in 0..300u32 {
                            let n = t * 10_000 + i;
                            store.commit(lease(n, n + round * 100_000)).unwrap();
                            if i % 50 == 0 {
                                store.release(&key(n)).unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        let compactor = {
            let store = store.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    store.compact().unwrap();
                }
            })
        };
        for t in writers {
            t.join().unwrap();
        }
        compactor.join().unwrap();
        let expect = |store: &FileStore| {
            for t in 0..4u32 {
                for i in 0..300u32 {
                    let n = t * 10_000 + i;
                    let want = (i % 50 != 0).then(|| lease(n, n + 200_000));
                    assert_eq!(store.by_client(&key(n)).unwrap(), want, "client {n}");
                }
            }
        };
        expect(&store);
        drop(store);
        expect(&FileStore::open(&path).unwrap());
    }
}
