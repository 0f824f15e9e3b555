//! TFTP packets (RFC 1350) and option negotiation (RFC 2347 options, RFC 2348 `blksize`,
//! RFC 2349 `timeout` and `tsize`, RFC 7440 `windowsize`): pure functions of bytes, so that
//! the fuzz target and the server run the same code.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// Opcodes.
pub mod opcode {
    /// Read request.
    pub const RRQ: u16 = 1;
    /// Write request.
    pub const WRQ: u16 = 2;
    /// Data.
    pub const DATA: u16 = 3;
    /// Acknowledgement.
    pub const ACK: u16 = 4;
    /// Error.
    pub const ERROR: u16 = 5;
    /// Option acknowledgement.
    pub const OACK: u16 = 6;
}

/// Error codes we send.
pub mod error_code {
    /// Not defined (see the message).
    pub const UNDEFINED: u16 = 0;
    /// File not found.
    pub const NOT_FOUND: u16 = 1;
    /// Access violation.
    pub const ACCESS: u16 = 2;
    /// Illegal TFTP operation.
    pub const ILLEGAL: u16 = 4;
}

/// Why a datagram to port 69 is not a request we serve. Each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than an opcode, or not a request opcode.
    NotRequest,
    /// A write request: the server is read-only.
    Write,
    /// The file name or mode is not NUL-terminated.
    Unterminated,
    /// An empty file name.
    EmptyName,
    /// A mode other than `octet` or `netascii`.
    Mode,
    /// An option name without a value, or more than 16 options.
    Options,
}

impl Malformed {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotRequest => "not_request",
            Self::Write => "write",
            Self::Unterminated => "unterminated",
            Self::EmptyName => "empty_name",
            Self::Mode => "mode",
            Self::Options => "options",
        }
    }

    /// The error code sent back.
    pub fn error_code(self) -> u16 {
        match self {
            Self::Write => error_code::ACCESS,
            _ => error_code::ILLEGAL,
        }
    }
}

/// The options a client asked for, each already within its RFC's range (an option out of
/// range is ignored, as RFC 2347 allows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested {
    /// `blksize` (8–65464).
    pub blksize: Option<u16>,
    /// `timeout` in seconds (1–255).
    pub timeout: Option<u8>,
    /// `tsize` asked (its value in a read request is 0).
    pub tsize: bool,
    /// `windowsize` (1–65535).
    pub windowsize: Option<u16>,
}

/// A read request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// The file name as sent (bytes: any Unix file name).
    pub filename: Vec<u8>,
    /// The options asked for.
    pub options: Requested,
}

impl ReadRequest {
    /// The file name as a path (not yet confined: see [`super::resolve`]).
    pub fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.filename))
    }
}

fn cstr(bytes: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    let end = bytes
        .iter()
        .position(|b| *b == 0)
        .ok_or(Malformed::Unterminated)?;
    Ok((&bytes[..end], &bytes[end + 1..]))
}

fn number<T: std::str::FromStr>(value: &[u8]) -> Option<T> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Parses a datagram sent to the server port.
pub fn parse_request(datagram: &[u8]) -> Result<ReadRequest, Malformed> {
    let (op, rest) = match datagram {
        [a, b, rest @ ..] => (u16::from_be_bytes([*a, *b]), rest),
        _ => return Err(Malformed::NotRequest),
    };
    match op {
        opcode::RRQ => {}
        opcode::WRQ => return Err(Malformed::Write),
        _ => return Err(Malformed::NotRequest),
    }
    let (filename, rest) = cstr(rest)?;
    if filename.is_empty() {
        return Err(Malformed::EmptyName);
    }
    let (mode, mut rest) = cstr(rest)?;
    // Files are sent as they are; netascii is accepted (iPXE binaries are never text).
    if !mode.eq_ignore_ascii_case(b"octet") && !mode.eq_ignore_ascii_case(b"netascii") {
        return Err(Malformed::Mode);
    }
    let mut options = Requested::default();
    let mut count = 0;
    while !rest.is_empty() {
        let (name, after) = cstr(rest)?;
        let (value, after) = cstr(after).map_err(|_| Malformed::Options)?;
        rest = after;
        count += 1;
        if count > 16 {
            return Err(Malformed::Options);
        }
        if name.eq_ignore_ascii_case(b"blksize") {
            options.blksize = number::<u16>(value).filter(|v| (8..=65464).contains(v));
        } else if name.eq_ignore_ascii_case(b"timeout") {
            options.timeout = number::<u8>(value).filter(|v| *v >= 1);
        } else if name.eq_ignore_ascii_case(b"tsize") {
            options.tsize = number::<u64>(value).is_some();
        } else if name.eq_ignore_ascii_case(b"windowsize") {
            options.windowsize = number::<u16>(value).filter(|v| *v >= 1);
        }
        // Unknown options are ignored (RFC 2347).
    }
    Ok(ReadRequest {
        filename: filename.to_vec(),
        options,
    })
}

/// The server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest block: 1468 fits an Ethernet frame with IP and UDP headers.
    pub max_blksize: u16,
    /// Largest window.
    pub max_windowsize: u16,
    /// Retransmission timeout when the client names none.
    pub default_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_blksize: 1468,
            max_windowsize: 16,
            default_timeout: Duration::from_secs(2),
        }
    }
}

