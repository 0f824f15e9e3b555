//! DHCPv6 relay envelopes (RFC 8415 §9, §19). A client's message reaches the server inside
//! one Relay-Forward (12) per relay agent on its way, outermost from the agent nearest the
//! server; the reply goes back inside one Relay-Reply (13) per agent, each giving that agent
//! back what it needs to pass the reply on: its hop count, link and peer addresses, and its
//! interface-id (option 18), echoed verbatim (§19.3).
//!
//! [`unwrap`] takes what arrived on the server port and gives the envelopes and the client's
//! message (borrowed, not copied); [`wrap`] puts a reply to that message into the matching
//! Relay-Reply envelopes. A direct (unrelayed) message passes through with no envelopes.
//! Envelope options other than 9, 18 and 79 (remote-id, subscriber-id, …) are read past and
//! not echoed: the server copies only the interface-id back.
//!
//! Parsed and built by hand: dhcproto decodes a Relay Message option (9) as another relay
//! message, but a first-hop agent's option 9 holds the client's own message.

use std::net::Ipv6Addr;

/// The deepest nesting [`unwrap`] accepts. Agents refuse to relay past `HOP_COUNT_LIMIT`
/// (8, RFC 8415 §7.6), but the limit is configurable there; this is lenient, yet bounds the
/// work an arriving datagram can cause.
pub const MAX_HOPS: usize = 32;

/// Message types (RFC 8415 §7.3).
const RELAY_FORW: u8 = 12;
const RELAY_REPL: u8 = 13;

/// Option codes: Relay Message (9), Interface-Id (18), Client Link-Layer Address (79,
/// RFC 6939).
const OPTION_RELAY_MSG: u16 = 9;
const OPTION_INTERFACE_ID: u16 = 18;
const OPTION_CLIENT_LINKLAYER_ADDR: u16 = 79;

/// msg-type, hop-count, link-address, peer-address.
const HEADER: usize = 1 + 1 + 16 + 16;

/// One relay agent's envelope, as it forwarded it; outermost first in [`Relayed::hops`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayHop {
    /// How many agents relayed the message before this one (0 for the agent nearest the
    /// client).
    pub hop_count: u8,
    /// An address on the client's link, or unspecified when the agent did not have one.
    pub link: Ipv6Addr,
    /// Where the agent got the message from: the client, or the next agent inward.
    pub peer: Ipv6Addr,
    /// Option 18's data, echoed back verbatim in the Relay-Reply: the agent's own
    /// reference to the interface to send the reply out of.
    pub interface_id: Option<Vec<u8>>,
    /// Option 79's data (RFC 6939: hardware type, then the address): the client's
    /// link-layer address as the agent saw it on the wire.
    pub link_layer: Option<Vec<u8>>,
}

/// A message that arrived at the server: the relay envelopes around it, outermost first
/// (none for a direct message), and the client's message itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed<'a> {
    pub hops: Vec<RelayHop>,
    pub client: &'a [u8],
}

impl Relayed<'_> {
    /// Option 79 of the innermost envelope: that of the agent nearest the client, the only
    /// one that saw the client's frame (an outer agent's would be about the inner agent).
    pub fn client_link_layer(&self) -> Option<&[u8]> {
        self.hops.last()?.link_layer.as_deref()
    }
}

/// Why relay envelopes were refused. An envelope's `depth` counts from the outermost (0);
/// a message's `depth` is how many envelopes were around it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error("the message inside {depth} relay envelope(s) is empty")]
    EmptyMessage { depth: usize },

    #[error(
        "the message inside {depth} relay envelope(s) is a Relay-Reply (13), which only a \
         server sends"
    )]
    RelayReply { depth: usize },

    #[error("relay envelopes are nested more than {MAX_HOPS} deep")]
    TooDeep,

    #[error("relay envelope {depth} is {len} bytes, shorter than its {HEADER}-byte header")]
    ShortHeader { depth: usize, len: usize },

    #[error("relay envelope {depth}: the option at byte {offset} runs past the envelope's end")]
    TruncatedOption { depth: usize, offset: usize },

    #[error("relay envelope {depth} has no Relay Message option (9)")]
    NoRelayMessage { depth: usize },

    #[error("relay envelope {depth} has option {code} more than once")]
    DuplicateOption { depth: usize, code: u16 },

    #[error(
        "option {code} of Relay-Reply envelope {depth} would be {len} bytes, more than an \
         option holds (65535)"
    )]
    OptionTooLong { depth: usize, code: u16, len: usize },
}

