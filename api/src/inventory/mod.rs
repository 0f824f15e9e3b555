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
//! refuses an oversized object whoever writes it) and in [`validate`], a pure function the
//! bootserver runs on an unauthenticated discovery report before it writes anything.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod bmc;
pub mod disputes;
pub mod labels;
pub mod validate;

pub use bmc::{BmcFacts, IpmiLan, RedfishHostInterface};

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

/// The bootserver's route an inspection agent posts its [`DiscoveryReport`] to.
pub const DISCOVERY_REPORT_PATH: &str = "/discovery/inventory";

/// The bootserver's route an inspection agent polls between reports: `GET
/// /discovery/claim/<boot MAC>` answers 200 while the machine's Machine waits, 409 with
/// [`REFUSAL_HEADER`] `known` once it is claimed (the agent reboots into its own boot), and
/// 404 when no Machine has the MAC (the agent reports again).
pub const DISCOVERY_CLAIM_PATH: &str = "/discovery/claim";

/// The response header that names why the bootserver refused a report (a fixed label such
/// as `known`, `rate_limited`, `invalid`).
pub const REFUSAL_HEADER: &str = "unbounded-refusal";

/// What the agent in inspection mode posts to the bootserver's discovery route: its inventory
/// and the MAC it network-booted from. Nothing in it authenticates the machine; the
/// bootserver bounds what it can do (`bootserver/src/discovery.rs`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryReport {
    /// The MAC the machine network-booted from (the kernel's `BOOTIF`).
    pub boot_mac: String,
    /// What the agent read.
    pub inventory: MachineInventorySpec,
    /// The TPM name of the machine's endorsement key, where it has a TPM: recorded on the
    /// Machine discovery creates (`spec.pxe.identity.endorsementKey`), so that the machine,
    /// once claimed, attests with that TPM and no other (`crate::identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endorsement_key: Option<String>,
}

/// Whether `name` is a TPM name of a SHA-256 key: `000b` and 64 hex digits.
pub fn is_tpm_name(name: &str) -> bool {
    name.len() == 68
        && name
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("000b"))
        && name.bytes().all(|b| b.is_ascii_hexdigit())
}

impl MachineInventorySpec {
    /// Tags every section with `origin`: the bootserver tags a discovery report `InBand` at
    /// the time it received it, whatever the report claimed.
    pub fn stamp(&mut self, origin: &FactOrigin) {
        let origins = [
            self.cpu.as_mut().map(|s| &mut s.origin),
            self.memory.as_mut().map(|s| &mut s.origin),
            self.disks.as_mut().map(|s| &mut s.origin),
            self.nics.as_mut().map(|s| &mut s.origin),
            self.system.as_mut().map(|s| &mut s.origin),
            self.pci.as_mut().map(|s| &mut s.origin),
            self.firmware.as_mut().map(|s| &mut s.origin),
            self.bmc.as_mut().map(|s| &mut s.origin),
        ];
        for slot in origins.into_iter().flatten() {
            *slot = origin.clone();
        }
        // What a report claims about past reads, or about its own disputes, is not kept
        // either.
        self.reads.clear();
        self.disagreements.clear();
    }

    /// The MAC addresses of the inventory's NICs, lower case, sorted, deduplicated.
    pub fn mac_set(&self) -> Vec<String> {
        let mut macs: Vec<String> = self
            .nics
            .iter()
            .flat_map(|n| n.interfaces.iter())
            .map(|nic| nic.mac.to_ascii_lowercase())
            .collect();
        macs.sort();
        macs.dedup();
        macs
    }

