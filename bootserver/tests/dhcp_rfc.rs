#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! DHCP as RFC 2131, 3046, 3527 and 6842 say, with real clients and a real relay: ISC
//! dhclient rebooting onto the wrong network, busybox udhcpc keeping its lease across NICs
//! by client identifier, and ISC dhcrelay between two namespaces adding option 82 (and the
//! RFC 3527 link selection). Option 118, which no client here sends, is tested with raw
//! packets in `dhcp::decide_tests`.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use unbounded_testbed::netns::{Link, Netns};

/// Runs ISC dhclient (v4) once on `eth0` of `ns` with this lease file; returns its output.
fn dhclient(ns: &Netns, leases: &std::path::Path) -> String {
    dhclient_once(ns, leases, &[])
}

#[test]
fn init_reboot_on_the_wrong_network_gets_a_nak_and_dhclient_starts_over() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:77").unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));
    // A machine moved from another rack: it remembers a lease there, valid for years.
    let dir = tempfile::tempdir().unwrap();
    let leases = dir.path().join("dhclient.leases");
    std::fs::write(
        &leases,
        "lease {\n  interface \"eth0\";\n  fixed-address 192.168.77.50;\n  option subnet-mask 255.255.255.0;\n  option dhcp-server-identifier 192.168.77.1;\n  renew 4 2037/01/01 00:00:00;\n  rebind 4 2037/01/01 00:00:00;\n  expire 4 2037/01/01 00:00:00;\n}\n",
    )
    .unwrap();
    let out = dhclient(&link.client, &leases);
    assert!(
        out.contains("DHCPREQUEST for 192.168.77.50"),
        "dhclient went through INIT-REBOOT:\n{out}"
    );
    assert!(
        out.contains("DHCPNAK from 10.99.0.1"),
        "{out}\n{}",
        server.log()
    );
    assert!(out.contains("bound to 10.99.0."), "{out}");
    let metrics = server.metrics(&link.server);
    assert!(
        metric(&metrics, "unbounded_bootserver_dhcp_sent_total", "NAK") >= 1.0,
        "{metrics}"
    );
}

#[test]
fn a_client_identifier_brings_the_lease_back_from_another_nic() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:61").unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));
    let id = ["-C", "-x", "0x3d:00756e626f756e6465642d3631"]; // type 0, "unbounded-61"
    let (env, out) = udhcpc(&link.client, &id);
    let first = get(&env, "ip")
        .unwrap_or_else(|| panic!("{out}\n{}", server.log()))
        .to_owned();
    // Another NIC, the same identifier: the same lease (RFC 2131 §4.2).
    link.client
        .ip(&["link", "set", "eth0", "address", "52:54:00:00:00:62"])
        .unwrap();
    let (env, out) = udhcpc(&link.client, &id);
    assert_eq!(get(&env, "ip"), Some(first.as_str()), "{out}");
    // That NIC on its own (busybox sends 01:<mac> as identifier) is another client.
    let (env, out) = udhcpc(&link.client, &[]);
    let own = get(&env, "ip").unwrap_or_else(|| panic!("{out}"));
    assert_ne!(own, first);
}

/// Server ⟷ relay ⟷ client: the server's namespace (10.99.0.1 on `pxe0`), the relay's
/// (`uplink` 10.99.0.2, `downlink` 10.98.0.1) and the client's (`eth0`, no address).
struct Relayed {
    server: Netns,
    relay: Netns,
    client: Netns,
}

fn relayed() -> Relayed {
    let r = Relayed {
        server: Netns::new("ubs").unwrap(),
        relay: Netns::new("ubr").unwrap(),
        client: Netns::new("ubc").unwrap(),
    };
    veth((&r.server, "pxe0"), (&r.relay, "uplink"));
    veth((&r.relay, "downlink"), (&r.client, "eth0"));
    r.client
        .ip(&["link", "set", "eth0", "address", "52:54:00:00:00:82"])
        .unwrap();
    r.server
        .ip(&["addr", "add", "10.99.0.1/24", "dev", "pxe0"])
        .unwrap();
    r.relay
        .ip(&["addr", "add", "10.99.0.2/24", "dev", "uplink"])
        .unwrap();
    r.relay
        .ip(&["addr", "add", "10.98.0.1/24", "dev", "downlink"])
        .unwrap();
    r.server
        .ip(&["route", "add", "10.98.0.0/24", "via", "10.99.0.2"])
        .unwrap();
    r
}

