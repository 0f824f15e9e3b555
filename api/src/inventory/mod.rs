//! `MachineInventory`: the hardware facts of one Machine (CPUs, memory, disks, NICs with their
//! LLDP neighbour, DMI, PCI devices, firmware), each section tagged with where it came from
//! (the agent in band, the BMC over Redfish, IPMI FRU) and when.
//!
//! # Why a companion resource and not `status.inventory`
//!
//! A server's inventory is 5 to 30 KiB of JSON (a 2-socket server with 16 DIMMs, 8 disks, 4
//! NICs and 40 PCI functions is about 12 KiB); a Machine without it is about 2 KiB. Every
//! component watches Machines (the controller, each bootserver's reflector, the pool
//! controller), and every change of a Machine — a power state, an agent heartbeat, a
//! condition — sends the whole object to every watcher. At 10,000 Machines, inventory in the
//! Machine would make each watcher's cache 140 MB instead of 20 MB and multiply the bytes of
//! every status event by six, for facts that change a few times a year. So the inventory is
//! its own cluster-scoped resource, `MachineInventory` (short name `mi`), named like its
//! Machine and owned by it (deleted with it); only what selection needs reaches the Machine,
//! as the small set of well-known [`labels`] (`hardware.unbounded-cloud.io/…`).
//!
//! # Validation
//!
//! The same limits twice: in the CRD schema (`maxLength`, `maxItems`, so the API server
//! refuses an oversized object whoever writes it) and in [`validate()`], a pure function the
//! bootserver runs on an unauthenticated discovery report before it writes anything.
//!
//! # Where the rest lives
//!
//! How the sources' reads combine, by rank, is [`fold`] (and what an in-band read that
//! contradicts the BMC becomes, [`disputes`]); what an inspection agent posts to the
//! bootserver, [`discovery`]; the BMC's own facts, [`bmc`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod bmc;
pub mod discovery;
pub mod disputes;
pub mod fold;
pub mod labels;
pub mod validate;

pub use bmc::{BmcFacts, IpmiLan, RedfishHostInterface};
pub use discovery::{
    DISCOVERY_CLAIM_PATH, DISCOVERY_REPORT_PATH, DiscoveryReport, REFUSAL_HEADER, is_tpm_name,
};
pub use fold::outranks;

pub use labels::{HardwareRequirements, hardware_labels};
pub use validate::{InventoryError, validate};

/// The hardware facts of one Machine. Named like the Machine and owned by it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "MachineInventory",
    plural = "machineinventories",
    shortname = "mi",
    category = "unbounded",
    derive = "PartialEq",
    derive = "Default",
    doc = "A MachineInventory holds the hardware facts of the Machine of the same name (CPUs, memory, disks, NICs, DMI, PCI, firmware), each section tagged with its source and time. Written by the bootserver (discovery, Redfish) and the agent.",
    printcolumn(
        name = "Arch",
        type_ = "string",
        json_path = ".spec.cpu.architecture",
        description = "CPU architecture"
    ),
    printcolumn(
        name = "CPUs",
        type_ = "integer",
        json_path = ".spec.cpu.threads",
        description = "Logical CPUs"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".spec.memory.totalBytes",
        description = "Memory in bytes"
    ),
    printcolumn(
        name = "Vendor",
        type_ = "string",
        json_path = ".spec.system.vendor",
        description = "System vendor (DMI)"
    ),
    printcolumn(
        name = "Disputed",
        type_ = "string",
        json_path = ".spec.disagreements[*].section",
        description = "Sections where the in-band report contradicts the BMC"
    ),
    printcolumn(
        name = "Product",
        type_ = "string",
        json_path = ".spec.system.product",
        description = "System product name (DMI)"
    ),
    printcolumn(
        name = "Serial",
        type_ = "string",
        json_path = ".spec.system.serial",
        priority = 1
    ),
    printcolumn(
        name = "BMC",
        type_ = "string",
        json_path = ".spec.bmc.suggestedAddress",
        description = "BMC address the machine suggests (in band; confirm before use)",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineInventorySpec {
    /// Processors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuFacts>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryFacts>,
    /// Block devices (disks; no partitions, loop, RAM or optical devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<DiskFacts>,
    /// Network interfaces (physical ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics: Option<NicFacts>,
    /// System, BIOS and baseboard identity (SMBIOS/DMI, or the BMC's view of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemFacts>,
    /// PCI devices, accelerators flagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciFacts>,
    /// Firmware mode and Secure Boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<FirmwareFacts>,
    /// The machine's own BMC as the machine sees it (in band only), with a suggested BMC
    /// address that nothing acts on: an operator confirms it into `spec.pxe.bmc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcFacts>,
    /// The last read of each source (at most one per source): when it happened and which
    /// re-inspection request it answered. Written by whoever read, never taken from a
    /// discovery report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub reads: Vec<InventoryRead>,
    /// Sections where the last in-band read contradicts the BMC's reading
    /// ([`disputes`]): the Machine is labelled disputed and no hardware claim takes it
    /// until an operator resolves them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub disagreements: Vec<disputes::Disagreement>,
}

/// One source's last read of the machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryRead {
    /// The source.
    pub source: FactSource,
    /// When it read.
    pub observed_at: Time,
    /// The Machine's `unbounded-cloud.io/reinspect` value this read answered (the value the
    /// Machine had when the read began), absent when none was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub reinspection: Option<String>,
}

