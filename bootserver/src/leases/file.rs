//! [`FileStore`]: the lease log on disk, append-only, made durable before any ACK.
//!
//! **One writer, its own result.** Appends are serialized by one lock held through the
//! write and the `fdatasync`; grouping many leases into one write is the job of the DHCP
//! commit thread ([`crate::dhcp::commit`]), which hands each batch over in one call. So a
//! caller's result is always the result of the write that carried its records: a failed
//! batch can never be reported as durable because a later one succeeded.
//!
//! **A failed write leaves the log as it was.** The log knows how many bytes of whole
//! records it holds. When a write or its sync fails (a full disk: `ENOSPC`), the file is cut
//! back to that length and synced, so that nothing appended later ends up behind a partial
//! record. If even the cut fails, the log is marked damaged and refuses every append until
//! a cut succeeds (each append tries first).
//!
//! **Replay tells a torn tail from damage in the middle.** A record that fails its length or
//! CRC check with no whole record after it is a torn tail (a crash mid-write): it is cut
//! off. Whole records *after* a bad stretch mean damage in the middle (a disk that lost
//! bytes, or a log written before failed writes were cut back): every whole record after it
//! is kept, the stretch is named in an error-level log line, the damaged file is kept beside
//! the log (`<log>.damaged-<unix time>`) and the log is rewritten without it. A resync point
//! is taken only where the records from there run cleanly to the end of the file, when one
//! exists, so that bytes inside a damaged record (a client identifier can hold anything)
//! are not read as records.
//!
//! **Compaction.** When the log holds more than four times the live records (and more than
//! 10,000), it is rewritten with only the live ones to a temporary file that replaces it
//! atomically. A compaction that fails (the disk is full) leaves the log as it was.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::record::{MAGIC_V2, Record, V1_RECORD_LEN};
use super::{Index, LeaseError, LeaseLog};

/// The state behind the log's lock.
#[derive(Debug)]
struct Log {
    file: File,
    /// Bytes of whole records (with the header): where the next record goes, and where a
    /// failed write is cut back to.
    good_len: u64,
    /// A failed write could not be cut back: the file may end with a partial record.
    damaged: bool,
    /// What the records add up to.
    index: Index,
    /// Records in the file.
    records_in_file: usize,
    /// A compaction renamed its file over the log but could not sync the directory: the
    /// new name may not be on disk, so a record appended now could be lost with it. No
    /// append is acknowledged until the directory is synced.
    rename_unsynced: bool,
}

/// The lease log on disk.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    log: Mutex<Log>,
    syncs: AtomicU64,
    failed_appends: AtomicU64,
    /// Makes every sync of the log's directory fail (tests: an EIO or EMFILE there).
    #[cfg(test)]
    fail_dir_sync: std::sync::atomic::AtomicBool,
}

/// A stretch of the log that holds no whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Damage {
    start: usize,
    end: usize,
}

/// What the replay of a log found.
#[derive(Debug)]
struct Replay {
    index: Index,
    records: usize,
    /// Where the whole records end; the rest is a torn tail.
    good_len: usize,
    /// Bad stretches followed by whole records.
    damage: Vec<Damage>,
    /// Whether the log is of version 1 (to be rewritten).
    v1: bool,
}

/// Decodes consecutive records from the start of `bytes`: the records and where they end.
fn run_of_records(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some((record, len)) = bytes.get(at..).and_then(Record::decode_v2) {
        records.push(record);
        at += len;
    }
    (records, at)
}

/// Where whole records start again after damage at `from`: the first point whose records
/// run to the end of `bytes`, else the first point where any whole record starts.
fn resync(bytes: &[u8], from: usize) -> Option<usize> {
    let candidates = || {
        (from + 1..bytes.len()).filter(|&at| bytes.get(at..).and_then(Record::decode_v2).is_some())
    };
    candidates()
        .find(|&at| at + run_of_records(&bytes[at..]).1 == bytes.len())
        .or_else(|| candidates().next())
}

