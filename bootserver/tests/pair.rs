#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Two bootserver processes as a pair (docs/bootserver.md, "Two bootservers on one
//! network") on one provisioning network in namespaces the tests create, a relay-mode load
//! generator sending every message to both, and the failures the pair must survive: a
//! `kill -9` mid-storm, a cut link between the two, a restart on an empty disk. After each,
//! both servers' lease logs are read and checked together: no address held by two clients.
//!
//! ```text
//!  [a] pxe0 10.99.0.1 ─┐                      ┌─ pxe0 10.99.0.3 [b]
//!                       └── br0 10.99.0.2 ───┘   (the relay: dhcp-load)
//!  [a] ha0 10.98.0.1 ──────────────────────────── ha0 10.98.0.2 [b]   (the pair's link)
//! ```

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use unbounded_bootserver::backend::MacAddr;
use unbounded_bootserver::leases::{ClientKey, FileStore, LeaseLog, Record};
use unbounded_testbed::netns::Netns;

/// One pair at a time: each storm wants the two cores.
static ONE_PAIR: Mutex<()> = Mutex::new(());

const A: &str = "10.99.0.1";
const B: &str = "10.99.0.3";
const RELAY: &str = "10.99.0.2";
/// The pool's halves: a (the lower name) owns 10.99.1.0–10.99.100.255, b the rest.
const POOL: (&str, &str) = ("10.99.1.0", "10.99.200.255");
const INTERRUPTED_AFTER: u64 = 3;

struct PairLab {
    a: Netns,
    b: Netns,
    lan: Netns,
    key: tempfile::TempDir,
    images: tempfile::TempDir,
    /// The pool (the whole, as both servers' settings write it).
    pool: (&'static str, &'static str),
    /// Extra top-level settings (the Kubernetes backend) and the servers' environment.
    extra: String,
    env: Vec<(String, String)>,
}

impl PairLab {
    fn new() -> Self {
        let lan = Netns::new("ubl").unwrap();
        lan.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        lan.ip(&["addr", "add", &format!("{RELAY}/16"), "dev", "br0"])
            .unwrap();
        lan.ip(&["link", "set", "br0", "up"]).unwrap();
        let (a, b) = (Netns::new("uba").unwrap(), Netns::new("ubb").unwrap());
        for (ns, port, address) in [(&a, "pa", A), (&b, "pb", B)] {
            veth((ns, "pxe0"), (&lan, port));
            lan.ip(&["link", "set", port, "master", "br0"]).unwrap();
            ns.ip(&["addr", "add", &format!("{address}/16"), "dev", "pxe0"])
                .unwrap();
        }
        veth((&a, "ha0"), (&b, "ha0"));
        a.ip(&["addr", "add", "10.98.0.1/30", "dev", "ha0"])
            .unwrap();
        b.ip(&["addr", "add", "10.98.0.2/30", "dev", "ha0"])
            .unwrap();
        let key = tempfile::tempdir().unwrap();
        std::fs::write(
            key.path().join("pair.key"),
            "c2hhcmVkIGJ5IGJvdGggc2VydmVycyBvZiB0aGUgcGFpcg==\n",
        )
        .unwrap();
        Self {
            a,
            b,
            lan,
            key,
            images: fake_images(),
            pool: POOL,
            extra: String::new(),
            env: Vec::new(),
        }
    }

    fn config(&self, name: &str) -> String {
        let (address, partner, own_link, partner_link) = if name == "a" {
            (A, "b", "10.98.0.1", "10.98.0.2")
        } else {
            (B, "a", "10.98.0.2", "10.98.0.1")
        };
        format!(
            r#"interface: pxe0
serverAddress: {address}
dhcp:
  mode: full
  leaseFile: "{{dir}}/leases.log"
  subnets:
    - subnet: 10.99.0.0/16
      pool: [{}, {}]
      gateway: {A}
      leaseSeconds: {}
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{}"}}
{}
ha:
  name: {name}
  partner: {{name: {partner}, address: "{partner_link}:8647"}}
  listen: "{own_link}:8647"
  keyFile: "{}"
  interruptedAfterSeconds: {INTERRUPTED_AFTER}
"#,
            self.pool.0,
            self.pool.1,
            if self.extra.is_empty() { 600 } else { 60 },
            self.images.path().display(),
            self.extra,
            self.key.path().join("pair.key").display()
        )
    }

