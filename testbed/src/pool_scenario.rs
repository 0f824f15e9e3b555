//! The MachinePool scenario on a running lab (`testbed up --machines 3`), through `kubectl`:
//!
//! 1. a PXE pool claims every lab machine from the inventory;
//! 2. a new configuration version rolls across them with `maxUnavailable: 1`, never more
//!    than one Node unready (absent, not Ready or cordoned), polled every second;
//! 3. scaled down by one, the pool releases the machine annotated
//!    `unbounded-cloud.io/delete-machine`: its Node is drained and deleted and the PXE provider
//!    powers it off;
//! 4. a member is powered off and its Node deleted: it stays without a Node until the pool's
//!    provisioning timeout, then the pool remediates it (a `pxeBoot`) and it joins again;
//! 5. the pool is deleted (its machines released and powered off) and every lab machine is
//!    booted again with a `pxeBoot` by selector, so the lab ends as it began.

use std::time::{Duration, Instant};

use crate::lab::{LAB_LABEL, LabError};
use crate::scenario::{
    Lab, get, operation, set_configuration_label, step, wait_complete, wait_new_version, wait_until,
};

const POOL: &str = "tb-pool";
/// The pool's provisioning timeout: a machine without a Ready Node this long is repaved.
const PROVISIONING_TIMEOUT_SECONDS: u64 = 300;

fn pool_yaml(replicas: usize) -> String {
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {{name: {POOL}}}
spec:
  replicas: {replicas}
  template:
    spec:
      provider: pxe
      pxe: {{inventorySelector: {{matchLabels: {{{LAB_LABEL}: "true"}}}}}}
      configurationRef: {{name: testbed}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 1, progressDeadlineSeconds: 1200}}}}
  remediation:
    unhealthyConditions:
      - {{type: Ready, status: Unknown, timeoutSeconds: 300}}
      - {{type: Ready, status: "False", timeoutSeconds: 300}}
    provisioningTimeoutSeconds: {PROVISIONING_TIMEOUT_SECONDS}
    maxUnhealthy: 1
"#
    )
}

fn members(lab: &Lab) -> Vec<String> {
    let mut names: Vec<String> = lab
        .kubectl(
            &[
                "get",
                "machines",
                "-l",
                &format!("unbounded-cloud.io/pool={POOL}"),
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ],
            None,
        )
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// A machine's Node is Ready and schedulable.
fn node_ready(lab: &Lab, name: &str) -> bool {
    let ready = get(
        lab,
        "node",
        name,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    );
    let cordoned = get(lab, "node", name, "{.spec.unschedulable}");
    ready == "True" && cordoned != "true"
}

/// The names of the Nodes that are Ready and schedulable, from one list (a consistent view,
/// and one `kubectl` call per poll so that short windows are not missed).
pub(crate) fn ready_nodes(lab: &Lab) -> Result<Vec<String>, LabError> {
    let listing = lab.kubectl(
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}|{.status.conditions[?(@.type==\"Ready\")].status}|{.spec.unschedulable}{\"\\n\"}{end}",
        ],
        None,
    )?;
    Ok(ready_from_listing(&listing))
}

/// Parses `name|ready-status|unschedulable` lines.
fn ready_from_listing(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().split('|');
            let name = fields.next().filter(|n| !n.is_empty())?;
            let ready = fields.next() == Some("True");
            let cordoned = fields.next() == Some("true");
            (ready && !cordoned).then(|| name.to_owned())
        })
        .collect()
}

/// Each machine's recorded configuration version and phase, from one list.
fn versions_and_phases(lab: &Lab) -> Result<Vec<(String, String, String)>, LabError> {
    let listing = lab.kubectl(
        &[
            "get",
            "machines",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}|{.status.configuration.version}|{.status.phase}{\"\\n\"}{end}",
        ],
        None,
    )?;
    Ok(listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().split('|');
            Some((
                fields.next().filter(|n| !n.is_empty())?.to_owned(),
                fields.next().unwrap_or_default().to_owned(),
                fields.next().unwrap_or_default().to_owned(),
            ))
        })
        .collect())
}

