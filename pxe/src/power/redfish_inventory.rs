//! A machine's inventory out of band, from its BMC's Redfish service, so that a server that
//! never booted is already described: the ComputerSystem (vendor, model, serial, UUID, BIOS
//! version, processor and memory summaries), its Processors, Memory and EthernetInterfaces
//! collections' members and the Drives of its Storage. Parsing is pure (JSON in, sections out,
//! tagged `Redfish`); fetching the documents is the shell's
//! ([`super::redfish::RedfishBmc::inventory_documents`], the power driver's client).
//!
//! Redfish gives what the BMC knows: no disk by-path, no link speed on every BMC, no PCI class
//! codes; the in-band report fills those, section by section, and where both describe a
//! section the in-band one is kept (`MachineInventorySpec::fold`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use unbounded_api::inventory::{
    CpuFacts, Dimm, Disk, DiskFacts, FactOrigin, FactSource, MachineInventorySpec, MemoryFacts,
    Nic, NicFacts, SystemFacts,
};

/// Why a Redfish document could not be read as inventory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedfishInventoryError {
    /// Not a ComputerSystem resource.
    #[error("the document is not a ComputerSystem (its @odata.type is {0:?})")]
    NotASystem(String),
}

/// The documents read from the BMC: the ComputerSystem and the members of its collections.
#[derive(Debug, Clone, Default)]
pub struct RedfishDocuments {
    /// `/redfish/v1/Systems/<id>`.
    pub system: Value,
    /// Members of `Processors`.
    pub processors: Vec<Value>,
    /// Members of `Memory`.
    pub memory: Vec<Value>,
    /// Members of `EthernetInterfaces`.
    pub ethernet_interfaces: Vec<Value>,
    /// The Drives of every member of `Storage`.
    pub drives: Vec<Value>,
}

fn string(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.chars()
                .filter(|c| (' '..='~').contains(c))
                .take(128)
                .collect()
        })
}

/// A number, or a number written as a string (sushy-tools writes `"TotalCores": "4"`).
fn int(v: &Value, key: &str) -> Option<i64> {
    let value = v.get(key)?;
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
}

/// Whether a member is there: `Status.State` absent or anything but `Absent`.
fn present(v: &Value) -> bool {
    v.pointer("/Status/State").and_then(Value::as_str) != Some("Absent")
}

/// Redfish's `ProcessorArchitecture`/`InstructionSet` as the kernel names it.
fn architecture(processor: &Value) -> Option<String> {
    match processor.get("InstructionSet").and_then(Value::as_str)? {
        "x86-64" => Some("x86_64".into()),
        "ARM-A64" => Some("aarch64".into()),
        other => Some(other.to_ascii_lowercase().replace('-', "_")),
    }
}

