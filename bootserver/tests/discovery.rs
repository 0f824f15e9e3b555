#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Discovery on a real control plane: the bootserver (the binary, running as its own
//! ServiceAccount with `deploy/`'s RBAC) serves an unknown MAC the inspection boot, turns an
//! inspection report into exactly one Machine (label `discovery=waiting`, condition
//! `Discovered`, phase `Pending`) and its MachineInventory, updates rather than duplicates,
//! refuses what the door's bounds refuse with a 4xx and writes nothing, and gives a waiting
//! Machine neither credentials, nor a configuration, nor a boot script of its own.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use unbounded_agent::inspect::{Answer, Step, next_step};
use unbounded_testbed::cluster::{LocalControlPlane, deploy_dir};
use unbounded_testbed::netns::{Link, LoopbackForward, Netns};
use unbounded_testbed::testkit::{kubectl, kubectl_ok as ok, wait_until_blocking as wait_until};

/// The tests share the control plane of this binary: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const LABEL: &str = "unbounded-cloud.io/discovery";

fn get_json(cp: &LocalControlPlane, kind: &str, name: &str) -> Option<Value> {
    let (found, out) = kubectl(cp, &["get", kind, name, "-o", "json"], None);
    found.then(|| serde_json::from_str(&out).unwrap())
}

