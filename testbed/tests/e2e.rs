#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The whole flow on QEMU, as shipped: `deploy/` applied through its testbed overlay runs as
//! pods on the appliance node (a VM that joined as a `manual` Machine), with the images of
//! this build pulled from the lab's registry; the bootserver's pod powers two VMs (BIOS
//! through Redfish, UEFI through IPMI) through their BMCs and boots them, and they become
//! Ready Nodes. Then the reduced day-2 scenario of the appliance runs: a rolling update
//! repaves both machines in one batch onto their data disks (`storage: {}`), and the leading
//! controller pod is deleted in the middle of it; both come back Ready on the new version,
//! their node state on the disk. Then the reduced discovery: a VM nobody declared, an IPMI
//! BMC inside it and a switch (lldpd) on the bridge, becomes a waiting Machine whose
//! inventory says its shape, its switch port and its BMC's address.
//!
//! Then, in a lab of its own, the reduced `scenario ipv6`: an IPv6-only provisioning network
//! (the bootserver and controller as host binaries, DHCPv4 off), where a UEFI machine boots
//! by OVMF's own PXEv6 and becomes a Ready Node on its reserved IPv6 address alone. The two
//! labs run one after the other (one bridge, one host route).
//!
//! The host, node and container images come from the image cache (`unbounded-testbed
//! images --containers`, which the test command runs first); the controller binary that the
//! lab runs outside the cluster for the appliance's first join from this build.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use unbounded_testbed::images;
use unbounded_testbed::lab::{Lab, LabMode, LabOptions, Provisioning};
use unbounded_testbed::progress;
use unbounded_testbed::scenario::{self, LabAccess as _};
use unbounded_testbed::{appliance_scenarios, discovery_scenario, ipv6_scenario};

mod common;
use common::workspace_binary;

/// One lab at a time: each makes the same bridge addresses and host route, and keeps both
/// cores busy.
static ONE_LAB: Mutex<()> = Mutex::new(());

