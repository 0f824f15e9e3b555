//! `dhcp6:` in the configuration file, validated into [`Dhcp6Settings`]: the v6 side of
//! the DHCP settings, beside (not inside) the v4 ones, so that a v4-only configuration reads
//! exactly as before.

use std::net::Ipv6Addr;

use serde::Deserialize;

use crate::dhcp::settings::UnknownMachines;
use crate::setting::InvalidSetting;

/// DHCPv6 mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dhcp6Mode {
    /// No DHCPv6 (the default: v6 is opted into).
    #[default]
    Off,
    /// Addresses (IA_NA) and boot options.
    Full,
    /// Beside the network's own DHCPv6 server: boot options only, to PXE and HTTP boot
    /// clients (Advertises without addresses, which UEFI takes as proxy offers).
    Proxy,
}

/// `dhcp6:` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dhcp6File {
    #[serde(default)]
    mode: Dhcp6Mode,
    /// The bootserver's address on the provisioning link (boot URLs name it).
    server_address: Option<Ipv6Addr>,
    /// The server's DUID, hex (`00030001525400990001`); by default DUID-LL of the
    /// provisioning interface's MAC, read at start.
    server_duid: Option<String>,
    /// Answer a Solicit with Rapid Commit (two messages) when the client asks for it.
    #[serde(default = "yes")]
    rapid_commit: bool,
    #[serde(default)]
    subnets: Vec<Subnet6File>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Subnet6File {
    /// `fd00:99::/64`.
    prefix: String,
    pool: [Ipv6Addr; 2],
    #[serde(default)]
    dns: Vec<Ipv6Addr>,
    preferred_seconds: Option<u32>,
    valid_seconds: Option<u32>,
}

/// One IPv6 prefix the server gives addresses from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet6 {
    /// The prefix's first address.
    pub network: Ipv6Addr,
    /// Its length.
    pub prefix_len: u8,
    /// First and last address of the pool (inclusive).
    pub pool: (Ipv6Addr, Ipv6Addr),
    /// DNS servers (option 23).
    pub dns: Vec<Ipv6Addr>,
    /// Preferred lifetime of an address; T1 and T2 are half and four fifths of it.
    pub preferred_seconds: u32,
    /// Valid lifetime (the lease's length in the book).
    pub valid_seconds: u32,
}

impl Subnet6 {
    /// Whether `ip` lies in the prefix.
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        u128::from(ip) & mask(self.prefix_len) == u128::from(self.network)
    }

    /// Whether `ip` lies in the pool.
    pub fn in_pool(&self, ip: Ipv6Addr) -> bool {
        (self.pool.0..=self.pool.1).contains(&ip)
    }

    /// The pool's size, less one (so that a whole /64 fits).
    pub fn pool_span(&self) -> u128 {
        u128::from(self.pool.1) - u128::from(self.pool.0)
    }
}

fn mask(prefix_len: u8) -> u128 {
    match prefix_len {
        0 => 0,
        n => u128::MAX << (128 - u32::from(n.min(128))),
    }
}

/// The DHCPv6 server's settings, validated.
#[derive(Debug, Clone)]
pub struct Dhcp6Settings {
    /// Off, full or proxy.
    pub mode: Dhcp6Mode,
    /// The bootserver's address on the provisioning link.
    pub server_address: Ipv6Addr,
    /// The server's DUID (option 2): `serverDuid`, else (empty here, filled at start by
    /// [`Dhcp6Settings::with_interface_mac`]) DUID-LL of the provisioning interface's MAC,
    /// so that it stays the same across restarts.
    pub server_duid: Vec<u8>,
    /// Whether Rapid Commit is honoured.
    pub rapid_commit: bool,
    /// Prefixes with pools (full mode).
    pub subnets: Vec<Subnet6>,
    /// What to do with unknown network-boot clients (`dhcp.unknownMachines`, shared with v4).
    pub unknown_machines: UnknownMachines,
}

/// Default preferred lifetime: an hour, as the v4 lease.
pub const DEFAULT_PREFERRED_SECONDS: u32 = 3600;

