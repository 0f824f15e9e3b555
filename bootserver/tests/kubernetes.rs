#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The Kubernetes backend against a real API server: a `provider: pxe` Machine and its
//! resolved configuration version become a DHCP reservation and an iPXE script; when the API
//! server goes away (every connection cut), the cached machines keep booting and the PXE
//! provider stops leading; when it is back, the bootserver catches up.
//!
//! The bootserver runs in the test's namespace and reaches the local API server on the host's
//! loopback through a forwarder. The test writes the Machine's `status.configuration` and the
//! version itself (the controller's part, tested in the controller's crate).

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use unbounded_api::{Machine, MachineConfigurationVersion};
use unbounded_testbed::cluster::LocalControlPlane;
use unbounded_testbed::netns::{Link, LoopbackForward};

/// Waits up to 30 s for `check`.
fn wait_until(what: &str, check: impl FnMut() -> bool) {
    unbounded_testbed::testkit::wait_until_blocking(what, Duration::from_secs(30), check);
}

fn script(link: &Link, mac: &str) -> String {
    let out = link
        .client
        .exec(&[
            "curl",
            "-s",
            &format!("http://{SERVER}:8080/boot.ipxe?mac={mac}"),
        ])
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_from_the_cluster_get_addresses_and_scripts_and_survive_an_api_outage() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let link = Link::new("10.99.0.1/24", "52:54:00:00:0b:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();

    // The API server as the bootserver's namespace sees it.
    let forward = LoopbackForward::new(&link.server, 6443, &api_server_target(cp)).unwrap();
    let (_kubeconfig_dir, kubeconfig) = namespace_kubeconfig(cp);

    let images = fake_images();
    let config = full_config(images.path(), "").replace(
        "serverAddress: 10.99.0.1\n",
        "serverAddress: 10.99.0.1\nbackend: kubernetes\n",
    );
    let config = config[..config.find("machines:").unwrap()].to_owned();
    let kubeconfig_env = kubeconfig.display().to_string();
    // The PXE provider elects its leader as in a cluster (a short lease, in `default`).
    let server = Bootserver::start_with_env(
        &link.server,
        &config,
        &[
            ("KUBECONFIG", kubeconfig_env.as_str()),
            ("POD_NAME", "kb-bootserver"),
            ("UNBOUNDED_LEADER_ELECTION_NAMESPACE", "default"),
            ("UNBOUNDED_LEADER_ELECTION_LEASE_DURATION", "6s"),
            ("UNBOUNDED_LEADER_ELECTION_RENEW_DEADLINE", "4s"),
            ("UNBOUNDED_LEADER_ELECTION_RETRY_PERIOD", "1s"),
        ],
    );
    wait_until("the machine caches to sync", || {
        link.server
            .exec(&["curl", "-sf", &format!("http://{SERVER}:8080/readyz")])
            .is_ok()
    });
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let holder = || async {
        leases
            .get_opt("unbounded-pxe-provider")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder().await.as_deref() != Some("kb-bootserver") {
        assert!(
            Instant::now() < deadline,
            "the PXE provider never took its Lease:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(server.log().contains("became leader"), "{}", server.log());

    let versions: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let version: MachineConfigurationVersion = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfigurationVersion",
        "metadata": {"name": "kb-general-v1"},
        "spec": {"configurationName": "kb-general", "version": 1, "template": {
            "boot": {"kernelURL": "vmlinuz", "initrdURL": "initrd.img", "kernelArgs": ["console=ttyS0"]}}},
    }))
    .unwrap();
    versions
        .create(&PostParams::default(), &version)
        .await
        .unwrap();
    let machines: Api<Machine> = Api::all(client.clone());
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": "kb-node-1"},
        "spec": {"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:0b:01"], "ipv4": "10.99.0.31", "firmware": "bios"}},
    }))
    .unwrap();
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();

    // Known but not resolved yet: a script that says so and exits.
    wait_until("the Machine in the cache", || {
        script(&link, "52:54:00:00:0b:01").contains("no boot target yet")
    });
    machines
        .patch_status(
            "kb-node-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"configuration": {"name": "kb-general", "version": 1}}}),
            ),
        )
        .await
        .unwrap();
    wait_until("the resolved version in the script", || {
        script(&link, "52:54:00:00:0b:01")
            .contains("unbounded.configuration=kb-general unbounded.version=1")
    });
    let text = script(&link, "52:54:00:00:0b:01");
    assert!(
        text.contains(&format!(
            "kernel http://{SERVER}:8080/images/vmlinuz initrd=initrd unbounded.machine=kb-node-1"
        )),
        "{text}"
    );

    // DHCP: the Machine's reservation and its Node name.
    link.client.ip(&["addr", "flush", "dev", "eth0"]).unwrap();
    let (env, out) = udhcpc(&link.client, &[]);
    assert_eq!(
        get(&env, "ip"),
        Some("10.99.0.31"),
        "{out}\n{}",
        server.log()
    );
    assert_eq!(get(&env, "hostname"), Some("kb-node-1"));

    // The API server goes away, established connections (the watches) included. Once the
    // bootserver has noticed (its watch fails to reconnect, and its PXE provider, which can
    // no longer renew its Lease, stops), the cache keeps answering.
    let watch_errors = |log: &str| {
        log.lines()
            .filter(|l| l.contains("watch error; retrying") && l.contains("Machine"))
            .count()
    };
    let errors_before = watch_errors(&server.log());
    drop(forward);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = server.log();
        if watch_errors(&log) > errors_before && log.contains("stopped leading") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bootserver did not notice the outage within 30 s:\n{}",
            log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (env, out) = udhcpc(&link.client, &[]);
    assert_eq!(get(&env, "ip"), Some("10.99.0.31"), "{out}");
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let text = script(&link, "52:54:00:00:0b:01");
    assert!(
        text.contains("unbounded.configuration=kb-general unbounded.version=1"),
        "{text}"
    );

    // Back, and the Machine deleted: the bootserver forgets it, and its provider leads again.
    let leading_before = server.log().matches("became leader").count();
    let _forward = LoopbackForward::new(&link.server, 6443, &api_server_target(cp)).unwrap();
    machines
        .delete("kb-node-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the deleted Machine to be forgotten", || {
        script(&link, "52:54:00:00:0b:01").contains("belongs to no Machine")
    });
    wait_until("the PXE provider to lead again", || {
        server.log().matches("became leader").count() > leading_before
    });
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}

