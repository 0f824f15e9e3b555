//! `machines:` in the configuration file (standalone mode, no cluster), validated into the
//! records [`super::StaticBackend`] serves.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::Deserialize;
use unbounded_api::{Architecture, Firmware};

use super::{BootTarget, MacAddr, MachineRecord};
use crate::dhcp::settings::Subnet;
use crate::setting::InvalidSetting;

/// One entry of `machines:` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFile {
    name: String,
    macs: Vec<String>,
    ipv4: Option<Ipv4Addr>,
    ipv6: Option<std::net::Ipv6Addr>,
    hostname: Option<String>,
    #[serde(default)]
    architecture: Architecture,
    #[serde(default)]
    firmware: Firmware,
    boot: Option<BootFile>,
}

/// What a machine (or discovery's inspection) boots, as written: `{kernel, initrd, args}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootFile {
    /// Kernel path under `http.imagesDir`, or a URL.
    pub kernel: String,
    /// Initrd path or URL.
    pub initrd: String,
    /// Extra kernel arguments.
    #[serde(default)]
    pub args: Vec<String>,
}

/// The machines, each with its MACs parsed; no MAC and no address is two machines', and each
/// address lies in one of `subnets` (when there are any).
pub fn machines(
    machines: Vec<MachineFile>,
    subnets: &[Subnet],
) -> Result<Vec<Arc<MachineRecord>>, InvalidSetting> {
    let mut seen_macs = BTreeMap::new();
    let mut seen_ips = BTreeMap::new();
    let mut seen_ips6 = BTreeMap::new();
    let mut out = Vec::with_capacity(machines.len());
    for m in machines {
        let invalid = |msg: String| InvalidSetting(format!("machine {}: {msg}", m.name));
        if m.macs.is_empty() {
            return Err(invalid("needs at least one MAC address in macs".into()));
        }
        let macs = m
            .macs
            .iter()
            .map(|s| s.parse::<MacAddr>().map_err(|e| invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        for mac in &macs {
            if let Some(other) = seen_macs.insert(*mac, m.name.clone()) {
                return Err(invalid(format!("MAC {mac} is also machine {other}'s")));
            }
        }
        if let Some(ip) = m.ipv4 {
            if let Some(other) = seen_ips.insert(ip, m.name.clone()) {
                return Err(invalid(format!(
                    "address {ip} is also machine {other}'s: never hand one address to two machines"
                )));
            }
            if !subnets.is_empty() && !subnets.iter().any(|s| s.contains(ip)) {
                return Err(invalid(format!("address {ip} is in no dhcp.subnets entry")));
            }
        }
        if let Some(ip) = m.ipv6
            && let Some(other) = seen_ips6.insert(ip, m.name.clone())
        {
            return Err(invalid(format!(
                "address {ip} is also machine {other}'s: never hand one address to two machines"
            )));
        }
        out.push(Arc::new(MachineRecord {
            hostname: m.hostname.or_else(|| Some(m.name.clone())),
            name: m.name,
            macs,
            ipv4: m.ipv4,
            ipv6: m.ipv6,
            architecture: m.architecture,
            firmware: m.firmware,
            boot: m.boot.map(|b| BootTarget {
                kernel_url: b.kernel,
                initrd_url: b.initrd,
                kernel_args: b.args,
                configuration: None,
            }),
            discovery_waiting: false,
            identity: Default::default(),
        }));
    }
    Ok(out)
}
