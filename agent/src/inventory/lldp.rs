//! LLDP (IEEE 802.1AB) frames: who is on the other end of a link. Only what an inventory
//! needs is read: chassis ID, port ID, port description and system name. A frame comes from
//! the wire, so the parser takes any bytes and answers with a neighbour or an error, never
//! a panic, and every string it returns is printable ASCII of bounded length.

use unbounded_api::inventory::LldpNeighbour;

/// LLDP's EtherType.
pub const ETHERTYPE: u16 = 0x88cc;
/// The nearest-bridge multicast address LLDP frames are sent to.
pub const NEAREST_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];

/// Longest text kept from one TLV (the inventory's limit).
const MAX_TEXT: usize = 256;

const TLV_END: u8 = 0;
const TLV_CHASSIS_ID: u8 = 1;
const TLV_PORT_ID: u8 = 2;
const TLV_PORT_DESCRIPTION: u8 = 4;
const TLV_SYSTEM_NAME: u8 = 5;
/// Chassis ID subtype 4 and port ID subtype 3: a MAC address.
const CHASSIS_MAC: u8 = 4;
const PORT_MAC: u8 = 3;

/// Why a frame is not a usable LLDP frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LldpError {
    /// Shorter than an Ethernet header.
    #[error("frame of {0} bytes is shorter than an Ethernet header")]
    Short(usize),
    /// Another EtherType.
    #[error("EtherType {0:#06x} is not LLDP")]
    NotLldp(u16),
    /// A TLV runs past the end of the frame.
    #[error("a TLV of type {tlv_type} claims {len} bytes past the frame's end")]
    Truncated {
        /// The TLV type.
        tlv_type: u8,
        /// Its claimed length.
        len: usize,
    },
    /// No chassis ID or no port ID (both are mandatory).
    #[error("the LLDPDU lacks its mandatory {0} TLV")]
    Missing(&'static str),
}

/// Parses an Ethernet frame (destination, source, EtherType `0x88cc`, LLDPDU), with or
/// without one 802.1Q tag.
pub fn parse_frame(frame: &[u8]) -> Result<LldpNeighbour, LldpError> {
    if frame.len() < 14 {
        return Err(LldpError::Short(frame.len()));
    }
    let mut ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let mut payload = &frame[14..];
    if ethertype == 0x8100 {
        if payload.len() < 4 {
            return Err(LldpError::Short(frame.len()));
        }
        ethertype = u16::from_be_bytes([payload[2], payload[3]]);
        payload = &payload[4..];
    }
    if ethertype != ETHERTYPE {
        return Err(LldpError::NotLldp(ethertype));
    }
    parse_lldpdu(payload)
}

/// Parses an LLDPDU (the TLVs after the Ethernet header).
pub fn parse_lldpdu(mut tlvs: &[u8]) -> Result<LldpNeighbour, LldpError> {
    let mut chassis_id = None;
    let mut port_id = None;
    let mut neighbour = LldpNeighbour::default();
    while tlvs.len() >= 2 {
        let header = u16::from_be_bytes([tlvs[0], tlvs[1]]);
        // 7 bits of type, 9 bits of length: the shift leaves at most 127.
        let tlv_type = (header >> 9) as u8;
        let len = usize::from(header & 0x01ff);
        let Some(value) = tlvs.get(2..2 + len) else {
            return Err(LldpError::Truncated { tlv_type, len });
        };
        tlvs = &tlvs[2 + len..];
        match tlv_type {
            TLV_END => break,
            TLV_CHASSIS_ID => {
                chassis_id = value
                    .split_first()
                    .map(|(s, v)| id_text(*s, CHASSIS_MAC, v))
            }
            TLV_PORT_ID => port_id = value.split_first().map(|(s, v)| id_text(*s, PORT_MAC, v)),
            TLV_PORT_DESCRIPTION => neighbour.port_description = Some(text(value)),
            TLV_SYSTEM_NAME => neighbour.system_name = Some(text(value)),
            _ => {}
        }
    }
    neighbour.chassis_id = chassis_id.ok_or(LldpError::Missing("chassis ID"))?;
    neighbour.port_id = port_id.ok_or(LldpError::Missing("port ID"))?;
    Ok(neighbour)
}

