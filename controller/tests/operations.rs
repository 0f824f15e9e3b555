#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The MachineOperation lifecycle on a real API server: the controller binary routes, orders,
//! fans out, aggregates, times out and cleans up; handlers in this process use the handler
//! API of `unbounded-api` the way the agent and the providers do.
//!
//! Tests share one control plane and one controller: each uses its own Machine names, and
//! its handlers claim only those.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::well_known::labels;
use unbounded_api::{HandlerKind, MachineOperation, OperationState};
use unbounded_runtime::handler::{Claim, Execute, OperationHandler, Outcome, WorkingOn};

/// Runs operations on Machines whose names start with `prefix`, with a fixed outcome, and
/// records what it ran.
#[derive(Clone)]
struct Recorder {
    prefix: String,
    outcome: Outcome,
    ran: Arc<Mutex<Vec<(String, bool)>>>,
    /// Holds each execution until released (for the ordering and resume tests).
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// The executions that ended, finished or dropped.
    ended: Arc<Mutex<Vec<String>>>,
}

/// Records an execution's end, however it ends.
struct Ended(Arc<Mutex<Vec<String>>>, String);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.lock().unwrap().push(std::mem::take(&mut self.1));
    }
}

impl Recorder {
    fn new(prefix: &str, outcome: Outcome) -> Self {
        Self {
            prefix: prefix.to_owned(),
            outcome,
            ran: Arc::default(),
            gate: None,
            ended: Arc::default(),
        }
    }

    fn ran(&self) -> Vec<(String, bool)> {
        self.ran.lock().unwrap().clone()
    }
}

impl Execute for Recorder {
    fn handles(&self, machine: &str, _operation_name: &str) -> bool {
        machine.starts_with(&self.prefix)
    }

    fn execute(
        &self,
        operation: Arc<MachineOperation>,
        resumed: bool,
    ) -> impl std::future::Future<Output = Outcome> + Send {
        let this = self.clone();
        async move {
            this.ran
                .lock()
                .unwrap()
                .push((operation.name_any(), resumed));
            let _ended = Ended(this.ended.clone(), operation.name_any());
            if let Some(gate) = &this.gate {
                gate.acquire().await.unwrap().forget();
            }
            this.outcome.clone()
        }
    }
}

fn spawn_handler(
    client: &Client,
    kind: HandlerKind,
    manager: &str,
    executor: Recorder,
) -> tokio::task::JoinHandle<()> {
    spawn_handler_watched(client, kind, manager, executor).0
}

/// [`spawn_handler`], with the view of what the handler is working on.
fn spawn_handler_watched(
    client: &Client,
    kind: HandlerKind,
    manager: &str,
    executor: Recorder,
) -> (tokio::task::JoinHandle<()>, WorkingOn) {
    let handler = OperationHandler::new(client.clone(), kind, manager, None, executor);
    let working_on = handler.working_on();
    let task = tokio::spawn(async move {
        let _ = handler.run().await;
    });
    (task, working_on)
}

async fn create_pxe_machine(client: &Client, name: &str, labels: Value, mac_index: usize) {
    let mac = format!(
        "52:54:00:{:02x}:{:02x}:{:02x}",
        (mac_index >> 16) & 0xff,
        (mac_index >> 8) & 0xff,
        mac_index & 0xff
    );
    create_machine(
        client,
        name,
        labels,
        json!({"provider": "pxe", "pxe": {"macAddresses": [mac]}}),
    )
    .await;
}

async fn create_operation(client: &Client, name: &str, spec: Value) -> MachineOperation {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .expect("create operation")
}

