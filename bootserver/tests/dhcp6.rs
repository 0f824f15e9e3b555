#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! DHCPv6 with real clients (ISC `dhclient -6`, dhcpcd) on a link of two network namespaces:
//! a stateful address from the pool, made durable before the Reply (it comes back to its
//! client after a `kill -9` and never goes to another), and TFTP and HTTP over IPv6.

mod common;

use std::time::{Duration, Instant};

use common::*;
use unbounded_testbed::netns::{Link, Netns};

const SERVER6: &str = "fd00:99::1";

fn config(images: &std::path::Path) -> String {
    full_config(images, "").replace(
        "tftp: ",
        &format!(
            "dhcp6:\n  mode: full\n  serverAddress: {SERVER6}\n  subnets:\n    - prefix: fd00:99::/64\n      pool: [fd00:99::100, fd00:99::1ff]\n      dns: [{SERVER6}]\ntftp: "
        ),
    )
}

/// The link with IPv6: the server's address (no duplicate address detection: nobody else
/// is on the link), the client's link-local address settled.
fn link() -> Link {
    link_with_mac("52:54:00:00:06:01")
}

fn link_with_mac(mac: &str) -> Link {
    let link = Link::new("10.99.0.1/24", mac).unwrap();
    link.server
        .ip(&[
            "-6",
            "addr",
            "add",
            &format!("{SERVER6}/64"),
            "dev",
            "pxe0",
            "nodad",
        ])
        .unwrap();
    wait_for_link_local(&link.client, "eth0");
    wait_for_link_local(&link.server, "pxe0");
    link
}

fn wait_for_link_local(ns: &Netns, interface: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = ns
            .ip(&["-6", "addr", "show", "dev", interface, "scope", "link"])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("fe80::") && !text.contains("tentative") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no link-local address on {interface}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `dhclient -6` once on `eth0` with this lease file (which keeps its DUID); returns
/// the address it was given and its output.
fn dhclient6(ns: &Netns, leases: &std::path::Path) -> (Option<String>, String) {
    dhclient6_with(ns, leases, &[])
}

/// [`dhclient6`] with more arguments (`-D LL`: a DUID-LL of the interface's MAC).
fn dhclient6_with(
    ns: &Netns,
    leases: &std::path::Path,
    extra: &[&str],
) -> (Option<String>, String) {
    let args: Vec<&str> = ["-6"].into_iter().chain(extra.iter().copied()).collect();
    let text = dhclient_once(ns, leases, &args);
    // The last lease's address, as dhclient wrote it down.
    let lease_file = std::fs::read_to_string(leases).unwrap_or_default();
    let address = lease_file
        .lines()
        .rev()
        .filter_map(|l| l.trim().strip_prefix("iaaddr "))
        .find_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned);
    (address, format!("{text}\nlease file:\n{lease_file}"))
}

#[test]
fn dhclient_gets_a_durable_v6_lease_that_survives_a_kill_9() {
    let link = link();
    let images = fake_images();
    let mut server = Bootserver::start(&link.server, &config(images.path()));
    let dir = tempfile::tempdir().unwrap();
    let first_leases = dir.path().join("first.leases");

    let (address, out) = dhclient6(&link.client, &first_leases);
    let address = address.unwrap_or_else(|| panic!("no address:\n{out}\n{}", server.log()));
    assert!(address.starts_with("fd00:99::1"), "{address}\n{out}");
    let metrics = server.metrics(&link.server);
    assert!(
        metric(&metrics, "unbounded_bootserver_dhcp6_sent_total", "REPLY") >= 1.0,
        "{metrics}"
    );
    assert!(
        server.log().contains("DHCPv6 Reply: address leased"),
        "{}",
        server.log()
    );

    // A crash: the lease is on disk, so the same client (its DUID kept in its lease file)
    // gets the same address again, and another client never gets it.
    server.crash_and_restart(&link.server);
    // Read back from the log alone, before any client asked again.
    let metrics = server.metrics(&link.server);
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_dhcp_active_leases", ""),
        1.0,
        "the v6 lease was not on disk:\n{metrics}\n{}",
        server.log()
    );
    // A client that starts with a lease confirms it; it forgets its address here (as after
    // a reinstall that kept the DUID) so that it asks the server's book rather than itself.
    let kept = std::fs::read_to_string(&first_leases).unwrap();
    let duid_line = kept
        .lines()
        .find(|l| l.starts_with("default-duid"))
        .unwrap_or_else(|| panic!("dhclient kept no DUID:\n{kept}"))
        .to_owned();
    std::fs::write(&first_leases, format!("{duid_line}\n")).unwrap();
    let (again, out) = dhclient6(&link.client, &first_leases);
    assert_eq!(
        again.as_deref(),
        Some(address.as_str()),
        "{out}\n{}",
        server.log()
    );

    let second_leases = dir.path().join("second.leases");
    std::fs::write(
        &second_leases,
        "default-duid \"\\000\\003\\000\\001RT\\000\\000\\006\\002\";\n",
    )
    .unwrap();
    let (other, out) = dhclient6(&link.client, &second_leases);
    let other = other.unwrap_or_else(|| panic!("no address:\n{out}\n{}", server.log()));
    assert_ne!(other, address, "one address for two clients:\n{out}");
}