impl Dhcp6File {
    /// Validates into settings. `unknown_machines` comes from `dhcp:`; `interface` is the
    /// provisioning interface (v6 needs one: the multicast group is joined on it).
    pub fn validate(
        self,
        unknown_machines: UnknownMachines,
        interface: Option<&str>,
    ) -> Result<Dhcp6Settings, InvalidSetting> {
        let invalid = |message: String| InvalidSetting(format!("dhcp6: {message}"));
        let server_address = match (self.mode, self.server_address) {
            (Dhcp6Mode::Off, address) => address.unwrap_or(Ipv6Addr::UNSPECIFIED),
            (_, Some(address)) if is_usable(address) => address,
            (_, Some(address)) => {
                return Err(invalid(format!(
                    "serverAddress {address} is not a unicast address a client can reach"
                )));
            }
            (_, None) => {
                return Err(invalid(
                    "serverAddress is required when dhcp6.mode is full or proxy".to_owned(),
                ));
            }
        };
        if self.mode != Dhcp6Mode::Off && interface.is_none() {
            return Err(invalid(
                "dhcp6 needs `interface`: DHCPv6 clients send to ff02::1:2, a group joined on one link".to_owned(),
            ));
        }
        let server_duid = match self.server_duid.as_deref() {
            Some(text) => parse_duid(text).ok_or_else(|| {
                invalid(format!(
                    "serverDuid {text:?} must be 3 to 130 bytes of hex (such as 00030001525400990001)"
                ))
            })?,
            None => Vec::new(),
        };
        let subnets = self
            .subnets
            .into_iter()
            .map(Subnet6File::validate)
            .collect::<Result<Vec<_>, String>>()
            .map_err(invalid)?;
        if self.mode == Dhcp6Mode::Full && subnets.is_empty() {
            return Err(invalid(
                "dhcp6.mode full needs at least one subnet (prefix and pool)".to_owned(),
            ));
        }
        for (i, a) in subnets.iter().enumerate() {
            if let Some(b) = subnets[i + 1..]
                .iter()
                .find(|b| a.contains(b.network) || b.contains(a.network))
            {
                return Err(invalid(format!(
                    "prefixes {}/{} and {}/{} overlap",
                    a.network, a.prefix_len, b.network, b.prefix_len
                )));
            }
        }
        Ok(Dhcp6Settings {
            mode: self.mode,
            server_address,
            server_duid,
            rapid_commit: self.rapid_commit,
            subnets,
            unknown_machines,
        })
    }
}

impl Dhcp6Settings {
    /// The settings with the server DUID made from the provisioning interface's MAC
    /// (DUID-LL, hardware type Ethernet), unless `serverDuid` set one.
    pub fn with_interface_mac(mut self, mac: [u8; 6]) -> Self {
        if self.server_duid.is_empty() {
            self.server_duid = vec![0, 3, 0, 1];
            self.server_duid.extend_from_slice(&mac);
        }
        self
    }
}

fn parse_duid(text: &str) -> Option<Vec<u8>> {
    let digits: String = text.chars().filter(|c| *c != ':').collect();
    if !digits.len().is_multiple_of(2) || !(6..=2 * 130).contains(&digits.len()) {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok())
        .collect()
}

fn is_usable(address: Ipv6Addr) -> bool {
    !(address.is_unspecified() || address.is_loopback() || address.is_multicast())
}

