//! A 48-bit Ethernet MAC address: parsed from a Machine's `macAddresses` (either separator,
//! any case) and printed in the one form Unbounded writes (lower case, colons). Shared by the
//! bootserver's packet path and the PXE provider's provider IDs.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The MAC from the first six bytes of a DHCP `chaddr`, if there are six.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let six: [u8; 6] = bytes.get(..6)?.try_into().ok()?;
        Some(Self(six))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a string is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (expected six hex pairs such as 52:54:00:12:34:56)")]
pub struct ParseMacError(String);

impl FromStr for MacAddr {
    type Err = ParseMacError;

    /// Accepts `aa:bb:cc:dd:ee:ff` and `aa-bb-cc-dd-ee-ff`, any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseMacError(s.chars().take(64).collect());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in &mut out {
            let part = parts.next().ok_or_else(err)?;
            if part.len() != 2 {
                return Err(err());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Self(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_separators_any_case_and_one_printed_form() {
        let mac: MacAddr = "52-54-00-AB-cd-01".parse().unwrap();
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:01");
        assert_eq!(
            MacAddr::from_slice(&[1, 2, 3, 4, 5, 6, 7]),
            Some(MacAddr([1, 2, 3, 4, 5, 6]))
        );
        for bad in [
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:01:02",
            "5:54:00:ab:cd:01",
            "zz:54:00:ab:cd:01",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }
}