fn replay(bytes: &[u8]) -> Replay {
    let empty = || Replay {
        index: Index::default(),
        records: 0,
        good_len: 0,
        damage: Vec::new(),
        v1: false,
    };
    if MAGIC_V2.starts_with(bytes) {
        // Empty, or a header torn while the log was created.
        return empty();
    }
    let v1_record = |chunk: &[u8]| {
        <&[u8; V1_RECORD_LEN]>::try_from(chunk)
            .ok()
            .and_then(Record::decode_v1)
    };
    let start = if bytes.starts_with(&MAGIC_V2[..]) {
        MAGIC_V2.len()
    } else if bytes.get(..V1_RECORD_LEN).and_then(v1_record).is_some() {
        return replay_v1(bytes, v1_record);
    } else {
        // Neither header: a damaged header is damage like any other.
        0
    };
    let mut replay = empty();
    let mut at = start;
    loop {
        let (run, len) = run_of_records(&bytes[at..]);
        for record in &run {
            replay.index.apply(record);
        }
        replay.records += run.len();
        at += len;
        if at == bytes.len() {
            break;
        }
        match resync(bytes, at) {
            Some(next) => {
                replay.damage.push(Damage {
                    start: at,
                    end: next,
                });
                at = next;
            }
            // Nothing whole after it: a torn tail.
            None => break,
        }
    }
    replay.good_len = at;
    replay
}

fn replay_v1(bytes: &[u8], decode: impl Fn(&[u8]) -> Option<Record>) -> Replay {
    let mut index = Index::default();
    let mut records = 0;
    for chunk in bytes.chunks_exact(V1_RECORD_LEN) {
        let Some(record) = decode(chunk) else {
            break;
        };
        index.apply(&record);
        records += 1;
    }
    Replay {
        index,
        records,
        good_len: records * V1_RECORD_LEN,
        damage: Vec::new(),
        v1: true,
    }
}

