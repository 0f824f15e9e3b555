//! The Azure provider end to end: the `unbounded-azure` binary against a real control plane
//! (kube-apiserver with etcd, the controller in this process) and the local fake of Azure.
//! Machines applied with kubectl get a NIC and a VM whose custom data starts the agent,
//! reach InfrastructureReady with their providerID and addresses, survive throttling and a
//! failed long-running operation, report quota, authorization, invalid-parameter, not-found and
//! credential errors as conditions, run the power operations and `redeploy`, report a VM that
//! vanished instead of recreating it, and are deleted with their NIC and disk. The client
//! secret (and any token) appears in no log, Event or status.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::process::{AGENT_SHA, AGENT_URL, IDENTITY, ProviderProcess, get, kubectl};
use common::{CLIENT_ID, FakeAzure, Fault, TENANT, wait_until};
use kube::Api;
use unbounded_api::Machine;
use unbounded_testbed::cluster::LocalControlPlane;

const CLIENT_SECRET: &str = "acc3ptance-cl1ent-s3cret-value";
const WRONG_SECRET: &str = "n0t-the-acceptance-s3cret";
const SUB: &str = "5e0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
const SUBNET: &str = "/subscriptions/5e0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes";
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq7bqZ9sS0Wm7mFsJkZq0QJtqgS3D6p2mW1Zl3f7cuA ops@example";
const WAIT: Duration = Duration::from_secs(90);

fn ready(cp: &LocalControlPlane, machine: &str) -> String {
    get(
        cp,
        "machine",
        machine,
        "{.status.conditions[?(@.type==\"InfrastructureReady\")]}",
    )
}

fn vm_id(group: &str, name: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
}

fn machine(name: &str, group: &str, extra: &str) -> String {
    format!(
        r#"---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: {name}, labels: {{lab: azure}}}}
spec:
  provider: azure
  azure:
    subscriptionID: {SUB}
    resourceGroup: {group}
    location: westeurope
    subnetID: {SUBNET}
{extra}
"#
    )
}

fn manifests() -> String {
    let sp = "    credentialsSecretRef: {namespace: default, name: az-sp}\n";
    let image = "    image: {publisher: Debian, offer: debian-12, sku: 12-gen2}\n";
    let size = "    vmSize: Standard_D2s_v5\n";
    let key = format!("    sshPublicKey: \"{SSH_KEY}\"\n");
    let mut all = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: az-sp, namespace: default}}
stringData: {{tenantID: {TENANT}, clientID: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: az-sp-wrong, namespace: default}}
stringData: {{tenantID: {TENANT}, clientID: {CLIENT_ID}, clientSecret: {WRONG_SECRET}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: az-ssh, namespace: default}}
stringData: {{ssh-publickey: "{SSH_KEY}"}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: az-nodes}}
spec:
  machineSelector: {{matchLabels: {{lab: azure}}}}
  template:
    kubernetes: {{version: v1.35.4}}
"#
    );
    let tags = "    tags: {team: infra}\n";
    all += &machine(
        "az-web",
        "rg-nodes",
        &format!("{sp}{image}{size}{key}{tags}"),
    );
    all += &machine(
        "az-fail",
        "rg-nodes",
        &format!("{sp}{image}{size}    sshKeySecretRef: {{namespace: default, name: az-ssh}}\n"),
    );
    all += &machine("az-slow", "rg-nodes", &format!("{sp}{image}{size}{key}"));
    all += &machine(
        "az-quota",
        "rg-nodes",
        &format!("{sp}{image}    vmSize: Standard_NC96ads_A100_v4\n{key}"),
    );
    all += &machine("az-denied", "rg-denied", &format!("{sp}{image}{size}{key}"));
    all += &machine(
        "az-badimage",
        "rg-nodes",
        &format!(
            "{sp}    image: {{publisher: Debian, offer: debian-12, sku: no-such-sku}}\n{size}{key}"
        ),
    );
    all += &machine(
        "az-nogroup",
        "rg-absent",
        &format!("{sp}{image}{size}{key}"),
    );
    all += &machine(
        "az-badsecret",
        "rg-nodes",
        &format!(
            "    credentialsSecretRef: {{namespace: default, name: az-sp-wrong}}\n{image}{size}{key}"
        ),
    );
    all += &machine(
        "az-nosecret",
        "rg-nodes",
        &format!(
            "    credentialsSecretRef: {{namespace: default, name: az-absent}}\n{image}{size}{key}"
        ),
    );
    all
}

