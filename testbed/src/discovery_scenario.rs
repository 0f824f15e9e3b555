//! The discovery scenario on a running lab (`testbed up`, either mode): servers nobody
//! declared become Machines with their facts, and a pool claims the right one by hardware.
//!
//! 1. Two VMs of different shapes join the lab's bridge ([`SHAPES`]: 1 vCPU, 1280 MiB, one
//!    data disk; 2 vCPUs, 2048 MiB, two data disks), each with an SMBIOS system serial, a
//!    MAC no Machine has, network boot on every boot, and **no BMC anyone told us about**.
//!    Each has one inside, as servers do ([`InBandBmc`]): the first an IPMI BMC (OpenIPMI's
//!    `ipmi_sim` behind the VM's KCS interface, its LAN channel set to the address it
//!    listens on), the second only a Redfish host interface (an SMBIOS type 42 structure).
//!    They are started with `virsh start`.
//! 2. The lab's bootserver discovers unknown machines ([`crate::lab::discovery`]): each VM
//!    boots the host OS in inspection mode and its agent reports. Checked for each: a
//!    Machine `discovered-<MAC>` with that MAC, no configuration, phase `Pending`, condition
//!    `Discovered=True/WaitingToBeClaimed`, label `unbounded-cloud.io/discovery=waiting` and
//!    the hardware labels of its shape; and its MachineInventory ([`inventory_problems`]):
//!    CPUs, memory (±5 %), the data disks by serial and size, the NIC it booted from, the
//!    SMBIOS serial, BIOS firmware, the BMC as the machine sees it (the first: its LAN
//!    channel's address and MAC, suggested as `ipmi://<address>`; the second: the host
//!    interface's service address and no suggestion), every section tagged `InBand`.
//! 3. The scenario, as the operator, gives both discovered Machines their BMC: the lab's
//!    sushy-tools (Redfish), which serves every libvirt domain by UUID, with the lab's BMC
//!    Secret. The claim path needs it: the controller grants a `pxe` Machine's agent its
//!    ServiceAccount only once the provider reports `InfrastructureReady` (or an agent has
//!    reported), so a claimed Machine without a BMC boots but never gets credentials.
//!    Checked: both become `InfrastructureReady` and still wait.
//! 4. A MachinePool for two machines, selecting discovered Machines that wait and requiring
//!    at least 2 CPUs (`hardwareRequirements`), with the lab's configuration: it claims the
//!    larger VM and only it (the smaller sorts first by name, so a pool ignoring the
//!    requirement would take it); the smaller stays `waiting`, `Pending`, in no pool.
//! 5. The claimed Machine becomes `Running` with a Ready Node. It is powered on already (a
//!    claim power-cycles only a Machine found off): its inspection agent asks every 15 s
//!    whether it was claimed, is answered 409 `known` once it is, and reboots the VM into its
//!    network boot, which now serves the Machine's own script.
//! 6. Clean-up, also after a failure, and first of all a killed run's leftovers: both
//!    Machines are deleted while their VMs run (the provider powers them off through their
//!    BMCs; their MachineInventories go with them), then the pool, the VMs, and the Node.
//!
//! A switch: `lldpd` on the lab's bridge (in the lab's namespace), whose frames reach every
//! VM; each discovered VM's boot NIC must have heard it (system name `tb-switch`, port `br0`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use unbounded_api::inventory::{FactSource, MachineInventory, MachineInventorySpec, labels};
use unbounded_api::well_known::{conditions, discovery, labels as well_known_labels, reasons};
use unbounded_api::{Firmware, Machine, MachinePhase, SecretReference, condition};

use crate::bmc::{self, Domain, DomainOptions};
use crate::lab::LabError;
use crate::scenario::{Lab, get, step, wait_until};

