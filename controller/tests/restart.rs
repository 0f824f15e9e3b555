//! A controller killed (SIGKILL) and restarted in the middle of versioning changes
//! converges: every version number from 1 up is used exactly once, none skipped or reused.
//! Its own test binary, so that it owns its control plane and controller.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Api, ListParams};
use serde_json::json;
use unbounded_api::{MachineConfiguration, MachineConfigurationVersion};

#[tokio::test]
async fn controller_restart_mid_versioning_converges() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "restart", json!({"template": template("k0")})).await;
    wait_for("restart-v1", || async {
        version(&client, "restart-v1").await
    })
    .await;

    let rounds = 6;
    for round in 1..=rounds {
        let current = format!("restart-v{round}");
        // Lock the newest version with a Machine, so that the next change needs a new one.
        let canary = format!("restart-canary-{round}");
        create_machine(
            &client,
            &canary,
            json!({}),
            json!({"configurationRef": {"name": "restart", "version": round}}),
        )
        .await;
        wait_resolved(&client, &canary, "restart", round).await;
        assert!(
            version(&client, &current)
                .await
                .unwrap()
                .status
                .unwrap()
                .deployed
        );

        // Change the template, then kill the controller at a different moment each round:
        // before it sees the change, while creating the version, or while recording it.
        set_template(&client, "restart", template(&format!("k{round}"))).await;
        tokio::time::sleep(Duration::from_millis(40 * round as u64)).await;
        restart_controller();

        let next = format!("restart-v{}", round + 1);
        wait_for(&next, || async { version(&client, &next).await }).await;
    }

    // Converged: exactly versions 1..=rounds+1, latestVersion recorded, newest holds the
    // last template.
    let expected_latest = rounds + 1;
    wait_for("latestVersion recorded", || async {
        let mc: MachineConfiguration = Api::all(client.clone()).get("restart").await.unwrap();
        (mc.status?.latest_version == expected_latest).then_some(())
    })
    .await;
    let versions: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let mut numbers: Vec<i64> = versions
        .list(&ListParams::default().labels("unbounded-cloud.io/configuration=restart"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|v| v.spec.version)
        .collect();
    numbers.sort_unstable();
    assert_eq!(
        numbers,
        (1..=expected_latest).collect::<Vec<_>>(),
        "no number skipped or reused"
    );
    let newest = version(&client, &format!("restart-v{expected_latest}"))
        .await
        .unwrap();
    assert_eq!(
        newest.spec.template.boot.unwrap().kernel_url,
        format!("k{rounds}")
    );
}
