//! Day 2 of the appliance, on a lab that runs the pods (`testbed up`, not `--host-binaries`),
//! each checked through `kubectl`, the Lease and the bootserver's own metrics:
//!
//! - **leader failover** ([`leader_failover`]): a rolling update of the lab's configuration
//!   starts; in its middle the leading controller pod is deleted. The other replica takes
//!   the Lease within the lease duration (plus the retry period it polls at and the time the
//!   kubelet takes to kill the pod), the rollout completes on every machine, and exactly one
//!   version was created for the one change (none twice, none skipped).
//! - **bootserver restart** ([`bootserver_restart`]): a machine reboots into a network boot;
//!   right after its iPXE script was served (its one-time credential nonce issued) the
//!   bootserver's Deployment moves to a new image (the same files, a new digest). The new
//!   pod holds the leases the old one granted (the lease log is on a hostPath) and the
//!   machine's boot completes: its agent gets its credentials from the new pod, the reboot
//!   operation is Complete, the Node is Ready with a new boot ID.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::appliance::{CONTROLLER_LEASE, SYSTEM_NAMESPACE};
use crate::failure::Failure;
use crate::lab::LabError;
use crate::pool_scenario::ready_nodes;
use crate::scenario::{Lab, get, operation, step, wait_complete, wait_until};

/// How long after the leader's pod is deleted its kubelet may take to kill it (the API
/// request, the kubelet's watch, runc) under emulation: added to the bound on the takeover.
const KILL_SLACK: Duration = Duration::from_secs(5);

/// What the leader failover measured.
#[derive(Debug, Clone)]
pub struct Failover {
    /// The pod deleted.
    pub old_leader: String,
    /// The pod that took the Lease.
    pub new_leader: String,
    /// From the deletion to the new holder.
    pub takeover: Duration,
    /// The bound it was held to: lease duration + 2 retry periods + [`KILL_SLACK`].
    pub bound: Duration,
    /// From the configuration change to the rollout complete.
    pub rollout: Duration,
    /// The version rolled to.
    pub version: i64,
}

/// What the bootserver restart measured.
#[derive(Debug, Clone)]
pub struct Restart {
    /// Active DHCP leases the old pod reported, and the new one.
    pub leases: (u64, u64),
    /// From the image change to the new pod Ready.
    pub restart: Duration,
    /// From the reboot operation to the machine's Node Ready again.
    pub boot: Duration,
}