    /// Folds one source's read into the inventory; the one rule by which every writer (the
    /// bootserver's discovery and Redfish reads, the agent's refresh) combines sources:
    /// - a section the read has replaces the current one, unless the current one comes from
    ///   a source that [`outranks`] the read's (Redfish over IPMI FRU over in band);
    /// - an in-band read that contradicts a BMC's section is recorded in `disagreements`
    ///   ([`disputes`]);
    /// - a section the read lacks is removed if the read's source wrote it (that source no
    ///   longer sees it), and kept if another source did;
    /// - the read is recorded in `reads`, replacing that source's previous record.
    ///
    /// Each section keeps the origin of the source it came from, so the result says which
    /// source each fact came from and when.
    pub fn fold(&mut self, read: MachineInventorySpec, record: InventoryRead) {
        let source = record.source;
        // Compared before anything moves: each in-band read judges afresh what the BMC
        // holds; a BMC read leaves the judgement to the next in-band one.
        if source == FactSource::InBand {
            self.disagreements = disputes::between(self, &read);
        }
        fn one<T>(
            current: &mut Option<T>,
            incoming: Option<T>,
            source: FactSource,
            origin: impl Fn(&T) -> FactSource,
        ) {
            let current_source = current.as_ref().map(&origin);
            match (incoming, current_source) {
                (Some(_), Some(held)) if outranks(held, source) => {}
                (Some(section), _) => *current = Some(section),
                (None, Some(held)) if held == source => *current = None,
                (None, _) => {}
            }
        }
        one(&mut self.cpu, read.cpu, source, |s| s.origin.source);
        one(&mut self.memory, read.memory, source, |s| s.origin.source);
        one(&mut self.disks, read.disks, source, |s| s.origin.source);
        one(&mut self.nics, read.nics, source, |s| s.origin.source);
        one(&mut self.system, read.system, source, |s| s.origin.source);
        one(&mut self.pci, read.pci, source, |s| s.origin.source);
        one(&mut self.firmware, read.firmware, source, |s| {
            s.origin.source
        });
        one(&mut self.bmc, read.bmc, source, |s| s.origin.source);
        self.reads.retain(|r| r.source != source);
        self.reads.push(record);
        self.reads.sort_by_key(|r| rank(r.source));
    }

    /// The read recorded for `source`, if any.
    pub fn read_of(&self, source: FactSource) -> Option<&InventoryRead> {
        self.reads.iter().find(|r| r.source == source)
    }
}

fn rank(source: FactSource) -> u8 {
    match source {
        FactSource::Redfish => 0,
        FactSource::IpmiFru => 1,
        FactSource::InBand => 2,
    }
}

