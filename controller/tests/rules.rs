//! Each rule of DESIGN.md's "Semantics the controller must get exactly right", by name,
//! against a real kube-apiserver with the controller binary running.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use unbounded_api::well_known::{annotations, conditions, reasons};
use unbounded_api::{Machine, MachineConfiguration, MachineConfigurationVersion, MachinePhase};

#[tokio::test]
async fn new_configuration_gets_v1() {
    start_controller();
    let client = client().await;
    let mc = create_configuration(&client, "rule-new", json!({"template": template("k1")})).await;
    let v1 = wait_for("rule-new-v1", || async {
        version(&client, "rule-new-v1").await
    })
    .await;
    assert_eq!(v1.spec.version, 1);
    assert_eq!(v1.spec.configuration_name, "rule-new");
    assert!(
        !v1.status.clone().unwrap_or_default().deployed,
        "v1 starts undeployed"
    );
    let owner = &v1.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.name, "rule-new");
    assert_eq!(Some(&owner.uid), mc.metadata.uid.as_ref());
    let status = wait_for("latestVersion 1", || async {
        let mc: MachineConfiguration = Api::all(client.clone()).get("rule-new").await.unwrap();
        mc.status
            .filter(|s| s.latest_version == 1 && s.versions.len() == 1)
    })
    .await;
    assert_eq!(status.versions[0].name, "rule-new-v1");
    wait_event(&client, "rule-new", reasons::VERSION_CREATED).await;
}

#[tokio::test]
async fn template_change_updates_undeployed_newest() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-copy", json!({"template": template("k1")})).await;
    wait_for("rule-copy-v1", || async {
        version(&client, "rule-copy-v1").await
    })
    .await;
    set_template(&client, "rule-copy", template("k2")).await;
    let v1 = wait_for("v1 to carry k2", || async {
        version(&client, "rule-copy-v1")
            .await
            .filter(|v| v.spec.template.boot.as_ref().map(|b| b.kernel_url.as_str()) == Some("k2"))
    })
    .await;
    assert_eq!(v1.spec.version, 1);
    // The pass that acted on the change has recorded it (observedGeneration): it updated
    // v1 and created nothing.
    wait_for("the change observed", || async {
        let mc: MachineConfiguration = Api::all(client.clone()).get("rule-copy").await.unwrap();
        let generation = mc.metadata.generation;
        (mc.status?.observed_generation == generation).then_some(())
    })
    .await;
    assert!(
        version(&client, "rule-copy-v2").await.is_none(),
        "no v2 while v1 is undeployed"
    );
}

#[tokio::test]
async fn template_change_after_deploy_creates_next_version() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "rule-next",
        json!({"template": template("k1"), "machineSelector": {"matchLabels": {"rule": "next"}}}),
    )
    .await;
    create_machine(&client, "rule-next-m", json!({"rule": "next"}), json!({})).await;
    wait_resolved(&client, "rule-next-m", "rule-next", 1).await;
    assert!(
        version(&client, "rule-next-v1")
            .await
            .unwrap()
            .status
            .unwrap()
            .deployed
    );

    set_template(&client, "rule-next", template("k2")).await;
    let v2 = wait_for("rule-next-v2", || async {
        version(&client, "rule-next-v2").await
    })
    .await;
    assert_eq!(v2.spec.template.boot.unwrap().kernel_url, "k2");
    let v1 = version(&client, "rule-next-v1").await.unwrap();
    assert_eq!(
        v1.spec.template.boot.unwrap().kernel_url,
        "k1",
        "a deployed version never changes"
    );
    // The Machine keeps v1 (OnDelete).
    let m = machine(&client, "rule-next-m").await;
    assert_eq!(m.status.unwrap().configuration.unwrap().version, 1);
}

#[tokio::test]
async fn explicit_version_is_used_exactly() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-pin", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-pin-canary",
        json!({}),
        json!({"configurationRef": {"name": "rule-pin"}}),
    )
    .await;
    wait_resolved(&client, "rule-pin-canary", "rule-pin", 1).await;
    set_template(&client, "rule-pin", template("k2")).await;
    wait_for("rule-pin-v2", || async {
        version(&client, "rule-pin-v2").await
    })
    .await;

    create_machine(
        &client,
        "rule-pin-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-pin", "version": 1}}),
    )
    .await;
    wait_resolved(&client, "rule-pin-m", "rule-pin", 1).await;
}