/// The relay envelopes around a message that arrived at the server and the client's
/// message inside them; a message that is not a Relay-Forward is the client's own.
pub fn unwrap(bytes: &[u8]) -> Result<Relayed<'_>, RelayError> {
    let mut hops = Vec::new();
    let mut message = bytes;
    loop {
        let depth = hops.len();
        match message.first() {
            None => return Err(RelayError::EmptyMessage { depth }),
            Some(&RELAY_REPL) => return Err(RelayError::RelayReply { depth }),
            Some(&RELAY_FORW) => {}
            Some(_) => {
                return Ok(Relayed {
                    hops,
                    client: message,
                });
            }
        }
        if depth == MAX_HOPS {
            return Err(RelayError::TooDeep);
        }
        let (hop, inner) = envelope(message, depth)?;
        hops.push(hop);
        message = inner;
    }
}

/// One Relay-Forward envelope: the hop, and the data of its Relay Message option.
fn envelope(bytes: &[u8], depth: usize) -> Result<(RelayHop, &[u8]), RelayError> {
    let short = || RelayError::ShortHeader {
        depth,
        len: bytes.len(),
    };
    let ([_, hop_count], rest) = bytes.split_first_chunk::<2>().ok_or_else(short)?;
    let (link, rest) = rest.split_first_chunk::<16>().ok_or_else(short)?;
    let (peer, mut options) = rest.split_first_chunk::<16>().ok_or_else(short)?;

    let mut relay_message = None;
    let mut interface_id = None;
    let mut link_layer = None;
    let mut offset = HEADER;
    while !options.is_empty() {
        let truncated = || RelayError::TruncatedOption { depth, offset };
        let ([c0, c1, l0, l1], rest) = options.split_first_chunk::<4>().ok_or_else(truncated)?;
        let code = u16::from_be_bytes([*c0, *c1]);
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        let (data, rest) = rest.split_at_checked(len).ok_or_else(truncated)?;
        let slot = match code {
            OPTION_RELAY_MSG => Some(&mut relay_message),
            OPTION_INTERFACE_ID => Some(&mut interface_id),
            OPTION_CLIENT_LINKLAYER_ADDR => Some(&mut link_layer),
            _ => None,
        };
        // Twice would be ambiguous (which interface-id to echo, which message to answer).
        if let Some(slot) = slot
            && slot.replace(data).is_some()
        {
            return Err(RelayError::DuplicateOption { depth, code });
        }
        options = rest;
        offset += 4 + len;
    }
    let inner = relay_message.ok_or(RelayError::NoRelayMessage { depth })?;
    let hop = RelayHop {
        hop_count: *hop_count,
        link: Ipv6Addr::from(*link),
        peer: Ipv6Addr::from(*peer),
        interface_id: interface_id.map(<[u8]>::to_vec),
        link_layer: link_layer.map(<[u8]>::to_vec),
    };
    Ok((hop, inner))
}

