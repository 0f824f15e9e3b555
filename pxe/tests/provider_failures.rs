#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! What the PXE provider records about where a Machine is and when it has failed, on a real
//! control plane with the provider and the controller running in this process and
//! sushy-tools' Redfish emulator (its fake driver: systems without VMs) as the BMC:
//!
//! - a provisioned Machine gets `spec.providerID: pxe://<first MAC>` and its reservation
//!   as `status.addresses`, and `kubectl get machines -o wide` shows the ID;
//! - each terminal failure (`ProviderIDMismatch`, `BmcAddressInvalid`) is written to
//!   `status.failureReason`/`failureMessage`, the controller shows the phase `Failed`, and
//!   the BMC is left alone; a change of the spec clears it and the provider tries again;
//! - a transient failure (a BMC that does not answer) is retried and never makes a Machine
//!   `Failed`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use unbounded_api::{Machine, MachinePhase};
use unbounded_pxe::power::Backoff;
use unbounded_pxe::provider::PowerSettings;
use unbounded_runtime::leader::Term;
use unbounded_testbed::bmc::{SushyEmulator, free_port};
use unbounded_testbed::cluster::LocalControlPlane;

const GOOD_SYSTEM: &str = "5b000000-0000-4000-8000-00000000a001";
const MISMATCH_SYSTEM: &str = "5b000000-0000-4000-8000-00000000a002";

/// Waits up to 90 s for `check`.
async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    unbounded_testbed::testkit::wait_until(what, Duration::from_secs(90), check).await;
}

