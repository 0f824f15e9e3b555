//! The Azure Resource Manager client and the credentials against the local fake of Azure
//! (identity platform + Resource Manager over TLS): long-running operations that succeed, fail
//! or never end; throttling with Retry-After and the remaining-requests headers; transient
//! failures; Azure's errors classified; deletes that find nothing; client-secret and
//! workload-identity tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use clap::Parser;
use common::{CLIENT_ID, FakeAzure, Fault, TENANT};
use serde_json::{Value, json};
use unbounded_azure::arm::{ArmClient, Credential, LroPolicy};
use unbounded_azure::config::{Flags, Settings};
use unbounded_azure::credentials::IdentityOptions;
use unbounded_azure::error::ArmError;
use unbounded_azure::retry::RetryPolicy;

const SECRET: &str = "arm-test-cl1ent-s3cret";
const SUB: &str = "0b1f6471-1bf0-4dda-aec3-111122223333";
const GROUP: &str = "/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/rg-arm";
const SUBNET: &str = "/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes";

struct Setup {
    fake: FakeAzure,
    arm: ArmClient,
    credential: Credential,
    options: IdentityOptions,
}

async fn setup(attempts: u32, timeout_seconds: u64) -> Setup {
    let fake = FakeAzure::start().await;
    fake.with(|s| {
        s.client_secrets.insert(SECRET.into());
        s.groups.insert(format!("{SUB}/rg-arm"));
        s.groups.insert(format!("{SUB}/rg-denied"));
        s.denied_groups.insert(format!("{SUB}/rg-denied"));
        s.subnets.insert(SUBNET.to_ascii_lowercase());
        s.quota_exhausted_sizes
            .insert("Standard_NC96ads_A100_v4".into());
    });
    let ca = fake.ca_file.display().to_string();
    let flags = Flags::try_parse_from([
        "unbounded-azure",
        "--cluster-name",
        "arm-test",
        "--api-server-url",
        "https://192.0.2.1:6443",
        "--cluster-ca-file",
        &ca,
        "--identity",
        "none",
        "--arm-endpoint",
        &fake.origin,
        "--authority-host",
        &fake.origin,
        "--extra-ca-file",
        &ca,
    ])
    .unwrap();
    let settings = Settings::from_flags(&flags, false).unwrap();
    let http = unbounded_azure::http_client(&settings).unwrap();
    let arm = ArmClient::new(
        http.clone(),
        settings.arm_endpoint.clone(),
        RetryPolicy {
            attempts,
            first_backoff: Duration::from_millis(200),
            ..RetryPolicy::default()
        },
        LroPolicy {
            poll: Duration::from_secs(1),
            max_poll: Duration::from_secs(2),
            timeout: Duration::from_secs(timeout_seconds),
        },
    );
    let options = IdentityOptions::new(http, &settings.authority_host);
    let credential = options
        .client_secret(TENANT, CLIENT_ID, SECRET.into())
        .unwrap();
    Setup {
        fake,
        arm,
        credential,
        options,
    }
}

fn nic_body() -> Value {
    json!({"location": "westeurope", "properties": {"ipConfigurations": [{"name": "ipconfig1", "properties": {"subnet": {"id": SUBNET}}}]}})
}

fn vm_body(nic: &str, size: &str, sku: &str) -> Value {
    json!({
        "location": "westeurope",
        "properties": {
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {
                "imageReference": {"publisher": "Debian", "offer": "debian-12", "sku": sku, "version": "latest"},
                "osDisk": {"name": "vm1-osdisk", "createOption": "FromImage", "deleteOption": "Delete"},
            },
            "osProfile": {"computerName": "vm1", "adminUsername": "unbounded", "customData": "I2Nsb3VkLWNvbmZpZw==",
                "linuxConfiguration": {"disablePasswordAuthentication": true, "ssh": {"publicKeys": [{"path": "/home/unbounded/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAA"}]}}},
            "networkProfile": {"networkInterfaces": [{"id": nic, "properties": {"primary": true, "deleteOption": "Delete"}}]},
        },
    })
}

fn path(kind: &str, name: &str, version: &str) -> String {
    format!("{GROUP}/providers/{kind}/{name}?api-version={version}")
}

fn vm_path(name: &str) -> String {
    path("Microsoft.Compute/virtualMachines", name, "2024-07-01")
}

fn nic_path(name: &str) -> String {
    path("Microsoft.Network/networkInterfaces", name, "2024-05-01")
}

async fn create_vm(s: &Setup, name: &str) -> Result<Value, ArmError> {
    let nic_id = format!("{GROUP}/providers/Microsoft.Network/networkInterfaces/{name}-nic");
    s.arm
        .put(
            &s.credential,
            "creating NIC",
            &nic_path(&format!("{name}-nic")),
            &nic_body(),
        )
        .await?;
    s.arm
        .put(
            &s.credential,
            "creating VM",
            &vm_path(name),
            &vm_body(&nic_id, "Standard_D2s_v5", "12-gen2"),
        )
        .await
}

