#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The plugin binary against a real kube-apiserver (with etcd and Unbounded's CRDs): what
//! `status` and `why` show from what the components wrote, what each verb creates or
//! changes, that `--dry-run` and refused input change nothing and exit non-zero with a
//! clear message. No controller runs in this binary, so what the verbs create stays as the
//! plugin wrote it (tests/follow.rs runs the controller).
//!
//! Tests share one control plane: each uses its own names and its own `test` label.

mod common;

use std::process::Stdio;

use common::*;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use unbounded_api::well_known::annotations;
use unbounded_api::{Machine, OperationState};

fn running_status(configuration: &str, version: i64) -> Value {
    json!({
        "phase": "Running", "power": "On",
        "configuration": {"name": configuration, "version": version},
        "agent": {"version": "0.1.0", "bootID": "boot-1", "containerState": "running"},
        "conditions": [
            condition("ConfigurationResolved", "True", "ConfigurationResolved", ""),
            condition("InfrastructureReady", "True", "Ready", ""),
            condition("BootstrapReady", "True", "Paved", ""),
            condition("NodeReady", "True", "NodeReady", ""),
        ],
    })
}

#[tokio::test]
async fn status_draws_the_tree_and_prints_it_as_json_and_yaml() {
    let client = client().await;
    create_configuration(
        &client,
        "st-gpu",
        json!({"machineSelector": {"matchLabels": {"test": "st"}}, "template": {}}),
    )
    .await;
    set_versions(&client, "st-gpu", &[(1, true), (2, true)]).await;
    create_machine(&client, "st-a", json!({"test": "st"}), json!({})).await;
    set_machine_status(&client, "st-a", running_status("st-gpu", 2)).await;
    create_node(&client, "st-a", true).await;
    create_machine(&client, "st-b", json!({"test": "st"}), json!({})).await;
    set_machine_status(
        &client,
        "st-b",
        json!({"phase": "Provisioning", "configuration": {"name": "st-gpu", "version": 1},
               "conditions": [condition("BootstrapReady", "False", "Paving", "fetching the node image")]}),
    )
    .await;

    let run = plugin(&["status", "-l", "test=st", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let tree: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(tree["grouping"], "configuration");
    let groups = tree["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{tree}");
    assert_eq!(groups[0]["name"], "st-gpu");
    let versions: Vec<(i64, Vec<&str>)> = groups[0]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let names = v["machines"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["name"].as_str().unwrap())
                .collect();
            (v["version"].as_i64().unwrap(), names)
        })
        .collect();
    assert_eq!(versions, vec![(2, vec!["st-a"]), (1, vec!["st-b"])]);
    let b = &groups[0]["versions"][1]["machines"][0];
    assert_eq!(b["blocker"]["condition"], "BootstrapReady");
    assert_eq!(b["blocker"]["message"], "fetching the node image");
    // st-b runs v1 and resolves to the newest deployed version by the selector: v2.
    assert_eq!(b["resolved"]["version"], 2);
    let a = &groups[0]["versions"][0]["machines"][0];
    assert_eq!(a["node"]["readiness"], "Ready");
    assert_eq!(a["power"], "On");

    let run = plugin(&["status", "-l", "test=st"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stdout.contains('\x1b'), "no colour without a terminal");
    let line = |name: &str| {
        run.stdout
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(run.stdout.starts_with("NAME"), "{}", run.stdout);
    assert_eq!(line("st-a"), "│ └─ st-a Running 2 Ready On running");
    assert!(
        line("st-b").starts_with("└─ st-b Provisioning 1→2 - - - BootstrapReady=False Paving"),
        "{}",
        run.stdout
    );

    let run = plugin(&["status", "st-b", "-o", "yaml"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("name: st-b"), "{}", run.stdout);
    assert!(!run.stdout.contains("st-a"), "{}", run.stdout);

    let run = plugin(&["status", "--configuration", "st-gpu", "--by", "pool"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("(in no pool)"), "{}", run.stdout);
}

#[tokio::test]
async fn status_refuses_unknown_names_and_bad_selectors() {
    let cases: [(&[&str], &str); 5] = [
        (&["status", "st-nosuch"], "no Machine named st-nosuch"),
        (
            &["status", "--pool", "nopool"],
            "no MachinePool named nopool",
        ),
        (
            &["status", "--configuration", "noconf"],
            "no MachineConfiguration named noconf",
        ),
        (
            &["status", "-l", "test=matches-nothing"],
            "no Machine matches the selector",
        ),
        (&["status", "-l", "test in (a"], "selector"),
    ];
    for (args, message) in cases {
        let run = plugin(args).await;
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(message), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
}

#[tokio::test]
async fn status_watch_redraws_when_a_machine_changes() {
    let client = client().await;
    create_machine(&client, "wt-a", json!({"test": "wt"}), json!({})).await;
    set_machine_status(&client, "wt-a", json!({"phase": "Provisioning"})).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-unbounded"))
        .arg("--kubeconfig")
        .arg(control_plane().kubeconfig_path())
        .args(["status", "-l", "test=wt", "--watch"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut next_line_with = async |words: &[&str], seen: &mut Vec<String>| loop {
        let line = tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .expect("a redraw")
            .unwrap()
            .expect("the watch goes on");
        seen.push(line.clone());
        if words.iter().all(|w| line.contains(w)) {
            return;
        }
    };
    // The first drawing, then the one after the change: the watch looked and redrew.
    next_line_with(&["wt-a", "Provisioning"], &mut seen).await;
    set_machine_status(&client, "wt-a", running_status("none", 1)).await;
    next_line_with(&["wt-a", "Running"], &mut seen).await;
    assert!(
        seen.iter().filter(|l| l.starts_with("NAME")).count() >= 2,
        "one heading per drawing: {seen:?}"
    );
    child.kill().await.unwrap();
}

#[tokio::test]
async fn why_tells_the_blocking_condition_the_events_and_the_agents_report() {
    let client = client().await;
    create_pxe_machine(&client, "why-m", json!({}), 1, true).await;
    set_machine_status(
        &client,
        "why-m",
        json!({"phase": "Provisioning", "power": "Unknown",
        "agent": {"version": "0.1.0", "bootID": "boot-7", "containerState": "paving"},
        "conditions": [
            condition("ConfigurationResolved", "True", "ConfigurationResolved", ""),
            condition("InfrastructureReady", "False", "PowerFailed", "the BMC does not answer"),
        ]}),
    )
    .await;
    let uid = machine(&client, "why-m").await.metadata.uid.unwrap();
    let event: Event = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "why-m.power", "namespace": "default"},
        "eventTime": Timestamp::now().to_string(),
        "reportingController": "unbounded-cloud.io/pxe-provider", "reportingInstance": "test",
        "action": "PowerOn", "reason": "PowerFailed", "type": "Warning",
        "note": "IPMI session timed out",
        "regarding": {"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                      "name": "why-m", "uid": uid},
    }))
    .unwrap();
    Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();

    let run = plugin(&["why", "why-m"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let text = run.stdout.trim_end();
    assert_eq!(text.lines().count(), 1, "one paragraph: {text}");
    for part in [
        "Machine why-m is Provisioning: it waits on InfrastructureReady",
        "InfrastructureReady=False PowerFailed",
        "the BMC does not answer",
        "Its Node why-m does not exist.",
        "Its agent last reported: agent 0.1.0, boot boot-7, container paving.",
        "Warning PowerFailed: IPMI session timed out",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }

    let run = plugin(&["why", "why-nosuch"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("no Machine named why-nosuch"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn verbs_create_one_operation_per_machine_and_refuse_what_cannot_be_done() {
    let client = client().await;
    create_pxe_machine(&client, "vb-ipmi", json!({"test": "vb"}), 2, true).await;
    create_pxe_machine(&client, "vb-bare", json!({"test": "vb"}), 3, false).await;
    create_machine(&client, "vb-man", json!({"test": "vb"}), json!({})).await;
    let all = ["vb-ipmi", "vb-bare", "vb-man"];
    let count_all = async || {
        let mut n = 0;
        for m in all {
            n += operations_on(&client, m).await.len();
        }
        n
    };

    // Dry run: says what it would create, creates nothing.
    let run = plugin(&["reboot", "vb-man", "vb-ipmi", "--dry-run"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("create MachineOperation reboot on vb-man"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("create MachineOperation reboot on vb-ipmi"),
        "{}",
        run.stdout
    );
    // A verb the providers cannot carry out, on any of the machines: nothing at all.
    let run = plugin(&["power", "on", "-l", "test=vb", "--no-wait"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("power on refused, nothing was changed"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("vb-bare: has no BMC"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("vb-man: a manual Machine has no handler for powerOn"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("vb-ipmi:"), "{}", run.stderr);
    // More machines than --confirm-above, no terminal to ask, no --yes.
    let run = plugin(&[
        "reboot",
        "-l",
        "test=vb",
        "--confirm-above",
        "2",
        "--no-wait",
    ])
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("pass --yes"), "{}", run.stderr);
    // Unknown machines and empty selectors.
    let run = plugin(&["reboot", "vb-man", "vb-nosuch", "--no-wait"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("no Machine named vb-nosuch"),
        "{}",
        run.stderr
    );
    let run = plugin(&["reboot", "-l", "test=vb-none", "--no-wait"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("no Machine matches the selector"),
        "{}",
        run.stderr
    );
    // Neither machines nor a selector: clap says so.
    let run = plugin(&["reboot"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        count_all().await,
        0,
        "nothing was created by the refused commands"
    );

    let run = plugin(&[
        "power",
        "cycle",
        "vb-ipmi",
        "--no-wait",
        "--active-deadline",
        "30",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let ops = operations_on(&client, "vb-ipmi").await;
    assert_eq!(ops.len(), 1);
    let op = &ops[0];
    assert_eq!(op.spec.operation_name, "powerCycle");
    assert_eq!(op.spec.machine_ref.as_ref().unwrap().name, "vb-ipmi");
    assert_eq!(op.spec.active_deadline_seconds, Some(30));
    assert!(
        op.metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with("vb-ipmi-powercycle-")
    );
    assert!(
        run.stdout.contains(op.metadata.name.as_deref().unwrap()),
        "{}",
        run.stdout
    );

    let run = plugin(&[
        "restart-service",
        "--service",
        "kubelet.service",
        "vb-man",
        "--no-wait",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let ops = operations_on(&client, "vb-man").await;
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].spec.operation_name, "restartService");
    assert_eq!(ops[0].spec.parameters["service"], "kubelet.service");

    let run = plugin(&[
        "reboot",
        "-l",
        "test=vb",
        "--confirm-above",
        "2",
        "--yes",
        "--no-wait",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    for m in all {
        let reboots: Vec<_> = operations_on(&client, m)
            .await
            .into_iter()
            .filter(|o| o.spec.operation_name == "reboot")
            .collect();
        assert_eq!(reboots.len(), 1, "{m}");
        assert_eq!(
            reboots[0].status.as_ref().and_then(|s| s.state),
            None::<OperationState>
        );
    }
}

#[tokio::test]
async fn repave_and_rollback_annotate_and_pin() {
    let client = client().await;
    create_configuration(&client, "rb-conf", json!({"template": {}})).await;
    set_versions(&client, "rb-conf", &[(1, true), (2, true)]).await;
    create_machine(
        &client,
        "rb-m",
        json!({}),
        json!({"configurationRef": {"name": "rb-conf"}}),
    )
    .await;
    set_machine_status(&client, "rb-m", running_status("rb-conf", 2)).await;
    create_machine(&client, "rb-r", json!({}), json!({})).await;

    let untouched = |m: &Machine| {
        !m.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::REPAVE))
            && m.spec
                .configuration_ref
                .as_ref()
                .and_then(|r| r.version)
                .is_none()
    };
    let run = plugin(&["rollback", "rb-m", "--to", "5"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("rb-conf has no version 5 (it has: v1, v2)"),
        "{}",
        run.stderr
    );
    let run = plugin(&["rollback", "rb-m", "--to", "1", "--dry-run"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("set Machine rb-m spec.configurationRef to rb-conf v1 (from v2)"),
        "{}",
        run.stdout
    );
    let run = plugin(&["rollback", "rb-m", "--to", "0"]).await;
    assert_eq!(run.code, 2, "clap refuses version 0: {run:?}");
    assert!(untouched(&machine(&client, "rb-m").await));

    let before = Timestamp::now().as_second();
    let run = plugin(&["rollback", "rb-m", "--to", "1", "--no-wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let m = machine(&client, "rb-m").await;
    let pinned = m.spec.configuration_ref.clone().unwrap();
    assert_eq!((pinned.name.as_str(), pinned.version), ("rb-conf", Some(1)));
    let at: Timestamp = m.metadata.annotations.as_ref().unwrap()[annotations::REPAVE]
        .parse()
        .expect("an RFC 3339 time");
    assert!(at.as_second() >= before && at.as_second() <= Timestamp::now().as_second());

    let run = plugin(&["repave", "rb-r", "--no-wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let m = machine(&client, "rb-r").await;
    let at = &m.metadata.annotations.as_ref().unwrap()[annotations::REPAVE];
    assert!(at.parse::<Timestamp>().is_ok(), "{at}");
    assert!(
        run.stdout
            .contains(&format!("requested a repave of rb-r at {at}")),
        "{}",
        run.stdout
    );

    // A follow-up the machine cannot run refuses the repave; one it can is written for the
    // controller, and a later plain repave clears it.
    let run = plugin(&["repave", "rb-r", "--then", "power-off"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("rb-r: the repave's follow-up powerOff: a manual Machine has no handler"),
        "{}",
        run.stderr
    );
    create_pxe_machine(&client, "rb-p", json!({}), 9, true).await;
    let run = plugin(&["repave", "rb-p", "--then", "pxe-boot", "--no-wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let then = |m: &Machine| {
        m.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::REPAVE_THEN).cloned())
    };
    assert_eq!(
        then(&machine(&client, "rb-p").await).as_deref(),
        Some("pxeBoot")
    );
    let run = plugin(&["repave", "rb-p", "--no-wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(then(&machine(&client, "rb-p").await), None);
}

#[tokio::test]
async fn completion_offers_scripts_and_machine_names() {
    let client = client().await;
    create_machine(&client, "cmp-one", json!({}), json!({})).await;
    create_machine(&client, "cmp-two", json!({}), json!({})).await;
    let run = plugin(&["completion", "bash"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("kubectl-unbounded"), "{}", run.stdout);
    let run = plugin(&["__complete", "reboot", "cmp-"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "cmp-one\ncmp-two\n:4\n");
    let run = plugin(&["__complete", "power", ""]).await;
    assert_eq!(run.stdout, "on\noff\ncycle\n:4\n");
}

/// tmux on a socket of this test: a real terminal of a chosen size.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, command: &str) -> Self {
        // One server per terminal: tests run in parallel, and each kills its own at the end.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("kubectl-unbounded-test-{}-{n}", std::process::id());
        let status = std::process::Command::new("tmux")
            .args(["-L", &socket, "new-session", "-d", "-s", "t"])
            .args(["-x", &width.to_string(), "-y", "40", command])
            .env_remove("NO_COLOR")
            .env_remove("TMUX")
            .status()
            .expect("tmux (Debian package tmux; scripts/install-deps.sh installs it)");
        assert!(status.success());
        Self { socket }
    }

    /// The screen, with escape codes (`-e`) or as plain text.
    fn screen(&self, escapes: bool) -> String {
        let mut args = vec!["-L", &self.socket, "capture-pane", "-p", "-t", "t"];
        if escapes {
            args.push("-e");
        }
        let out = std::process::Command::new("tmux")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Tmux {
    /// Types keys into the terminal.
    fn send(&self, keys: &[&str]) {
        let status = std::process::Command::new("tmux")
            .args(["-L", &self.socket, "send-keys", "-t", "t"])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

#[tokio::test]
async fn status_watch_in_a_real_terminal_colours_fits_the_width_and_redraws_in_place() {
    let client = client().await;
    create_machine(&client, "tm-a", json!({"test": "tm"}), json!({})).await;
    set_machine_status(
        &client,
        "tm-a",
        json!({"phase": "Provisioning", "conditions": [condition(
            "BootstrapReady", "False", "Paving",
            &"a long message that does not fit an eighty-column terminal ".repeat(4))]}),
    )
    .await;
    let command = format!(
        "{} --kubeconfig {} status -l test=tm --watch",
        env!("CARGO_BIN_EXE_kubectl-unbounded"),
        control_plane().kubeconfig_path().display()
    );
    let tmux = Tmux::start(80, &command);
    let screen = wait_for("the first drawing", || async {
        let s = tmux.screen(false);
        s.contains("tm-a").then_some(s)
    })
    .await;
    let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("NAME"), "{screen}");
    assert!(
        !lines[0].contains("POWER"),
        "80 columns leave POWER and AGENT out: {screen}"
    );
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{screen}");
    assert!(screen.contains('…'), "the long message is cut: {screen}");
    let coloured = tmux.screen(true);
    assert!(
        coloured.contains("\x1b["),
        "colour on a terminal: {coloured:?}"
    );

    set_machine_status(&client, "tm-a", running_status("none", 1)).await;
    let screen = wait_for("the redraw", || async {
        let s = tmux.screen(false);
        s.contains("Running").then_some(s)
    })
    .await;
    assert!(
        !screen.contains("Provisioning"),
        "redrawn in place, not appended: {screen}"
    );
    assert_eq!(screen.matches("NAME").count(), 1, "{screen}");
}

/// A directory for PATH holding the plugin and its completion script, as an operator
/// installs them (docs/kubectl-plugin.md).
fn plugin_path() -> (tempfile::TempDir, std::ffi::OsString) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-unbounded"),
        dir.path().join("kubectl-unbounded"),
    )
    .unwrap();
    let script = dir.path().join("kubectl_complete-unbounded");
    std::fs::write(
        &script,
        "#!/bin/sh\nexec kubectl-unbounded __complete \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut path = std::ffi::OsString::from(dir.path());
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    (dir, path)
}

async fn real_kubectl(args: &[&str], path: &std::ffi::OsStr) -> Run {
    let out = tokio::process::Command::new(&control_plane().binaries().kubectl)
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", control_plane().kubeconfig_path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn kubectl_runs_the_plugin_and_completes_its_machine_names() {
    let client = client().await;
    create_machine(&client, "kc-first", json!({"test": "kc"}), json!({})).await;
    create_machine(&client, "kc-second", json!({"test": "kc"}), json!({})).await;
    let (_dir, path) = plugin_path();

    let run = real_kubectl(
        &["unbounded", "status", "-l", "test=kc", "-o", "json"],
        &path,
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let tree: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        tree["groups"][0]["machines"].as_array().unwrap().len(),
        2,
        "{tree}"
    );

    // kubectl's own completion hands the words after the plugin's name to
    // kubectl_complete-unbounded.
    let run = real_kubectl(&["__complete", "unbounded", "why", "kc-"], &path).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines, ["kc-first", "kc-second", ":4"], "{run:?}");
    let run = real_kubectl(&["__complete", "unbounded", "re"], &path).await;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        ["reboot", "restart-service", "repave", ":4"],
        "{run:?}"
    );
}

#[tokio::test]
async fn many_machines_need_a_yes_typed_in_the_terminal() {
    let client = client().await;
    for name in ["cf-1", "cf-2", "cf-3"] {
        create_machine(&client, name, json!({"test": "cf"}), json!({})).await;
    }
    let command = |answer: &str| {
        format!(
            "{} --kubeconfig {} reboot -l test=cf --confirm-above 2 --no-wait; echo exit=$?; \
             sleep 600 # {answer}",
            env!("CARGO_BIN_EXE_kubectl-unbounded"),
            control_plane().kubeconfig_path().display()
        )
    };
    let reboots = async || {
        let mut n = 0;
        for m in ["cf-1", "cf-2", "cf-3"] {
            n += operations_on(&client, m).await.len();
        }
        n
    };
    for (answer, code, created) in [("n", 2, 0), ("y", 0, 3)] {
        let tmux = Tmux::start(120, &command(answer));
        wait_for("the question", || async {
            tmux.screen(false)
                .contains("reboot 3 machines (cf-1, cf-2, cf-3)? [y/N]")
                .then_some(())
        })
        .await;
        assert_eq!(reboots().await, 0, "nothing before the answer");
        tmux.send(&[answer, "Enter"]);
        let screen = wait_for("the plugin to exit", || async {
            let s = tmux.screen(false);
            s.contains("exit=").then_some(s)
        })
        .await;
        assert!(
            screen.contains(&format!("exit={code}")),
            "{answer}: {screen}"
        );
        assert_eq!(reboots().await, created, "{answer}: {screen}");
    }
}

#[tokio::test]
async fn ctrl_c_stops_following_and_leaves_the_operation() {
    let client = client().await;
    create_machine(&client, "int-m", json!({}), json!({})).await;
    let mut child = spawn_plugin(&["reboot", "int-m", "--timeout", "600"]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Following: no controller runs here, so the operation stays pending.
    loop {
        let line = tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .expect("a progress line")
            .unwrap()
            .expect("following");
        if line.starts_with("reboot: 0/1 done, 1 pending") {
            break;
        }
    }
    let out = interrupt(child).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stopped following: reboot: 0/1 done, 1 pending"),
        "{stderr}"
    );
    assert_eq!(
        operations_on(&client, "int-m").await.len(),
        1,
        "the operation stays"
    );
}

/// `logs` before the machine has a Node: it says where the agent's lines would come from,
/// shows what `why` shows (the blocking condition, the Events, the agent's report), and
/// that no bootserver pod runs here; once a Node exists whose kubelet does not answer (this
/// plane has none), it says the agent's log could not be read. Unknown machines and bad
/// `--since` values are refused.
#[tokio::test]
async fn logs_before_a_node_shows_what_is_known_and_says_what_is_missing() {
    let client = client().await;
    create_pxe_machine(&client, "logs-m", json!({}), 41, true).await;
    set_machine_status(
        &client,
        "logs-m",
        json!({"phase": "Provisioning",
        "agent": {"version": "0.1.0", "bootID": "boot-9", "containerState": "paving"},
        "conditions": [
            condition("ConfigurationResolved", "True", "ConfigurationResolved", ""),
            condition("BootstrapReady", "False", "Paving", "pulling the node image"),
        ]}),
    )
    .await;
    let uid = machine(&client, "logs-m").await.metadata.uid.unwrap();
    let event: Event = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "logs-m.pave", "namespace": "default"},
        "eventTime": Timestamp::now().to_string(),
        "reportingController": "unbounded-cloud.io/agent", "reportingInstance": "test",
        "action": "Pave", "reason": "PaveStarted", "type": "Normal",
        "note": "paving with v1",
        "regarding": {"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                      "name": "logs-m", "uid": uid},
    }))
    .unwrap();
    Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();

    let run = plugin(&["logs", "logs-m"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    for part in [
        "Machine logs-m has no Node (logs-m) yet",
        "it waits on BootstrapReady",
        "pulling the node image",
        "agent 0.1.0, boot boot-9, container paving",
        "PaveStarted: paving with v1",
        "note: no bootserver pod in unbounded-system (app.kubernetes.io/name=unbounded-bootserver)",
    ] {
        assert!(
            run.stderr.contains(part),
            "{part:?} missing from: {}",
            run.stderr
        );
    }
    assert_eq!(run.stdout, "", "no lines to show");

    create_node(&client, "logs-m", false).await;
    let run = plugin(&["logs", "logs-m", "--since", "10m"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("has no Node"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("the agent's log is not served by Node logs-m")
            || run
                .stderr
                .contains("reading the agent's log through Node logs-m"),
        "{}",
        run.stderr
    );

    let run = plugin(&["logs", "logs-nosuch"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("no Machine named logs-nosuch"),
        "{}",
        run.stderr
    );
    let run = plugin(&["logs", "logs-m", "--since", "5w"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("the unit must be s, m, h or d"),
        "{}",
        run.stderr
    );
}