/// Whether facts from `held` stay when `incoming` describes the same section: the BMC's
/// Redfish view outranks its IPMI FRU records, which outrank what the agent reports in band.
/// In band is what the OS of whoever answers on the machine's address says, the BMC is the
/// machine's own management controller: a report never replaces its reading (sections the
/// BMC does not read, such as disks by path, link speeds, PCI classes and LLDP, come from
/// in band alone). A source never outranks itself, so a source's newer read replaces its
/// older one.
pub fn outranks(held: FactSource, incoming: FactSource) -> bool {
    rank(held) < rank(incoming)
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

    fn origin(source: FactSource, second: i64) -> FactOrigin {
        FactOrigin {
            source,
            observed_at: Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap()),
        }
    }

    /// A read of `source` at `second` with a system section (its serial says which read it
    /// was) and, if `firmware`, a firmware section.
    fn read(source: FactSource, second: i64, system: bool, firmware: bool) -> MachineInventorySpec {
        MachineInventorySpec {
            system: system.then(|| SystemFacts {
                serial: Some(format!("{source:?}@{second}")),
                ..SystemFacts::empty(origin(source, second))
            }),
            firmware: firmware.then(|| FirmwareFacts {
                origin: origin(source, second),
                mode: crate::Firmware::Uefi,
                secure_boot: None,
            }),
            ..Default::default()
        }
    }

    fn record(source: FactSource, second: i64, reinspection: Option<&str>) -> InventoryRead {
        InventoryRead {
            source,
            observed_at: origin(source, second).observed_at,
            reinspection: reinspection.map(str::to_owned),
        }
    }

    /// A read in a sequence: its source, and whether it has a system and a firmware section.
    type Read = (FactSource, bool, bool);

    fn fold_all(reads: &[Read]) -> MachineInventorySpec {
        let mut spec = MachineInventorySpec::default();
        for (i, (source, system, firmware)) in reads.iter().enumerate() {
            let at = i64::try_from(i).unwrap() + 1;
            spec.fold(
                read(*source, at, *system, *firmware),
                record(*source, at, None),
            );
        }
        spec
    }

    #[test]
    fn sources_fold_by_rank_and_each_section_names_its_source() {
        use FactSource::{InBand, IpmiFru, Redfish};
        let serial =
            |spec: &MachineInventorySpec| spec.system.as_ref().and_then(|s| s.serial.clone());
        let firmware_source =
            |spec: &MachineInventorySpec| spec.firmware.as_ref().map(|f| f.origin.source);
        type Case<'a> = (&'a str, Vec<Read>, Option<&'a str>, Option<FactSource>);
        let cases: [Case<'_>; 7] = [
            (
                "Redfish first, then in band: Redfish stays, in band fills what it lacks",
                vec![(Redfish, true, false), (InBand, true, true)],
                Some("Redfish@1"),
                Some(InBand),
            ),
            (
                "in band first, then Redfish: Redfish replaces",
                vec![(InBand, true, false), (Redfish, true, true)],
                Some("Redfish@2"),
                Some(Redfish),
            ),
            (
                "Redfish fills what in band lacks",
                vec![(InBand, false, true), (Redfish, true, false)],
                Some("Redfish@2"),
                Some(InBand),
            ),
            (
                "a source's newer read replaces its older one",
                vec![(Redfish, true, false), (Redfish, true, false)],
                Some("Redfish@2"),
                None,
            ),
            (
                "a section its own source no longer sees goes",
                vec![(Redfish, true, true), (Redfish, false, true)],
                None,
                Some(Redfish),
            ),
            (
                "a section another source wrote stays when a read lacks it",
                vec![(InBand, true, false), (Redfish, false, true)],
                Some("InBand@1"),
                Some(Redfish),
            ),
            (
                "IPMI FRU never replaces Redfish",
                vec![(Redfish, true, false), (IpmiFru, true, true)],
                Some("Redfish@1"),
                Some(IpmiFru),
            ),
        ];
        for (case, reads, want_serial, want_firmware) in cases {
            let spec = fold_all(&reads);
            assert_eq!(serial(&spec).as_deref(), want_serial, "{case}");
            assert_eq!(firmware_source(&spec), want_firmware, "{case}");
        }
    }

    /// A report that contradicts the BMC never replaces its reading: the difference is
    /// recorded, the Machine's labels say disputed, and no hardware requirement admits it;
    /// a later in-band read that agrees settles it.
    #[test]
    fn an_in_band_report_that_contradicts_the_bmc_is_a_dispute_not_a_fact() {
        let system = |source, serial: &str, product: &str| SystemFacts {
            serial: Some(serial.into()),
            product: Some(product.into()),
            ..SystemFacts::empty(origin(source, 1))
        };
        let memory = |source, gib: i64| MemoryFacts {
            origin: origin(source, 1),
            total_bytes: gib << 30,
            usable_bytes: None,
            dimms: vec![],
        };
        let mut spec = MachineInventorySpec::default();
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::Redfish, "SN-1", "R650")),
                memory: Some(memory(FactSource::Redfish, 512)),
                ..Default::default()
            },
            record(FactSource::Redfish, 1, None),
        );
        let requirements = HardwareRequirements {
            min_memory_gib: Some(256),
            ..Default::default()
        };
        assert!(requirements.admits(&hardware_labels(&spec)));
        // A report whose memory is within the OS's reservations and whose identity matches.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, " sn-1 ", "R650")),
                memory: Some(memory(FactSource::InBand, 503)),
                ..Default::default()
            },
            record(FactSource::InBand, 2, None),
        );
        assert!(spec.disagreements.is_empty(), "{:?}", spec.disagreements);
        // A forged report: another serial, four times the memory.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, "SN-FORGED", "R650")),
                memory: Some(memory(FactSource::InBand, 2048)),
                ..Default::default()
            },
            record(FactSource::InBand, 3, None),
        );
        let sections: Vec<&str> = spec
            .disagreements
            .iter()
            .map(|d| d.section.as_str())
            .collect();
        assert_eq!(sections, ["memory", "system"]);
        assert_eq!(
            spec.system.as_ref().and_then(|s| s.serial.as_deref()),
            Some("SN-1"),
            "the BMC's reading stays"
        );
        assert_eq!(spec.memory.as_ref().map(|m| m.total_bytes), Some(512 << 30));
        let labels = hardware_labels(&spec);
        assert_eq!(
            labels.get(labels::DISPUTED).map(String::as_str),
            Some("true")
        );
        assert!(!requirements.admits(&labels), "kept off hardware claims");
        // The machine's own report again: settled.
        spec.fold(
            MachineInventorySpec {
                system: Some(system(FactSource::InBand, "SN-1", "R650")),
                memory: Some(memory(FactSource::InBand, 510)),
                ..Default::default()
            },
            record(FactSource::InBand, 4, None),
        );
        assert!(spec.disagreements.is_empty());
        assert!(requirements.admits(&hardware_labels(&spec)));
    }

    #[test]
    fn reads_keep_one_record_per_source() {
        let mut spec = MachineInventorySpec::default();
        spec.fold(
            read(FactSource::Redfish, 1, true, false),
            record(FactSource::Redfish, 1, Some("a")),
        );
        spec.fold(
            read(FactSource::InBand, 2, true, false),
            record(FactSource::InBand, 2, None),
        );
        spec.fold(
            read(FactSource::Redfish, 3, true, false),
            record(FactSource::Redfish, 3, Some("b")),
        );
        assert_eq!(
            spec.reads,
            vec![
                record(FactSource::Redfish, 3, Some("b")),
                record(FactSource::InBand, 2, None),
            ]
        );
        assert_eq!(
            spec.read_of(FactSource::Redfish)
                .and_then(|r| r.reinspection.as_deref()),
            Some("b")
        );
        assert!(spec.read_of(FactSource::IpmiFru).is_none());
    }

    fn source() -> impl proptest::strategy::Strategy<Value = FactSource> {
        proptest::prop_oneof![
            proptest::strategy::Just(FactSource::InBand),
            proptest::strategy::Just(FactSource::Redfish),
            proptest::strategy::Just(FactSource::IpmiFru),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(26), ..proptest::test_runner::Config::default() })]

        /// Whatever the order of reads, for the system section:
        /// - if present, it is exactly what its source's latest read said (never a stale fact
        ///   of a source that since stopped seeing it);
        /// - no source that outranks it has read the section since;
        /// - if the latest read of all had it, it is present.
        #[test]
        fn folding_never_keeps_a_stale_or_outranked_section(
            reads in proptest::collection::vec((source(), proptest::bool::ANY), 1..24)
        ) {
            let full: Vec<Read> = reads.iter().map(|(s, sys)| (*s, *sys, false)).collect();
            let spec = fold_all(&full);
            let latest = |source: FactSource| reads.iter().rposition(|(s, _)| *s == source);
            if let Some(system) = &spec.system {
                let held = system.origin.source;
                let at = latest(held).unwrap();
                proptest::prop_assert!(reads[at].1, "its source's latest read lacks it");
                proptest::prop_assert_eq!(system.serial.clone(), Some(format!("{held:?}@{}", at + 1)));
                for (later, (s, had)) in reads.iter().enumerate().skip(at + 1) {
                    proptest::prop_assert!(!(outranks(*s, held) && *had), "read {later} of {s:?} outranks it");
                }
            }
            if reads.last().is_some_and(|(_, had)| *had) {
                proptest::prop_assert!(spec.system.is_some());
            }
            let mut sources: Vec<FactSource> = spec.reads.iter().map(|r| r.source).collect();
            sources.dedup();
            proptest::prop_assert_eq!(sources.len(), spec.reads.len());
        }
    }

    /// Every section a report has is stamped with the receiver's origin, whatever the report
    /// claimed; sections it lacks stay absent.
    #[test]
    fn stamp_tags_every_present_section() {
        let claimed = FactOrigin {
            source: FactSource::Redfish,
            observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let mut spec = MachineInventorySpec {
            system: Some(SystemFacts::empty(claimed.clone())),
            firmware: Some(FirmwareFacts {
                origin: claimed,
                mode: crate::Firmware::Bios,
                secure_boot: None,
            }),
            ..Default::default()
        };
        let received = FactOrigin {
            source: FactSource::InBand,
            observed_at: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
        };
        spec.stamp(&received);
        assert_eq!(spec.system.as_ref().map(|s| &s.origin), Some(&received));
        assert_eq!(spec.firmware.as_ref().map(|f| &f.origin), Some(&received));
        assert!(spec.cpu.is_none() && spec.nics.is_none());
    }
}
