#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The Kubernetes backend against a real API server: a `provider: pxe` Machine and its
//! resolved configuration version become a DHCP reservation and an iPXE script; when the API
//! server goes away, the cached machines keep booting.
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

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    let server = Bootserver::start_with_env(
        &link.server,
        &config,
        &[("KUBECONFIG", kubeconfig_env.as_str())],
    );
    wait_until("the machine caches to sync", || {
        link.server
            .exec(&["curl", "-sf", &format!("http://{SERVER}:8080/readyz")])
            .is_ok()
    });

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

    // The API server goes away: the cache keeps answering.
    drop(forward);
    let (env, out) = udhcpc(&link.client, &[]);
    assert_eq!(get(&env, "ip"), Some("10.99.0.31"), "{out}");

    // Back, and the Machine deleted: the bootserver forgets it.
    let _forward = LoopbackForward::new(&link.server, 6443, &api_server_target(cp)).unwrap();
    machines
        .delete("kb-node-1", &DeleteParams::default())
        .await
        .unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    wait_until("the deleted Machine to be forgotten", || {
        script(&link, "52:54:00:00:0b:01").contains("belongs to no Machine")
    });
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}