async fn operation(client: &Client, name: &str) -> Option<MachineOperation> {
    Api::<MachineOperation>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

fn state(op: &MachineOperation) -> Option<OperationState> {
    op.status.as_ref()?.state
}

fn message(op: &MachineOperation) -> String {
    op.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

/// Waits until the operation reaches `expected` and returns it.
async fn wait_state(client: &Client, name: &str, expected: OperationState) -> MachineOperation {
    wait_for(&format!("{name} to be {expected:?}"), || async {
        let op = operation(client, name).await?;
        (state(&op) == Some(expected)).then_some(op)
    })
    .await
}

async fn wait_gone(client: &Client, name: &str) {
    wait_for(&format!("{name} to be deleted"), || async {
        operation(client, name).await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn single_operation_is_labelled_routed_claimed_and_completed() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-single-m", json!({}), 1).await;
    create_operation(
        &client,
        "op-single",
        json!({"machineRef": {"name": "op-single-m"}, "operationName": "powerCycle"}),
    )
    .await;
    wait_state(&client, "op-single", OperationState::Pending).await;
    let routed = wait_for("routing to the provider", || async {
        let op = operation(&client, "op-single").await?;
        (op.status.as_ref()?.routed_to == Some(HandlerKind::Provider)).then_some(op)
    })
    .await;
    assert_eq!(
        routed.labels().get(labels::MACHINE).map(String::as_str),
        Some("op-single-m"),
        "the controller labels a single-machine operation with its Machine"
    );
    assert!(
        message(&routed).contains("pxe provider"),
        "{}",
        message(&routed)
    );

    // An agent-kind handler must not take a provider operation.
    let agent = Recorder::new("op-single", Outcome::Complete("rebooted".into()));
    let agent_task = spawn_handler(
        &client,
        HandlerKind::Agent,
        "test-agent-single",
        agent.clone(),
    );
    let provider = Recorder::new("op-single", Outcome::Complete("power cycled".into()));
    let provider_task = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-single",
        provider.clone(),
    );
    let done = wait_state(&client, "op-single", OperationState::Complete).await;
    let status = done.status.unwrap();
    assert_eq!(status.message.as_deref(), Some("power cycled"));
    assert_eq!(status.handler.as_deref(), Some("test-provider-single"));
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    assert_eq!(provider.ran(), vec![("op-single".to_owned(), false)]);
    assert!(agent.ran().is_empty());
    agent_task.abort();
    provider_task.abort();
}

#[tokio::test]
async fn selector_operation_fans_out_to_fifty_machines() {
    start_controller();
    let client = client().await;
    for i in 0..50 {
        create_pxe_machine(
            &client,
            &format!("op-fan-{i:02}"),
            json!({"op-test": "fan"}),
            100 + i,
        )
        .await;
    }
    // Not matched: another pool.
    create_pxe_machine(&client, "op-fan-other", json!({"op-test": "other"}), 200).await;
    let provider = Recorder::new("op-fan-", Outcome::Complete("power cycled".into()));
    let task = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-fan",
        provider.clone(),
    );
    create_operation(
        &client,
        "op-fan",
        json!({"machineSelector": {"matchLabels": {"op-test": "fan"}}, "operationName": "powerCycle"}),
    )
    .await;
    let done = wait_state(&client, "op-fan", OperationState::Complete).await;
    let status = done.status.clone().unwrap();
    let counts = status.children.unwrap();
    assert_eq!((counts.total, counts.complete, counts.failed), (50, 50, 0));
    assert_eq!(
        status.message.as_deref(),
        Some("all 50 operations completed")
    );
    assert!(status.completion_time.is_some());

    let api: Api<MachineOperation> = Api::all(client.clone());
    let children = api
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("{}=op-fan", labels::PARENT_OPERATION)),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(children.len(), 50);
    for child in &children {
        let machine = &child.spec.machine_ref.as_ref().unwrap().name;
        assert_eq!(child.name_any(), format!("op-fan-{machine}"));
        assert_eq!(child.labels().get(labels::MACHINE), Some(machine));
        let owner = &child.owner_references()[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("op-fan", Some(true))
        );
        assert_eq!(state(child), Some(OperationState::Complete));
    }
    let mut ran: Vec<String> = provider.ran().into_iter().map(|(n, _)| n).collect();
    ran.sort();
    ran.dedup();
    assert_eq!(ran.len(), 50, "each child ran exactly once");
    assert!(!ran.iter().any(|n| n.contains("other")));
    task.abort();
}

#[tokio::test]
async fn selector_matching_nothing_completes_with_a_message() {
    start_controller();
    let client = client().await;
    create_operation(
        &client,
        "op-none",
        json!({"machineSelector": {"matchLabels": {"op-test": "nobody"}}, "operationName": "reboot"}),
    )
    .await;
    let done = wait_state(&client, "op-none", OperationState::Complete).await;
    assert!(
        message(&done).contains("matched no Machine"),
        "{}",
        message(&done)
    );
}

#[tokio::test]
async fn finished_operations_are_deleted_after_their_ttl() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-ttl-a", json!({"op-test": "ttl"}), 300).await;
    create_pxe_machine(&client, "op-ttl-b", json!({"op-test": "ttl"}), 301).await;
    let task = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-ttl",
        Recorder::new("op-ttl-", Outcome::Complete("done".into())),
    );
    create_operation(
        &client,
        "op-ttl-single",
        json!({"machineRef": {"name": "op-ttl-a"}, "operationName": "powerOn", "ttlSecondsAfterFinished": 2}),
    )
    .await;
    create_operation(
        &client,
        "op-ttl-pool",
        json!({"machineSelector": {"matchLabels": {"op-test": "ttl"}}, "operationName": "powerOff", "ttlSecondsAfterFinished": 2}),
    )
    .await;
    wait_state(&client, "op-ttl-single", OperationState::Complete).await;
    wait_state(&client, "op-ttl-pool", OperationState::Complete).await;
    wait_gone(&client, "op-ttl-single").await;
    wait_gone(&client, "op-ttl-pool").await;
    // The garbage collector takes the children with their parent.
    wait_gone(&client, "op-ttl-pool-op-ttl-a").await;
    wait_gone(&client, "op-ttl-pool-op-ttl-b").await;
    task.abort();
}