/// A reply to a relayed message, in the Relay-Reply envelopes matching the Relay-Forward
/// ones it came in (`hops` outermost first, as [`unwrap`] gave them): each with the same
/// hop count, link and peer, then the interface-id if the agent sent one, then the inner
/// message. No `hops`, no envelope: the reply itself. Refused only when an option would
/// outgrow its 16-bit length, which a reply sent over UDP cannot.
pub fn wrap(hops: &[RelayHop], reply: &[u8]) -> Result<Vec<u8>, RelayError> {
    let mut message = reply.to_vec();
    for (depth, hop) in hops.iter().enumerate().rev() {
        let id_len = hop.interface_id.as_ref().map_or(0, |id| 4 + id.len());
        let mut envelope = Vec::with_capacity(HEADER + id_len + 4 + message.len());
        envelope.extend_from_slice(&[RELAY_REPL, hop.hop_count]);
        envelope.extend_from_slice(&hop.link.octets());
        envelope.extend_from_slice(&hop.peer.octets());
        if let Some(id) = &hop.interface_id {
            put_option(&mut envelope, depth, OPTION_INTERFACE_ID, id)?;
        }
        put_option(&mut envelope, depth, OPTION_RELAY_MSG, &message)?;
        message = envelope;
    }
    Ok(message)
}

