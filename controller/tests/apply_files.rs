//! `applyConfiguration` with the agent's part, against a real kube-apiserver with the
//! controller binary running and the agent's own `applyFiles` code acting as the Machine's
//! agent (impersonated: it sees only what its role grants). A version that changes a label,
//! a file's content and mode, a new file and kubelet's flags is applied in place: the
//! controller hands the files to the agent as an `applyFiles` child; the agent reads the
//! target version through its role, writes the files into a container root (a temporary
//! directory here), restarts each named unit once after every write, and completes; only
//! then is the Node labelled and the version recorded, with the Node's UID unchanged. A unit
//! that fails to restart fails the operation and nothing is recorded. An `applyFiles`
//! created by a person is refused.
//!
//! The unit restarts are the one part that needs a running systemd (the container's, over
//! its bus): they go through the agent's `RestartUnits` seam, recorded here; the testbed's
//! `scenario in-place` exercises the real ones on VMs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use common::*;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use unbounded_agent::apply_files::{self, ContainerFacts, RestartUnits, Target};
use unbounded_agent::plan::Paved;
use unbounded_api::well_known::{field_managers, operations};
use unbounded_api::{
    HandlerKind, MachineConfigurationVersion, MachineOperation, OperationState,
    ResolvedConfiguration,
};
use unbounded_runtime::handler::{self, Claim};

const MOTD: &str = "/etc/unbounded-test/motd";
const NEW: &str = "/etc/unbounded-test/new.conf";

fn template(tier: &str, motd: &str, mode: &str, extra: Value, new_file: bool) -> Value {
    let mut files = vec![json!({"path": MOTD, "content": motd, "mode": mode,
                                "restartUnits": ["motd.service", "containerd.service"]})];
    if new_file {
        files.push(json!({"path": NEW, "content": "new", "restartUnits": ["containerd.service", "broken.service"]}));
    }
    json!({"boot": {"kernelURL": "k", "initrdURL": "i"},
           "kubernetes": {"version": "v1.35.4", "nodeLabels": {"tier": tier}, "kubeletExtraArgs": extra},
           "files": files})
}

async fn create_operation(
    client: &Client,
    name: &str,
    machine: &str,
    operation: &str,
    parameters: Value,
) {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
        "metadata": {"name": name},
        "spec": {"machineRef": {"name": machine}, "operationName": operation, "parameters": parameters},
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn finished(client: &Client, name: &str) -> (OperationState, String) {
    let api: Api<MachineOperation> = Api::all(client.clone());
    wait_for(&format!("operation {name} to finish"), || async {
        let status = api.get(name).await.unwrap().status?;
        let state = status.state.filter(|s| s.is_finished())?;
        Some((state, status.message.unwrap_or_default()))
    })
    .await
}

/// A client that is the Machine's agent: only its role's grants apply.
async fn as_agent(machine: &str) -> Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(control_plane().kubeconfig_path()).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate = Some(unbounded_api::agent::agent_username(machine));
    Client::try_from(config).unwrap()
}

/// Records each restart, with the files that were in place at that moment.
struct Recorded {
    root: PathBuf,
    fail: &'static str,
    restarts: Mutex<Vec<(String, bool)>>,
}

impl RestartUnits for Recorded {
    fn restart(&self, unit: &str) -> impl std::future::Future<Output = Result<(), String>> + Send {
        let written = std::fs::read_to_string(self.root.join(MOTD.trim_start_matches('/')))
            .is_ok_and(|c| c != "motd v1");
        self.restarts
            .lock()
            .unwrap()
            .push((unit.to_owned(), written));
        let result = if unit == self.fail {
            Err(format!("{unit} failed to start (failed)"))
        } else {
            Ok(())
        };
        async move { result }
    }
}

fn read(root: &Path, path: &str) -> (String, u32) {
    let file = root.join(path.trim_start_matches('/'));
    let content = std::fs::read_to_string(&file).unwrap_or_default();
    let mode = std::fs::metadata(&file).map_or(0, |m| m.permissions().mode() & 0o7777);
    (content, mode)
}

/// Plays the agent for one `applyFiles`: waits until its role routes it (reading it as
/// the agent), claims it, runs the agent's code on `root`, finishes it.
async fn agent_runs(
    machine: &str,
    child: &str,
    root: &Path,
    held: i64,
    units: &Recorded,
) -> (bool, String) {
    let agent = as_agent(machine).await;
    let ops: Api<MachineOperation> = Api::all(agent.clone());
    let versions: Api<MachineConfigurationVersion> = Api::all(agent);
    let operation = wait_for(
        &format!("{child} routed to the agent, readable by it"),
        || async {
            let op = ops.get(child).await.ok()?;
            let status = op.status.as_ref()?;
            (status.routed_to == Some(HandlerKind::Agent)
                && status.state == Some(OperationState::Pending))
            .then_some(op)
        },
    )
    .await;
    let Claim::Won(operation) = handler::claim(&ops, field_managers::AGENT, &operation)
        .await
        .unwrap()
    else {
        panic!("the claim of {child} was lost");
    };
    let paved = Paved {
        container: machine.to_owned(),
        configuration: ResolvedConfiguration {
            name: "af-mc".into(),
            version: held,
        },
        image_sha256: "x".into(),
        joined_node_uid: None,
        starts: 1,
        node_ip: None,
    };
    let facts = ContainerFacts {
        node: machine,
        paved: Some(&paved),
        paving: false,
        running: true,
    };
    let target = Target {
        operations: &ops,
        name: child,
        field_manager: field_managers::AGENT,
        root,
        units,
    };
    let (outcome, applied) =
        apply_files::run(&target, &versions, &operation.spec.parameters, &facts).await;
    let outcome = outcome.expect("not postponed");
    assert!(
        handler::finish(&ops, field_managers::AGENT, child, &outcome)
            .await
            .unwrap()
    );
    (applied, format!("{outcome:?}"))
}