/// The credentials in az-web's custom data: the agent's token reads its own Machine and
/// renews itself (TokenRequest on its own ServiceAccount), and nothing else; the bootstrap
/// token is a Secret of Unbounded's bootstrap group.
fn first_credentials_reach_only_their_own_machine(cp: &LocalControlPlane, custom: &str) {
    let doc: serde_json::Value =
        serde_saphyr::from_str(custom.strip_prefix("#cloud-config\n").unwrap()).unwrap();
    let file = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == unbounded_api::agent::CREDENTIALS_FILE)
        .expect("a credentials file in the custom data");
    assert_eq!(file["permissions"], "0600");
    let credentials: unbounded_api::agent::Credentials =
        serde_json::from_str(file["content"].as_str().unwrap()).unwrap();
    assert_eq!(credentials.server, cp.server_url());
    assert_eq!(credentials.lifetime_seconds, 86_400);
    assert!(
        credentials
            .certificate_authority
            .contains("BEGIN CERTIFICATE")
    );
    let as_agent = |args: &[&str]| {
        let out = Command::new(&cp.binaries().kubectl)
            .args(["--server", cp.server_url(), "--token", &credentials.token])
            .args([
                "--certificate-authority",
                &cp.data_dir().join("pki/ca.crt").display().to_string(),
            ])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = as_agent(&["get", "machine", "az-web", "-o", "name"]);
    assert!(ok, "the agent reads its own Machine: {out}");
    let (ok, out) = as_agent(&["create", "token", "-n", "unbounded-machines", "az-web"]);
    assert!(
        ok && out.trim().len() > 100,
        "the agent renews its own token: {out}"
    );
    let (ok, out) = as_agent(&["create", "token", "-n", "unbounded-machines", "az-fail"]);
    assert!(!ok && out.contains("forbidden"), "not another's: {out}");
    let (ok, out) = as_agent(&["get", "machine", "az-fail"]);
    assert!(
        !ok && out.contains("forbidden"),
        "nor another Machine: {out}"
    );
    let bootstrap = credentials.bootstrap_token.expect("a bootstrap token");
    let (id, _) = bootstrap.split_once('.').unwrap();
    let groups = get_ns(
        cp,
        "kube-system",
        &format!("secret/bootstrap-token-{id}"),
        "{.data.auth-extra-groups}",
    );
    let groups = base64::engine::general_purpose::STANDARD
        .decode(groups)
        .unwrap();
    assert_eq!(groups, b"system:bootstrappers:unbounded");
}

fn get_ns(cp: &LocalControlPlane, namespace: &str, object: &str, path: &str) -> String {
    kubectl(
        cp,
        &[
            "get",
            "-n",
            namespace,
            object,
            "-o",
            &format!("jsonpath={path}"),
        ],
        None,
    )
}

