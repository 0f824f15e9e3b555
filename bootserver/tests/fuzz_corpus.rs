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
fn tftp_seeds_and_regressions_pass() {
    assert!(replay("tftp", fuzzing::tftp) > 0, "no TFTP seeds");
}

#[test]
fn http_seeds_and_regressions_pass() {
    assert!(replay("http", fuzzing::http) > 0, "no HTTP seeds");
}

/// The datagram that stopped the bootserver before issue 11 (`hlen` 200): dropped as
/// malformed, in every mode and port.
#[test]
fn the_hlen_above_16_datagram_is_dropped() {
    let mut packet = vec![0u8; 236];
    packet[..4].copy_from_slice(&[1, 1, 200, 0]);
    packet.extend_from_slice(&[99, 130, 83, 99, 53, 1, 1, 255]);
    for control in 0..4u8 {
        let mut input = vec![control];
        input.extend_from_slice(&packet);
        fuzzing::dhcp(&input);
    }
}
