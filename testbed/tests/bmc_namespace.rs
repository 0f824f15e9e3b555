#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The BMC emulators run inside a network namespace (as the testbed's bootserver, which is
//! in that namespace, reaches them) and answer there.

use unbounded_testbed::bmc::IpmiSim;
use unbounded_testbed::netns::Netns;

#[test]
fn ipmi_sim_answers_inside_a_namespace() {
    let ns = Netns::new("ubbmc").unwrap();
    let sim = IpmiSim::start_in(Some(&ns), "ub-nonexistent", "admin", "secret-pw")
        .unwrap_or_else(|e| panic!("{e}"));
    let out = ns
        .command("ipmitool")
        .args([
            "-I",
            "lanplus",
            "-C",
            "3",
            "-H",
            "127.0.0.1",
            "-p",
            &sim.port.to_string(),
        ])
        .args(["-U", "admin", "-E", "chassis", "power", "status"])
        .env("IPMI_PASSWORD", "secret-pw")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Chassis Power is off"));
}
