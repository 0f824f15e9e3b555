//! What `scenario discovery` expects of each VM it boots: the shapes, the BMC inside each,
//! the Machine discovery must make of it and the inventory its agent must report. Pure
//! checks over plain objects, tested here on reported and wrong facts.

use std::collections::BTreeMap;

use unbounded_api::inventory::{FactSource, MachineInventorySpec, labels};
use unbounded_api::well_known::{conditions, discovery, labels as well_known_labels, reasons};
use unbounded_api::{Firmware, Machine, MachinePhase, condition};

use crate::bmc;

/// Memory as the guest counts it may differ from the domain's by this share.
const MEMORY_TOLERANCE: f64 = 0.05;

/// One VM the scenario boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory.
    pub memory_mib: u32,
    /// Data disks (beside the domain's 64 MiB boot disk).
    pub data_disks_gib: Vec<u32>,
}

/// The two shapes: only the second has the 2 CPUs the pool requires.
pub fn shapes() -> [Shape; 2] {
    [
        Shape {
            vcpus: 1,
            memory_mib: 1280,
            data_disks_gib: vec![4],
        },
        Shape {
            vcpus: 2,
            memory_mib: 2048,
            data_disks_gib: vec![4, 6],
        },
    ]
}

/// The BMC a VM carries inside, as its OS sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InBandBmc {
    /// An IPMI BMC behind the VM's KCS interface whose LAN channel says `ip` and `mac`.
    Ipmi {
        /// The LAN channel's address: the host's end of the lab's routed link, where the
        /// simulator listens.
        ip: String,
        /// The LAN channel's MAC.
        mac: String,
    },
    /// Only a Redfish host interface (SMBIOS type 42) whose service is at `service_address`.
    RedfishHostInterface {
        /// The service's address on the host interface.
        service_address: String,
    },
}

/// The LLDP sender's system name and port: lldpd on the lab's bridge.
pub(super) const SWITCH_NAME: &str = "tb-switch";
pub(super) const SWITCH_PORT: &str = "br0";

/// The Redfish host interface's service address in the second VM's SMBIOS type 42.
const HOST_INTERFACE_SERVICE: [u8; 4] = [169, 254, 95, 118];

/// The VMs of a run of process `pid`: one per shape, MACs `52:54:00:99:0d:<n>` (the lab's
/// machines have `52:54:00:99:00:<n>`, the first VM's BMC `52:54:00:99:0b:01`), domains
/// `ub-d<pid>-<n>`, serials `TB-DISCO-<pid>-<n>`.
pub fn expected_vms(pid: u32) -> Vec<Expected> {
    shapes()
        .into_iter()
        .enumerate()
        .map(|(i, shape)| {
            let index = i + 1;
            let bmc = if index == 1 {
                InBandBmc::Ipmi {
                    ip: host_route_address(),
                    mac: format!("52:54:00:99:0b:{index:02x}"),
                }
            } else {
                InBandBmc::RedfishHostInterface {
                    service_address: std::net::Ipv4Addr::from(HOST_INTERFACE_SERVICE).to_string(),
                }
            };
            Expected {
                mac: format!("52:54:00:99:0d:{index:02x}"),
                // Short: a virtio disk serial holds 20 bytes, and `data2-` comes before it.
                domain: format!("{}{pid}-{index}", domain_prefix()),
                serial: format!("TB-DISCO-{pid}-{index}"),
                shape,
                bmc,
                switch: None,
            }
        })
        .collect()
}

/// The host's end of the lab's routed link (both lab modes have it): QEMU in the lab's
/// namespace reaches a BMC simulator on the host there.
fn host_route_address() -> String {
    let (host_cidr, _, _) = crate::appliance::HOST_ROUTE;
    host_cidr.split('/').next().unwrap_or(host_cidr).to_owned()
}

/// What a discovered VM must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Its shape.
    pub shape: Shape,
    /// Its MAC (lower case).
    pub mac: String,
    /// The libvirt domain (its data disks' serials are named after it).
    pub domain: String,
    /// The SMBIOS system serial set on it.
    pub serial: String,
    /// The BMC inside it.
    pub bmc: InBandBmc,
    /// The system name of the LLDP sender on the lab's bridge, when one runs: the NIC the VM
    /// booted from hears it on port `br0`.
    pub switch: Option<String>,
}

impl Expected {
    /// The Machine discovery names it: `discovered-<boot MAC without colons>`.
    pub fn machine_name(&self) -> String {
        format!("discovered-{}", self.mac.replace(':', ""))
    }