#[tokio::test]
async fn a_failing_handler_fails_the_operation_and_its_parent() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-fail-ok", json!({"op-test": "fail"}), 400).await;
    create_pxe_machine(&client, "op-fail-bad", json!({"op-test": "fail"}), 401).await;
    let good = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-fail-ok",
        Recorder::new("op-fail-ok", Outcome::Complete("done".into())),
    );
    let bad = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-fail-bad",
        Recorder::new(
            "op-fail-bad",
            Outcome::Failed("the BMC refused the reset".into()),
        ),
    );
    create_operation(
        &client,
        "op-fail",
        json!({"machineSelector": {"matchLabels": {"op-test": "fail"}}, "operationName": "powerCycle"}),
    )
    .await;
    let parent = wait_state(&client, "op-fail", OperationState::Failed).await;
    let counts = parent.status.clone().unwrap().children.unwrap();
    assert_eq!((counts.total, counts.complete, counts.failed), (2, 1, 1));
    assert_eq!(
        message(&parent),
        "1 of 2 operations failed: op-fail-op-fail-bad (the BMC refused the reset)"
    );
    let child = operation(&client, "op-fail-op-fail-bad").await.unwrap();
    assert_eq!(state(&child), Some(OperationState::Failed));
    assert_eq!(message(&child), "the BMC refused the reset");
    good.abort();
    bad.abort();
}

#[tokio::test]
async fn an_operation_nobody_claims_fails_at_its_deadline() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-deadline-m", json!({}), 500).await;
    create_operation(
        &client,
        "op-deadline",
        json!({"machineRef": {"name": "op-deadline-m"}, "operationName": "powerOff", "activeDeadlineSeconds": 3}),
    )
    .await;
    let failed = wait_state(&client, "op-deadline", OperationState::Failed).await;
    assert_eq!(
        message(&failed),
        "no handler claimed the operation within activeDeadlineSeconds (3s): is the pxe provider running?"
    );
    wait_event(&client, "op-deadline", "OperationFailed").await;
}