    fn start(&self, name: &str) -> Bootserver {
        let (ns, address) = if name == "a" {
            (&self.a, A)
        } else {
            (&self.b, B)
        };
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Bootserver::start_at(ns, &self.config(name), &env, address)
    }

    fn ns(&self, name: &str) -> &Netns {
        if name == "a" { &self.a } else { &self.b }
    }

    /// Starts both servers and waits until the pair is up.
    fn start_both(&self) -> (Bootserver, Bootserver) {
        let (a, b) = (self.start("a"), self.start("b"));
        self.wait_up(&a, &b);
        (a, b)
    }

    /// Waits until both servers say the pair is up.
    fn wait_up(&self, a: &Bootserver, b: &Bootserver) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let states = [state(a, &self.a), state(b, &self.b)];
            if states.iter().all(|s| s == "up") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the pair is not up: a {}, b {}\n--- a:\n{}\n--- b:\n{}",
                states[0],
                states[1],
                tail(&a.log()),
                tail(&b.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The load generator for clients `first..first + clients`, sending to both servers.
    fn storm(&self, first: u32, clients: u32, out: &Path) -> Child {
        self.lan
            .command(env!("CARGO_BIN_EXE_dhcp-load"))
            .args(["--relay", RELAY, "--server", A, "--server", B])
            .args(["--first", &first.to_string()])
            .args(["--clients", &clients.to_string()])
            .args(["--timeout-seconds", "120", "--window", "32", "--retry-naks"])
            .arg("--leases-out")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// The pair's state a server reports in its metrics.
fn state(server: &Bootserver, ns: &Netns) -> String {
    let metrics = server.metrics(ns);
    ["up", "interrupted", "partner-down", "recovering"]
        .into_iter()
        .find(|s| {
            metric(
                &metrics,
                "unbounded_bootserver_pair_state",
                &format!("state=\"{s}\""),
            ) == 1.0
        })
        .unwrap_or("none")
        .to_owned()
}

/// A log without its colours.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Waits for a storm; asserts every client got an address, and returns `mac → ip`.
fn finish(storm: Child, out: &Path) -> BTreeMap<String, String> {
    let output = storm.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "every client gets an address: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("storm: {stdout}");
    let text = std::fs::read_to_string(out).unwrap();
    let leases: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(mac, ip)| (mac.to_owned(), ip.to_owned()))
        .collect();
    assert_eq!(
        leases.len(),
        text.lines().count(),
        "one ACK line per client"
    );
    assert_no_address_twice(&leases);
    leases
}

fn assert_no_address_twice(leases: &BTreeMap<String, String>) {
    let mut holders: HashMap<&String, &String> = HashMap::new();
    for (mac, ip) in leases {
        if let Some(other) = holders.insert(ip, mac) {
            panic!("{ip} acknowledged to {other} and to {mac}");
        }
    }
}

fn key_of(mac: &str) -> ClientKey {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    ClientKey::Hardware(MacAddr(bytes.try_into().unwrap()))
}

/// A server's leases as its log holds them (read from a copy: the server may be running),
/// live at `now`: `client → address`.
fn book(server: &Bootserver) -> HashMap<ClientKey, IpAddr> {
    let copy = tempfile::tempdir().unwrap();
    let path = copy.path().join("leases.log");
    std::fs::copy(server.dir.path().join("leases.log"), &path).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    FileStore::open(&path)
        .unwrap()
        .durable()
        .unwrap()
        .records()
        .filter_map(|record| match record {
            Record::Commit(lease) if lease.expires_unix > now => Some((lease.key, lease.ip)),
            _ => None,
        })
        .collect()
}

/// No address is held by two clients across both servers' logs.
fn assert_one_holder_across(a: &HashMap<ClientKey, IpAddr>, b: &HashMap<ClientKey, IpAddr>) {
    let mut holders: HashMap<IpAddr, &ClientKey> = HashMap::new();
    for (key, ip) in a.iter().chain(b.iter()) {
        if let Some(other) = holders.insert(*ip, key)
            && other != key
        {
            panic!("{ip} is held by {other:?} and by {key:?} across the pair's logs");
        }
    }
}

fn in_lower_half(ip: &str) -> bool {
    let ip: Ipv4Addr = ip.parse().unwrap();
    ip <= Ipv4Addr::new(10, 99, 100, 255)
}

/// `kill -9` of one server while a storm runs: every client still gets an address from
/// the other, no address is acknowledged twice, every lease the dead server acknowledged
/// was in its partner's log first, and after a restart on its own disk the two agree and
/// every client keeps its address.
#[test]
fn a_server_killed_mid_storm_loses_no_client_and_gives_no_address_twice() {
    let _one = ONE_PAIR.lock().unwrap_or_else(|e| e.into_inner());
    let lab = PairLab::new();
    let (mut a, b) = lab.start_both();
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.txt");
    let mut storm = lab.storm(0, 6_000, &first);
    std::thread::sleep(Duration::from_millis(1000));
    if storm.try_wait().unwrap().is_some() {
        let output = storm.wait_with_output().unwrap();
        panic!(
            "the storm ended before the kill: {}{}\n--- a:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            tail(&a.log())
        );
    }
    let before = a.metrics(&lab.a);
    assert_eq!(
        metric(
            &before,
            "unbounded_bootserver_pair_replication_timeouts",
            ""
        ),
        0.0,
        "a waited in vain for its partner while the pair was up:\n{before}"
    );
    let killed_at = Instant::now();
    a.kill();
    let leases = finish(storm, &first);
    eprintln!("the storm ended {:?} after the kill", killed_at.elapsed());
    let by_a = leases.values().filter(|ip| in_lower_half(ip)).count();
    assert!(by_a > 0, "a acknowledged some leases before the kill");
    assert!(by_a < leases.len(), "b served the rest");

    // Every lease of a's half (only a allocates there) was in b's log before its ACK.
    let b_book = book(&b);
    for (mac, ip) in leases.iter().filter(|(_, ip)| in_lower_half(ip)) {
        assert_eq!(
            b_book.get(&key_of(mac)).map(IpAddr::to_string).as_deref(),
            Some(ip.as_str()),
            "{mac}: a acknowledged {ip}; b's log does not have it"
        );
    }

    // a comes back on its own disk: it catches up, the pair is up again, and every client
    // (asking again, with some new ones) keeps its address.
    a.crash_and_restart(&lab.a);
    lab.wait_up(&a, &b);
    // Its log, with the partner's catch-up, holds every client where the client is.
    let a_book = book(&a);
    let wrong: Vec<_> = leases
        .iter()
        .filter(|(mac, ip)| {
            a_book.get(&key_of(mac)).map(IpAddr::to_string).as_deref() != Some(ip.as_str())
        })
        .map(|(mac, ip)| (mac, ip, a_book.get(&key_of(mac))))
        .collect();
    assert!(
        wrong.is_empty(),
        "a's log after the catch-up does not hold these clients' leases (client, its address, a's): {wrong:?}"
    );
    let second = dir.path().join("second.txt");
    let again = finish(lab.storm(0, 15_500, &second), &second);
    let pair_metrics = |server: &Bootserver, ns| {
        server
            .metrics(ns)
            .lines()
            .filter(|l| l.contains("pair_") || l.contains("dropped"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (a_book, b_book) = (book(&a), book(&b));
    for (mac, ip) in &leases {
        let history = |server: &Bootserver| {
            server
                .log()
                .lines()
                .filter(|l| l.contains(mac.as_str()) || l.contains("pair:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            again.get(mac).map(String::as_str),
            Some(ip.as_str()),
            "{mac} kept its address {ip}; a's book {:?}, b's book {:?}\n--- a:\n{}\n{}\n--- b:\n{}\n{}",
            a_book.get(&key_of(mac)),
            b_book.get(&key_of(mac)),
            pair_metrics(&a, &lab.a),
            history(&a),
            pair_metrics(&b, &lab.b),
            history(&b),
        );
    }
    assert_one_holder_across(&book(&a), &book(&b));
    for server in [&a, &b] {
        assert!(!server.log().contains("panicked"), "{}", server.log());
    }
}

/// The link between the two is cut while clients keep coming: both serve every client
/// from their own half, no address is given twice, and once the link heals the two
/// catch up and hold the same leases.
#[test]
fn a_cut_link_gives_no_address_twice_and_the_pair_agrees_after_it_heals() {
    let _one = ONE_PAIR.lock().unwrap_or_else(|e| e.into_inner());
    let lab = PairLab::new();
    let (a, b) = lab.start_both();
    let dir = tempfile::tempdir().unwrap();
    let mut all = BTreeMap::new();
    let out = dir.path().join("up.txt");
    all.extend(finish(lab.storm(0, 800, &out), &out));

    lab.a.ip(&["link", "set", "ha0", "down"]).unwrap();
    let out = dir.path().join("cut.txt");
    let during = finish(lab.storm(800, 800, &out), &out);
    assert!(
        during.values().any(|ip| in_lower_half(ip)) && during.values().any(|ip| !in_lower_half(ip)),
        "cut off from each other, both served"
    );
    // Each sees the other silent within interruptedAfterSeconds (or sooner, at its first
    // replication that is not answered).
    let deadline = Instant::now() + Duration::from_secs(2 * INTERRUPTED_AFTER + 5);
    while [state(&a, &lab.a), state(&b, &lab.b)] != ["interrupted", "interrupted"] {
        assert!(
            Instant::now() < deadline,
            "the cut is not seen:\n--- a:\n{}",
            tail(&plain(&a.log()))
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    all.extend(during);

    lab.a.ip(&["link", "set", "ha0", "up"]).unwrap();
    lab.wait_up(&a, &b);
    let out = dir.path().join("healed.txt");
    all.extend(finish(lab.storm(1600, 400, &out), &out));
    assert_no_address_twice(&all);

    // After the catch-up both logs hold every client's lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (a_book, b_book) = (book(&a), book(&b));
        assert_one_holder_across(&a_book, &b_book);
        let missing: Vec<&String> = all
            .iter()
            .filter(|(mac, ip)| {
                let key = key_of(mac);
                [&a_book, &b_book].iter().any(|book| {
                    book.get(&key).map(IpAddr::to_string).as_deref() != Some(ip.as_str())
                })
            })
            .map(|(mac, _)| mac)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} leases not in both logs, such as {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A server that starts on an empty disk serves nobody until its partner's catch-up made
/// its book whole; then every client keeps its address.
#[test]
fn a_server_on_an_empty_disk_catches_up_before_it_serves() {
    let _one = ONE_PAIR.lock().unwrap_or_else(|e| e.into_inner());
    let lab = PairLab::new();
    let (mut a, b) = lab.start_both();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("first.txt");
    let leases = finish(lab.storm(0, 1000, &out), &out);

    a.kill();
    std::fs::remove_file(a.dir.path().join("leases.log")).unwrap();
    a.crash_and_restart(lab.ns("a"));
    lab.wait_up(&a, &b);
    // Its second life: it knew its log was new, and caught up before its first ACK.
    let log = plain(&a.log());
    let second_life = log.rfind("one of a pair").map(|at| &log[at..]).unwrap();
    assert!(second_life.contains("new_log=true"), "{second_life}");
    let caught_up = second_life
        .find("caught up with the partner's log")
        .expect("a caught up");
    assert!(
        second_life
            .find("DHCP ACK")
            .is_none_or(|first_ack| first_ack > caught_up),
        "a acknowledged a lease before its catch-up:\n{second_life}"
    );
    let a_book = book(&a);
    for (mac, ip) in leases.iter().filter(|(_, ip)| in_lower_half(ip)) {
        assert_eq!(
            a_book.get(&key_of(mac)).map(IpAddr::to_string).as_deref(),
            Some(ip.as_str()),
            "{mac}: {ip} came back to a from b"
        );
    }
    let out = dir.path().join("again.txt");
    let again = finish(lab.storm(0, 1200, &out), &out);
    for (mac, ip) in &leases {
        assert_eq!(again.get(mac), Some(ip), "{mac} kept its address");
    }
    assert_one_holder_across(&book(&a), &book(&b));
}

/// With an API server each part is fenced by a Lease. `kill -9` of one server: its partner
/// takes the dead one's part once the part's Lease went unrenewed, binds there once the
/// longest lease has passed (every client gets an address though its own half is too
/// small), and hands the part back when the other returns.
#[test]
fn a_fenced_pair_takes_over_a_dead_servers_part_and_hands_it_back() {
    use k8s_openapi::api::coordination::v1::Lease;
    use unbounded_testbed::cluster::LocalControlPlane;
    use unbounded_testbed::netns::LoopbackForward;

    let _one = ONE_PAIR.lock().unwrap_or_else(|e| e.into_inner());
    let cp = LocalControlPlane::shared().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(cp.client()).unwrap();
    let namespace = unbounded_testbed::netns::unique("pair").to_lowercase();
    runtime
        .block_on(async {
            let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                kube::Api::all(client.clone());
            let object = serde_json::from_value(serde_json::json!({
                "metadata": {"name": namespace}
            }))
            .unwrap();
            namespaces
                .create(&kube::api::PostParams::default(), &object)
                .await
        })
        .unwrap();
    let holder = |owner: &str| {
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &namespace);
        runtime
            .block_on(leases.get_opt(&format!("unbounded-bootserver-part-{owner}")))
            .unwrap()
            .and_then(|lease| lease.spec?.holder_identity)
    };

    let mut lab = PairLab::new();
    // Twenty addresses: ten for each half.
    lab.pool = ("10.99.1.0", "10.99.1.19");
    lab.extra = "backend: kubernetes\npower: {enabled: false}".into();
    let (_kubeconfig_dir, kubeconfig) = namespace_kubeconfig(cp);
    lab.env = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("UNBOUNDED_LEADER_ELECTION_NAMESPACE", namespace.clone()),
        ("UNBOUNDED_LEADER_ELECTION_LEASE_DURATION", "6s".into()),
        ("UNBOUNDED_LEADER_ELECTION_RENEW_DEADLINE", "4s".into()),
        ("UNBOUNDED_LEADER_ELECTION_RETRY_PERIOD", "1s".into()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec();
    let _forwards =
        [&lab.a, &lab.b].map(|ns| LoopbackForward::new(ns, 6443, &api_server_target(cp)).unwrap());
    let (mut a, b) = lab.start_both();
    assert_eq!(holder("a").as_deref(), Some("a"));
    assert_eq!(holder("b").as_deref(), Some("b"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("up.txt");
    finish(lab.storm(0, 6, &out), &out);

    a.kill();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(60);
    while state(&b, &lab.b) != "partner-down" {
        assert!(
            Instant::now() < deadline,
            "b did not take a's part:\n{}",
            tail(&plain(&b.log()))
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let taken = Instant::now();
    eprintln!("b took a's part {:?} after the kill", taken - killed);
    assert_eq!(holder("a").as_deref(), Some("b"), "b holds a's part");
    // At once b serves alone, from its own half.
    let out = dir.path().join("alone.txt");
    let alone = finish(lab.storm(100, 5, &out), &out);
    assert!(
        alone.values().all(|ip| !in_lower_half_of(ip, "10.99.1.9")),
        "nothing in a's part before the longest lease has passed: {alone:?}"
    );
    // Once the longest lease (60 s) has passed since, whatever a gave there has ended: b
    // binds in a's part too (its scans start at the pool's first address, a's).
    std::thread::sleep((taken + Duration::from_secs(61)).saturating_duration_since(Instant::now()));
    let out = dir.path().join("taken.txt");
    let taken_over = finish(lab.storm(200, 6, &out), &out);
    assert!(
        taken_over
            .values()
            .any(|ip| in_lower_half_of(ip, "10.99.1.9")),
        "b binds in a's part once it may: {taken_over:?}"
    );
    assert_one_holder_across(&book(&a), &book(&b));

    // a returns: b hands its part back (once its offers there lapsed), and both are up.
    a.crash_and_restart(&lab.a);
    let returned = Instant::now();
    let deadline = returned + Duration::from_secs(120);
    while holder("a").as_deref() != Some("a") {
        assert!(
            Instant::now() < deadline,
            "a's part not handed back:\n--- b:\n{}",
            tail(&plain(&b.log()))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "a's part was back {:?} after it returned",
        returned.elapsed()
    );
    lab.wait_up(&a, &b);
    // a's log holds what b bound in a's part meanwhile, and new clients get addresses
    // that nobody holds.
    let a_book = book(&a);
    for (mac, ip) in taken_over
        .iter()
        .filter(|(_, ip)| in_lower_half_of(ip, "10.99.1.9"))
    {
        assert_eq!(
            a_book.get(&key_of(mac)).map(IpAddr::to_string).as_deref(),
            Some(ip.as_str()),
            "{mac}: b bound {ip} in a's part; a's log does not have it"
        );
    }
    let out = dir.path().join("back.txt");
    finish(lab.storm(300, 4, &out), &out);
    assert_one_holder_across(&book(&a), &book(&b));
    let log = plain(&b.log());
    assert!(log.contains("took its part"), "{}", tail(&log));
    assert!(
        log.contains("handed the partner's part back"),
        "{}",
        tail(&log)
    );
}

/// Whether `ip` lies at or below `last` (the lower half's last address).
fn in_lower_half_of(ip: &str, last: &str) -> bool {
    ip.parse::<Ipv4Addr>().unwrap() <= last.parse::<Ipv4Addr>().unwrap()
}
