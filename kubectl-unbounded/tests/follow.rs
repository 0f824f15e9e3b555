#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The verbs followed to their end with the real controller running (in this process, as the
//! controller's and the providers' own tests run it) against a real kube-apiserver: an
//! operation handler of the runtime plays the provider (it completes or fails what it is
//! routed), and the test plays the kubelet (it registers Nodes). The plugin's progress line
//! ends when the controller and the handler are done, and its exit code says how it went.

mod common;

use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use unbounded_api::well_known::annotations;
use unbounded_api::{HandlerKind, MachineOperation, MachinePhase};
use unbounded_runtime::handler::{Execute, OperationHandler, Outcome};

/// Completes operations on machines named `follow-ok-*`, fails those on `follow-bad-*`.
#[derive(Clone)]
struct Provider;

impl Execute for Provider {
    fn handles(&self, machine: &str, _operation_name: &str) -> bool {
        machine.starts_with("follow-ok-") || machine.starts_with("follow-bad-")
    }

    fn execute(
        &self,
        operation: Arc<MachineOperation>,
        _resumed: bool,
    ) -> impl std::future::Future<Output = Outcome> + Send {
        let machine = operation
            .spec
            .machine_ref
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default();
        async move {
            if machine.starts_with("follow-ok-") {
                Outcome::Complete("power cycled".to_owned())
            } else {
                Outcome::Failed("the BMC refused the reset".to_owned())
            }
        }
    }
}

