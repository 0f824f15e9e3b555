//! Day-2 flows on a running lab, each checked end to end through `kubectl`:
//! - **repave**: delete a Node; the agent repaves with the same version and it joins again;
//! - **rollback**: a new configuration version pinned on one machine (a canary) and applied
//!   by deleting its Node; then the old version pinned and applied the same way;
//! - **operations**: `reboot` (Complete once the machine is back with a new boot ID),
//!   `restartService` of kubelet, and `powerCycle` by selector across every machine;
//! - **pool**: a MachinePool over the lab's machines ([`crate::pool_scenario`]);
//! - **leader-failover** and **bootserver-restart**: the appliance on day 2
//!   ([`crate::appliance_scenarios`]).

use std::time::{Duration, Instant};

use crate::appliance::PodsInfo;
use crate::lab::base::{LAB_LABEL, LabError};

/// What a scenario needs of a lab: `kubectl`, the machines' names and consoles, and what
/// the pods mode pushed. Implemented by the in-process [`crate::lab::Lab`] and by
/// [`crate::lab::RunningLab`] (a lab that `testbed up` left running).
pub trait LabAccess {
    /// `kubectl` as the admin.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, LabError>;
    /// The lab's Machine names, in order.
    fn machine_names(&self) -> Vec<String>;
    /// What a machine's serial console printed so far (empty for an unknown machine).
    fn console(&self, machine: &str) -> String;
    /// The registry, the images pushed and the bootserver's URL, when the lab runs the pods.
    fn pods(&self) -> Option<PodsInfo>;
    /// The provisioning network's namespace (its bridge is `br0`), when known.
    fn netns(&self) -> Option<String>;
}

pub(crate) type Lab = dyn LabAccess;

pub(crate) fn step(message: impl Into<String>) -> LabError {
    LabError::Step(message.into())
}

/// `jsonpath` of an object, or empty.
pub(crate) fn get(lab: &Lab, kind: &str, name: &str, path: &str) -> String {
    lab.kubectl(
        &["get", kind, name, "-o", &format!("jsonpath={path}")],
        None,
    )
    .unwrap_or_default()
}

