//! Steps 4b (a rollout onto another Kubernetes release) and 5 (a MachineHealthCheck's
//! remediation) of `scenario capi`.

use std::time::{Duration, Instant};

use super::objects::{self, CONFIGURATION, CapiMachine, DEPLOYMENT, Host, NAMESPACE, kinds};
use super::{Run, TPM_LOCKOUT_RECOVERY, UNHEALTHY_SECONDS};
use crate::failure::Failure;
use crate::kubelet_scenario::OTHER_VERSION;
use crate::lab::base::LabError;
use crate::scenario::{
    latest_version, operation, patch_configuration, step, wait_complete, wait_new_version,
};

impl Run<'_> {
    /// The node image of [`OTHER_VERSION`], where the lab's machines fetch it: a blob of the
    /// lab's registry (pods: the bootserver pod serves only its own image's files), or the
    /// bootserver's image directory (host binaries). `(url, sha256)`.
    pub(super) fn other_image(&self) -> Result<(String, String), LabError> {
        match self.lab.pods() {
            Some(pods) => {
                let node = crate::images::node_image_for(OTHER_VERSION).map_err(Failure::of)?;
                let url = pods.registry().push_blob(
                    &format!("unbounded/node-{OTHER_VERSION}"),
                    &node.archive,
                    &node.sha256,
                )?;
                Ok((url, node.sha256))
            }
            None => {
                let (url, node) =
                    crate::kubelet_scenario::serve_other_image(&self.paths.dir.join("images"))?;
                Ok((url, node.sha256))
            }
        }
    }

    /// Step 4b.
    pub(super) fn roll(&mut self) -> Result<(), LabError> {
        let release = self.configuration_release()?;
        let before = self.wait_running(2, &release, Duration::from_secs(60))?;
        self.say(&format!(
            "the node image of {OTHER_VERSION} (kubelet built from its Go modules the first time)"
        ));
        let (url, sha) = self.other_image()?;
        let old = latest_version(self.lab);
        patch_configuration(
            self.lab,
            &format!(
                r#"{{"spec":{{"template":{{"image":{{"url":"{url}","sha256":"{sha}"}},"kubernetes":{{"version":"{OTHER_VERSION}"}}}}}}}}"#
            ),
        )?;
        let next = wait_new_version(self.lab, &old)?;
        let next_number: i64 = next
            .parse()
            .map_err(|_| step(format!("the new version is {next:?}")))?;
        self.say(&format!(
            "configuration {CONFIGURATION} version {next} runs {OTHER_VERSION} ({url}); the deployment's version → {OTHER_VERSION}"
        ));
        self.kubectl(&[
            "patch",
            "-n",
            NAMESPACE,
            &format!("{}/{DEPLOYMENT}", kinds::DEPLOYMENTS),
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"template":{{"spec":{{"version":"{OTHER_VERSION}"}}}}}}}}"#),
        ])?;
        let started = Instant::now();
        // Two machines boot one after the other, each possibly behind a TPM lockout.
        let deadline = started + self.timeout * 4 + TPM_LOCKOUT_RECOVERY * 2;
        let mut seen_running: Vec<String> = Vec::new();
        let mut last = String::new();
        loop {
            let machines = self.capi_machines()?;
            let hosts = self.hosts()?;
            let nodes = self.nodes()?;
            let live: Vec<&CapiMachine> = machines.iter().filter(|m| !m.deleting).collect();
            let running = live.iter().filter(|m| m.running()).count();
            if running < 2 {
                return Err(step(format!(
                    "fewer than the 2 replicas Running during the rollout: {}",
                    self.capi_summary()
                )));
            }
            if live.len() > 3 {
                return Err(step(format!(
                    "more than replicas + maxSurge (3) Machines: {}",
                    self.capi_summary()
                )));
            }
            let on_new = |m: &CapiMachine| {
                let host = Self::host_of(&hosts, m);
                let node = host.and_then(|h| nodes.iter().find(|n| n.name == h.name));
                m.running()
                    && m.version == OTHER_VERSION
                    && host.is_some_and(|h| {
                        h.configuration == Some((CONFIGURATION.to_owned(), next_number))
                            && h.recorded == next_number
                    })
                    && node.is_some_and(|n| n.ready && n.kubelet == OTHER_VERSION)
            };
            for m in live.iter().filter(|m| on_new(m)) {
                if !seen_running.contains(&m.name) {
                    seen_running.push(m.name.clone());
                    self.say(&format!(
                        "{} on version {next} with kubelet {OTHER_VERSION} at {:.0} s (on {})",
                        m.name,
                        started.elapsed().as_secs_f64(),
                        Self::host_of(&hosts, m)
                            .map(|h| h.name.as_str())
                            .unwrap_or("?")
                    ));
                }
            }
            if machines.len() == 2 && machines.iter().all(on_new) {
                break;
            }
            let now: Vec<String> = machines.iter().map(CapiMachine::summary).collect();
            let now = now.join("; ") + &self.tpm_lockouts();
            if now != last {
                self.say(&format!("rolling: {now}"));
                last = now;
            }
            if Instant::now() > deadline {
                return Err(step(format!(
                    "timed out rolling onto {OTHER_VERSION}: {last}; Nodes: {nodes:?}"
                )));
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        let after = self.wait_running(2, OTHER_VERSION, Duration::from_secs(30))?;
        for (old_machine, old_host) in &before {
            if after.iter().any(|(m, _)| m.name == old_machine.name) {
                return Err(step(format!("{} was not replaced", old_machine.name)));
            }
            if after.iter().all(|(_, h)| h.name != old_host.name) {
                self.wait_released(&old_host.name, 0)?;
            }
        }
        self.say(&format!(
            "rolled onto {OTHER_VERSION} in {:.0} s, never fewer than 2 Running",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Step 5.
    pub(super) fn remediate(&mut self) -> Result<(), LabError> {
        self.lab.kubectl(
            &["apply", "-f", "-"],
            Some(&objects::health_check_yaml(UNHEALTHY_SECONDS)),
        )?;
        let running = self.wait_running(2, OTHER_VERSION, Duration::from_secs(60))?;
        let (victim, host) = running
            .first()
            .cloned()
            .ok_or_else(|| step("no Machine to make unhealthy"))?;
        let offs = self.power_offs(&host.name);
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stop = format!("tb-capi-stop-{run}");
        self.say(&format!(
            "{}: shutting down {} (MachineOperation {stop}, shutdown: kubelet stops with the OS)",
            victim.name, host.name
        ));
        let stopped = Instant::now();
        operation(self.lab, &stop, &host.name, "shutdown", "")?;
        wait_complete(self.lab, &stop, Duration::from_secs(180))?;
        self.wait(
            &format!("{}'s Node not Ready", host.name),
            Duration::from_secs(300),
            |r| {
                let nodes = r.nodes()?;
                let node = nodes.iter().find(|n| n.name == host.name);
                Ok((node.is_none_or(|n| !n.ready), format!("{node:?}")))
            },
        )?;
        self.say(&format!(
            "{}'s Node not Ready {:.0} s after the shutdown was asked",
            host.name,
            stopped.elapsed().as_secs_f64()
        ));
        self.wait(
            &format!("Cluster API to delete {}", victim.name),
            Duration::from_secs(300),
            |r| {
                let machines = r.capi_machines()?;
                let gone = machines.iter().all(|m| m.name != victim.name || m.deleting);
                Ok((gone, r.capi_summary()))
            },
        )?;
        self.say(&format!(
            "the MachineHealthCheck had {} deleted {:.0} s after the shutdown",
            victim.name,
            stopped.elapsed().as_secs_f64()
        ));
        let mut replacement = None;
        let limit = self.timeout * 2 + TPM_LOCKOUT_RECOVERY;
        self.wait("a replacement Running", limit, |r| {
            let machines = r.capi_machines()?;
            let hosts = r.hosts()?;
            let done = machines.len() == 2
                && machines
                    .iter()
                    .all(|m| m.running() && m.name != victim.name);
            replacement = machines
                .iter()
                .find(|m| running.iter().all(|(old, _)| old.name != m.name))
                .map(|m| {
                    let on = Self::host_of(&hosts, m)
                        .map(|h| h.name.clone())
                        .unwrap_or_default();
                    (m.name.clone(), on)
                });
            Ok((done, r.capi_summary() + &r.tpm_lockouts()))
        })?;
        let released = self.power_offs(&host.name) > offs;
        if !released {
            return Err(step(format!(
                "{} was not powered off by a release before serving again",
                host.name
            )));
        }
        let now = self.wait_running(2, OTHER_VERSION, Duration::from_secs(60))?;
        let fresh: Vec<(CapiMachine, Host)> = now
            .into_iter()
            .filter(|(m, _)| running.iter().all(|(old, _)| old.name != m.name))
            .collect();
        self.check_runs_claim(&fresh, OTHER_VERSION)?;
        let (name, on) = replacement.unwrap_or_default();
        self.say(&format!(
            "{} released (powered off, {} powerOff operations now); replacement {name} Running on {on} {:.0} s after the shutdown",
            host.name,
            self.power_offs(&host.name),
            stopped.elapsed().as_secs_f64()
        ));
        Ok(())
    }
}
