//! Well-known labels derived from an inventory, so that label selectors (a MachinePool's
//! `inventorySelector`, a MachineConfiguration's `machineSelector`) can choose by hardware, and
//! [`HardwareRequirements`]: the numeric form (at least N CPUs, at least M GiB) a label
//! selector cannot say, checked against the same labels.
//!
//! | label | value |
//! |---|---|
//! | `hardware.unbounded-cloud.io/arch` | `amd64` or `arm64` (Kubernetes' names, as `kubernetes.io/arch`) |
//! | `hardware.unbounded-cloud.io/cpus` | logical CPUs |
//! | `hardware.unbounded-cloud.io/memory-gib` | installed memory in GiB, rounded to the nearest |
//! | `hardware.unbounded-cloud.io/disks` | number of disks |
//! | `hardware.unbounded-cloud.io/accelerator` | vendor of the first accelerator: `nvidia`, `amd`, `intel`, `habana` or `pci-<vendor id>` |
//! | `hardware.unbounded-cloud.io/nic-speed` | fastest link that is up, in Mbit/s |
//! | `hardware.unbounded-cloud.io/vendor` | system vendor (DMI), made a label value |
//! | `hardware.unbounded-cloud.io/product` | product name (DMI), made a label value |
//! | `hardware.unbounded-cloud.io/disputed` | `"true"` while the in-band report contradicts the BMC |
//!
//! A label is absent when the inventory does not tell (no accelerator: no `accelerator`).

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::MachineInventorySpec;

/// The prefix of every hardware label.
pub const PREFIX: &str = "hardware.unbounded-cloud.io/";
/// Architecture label.
pub const ARCH: &str = "hardware.unbounded-cloud.io/arch";
/// Logical CPUs label.
pub const CPUS: &str = "hardware.unbounded-cloud.io/cpus";
/// Memory (GiB) label.
pub const MEMORY_GIB: &str = "hardware.unbounded-cloud.io/memory-gib";
/// Disk count label.
pub const DISKS: &str = "hardware.unbounded-cloud.io/disks";
/// Accelerator vendor label.
pub const ACCELERATOR: &str = "hardware.unbounded-cloud.io/accelerator";
/// Fastest NIC (Mbit/s) label.
pub const NIC_SPEED: &str = "hardware.unbounded-cloud.io/nic-speed";
/// System vendor label.
pub const VENDOR: &str = "hardware.unbounded-cloud.io/vendor";
/// Product label.
pub const PRODUCT: &str = "hardware.unbounded-cloud.io/product";
/// The switch the machine's network-boot interface is cabled to, by its LLDP system name
/// (else its chassis ID): the failure domain a Cluster API Machine on it reports when the
/// Machine has no `topology.kubernetes.io/zone` label.
pub const SWITCH: &str = "hardware.unbounded-cloud.io/switch";
/// `"true"` while the in-band report contradicts the BMC ([`super::disputes`]): no hardware
/// requirement admits the Machine and no pool claims it.
pub const DISPUTED: &str = "hardware.unbounded-cloud.io/disputed";

const GIB: i64 = 1 << 30;