#[tokio::test]
async fn name_only_uses_newest_and_locks_it() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-name", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-name-a",
        json!({}),
        json!({"configurationRef": {"name": "rule-name"}}),
    )
    .await;
    wait_resolved(&client, "rule-name-a", "rule-name", 1).await;
    set_template(&client, "rule-name", template("k2")).await;
    let v2 = wait_for("rule-name-v2", || async {
        version(&client, "rule-name-v2").await
    })
    .await;
    assert!(!v2.status.clone().unwrap_or_default().deployed);

    create_machine(
        &client,
        "rule-name-b",
        json!({}),
        json!({"configurationRef": {"name": "rule-name"}}),
    )
    .await;
    wait_resolved(&client, "rule-name-b", "rule-name", 2).await;
    let v2 = version(&client, "rule-name-v2").await.unwrap();
    assert!(
        v2.status.unwrap().deployed,
        "the newest version is locked when a machine takes it"
    );
    wait_event(&client, "rule-name-b", reasons::VERSION_LOCKED).await;
}

#[tokio::test]
async fn selector_highest_priority_then_name() {
    start_controller();
    let client = client().await;
    let selector = json!({"matchLabels": {"rule": "prio"}});
    create_configuration(
        &client,
        "rule-prio-low",
        json!({"priority": 1, "machineSelector": selector, "template": template("low")}),
    )
    .await;
    create_configuration(
        &client,
        "rule-prio-zeta",
        json!({"priority": 5, "machineSelector": selector, "template": template("z")}),
    )
    .await;
    create_configuration(
        &client,
        "rule-prio-alpha",
        json!({"priority": 5, "machineSelector": selector, "template": template("a")}),
    )
    .await;
    for name in [
        "rule-prio-low-v1",
        "rule-prio-zeta-v1",
        "rule-prio-alpha-v1",
    ] {
        wait_for(name, || async { version(&client, name).await }).await;
    }
    create_machine(&client, "rule-prio-m", json!({"rule": "prio"}), json!({})).await;
    wait_resolved(&client, "rule-prio-m", "rule-prio-alpha", 1).await;
}

#[tokio::test]
async fn selector_uses_newest_deployed_version() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "rule-deployed",
        json!({"machineSelector": {"matchLabels": {"rule": "deployed"}}, "template": template("k1")}),
    )
    .await;
    create_machine(
        &client,
        "rule-deployed-a",
        json!({"rule": "deployed"}),
        json!({}),
    )
    .await;
    wait_resolved(&client, "rule-deployed-a", "rule-deployed", 1).await;
    set_template(&client, "rule-deployed", template("k2")).await;
    wait_for("rule-deployed-v2", || async {
        version(&client, "rule-deployed-v2").await
    })
    .await;
    // v2 exists but is not deployed: a new selector-matched machine still gets v1.
    create_machine(
        &client,
        "rule-deployed-b",
        json!({"rule": "deployed"}),
        json!({}),
    )
    .await;
    wait_resolved(&client, "rule-deployed-b", "rule-deployed", 1).await;
}

#[tokio::test]
async fn no_match_stays_pending_until_a_configuration_matches() {
    start_controller();
    let client = client().await;
    create_machine(
        &client,
        "rule-pending-m",
        json!({"rule": "pending"}),
        json!({}),
    )
    .await;
    let m = wait_for("ConfigurationPending", || async {
        let m = machine(&client, "rule-pending-m").await;
        let c = condition(&m, conditions::CONFIGURATION_RESOLVED)?;
        (c.status == "False" && c.reason == reasons::CONFIGURATION_PENDING).then_some(m)
    })
    .await;
    assert_eq!(
        m.status.as_ref().unwrap().phase,
        Some(MachinePhase::Pending)
    );
    assert!(m.status.unwrap().configuration.is_none());

    // Re-evaluated when a configuration that matches appears.
    create_configuration(
        &client,
        "rule-pending",
        json!({"machineSelector": {"matchLabels": {"rule": "pending"}}, "template": template("k")}),
    )
    .await;
    let m = wait_resolved(&client, "rule-pending-m", "rule-pending", 1).await;
    assert_eq!(m.status.unwrap().phase, Some(MachinePhase::Provisioning));
}