/// The controller and the provider's handler, once per test binary, on a runtime of their
/// own that lives as long as the process (each test's runtime ends with the test).
fn start() {
    static STARTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    STARTED.get_or_init(|| {
        let (ready, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = control_plane().client().await.unwrap();
                tokio::spawn(unbounded_controller::run(
                    client.clone(),
                    unbounded_controller::Settings::default(),
                    Arc::new(unbounded_controller::metrics::Metrics::new(
                        &mut prometheus_client::registry::Registry::default(),
                    )),
                    std::future::pending(),
                ));
                let handler = OperationHandler::new(
                    client,
                    HandlerKind::Provider,
                    "test-provider",
                    None,
                    Provider,
                );
                tokio::spawn(async move {
                    let _ = handler.run().await;
                });
                ready.send(()).unwrap();
                std::future::pending::<()>().await;
            });
        });
        started.recv().unwrap();
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn power_cycle_is_followed_until_the_provider_completes_or_fails_it() {
    let client = client().await;
    start();
    create_pxe_machine(&client, "follow-ok-1", json!({"follow": "power"}), 1, true).await;
    create_pxe_machine(&client, "follow-ok-2", json!({"follow": "power"}), 2, true).await;
    create_pxe_machine(&client, "follow-bad-1", json!({}), 3, true).await;

    let run = plugin(&["power", "cycle", "-l", "follow=power", "--timeout", "80"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let last = run.stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("power cycle: 2/2 done ·"),
        "{}",
        run.stdout
    );
    for m in ["follow-ok-1", "follow-ok-2"] {
        let ops = operations_on(&client, m).await;
        assert_eq!(ops.len(), 1, "{m}");
        let status = ops[0].status.clone().unwrap();
        assert_eq!(status.message.as_deref(), Some("power cycled"));
        assert_eq!(status.handler.as_deref(), Some("test-provider"));
    }

    let run = plugin(&["power", "cycle", "follow-bad-1", "--timeout", "80"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(
            "power cycle failed on 1 of 1 machines:\n  follow-bad-1: the BMC refused the reset"
        ),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("0/1 done, 1 failed"), "{}", run.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operation_nobody_handles_fails_at_its_deadline_and_so_does_the_plugin() {
    let client = client().await;
    start();
    // A manual machine's reboot goes to its agent, and there is none.
    create_machine(&client, "follow-noagent", json!({}), json!({})).await;
    let run = plugin(&[
        "reboot",
        "follow-noagent",
        "--active-deadline",
        "2",
        "--timeout",
        "80",
    ])
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("reboot failed on 1 of 1 machines"),
        "{}",
        run.stderr
    );
    let ops = operations_on(&client, "follow-noagent").await;
    let message = ops[0]
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        run.stderr.contains(&message),
        "the controller's reason is shown: {message:?} in {}",
        run.stderr
    );
}

/// Plays the agent and kubelet of one Machine: whenever its Node is gone and the Machine
/// records `version`, the Node registers again, Ready.
fn kubelet_for(client: &Client, name: &'static str, version: i64) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client.clone());
        loop {
            let m = machine(&client, name).await;
            let recorded = m
                .status
                .as_ref()
                .and_then(|s| s.configuration.as_ref())
                .map(|c| c.version);
            if recorded == Some(version) && nodes.get_opt(name).await.unwrap().is_none() {
                create_node(&client, name, true).await;
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_is_carried_out_by_the_controller_and_followed_to_running_on_the_old_version() {
    let client = client().await;
    start();
    let name = "follow-roll";
    create_configuration(
        &client,
        name,
        json!({"template": {"kubernetes": {"version": "v1.35.4"}}}),
    )
    .await;
    create_machine(
        &client,
        name,
        json!({}),
        json!({"configurationRef": {"name": name}}),
    )
    .await;
    wait_for("v1 recorded", || async {
        let m = machine(&client, name).await;
        (m.status?.configuration?.version == 1).then_some(())
    })
    .await;
    create_node(&client, name, true).await;
    // v1 is deployed now: a template change makes v2.
    Api::<unbounded_api::MachineConfiguration>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"kubernetes": {"version": "v1.35.5"}}}})),
        )
        .await
        .unwrap();
    // Roll forward by hand (as DESIGN.md's rollback rule test does): delete the Node.
    wait_for("v2 and the nodeRef", || async {
        let m = machine(&client, name).await;
        let s = m.status?;
        let c = Api::<unbounded_api::MachineConfiguration>::all(client.clone())
            .get(name)
            .await
            .ok()?;
        (s.node_ref.is_some() && c.status?.latest_version == 2).then_some(())
    })
    .await;
    let kubelet = kubelet_for(&client, name, 2);
    Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    kubelet.await.unwrap();
    wait_for("Running on v2", || async {
        let m = machine(&client, name).await;
        let s = m.status?;
        (s.phase == Some(MachinePhase::Running) && s.configuration?.version == 2).then_some(())
    })
    .await;

    // The rollback: the plugin pins v1 and requests the repave; the controller drains and
    // deletes the Node and records v1; the "kubelet" registers again; the plugin follows.
    let kubelet = kubelet_for(&client, name, 1);
    let run = plugin(&["rollback", name, "--to", "1", "--timeout", "80"]).await;
    kubelet.await.unwrap();
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "pinned {name} to {name} v1 and requested a repave"
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("rollback: 1/1 done ·"),
        "{}",
        run.stdout
    );
    let m = machine(&client, name).await;
    let status = m.status.clone().unwrap();
    assert_eq!(status.phase, Some(MachinePhase::Running));
    assert_eq!(status.configuration.unwrap().version, 1);
    let a = m.annotations();
    assert!(
        !a.contains_key(annotations::REPAVE) && !a.contains_key(annotations::REPAVING),
        "{a:?}"
    );
    let node: Node = Api::all(client.clone()).get(name).await.unwrap();
    assert_eq!(
        node.annotations()[annotations::MACHINE_CONFIGURATION_VERSION],
        "1"
    );
}

async fn set_template(client: &Client, name: &str, template: serde_json::Value) {
    Api::<unbounded_api::MachineConfiguration>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template}})),
        )
        .await
        .unwrap();
}

