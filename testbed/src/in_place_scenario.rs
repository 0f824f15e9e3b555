//! `scenario in-place`: `applyConfiguration` on a running lab machine.
//! 1. A new version of the lab's configuration `testbed` adds a Node label and a file
//!    (`/var/log/unbounded-in-place.log` in the node container, read back through the
//!    Node's kubelet `/logs/` endpoint) whose `restartUnits` is `containerd.service`. The
//!    machine is pinned to it and an `applyConfiguration` (not disruptive) completes; its
//!    `applyFiles` child completed with containerd restarted; no repave: the Node's UID, the
//!    container's boot ID (the Node's `nodeInfo.bootID`) and the host's (the agent's) are
//!    unchanged; the label is on the Node, the file holds the new content, the Machine
//!    records the version.
//! 2. A version without that file needs a repave (a removed file cannot be restored in
//!    place): refused without `disruptive`, the Machine keeps its version; carried out with
//!    it: the Node is replaced (a new UID), the Machine records the version.
//!
//! The machine is unpinned at the end; the configuration keeps the last version.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::scenario::{
    Lab, get, operation, patch_configuration, pin, step, wait_complete, wait_until,
};

/// The file the scenario writes, inside the node container (under kubelet's `/logs/`).
pub const FILE: &str = "/var/log/unbounded-in-place.log";
/// The Node label the scenario sets.
pub const LABEL: &str = "unbounded-cloud.io/in-place";

/// The lab configuration's files with ours set to `content`, or removed (`None`).
fn files_with(current: &str, content: Option<&str>) -> Result<Value, LabError> {
    let mut files: Vec<Value> = if current.trim().is_empty() {
        Vec::new()
    } else {
        serde_json::from_str(current).map_err(|e| {
            Failure::around(
                "the configuration's files are not JSON (",
                e,
                format!("): {current}"),
            )
        })?
    };
    files.retain(|f| f.get("path").and_then(Value::as_str) != Some(FILE));
    if let Some(content) = content {
        files.push(json!({"path": FILE, "content": content, "mode": "0644",
                          "restartUnits": ["containerd.service"]}));
    }
    Ok(Value::Array(files))
}

/// Changes the lab configuration's template and waits for the version it makes.
fn new_version(lab: &Lab, template: Value) -> Result<i64, LabError> {
    let latest = |lab: &Lab| {
        get(
            lab,
            "machineconfiguration",
            "testbed",
            "{.status.latestVersion}",
        )
        .parse::<i64>()
        .unwrap_or(0)
    };
    let before = latest(lab);
    patch_configuration(lab, &json!({"spec": {"template": template}}).to_string())?;
    let mut seen = before;
    wait_until("a new version of testbed", Duration::from_secs(60), || {
        seen = latest(lab);
        (seen > before, seen.to_string())
    })?;
    Ok(seen)
}

fn apply(
    lab: &Lab,
    name: &str,
    machine: &str,
    version: i64,
    disruptive: bool,
) -> Result<(), LabError> {
    operation(
        lab,
        name,
        machine,
        "applyConfiguration",
        &format!("version: \"{version}\", disruptive: \"{disruptive}\""),
    )
}

fn identities(lab: &Lab, machine: &str) -> (String, String, String) {
    (
        get(lab, "node", machine, "{.metadata.uid}"),
        get(lab, "node", machine, "{.status.nodeInfo.bootID}"),
        get(lab, "machine", machine, "{.status.agent.bootID}"),
    )
}