/// The names of the Machines discovery created (any value of its label).
fn discovered(cp: &LocalControlPlane) -> Vec<String> {
    let out = ok(
        cp,
        &[
            "get",
            "machines",
            "-l",
            LABEL,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    out.split_whitespace().map(str::to_owned).collect()
}

/// curl from the client namespace: (HTTP status, headers and body).
fn curl(link: &Link, args: &[&str]) -> (u16, String) {
    curl_in(&link.client, args)
}

fn curl_in(ns: &Netns, args: &[&str]) -> (u16, String) {
    let mut full = vec!["curl", "-s", "-i", "-w", "\n%{http_code}"];
    full.extend_from_slice(args);
    let out = ns.command(full[0]).args(&full[1..]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn get(link: &Link, path: &str) -> (u16, String) {
    curl(link, &[&format!("http://{SERVER}:8080{path}")])
}

/// Runs the agent's own HTTP code in the client namespace (a machine on the provisioning
/// network), with an HTTP client and the bootserver's base URL, as the agent's binary sets
/// them up.
fn as_the_agent<T, F, Fut>(ns: &Netns, work: F) -> T
where
    T: Send + 'static,
    F: FnOnce(reqwest::Client, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    ns.spawn_inside(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // As the agent's binary does at its start.
        let _ = rustls::crypto::ring::default_provider().install_default();
        runtime.block_on(work(
            reqwest::Client::new(),
            format!("http://{SERVER}:8080"),
        ))
    })
    .unwrap()
    .join()
    .unwrap()
    .unwrap()
}

/// Posts `body` (written to a file, so that any size goes) to the discovery route.
fn post_report(link: &Link, dir: &Path, body: &str, extra: &[&str]) -> (u16, String) {
    post_report_in(&link.client, dir, body, extra)
}

fn post_report_in(ns: &Netns, dir: &Path, body: &str, extra: &[&str]) -> (u16, String) {
    let file = dir.join("report.json");
    std::fs::write(&file, body).unwrap();
    let data = format!("@{}", file.display());
    let url = format!("http://{SERVER}:8080/discovery/inventory");
    let mut args = vec![
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &data,
    ];
    args.extend_from_slice(extra);
    args.push(&url);
    curl_in(ns, &args)
}

fn origin() -> Value {
    // What the report claims; the bootserver stamps its own time instead.
    json!({"source": "Redfish", "observedAt": "2001-01-01T00:00:00Z"})
}

/// An inspection report: `macs[0]` booted; `disks` virtio disks of 20 GiB.
fn report(macs: &[&str], disks: usize) -> Value {
    let nics: Vec<Value> = macs
        .iter()
        .enumerate()
        .map(|(i, mac)| json!({"name": format!("eth{i}"), "mac": mac, "link": true, "pxeBooted": i == 0, "speedMbps": 10000}))
        .collect();
    let devices: Vec<Value> = (0..disks)
        .map(|i| json!({"name": format!("vd{}", char::from(b'a' + i as u8)), "sizeBytes": 21_474_836_480_i64, "rotational": false}))
        .collect();
    json!({
        "bootMac": macs[0],
        "inventory": {
            "cpu": {"origin": origin(), "architecture": "x86_64", "model": "QEMU Virtual CPU", "sockets": 1, "cores": 4, "threads": 4, "flags": ["vmx"]},
            "memory": {"origin": origin(), "totalBytes": 8_589_934_592_i64},
            "disks": {"origin": origin(), "devices": devices},
            "nics": {"origin": origin(), "interfaces": nics},
            "system": {"origin": origin(), "vendor": "QEMU", "product": "Standard PC (Q35 + ICH9, 2009)", "serial": "lab-0001"},
            "firmware": {"origin": origin(), "mode": "uefi"},
        }
    })
}

fn service_account_token(cp: &LocalControlPlane, namespace: &str, account: &str) -> String {
    ok(
        cp,
        &["create", "token", account, "-n", namespace, "--duration=1h"],
        None,
    )
    .trim()
    .to_owned()
}

fn token_kubeconfig(cp: &LocalControlPlane, dir: &Path, token: &str) -> std::path::PathBuf {
    let path = dir.join("bootserver.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            cp.data_dir().join("pki/ca.crt").display()
        ),
    )
    .unwrap();
    path
}

/// A provisioning link with the bootserver in discovery mode, as its own ServiceAccount.
struct Site {
    link: Link,
    _forward: LoopbackForward,
    bootserver: Bootserver,
    _images: tempfile::TempDir,
    dir: tempfile::TempDir,
    client_mac: String,
    /// ProxyDHCP (a report is vouched for by its PXE exchange).
    proxy: bool,
    /// Other hosts on the link, by MAC: (namespace, address).
    hosts: std::cell::RefCell<Vec<(String, std::rc::Rc<Netns>, String)>>,
}

impl Site {
    fn start(cp: &'static LocalControlPlane, client_mac: &str, dhcp: &str) -> Self {
        let deploy = deploy_dir();
        for part in ["namespace.yaml", "rbac"] {
            let path = deploy.join(part).display().to_string();
            ok(cp, &["apply", "--server-side", "-f", &path], None);
        }
        let images = fake_images();
        let link = Link::new(&format!("{SERVER}/24"), client_mac).unwrap();
        // A static address: leased by nobody.
        link.client
            .ip(&["addr", "add", "10.99.0.2/24", "dev", "eth0"])
            .unwrap();
        let forward = LoopbackForward::new(&link.server, 6443, &api_server_target(cp)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let token = service_account_token(cp, "unbounded-system", "unbounded-bootserver");
        let kubeconfig = token_kubeconfig(cp, dir.path(), &token);
        let config = format!(
            r#"interface: pxe0
serverAddress: {SERVER}
routerAdvertisements: false
backend: kubernetes
power: {{enabled: false}}
dhcp:
{dhcp}
  unknownMachines: discover
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
credentials:
  apiServer: {server}
  caFile: "{ca}"
discovery:
  boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
  creationsPerMinute: 3
  maxUnclaimed: 10
  maxBodyBytes: 8192
"#,
            images = images.path().display(),
            server = cp.server_url(),
            ca = cp.data_dir().join("pki/ca.crt").display(),
        );
        let kubeconfig_env = kubeconfig.display().to_string();
        let bootserver = Bootserver::start_with_env(
            &link.server,
            &config,
            &[("KUBECONFIG", kubeconfig_env.as_str())],
        );
        let site = Self {
            link,
            _forward: forward,
            bootserver,
            _images: images,
            dir,
            client_mac: client_mac.to_owned(),
            proxy: dhcp.contains("mode: proxy"),
            hosts: Default::default(),
        };
        site.wait_ready();
        site
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(&self.link, "/readyz").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "bootserver not ready: {}\n{}",
                get(&self.link, "/readyz").1,
                self.bootserver.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The host on the link whose NIC has `mac`, and its address (the link's client for
    /// the site's own MAC; a host of its own for any other), after the PXE exchange that
    /// its iPXE would have had with the bootserver (which vouches for it as `mac` in proxy
    /// mode).
    fn host(&self, mac: &str) -> (std::rc::Rc<Netns>, String) {
        let found = self
            .hosts
            .borrow()
            .iter()
            .find(|(m, _, _)| m == mac)
            .map(|(_, ns, ip)| (ns.clone(), ip.clone()));
        let (ns, ip) = found.unwrap_or_else(|| {
            let mut hosts = self.hosts.borrow_mut();
            let ip = format!("10.99.0.{}", 10 + hosts.len());
            let ns = std::rc::Rc::new(self.link.host(mac, &format!("{ip}/24")).unwrap());
            hosts.push((mac.to_owned(), ns.clone(), ip.clone()));
            (ns, ip)
        });
        assert!(
            pxe_exchange(&ns, mac, &ip).is_some(),
            "the bootserver answered {mac}'s PXE exchange"
        );
        (ns, ip)
    }

    /// Posts a report from the host of its boot MAC, as an inspection agent would.
    fn post(&self, body: &Value) -> (u16, String) {
        let boot_mac = body["bootMac"].as_str().unwrap_or_default();
        if boot_mac == self.client_mac {
            if self.proxy {
                assert!(pxe_exchange(&self.link.client, boot_mac, "10.99.0.2").is_some());
            }
            return post_report(&self.link, self.dir.path(), &body.to_string(), &[]);
        }
        let (ns, _) = self.host(boot_mac);
        post_report_in(&ns, self.dir.path(), &body.to_string(), &[])
    }

    fn metrics(&self) -> String {
        self.bootserver.metrics(&self.link.server)
    }
}

fn clean(cp: &LocalControlPlane) {
    let _ = kubectl(
        cp,
        &["delete", "machines", "-l", LABEL, "--wait=true"],
        None,
    );
    let _ = kubectl(
        cp,
        &[
            "delete",
            "machine",
            "declared-e1",
            "--ignore-not-found",
            "--wait=true",
        ],
        None,
    );
}

#[test]
fn an_unknown_server_becomes_one_waiting_machine_and_the_door_holds() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    clean(cp);
    let (mac_a, mac_a2, mac_a3) = (
        "52:54:00:0d:00:01",
        "52:54:00:0d:00:02",
        "52:54:00:0d:00:03",
    );
    let mut site = Site::start(cp, mac_a, "  mode: proxy");
    let link = &site.link;

    // An unknown MAC chains to the inspection boot, which boots the host OS with the inspect
    // argument, the bootserver's URL and the boot MAC, and no identity or nonce.
    let (code, script) = get(link, &format!("/boot.ipxe?mac={mac_a}"));
    assert_eq!(code, 200);
    assert!(
        script.contains(&format!(
            "chain http://{SERVER}:8080/discover.ipxe?mac={mac_a}"
        )),
        "{script}"
    );
    let (code, script) = get(link, &format!("/discover.ipxe?mac={mac_a}"));
    assert_eq!(code, 200);
    assert!(
        script.contains(&format!(
            "kernel http://{SERVER}:8080/images/vmlinuz initrd=initrd console=ttyS0 unbounded.inspect=1 unbounded.bootserver=http://{SERVER}:8080 BOOTIF=01-52-54-00-0d-00-01"
        )),
        "{script}"
    );
    assert!(script.contains(&format!(
        "initrd --name initrd http://{SERVER}:8080/images/initrd.img"
    )));
    assert!(!script.contains("unbounded.nonce") && !script.contains("unbounded.machine"));

    // A report creates exactly one Machine and its inventory.
    let (code, answer) = site.post(&report(&[mac_a, mac_a2], 1));
    assert_eq!(code, 201, "{answer}");
    let name = "discovered-5254000d0001";
    assert!(answer.contains(name), "{answer}");
    assert_eq!(discovered(cp), vec![name.to_owned()]);
    let machine = get_json(cp, "machine", name).unwrap();
    assert_eq!(machine["metadata"]["labels"][LABEL], "waiting");
    assert_eq!(
        machine["metadata"]["labels"]["hardware.unbounded-cloud.io/cpus"],
        "4"
    );
    assert_eq!(machine["spec"]["provider"], "pxe");
    // Its boot MAC only: the one MAC the bootserver saw it hold. The other NIC is an
    // inventory fact.
    assert_eq!(machine["spec"]["pxe"]["macAddresses"], json!([mac_a]));
    assert_eq!(machine["spec"]["pxe"]["firmware"], "uefi");
    assert!(machine["spec"].get("configurationRef").is_none());
    assert_eq!(machine["status"]["phase"], "Pending");
    let condition = machine["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Discovered")
        .cloned()
        .unwrap();
    assert_eq!(
        (condition["status"].as_str(), condition["reason"].as_str()),
        (Some("True"), Some("WaitingToBeClaimed"))
    );
    let inventory = get_json(cp, "machineinventory", name).unwrap();
    assert_eq!(inventory["metadata"]["ownerReferences"][0]["name"], name);
    assert_eq!(
        inventory["metadata"]["ownerReferences"][0]["uid"],
        machine["metadata"]["uid"]
    );
    assert_eq!(inventory["spec"]["nics"]["origin"]["source"], "InBand");
    assert_ne!(
        inventory["spec"]["cpu"]["origin"]["observedAt"], "2001-01-01T00:00:00Z",
        "the bootserver stamps its own time"
    );
    assert_eq!(
        inventory["spec"]["disks"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // The same MACs at once: too soon (429), nothing new.
    let (code, answer) = site.post(&report(&[mac_a, mac_a2], 1));
    assert_eq!(code, 429, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("unbounded-refusal: too_soon"),
        "{answer}"
    );
    assert_eq!(discovered(cp), vec![name.to_owned()]);

    // The agent's own inspection code, from the machine's side: a real inventory of this
    // host (read by the agent's parsers; its NICs replaced by the link's MAC), posted; then
    // what it does after each answer.
    let mac_r = "52:54:00:0d:40:01";
    let now = || {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
    };
    let mut inventory =
        unbounded_agent::inventory::collect(Path::new("/"), std::env::consts::ARCH, None, now());
    let nics = inventory
        .nics
        .get_or_insert_with(|| unbounded_api::inventory::NicFacts {
            origin: unbounded_api::inventory::FactOrigin {
                source: unbounded_api::inventory::FactSource::InBand,
                observed_at: now(),
            },
            interfaces: Vec::new(),
        });
    nics.interfaces = vec![unbounded_api::inventory::Nic {
        name: "eth0".into(),
        mac: mac_r.into(),
        driver: Some("virtio_net".into()),
        speed_mbps: None,
        link: true,
        pxe_booted: true,
        lldp: None,
    }];
    // The TPM's endorsement key the inspection read: recorded on the Machine it creates.
    let endorsement_key = format!("000b{}", "5e".repeat(32));
    let agent_report = unbounded_api::inventory::DiscoveryReport {
        boot_mac: mac_r.into(),
        inventory,
        endorsement_key: Some(endorsement_key.clone()),
    };
    let (agent_host, _) = site.host(mac_r);
    let answers = as_the_agent(&agent_host, async move |http, base| {
        let first = unbounded_agent::inspect::post(&http, &base, &agent_report).await;
        let second = unbounded_agent::inspect::post(&http, &base, &agent_report).await;
        (first, second)
    });
    assert!(
        matches!(answers.0, Answer::Status { code: 201, .. }),
        "a real inventory of this host is taken: {answers:?}"
    );
    assert_eq!(
        next_step(&answers.0, 0),
        Step::ReportAfter {
            wait: unbounded_agent::inspect::REREPORT,
            attempt: 0
        }
    );
    assert_eq!(
        next_step(&answers.1, 0),
        Step::ReportAfter {
            wait: Duration::from_secs(60),
            attempt: 1
        },
        "too soon: again after Retry-After ({answers:?})"
    );
    assert!(get_json(cp, "machineinventory", "discovered-5254000d4001").is_some());
    assert_eq!(
        get_json(cp, "machine", "discovered-5254000d4001").unwrap()["spec"]["pxe"]["identity"]["endorsementKey"],
        endorsement_key.as_str(),
        "the TPM is learned at discovery"
    );

    // A waiting Machine: no script of its own (inspected again), no configuration, no
    // credentials whatever it presents.
    wait_until(
        "the bootserver to see the Machine",
        Duration::from_secs(30),
        || get(link, &format!("/machines/{name}/config")).0 != 404,
    );
    let (_, script) = get(link, &format!("/boot.ipxe?mac={mac_a2}"));
    assert!(script.contains("/discover.ipxe?mac="), "{script}");
    assert!(!script.contains("unbounded.nonce"), "{script}");
    let (code, answer) = get(link, &format!("/machines/{name}/config"));
    assert_eq!(code, 403, "{answer}");
    let url = format!("http://{SERVER}:8080/machines/{name}/credentials");
    let (code, answer) = curl(
        link,
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"nonce":"00112233445566778899aabbccddeeff"}"#,
            &url,
        ],
    );
    assert_eq!(code, 403, "{answer}");
    assert!(answer.contains("waits to be claimed"), "{answer}");

    // Restarted (its memory of its writes gone), the bootserver updates the Machine from
    // its index rather than creating a second: a new disk; the new NIC is an inventory fact
    // and does not join the Machine.
    site.bootserver.crash_and_restart(&site.link.server);
    site.wait_ready();
    let link = &site.link;
    let (code, answer) = site.post(&report(&[mac_a, mac_a2, mac_a3], 2));
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("updated"), "{answer}");
    assert_eq!(
        discovered(cp),
        [name, "discovered-5254000d4001"],
        "no second Machine"
    );
    let machine = get_json(cp, "machine", name).unwrap();
    assert_eq!(machine["spec"]["pxe"]["macAddresses"], json!([mac_a]));
    assert_eq!(
        machine["metadata"]["labels"]["hardware.unbounded-cloud.io/disks"],
        "2"
    );
    let inventory = get_json(cp, "machineinventory", name).unwrap();
    assert_eq!(
        inventory["spec"]["disks"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Refused with a 4xx, nothing written: too large (declared, and chunked with no
    // length), invalid, a boot MAC not among the NICs, a MAC of a declared Machine.
    let before = discovered(cp);
    let mut big = report(&["52:54:00:0d:10:01"], 1);
    big["inventory"]["system"]["product"] = json!("x".repeat(9000));
    let (code, answer) = site.post(&big);
    assert_eq!(code, 413, "{answer}");
    let (code, answer) = post_report(
        link,
        site.dir.path(),
        &big.to_string(),
        &["-H", "Transfer-Encoding: chunked"],
    );
    assert_eq!(code, 413, "chunked: {answer}");
    let mut invalid = report(&["52:54:00:0d:10:01"], 1);
    invalid["inventory"]["system"]["vendor"] = json!("QEMU\u{1b}[31m");
    let (code, answer) = site.post(&invalid);
    assert_eq!(code, 422, "{answer}");
    let mut wrong_boot = report(&["52:54:00:0d:10:01"], 1);
    wrong_boot["bootMac"] = json!("52:54:00:0d:10:99");
    let (code, answer) = site.post(&wrong_boot);
    assert_eq!(code, 422, "{answer}");
    let (code, answer) = post_report(link, site.dir.path(), "{\"bootMac\": 1}", &[]);
    assert_eq!(code, 400, "{answer}");
    ok(
        cp,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {name: declared-e1}\nspec:\n  provider: pxe\n  pxe: {macAddresses: ['52:54:00:0e:00:01']}\n",
        ),
    );
    wait_until(
        "the bootserver to see the declared Machine",
        Duration::from_secs(30),
        || {
            !get(link, "/boot.ipxe?mac=52:54:00:0e:00:01")
                .1
                .contains("discover.ipxe")
        },
    );
    let (code, answer) = site.post(&report(&["52:54:00:0e:00:02", "52:54:00:0e:00:01"], 1));
    assert_eq!(code, 409, "{answer}");
    assert!(answer.contains("declared-e1"), "{answer}");
    let (_, script) = get(link, "/discover.ipxe?mac=52:54:00:0e:00:01");
    assert!(
        !script.contains("kernel"),
        "a declared Machine is never inspected: {script}"
    );
    assert_eq!(
        discovered(cp),
        before,
        "nothing written by a refused report"
    );
    assert!(get_json(cp, "machineinventory", "declared-e1").is_none());

    // The rate: three creations in a minute, the fourth refused (429).
    for n in 1..=3 {
        let mac = format!("52:54:00:0d:2{n}:01");
        let (code, answer) = site.post(&report(&[&mac], 1));
        assert_eq!(code, 201, "creation {n}: {answer}");
    }
    let (code, answer) = site.post(&report(&["52:54:00:0d:24:01"], 1));
    assert_eq!(code, 429, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("unbounded-refusal: rate_limited"),
        "{answer}"
    );
    assert_eq!(discovered(cp).len(), 5);
    let metrics = site.metrics();
    assert_eq!(
        metric(
            &metrics,
            "unbounded_bootserver_discovery_reports",
            "outcome=\"created\""
        ),
        3.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "unbounded_bootserver_discovery_reports",
            "outcome=\"rate_limited\""
        ) >= 1.0
    );

    // The agent's poll between reports: waiting, then nobody's MAC, then garbage.
    let (code, answer) = get(link, &format!("/discovery/claim/{mac_a}"));
    assert_eq!(code, 200, "{answer}");
    assert!(
        answer.contains(&format!("{name} waits to be claimed")),
        "{answer}"
    );
    let (code, answer) = get(link, "/discovery/claim/52:54:00:0d:99:99");
    assert_eq!(code, 404, "{answer}");
    let (code, answer) = get(link, "/discovery/claim/not-a-mac");
    assert_eq!(code, 400, "{answer}");

    // Claimed by hand: it boots as itself (here: no configuration yet), no inspection.
    ok(
        cp,
        &[
            "label",
            "machine",
            name,
            &format!("{LABEL}=claimed"),
            "--overwrite",
        ],
        None,
    );
    wait_until(
        "the claim to reach the bootserver",
        Duration::from_secs(30),
        || {
            let script = get(link, &format!("/boot.ipxe?mac={mac_a}")).1;
            script.contains("has no boot target yet")
        },
    );
    // The waiting agent's next poll says so, and it reboots (the real agent's client).
    let (code, answer) = get(link, &format!("/discovery/claim/{mac_a}"));
    assert_eq!(code, 409, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("unbounded-refusal: known"),
        "{answer}"
    );
    let polled_mac = mac_a.to_owned();
    let polled = as_the_agent(&link.client, async move |http, base| {
        unbounded_agent::inspect::poll_claim(&http, &base, &polled_mac).await
    });
    assert_eq!(
        unbounded_agent::inspect::after_poll(&polled),
        unbounded_agent::inspect::AfterPoll::Reboot,
        "{polled:?}"
    );
    let (code, answer) = site.post(&report(&[mac_a], 1));
    assert_eq!(
        code, 409,
        "a claimed Machine's inventory is not discovery's: {answer}"
    );
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("unbounded-refusal: known"),
        "{answer}"
    );
    // Its inspection agent, told so, reboots into the Machine's own boot.
    let known = Answer::Status {
        code,
        refusal: Some("known".into()),
        retry_after: None,
    };
    assert_eq!(next_step(&known, 0), Step::Reboot);
    clean(cp);
}

/// With a full DHCP server, a report must come from the address leased to its boot MAC.
#[test]
fn with_full_dhcp_a_report_comes_from_its_boot_mac_s_lease() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    clean(cp);
    let mac = "52:54:00:0d:30:01";
    let site = Site::start(
        cp,
        mac,
        "  mode: full\n  leaseFile: \"{dir}/leases.log\"\n  subnets: [{subnet: 10.99.0.0/24, pool: [10.99.0.100, 10.99.0.199]}]",
    );
    let (code, answer) = site.post(&report(&[mac], 1));
    assert_eq!(code, 403, "no lease for this address: {answer}");
    assert!(discovered(cp).is_empty());
    let (env, out) = udhcpc(&site.link.client, &[]);
    let ip = common::get(&env, "ip")
        .unwrap_or_else(|| panic!("no lease: {out}"))
        .to_owned();
    site.link
        .client
        .ip(&["addr", "del", "10.99.0.2/24", "dev", "eth0"])
        .unwrap();
    site.link
        .client
        .ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])
        .unwrap();
    let (code, answer) = site.post(&report(&[mac], 1));
    assert_eq!(code, 201, "from its own lease: {answer}");
    let (code, answer) = post_report(
        &site.link,
        site.dir.path(),
        &report(&["52:54:00:0d:30:02"], 1).to_string(),
        &[],
    );
    assert_eq!(code, 403, "another boot MAC from this lease: {answer}");
    assert_eq!(discovered(cp), vec!["discovered-5254000d3001".to_owned()]);
    clean(cp);
}

