//! `scenario capi`: Unbounded as a Cluster API provider on the lab's VMs (`up --machines 3`),
//! the real form of `controller/tests/cluster_api.rs`, each step timed:
//!
//! 1. **provider on**: Cluster API's core CRDs and ours applied to the lab's API server,
//!    our Cluster API RBAC, `--cluster-api` on the lab's controller (pods:
//!    `UNBOUNDED_CLUSTER_API=true` set on its Deployment, rolled out; host binaries: the
//!    controller must have been started with it, `UNBOUNDED_CLUSTER_API=true up
//!    --host-binaries`, since the lab's supervisor owns that process), and Cluster API's core
//!    manager on the host against the lab's admin kubeconfig;
//! 2. **claim**: a Cluster (our control plane: the lab's; the `<cluster>-kubeconfig` Secret
//!    is the lab's admin kubeconfig) with a MachineDeployment of 2 over the lab's inventory
//!    running configuration `testbed` at its Kubernetes version: both Cluster API Machines
//!    Running with a nodeRef, Ready, and so in `clusterctl describe cluster`;
//! 3. **scale to 1**: the machine let go is released: its Node drained and deleted, its
//!    disks wiped as the configuration says, powered off (a `powerOff` operation), free;
//! 4. **roll**: back to 2, then a new configuration version with another Kubernetes release
//!    ([`crate::kubelet_scenario::OTHER_VERSION`], its node image) and the deployment's
//!    `version` patched: one Machine at a time (maxSurge 1, maxUnavailable 0), never fewer
//!    than 2 Running, onto hardware whose `configurationRef` names the new version, which it
//!    records, and whose Node's kubelet reports it;
//! 5. **remediate**: a MachineHealthCheck; one machine's OS is shut down by its agent (a
//!    `shutdown` MachineOperation: kubelet stops with it and its Node goes Unknown): Cluster
//!    API deletes the Machine, we release it (powered off), a replacement runs;
//! 6. **clean up**: the Cluster deleted (every machine released), the core manager stopped,
//!    the provider off and the CRDs and RBAC removed, the configuration back on the lab's
//!    release (a new version); every lab machine pinned to it and repaved with a `pxeBoot`
//!    (a released machine would get the newest *deployed* version, the other release's),
//!    Running with a Ready Node of the lab's release, then unpinned as it began.

mod objects;
mod rollout;
mod steps;

use std::path::Path;
use std::time::{Duration, Instant};

use objects::{CONFIGURATION, CapiMachine, DEPLOYMENT, Host, NAMESPACE, NodeView, kinds};
use serde_json::Value;
use unbounded_api::well_known::labels;

use crate::cluster::{ClusterApiBinaries, CoreManager};
use crate::failure::Failure;
use crate::lab::base::{LAB_LABEL, LabError};
use crate::scenario::{Lab, get, step};

/// Where the running lab keeps what the scenario needs beyond `kubectl`.
#[derive(Debug, Clone, Copy)]
pub struct CapiPaths<'a> {
    /// The lab's admin kubeconfig (reaches the API server from the host).
    pub kubeconfig: &'a Path,
    /// kubectl.
    pub kubectl: &'a Path,
    /// The lab's directory (logs; the core manager's directory goes here).
    pub dir: &'a Path,
}

/// Each step's name and how long it took.
#[derive(Debug, Clone, Default)]
pub struct CapiFigures {
    /// In order.
    pub steps: Vec<(String, Duration)>,
}

const CONTROLLER_NAMESPACE: &str = "unbounded-system";
const CONTROLLER_DEPLOYMENT: &str = "deployment/unbounded-controller";
/// How long a Node must be not Ready before the MachineHealthCheck finds it unhealthy.
const UNHEALTHY_SECONDS: u32 = 30;
/// What a boot may wait on top of its own time for the machine's TPM to leave its
/// dictionary-attack lockout: every hard power-off of a running machine (a release's
/// `powerOff`) is a non-orderly TPM shutdown, counted as a failed try; from the third
/// (swtpm's default `maxTries`) the TPM refuses the agent's attestation key
/// (`tpm2_activatecredential` fails) until one try is forgotten per 1000 s powered on
/// (`recoveryTime`). Measured here: attested again at 990 s of uptime.
const TPM_LOCKOUT_RECOVERY: Duration = Duration::from_secs(1000);

