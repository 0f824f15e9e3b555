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

/// A tmpfs of `bytes` mounted on a temporary directory of the test, unmounted on drop: a
/// real disk that fills up.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(bytes: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs");
        Self { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills what is left with a file (until the disk refuses).
    fn fill(&self) {
        let filler = self.path().join("filler");
        let _ = std::process::Command::new("dd")
            .args(["if=/dev/zero", "bs=4096"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(std::fs::metadata(&filler).unwrap().len() > 0);
    }

    fn free(&self) {
        std::fs::remove_file(self.path().join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(self.dir.path())
            .status();
    }
}

fn http_status(ns: &unbounded_testbed::netns::Netns, path: &str) -> (String, String) {
    let out = ns
        .exec(&[
            "curl",
            "-s",
            "-w",
            "\n%{http_code}",
            &format!("http://{SERVER}:8080{path}"),
        ])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_owned(), body.to_owned())
}

/// The lease log on a real disk that fills up while clients are served: no ACK for a lease
/// that is not on disk, a clear error, a metric and readiness while it is full, serving
/// again once there is room, and after a `kill -9` every acknowledged lease is back and no
/// address is acknowledged to two clients.
#[test]
fn a_full_disk_refuses_acks_and_loses_no_acknowledged_lease() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let images = fake_images();
    let disk = SmallDisk::new(256 * 1024);
    let log_path = disk.path().join("leases.log");
    let config = full_config(images.path(), "")
        .replace("{dir}/leases.log", &log_path.display().to_string())
        .replace("subnet: 10.99.0.0/24", "subnet: 10.99.0.0/16")
        .replace(
            "pool: [10.99.0.100, 10.99.0.250]",
            "pool: [10.99.0.10, 10.99.127.254]",
        );
    let mut server = Bootserver::start(&link.server, &config);
    let dir = tempfile::tempdir().unwrap();
    let acknowledged = |file: &str| read_leases(&dir.path().join(file));

    // Room on the disk: every client gets a lease.
    let out = dhcp_load(&link, 0, 300, &dir.path().join("before.txt"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(acknowledged("before.txt").len(), 300);

    // The disk fills up: what is acknowledged now must be on disk (a few records may still
    // fit in the log's last page); the rest gets no ACK.
    disk.fill();
    let _ = dhcp_load(&link, 1000, 300, &dir.path().join("full.txt"));
    let while_full = acknowledged("full.txt");
    assert!(
        while_full.len() < 300,
        "ACKs with a full disk: {}",
        while_full.len()
    );
    let metrics = server.metrics(&link.server);
    assert!(
        metric(
            &metrics,
            "unbounded_bootserver_dhcp_dropped_total",
            "commit_failed"
        ) >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_dhcp_lease_log_failing", ""),
        1.0,
        "{metrics}"
    );
    let (code, body) = http_status(&link.server, "/readyz");
    assert_eq!(code, "503", "{body}");
    assert!(body.contains("lease log"), "{body}");
    assert!(
        server.log().contains("making leases durable failed"),
        "{}",
        server.log()
    );

    // Room again: served again, and ready.
    disk.free();
    let out = dhcp_load(&link, 2000, 300, &dir.path().join("after.txt"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(acknowledged("after.txt").len(), 300);
    let metrics = server.metrics(&link.server);
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_dhcp_lease_log_failing", ""),
        0.0,
        "{metrics}"
    );
    assert_eq!(http_status(&link.server, "/readyz").0, "200");

    // A crash: every acknowledged lease is back (the same clients get the same addresses)
    // and fresh clients get none of them.
    server.crash_and_restart(&link.server);
    let mut promised = BTreeMap::new();
    for file in ["before.txt", "full.txt", "after.txt"] {
        promised.extend(acknowledged(file));
    }
    for (first, file) in [
        (0, "before-again.txt"),
        (1000, "full-again.txt"),
        (2000, "after-again.txt"),
    ] {
        let out = dhcp_load(&link, first, 300, &dir.path().join(file));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = dhcp_load(&link, 5000, 300, &dir.path().join("fresh.txt"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut after = BTreeMap::new();
    for file in [
        "before-again.txt",
        "full-again.txt",
        "after-again.txt",
        "fresh.txt",
    ] {
        after.extend(acknowledged(file));
    }
    for (mac, ip) in &promised {
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

/// A request far longer than 1,500 bytes (fragmented on the wire) is read whole and
/// answered: the receive buffer holds the largest datagram a client may send.
#[test]
fn a_request_longer_than_an_ethernet_frame_is_answered() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    link.client
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));
    // A relayed DISCOVER of 4,000 bytes (option 57 announces 8,000), sent from the relay's
    // port 67; the OFFER comes back to it.
    let script = format!(
        r#"
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.99.0.2", 67))
s.settimeout(5)
p = bytearray(236)
p[0:4] = bytes([1, 1, 6, 1])
p[4:8] = b"\x12\x34\x56\x78"
p[24:28] = socket.inet_aton("10.99.0.2")
p[28:34] = bytes([0x52, 0x54, 0, 0, 0x7e, 0x01])
p += bytes([99, 130, 83, 99, 53, 1, 1, 57, 2]) + struct.pack("!H", 8000)
while len(p) < 3990:
    p += bytes([250, 200]) + bytes(200)
p += bytes([255])
s.sendto(bytes(p), ("{SERVER}", 67))
reply, _ = s.recvfrom(65535)
kind, i = -1, 240
while i < len(reply) and reply[i] != 255:
    if reply[i] == 0:
        i += 1
        continue
    if reply[i] == 53:
        kind = reply[i + 2]
    i += 2 + reply[i + 1]
print(len(p), kind, socket.inet_ntoa(reply[16:20]))
"#
    );
    let out = link.client.exec(&["python3", "-c", &script]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert!(
        fields.len() == 3 && fields[0].parse::<usize>().unwrap() > 3900,
        "{text}\n{}",
        server.log()
    );
    assert_eq!(fields[1], "2", "option 53 says OFFER: {text}");
    assert!(fields[2].starts_with("10.99.0."), "{text}");
}