#[tokio::test]
async fn missing_reference_is_a_condition_not_a_crash() {
    start_controller();
    let client = client().await;
    create_machine(
        &client,
        "rule-missing-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-missing-nothing"}}),
    )
    .await;
    let m = wait_for("ConfigurationNotFound", || async {
        let m = machine(&client, "rule-missing-m").await;
        condition(&m, conditions::CONFIGURATION_RESOLVED)
            .filter(|c| c.reason == reasons::CONFIGURATION_NOT_FOUND)
            .cloned()
    })
    .await;
    assert!(
        m.message
            .contains("rule-missing-nothing, which does not exist"),
        "{}",
        m.message
    );

    create_configuration(&client, "rule-missing", json!({"template": template("k")})).await;
    create_machine(
        &client,
        "rule-missing-v",
        json!({}),
        json!({"configurationRef": {"name": "rule-missing", "version": 4}}),
    )
    .await;
    let c = wait_for("VersionNotFound", || async {
        let m = machine(&client, "rule-missing-v").await;
        condition(&m, conditions::CONFIGURATION_RESOLVED)
            .filter(|c| c.reason == reasons::VERSION_NOT_FOUND)
            .cloned()
    })
    .await;
    assert!(c.message.contains("pins version 4"), "{}", c.message);
}

#[tokio::test]
async fn version_locked_on_first_provision() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "rule-lock",
        json!({"machineSelector": {"matchLabels": {"rule": "lock"}}, "template": template("k1")}),
    )
    .await;
    let v1 = wait_for("rule-lock-v1", || async {
        version(&client, "rule-lock-v1").await
    })
    .await;
    assert!(!v1.status.unwrap_or_default().deployed);
    create_machine(&client, "rule-lock-m", json!({"rule": "lock"}), json!({})).await;
    wait_resolved(&client, "rule-lock-m", "rule-lock", 1).await;
    let v1 = version(&client, "rule-lock-v1").await.unwrap();
    assert!(v1.status.unwrap().deployed);
    // And the API server now refuses to change it.
    let api: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let err = api
        .patch(
            "rule-lock-v1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template("evil")}})),
        )
        .await
        .expect_err("deployed version is immutable");
    assert!(err.to_string().contains("immutable"), "{err}");
}

#[tokio::test]
async fn revision_history_limit_keeps_referenced() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "rule-hist",
        json!({"revisionHistoryLimit": 2, "template": template("k1")}),
    )
    .await;
    // v1 referenced by a Machine that pins it.
    create_machine(
        &client,
        "rule-hist-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-hist", "version": 1}}),
    )
    .await;
    wait_resolved(&client, "rule-hist-m", "rule-hist", 1).await;
    for (i, kernel) in ["k2", "k3", "k4", "k5"].iter().enumerate() {
        let n = i as i64 + 2;
        // Lock each new version with a short-lived canary so the next change makes a new one.
        set_template(&client, "rule-hist", template(kernel)).await;
        let name = format!("rule-hist-v{n}");
        wait_for(&name, || async { version(&client, &name).await }).await;
        let canary = format!("rule-hist-c{n}");
        create_machine(
            &client,
            &canary,
            json!({}),
            json!({"configurationRef": {"name": "rule-hist", "version": n}}),
        )
        .await;
        wait_resolved(&client, &canary, "rule-hist", n).await;
        Api::<Machine>::all(client.clone())
            .delete(&canary, &DeleteParams::default())
            .await
            .unwrap();
    }
    // Newest two (v4, v5) kept, v1 kept because a Machine uses it, v2 and v3 pruned.
    let expected = [(1, true), (2, false), (3, false), (4, true), (5, true)];
    wait_for("pruning to v1, v4, v5", || async {
        let mut ok = true;
        for (n, exists) in expected {
            ok &= version(&client, &format!("rule-hist-v{n}")).await.is_some() == exists;
        }
        ok.then_some(())
    })
    .await;
    let mc: MachineConfiguration = Api::all(client.clone()).get("rule-hist").await.unwrap();
    let status = mc.status.unwrap();
    assert_eq!(status.latest_version, 5);
    // A new change gets v6: pruned numbers are not reused.
    set_template(&client, "rule-hist", template("k6")).await;
    wait_for("rule-hist-v6", || async {
        version(&client, "rule-hist-v6").await
    })
    .await;
}

