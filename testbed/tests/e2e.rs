#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The whole flow on QEMU: two VMs (BIOS through Redfish, UEFI through IPMI) go from
//! power-off to Ready Nodes through the bootserver, the controller and the agent, as the
//! binaries `deploy/` runs with `deploy/`'s RBAC; then one Node is deleted and the machine
//! repaves and joins again.
//!
//! The host and node images come from the image cache (`unbounded-testbed images`, which
//! the test command runs first); the controller and bootserver binaries from this build.

use std::time::Duration;

use unbounded_testbed::images;
use unbounded_testbed::lab::{Lab, LabOptions};
use unbounded_testbed::progress;
use unbounded_testbed::scenario;

mod common;
use common::workspace_binary;

#[test]
fn pxe_machines_become_ready_nodes_and_a_deleted_node_is_repaved() {
    let images = images::cached().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = LabOptions {
        machines: 2,
        memory_mib: 1536,
        dir: dir.path().to_path_buf(),
        controller: workspace_binary("unbounded-controller"),
        bootserver: workspace_binary("unbounded-bootserver"),
    };
    let say = |m: &str| eprintln!("lab: {m}");
    let mut lab = Lab::start(&options, &images, &say).unwrap();
    lab.apply_machines(&images).unwrap();
    let timelines = lab
        .wait_ready(Duration::from_secs(420), &say)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", progress::table(&timelines));

    scenario::check_running_and_annotated(&lab, 1)
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    scenario::repave(&lab, "machine-1", Duration::from_secs(420), &say)
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));

    // No BMC password, token or bootstrap token in any component's log or console.
    let leaks = lab.secret_leaks();
    assert!(
        leaks.is_empty(),
        "secrets in the lab's logs:\n{}",
        leaks.join("\n")
    );
}
