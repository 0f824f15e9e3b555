//! What the bootserver knows about machines, behind one trait with two implementations: the
//! Kubernetes backend (Machines, their resolved configuration versions and Secrets through
//! reflector caches; no API call per packet) and the YAML file backend (standalone mode).
//!
//! DHCP, TFTP and HTTP ask only [`MachineBackend`]; lookups are synchronous and in memory so
//! that the packet path never waits on the network.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use unbounded_api::identity::IdentityMode;
use unbounded_api::{Architecture, Firmware};

pub use unbounded_api::mac::{MacAddr, ParseMacError};

pub mod standalone;

/// What the host OS of a machine boots: the kernel, initrd and arguments of its resolved
/// configuration version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootTarget {
    /// Kernel URL, or a path relative to the bootserver's image directory.
    pub kernel_url: String,
    /// Initrd URL, or a path relative to the bootserver's image directory.
    pub initrd_url: String,
    /// Extra kernel arguments from the configuration.
    pub kernel_args: Vec<String>,
    /// The configuration name and version this came from, when there is one.
    pub configuration: Option<(String, i64)>,
}

/// One machine as the bootserver sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRecord {
    /// Machine name (the Machine object's name, or the file entry's name).
    pub name: String,
    /// The NICs that may network-boot.
    pub macs: Vec<MacAddr>,
    /// Static IPv4 reservation, when the bootserver is the DHCP server.
    pub ipv4: Option<Ipv4Addr>,
    /// Static IPv6 reservation, when the bootserver is the DHCPv6 server.
    pub ipv6: Option<Ipv6Addr>,
    /// Host name handed out by DHCP (the Node name).
    pub hostname: Option<String>,
    /// CPU architecture.
    pub architecture: Architecture,
    /// Firmware type.
    pub firmware: Firmware,
    /// What to boot; `None` when the machine is known but should not boot now (for instance
    /// no configuration is resolved yet): DHCP still gives its address, HTTP serves a script
    /// that says why and exits.
    pub boot: Option<BootTarget>,
    /// Discovered and not claimed yet (label `unbounded-cloud.io/discovery=waiting`): it
    /// boots nothing but the inspection, and gets no configuration and no credentials.
    pub discovery_waiting: bool,
    /// How it proves who it is before it gets credentials (its Machine's and its
    /// configuration version's identity settings).
    pub identity: IdentityPolicy,
}

impl MachineRecord {
    /// The addresses reserved for it, v4 then v6.
    pub fn reservations(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.ipv6.map(IpAddr::V6))
    }
}

/// A machine's identity settings as the bootserver applies them: the Machine's, else its
/// configuration version's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityPolicy {
    /// `None`: the bootserver's `credentials.defaultIdentity`.
    pub mode: Option<IdentityMode>,
    /// The recorded endorsement key's TPM name (lower-case hex).
    pub endorsement_key: Option<String>,
    /// Record the EK of the first attestation when none is recorded.
    pub trust_on_first_use: bool,
    /// Accepted PCR sets of the boot (index to SHA-256 value); empty: PCRs not checked.
    pub measurements: Vec<BTreeMap<u8, Vec<u8>>>,
}

/// What the bootserver knows about machines. Implementations answer from memory.
pub trait MachineBackend: Send + Sync + 'static {
    /// The machine that owns this MAC, if any.
    fn machine_by_mac(&self, mac: &MacAddr) -> Option<Arc<MachineRecord>>;

    /// The machine with this name, if any.
    fn machine_by_name(&self, name: &str) -> Option<Arc<MachineRecord>>;

    /// The machine an address (either family) is reserved for, so that pools never hand
    /// it to others.
    fn reserved_by(&self, ip: IpAddr) -> Option<Arc<MachineRecord>>;

    /// Whether the backend has its data (the Kubernetes caches have synced).
    fn is_ready(&self) -> bool;

    /// Reports, where the operator looks, that something was refused for `machine`
    /// (`reason` is a fixed CamelCase word; `message` names no secret). The Kubernetes
    /// backend publishes a Warning Event on the Machine; the file backend has only the log.
    fn report_refusal(&self, machine: &str, reason: &'static str, message: String) {
        let _ = (machine, reason, message);
    }
}

/// The machines of the configuration file (standalone mode, no cluster).
#[derive(Debug, Default)]
pub struct StaticBackend {
    by_mac: HashMap<MacAddr, Arc<MachineRecord>>,
    by_ip: HashMap<IpAddr, Arc<MachineRecord>>,
    machines: Vec<Arc<MachineRecord>>,
}

impl StaticBackend {
    /// A backend over these machines (validated: no MAC twice).
    pub fn new(machines: Vec<Arc<MachineRecord>>) -> Self {
        let by_mac = machines
            .iter()
            .flat_map(|m| m.macs.iter().map(move |mac| (*mac, m.clone())))
            .collect();
        let by_ip = machines
            .iter()
            .flat_map(|m| m.reservations().map(move |ip| (ip, m.clone())))
            .collect();
        Self {
            by_mac,
            by_ip,
            machines,
        }
    }
}

impl MachineBackend for StaticBackend {
    fn machine_by_mac(&self, mac: &MacAddr) -> Option<Arc<MachineRecord>> {
        self.by_mac.get(mac).cloned()
    }

    fn machine_by_name(&self, name: &str) -> Option<Arc<MachineRecord>> {
        self.machines.iter().find(|m| m.name == name).cloned()
    }

    fn reserved_by(&self, ip: IpAddr) -> Option<Arc<MachineRecord>> {
        self.by_ip.get(&ip).cloned()
    }

    fn is_ready(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_both_separators_and_prints_lower_case() {
        for text in ["52:54:00:AB:cd:01", "52-54-00-ab-CD-01"] {
            let mac: MacAddr = text.parse().unwrap();
            assert_eq!(mac.to_string(), "52:54:00:ab:cd:01");
        }
    }

    #[test]
    fn mac_rejects_malformed_text() {
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:01:02",
            "5:54:00:ab:cd:01",
            "zz:54:00:ab:cd:01",
            "525400abcd01",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn mac_from_slice_needs_six_bytes() {
        assert_eq!(
            MacAddr::from_slice(&[1, 2, 3, 4, 5, 6, 7]),
            Some(MacAddr([1, 2, 3, 4, 5, 6]))
        );
        assert_eq!(MacAddr::from_slice(&[1, 2, 3]), None);
    }
}
