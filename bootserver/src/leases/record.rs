//! The lease log's format.
//!
//! **Version 2** (written since client identifiers became lease keys): the file starts with
//! the 8 bytes `UBLEASE2`, then variable-length records, big-endian:
//!
//! ```text
//! len u16 | kind u8 | key_type u8 | key_len u8 | key [key_len] | mac [6] | ip u32 | expires u64 | crc32 u32
//! ```
//!
//! `len` counts the bytes after itself; the CRC-32 covers `len` through `expires`. `kind` is
//! 1 commit, 2 release (with the address given back; `0.0.0.0` before that was written), 3
//! decline; `key_type` 0 is a hardware address (six bytes), 1 a
//! client identifier (1–255 bytes), 2 no key (a decline). A damaged record fails its length
//! or CRC check; how the log is replayed around one is in [`super::FileStore::open`].
//!
//! **Version 1** (no header; fixed 24-byte records `kind u8 | mac [6] | pad u8 | ip u32 |
//! expires u64 | crc32 u32`, keyed by MAC, a decline with an all-zero MAC) is still read: a
//! log of version 1 is replayed and then rewritten as version 2 atomically (a temporary
//! file renamed over it), so an upgrade loses no lease even if it is interrupted.

use std::net::Ipv4Addr;

use super::{ClientKey, Lease};
use crate::backend::MacAddr;

/// The first bytes of a version 2 log.
pub const MAGIC_V2: &[u8; 8] = b"UBLEASE2";
/// The length of a version 1 record.
pub const V1_RECORD_LEN: usize = 24;

/// One change to the lease index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A lease made or renewed.
    Commit(Lease),
    /// A client gave its lease on `ip` back (`0.0.0.0` in logs written before releases
    /// named the address: whatever lease the client had).
    Release {
        /// The client.
        key: ClientKey,
        /// The address given back.
        ip: Ipv4Addr,
    },
    /// An address declined (in use by someone unknown) until then.
    Decline {
        /// The address.
        ip: Ipv4Addr,
        /// Seconds since the Unix epoch.
        until_unix: u64,
    },
}

const COMMIT: u8 = 1;
const RELEASE: u8 = 2;
const DECLINE: u8 = 3;
const KEY_HARDWARE: u8 = 0;
const KEY_ID: u8 = 1;
const KEY_NONE: u8 = 2;

