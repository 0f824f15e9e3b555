//! `dhcp:` in the configuration file, validated into [`DhcpSettings`].

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::setting::InvalidSetting;

/// DHCP mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DhcpMode {
    /// Assign addresses and boot files.
    #[default]
    Full,
    /// Beside another DHCP server: answer PXE clients with boot information only.
    Proxy,
    /// No DHCP (firmware configured otherwise).
    Off,
}

/// What to do with a PXE client whose MAC no machine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UnknownMachines {
    /// Do not answer it (the safe default: never boot what nobody declared).
    #[default]
    Ignore,
    /// Boot it into the discovery script (`/discover.ipxe`).
    Discover,
}

/// `dhcp:` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DhcpFile {
    #[serde(default)]
    mode: DhcpMode,
    lease_file: Option<PathBuf>,
    #[serde(default)]
    unknown_machines: UnknownMachines,
    uefi_boot_file: Option<String>,
    #[serde(default)]
    subnets: Vec<SubnetFile>,
    /// Ports, for tests in unprivileged setups; 67 and 4011 by default.
    port: Option<u16>,
    proxy_port: Option<u16>,
    #[serde(default)]
    limits: LimitsFile,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SubnetFile {
    subnet: String,
    pool: [Ipv4Addr; 2],
    gateway: Option<Ipv4Addr>,
    #[serde(default)]
    dns: Vec<Ipv4Addr>,
    domain: Option<String>,
    lease_seconds: Option<u32>,
}

/// One IPv4 subnet the DHCP server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// Network address.
    pub network: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// First and last address of the dynamic pool (inclusive).
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// Default gateway (option 3).
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers (option 6).
    pub dns: Vec<Ipv4Addr>,
    /// Domain name (option 15).
    pub domain: Option<String>,
    /// Lease time in seconds (option 51).
    pub lease_seconds: u32,
    /// With a pair of servers (`ha:`): the whole pool as written, of which `pool` is this
    /// server's half ([`crate::ha::parts`]).
    pub pair_pool: Option<(Ipv4Addr, Ipv4Addr)>,
}

impl Subnet {
    /// The subnet mask.
    pub fn mask(&self) -> Ipv4Addr {
        Ipv4Addr::from(mask_bits(self.prefix))
    }

    /// Whether `ip` lies in the subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask_bits(self.prefix) == u32::from(self.network)
    }

    /// This server's `half` of the pool, for a pair of servers: `pool` becomes the half,
    /// `pair_pool` keeps the whole.
    pub fn halved(self, half: crate::ha::parts::Half) -> Result<Self, InvalidSetting> {
        let whole = self.pool;
        // Both servers of the pair must have a half, whichever this one is.
        let partners = match half {
            crate::ha::parts::Half::Lower => crate::ha::parts::Half::Upper,
            crate::ha::parts::Half::Upper => crate::ha::parts::Half::Lower,
        };
        let own = crate::ha::parts::half_of_v4(whole, half)
            .filter(|_| crate::ha::parts::half_of_v4(whole, partners).is_some())
            .ok_or_else(|| {
            InvalidSetting(format!(
                "dhcp.subnets {}/{}: pool {}–{} has one address, which a pair of servers cannot share (each owns half of every pool)",
                self.network, self.prefix, whole.0, whole.1
            ))
        })?;
        Ok(Self {
            pool: own,
            pair_pool: Some(whole),
            ..self
        })
    }

    /// Whether `ip` lies in the partner's half of the pair's pool (never without a pair).
    pub fn in_partners_part(&self, ip: Ipv4Addr) -> bool {
        self.pair_pool.is_some_and(|(first, last)| {
            (u32::from(first)..=u32::from(last)).contains(&u32::from(ip)) && !self.in_pool(ip)
        })
    }

    /// Whether `ip` lies in the dynamic pool.
    pub fn in_pool(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.pool.0)..=u32::from(self.pool.1)).contains(&u32::from(ip))
    }
}

fn mask_bits(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

/// The DHCP server's settings, validated.
#[derive(Debug, Clone)]
pub struct DhcpSettings {
    /// Full, proxy or off.
    pub mode: DhcpMode,
    /// Subnets with pools (full mode).
    pub subnets: Vec<Subnet>,
    /// Pool addresses per relay and per relay port (`dhcp.limits`).
    pub limits: SourceLimits,
    /// Where leases are kept (full mode).
    pub lease_file: PathBuf,
    /// What to do with unknown PXE clients.
    pub unknown_machines: UnknownMachines,
    /// The x86-64 UEFI boot file: `ipxe.efi` or `snponly.efi`.
    pub uefi_boot_file: String,
    /// DHCP port (67).
    pub port: u16,
    /// ProxyDHCP port (4011).
    pub proxy_port: u16,
}

impl DhcpSettings {
    /// For one server of a pair: each subnet's pool cut to its `half`.
    pub fn for_pair(self, half: crate::ha::parts::Half) -> Result<Self, InvalidSetting> {
        let subnets = self
            .subnets
            .into_iter()
            .map(|s| s.halved(half))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { subnets, ..self })
    }
}