fn put_option(out: &mut Vec<u8>, depth: usize, code: u16, data: &[u8]) -> Result<(), RelayError> {
    let len = u16::try_from(data.len()).map_err(|_| RelayError::OptionTooLong {
        depth,
        code,
        len: data.len(),
    })?;
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::dhcp6::identify::tests_fixture::{hex, ovmf_solicit};
    use proptest::prelude::*;

    /// A Reply: type 7, transaction id, server id (2) of 4 bytes; 12 bytes in all.
    const REPLY: &str = "07 096839 0002 0004 deadbeef";

    /// Relay-Forward envelopes (12) around `message`, `hops` outermost first, options 18,
    /// 79, 9 in that order; or with `kind` 13, the Relay-Reply envelopes [`wrap`] should
    /// build (no option 79). Built independently of [`wrap`], to check it.
    fn envelopes(kind: u8, hops: &[RelayHop], message: &[u8]) -> Vec<u8> {
        hops.iter().rev().fold(message.to_vec(), |inner, hop| {
            let mut out = vec![kind, hop.hop_count];
            out.extend(hop.link.octets());
            out.extend(hop.peer.octets());
            let link_layer = hop.link_layer.as_deref().filter(|_| kind == RELAY_FORW);
            for (code, data) in [
                (OPTION_INTERFACE_ID, hop.interface_id.as_deref()),
                (OPTION_CLIENT_LINKLAYER_ADDR, link_layer),
                (OPTION_RELAY_MSG, Some(&inner[..])),
            ] {
                if let Some(data) = data {
                    out.extend(code.to_be_bytes());
                    out.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
                    out.extend(data);
                }
            }
            out
        })
    }

    fn forward(hops: &[RelayHop], message: &[u8]) -> Vec<u8> {
        envelopes(RELAY_FORW, hops, message)
    }

    fn hop(hop_count: u8, link: &str, peer: &str) -> RelayHop {
        RelayHop {
            hop_count,
            link: link.parse().unwrap(),
            peer: peer.parse().unwrap(),
            interface_id: None,
            link_layer: None,
        }
    }

    /// Three agents: the outermost (hop count 2) with an interface-id and, oddly, an
    /// option 79 of its own; the middle without either and no link address; the innermost
    /// with both.
    fn three_hops() -> Vec<RelayHop> {
        vec![
            RelayHop {
                interface_id: Some(b"ab".to_vec()),
                link_layer: Some(hex("0001 020000000099")),
                ..hop(2, "2001:db8:1::1", "2001:db8:2::1")
            },
            hop(1, "::", "2001:db8:3::1"),
            RelayHop {
                interface_id: Some(b"c".to_vec()),
                link_layer: Some(hex("0001 525400660001")),
                ..hop(0, "2001:db8:3::1", "fe80::5054:ff:fe66:1")
            },
        ]
    }

    #[test]
    fn a_direct_message_passes_through() {
        let solicit = ovmf_solicit();
        let relayed = unwrap(&solicit).unwrap();
        assert!(relayed.hops.is_empty());
        assert_eq!(relayed.client, &solicit[..]);
        assert_eq!(relayed.client_link_layer(), None);
        assert_eq!(wrap(&[], &hex(REPLY)).unwrap(), hex(REPLY));
    }

    #[test]
    fn one_relay_round_trips_with_its_interface_id_echoed() {
        let solicit = ovmf_solicit();
        // Relay-Forward, hop count 0, link 2001:db8:1::1, peer fe80::5054:ff:fe66:1,
        // interface-id "eth1", remote-id (37, not echoed), option 79, the Solicit (111 bytes).
        let mut bytes = hex(
            "0c 00 20010db8000100000000000000000001 fe80000000000000505400fffe660001
             0012 0004 65746831
             0025 0008 00000009 01020304
             004f 0008 0001 525400660001
             0009 006f",
        );
        bytes.extend(&solicit);

        let relayed = unwrap(&bytes).unwrap();
        assert_eq!(relayed.client, &solicit[..]);
        assert_eq!(
            relayed.hops,
            vec![RelayHop {
                interface_id: Some(b"eth1".to_vec()),
                link_layer: Some(hex("0001 525400660001")),
                ..hop(0, "2001:db8:1::1", "fe80::5054:ff:fe66:1")
            }]
        );
        assert_eq!(
            relayed.client_link_layer(),
            Some(&hex("0001 525400660001")[..])
        );

        let expected = hex(&format!(
            "0d 00 20010db8000100000000000000000001 fe80000000000000505400fffe660001
             0012 0004 65746831
             0009 000c {REPLY}"
        ));
        assert_eq!(wrap(&relayed.hops, &hex(REPLY)).unwrap(), expected);
    }

    #[test]
    fn three_nested_relays_round_trip() {
        let hops = three_hops();
        let solicit = ovmf_solicit();
        let bytes = forward(&hops, &solicit);
        let relayed = unwrap(&bytes).unwrap();
        assert_eq!(relayed.hops, hops);
        assert_eq!(relayed.client, &solicit[..]);
        // The innermost agent's, not the outermost's.
        assert_eq!(
            relayed.client_link_layer(),
            Some(&hex("0001 525400660001")[..])
        );

        // Innermost: 34 + 5 + 4 + 12 = 55 (0x37) bytes; middle: 34 + 4 + 55 = 93 (0x5d).
        let expected = hex(&format!(
            "0d 02 20010db8000100000000000000000001 20010db8000200000000000000000001
             0012 0002 6162
             0009 005d
               0d 01 00000000000000000000000000000000 20010db8000300000000000000000001
               0009 0037
                 0d 00 20010db8000300000000000000000001 fe80000000000000505400fffe660001
                 0012 0001 63
                 0009 000c {REPLY}"
        ));
        assert_eq!(wrap(&relayed.hops, &hex(REPLY)).unwrap(), expected);
    }

    #[test]
    fn every_truncation_of_two_envelopes_is_refused() {
        let hops = &three_hops()[1..];
        let bytes = forward(hops, &ovmf_solicit());
        assert!(unwrap(&bytes).is_ok());
        for len in 0..bytes.len() {
            assert!(
                unwrap(&bytes[..len]).is_err(),
                "{len} of {} bytes",
                bytes.len()
            );
        }
        assert_eq!(unwrap(&[]), Err(RelayError::EmptyMessage { depth: 0 }));
        assert_eq!(
            unwrap(&bytes[..HEADER - 1]),
            Err(RelayError::ShortHeader {
                depth: 0,
                len: HEADER - 1
            })
        );
        assert_eq!(
            unwrap(&bytes[..HEADER + 3]),
            Err(RelayError::TruncatedOption {
                depth: 0,
                offset: HEADER
            })
        );
        assert_eq!(
            unwrap(&bytes[..HEADER]),
            Err(RelayError::NoRelayMessage { depth: 0 })
        );
    }

    #[test]
    fn malformed_envelopes_are_refused_for_what_is_wrong() {
        let inner = [hop(0, "2001:db8:3::1", "fe80::1")];
        let solicit = ovmf_solicit();
        let mut stray_reply = hex(REPLY);
        stray_reply[0] = RELAY_REPL;
        assert_eq!(
            unwrap(&forward(&inner, &[])),
            Err(RelayError::EmptyMessage { depth: 1 })
        );
        assert_eq!(
            unwrap(&forward(&inner, &stray_reply)),
            Err(RelayError::RelayReply { depth: 1 })
        );
        assert_eq!(
            unwrap(&stray_reply),
            Err(RelayError::RelayReply { depth: 0 })
        );

        // Option 9 twice in the inner envelope: append a second one to it.
        let mut twice = forward(&inner, &solicit);
        twice.extend(hex("0009 0001 01"));
        let outer = [hop(1, "::", "2001:db8:3::1")];
        assert_eq!(
            unwrap(&forward(&outer, &twice)),
            Err(RelayError::DuplicateOption { depth: 1, code: 9 })
        );

        let mut ids = forward(&inner, &solicit);
        ids.extend(hex("0012 0001 61 0012 0001 62"));
        assert_eq!(
            unwrap(&ids),
            Err(RelayError::DuplicateOption { depth: 0, code: 18 })
        );
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let hops: Vec<RelayHop> = (0..=MAX_HOPS)
            .map(|i| hop(u8::try_from(i).unwrap(), "2001:db8::1", "fe80::1"))
            .collect();
        let solicit = ovmf_solicit();
        assert_eq!(unwrap(&forward(&hops, &solicit)), Err(RelayError::TooDeep));
        let at_limit = forward(&hops[1..], &solicit);
        assert_eq!(unwrap(&at_limit).unwrap().hops.len(), MAX_HOPS);
    }

    #[test]
    fn a_reply_too_long_for_an_option_is_refused() {
        let hops = [hop(0, "2001:db8::1", "fe80::1")];
        assert_eq!(
            wrap(&hops, &vec![7; 65536]),
            Err(RelayError::OptionTooLong {
                depth: 0,
                code: 9,
                len: 65536
            })
        );
        assert!(wrap(&hops, &vec![7; 65535]).is_ok());
    }

    fn arbitrary_hop() -> impl Strategy<Value = RelayHop> {
        let data = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24));
        (
            any::<u8>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            data(),
            data(),
        )
            .prop_map(
                |(hop_count, link, peer, interface_id, link_layer)| RelayHop {
                    hop_count,
                    link: link.into(),
                    peer: peer.into(),
                    interface_id,
                    link_layer,
                },
            )
    }

    /// A client message: any type but the relay ones, then anything.
    fn arbitrary_message() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<u8>().prop_filter("not a relay message", |t| {
                *t != RELAY_FORW && *t != RELAY_REPL
            }),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(kind, rest)| [vec![kind], rest].concat())
    }

    proptest! {
        /// Whatever arrives, unwrap answers and never panics.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = unwrap(&bytes);
        }

        /// Nor do valid envelopes with one byte changed, or cut short: closer to what
        /// reaches the parser's deeper paths than random bytes.
        #[test]
        fn damaged_envelopes_never_panic(
            hops in proptest::collection::vec(arbitrary_hop(), 1..4),
            message in arbitrary_message(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = forward(&hops, &message);
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let _ = unwrap(&bytes);
            let _ = unwrap(&bytes[..cut.index(bytes.len())]);
        }

        /// unwrap gives back the envelopes and message a Relay-Forward was built from, and
        /// wrap builds the matching Relay-Reply envelopes.
        #[test]
        fn forward_unwraps_and_reply_wraps(
            hops in proptest::collection::vec(arbitrary_hop(), 0..=MAX_HOPS),
            message in arbitrary_message(),
            reply in arbitrary_message(),
        ) {
            let bytes = forward(&hops, &message);
            let relayed = unwrap(&bytes).unwrap();
            prop_assert_eq!(&relayed.hops, &hops);
            prop_assert_eq!(relayed.client, &message[..]);
            prop_assert_eq!(
                relayed.client_link_layer(),
                hops.last().and_then(|h| h.link_layer.as_deref())
            );
            prop_assert_eq!(
                wrap(&relayed.hops, &reply).unwrap(),
                envelopes(RELAY_REPL, &hops, &reply)
            );
        }
    }
}