/// Where a section of facts came from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FactSource {
    /// The agent, reading `/proc` and `/sys` on the machine (inspection boot or a running node).
    InBand,
    /// The BMC's Redfish service.
    Redfish,
    /// The BMC's IPMI FRU records.
    IpmiFru,
}

/// Source and time of a section of facts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FactOrigin {
    /// Who reported the facts.
    pub source: FactSource,
    /// When they were read.
    pub observed_at: Time,
}

/// Processors.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// Architecture as the kernel names it: `x86_64` or `aarch64`.
    #[schemars(length(max = 32))]
    pub architecture: String,
    /// Model name of the first processor, such as `Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub model: Option<String>,
    /// Populated sockets.
    pub sockets: i32,
    /// Physical cores, all sockets together.
    pub cores: i32,
    /// Logical CPUs (hardware threads), all sockets together.
    pub threads: i32,
    /// The flags of interest the processors have: virtualization (`vmx`, `svm`), vector units
    /// (`avx2`, `avx512f`), crypto (`aes`, `sha_ni`) and ARM's `sve`. Not the full list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 32)))]
    pub flags: Vec<String>,
}

/// Memory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// Memory installed, in bytes: the DIMMs' sum or the BMC's total where known, otherwise the
    /// online memory blocks (`/sys/devices/system/memory`), otherwise `MemTotal`.
    pub total_bytes: i64,
    /// Memory the kernel can use (`MemTotal`), in bytes: less than installed (firmware and
    /// kernel reservations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable_bytes: Option<i64>,
    /// Memory modules, where SMBIOS or the BMC tells.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub dimms: Vec<Dimm>,
}

/// One memory module.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dimm {
    /// Slot, such as `DIMM_A1` or `CPU0_DIMM_A1`.
    #[schemars(length(max = 64))]
    pub locator: String,
    /// Size in bytes.
    pub size_bytes: i64,
    /// Type, such as `DDR4` or `DDR5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub memory_type: Option<String>,
    /// Speed in MT/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mts: Option<i32>,
    /// Manufacturer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub manufacturer: Option<String>,
    /// Part number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub part_number: Option<String>,
}

/// Disks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// The disks, by kernel name.
    #[schemars(length(max = 128))]
    pub devices: Vec<Disk>,
}

/// One disk.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Kernel name, such as `sda` or `nvme0n1` (for Redfish, the drive's Id).
    #[schemars(length(max = 64))]
    pub name: String,
    /// Stable path under `/dev/disk/by-path`, such as `pci-0000:00:1f.2-ata-1`: what a
    /// configuration names a disk by, as it survives reordering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub by_path: Option<String>,
    /// Size in bytes.
    pub size_bytes: i64,
    /// Whether it spins (false for SSDs and NVMe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    /// Model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub model: Option<String>,
    /// Serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub serial: Option<String>,
    /// World Wide Name, such as `0x5000c500a1b2c3d4` or `eui.…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub wwn: Option<String>,
}

/// Network interfaces.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NicFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// The interfaces.
    #[schemars(length(max = 64))]
    pub interfaces: Vec<Nic>,
}

/// One network interface.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    /// Kernel name, such as `eno1` (for Redfish, the interface's Id).
    #[schemars(length(max = 64))]
    pub name: String,
    /// MAC address, lower case, colon-separated.
    #[schemars(length(max = 17))]
    pub mac: String,
    /// Kernel driver, such as `ixgbe` or `virtio_net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub driver: Option<String>,
    /// Link speed in Mbit/s, when the link is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<i32>,
    /// Whether the link is up.
    #[serde(default)]
    pub link: bool,
    /// Whether the machine network-booted from this interface (the agent's boot MAC).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pxe_booted: bool,
    /// The switch port on the other end, from LLDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lldp: Option<LldpNeighbour>,
}