/// The scenario on the lab's first machine.
pub fn in_place(lab: &Lab, timeout: Duration, say: &dyn Fn(&str)) -> Result<(), LabError> {
    let machine = lab
        .machine_names()
        .first()
        .cloned()
        .ok_or_else(|| step("no machines"))?;
    let before = identities(lab, &machine);
    if before.0.is_empty() || before.1.is_empty() {
        return Err(step(format!("{machine} has no Node to apply to")));
    }
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let content = format!("applied in place at {stamp}\n");
    let files = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.spec.template.files}",
    );

    // 1. A label and a file, in place.
    let version = new_version(
        lab,
        json!({"kubernetes": {"nodeLabels": {LABEL: stamp.to_string()}},
               "files": files_with(&files, Some(&content))?}),
    )?;
    say(&format!(
        "in-place: version {version} adds the label {LABEL} and {FILE}; applying it to {machine}"
    ));
    pin(lab, &machine, version)?;
    let name = format!("tb-in-place-v{version}");
    apply(lab, &name, &machine, version, false)?;
    wait_complete(lab, &name, timeout)?;
    let child = format!("{name}-files");
    let child_message = get(lab, "machineoperation", &child, "{.status.message}");
    let child_state = get(lab, "machineoperation", &child, "{.status.state}");
    if child_state != "Complete" || !child_message.contains("restarted containerd.service") {
        return Err(step(format!(
            "{child}: {child_state}: {child_message} (wanted Complete, containerd.service restarted)"
        )));
    }
    let after = identities(lab, &machine);
    if after != before {
        return Err(step(format!(
            "{machine} was replaced: (Node UID, container boot ID, host boot ID) {before:?} → {after:?}"
        )));
    }
    let label = get(
        lab,
        "node",
        &machine,
        "{.metadata.labels.unbounded-cloud\\.io/in-place}",
    );
    if label != stamp.to_string() {
        return Err(step(format!(
            "the Node's {LABEL} is {label:?}, not {stamp}"
        )));
    }
    let recorded = get(lab, "machine", &machine, "{.status.configuration.version}");
    if recorded != version.to_string() {
        return Err(step(format!(
            "{machine} records version {recorded}, not {version}"
        )));
    }
    let log_name = FILE.trim_start_matches("/var/log/");
    let written = lab.kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{machine}/proxy/logs/{log_name}"),
        ],
        None,
    )?;
    if written != content {
        return Err(step(format!(
            "{FILE} in the container holds {written:?}, not {content:?}"
        )));
    }
    say(&format!(
        "in-place: {machine} on version {version} without a repave (Node UID, boot IDs unchanged; label, file, containerd restarted: {child_message})"
    ));

    // 2. The file removed: a repave, refused and then carried out.
    let files = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.spec.template.files}",
    );
    let repave_version = new_version(lab, json!({"files": files_with(&files, None)?}))?;
    pin(lab, &machine, repave_version)?;
    let refused = format!("tb-in-place-v{repave_version}-refused");
    apply(lab, &refused, &machine, repave_version, false)?;
    wait_until(
        &format!("{refused} Failed"),
        Duration::from_secs(60),
        || {
            let state = get(lab, "machineoperation", &refused, "{.status.state}");
            let message = get(lab, "machineoperation", &refused, "{.status.message}");
            (
                state == "Failed" && message.contains("is no longer in the configuration"),
                format!("{state}: {message}"),
            )
        },
    )?;
    if identities(lab, &machine).0 != before.0 {
        return Err(step("the refused operation replaced the Node"));
    }
    say(&format!(
        "in-place: version {repave_version} (file removed) refused without disruptive; applying it with disruptive"
    ));
    let disruptive = format!("tb-in-place-v{repave_version}-disruptive");
    apply(lab, &disruptive, &machine, repave_version, true)?;
    wait_complete(lab, &disruptive, timeout)?;
    let replaced = identities(lab, &machine);
    if replaced.0 == before.0 || replaced.0.is_empty() {
        return Err(step(format!("the Node was not replaced: {replaced:?}")));
    }
    lab.kubectl(
        &[
            "patch",
            "machine",
            &machine,
            "--type=merge",
            "-p",
            r#"{"spec":{"configurationRef":{"name":"testbed","version":null}}}"#,
        ],
        None,
    )?;
    say(&format!(
        "in-place: the repave with disruptive replaced {machine}'s Node; unpinned"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_keep_the_labs_own_and_replace_ours() {
        let current = r#"[{"path":"/etc/a","content":"x"},{"path":"/var/log/unbounded-in-place.log","content":"old"}]"#;
        let set = files_with(current, Some("new")).unwrap();
        assert_eq!(set.as_array().unwrap().len(), 2);
        assert_eq!(set[0]["path"], "/etc/a");
        assert_eq!(set[1]["content"], "new");
        assert_eq!(
            files_with(current, None).unwrap(),
            json!([{"path": "/etc/a", "content": "x"}])
        );
        assert_eq!(files_with("", None).unwrap(), json!([]));
        assert!(files_with("not json", None).is_err());
    }
}