#[test]
fn tftp_and_http_answer_over_ipv6() {
    let link = link();
    link.client
        .ip(&[
            "-6",
            "addr",
            "add",
            "fd00:99::50/64",
            "dev",
            "eth0",
            "nodad",
        ])
        .unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &config(images.path()));
    let health = link
        .client
        .exec(&["curl", "-gsf", &format!("http://[{SERVER6}]:8080/healthz")]);
    assert!(
        health.is_ok(),
        "HTTP over IPv6: {health:?}\n{}",
        server.log()
    );
    let kernel = link
        .client
        .exec(&[
            "curl",
            "-gsf",
            &format!("http://[{SERVER6}]:8080/images/vmlinuz"),
        ])
        .unwrap();
    assert_eq!(kernel.stdout.len(), 200_000);
    let dir = tempfile::tempdir().unwrap();
    let fetched = dir.path().join("snponly.efi");
    let tftp = link.client.exec(&[
        "curl",
        "-gsf",
        "-o",
        &fetched.display().to_string(),
        &format!("tftp://[{SERVER6}]/snponly.efi"),
    ]);
    assert!(tftp.is_ok(), "TFTP over IPv6: {tftp:?}\n{}", server.log());
    assert_eq!(
        std::fs::read(&fetched).unwrap(),
        std::fs::read("/usr/lib/ipxe/snponly.efi").unwrap()
    );
}

