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
//! IPv6 leases (DHCPv6, issue 42) are records of the same version: `kind` has bit `0x10`
//! set (`0x11` commit, `0x12` release, `0x13` decline) and `ip` is 16 bytes; their key is
//! `key_type` 3, an identity association (`iaid u32 | duid`). A v4-only log is byte for
//! byte what it was; a binary from before v6 reads a v6 record as damaged and stops there.
//!
//! **Version 1** (no header; fixed 24-byte records `kind u8 | mac [6] | pad u8 | ip u32 |
//! expires u64 | crc32 u32`, keyed by MAC, a decline with an all-zero MAC) is still read: a
//! log of version 1 is replayed and then rewritten as version 2 atomically (a temporary
//! file renamed over it), so an upgrade loses no lease even if it is interrupted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
        ip: IpAddr,
    },
    /// An address declined (in use by someone unknown) until then.
    Decline {
        /// The address.
        ip: IpAddr,
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
const KEY_IA: u8 = 3;
/// Set in `kind` for a record of an IPv6 address.
const KIND_V6: u8 = 0x10;

impl Record {
    /// Appends the version 2 encoding to `out`.
    pub fn encode_v2(&self, out: &mut Vec<u8>) {
        let unspecified = MacAddr([0; 6]);
        let (kind, key, mac, ip, expires) = match self {
            Self::Commit(l) => (COMMIT, Some(&l.key), l.mac, l.ip, l.expires_unix),
            Self::Release { key, ip } => (RELEASE, Some(key), unspecified, *ip, 0),
            Self::Decline { ip, until_unix } => (DECLINE, None, unspecified, *ip, *until_unix),
        };
        let (key_type, key_len): (u8, usize) = match key {
            Some(ClientKey::Hardware(m)) => (KEY_HARDWARE, m.0.len()),
            Some(ClientKey::Id(id)) => (KEY_ID, id.len()),
            Some(ClientKey::Ia { duid, .. }) => (KEY_IA, 4 + duid.len()),
            None => (KEY_NONE, 0),
        };
        // Identifiers come from option 61, at most 255 bytes, and DUIDs are at most 130
        // (RFC 8415 §11.1, and refused longer on receipt): the length fits a byte.
        let key_len = key_len.min(255);
        let (kind, ip_len) = match ip {
            IpAddr::V4(_) => (kind, 4),
            IpAddr::V6(_) => (kind | KIND_V6, 16),
        };
        let start = out.len();
        let len = 3 + key_len + 6 + ip_len + 8 + 4;
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&[kind, key_type, key_len as u8]);
        let key_start = out.len();
        match key {
            Some(ClientKey::Hardware(m)) => out.extend_from_slice(&m.0),
            Some(ClientKey::Id(id)) => out.extend_from_slice(id),
            Some(ClientKey::Ia { duid, iaid }) => {
                out.extend_from_slice(&iaid.to_be_bytes());
                out.extend_from_slice(duid);
            }
            None => {}
        }
        out.truncate(key_start + key_len);
        out.extend_from_slice(&mac.0);
        match ip {
            IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
        }
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
        let (kind, ip) = if kind & KIND_V6 == 0 {
            let octets: [u8; 4] = r.take(4)?.try_into().ok()?;
            (kind, IpAddr::V4(Ipv4Addr::from(octets)))
        } else {
            let octets: [u8; 16] = r.take(16)?.try_into().ok()?;
            (kind & !KIND_V6, IpAddr::V6(Ipv6Addr::from(octets)))
        };
        let expires = u64::from_be_bytes(r.take(8)?.try_into().ok()?);
        if !r.0.is_empty() {
            return None;
        }
        let key = match (key_type, key_len) {
            (KEY_HARDWARE, 6) => Some(ClientKey::Hardware(MacAddr::from_slice(key)?)),
            (KEY_ID, 1..) => Some(ClientKey::Id(Box::from(key))),
            (KEY_NONE, 0) => None,
            (KEY_IA, 5..) => {
                let (iaid, duid) = key.split_at(4);
                Some(ClientKey::Ia {
                    duid: Box::from(duid),
                    iaid: u32::from_be_bytes(iaid.try_into().ok()?),
                })
            }
            _ => return None,
        };
        // An identity association is a DHCPv6 client's, and holds IPv6 addresses only.
        if matches!(key, Some(ClientKey::Ia { .. })) != ip.is_ipv6() && key.is_some() {
            return None;
        }
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
        let ip = IpAddr::V4(Ipv4Addr::from(u32::from_be_bytes([
            b[8], b[9], b[10], b[11],
        ])));
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
                ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
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
                ip: Ipv4Addr::new(10, 0, 0, 9).into(),
                expires_unix: 4_000_000_000,
            }),
            Record::Commit(Lease {
                key: ClientKey::Id(vec![0xff; 255].into_boxed_slice()),
                mac,
                ip: Ipv4Addr::new(10, 0, 0, 10).into(),
                expires_unix: 1,
            }),
            Record::Release {
                key: ClientKey::Id(Box::from(&b"x"[..])),
                ip: Ipv4Addr::new(10, 0, 0, 12).into(),
            },
            Record::Decline {
                ip: Ipv4Addr::new(10, 0, 0, 11).into(),
                until_unix: 7,
            },
            Record::Commit(Lease {
                key: ClientKey::Ia {
                    duid: vec![0, 1, 0, 1, 0x2a, 0x2b, 0x2c, 0x2d, 0x52, 0x54, 0, 0, 0, 9]
                        .into_boxed_slice(),
                    iaid: 0x0102_0304,
                },
                mac,
                ip: "fd00:99::10".parse().unwrap(),
                expires_unix: 4_000_000_000,
            }),
            Record::Release {
                key: ClientKey::Ia {
                    duid: vec![0xee; 130].into_boxed_slice(),
                    iaid: 0,
                },
                ip: "fd00:99::11".parse().unwrap(),
            },
            Record::Decline {
                ip: "fd00:99::12".parse().unwrap(),
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

    /// A v4 record's bytes are what they were before v6 (an older binary reads them), and
    /// an identity association never holds a v4 address.
    #[test]
    fn v4_records_are_unchanged_and_families_do_not_mix() {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 9]);
        let mut bytes = Vec::new();
        Record::Commit(Lease {
            key: ClientKey::Hardware(mac),
            mac,
            ip: Ipv4Addr::new(10, 0, 0, 9).into(),
            expires_unix: 5,
        })
        .encode_v2(&mut bytes);
        let mut expected = vec![0, 31, COMMIT, KEY_HARDWARE, 6];
        expected.extend_from_slice(&mac.0);
        expected.extend_from_slice(&mac.0);
        expected.extend_from_slice(&[10, 0, 0, 9]);
        expected.extend_from_slice(&5u64.to_be_bytes());
        let crc = crc32(&expected);
        expected.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(bytes, expected);

        let mut mixed = Vec::new();
        Record::Commit(Lease {
            key: ClientKey::Ia {
                duid: Box::from(&[0u8, 3, 0, 1, 1, 2, 3, 4, 5, 6][..]),
                iaid: 1,
            },
            mac,
            ip: Ipv4Addr::new(10, 0, 0, 9).into(),
            expires_unix: 5,
        })
        .encode_v2(&mut mixed);
        assert_eq!(Record::decode_v2(&mixed), None);
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
                ip: ip.into(),
                expires_unix: 5
            }))
        );
        assert_eq!(
            Record::decode_v1(&encode_v1(3, [0; 6], ip, 5)),
            Some(Record::Decline {
                ip: ip.into(),
                until_unix: 5
            })
        );
        let mut torn = encode_v1(2, mac, ip, 0);
        torn[3] ^= 0x10;
        assert_eq!(Record::decode_v1(&torn), None);
    }
}