/// The MACs of a Machine are never a report's to change: a report naming another waiting
/// Machine's MAC is refused and that Machine is left as it was; a report naming an unknown
/// second MAC creates its sender's Machine with its boot MAC only (no pre-registration of
/// another server's NIC); and a host cannot report as another machine's boot MAC, even
/// after a forged PXE exchange in that MAC's name from its own address.
#[test]
fn a_report_never_changes_or_claims_another_machine_s_macs() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cp = LocalControlPlane::shared().unwrap();
    clean(cp);
    let site = Site::start(cp, "52:54:00:0d:5f:01", "  mode: proxy");
    let (v, x, w) = (
        "52:54:00:0d:50:01",
        "52:54:00:0d:51:01",
        "52:54:00:0d:52:01",
    );
    let macs_of =
        |name: &str| get_json(cp, "machine", name).unwrap()["spec"]["pxe"]["macAddresses"].clone();

    let (code, answer) = site.post(&report(&[v], 1));
    assert_eq!(code, 201, "{answer}");
    let victim = "discovered-5254000d5001";
    wait_until(
        "the bootserver to see the Machine",
        Duration::from_secs(30),
        || get(&site.link, &format!("/discovery/claim/{v}")).0 == 200,
    );

    // X names V's NIC beside its own: refused, V's Machine as it was, nothing created.
    let (code, answer) = site.post(&report(&[x, v], 1));
    assert_eq!(code, 409, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("unbounded-refusal: other_machine"),
        "{answer}"
    );
    assert_eq!(macs_of(victim), json!([v]));
    assert_eq!(discovered(cp), vec![victim.to_owned()]);

    // X names a NIC nobody has: its Machine gets its boot MAC only, and W, reporting
    // later, gets a Machine of its own.
    let (code, answer) = site.post(&report(&[x, w], 1));
    assert_eq!(code, 201, "{answer}");
    assert_eq!(macs_of("discovered-5254000d5101"), json!([x]));
    let (code, answer) = site.post(&report(&[w], 1));
    assert_eq!(code, 201, "{answer}");
    assert_eq!(macs_of("discovered-5254000d5201"), json!([w]));

    // X reports as V from its own host, after a forged PXE exchange as V: refused for its
    // hardware, and nothing changes on V's Machine.
    let (x_host, x_ip) = site.host(x);
    assert!(pxe_exchange(&x_host, v, &x_ip).is_some());
    let (code, answer) =
        post_report_in(&x_host, site.dir.path(), &report(&[v], 3).to_string(), &[]);
    assert_eq!(code, 403, "{answer}");
    assert!(
        answer.contains("not one of this machine's MACs"),
        "{answer}"
    );
    let inventory = get_json(cp, "machineinventory", victim).unwrap();
    assert_eq!(
        inventory["spec"]["disks"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "V's inventory untouched"
    );
    clean(cp);
}
