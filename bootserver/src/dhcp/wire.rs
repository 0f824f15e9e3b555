//! Validation and decoding of DHCP requests: the bytes a client sent, checked field by field
//! before anything indexes by them, into one [`Request`] that the decision reads.
//!
//! Decoded by hand rather than with `dhcproto`'s `Message::decode`: see the crate
//! documentation of [`crate::dhcp`] for what that library does with hostile input.
//! Everything here is a pure function of the datagram, so that the fuzz target and the
//! server run exactly this code.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use dhcproto::v4::MessageType;

use crate::backend::MacAddr;
use crate::boot::ClientHints;
use crate::leases::ClientKey;

/// Length of the fixed BOOTP header (up to the options), RFC 2131 §2.
pub const HEADER_LEN: usize = 236;
/// The DHCP magic cookie.
pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// Option codes this module reads.
pub mod code {
    /// Pad.
    pub const PAD: u8 = 0;
    /// Requested IP address.
    pub const REQUESTED_IP: u8 = 50;
    /// Option overload (sname/file carry options).
    pub const OVERLOAD: u8 = 52;
    /// DHCP message type.
    pub const MESSAGE_TYPE: u8 = 53;
    /// Server identifier.
    pub const SERVER_ID: u8 = 54;
    /// Maximum DHCP message size.
    pub const MAX_MESSAGE_SIZE: u8 = 57;
    /// Vendor class identifier.
    pub const VENDOR_CLASS: u8 = 60;
    /// Client identifier (RFC 2132 §9.14, echoed per RFC 6842).
    pub const CLIENT_ID: u8 = 61;
    /// User class (iPXE says `iPXE`).
    pub const USER_CLASS: u8 = 77;
    /// Relay agent information (RFC 3046).
    pub const RELAY_AGENT_INFO: u8 = 82;
    /// Client system architecture (RFC 4578).
    pub const CLIENT_ARCH: u8 = 93;
    /// Subnet selection (RFC 3011).
    pub const SUBNET_SELECTION: u8 = 118;
    /// iPXE's encapsulated options.
    pub const IPXE: u8 = 175;
    /// End.
    pub const END: u8 = 255;
    /// Link selection, a sub-option of option 82 (RFC 3527).
    pub const LINK_SELECTION: u8 = 5;
    /// Circuit ID, a sub-option of option 82 (RFC 3046 §2.0): the relay's port.
    pub const CIRCUIT_ID: u8 = 1;
}

/// Why a datagram is not a request we can read. Each variant is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Malformed {
    /// Shorter than the BOOTP header and the magic cookie.
    TooShort,
    /// `op` is not BOOTREQUEST.
    NotRequest,
    /// `htype` is not Ethernet (1).
    HardwareType,
    /// `hlen` is not 6 (for Ethernet).
    HardwareLength,
    /// The magic cookie is wrong.
    MagicCookie,
    /// An option runs past the end of its area.
    OptionOverrun,
    /// An option has a length its type does not allow.
    OptionLength,
    /// Option 52 has a value other than 1, 2 or 3.
    Overload,
    /// No option 53.
    NoMessageType,
    /// Option 82's sub-options run past its end, or link selection is not 4 bytes.
    RelayAgentInfo,
    /// `giaddr` is not a unicast address.
    Giaddr,
    /// `ciaddr` is not a unicast address (or zero).
    Ciaddr,
    /// The source was not IPv4 (never a DHCPv4 client).
    NotIpv4,
}

impl Malformed {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooShort => "malformed_too_short",
            Self::NotRequest => "malformed_not_request",
            Self::HardwareType => "malformed_htype",
            Self::HardwareLength => "malformed_hlen",
            Self::MagicCookie => "malformed_magic_cookie",
            Self::OptionOverrun => "malformed_option_overrun",
            Self::OptionLength => "malformed_option_length",
            Self::Overload => "malformed_option_overload",
            Self::NoMessageType => "malformed_no_message_type",
            Self::RelayAgentInfo => "malformed_relay_agent_info",
            Self::Giaddr => "malformed_giaddr",
            Self::Ciaddr => "malformed_ciaddr",
            Self::NotIpv4 => "malformed_not_ipv4",
        }
    }
}

/// Option 82 as the relay sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayAgentInfo {
    /// The option's value, exactly as received: echoed unchanged (RFC 3046 §2.2).
    pub raw: Vec<u8>,
    /// Sub-option 5, link selection (RFC 3527): the subnet the client is on.
    pub link_selection: Option<Ipv4Addr>,
    /// Sub-option 1, circuit ID (RFC 3046): the port the client is behind, as the relay
    /// names it (opaque bytes).
    pub circuit_id: Option<Vec<u8>>,
}