#[test]
fn the_appliance_runs_deploy_as_pods_that_boot_machines_to_ready_nodes() {
    let _one_lab = ONE_LAB.lock().unwrap_or_else(PoisonError::into_inner);
    let mut images = images::cached().unwrap();
    images.containers = Some(images::cached_containers().unwrap_or_else(|e| {
        panic!("{e} (scripts/test runs `unbounded-testbed images --containers` first)")
    }));
    let dir = tempfile::tempdir().unwrap();
    let options = LabOptions {
        machines: 2,
        memory_mib: 1536,
        dir: dir.path().to_path_buf(),
        controller: workspace_binary("unbounded-controller"),
        bootserver: workspace_binary("unbounded-bootserver"),
        mode: LabMode::Pods,
        appliance_memory_mib: 2560,
        stage_timeout: Duration::from_secs(420),
        provisioning: Provisioning::Ipv4,
    };
    let say = |m: &str| eprintln!("lab: {m}");
    let mut lab = Lab::start(&options, &images, &say).unwrap_or_else(|e| panic!("{e}"));
    lab.apply_machines().unwrap();
    let mut timelines = lab
        .wait_ready(Duration::from_secs(420), &say)
        .unwrap_or_else(|e| panic!("{e}"));
    let appliance = lab.appliance().expect("the lab runs the pods");
    eprintln!("{}", progress::steps_table(&appliance.steps));
    timelines.insert(0, ("appliance".into(), appliance.timeline.clone()));
    eprintln!("{}", progress::table(&timelines));

    // Every pod of the project Running, on the appliance, with the images of the lab's
    // registry by digest.
    let pods = lab
        .kubectl(
            &[
                "get",
                "pods",
                "-n",
                "unbounded-system",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}|{.status.phase}|{.spec.nodeName}|{.spec.containers[*].image}{\"\\n\"}{end}",
            ],
            None,
        )
        .unwrap();
    let lines: Vec<&str> = pods.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 3, "two controllers and a bootserver:\n{pods}");
    for line in &lines {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(fields[1], "Running", "{pods}");
        assert_eq!(fields[2], "appliance", "{pods}");
        assert!(
            fields[3].starts_with("10.99.0.1:5000/unbounded/") && fields[3].contains("@sha256:"),
            "{pods}"
        );
    }

    scenario::check_running_and_annotated(&lab, 1)
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    // Each machine got its credentials in TPM mode: its own TPM (libvirt's swtpm) attested,
    // and its endorsement key, taken on first use, is recorded on its Machine.
    let mut keys = Vec::new();
    for machine in ["machine-1", "machine-2"] {
        let attested = lab
            .kubectl(
                &[
                    "get",
                    "machine",
                    machine,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='TPMAttested')].status} {.spec.pxe.identity.endorsementKey}",
                ],
                None,
            )
            .unwrap();
        let (status, key) = attested.split_once(' ').unwrap_or((attested.as_str(), ""));
        assert_eq!(
            status, "True",
            "{machine} attested with its TPM: {attested}"
        );
        assert!(
            key.starts_with("000b") && key.len() == 68,
            "{machine}: {attested}"
        );
        keys.push(key.to_owned());
    }
    assert_ne!(keys[0], keys[1], "each machine has a TPM of its own");
    // The reduced leader-failover: both machines repave in one batch (the scenario command
    // rolls them one at a time), and the leading controller pod is deleted mid-rollout. The
    // new version also puts the node's state on each machine's data disk (the reduced
    // `disks` scenario: the pave onto a blank disk, at no extra VM time).
    let failover =
        appliance_scenarios::leader_failover(&lab, 2, true, Duration::from_secs(420), &say)
            .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    eprintln!(
        "leader failover: {} → {} in {:.1} s (bound {} s); rollout {:.0} s",
        failover.old_leader,
        failover.new_leader,
        failover.takeover.as_secs_f64(),
        failover.bound.as_secs(),
        failover.rollout.as_secs_f64()
    );

    // The reduced discovery: a server nobody declared, with a BMC inside and a switch on
    // the bridge, becomes a waiting Machine with its inventory (`scenario discovery` runs
    // the rest: the pool's claim and the Ready Node).
    let discovered = discovery_scenario::discovery(
        &lab,
        discovery_scenario::Depth::Reduced,
        Duration::from_secs(300),
        &say,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    for (machine, took) in &discovered.discovered {
        eprintln!(
            "discovery: {machine} discovered {:.0} s after power-on",
            took.as_secs_f64()
        );
    }

    // No BMC password, token or bootstrap token in any component's log, pod log or console.
    let leaks = lab.secret_leaks();
    assert!(
        leaks.is_empty(),
        "secrets in the lab's logs:\n{}",
        leaks.join("\n")
    );
}

#[test]
fn on_an_ipv6_only_network_a_uefi_machine_boots_by_pxev6_to_a_node_on_its_ipv6_address() {
    let _one_lab = ONE_LAB.lock().unwrap_or_else(PoisonError::into_inner);
    let images = images::cached().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = LabOptions {
        machines: 1,
        memory_mib: 1536,
        dir: dir.path().to_path_buf(),
        controller: workspace_binary("unbounded-controller"),
        bootserver: workspace_binary("unbounded-bootserver"),
        mode: LabMode::HostBinaries,
        appliance_memory_mib: 0,
        stage_timeout: Duration::from_secs(420),
        provisioning: Provisioning::Ipv6Only,
    };
    let say = |m: &str| eprintln!("ipv6 lab: {m}");
    let mut lab = Lab::start(&options, &images, &say).unwrap_or_else(|e| panic!("{e}"));
    lab.apply_machines().unwrap();
    let timelines = lab
        .wait_ready(Duration::from_secs(420), &say)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", progress::table(&timelines));
    let found = ipv6_scenario::ipv6(
        &lab,
        &lab.dir,
        ipv6_scenario::Ipv6Depth::Reduced,
        Duration::from_secs(300),
        &say,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    assert_eq!(
        found.nodes,
        vec![(
            "machine-1".to_owned(),
            vec!["fd00:99::21".parse::<std::net::IpAddr>().unwrap()]
        )]
    );
    let leaks = lab.secret_leaks();
    assert!(
        leaks.is_empty(),
        "secrets in the lab's logs:\n{}",
        leaks.join("\n")
    );
}