#[tokio::test]
async fn node_annotated_after_it_appears_and_machine_runs_when_ready() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-node", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-node-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-node"}}),
    )
    .await;
    wait_resolved(&client, "rule-node-m", "rule-node", 1).await;

    create_node(&client, "rule-node-m", false).await;
    let node = wait_for("annotations on the Node", || async {
        let node: Node = Api::all(client.clone()).get("rule-node-m").await.unwrap();
        let a = node.metadata.annotations.clone()?;
        (a.get(annotations::MACHINE_CONFIGURATION)? == "rule-node"
            && a.get(annotations::MACHINE_CONFIGURATION_VERSION)? == "1")
            .then_some(node)
    })
    .await;
    assert_eq!(node.metadata.name.as_deref(), Some("rule-node-m"));
    let m = wait_for("Provisioned with a NotReady Node", || async {
        let m = machine(&client, "rule-node-m").await;
        (m.status.as_ref()?.phase == Some(MachinePhase::Provisioned)).then_some(m)
    })
    .await;
    assert_eq!(m.status.unwrap().node_ref.unwrap().name, "rule-node-m");

    let api: Api<Node> = Api::all(client.clone());
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "", "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status("rule-node-m", &PatchParams::default(), &Patch::Merge(ready))
        .await
        .unwrap();
    wait_for("Running", || async {
        let m = machine(&client, "rule-node-m").await;
        (m.status.as_ref()?.phase == Some(MachinePhase::Running)).then_some(())
    })
    .await;
    wait_event(&client, "rule-node-m", reasons::NODE_ANNOTATED).await;
}

#[tokio::test]
async fn node_found_by_provider_id() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-pid", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-pid-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-pid"}, "providerID": "pxe://52:54:00:00:00:99"}),
    )
    .await;
    wait_resolved(&client, "rule-pid-m", "rule-pid", 1).await;
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "some-other-hostname"}, "spec": {"providerID": "pxe://52:54:00:00:00:99"}}))
    .unwrap();
    api.create(&PostParams::default(), &node).await.unwrap();
    wait_for("nodeRef by providerID", || async {
        let m = machine(&client, "rule-pid-m").await;
        (m.status.as_ref()?.node_ref.as_ref()?.name == "some-other-hostname").then_some(())
    })
    .await;
}

#[tokio::test]
async fn rollback_by_pinning_and_deleting_node() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-roll", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-roll-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-roll"}}),
    )
    .await;
    wait_resolved(&client, "rule-roll-m", "rule-roll", 1).await;
    create_node(&client, "rule-roll-m", true).await;

    // Roll forward: v2, applied by a repave (delete the Node).
    set_template(&client, "rule-roll", template("k2")).await;
    wait_for("rule-roll-v2", || async {
        version(&client, "rule-roll-v2").await
    })
    .await;
    wait_for("nodeRef recorded", || async {
        machine(&client, "rule-roll-m")
            .await
            .status?
            .node_ref
            .map(|_| ())
    })
    .await;
    delete_node(&client, "rule-roll-m").await;
    wait_resolved(&client, "rule-roll-m", "rule-roll", 2).await;
    create_node(&client, "rule-roll-m", true).await;
    wait_for("Running on v2", || async {
        let m = machine(&client, "rule-roll-m").await;
        let s = m.status?;
        (s.phase == Some(MachinePhase::Running) && s.configuration?.version == 2).then_some(())
    })
    .await;

    // Roll back: pin v1, then delete the Node.
    let api: Api<Machine> = Api::all(client.clone());
    api.patch(
        "rule-roll-m",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"configurationRef": {"name": "rule-roll", "version": 1}}})),
    )
    .await
    .unwrap();
    // Pinning alone changes nothing while the Node lives.
    let pending = wait_for("the condition to announce the rollback", || async {
        let m = machine(&client, "rule-roll-m").await;
        let announced = condition(&m, conditions::CONFIGURATION_RESOLVED).is_some_and(|c| {
            c.message
                .contains("version 1 is applied when the Node is deleted")
        });
        announced.then_some(m)
    })
    .await;
    assert_eq!(pending.status.unwrap().configuration.unwrap().version, 2);
    delete_node(&client, "rule-roll-m").await;
    wait_resolved(&client, "rule-roll-m", "rule-roll", 1).await;
    wait_event(&client, "rule-roll-m", reasons::REPAVE).await;
    create_node(&client, "rule-roll-m", true).await;
    let node = wait_for("Node annotated with v1 again", || async {
        let node: Node = Api::all(client.clone()).get("rule-roll-m").await.unwrap();
        (node
            .metadata
            .annotations
            .as_ref()?
            .get(annotations::MACHINE_CONFIGURATION_VERSION)?
            == "1")
            .then_some(node)
    })
    .await;
    assert_eq!(
        node.metadata.annotations.unwrap()[annotations::MACHINE_CONFIGURATION],
        "rule-roll"
    );
}