/// A validated DHCP request: only what the decision reads, each field checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Transaction ID.
    pub xid: u32,
    /// `secs`.
    pub secs: u16,
    /// `flags` (bit 15: reply by broadcast).
    pub flags: u16,
    /// Relay hops.
    pub hops: u8,
    /// `ciaddr`: the client's address (RENEWING, REBINDING, INFORM), or unspecified.
    pub ciaddr: Ipv4Addr,
    /// `giaddr`: the relay, or unspecified.
    pub giaddr: Ipv4Addr,
    /// The client's Ethernet address (`chaddr`, `hlen` 6).
    pub mac: MacAddr,
    /// Option 53. Values outside 1–18 are kept as `Unknown`: the decision drops them.
    pub message_type: MessageType,
    /// Option 50.
    pub requested_ip: Option<Ipv4Addr>,
    /// Option 54.
    pub server_id: Option<Ipv4Addr>,
    /// Option 61, raw.
    pub client_id: Option<Vec<u8>>,
    /// Option 118.
    pub subnet_selection: Option<Ipv4Addr>,
    /// Option 82.
    pub relay_agent_info: Option<RelayAgentInfo>,
    /// Option 57 (at least 576).
    pub max_message_size: Option<u16>,
    /// Options 60, 77, 93 and 175: what kind of boot client this is.
    pub hints: ClientHints,
}

impl Request {
    /// Who the lease belongs to (option 61, else `chaddr`).
    pub fn client_key(&self) -> ClientKey {
        ClientKey::of(self.client_id.as_deref(), self.mac)
    }

    /// Whether a relay forwarded it.
    pub fn relayed(&self) -> bool {
        !self.giaddr.is_unspecified()
    }

    /// Whether the client asked for broadcast replies.
    pub fn broadcast(&self) -> bool {
        self.flags & 0x8000 != 0
    }
}

/// Options by code, each the concatenation of all its instances (RFC 3396).
type Options = BTreeMap<u8, Vec<u8>>;

/// Walks one option area, adding to `options`.
fn walk(area: &[u8], options: &mut Options) -> Result<(), Malformed> {
    let mut i = 0;
    while let Some(&code) = area.get(i) {
        match code {
            code::PAD => i += 1,
            code::END => return Ok(()),
            _ => {
                let len = usize::from(*area.get(i + 1).ok_or(Malformed::OptionOverrun)?);
                let value = area
                    .get(i + 2..i + 2 + len)
                    .ok_or(Malformed::OptionOverrun)?;
                options.entry(code).or_default().extend_from_slice(value);
                i += 2 + len;
            }
        }
    }
    // No End option: tolerated when the options fill the area exactly (some firmware).
    Ok(())
}

fn ipv4(value: &[u8]) -> Result<Ipv4Addr, Malformed> {
    let four: [u8; 4] = value.try_into().map_err(|_| Malformed::OptionLength)?;
    Ok(Ipv4Addr::from(four))
}

/// A unicast address (or zero where zero is allowed).
fn unicast(ip: Ipv4Addr) -> bool {
    !(ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() || ip.octets()[0] == 0)
}

fn relay_agent_info(raw: &[u8]) -> Result<RelayAgentInfo, Malformed> {
    let mut link_selection = None;
    let mut circuit_id = None;
    let mut i = 0;
    while i < raw.len() {
        let sub = raw[i];
        let len = usize::from(*raw.get(i + 1).ok_or(Malformed::RelayAgentInfo)?);
        let value = raw
            .get(i + 2..i + 2 + len)
            .ok_or(Malformed::RelayAgentInfo)?;
        if sub == code::LINK_SELECTION {
            let four: [u8; 4] = value.try_into().map_err(|_| Malformed::RelayAgentInfo)?;
            link_selection = Some(Ipv4Addr::from(four));
        }
        if sub == code::CIRCUIT_ID && !value.is_empty() {
            circuit_id = Some(value.to_vec());
        }
        i += 2 + len;
    }
    Ok(RelayAgentInfo {
        raw: raw.to_vec(),
        link_selection,
        circuit_id,
    })
}

