#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The PXE provider end to end on a real control plane: `provider: pxe` Machines with a
//! Redfish BMC (sushy-tools) and an IPMI BMC (ipmi_sim), each driving a libvirt VM, are
//! applied with `kubectl`; the provider powers them on with a one-time PXE boot and they boot
//! from the bootserver (Kubernetes backend) to the marker; `powerCycle` and `powerOff`
//! operations by selector work on both; deleting a Machine powers it off. Broken BMC set-ups
//! give conditions with clear messages, and no password appears in any status, Event or log.
//!
//! The controller (configuration resolution, operation routing) and the provider run in
//! this test's process; the bootserver binary serves DHCP, TFTP and HTTP in the test's
//! namespace. The provider is the process that holds the passwords, so this process's own
//! log (every crate at debug level, as `RUST_LOG=debug` would show it) is captured and
//! scanned; a decoy secret logged into the same capture shows that the scan sees it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kube::Api;
use unbounded_api::Machine;
use unbounded_pxe::power::Backoff;
use unbounded_pxe::provider::PowerSettings;
use unbounded_runtime::leader::Term;
use unbounded_testbed::bmc::{Domain, IpmiSim, Libvirtd, SushyEmulator, free_port};
use unbounded_testbed::cluster::LocalControlPlane;
use unbounded_testbed::netns::LoopbackForward;
use unbounded_testbed::qemu::marker_image;
use unbounded_testbed::testkit::{CapturedLog, kubectl_ok as kubectl, wait_until};

const PASSWORD: &str = "pr0vider-bmc-s3cret";
/// Logged on purpose from a provider task: the scan must find it, or it is blind.
const DECOY: &str = "decoy-s3cret-in-the-log";
const WRONG_PASSWORD: &str = "not-the-pr0vider-password";
const REDFISH_MAC: &str = "52:54:00:00:03:01";
const IPMI_MAC: &str = "52:54:00:00:03:02";
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// The secrets found in `text`.
fn leaked<'a>(text: &str, secrets: &[&'a str]) -> Vec<&'a str> {
    secrets
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect()
}

/// `jsonpath` of a cluster-scoped object, or empty.
fn get(cp: &LocalControlPlane, kind: &str, name: &str, path: &str) -> String {
    cp.kubectl_output(&["get", kind, name, "-o", &format!("jsonpath={path}")])
        .unwrap_or_default()
}

/// Waits until the Machine's `InfrastructureReady` condition has `reason` and `words`.
async fn wait_for_infrastructure_reason(
    cp: &LocalControlPlane,
    machine: &str,
    reason: &str,
    words: &str,
) {
    let path = "{.status.conditions[?(@.type==\"InfrastructureReady\")]}";
    wait_until(
        &format!("{machine}: {reason}"),
        Duration::from_secs(60),
        || async {
            let condition = get(cp, "machine", machine, path);
            condition.contains(reason) && condition.contains(words)
        },
    )
    .await;
}