/// Waits until `check` holds; the error names `what` and the last value seen.
pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> (bool, String),
) -> Result<(), LabError> {
    let deadline = Instant::now() + timeout;
    loop {
        let (ok, seen) = check();
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(step(format!(
                "timed out after {} s waiting for {what}; last seen: {seen}",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Every lab Machine is Running on `version` and its Node carries the configuration
/// annotations.
pub fn check_running_and_annotated(lab: &Lab, version: i64) -> Result<(), LabError> {
    for name in lab.machine_names() {
        wait_until(
            &format!("{name} Running with version {version}, Node annotated"),
            Duration::from_secs(120),
            || {
                let phase = get(lab, "machine", &name, "{.status.phase}");
                let recorded = get(lab, "machine", &name, "{.status.configuration.version}");
                let annotation = get(
                    lab,
                    "node",
                    &name,
                    "{.metadata.annotations.unbounded-cloud\\.io/machine-configuration-version}",
                );
                let seen =
                    format!("phase {phase}, version {recorded}, Node annotation {annotation}");
                (
                    phase == "Running"
                        && recorded == version.to_string()
                        && annotation == version.to_string(),
                    seen,
                )
            },
        )?;
    }
    Ok(())
}

/// Deletes the Node of `machine` and waits until a new Node (another UID) of it is Ready and
/// the Machine is Running again.
pub fn repave(
    lab: &Lab,
    machine: &str,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Duration, LabError> {
    let old_uid = get(lab, "node", machine, "{.metadata.uid}");
    if old_uid.is_empty() {
        return Err(step(format!("{machine} has no Node to delete")));
    }
    say(&format!("repave: deleting Node {machine}"));
    let started = Instant::now();
    lab.kubectl(&["delete", "node", machine, "--wait=true"], None)?;
    // kubelet re-registers a deleted Node within seconds, before the agent has stopped it:
    // a Ready Node with a new UID proves nothing until the agent has repaved. So: the agent's
    // `Paving`, then its `ContainerRunning`, noting every Node UID seen meanwhile (the
    // re-registered one, which the agent deletes once the old container is stopped); then a
    // Node with none of those UIDs, Ready.
    let reason = |lab: &Lab| {
        get(
            lab,
            "machine",
            machine,
            "{.status.conditions[?(@.type==\"BootstrapReady\")].reason}",
        )
    };
    let mut stale = std::collections::BTreeSet::from([old_uid]);
    let mut paving = false;
    wait_until(
        &format!("{machine}'s agent to repave and start the new container"),
        timeout,
        || {
            let seen = reason(lab);
            let uid = get(lab, "node", machine, "{.metadata.uid}");
            paving |= seen == "Paving";
            let done = paving && seen == "ContainerRunning";
            if !done && !uid.is_empty() {
                stale.insert(uid.clone());
            }
            (
                done,
                format!("BootstrapReady reason {seen}, Node uid {uid}"),
            )
        },
    )?;
    wait_until(
        &format!("{machine} to join again from the repaved container and be Ready"),
        timeout,
        || {
            let uid = get(lab, "node", machine, "{.metadata.uid}");
            let ready = get(
                lab,
                "node",
                machine,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            (
                !uid.is_empty() && !stale.contains(&uid) && ready == "True",
                format!("uid {uid}, Ready {ready}"),
            )
        },
    )?;
    let took = started.elapsed();
    say(&format!(
        "repave: {machine} Ready again after {:.1} s",
        took.as_secs_f64()
    ));
    wait_until(
        &format!("{machine} Running"),
        Duration::from_secs(120),
        || {
            let phase = get(lab, "machine", machine, "{.status.phase}");
            (phase == "Running", phase)
        },
    )?;
    Ok(took)
}

/// Merge-patches the lab's configuration `testbed` (a template change makes a new version).
pub(crate) fn patch_configuration(lab: &Lab, patch: &str) -> Result<(), LabError> {
    lab.kubectl(
        &[
            "patch",
            "machineconfiguration",
            "testbed",
            "--type=merge",
            "-p",
            patch,
        ],
        None,
    )?;
    Ok(())
}

/// The newest version of the lab's configuration `testbed` (empty when unreadable).
pub(crate) fn latest_version(lab: &Lab) -> String {
    get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    )
}

/// Waits for the configuration `testbed` to make a version after `old` (a template change
/// was just written), and returns its number.
pub(crate) fn wait_new_version(lab: &Lab, old: &str) -> Result<String, LabError> {
    let mut next = String::new();
    wait_until("a new testbed version", Duration::from_secs(60), || {
        next = latest_version(lab);
        (!next.is_empty() && next != old, next.clone())
    })?;
    Ok(next)
}

/// Pins `machine` to `version` of the lab's configuration (applied at its next repave).
pub(crate) fn pin(lab: &Lab, machine: &str, version: i64) -> Result<(), LabError> {
    lab.kubectl(
        &[
            "patch",
            "machine",
            machine,
            "--type=merge",
            "-p",
            &format!(
                r#"{{"spec":{{"configurationRef":{{"name":"testbed","version":{version}}}}}}}"#
            ),
        ],
        None,
    )?;
    Ok(())
}

/// Sets a Node label in the template of the lab's configuration `testbed`: a new version.
pub fn set_configuration_label(lab: &Lab, key: &str, value: &str) -> Result<(), LabError> {
    patch_configuration(
        lab,
        &format!(
            r#"{{"spec":{{"template":{{"kubernetes":{{"nodeLabels":{{"{key}":"{value}"}}}}}}}}}}"#
        ),
    )
}

/// A canary on a new version, then a rollback, on `machine`.
pub fn rollback(
    lab: &Lab,
    machine: &str,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<(), LabError> {
    say("rollback: changing the configuration (version 2 adds a Node label)");
    set_configuration_label(lab, "unbounded-cloud.io/generation", "2")?;
    wait_until("version 2 to exist", Duration::from_secs(60), || {
        let latest = get(
            lab,
            "machineconfiguration",
            "testbed",
            "{.status.latestVersion}",
        );
        (latest == "2", latest)
    })?;
    for (version, label) in [(2, "2"), (1, "")] {
        say(&format!(
            "rollback: pinning {machine} to version {version} and deleting its Node"
        ));
        pin(lab, machine, version)?;
        repave(lab, machine, timeout, say)?;
        wait_until(
            &format!("{machine}'s Node on version {version}"),
            Duration::from_secs(120),
            || {
                let annotation = get(
                    lab,
                    "node",
                    machine,
                    "{.metadata.annotations.unbounded-cloud\\.io/machine-configuration-version}",
                );
                let generation = get(
                    lab,
                    "node",
                    machine,
                    "{.metadata.labels.unbounded-cloud\\.io/generation}",
                );
                (
                    annotation == version.to_string() && generation == label,
                    format!("annotation {annotation}, generation label {generation:?}"),
                )
            },
        )?;
    }
    // The other machines kept version 1 throughout (OnDelete).
    for name in lab.machine_names().iter().filter(|n| *n != machine) {
        let recorded = get(lab, "machine", name, "{.status.configuration.version}");
        if recorded != "1" {
            return Err(step(format!(
                "{name} moved to version {recorded} without a repave"
            )));
        }
    }
    Ok(())
}

pub(crate) fn operation(
    lab: &Lab,
    name: &str,
    target: &str,
    operation: &str,
    parameters: &str,
) -> Result<(), LabError> {
    let target = if target.starts_with("selector:") {
        format!("machineSelector: {{matchLabels: {{{LAB_LABEL}: \"true\"}}}}")
    } else {
        format!("machineRef: {{name: {target}}}")
    };
    lab.kubectl(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineOperation\nmetadata: {{name: {name}}}\n\
             spec:\n  {target}\n  operationName: {operation}\n  parameters: {{{parameters}}}\n"
        )),
    )?;
    Ok(())
}

/// Whether `machine` is back on a new boot: its agent reports a boot ID other than
/// `boot_before`, its Node one other than `node_boot_before` (kubelet runs in the node
/// container, whose boot ID systemd-nspawn makes up), and the Node is Ready; with what was
/// seen.
pub(crate) fn ready_on_new_boot(
    lab: &Lab,
    machine: &str,
    boot_before: &str,
    node_boot_before: &str,
) -> (bool, String) {
    let boot = get(lab, "machine", machine, "{.status.agent.bootID}");
    let node_boot = get(lab, "node", machine, "{.status.nodeInfo.bootID}");
    let ready = get(
        lab,
        "node",
        machine,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    );
    (
        !boot.is_empty()
            && boot != boot_before
            && !node_boot.is_empty()
            && node_boot != node_boot_before
            && ready == "True",
        format!("agent boot {boot}, Node boot {node_boot}, Ready {ready}"),
    )
}

pub(crate) fn wait_complete(lab: &Lab, name: &str, timeout: Duration) -> Result<(), LabError> {
    wait_until(
        &format!("MachineOperation {name} Complete"),
        timeout,
        || {
            let state = get(lab, "machineoperation", name, "{.status.state}");
            let message = get(lab, "machineoperation", name, "{.status.message}");
            (state == "Complete", format!("{state}: {message}"))
        },
    )
}

/// `reboot`, `restartService` and `powerCycle` (by selector).
pub fn operations(lab: &Lab, timeout: Duration, say: &dyn Fn(&str)) -> Result<(), LabError> {
    let names = lab.machine_names();
    let first = names.first().cloned().ok_or_else(|| step("no machines"))?;
    let last = names.last().cloned().ok_or_else(|| step("no machines"))?;

    say(&format!("operations: restartService kubelet on {last}"));
    operation(
        lab,
        "tb-restart-kubelet",
        &last,
        "restartService",
        "service: kubelet",
    )?;
    wait_complete(lab, "tb-restart-kubelet", Duration::from_secs(180))?;

    say(&format!("operations: reboot {first}"));
    let boot_id = get(lab, "machine", &first, "{.status.agent.bootID}");
    operation(lab, "tb-reboot", &first, "reboot", "")?;
    wait_complete(lab, "tb-reboot", timeout)?;
    let new_boot_id = get(lab, "machine", &first, "{.status.agent.bootID}");
    if new_boot_id == boot_id {
        return Err(step(format!(
            "reboot completed but the boot ID is still {boot_id}"
        )));
    }
    wait_until(&format!("{first} Ready after the reboot"), timeout, || {
        let ready = get(
            lab,
            "node",
            &first,
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        );
        (ready == "True", ready)
    })?;

    say("operations: powerCycle every machine (by selector)");
    let boots: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.clone(), get(lab, "machine", n, "{.status.agent.bootID}")))
        .collect();
    operation(lab, "tb-cycle", "selector:", "powerCycle", "")?;
    wait_complete(lab, "tb-cycle", Duration::from_secs(300))?;
    for (name, before) in &boots {
        wait_until(
            &format!("{name} booted again, container running, Node Ready"),
            timeout,
            || {
                let ready = get(
                    lab,
                    "node",
                    name,
                    "{.status.conditions[?(@.type==\"Ready\")].status}",
                );
                let boot = get(lab, "machine", name, "{.status.agent.bootID}");
                let container = get(lab, "machine", name, "{.status.agent.containerState}");
                (
                    ready == "True"
                        && &boot != before
                        && !boot.is_empty()
                        && container == "running",
                    format!("Ready {ready}, boot {boot}, container {container}"),
                )
            },
        )?;
    }
    Ok(())
}