#[tokio::test]
async fn vap_denies_deleting_referenced_version() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-vap", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-vap-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-vap"}}),
    )
    .await;
    wait_resolved(&client, "rule-vap-m", "rule-vap", 1).await;
    let api: Api<MachineConfigurationVersion> = Api::all(client.clone());
    wait_for("machineCount 1", || async {
        (version(&client, "rule-vap-v1").await?.status?.machine_count == 1).then_some(())
    })
    .await;
    let err = api
        .delete("rule-vap-v1", &DeleteParams::default())
        .await
        .expect_err("denied");
    assert!(err.to_string().contains("is used by 1 Machine(s)"), "{err}");
    let v1 = version(&client, "rule-vap-v1").await.unwrap();
    assert!(
        v1.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&unbounded_api::well_known::finalizers::VERSION_IN_USE.to_owned())
    );

    // Once the Machine is gone, the count drops, the finalizer goes and deleting works.
    Api::<Machine>::all(client.clone())
        .delete("rule-vap-m", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("machineCount 0 and no finalizer", || async {
        let v = version(&client, "rule-vap-v1").await?;
        (v.status?.machine_count == 0 && v.metadata.finalizers.unwrap_or_default().is_empty())
            .then_some(())
    })
    .await;
    api.delete("rule-vap-v1", &DeleteParams::default())
        .await
        .expect("deleting an unused version");
}

