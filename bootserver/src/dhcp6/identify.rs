//! Which Machine a DHCPv6 client is. A v6 client names itself by DUID and IAID, not by
//! its MAC; Machines are known by MAC. The MAC comes, best first, from:
//!
//! 1. the client link-layer address option (79, RFC 6939) a relay adds: what the relay
//!    saw on the wire, not what the client claims;
//! 2. the client's DUID when it is link-layer based (DUID-LLT, type 1, or DUID-LL, type 3,
//!    hardware type Ethernet): OVMF's PXEv6 sends DUID-LLT of the booting NIC;
//! 3. the modified EUI-64 interface identifier of the link-local source address
//!    (`fe80::5054:ff:fe66:1` is `52:54:00:66:00:01`): OVMF and iPXE form theirs so.
//!
//! When none yields one (a DUID-EN or DUID-UUID client behind no relay, with a privacy or
//! stable-opaque link-local address), the client is unknown: it gets what an unknown v4
//! client gets in the configured mode, never a known Machine's boot.
//!
//! A MAC from the DUID or from the source address is the client's own claim, as a v4
//! client's `chaddr` is; what vouches for a machine before credentials is
//! [`crate::identity`], as for v4.

use std::net::Ipv6Addr;

use unbounded_api::mac::MacAddr;

/// Where a v6 client's MAC came from, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MacSource {
    /// A relay's client link-layer address option (79).
    RelayLinkLayer,
    /// The client's link-layer DUID (LLT or LL).
    Duid,
    /// The EUI-64 interface identifier of the client's link-local address.
    LinkLocalEui64,
}

/// Hardware type Ethernet (RFC 826), as DUIDs and option 79 carry it.
const ETHERNET: u16 = 1;

/// The MAC of a link-layer DUID: DUID-LLT (type 1: hardware type, time, address) or
/// DUID-LL (type 3: hardware type, address), hardware type Ethernet.
pub fn mac_of_duid(duid: &[u8]) -> Option<MacAddr> {
    let (kind, rest) = split_u16(duid)?;
    let (hardware, rest) = split_u16(rest)?;
    if hardware != ETHERNET {
        return None;
    }
    let address = match kind {
        1 => rest.get(4..)?,
        3 => rest,
        _ => return None,
    };
    (address.len() == 6).then(|| MacAddr::from_slice(address))?
}

/// The MAC of a client link-layer address option (79): hardware type, then the address.
pub fn mac_of_link_layer_option(option: &[u8]) -> Option<MacAddr> {
    let (hardware, address) = split_u16(option)?;
    (hardware == ETHERNET && address.len() == 6).then(|| MacAddr::from_slice(address))?
}

/// The MAC a link-local address's modified EUI-64 interface identifier was formed from
/// (`ff:fe` in the middle, the universal/local bit flipped back), or `None` for any other
/// address.
pub fn mac_of_link_local(address: Ipv6Addr) -> Option<MacAddr> {
    let o = address.octets();
    let link_local = o[0] == 0xfe && (o[1] & 0xc0) == 0x80 && o[2..8] == [0; 6];
    if !link_local || o[11] != 0xff || o[12] != 0xfe {
        return None;
    }
    Some(MacAddr([o[8] ^ 0x02, o[9], o[10], o[13], o[14], o[15]]))
}

/// The client's MAC and where it came from: option 79, else the DUID, else the link-local
/// source's EUI-64 ([module docs](self)).
pub fn client_mac(
    relay_link_layer: Option<&[u8]>,
    duid: Option<&[u8]>,
    source: Ipv6Addr,
) -> Option<(MacAddr, MacSource)> {
    relay_link_layer
        .and_then(mac_of_link_layer_option)
        .map(|m| (m, MacSource::RelayLinkLayer))
        .or_else(|| duid.and_then(mac_of_duid).map(|m| (m, MacSource::Duid)))
        .or_else(|| mac_of_link_local(source).map(|m| (m, MacSource::LinkLocalEui64)))
}

fn split_u16(bytes: &[u8]) -> Option<(u16, &[u8])> {
    let (head, rest) = bytes.split_at_checked(2)?;
    Some((u16::from_be_bytes([head[0], head[1]]), rest))
}