async fn events_of(client: &kube::Client, machine: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(machine)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// Two Machines claim one MAC: the one created first keeps it, whatever their names and
/// however often the bootserver restarts, and both get a Warning Event.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicated_mac_goes_to_the_oldest_machine_and_both_hear_of_it() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let mac = "52:54:00:00:0d:01";
    let link = Link::new("10.99.0.1/24", mac).unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let _forward = LoopbackForward::new(&link.server, 6443, &api_server_target(cp)).unwrap();
    let (_kubeconfig_dir, kubeconfig) = namespace_kubeconfig(cp);
    let images = fake_images();
    let config = full_config(images.path(), "").replace(
        "serverAddress: 10.99.0.1\n",
        "serverAddress: 10.99.0.1\nbackend: kubernetes\npower: {enabled: false}\n",
    );
    let config = config[..config.find("machines:").unwrap()].to_owned();
    let kubeconfig_env = kubeconfig.display().to_string();

    let machines: Api<Machine> = Api::all(client.clone());
    let machine = |name: &str| -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": name},
            "spec": {"provider": "pxe", "pxe": {"macAddresses": [mac], "firmware": "bios"}},
        }))
        .unwrap()
    };
    // The older one sorts last by name: a first-by-name rule would pick the other.
    machines
        .create(&PostParams::default(), &machine("kb-dup-z-old"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // creationTimestamp has seconds
    machines
        .create(&PostParams::default(), &machine("kb-dup-a-new"))
        .await
        .unwrap();

    let mut server = Bootserver::start_with_env(
        &link.server,
        &config,
        &[("KUBECONFIG", kubeconfig_env.as_str())],
    );
    for round in 0..2 {
        wait_until("the cache to hold the Machines", || {
            script(&link, mac).contains("machine kb-dup-")
        });
        let text = script(&link, mac);
        assert!(
            text.contains("machine kb-dup-z-old "),
            "round {round}: {text}\n{}",
            server.log()
        );
        server.crash_and_restart(&link.server);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in ["kb-dup-z-old", "kb-dup-a-new"] {
        loop {
            let notes = events_of(&client, name, "DuplicateMACAddress").await;
            if let Some(note) = notes.first() {
                assert!(
                    note.contains("kb-dup-z-old (created first) keeps it"),
                    "{note}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no DuplicateMACAddress Event on {name}:\n{}",
                server.log()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    for name in ["kb-dup-z-old", "kb-dup-a-new"] {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// A deleted Machine whose Node still exists waits without backing off, and is released
/// the moment its Node goes: the provider loop watches Nodes. The loop's own retry is set
/// far longer than the bound here, so only the Node watch can meet it.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_machine_is_released_as_soon_as_its_node_goes() {
    use k8s_openapi::api::core::v1::Node;
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let mut settings = unbounded_pxe::provider::PowerSettings::default();
    settings.loop_settings.first_backoff = Duration::from_secs(300);
    settings.loop_settings.wait = Duration::from_secs(300);
    let provider = tokio::spawn(unbounded_pxe::run(
        client.clone(),
        settings,
        unbounded_runtime::leader::Term::unbounded(),
    ));

    let name = "kb-wait-1";
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let machines: Api<Machine> = Api::all(client.clone());
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name},
        "spec": {"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:0e:01"], "firmware": "bios"}},
    }))
    .unwrap();
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    // The provider takes it (its finalizer), fails to create it (no BMC), and backs off.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = machines.get(name).await.unwrap();
        if !m.metadata.finalizers.unwrap_or_default().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the provider never took the Machine"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    machines
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    // The deletion is seen and waits for the Node (a reconcile happens at once on the
    // update; give it time to run and requeue).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        machines.get_opt(name).await.unwrap().is_some(),
        "released while its Node still existed"
    );
    nodes.delete(name, &DeleteParams::default()).await.unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while machines.get_opt(name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the Machine was not released within 30 s of its Node going (its retry is 300 s)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "released {:.1} s after the Node went",
        started.elapsed().as_secs_f64()
    );
    provider.abort();
}
