//! The in-band inventory: what this machine is, read from `/proc` and `/sys` (and LLDP frames
//! from the switch), assembled into a [`MachineInventorySpec`] with every section tagged
//! `InBand` and the time it was read.
//!
//! The parsers are pure functions over text or bytes ([`procfs`], [`lldp`]) or over a root
//! directory ([`sysfs`]), so that tests run them on fixture trees; [`collect`] reads a root
//! (`/` on a machine) and assembles; [`collect_live`] adds what only the live machine
//! answers: the switches' LLDP frames on the NICs whose link is up ([`lldp_capture`], at most
//! 35 s in all) and the BMC's view of itself ([`bmc`]). Nothing here needs credentials: the inspection boot runs
//! it before the machine is claimed, and posts the result to the bootserver's discovery
//! endpoint.

use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use unbounded_api::inventory::{
    CpuFacts, DiskFacts, FactOrigin, FactSource, FirmwareFacts, MachineInventorySpec, MemoryFacts,
    NicFacts, PciFacts,
};

pub mod bmc;
pub mod lldp;
pub mod lldp_capture;
pub mod procfs;
pub mod sysfs;

/// Reads the inventory of the machine whose `/proc` and `/sys` hang from `root`. `arch` is the
/// kernel's architecture name (`std::env::consts::ARCH` on the machine itself); `boot_mac`
/// marks the NIC the machine network-booted from.
pub fn collect(root: &Path, arch: &str, boot_mac: Option<&str>, now: Time) -> MachineInventorySpec {
    let origin = || FactOrigin {
        source: FactSource::InBand,
        observed_at: now.clone(),
    };
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let cpu = read("proc/cpuinfo")
        .as_deref()
        .and_then(procfs::parse_cpuinfo)
        .map(|c| CpuFacts {
            origin: origin(),
            architecture: arch.to_owned(),
            model: c.model,
            sockets: c.sockets,
            cores: c.cores,
            threads: c.threads,
            flags: c.flags,
        });
    let usable = read("proc/meminfo")
        .as_deref()
        .and_then(procfs::parse_meminfo_total);
    let memory = sysfs::read_memory_blocks(root)
        .or(usable)
        .map(|total_bytes| MemoryFacts {
            origin: origin(),
            total_bytes,
            usable_bytes: usable,
            dimms: Vec::new(),
        });
    let disks = sysfs::read_disks(root);
    let nics = sysfs::read_nics(root, boot_mac);
    let pci = sysfs::read_pci(root);
    let (mode, secure_boot) = sysfs::read_firmware(root);
    MachineInventorySpec {
        cpu,
        memory,
        disks: Some(DiskFacts {
            origin: origin(),
            devices: disks,
        }),
        nics: (!nics.is_empty()).then(|| NicFacts {
            origin: origin(),
            interfaces: nics,
        }),
        system: sysfs::read_dmi(root, origin()),
        pci: (!pci.is_empty()).then(|| PciFacts {
            origin: origin(),
            devices: pci,
        }),
        firmware: Some(FirmwareFacts {
            origin: origin(),
            mode,
            secure_boot,
        }),
        bmc: None,
        reads: Vec::new(),
        disagreements: Vec::new(),
    }
}

/// [`collect`], then what only the live machine can answer: the switches' LLDP frames on
/// the NICs whose link is up (all at once, at most `lldp_wait`; see [`lldp_capture`] for why
/// 35 s), each switch port put on its NIC, and the BMC's own view of itself ([`bmc`]: the
/// IPMI LAN channel through `ipmitool` when there is an IPMI device, the Redfish host
/// interface from SMBIOS). `root` is `/` on a machine: the sockets listen on this machine's
/// interfaces.
pub async fn collect_live(
    root: &Path,
    arch: &str,
    boot_mac: Option<&str>,
    now: Time,
    lldp_wait: std::time::Duration,
) -> MachineInventorySpec {
    let mut inventory = collect(root, arch, boot_mac, now.clone());
    let origin = FactOrigin {
        source: FactSource::InBand,
        observed_at: now,
    };
    let bmc = bmc::read(root, origin);
    let lldp = async {
        let Some(nics) = inventory.nics.as_mut() else {
            return;
        };
        let listeners = lldp_capture::listeners(nics);
        if listeners.is_empty() {
            return;
        }
        let heard = lldp_capture::capture(&listeners, lldp_wait).await;
        println!(
            "unbounded-agent: LLDP: heard a switch on {} of {} NICs with link",
            heard.len(),
            listeners.len()
        );
        lldp_capture::attach(nics, &heard);
    };
    let ((), bmc) = tokio::join!(lldp, bmc);
    if let Some(bmc) = &bmc {
        println!(
            "unbounded-agent: BMC: {} (suggested address {})",
            [
                bmc.ipmi_lan.as_ref().map(|_| "IPMI LAN channel"),
                bmc.redfish_host_interface
                    .as_ref()
                    .map(|_| "Redfish host interface")
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and "),
            bmc.suggested_address.as_deref().unwrap_or("none")
        );
    }
    inventory.bmc = bmc;
    inventory
}