/// A machine that got its address over DHCPv6 reads its own configuration from that
/// address, over IPv6; any other address is refused; its boot script names the bootserver
/// by its IPv6 address.
#[test]
fn a_machine_is_known_by_its_v6_lease() {
    // node-2's MAC: dhclient's DUID-LL carries it, and the lease records it.
    let link = link_with_mac("52:54:00:00:00:02");
    let images = fake_images();
    let server = Bootserver::start(&link.server, &config(images.path()));
    let dir = tempfile::tempdir().unwrap();
    let (address, out) = dhclient6_with(&link.client, &dir.path().join("l"), &["-D", "LL"]);
    let address = address.unwrap_or_else(|| panic!("no address:\n{out}\n{}", server.log()));
    link.client
        .ip(&[
            "-6",
            "addr",
            "add",
            &format!("{address}/128"),
            "dev",
            "eth0",
            "nodad",
        ])
        .unwrap();
    link.client
        .ip(&[
            "-6",
            "addr",
            "add",
            "fd00:99::77/128",
            "dev",
            "eth0",
            "nodad",
        ])
        .unwrap();
    let get = |from: &str, path: &str| {
        let out = link
            .client
            .command("curl")
            .args(["-gs", "--interface", from, "-w", "\n%{http_code}"])
            .arg(format!("http://[{SERVER6}]:8080{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let own = get(&address, "/machines/node-2/config");
    assert!(own.ends_with("200"), "{own}\n{}", server.log());
    assert!(own.contains(&format!("http://[{SERVER6}]:8080")), "{own}");
    let stranger = get("fd00:99::77", "/machines/node-2/config");
    assert!(stranger.ends_with("403"), "{stranger}");
    let script = get(&address, "/boot.ipxe?mac=52:54:00:00:00:02");
    assert!(
        script.contains(&format!("http://[{SERVER6}]:8080/images/vmlinuz")),
        "{script}"
    );
}

/// dhcpcd (Roy Marples', as Debian's `dhcpcd-base` ships it): it starts DHCPv6 only on our
/// router advertisement's M flag (as iPXE and systemd-networkd do; ISC dhclient does not
/// wait for one), asks with a DUID-LL and gets a pool address, which it puts on the
/// interface; the bootserver's book has the lease before the Reply.
#[test]
fn dhcpcd_starts_on_our_router_advertisement_and_gets_a_pool_address() {
    let link = link_with_mac("52:54:00:00:06:0c");
    let images = fake_images();
    let server = Bootserver::start(&link.server, &config(images.path()));
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("dhcpcd.conf");
    // No hooks (the host's resolv.conf is not ours to write), IPv6 only, one IA_NA.
    std::fs::write(&conf, "ipv6only\nduid ll\nia_na 1\noption rapid_commit\n").unwrap();
    // dhcpcd keeps its DUID and leases in /var/lib/dhcpcd and its sockets in /run/dhcpcd,
    // whoever runs it: empty ones of its own (a private mount namespace), or a lease of an
    // earlier run makes it CONFIRM instead of asking.
    let out = link
        .client
        .command("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-ec"])
        .arg(
            "mkdir -p /var/lib/dhcpcd /run/dhcpcd; \
             mount -t tmpfs dhcpcd-db /var/lib/dhcpcd; mount -t tmpfs dhcpcd-run /run/dhcpcd; \
             exec timeout 60 dhcpcd -f \"$1\" -c /bin/true -6 -1 -B -t 40 eth0",
        )
        .arg("sh")
        .arg(&conf)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // dhcpcd -1 leaves its address configured when it exits.
    let addresses = link
        .client
        .ip(&["-6", "addr", "show", "dev", "eth0", "scope", "global"])
        .unwrap();
    let addresses = String::from_utf8_lossy(&addresses.stdout).into_owned();
    assert!(
        addresses.contains("inet6 fd00:99::1"),
        "no pool address on the interface:\n{addresses}\ndhcpcd:\n{text}\n{}",
        server.log()
    );
    assert!(
        text.contains("Router Advertisement from") || text.contains("RA from"),
        "dhcpcd did not hear our router advertisement:\n{text}"
    );
    let metrics = server.metrics(&link.server);
    assert_eq!(
        metric(&metrics, "unbounded_bootserver_dhcp_active_leases", ""),
        1.0,
        "{metrics}"
    );
}

/// ISC `dhcrelay -6` between the client's link (fd00:98::/64) and the server's: the
/// client gets an address of its own link's prefix (chosen by the relay's link address), the
/// Reply goes back through the relay in a Relay-Reply with the interface-id echoed.
#[test]
fn a_client_behind_dhcrelay_gets_an_address_of_its_own_link() {
    let server = Netns::new("ubs").unwrap();
    let relay = Netns::new("ubr").unwrap();
    let client = Netns::new("ubc").unwrap();
    veth((&server, "pxe0"), (&relay, "uplink"));
    veth((&relay, "downlink"), (&client, "eth0"));
    server
        .ip(&["addr", "add", "10.99.0.1/24", "dev", "pxe0"])
        .unwrap();
    for (ns, address, dev) in [
        (&server, "fd00:99::1/64", "pxe0"),
        (&relay, "fd00:99::2/64", "uplink"),
        (&relay, "fd00:98::1/64", "downlink"),
    ] {
        ns.ip(&["-6", "addr", "add", address, "dev", dev, "nodad"])
            .unwrap();
    }
    server
        .ip(&["-6", "route", "add", "fd00:98::/64", "via", "fd00:99::2"])
        .unwrap();
    wait_for_link_local(&client, "eth0");
    wait_for_link_local(&relay, "downlink");
    wait_for_link_local(&relay, "uplink");
    let images = fake_images();
    let config = config(images.path()).replace(
        "      dns: [fd00:99::1]\n",
        "      dns: [fd00:99::1]\n    - prefix: fd00:98::/64\n      pool: [fd00:98::100, fd00:98::1ff]\n",
    );
    let bootserver = Bootserver::start(&server, &config);
    let dir = tempfile::tempdir().unwrap();
    let relay_log = dir.path().join("dhcrelay.log");
    let log = std::fs::File::create(&relay_log).unwrap();
    let mut dhcrelay = relay
        .command("dhcrelay")
        .args([
            "-6",
            "-d",
            "--no-pid",
            "-I",
            "-l",
            "downlink",
            "-u",
            "fd00:99::1%uplink",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (address, out) = dhclient6(&client, &dir.path().join("l"));
    let _ = dhcrelay.kill();
    let _ = dhcrelay.wait();
    let relay_text = std::fs::read_to_string(&relay_log).unwrap_or_default();
    let address = address.unwrap_or_else(|| {
        panic!(
            "no address through the relay:\n{out}\ndhcrelay:\n{relay_text}\nbootserver:\n{}",
            bootserver.log()
        )
    });
    assert!(address.starts_with("fd00:98::1"), "{address}\n{out}");
    // dhcrelay forwards a Relay-Reply only when its interface-id names one of its links.
    assert!(relay_text.contains("Relaying Reply"), "{relay_text}");
}

/// A DHCPv6 client of its own (dhcproto), in the client's namespace: `count` clients
/// (DUID-EN `first..first+count`) each send a Solicit with Rapid Commit, about one per
/// millisecond, from one socket on port 546; returns what each was given, by client.
fn rapid_clients(
    ns: &Netns,
    first: u32,
    count: u32,
) -> std::collections::BTreeMap<u32, std::net::Ipv6Addr> {
    use dhcproto::v6::{DhcpOption, DhcpOptions, IANA, Message, MessageType};
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};
    let handle = ns
        .spawn_inside(move || {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV6,
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )
            .unwrap();
            socket.set_only_v6(true).unwrap();
            socket.bind_device(Some(b"eth0")).unwrap();
            socket
                .bind(&std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 546)).into())
                .unwrap();
            let socket: std::net::UdpSocket = socket.into();
            socket
                .set_read_timeout(Some(Duration::from_millis(5)))
                .unwrap();
            let index = rustix::net::netdevice::name_to_index(&socket, "eth0").unwrap();
            let to = std::net::SocketAddrV6::new("ff02::1:2".parse().unwrap(), 547, 0, index);
            let duid = |n: u32| {
                let mut d = vec![0, 2, 0, 0, 0x01, 0x57];
                d.extend_from_slice(&n.to_be_bytes());
                d
            };
            let mut given = std::collections::BTreeMap::new();
            let mut buf = [0u8; 1500];
            let mut receive = |given: &mut std::collections::BTreeMap<u32, std::net::Ipv6Addr>| {
                while let Ok(len) = socket.recv(&mut buf) {
                    let Ok(reply) = Message::decode(&mut Decoder::new(&buf[..len])) else {
                        continue;
                    };
                    if reply.msg_type() != MessageType::Reply {
                        continue;
                    }
                    let client =
                        u32::from_be_bytes([0, reply.xid()[0], reply.xid()[1], reply.xid()[2]]);
                    let address = reply.opts().iter().find_map(|o| match o {
                        DhcpOption::IANA(ia) => ia.opts.iter().find_map(|o| match o {
                            DhcpOption::IAAddr(a) if a.valid_life > 0 => Some(a.addr),
                            _ => None,
                        }),
                        _ => None,
                    });
                    if let Some(address) = address {
                        given.insert(client, address);
                    }
                }
            };
            for n in first..first + count {
                let xid = n.to_be_bytes();
                let mut m = Message::new_with_id(MessageType::Solicit, [xid[1], xid[2], xid[3]]);
                m.opts_mut().insert(DhcpOption::ClientId(duid(n)));
                m.opts_mut().insert(DhcpOption::RapidCommit);
                m.opts_mut().insert(DhcpOption::IANA(IANA {
                    id: 1,
                    t1: 0,
                    t2: 0,
                    opts: DhcpOptions::new(),
                }));
                let mut bytes = Vec::new();
                m.encode(&mut Encoder::new(&mut bytes)).unwrap();
                let _ = socket.send_to(&bytes, to);
                receive(&mut given);
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                receive(&mut given);
            }
            given
        })
        .unwrap();
    handle.join().unwrap().unwrap()
}