impl Record {
    /// Appends the version 2 encoding to `out`.
    pub fn encode_v2(&self, out: &mut Vec<u8>) {
        let unspecified = MacAddr([0; 6]);
        let (kind, key, mac, ip, expires) = match self {
            Self::Commit(l) => (COMMIT, Some(&l.key), l.mac, l.ip, l.expires_unix),
            Self::Release { key, ip } => (RELEASE, Some(key), unspecified, *ip, 0),
            Self::Decline { ip, until_unix } => (DECLINE, None, unspecified, *ip, *until_unix),
        };
        let (key_type, key_bytes): (u8, &[u8]) = match key {
            Some(ClientKey::Hardware(m)) => (KEY_HARDWARE, &m.0),
            Some(ClientKey::Id(id)) => (KEY_ID, id),
            None => (KEY_NONE, &[]),
        };
        // Identifiers come from option 61, at most 255 bytes: the length fits a byte.
        let key_bytes = &key_bytes[..key_bytes.len().min(255)];
        let start = out.len();
        let len = 3 + key_bytes.len() + 6 + 4 + 8 + 4;
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&[kind, key_type, key_bytes.len() as u8]);
        out.extend_from_slice(key_bytes);
        out.extend_from_slice(&mac.0);
        out.extend_from_slice(&u32::from(ip).to_be_bytes());
        out.extend_from_slice(&expires.to_be_bytes());
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }

    /// Decodes one version 2 record from the start of `bytes`: the record and its length,
    /// or `None` when the bytes do not hold a whole, intact record.
    pub fn decode_v2(bytes: &[u8]) -> Option<(Self, usize)> {
        let len = usize::from(u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]));
        let whole = bytes.get(..2 + len)?;
        let (body, crc) = whole.split_at(whole.len().checked_sub(4)?);
        if crc32(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = Reader(body.get(2..)?);
        let (kind, key_type, key_len) = (r.u8()?, r.u8()?, usize::from(r.u8()?));
        let key = r.take(key_len)?;
        let mac = MacAddr::from_slice(r.take(6)?)?;
        let ip = Ipv4Addr::from(u32::from_be_bytes(r.take(4)?.try_into().ok()?));
        let expires = u64::from_be_bytes(r.take(8)?.try_into().ok()?);
        if !r.0.is_empty() {
            return None;
        }
        let key = match (key_type, key_len) {
            (KEY_HARDWARE, 6) => Some(ClientKey::Hardware(MacAddr::from_slice(key)?)),
            (KEY_ID, 1..) => Some(ClientKey::Id(Box::from(key))),
            (KEY_NONE, 0) => None,
            _ => return None,
        };
        let record = match (kind, key) {
            (COMMIT, Some(key)) => Self::Commit(Lease {
                key,
                mac,
                ip,
                expires_unix: expires,
            }),
            (RELEASE, Some(key)) => Self::Release { key, ip },
            (DECLINE, None) => Self::Decline {
                ip,
                until_unix: expires,
            },
            _ => return None,
        };
        Some((record, 2 + len))
    }

    /// Decodes a version 1 record (keyed by MAC).
    pub fn decode_v1(b: &[u8; V1_RECORD_LEN]) -> Option<Self> {
        let crc = u32::from_be_bytes([b[20], b[21], b[22], b[23]]);
        if crc32(&b[..20]) != crc {
            return None;
        }
        let mac = MacAddr::from_slice(&b[1..7])?;
        let ip = Ipv4Addr::from(u32::from_be_bytes([b[8], b[9], b[10], b[11]]));
        let expires = u64::from_be_bytes(b[12..20].try_into().ok()?);
        match b[0] {
            COMMIT => Some(Self::Commit(Lease {
                key: ClientKey::Hardware(mac),
                mac,
                ip,
                expires_unix: expires,
            })),
            RELEASE => Some(Self::Release {
                key: ClientKey::Hardware(mac),
                ip: Ipv4Addr::UNSPECIFIED,
            }),
            DECLINE => Some(Self::Decline {
                ip,
                until_unix: expires,
            }),
            _ => None,
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
}

/// CRC-32 (IEEE), bitwise: records are tiny and the sync dominates.
pub fn crc32(data: &[u8]) -> u32 {
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

/// Encodes a version 1 record, for tests of the upgrade path.
#[cfg(test)]
pub fn encode_v1(kind: u8, mac: [u8; 6], ip: Ipv4Addr, expires: u64) -> [u8; V1_RECORD_LEN] {
    let mut b = [0u8; V1_RECORD_LEN];
    b[0] = kind;
    b[1..7].copy_from_slice(&mac);
    b[8..12].copy_from_slice(&u32::from(ip).to_be_bytes());
    b[12..20].copy_from_slice(&expires.to_be_bytes());
    let crc = crc32(&b[..20]);
    b[20..24].copy_from_slice(&crc.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn v2_records_round_trip_and_torn_ones_are_refused() {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 9]);
        let records = [
            Record::Commit(Lease {
                key: ClientKey::Hardware(mac),
                mac,
                ip: Ipv4Addr::new(10, 0, 0, 9),
                expires_unix: 4_000_000_000,
            }),
            Record::Commit(Lease {
                key: ClientKey::Id(vec![0xff; 255].into_boxed_slice()),
                mac,
                ip: Ipv4Addr::new(10, 0, 0, 10),
                expires_unix: 1,
            }),
            Record::Release {
                key: ClientKey::Id(Box::from(&b"x"[..])),
                ip: Ipv4Addr::new(10, 0, 0, 12),
            },
            Record::Decline {
                ip: Ipv4Addr::new(10, 0, 0, 11),
                until_unix: 7,
            },
        ];
        for record in records {
            let mut bytes = Vec::new();
            record.encode_v2(&mut bytes);
            assert_eq!(
                Record::decode_v2(&bytes),
                Some((record.clone(), bytes.len()))
            );
            for cut in 0..bytes.len() {
                assert_eq!(
                    Record::decode_v2(&bytes[..cut]),
                    None,
                    "{record:?} cut {cut}"
                );
            }
            let mut flipped = bytes.clone();
            flipped[5] ^= 1;
            assert_eq!(Record::decode_v2(&flipped), None);
        }
    }

    #[test]
    fn v1_records_are_keyed_by_mac() {
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        let mac = [2, 0, 0, 0, 0, 1];
        assert_eq!(
            Record::decode_v1(&encode_v1(1, mac, ip, 5)),
            Some(Record::Commit(Lease {
                key: ClientKey::Hardware(MacAddr(mac)),
                mac: MacAddr(mac),
                ip,
                expires_unix: 5
            }))
        );
        assert_eq!(
            Record::decode_v1(&encode_v1(3, [0; 6], ip, 5)),
            Some(Record::Decline { ip, until_unix: 5 })
        );
        let mut torn = encode_v1(2, mac, ip, 0);
        torn[3] ^= 0x10;
        assert_eq!(Record::decode_v1(&torn), None);
    }
}