/// An ID TLV's value as text: a MAC in colon form when the subtype says MAC and the length
/// fits, otherwise the bytes as text.
fn id_text(subtype: u8, mac_subtype: u8, value: &[u8]) -> String {
    if subtype == mac_subtype && value.len() == 6 {
        value
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    } else {
        text(value)
    }
}

/// Bytes as printable ASCII: anything else becomes `?`, at most [`MAX_TEXT`] characters,
/// trailing NULs and spaces dropped (some switches pad).
fn text(value: &[u8]) -> String {
    let value = value
        .iter()
        .rposition(|b| *b != 0 && *b != b' ')
        .map_or(&value[..0], |last| &value[..=last]);
    value
        .iter()
        .take(MAX_TEXT)
        .map(|b| {
            if (0x20..=0x7e).contains(b) {
                char::from(*b)
            } else {
                '?'
            }
        })
        .collect()
}

/// Builds an LLDP frame (for tests and for the testbed's sender): chassis ID and port ID as
/// locally assigned text (subtype 7 and 7), or MACs (subtypes 4 and 3) when they parse as
/// one; TTL 120; optional port description and system name; end TLV.
pub fn build_frame(source: [u8; 6], neighbour: &LldpNeighbour) -> Vec<u8> {
    let mut frame = Vec::with_capacity(128);
    frame.extend_from_slice(&NEAREST_BRIDGE);
    frame.extend_from_slice(&source);
    frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
    let id = |mac_subtype: u8, value: &str| match parse_mac(value) {
        Some(mac) => [&[mac_subtype][..], &mac].concat(),
        None => [&[7u8][..], value.as_bytes()].concat(),
    };
    push_tlv(
        &mut frame,
        TLV_CHASSIS_ID,
        &id(CHASSIS_MAC, &neighbour.chassis_id),
    );
    push_tlv(&mut frame, TLV_PORT_ID, &id(PORT_MAC, &neighbour.port_id));
    push_tlv(&mut frame, 3, &120u16.to_be_bytes());
    if let Some(d) = &neighbour.port_description {
        push_tlv(&mut frame, TLV_PORT_DESCRIPTION, d.as_bytes());
    }
    if let Some(n) = &neighbour.system_name {
        push_tlv(&mut frame, TLV_SYSTEM_NAME, n.as_bytes());
    }
    push_tlv(&mut frame, TLV_END, &[]);
    frame
}

fn push_tlv(frame: &mut Vec<u8>, tlv_type: u8, value: &[u8]) {
    // A TLV holds at most 511 bytes; longer values are cut (build_frame is for tests).
    let value = &value[..value.len().min(511)];
    let header = (u16::from(tlv_type) << 9) | value.len() as u16;
    frame.extend_from_slice(&header.to_be_bytes());
    frame.extend_from_slice(value);
}

