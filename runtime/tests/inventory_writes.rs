#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Folding reads into a MachineInventory on a real API server, as the writers do it: the
//! bootserver (cluster admin here) and an agent, impersonated as its Machine's ServiceAccount
//! with exactly the role the controller gives it (`AgentAccess::rules`) and under the
//! admission policy of `deploy/policies/agent-writes.yaml`:
//!
//! - the agent creates its own inventory (by name: the apply path) and folds its in-band
//!   read; the bootserver's Redfish read fills what in band lacks and leaves the rest;
//! - the agent's next read replaces its own sections and leaves Redfish's;
//! - the agent may not change a Redfish section or record, nor write another Machine's.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use unbounded_api::Machine;
use unbounded_api::agent::AgentAccess;
use unbounded_api::inventory::{
    BmcFacts, CpuFacts, FactOrigin, FactSource, FirmwareFacts, InventoryRead, IpmiLan,
    MachineInventory, MachineInventorySpec, SystemFacts,
};
use unbounded_runtime::inventory::fold_into;
use unbounded_testbed::cluster::LocalControlPlane;

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
}

fn origin(source: FactSource, second: i64) -> FactOrigin {
    FactOrigin {
        source,
        observed_at: at(second),
    }
}

fn record(source: FactSource, second: i64) -> InventoryRead {
    InventoryRead {
        source,
        observed_at: at(second),
        reinspection: None,
    }
}

fn in_band(second: i64, serial: &str) -> MachineInventorySpec {
    MachineInventorySpec {
        system: Some(SystemFacts {
            serial: Some(serial.into()),
            ..SystemFacts::empty(origin(FactSource::InBand, second))
        }),
        firmware: Some(FirmwareFacts {
            origin: origin(FactSource::InBand, second),
            mode: unbounded_api::Firmware::Uefi,
            secure_boot: Some(true),
        }),
        bmc: Some(BmcFacts {
            origin: origin(FactSource::InBand, second),
            suggested_address: Some("ipmi://10.40.0.17".into()),
            ipmi_lan: Some(IpmiLan {
                channel: 1,
                ip_address: "10.40.0.17".into(),
                ip_source: Some("dhcp".into()),
                mac: Some("b4:96:91:0a:1b:30".into()),
                vlan: None,
            }),
            redfish_host_interface: None,
        }),
        ..Default::default()
    }
}

fn redfish(second: i64) -> MachineInventorySpec {
    MachineInventorySpec {
        cpu: Some(CpuFacts {
            origin: origin(FactSource::Redfish, second),
            architecture: "x86_64".into(),
            model: None,
            sockets: 2,
            cores: 64,
            threads: 128,
            flags: Vec::new(),
        }),
        system: Some(SystemFacts {
            serial: Some("FROM-BMC".into()),
            ..SystemFacts::empty(origin(FactSource::Redfish, second))
        }),
        ..Default::default()
    }
}

async fn machine(client: &kube::Client, name: &str) -> Machine {
    let object: Machine = serde_json::from_value(serde_json::json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name},
        "spec": {"provider": "manual"},
    }))
    .unwrap();
    Api::<Machine>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

/// A client acting as `machine`'s agent, with the role the controller gives it.
async fn agent_client(cp: &LocalControlPlane, admin: &kube::Client, machine: &str) -> kube::Client {
    let access = AgentAccess {
        machine: machine.into(),
        node: machine.into(),
        versions: BTreeSet::new(),
        operations: BTreeSet::new(),
        self_refresh: false,
    };
    let name = format!("iw-agent:{machine}");
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        rules: Some(access.rules()),
        ..ClusterRole::default()
    };
    let params = PatchParams::apply("iw-test").force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(&name, &params, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: machine.into(),
            namespace: Some("unbounded-machines".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(&name, &params, &Patch::Apply(&binding))
        .await
        .unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:unbounded-machines:{machine}"
    ));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:unbounded-machines".into(),
        "system:authenticated".into(),
    ]);
    kube::Client::try_from(config).unwrap()
}

