#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The provider loop's release of a deleted Machine against a real kube-apiserver: with a
//! configuration that wipes on release, the infrastructure is released (the provider's
//! `delete`, the power-off) and the finalizer removed only once the agent's status says
//! `Wiped`; a `Failed` wipe or a timeout holds the Machine with `DisksWiped=False` and its
//! finalizer, until the agent reports `Wiped` or a person annotates
//! `unbounded-cloud.io/release-without-wipe=true`; `never` releases at once.
//!
//! The provider here is a power switch that records its calls: the loop, the API server,
//! the status writes and the finalizer are the real ones; what a PXE power-off does is
//! tested with the BMC emulators in the bootserver's tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::well_known::{annotations, conditions, field_managers, reasons};
use unbounded_api::{Machine, MachineConfigurationVersion, MachineProvider, PowerState};
use unbounded_runtime::provider::{Observed, Provider, ProviderError, Settings, run};
use unbounded_runtime::release::WipeTimeouts;
use unbounded_testbed::cluster::LocalControlPlane;
use unbounded_testbed::testkit::wait_for;

const FINALIZER: &str = "test.unbounded-cloud.io/power-switch";

/// A provider that records which Machines it powered on and off.
#[derive(Clone, Default)]
struct PowerSwitch {
    released: Arc<Mutex<Vec<String>>>,
}

impl PowerSwitch {
    fn released(&self, name: &str) -> bool {
        self.released.lock().unwrap().iter().any(|n| n == name)
    }
}

impl Provider for PowerSwitch {
    const KIND: MachineProvider = MachineProvider::Manual;
    const FINALIZER: &'static str = FINALIZER;
    const FIELD_MANAGER: &'static str = "test-power-switch";

    async fn create(&self, _: &Machine) -> Result<Observed, ProviderError> {
        Ok(on())
    }

    async fn observe(&self, _: &Machine) -> Result<Observed, ProviderError> {
        Ok(on())
    }

    async fn delete(&self, machine: &Machine) -> Result<(), ProviderError> {
        self.released.lock().unwrap().push(machine.name_any());
        Ok(())
    }
}

fn on() -> Observed {
    Observed {
        power: PowerState::On,
        addresses: Vec::new(),
        provider_id: None,
        detail: None,
    }
}

async fn create_version(client: &Client, configuration: &str, wipe: &str) {
    let api: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let version: MachineConfigurationVersion = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "MachineConfigurationVersion",
        "metadata": {"name": format!("{configuration}-v1")},
        "spec": {
            "configurationName": configuration,
            "version": 1,
            "template": {
                "boot": {"kernelURL": "http://boot/vmlinuz", "initrdURL": "http://boot/initrd"},
                "storage": {"wipe": wipe},
            },
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &version).await.unwrap();
}

/// A Machine as an agent leaves it after a pave with `configuration` version 1.
async fn create_paved_machine(client: &Client, name: &str, configuration: &str) {
    let api: Api<Machine> = Api::all(client.clone());
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name},
        "spec": {"provider": "manual"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &machine).await.unwrap();
    agent_writes(
        client,
        name,
        json!({
            "bootID": "b-1",
            "paved": {"name": configuration, "version": 1},
            "containerState": "running",
        }),
    )
    .await;
}

/// Writes `status.agent` as the agent does (server-side apply, its field manager).
async fn agent_writes(client: &Client, name: &str, agent: Value) {
    let api: Api<Machine> = Api::all(client.clone());
    api.patch_status(
        name,
        &PatchParams::apply(field_managers::AGENT).force(),
        &Patch::Apply(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "status": {"agent": agent},
        })),
    )
    .await
    .unwrap();
}

/// `status.agent` with a release wipe report, as the agent writes it after a pave of
/// `configuration` version 1 (every write carries all of the agent's fields).
fn wipe_report(configuration: &str, state: &str, message: Option<&str>) -> Value {
    json!({
        "bootID": "b-1",
        "paved": {"name": configuration, "version": 1},
        "releaseWipe": {"state": state, "method": "fast", "disks": ["sda"], "message": message},
    })
}

async fn machine(client: &Client, name: &str) -> Option<Machine> {
    Api::<Machine>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

/// Waits until `DisksWiped` has `reason`, and returns the Machine.
async fn wait_for_reason(client: &Client, name: &str, reason: &str) -> Machine {
    wait_for(&format!("{name}: DisksWiped {reason}"), || async {
        machine(client, name).await.filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == conditions::DISKS_WIPED && c.reason == reason)
            })
        })
    })
    .await
}

