//! The pair's link on the wire: a handshake that proves both ends hold the pair's key, then
//! frames that each carry an HMAC under a key of this connection. Pure: bytes in, bytes or
//! a typed refusal out; the shells in [`super::link`] do the I/O.
//!
//! Lease records are no secret (their MACs and addresses cross the provisioning network in
//! clear anyway), so nothing is encrypted. What matters is that nobody else on that
//! network can write records into a server's book, acknowledge records for its partner, or
//! keep a dead partner looking alive with forged heartbeats. Hence:
//!
//! ```text
//! listener → dialer   "UBHA1" | challenge_l [32]
//! dialer → listener   "UBHA1" | challenge_d [32] | name_len u8 | name | proof_d [32]
//! listener → dialer   proof_l [32]
//! proof_d   = HMAC(pair key, "dialer"   | challenge_l | challenge_d | dialer's name)
//! proof_l   = HMAC(pair key, "listener" | challenge_l | challenge_d | listener's name)
//! session   = HMAC(pair key, "session"  | challenge_l | challenge_d)
//! frame     = len u32 | kind u8 | seq u64 | body | tag [32]
//! tag       = HMAC(session, direction u8 | kind | seq | body)
//! ```
//!
//! Fresh challenges from both ends make every connection's session key new, so a recorded
//! connection cannot be replayed; `seq` rises by one per frame and direction, so a frame
//! cannot be replayed, dropped or reordered within one; the direction byte keeps a frame
//! from being reflected back to its sender. `len` counts the bytes after itself.

use std::net::IpAddr;

use ring::hmac;

use crate::leases::Record;

/// The handshake's magic and version.
pub const MAGIC: &[u8; 5] = b"UBHA1";
/// The length of a challenge, a proof and a frame's tag.
pub const TAG_LEN: usize = 32;
/// The largest frame accepted: a catch-up of every lease of a large network fits (a v4
/// record is about 40 bytes; 16 MiB is some 400,000 of them).
pub const MAX_FRAME: usize = 16 << 20;
/// The fixed bytes of a frame after `len`: kind, seq and tag.
const FRAME_OVERHEAD: usize = 1 + 8 + TAG_LEN;

/// Which way a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the server that dialed (whose records the connection carries).
    FromDialer = 1,
    /// From the server that listened (acknowledgements).
    FromListener = 2,
}

/// One message of the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Records the sender made durable, in the order it wrote them; `catch_up`: every
    /// record its log holds (sent first on each connection).
    Records {
        /// Echoed in the acknowledgement.
        batch: u64,
        /// The sender's whole log rather than its latest writes.
        catch_up: bool,
        /// The records.
        records: Vec<Record>,
    },
    /// What the receiver's book took of a batch, one flag per record; `None`: it could not
    /// write them (its disk), so they are not its.
    Ack {
        /// The batch acknowledged.
        batch: u64,
        /// Per record, whether the book took it.
        taken: Option<Vec<bool>>,
    },
    /// I am here; `state` is my view of the pair (for the partner's status).
    Heartbeat {
        /// [`super::pair::PairState`]'s code ([`super::pair::state_code`]).
        state: u8,
    },
}

/// Records per frame of a catch-up: the longest record (a DHCPv6 lease with a 255-byte
/// key, 294 bytes) times this stays below [`MAX_FRAME`].
pub const CATCH_UP_RECORDS_PER_FRAME: usize = 50_000;

/// A log's records as the frames of a catch-up, in order, each below [`MAX_FRAME`]: only
/// the last says `catch_up` (the receiver counts itself synced once that one is taken), and
/// an empty log is one empty frame.
pub fn catch_up(records: Vec<Record>) -> Vec<Message> {
    let mut chunks: Vec<Vec<Record>> = records
        .chunks(CATCH_UP_RECORDS_PER_FRAME)
        .map(<[Record]>::to_vec)
        .collect();
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, records)| Message::Records {
            batch: 0,
            catch_up: i == last,
            records,
        })
        .collect()
}

