//! The VMs of one run: each defined with its shape, serial and MAC, its BMC inside
//! ([`InBandBmc`]), started with `virsh start`; destroyed and undefined when dropped, and a
//! killed run's found and removed.

use super::expect::{Expected, InBandBmc, domain_prefix};
use crate::bmc::{self, Domain, DomainOptions};
use crate::failure::Failure;
use crate::lab::LabError;

/// The VMs of one run: defined and started, destroyed and undefined when dropped, with
/// their in-band BMCs (simulators stopped, SMBIOS files removed on drop).
pub(super) struct Vms {
    pub(super) expected: Vec<Expected>,
    pub(super) domains: Vec<Domain>,
    _bmcs: Vec<bmc::IpmiSim>,
    _smbios: tempfile::TempDir,
}

/// The QEMU arguments that put `vm`'s BMC inside it: a simulator started (and its LAN
/// channel set) for an IPMI BMC, an SMBIOS type 42 file for a Redfish host interface.
fn in_band_bmc(
    vm: &Expected,
    smbios_dir: &std::path::Path,
    bmcs: &mut Vec<bmc::IpmiSim>,
) -> Result<Vec<String>, LabError> {
    match &vm.bmc {
        InBandBmc::Ipmi { ip, mac } => {
            let sim = bmc::IpmiSim::start_for_vm(None, ip, "tb-discovery", "tb-discovery-pw")
                .map_err(Failure::of)?;
            sim.set_lan(ip, mac).map_err(Failure::of)?;
            let args = sim.qemu_args();
            bmcs.push(sim);
            Ok(args)
        }
        InBandBmc::RedfishHostInterface { service_address } => {
            let address: std::net::Ipv4Addr = service_address
                .parse()
                .map_err(|e| Failure::new(service_address, e))?;
            let uuid = uuid_bytes(&vm.domain);
            let file = smbios_dir.join(format!("{}-type42.bin", vm.domain));
            std::fs::write(
                &file,
                bmc::smbios::host_interface_structure(address, 443, uuid, "tb-bmc"),
            )
            .map_err(|e| Failure::new(file.display(), e))?;
            Ok(vec!["-smbios".into(), format!("file={}", file.display())])
        }
    }
}

/// Sixteen bytes named after `domain` (the host interface's service UUID).
fn uuid_bytes(domain: &str) -> [u8; 16] {
    let mut bytes = [0x5a_u8; 16];
    for (slot, b) in bytes.iter_mut().zip(domain.bytes()) {
        *slot ^= b;
    }
    bytes
}

impl Vms {
    pub(super) fn start(expected: Vec<Expected>, say: &dyn Fn(&str)) -> Result<Self, LabError> {
        let mut domains = Vec::new();
        let mut bmcs = Vec::new();
        let smbios = tempfile::tempdir().map_err(Failure::of)?;
        for vm in &expected {
            let shape = &vm.shape;
            say(&format!(
                "discovery: VM {} ({} vCPU, {} MiB, data disks {:?} GiB, MAC {}, serial {}, inside {:?}), no Machine, no BMC told",
                vm.domain,
                shape.vcpus,
                shape.memory_mib,
                shape.data_disks_gib,
                vm.mac,
                vm.serial,
                vm.bmc
            ));
            let qemu_args = in_band_bmc(vm, smbios.path(), &mut bmcs)?;
            // Pushed at once: a domain defined is undefined when `domains` drops, also when a
            // later one fails.
            domains.push(
                Domain::define_with(
                    &vm.domain,
                    &vm.mac,
                    "br0",
                    &DomainOptions {
                        uefi: false,
                        memory_mib: shape.memory_mib,
                        vcpus: shape.vcpus,
                        network_fallback: true,
                        data_disks_gib: shape.data_disks_gib.clone(),
                        smbios_serial: Some(vm.serial.clone()),
                        qemu_args,
                        tpm: true,
                    },
                )
                .map_err(Failure::of)?,
            );
        }
        for domain in &domains {
            bmc::virsh(&["start", &domain.name]).map_err(Failure::of)?;
        }
        Ok(Self {
            expected,
            domains,
            _bmcs: bmcs,
            _smbios: smbios,
        })
    }

    pub(super) fn consoles(&self) -> String {
        self.domains
            .iter()
            .map(|d| {
                format!(
                    "--- console of {} ---\n{}",
                    d.name,
                    crate::qemu::console_tail(&d.console(), 2000)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Destroys and undefines every domain of this scenario still defined (a killed run's).
pub(super) fn destroy_leftover_domains() -> Result<(), LabError> {
    let listed = bmc::virsh(&["list", "--all", "--name"]).map_err(Failure::of)?;
    for name in listed.lines().map(str::trim) {
        if name.starts_with(&domain_prefix()) {
            let _ = bmc::virsh(&["destroy", name]);
            bmc::virsh(&["undefine", "--nvram", name]).map_err(Failure::of)?;
        }
    }
    Ok(())
}