impl TryFrom<&DhcpFile> for DhcpSettings {
    type Error = InvalidSetting;

    fn try_from(file: &DhcpFile) -> Result<Self, InvalidSetting> {
        let subnets = file
            .subnets
            .iter()
            .map(subnet)
            .collect::<Result<Vec<_>, _>>()?;
        if file.mode == DhcpMode::Full && subnets.is_empty() {
            return Err(InvalidSetting(
                "dhcp.mode full needs at least one entry in dhcp.subnets".into(),
            ));
        }
        let uefi_boot_file = file
            .uefi_boot_file
            .clone()
            .unwrap_or_else(|| "snponly.efi".into());
        if !["ipxe.efi", "snponly.efi"].contains(&uefi_boot_file.as_str()) {
            return Err(InvalidSetting(format!(
                "dhcp.uefiBootFile must be ipxe.efi or snponly.efi, not {uefi_boot_file:?}"
            )));
        }
        Ok(Self {
            mode: file.mode,
            subnets,
            limits: SourceLimits::try_from(&file.limits)
                .map_err(|e| InvalidSetting(e.to_string()))?,
            lease_file: file
                .lease_file
                .clone()
                .unwrap_or_else(|| PathBuf::from("/var/lib/unbounded/leases.log")),
            unknown_machines: file.unknown_machines,
            uefi_boot_file,
            port: file.port.unwrap_or(67),
            proxy_port: file.proxy_port.unwrap_or(4011),
        })
    }
}

fn subnet(s: &SubnetFile) -> Result<Subnet, InvalidSetting> {
    let invalid = |m: String| InvalidSetting(format!("dhcp.subnets {}: {m}", s.subnet));
    let (network, prefix) = s
        .subnet
        .split_once('/')
        .ok_or_else(|| invalid("expected address/prefix such as 10.99.0.0/24".into()))?;
    let network: Ipv4Addr = network
        .parse()
        .map_err(|_| invalid("not an IPv4 network".into()))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| invalid("prefix length must be between 8 and 30".into()))?;
    let subnet = Subnet {
        network,
        prefix,
        pool: (s.pool[0], s.pool[1]),
        gateway: s.gateway,
        dns: s.dns.clone(),
        domain: s.domain.clone(),
        lease_seconds: s.lease_seconds.unwrap_or(3600).max(60),
        pair_pool: None,
    };
    if u32::from(network) & !mask_bits(prefix) != 0 {
        return Err(invalid("host bits are set in the network address".into()));
    }
    if !subnet.contains(s.pool[0]) || !subnet.contains(s.pool[1]) || s.pool[0] > s.pool[1] {
        return Err(invalid(format!(
            "pool {}–{} must lie inside the subnet, first address first",
            s.pool[0], s.pool[1]
        )));
    }
    Ok(subnet)
}

/// `dhcp.limits` in the configuration file.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsFile {
    per_relay: Option<u32>,
    per_circuit: Option<u32>,
}

/// The limits, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLimits {
    /// Clients holding a pool address per relay (`giaddr`); `None`: no limit.
    pub per_relay: Option<u32>,
    /// Clients holding a pool address per relay port (circuit ID); `None`: no limit.
    pub per_circuit: Option<u32>,
}

impl SourceLimits {
    /// A port rarely has more than a server's few interfaces behind it.
    pub const DEFAULT_PER_CIRCUIT: u32 = 16;
}

impl Default for SourceLimits {
    fn default() -> Self {
        Self {
            per_relay: None,
            per_circuit: Some(Self::DEFAULT_PER_CIRCUIT),
        }
    }
}

/// A limit that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dhcp.limits.{field} must be at least 1 (leave it out for no limit), not 0")]
pub struct LimitsError {
    field: &'static str,
}

impl TryFrom<&LimitsFile> for SourceLimits {
    type Error = LimitsError;

    fn try_from(file: &LimitsFile) -> Result<Self, Self::Error> {
        let nonzero = |value: Option<u32>, field| match value {
            Some(0) => Err(LimitsError { field }),
            other => Ok(other),
        };
        Ok(Self {
            per_relay: nonzero(file.per_relay, "perRelay")?,
            per_circuit: match file.per_circuit {
                None => Some(Self::DEFAULT_PER_CIRCUIT),
                value => nonzero(value, "perCircuit")?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_table() {
        let file = |relay, circuit| LimitsFile {
            per_relay: relay,
            per_circuit: circuit,
        };
        assert_eq!(
            SourceLimits::try_from(&file(None, None)),
            Ok(SourceLimits::default())
        );
        assert_eq!(
            SourceLimits::try_from(&file(Some(50), Some(4))),
            Ok(SourceLimits {
                per_relay: Some(50),
                per_circuit: Some(4)
            })
        );
        let error = SourceLimits::try_from(&file(Some(0), None)).unwrap_err();
        assert!(
            error.to_string().contains("perRelay must be at least 1"),
            "{error}"
        );
    }
}