#[tokio::test]
async fn writes_follow_their_long_running_operations() {
    let s = setup(3, 30).await;
    let vm = create_vm(&s, "vm1").await.unwrap();
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
    let polls = s.fake.requests_to("GET", "/operations/");
    assert!(
        polls.len() >= 2,
        "the NIC's and the VM's operations were polled: {polls:?}"
    );
    let viewed = s
        .arm
        .get(
            &s.credential,
            "reading VM",
            &format!("{}&$expand=instanceView", vm_path("vm1")),
        )
        .await
        .unwrap()
        .unwrap();
    let view = unbounded_azure::resources::VmView::of(&viewed);
    assert_eq!(view.power, unbounded_api::PowerState::On);

    // An action followed through Location: 202, then 200.
    s.arm
        .post(
            &s.credential,
            "powering off",
            &format!("{GROUP}/providers/Microsoft.Compute/virtualMachines/vm1/powerOff?api-version=2024-07-01"),
        )
        .await
        .unwrap();
    assert!(!s.fake.requests_to("GET", "/operationResults/").is_empty());
    let vm_id = format!("{GROUP}/providers/Microsoft.Compute/virtualMachines/vm1");
    assert_eq!(s.fake.resource(&vm_id).unwrap()["__power"], "stopped");

    // Deleting: the NIC is still in use by the VM; the VM goes (with its NIC and disk,
    // deleteOption Delete); deleting what is gone succeeds.
    let in_use = s
        .arm
        .delete(&s.credential, "deleting NIC", &nic_path("vm1-nic"))
        .await
        .unwrap_err();
    assert_eq!(in_use.reason(), "AzureInvalidParameter", "{in_use}");
    assert!(in_use.to_string().contains("NicInUse"), "{in_use}");
    s.arm
        .delete(&s.credential, "deleting VM", &vm_path("vm1"))
        .await
        .unwrap();
    assert!(
        s.fake.resource_ids().is_empty(),
        "{:?}",
        s.fake.resource_ids()
    );
    s.arm
        .delete(&s.credential, "deleting NIC", &nic_path("vm1-nic"))
        .await
        .unwrap();
    assert_eq!(
        s.fake
            .requests_to("DELETE", "vm1-nic")
            .last()
            .unwrap()
            .status,
        204
    );
    assert!(
        s.arm
            .get(&s.credential, "reading VM", &vm_path("vm1"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_failed_operation_carries_azures_code_and_message() {
    let s = setup(3, 30).await;
    s.fake.add_fault(Fault::FailOperation {
        method: "PUT",
        fragment: "virtualMachines/vm2".into(),
        times: 1,
        code: "AllocationFailed".into(),
        message: "Allocation failed. We do not have sufficient capacity for the requested VM size in this region.".into(),
    });
    let error = create_vm(&s, "vm2").await.unwrap_err();
    assert_eq!(error.reason(), "AzureOperationFailed");
    let text = error.to_string();
    assert!(
        text.contains("AllocationFailed") && text.contains("sufficient capacity"),
        "{text}"
    );
    // The PUT is idempotent: the next try provisions the same VM.
    let vm = create_vm(&s, "vm2").await.unwrap();
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
}

#[tokio::test]
async fn an_operation_that_never_ends_times_out() {
    let s = setup(3, 3).await;
    s.fake.add_fault(Fault::StallOperation {
        method: "PUT",
        fragment: "virtualMachines/vm3".into(),
        times: 1,
    });
    let error = create_vm(&s, "vm3").await.unwrap_err();
    assert_eq!(error.reason(), "AzureOperationTimedOut", "{error}");
    assert!(
        error.to_string().contains("still running after 3 s"),
        "{error}"
    );
}

#[tokio::test]
async fn throttling_waits_retry_after_then_gives_up_clearly() {
    let s = setup(3, 30).await;
    s.fake.add_fault(Fault::Throttle {
        method: "PUT",
        fragment: "networkInterfaces/thr-nic".into(),
        times: 2,
        retry_after: 1,
    });
    s.arm
        .put(
            &s.credential,
            "creating NIC",
            &nic_path("thr-nic"),
            &nic_body(),
        )
        .await
        .unwrap();
    let puts = s.fake.requests_to("PUT", "thr-nic");
    let statuses: Vec<u16> = puts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 201]);
    for pair in puts.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_millis(950),
            "Retry-After honoured: {gap:?}"
        );
    }
    s.fake.add_fault(Fault::Throttle {
        method: "PUT",
        fragment: "networkInterfaces/thr2-nic".into(),
        times: 10,
        retry_after: 1,
    });
    let error = s
        .arm
        .put(
            &s.credential,
            "creating NIC thr2-nic",
            &nic_path("thr2-nic"),
            &nic_body(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "AzureThrottled");
    assert_eq!(
        error.to_string(),
        "creating NIC thr2-nic: Azure Resource Manager throttled the request (429); Azure asked to retry after 1 s"
    );
    assert_eq!(
        s.fake.requests_to("PUT", "thr2-nic").len(),
        3,
        "three attempts"
    );
}

#[tokio::test]
async fn few_remaining_requests_slow_the_subscription_down() {
    let s = setup(3, 30).await;
    s.fake.add_fault(Fault::Remaining {
        method: "GET",
        fragment: "virtualMachines/paced".into(),
        times: 1,
        header: "x-ms-ratelimit-remaining-subscription-reads".into(),
        value: "3".into(),
    });
    for _ in 0..2 {
        s.arm
            .get(&s.credential, "reading VM", &vm_path("paced"))
            .await
            .unwrap();
    }
    let gets = s.fake.requests_to("GET", "virtualMachines/paced");
    let gap = gets[1].at.duration_since(gets[0].at);
    assert!(
        gap >= Duration::from_millis(950),
        "paused after a low count: {gap:?}"
    );
}

#[tokio::test]
async fn transient_failures_are_retried_with_backoff() {
    let s = setup(3, 30).await;
    s.fake.add_fault(Fault::Error {
        method: "GET",
        fragment: "virtualMachines/flaky".into(),
        times: 2,
        status: 503,
        code: "ServiceUnavailable".into(),
        message: "The service is temporarily unavailable.".into(),
    });
    assert!(
        s.arm
            .get(&s.credential, "reading VM flaky", &vm_path("flaky"))
            .await
            .unwrap()
            .is_none()
    );
    let statuses: Vec<u16> = s
        .fake
        .requests_to("GET", "virtualMachines/flaky")
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [503, 503, 404]);
    s.fake.add_fault(Fault::Error {
        method: "GET",
        fragment: "virtualMachines/down".into(),
        times: 10,
        status: 500,
        code: "InternalServerError".into(),
        message: "An internal error occurred.".into(),
    });
    let error = s
        .arm
        .get(&s.credential, "reading VM down", &vm_path("down"))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "AzureUnavailable");
    assert!(
        error.to_string().contains("500 InternalServerError"),
        "{error}"
    );
}