fn forbidden(result: Result<MachineInventory, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_and_the_bootserver_fold_reads_and_an_agent_writes_only_in_band_facts() {
    let cp = LocalControlPlane::shared().unwrap();
    let admin = cp.client().await.unwrap();
    let m = machine(&admin, "iw-one").await;
    let other = machine(&admin, "iw-other").await;
    let agent = agent_client(cp, &admin, "iw-one").await;
    // RBAC is cached by the authorizer's informer: wait until the role is seen.
    let inventories = Api::<MachineInventory>::all(agent.clone());
    for _ in 0..100 {
        match inventories.get_opt("iw-one").await {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }

    // The agent creates its inventory (no POST right: the apply path) with its read.
    let written = fold_into(
        &agent,
        &m,
        in_band(100, "IN-BAND"),
        record(FactSource::InBand, 100),
        "agent",
    )
    .await
    .unwrap();
    assert_eq!(
        written
            .bmc
            .as_ref()
            .and_then(|b| b.suggested_address.as_deref()),
        Some("ipmi://10.40.0.17")
    );
    assert_eq!(written.system.unwrap().serial.as_deref(), Some("IN-BAND"));

    // The bootserver's Redfish read: cpu filled, system replaced (the BMC outranks a report).
    let written = fold_into(
        &admin,
        &m,
        redfish(200),
        record(FactSource::Redfish, 200),
        "bootserver",
    )
    .await
    .unwrap();
    assert_eq!(
        written.cpu.as_ref().map(|c| c.origin.source),
        Some(FactSource::Redfish)
    );
    assert_eq!(
        written.system.as_ref().and_then(|s| s.serial.as_deref()),
        Some("FROM-BMC")
    );

    // The agent's next read: Redfish's sections kept, its contradiction recorded, both
    // records there.
    let written = fold_into(
        &agent,
        &m,
        in_band(300, "IN-BAND-2"),
        record(FactSource::InBand, 300),
        "agent",
    )
    .await
    .unwrap();
    assert_eq!(
        written.system.as_ref().and_then(|s| s.serial.as_deref()),
        Some("FROM-BMC")
    );
    assert_eq!(
        written
            .disagreements
            .iter()
            .map(|d| d.section.as_str())
            .collect::<Vec<_>>(),
        ["system"]
    );
    assert_eq!(written.cpu.as_ref().map(|c| c.threads), Some(128));
    assert_eq!(
        written.reads.iter().map(|r| r.source).collect::<Vec<_>>(),
        vec![FactSource::Redfish, FactSource::InBand]
    );

    // The agent may not forge the BMC's facts or its record.
    let mut forged = inventories.get("iw-one").await.unwrap();
    if let Some(cpu) = forged.spec.cpu.as_mut() {
        cpu.threads = 4096;
    }
    let message = forbidden(
        inventories
            .replace("iw-one", &PostParams::default(), &forged)
            .await,
    );
    assert!(message.contains("spec.cpu"), "{message}");
    // Nor pass its own BMC suggestion off as the BMC's word.
    let mut forged = inventories.get("iw-one").await.unwrap();
    if let Some(bmc) = forged.spec.bmc.as_mut() {
        bmc.origin = origin(FactSource::Redfish, 350);
    }
    let message = forbidden(
        inventories
            .replace("iw-one", &PostParams::default(), &forged)
            .await,
    );
    assert!(message.contains("spec.bmc"), "{message}");
    let mut forged = inventories.get("iw-one").await.unwrap();
    forged
        .spec
        .reads
        .retain(|r| r.source != FactSource::Redfish);
    let message = forbidden(
        inventories
            .replace("iw-one", &PostParams::default(), &forged)
            .await,
    );
    assert!(message.contains("read"), "{message}");
    // Nor replace a section the BMC read with one of its own, however it is tagged, nor
    // remove one.
    let mut own = inventories.get("iw-one").await.unwrap();
    if let Some(cpu) = own.spec.cpu.as_mut() {
        cpu.origin = origin(FactSource::InBand, 400);
    }
    let message = forbidden(
        inventories
            .replace("iw-one", &PostParams::default(), &own)
            .await,
    );
    assert!(message.contains("spec.cpu"), "{message}");
    let mut own = inventories.get("iw-one").await.unwrap();
    own.spec.system = None;
    let message = forbidden(
        inventories
            .replace("iw-one", &PostParams::default(), &own)
            .await,
    );
    assert!(message.contains("spec.system"), "{message}");

    // Nor write another Machine's inventory.
    let result = fold_into(
        &agent,
        &other,
        in_band(500, "X"),
        record(FactSource::InBand, 500),
        "agent",
    )
    .await;
    assert!(
        matches!(&result, Err(unbounded_runtime::inventory::InventoryWriteError::Kube { source: kube::Error::Api(s), .. }) if s.code == 403),
        "{result:?}"
    );
    assert!(
        Api::<MachineInventory>::all(admin.clone())
            .get_opt("iw-other")
            .await
            .unwrap()
            .is_none()
    );
}