fn machines_yaml(redfish: &str, ipmi: &str, closed_port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: pv-bmc, namespace: default}}
stringData: {{username: admin, password: {PASSWORD}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: pv-bmc-wrong, namespace: default}}
stringData: {{username: admin, password: {WRONG_PASSWORD}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: pv-bmc-nokey, namespace: default}}
stringData: {{username: admin}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: pv-marker}}
spec:
  machineSelector: {{matchLabels: {{lab: power}}}}
  template:
    boot: {{kernelURL: vmlinuz, initrdURL: initrd.img, kernelArgs: [console=ttyS0, unbounded.marker=hold]}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-redfish, labels: {{lab: power}}}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["{REDFISH_MAC}"]
    firmware: bios
    bmc: {{address: "{redfish}", credentialsSecretRef: {{namespace: default, name: pv-bmc}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-ipmi, labels: {{lab: power}}}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["{IPMI_MAC}"]
    firmware: bios
    bmc: {{address: "{ipmi}", credentialsSecretRef: {{namespace: default, name: pv-bmc}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-wrong-password}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:00:03:11"]
    bmc: {{address: "{redfish}", credentialsSecretRef: {{namespace: default, name: pv-bmc-wrong}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-no-secret}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:00:03:12"]
    bmc: {{address: "{redfish}", credentialsSecretRef: {{namespace: default, name: pv-absent}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-no-key}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:00:03:13"]
    bmc: {{address: "{redfish}", credentialsSecretRef: {{namespace: default, name: pv-bmc-nokey}}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: pv-unreachable}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:00:03:14"]
    bmc: {{address: "ipmi://127.0.0.1:{closed_port}", credentialsSecretRef: {{namespace: default, name: pv-bmc}}}}
"#
    )
}

fn operation_yaml(name: &str, operation: &str) -> String {
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineOperation
metadata: {{name: {name}}}
spec:
  machineSelector: {{matchLabels: {{lab: power}}}}
  operationName: {operation}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pxe_machines_are_powered_booted_cycled_and_powered_off_through_their_bmcs() {
    let own_log = CapturedLog::install("debug,ipmi_rs=warn");
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();

    // The controller and the PXE provider, in this process.
    tokio::spawn(unbounded_controller::runner::run(
        client.clone(),
        unbounded_controller::context::Settings::default(),
        Arc::new(unbounded_controller::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        )),
        std::future::pending(),
    ));
    let mut settings = PowerSettings {
        timeout: Duration::from_secs(3),
        graceful_shutdown: Duration::from_secs(3),
        backoff: Backoff {
            first: Duration::from_millis(200),
            max: Duration::from_secs(1),
            attempts: 2,
        },
        ..PowerSettings::default()
    };
    settings.loop_settings.poll = Duration::from_secs(3);
    settings.loop_settings.first_backoff = Duration::from_secs(2);
    settings.loop_settings.max_backoff = Duration::from_secs(10);
    tokio::spawn(unbounded_pxe::run(
        client.clone(),
        settings,
        Term::unbounded(),
    ));
    // The decoy, from another task of the runtime, under the provider's target.
    tokio::spawn(async {
        tracing::debug!(target: "unbounded_pxe::provider", "decoy credential {DECOY}");
    })
    .await
    .unwrap();

    // The provisioning network, the bootserver (Kubernetes backend) and the BMCs.
    let images = marker_image().unwrap();
    let ns = bridge_namespace("ubv");
    let _forward = LoopbackForward::new(&ns, 6443, &api_server_target(cp)).unwrap();
    let (_kubeconfig_dir, kubeconfig) = namespace_kubeconfig(cp);
    let config = bridge_config(&images, "backend: kubernetes\npower: {enabled: false}\n");
    let kubeconfig_env = kubeconfig.display().to_string();
    let bootserver =
        Bootserver::start_with_env(&ns, &config, &[("KUBECONFIG", kubeconfig_env.as_str())]);
    let libvirtd = Libvirtd::start(&ns).unwrap();
    let pid = std::process::id();
    let redfish_vm = Domain::define(&format!("ub-prf-{pid}"), REDFISH_MAC, "br0", false).unwrap();
    let ipmi_vm = Domain::define(&format!("ub-pipmi-{pid}"), IPMI_MAC, "br0", false).unwrap();
    let sushy = SushyEmulator::start("admin", PASSWORD).unwrap();
    let ipmi_sim = IpmiSim::start(&ipmi_vm.name, "admin", PASSWORD).unwrap();
    let redfish_address = format!(
        "redfish+http://127.0.0.1:{}/redfish/v1/Systems/{}",
        sushy.port, redfish_vm.uuid
    );
    let ipmi_address = format!("ipmi://127.0.0.1:{}", ipmi_sim.port);
    let logs = || {
        format!(
            "bootserver:\n{}\nsushy:\n{}\nipmi_sim:\n{}\nlibvirtd:\n{}",
            bootserver.log(),
            sushy.log(),
            ipmi_sim.log(),
            libvirtd.log()
        )
    };

    // Applied with kubectl: powered on with a one-time PXE boot, booted to the marker.
    let closed_port = free_port(true).unwrap();
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&machines_yaml(&redfish_address, &ipmi_address, closed_port)),
    );
    for (vm, machine) in [(&redfish_vm, "pv-redfish"), (&ipmi_vm, "pv-ipmi")] {
        let line = vm
            .wait_for("UNBOUNDED-MARKER", 1, BOOT_TIMEOUT)
            .unwrap_or_else(|e| panic!("{machine}: {e}\n{}", logs()));
        assert!(
            line.contains(&format!("unbounded.machine={machine}")),
            "{line}"
        );
        assert!(line.contains("unbounded.configuration=pv-marker"), "{line}");
        wait_until(
            &format!("{machine} reported on and ready"),
            Duration::from_secs(60),
            || async {
                get(cp, "machine", machine, "{.status.power}") == "On"
                    && get(
                        cp,
                        "machine",
                        machine,
                        "{.status.conditions[?(@.type==\"InfrastructureReady\")].status}",
                    ) == "True"
            },
        )
        .await;
    }

    // Broken BMC set-ups: conditions with clear messages.
    for (machine, reason, words) in [
        (
            "pv-wrong-password",
            "BmcAuthenticationFailed",
            "refused the credentials",
        ),
        (
            "pv-no-secret",
            "CredentialsMissing",
            "Secret default/pv-absent does not exist",
        ),
        ("pv-no-key", "CredentialsMissing", "pv-bmc-nokey has no key"),
        ("pv-unreachable", "BmcUnreachable", "ipmi://127.0.0.1"),
    ] {
        wait_for_infrastructure_reason(cp, machine, reason, words).await;
    }

    // Secrets changed afterwards are used without a restart (the provider reads them from a
    // watch): the missing key added and the missing Secret created, both with a password
    // the BMC refuses, so the reasons move on to the BMC's refusal.
    let late_secrets = ["pv-bmc-nokey", "pv-absent"]
        .map(|name| {
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\nstringData: {{username: admin, password: {WRONG_PASSWORD}}}\n"
            )
        })
        .join("---\n");
    kubectl(cp, &["apply", "-f", "-"], Some(&late_secrets));
    for machine in ["pv-no-key", "pv-no-secret"] {
        wait_for_infrastructure_reason(
            cp,
            machine,
            "BmcAuthenticationFailed",
            "refused the credentials",
        )
        .await;
    }

    // powerCycle by selector: both machines boot once more.
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&operation_yaml("pv-cycle", "powerCycle")),
    );
    wait_until("powerCycle complete", Duration::from_secs(120), || async {
        get(cp, "machineoperation", "pv-cycle", "{.status.state}") == "Complete"
    })
    .await;
    // The firmware started again: a second SeaBIOS banner (a full boot to the marker after
    // a cycle is the driver test's; two TCG guests booting at once on two cores are slow).
    for vm in [&redfish_vm, &ipmi_vm] {
        vm.wait_for("SeaBIOS (version", 2, BOOT_TIMEOUT)
            .unwrap_or_else(|e| panic!("after powerCycle: {e}\n{}", logs()));
    }

    // powerOff by selector: both off, and the status says so.
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&operation_yaml("pv-off", "powerOff")),
    );
    wait_until("powerOff complete", Duration::from_secs(120), || async {
        get(cp, "machineoperation", "pv-off", "{.status.state}") == "Complete"
    })
    .await;
    for (vm, machine) in [(&redfish_vm, "pv-redfish"), (&ipmi_vm, "pv-ipmi")] {
        assert_eq!(vm.state(), "shut off", "{machine}");
        wait_until(
            &format!("{machine} reported off"),
            Duration::from_secs(30),
            || async { get(cp, "machine", machine, "{.status.power}") == "Off" },
        )
        .await;
    }

    // Deleting a Machine powers it off: on again first, then delete.
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&operation_yaml("pv-on", "powerOn")),
    );
    wait_until("powerOn complete", Duration::from_secs(120), || async {
        get(cp, "machineoperation", "pv-on", "{.status.state}") == "Complete"
    })
    .await;
    assert_eq!(redfish_vm.state(), "running");
    assert_eq!(ipmi_vm.state(), "running");
    kubectl(
        cp,
        &["delete", "machine", "pv-redfish", "pv-ipmi", "--wait=false"],
        None,
    );
    let machines: Api<Machine> = Api::all(client.clone());
    wait_until("both Machines gone", Duration::from_secs(120), || async {
        machines.get_opt("pv-redfish").await.unwrap().is_none()
            && machines.get_opt("pv-ipmi").await.unwrap().is_none()
    })
    .await;
    assert_eq!(redfish_vm.state(), "shut off", "{}", logs());
    assert_eq!(ipmi_vm.state(), "shut off", "{}", logs());

    // No password anywhere a person or a log collector looks: the objects, the Events, the
    // bootserver's log and the log of this process, where the provider read the Secrets.
    let provider_log = own_log.text();
    // The capture holds the provider's own lines (a BMC that refused the credentials)...
    assert!(
        provider_log.contains("provider reconcile failed")
            && provider_log.contains("BmcAuthenticationFailed"),
        "the provider's log is captured:\n{provider_log}"
    );
    // ...and the scan finds a secret that was logged.
    assert_eq!(leaked(&provider_log, &[DECOY, PASSWORD]), [DECOY]);
    let everything = [
        kubectl(cp, &["get", "machines", "-o", "yaml"], None),
        kubectl(cp, &["get", "machineoperations", "-o", "yaml"], None),
        kubectl(cp, &["get", "events", "-A", "-o", "yaml"], None),
        bootserver.log(),
        provider_log,
    ]
    .join("\n");
    assert!(
        everything.contains("refused the credentials"),
        "the events are there"
    );
    let found = leaked(&everything, &[PASSWORD, WRONG_PASSWORD]);
    assert!(found.is_empty(), "{found:?} leaked:\n{everything}");

    kubectl(
        cp,
        &[
            "delete",
            "machines",
            "pv-wrong-password",
            "pv-no-secret",
            "pv-no-key",
            "pv-unreachable",
            "--wait=false",
        ],
        None,
    );
    kubectl(
        cp,
        &["delete", "machineoperations", "--all", "--wait=false"],
        None,
    );
}