#[tokio::test]
async fn machine_deletion_drains_and_deletes_node() {
    start_controller();
    let client = client().await;
    create_configuration(&client, "rule-del", json!({"template": template("k1")})).await;
    create_machine(
        &client,
        "rule-del-m",
        json!({}),
        json!({"configurationRef": {"name": "rule-del"}}),
    )
    .await;
    wait_resolved(&client, "rule-del-m", "rule-del", 1).await;
    create_node(&client, "rule-del-m", true).await;

    // A pod on the Node, protected by a PodDisruptionBudget that allows no disruption.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rule-del-pod", "labels": {"app": "rule-del"}},
        "spec": {"nodeName": "rule-del-m", "containers": [{"name": "c", "image": "registry.invalid/none"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "rule-del-pdb"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "rule-del"}}}}),
    )
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    wait_for("the PDB to be observed", || async {
        let pdb = pdbs.get("rule-del-pdb").await.ok()?;
        pdb.status
            .filter(|s| s.observed_generation.is_some())
            .map(|_| ())
    })
    .await;

    Api::<Machine>::all(client.clone())
        .delete("rule-del-m", &DeleteParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("the Node cordoned and the Machine Deleting", || async {
        let node = nodes.get("rule-del-m").await.ok()?;
        let m = machine(&client, "rule-del-m").await;
        (node.spec?.unschedulable == Some(true) && m.status?.phase == Some(MachinePhase::Deleting))
            .then_some(())
    })
    .await;
    // The budget holds the pod: the controller tried to evict it and was refused (its
    // Draining event says what is left), and the Node stays.
    wait_for("the drain held by the budget", || async {
        event_reasons(&client, "rule-del-m")
            .await
            .contains(&reasons::DRAINING.to_owned())
            .then_some(())
    })
    .await;
    assert!(
        nodes.get_opt("rule-del-m").await.unwrap().is_some(),
        "drain must respect the PodDisruptionBudget"
    );
    assert!(pods.get_opt("rule-del-pod").await.unwrap().is_some());

    // Lift the budget; the eviction goes through. There is no kubelet, so finish the pod's
    // termination as a kubelet would.
    pdbs.delete("rule-del-pdb", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pod evicted", || async {
        let pod = pods.get_opt("rule-del-pod").await.unwrap();
        match pod {
            None => Some(()),
            Some(p) if p.metadata.deletion_timestamp.is_some() => {
                let _ = pods
                    .delete("rule-del-pod", &DeleteParams::default().grace_period(0))
                    .await;
                None
            }
            Some(_) => None,
        }
    })
    .await;
    wait_for("the Node deleted and the Machine gone", || async {
        let node = nodes.get_opt("rule-del-m").await.unwrap();
        let m = Api::<Machine>::all(client.clone())
            .get_opt("rule-del-m")
            .await
            .unwrap();
        (node.is_none() && m.is_none()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn machine_deletion_waits_for_the_provider_finalizer() {
    start_controller();
    let client = client().await;
    create_machine(&client, "rule-prov-m", json!({}), json!({})).await;
    let api: Api<Machine> = Api::all(client.clone());
    wait_for("the controller's finalizer", || async {
        let m = machine(&client, "rule-prov-m").await;
        m.metadata.finalizers.filter(|f| !f.is_empty()).map(|_| ())
    })
    .await;
    // A provider holds the Machine until it has released the infrastructure.
    let m = machine(&client, "rule-prov-m").await;
    let mut finalizers = m.metadata.finalizers.clone().unwrap();
    finalizers.push(unbounded_api::well_known::finalizers::PXE_PROVIDER.to_owned());
    api.patch(
        "rule-prov-m",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": m.metadata.resource_version}})),
    )
    .await
    .unwrap();
    api.delete("rule-prov-m", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the controller waiting for the provider", || async {
        event_reasons(&client, "rule-prov-m")
            .await
            .contains(&reasons::WAITING_FOR_PROVIDER.to_owned())
            .then_some(())
    })
    .await;
    let m = machine(&client, "rule-prov-m").await;
    assert!(
        m.metadata
            .finalizers
            .clone()
            .unwrap()
            .contains(&unbounded_api::well_known::finalizers::MACHINE.to_owned()),
        "the controller keeps its finalizer while the provider's is there"
    );
    // The provider lets go; then the controller does.
    api.patch(
        "rule-prov-m",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers/1", "value": unbounded_api::well_known::finalizers::PXE_PROVIDER},
            {"op": "remove", "path": "/metadata/finalizers/1"}
        ])).unwrap()),
    )
    .await
    .unwrap();
    wait_for("the Machine gone", || async {
        api.get_opt("rule-prov-m")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// The acceptance of RollingUpdate, with kubectl: a configuration with `maxUnavailable: 1`
/// moves 4 Machines to a new version, never more than one of them repaving (a watch
/// counts, at every event, the Machines with a repave requested or under way, or whose Node
/// is absent, not Ready or cordoned). Nodes registered by the test stand in for the agent.
#[tokio::test]
async fn rolling_update_moves_machines_one_batch_at_a_time() {
    use common::rollout::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    start_controller();
    let client = client().await;
    let names: Vec<String> = (1..=4).map(|i| format!("rule-rolling-{i}")).collect();
    let mut manifests = String::from(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {name: rule-rolling}
spec:
  machineSelector: {matchLabels: {rule: rolling}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template: {boot: {kernelURL: k1, initrdURL: initrd}}
"#,
    );
    for name in &names {
        manifests += &format!(
            "---\napiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {{name: {name}, labels: {{rule: rolling}}}}\nspec: {{provider: manual}}\n"
        );
    }
    kubectl(&["apply", "-f", "-"], Some(&manifests));
    let wanted = Arc::new(Mutex::new(1));
    let _kubelet = StandInKubelet::start(
        &client,
        names.clone(),
        "rule-rolling",
        wanted.clone(),
        Duration::from_millis(500),
    );
    wait_all_running_on(&client, &names, "rule-rolling", 1, Duration::from_secs(60)).await;

    let watch = UnreadyWatch::start(&client, &names);
    watch.wait_listed().await;
    *wanted.lock().unwrap() = 2;
    kubectl(
        &[
            "patch",
            "mc",
            "rule-rolling",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"template":{"boot":{"kernelURL":"k2"}}}}"#,
        ],
        None,
    );
    wait_all_running_on(&client, &names, "rule-rolling", 2, Duration::from_secs(180)).await;
    let up_to_date = wait_for("UpToDate=True", || async {
        let mc: MachineConfiguration = Api::all(client.clone()).get("rule-rolling").await.unwrap();
        let status = mc.status?;
        let c = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::UP_TO_DATE && c.status == "True")?;
        Some((c, status.rollout))
    })
    .await;
    let rollout = up_to_date.1.unwrap();
    assert_eq!((rollout.machines, rollout.updated), (4, 4));
    let most = watch.most();
    assert_eq!(
        most.len(),
        1,
        "at most one Machine repaving at once, and one did: {most:?}; history {:?}",
        watch.history()
    );
    assert!(
        version(&client, "rule-rolling-v2")
            .await
            .unwrap()
            .status
            .unwrap()
            .deployed,
        "the first batch locked v2"
    );
    let supported = kubectl(
        &[
            "get",
            "mc",
            "rule-rolling",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"UpdateStrategySupported\")].status}",
        ],
        None,
    );
    assert_eq!(supported, "True");
    wait_event(&client, "rule-rolling", reasons::ROLLING_OUT).await;
    for name in &names {
        wait_event(&client, name, reasons::REPAVE).await;
    }
}