/// The inventory sections the documents tell.
pub fn parse(
    docs: &RedfishDocuments,
    now: Time,
) -> Result<MachineInventorySpec, RedfishInventoryError> {
    let odata = docs
        .system
        .get("@odata.type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !odata.starts_with("#ComputerSystem.") {
        return Err(RedfishInventoryError::NotASystem(odata.to_owned()));
    }
    let origin = || FactOrigin {
        source: FactSource::Redfish,
        observed_at: now.clone(),
    };
    let sys = &docs.system;
    let system = SystemFacts {
        vendor: string(sys, "Manufacturer"),
        product: string(sys, "Model"),
        serial: string(sys, "SerialNumber"),
        uuid: string(sys, "UUID").map(|u| u.to_ascii_lowercase()),
        bios_version: string(sys, "BiosVersion"),
        ..SystemFacts::empty(origin())
    };

    let cpus: Vec<&Value> = docs
        .processors
        .iter()
        .filter(|p| {
            present(p)
                && p.get("ProcessorType")
                    .and_then(Value::as_str)
                    .is_none_or(|t| t == "CPU")
        })
        .collect();
    let cpu = if cpus.is_empty() {
        // Only the summary: a count, no cores.
        let count = docs
            .system
            .pointer("/ProcessorSummary/LogicalProcessorCount")
            .and_then(Value::as_i64)
            .or_else(|| {
                docs.system
                    .pointer("/ProcessorSummary/Count")
                    .and_then(Value::as_i64)
            });
        count
            .and_then(|c| i32::try_from(c).ok())
            .map(|threads| CpuFacts {
                origin: origin(),
                architecture: "unknown".into(),
                model: docs
                    .system
                    .pointer("/ProcessorSummary/Model")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                sockets: docs
                    .system
                    .pointer("/ProcessorSummary/Count")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(1),
                cores: threads,
                threads,
                flags: Vec::new(),
            })
    } else {
        let sum = |key: &str| cpus.iter().filter_map(|p| int(p, key)).sum::<i64>();
        Some(CpuFacts {
            origin: origin(),
            architecture: cpus
                .iter()
                .find_map(|p| architecture(p))
                .unwrap_or_else(|| "unknown".into()),
            model: cpus.iter().find_map(|p| string(p, "Model")),
            sockets: i32::try_from(cpus.len()).unwrap_or(i32::MAX),
            cores: i32::try_from(sum("TotalCores")).unwrap_or(i32::MAX),
            threads: i32::try_from(sum("TotalThreads")).unwrap_or(i32::MAX),
            flags: Vec::new(),
        })
    };

    let dimms: Vec<Dimm> = docs
        .memory
        .iter()
        .filter(|m| present(m))
        .filter_map(|m| {
            let mib = int(m, "CapacityMiB")?;
            (mib > 0).then(|| Dimm {
                locator: string(m, "DeviceLocator")
                    .or_else(|| string(m, "Id"))
                    .unwrap_or_default(),
                size_bytes: mib.saturating_mul(1 << 20),
                memory_type: string(m, "MemoryDeviceType"),
                speed_mts: int(m, "OperatingSpeedMhz").and_then(|s| i32::try_from(s).ok()),
                manufacturer: string(m, "Manufacturer"),
                part_number: string(m, "PartNumber"),
            })
        })
        .collect();
    let summary_bytes = docs
        .system
        .pointer("/MemorySummary/TotalSystemMemoryGiB")
        .and_then(Value::as_f64)
        .map(|gib| (gib * f64::from(1u32 << 30)) as i64);
    let dimm_bytes: i64 = dimms.iter().map(|d| d.size_bytes).sum();
    let memory = (dimm_bytes > 0 || summary_bytes.is_some()).then(|| MemoryFacts {
        origin: origin(),
        total_bytes: if dimm_bytes > 0 {
            dimm_bytes
        } else {
            summary_bytes.unwrap_or_default()
        },
        usable_bytes: None,
        dimms,
    });

    let interfaces: Vec<Nic> = docs
        .ethernet_interfaces
        .iter()
        .filter_map(|e| {
            let mac = string(e, "MACAddress")
                .or_else(|| string(e, "PermanentMACAddress"))?
                .to_ascii_lowercase();
            let link = e.get("LinkStatus").and_then(Value::as_str) == Some("LinkUp");
            Some(Nic {
                name: string(e, "Id").unwrap_or_else(|| mac.clone()),
                mac,
                driver: None,
                speed_mbps: int(e, "SpeedMbps")
                    .and_then(|s| i32::try_from(s).ok())
                    .filter(|s| *s > 0),
                link,
                pxe_booted: false,
                lldp: None,
            })
        })
        .collect();

    let devices: Vec<Disk> = docs
        .drives
        .iter()
        .filter(|d| present(d))
        .filter_map(|d| {
            let size_bytes = int(d, "CapacityBytes").filter(|b| *b > 0)?;
            Some(Disk {
                name: string(d, "Id")?.chars().take(64).collect(),
                by_path: None,
                size_bytes,
                rotational: match d.get("MediaType").and_then(Value::as_str) {
                    Some("HDD") => Some(true),
                    Some("SSD") => Some(false),
                    _ => None,
                },
                model: string(d, "Model"),
                serial: string(d, "SerialNumber"),
                // A durable name in NAA or EUI-64 form is the WWN the OS shows.
                wwn: d
                    .get("Identifiers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|i| {
                        matches!(
                            i.get("DurableNameFormat").and_then(Value::as_str),
                            Some("NAA" | "EUI")
                        )
                    })
                    .and_then(|i| string(i, "DurableName")),
            })
        })
        .collect();

    Ok(MachineInventorySpec {
        cpu,
        memory,
        disks: (!devices.is_empty()).then(|| DiskFacts {
            origin: origin(),
            devices,
        }),
        nics: (!interfaces.is_empty()).then(|| NicFacts {
            origin: origin(),
            interfaces,
        }),
        system: Some(system),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use unbounded_api::inventory::validate;

    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    /// A two-socket server as a Redfish 1.x BMC describes it (written from the DMTF schema's
    /// properties: ComputerSystem v1.x, Processor, Memory, EthernetInterface).
    fn server() -> RedfishDocuments {
        let cpu = |id: &str| {
            json!({"@odata.type": "#Processor.v1_11_0.Processor", "Id": id, "ProcessorType": "CPU",
            "InstructionSet": "x86-64", "Model": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "TotalCores": 32, "TotalThreads": 64,
            "Status": {"State": "Enabled"}})
        };
        let dimm = |id: &str, state: &str| {
            json!({"@odata.type": "#Memory.v1_14_0.Memory", "Id": id, "DeviceLocator": id,
            "CapacityMiB": 32768, "MemoryDeviceType": "DDR4", "OperatingSpeedMhz": 3200, "Manufacturer": "Hynix",
            "PartNumber": "HMA84GR7CJR4N-XN", "Status": {"State": state}})
        };
        RedfishDocuments {
            system: json!({"@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem", "Id": "1", "Manufacturer": "HPE",
                "Model": "ProLiant DL360 Gen10 Plus", "SerialNumber": "CZJ1234ABC", "UUID": "34393350-3036-435A-4A31-323334414243",
                "BiosVersion": "U46 v1.62 (11/09/2022)", "ProcessorSummary": {"Count": 2, "LogicalProcessorCount": 128},
                "MemorySummary": {"TotalSystemMemoryGiB": 64}}),
            processors: vec![
                cpu("Proc1"),
                cpu("Proc2"),
                json!({"Id": "GPU1", "ProcessorType": "GPU", "TotalCores": 6912}),
            ],
            memory: vec![
                dimm("PROC 1 DIMM 1", "Enabled"),
                dimm("PROC 2 DIMM 1", "Enabled"),
                dimm("PROC 2 DIMM 2", "Absent"),
            ],
            ethernet_interfaces: vec![
                json!({"Id": "1", "MACAddress": "94:40:C9:4A:10:00", "SpeedMbps": 25000, "LinkStatus": "LinkUp"}),
                json!({"Id": "2", "MACAddress": "94:40:C9:4A:10:01", "SpeedMbps": 0, "LinkStatus": "LinkDown"}),
                json!({"Id": "3"}),
            ],
            drives: Vec::new(),
        }
    }

    #[test]
    fn a_server_as_its_bmc_describes_it() {
        let inv = parse(&server(), now()).unwrap();
        assert_eq!(validate(&inv), Ok(()));
        let cpu = inv.cpu.as_ref().unwrap();
        assert_eq!(
            (
                cpu.architecture.as_str(),
                cpu.sockets,
                cpu.cores,
                cpu.threads
            ),
            ("x86_64", 2, 64, 128),
            "the GPU is not a socket"
        );
        assert_eq!(cpu.origin.source, FactSource::Redfish);
        let memory = inv.memory.as_ref().unwrap();
        assert_eq!(
            memory.total_bytes,
            64 << 30,
            "two present DIMMs; the absent slot not counted"
        );
        assert_eq!(memory.dimms.len(), 2);
        assert_eq!(memory.dimms[0].speed_mts, Some(3200));
        let nics = &inv.nics.as_ref().unwrap().interfaces;
        assert_eq!(nics.len(), 2, "an interface without a MAC is left out");
        assert_eq!(
            (nics[0].mac.as_str(), nics[0].speed_mbps, nics[0].link),
            ("94:40:c9:4a:10:00", Some(25_000), true)
        );
        assert_eq!((nics[1].speed_mbps, nics[1].link), (None, false));
        let system = inv.system.as_ref().unwrap();
        assert_eq!(system.vendor.as_deref(), Some("HPE"));
        assert_eq!(
            system.uuid.as_deref(),
            Some("34393350-3036-435a-4a31-323334414243")
        );
        assert!(
            inv.disks.is_none() && inv.pci.is_none(),
            "Redfish does not fill what it does not tell"
        );
    }

    #[test]
    fn a_bmc_with_only_summaries() {
        let docs = RedfishDocuments {
            system: json!({"@odata.type": "#ComputerSystem.v1_5_0.ComputerSystem", "Manufacturer": "Supermicro", "Model": "",
                "ProcessorSummary": {"Count": 1, "Model": "AMD EPYC 7313P"}, "MemorySummary": {"TotalSystemMemoryGiB": 127.5}}),
            ..Default::default()
        };
        let inv = parse(&docs, now()).unwrap();
        assert_eq!(inv.cpu.as_ref().unwrap().threads, 1);
        assert_eq!(
            inv.memory.as_ref().unwrap().total_bytes,
            (127 << 30) + (512 << 20)
        );
        assert_eq!(
            inv.system.as_ref().unwrap().product,
            None,
            "an empty Model is no product"
        );
    }

    /// Drives as a Dell iDRAC and an HPE iLO describe them (written from the DMTF Drive
    /// schema's properties), and as sushy-tools does (numbers as strings in Processors).
    #[test]
    fn drives_become_disks_and_string_numbers_count() {
        let docs = RedfishDocuments {
            system: json!({"@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem"}),
            processors: vec![
                json!({"Id": "CPU0", "ProcessorType": "CPU", "InstructionSet": "x86-64",
                "TotalCores": "2", "TotalThreads": "4"}),
            ],
            drives: vec![
                json!({"Id": "Disk.Bay.0:Enclosure.Internal.0-1:RAID.SL.3-1", "CapacityBytes": 479559942144_i64,
                    "MediaType": "SSD", "Model": "MZ7KH480HAHQ0D3", "SerialNumber": "S47MNA0R123456",
                    "Identifiers": [{"DurableNameFormat": "NAA", "DurableName": "5002538E00000001"}],
                    "Status": {"State": "Enabled"}}),
                json!({"Id": "DA000001", "CapacityBytes": 2400476553216_i64, "MediaType": "HDD",
                    "Model": "EG002400JWJNT", "Status": {"State": "Enabled"}}),
                json!({"Id": "empty-bay", "Status": {"State": "Absent"}}),
                json!({"Id": "no-size", "Status": {"State": "Enabled"}}),
            ],
            ..Default::default()
        };
        let inv = parse(&docs, now()).unwrap();
        assert_eq!(validate(&inv), Ok(()));
        let cpu = inv.cpu.unwrap();
        assert_eq!((cpu.sockets, cpu.cores, cpu.threads), (1, 2, 4));
        let disks = inv.disks.unwrap();
        assert_eq!(disks.origin.source, FactSource::Redfish);
        let summary: Vec<(&str, i64, Option<bool>, Option<&str>)> = disks
            .devices
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.size_bytes,
                    d.rotational,
                    d.wwn.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "Disk.Bay.0:Enclosure.Internal.0-1:RAID.SL.3-1",
                    479_559_942_144,
                    Some(false),
                    Some("5002538E00000001")
                ),
                ("DA000001", 2_400_476_553_216, Some(true), None),
            ],
            "an absent bay and a drive without a size are left out"
        );
    }

    #[test]
    fn not_a_system_is_an_error() {
        let docs = RedfishDocuments {
            system: json!({"@odata.type": "#Chassis.v1_14_0.Chassis"}),
            ..Default::default()
        };
        assert_eq!(
            parse(&docs, now()).unwrap_err(),
            RedfishInventoryError::NotASystem("#Chassis.v1_14_0.Chassis".into())
        );
    }
}
