#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! DHCP against real clients (busybox udhcpc, and the relay-mode load generator) in network
//! namespaces the tests create.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use unbounded_testbed::netns::Link;

#[test]
fn full_mode_gives_reservations_pool_addresses_and_boot_files() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));

    // A known machine gets its reservation, its host name and the options of the subnet.
    let (env, out) = udhcpc(&link.client, &[]);
    assert_eq!(
        get(&env, "ip"),
        Some("10.99.0.21"),
        "{out}\n{}",
        server.log()
    );
    assert_eq!(get(&env, "hostname"), Some("node-1"));
    assert_eq!(get(&env, "router"), Some(SERVER));
    assert_eq!(get(&env, "domain"), Some("lab.test"));
    assert_eq!(get(&env, "lease"), Some("600"));
    // An OS DHCP client gets no boot file.
    assert_eq!(get(&env, "boot_file"), None);

    // The same machine as BIOS PXE firmware: undionly.kpxe from us over TFTP.
    let (env, out) = udhcpc(
        &link.client,
        &["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"],
    );
    assert_eq!(get(&env, "boot_file"), Some("undionly.kpxe"), "{out}");
    assert_eq!(get(&env, "siaddr"), Some(SERVER));

    // As iPXE (user class): straight to its own script over HTTP, so the chain never loops.
    let (env, out) = udhcpc(
        &link.client,
        &[
            "-V",
            "PXEClient:Arch:00000:UNDI:002001",
            "-x",
            "0x5d:0000",
            "-x",
            "0x4d:69505845",
        ],
    );
    assert_eq!(
        get(&env, "boot_file"),
        Some("http://10.99.0.1:8080/boot.ipxe?mac=52:54:00:00:00:01"),
        "{out}"
    );

    // An unknown machine that is not network-booting gets a pool address.
    link.client
        .ip(&["link", "set", "eth0", "address", "52:54:00:00:00:99"])
        .unwrap();
    let (env, out) = udhcpc(&link.client, &[]);
    let ip: std::net::Ipv4Addr = get(&env, "ip").expect(&out).parse().unwrap();
    assert!((100..=250).contains(&ip.octets()[3]), "{ip}");
    // An unknown machine that wants to network-boot is ignored (it moves on to its disk).
    let (env, out) = udhcpc(
        &link.client,
        &["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"],
    );
    assert!(
        env.is_empty(),
        "unknown PXE client must get no answer: {out}"
    );

    // x86-64 UEFI machine: the configured UEFI build.
    link.client
        .ip(&["link", "set", "eth0", "address", "52:54:00:00:00:02"])
        .unwrap();
    let (env, out) = udhcpc(
        &link.client,
        &["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"],
    );
    assert_eq!(get(&env, "boot_file"), Some("snponly.efi"), "{out}");
    let metrics = server.metrics(&link.server);
    assert!(
        metric(&metrics, "unbounded_bootserver_dhcp_sent_total", "ACK") >= 4.0,
        "{metrics}"
    );
}

/// One valid request after each malformed one still gets its answer, and each malformed one
/// is counted.
#[test]
fn malformed_packets_are_counted_and_dropped() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));

    let header = {
        let mut h = vec![1u8, 1, 6, 0, 0xde, 0xad, 0xbe, 0xef];
        h.resize(236, 0);
        h
    };
    let with = |tail: &[u8]| {
        let mut p = header.clone();
        p.extend_from_slice(tail);
        p
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("one byte", vec![1]),
        ("truncated header", header[..100].to_vec()),
        ("no magic cookie", header.clone()),
        ("wrong magic cookie", with(&[1, 2, 3, 4, 53, 1, 1, 255])),
        (
            "option longer than the packet",
            with(&[99, 130, 83, 99, 53, 200, 1]),
        ),
        (
            "message type of length zero",
            with(&[99, 130, 83, 99, 53, 0, 255]),
        ),
        (
            "random bytes",
            (0..400u32).map(|i| (i * 7919 % 256) as u8).collect(),
        ),
        // hlen 200: dhcproto's chaddr() panicked on it and the whole server stopped.
        ("hlen above 16", {
            let mut p = with(&[99, 130, 83, 99, 53, 1, 1, 255]);
            p[2] = 200;
            p
        }),
        ("hardware type 32", {
            let mut p = with(&[99, 130, 83, 99, 53, 1, 1, 255]);
            p[1] = 32;
            p
        }),
        (
            "client identifier of one byte",
            with(&[99, 130, 83, 99, 53, 1, 1, 61, 1, 1, 255]),
        ),
    ];
    for (case, bytes) in &cases {
        let hex: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
        // bash's /dev/udp sends the datagram from the client namespace.
        link.client
            .exec(&[
                "bash",
                "-c",
                &format!("printf '{hex}' > /dev/udp/{SERVER}/67"),
            ])
            .unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    // Still answering.
    link.client.ip(&["addr", "flush", "dev", "eth0"]).unwrap();
    let (env, out) = udhcpc(&link.client, &[]);
    assert_eq!(
        get(&env, "ip"),
        Some("10.99.0.21"),
        "{out}\n{}",
        server.log()
    );
    let metrics = server.metrics(&link.server);
    let dropped = metric(&metrics, "unbounded_bootserver_dhcp_dropped_total", "");
    assert!(
        dropped >= cases.len() as f64,
        "every malformed packet counted ({} sent):\n{metrics}",
        cases.len()
    );
    // By reason, as typed labels.
    for reason in [
        "malformed_hlen",
        "malformed_htype",
        "malformed_option_length",
    ] {
        assert!(
            metric(&metrics, "unbounded_bootserver_dhcp_dropped_total", reason) >= 1.0,
            "{reason}:\n{metrics}"
        );
    }
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}

