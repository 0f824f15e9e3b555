#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! `deploy/rbac/controller.yaml` holds every grant the controller gives an agent. The API
//! server accepts a role only from a creator that holds each of its grants (RBAC's
//! escalation check), so a grant the controller's own role lacks stops every agent from
//! getting its role — as the pod lab found when agents were first allowed to write their
//! MachineInventory. The controller's real `apply_access`, as the controller's
//! ServiceAccount under deploy/'s RBAC, against a real API server.

mod common;

use std::collections::BTreeSet;

use common::{apply_deploy_rbac, client, control_plane, create_machine};
use serde_json::json;
use unbounded_api::agent::AgentAccess;
use unbounded_controller::agent_access::apply_access;

async fn as_controller() -> kube::Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(control_plane().kubeconfig_path()).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate =
        Some("system:serviceaccount:unbounded-system:unbounded-controller".into());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:unbounded-system".into(),
        "system:authenticated".into(),
    ]);
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn the_controllers_role_holds_every_grant_it_gives_an_agent() {
    apply_deploy_rbac(&["rbac/controller.yaml"]);

    let admin = client().await;
    let machine = create_machine(&admin, "rbac-grants", json!({}), json!({})).await;
    // Every kind of grant at once: versions, operations, and the self-refresh Role.
    let access = AgentAccess {
        machine: "rbac-grants".into(),
        node: "rbac-grants".into(),
        versions: BTreeSet::from(["general-v1".to_owned(), "general-v2".to_owned()]),
        operations: BTreeSet::from(["reboot-1".to_owned()]),
        self_refresh: true,
    };
    // RBAC's view of the controller's new grants can lag the apply by a moment.
    let mut last = None;
    for _ in 0..20 {
        match apply_access(&as_controller().await, &machine, &access).await {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    panic!(
        "the controller, under deploy/rbac/controller.yaml, cannot give an agent its role: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    );
}
