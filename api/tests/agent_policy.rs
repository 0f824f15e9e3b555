//! `deploy/policies/agent-writes.yaml` against a real kube-apiserver, as an agent: each
//! rule is exercised by a write that only that rule refuses, beside a write it lets
//! through. The agent (`system:serviceaccount:unbounded-machines:<machine>`, impersonated)
//! is given a role wider than the controller ever grants (status of every Machine and every
//! MachineOperation), so that what refuses the write is the policy, not RBAC: with the rule
//! deleted, the write goes through and the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use unbounded_api::{Machine, MachineOperation};
use unbounded_testbed::cluster::LocalControlPlane;

const AGENT: &str = "system:serviceaccount:unbounded-machines:ap-m1";

async fn admin() -> kube::Client {
    LocalControlPlane::shared()
        .expect("control plane")
        .client()
        .await
        .expect("client")
}

async fn as_agent() -> kube::Client {
    let cp = LocalControlPlane::shared().expect("control plane");
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some(AGENT.into());
    kube::Client::try_from(config).expect("client")
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": "Test", "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Two Machines with controller-written conditions, two operations (one labelled for each
/// Machine, both routed to the agent), and a role that lets the agent write all their
/// status.
async fn set_up(admin: &kube::Client) {
    let cp = LocalControlPlane::shared().expect("control plane");
    cp.kubectl_with_input(
        &["apply", "-f", "-"],
        Some(&format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: ap-wider-than-granted}}
rules:
  - apiGroups: [unbounded-cloud.io]
    resources: [machines, machines/status, machineoperations, machineoperations/status]
    verbs: [get, list, update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: ap-wider-than-granted}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ap-wider-than-granted}}
subjects: [{{kind: User, name: "{AGENT}"}}]
"#
        )),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let machines: Api<Machine> = Api::all(admin.clone());
    for name in ["ap-m1", "ap-m2"] {
        let m: Machine = serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": name}, "spec": {"provider": "manual"},
        }))
        .unwrap();
        machines.create(&PostParams::default(), &m).await.unwrap();
        machines
            .patch_status(
                name,
                &PatchParams::apply("ap-controller"),
                &Patch::Apply(json!({
                    "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                    "status": {"phase": "Provisioned",
                               "conditions": [condition("NodeReady", "False")]},
                })),
            )
            .await
            .unwrap();
    }
    let operations: Api<MachineOperation> = Api::all(admin.clone());
    for (name, machine) in [("ap-op-m1", "ap-m1"), ("ap-op-m2", "ap-m2")] {
        let o: MachineOperation = serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
            "metadata": {"name": name, "labels": {"unbounded-cloud.io/machine": machine}},
            "spec": {"machineRef": {"name": machine}, "operationName": "reboot"},
        }))
        .unwrap();
        operations.create(&PostParams::default(), &o).await.unwrap();
        operations
            .patch_status(
                name,
                &PatchParams::apply("ap-controller"),
                &Patch::Apply(json!({
                    "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
                    "status": {"state": "Pending", "routedTo": "Agent"},
                })),
            )
            .await
            .unwrap();
    }
}

/// A status write as the agent (server-side apply under its own field manager, forced).
async fn agent_apply<K>(agent: &kube::Client, name: &str, status: Value) -> Result<(), String>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    Api::<K>::all(agent.clone())
        .patch_status(
            name,
            &PatchParams::apply("ap-agent").force(),
            &Patch::Apply(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": kind, "status": status,
            })),
        )
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn refused(result: Result<(), String>, words: &str, what: &str) {
    match result {
        Ok(()) => panic!("{what}: the policy let it through"),
        Err(e) => assert!(
            e.contains(words),
            "{what}: refused, but not by that rule: {e}"
        ),
    }
}

#[tokio::test]
async fn each_rule_of_the_agent_policy_refuses_what_it_names() {
    let admin = admin().await;
    set_up(&admin).await;
    let agent = as_agent().await;

    // The policy is in force (it may compile a moment after the API server starts): the
    // agent's write of another Machine's own field is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match agent_apply::<Machine>(&agent, "ap-m2", json!({"agent": {"version": "x"}})).await {
            Err(e) if e.contains("may write only its own Machine") => break,
            other => assert!(
                Instant::now() < deadline,
                "the agent policy is not in force: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Only its own condition: BootstrapReady goes through, NodeReady does not.
    agent_apply::<Machine>(
        &agent,
        "ap-m1",
        json!({"conditions": [condition("BootstrapReady", "True")]}),
    )
    .await
    .expect("the agent's own condition");
    refused(
        agent_apply::<Machine>(
            &agent,
            "ap-m1",
            json!({"conditions": [condition("NodeReady", "True")]}),
        )
        .await,
        "an agent may change only its own condition (BootstrapReady)",
        "the agent set NodeReady",
    );

    // Only its own operations: its own goes through, the other Machine's does not.
    agent_apply::<MachineOperation>(
        &agent,
        "ap-op-m1",
        json!({"state": "InProgress", "message": "rebooting"}),
    )
    .await
    .expect("the agent's own operation");
    refused(
        agent_apply::<MachineOperation>(
            &agent,
            "ap-op-m2",
            json!({"state": "InProgress", "message": "rebooting"}),
        )
        .await,
        "agent ap-m1 may update only operations of its own Machine",
        "the agent claimed another Machine's operation",
    );

    // Routing unchanged: even on its own operation, the agent may not send it elsewhere.
    refused(
        agent_apply::<MachineOperation>(&agent, "ap-op-m1", json!({"routedTo": "Provider"})).await,
        "an agent may not change where an operation is routed",
        "the agent rerouted its operation",
    );

    // Nothing refused changed anything.
    let machine: Machine = Api::all(admin.clone()).get("ap-m1").await.unwrap();
    let node_ready = machine
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "NodeReady")
        .unwrap();
    assert_eq!(node_ready.status, "False");
    let op: MachineOperation = Api::all(admin.clone()).get("ap-op-m2").await.unwrap();
    assert_eq!(
        op.status.unwrap().state,
        Some(unbounded_api::OperationState::Pending)
    );
}