#[tokio::test]
async fn two_handlers_racing_for_one_operation_exactly_one_wins() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-race-m", json!({}), 600).await;
    create_operation(
        &client,
        "op-race",
        json!({"machineRef": {"name": "op-race-m"}, "operationName": "powerCycle"}),
    )
    .await;
    let routed = wait_for("routing", || async {
        let op = operation(&client, "op-race").await?;
        (op.status.as_ref()?.routed_to == Some(HandlerKind::Provider)).then_some(op)
    })
    .await;
    let outcome = Outcome::Complete("done".into());
    let a = OperationHandler::new(
        client.clone(),
        HandlerKind::Provider,
        "test-race-a",
        None,
        Recorder::new("op-race", outcome.clone()),
    );
    let b = OperationHandler::new(
        client.clone(),
        HandlerKind::Provider,
        "test-race-b",
        None,
        Recorder::new("op-race", outcome.clone()),
    );
    // Both saw the same Pending object; both claim at once.
    let (ra, rb) = tokio::join!(a.claim(&routed), b.claim(&routed));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let winners = [&ra, &rb]
        .iter()
        .filter(|c| matches!(c, Claim::Won(_)))
        .count();
    assert_eq!(winners, 1, "exactly one claim wins: {ra:?} / {rb:?}");
    let (winner, loser, name) = if matches!(ra, Claim::Won(_)) {
        (&a, &b, "test-race-a")
    } else {
        (&b, &a, "test-race-b")
    };
    let claimed = wait_state(&client, "op-race", OperationState::InProgress).await;
    assert_eq!(claimed.status.unwrap().handler.as_deref(), Some(name));
    // The loser cannot finish what it does not own; the winner can.
    assert!(!loser.finish("op-race", &outcome).await.unwrap());
    assert!(winner.finish("op-race", &outcome).await.unwrap());
    let done = wait_state(&client, "op-race", OperationState::Complete).await;
    assert_eq!(done.status.unwrap().handler.as_deref(), Some(name));
}

#[tokio::test]
async fn an_unknown_operation_name_fails_at_once() {
    start_controller();
    let client = client().await;
    create_pxe_machine(&client, "op-unknown-m", json!({}), 700).await;
    create_operation(
        &client,
        "op-unknown",
        json!({"machineRef": {"name": "op-unknown-m"}, "operationName": "selfDestruct"}),
    )
    .await;
    let failed = wait_state(&client, "op-unknown", OperationState::Failed).await;
    assert_eq!(
        message(&failed),
        "no handler runs operation 'selfDestruct' on a pxe Machine; known operations: reboot, shutdown, restartService, applyConfiguration, powerOn, powerOff, powerCycle, pxeBoot"
    );
    // Nobody powers a manual Machine.
    create_machine(&client, "op-unknown-manual", json!({}), json!({})).await;
    create_operation(
        &client,
        "op-unknown-manual",
        json!({"machineRef": {"name": "op-unknown-manual"}, "operationName": "powerOn"}),
    )
    .await;
    let failed = wait_state(&client, "op-unknown-manual", OperationState::Failed).await;
    assert!(
        message(&failed).contains("on a manual Machine"),
        "{}",
        message(&failed)
    );
}

#[tokio::test]
async fn operations_on_missing_or_deleted_machines_fail() {
    start_controller();
    let client = client().await;
    create_operation(
        &client,
        "op-ghost",
        json!({"machineRef": {"name": "op-no-such-machine"}, "operationName": "reboot"}),
    )
    .await;
    let failed = wait_state(&client, "op-ghost", OperationState::Failed).await;
    assert_eq!(
        message(&failed),
        "Machine op-no-such-machine does not exist"
    );

    // Claimed, then the Machine goes away while the handler works.
    create_machine(&client, "op-vanish-m", json!({}), json!({})).await;
    let mut slow = Recorder::new("op-vanish", Outcome::Complete("rebooted".into()));
    slow.gate = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let (task, working_on) = spawn_handler_watched(
        &client,
        HandlerKind::Agent,
        "test-agent-vanish",
        slow.clone(),
    );
    create_operation(
        &client,
        "op-vanish",
        json!({"machineRef": {"name": "op-vanish-m"}, "operationName": "reboot"}),
    )
    .await;
    wait_state(&client, "op-vanish", OperationState::InProgress).await;
    Api::<unbounded_api::Machine>::all(client.clone())
        .delete("op-vanish-m", &DeleteParams::default())
        .await
        .unwrap();
    let failed = wait_state(&client, "op-vanish", OperationState::Failed).await;
    assert_eq!(
        message(&failed),
        "Machine op-vanish-m was deleted while the operation ran"
    );
    // The handler's late success does not overwrite the failure: once the handler is done
    // with the operation (its outcome written, or found not to be its own), it is Failed.
    assert!(working_on.contains("op-vanish"));
    slow.gate.as_ref().unwrap().add_permits(1);
    wait_for("the handler done with op-vanish", || async {
        (!working_on.contains("op-vanish")).then_some(())
    })
    .await;
    let after = operation(&client, "op-vanish").await.unwrap();
    assert_eq!(state(&after), Some(OperationState::Failed));
    task.abort();
}