    /// Its disks as the guest sees them: the boot disk and the data disks.
    pub(super) fn disk_count(&self) -> usize {
        1 + self.shape.data_disks_gib.len()
    }
}

/// What is wrong with a discovered VM's inventory (empty: nothing).
pub fn inventory_problems(expected: &Expected, inventory: &MachineInventorySpec) -> Vec<String> {
    let mut problems = Vec::new();
    let mut say = |m: String| problems.push(m);
    let in_band = |name: &str, source: FactSource, say: &mut dyn FnMut(String)| {
        if source != FactSource::InBand {
            say(format!("{name} comes from {source:?}, not InBand"));
        }
    };
    match &inventory.cpu {
        None => say("no cpu section".into()),
        Some(cpu) => {
            in_band("cpu", cpu.origin.source, &mut say);
            if u32::try_from(cpu.threads).ok() != Some(expected.shape.vcpus) {
                say(format!(
                    "{} logical CPUs, not {}",
                    cpu.threads, expected.shape.vcpus
                ));
            }
            if cpu.architecture != "x86_64" {
                say(format!("architecture {}, not x86_64", cpu.architecture));
            }
        }
    }
    match &inventory.memory {
        None => say("no memory section".into()),
        Some(memory) => {
            in_band("memory", memory.origin.source, &mut say);
            let want = f64::from(expected.shape.memory_mib) * 1024.0 * 1024.0;
            #[allow(clippy::cast_precision_loss)] // bytes of memory: far below 2^52
            let have = memory.total_bytes as f64;
            if (have - want).abs() > want * MEMORY_TOLERANCE {
                say(format!(
                    "memory {} bytes, not {} MiB ±5 %",
                    memory.total_bytes, expected.shape.memory_mib
                ));
            }
        }
    }
    match &inventory.disks {
        None => say("no disks section".into()),
        Some(disks) => {
            in_band("disks", disks.origin.source, &mut say);
            if disks.devices.len() != expected.disk_count() {
                say(format!(
                    "{} disks, not {} (the boot disk and {} data disks)",
                    disks.devices.len(),
                    expected.disk_count(),
                    expected.shape.data_disks_gib.len()
                ));
            }
            for (index, gib) in expected.shape.data_disks_gib.iter().enumerate() {
                let serial = bmc::data_disk_serial(index, &expected.domain);
                let size = i64::from(*gib) << 30;
                match disks
                    .devices
                    .iter()
                    .find(|d| d.serial.as_deref() == Some(serial.as_str()))
                {
                    None => say(format!("no disk with serial {serial}")),
                    Some(disk) if disk.size_bytes != size => say(format!(
                        "disk {serial} ({}) has {} bytes, not {gib} GiB",
                        disk.name, disk.size_bytes
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    match &inventory.nics {
        None => say("no nics section".into()),
        Some(nics) => {
            in_band("nics", nics.origin.source, &mut say);
            match nics.interfaces.iter().find(|n| n.mac == expected.mac) {
                None => say(format!("no NIC with MAC {}", expected.mac)),
                Some(nic) if !nic.pxe_booted || !nic.link => say(format!(
                    "NIC {} ({}): pxeBooted {}, link {}; both should be true",
                    nic.name, nic.mac, nic.pxe_booted, nic.link
                )),
                Some(nic) => {
                    let heard = nic
                        .lldp
                        .as_ref()
                        .map(|l| (l.system_name.as_deref(), l.port_id.as_str()));
                    if let Some(switch) = &expected.switch
                        && heard != Some((Some(switch.as_str()), SWITCH_PORT))
                    {
                        say(format!(
                            "NIC {} heard LLDP {heard:?}, not {switch} port {SWITCH_PORT}",
                            nic.name
                        ));
                    }
                }
            }
        }
    }
    match &inventory.system {
        None => say("no system section".into()),
        Some(system) => {
            in_band("system", system.origin.source, &mut say);
            if system.serial.as_deref() != Some(expected.serial.as_str()) {
                say(format!(
                    "SMBIOS serial {:?}, not {}",
                    system.serial, expected.serial
                ));
            }
        }
    }
    match &inventory.firmware {
        None => say("no firmware section".into()),
        Some(firmware) => {
            in_band("firmware", firmware.origin.source, &mut say);
            if firmware.mode != Firmware::Bios {
                say(format!("firmware {:?}, not BIOS", firmware.mode));
            }
        }
    }
    if let Some(pci) = &inventory.pci {
        in_band("pci", pci.origin.source, &mut say);
    }
    match (&inventory.bmc, &expected.bmc) {
        (None, _) => say("no bmc section".into()),
        (Some(bmc), InBandBmc::Ipmi { ip, mac }) => {
            in_band("bmc", bmc.origin.source, &mut say);
            let lan = bmc.ipmi_lan.as_ref();
            if lan.map(|l| (l.ip_address.as_str(), l.mac.as_deref()))
                != Some((ip.as_str(), Some(mac.as_str())))
            {
                say(format!(
                    "BMC LAN channel {lan:?}, not address {ip} and MAC {mac}"
                ));
            }
            let want = format!("ipmi://{ip}");
            if bmc.suggested_address.as_deref() != Some(want.as_str()) {
                say(format!(
                    "suggested BMC address {:?}, not {want}",
                    bmc.suggested_address
                ));
            }
        }
        (Some(bmc), InBandBmc::RedfishHostInterface { service_address }) => {
            in_band("bmc", bmc.origin.source, &mut say);
            let seen = bmc
                .redfish_host_interface
                .as_ref()
                .map(|h| h.service_address.as_str());
            if seen != Some(service_address.as_str()) {
                say(format!(
                    "Redfish host interface at {seen:?}, not {service_address}"
                ));
            }
            if bmc.suggested_address.is_some() || bmc.ipmi_lan.is_some() {
                say(format!(
                    "a BMC suggestion {:?} from a machine without an IPMI LAN channel",
                    bmc.suggested_address
                ));
            }
        }
    }
    problems
}

/// What is wrong with a discovered VM's Machine while it waits to be claimed.
pub fn machine_problems(expected: &Expected, machine: &Machine) -> Vec<String> {
    let mut problems = Vec::new();
    let labels = machine.metadata.labels.clone().unwrap_or_default();
    let name = machine.metadata.name.clone().unwrap_or_default();
    if name != expected.machine_name() {
        problems.push(format!("named {name}, not {}", expected.machine_name()));
    }
    let macs = machine
        .spec
        .pxe
        .as_ref()
        .map(|p| p.mac_addresses.clone())
        .unwrap_or_default();
    if macs != [expected.mac.clone()] {
        problems.push(format!("MACs {macs:?}, not [{}]", expected.mac));
    }
    if let Some(reference) = &machine.spec.configuration_ref {
        problems.push(format!("has configurationRef {}", reference.name));
    }
    if machine.spec.pxe.as_ref().is_some_and(|p| p.bmc.is_some()) {
        problems.push("has a BMC".into());
    }
    let want: BTreeMap<&str, String> = [
        (well_known_labels::DISCOVERY, discovery::WAITING.to_owned()),
        (labels::ARCH, "amd64".to_owned()),
        (labels::CPUS, expected.shape.vcpus.to_string()),
        (
            labels::MEMORY_GIB,
            ((expected.shape.memory_mib + 512) / 1024).to_string(),
        ),
        (labels::DISKS, expected.disk_count().to_string()),
        (labels::VENDOR, "QEMU".to_owned()),
    ]
    .into_iter()
    .collect();
    for (key, value) in want {
        let have = labels.get(key);
        if have != Some(&value) {
            problems.push(format!("label {key}={have:?}, not {value}"));
        }
    }
    let status = machine.status.clone().unwrap_or_default();
    if status.phase != Some(MachinePhase::Pending) {
        problems.push(format!("phase {:?}, not Pending", status.phase));
    }
    match condition::find(&status.conditions, conditions::DISCOVERED) {
        Some(c) if c.status == "True" && c.reason == reasons::AWAITING_CLAIM => {}
        other => problems.push(format!(
            "condition Discovered is {:?}, not True/{}",
            other.map(|c| (&c.status, &c.reason)),
            reasons::AWAITING_CLAIM
        )),
    }
    problems
}

/// The prefix of this scenario's domains (the lab's are `ub-<pid>-<n>`).
pub(super) fn domain_prefix() -> String {
    format!("{}d", bmc::TEST_DOMAIN_PREFIX)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn small() -> Expected {
        let mut vm = expected_vms(4_194_304).remove(0);
        vm.switch = Some(SWITCH_NAME.to_owned());
        vm
    }

    /// What the agent reports for [`small`] (its shape as a QEMU guest would show it).
    fn reported(vm: &Expected) -> MachineInventorySpec {
        let origin = serde_json::json!({"source": "InBand", "observedAt": "2026-01-01T00:00:00Z"});
        let mut disks = vec![serde_json::json!({"name": "vda", "sizeBytes": 64 << 20})];
        for (i, gib) in vm.shape.data_disks_gib.iter().enumerate() {
            disks.push(serde_json::json!({
                "name": format!("vd{}", char::from(b'b' + u8::try_from(i).unwrap())),
                "sizeBytes": i64::from(*gib) << 30,
                "serial": bmc::data_disk_serial(i, &vm.domain),
            }));
        }
        serde_json::from_value(serde_json::json!({
            "cpu": {"origin": origin, "architecture": "x86_64", "sockets": vm.shape.vcpus, "cores": 1, "threads": vm.shape.vcpus},
            "memory": {"origin": origin, "totalBytes": i64::from(vm.shape.memory_mib) << 20},
            "disks": {"origin": origin, "devices": disks},
            "nics": {"origin": origin, "interfaces": [
                {"name": "ens3", "mac": vm.mac, "link": true, "pxeBooted": true,
                 "lldp": {"chassisId": "02:00:00:00:00:01", "portId": SWITCH_PORT, "systemName": SWITCH_NAME}}
            ]},
            "system": {"origin": origin, "vendor": "QEMU", "serial": vm.serial},
            "pci": {"origin": origin, "devices": []},
            "firmware": {"origin": origin, "mode": "bios"},
            "bmc": match &vm.bmc {
                InBandBmc::Ipmi { ip, mac } => serde_json::json!({
                    "origin": origin,
                    "suggestedAddress": format!("ipmi://{ip}"),
                    "ipmiLan": {"channel": 1, "ipAddress": ip, "mac": mac, "ipSource": "static"},
                }),
                InBandBmc::RedfishHostInterface { service_address } => serde_json::json!({
                    "origin": origin,
                    "redfishHostInterface": {"serviceAddress": service_address, "port": 443},
                }),
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_reported_shape_passes_and_each_wrong_fact_is_named() {
        let vm = small();
        assert_eq!(
            inventory_problems(&vm, &reported(&vm)),
            Vec::<String>::new()
        );
        let big = expected_vms(7).remove(1);
        assert_eq!(
            inventory_problems(&big, &reported(&big)),
            Vec::<String>::new()
        );
        let mut suggested = reported(&big);
        suggested.bmc.as_mut().unwrap().suggested_address = Some("redfish://10.0.0.1".into());
        assert_eq!(
            inventory_problems(&big, &suggested).len(),
            1,
            "a host interface alone suggests nothing"
        );

        type Change = fn(&mut MachineInventorySpec);
        let cases: [(&str, Change, &str); 15] = [
            (
                "CPUs",
                |i| i.cpu.as_mut().unwrap().threads = 2,
                "logical CPUs",
            ),
            (
                "memory 6 % short",
                |i| {
                    let m = i.memory.as_mut().unwrap();
                    m.total_bytes = m.total_bytes * 94 / 100;
                },
                "memory",
            ),
            (
                "a data disk's size",
                |i| i.disks.as_mut().unwrap().devices[1].size_bytes += 512,
                "bytes, not 4 GiB",
            ),
            (
                "a data disk's serial missing",
                |i| i.disks.as_mut().unwrap().devices[1].serial = None,
                "no disk with serial",
            ),
            (
                "an extra disk",
                |i| {
                    let d = i.disks.as_mut().unwrap();
                    let extra = d.devices[0].clone();
                    d.devices.push(extra);
                },
                "3 disks, not 2",
            ),
            (
                "the NIC's MAC",
                |i| i.nics.as_mut().unwrap().interfaces[0].mac = "52:54:00:00:00:01".into(),
                "no NIC with MAC",
            ),
            (
                "not the boot NIC",
                |i| i.nics.as_mut().unwrap().interfaces[0].pxe_booted = false,
                "pxeBooted false",
            ),
            (
                "the SMBIOS serial",
                |i| i.system.as_mut().unwrap().serial = Some("To Be Filled By O.E.M.".into()),
                "SMBIOS serial",
            ),
            (
                "firmware",
                |i| i.firmware.as_mut().unwrap().mode = Firmware::Uefi,
                "not BIOS",
            ),
            (
                "a section from Redfish",
                |i| i.system.as_mut().unwrap().origin.source = FactSource::Redfish,
                "system comes from Redfish",
            ),
            (
                "no memory section",
                |i| i.memory = None,
                "no memory section",
            ),
            (
                "the BMC's LAN address",
                |i| {
                    i.bmc
                        .as_mut()
                        .unwrap()
                        .ipmi_lan
                        .as_mut()
                        .unwrap()
                        .ip_address = "10.99.1.9".into()
                },
                "BMC LAN channel",
            ),
            (
                "a suggestion that is not the LAN address",
                |i| i.bmc.as_mut().unwrap().suggested_address = Some("ipmi://10.99.1.9".into()),
                "suggested BMC address",
            ),
            ("no BMC read", |i| i.bmc = None, "no bmc section"),
            (
                "no switch heard",
                |i| i.nics.as_mut().unwrap().interfaces[0].lldp = None,
                "heard LLDP None",
            ),
        ];
        for (what, change, expected) in cases {
            let mut inventory = reported(&vm);
            change(&mut inventory);
            let problems = inventory_problems(&vm, &inventory);
            assert!(
                problems.len() == 1 && problems[0].contains(expected),
                "{what}: {problems:?}"
            );
        }
    }

    pub(crate) fn waiting_machine(vm: &Expected) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": vm.machine_name(), "labels": {
                "unbounded-cloud.io/discovery": "waiting",
                "hardware.unbounded-cloud.io/arch": "amd64",
                "hardware.unbounded-cloud.io/cpus": "1",
                "hardware.unbounded-cloud.io/memory-gib": "1",
                "hardware.unbounded-cloud.io/disks": "2",
                "hardware.unbounded-cloud.io/vendor": "QEMU",
            }},
            "spec": {"provider": "pxe", "pxe": {"macAddresses": [vm.mac], "firmware": "bios"}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "Discovered", "status": "True", "reason": "WaitingToBeClaimed",
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"
            }]},
        }))
        .unwrap()
    }

    #[test]
    fn a_waiting_machine_passes_and_each_wrong_fact_is_named() {
        let vm = small();
        assert_eq!(
            machine_problems(&vm, &waiting_machine(&vm)),
            Vec::<String>::new()
        );
        type Change = fn(&mut Machine);
        let cases: [(&str, Change, &str); 6] = [
            (
                "claimed",
                |m| {
                    m.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert("unbounded-cloud.io/discovery".into(), "claimed".into());
                },
                "discovery",
            ),
            (
                "CPU label",
                |m| {
                    m.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert(labels::CPUS.into(), "2".into());
                },
                "cpus",
            ),
            (
                "disk label missing",
                |m| {
                    m.metadata.labels.as_mut().unwrap().remove(labels::DISKS);
                },
                "disks=None",
            ),
            (
                "another name",
                |m| m.metadata.name = Some("discovered-525400990d09".into()),
                "named",
            ),
            (
                "a configuration",
                |m| {
                    m.spec.configuration_ref = Some(
                        serde_json::from_value(serde_json::json!({"name": "testbed"})).unwrap(),
                    );
                },
                "configurationRef",
            ),
            (
                "not Pending yet",
                |m| m.status.as_mut().unwrap().phase = None,
                "not Pending",
            ),
        ];
        for (what, change, expected) in cases {
            let mut machine = waiting_machine(&vm);
            change(&mut machine);
            let problems = machine_problems(&vm, &machine);
            assert!(
                problems.len() == 1 && problems[0].contains(expected),
                "{what}: {problems:?}"
            );
        }
    }

    #[test]
    fn the_vms_fit_virtio_serials_and_the_pool_would_pick_the_small_one_first() {
        // Linux pids go up to 2^22.
        for pid in [1, 4_194_304] {
            let vms = expected_vms(pid);
            for vm in &vms {
                for i in 0..vm.shape.data_disks_gib.len() {
                    let serial = bmc::data_disk_serial(i, &vm.domain);
                    assert!(serial.len() <= 20, "{serial} is cut by virtio-blk");
                }
                assert!(
                    !vm.mac.starts_with("52:54:00:99:00:"),
                    "a lab machine's MAC"
                );
            }
            // Only the second meets the pool's 2 CPUs; it must not also be the first by
            // name, or a pool ignoring the requirement would pick it anyway.
            assert!(vms[0].machine_name() < vms[1].machine_name());
            assert_eq!((vms[0].shape.vcpus, vms[1].shape.vcpus), (1, 2));
        }
    }
}