/// `kill -9` in the middle of a stream of Rapid Commit exchanges: every address a client
/// was given is on disk (active after the restart, before anyone asks), no address went to
/// two clients, and clients after the restart get none of them.
#[test]
fn a_kill_9_mid_stream_loses_no_acknowledged_v6_lease() {
    let link = link();
    let images = fake_images();
    let mut server = Bootserver::start(&link.server, &config(images.path()));
    // The server dies while the clients are still sending.
    let stream = std::thread::scope(|scope| {
        let sender = scope.spawn(|| rapid_clients(&link.client, 0, 200));
        std::thread::sleep(Duration::from_millis(400));
        server.kill();
        sender.join().unwrap()
    });
    assert!(
        !stream.is_empty(),
        "no Reply before the kill:\n{}",
        server.log()
    );
    let addresses: std::collections::BTreeSet<_> = stream.values().collect();
    assert_eq!(
        addresses.len(),
        stream.len(),
        "one address for two clients: {stream:?}"
    );

    server.crash_and_restart(&link.server);
    let metrics = server.metrics(&link.server);
    let active = metric(&metrics, "unbounded_bootserver_dhcp_active_leases", "");
    assert!(
        active >= stream.len() as f64,
        "{} Replies went out, {active} leases are on disk",
        stream.len()
    );
    let later = rapid_clients(&link.client, 1000, 50);
    assert!(!later.is_empty(), "{}", server.log());
    for (client, address) in &later {
        assert!(
            !addresses.contains(address),
            "{address} given to {client} after the restart, and to another before"
        );
    }
    eprintln!(
        "kill -9 mid-stream: {} Replies before, {active} leases after, {} new clients served",
        stream.len(),
        later.len()
    );
}