fn operation(name: &str, machine: &str, operation: &str, parameters: &str) -> String {
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineOperation
metadata: {{name: {name}}}
spec:
  machineRef: {{name: {machine}}}
  operationName: {operation}
  parameters: {{{parameters}}}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_machines_are_created_operated_reported_and_deleted() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    // The agents' namespace: the controller creates each Machine's ServiceAccount there
    // before the provider mints the VM's first credentials.
    let namespace = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/namespace.yaml");
    kubectl(cp, &["apply", "--server-side", "-f", namespace], None);
    tokio::spawn(unbounded_controller::runner::run(
        client.clone(),
        unbounded_controller::context::Settings::default(),
        Arc::new(unbounded_controller::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        )),
        std::future::pending(),
    ));

    let fake = FakeAzure::start().await;
    fake.with(|s| {
        s.client_secrets.insert(CLIENT_SECRET.into());
        for group in ["rg-nodes", "rg-denied"] {
            s.groups.insert(format!("{SUB}/{group}"));
        }
        s.denied_groups.insert(format!("{SUB}/rg-denied"));
        s.subnets.insert(SUBNET.to_ascii_lowercase());
        s.quota_exhausted_sizes
            .insert("Standard_NC96ads_A100_v4".into());
        s.unknown_skus.insert("no-such-sku".into());
    });
    // Throttling on az-web's VM, a failed operation on az-fail's, one that never ends on
    // az-slow's.
    fake.add_fault(Fault::Throttle {
        method: "PUT",
        fragment: "virtualMachines/az-web".into(),
        times: 2,
        retry_after: 1,
    });
    fake.add_fault(Fault::FailOperation {
        method: "PUT",
        fragment: "virtualMachines/az-fail".into(),
        times: 1,
        code: "AllocationFailed".into(),
        message: "Allocation failed. We do not have sufficient capacity for the requested VM size in this region.".into(),
    });
    fake.add_fault(Fault::StallOperation {
        method: "PUT",
        fragment: "virtualMachines/az-slow".into(),
        times: 1,
    });
    let provider = ProviderProcess::start(cp, &fake);
    let logs = || format!("provider log:\n{}", provider.log());
    // It acts as the leader of its Lease.
    wait_until("the provider to lead", WAIT, logs, || async {
        get(
            cp,
            "lease",
            "unbounded-azure-provider",
            "{.spec.holderIdentity}",
        ) == IDENTITY
    })
    .await;

    kubectl(cp, &["apply", "-f", "-"], Some(&manifests()));

    // az-web: created through throttling, ready with its provider ID and address.
    let web_id = vm_id("rg-nodes", "az-web");
    wait_until("az-web ready", WAIT, logs, || async {
        ready(cp, "az-web").contains("\"status\":\"True\"")
    })
    .await;
    assert_eq!(
        get(cp, "machine", "az-web", "{.spec.providerID}"),
        format!("azure://{web_id}")
    );
    wait_until(
        "az-web reported on with its address",
        WAIT,
        logs,
        || async {
            get(cp, "machine", "az-web", "{.status.power}") == "On"
                && get(cp, "machine", "az-web", "{.status.addresses[0].address}")
                    .starts_with("10.1.0.")
        },
    )
    .await;
    assert!(ready(cp, "az-web").contains("VM az-web: provisioning Succeeded, power running"));
    let puts = fake.requests_to("PUT", "virtualMachines/az-web");
    let statuses: Vec<u16> = puts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 201], "throttled twice, then created");
    let vm = &puts[2].body;
    let custom = base64::engine::general_purpose::STANDARD
        .decode(
            vm["properties"]["osProfile"]["customData"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let custom = String::from_utf8(custom).unwrap();
    for words in [
        "#cloud-config",
        "UNBOUNDED_MACHINE=az-web",
        "UNBOUNDED_BOOTSERVER_URL=http://192.0.2.1:8080",
        &format!("UNBOUNDED_PROVIDER_ID=azure://{web_id}"),
        "ExecStart=/usr/local/bin/unbounded-agent\n",
        unbounded_api::agent::CREDENTIALS_FILE,
        AGENT_URL,
        AGENT_SHA,
        "systemctl",
    ] {
        assert!(
            custom.contains(words),
            "custom data lacks {words:?}:\n{custom}"
        );
    }
    first_credentials_reach_only_their_own_machine(cp, &custom);
    assert_eq!(vm["tags"]["unbounded-machine"], "az-web");
    assert_eq!(vm["tags"]["unbounded-cluster"], "acceptance");
    assert_eq!(vm["tags"]["team"], "infra");
    assert_eq!(
        vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"],
        SSH_KEY
    );
    let nic = &fake.requests_to("PUT", "networkInterfaces/az-web-nic")[0].body;
    assert_eq!(
        nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"],
        SUBNET
    );
    assert!(
        provider.log().contains("Azure throttled the request (429)"),
        "{}",
        logs()
    );

    // az-fail: the failed operation is a clear condition (and Event), then the next try works.
    wait_until("az-fail's failure reported", WAIT, logs, || async {
        let events = kubectl(
            cp,
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                "involvedObject.name=az-fail",
                "-o",
                "yaml",
            ],
            None,
        );
        events.contains("AzureOperationFailed") && events.contains("AllocationFailed")
    })
    .await;
    wait_until("az-fail ready after the retry", WAIT, logs, || async {
        ready(cp, "az-fail").contains("\"status\":\"True\"")
    })
    .await;

    // Clear conditions for what cannot work.
    for (machine, reason, words) in [
        (
            "az-slow",
            "AzureOperationTimedOut",
            "still running after 8 s",
        ),
        (
            "az-quota",
            "AzureQuotaExceeded",
            "OperationNotAllowed: Operation could not be completed as it results in exceeding approved",
        ),
        (
            "az-denied",
            "AzureAuthorizationFailed",
            "AuthorizationFailed: The client",
        ),
        (
            "az-badimage",
            "AzureInvalidParameter",
            "InvalidParameter: The value of parameter imageReference.sku is invalid",
        ),
        (
            "az-nogroup",
            "AzureNotFound",
            "ResourceGroupNotFound: Resource group 'rg-absent' could not be found",
        ),
        ("az-badsecret", "AzureAuthenticationFailed", "AADSTS7000215"),
        (
            "az-nosecret",
            "CredentialsMissing",
            "Secret default/az-absent does not exist",
        ),
    ] {
        wait_until(&format!("{machine}: {reason}"), WAIT, logs, || async {
            let condition = ready(cp, machine);
            condition.contains(&format!("\"reason\":\"{reason}\""))
                && condition.contains("\"status\":\"False\"")
                && condition.contains(words)
        })
        .await;
    }

    // Of those, only the request Azure refuses as specified is terminal: the Machine is
    // Failed with its reason; the others stay conditions and are retried.
    wait_until("az-badimage Failed", WAIT, logs, || async {
        get(
            cp,
            "machine",
            "az-badimage",
            "{.status.failureReason}/{.status.phase}",
        ) == "AzureInvalidParameter/Failed"
    })
    .await;
    for machine in [
        "az-slow",
        "az-quota",
        "az-denied",
        "az-nogroup",
        "az-badsecret",
    ] {
        let failed = get(
            cp,
            "machine",
            machine,
            "{.status.failureReason}{.status.phase}",
        );
        assert!(
            !failed.contains("Failed") && !failed.starts_with("Azure"),
            "{machine}: {failed}"
        );
    }

    // Power operations and redeploy on az-web.
    let cases = [
        ("az-off", "powerOff", "", "/powerOff", "Off"),
        (
            "az-dealloc",
            "powerOff",
            "deallocate: \"true\"",
            "/deallocate",
            "Off",
        ),
        ("az-on", "powerOn", "", "/start", "On"),
        ("az-cycle", "powerCycle", "", "/restart", "On"),
        ("az-redeploy", "redeploy", "", "/redeploy", "On"),
    ];
    for (name, op, parameters, action, power) in cases {
        kubectl(
            cp,
            &["apply", "-f", "-"],
            Some(&operation(name, "az-web", op, parameters)),
        );
        wait_until(&format!("{name} complete"), WAIT, logs, || async {
            get(cp, "machineoperation", name, "{.status.state}") == "Complete"
        })
        .await;
        assert_eq!(
            fake.requests_to("POST", &format!("virtualMachines/az-web{action}"))
                .len(),
            1,
            "{name}"
        );
        wait_until(&format!("{name}: power {power}"), WAIT, logs, || async {
            get(cp, "machine", "az-web", "{.status.power}") == power
        })
        .await;
    }
    let message = get(cp, "machineoperation", "az-dealloc", "{.status.message}");
    assert!(
        message.contains("deallocate") && message.contains("power deallocated"),
        "{message}"
    );

    // The VM vanishes behind the operator's back: reported, not recreated.
    fake.remove(&web_id).unwrap();
    wait_until("az-web reported gone", WAIT, logs, || async {
        let condition = ready(cp, "az-web");
        condition.contains("\"reason\":\"VmNotFound\"")
            && condition.contains("deleted outside Unbounded")
    })
    .await;
    let puts_before = fake.requests_to("PUT", "virtualMachines/az-web").len();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        fake.requests_to("PUT", "virtualMachines/az-web").len(),
        puts_before,
        "the VM was not recreated"
    );
    assert!(ready(cp, "az-web").contains("VmNotFound"));

    // No secret and no token anywhere a person or a log collector looks.
    let everything = [
        kubectl(cp, &["get", "machines", "-o", "yaml"], None),
        kubectl(cp, &["get", "machineoperations", "-o", "yaml"], None),
        kubectl(cp, &["get", "events", "-A", "-o", "yaml"], None),
        provider.log(),
    ]
    .join("\n");
    assert!(
        everything.contains("AADSTS7000215"),
        "the auth failure is reported"
    );
    for secret in [CLIENT_SECRET, WRONG_SECRET, "fake-arm-token-"] {
        assert!(
            !everything.contains(secret),
            "{secret} leaked:\n{everything}"
        );
    }

    // Deleting: az-fail's VM, NIC and disk; az-web's leftover NIC and disk; az-quota's NIC
    // (its VM never existed); az-denied waits until the identity may delete.
    let machines: Api<Machine> = Api::all(client.clone());
    kubectl(
        cp,
        &["delete", "machines", "-l", "lab=azure", "--wait=false"],
        None,
    );
    for name in [
        "az-fail",
        "az-web",
        "az-quota",
        "az-slow",
        "az-badimage",
        "az-nogroup",
        "az-badsecret",
        "az-nosecret",
    ] {
        wait_until(&format!("{name} deleted"), WAIT, logs, || async {
            machines.get_opt(name).await.unwrap().is_none()
        })
        .await;
    }
    for (fragment, expected) in [
        ("virtualMachines/az-fail", 202),
        ("networkInterfaces/az-fail-nic", 204),
        ("disks/az-fail-osdisk", 204),
        ("virtualMachines/az-web", 204),
        ("networkInterfaces/az-web-nic", 202),
        ("disks/az-web-osdisk", 202),
        ("networkInterfaces/az-quota-nic", 202),
    ] {
        let deletes = fake.requests_to("DELETE", fragment);
        assert!(
            deletes.iter().any(|r| r.status == expected),
            "DELETE {fragment}: {:?}",
            deletes.iter().map(|r| r.status).collect::<Vec<_>>()
        );
    }
    assert!(machines.get_opt("az-denied").await.unwrap().is_some());
    assert!(
        ready(cp, "az-denied").contains("AuthorizationFailed")
            || provider.log().contains("AuthorizationFailed")
    );
    fake.with(|s| s.denied_groups.clear());
    wait_until("az-denied deleted once permitted", WAIT, logs, || async {
        machines.get_opt("az-denied").await.unwrap().is_none()
    })
    .await;
    assert!(
        fake.resource_ids().is_empty(),
        "everything was released: {:?}",
        fake.resource_ids()
    );
    let log = provider.log();
    for secret in [CLIENT_SECRET, WRONG_SECRET, "fake-arm-token-"] {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
    kubectl(
        cp,
        &["delete", "machineoperations", "--all", "--wait=false"],
        None,
    );
}