fn manifests(sushy: u16, closed: u16) -> String {
    let redfish =
        |system: &str| format!("redfish+http://127.0.0.1:{sushy}/redfish/v1/Systems/{system}");
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: pf-bmc, namespace: default}}
stringData: {{username: admin, password: pf-not-checked}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pf-good}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:0A:00:01", "52:54:00:0a:00:11"]
    ipv4: 10.9.0.5
    bmc: {{address: "{good}", credentialsSecretRef: {{namespace: default, name: pf-bmc}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pf-mismatch}}
spec:
  provider: pxe
  providerID: pxe://52:54:00:0a:00:99
  pxe:
    macAddresses: ["52:54:00:0a:00:02"]
    bmc: {{address: "{mismatch}", credentialsSecretRef: {{namespace: default, name: pf-bmc}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pf-bad-address}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:0a:00:03"]
    bmc: {{address: "ipmi://127.0.0.1:99999", credentialsSecretRef: {{namespace: default, name: pf-bmc}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pf-unreachable}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:0a:00:04"]
    bmc: {{address: "ipmi://127.0.0.1:{closed}", credentialsSecretRef: {{namespace: default, name: pf-bmc}}}}
"#,
        good = redfish(GOOD_SYSTEM),
        mismatch = redfish(MISMATCH_SYSTEM),
    )
}

async fn machine(client: &kube::Client, name: &str) -> Machine {
    Api::<Machine>::all(client.clone()).get(name).await.unwrap()
}

fn failure(m: &Machine) -> (Option<String>, Option<String>) {
    let status = m.status.clone().unwrap_or_default();
    (status.failure_reason, status.failure_message)
}

fn phase(m: &Machine) -> Option<MachinePhase> {
    m.status.as_ref().and_then(|s| s.phase)
}

fn infrastructure_reason(m: &Machine) -> Option<String> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "InfrastructureReady")
        .map(|c| c.reason.clone())
}

/// Waits until the Machine has failed with `reason`, terminally: failure recorded and the
/// controller's phase `Failed`.
async fn wait_failed(client: &kube::Client, name: &str, reason: &str) -> Machine {
    wait_until(&format!("{name} Failed with {reason}"), || async {
        let m = machine(client, name).await;
        failure(&m).0.as_deref() == Some(reason) && phase(&m) == Some(MachinePhase::Failed)
    })
    .await;
    machine(client, name).await
}

/// How many times the provider reported `reason` on `name` as an Event (a series counts
/// each occurrence).
async fn occurrences(client: &kube::Client, name: &str, reason: &str) -> i32 {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count.max(1)))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_provider_records_where_machines_are_and_which_failures_are_terminal() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let sushy = SushyEmulator::start_fake(&[
        (GOOD_SYSTEM, "52:54:00:0a:00:01"),
        (MISMATCH_SYSTEM, "52:54:00:0a:00:02"),
    ])
    .unwrap();
    let closed = free_port(false).unwrap();

    let mut settings = PowerSettings {
        timeout: Duration::from_secs(2),
        graceful_shutdown: Duration::from_secs(2),
        backoff: Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_millis(200),
            attempts: 1,
        },
        ..PowerSettings::default()
    };
    settings.loop_settings.poll = Duration::from_secs(3);
    settings.loop_settings.first_backoff = Duration::from_secs(1);
    settings.loop_settings.max_backoff = Duration::from_secs(2);
    tokio::spawn(unbounded_pxe::run(
        client.clone(),
        settings,
        Term::unbounded(),
    ));
    let mut registry = prometheus_client::registry::Registry::default();
    tokio::spawn(unbounded_controller::run(
        client.clone(),
        unbounded_controller::Settings::default(),
        Arc::new(unbounded_controller::metrics::Metrics::new(&mut registry)),
        futures::future::pending(),
    ));
    cp.kubectl_with_input(&["apply", "-f", "-"], Some(&manifests(sushy.port, closed)))
        .unwrap_or_else(|e| panic!("{e}"));

    // Provisioned: the provider ID (first MAC, lower case) and the reservation.
    wait_until("pf-good provisioned", || async {
        infrastructure_reason(&machine(&client, "pf-good").await).as_deref() == Some("Provisioned")
    })
    .await;
    let good = machine(&client, "pf-good").await;
    assert_eq!(
        good.spec.provider_id.as_deref(),
        Some("pxe://52:54:00:0a:00:01")
    );
    let addresses = good.status.clone().unwrap().addresses;
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert_eq!(
        (addresses[0].type_.as_str(), addresses[0].address.as_str()),
        ("InternalIP", "10.9.0.5")
    );
    assert_eq!(failure(&good), (None, None));
    let wide = cp
        .kubectl_output(&["get", "machines", "pf-good", "-o", "wide"])
        .unwrap();
    let header = wide.lines().next().unwrap();
    assert!(header.contains("PROVIDERID"), "{wide}");
    assert!(wide.contains("pxe://52:54:00:0a:00:01"), "{wide}");

    // Terminal: an immutable provider ID that names none of the Machine's MACs. Its BMC is
    // never touched: its system stays off.
    let mismatch = wait_failed(&client, "pf-mismatch", "ProviderIDMismatch").await;
    let message = failure(&mismatch).1.unwrap();
    assert!(message.contains("pxe://52:54:00:0a:00:99"), "{message}");
    assert_eq!(
        infrastructure_reason(&mismatch).as_deref(),
        Some("ProviderIDMismatch")
    );
    let log = sushy.log();
    assert!(
        log.contains(&format!("/redfish/v1/Systems/{GOOD_SYSTEM}")),
        "the control: the good Machine's BMC was called\n{log}"
    );
    assert!(
        !log.contains(MISMATCH_SYSTEM),
        "no request for the mismatched Machine's system\n{log}"
    );

    // Terminal: a BMC address the CRD lets through but nobody can use.
    let bad = wait_failed(&client, "pf-bad-address", "BmcAddressInvalid").await;
    assert!(failure(&bad).1.unwrap().contains("bad port"));
    let reported = occurrences(&client, "pf-bad-address", "BmcAddressInvalid").await;

    // Transient: a BMC that does not answer is retried, and the Machine is never Failed.
    wait_until("pf-unreachable tried three times", || async {
        occurrences(&client, "pf-unreachable", "BmcUnreachable").await >= 3
    })
    .await;
    let unreachable = machine(&client, "pf-unreachable").await;
    assert_eq!(
        infrastructure_reason(&unreachable).as_deref(),
        Some("BmcUnreachable")
    );
    assert_eq!(failure(&unreachable), (None, None));
    assert_ne!(phase(&unreachable), Some(MachinePhase::Failed));
    // Meanwhile the terminal failure was not retried.
    assert_eq!(
        occurrences(&client, "pf-bad-address", "BmcAddressInvalid").await,
        reported,
        "a terminal failure is not retried"
    );

    // Fixing the spec clears the failure: the provider tries again, and an unreachable BMC
    // is a transient failure like any other.
    Api::<Machine>::all(client.clone())
        .patch(
            "pf-bad-address",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"pxe": {"bmc": {"address": format!("ipmi://127.0.0.1:{closed}")}}}})),
        )
        .await
        .unwrap();
    wait_until("pf-bad-address retried after the fix", || async {
        let m = machine(&client, "pf-bad-address").await;
        infrastructure_reason(&m).as_deref() == Some("BmcUnreachable")
            && failure(&m) == (None, None)
            && phase(&m).is_some_and(|p| p != MachinePhase::Failed)
    })
    .await;
}
