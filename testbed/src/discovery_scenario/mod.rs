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

use std::time::{Duration, Instant};

use unbounded_api::inventory::{MachineInventory, labels};
use unbounded_api::well_known::{discovery, labels as well_known_labels};
use unbounded_api::{Machine, SecretReference};

use crate::bmc::{self, Domain, DomainOptions};
use crate::failure::Failure;
use crate::lab::LabError;
use crate::scenario::{Lab, get, step, wait_until};

mod expect;

pub use expect::{
    Expected, InBandBmc, Shape, expected_vms, inventory_problems, machine_problems, shapes,
};
use expect::{SWITCH_NAME, SWITCH_PORT, domain_prefix};

const POOL: &str = "tb-discovery";
/// How often a waiting inspection agent reports again (`unbounded_agent::inspect::REREPORT`),
/// plus its LLDP wait before each report: the longest a claim waits for the reboot.
const REPORT_CYCLE: Duration = Duration::from_secs(300 + 35);
/// How often a waiting inspection agent asks whether it was claimed
/// (`unbounded_agent::inspect::CLAIM_POLL`; the testbed does not depend on the agent).
const CLAIM_POLL: Duration = Duration::from_secs(15);

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
        serde_json::from_str(&listing).map_err(|e| Failure::new("kubectl get machines", e))?;
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|item| serde_json::from_value(item).map_err(|e| Failure::new("a Machine", e).into()))
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
    serde_json::from_str(&text)
        .map_err(|e| Failure::new(format!("MachineInventory {name}"), e).into())
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
    fn start(expected: Vec<Expected>, say: &dyn Fn(&str)) -> Result<Self, LabError> {
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

/// Destroys and undefines every domain of this scenario still defined (a killed run's).
fn destroy_leftover_domains() -> Result<(), LabError> {
    let listed = bmc::virsh(&["list", "--all", "--name"]).map_err(Failure::of)?;
    for name in listed.lines().map(str::trim) {
        if name.starts_with(&domain_prefix()) {
            let _ = bmc::virsh(&["destroy", name]);
            bmc::virsh(&["undefine", "--nvram", name]).map_err(Failure::of)?;
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
                .map_err(Failure::of)?;
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
    let result = run(lab, &vms, depth, timeout, say)
        .map_err(|e| Failure::around("", e, format!("\n{}", vms.consoles())).into());
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
    use super::expect::tests::{small, waiting_machine};
    use super::*;

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