#[tokio::test]
async fn operations_on_one_machine_run_one_at_a_time_in_creation_order() {
    start_controller();
    let client = client().await;
    create_machine(&client, "op-order-m", json!({}), json!({})).await;
    let mut agent = Recorder::new("op-order", Outcome::Complete("done".into()));
    agent.gate = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let task = spawn_handler(
        &client,
        HandlerKind::Agent,
        "test-agent-order",
        agent.clone(),
    );
    create_operation(
        &client,
        "op-order-1",
        json!({"machineRef": {"name": "op-order-m"}, "operationName": "restartService", "parameters": {"service": "kubelet.service"}}),
    )
    .await;
    wait_state(&client, "op-order-1", OperationState::InProgress).await;
    create_operation(
        &client,
        "op-order-2",
        json!({"machineRef": {"name": "op-order-m"}, "operationName": "reboot"}),
    )
    .await;
    let queued = wait_for("the second operation to queue", || async {
        let op = operation(&client, "op-order-2").await?;
        message(&op)
            .contains("waiting for operation op-order-1")
            .then_some(op)
    })
    .await;
    assert_eq!(state(&queued), Some(OperationState::Pending));
    assert_eq!(
        queued.status.unwrap().routed_to,
        None,
        "not routed while another runs"
    );
    assert_eq!(agent.ran().len(), 1);

    agent.gate.as_ref().unwrap().add_permits(1);
    wait_state(&client, "op-order-1", OperationState::Complete).await;
    agent.gate.as_ref().unwrap().add_permits(1);
    wait_state(&client, "op-order-2", OperationState::Complete).await;
    let ran: Vec<String> = agent.ran().into_iter().map(|(n, _)| n).collect();
    assert_eq!(ran, ["op-order-1", "op-order-2"]);
    task.abort();
}

#[tokio::test]
async fn a_restarted_handler_resumes_its_in_progress_operation() {
    start_controller();
    let client = client().await;
    create_machine(&client, "op-resume-m", json!({}), json!({})).await;
    let mut first = Recorder::new("op-resume", Outcome::Complete("never".into()));
    first.gate = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let task = spawn_handler(
        &client,
        HandlerKind::Agent,
        "test-agent-resume",
        first.clone(),
    );
    create_operation(
        &client,
        "op-resume",
        json!({"machineRef": {"name": "op-resume-m"}, "operationName": "reboot"}),
    )
    .await;
    wait_state(&client, "op-resume", OperationState::InProgress).await;
    // The handler dies mid-operation.
    task.abort();
    let _ = task.await;
    let second = Recorder::new(
        "op-resume",
        Outcome::Complete("back with a new boot ID".into()),
    );
    let task = spawn_handler(
        &client,
        HandlerKind::Agent,
        "test-agent-resume",
        second.clone(),
    );
    let done = wait_state(&client, "op-resume", OperationState::Complete).await;
    assert_eq!(message(&done), "back with a new boot ID");
    assert_eq!(second.ran(), vec![("op-resume".to_owned(), true)]);
    task.abort();
}

