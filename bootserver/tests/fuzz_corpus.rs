#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Every checked-in fuzz seed (cut from packet captures of the PXE tests) and every input a
//! fuzzer once failed on (`bootserver/fuzz/regressions/<target>/`) goes through the fuzz
//! targets' bodies again: the regression tests of the fuzzing campaign, and a check that
//! the targets keep working without cargo-fuzz.

use std::path::Path;

use unbounded_bootserver::fuzzing;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for folder in ["seeds", "regressions"] {
        let dir = base.join(folder).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            eprintln!("{target}: {}", path.display());
            run(&data);
            count += 1;
        }
    }
    count
}

#[test]
fn dhcp_seeds_and_regressions_pass() {
    assert!(replay("dhcp", fuzzing::dhcp) > 0, "no DHCP seeds");
}

#[test]
fn dhcp6_seeds_and_regressions_pass() {
    assert!(replay("dhcp6", fuzzing::dhcp6) > 0, "no DHCPv6 seeds");
}

#[test]
fn tftp_seeds_and_regressions_pass() {
    assert!(replay("tftp", fuzzing::tftp) > 0, "no TFTP seeds");
}

#[test]
fn http_seeds_and_regressions_pass() {
    assert!(replay("http", fuzzing::http) > 0, "no HTTP seeds");
}

/// The datagram that stopped the bootserver before issue 11 (`hlen` 200): dropped as
/// malformed (`hlen`), in every mode and port, by the same handler the socket loop runs.
#[test]
fn the_hlen_above_16_datagram_is_dropped() {
    use std::sync::Arc;
    use unbounded_bootserver::backend::StaticBackend;
    use unbounded_bootserver::config::Settings;
    use unbounded_bootserver::dhcp::settings::DhcpMode;
    use unbounded_bootserver::dhcp::wire::Malformed;
    use unbounded_bootserver::dhcp::{Decision, DropReason, Responder, serve};
    use unbounded_bootserver::leases::Leases;

    let mut packet = vec![0u8; 236];
    packet[..4].copy_from_slice(&[1, 1, 200, 0]);
    packet.extend_from_slice(&[99, 130, 83, 99, 53, 1, 1, 255]);
    let base = Settings::parse(
        "serverAddress: 10.99.0.1\ndhcp:\n  subnets:\n    - {subnet: 10.99.0.0/24, pool: [10.99.0.100, 10.99.0.199]}\n",
    )
    .unwrap();
    let from = "10.99.0.50:68".parse().unwrap();
    for mode in [DhcpMode::Full, DhcpMode::Proxy] {
        let mut settings = base.clone();
        settings.dhcp.mode = mode;
        let settings = Arc::new(settings);
        let backend = Arc::new(StaticBackend::new(Vec::new()));
        let responder = Responder::new(settings.clone(), backend, Arc::new(Leases::in_memory()));
        for port in [settings.dhcp.port, settings.dhcp.proxy_port] {
            let (kind, decision) = serve::handle(&responder, &packet, from, port, 1_700_000_000);
            assert_eq!(kind, None, "{mode:?} {port}");
            assert_eq!(
                decision,
                Decision::Drop(DropReason::Malformed(Malformed::HardwareLength)),
                "{mode:?} {port}"
            );
        }
    }
    // And through the fuzz target's body, which must not panic on it.
    for control in 0..4u8 {
        let mut input = vec![control];
        input.extend_from_slice(&packet);
        fuzzing::dhcp(&input);
    }
}