fn controller_pods(lab: &Lab) -> Vec<String> {
    lab.kubectl(
        &[
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=unbounded-controller",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )
    .unwrap_or_default()
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

fn lease(lab: &Lab, path: &str) -> String {
    lab.kubectl(
        &[
            "get",
            "lease",
            "-n",
            SYSTEM_NAMESPACE,
            CONTROLLER_LEASE,
            "-o",
            &format!("jsonpath={path}"),
        ],
        None,
    )
    .unwrap_or_default()
}

/// The version numbers of `configuration` that exist (from the names `<name>-v<n>`).
fn versions_of(lab: &Lab, configuration: &str) -> BTreeSet<i64> {
    let prefix = format!("{configuration}-v");
    lab.kubectl(
        &[
            "get",
            "machineconfigurationversions",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )
    .unwrap_or_default()
    .split_whitespace()
    .filter_map(|n| n.strip_prefix(&prefix)?.parse().ok())
    .collect()
}

fn deployment_available(lab: &Lab, name: &str) -> (bool, String) {
    let replicas = get_namespaced(lab, "deployment", name, "{.spec.replicas}");
    let available = get_namespaced(lab, "deployment", name, "{.status.availableReplicas}");
    (
        !replicas.is_empty() && replicas == available,
        format!("{available}/{replicas} available"),
    )
}

fn get_namespaced(lab: &Lab, kind: &str, name: &str, path: &str) -> String {
    lab.kubectl(
        &[
            "get",
            kind,
            name,
            "-n",
            SYSTEM_NAMESPACE,
            "-o",
            &format!("jsonpath={path}"),
        ],
        None,
    )
    .unwrap_or_default()
}

fn seconds_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Deletes the leading controller pod in the middle of a rolling update of `testbed` that
/// takes down at most `max_unavailable` machines at a time (the scenario: 1, one machine
/// after the other; CI's reduced form: all of them in one batch). With `onto_disks` the
/// update also adds `storage: {}` (docs/storage.md): every machine paves onto its blank data
/// disk, checked in its `status.agent.storage` (CI's reduced form of the `disks` scenario).
pub fn leader_failover(
    lab: &Lab,
    max_unavailable: usize,
    onto_disks: bool,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Failover, LabError> {
    if lab.pods().is_none() {
        return Err(step(
            "leader-failover needs the controller as pods: start the lab without --host-binaries",
        ));
    }
    let mut names = lab.machine_names();
    names.sort();
    let before: i64 = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    )
    .parse()
    .map_err(|_| step("the configuration testbed has no latestVersion"))?;
    let next = before + 1;

    say(&format!(
        "leader-failover: rolling update of testbed to version {next} (maxUnavailable {max_unavailable})"
    ));
    let started = Instant::now();
    // A change that needs a repave (the host OS reads its kernel arguments when it network
    // boots): labels or files would be applied in place, without taking a machine down.
    let mut kernel_args: Vec<String> = crate::lab::LAB_KERNEL_ARGS
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    kernel_args.push(format!(
        "unbounded.testbed.rollout={}",
        seconds_since_epoch()
    ));
    let mut template = serde_json::json!({"boot": {"kernelArgs": kernel_args}});
    if onto_disks {
        template["storage"] = serde_json::json!({});
    }
    let patch = serde_json::json!({"spec": {
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
        "template": template,
    }});
    crate::scenario::patch_configuration(lab, &patch.to_string())?;
    wait_until(
        &format!("version {next} of testbed"),
        Duration::from_secs(60),
        || {
            let latest = get(
                lab,
                "machineconfiguration",
                "testbed",
                "{.status.latestVersion}",
            );
            (latest == next.to_string(), latest)
        },
    )?;
    wait_until(
        "the rollout to take a machine down",
        timeout,
        || match ready_nodes(lab) {
            Ok(ready) => {
                let down: Vec<&String> = names.iter().filter(|n| !ready.contains(n)).collect();
                (!down.is_empty(), format!("ready: {ready:?}"))
            }
            Err(e) => (false, e.to_string()),
        },
    )?;

    let old_leader = lease(lab, "{.spec.holderIdentity}");
    let pods = controller_pods(lab);
    if !pods.contains(&old_leader) {
        return Err(step(format!(
            "the Lease {CONTROLLER_LEASE} is held by {old_leader:?}, not by a controller pod ({pods:?})"
        )));
    }
    let lease_seconds: u64 = lease(lab, "{.spec.leaseDurationSeconds}")
        .parse()
        .unwrap_or(15);
    // The runtime's default retry period (`--leader-election-retry-period`, README "Leader
    // election"); deploy/ does not change it.
    let retry = Duration::from_secs(2);
    let bound = Duration::from_secs(lease_seconds) + retry * 2 + KILL_SLACK;
    say(&format!(
        "leader-failover: deleting the leader {old_leader} mid-rollout (lease {lease_seconds} s)"
    ));
    let deleted = Instant::now();
    lab.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            SYSTEM_NAMESPACE,
            &old_leader,
            "--wait=false",
        ],
        None,
    )?;
    let new_leader = loop {
        let holder = lease(lab, "{.spec.holderIdentity}");
        if !holder.is_empty() && holder != old_leader {
            break holder;
        }
        if deleted.elapsed() > bound + Duration::from_secs(60) {
            return Err(step(format!(
                "no other controller took the Lease within {} s of deleting {old_leader} (holder {holder:?})",
                deleted.elapsed().as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let takeover = deleted.elapsed();
    say(&format!(
        "leader-failover: {new_leader} leads {:.1} s after the deletion (bound {} s)",
        takeover.as_secs_f64(),
        bound.as_secs()
    ));
    if takeover > bound {
        return Err(step(format!(
            "{new_leader} took the Lease {:.1} s after {old_leader} was deleted: later than the lease duration ({lease_seconds} s) + 2 retry periods + {} s",
            takeover.as_secs_f64(),
            KILL_SLACK.as_secs()
        )));
    }

    let batches = names.len().div_ceil(max_unavailable.max(1));
    let deadline = timeout * u32::try_from(batches + 1).unwrap_or(4);
    wait_until(
        &format!("every lab machine Running on version {next} with a Ready, schedulable Node"),
        deadline,
        || {
            let ready = ready_nodes(lab).unwrap_or_default();
            let states: Vec<String> = names
                .iter()
                .map(|n| {
                    format!(
                        "{n}: {} v{} paved v{}",
                        get(lab, "machine", n, "{.status.phase}"),
                        get(lab, "machine", n, "{.status.configuration.version}"),
                        get(lab, "machine", n, "{.status.agent.paved.version}")
                    )
                })
                .collect();
            // Recorded is not rolled: the controller records the version before the repave,
            // while the old Node may still be Ready. The agent's `paved` says the running
            // container is the new version's (and its storage report went out with it).
            let done = names.iter().all(|n| {
                ready.contains(n)
                    && get(lab, "machine", n, "{.status.phase}") == "Running"
                    && get(lab, "machine", n, "{.status.configuration.version}") == next.to_string()
                    && get(lab, "machine", n, "{.status.agent.paved.version}") == next.to_string()
            });
            (done, format!("{states:?}"))
        },
    )?;
    let rollout = started.elapsed();
    let latest = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    );
    let versions = versions_of(lab, "testbed");
    if latest != next.to_string() || versions.iter().any(|v| *v > next) || !versions.contains(&next)
    {
        return Err(step(format!(
            "one change must make one version ({next}); latestVersion is {latest}, versions {versions:?}"
        )));
    }
    if onto_disks {
        for name in &names {
            let action = get(lab, "machine", name, "{.status.agent.storage.action}");
            let serial = get(lab, "machine", name, "{.status.agent.storage.serial}");
            // The lab's first data disk (`data-<domain>`): the smallest of at least 16 GiB.
            if action != "formatted" || !serial.starts_with("data-") {
                return Err(step(format!(
                    "{name} rolled to version {next} (storage: {{}}) but did not pave onto its data disk: action {action:?}, serial {serial:?}"
                )));
            }
        }
        say("leader-failover: every machine paved onto its data disk");
    }
    wait_until("both controller replicas available again", timeout, || {
        deployment_available(lab, "unbounded-controller")
    })?;
    // Back to the lab's usual strategy, for the scenarios that follow.
    lab.kubectl(
        &[
            "patch",
            "machineconfiguration",
            "testbed",
            "--type=merge",
            "-p",
            r#"{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null}}}"#,
        ],
        None,
    )?;
    say(&format!(
        "leader-failover: rolled {} machines to version {next} in {:.0} s; versions {versions:?}",
        names.len(),
        rollout.as_secs_f64()
    ));
    Ok(Failover {
        old_leader,
        new_leader,
        takeover,
        bound,
        rollout,
        version: next,
    })
}

/// The value of the bootserver's `dhcp_active_leases` gauge, read from its `/metrics`.
fn active_leases(bootserver_url: &str) -> Result<u64, LabError> {
    let host = bootserver_url
        .trim_start_matches("http://")
        .split(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let output = Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "10",
            &format!("{bootserver_url}/metrics"),
        ])
        .env("NO_PROXY", host)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::new("curl", e))?;
    if !output.status.success() {
        return Err(step(format!(
            "the bootserver's metrics at {bootserver_url}/metrics did not answer"
        )));
    }
    metric_value(
        &String::from_utf8_lossy(&output.stdout),
        "dhcp_active_leases",
    )
    .ok_or_else(|| step("the bootserver's metrics have no dhcp_active_leases"))
}

/// The value of the first sample whose metric name ends with `suffix` (Prometheus text).
pub fn metric_value(text: &str, suffix: &str) -> Option<u64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.split_once(' ')?;
        let name = name.split('{').next()?;
        if name.ends_with(suffix) {
            value.trim().parse::<f64>().ok().map(|v| v as u64)
        } else {
            None
        }
    })
}

/// How many boot scripts a console shows (one per network boot that reached iPXE's script).
fn scripts_served(console: &str) -> usize {
    crate::qemu::complete_lines(console)
        .filter(|l| crate::progress::console_stage(l) == Some(crate::progress::Stage::Ipxe))
        .count()
}

/// Restarts the bootserver with a new image while `machine` network-boots.
pub fn bootserver_restart(
    lab: &Lab,
    machine: &str,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Restart, LabError> {
    let pods = lab.pods().ok_or_else(|| {
        step("bootserver-restart needs the bootserver as a pod: start the lab without --host-binaries")
    })?;
    let image = pods
        .image("bootserver")
        .cloned()
        .ok_or_else(|| step("the lab pushed no bootserver image"))?;
    let leases_before = active_leases(&pods.bootserver_url)?;
    if leases_before == 0 {
        return Err(step("the bootserver holds no DHCP lease to keep"));
    }

    // The same files, a new build: what an upgrade looks like to the Deployment.
    let build = seconds_since_epoch();
    let new_tag = format!("{}-build{build}", image.layout_tag);
    let dir = tempfile::tempdir().map_err(Failure::of)?;
    let layout = dir.path().join("layout");
    crate::registry::relabelled_layout(
        &image.layout,
        &image.layout_tag,
        &layout,
        &new_tag,
        "io.unbounded.testbed.build",
        &build.to_string(),
    )?;
    let registry = pods.registry();
    let digest = registry.push_layout(&layout, &new_tag, &image.repository, &new_tag)?;
    say(&format!(
        "bootserver-restart: pushed {}:{new_tag} ({digest})",
        image.repository
    ));

    let scripts_before = scripts_served(&lab.console(machine));
    let boot_before = get(lab, "machine", machine, "{.status.agent.bootID}");
    let reboot = format!("tb-bs-restart-{build}");
    say(&format!(
        "bootserver-restart: rebooting {machine} into a network boot"
    ));
    let boot_started = Instant::now();
    operation(lab, &reboot, machine, "reboot", "")?;
    wait_until(
        &format!("{machine} to fetch its boot script (its nonce issued)"),
        timeout,
        || {
            let served = scripts_served(&lab.console(machine));
            (served > scripts_before, format!("{served} scripts served"))
        },
    )?;
    say(&format!(
        "bootserver-restart: {machine} has its script; moving the bootserver to the new image"
    ));
    let restart_started = Instant::now();
    let reference = registry.by_digest(&image.repository, &digest);
    lab.kubectl(
        &[
            "set",
            "image",
            "-n",
            SYSTEM_NAMESPACE,
            "deployment/unbounded-bootserver",
            &format!("bootserver={reference}"),
        ],
        None,
    )?;
    wait_until(
        "the bootserver pod of the new image Ready (and the old one gone)",
        timeout,
        || {
            let listing = lab
                .kubectl(
                    &[
                        "get",
                        "pods",
                        "-n",
                        SYSTEM_NAMESPACE,
                        "-l",
                        "app.kubernetes.io/name=unbounded-bootserver",
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.name}|{.status.containerStatuses[0].imageID}|{.status.containerStatuses[0].ready}{\"\\n\"}{end}",
                    ],
                    None,
                )
                .unwrap_or_default();
            let pods: Vec<&str> = listing.lines().filter(|l| !l.is_empty()).collect();
            let done = pods.len() == 1
                && pods
                    .first()
                    .is_some_and(|p| p.contains(&digest) && p.ends_with("|true"));
            (done, listing.replace('\n', "; "))
        },
    )?;
    let restart = restart_started.elapsed();
    let leases_after = active_leases(&pods.bootserver_url)?;
    say(&format!(
        "bootserver-restart: new pod Ready after {:.1} s; active leases {leases_before} before, {leases_after} after",
        restart.as_secs_f64()
    ));
    if leases_after < leases_before {
        return Err(step(format!(
            "the new bootserver holds {leases_after} leases, the old one held {leases_before}: leases were lost"
        )));
    }
    wait_complete(lab, &reboot, timeout * 2)?;
    wait_until(
        &format!("{machine} booted again, container running, Node Ready"),
        timeout * 2,
        || {
            let ready = get(
                lab,
                "node",
                machine,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            let boot = get(lab, "machine", machine, "{.status.agent.bootID}");
            let container = get(lab, "machine", machine, "{.status.agent.containerState}");
            let reason = get(
                lab,
                "machine",
                machine,
                "{.status.conditions[?(@.type==\"BootstrapReady\")].message}",
            );
            (
                ready == "True"
                    && boot != boot_before
                    && !boot.is_empty()
                    && container == "running",
                format!("Ready {ready}, boot {boot}, container {container}; agent: {reason}"),
            )
        },
    )?;
    let boot = boot_started.elapsed();
    say(&format!(
        "bootserver-restart: {machine} Ready again {:.0} s after the reboot",
        boot.as_secs_f64()
    ));
    Ok(Restart {
        leases: (leases_before, leases_after),
        restart,
        boot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_are_read_by_suffix() {
        let text = "# HELP unbounded_bootserver_dhcp_active_leases Active leases.\n\
                    # TYPE unbounded_bootserver_dhcp_active_leases gauge\n\
                    unbounded_bootserver_dhcp_active_leases 3\n\
                    unbounded_bootserver_http_requests_total{route=\"/x\"} 7\n";
        assert_eq!(metric_value(text, "dhcp_active_leases"), Some(3));
        assert_eq!(metric_value(text, "http_requests_total"), Some(7));
        assert_eq!(metric_value(text, "missing"), None);
    }

    #[test]
    fn scripts_are_counted_per_boot() {
        let console = "Unbounded: booting machine-1\nLinux version\nUnbounded: booting machine-1\nUnbounded: boot";
        assert_eq!(
            scripts_served(console),
            2,
            "the half-written line does not count"
        );
    }
}
