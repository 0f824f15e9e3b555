//! Steps 1 (the provider on), 2 (claim), 3 (scale to 1), 4a (back to 2) and 6 (clean up)
//! of `scenario capi`.

use std::time::{Duration, Instant};

use serde_json::Value;
use unbounded_api::well_known::{annotations, operations};

use super::objects::{
    self, CLUSTER, CONFIGURATION, CapiMachine, DEPLOYMENT, HEALTH_CHECK, NAMESPACE, kinds,
};
use super::{CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE, Run, TPM_LOCKOUT_RECOVERY};
use crate::cluster::cluster_api::provider_crds;
use crate::cluster::{CoreManager, ManagerTarget, deploy_dir};
use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::scenario::{latest_version, patch_configuration, step, wait_new_version};

impl Run<'_> {
    /// Step 1.
    pub(super) fn enable(&mut self) -> Result<(), LabError> {
        let started = Instant::now();
        let manager = CoreManager::start_against(ManagerTarget {
            kubeconfig: self.paths.kubeconfig,
            kubectl: self.paths.kubectl,
            data_dir: self.paths.dir,
        })
        .map_err(Failure::of)?;
        self.say(&format!(
            "Cluster API's core and our provider CRDs applied; core manager {} ready in {:.1} s (log {})",
            crate::cluster::CLUSTER_API_VERSION,
            started.elapsed().as_secs_f64(),
            manager.log_path().display()
        ));
        self.manager = Some(manager);
        let rbac = deploy_dir().join("cluster-api/rbac");
        self.kubectl(&["apply", "--server-side", "-f", &rbac.display().to_string()])?;
        if self.lab.pods().is_some() {
            self.say("the controller's Deployment: UNBOUNDED_CLUSTER_API=true, rolling out");
            self.set_provider_env("UNBOUNDED_CLUSTER_API=true")?;
        } else {
            let log = self.paths.dir.join("controller.log");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if !text.contains("Cluster API provider") {
                return Err(step(format!(
                    "the lab's controller (a process of the lab, --host-binaries) runs without --cluster-api ({} does not say it reconciles Cluster API kinds): start the lab with `UNBOUNDED_CLUSTER_API=true cargo run -p unbounded-testbed -- up --host-binaries --machines 3`, or without --host-binaries",
                    log.display()
                )));
            }
            self.say("the lab's controller process runs with UNBOUNDED_CLUSTER_API=true");
        }
        let leftover = self.kubectl(&[
            "get",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "-o",
            "name",
        ])?;
        if !leftover.trim().is_empty() {
            self.say(&format!(
                "an earlier run left {NAMESPACE}: deleting its Cluster first"
            ));
            self.delete_cluster()?;
        }
        Ok(())
    }

    /// Sets (`NAME=value`) or removes (`NAME-`) an environment variable of the controller's
    /// Deployment and waits for the rollout.
    fn set_provider_env(&self, change: &str) -> Result<(), LabError> {
        self.kubectl(&[
            "-n",
            CONTROLLER_NAMESPACE,
            "set",
            "env",
            CONTROLLER_DEPLOYMENT,
            change,
        ])?;
        self.kubectl(&[
            "-n",
            CONTROLLER_NAMESPACE,
            "rollout",
            "status",
            CONTROLLER_DEPLOYMENT,
            &format!("--timeout={}s", self.timeout.as_secs()),
        ])?;
        Ok(())
    }

    /// Step 2.
    pub(super) fn claim(&mut self, release: &str) -> Result<(), LabError> {
        let kubeconfig = std::fs::read_to_string(self.paths.kubeconfig)
            .map_err(|e| Failure::new(self.paths.kubeconfig.display(), e))?;
        // A version nobody runs yet (a Node label of this run): every machine claimed is
        // on another one, warm, and is repaved onto it before it serves its Cluster API
        // Machine (a warm machine on the claimed version would be taken as it is).
        let old = latest_version(self.lab);
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        patch_configuration(
            self.lab,
            &format!(
                r#"{{"spec":{{"template":{{"kubernetes":{{"nodeLabels":{{"unbounded-cloud.io/capi-run":"{run}"}}}}}}}}}}"#
            ),
        )?;
        let latest = wait_new_version(self.lab, &old)?;
        self.say(&format!(
            "Cluster {NAMESPACE}/{CLUSTER}, MachineDeployment {DEPLOYMENT} of 2 at {release}: configuration {CONFIGURATION} version {latest} (a new Node label), which no machine runs yet"
        ));
        self.lab.kubectl(
            &["apply", "-f", "-"],
            Some(&objects::cluster_yaml(&kubeconfig, 2, release)),
        )?;
        let running = self.wait_running(2, release, self.timeout * 2)?;
        self.check_runs_claim(&running, release)?;
        self.wait("both Machines Ready", Duration::from_secs(300), |r| {
            let machines = r.capi_machines()?;
            let ready = machines.len() == 2 && machines.iter().all(|m| m.ready.starts_with("True"));
            let seen: Vec<String> = machines.iter().map(CapiMachine::summary).collect();
            Ok((ready, seen.join("; ")))
        })?;
        let described = std::process::Command::new(&self.binaries.clusterctl)
            .args([
                "describe",
                "cluster",
                CLUSTER,
                "-n",
                NAMESPACE,
                "--grouping=false",
            ])
            .arg("--kubeconfig")
            .arg(self.paths.kubeconfig)
            .output()
            .map_err(|e| Failure::new("clusterctl describe cluster", e))?;
        let text = String::from_utf8_lossy(&described.stdout).into_owned();
        (self.say)(&text);
        if !described.status.success() {
            return Err(step(format!(
                "clusterctl describe cluster failed: {}",
                String::from_utf8_lossy(&described.stderr)
            )));
        }
        for (machine, _) in &running {
            let line = text.lines().find(|l| l.contains(&machine.name));
            if !line.is_some_and(|l| l.contains("True")) {
                return Err(step(format!(
                    "clusterctl describe shows {} not Ready: {line:?}",
                    machine.name
                )));
            }
        }
        Ok(())
    }

    /// Step 3.
    pub(super) fn scale_down(&mut self) -> Result<(), LabError> {
        let release = self.configuration_release()?;
        let before = self.wait_running(2, &release, Duration::from_secs(60))?;
        let offs: Vec<(String, usize)> = before
            .iter()
            .map(|(_, h)| (h.name.clone(), self.power_offs(&h.name)))
            .collect();
        self.scale(1)?;
        let kept = self.wait_running(1, &release, self.timeout)?;
        let (leaving, count) = offs
            .iter()
            .find(|(name, _)| kept.iter().all(|(_, h)| &h.name != name))
            .ok_or_else(|| step("no machine left the deployment"))?;
        self.say(&format!("{leaving} leaves the deployment"));
        let wiped = self.wait_released(leaving, *count)?;
        let policy = self.wipe_policy();
        if !policy.starts_with("the configuration has no storage") && !wiped.starts_with("True") {
            return Err(step(format!(
                "{leaving} was powered off with DisksWiped {wiped:?} ({policy})"
            )));
        }
        self.say(&format!(
            "{leaving} released: Node drained and deleted, powered off, free; DisksWiped {wiped:?} ({policy})"
        ));
        Ok(())
    }

    /// Step 4a.
    pub(super) fn scale_up(&mut self, release: &str) -> Result<(), LabError> {
        self.scale(2)?;
        let running = self.wait_running(2, release, self.timeout * 2)?;
        self.check_runs_claim(&running, release)
    }

    /// Deletes the Cluster (Cluster API deletes its Machines: we release them) and the
    /// namespace, and waits until no lab machine is claimed or releasing.
    fn delete_cluster(&self) -> Result<(), LabError> {
        let limit = format!("--timeout={}s", (self.timeout * 3).as_secs());
        self.kubectl(&[
            "delete",
            "machinehealthchecks.cluster.x-k8s.io",
            HEALTH_CHECK,
            "-n",
            NAMESPACE,
            "--ignore-not-found",
        ])?;
        self.kubectl(&[
            "delete",
            kinds::CLUSTERS,
            CLUSTER,
            "-n",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            &limit,
        ])?;
        self.wait("every lab machine released", self.timeout, |r| {
            let hosts = r.hosts()?;
            let busy: Vec<String> = hosts
                .iter()
                .filter(|h| !h.claim.is_empty() || h.repave)
                .map(|h| format!("{} (claim {:?}, repave {})", h.name, h.claim, h.repave))
                .collect();
            Ok((busy.is_empty(), format!("{busy:?}")))
        })?;
        self.kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            &limit,
        ])?;
        Ok(())
    }

    /// Step 6.
    pub(super) fn clean_up(&mut self, release: &str, template: &Value) -> Result<(), LabError> {
        self.say("deleting the Cluster: Cluster API deletes its Machines, we release them");
        self.delete_cluster()?;
        if let Some(manager) = self.manager.take() {
            drop(manager);
            self.say("core manager stopped");
        }
        if self.lab.pods().is_some() {
            self.say("the controller's Deployment: UNBOUNDED_CLUSTER_API removed, rolling out");
            self.set_provider_env("UNBOUNDED_CLUSTER_API-")?;
        } else {
            self.say(
                "the lab's controller process keeps UNBOUNDED_CLUSTER_API (it was started with it)",
            );
        }
        let core = self.binaries.core_crds().display().to_string();
        let provider = provider_crds().display().to_string();
        let rbac = deploy_dir().join("cluster-api/rbac").display().to_string();
        for what in [&provider, &core, &rbac] {
            self.kubectl(&[
                "delete",
                "-f",
                what,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=300s",
            ])?;
        }
        self.say("Cluster API's CRDs, ours and our Cluster API RBAC removed");
        let old = latest_version(self.lab);
        let restore =
            serde_json::json!([{"op": "replace", "path": "/spec/template", "value": template}]);
        self.kubectl(&[
            "patch",
            "machineconfiguration",
            CONFIGURATION,
            "--type=json",
            "-p",
            &restore.to_string(),
        ])?;
        let back = wait_new_version(self.lab, &old)?;
        self.say(&format!(
            "configuration {CONFIGURATION} version {back}: its template as it began ({release})"
        ));
        // A released machine gets the newest *deployed* version of the configuration that
        // selects it (selection.rs), which `back` is not yet, and a boot alone does not
        // move it (`OnDelete`: a version is applied at a repave). So each machine names
        // `back` (as a canary would) with a repave request followed by a `pxeBoot`, then
        // names nothing again, as before.
        let back_number: i64 = back
            .parse()
            .map_err(|_| step(format!("the restored version is {back:?}")))?;
        let names = self.lab.machine_names();
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        for name in &names {
            let patch = serde_json::json!({
                "metadata": {"annotations": {
                    annotations::REPAVE: now,
                    annotations::REPAVE_THEN: operations::PXE_BOOT,
                }},
                "spec": {"configurationRef": {"name": CONFIGURATION, "version": back_number}},
            });
            self.kubectl(&[
                "patch",
                kinds::MACHINES,
                name,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ])?;
        }
        self.wait_lab_running(&back, release, self.timeout * 2 + TPM_LOCKOUT_RECOVERY)?;
        for name in &names {
            self.kubectl(&[
                "patch",
                kinds::MACHINES,
                name,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/configurationRef"}]"#,
            ])?;
        }
        // Unpinned, each still resolves to `back` (now deployed): nothing repaves.
        std::thread::sleep(Duration::from_secs(10));
        self.wait_lab_running(&back, release, Duration::from_secs(60))?;
        let pending: Vec<String> = self
            .hosts()?
            .into_iter()
            .filter(|h| h.repave || h.configuration.is_some())
            .map(|h| h.name)
            .collect();
        if !pending.is_empty() {
            return Err(step(format!(
                "unpinned, {pending:?} still name a configuration or repave"
            )));
        }
        Ok(())
    }

    /// Waits until every lab machine is Running on configuration version `version` with a
    /// Ready Node whose kubelet is `release`.
    fn wait_lab_running(
        &self,
        version: &str,
        release: &str,
        limit: Duration,
    ) -> Result<(), LabError> {
        let names = self.lab.machine_names();
        self.wait(
            &format!(
                "every lab machine Running on version {version} with a Ready Node ({release})"
            ),
            limit,
            |r| {
                let hosts = r.hosts()?;
                let nodes = r.nodes()?;
                let views: Vec<String> = names
                    .iter()
                    .map(|name| {
                        let h = hosts.iter().find(|h| &h.name == name);
                        let n = nodes.iter().find(|n| &n.name == name);
                        format!(
                            "{name}: {} v{} Node {}",
                            h.map(|h| h.phase.as_str()).unwrap_or("?"),
                            h.map_or(0, |h| h.recorded),
                            n.map(|n| format!(
                                "{} {}",
                                if n.ready { "Ready" } else { "NotReady" },
                                n.kubelet
                            ))
                            .unwrap_or_else(|| "absent".into())
                        )
                    })
                    .collect();
                let done = names.iter().all(|name| {
                    hosts.iter().any(|h| {
                        &h.name == name && h.phase == "Running" && h.recorded.to_string() == version
                    }) && nodes
                        .iter()
                        .any(|n| &n.name == name && n.ready && n.kubelet == release)
                });
                Ok((done, views.join(", ") + &r.tpm_lockouts()))
            },
        )
    }
}
