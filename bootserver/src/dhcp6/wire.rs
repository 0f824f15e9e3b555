//! Decoding a DHCPv6 message from untrusted bytes. dhcproto 0.15's decoder subtracts
//! before it checks: an option 13 (status code) shorter than 2 bytes, or 16/17 (vendor
//! class, vendor options) shorter than 4, underflows (a panic in debug builds, a wrapped
//! length in release ones); found by the property test over damaged messages. So the
//! option tree is walked first, and a message whose options do not nest within their
//! lengths, or are shorter than their fixed part, is refused before dhcproto sees it.

use dhcproto::v6::Message;
use dhcproto::{Decodable, Decoder};

/// Why bytes are not a DHCPv6 message we decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed6 {
    /// Shorter than a message header (type and transaction ID).
    #[error("shorter than a DHCPv6 header")]
    Short,
    /// An option runs past its container, or is shorter than its fixed fields.
    #[error("option {0} is malformed")]
    Option(u16),
    /// Options nest deeper than any real message.
    #[error("options nest too deep")]
    TooDeep,
    /// dhcproto refused it.
    #[error("undecodable")]
    Undecodable,
}

/// Options nest at most this deep (a relay message in an IA address in an IA is 3).
const MAX_DEPTH: usize = 8;

/// The fixed fields before the nested options of an option that carries options, and the
/// minimum length of an option whose decoder subtracts.
fn layout(code: u16) -> (usize, Option<usize>) {
    match code {
        3 | 25 => (12, Some(12)),    // IA_NA, IA_PD: IAID, T1, T2
        4 => (4, Some(4)),           // IA_TA: IAID
        5 => (24, Some(24)),         // IA address: address, lifetimes
        26 => (25, Some(25)),        // IA prefix: lifetimes, length, prefix
        17 => (4, Some(4)),          // vendor options: enterprise number
        9 => (34, Some(34)),         // relay message (decoded as a relay envelope)
        13 => (usize::MAX, Some(2)), // status code: code, then text
        16 => (usize::MAX, Some(4)), // vendor class: enterprise number, then data
        _ => (usize::MAX, None),
    }
}

/// Checks that `options` is a sequence of options within its bounds, recursively.
fn check_options(options: &[u8], depth: usize) -> Result<(), Malformed6> {
    if depth > MAX_DEPTH {
        return Err(Malformed6::TooDeep);
    }
    let mut rest = options;
    while !rest.is_empty() {
        let (header, after) = rest.split_at_checked(4).ok_or(Malformed6::Option(0))?;
        let code = u16::from_be_bytes([header[0], header[1]]);
        let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let (body, next) = after
            .split_at_checked(len)
            .ok_or(Malformed6::Option(code))?;
        let (nested_from, min) = layout(code);
        if min.is_some_and(|min| len < min) {
            return Err(Malformed6::Option(code));
        }
        if let Some(nested) = body.get(nested_from..) {
            check_options(nested, depth + 1)?;
        }
        rest = next;
    }
    Ok(())
}

/// Decodes a client message (type, transaction ID, options), refusing what dhcproto
/// would mishandle.
pub fn decode(bytes: &[u8]) -> Result<Message, Malformed6> {
    let options = bytes.get(4..).ok_or(Malformed6::Short)?;
    check_options(options, 0)?;
    Message::decode(&mut Decoder::new(bytes)).map_err(|_| Malformed6::Undecodable)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn message(options: &[u8]) -> Vec<u8> {
        let mut m = vec![1, 0, 0, 1];
        m.extend_from_slice(options);
        m
    }

    #[test]
    fn what_would_underflow_dhcproto_is_refused() {
        // A vendor class of length 2, a status code of length 1, a vendor class of length
        // 0 inside an IA_NA.
        assert_eq!(
            decode(&message(&[0, 16, 0, 2, 0, 0])),
            Err(Malformed6::Option(16))
        );
        assert_eq!(
            decode(&message(&[0, 13, 0, 1, 0])),
            Err(Malformed6::Option(13))
        );
        let mut ia = vec![0, 3, 0, 16];
        ia.extend_from_slice(&[0; 12]);
        ia.extend_from_slice(&[0, 16, 0, 0]);
        assert_eq!(decode(&message(&ia)), Err(Malformed6::Option(16)));
        // An option past the end, a header cut short.
        assert_eq!(
            decode(&message(&[0, 1, 0, 9, 1])),
            Err(Malformed6::Option(1))
        );
        assert_eq!(decode(&[1, 0, 0]), Err(Malformed6::Short));
    }

    #[test]
    fn real_messages_pass() {
        let ovmf = crate::dhcp6::identify::tests_fixture::ovmf_solicit();
        assert!(decode(&ovmf).is_ok());
        // A vendor class with its data, a status code with text.
        let mut options = vec![0, 16, 0, 8, 0, 0, 1, 0x57, 0, 2, b'a', b'b'];
        options.extend_from_slice(&[0, 13, 0, 4, 0, 0, b'o', b'k']);
        assert!(decode(&message(&options)).is_ok());
    }
}