/// `name=operationName` of every MachineOperation on `machine`.
fn operations_on(lab: &Lab, machine: &str) -> Vec<String> {
    lab.kubectl(
        &[
            "get",
            "machineoperations",
            "-l",
            &format!("unbounded-cloud.io/machine={machine}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.operationName} {end}",
        ],
        None,
    )
    .unwrap_or_default()
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

fn wait_running(
    lab: &Lab,
    names: &[String],
    version: &str,
    timeout: Duration,
) -> Result<(), LabError> {
    for name in names {
        wait_until(
            &format!("{name} Running on version {version} with a Ready Node"),
            timeout,
            || {
                let phase = get(lab, "machine", name, "{.status.phase}");
                let recorded = get(lab, "machine", name, "{.status.configuration.version}");
                (
                    phase == "Running" && recorded == version && node_ready(lab, name),
                    format!("phase {phase}, version {recorded}"),
                )
            },
        )?;
    }
    Ok(())
}

fn pool_condition(lab: &Lab, type_: &str) -> String {
    get(
        lab,
        "machinepool",
        POOL,
        &format!(
            "{{.status.conditions[?(@.type==\"{type_}\")].status}}/{{.status.conditions[?(@.type==\"{type_}\")].reason}}"
        ),
    )
}

/// Runs the scenario.
pub fn pool(lab: &Lab, timeout: Duration, say: &dyn Fn(&str)) -> Result<(), LabError> {
    let mut names = lab.machine_names();
    names.sort();
    if names.len() < 2 {
        return Err(step(
            "the pool scenario needs at least 2 machines (testbed up --machines 3)",
        ));
    }
    let latest = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    );

    // 1. Claim.
    say(&format!(
        "pool: MachinePool {POOL} claims the {} lab machines",
        names.len()
    ));
    lab.kubectl(&["apply", "-f", "-"], Some(&pool_yaml(names.len())))?;
    wait_until(
        "every lab machine claimed",
        Duration::from_secs(120),
        || {
            let m = members(lab);
            (m == names, format!("{m:?}"))
        },
    )?;
    wait_until("the pool up to date", timeout * 3, || {
        let c = pool_condition(lab, "UpToDate");
        (c == "True/UpToDate", c)
    })?;
    wait_running(lab, &names, &latest, timeout)?;

    // 2. Roll to a new version, one machine at a time.
    say("pool: a new testbed configuration version rolls across the pool (maxUnavailable 1)");
    let generation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    set_configuration_label(
        lab,
        "unbounded-cloud.io/generation",
        &format!("pool-{generation}"),
    )?;
    let next = wait_new_version(lab, &latest)?;
    say(&format!("pool: rolling to testbed version {next}"));
    let started = Instant::now();
    let mut most = 0;
    let mut went_down: Vec<String> = Vec::new();
    let deadline = Instant::now() + timeout * u32::try_from(names.len() + 1).unwrap_or(4);
    loop {
        let ready = ready_nodes(lab)?;
        let unready: Vec<&String> = names.iter().filter(|n| !ready.contains(n)).collect();
        for name in &unready {
            if !went_down.contains(name) {
                went_down.push((*name).clone());
                say(&format!(
                    "pool: {name} unready at {:.0} s (unready now: {unready:?})",
                    started.elapsed().as_secs_f64()
                ));
            }
        }
        most = most.max(unready.len());
        if unready.len() > 1 {
            return Err(step(format!(
                "more than maxUnavailable (1) Nodes unready at once: {unready:?}"
            )));
        }
        let machines = versions_and_phases(lab)?;
        let done = unready.is_empty()
            && names.iter().all(|n| {
                machines
                    .iter()
                    .any(|(m, v, p)| m == n && *v == next && p == "Running")
            });
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(step(format!(
                "timed out rolling to version {next}; machines {machines:?}; pool UpToDate {}",
                pool_condition(lab, "UpToDate")
            )));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    // Every machine was repaved (its Node went away and came back), one at a time.
    went_down.sort();
    if went_down != names {
        return Err(step(format!(
            "the rollout took down {went_down:?}, not every machine of {names:?}"
        )));
    }
    say(&format!(
        "pool: rolled {} machines in {:.0} s, never more than {most} unready",
        names.len(),
        started.elapsed().as_secs_f64()
    ));

    // 3. Scale down by one: the annotated machine goes back to the inventory, powered off.
    let leaving = names[names.len() - 1].clone();
    say(&format!(
        "pool: scaling to {} with {leaving} annotated delete-machine",
        names.len() - 1
    ));
    lab.kubectl(
        &[
            "annotate",
            "machine",
            &leaving,
            "unbounded-cloud.io/delete-machine=yes",
            "--overwrite",
        ],
        None,
    )?;
    lab.kubectl(
        &[
            "scale",
            &format!("machinepool/{POOL}"),
            &format!("--replicas={}", names.len() - 1),
        ],
        None,
    )?;
    wait_until(
        &format!("{leaving} released and powered off"),
        timeout,
        || {
            let released = !members(lab).contains(&leaving);
            let node = get(lab, "node", &leaving, "{.metadata.name}");
            let power = get(lab, "machine", &leaving, "{.status.power}");
            (
                released && node.is_empty() && power == "Off",
                format!("released {released}, Node {node:?}, power {power}"),
            )
        },
    )?;
    lab.kubectl(
        &[
            "annotate",
            "machine",
            &leaving,
            "unbounded-cloud.io/delete-machine-",
        ],
        None,
    )?;
    let kept: Vec<String> = names[..names.len() - 1].to_vec();
    if members(lab) != kept {
        return Err(step(format!(
            "the pool holds {:?}, not {kept:?}",
            members(lab)
        )));
    }

    // 4. A member dies and its Node is deleted: remediated after the provisioning timeout.
    let victim = kept[0].clone();
    say(&format!(
        "pool: powering {victim} off and deleting its Node"
    ));
    // Operations are immutable and named once per run.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let kill = format!("tb-pool-kill-{run}");
    let before = operations_on(lab, &victim);
    // The machine stops being Ready no earlier than this.
    let killed = Instant::now();
    operation(lab, &kill, &victim, "powerOff", "")?;
    wait_complete(lab, &kill, Duration::from_secs(180))?;
    lab.kubectl(&["delete", "node", &victim, "--wait=true"], None)?;
    wait_until(
        &format!("{POOL} to remediate {victim} with a pxeBoot"),
        Duration::from_secs(PROVISIONING_TIMEOUT_SECONDS + 180),
        || {
            let now = operations_on(lab, &victim);
            let remediated = now
                .iter()
                .any(|o| o.ends_with("=pxeBoot") && !before.contains(o));
            (remediated, format!("{now:?}"))
        },
    )?;
    let after = killed.elapsed();
    say(&format!(
        "pool: {victim} remediated (pxeBoot) {:.0} s after it was powered off",
        after.as_secs_f64()
    ));
    // The clock starts when the machine stopped being Ready, not at its last repave: sooner
    // means the pool repaved a machine the provisioning timeout still covered.
    if after < Duration::from_secs(PROVISIONING_TIMEOUT_SECONDS - 5) {
        return Err(step(format!(
            "{victim} was remediated {} s after it was powered off, before the provisioning \
             timeout of {PROVISIONING_TIMEOUT_SECONDS} s",
            after.as_secs()
        )));
    }
    wait_running(lab, &kept, &next, timeout)?;
    wait_until("MachinesHealthy=True", Duration::from_secs(60), || {
        let c = pool_condition(lab, "MachinesHealthy");
        (c.starts_with("True"), c)
    })?;

    // 5. Delete the pool, boot everything again.
    say("pool: deleting the pool (its machines are released) and booting every lab machine");
    lab.kubectl(
        &[
            "delete",
            "machinepool",
            POOL,
            "--wait=true",
            "--timeout=600s",
        ],
        None,
    )?;
    wait_until("every lab machine released", timeout, || {
        let m = members(lab);
        (m.is_empty(), format!("{m:?}"))
    })?;
    wait_until("released machines powered off", timeout, || {
        let powers: Vec<String> = kept
            .iter()
            .map(|n| get(lab, "machine", n, "{.status.power}"))
            .collect();
        (powers.iter().all(|p| p == "Off"), format!("{powers:?}"))
    })?;
    let boot = format!("tb-pool-boot-{run}");
    operation(lab, &boot, "selector:", "pxeBoot", "")?;
    wait_complete(lab, &boot, Duration::from_secs(300))?;
    wait_running(lab, &names, &next, timeout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ready_from_listing;

    #[test]
    fn only_ready_uncordoned_nodes_count_as_ready() {
        let listing = "m1|True|\nm2|False|\nm3|True|true\nm4|Unknown|\nm5||\n|True|\n";
        assert_eq!(ready_from_listing(listing), vec!["m1".to_owned()]);
        assert!(ready_from_listing("").is_empty());
    }
}