/// Validates and decodes one datagram.
pub fn parse(datagram: &[u8]) -> Result<Request, Malformed> {
    let header = datagram.get(..HEADER_LEN).ok_or(Malformed::TooShort)?;
    let cookie = datagram
        .get(HEADER_LEN..HEADER_LEN + 4)
        .ok_or(Malformed::TooShort)?;
    let field4 =
        |at: usize| -> [u8; 4] { [header[at], header[at + 1], header[at + 2], header[at + 3]] };
    if header[0] != 1 {
        return Err(Malformed::NotRequest);
    }
    if header[1] != 1 {
        return Err(Malformed::HardwareType);
    }
    if header[2] != 6 {
        return Err(Malformed::HardwareLength);
    }
    if cookie != MAGIC_COOKIE {
        return Err(Malformed::MagicCookie);
    }
    let ciaddr = Ipv4Addr::from(field4(12));
    let giaddr = Ipv4Addr::from(field4(24));
    if !giaddr.is_unspecified() && !unicast(giaddr) {
        return Err(Malformed::Giaddr);
    }
    if !ciaddr.is_unspecified() && !unicast(ciaddr) {
        return Err(Malformed::Ciaddr);
    }
    let mac = MacAddr([
        header[28], header[29], header[30], header[31], header[32], header[33],
    ]);

    let mut options = Options::new();
    walk(&datagram[HEADER_LEN + 4..], &mut options)?;
    if let Some(overload) = options.get(&code::OVERLOAD) {
        // RFC 2131 §4.1: the file field is read first, then sname.
        let (file, sname) = match overload.as_slice() {
            [1] => (true, false),
            [2] => (false, true),
            [3] => (true, true),
            _ => return Err(Malformed::Overload),
        };
        if file {
            walk(&header[108..236], &mut options)?;
        }
        if sname {
            walk(&header[44..108], &mut options)?;
        }
    }

    let message_type = match options.get(&code::MESSAGE_TYPE).map(Vec::as_slice) {
        Some(&[t]) => MessageType::from(t),
        Some(_) => return Err(Malformed::OptionLength),
        None => return Err(Malformed::NoMessageType),
    };
    let address = |code: u8| options.get(&code).map(|v| ipv4(v)).transpose();
    let requested_ip = address(code::REQUESTED_IP)?;
    let server_id = address(code::SERVER_ID)?;
    let subnet_selection = address(code::SUBNET_SELECTION)?;
    let client_id = match options.get(&code::CLIENT_ID) {
        Some(id) if id.len() < 2 => return Err(Malformed::OptionLength),
        other => other.cloned(),
    };
    let max_message_size = match options.get(&code::MAX_MESSAGE_SIZE).map(Vec::as_slice) {
        None => None,
        Some(&[a, b]) if u16::from_be_bytes([a, b]) >= 576 => Some(u16::from_be_bytes([a, b])),
        Some(_) => return Err(Malformed::OptionLength),
    };
    let architecture = match options.get(&code::CLIENT_ARCH).map(Vec::as_slice) {
        None => None,
        // RFC 4578: a list of 16-bit types; the first is the one booting.
        Some(list @ [a, b, ..]) if list.len() % 2 == 0 => Some(u16::from_be_bytes([*a, *b])),
        Some(_) => return Err(Malformed::OptionLength),
    };
    let non_empty = |code: u8| -> Result<Option<Vec<u8>>, Malformed> {
        match options.get(&code) {
            Some(v) if v.is_empty() => Err(Malformed::OptionLength),
            other => Ok(other.cloned()),
        }
    };
    let relay_agent_info = options
        .get(&code::RELAY_AGENT_INFO)
        .map(|raw| relay_agent_info(raw))
        .transpose()?;
    Ok(Request {
        xid: u32::from_be_bytes(field4(4)),
        secs: u16::from_be_bytes([header[8], header[9]]),
        flags: u16::from_be_bytes([header[10], header[11]]),
        hops: header[3],
        ciaddr,
        giaddr,
        mac,
        message_type,
        requested_ip,
        server_id,
        client_id,
        subnet_selection,
        relay_agent_info,
        max_message_size,
        hints: ClientHints {
            architecture,
            vendor_class: non_empty(code::VENDOR_CLASS)?,
            user_class: non_empty(code::USER_CLASS)?,
            ipxe_options: options.contains_key(&code::IPXE),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DISCOVER from 52:54:00:00:00:01 with these options after the cookie.
    pub(crate) fn packet(options: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[..4].copy_from_slice(&[1, 1, 6, 0]);
        p[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        p[28..34].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        p.extend_from_slice(&MAGIC_COOKIE);
        p.extend_from_slice(options);
        p
    }

    #[test]
    fn a_discover_decodes() {
        let r = parse(&packet(&[
            53, 1, 1, 61, 7, 1, 0x52, 0x54, 0, 0, 0, 1, 93, 2, 0, 7, 255,
        ]))
        .unwrap();
        assert_eq!(r.message_type, MessageType::Discover);
        assert_eq!(r.mac, MacAddr([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(r.xid, 0xdead_beef);
        assert_eq!(r.hints.architecture, Some(7));
        assert_eq!(r.client_key(), ClientKey::Hardware(r.mac));
    }

    #[test]
    fn hostile_headers_are_refused_before_anything_reads_them() {
        let mut hlen = packet(&[53, 1, 1, 255]);
        hlen[2] = 200; // what stopped the server through dhcproto's chaddr()
        let mut htype = packet(&[53, 1, 1, 255]);
        htype[1] = 32;
        let mut op = packet(&[53, 1, 1, 255]);
        op[0] = 2;
        let mut giaddr = packet(&[53, 1, 1, 255]);
        giaddr[24..28].copy_from_slice(&[255, 255, 255, 255]);
        let mut ciaddr = packet(&[53, 1, 1, 255]);
        ciaddr[12..16].copy_from_slice(&[224, 0, 0, 1]);
        let mut cookie = packet(&[53, 1, 1, 255]);
        cookie[HEADER_LEN] = 0;
        let cases = [
            ("empty", vec![], Malformed::TooShort),
            (
                "header only",
                packet(&[])[..HEADER_LEN].to_vec(),
                Malformed::TooShort,
            ),
            ("hlen 200", hlen, Malformed::HardwareLength),
            ("htype infiniband", htype, Malformed::HardwareType),
            ("a reply", op, Malformed::NotRequest),
            ("broadcast giaddr", giaddr, Malformed::Giaddr),
            ("multicast ciaddr", ciaddr, Malformed::Ciaddr),
            ("bad cookie", cookie, Malformed::MagicCookie),
        ];
        for (case, bytes, expected) in cases {
            assert_eq!(parse(&bytes), Err(expected), "{case}");
        }
    }

    #[test]
    fn option_lengths_are_checked() {
        let cases: [(&str, &[u8], Malformed); 12] = [
            ("no options", &[255], Malformed::NoMessageType),
            ("type of length 0", &[53, 0, 255], Malformed::OptionLength),
            (
                "type of length 2",
                &[53, 2, 1, 1, 255],
                Malformed::OptionLength,
            ),
            ("overrun", &[53, 1, 1, 60, 200, 1], Malformed::OptionOverrun),
            (
                "code without length",
                &[53, 1, 1, 60],
                Malformed::OptionOverrun,
            ),
            (
                "requested ip of 3",
                &[53, 1, 3, 50, 3, 1, 2, 3, 255],
                Malformed::OptionLength,
            ),
            (
                "client id of 1",
                &[53, 1, 1, 61, 1, 1, 255],
                Malformed::OptionLength,
            ),
            (
                "arch of 3",
                &[53, 1, 1, 93, 3, 0, 0, 7, 255],
                Malformed::OptionLength,
            ),
            (
                "max size 100",
                &[53, 1, 1, 57, 2, 0, 100, 255],
                Malformed::OptionLength,
            ),
            (
                "overload 4",
                &[53, 1, 1, 52, 1, 4, 255],
                Malformed::Overload,
            ),
            (
                "relay sub-option overrun",
                &[53, 1, 1, 82, 3, 1, 5, 0, 255],
                Malformed::RelayAgentInfo,
            ),
            (
                "link selection of 2",
                &[53, 1, 1, 82, 4, 5, 2, 10, 0, 255],
                Malformed::RelayAgentInfo,
            ),
        ];
        for (case, options, expected) in cases {
            assert_eq!(parse(&packet(options)), Err(expected), "{case}");
        }
    }

    #[test]
    fn relay_information_is_kept_raw_and_link_selection_read() {
        let info = [1, 3, b'e', b't', b'h', 5, 4, 10, 98, 0, 0, 9, 0];
        let mut options = vec![53, 1, 1, 82, info.len() as u8];
        options.extend_from_slice(&info);
        options.extend_from_slice(&[118, 4, 10, 97, 0, 0, 255]);
        let r = parse(&packet(&options)).unwrap();
        let relay = r.relay_agent_info.unwrap();
        assert_eq!(relay.raw, info);
        assert_eq!(relay.link_selection, Some(Ipv4Addr::new(10, 98, 0, 0)));
        assert_eq!(r.subnet_selection, Some(Ipv4Addr::new(10, 97, 0, 0)));
    }

    #[test]
    fn split_options_are_joined_and_overload_is_read() {
        // Option 60 in two pieces (RFC 3396), option 53 in the file field (option 52 = 1).
        let mut p = packet(&[
            60, 3, b'P', b'X', b'E', 60, 6, b'C', b'l', b'i', b'e', b'n', b't', 52, 1, 1, 255,
        ]);
        p[108..111].copy_from_slice(&[53, 1, 3]);
        p[111] = 255;
        let r = parse(&p).unwrap();
        assert_eq!(r.message_type, MessageType::Request);
        assert_eq!(r.hints.vendor_class.as_deref(), Some(&b"PXEClient"[..]));
    }
}