#[tokio::test]
async fn files_and_kubelet_flags_are_applied_in_place_by_the_agent() {
    start_controller();
    let client = client().await;
    // The agents' namespace, as deploy/ creates it (the controller puts their ServiceAccounts
    // there).
    let namespace: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": unbounded_api::agent::AGENT_NAMESPACE}}),
    )
    .unwrap();
    match Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the agents' namespace: {e}"),
    }
    let (mc, m) = ("af-mc", "af-m1");
    create_configuration(
        &client,
        mc,
        json!({"template": template("a", "motd v1", "0644", json!({}), false)}),
    )
    .await;
    create_machine(
        &client,
        m,
        json!({}),
        json!({"configurationRef": {"name": mc}}),
    )
    .await;
    wait_resolved(&client, m, mc, 1).await;
    let uid = create_node(&client, m, true).await.metadata.uid.unwrap();
    wait_for("af-m1 Running", || async {
        let s = machine(&client, m).await.status?;
        (s.phase == Some(unbounded_api::MachinePhase::Running)).then_some(())
    })
    .await;
    // The container as v1's pave left it.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(m);
    std::fs::create_dir_all(&root).unwrap();
    let v1_files = vec![(MOTD.to_owned(), b"motd v1".to_vec(), 0o644)];
    unbounded_agent::container_root::write_files(&root, v1_files)
        .await
        .unwrap();

    // v2: a label, the file's content and mode, kubelet's flags.
    set_template(
        &client,
        mc,
        template("b", "motd v2", "0600", json!({"max-pods": "50"}), false),
    )
    .await;
    wait_for("af-mc-v2", || async { version(&client, "af-mc-v2").await }).await;
    create_operation(
        &client,
        "af-apply-v2",
        m,
        operations::APPLY_CONFIGURATION,
        json!({"version": "2"}),
    )
    .await;
    let units = Recorded {
        root: root.clone(),
        fail: "broken.service",
        restarts: Mutex::default(),
    };
    let (applied, outcome) = agent_runs(m, "af-apply-v2-files", &root, 1, &units).await;
    assert!(applied, "{outcome}");
    let (state, message) = finished(&client, "af-apply-v2").await;
    assert_eq!(state, OperationState::Complete, "{message}");
    assert!(
        message.contains("in place") && message.contains("the agent: wrote"),
        "{message}"
    );

    assert_eq!(read(&root, MOTD), ("motd v2".to_owned(), 0o600));
    let (env, _) = read(&root, unbounded_agent::render::KUBELET_ENV);
    assert!(env.contains("--max-pods=50"), "{env}");
    let restarts = units.restarts.lock().unwrap().clone();
    assert_eq!(
        restarts,
        vec![
            ("containerd.service".to_owned(), true),
            ("kubelet.service".to_owned(), true),
            ("motd.service".to_owned(), true),
        ],
        "each unit once, after the files were written"
    );
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(m)
        .await
        .unwrap();
    assert_eq!(
        node.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the Node was not replaced"
    );
    assert_eq!(node.labels().get("tier").map(String::as_str), Some("b"));
    let recorded = machine(&client, m)
        .await
        .status
        .unwrap()
        .configuration
        .unwrap();
    assert_eq!(recorded.version, 2);

    // v3: a new file whose unit fails to restart: the operation fails, v2 stays recorded.
    set_template(
        &client,
        mc,
        template("c", "motd v2", "0600", json!({"max-pods": "50"}), true),
    )
    .await;
    wait_for("af-mc-v3", || async { version(&client, "af-mc-v3").await }).await;
    create_operation(
        &client,
        "af-apply-v3",
        m,
        operations::APPLY_CONFIGURATION,
        json!({"version": "3"}),
    )
    .await;
    let failing = Recorded {
        root: root.clone(),
        fail: "broken.service",
        restarts: Mutex::default(),
    };
    let (applied, outcome) = agent_runs(m, "af-apply-v3-files", &root, 2, &failing).await;
    assert!(!applied, "{outcome}");
    let (state, message) = finished(&client, "af-apply-v3").await;
    assert_eq!(state, OperationState::Failed, "{message}");
    assert!(
        message.contains("restarting broken.service")
            && message.contains("still records version 2"),
        "{message}"
    );
    let units: BTreeSet<String> = failing
        .restarts
        .lock()
        .unwrap()
        .iter()
        .map(|(u, _)| u.clone())
        .collect();
    assert!(units.contains("broken.service"));
    assert_eq!(
        machine(&client, m)
            .await
            .status
            .unwrap()
            .configuration
            .unwrap()
            .version,
        2
    );
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(m)
        .await
        .unwrap();
    assert_eq!(
        node.labels().get("tier").map(String::as_str),
        Some("b"),
        "nothing applied on the Node"
    );

    // A person's applyFiles is refused: only applyConfiguration creates one.
    let params = unbounded_api::in_place::AgentApply {
        configuration: mc.into(),
        from: 2,
        version: 3,
    }
    .to_parameters();
    create_operation(
        &client,
        "af-by-hand",
        m,
        operations::APPLY_FILES,
        serde_json::to_value(params).unwrap(),
    )
    .await;
    let (state, message) = finished(&client, "af-by-hand").await;
    assert_eq!(state, OperationState::Failed, "{message}");
    assert!(
        message.contains("create an applyConfiguration operation instead"),
        "{message}"
    );
}