const POOL: &str = "tb-discovery";
/// How often a waiting inspection agent reports again (`unbounded_agent::inspect::REREPORT`),
/// plus its LLDP wait before each report: the longest a claim waits for the reboot.
const REPORT_CYCLE: Duration = Duration::from_secs(300 + 35);
/// Memory as the guest counts it may differ from the domain's by this share.
const MEMORY_TOLERANCE: f64 = 0.05;
/// How often a waiting inspection agent asks whether it was claimed
/// (`unbounded_agent::inspect::CLAIM_POLL`; the testbed does not depend on the agent).
const CLAIM_POLL: Duration = Duration::from_secs(15);

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
const SWITCH_NAME: &str = "tb-switch";
const SWITCH_PORT: &str = "br0";

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
    fn disk_count(&self) -> usize {
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

/// The lab's Redfish BMC emulator as a lab Machine names it: its address up to the system's
/// UUID (`…/redfish/v1/Systems/`) and the BMC Secret. sushy-tools serves every libvirt
/// domain of the lab, so a new VM's BMC is that address with the domain's UUID.
pub fn lab_redfish(machines: &[Machine]) -> Option<(String, SecretReference)> {
    const SYSTEMS: &str = "/redfish/v1/Systems/";
    machines.iter().find_map(|m| {
        let bmc = m.spec.pxe.as_ref()?.bmc.as_ref()?;
        if !bmc.address.starts_with("redfish") {
            return None;
        }
        let end = bmc.address.find(SYSTEMS)? + SYSTEMS.len();
        Some((
            bmc.address[..end].to_owned(),
            bmc.credentials_secret_ref.clone(),
        ))
    })
}

/// The merge patch that gives a Machine the BMC `address` with `secret`.
fn bmc_patch(address: &str, secret: &SecretReference) -> String {
    serde_json::json!({"spec": {"pxe": {"bmc": {
        "address": address,
        "credentialsSecretRef": {"namespace": secret.namespace, "name": secret.name},
    }}}})
    .to_string()
}

/// Every Machine of the lab, typed.
fn machines(lab: &Lab) -> Result<Vec<Machine>, LabError> {
    let listing = lab.kubectl(&["get", "machines", "-o", "json"], None)?;
    let list: serde_json::Value =
        serde_json::from_str(&listing).map_err(|e| step(format!("kubectl get machines: {e}")))?;
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|item| serde_json::from_value(item).map_err(|e| step(format!("a Machine: {e}"))))
        .collect()
}

/// The Machine one of whose MACs is `mac`.
fn machine_with_mac<'a>(machines: &'a [Machine], mac: &str) -> Option<&'a Machine> {
    machines.iter().find(|m| {
        m.spec
            .pxe
            .as_ref()
            .is_some_and(|p| p.mac_addresses.iter().any(|a| a.eq_ignore_ascii_case(mac)))
    })
}

fn inventory_of(lab: &Lab, name: &str) -> Result<MachineInventory, LabError> {
    let text = lab.kubectl(&["get", "machineinventory", name, "-o", "json"], None)?;
    serde_json::from_str(&text).map_err(|e| step(format!("MachineInventory {name}: {e}")))
}

fn pool_yaml() -> String {
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {{name: {POOL}}}
spec:
  replicas: 2
  template:
    spec:
      provider: pxe
      pxe:
        inventorySelector: {{matchLabels: {{{discovery_label}: {waiting}}}}}
        hardwareRequirements: {{minCPUs: 2}}
      configurationRef: {{name: testbed}}
"#,
        discovery_label = well_known_labels::DISCOVERY,
        waiting = discovery::WAITING,
    )
}