fn read_leases(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(mac, ip)| (mac.to_owned(), ip.to_owned()))
        .collect()
}

fn dhcp_load(link: &Link, first: u32, clients: u32, out: &std::path::Path) -> std::process::Output {
    link.client
        .command(env!("CARGO_BIN_EXE_dhcp-load"))
        .args(["--relay", "10.99.0.2", "--server", SERVER])
        .args([
            "--first",
            &first.to_string(),
            "--clients",
            &clients.to_string(),
        ])
        .arg("--leases-out")
        .arg(out)
        .output()
        .unwrap()
}

/// A `kill -9` in the middle of a burst of leases loses no acknowledged lease, and no
/// address is ever acknowledged to two clients.
#[test]
fn a_crash_mid_burst_loses_no_lease_and_duplicates_no_address() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let images = fake_images();
    // A /16 with a pool of ~32,000 addresses: room for every client of both runs.
    let config = full_config(images.path(), "")
        .replace("subnet: 10.99.0.0/24", "subnet: 10.99.0.0/16")
        .replace(
            "pool: [10.99.0.100, 10.99.0.250]",
            "pool: [10.99.0.10, 10.99.127.254]",
        );
    let mut server = Bootserver::start(&link.server, &config);
    let dir = tempfile::tempdir().unwrap();

    // A burst of 20,000 clients; the server is killed while it runs.
    let first_out = dir.path().join("first.txt");
    let burst = {
        let mut command = link.client.command(env!("CARGO_BIN_EXE_dhcp-load"));
        command
            .args([
                "--relay",
                "10.99.0.2",
                "--server",
                SERVER,
                "--clients",
                "20000",
            ])
            .args(["--timeout-seconds", "2"])
            .arg("--leases-out")
            .arg(&first_out);
        command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let mut burst = burst;
    assert!(
        burst.try_wait().unwrap().is_none(),
        "the burst still runs at the crash"
    );
    server.crash_and_restart(&link.server);
    let burst = burst.wait_with_output().unwrap();
    // Clients retransmit, so on a fast machine the burst may still finish against the
    // restarted server; what matters is that the crash happened while it ran.
    eprintln!(
        "burst across the crash: {}",
        String::from_utf8_lossy(&burst.stdout)
    );
    let before_crash = read_leases(&first_out);
    let lines = std::fs::read_to_string(&first_out).unwrap().lines().count();
    assert_eq!(lines, before_crash.len(), "each client acknowledged once");
    let distinct: BTreeSet<&String> = before_crash.values().collect();
    assert_eq!(
        distinct.len(),
        before_crash.len(),
        "no address acknowledged to two clients during the burst"
    );
    assert!(
        !before_crash.is_empty(),
        "some leases were acknowledged before the crash"
    );

    // The same 20,000 clients again, plus 500 new ones, against the restarted server.
    let second_out = dir.path().join("second.txt");
    let again = dhcp_load(&link, 0, 20_500, &second_out);
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.status.success(),
        "every client gets a lease after the restart: {stdout}"
    );
    let after = read_leases(&second_out);
    eprintln!(
        "before the crash: {} leases; after: {stdout}",
        before_crash.len()
    );

    for (mac, ip) in &before_crash {
        assert_eq!(
            after.get(mac),
            Some(ip),
            "{mac} kept its acknowledged lease"
        );
    }
    let distinct: BTreeSet<&String> = after.values().collect();
    assert_eq!(
        distinct.len(),
        after.len(),
        "no address acknowledged to two clients"
    );
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}