/// The OVMF Solicit captured on the testbed, for the v6 tests ([`tests`]).
#[cfg(test)]
pub(crate) mod tests_fixture {
    /// The first Solicit Debian bookworm's OVMF (edk2 2022.11) sent from PXEv6 on the
    /// testbed, UDP payload as captured: DUID-LLT of the NIC, IA_NA, ORO 59/60/23/16,
    /// NII (62), architecture 7 (61), vendor class `PXEClient:Arch:00007:UNDI:003000`.
    const OVMF_SOLICIT: &str = "01096839 0001000e 0001000131e516f752540066 0001 0008 0002 0000 0003 000c feff f776 ffffffff ffffffff 0006 0008 003b003c00170010 003e 0003 010300 003d 0002 0007 0010 0026 00000157 0020 5058 45436c69656e743a417263683a30303030373a554e44493a303033303030";

    /// Its bytes.
    pub(crate) fn ovmf_solicit() -> Vec<u8> {
        hex(OVMF_SOLICIT)
    }

    /// Bytes from hex digits (anything else ignored).
    #[allow(clippy::unwrap_used)]
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let digits: String = s.chars().filter(char::is_ascii_hexdigit).collect();
        (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use dhcproto::v6::{DhcpOption, Message};
    use dhcproto::{Decodable, Decoder};

    const OVMF_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x66, 0x00, 0x01]);

    use super::tests_fixture::{hex, ovmf_solicit};

    #[test]
    fn ovmf_pxev6_is_known_by_its_duid_and_by_its_link_local_address() {
        let message = Message::decode(&mut Decoder::new(&ovmf_solicit())).unwrap();
        let duid = message
            .opts()
            .iter()
            .find_map(|o| match o {
                DhcpOption::ClientId(d) => Some(d.clone()),
                _ => None,
            })
            .unwrap();
        let source: Ipv6Addr = "fe80::5054:ff:fe66:1".parse().unwrap();
        assert_eq!(mac_of_duid(&duid), Some(OVMF_MAC));
        assert_eq!(mac_of_link_local(source), Some(OVMF_MAC));
        assert_eq!(
            client_mac(None, Some(&duid), source),
            Some((OVMF_MAC, MacSource::Duid))
        );
    }

    /// What a table row gives [`client_mac`], and what it should answer.
    type Case<'a> = (
        &'a str,
        Option<&'a [u8]>,
        Option<&'a [u8]>,
        Ipv6Addr,
        Option<(MacAddr, MacSource)>,
    );

    #[test]
    fn identification_table() {
        let relay = hex("0001 020000000042");
        let llt = hex("0001 0001 31e516f7 525400660001");
        let ll = hex("0003 0001 525400660002");
        let en = hex("0002 00000157 0102030405");
        let uuid = hex("0004 000102030405060708090a0b0c0d0e0f");
        let infiniband = hex("0003 0020 525400660001");
        let eui: Ipv6Addr = "fe80::5054:ff:fe66:3".parse().unwrap();
        let opaque: Ipv6Addr = "fe80::1c2b:3a4d:5e6f:7081".parse().unwrap();
        let global: Ipv6Addr = "2001:db8::5054:ff:fe66:3".parse().unwrap();
        let mac = |last: u8| MacAddr([0x52, 0x54, 0x00, 0x66, 0x00, last]);
        let cases: [Case<'_>; 9] = [
            (
                "a relay's option wins over all",
                Some(&relay),
                Some(&llt),
                eui,
                Some((MacAddr([0x02, 0, 0, 0, 0, 0x42]), MacSource::RelayLinkLayer)),
            ),
            (
                "DUID-LLT",
                None,
                Some(&llt),
                opaque,
                Some((mac(1), MacSource::Duid)),
            ),
            (
                "DUID-LL",
                None,
                Some(&ll),
                opaque,
                Some((mac(2), MacSource::Duid)),
            ),
            (
                "DUID-EN: the link-local's EUI-64",
                None,
                Some(&en),
                eui,
                Some((mac(3), MacSource::LinkLocalEui64)),
            ),
            (
                "DUID-UUID and an opaque address: unknown",
                None,
                Some(&uuid),
                opaque,
                None,
            ),
            ("not Ethernet", None, Some(&infiniband), opaque, None),
            (
                "a global address is not read",
                None,
                Some(&en),
                global,
                None,
            ),
            ("a truncated DUID", None, Some(&llt[..9]), opaque, None),
            ("nothing at all", None, None, Ipv6Addr::UNSPECIFIED, None),
        ];
        for (name, option, duid, source, want) in cases {
            assert_eq!(client_mac(option, duid, source), want, "{name}");
        }
    }
}