async fn wait_until_ready(client: &Client, name: &str) {
    wait_for(&format!("{name} provisioned"), || async {
        machine(client, name).await.filter(|m| {
            m.finalizers().iter().any(|f| f == FINALIZER)
                && m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == conditions::INFRASTRUCTURE_READY && c.status == "True")
                })
        })
    })
    .await;
}

async fn delete(client: &Client, name: &str) {
    Api::<Machine>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn wait_gone(client: &Client, name: &str) {
    wait_for(&format!("{name} gone"), || async {
        machine(client, name).await.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_machine_is_powered_off_only_after_its_disks_are_wiped() {
    let cp = LocalControlPlane::shared().expect("local control plane");
    let client = cp.client().await.unwrap();
    // No Node of these names exists: the release goes straight to the disks.
    for name in ["rw-wiped", "rw-failed", "rw-timeout", "rw-never"] {
        assert!(
            Api::<Node>::all(client.clone())
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
        );
    }
    create_version(&client, "rw-onrelease", "onRelease").await;
    create_version(&client, "rw-always", "always").await;
    create_version(&client, "rw-keep", "never").await;
    let switch = PowerSwitch::default();
    let settings = Settings {
        wait: Duration::from_millis(500),
        held: Duration::from_secs(1),
        wipe_timeouts: WipeTimeouts {
            fast: Duration::from_secs(6),
            overwrite: Duration::from_secs(3600),
        },
        ..Settings::default()
    };
    tokio::spawn(run(client.clone(), switch.clone(), settings));

    create_paved_machine(&client, "rw-wiped", "rw-onrelease").await;
    create_paved_machine(&client, "rw-failed", "rw-always").await;
    create_paved_machine(&client, "rw-timeout", "rw-onrelease").await;
    create_paved_machine(&client, "rw-never", "rw-keep").await;
    for name in ["rw-wiped", "rw-failed", "rw-timeout", "rw-never"] {
        wait_until_ready(&client, name).await;
        delete(&client, name).await;
    }

    // never: released at once, its condition says why.
    wait_gone(&client, "rw-never").await;
    assert!(switch.released("rw-never"));

    // onRelease: the loop looked (it wrote WipePending) and did not power off.
    let waiting = wait_for_reason(&client, "rw-wiped", reasons::WIPE_PENDING).await;
    assert!(waiting.finalizers().iter().any(|f| f == FINALIZER));
    assert!(!switch.released("rw-wiped"), "powered off before the wipe");
    agent_writes(
        &client,
        "rw-wiped",
        wipe_report("rw-onrelease", "Wiping", None),
    )
    .await;
    agent_writes(
        &client,
        "rw-wiped",
        wipe_report("rw-onrelease", "Wiped", None),
    )
    .await;
    wait_gone(&client, "rw-wiped").await;
    assert!(switch.released("rw-wiped"));

    // always, and the wipe failed: held, not powered off, until a person says to go on.
    agent_writes(
        &client,
        "rw-failed",
        wipe_report(
            "rw-always",
            "Failed",
            Some("wipefs: /dev/sda: Input/output error"),
        ),
    )
    .await;
    let held = wait_for_reason(&client, "rw-failed", reasons::WIPE_FAILED).await;
    let c = held
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::DISKS_WIPED)
        .unwrap();
    assert_eq!(c.status, "False");
    assert!(c.message.contains("Input/output error"), "{}", c.message);
    assert!(held.finalizers().iter().any(|f| f == FINALIZER));
    assert!(
        !switch.released("rw-failed"),
        "powered off after a failed wipe"
    );

    // No report at all: held once the timeout passed, with the finalizer.
    let timed_out = wait_for_reason(&client, "rw-timeout", reasons::WIPE_TIMED_OUT).await;
    assert!(timed_out.finalizers().iter().any(|f| f == FINALIZER));
    assert!(
        !switch.released("rw-timeout"),
        "powered off after a timeout"
    );
    // The provider's other status fields survive its condition writes.
    let status = timed_out.status.unwrap();
    assert_eq!(status.power, Some(PowerState::On));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::INFRASTRUCTURE_READY && c.status == "True")
    );
    // A late report releases it.
    agent_writes(
        &client,
        "rw-timeout",
        wipe_report("rw-onrelease", "Wiped", None),
    )
    .await;
    wait_gone(&client, "rw-timeout").await;
    assert!(switch.released("rw-timeout"));

    // The annotation releases the failed one.
    assert!(machine(&client, "rw-failed").await.is_some());
    Api::<Machine>::all(client.clone())
        .patch(
            "rw-failed",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                annotations::RELEASE_WITHOUT_WIPE: "true"
            }}})),
        )
        .await
        .unwrap();
    wait_gone(&client, "rw-failed").await;
    assert!(switch.released("rw-failed"));
}