async fn wait_latest(client: &Client, name: &str, version: i64) {
    wait_for(&format!("{name} v{version}"), || async {
        let c = Api::<unbounded_api::MachineConfiguration>::all(client.clone())
            .get(name)
            .await
            .ok()?;
        (c.status?.latest_version == version).then_some(())
    })
    .await;
}

async fn running_on(client: &Client, name: &str, version: i64) {
    wait_for(&format!("{name} Running on v{version}"), || async {
        let s = machine(client, name).await.status?;
        (s.phase == Some(MachinePhase::Running) && s.configuration?.version == version)
            .then_some(())
    })
    .await;
}

fn tiered(tier: &str, kubernetes: &str) -> serde_json::Value {
    json!({"kubernetes": {"version": kubernetes, "nodeLabels": {"tier": tier}}})
}

/// `apply`: a label change is applied in place by the controller (the Node kept, labelled,
/// the version recorded) and followed to the end; a Kubernetes change is refused by the
/// plugin before anything is created, with --disruptive offered; with it the controller
/// drains and deletes the Node, and the plugin follows until the machine runs the version.
#[tokio::test(flavor = "multi_thread")]
async fn apply_is_carried_out_in_place_refused_without_disruptive_and_repaved_with_it() {
    let client = client().await;
    start();
    let name = "follow-apply";
    create_configuration(&client, name, json!({"template": tiered("a", "v1.35.4")})).await;
    create_machine(
        &client,
        name,
        json!({}),
        json!({"configurationRef": {"name": name}}),
    )
    .await;
    wait_for("v1 recorded", || async {
        (machine(&client, name).await.status?.configuration?.version == 1).then_some(())
    })
    .await;
    create_node(&client, name, true).await;
    running_on(&client, name, 1).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = nodes.get(name).await.unwrap().uid();

    // v2 changes a Node label: in place.
    set_template(&client, name, tiered("b", "v1.35.4")).await;
    wait_latest(&client, name, 2).await;
    let dry = plugin(&["apply", name, "--dry-run"]).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        dry.stdout.contains(&format!(
            "create MachineOperation applyConfiguration on {name} (version=2): {name} v1 → v2, in place: Node labels tier=b"
        )),
        "{}",
        dry.stdout
    );
    assert!(
        operations_on(&client, name).await.is_empty(),
        "a dry run creates nothing"
    );

    let run = plugin(&["apply", name, "--timeout", "80"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("apply: 1/1 done ·"),
        "{}",
        run.stdout
    );
    let node = nodes.get(name).await.unwrap();
    assert_eq!(node.uid(), uid, "applied in place: the Node is the same");
    assert_eq!(node.labels().get("tier").map(String::as_str), Some("b"));
    running_on(&client, name, 2).await;
    let ops = operations_on(&client, name).await;
    assert_eq!(ops.len(), 1);
    assert!(
        ops[0]
            .status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .unwrap_or_default()
            .contains("in place"),
        "{:?}",
        ops[0].status
    );

    // v3 changes Kubernetes: refused by the plugin, nothing created, the flag offered.
    set_template(&client, name, tiered("b", "v1.35.5")).await;
    wait_latest(&client, name, 3).await;
    let refused = plugin(&["apply", name, "--timeout", "80"]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("apply refused, nothing was changed:")
            && refused
                .stderr
                .contains("needs a repave: kubernetes.version changed: pass --disruptive"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        operations_on(&client, name).await.len(),
        1,
        "nothing created"
    );

    // With --disruptive: the controller drains and deletes the Node; the "kubelet" registers
    // it again once v3 is recorded; the plugin follows the operation to Complete.
    let kubelet = kubelet_for(&client, name, 3);
    let run = plugin(&["apply", name, "--disruptive", "--timeout", "80"]).await;
    kubelet.await.unwrap();
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("apply: 1/1 done ·"),
        "{}",
        run.stdout
    );
    assert_ne!(
        nodes.get(name).await.unwrap().uid(),
        uid,
        "repaved: a new Node"
    );
    running_on(&client, name, 3).await;
}