/// What the switch on the other end of a link announces over LLDP (IEEE 802.1AB).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LldpNeighbour {
    /// Chassis ID, as text (a MAC in colon form, or the ID's text).
    #[schemars(length(max = 256))]
    pub chassis_id: String,
    /// Port ID, as text (such as `Ethernet1/12` or a MAC).
    #[schemars(length(max = 256))]
    pub port_id: String,
    /// System name, such as `leaf-r12-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub system_name: Option<String>,
    /// Port description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub port_description: Option<String>,
}

/// System, BIOS and baseboard identity.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// System manufacturer, such as `Dell Inc.`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub vendor: Option<String>,
    /// Product name, such as `PowerEdge R650`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub product: Option<String>,
    /// System serial number (Dell's service tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub serial: Option<String>,
    /// SMBIOS system UUID, lower case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 36))]
    pub uuid: Option<String>,
    /// BIOS vendor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub bios_vendor: Option<String>,
    /// BIOS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub bios_version: Option<String>,
    /// BIOS release date as the firmware writes it (`MM/DD/YYYY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub bios_date: Option<String>,
    /// Baseboard manufacturer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub board_vendor: Option<String>,
    /// Baseboard product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub board_product: Option<String>,
    /// Baseboard serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub board_serial: Option<String>,
}

impl SystemFacts {
    /// Facts with only an origin, to be filled in.
    pub fn empty(origin: FactOrigin) -> Self {
        Self {
            origin,
            vendor: None,
            product: None,
            serial: None,
            uuid: None,
            bios_vendor: None,
            bios_version: None,
            bios_date: None,
            board_vendor: None,
            board_product: None,
            board_serial: None,
        }
    }
}

/// PCI devices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PciFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// The functions, bridges left out.
    #[schemars(length(max = 512))]
    pub devices: Vec<PciDevice>,
}

/// One PCI function.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PciDevice {
    /// Address `domain:bus:device.function`, such as `0000:3b:00.0`.
    #[schemars(length(max = 16))]
    pub address: String,
    /// Vendor ID, four lower-case hex digits (`10de` is NVIDIA).
    #[schemars(length(max = 4))]
    pub vendor_id: String,
    /// Device ID, four lower-case hex digits.
    #[schemars(length(max = 4))]
    pub device_id: String,
    /// Class code, six lower-case hex digits (class, subclass, programming interface).
    #[schemars(length(max = 6))]
    pub class_code: String,
    /// Whether it is a compute accelerator (see [`is_accelerator`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accelerator: bool,
}

/// Firmware mode and Secure Boot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwareFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// How the machine booted: `uefi` or `bios`.
    pub mode: crate::Firmware,
    /// Whether UEFI Secure Boot is on; absent when unknown (or BIOS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
}

/// PCI vendor IDs whose display controllers are compute GPUs rather than a BMC's VGA.
const GPU_VENDORS: [&str; 2] = ["10de", "1002"];

/// Whether a PCI function is a compute accelerator, from its class code (six hex digits) and
/// vendor: a 3D controller (class 03, subclass 02), a processing accelerator (class 12), a
/// co-processor (class 0b, subclass 40), or a VGA controller (0300) from NVIDIA or AMD. A plain
/// VGA controller from anyone else is the BMC's or the board's console, not an accelerator.
pub fn is_accelerator(class_code: &str, vendor_id: &str) -> bool {
    let class = class_code.to_ascii_lowercase();
    class.starts_with("0302")
        || class.starts_with("12")
        || class.starts_with("0b40")
        || (class.starts_with("0300")
            && GPU_VENDORS.contains(&vendor_id.to_ascii_lowercase().as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerators_are_told_from_console_vga() {
        let cases = [
            ("030200", "10de", true, "NVIDIA 3D controller (A100, H100)"),
            ("030000", "10de", true, "NVIDIA VGA-class GPU"),
            ("030000", "1002", true, "AMD GPU"),
            ("030000", "1a03", false, "ASPEED BMC VGA"),
            ("030000", "102b", false, "Matrox G200 console"),
            (
                "120000",
                "1da3",
                true,
                "Habana Gaudi processing accelerator",
            ),
            ("0b4000", "8086", true, "co-processor"),
            ("020000", "8086", false, "Ethernet controller"),
            ("010802", "144d", false, "NVMe controller"),
        ];
        for (class, vendor, want, what) in cases {
            assert_eq!(is_accelerator(class, vendor), want, "{what}");
        }
    }
}