fn parse_mac(value: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = value.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A frame as an Arista-style switch sends it: chassis ID a MAC, port ID an interface
    /// name (subtype 5), port description, system name, TTL, end.
    fn switch_frame() -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&NEAREST_BRIDGE);
        f.extend_from_slice(&[0x44, 0x4c, 0xa8, 0x12, 0x34, 0x56]);
        f.extend_from_slice(&[0x88, 0xcc]);
        push_tlv(&mut f, 1, &[4, 0x44, 0x4c, 0xa8, 0x12, 0x34, 0x00]);
        push_tlv(
            &mut f,
            2,
            &[
                5, b'E', b't', b'h', b'e', b'r', b'n', b'e', b't', b'1', b'2',
            ],
        );
        push_tlv(&mut f, 3, &[0, 120]);
        push_tlv(&mut f, 4, b"server r12u07 eno1");
        push_tlv(&mut f, 5, b"leaf-r12-1");
        push_tlv(
            &mut f,
            127,
            &[0x00, 0x12, 0x0f, 0x01, 0x03, 0x6c, 0x03, 0x00, 0x10],
        );
        push_tlv(&mut f, 0, &[]);
        f
    }

    #[test]
    fn frames_parse_to_neighbours() {
        let want = LldpNeighbour {
            chassis_id: "44:4c:a8:12:34:00".into(),
            port_id: "Ethernet12".into(),
            system_name: Some("leaf-r12-1".into()),
            port_description: Some("server r12u07 eno1".into()),
        };
        assert_eq!(parse_frame(&switch_frame()), Ok(want.clone()));

        // The same behind an 802.1Q tag.
        let mut tagged = switch_frame()[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
        tagged.extend_from_slice(&switch_frame()[12..]);
        assert_eq!(parse_frame(&tagged), Ok(want));
    }

    #[test]
    fn bad_frames_are_errors() {
        let mut no_port = Vec::new();
        no_port.extend_from_slice(&switch_frame()[..14]);
        push_tlv(&mut no_port, 1, &[7, b'x']);
        let mut truncated = switch_frame()[..20].to_vec();
        truncated.truncate(18);
        let mut ipv4 = switch_frame();
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        let cases: [(&str, Vec<u8>, LldpError); 4] = [
            ("short", vec![0; 10], LldpError::Short(10)),
            ("not LLDP", ipv4, LldpError::NotLldp(0x0800)),
            ("no port ID", no_port, LldpError::Missing("port ID")),
            (
                "truncated TLV",
                truncated,
                LldpError::Truncated {
                    tlv_type: 1,
                    len: 7,
                },
            ),
        ];
        for (what, frame, want) in cases {
            assert_eq!(parse_frame(&frame), Err(want), "{what}");
        }
    }

    #[test]
    fn control_bytes_become_question_marks() {
        let mut f = switch_frame()[..14].to_vec();
        push_tlv(&mut f, 1, &[7, b'a', 0x1b, b'b']);
        push_tlv(&mut f, 2, &[7, b'p', 0xff]);
        push_tlv(&mut f, 5, b"sw\0\0  ");
        let n = parse_frame(&f).unwrap();
        assert_eq!((n.chassis_id.as_str(), n.port_id.as_str()), ("a?b", "p?"));
        assert_eq!(n.system_name.as_deref(), Some("sw"));
    }

    fn printable(max: usize) -> impl Strategy<Value = String> {
        proptest::string::string_regex(&format!("[ -~]{{1,{max}}}"))
            .unwrap()
            .prop_filter("no padding to strip", |s| !s.ends_with(' '))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(26), ..ProptestConfig::default() })]

        #[test]
        fn never_panics_and_text_is_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
            if let Ok(n) = parse_frame(&bytes) {
                for s in [Some(&n.chassis_id), Some(&n.port_id), n.system_name.as_ref(), n.port_description.as_ref()].into_iter().flatten() {
                    prop_assert!(s.len() <= MAX_TEXT);
                    prop_assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                }
            }
            let _ = parse_lldpdu(&bytes);
        }

        #[test]
        fn built_frames_round_trip(
            chassis in printable(200),
            port in printable(200),
            name in proptest::option::of(printable(255)),
            description in proptest::option::of(printable(255)),
            mac_chassis in any::<[u8; 6]>(),
            use_mac in any::<bool>(),
        ) {
            let chassis_id = if use_mac {
                mac_chassis.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
            } else {
                chassis
            };
            let sent = LldpNeighbour { chassis_id, port_id: port, system_name: name, port_description: description };
            prop_assert_eq!(parse_frame(&build_frame([2, 0, 0, 0, 0, 1], &sent)), Ok(sent));
        }
    }
}