/// The hardware labels of an inventory.
pub fn hardware_labels(spec: &MachineInventorySpec) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value.and_then(|v| label_value(&v)) {
            labels.insert(key.to_owned(), value);
        }
    };
    if let Some(cpu) = &spec.cpu {
        put(ARCH, Some(kubernetes_arch(&cpu.architecture)));
        put(CPUS, Some(cpu.threads.to_string()));
    }
    if let Some(memory) = &spec.memory {
        // Nearest, not floor: installed memory read from memory blocks can miss a hole of a
        // few hundred MiB, and 63.8 GiB is a 64 GiB machine.
        put(
            MEMORY_GIB,
            Some(((memory.total_bytes + GIB / 2) / GIB).to_string()),
        );
    }
    if let Some(disks) = &spec.disks {
        put(DISKS, Some(disks.devices.len().to_string()));
    }
    if let Some(pci) = &spec.pci {
        put(
            ACCELERATOR,
            pci.devices
                .iter()
                .find(|d| d.accelerator)
                .map(|d| accelerator_vendor(&d.vendor_id)),
        );
    }
    if let Some(nics) = &spec.nics {
        put(
            NIC_SPEED,
            nics.interfaces
                .iter()
                .filter(|n| n.link)
                .filter_map(|n| n.speed_mbps)
                .filter(|s| *s > 0)
                .max()
                .map(|s| s.to_string()),
        );
        // The boot interface's neighbour, else the first linked interface's.
        let neighbour = nics
            .interfaces
            .iter()
            .filter(|n| n.pxe_booted)
            .chain(nics.interfaces.iter().filter(|n| n.link))
            .find_map(|n| n.lldp.as_ref());
        put(
            SWITCH,
            neighbour.map(|l| {
                l.system_name
                    .clone()
                    .unwrap_or_else(|| l.chassis_id.clone())
            }),
        );
    }
    if let Some(system) = &spec.system {
        put(VENDOR, system.vendor.clone());
        put(PRODUCT, system.product.clone());
    }
    if !spec.disagreements.is_empty() {
        put(DISPUTED, Some("true".into()));
    }
    labels
}

/// Kubernetes' name for a kernel architecture name (`uname -m`).
fn kubernetes_arch(kernel: &str) -> String {
    match kernel {
        "x86_64" | "amd64" => "amd64".into(),
        "aarch64" | "arm64" => "arm64".into(),
        other => other.to_ascii_lowercase(),
    }
}

fn accelerator_vendor(vendor_id: &str) -> String {
    match vendor_id.to_ascii_lowercase().as_str() {
        "10de" => "nvidia".into(),
        "1002" => "amd".into(),
        "8086" => "intel".into(),
        "1da3" => "habana".into(),
        other => format!("pci-{other}"),
    }
}

/// A free-text value made a label value: at most 63 characters of `[A-Za-z0-9._-]`, starting
/// and ending alphanumeric; every run of other characters becomes one `-`. `None` when nothing
/// is left (or the firmware's placeholder, such as `To Be Filled By O.E.M.`).
pub fn label_value(raw: &str) -> Option<String> {
    let trimmed = raw.trim();
    if is_placeholder(trimmed) {
        return None;
    }
    let mut value = String::with_capacity(trimmed.len().min(63));
    let mut gap = false;
    for c in trimmed.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
            if gap && !value.is_empty() {
                value.push('-');
            }
            gap = false;
            value.push(c);
        } else {
            gap = true;
        }
    }
    let mut value: String = value.chars().take(63).collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    let value = value
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned();
    (!value.is_empty()).then_some(value)
}

/// What firmware writes into a DMI field nobody filled.
fn is_placeholder(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    [
        "to be filled by o.e.m.",
        "default string",
        "system product name",
        "system manufacturer",
        "not specified",
        "none",
        "n/a",
        "0123456789",
    ]
    .contains(&lower.as_str())
}

/// Numeric hardware requirements (each optional, all must hold), for what a label selector
/// cannot say ("at least"). Checked against a Machine's hardware labels by [`Self::admits`]; a
/// Machine without the label a requirement needs does not qualify.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.minCPUs) || has(self.minMemoryGiB) || has(self.minDisks) || has(self.minNICSpeedMbps)").message("hardwareRequirements needs at least one of minCPUs, minMemoryGiB, minDisks, minNICSpeedMbps"))]
pub struct HardwareRequirements {
    /// At least this many logical CPUs.
    #[serde(default, rename = "minCPUs", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 16384").message("minCPUs must be 1 to 16384"))]
    pub min_cpus: Option<i32>,
    /// At least this much memory, in GiB.
    #[serde(
        default,
        rename = "minMemoryGiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65536").message("minMemoryGiB must be 1 to 65536"))]
    pub min_memory_gib: Option<i32>,
    /// At least this many disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 128").message("minDisks must be 1 to 128"))]
    pub min_disks: Option<i32>,
    /// A link at least this fast (Mbit/s) that is up.
    #[serde(
        default,
        rename = "minNICSpeedMbps",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1600000").message("minNICSpeedMbps must be 1 to 1600000"))]
    pub min_nic_speed_mbps: Option<i32>,
}

