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

/// Processes whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

/// The SOL relay forks a `socat` (and its `tail`) per connection; stopping the simulator
/// stops them all, not only the listening parent (a forked child keeps no parent-death
/// signal). A child whose `tail` never reads what a SOL client typed blocks and never sees
/// its connection end: the lab's `down` left such children running.
#[test]
fn the_sol_relay_goes_with_the_simulator() {
    let ns = Netns::new("ubsol").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("console.log");
    std::fs::write(&console, "booting\n").unwrap();
    let needle = console.display().to_string();
    let sim = IpmiSim::start_with_console(
        Some(&ns),
        "127.0.0.1",
        "ub-nonexistent",
        "admin",
        "secret-pw",
        &console,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // ipmi_sim connects to the relay when it starts: a forked child runs `tail` of the file.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !processes_naming(&needle)
        .iter()
        .any(|c| c.starts_with("tail "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no relay connection: {:?}",
            processes_naming(&needle)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Keystrokes nobody reads: a client floods the relay until its child blocks.
    let listener = processes_naming(&needle)
        .into_iter()
        .find(|c| c.starts_with("socat TCP-LISTEN:"))
        .expect("the relay's listener");
    let port = listener
        .trim_start_matches("socat TCP-LISTEN:")
        .split(',')
        .next()
        .unwrap()
        .to_owned();
    let _ = ns
        .command("timeout")
        .args([
            "3",
            "socat",
            "-u",
            "/dev/zero",
            &format!("TCP:127.0.0.1:{port}"),
        ])
        .output()
        .unwrap();
    drop(sim);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = processes_naming(&needle);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left running after the simulator stopped: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
