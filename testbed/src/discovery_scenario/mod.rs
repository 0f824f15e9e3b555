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

//!
//! Where things are: this file runs the scenario and cleans up; `vms` defines, starts and
//! removes the VMs; `discovered` waits for their Machines and judges them and their
//! inventories (step 2); `claim` gives them their BMCs and has the pool claim one (steps 3
//! to 5); `expect` says what each VM must look like.

use std::time::Duration;

use crate::failure::Failure;
use crate::lab::LabError;
use crate::scenario::{Lab, get, wait_until};

mod claim;
mod discovered;
mod expect;
mod vms;

use claim::POOL;
pub use claim::lab_redfish;
pub use expect::{
    Expected, InBandBmc, Shape, expected_vms, inventory_problems, machine_problems, shapes,
};
use expect::{SWITCH_NAME, SWITCH_PORT};
use vms::{Vms, destroy_leftover_domains};

/// How often a waiting inspection agent reports again (`unbounded_agent::inspect::REREPORT`),
/// plus its LLDP wait before each report: the longest a claim waits for the reboot.
const REPORT_CYCLE: Duration = Duration::from_secs(300 + 35);

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
    let discovered = discovered::wait_discovered(lab, vms, timeout, say)?;
    let claimed_to_running = match depth {
        Depth::Reduced => None,
        Depth::Full => Some(claim::claim(lab, vms, timeout, say)?),
    };
    Ok(DiscoveryFigures {
        discovered,
        claimed_to_running,
    })
}