/// A child process killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dhcrelay(ns: &Netns, extra: &[&str], log: &std::path::Path) -> Running {
    let log = std::fs::File::create(log).unwrap();
    let child = ns
        .command("dhcrelay")
        .args(["-4", "-d", "-a", "--no-pid"])
        .args(extra)
        .args(["-id", "downlink", SERVER])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    Running(child)
}

fn two_subnet_config(images: &std::path::Path) -> String {
    full_config(images, "").replace(
        "      leaseSeconds: 600\n",
        "      leaseSeconds: 600\n    - subnet: 10.98.0.0/24\n      pool: [10.98.0.100, 10.98.0.150]\n      gateway: 10.98.0.1\n",
    )
}

/// The DHCP payloads of UDP datagrams in an Ethernet pcap, with their IPv4 source.
fn dhcp_payloads(pcap: &[u8]) -> Vec<(std::net::Ipv4Addr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let caplen = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &pcap[at + 16..at + 16 + caplen];
        at += 16 + caplen;
        if frame.len() < 42 || frame[12..14] != [8, 0] || frame[23] != 17 {
            continue;
        }
        let ihl = usize::from(frame[14] & 15) * 4;
        let src = std::net::Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]);
        let udp = &frame[14 + ihl..];
        out.push((src, udp[8..].to_vec()));
    }
    out
}

/// The value of one option of a DHCP message, and whether it is the last option.
fn option(message: &[u8], code: u8) -> Option<(Vec<u8>, bool)> {
    let mut i = 240;
    let mut found = None;
    while i < message.len() && message[i] != 255 {
        if message[i] == 0 {
            i += 1;
            continue;
        }
        let len = usize::from(message[i + 1]);
        let last = message.get(i + 2 + len) == Some(&255);
        if message[i] == code {
            found = Some((message[i + 2..i + 2 + len].to_vec(), last));
        }
        i += 2 + len;
    }
    found
}