impl FileStore {
    /// Opens (or creates) the log at `path` and replays it: a torn tail is cut off, damage in
    /// the middle is reported and rewritten away (the damaged file kept beside it), a log of
    /// version 1 is rewritten as version 2.
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
        for damage in &replay.damage {
            tracing::error!(
                path = %path.display(),
                from = damage.start,
                to = damage.end,
                "lease log damaged in the middle: the bytes between hold no whole record; every whole record after them is kept, the records that were there are lost"
            );
        }
        if !replay.damage.is_empty() {
            let copy = path.with_extension(format!("damaged-{}", crate::dhcp::now_unix()));
            std::fs::write(&copy, &bytes).map_err(|e| io("keeping a copy of the damaged", e))?;
            tracing::error!(copy = %copy.display(), "kept the damaged lease log");
        }
        if replay.good_len != bytes.len() {
            tracing::warn!(path = %path.display(), kept = replay.records, dropped_bytes = bytes.len() - replay.good_len, "lease log had a torn tail; cut off");
            file.set_len(replay.good_len as u64)
                .map_err(|e| io("truncating", e))?;
            file.sync_all().map_err(|e| io("syncing", e))?;
        }
        let mut good_len = replay.good_len as u64;
        if replay.good_len == 0 && !replay.v1 {
            file.set_len(0)
                .and_then(|()| file.write_all(MAGIC_V2))
                .and_then(|()| file.sync_all())
                .map_err(|e| io("writing the header of", e))?;
            good_len = MAGIC_V2.len() as u64;
        }
        let rewrite = replay.v1 || !replay.damage.is_empty();
        let store = Self {
            path: path.to_owned(),
            log: Mutex::new(Log {
                file,
                good_len,
                damaged: false,
                index: replay.index,
                records_in_file: replay.records,
                rename_unsynced: false,
            }),
            syncs: AtomicU64::new(0),
            failed_appends: AtomicU64::new(0),
            #[cfg(test)]
            fail_dir_sync: std::sync::atomic::AtomicBool::new(false),
        };
        if rewrite {
            tracing::info!(path = %path.display(), records = replay.records, v1 = replay.v1, "rewriting the lease log");
            let log = store.lock()?;
            drop(store.compact_locked(log)?);
        }
        Ok(store)
    }

    /// How many times the log was synced.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// How many appends failed (nothing of them is durable).
    pub fn failed_appends(&self) -> u64 {
        self.failed_appends.load(Ordering::Relaxed)
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

    fn io(&self, action: &'static str, source: std::io::Error) -> LeaseError {
        LeaseError::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }

    /// Cuts the file back to its whole records and syncs the cut; marks the log damaged
    /// when that fails.
    fn cut_back(&self, log: &mut Log) -> Result<(), LeaseError> {
        let cut = log
            .file
            .set_len(log.good_len)
            .and_then(|()| log.file.sync_data());
        match cut {
            Ok(()) => {
                log.damaged = false;
                Ok(())
            }
            Err(source) => {
                log.damaged = true;
                Err(LeaseError::Damaged {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    fn append_locked(&self, log: &mut Log, records: &[Record]) -> Result<(), LeaseError> {
        if log.rename_unsynced {
            self.sync_dir()?;
            log.rename_unsynced = false;
        }
        if log.damaged {
            self.cut_back(log)?;
        }
        let mut bytes = Vec::with_capacity(records.len() * 40);
        for record in records {
            record.encode_v2(&mut bytes);
        }
        let written = log
            .file
            .write_all(&bytes)
            .map_err(|e| ("appending to", e))
            .and_then(|()| log.file.sync_data().map_err(|e| ("syncing", e)));
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err((action, source)) = written {
            // Whatever part reached the file goes: later records must not follow a partial
            // one, and a record whose sync failed may or may not be on disk.
            if let Err(error) = self.cut_back(log) {
                tracing::error!(%error, "could not cut the lease log back after a failed write");
            }
            return Err(self.io(action, source));
        }
        log.good_len += bytes.len() as u64;
        log.records_in_file += records.len();
        for record in records {
            log.index.apply(record);
        }
        Ok(())
    }

    /// Rewrites the log with only the live records.
    pub fn compact(&self) -> Result<(), LeaseError> {
        let log = self.lock()?;
        self.compact_locked(log).map(drop)
    }

    fn compact_locked<'a>(
        &'a self,
        mut log: MutexGuard<'a, Log>,
    ) -> Result<MutexGuard<'a, Log>, LeaseError> {
        let mut bytes = MAGIC_V2.to_vec();
        let mut records = 0;
        for record in log.index.records() {
            record.encode_v2(&mut bytes);
            records += 1;
        }
        let file = self.write_compacted(&bytes)?;
        if let Err(source) = std::fs::rename(self.compacting_path(), &self.path) {
            let _ = std::fs::remove_file(self.compacting_path());
            return Err(self.io("replacing", source));
        }
        // From here the file at the log's path is the compacted one, so that is where the
        // log writes, whatever fails next: a handle on the file the rename replaced would
        // take records that no restart reads.
        log.file = file;
        log.good_len = bytes.len() as u64;
        log.damaged = false;
        log.records_in_file = records;
        if let Err(error) = self.sync_dir() {
            log.rename_unsynced = true;
            return Err(error);
        }
        Ok(log)
    }

    fn compacting_path(&self) -> PathBuf {
        self.path.with_extension("compacting")
    }

    /// Writes `bytes` to a temporary file beside the log, synced, and returns it open for
    /// appending: the log's next handle once it is renamed over the log (opened before the
    /// rename, so that nothing can fail between the rename and the handle). On failure the
    /// temporary file is removed and the log is as it was.
    fn write_compacted(&self, bytes: &[u8]) -> Result<File, LeaseError> {
        let tmp = self.compacting_path();
        // A copy left by a compaction that died half-way is of no use.
        let _ = std::fs::remove_file(&tmp);
        let written = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut file| {
                file.write_all(bytes)?;
                file.sync_all()?;
                Ok(file)
            })
            .map_err(|e| self.io("writing a compacted copy of", e));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Syncs the log's directory, so that a rename in it is on disk.
    fn sync_dir(&self) -> Result<(), LeaseError> {
        #[cfg(test)]
        if self.fail_dir_sync.load(Ordering::SeqCst) {
            return Err(self.io(
                "syncing the directory of",
                std::io::Error::other("injected failure"),
            ));
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.io("syncing the directory of", e))?;
        }
        Ok(())
    }
}

impl LeaseLog for FileStore {
    fn durable(&self) -> Result<Index, LeaseError> {
        Ok(self.lock()?.index.clone())
    }

    fn append(&self, records: &[Record]) -> Result<(), LeaseError> {
        let mut log = self.lock()?;
        if let Err(error) = self.append_locked(&mut log, records) {
            self.failed_appends.fetch_add(1, Ordering::Relaxed);
            return Err(error);
        }
        let live = log.index.live();
        if log.records_in_file > 10_000 && log.records_in_file > 4 * live.max(1) {
            // The records are durable already: a compaction that fails (a full disk) is
            // only reported; the log stays as it was and grows until one succeeds.
            if let Err(error) = self.compact_locked(log) {
                tracing::warn!(%error, "compacting the lease log failed; it stays as it was");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::encode_v1;
    use super::super::{Binding, ClientKey, Lease};
    use super::*;
    use crate::backend::MacAddr;
    use std::net::Ipv4Addr;

    fn mac(n: u32) -> MacAddr {
        let b = n.to_be_bytes();
        MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
    }

    fn lease(n: u32, ip: u32) -> Lease {
        Lease {
            key: ClientKey::Hardware(mac(n)),
            mac: mac(n),
            ip: Ipv4Addr::from(0x0a00_0000 + ip).into(),
            expires_unix: 4_000_000_000,
        }
    }

    fn key(n: u32) -> ClientKey {
        ClientKey::Hardware(mac(n))
    }

    fn commit(store: &FileStore, lease: Lease) {
        store.append(&[Record::Commit(lease)]).unwrap();
    }

    fn durable(store: &FileStore) -> Index {
        store.durable().unwrap()
    }

    #[test]
    fn commit_release_decline_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        commit(&store, lease(1, 10));
        commit(&store, lease(2, 11));
        // The same client moves to a new address: the old one is free again.
        commit(&store, lease(1, 12));
        assert_eq!(durable(&store).by_ip(lease(1, 10).ip), None);
        store
            .append(&[
                Record::Release {
                    key: key(2),
                    ip: lease(2, 11).ip,
                },
                Record::Decline {
                    ip: Ipv4Addr::new(10, 0, 0, 99).into(),
                    until_unix: 123,
                },
            ])
            .unwrap();
        // A client known by an identifier, from another MAC.
        let by_id = Lease {
            key: ClientKey::Id(Box::from(&b"\x00client-7"[..])),
            mac: mac(7),
            ip: Ipv4Addr::new(10, 0, 0, 77).into(),
            expires_unix: 4_000_000_000,
        };
        commit(&store, by_id.clone());
        drop(store);

        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&key(1)), Some(lease(1, 12)));
        assert_eq!(
            index.by_ip(lease(1, 12).ip),
            Some(Binding::Leased(lease(1, 12)))
        );
        assert_eq!(index.by_client(&key(2)), None);
        assert_eq!(index.by_ip(lease(2, 11).ip), None);
        assert_eq!(
            index.by_ip(Ipv4Addr::new(10, 0, 0, 99)),
            Some(Binding::Declined { until_unix: 123 })
        );
        assert_eq!(index.by_client(&by_id.key), Some(by_id));
    }

    /// DHCPv6 leases (keyed by identity association) share the log with v4 ones, and come
    /// back after a reopen and a compaction.
    #[test]
    fn v6_leases_survive_a_reopen_and_a_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        let v6 = Lease {
            key: ClientKey::Ia {
                duid: Box::from(&[0u8, 1, 0, 1, 1, 2, 3, 4, 0x52, 0x54, 0, 0, 0, 1][..]),
                iaid: 7,
            },
            mac: mac(1),
            ip: "fd00:99::100".parse().unwrap(),
            expires_unix: 4_000_000_000,
        };
        commit(&store, lease(1, 10));
        commit(&store, v6.clone());
        store
            .append(&[Record::Decline {
                ip: "fd00:99::101".parse().unwrap(),
                until_unix: 123,
            }])
            .unwrap();
        drop(store);
        let store = FileStore::open(&path).unwrap();
        let index = durable(&store);
        assert_eq!(index.by_client(&v6.key), Some(v6.clone()));
        assert_eq!(index.by_client(&key(1)), Some(lease(1, 10)));
        store.compact().unwrap();
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&v6.key), Some(v6));
        assert_eq!(
            index.by_ip("fd00:99::101".parse::<std::net::IpAddr>().unwrap()),
            Some(Binding::Declined { until_unix: 123 })
        );
    }

    /// A release written after the client's next lease (records reach the log in the order
    /// they were decided, but a release names its address anyway) ends only the old lease.
    #[test]
    fn a_release_ends_only_the_lease_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        commit(&store, lease(1, 10));
        commit(&store, lease(1, 11));
        store
            .append(&[Record::Release {
                key: key(1),
                ip: lease(1, 10).ip,
            }])
            .unwrap();
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&key(1)), Some(lease(1, 11)));
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        commit(&store, lease(1, 1));
        commit(&store, lease(2, 2));
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
        assert_eq!(durable(&store).by_client(&key(3)), None);
        commit(&store, lease(4, 4));
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&key(4)), Some(lease(4, 4)));
        assert_eq!(index.by_client(&key(1)), Some(lease(1, 1)));
        let copies = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(copies, 1, "a torn tail is not damage: no copy kept");
    }

    /// The log the old code left behind after a full disk: a partial record, then whole
    /// records appended once space came back. Every whole record is kept.
    #[test]
    fn damage_in_the_middle_keeps_every_whole_record_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let mut bytes = MAGIC_V2.to_vec();
        for n in 1..=3 {
            Record::Commit(lease(n, n)).encode_v2(&mut bytes);
        }
        let mut partial = Vec::new();
        Record::Commit(lease(4, 4)).encode_v2(&mut partial);
        bytes.extend_from_slice(&partial[..partial.len() - 5]);
        for n in 5..=300 {
            Record::Commit(lease(n, n)).encode_v2(&mut bytes);
        }
        std::fs::write(&path, &bytes).unwrap();

        let store = FileStore::open(&path).unwrap();
        let index = durable(&store);
        for n in (1..=3).chain(5..=300) {
            assert_eq!(index.by_client(&key(n)), Some(lease(n, n)), "lease {n}");
        }
        assert_eq!(index.by_client(&key(4)), None);
        // Rewritten without the damage, and the damaged file kept beside it.
        drop(store);
        let rewritten = std::fs::read(&path).unwrap();
        let replayed = replay(&rewritten);
        assert!(replayed.damage.is_empty());
        assert_eq!(replayed.good_len, rewritten.len());
        assert_eq!(replayed.records, 299);
        let kept: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("damaged-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(std::fs::read(dir.path().join(&kept[0])).unwrap(), bytes);
    }

    /// A record hidden inside a client identifier of a damaged record is not taken for a
    /// record: the resync point is the one whose records run to the end.
    #[test]
    fn records_inside_a_damaged_record_are_not_replayed() {
        let mut forged = Vec::new();
        Record::Commit(lease(66, 9)).encode_v2(&mut forged);
        let mut hiding = Vec::new();
        Record::Commit(Lease {
            key: ClientKey::Id(forged.clone().into_boxed_slice()),
            ..lease(7, 7)
        })
        .encode_v2(&mut hiding);
        let mut bytes = MAGIC_V2.to_vec();
        Record::Commit(lease(1, 1)).encode_v2(&mut bytes);
        // Damage the hiding record's kind (outside the identifier): its CRC fails.
        let at = bytes.len();
        bytes.extend_from_slice(&hiding);
        bytes[at + 2] ^= 0xff;
        assert!(
            Record::decode_v2(&bytes[at + 5..]).is_some(),
            "the forged record is whole"
        );
        Record::Commit(lease(2, 2)).encode_v2(&mut bytes);
        let replayed = replay(&bytes);
        assert_eq!(replayed.index.by_client(&key(66)), None, "forged record");
        assert_eq!(replayed.index.by_client(&key(2)), Some(lease(2, 2)));
        assert_eq!(replayed.damage.len(), 1);
    }

    /// A damaged header does not make the log look empty.
    #[test]
    fn a_damaged_header_keeps_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let mut bytes = MAGIC_V2.to_vec();
        for n in 1..=50 {
            Record::Commit(lease(n, n)).encode_v2(&mut bytes);
        }
        bytes[0] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let index = durable(&FileStore::open(&path).unwrap());
        for n in 1..=50 {
            assert_eq!(index.by_client(&key(n)), Some(lease(n, n)), "lease {n}");
        }
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC_V2));
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
        let check = |index: &Index| {
            assert_eq!(
                index.by_client(&key(1)),
                Some(Lease {
                    ip: ip(1).into(),
                    ..lease(1, 0)
                })
            );
            assert_eq!(index.by_client(&key(2)), None);
            assert_eq!(
                index.by_ip(ip(3)),
                Some(Binding::Declined { until_unix: 55 })
            );
            assert_eq!(index.by_client(&key(4)), None);
        };
        check(&durable(&store));
        drop(store);
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC_V2));
        check(&durable(&FileStore::open(&path).unwrap()));
    }

    #[test]
    fn compaction_keeps_the_state_and_shrinks_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        for round in 0..5 {
            for n in 0..100 {
                commit(&store, lease(n, n + round * 1000));
            }
        }
        let before = store.file_len().unwrap();
        store.compact().unwrap();
        let after = store.file_len().unwrap();
        assert_eq!(
            after - MAGIC_V2.len() as u64,
            (before - MAGIC_V2.len() as u64) / 5
        );
        commit(&store, lease(500, 5));
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&key(7)), Some(lease(7, 4007)));
        assert_eq!(index.by_client(&key(500)), Some(lease(500, 5)));
        assert_eq!(index.live(), 101);
    }

    /// Appends from several threads: each gets its own result and all survive.
    #[test]
    fn concurrent_appends_all_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = std::sync::Arc::new(FileStore::open(&path).unwrap());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..200u32 {
                        let n = t * 10_000 + i;
                        commit(&store, lease(n, n));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        for t in 0..4u32 {
            for i in 0..200u32 {
                let n = t * 10_000 + i;
                assert_eq!(index.by_client(&key(n)), Some(lease(n, n)));
            }
        }
    }

    /// A write that fails (the device is full) leaves the log as it was, and the records
    /// appended once it works again are replayed. `/dev/full` fails every write with ENOSPC
    /// the way a full disk does.
    #[test]
    fn a_failed_write_leaves_the_log_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        commit(&store, lease(1, 1));
        let intact = store.file_len().unwrap();
        // Swap the log's file for the full device, as a disk that filled up.
        let good = {
            let mut log = store.lock().unwrap();
            let full = OpenOptions::new().append(true).open("/dev/full").unwrap();
            std::mem::replace(&mut log.file, full)
        };
        let failed = store.append(&[Record::Commit(lease(2, 2))]);
        assert!(matches!(failed, Err(LeaseError::Io { .. })), "{failed:?}");
        assert_eq!(store.failed_appends(), 1);
        assert_eq!(durable(&store).by_client(&key(2)), None, "not in the index");
        store.lock().unwrap().file = good;
        assert_eq!(store.file_len().unwrap(), intact);
        commit(&store, lease(3, 3));
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        assert_eq!(index.by_client(&key(1)), Some(lease(1, 1)));
        assert_eq!(index.by_client(&key(2)), None);
        assert_eq!(index.by_client(&key(3)), Some(lease(3, 3)));
    }

    /// A compaction whose rename may not be on disk (the directory's sync failed: EIO,
    /// EMFILE) leaves the log on the compacted file and acknowledges no append until the
    /// directory is synced; every append acknowledged before or after is back after a
    /// restart. (Before: the log went on appending to the file the rename had replaced, and
    /// acknowledged records that no restart read.)
    #[test]
    fn after_a_compaction_that_failed_late_every_acknowledged_lease_survives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = FileStore::open(&path).unwrap();
        for round in 0..3 {
            for n in 0..20 {
                commit(&store, lease(n, n + round * 100));
            }
        }
        store.fail_dir_sync.store(true, Ordering::SeqCst);
        assert!(matches!(store.compact(), Err(LeaseError::Io { .. })));
        let refused = store.append(&[Record::Commit(lease(30, 30))]);
        assert!(
            matches!(refused, Err(LeaseError::Io { .. })),
            "acknowledged while the log's name may not be on disk: {refused:?}"
        );
        store.fail_dir_sync.store(false, Ordering::SeqCst);
        commit(&store, lease(31, 31));
        commit(&store, lease(32, 32));
        drop(store);
        let index = durable(&FileStore::open(&path).unwrap());
        for n in 0..20 {
            assert_eq!(index.by_client(&key(n)), Some(lease(n, n + 200)));
        }
        assert_eq!(index.by_client(&key(30)), None, "refused, so never leased");
        assert_eq!(index.by_client(&key(31)), Some(lease(31, 31)));
        assert_eq!(index.by_client(&key(32)), Some(lease(32, 32)));
        assert!(!path.with_extension("compacting").exists());
    }
}
