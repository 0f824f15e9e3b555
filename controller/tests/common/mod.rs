//! Shared by the controller's integration tests: the local control plane, the controller
//! binary running against it, and small helpers to create objects and wait for outcomes.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // a panic is the test failure report

pub mod rollout;

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::{Machine, MachineConfiguration, MachineConfigurationVersion};
use unbounded_testbed::cluster::LocalControlPlane;

// Not every test binary uses each of them.
#[allow(unused_imports)]
pub use unbounded_testbed::testkit::{TIMEOUT, create_node, wait_for};

pub fn control_plane() -> &'static LocalControlPlane {
    LocalControlPlane::shared().expect("local control plane")
}

static CONTROLLER: OnceLock<Mutex<Option<Child>>> = OnceLock::new();

/// Starts the controller binary once for this test binary (killed when it exits).
pub fn start_controller() {
    CONTROLLER.get_or_init(|| Mutex::new(Some(spawn_controller())));
}

/// Starts a controller process tied to a thread that lives as long as the test binary.
pub fn spawn_controller() -> Child {
    spawn_controller_with(&[])
}

/// [`spawn_controller`] with `extra` flags.
pub fn spawn_controller_with(extra: &'static [&'static str]) -> Child {
    spawn_controller_from(extra, control_plane().kubeconfig_path().to_path_buf())
}

/// Starts the controller once for this test binary as its ServiceAccount
/// (`unbounded-system/unbounded-controller`, by impersonation) under `rbac` (the files of
/// deploy/ that grant it, applied first): what it may not do fails as in a real cluster.
pub fn start_controller_as_service_account(extra: &'static [&'static str], rbac: &[&str]) {
    CONTROLLER.get_or_init(|| {
        apply_deploy_rbac(rbac);
        let cp = control_plane();
        let mut kubeconfig =
            kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).expect("admin kubeconfig");
        for user in &mut kubeconfig.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                auth.impersonate =
                    Some("system:serviceaccount:unbounded-system:unbounded-controller".into());
                auth.impersonate_groups = Some(vec![
                    "system:serviceaccounts".into(),
                    "system:serviceaccounts:unbounded-system".into(),
                    "system:authenticated".into(),
                ]);
            }
        }
        let path = cp.data_dir().join("controller-service-account.kubeconfig");
        // JSON is YAML.
        std::fs::write(&path, serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
        Mutex::new(Some(spawn_controller_from(extra, path)))
    });
}

/// Applies `files` of deploy/ (RBAC: the controller's ServiceAccount and roles) with the
/// namespaces they name.
pub fn apply_deploy_rbac(files: &[&str]) {
    let cp = control_plane();
    for namespace in ["unbounded-system", "unbounded-machines"] {
        cp.kubectl_with_input(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n"
            )),
        )
        .unwrap();
    }
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for file in files {
        let path = deploy.join(file);
        cp.kubectl_with_input(&["apply", "-f", &path.display().to_string()], None)
            .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
    }
}

fn spawn_controller_from(extra: &'static [&'static str], kubeconfig: std::path::PathBuf) -> Child {
    let (tx, rx) = std::sync::mpsc::channel();
    // Its log (tracing writes to stdout) goes to $UNBOUNDED_TEST_CONTROLLER_LOG when set.
    let log = std::env::var_os("UNBOUNDED_TEST_CONTROLLER_LOG");
    std::thread::spawn(move || {
        let stdout = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("controller log file")),
            None => Stdio::null(),
        };
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(env!("CARGO_BIN_EXE_unbounded-controller"))
            .args([
                "--no-leader-election",
                "--metrics-addr",
                "127.0.0.1:0",
                "--drain-timeout-seconds",
                "120",
            ])
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,unbounded_controller=debug")
            .stdout(stdout)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start unbounded-controller");
        tx.send(child).unwrap();
        loop {
            std::thread::park();
        }
    });
    rx.recv().unwrap()
}

/// Kills the shared controller (SIGKILL) and starts a new one.
pub fn restart_controller() {
    let lock = CONTROLLER.get_or_init(|| Mutex::new(None));
    let mut guard = lock.lock().unwrap();
    if let Some(mut child) = guard.take() {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    *guard = Some(spawn_controller());
}

pub async fn client() -> Client {
    control_plane().client().await.expect("client")
}

pub fn template(kernel: &str) -> Value {
    json!({"boot": {"kernelURL": kernel, "initrdURL": "initrd"}, "kubernetes": {"version": "v1.35.4"}})
}

pub async fn create_configuration(
    client: &Client,
    name: &str,
    spec: Value,
) -> MachineConfiguration {
    let api: Api<MachineConfiguration> = Api::all(client.clone());
    let object: MachineConfiguration = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfiguration",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .expect("create configuration")
}

pub async fn set_template(client: &Client, name: &str, template: Value) {
    let api: Api<MachineConfiguration> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": template}})),
    )
    .await
    .expect("change template");
}

pub async fn create_machine(
    client: &Client,
    name: &str,
    labels: Value,
    spec_extra: Value,
) -> Machine {
    let mut spec = json!({"provider": "manual"});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    let api: Api<Machine> = Api::all(client.clone());
    let object: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "labels": labels}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .expect("create machine")
}

pub async fn machine(client: &Client, name: &str) -> Machine {
    Api::<Machine>::all(client.clone())
        .get(name)
        .await
        .expect("get machine")
}

pub async fn version(client: &Client, name: &str) -> Option<MachineConfigurationVersion> {
    Api::<MachineConfigurationVersion>::all(client.clone())
        .get_opt(name)
        .await
        .expect("get version")
}

/// Waits until the Machine records this configuration version.
pub async fn wait_resolved(
    client: &Client,
    machine_name: &str,
    configuration: &str,
    version: i64,
) -> Machine {
    wait_for(
        &format!("{machine_name} to record {configuration} v{version}"),
        || async {
            let m = machine(client, machine_name).await;
            let c = m.status.as_ref()?.configuration.as_ref()?;
            (c.name == configuration && c.version == version).then_some(m)
        },
    )
    .await
}

pub async fn delete_node(client: &Client, name: &str) {
    let api: Api<Node> = Api::all(client.clone());
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete node");
    wait_for(&format!("Node {name} gone"), || async {
        api.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

pub fn condition<'a>(
    m: &'a Machine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The reasons of the Events about an object, oldest first.
pub async fn event_reasons(client: &Client, object_name: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let mut events: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object_name))
        .collect();
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    events.into_iter().filter_map(|e| e.reason).collect()
}

/// Waits until an Event about `object_name` with `reason` is published (the controller
/// queues its Events and a worker publishes them: one may follow the change it is about).
pub async fn wait_event(client: &Client, object_name: &str, reason: &str) {
    wait_for(&format!("a {reason} Event about {object_name}"), || async {
        let seen = event_reasons(client, object_name).await;
        seen.iter().any(|r| r == reason).then_some(())
    })
    .await
}

pub fn name_of<K: ResourceExt>(k: &K) -> String {
    k.name_any()
}