/// Whether a Machine's labels say its inventory is disputed.
pub fn is_disputed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(DISPUTED).is_some_and(|v| v == "true")
}

impl HardwareRequirements {
    /// Whether a Machine with these labels meets every requirement.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        if is_disputed(labels) {
            return false;
        }
        let at_least = |key: &str, min: Option<i32>| match min {
            None => true,
            Some(min) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|have| have >= i64::from(min)),
        };
        at_least(CPUS, self.min_cpus)
            && at_least(MEMORY_GIB, self.min_memory_gib)
            && at_least(DISKS, self.min_disks)
            && at_least(NIC_SPEED, self.min_nic_speed_mbps)
    }
}

/// The `metadata.labels` of a merge patch that gives a Machine the hardware labels of
/// `inventory`: hardware labels it no longer gives are removed (null), every label outside
/// `hardware.unbounded-cloud.io/` is left alone.
pub fn hardware_label_patch(
    current: &BTreeMap<String, String>,
    inventory: &MachineInventorySpec,
) -> serde_json::Map<String, serde_json::Value> {
    let fresh = hardware_labels(inventory);
    let mut labels: serde_json::Map<String, serde_json::Value> = current
        .keys()
        .filter(|k| k.starts_with(PREFIX) && !fresh.contains_key(*k))
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    labels.extend(
        fresh
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v))),
    );
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::LldpNeighbour;
    use crate::inventory::validate::tests::good;

    #[test]
    fn a_server_gets_every_label() {
        let labels = hardware_labels(&good());
        let want: BTreeMap<String, String> = [
            (ARCH, "amd64"),
            (CPUS, "128"),
            (MEMORY_GIB, "256"),
            (DISKS, "1"),
            (ACCELERATOR, "nvidia"),
            (NIC_SPEED, "10000"),
            (VENDOR, "Dell-Inc"),
            (PRODUCT, "PowerEdge-R650"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(labels, want);
    }

    #[test]
    fn the_switch_is_the_boot_interfaces_neighbour() {
        let mut spec = good();
        let neighbour = |system: Option<&str>, chassis: &str| LldpNeighbour {
            chassis_id: chassis.into(),
            port_id: "Ethernet1/12".into(),
            system_name: system.map(str::to_owned),
            port_description: None,
        };
        let nics = &mut spec.nics.as_mut().unwrap().interfaces;
        let mut second = nics[0].clone();
        second.name = "eno2".into();
        second.pxe_booted = true;
        second.link = false;
        second.lldp = Some(neighbour(Some("leaf r12/1"), "aa:bb"));
        nics[0].pxe_booted = false;
        nics[0].lldp = Some(neighbour(None, "52:54:00:00:00:99"));
        nics.push(second);
        assert_eq!(
            hardware_labels(&spec).get(SWITCH).map(String::as_str),
            Some("leaf-r12-1")
        );
        let nics = &mut spec.nics.as_mut().unwrap().interfaces;
        nics.pop();
        // No boot interface with a neighbour: the first linked one's, by chassis ID.
        assert_eq!(
            hardware_labels(&spec).get(SWITCH).map(String::as_str),
            Some("52-54-00-00-00-99")
        );
    }

    #[test]
    fn labels_absent_when_the_inventory_does_not_tell() {
        let mut spec = good();
        spec.pci.as_mut().unwrap().devices[0].accelerator = false;
        for nic in &mut spec.nics.as_mut().unwrap().interfaces {
            nic.link = false;
        }
        spec.system.as_mut().unwrap().product = Some("To Be Filled By O.E.M.".into());
        let labels = hardware_labels(&spec);
        assert!(!labels.contains_key(ACCELERATOR));
        assert!(!labels.contains_key(NIC_SPEED));
        assert!(!labels.contains_key(PRODUCT));
        assert!(!labels.contains_key(SWITCH));
        assert!(hardware_labels(&MachineInventorySpec::default()).is_empty());
    }

    #[test]
    fn memory_rounds_to_the_nearest_gib() {
        let mut spec = good();
        for (bytes, want) in [
            (64 << 30, "64"),
            ((64 << 30) - (200 << 20), "64"),
            ((62 << 30) + (800 << 20), "63"),
        ] {
            spec.memory.as_mut().unwrap().total_bytes = bytes;
            assert_eq!(hardware_labels(&spec)[MEMORY_GIB], want, "{bytes}");
        }
    }

    #[test]
    fn free_text_becomes_a_label_value() {
        let cases = [
            ("Dell Inc.", Some("Dell-Inc")),
            ("HPE", Some("HPE")),
            (
                "ProLiant DL380 Gen10 Plus",
                Some("ProLiant-DL380-Gen10-Plus"),
            ),
            (
                "Standard PC (Q35 + ICH9, 2009)",
                Some("Standard-PC-Q35-ICH9-2009"),
            ),
            ("  QEMU  ", Some("QEMU")),
            ("-.weird_.-", Some("weird")),
            ("To Be Filled By O.E.M.", None),
            ("Default string", None),
            ("", None),
            ("@@@", None),
            ("Supermicro\u{e9}X12", Some("Supermicro-X12")),
        ];
        for (raw, want) in cases {
            assert_eq!(label_value(raw).as_deref(), want, "{raw:?}");
        }
        let long = label_value(&"a".repeat(100)).unwrap();
        assert_eq!(long.len(), 63);
        // A cut that ends on a separator is trimmed back to an alphanumeric.
        let cut = label_value(&format!("{}-b", "a".repeat(62))).unwrap();
        assert_eq!(cut, "a".repeat(62));
    }

    #[test]
    fn every_label_value_is_valid() {
        let re_ok = |v: &str| {
            v.len() <= 63
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        for raw in [
            "Dell Inc.",
            "a b c",
            "ÄÖÜ x",
            "x/y\\z",
            "...a...",
            "(((Q35)))",
        ] {
            if let Some(v) = label_value(raw) {
                assert!(re_ok(&v), "{raw:?} -> {v:?}");
            }
        }
    }

    #[test]
    fn requirements_admit_by_the_labels() {
        let labels = hardware_labels(&good());
        let cases = [
            (
                HardwareRequirements {
                    min_cpus: Some(8),
                    min_memory_gib: Some(64),
                    ..Default::default()
                },
                true,
            ),
            (
                HardwareRequirements {
                    min_cpus: Some(128),
                    ..Default::default()
                },
                true,
            ),
            (
                HardwareRequirements {
                    min_cpus: Some(129),
                    ..Default::default()
                },
                false,
            ),
            (
                HardwareRequirements {
                    min_memory_gib: Some(512),
                    ..Default::default()
                },
                false,
            ),
            (
                HardwareRequirements {
                    min_disks: Some(2),
                    ..Default::default()
                },
                false,
            ),
            (
                HardwareRequirements {
                    min_nic_speed_mbps: Some(25_000),
                    ..Default::default()
                },
                false,
            ),
            (
                HardwareRequirements {
                    min_nic_speed_mbps: Some(10_000),
                    ..Default::default()
                },
                true,
            ),
        ];
        for (req, want) in cases {
            assert_eq!(req.admits(&labels), want, "{req:?}");
        }
        // Without the label, a requirement is not met.
        let req = HardwareRequirements {
            min_cpus: Some(1),
            ..Default::default()
        };
        assert!(!req.admits(&BTreeMap::new()));
    }
}