impl Subnet6File {
    fn validate(self) -> Result<Subnet6, String> {
        let (network, prefix_len) = self
            .prefix
            .split_once('/')
            .and_then(|(n, l)| Some((n.parse::<Ipv6Addr>().ok()?, l.parse::<u8>().ok()?)))
            .ok_or_else(|| {
                format!(
                    "prefix {:?} must be an IPv6 prefix such as fd00:99::/64",
                    self.prefix
                )
            })?;
        if !(8..=126).contains(&prefix_len) {
            return Err(format!(
                "prefix {network}/{prefix_len}: the length must be 8 to 126"
            ));
        }
        if u128::from(network) & !mask(prefix_len) != 0 {
            return Err(format!(
                "prefix {network}/{prefix_len} has host bits set (its network is {})",
                Ipv6Addr::from(u128::from(network) & mask(prefix_len))
            ));
        }
        let subnet = Subnet6 {
            network,
            prefix_len,
            pool: (self.pool[0], self.pool[1]),
            dns: self.dns,
            preferred_seconds: self.preferred_seconds.unwrap_or(DEFAULT_PREFERRED_SECONDS),
            valid_seconds: self.valid_seconds.unwrap_or(2 * DEFAULT_PREFERRED_SECONDS),
        };
        let [first, last] = self.pool;
        if !subnet.contains(first) || !subnet.contains(last) || first > last {
            return Err(format!(
                "pool {first} - {last} must lie in {network}/{prefix_len}, first to last"
            ));
        }
        if subnet.preferred_seconds == 0 || subnet.valid_seconds < subnet.preferred_seconds {
            return Err(format!(
                "{network}/{prefix_len}: preferredSeconds must be above 0 and validSeconds at least as long"
            ));
        }
        Ok(subnet)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(yaml: &str) -> Result<Dhcp6Settings, String> {
        let file: Dhcp6File = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        file.validate(UnknownMachines::Ignore, Some("br0"))
            .map(|s| s.with_interface_mac([0x52, 0x54, 0, 0x99, 0, 1]))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_configuration_validates_into_runtime_types() {
        let settings = parse(
            "mode: full\nserverAddress: fd00:99::1\nsubnets:\n- prefix: fd00:99::/64\n  pool: [fd00:99::100, fd00:99::1ff]\n  dns: [fd00:99::1]\n",
        )
        .unwrap();
        assert_eq!(
            settings.server_duid,
            vec![0, 3, 0, 1, 0x52, 0x54, 0, 0x99, 0, 1]
        );
        let subnet = &settings.subnets[0];
        assert!(subnet.contains("fd00:99::ffff:1".parse().unwrap()));
        assert!(!subnet.contains("fd00:98::1".parse().unwrap()));
        assert!(subnet.in_pool("fd00:99::150".parse().unwrap()));
        assert!(!subnet.in_pool("fd00:99::200".parse().unwrap()));
        assert_eq!(subnet.pool_span(), 0xff);
        assert_eq!(
            (subnet.preferred_seconds, subnet.valid_seconds),
            (3600, 7200)
        );
        assert!(settings.rapid_commit);
        // A configured DUID wins over the interface's.
        let settings =
            parse("mode: proxy\nserverAddress: fd00:99::1\nserverDuid: \"00:02:00:00:01:57:01\"\n")
                .unwrap();
        assert_eq!(settings.server_duid, vec![0, 2, 0, 0, 1, 0x57, 1]);
    }

    #[test]
    fn v6_needs_the_interface_its_multicast_group_is_joined_on() {
        let file: Dhcp6File =
            serde_saphyr::from_str("mode: proxy\nserverAddress: fd00::1\n").unwrap();
        let error = file.validate(UnknownMachines::Ignore, None).unwrap_err();
        assert!(error.to_string().contains("needs `interface`"), "{error}");
    }

    #[test]
    fn off_is_the_default_and_needs_nothing() {
        let settings = parse("{}").unwrap();
        assert_eq!(settings.mode, Dhcp6Mode::Off);
    }

    #[test]
    fn each_mistake_is_named() {
        for (yaml, expected) in [
            ("mode: full\nsubnets: []", "serverAddress is required"),
            (
                "mode: full\nserverAddress: ff02::1:2",
                "not a unicast address",
            ),
            (
                "mode: full\nserverAddress: fd00::1",
                "needs at least one subnet",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::\", pool: [\"fd00::1\", \"fd00::2\"]}]",
                "must be an IPv6 prefix",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::1/64\", pool: [\"fd00::1\", \"fd00::2\"]}]",
                "host bits set",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::/64\", pool: [\"fd00::9\", \"fd00::2\"]}]",
                "first to last",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::/64\", pool: [\"fd00::1\", \"fd01::2\"]}]",
                "must lie in",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::/64\", pool: [\"fd00::1\", \"fd00::2\"], preferredSeconds: 10, validSeconds: 5}]",
                "validSeconds at least",
            ),
            (
                "mode: full\nserverAddress: fd00::1\nsubnets: [{prefix: \"fd00::/64\", pool: [\"fd00::1\", \"fd00::2\"]}, {prefix: \"fd00::/48\", pool: [\"fd00::1\", \"fd00::2\"]}]",
                "overlap",
            ),
            ("mode: both", "unknown variant"),
            (
                "mode: proxy\nserverAddress: fd00::1\nserverDuid: \"0003\"",
                "serverDuid",
            ),
            (
                "mode: proxy\nserverAddress: fd00::1\nserverDuid: \"00030001zz\"",
                "serverDuid",
            ),
            ("mode: full\nserverAdress: fd00::1", "unknown field"),
        ] {
            let error = parse(yaml).unwrap_err();
            assert!(error.contains(expected), "{yaml}: {error}");
        }
    }
}