#[tokio::test]
async fn azure_errors_become_clear_reasons() {
    let s = setup(3, 30).await;
    let nic_id = format!("{GROUP}/providers/Microsoft.Network/networkInterfaces/e-nic");
    s.arm
        .put(
            &s.credential,
            "creating NIC",
            &nic_path("e-nic"),
            &nic_body(),
        )
        .await
        .unwrap();
    let missing_group = format!(
        "/subscriptions/{SUB}/resourceGroups/rg-gone/providers/Microsoft.Network/networkInterfaces/x?api-version=2024-05-01"
    );
    let denied = format!(
        "/subscriptions/{SUB}/resourceGroups/rg-denied/providers/Microsoft.Network/networkInterfaces/x?api-version=2024-05-01"
    );
    let cases: Vec<(String, Value, &str, &str)> = vec![
        (
            missing_group,
            nic_body(),
            "AzureNotFound",
            "ResourceGroupNotFound",
        ),
        (
            denied,
            nic_body(),
            "AzureAuthorizationFailed",
            "AuthorizationFailed",
        ),
        (
            vm_path("e1"),
            vm_body(&nic_id, "Standard_NC96ads_A100_v4", "12-gen2"),
            "AzureQuotaExceeded",
            "OperationNotAllowed",
        ),
        (
            vm_path("e2"),
            {
                s.fake
                    .with(|st| st.unknown_skus.insert("no-such-sku".into()));
                vm_body(&nic_id, "Standard_D2s_v5", "no-such-sku")
            },
            "AzureInvalidParameter",
            "imageReference.sku is invalid",
        ),
        (
            nic_path("e3-nic"),
            json!({"location": "westeurope", "properties": {"ipConfigurations": [{"name": "c", "properties": {"subnet": {"id": format!("{SUBNET}-absent")}}}]}}),
            "AzureNotFound",
            "InvalidResourceReference",
        ),
    ];
    for (path, body, reason, words) in cases {
        let error = s
            .arm
            .put(&s.credential, "writing", &path, &body)
            .await
            .unwrap_err();
        assert_eq!(error.reason(), reason, "{error}");
        assert!(error.to_string().contains(words), "{error}");
    }
}

#[tokio::test]
async fn tokens_from_a_client_secret_and_from_workload_identity() {
    let s = setup(3, 30).await;
    // A wrong secret: the identity platform's error, never the secret.
    let wrong = "the-wr0ng-cl1ent-secret";
    let credential = s
        .options
        .client_secret(TENANT, CLIENT_ID, wrong.into())
        .unwrap();
    let error = s
        .arm
        .get(&credential, "reading VM", &vm_path("x"))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "AzureAuthenticationFailed");
    let text = format!("{error} {error:?}");
    assert!(text.contains("AADSTS7000215"), "{text}");
    assert!(!text.contains(wrong), "{text}");

    // Workload identity: the federated service-account token from its file.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJ.federated.token").unwrap();
    s.fake
        .with(|st| st.federated_tokens.insert("eyJ.federated.token".into()));
    let workload = s
        .options
        .workload(
            Some(TENANT.into()),
            Some(CLIENT_ID.into()),
            Some(token_file),
        )
        .unwrap();
    assert!(
        s.arm
            .get(&workload, "reading VM", &vm_path("x"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.fake
            .requests_to("GET", "virtualMachines/x")
            .last()
            .unwrap()
            .status,
        404
    );
}