/// What the transfer uses; `oack` lists what the OACK carries (only options the client
/// asked for, RFC 2347), empty when no OACK is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Block size.
    pub blksize: u16,
    /// Retransmission timeout.
    pub timeout: Duration,
    /// Blocks sent before an ACK is awaited.
    pub windowsize: u16,
    /// The options acknowledged, as name and value.
    pub oack: Vec<(&'static str, String)>,
}

/// Negotiates the transfer of a file of `size` bytes.
pub fn negotiate(requested: &Requested, limits: &Limits, size: u64) -> Negotiated {
    let mut oack = Vec::new();
    let blksize = match requested.blksize {
        Some(b) => {
            let b = b.min(limits.max_blksize);
            oack.push(("blksize", b.to_string()));
            b
        }
        None => 512,
    };
    let timeout = match requested.timeout {
        Some(t) => {
            oack.push(("timeout", t.to_string()));
            Duration::from_secs(u64::from(t))
        }
        None => limits.default_timeout,
    };
    if requested.tsize {
        oack.push(("tsize", size.to_string()));
    }
    let windowsize = match requested.windowsize {
        Some(w) => {
            let w = w.min(limits.max_windowsize);
            oack.push(("windowsize", w.to_string()));
            w
        }
        None => 1,
    };
    Negotiated {
        blksize,
        timeout,
        windowsize,
        oack,
    }
}

/// An OACK.
pub fn encode_oack(options: &[(&'static str, String)]) -> Vec<u8> {
    let mut out = opcode::OACK.to_be_bytes().to_vec();
    for (name, value) in options {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A DATA packet.
pub fn encode_data(block: u16, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + data.len());
    out.extend_from_slice(&opcode::DATA.to_be_bytes());
    out.extend_from_slice(&block.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// An ERROR packet.
pub fn encode_error(code: u16, message: &str) -> Vec<u8> {
    let mut out = opcode::ERROR.to_be_bytes().to_vec();
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out.push(0);
    out
}

/// What a client sent during a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// ACK of a block.
    Ack(u16),
    /// The client gave up (ERROR).
    Error,
    /// Anything else: ignored.
    Other,
}

/// Parses a packet from the client during a transfer.
pub fn parse_reply(datagram: &[u8]) -> Reply {
    match datagram {
        [0, 4, a, b] => Reply::Ack(u16::from_be_bytes([*a, *b])),
        [0, 5, ..] => Reply::Error,
        _ => Reply::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(parts: &[&str]) -> Vec<u8> {
        let mut out = vec![0, 1];
        for p in parts {
            out.extend_from_slice(p.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn requests_parse_with_their_options() {
        let r = parse_request(&rrq(&[
            "undionly.kpxe",
            "octet",
            "tsize",
            "0",
            "blksize",
            "1468",
            "windowsize",
            "8",
            "x-unknown",
            "1",
        ]))
        .unwrap();
        assert_eq!(r.filename, b"undionly.kpxe");
        assert_eq!(
            r.options,
            Requested {
                blksize: Some(1468),
                timeout: None,
                tsize: true,
                windowsize: Some(8)
            }
        );
        // Out-of-range values are ignored, not refused.
        let r = parse_request(&rrq(&[
            "f",
            "NETASCII",
            "blksize",
            "7",
            "timeout",
            "0",
            "windowsize",
            "x",
        ]))
        .unwrap();
        assert_eq!(r.options, Requested::default());
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let mut unterminated = rrq(&["f"]);
        unterminated.extend_from_slice(b"octet");
        let mut wrq = rrq(&["f", "octet"]);
        wrq[1] = 2;
        let cases: [(&str, Vec<u8>, Malformed); 7] = [
            ("one byte", vec![0], Malformed::NotRequest),
            ("data", vec![0, 3, 0, 1], Malformed::NotRequest),
            ("write", wrq, Malformed::Write),
            ("no mode terminator", unterminated, Malformed::Unterminated),
            ("empty name", rrq(&["", "octet"]), Malformed::EmptyName),
            ("mail mode", rrq(&["f", "mail"]), Malformed::Mode),
            (
                "option without value",
                rrq(&["f", "octet", "blksize"]),
                Malformed::Options,
            ),
        ];
        for (case, bytes, expected) in cases {
            assert_eq!(parse_request(&bytes), Err(expected), "{case}");
        }
    }

    #[test]
    fn negotiation_caps_and_acknowledges_only_what_was_asked() {
        let limits = Limits::default();
        let n = negotiate(&Requested::default(), &limits, 100);
        assert_eq!((n.blksize, n.windowsize, n.oack.len()), (512, 1, 0));
        let asked = Requested {
            blksize: Some(65464),
            timeout: Some(3),
            tsize: true,
            windowsize: Some(64),
        };
        let n = negotiate(&asked, &limits, 12345);
        assert_eq!((n.blksize, n.windowsize), (1468, 16));
        assert_eq!(n.timeout, Duration::from_secs(3));
        assert_eq!(
            encode_oack(&n.oack),
            b"\x00\x06blksize\x001468\x00timeout\x003\x00tsize\x0012345\x00windowsize\x0016\x00"
        );
    }
}