/// A Machine discovery created — its `Discovered` condition written first by the
/// bootserver's field manager, as `discovery_writes` does — then claimed, then deleted. The
/// controller's status writes must keep the shared condition whole: without it, the API
/// server refused the entry left behind (no reason, no message) and the Machine stayed
/// `Deleting` for ever (seen in `scenario discovery`).
#[tokio::test]
async fn a_claimed_discovered_machine_is_deleted() {
    start_controller();
    let client = client().await;
    let machines: Api<Machine> = Api::all(client.clone());
    let name = "rule-discovered";
    create_machine(
        &client,
        name,
        json!({"unbounded-cloud.io/discovery": "waiting"}),
        json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:d1:5c:01"]}}),
    )
    .await;
    let discovered = unbounded_api::condition::new_condition(
        conditions::DISCOVERED,
        true,
        reasons::AWAITING_CLAIM,
        "discovered by network boot; claim it (label unbounded-cloud.io/discovery=claimed, or a MachinePool) to provision it",
        None,
    );
    machines
        .patch_status(
            name,
            &PatchParams::apply("unbounded-bootserver-discovery").force(),
            &Patch::Apply(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                "status": {"phase": "Pending", "conditions": [discovered]},
            })),
        )
        .await
        .unwrap();
    let reason_is = |want: &'static str| {
        let client = client.clone();
        move || {
            let client = client.clone();
            async move {
                let m = machine(&client, name).await;
                let status = m.status.clone().unwrap_or_default();
                unbounded_api::condition::find(&status.conditions, conditions::DISCOVERED)
                    .filter(|c| c.reason == want && !m.finalizers().is_empty())
                    .map(|_| ())
            }
        }
    };
    wait_for(
        "the controller's Discovered condition",
        reason_is(reasons::AWAITING_CLAIM),
    )
    .await;
    machines
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"unbounded-cloud.io/discovery": "claimed"}}}),
            ),
        )
        .await
        .unwrap();
    wait_for("Discovered=Claimed", reason_is(reasons::CLAIMED)).await;
    machines
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the claimed discovered Machine gone", || async {
        match machines.get_opt(name).await.unwrap() {
            None => Some(()),
            Some(_) => None,
        }
    })
    .await;
}