struct Run<'a> {
    lab: &'a Lab,
    paths: CapiPaths<'a>,
    say: &'a dyn Fn(&str),
    timeout: Duration,
    binaries: ClusterApiBinaries,
    manager: Option<CoreManager>,
    figures: CapiFigures,
}

/// Runs the scenario; needs 3 lab machines (2 replicas and the surge).
pub fn capi(
    lab: &Lab,
    paths: CapiPaths<'_>,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<CapiFigures, LabError> {
    let machines = lab.machine_names().len();
    if machines < 3 {
        return Err(step(format!(
            "scenario capi needs 3 lab machines (2 replicas and a surge), this lab has {machines}: `up --machines 3`"
        )));
    }
    let mut run = Run {
        lab,
        paths,
        say,
        timeout,
        binaries: ClusterApiBinaries::ensure().map_err(Failure::of)?,
        manager: None,
        figures: CapiFigures::default(),
    };
    let original = run.configuration_release()?;
    let template = run.configuration_template()?;
    run.timed("1 provider on, core manager started", Run::enable)?;
    run.timed("2 MachineDeployment of 2 claims, Running, Ready", |r| {
        r.claim(&original)
    })?;
    run.timed("3 scale to 1: one machine released", Run::scale_down)?;
    run.timed("4a scale to 2", |r| r.scale_up(&original))?;
    run.timed("4b rollout onto a new Kubernetes version", Run::roll)?;
    run.timed("5 MachineHealthCheck remediation", Run::remediate)?;
    run.timed("6 clean up, every machine booted again", |r| {
        r.clean_up(&original, &template)
    })?;
    Ok(run.figures)
}