/// A handler that stops (a provider that lost its leadership drops it) stops the operations
/// it runs: none goes on driving a BMC or a VM behind the new leader's back.
#[tokio::test]
async fn a_dropped_handler_stops_the_operations_it_runs() {
    start_controller();
    let client = client().await;
    create_machine(&client, "op-drop-m", json!({}), json!({})).await;
    let mut held = Recorder::new("op-drop", Outcome::Complete("never".into()));
    held.gate = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let task = spawn_handler(&client, HandlerKind::Agent, "test-agent-drop", held.clone());
    create_operation(
        &client,
        "op-drop",
        json!({"machineRef": {"name": "op-drop-m"}, "operationName": "reboot"}),
    )
    .await;
    wait_for("the execution to start", || async {
        (!held.ran().is_empty()).then_some(())
    })
    .await;
    assert!(held.ended.lock().unwrap().is_empty());
    task.abort();
    let _ = task.await;
    wait_for("the execution to be dropped with its handler", || async {
        (held.ended.lock().unwrap().as_slice() == ["op-drop"]).then_some(())
    })
    .await;
}

/// The acceptance as a person sees it: applied and watched with kubectl.
#[tokio::test]
async fn kubectl_shows_a_selector_operation_with_children_counts_and_state() {
    start_controller();
    let client = client().await;
    for i in 0..3 {
        create_pxe_machine(
            &client,
            &format!("op-kubectl-{i}"),
            json!({"op-test": "kubectl"}),
            800 + i,
        )
        .await;
    }
    let task = spawn_handler(
        &client,
        HandlerKind::Provider,
        "test-provider-kubectl",
        Recorder::new("op-kubectl-", Outcome::Complete("power cycled".into())),
    );
    let manifest = std::env::temp_dir().join(format!("op-kubectl-{}.yaml", std::process::id()));
    std::fs::write(
        &manifest,
        "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineOperation\nmetadata:\n  name: op-kubectl\nspec:\n  machineSelector:\n    matchLabels:\n      op-test: kubectl\n  operationName: powerCycle\n",
    )
    .unwrap();
    let cp = control_plane();
    cp.kubectl_output(&["apply", "-f", manifest.to_str().unwrap()])
        .unwrap();
    wait_state(&client, "op-kubectl", OperationState::Complete).await;
    let table = cp
        .kubectl_output(&[
            "get",
            "mo",
            "-o",
            "wide",
            "-l",
            "unbounded-cloud.io/parent-operation=op-kubectl",
        ])
        .unwrap();
    assert_eq!(
        table.lines().count(),
        4,
        "header and three children:\n{table}"
    );
    assert!(
        table
            .lines()
            .skip(1)
            .all(|l| l.contains("powerCycle") && l.contains("Complete")),
        "{table}"
    );
    let parent = cp
        .kubectl_output(&["get", "mo", "op-kubectl", "-o", "wide"])
        .unwrap();
    let header: Vec<&str> = parent.lines().next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = parent.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &header[..7],
        [
            "NAME",
            "MACHINE",
            "OPERATION",
            "STATE",
            "CHILDREN",
            "COMPLETE",
            "FAILED"
        ],
        "{parent}"
    );
    // A selector operation has no Machine: that column is blank.
    assert_eq!(
        &row[..6],
        ["op-kubectl", "powerCycle", "Complete", "3", "3", "0"],
        "{parent}"
    );

    // A bad operation is refused with a message a person understands.
    std::fs::write(
        &manifest,
        "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineOperation\nmetadata:\n  name: op-kubectl-bad\nspec:\n  machineRef:\n    name: op-kubectl-0\n  machineSelector:\n    matchLabels:\n      op-test: kubectl\n  operationName: powerCycle\n",
    )
    .unwrap();
    let refused = cp
        .kubectl_output(&["apply", "-f", manifest.to_str().unwrap()])
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("set exactly one of spec.machineRef and spec.machineSelector"),
        "{refused}"
    );
    std::fs::remove_file(&manifest).unwrap();
    task.abort();
}
