//! `scenario kubelet`: the lab's machines rolled from the testbed's Kubernetes release to
//! another by their configuration alone, then back by pinning, on VMs.
//!
//! 1. The node image of [`OTHER_VERSION`] is built (its kubelet from that release's Go
//!    modules, cached) and put where the lab's bootserver serves images.
//! 2. The configuration `testbed` gets that image and `kubernetes.version` with a
//!    `RollingUpdate` (`maxUnavailable: 1`): every Machine moves to the new version one at a
//!    time, never more than one Node unready, and each Node comes back running the other
//!    kubelet (`status.nodeInfo.kubeletVersion`), which its Machine reports (`KUBELET`
//!    column, condition `KubeletVersion`).
//! 3. Every Machine pinned to the old version: the rollout takes them back, one at a time,
//!    to the testbed's kubelet.
//! 4. The configuration is left as it was (`OnDelete`, the testbed's image and version, as a
//!    new version) and the pins removed, so that the lab's other scenarios run as before.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::KUBERNETES_VERSION;
use crate::failure::Failure;
use crate::images::{self, NodeImage};
use crate::lab::base::LabError;
use crate::scenario::{Lab, get, latest_version, patch_configuration, pin, step, wait_new_version};

/// The other release: one minor older than the control plane, as kubelets may be.
pub const OTHER_VERSION: &str = "v1.34.4";

/// What the scenario measured.
#[derive(Debug, Clone)]
pub struct KubeletFigures {
    /// The rollout to [`OTHER_VERSION`]: each machine and when its Node was Ready with it.
    pub upgrade: Vec<(String, Duration)>,
    /// The rollback by pinning.
    pub rollback: Vec<(String, Duration)>,
}

/// The node image of [`OTHER_VERSION`], served by the lab's bootserver from `images_dir` as
/// `kubelet-<version>/node.tar.zst`; returns its URL (relative: the agent resolves it
/// against its bootserver) and the image.
pub(crate) fn serve_other_image(images_dir: &Path) -> Result<(String, NodeImage), LabError> {
    let node = images::node_image_for(OTHER_VERSION).map_err(Failure::of)?;
    let dir_name = format!("kubelet-{OTHER_VERSION}");
    let dir = images_dir.join(&dir_name);
    std::fs::create_dir_all(&dir).map_err(|e| Failure::new(dir.display(), e))?;
    let link = dir.join("node.tar.zst");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&node.archive, &link)
        .map_err(|e| Failure::new(link.display(), e))?;
    Ok((format!("{dir_name}/node.tar.zst"), node))
}

/// One poll of the lab: each Node's `(name, ready and schedulable, kubelet version)`.
fn nodes(lab: &Lab) -> Result<Vec<(String, bool, String)>, LabError> {
    let listing = lab.kubectl(
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}|{.status.conditions[?(@.type==\"Ready\")].status}|{.spec.unschedulable}|{.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}",
        ],
        None,
    )?;
    Ok(parse_nodes(&listing))
}

fn parse_nodes(listing: &str) -> Vec<(String, bool, String)> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().split('|');
            let name = fields.next().filter(|n| !n.is_empty())?.to_owned();
            let ready = fields.next() == Some("True");
            let cordoned = fields.next() == Some("true");
            let kubelet = fields.next().unwrap_or_default().to_owned();
            Some((name, ready && !cordoned, kubelet))
        })
        .collect()
}

/// One Machine's `(recorded version, phase, reported kubelet, KubeletVersion reason)`.
fn machine_view(lab: &Lab, name: &str) -> (String, String, String, String) {
    let fields = get(
        lab,
        "machine",
        name,
        "{.status.configuration.version}|{.status.phase}|{.status.kubeletVersion}|{.status.conditions[?(@.type==\"KubeletVersion\")].reason}",
    );
    let mut parts = fields.split('|').map(str::to_owned);
    (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    )
}