const RECORDS: u8 = 1;
const ACK: u8 = 2;
const HEARTBEAT: u8 = 3;

/// Why bytes from the link were refused. The connection is closed on any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not this protocol, or another version of it.
    #[error("not the pair's protocol (magic or version)")]
    Magic,
    /// The peer named itself as someone other than the partner.
    #[error("the peer says it is {0:?}, not this server's partner")]
    NotThePartner(String),
    /// A proof or a frame's tag does not verify: another key, or tampering.
    #[error("a proof or tag did not verify (another pair key, or the bytes were changed)")]
    BadTag,
    /// A frame out of sequence: replayed, dropped or reordered.
    #[error("frame {got} where {expected} was due")]
    Sequence {
        /// The sequence number due.
        expected: u64,
        /// The one that came.
        got: u64,
    },
    /// Longer than [`MAX_FRAME`], or shorter than a frame can be.
    #[error("a frame of {0} bytes")]
    Length(usize),
    /// A body that does not decode.
    #[error("a malformed {0} frame")]
    Malformed(&'static str),
}

/// The pair's shared key, as HMAC keys for proofs and for sessions.
#[derive(Clone)]
pub struct PairKey(hmac::Key);

impl std::fmt::Debug for PairKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairKey(..)")
    }
}

impl PairKey {
    /// The key from the key file's bytes (at least 16 after trimming white space; checked
    /// when the settings are read).
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret.trim_ascii()))
    }

    fn proof(&self, role: &[u8], challenge_l: &[u8], challenge_d: &[u8], name: &str) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.0);
        for part in [role, challenge_l, challenge_d, name.as_bytes()] {
            context.update(part);
        }
        context.sign()
    }

    /// The listener's first message.
    pub fn listener_hello(challenge_l: &[u8; TAG_LEN]) -> Vec<u8> {
        [MAGIC.as_slice(), challenge_l].concat()
    }

    /// The dialer's answer to the listener's hello: its challenge, its name and its proof.
    pub fn dialer_hello(
        &self,
        listener_hello: &[u8],
        challenge_d: &[u8; TAG_LEN],
        dialer: &str,
    ) -> Result<Vec<u8>, Refused> {
        let challenge_l = read_hello(listener_hello)?;
        let proof = self.proof(b"dialer", challenge_l, challenge_d, dialer);
        let name = dialer.as_bytes();
        let len = u8::try_from(name.len()).map_err(|_| Refused::Malformed("hello"))?;
        Ok([MAGIC.as_slice(), challenge_d, &[len], name, proof.as_ref()].concat())
    }

    /// The listener checks the dialer's hello (that it is `partner` and holds the key) and
    /// answers with its own proof and the session.
    pub fn accept(
        &self,
        challenge_l: &[u8; TAG_LEN],
        dialer_hello: &[u8],
        partner: &str,
        listener: &str,
    ) -> Result<(Vec<u8>, Session), Refused> {
        let challenge_d = read_hello(dialer_hello)?;
        let rest = dialer_hello
            .get(MAGIC.len() + TAG_LEN..)
            .ok_or(Refused::Malformed("hello"))?;
        let (&len, rest) = rest.split_first().ok_or(Refused::Malformed("hello"))?;
        let (name, proof) = rest
            .split_at_checked(usize::from(len))
            .ok_or(Refused::Malformed("hello"))?;
        if proof.len() != TAG_LEN {
            return Err(Refused::Malformed("hello"));
        }
        let name = String::from_utf8_lossy(name);
        if name != partner {
            return Err(Refused::NotThePartner(name.into_owned()));
        }
        let expected = self.proof(b"dialer", challenge_l, challenge_d, partner);
        if !constant_time_eq(expected.as_ref(), proof) {
            return Err(Refused::BadTag);
        }
        let answer = self.proof(b"listener", challenge_l, challenge_d, listener);
        Ok((
            answer.as_ref().to_vec(),
            self.session(challenge_l, challenge_d, Direction::FromListener),
        ))
    }

    /// The dialer checks the listener's proof (that it is `partner`) and gets the session.
    pub fn confirm(
        &self,
        listener_hello: &[u8],
        challenge_d: &[u8; TAG_LEN],
        proof: &[u8],
        partner: &str,
    ) -> Result<Session, Refused> {
        let challenge_l = read_hello(listener_hello)?;
        let expected = self.proof(b"listener", challenge_l, challenge_d, partner);
        if !constant_time_eq(expected.as_ref(), proof) {
            return Err(Refused::BadTag);
        }
        Ok(self.session(challenge_l, challenge_d, Direction::FromDialer))
    }

    fn session(&self, challenge_l: &[u8], challenge_d: &[u8], sends: Direction) -> Session {
        let mut context = hmac::Context::with_key(&self.0);
        for part in [b"session".as_slice(), challenge_l, challenge_d] {
            context.update(part);
        }
        Session {
            key: hmac::Key::new(hmac::HMAC_SHA256, context.sign().as_ref()),
            sends,
            sent: 0,
            received: 0,
        }
    }
}

