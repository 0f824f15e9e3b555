#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The agent's status reports against a real API server: an agent that has not decided its
//! readiness in this boot writes nothing and says so ([`Reported::Skipped`]) — the reboot
//! record it was asked to write is not on the Machine, so the reboot must wait — and the
//! BootstrapReady condition the previous boot left stays; the first report with a readiness
//! writes the kept change; the same again is [`Reported::Unchanged`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use unbounded_agent::operations::{AfterRecord, after_record};
use unbounded_agent::status::{Readiness, Reported, Reporter, SkipReason, reasons};
use unbounded_api::{AgentReboot, AgentStatus, Machine};
use unbounded_testbed::cluster::LocalControlPlane;

const MACHINE: &str = "report-1";

fn bootstrap_ready(machine: &Machine) -> Option<Condition> {
    machine
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "BootstrapReady")
        .cloned()
}

fn reboot_record(machine: &Machine) -> Option<AgentReboot> {
    machine.status.as_ref()?.agent.as_ref()?.reboot.clone()
}

#[tokio::test]
async fn a_report_without_readiness_writes_nothing_and_says_so() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let machines: Api<Machine> = Api::all(client);
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": MACHINE},
        "spec": {"provider": "manual"},
    }))
    .unwrap();
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let running = Readiness {
        ready: true,
        reason: reasons::CONTAINER_RUNNING.into(),
        message: "node container paved with general version 1 is running".into(),
    };
    let agent = |boot: &str| AgentStatus {
        version: Some("test".into()),
        boot_id: Some(boot.into()),
        ..AgentStatus::default()
    };

    // The previous boot's agent reported its container running.
    let previous = Reporter::new(machines.clone(), MACHINE, agent("boot-a"));
    assert_eq!(
        previous
            .report(|_| {}, Some(running.clone()))
            .await
            .unwrap(),
        Reported::Written
    );
    let before = bootstrap_ready(&machines.get(MACHINE).await.unwrap()).unwrap();
    assert_eq!(before.status, "True");

    // This boot's agent is asked to record a reboot before its first pass decided anything.
    let current = Reporter::new(machines.clone(), MACHINE, agent("boot-b"));
    let record = AgentReboot {
        operation: "op-reboot".into(),
        from_boot_id: "boot-b".into(),
    };
    let reported = current
        .report(|a| a.reboot = Some(record.clone()), None)
        .await
        .unwrap();
    assert_eq!(reported, Reported::Skipped(SkipReason::ReadinessUnknown));
    assert_eq!(
        after_record(reported),
        AfterRecord::Postpone(SkipReason::ReadinessUnknown),
        "no reboot without the record on the Machine"
    );
    let seen = machines.get(MACHINE).await.unwrap();
    assert_eq!(reboot_record(&seen), None, "nothing was written");
    assert_eq!(
        bootstrap_ready(&seen).map(|c| c.status),
        Some("True".into()),
        "the previous boot's condition stays"
    );

    // Once the first pass decided, the kept record goes out with the readiness.
    assert_eq!(
        current.report(|_| {}, Some(running.clone())).await.unwrap(),
        Reported::Written
    );
    let seen = machines.get(MACHINE).await.unwrap();
    assert_eq!(reboot_record(&seen), Some(record.clone()));
    let reported = current
        .report(|a| a.reboot = Some(record.clone()), None)
        .await
        .unwrap();
    assert_eq!(reported, Reported::Unchanged);
    assert_eq!(after_record(reported), AfterRecord::Reboot);
    machines.delete(MACHINE, &Default::default()).await.unwrap();
}