impl Run<'_> {
    fn say(&self, message: &str) {
        (self.say)(&format!("capi: {message}"));
    }

    fn timed(
        &mut self,
        name: &str,
        body: impl FnOnce(&mut Self) -> Result<(), LabError>,
    ) -> Result<(), LabError> {
        self.say(&format!("step {name}"));
        let started = Instant::now();
        let result = body(self);
        let took = started.elapsed();
        match &result {
            Ok(()) => self.say(&format!("step {name}: {:.0} s", took.as_secs_f64())),
            Err(_) => self.say(&format!(
                "step {name} FAILED after {:.0} s; Cluster API Machines: {}; core manager log (tail): {}",
                took.as_secs_f64(),
                self.capi_summary(),
                self.manager
                    .as_ref()
                    .map(|m| format!("{}\n{}", m.log_path().display(), m.log_tail(25)))
                    .unwrap_or_default()
            )),
        }
        self.figures.steps.push((name.to_owned(), took));
        result
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, LabError> {
        self.lab.kubectl(args, None)
    }

    fn json(&self, args: &[&str]) -> Result<Value, LabError> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.kubectl(&all)?;
        serde_json::from_str(&text).map_err(|e| Failure::new("reading kubectl's JSON", e).into())
    }

    fn capi_machines(&self) -> Result<Vec<CapiMachine>, LabError> {
        let selector = format!("cluster.x-k8s.io/deployment-name={DEPLOYMENT}");
        let list = self.json(&[
            "get",
            kinds::CAPI_MACHINES,
            "-n",
            NAMESPACE,
            "-l",
            &selector,
        ])?;
        Ok(objects::capi_machines(&list))
    }

    fn capi_summary(&self) -> String {
        match self.capi_machines() {
            Ok(machines) => format!(
                "[{}]",
                machines
                    .iter()
                    .map(CapiMachine::summary)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Err(e) => e.to_string(),
        }
    }

    fn hosts(&self) -> Result<Vec<Host>, LabError> {
        let selector = format!("{LAB_LABEL}=true");
        let list = self.json(&["get", kinds::MACHINES, "-l", &selector])?;
        Ok(objects::hosts(&list))
    }

    fn nodes(&self) -> Result<Vec<NodeView>, LabError> {
        Ok(objects::nodes(&self.json(&["get", "nodes"])?))
    }

    /// The lab Machine a Cluster API Machine stands on (by provider ID).
    fn host_of<'h>(hosts: &'h [Host], machine: &CapiMachine) -> Option<&'h Host> {
        hosts
            .iter()
            .find(|h| !machine.provider_id.is_empty() && h.provider_id == machine.provider_id)
    }

    /// The lab machines whose agent's last TPM attestation was refused by their TPM (the
    /// lockout [`TPM_LOCKOUT_RECOVERY`] is about), as a note for what a wait saw.
    fn tpm_lockouts(&self) -> String {
        let locked: Vec<String> = self
            .lab
            .machine_names()
            .into_iter()
            .filter(|name| {
                let console = self.lab.console(name);
                console
                    .lines()
                    .rfind(|l| {
                        l.contains("TPM attestation") || l.contains("attesting this machine")
                    })
                    .is_some_and(|l| l.contains("tpm2_activatecredential: ERROR"))
            })
            .collect();
        if locked.is_empty() {
            String::new()
        } else {
            format!(
                "; TPM refuses attestation on {locked:?} (dictionary-attack lockout after hard power-offs: heals within {} s powered on)",
                TPM_LOCKOUT_RECOVERY.as_secs()
            )
        }
    }

    /// Waits until `check` holds, saying what it sees whenever that changes; the error names
    /// `what` and the last thing seen.
    fn wait(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Self) -> Result<(bool, String), LabError>,
    ) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        loop {
            let (done, seen) = check(self).unwrap_or_else(|e| (false, e.to_string()));
            if done {
                return Ok(());
            }
            if seen != last {
                self.say(&format!("waiting for {what}: {seen}"));
                last = seen;
            }
            if Instant::now() > deadline {
                return Err(step(format!(
                    "timed out after {} s waiting for {what}; last seen: {last}",
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// Waits until the hardware of each Cluster API Machine runs what its claim names: its
    /// `configurationRef` names the lab's configuration with a version, it records that
    /// version, and its Node is Ready with kubelet `release` (a Node of another version
    /// would be a previous tenant's).
    fn check_runs_claim(
        &self,
        running: &[(CapiMachine, Host)],
        release: &str,
    ) -> Result<(), LabError> {
        for (machine, host) in running {
            let name = &host.name;
            self.wait(
                &format!("{name} (of {}) on its claimed version, kubelet {release}", machine.name),
                Duration::from_secs(300),
                |r| {
                    let hosts = r.hosts()?;
                    let h = hosts.iter().find(|h| &h.name == name);
                    let nodes = r.nodes()?;
                    let node = nodes.iter().find(|n| &n.name == name);
                    let claimed = h.and_then(|h| h.configuration.clone());
                    let recorded = h.map_or(0, |h| h.recorded);
                    let ok = matches!(&claimed, Some((c, v)) if c == CONFIGURATION && *v == recorded && *v > 0)
                        && node.is_some_and(|n| n.ready && n.kubelet == release);
                    Ok((
                        ok,
                        format!("configurationRef {claimed:?}, recorded version {recorded}, Node {node:?}"),
                    ))
                },
            )?;
            let recorded = self
                .hosts()?
                .into_iter()
                .find(|h| &h.name == name)
                .map_or(0, |h| h.recorded);
            self.say(&format!(
                "{} Running on {name} ({}): {CONFIGURATION} version {recorded}, kubelet {release}",
                machine.name, host.provider_id
            ));
        }
        Ok(())
    }

    /// The Kubernetes release of the lab's configuration.
    fn configuration_release(&self) -> Result<String, LabError> {
        let release = get(
            self.lab,
            "machineconfiguration",
            CONFIGURATION,
            "{.spec.template.kubernetes.version}",
        );
        if release.is_empty() {
            return Err(step("the lab's configuration names no Kubernetes version"));
        }
        Ok(release)
    }

    /// The lab configuration's `spec.template`, as JSON (put back at the end).
    fn configuration_template(&self) -> Result<Value, LabError> {
        let text = get(
            self.lab,
            "machineconfiguration",
            CONFIGURATION,
            "{.spec.template}",
        );
        serde_json::from_str(&text)
            .map_err(|e| Failure::new("reading the lab configuration's template", e).into())
    }

    /// Waits until the deployment has exactly `count` Machines, all Running with a nodeRef on
    /// distinct lab machines, and returns them with those machines.
    fn wait_running(
        &self,
        count: usize,
        version: &str,
        limit: Duration,
    ) -> Result<Vec<(CapiMachine, Host)>, LabError> {
        let mut found = Vec::new();
        self.wait(
            &format!("{count} Cluster API Machines Running on {version}"),
            limit,
            |r| {
                let machines = r.capi_machines()?;
                let hosts = r.hosts()?;
                let pairs: Vec<(CapiMachine, Host)> = machines
                    .iter()
                    .filter_map(|m| Some((m.clone(), Self::host_of(&hosts, m)?.clone())))
                    .collect();
                let mut distinct: Vec<&str> = pairs.iter().map(|(_, h)| h.name.as_str()).collect();
                distinct.sort_unstable();
                distinct.dedup();
                let done = machines.len() == count
                    && pairs.len() == count
                    && distinct.len() == count
                    && machines.iter().all(|m| m.running() && m.version == version);
                found = pairs;
                let seen: Vec<String> = machines.iter().map(CapiMachine::summary).collect();
                Ok((done, format!("[{}]", seen.join("; "))))
            },
        )?;
        Ok(found)
    }

    fn scale(&self, replicas: u32) -> Result<(), LabError> {
        self.kubectl(&[
            "scale",
            "-n",
            NAMESPACE,
            &format!("{}/{DEPLOYMENT}", kinds::DEPLOYMENTS),
            &format!("--replicas={replicas}"),
        ])?;
        Ok(())
    }

    /// How many `powerOff` operations name `host`.
    fn power_offs(&self, host: &str) -> usize {
        let selector = format!("{}={host}", labels::MACHINE);
        self.kubectl(&[
            "get",
            "machineoperations",
            "-l",
            &selector,
            "-o",
            "jsonpath={range .items[*]}{.spec.operationName}{\"\\n\"}{end}",
        ])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim() == "powerOff")
        .count()
    }

    /// Waits until `host` is released: no claim, no repave pending, powered off, no Node;
    /// and powered off by an operation newer than the `before` count. Returns its
    /// `DisksWiped` condition.
    fn wait_released(&self, host: &str, before: usize) -> Result<String, LabError> {
        let mut wiped = String::new();
        self.wait(
            &format!("{host} released: Node gone, powered off"),
            self.timeout,
            |r| {
                let hosts = r.hosts()?;
                let Some(h) = hosts.iter().find(|h| h.name == host) else {
                    return Ok((false, format!("{host} not found")));
                };
                let node = r.nodes()?.iter().any(|n| n.name == host);
                let offs = r.power_offs(host);
                wiped = h.disks_wiped.clone();
                Ok((
                    h.released() && !node && offs > before,
                    format!(
                        "claim {:?}, repave pending {}, power {}, Node {node}, powerOff operations {offs}, DisksWiped {:?}",
                        h.claim, h.repave, h.power, h.disks_wiped
                    ),
                ))
            },
        )?;
        Ok(wiped)
    }

    /// What the configuration says a release wipes, in words.
    fn wipe_policy(&self) -> String {
        let storage = get(
            self.lab,
            "machineconfiguration",
            CONFIGURATION,
            "{.spec.template.storage}",
        );
        if storage.is_empty() {
            "the configuration has no storage: the node lives in RAM, nothing to wipe".to_owned()
        } else {
            format!("the configuration's storage: {storage}")
        }
    }
}