fn read_hello(hello: &[u8]) -> Result<&[u8], Refused> {
    if hello.get(..MAGIC.len()) != Some(MAGIC.as_slice()) {
        return Err(Refused::Magic);
    }
    hello
        .get(MAGIC.len()..MAGIC.len() + TAG_LEN)
        .ok_or(Refused::Malformed("hello"))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The length of the dialer's hello whose first bytes (magic, challenge, name length) are
/// `head`: how many bytes to read in all.
pub fn dialer_hello_len(head: &[u8; MAGIC.len() + TAG_LEN + 1]) -> usize {
    head.len() + usize::from(head[MAGIC.len() + TAG_LEN]) + TAG_LEN
}

/// One connection's keys and sequence numbers. A connection's reader and writer each keep
/// a copy: one only opens, the other only seals.
#[derive(Clone)]
pub struct Session {
    key: hmac::Key,
    sends: Direction,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("sends", &self.sends)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Session {
    fn tag(&self, direction: Direction, kind: u8, seq: u64, body: &[u8]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(&[direction as u8, kind]);
        context.update(&seq.to_be_bytes());
        context.update(body);
        context.sign()
    }

    /// `message` as a frame, appended to `out`.
    pub fn seal(&mut self, message: &Message, out: &mut Vec<u8>) {
        let (kind, body) = encode(message);
        let seq = self.sent;
        self.sent += 1;
        let tag = self.tag(self.sends, kind, seq, &body);
        let len = FRAME_OVERHEAD + body.len();
        out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(tag.as_ref());
    }

    /// The length of the frame whose first four bytes are `len`, checked.
    pub fn frame_len(len: [u8; 4]) -> Result<usize, Refused> {
        let len = u32::from_be_bytes(len) as usize;
        if !(FRAME_OVERHEAD..=MAX_FRAME).contains(&len) {
            return Err(Refused::Length(len));
        }
        Ok(len)
    }

    /// Checks and decodes a frame (the bytes after `len`) that came from the other end.
    pub fn open(&mut self, frame: &[u8]) -> Result<Message, Refused> {
        let (head, tag) = frame
            .split_at_checked(frame.len().saturating_sub(TAG_LEN))
            .filter(|(head, _)| head.len() >= 9)
            .ok_or(Refused::Length(frame.len()))?;
        let (kind, rest) = head.split_at(1);
        let (seq, body) = rest.split_at(8);
        let seq = u64::from_be_bytes(seq.try_into().map_err(|_| Refused::Length(frame.len()))?);
        let from = match self.sends {
            Direction::FromDialer => Direction::FromListener,
            Direction::FromListener => Direction::FromDialer,
        };
        let expected = self.tag(from, kind[0], seq, body);
        if !constant_time_eq(expected.as_ref(), tag) {
            return Err(Refused::BadTag);
        }
        if seq != self.received {
            return Err(Refused::Sequence {
                expected: self.received,
                got: seq,
            });
        }
        self.received += 1;
        decode(kind[0], body)
    }
}

fn encode(message: &Message) -> (u8, Vec<u8>) {
    let mut body = Vec::new();
    match message {
        Message::Records {
            batch,
            catch_up,
            records,
        } => {
            body.extend_from_slice(&batch.to_be_bytes());
            body.push(u8::from(*catch_up));
            for record in records {
                record.encode_v2(&mut body);
            }
            (RECORDS, body)
        }
        Message::Ack { batch, taken } => {
            body.extend_from_slice(&batch.to_be_bytes());
            match taken {
                Some(taken) => {
                    body.push(1);
                    body.extend(taken.iter().map(|t| u8::from(*t)));
                }
                None => body.push(0),
            }
            (ACK, body)
        }
        Message::Heartbeat { state } => {
            body.push(*state);
            (HEARTBEAT, body)
        }
    }
}

fn decode(kind: u8, body: &[u8]) -> Result<Message, Refused> {
    let batch = |name| {
        body.get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or(Refused::Malformed(name))
    };
    match kind {
        RECORDS => {
            let batch = batch("records")?;
            let catch_up = match body.get(8) {
                Some(0) => false,
                Some(1) => true,
                _ => return Err(Refused::Malformed("records")),
            };
            let mut rest = body.get(9..).unwrap_or_default();
            let mut records = Vec::new();
            while !rest.is_empty() {
                let (record, len) = Record::decode_v2(rest).ok_or(Refused::Malformed("records"))?;
                if !plausible(&record) {
                    return Err(Refused::Malformed("records"));
                }
                records.push(record);
                rest = rest.get(len..).unwrap_or_default();
            }
            Ok(Message::Records {
                batch,
                catch_up,
                records,
            })
        }
        ACK => {
            let batch = batch("ack")?;
            let taken = match body.get(8) {
                Some(0) if body.len() == 9 => None,
                Some(1) => Some(
                    body.get(9..)
                        .unwrap_or_default()
                        .iter()
                        .map(|b| match b {
                            0 => Ok(false),
                            1 => Ok(true),
                            _ => Err(Refused::Malformed("ack")),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => return Err(Refused::Malformed("ack")),
            };
            Ok(Message::Ack { batch, taken })
        }
        HEARTBEAT => match body {
            [state] => Ok(Message::Heartbeat { state: *state }),
            _ => Err(Refused::Malformed("heartbeat")),
        },
        _ => Err(Refused::Malformed("unknown")),
    }
}

/// A record a partner can have written: an address that is neither unspecified nor a
/// whole-network one (the log reads `0.0.0.0` as "whatever lease the client had" in
/// releases from before addresses were written; a partner always names the address).
fn plausible(record: &Record) -> bool {
    let ip = match record {
        Record::Commit(lease) => lease.ip,
        Record::Release { ip, .. } | Record::Decline { ip, .. } => *ip,
    };
    !ip.is_unspecified()
        && match ip {
            IpAddr::V4(v4) => !v4.is_broadcast(),
            IpAddr::V6(v6) => !v6.is_multicast(),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MacAddr;
    use crate::leases::{ClientKey, Lease};

    fn lease(n: u8) -> Record {
        let mac = MacAddr([2, 0, 0, 0, 0, n]);
        Record::Commit(Lease {
            key: ClientKey::Hardware(mac),
            mac,
            ip: std::net::Ipv4Addr::new(10, 99, 0, 100 + n).into(),
            expires_unix: 1_700_000_000 + u64::from(n),
        })
    }

    /// Both ends of a handshake with `dialer_key` and `listener_key`.
    fn handshake(
        dialer_key: &PairKey,
        listener_key: &PairKey,
    ) -> Result<(Session, Session), Refused> {
        let (cl, cd) = ([7u8; TAG_LEN], [9u8; TAG_LEN]);
        let hello_l = PairKey::listener_hello(&cl);
        let hello_d = dialer_key.dialer_hello(&hello_l, &cd, "bootserver-a")?;
        let head: [u8; MAGIC.len() + TAG_LEN + 1] =
            hello_d[..MAGIC.len() + TAG_LEN + 1].try_into().unwrap();
        assert_eq!(dialer_hello_len(&head), hello_d.len());
        let (proof_l, listener) =
            listener_key.accept(&cl, &hello_d, "bootserver-a", "bootserver-b")?;
        let dialer = dialer_key.confirm(&hello_l, &cd, &proof_l, "bootserver-b")?;
        Ok((dialer, listener))
    }

    fn frame_body(frame: &[u8]) -> &[u8] {
        let len = Session::frame_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, frame.len() - 4);
        &frame[4..]
    }

    #[test]
    fn records_acks_and_heartbeats_cross_both_ways() {
        let key = PairKey::new(b"0123456789abcdef0123456789abcdef\n");
        let (mut dialer, mut listener) = handshake(&key, &key).unwrap();
        let messages = [
            Message::Records {
                batch: 1,
                catch_up: true,
                records: vec![
                    lease(1),
                    Record::Decline {
                        ip: "10.99.0.9".parse().unwrap(),
                        until_unix: 5,
                    },
                ],
            },
            Message::Records {
                batch: 2,
                catch_up: false,
                records: vec![],
            },
            Message::Heartbeat { state: 1 },
        ];
        for message in &messages {
            let mut out = Vec::new();
            dialer.seal(message, &mut out);
            assert_eq!(&listener.open(frame_body(&out)).unwrap(), message);
        }
        for message in [
            Message::Ack {
                batch: 1,
                taken: Some(vec![true, false]),
            },
            Message::Ack {
                batch: 2,
                taken: None,
            },
        ] {
            let mut out = Vec::new();
            listener.seal(&message, &mut out);
            assert_eq!(dialer.open(frame_body(&out)).unwrap(), message);
        }
    }

    #[test]
    fn another_key_or_another_name_is_refused_in_the_handshake() {
        let key = PairKey::new(b"0123456789abcdef0123456789abcdef");
        let other = PairKey::new(b"fedcba9876543210fedcba9876543210");
        assert_eq!(handshake(&other, &key).err(), Some(Refused::BadTag));
        let (cl, cd) = ([1u8; TAG_LEN], [2u8; TAG_LEN]);
        let hello_l = PairKey::listener_hello(&cl);
        let hello_d = key.dialer_hello(&hello_l, &cd, "intruder").unwrap();
        assert_eq!(
            key.accept(&cl, &hello_d, "bootserver-a", "bootserver-b")
                .err(),
            Some(Refused::NotThePartner("intruder".into()))
        );
        // A listener that does not hold the key cannot prove itself to the dialer.
        let forged = other.proof(b"listener", &cl, &cd, "bootserver-b");
        assert_eq!(
            key.confirm(&hello_l, &cd, forged.as_ref(), "bootserver-b")
                .err(),
            Some(Refused::BadTag)
        );
        assert_eq!(
            key.dialer_hello(b"HTTP/1.1 400", &cd, "a").err(),
            Some(Refused::Magic)
        );
    }

    #[test]
    fn a_changed_replayed_or_reflected_frame_is_refused() {
        let key = PairKey::new(b"0123456789abcdef0123456789abcdef");
        let (mut dialer, mut listener) = handshake(&key, &key).unwrap();
        let mut out = Vec::new();
        dialer.seal(
            &Message::Records {
                batch: 1,
                catch_up: false,
                records: vec![lease(1)],
            },
            &mut out,
        );
        let mut changed = out.clone();
        changed[20] ^= 1;
        assert_eq!(listener.open(frame_body(&changed)), Err(Refused::BadTag));
        assert!(listener.open(frame_body(&out)).is_ok());
        assert_eq!(
            listener.open(frame_body(&out)),
            Err(Refused::Sequence {
                expected: 1,
                got: 0
            }),
            "replayed"
        );
        // The dialer's own frame sent back to it.
        assert_eq!(dialer.open(frame_body(&out)), Err(Refused::BadTag));
        // Another connection's session (fresh challenges) does not take it either.
        let (cl, cd) = ([3u8; TAG_LEN], [4u8; TAG_LEN]);
        let hello_l = PairKey::listener_hello(&cl);
        let hello_d = key.dialer_hello(&hello_l, &cd, "bootserver-a").unwrap();
        let (_, mut fresh) = key
            .accept(&cl, &hello_d, "bootserver-a", "bootserver-b")
            .unwrap();
        assert_eq!(fresh.open(frame_body(&out)), Err(Refused::BadTag));
    }

    /// A log too large for one frame goes as several, each within the limit, and only the
    /// last ends the catch-up (found reading the change: one frame of a large log would be
    /// refused by the partner on every connection, and it would never catch up).
    #[test]
    fn a_large_catch_up_is_cut_into_frames_the_partner_takes() {
        let longest = Record::Commit(Lease {
            key: ClientKey::Ia {
                iaid: 7,
                duid: vec![0xab; 251].into_boxed_slice(),
            },
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ip: "fd00:99::1".parse().unwrap(),
            expires_unix: 1,
        });
        let records = vec![longest; 2 * CATCH_UP_RECORDS_PER_FRAME + 1];
        let frames = catch_up(records);
        assert_eq!(frames.len(), 3);
        let key = PairKey::new(b"0123456789abcdef0123456789abcdef");
        let (mut dialer, mut listener) = handshake(&key, &key).unwrap();
        let mut taken = 0;
        for (i, frame) in frames.iter().enumerate() {
            let Message::Records {
                catch_up, records, ..
            } = frame
            else {
                panic!("{frame:?}")
            };
            assert_eq!(*catch_up, i == 2);
            taken += records.len();
            let mut out = Vec::new();
            dialer.seal(frame, &mut out);
            assert!(out.len() - 4 <= MAX_FRAME, "frame {i}: {} bytes", out.len());
            assert_eq!(&listener.open(frame_body(&out)).unwrap(), frame);
        }
        assert_eq!(taken, 2 * CATCH_UP_RECORDS_PER_FRAME + 1);
        assert!(matches!(
            catch_up(Vec::new()).as_slice(),
            [Message::Records { catch_up: true, records, .. }] if records.is_empty()
        ));
    }

    #[test]
    fn lengths_and_bodies_out_of_shape_are_refused() {
        assert_eq!(
            Session::frame_len(u32::MAX.to_be_bytes()),
            Err(Refused::Length(u32::MAX as usize))
        );
        assert_eq!(
            Session::frame_len(3u32.to_be_bytes()),
            Err(Refused::Length(3))
        );
        let key = PairKey::new(b"0123456789abcdef0123456789abcdef");
        let (mut dialer, mut listener) = handshake(&key, &key).unwrap();
        // A body that verifies but does not decode: a record cut short, an unknown kind,
        // an unspecified address.
        let unspecified = Record::Decline {
            ip: "0.0.0.0".parse().unwrap(),
            until_unix: 1,
        };
        let mut out = Vec::new();
        dialer.seal(
            &Message::Records {
                batch: 1,
                catch_up: false,
                records: vec![unspecified],
            },
            &mut out,
        );
        assert_eq!(
            listener.open(frame_body(&out)),
            Err(Refused::Malformed("records"))
        );
        assert_eq!(listener.open(&[0u8; 5]), Err(Refused::Length(5)));
    }
}
