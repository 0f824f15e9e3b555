//! Step 2 of the scenario: each VM becomes a discovered Machine (found by its MAC, judged
//! by [`machine_problems`]), then its MachineInventory is judged once
//! ([`inventory_problems`]).

use std::time::{Duration, Instant};

use unbounded_api::Machine;
use unbounded_api::inventory::{MachineInventory, labels};

use super::REPORT_CYCLE;
use super::expect::{inventory_problems, machine_problems};
use super::vms::Vms;
use crate::failure::Failure;
use crate::lab::LabError;
use crate::scenario::{Lab, step};

/// Every Machine of the lab, typed.
pub(super) fn machines(lab: &Lab) -> Result<Vec<Machine>, LabError> {
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

/// Waits until every VM of `vms` is a discovered Machine that is right (within `timeout`
/// and one report cycle), then checks each one's inventory. Returns how long after
/// power-on each was discovered, by Machine name.
pub(super) fn wait_discovered(
    lab: &Lab,
    vms: &Vms,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Vec<(String, Duration)>, LabError> {
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
    Ok(discovered)
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
    use super::super::expect::tests::{small, waiting_machine};
    use super::*;

    #[test]
    fn the_machine_is_found_by_any_of_its_macs() {
        let vm = small();
        let machines = [waiting_machine(&vm)];
        assert!(machine_with_mac(&machines, &vm.mac.to_ascii_uppercase()).is_some());
        assert!(machine_with_mac(&machines, "52:54:00:99:0d:02").is_none());
    }
}