/// Watches a rollout of `names` to configuration `version` with kubelet `kubelet`: never
/// more than one Node unready, every Machine done once it records the version, runs, its
/// Node is Ready with that kubelet and the Machine reports it as matching. Returns when each
/// machine was done.
fn watch_rollout(
    lab: &Lab,
    names: &[String],
    version: &str,
    kubelet: &str,
    deadline: Duration,
    say: &dyn Fn(&str),
) -> Result<Vec<(String, Duration)>, LabError> {
    let started = Instant::now();
    let mut done: Vec<(String, Duration)> = Vec::new();
    let mut went_down: Vec<String> = Vec::new();
    loop {
        let nodes = nodes(lab)?;
        let ready = |name: &str| nodes.iter().any(|(n, r, _)| n == name && *r);
        let unready: Vec<&String> = names.iter().filter(|n| !ready(n)).collect();
        if unready.len() > 1 {
            return Err(step(format!(
                "more than maxUnavailable (1) Nodes unready at once: {unready:?}"
            )));
        }
        for name in &unready {
            if !went_down.contains(name) {
                went_down.push((*name).clone());
                say(&format!(
                    "kubelet: {name} unready at {:.0} s",
                    started.elapsed().as_secs_f64()
                ));
            }
        }
        for name in names {
            if done.iter().any(|(n, _)| n == name) {
                continue;
            }
            let node_kubelet = nodes
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, k)| k.as_str())
                .unwrap_or_default();
            let (recorded, phase, reported, reason) = machine_view(lab, name);
            if recorded == version
                && phase == "Running"
                && ready(name)
                && node_kubelet == kubelet
                && reported == kubelet
                && reason == "KubeletVersionMatches"
            {
                let at = started.elapsed();
                say(&format!(
                    "kubelet: {name} on version {version}, its Node Ready with kubelet {kubelet} at {:.0} s",
                    at.as_secs_f64()
                ));
                done.push((name.clone(), at));
            }
        }
        if done.len() == names.len() {
            break;
        }
        if started.elapsed() > deadline {
            let views: Vec<_> = names.iter().map(|n| (n, machine_view(lab, n))).collect();
            return Err(step(format!(
                "timed out rolling to version {version} (kubelet {kubelet}); machines (version, phase, kubelet, condition): {views:?}; Nodes: {nodes:?}"
            )));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    // Every machine was repaved (its Node went away), not just relabelled.
    went_down.sort();
    let mut all = names.to_vec();
    all.sort();
    if went_down != all {
        return Err(step(format!(
            "the rollout took down {went_down:?}, not every machine of {all:?}"
        )));
    }
    Ok(done)
}

/// Runs the scenario on a lab whose bootserver serves `images_dir` (a `--host-binaries`
/// lab: the pods lab's bootserver serves the boot images image).
pub fn kubelet(
    lab: &Lab,
    images_dir: &Path,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<KubeletFigures, LabError> {
    if lab.pods().is_some() {
        return Err(step(
            "scenario kubelet puts the other node image where the bootserver serves images from the host: run it on a lab started with `up --host-binaries`",
        ));
    }
    let names = lab.machine_names();
    say(&format!(
        "kubelet: the node image of {OTHER_VERSION} (kubelet from its Go modules; cached after the first time)"
    ));
    let (url, node) = serve_other_image(images_dir)?;
    let old = latest_version(lab);
    let old_image = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.spec.template.image.url}|{.spec.template.image.sha256}",
    );
    let Some((old_url, old_sha)) = old_image.split_once('|') else {
        return Err(step(format!(
            "the configuration testbed has no image: {old_image:?}"
        )));
    };
    let old_number: i64 = old
        .parse()
        .map_err(|_| step(format!("the configuration's latest version is {old:?}")))?;

    say(&format!(
        "kubelet: configuration testbed → kubernetes.version {OTHER_VERSION} with its node image, RollingUpdate maxUnavailable 1"
    ));
    patch_configuration(
        lab,
        &format!(
            r#"{{"spec":{{"updateStrategy":{{"type":"RollingUpdate","rollingUpdate":{{"maxUnavailable":1}}}},"template":{{"image":{{"url":"{url}","sha256":"{sha}"}},"kubernetes":{{"version":"{OTHER_VERSION}"}}}}}}}}"#,
            sha = node.sha256
        ),
    )?;
    let next = wait_new_version(lab, &old)?;
    let per_machine = timeout * u32::try_from(names.len() + 1).unwrap_or(4);
    let upgrade = watch_rollout(lab, &names, &next, OTHER_VERSION, per_machine, say)?;

    say(&format!(
        "kubelet: rollback by pinning every machine to version {old} ({KUBERNETES_VERSION})"
    ));
    for name in &names {
        pin(lab, name, old_number)?;
    }
    let rollback = watch_rollout(lab, &names, &old, KUBERNETES_VERSION, per_machine, say)?;

    say(
        "kubelet: the configuration back to OnDelete with the testbed's image and version, pins removed",
    );
    patch_configuration(
        lab,
        &format!(
            r#"{{"spec":{{"updateStrategy":{{"type":"OnDelete","rollingUpdate":null}},"template":{{"image":{{"url":"{old_url}","sha256":"{old_sha}"}},"kubernetes":{{"version":"{KUBERNETES_VERSION}"}}}}}}}}"#
        ),
    )?;
    for name in &names {
        lab.kubectl(
            &[
                "patch",
                "machine",
                name,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/configurationRef/version"}]"#,
            ],
            None,
        )?;
    }
    Ok(KubeletFigures { upgrade, rollback })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_listing_reads_readiness_and_kubelet() {
        let listing = "machine-1|True||v1.34.4\nmachine-2|False||v1.35.4\nmachine-3|True|true|v1.35.4\n|True||x\n";
        assert_eq!(
            parse_nodes(listing),
            vec![
                ("machine-1".into(), true, "v1.34.4".into()),
                ("machine-2".into(), false, "v1.35.4".into()),
                ("machine-3".into(), false, "v1.35.4".into()),
            ]
        );
    }
}
