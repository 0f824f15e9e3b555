#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! A `manual` Machine has no provider loop: the controller itself keeps a deleted one until
//! its agent reported its disks wiped, as its configuration says (`wipe: onRelease`), and
//! lets one with `wipe: never` go at once. Against the real API server and controller
//! binary; the agent's status writes are made as the agent makes them (server-side apply
//! under its field manager).

mod common;

use common::*;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use unbounded_api::Machine;
use unbounded_api::well_known::{conditions, field_managers, finalizers, reasons};

async fn agent_writes(client: &kube::Client, name: &str, configuration: &str, wipe: Value) {
    let mut agent = json!({"bootID": "b-1", "paved": {"name": configuration, "version": 1}});
    if !wipe.is_null() {
        agent["releaseWipe"] = wipe;
    }
    Api::<Machine>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::apply(field_managers::AGENT).force(),
            &Patch::Apply(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                "status": {"agent": agent},
            })),
        )
        .await
        .unwrap();
}

async fn gone(client: &kube::Client, name: &str) {
    wait_for(&format!("{name} gone"), || async {
        Api::<Machine>::all(client.clone())
            .get_opt(name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_deleted_manual_machine_is_kept_until_its_disks_are_wiped() {
    start_controller();
    let client = client().await;
    for (configuration, wipe, label) in [
        ("wipe-on-release", "onRelease", "wipes"),
        ("wipe-never", "never", "keeps"),
    ] {
        let mut template = template("http://boot/vmlinuz");
        template["storage"] = json!({"wipe": wipe});
        create_configuration(
            &client,
            configuration,
            json!({"machineSelector": {"matchLabels": {"release-wipe": label}}, "template": template}),
        )
        .await;
    }
    create_machine(
        &client,
        "rw-wipes",
        json!({"release-wipe": "wipes"}),
        json!({}),
    )
    .await;
    create_machine(
        &client,
        "rw-keeps",
        json!({"release-wipe": "keeps"}),
        json!({}),
    )
    .await;
    wait_resolved(&client, "rw-wipes", "wipe-on-release", 1).await;
    wait_resolved(&client, "rw-keeps", "wipe-never", 1).await;
    agent_writes(&client, "rw-wipes", "wipe-on-release", Value::Null).await;
    agent_writes(&client, "rw-keeps", "wipe-never", Value::Null).await;

    let api: Api<Machine> = Api::all(client.clone());
    for name in ["rw-keeps", "rw-wipes"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    gone(&client, "rw-keeps").await;

    // The controller looked (it wrote WipePending) and kept its finalizer.
    let waiting = wait_for("rw-wipes: DisksWiped WipePending", || async {
        let m = machine(&client, "rw-wipes").await;
        (condition(&m, conditions::DISKS_WIPED)?.reason == reasons::WIPE_PENDING).then_some(m)
    })
    .await;
    assert!(
        waiting
            .finalizers()
            .iter()
            .any(|f| f == finalizers::MACHINE)
    );
    agent_writes(
        &client,
        "rw-wipes",
        "wipe-on-release",
        json!({"state": "Wiped", "method": "fast", "disks": ["sda"]}),
    )
    .await;
    gone(&client, "rw-wipes").await;
}