fn relay_case(extra: &[&str], expected_prefix: &str, giaddr: [u8; 4]) {
    let r = relayed();
    let images = fake_images();
    let server = Bootserver::start(&r.server, &two_subnet_config(images.path()));
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("up.pcap");
    let tcpdump = Running(
        r.relay
            .command("tcpdump")
            .args(["-i", "uplink", "-U", "-s", "0", "-w"])
            .arg(&pcap)
            .arg("udp port 67")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // tcpdump writes the file's header once it captures: only then start the exchange.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) < 24 {
        assert!(Instant::now() < deadline, "tcpdump did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let relay_log = dir.path().join("dhcrelay.log");
    let relay = dhcrelay(&r.relay, extra, &relay_log);
    std::thread::sleep(Duration::from_millis(500));
    let (env, out) = udhcpc(&r.client, &[]);
    let ip = get(&env, "ip").unwrap_or_else(|| {
        panic!(
            "no lease through the relay: {out}\ndhcrelay:\n{}\nbootserver:\n{}",
            std::fs::read_to_string(&relay_log).unwrap_or_default(),
            server.log()
        )
    });
    assert!(ip.starts_with(expected_prefix), "{ip}");
    assert_eq!(get(&env, "router"), Some("10.98.0.1"));
    drop(relay);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) < 1000 {
        assert!(Instant::now() < deadline, "no capture");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(tcpdump);
    let captured = dhcp_payloads(&std::fs::read(&pcap).unwrap());
    let requests: Vec<_> = captured
        .iter()
        .filter(|(src, m)| src.octets() == [10, 99, 0, 2] && m[0] == 1)
        .collect();
    let replies: Vec<_> = captured
        .iter()
        .filter(|(src, m)| src.octets() == [10, 99, 0, 1] && m[0] == 2)
        .collect();
    assert!(!requests.is_empty() && replies.len() >= 2, "{captured:?}");
    for (_, reply) in replies {
        let xid = &reply[4..8];
        let (_, request) = requests.iter().find(|(_, m)| &m[4..8] == xid).unwrap();
        assert_eq!(request[24..28], giaddr, "giaddr");
        let (sent, _) = option(request, 82).expect("the relay added option 82");
        let (echoed, last) = option(reply, 82).expect("option 82 echoed");
        assert_eq!(echoed, sent, "option 82 unchanged");
        assert!(last, "option 82 is the last option");
    }
}

#[test]
fn relayed_requests_get_option_82_back_unchanged_through_dhcrelay() {
    relay_case(&["-iu", "uplink"], "10.98.0.", [10, 98, 0, 1]);
}

/// `dhcrelay -U uplink`: `giaddr` is the relay's upstream address (on the server's subnet) and
/// the link-selection sub-option names the client's: the client's subnet must win.
#[test]
fn link_selection_from_dhcrelay_chooses_the_client_subnet() {
    relay_case(&["-U", "uplink"], "10.98.0.", [10, 99, 0, 2]);
}

/// Complete DORAs from made-up MACs behind one relay (a real `dhcrelay`, option 82 added)
/// take at most `dhcp.limits.perRelay` addresses of a pool that two relays share; a client
/// behind the other relay still gets one, and the refusals are counted
/// (`unbounded_bootserver_dhcp_dropped_total{reason="source_limit"}`). Before the limit, the flood took the pool.
#[test]
fn a_flood_behind_one_relay_leaves_the_shared_pool_to_the_other() {
    // The server's link is a bridge with two relays on it; each relay's downlink is a
    // segment of 10.98.0.0/24 with one client namespace.
    let server = Netns::new("ubs").unwrap();
    server
        .ip(&["link", "add", "pxe0", "type", "bridge"])
        .unwrap();
    server
        .ip(&["addr", "add", "10.99.0.1/24", "dev", "pxe0"])
        .unwrap();
    server.ip(&["link", "set", "pxe0", "up"]).unwrap();
    let mut relays = Vec::new();
    for (i, (uplink, downlink)) in [("10.99.0.2", "10.98.0.1"), ("10.99.0.3", "10.98.0.2")]
        .into_iter()
        .enumerate()
    {
        let relay = Netns::new("ubr").unwrap();
        let client = Netns::new("ubc").unwrap();
        let port = format!("port{i}");
        veth((&server, &port), (&relay, "uplink"));
        server
            .ip(&["link", "set", &port, "master", "pxe0"])
            .unwrap();
        veth((&relay, "downlink"), (&client, "eth0"));
        relay
            .ip(&["addr", "add", &format!("{uplink}/24"), "dev", "uplink"])
            .unwrap();
        relay
            .ip(&["addr", "add", &format!("{downlink}/24"), "dev", "downlink"])
            .unwrap();
        server
            .ip(&["route", "add", &format!("{downlink}/32"), "via", uplink])
            .unwrap();
        relays.push((relay, client));
    }
    let images = fake_images();
    let config = two_subnet_config(images.path())
        .replace("  mode: full\n", "  mode: full\n  limits: {perRelay: 3}\n");
    let bootserver = Bootserver::start(&server, &config);
    let dir = tempfile::tempdir().unwrap();
    let _relays: Vec<Running> = relays
        .iter()
        .enumerate()
        .map(|(i, (relay, _))| {
            dhcrelay(
                relay,
                &["-iu", "uplink"],
                &dir.path().join(format!("dhcrelay{i}.log")),
            )
        })
        .collect();
    let lease = |client: &Netns, mac: &str| {
        client.ip(&["link", "set", "eth0", "address", mac]).unwrap();
        let (env, out) = udhcpc(client, &[]);
        (get(&env, "ip").map(str::to_owned), out)
    };

    // Five made-up MACs behind the first relay: three addresses, then nothing.
    let flooder = &relays[0].1;
    let mut got = Vec::new();
    for n in 1..=5 {
        let (ip, out) = lease(flooder, &format!("02:00:00:00:0f:{n:02x}"));
        match ip {
            Some(ip) => got.push(ip),
            None => assert!(
                n > 3,
                "client {n} got no lease: {out}\n{}",
                bootserver.log()
            ),
        }
    }
    assert_eq!(got.len(), 3, "{got:?}\n{}", bootserver.log());
    assert!(got.iter().all(|ip| ip.starts_with("10.98.0.")), "{got:?}");
    // The other relay's client is served from the same pool.
    let (other, out) = lease(&relays[1].1, "02:00:00:00:0e:01");
    let other = other.unwrap_or_else(|| panic!("no lease behind the other relay: {out}"));
    assert!(
        other.starts_with("10.98.0.") && !got.contains(&other),
        "{other}"
    );
    let refused = metric(
        &bootserver.metrics(&server),
        "unbounded_bootserver_dhcp_dropped_total",
        "source_limit",
    );
    assert!(refused >= 2.0, "source_limit drops: {refused}");
}
