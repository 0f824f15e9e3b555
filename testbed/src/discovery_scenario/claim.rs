//! Steps 3 to 5 of the scenario: the operator gives the discovered Machines their BMC, a
//! MachinePool claims the larger VM by its hardware and leaves the smaller one alone, and the
//! claimed Machine becomes Running with a Ready Node.

use std::time::{Duration, Instant};

use unbounded_api::well_known::{discovery, labels as well_known_labels};
use unbounded_api::{Machine, SecretReference};

use super::REPORT_CYCLE;
use super::discovered::machines;
use super::vms::Vms;
use crate::lab::LabError;
use crate::scenario::{Lab, get, step, wait_until};

/// The MachinePool the scenario creates.
pub(super) const POOL: &str = "tb-discovery";
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

/// Gives the VMs' Machines their BMCs, has a pool claim the larger one and waits until it
/// is Running with a Ready Node. Returns the time from the pool's creation to then.
pub(super) fn claim(
    lab: &Lab,
    vms: &Vms,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Duration, LabError> {
    // The operator gives the discovered Machines their BMCs.
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
    Ok(claimed_to_running)
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

#[cfg(test)]
mod tests {
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
}
