#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! `deploy/components/finalizer-at-creation`: with the MutatingAdmissionPolicy, a Machine is
//! created with the controller's finalizer (beside any the creator wrote), and the controller
//! writes it once — its status — instead of twice. Checked in the API server's audit log.
//! Its own test binary: the control plane serves the beta policy API and writes the log.

mod common;

use common::*;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use unbounded_api::Machine;
use unbounded_api::well_known::finalizers;
use unbounded_testbed::cluster::{LocalControlPlane, PlaneOptions};

fn plane() -> &'static LocalControlPlane {
    LocalControlPlane::shared_with(PlaneOptions {
        finalizer_at_creation: true,
        ..PlaneOptions::audited()
    })
    .expect("control plane")
}

fn machine_object(name: &str, finalizers: &[&str]) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "labels": {"class": "finalizer-test"}, "finalizers": finalizers},
        "spec": {"provider": "manual"},
    }))
    .unwrap()
}

/// `(verb, subresource, answer's code)` of every write the controller made to the Machine
/// `name`, refused ones too: each is the API server's work.
fn controller_writes_to(name: &str) -> Vec<(String, String, u64)> {
    let text = std::fs::read_to_string(plane().audit_log_path().unwrap()).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["userAgent"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("unbounded-controller"))
                && e["objectRef"]["resource"] == "machines"
                && e["objectRef"]["name"] == name
        })
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["objectRef"]["subresource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["responseStatus"]["code"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_machine_is_created_with_the_finalizer_and_written_once() {
    plane();
    let client = client().await;
    let machines: Api<Machine> = Api::all(client.clone());
    // The control plane is ready once the policy acts (a dry-run create shows it).
    create_configuration(
        &client,
        "finalizer-test",
        json!({"machineSelector": {"matchLabels": {"class": "finalizer-test"}}, "template": template("k1")}),
    )
    .await;
    start_controller();
    // The Machine is created once its version exists: a Machine reconciled before would
    // record that it waits for one, a write of its own.
    wait_for("finalizer-test v1", || {
        version(&client, "finalizer-test-v1")
    })
    .await;
    let created = machines
        .create(
            &PostParams::default(),
            &machine_object("with-policy", &["example.com/keep"]),
        )
        .await
        .unwrap();
    let mut list = created.metadata.finalizers.clone().unwrap_or_default();
    list.sort();
    assert_eq!(
        list,
        vec![
            "example.com/keep".to_owned(),
            finalizers::MACHINE.to_owned()
        ],
        "the creator's finalizer is kept beside the controller's"
    );
    wait_resolved(&client, "with-policy", "finalizer-test", 1).await;
    let writes = controller_writes_to("with-policy");
    assert_eq!(
        writes,
        vec![("patch".to_owned(), "status".to_owned(), 200)],
        "one write: the status"
    );

    // Deletion still goes through the controller's cleanup, which removes its finalizer.
    machines
        .delete("with-policy", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the controller to let go of the Machine", || async {
        let m = machines.get_opt("with-policy").await.unwrap()?;
        (!m.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == finalizers::MACHINE))
        .then_some(())
    })
    .await;
}