/// The VMs of one run: defined and started, destroyed and undefined when dropped, with
/// their in-band BMCs (simulators stopped, SMBIOS files removed on drop).
struct Vms {
    expected: Vec<Expected>,
    domains: Vec<Domain>,
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
                .map_err(|e| step(e.to_string()))?;
            sim.set_lan(ip, mac).map_err(|e| step(e.to_string()))?;
            let args = sim.qemu_args();
            bmcs.push(sim);
            Ok(args)
        }
        InBandBmc::RedfishHostInterface { service_address } => {
            let address: std::net::Ipv4Addr = service_address
                .parse()
                .map_err(|e| step(format!("{service_address}: {e}")))?;
            let uuid = uuid_bytes(&vm.domain);
            let file = smbios_dir.join(format!("{}-type42.bin", vm.domain));
            std::fs::write(
                &file,
                bmc::smbios::host_interface_structure(address, 443, uuid, "tb-bmc"),
            )
            .map_err(|e| step(format!("{}: {e}", file.display())))?;
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
    fn start(expected: Vec<Expected>, say: &dyn Fn(&str)) -> Result<Self, LabError> {
        let mut domains = Vec::new();
        let mut bmcs = Vec::new();
        let smbios = tempfile::tempdir().map_err(|e| step(e.to_string()))?;
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
                    },
                )
                .map_err(|e| step(e.to_string()))?,
            );
        }
        for domain in &domains {
            bmc::virsh(&["start", &domain.name]).map_err(|e| step(e.to_string()))?;
        }
        Ok(Self {
            expected,
            domains,
            _bmcs: bmcs,
            _smbios: smbios,
        })
    }

    fn consoles(&self) -> String {
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

/// Deletes what a run (this one, or a killed one) left, each step tried whatever the one
/// before did: the Machines with the scenario's MACs first, while their VMs still run (a
/// Machine with a BMC is powered off through it before it goes), then the pool, the VMs
/// (`vms`, and any scenario domain a killed run left defined), and the Nodes and
/// MachineInventories left behind. Returns the first failure.
fn clean_up(lab: &Lab, names: &[String], vms: Option<Vms>) -> Result<(), LabError> {
    let mut first: Option<LabError> = None;
    let mut note = |result: Result<(), LabError>| {
        if let Err(e) = result {
            first.get_or_insert(e);
        }
    };
    for name in names {
        note(
            lab.kubectl(
                &[
                    "delete",
                    "machine",
                    name,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            )
            .map(drop),
        );
    }
    note(wait_until(
        "the discovered Machines to be deleted",
        Duration::from_secs(300),
        || {
            let left: Vec<&String> = names
                .iter()
                .filter(|n| !get(lab, "machine", n, "{.metadata.name}").is_empty())
                .collect();
            (left.is_empty(), format!("{left:?}"))
        },
    ));
    note(
        lab.kubectl(
            &[
                "delete",
                "machinepool",
                POOL,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
            ],
            None,
        )
        .map(drop),
    );
    drop(vms);
    note(destroy_leftover_domains());
    for name in names {
        // A destroyed VM's kubelet cannot register its Node again; the inventory is the
        // Machine's (garbage-collected), deleted here too in case the collector lags.
        for kind in ["node", "machineinventory"] {
            note(
                lab.kubectl(&["delete", kind, name, "--ignore-not-found"], None)
                    .map(drop),
            );
        }
    }
    first.map_or(Ok(()), Err)
}

/// The prefix of this scenario's domains (the lab's are `ub-<pid>-<n>`).
fn domain_prefix() -> String {
    format!("{}d", bmc::TEST_DOMAIN_PREFIX)
}

/// Destroys and undefines every domain of this scenario still defined (a killed run's).
fn destroy_leftover_domains() -> Result<(), LabError> {
    let listed = bmc::virsh(&["list", "--all", "--name"]).map_err(|e| step(e.to_string()))?;
    for name in listed.lines().map(str::trim) {
        if name.starts_with(&domain_prefix()) {
            let _ = bmc::virsh(&["destroy", name]);
            bmc::virsh(&["undefine", "--nvram", name]).map_err(|e| step(e.to_string()))?;
        }
    }
    Ok(())
}

/// What the scenario measured.
#[derive(Debug, Clone)]
pub struct DiscoveryFigures {
    /// From `virsh start` to each Machine's discovery, by Machine name.
    pub discovered: Vec<(String, Duration)>,
    /// From the pool's creation to the claimed Machine Running with a Ready Node (the full
    /// scenario only).
    pub claimed_to_running: Option<Duration>,
}

/// How much of the scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Both VMs, the BMCs given, the pool's claim and the claimed VM's Ready Node.
    Full,
    /// CI's reduced form (the end-to-end test): the first VM (its IPMI BMC inside, the
    /// switch on the bridge) discovered with the right Machine and inventory, then removed.
    Reduced,
}

/// Runs the scenario; cleans up after itself, also after a failure.
pub fn discovery(
    lab: &Lab,
    depth: Depth,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<DiscoveryFigures, LabError> {
    let mut expected = expected_vms(std::process::id());
    // Every VM's Machine is cleaned up, also in the reduced form: a killed full run's.
    let names: Vec<String> = expected.iter().map(Expected::machine_name).collect();
    if depth == Depth::Reduced {
        expected.truncate(1);
    }
    // A killed run's leftovers would turn this run's reports into updates, and its VMs
    // would answer with this run's MACs.
    clean_up(lab, &names, None)?;
    // A switch on the provisioning network: lldpd on the lab's bridge (a lab that an older
    // testbed started does not say its namespace; then no sender, and no LLDP expected).
    let _switch = match lab.netns() {
        Some(netns) => {
            let switch = crate::lldp::Lldpd::start(&netns, SWITCH_PORT, SWITCH_NAME, None)
                .map_err(|e| step(e.to_string()))?;
            say(&format!(
                "discovery: LLDP sender {SWITCH_NAME} on {SWITCH_PORT} in {netns}"
            ));
            for vm in &mut expected {
                vm.switch = Some(SWITCH_NAME.to_owned());
            }
            Some(switch)
        }
        None => {
            say("discovery: the lab does not say its namespace: no LLDP sender");
            None
        }
    };
    // Defined domains are destroyed and undefined when `Vms` drops, a failed start included.
    let vms = Vms::start(expected, say)?;
    let result =
        run(lab, &vms, depth, timeout, say).map_err(|e| step(format!("{e}\n{}", vms.consoles())));
    say("discovery: cleaning up (Machines, pool, VMs, Node)");
    let cleaned = clean_up(lab, &names, Some(vms));
    match (result, cleaned) {
        (Ok(figures), Ok(())) => Ok(figures),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), cleaned) => {
            if let Err(c) = cleaned {
                say(&format!("discovery: clean-up failed too: {c}"));
            }
            Err(e)
        }
    }
}

fn run(
    lab: &Lab,
    vms: &Vms,
    depth: Depth,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<DiscoveryFigures, LabError> {
    let started = Instant::now();
    let mut discovered: Vec<(String, Duration)> = Vec::new();
    let mut last = String::new();
    // One wait for both: they boot at once. The inventory is written before the Machine's
    // labels are complete and the controller's phase arrives: wait until the Machine is
    // right, then judge the inventory once.
    let deadline = started + timeout + REPORT_CYCLE;
    while discovered.len() < vms.expected.len() {
        let all = machines(lab)?;
        for vm in &vms.expected {
            let name = vm.machine_name();
            if discovered.iter().any(|(n, _)| *n == name) {
                continue;
            }
            match machine_with_mac(&all, &vm.mac) {
                None => last = format!("no Machine has {} yet", vm.mac),
                Some(machine) => {
                    let problems = machine_problems(vm, machine);
                    if problems.is_empty() {
                        let took = started.elapsed();
                        say(&format!(
                            "discovery: {name} discovered {:.0} s after power-on: waiting, Pending, labels {}",
                            took.as_secs_f64(),
                            hardware_labels_of(machine)
                        ));
                        discovered.push((name, took));
                    } else {
                        last = format!("{name}: {}", problems.join("; "));
                    }
                }
            }
        }
        if discovered.len() < vms.expected.len() {
            if Instant::now() > deadline {
                return Err(step(format!(
                    "timed out waiting for the VMs to be discovered; last seen: {last}"
                )));
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    for vm in &vms.expected {
        let name = vm.machine_name();
        let inventory = inventory_of(lab, &name)?;
        let problems = inventory_problems(vm, &inventory.spec);
        if !problems.is_empty() {
            return Err(step(format!(
                "the inventory of {name} is wrong: {}",
                problems.join("; ")
            )));
        }
        say(&format!(
            "discovery: {name}'s inventory: {} CPUs, {} bytes of memory, {} disks (data disks by serial and size), NIC {} booted, serial {}, BIOS, BMC {:?} (suggested {}), all InBand",
            vm.shape.vcpus,
            inventory.spec.memory.as_ref().map_or(0, |m| m.total_bytes),
            vm.disk_count(),
            vm.mac,
            vm.serial,
            vm.bmc,
            inventory
                .spec
                .bmc
                .as_ref()
                .and_then(|b| b.suggested_address.as_deref())
                .unwrap_or("nothing"),
        ));
    }

    if depth == Depth::Reduced {
        return Ok(DiscoveryFigures {
            discovered,
            claimed_to_running: None,
        });
    }

    // 3. The operator gives the discovered Machines their BMCs.
    let (base, secret) = lab_redfish(&machines(lab)?).ok_or_else(|| {
        step("no lab Machine has a Redfish BMC: the scenario takes the lab's sushy-tools address from one")
    })?;
    for (vm, domain) in vms.expected.iter().zip(&vms.domains) {
        let address = format!("{base}{}", domain.uuid);
        say(&format!(
            "discovery: {} gets its BMC {address}",
            vm.machine_name()
        ));
        lab.kubectl(
            &[
                "patch",
                "machine",
                &vm.machine_name(),
                "--type=merge",
                "-p",
                &bmc_patch(&address, &secret),
            ],
            None,
        )?;
    }
    for vm in &vms.expected {
        let name = vm.machine_name();
        wait_until(
            &format!("{name} InfrastructureReady through its BMC, still waiting"),
            Duration::from_secs(180),
            || {
                let ready = get(
                    lab,
                    "machine",
                    &name,
                    "{.status.conditions[?(@.type==\"InfrastructureReady\")].status}",
                );
                let waiting = get(
                    lab,
                    "machine",
                    &name,
                    "{.metadata.labels.unbounded-cloud\\.io/discovery}",
                );
                (
                    ready == "True" && waiting == discovery::WAITING,
                    format!("InfrastructureReady {ready:?}, discovery={waiting:?}"),
                )
            },
        )?;
    }

    // 4. The pool claims by hardware.
    let (small, big) = (
        vms.expected[0].machine_name(),
        vms.expected[1].machine_name(),
    );
    say(&format!(
        "discovery: MachinePool {POOL} (2 replicas, discovered Machines with at least 2 CPUs, configuration testbed)"
    ));
    let pool_created = Instant::now();
    lab.kubectl(&["apply", "-f", "-"], Some(&pool_yaml()))?;
    wait_until(
        &format!("{POOL} to claim {big}"),
        Duration::from_secs(120),
        || {
            let discovery_label = get(
                lab,
                "machine",
                &big,
                "{.metadata.labels.unbounded-cloud\\.io/discovery}",
            );
            let pool = get(
                lab,
                "machine",
                &big,
                "{.metadata.labels.unbounded-cloud\\.io/pool}",
            );
            (
                discovery_label == discovery::CLAIMED && pool == POOL,
                format!("discovery={discovery_label:?}, pool={pool:?}"),
            )
        },
    )?;
    say(&format!(
        "discovery: {big} claimed; waiting for its inspection agent's claim poll (every {} s), its reboot and its Node",
        CLAIM_POLL.as_secs()
    ));
    check_left_alone(lab, &small)?;

    // 5. Running, with a Ready Node.
    wait_until(
        &format!("{big} Running with a Ready Node"),
        REPORT_CYCLE + timeout * 2,
        || {
            let phase = get(lab, "machine", &big, "{.status.phase}");
            let ready = get(
                lab,
                "node",
                &big,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            (
                phase == "Running" && ready == "True",
                format!("phase {phase}, Node Ready {ready:?}"),
            )
        },
    )?;
    let claimed_to_running = pool_created.elapsed();
    say(&format!(
        "discovery: {big} Running with a Ready Node {:.0} s after the pool was created",
        claimed_to_running.as_secs_f64()
    ));
    // Minutes later, the pool still holds only the machine that meets its requirement.
    check_left_alone(lab, &small)?;
    let members = lab.kubectl(
        &[
            "get",
            "machines",
            "-l",
            &format!("{}={POOL}", well_known_labels::POOL),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )?;
    if members.split_whitespace().collect::<Vec<_>>() != [big.as_str()] {
        return Err(step(format!("{POOL} holds {members:?}, not only {big}")));
    }
    Ok(DiscoveryFigures {
        discovered,
        claimed_to_running: Some(claimed_to_running),
    })
}

/// The smaller VM's Machine still waits: label `waiting`, in no pool, `Pending`.
fn check_left_alone(lab: &Lab, name: &str) -> Result<(), LabError> {
    let discovery_label = get(
        lab,
        "machine",
        name,
        "{.metadata.labels.unbounded-cloud\\.io/discovery}",
    );
    let pool = get(
        lab,
        "machine",
        name,
        "{.metadata.labels.unbounded-cloud\\.io/pool}",
    );
    let phase = get(lab, "machine", name, "{.status.phase}");
    if discovery_label != discovery::WAITING || !pool.is_empty() || phase != "Pending" {
        return Err(step(format!(
            "{name} (1 CPU) should wait unclaimed: discovery={discovery_label:?}, pool={pool:?}, phase {phase}"
        )));
    }
    Ok(())
}

fn hardware_labels_of(machine: &Machine) -> String {
    machine
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(labels::PREFIX))
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches(labels::PREFIX)))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Expected {
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

    fn waiting_machine(vm: &Expected) -> Machine {
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

    #[test]
    fn a_new_vm_s_bmc_is_the_lab_s_redfish_emulator_with_its_uuid() {
        let machine = |name: &str, address: Option<&str>| -> Machine {
            let mut pxe = serde_json::json!({"macAddresses": ["52:54:00:99:00:01"]});
            if let Some(address) = address {
                pxe["bmc"] = serde_json::json!({
                    "address": address,
                    "credentialsSecretRef": {"namespace": "unbounded-system", "name": "testbed-bmc"},
                });
            }
            serde_json::from_value(serde_json::json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": name},
                "spec": {"provider": "pxe", "pxe": pxe},
            }))
            .unwrap()
        };
        let lab = [
            machine("discovered-x", None),
            machine("machine-2", Some("ipmi://10.99.0.1:40123")),
            machine(
                "machine-1",
                Some("redfish+http://10.99.0.1:38001/redfish/v1/Systems/0b7c-uuid"),
            ),
        ];
        let (base, secret) = lab_redfish(&lab).unwrap();
        assert_eq!(base, "redfish+http://10.99.0.1:38001/redfish/v1/Systems/");
        assert_eq!(
            (secret.namespace.as_str(), secret.name.as_str()),
            ("unbounded-system", "testbed-bmc")
        );
        assert!(
            lab_redfish(&lab[..2]).is_none(),
            "no Redfish machine, no address"
        );
        let patch: serde_json::Value =
            serde_json::from_str(&bmc_patch(&format!("{base}u-1"), &secret)).unwrap();
        assert_eq!(
            patch["spec"]["pxe"]["bmc"]["address"],
            "redfish+http://10.99.0.1:38001/redfish/v1/Systems/u-1"
        );
        assert_eq!(
            patch["spec"]["pxe"]["bmc"]["credentialsSecretRef"]["name"],
            "testbed-bmc"
        );
    }

    #[test]
    fn the_machine_is_found_by_any_of_its_macs() {
        let vm = small();
        let machines = [waiting_machine(&vm)];
        assert!(machine_with_mac(&machines, &vm.mac.to_ascii_uppercase()).is_some());
        assert!(machine_with_mac(&machines, "52:54:00:99:0d:02").is_none());
    }
}
