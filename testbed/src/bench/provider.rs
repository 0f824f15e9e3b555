//! The PXE provider with many Machines whose BMC is an emulator: sushy-tools' Redfish
//! emulator with its fake driver (one system per Machine, no VMs), behind a TCP proxy of
//! ours that counts connections, and our bootserver (Kubernetes backend, power on) on a
//! fresh local control plane. Figures: the time until every Machine is
//! `InfrastructureReady` (one-time PXE boot and power on through its BMC), then per poll
//! the BMC connections, Redfish requests and Secret reads.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;

use super::controller::probe::{self, RequestCounts};
use super::proc::Daemon;
use super::report::{Better, Cell, Report, Row};
use crate::cluster::LocalControlPlane;
use crate::ports::{Protocol, free_loopback_port};

/// The provider benchmark's size.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Machines (one emulated BMC system each).
    pub machines: usize,
    /// The provider's poll period, seconds (`power.pollSeconds`, at least 5).
    pub poll_seconds: u64,
    /// Polls counted in the steady state.
    pub polls: u64,
    /// How long the creation may take.
    pub create_timeout: Duration,
}

impl Plan {
    /// The size.
    pub fn full() -> Self {
        Self {
            machines: 1000,
            poll_seconds: 10,
            polls: 3,
            create_timeout: Duration::from_secs(600),
        }
    }

    /// Seconds' worth.
    pub fn smoke() -> Self {
        Self {
            machines: 20,
            poll_seconds: 5,
            polls: 2,
            create_timeout: Duration::from_secs(120),
        }
    }
}

/// The emulated system of the `i`-th Machine.
fn system_uuid(i: usize) -> String {
    format!("5b000000-0000-4000-8000-{i:012}")
}

/// sushy-emulator's configuration: the fake driver with one powered-off system per Machine,
/// its state (power, boot override) kept in `state_dir` so that no earlier run's systems are
/// found powered on (the default is a fixed path under /tmp shared by every run).
pub fn sushy_config(machines: usize, state_dir: &Path) -> String {
    let systems: Vec<String> = (0..machines)
        .map(|i| {
            format!(
                "{{'uuid': '{}', 'name': 'bench-{i:05}', 'power_state': 'Off', 'external_notifier': False, 'nics': [{{'mac': '02:5c:00:00:{:02x}:{:02x}', 'ip': '10.0.0.1'}}]}}",
                system_uuid(i),
                i / 256 % 256,
                i % 256
            )
        })
        .collect();
    format!(
        "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = {:?}\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n  {}\n]\n",
        state_dir.display().to_string(),
        systems.join(",\n  ")
    )
}

/// `GET path` from sushy-emulator: the body of a 200 answer, as JSON.
async fn sushy_get(port: u16, path: &str) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(300), exchange)
        .await
        .map_err(|_| format!("sushy-emulator: no answer to GET {path} in 300 s"))?
        .map_err(|e| format!("sushy-emulator: GET {path}: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("sushy-emulator: GET {path}: not an HTTP response: {text:.200}"))?;
    if !head.lines().next().is_some_and(|l| l.contains(" 200 ")) {
        return Err(format!("sushy-emulator: GET {path}: {head:.200}"));
    }
    serde_json::from_str(body).map_err(|e| format!("sushy-emulator: GET {path}: {e}"))
}

/// Asks sushy-emulator for its systems and for one system, before any load, and checks it
/// has `expected`.
///
/// Its drivers (systems, indicators, ...) are built lazily by the first request that needs
/// them, and every request arriving before one is built builds one of its own: for the fake
/// driver, two SQLite accesses per system each. Under the bootserver's first burst at 1,000
/// systems that herd alone exhausted the emulator's descriptors. One request each first.
async fn warm_up_sushy(port: u16, expected: usize) -> Result<(), String> {
    let systems = sushy_get(port, "/redfish/v1/Systems").await?;
    let count = systems["Members@odata.count"].as_u64();
    if count != Some(expected as u64) {
        return Err(format!(
            "sushy-emulator lists {count:?} systems, expected {expected}"
        ));
    }
    sushy_get(port, &format!("/redfish/v1/Systems/{}", system_uuid(0))).await?;
    Ok(())
}

/// A TCP proxy on loopback that counts the connections it accepts.
struct CountingProxy {
    port: u16,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    async fn start(target: u16) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicU64::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self {
            port,
            connections,
            task,
        })
    }

    fn count(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Redfish requests sushy-emulator logged so far.
fn redfish_requests(log: &Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("\"GET /redfish")
                || l.contains("\"POST /redfish")
                || l.contains("\"PATCH /redfish")
        })
        .count() as u64
}

fn secret_gets(counts: &RequestCounts) -> u64 {
    counts
        .iter()
        .filter(|(k, _)| k.resource == "secrets" && k.verb == "GET")
        .map(|(_, n)| n)
        .sum()
}

async fn api_counts(client: &kube::Client) -> Result<RequestCounts, String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("reading kube-apiserver's /metrics: {e}"))?;
    Ok(probe::parse_request_counts(&text))
}

fn free_port() -> Result<u16, String> {
    free_loopback_port(Protocol::Tcp).map_err(|e| e.to_string())
}

/// Counters at one moment.
#[derive(Debug, Clone, Copy)]
struct Counters {
    connections: u64,
    redfish: u64,
    secret_gets: u64,
}

/// Runs the provider benchmark on `plane` with the bootserver binary `bootserver`.
pub async fn run(
    plane: &LocalControlPlane,
    bootserver: &Path,
    plan: &Plan,
    dir: &Path,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let client = plane.client().await.map_err(|e| e.to_string())?;

    let bin = crate::bmc::emulators_bin().map_err(|e| e.to_string())?;
    let sushy_conf = dir.join("sushy.conf");
    std::fs::write(
        &sushy_conf,
        sushy_config(plan.machines, &dir.join("sushy-state")),
    )
    .map_err(|e| e.to_string())?;
    let sushy_port = free_port()?;
    let sushy_log = dir.join("sushy.log");
    // sushy-emulator through a launcher that closes its SQLite connections (see the script).
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sushy-emulator-closing.py");
    let mut command = Command::new("setpriv");
    command
        .args(["--pdeathsig", "KILL", "--"])
        .arg(bin.join("python"))
        .arg(&launcher)
        .arg("--config")
        .arg(&sushy_conf)
        .args([
            "--interface",
            "127.0.0.1",
            "--port",
            &sushy_port.to_string(),
        ]);
    let mut sushy =
        Daemon::start("sushy-emulator", command, &sushy_log).map_err(|e| e.to_string())?;
    sushy
        .wait_listening(sushy_port, false, Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    warm_up_sushy(sushy_port, plan.machines).await?;
    let proxy = CountingProxy::start(sushy_port)
        .await
        .map_err(|e| e.to_string())?;

    say(format!(
        "provider: creating a Secret and {} Machines",
        plan.machines
    ));
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": "unbounded-system"}}))
        .map_err(|e| e.to_string())?;
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating namespace unbounded-system: {e}")),
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "unbounded-system");
    let secret = serde_json::from_value(json!({
        "metadata": {"name": "bench-bmc"},
        "stringData": {"username": "admin", "password": "bench-password"}
    }))
    .map_err(|e| e.to_string())?;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| format!("creating the BMC Secret: {e}"))?;
    let machines: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("unbounded-cloud.io", "v1alpha1", "Machine"),
            "machines",
        ),
    );
    let port = proxy.port;
    let creates = futures::stream::iter(0..plan.machines)
        .map(|i| {
            let machines = machines.clone();
            async move {
                let object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "unbounded-cloud.io/v1alpha1",
                    "kind": "Machine",
                    "metadata": {"name": format!("bench-{i:05}")},
                    "spec": {"provider": "pxe", "pxe": {
                        "macAddresses": [format!("02:5c:00:00:{:02x}:{:02x}", i / 256 % 256, i % 256)],
                        "firmware": "bios",
                        "bmc": {
                            "address": format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/{}", system_uuid(i)),
                            "credentialsSecretRef": {"namespace": "unbounded-system", "name": "bench-bmc"}
                        }
                    }}
                }))
                .map_err(|e| e.to_string())?;
                machines
                    .create(&PostParams::default(), &object)
                    .await
                    .map(drop)
                    .map_err(|e| format!("creating bench-{i:05}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    creates.into_iter().collect::<Result<Vec<()>, String>>()?;

    let config = dir.join("bootserver.yaml");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).map_err(|e| e.to_string())?;
    // Nothing network-boots here, but the start-up check wants the iPXE builds a BIOS or
    // UEFI machine would ask for: stand-ins.
    let tftp_root = dir.join("tftp");
    std::fs::create_dir_all(&tftp_root).map_err(|e| e.to_string())?;
    for build in ["undionly.kpxe", "snponly.efi"] {
        std::fs::write(tftp_root.join(build), b"stand-in").map_err(|e| e.to_string())?;
    }
    std::fs::write(
        &config,
        format!(
            "serverAddress: 127.0.0.1\nrouterAdvertisements: false\nbackend: kubernetes\ndhcp: {{mode: off}}\ntftp: {{root: {tftp_root}, port: {tftp}}}\nhttp: {{port: {http}, imagesDir: {images}}}\npower: {{enabled: true, pollSeconds: {poll}, timeoutSeconds: 10}}\n",
            images = images.display(),
            tftp_root = tftp_root.display(),
            tftp = free_port()?,
            http = free_port()?,
            poll = plan.poll_seconds,
        ),
    )
    .map_err(|e| e.to_string())?;
    let counters = |before: Option<&RequestCounts>, after: &RequestCounts| Counters {
        connections: proxy.count(),
        redfish: redfish_requests(&sushy_log),
        secret_gets: secret_gets(
            &before.map_or_else(|| after.clone(), |b| probe::difference(b, after)),
        ),
    };
    let start_counts = api_counts(&client).await?;
    let mut command = Command::new("setpriv");
    command
        .args(["--pdeathsig", "KILL", "--"])
        .arg(bootserver)
        .arg("--config")
        .arg(&config)
        // Elected as in a cluster; a fixed identity takes its own Lease back at once.
        .args(["--leader-election-identity", "bench-bootserver"])
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env("RUST_LOG", "warn");
    let started = Instant::now();
    let mut server = Daemon::start("bootserver", command, &dir.join("bootserver.log"))
        .map_err(|e| e.to_string())?;
    say(format!(
        "provider: bootserver started; waiting for {} Machines to be InfrastructureReady",
        plan.machines
    ));
    let ready_seconds = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !server.running() {
            return Err(format!("the bootserver exited:\n{}", server.log_tail(20)));
        }
        let list = machines
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing Machines: {e}"))?;
        let ready = list
            .items
            .iter()
            .filter(|m| {
                m.data["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "InfrastructureReady" && c["status"] == "True")
                })
            })
            .count();
        if ready == plan.machines {
            break started.elapsed().as_secs_f64();
        }
        if started.elapsed() > plan.create_timeout {
            return Err(format!(
                "only {ready} of {} Machines InfrastructureReady after {:?}; bootserver log:\n{}",
                plan.machines,
                plan.create_timeout,
                server.log_tail(20)
            ));
        }
    };
    let created = counters(Some(&start_counts), &api_counts(&client).await?);
    say(format!(
        "provider: all InfrastructureReady after {ready_seconds:.1} s ({} BMC connections, {} Redfish requests, {} Secret reads)",
        created.connections, created.redfish, created.secret_gets
    ));
    // Steady state: the provider observes each Machine every poll.
    let steady_counts = api_counts(&client).await?;
    let before = counters(None, &steady_counts);
    let cpu_before = server.cpu_seconds();
    tokio::time::sleep(Duration::from_secs(plan.poll_seconds * plan.polls)).await;
    let after = counters(Some(&steady_counts), &api_counts(&client).await?);
    let cpu = server.cpu_seconds() - cpu_before;
    drop(server);
    drop(proxy);
    sushy.stop();
    let polls = plan.polls as f64;
    let per_poll = |n: u64| n as f64 / polls;
    let connections = per_poll(after.connections - before.connections);
    let redfish = per_poll(after.redfish - before.redfish);
    let secret_reads = per_poll(after.secret_gets);
    for (name, value) in [
        ("machines", plan.machines as f64),
        ("create_seconds", ready_seconds),
        ("create_bmc_connections", created.connections as f64),
        ("create_redfish_requests", created.redfish as f64),
        ("create_secret_reads", created.secret_gets as f64),
        ("poll_bmc_connections", connections),
        ("poll_redfish_requests", redfish),
        ("poll_secret_reads", secret_reads),
        ("poll_cpu_seconds", cpu / polls),
    ] {
        report.figure(format!("provider.pxe.ours.{name}"), value);
    }
    let line = format!(
        "PXE provider, {} Machines on an emulated Redfish BMC each (sushy-tools, fake driver), poll every {} s: all InfrastructureReady in {ready_seconds:.1} s; per poll {connections:.0} BMC connections, {redfish:.0} Redfish requests, {secret_reads:.0} Secret reads, {:.2} s of bootserver CPU",
        plan.machines,
        plan.poll_seconds,
        cpu / polls
    );
    say(line.clone());
    report.rows.push(Row {
        mode: "controller",
        case: "pxe_provider".into(),
        what: format!(
            "PXE provider, {} Machines with emulated BMCs: per poll",
            super::report::human(plan.machines as f64)
        ),
        metric: "secret_reads_per_poll",
        unit: "Secret reads",
        ours: Some(Cell::with_note(
            secret_reads,
            format!(
                "{connections:.0} BMC connections, {redfish:.0} Redfish requests; all InfrastructureReady in {ready_seconds:.1} s"
            ),
        )),
        peers: Vec::new(),
        better: Better::Higher,
        target: None,
    });
    report.note(line);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fake_system_per_machine() {
        let config = sushy_config(3, Path::new("/run/bench/sushy-state"));
        assert!(config.starts_with("SUSHY_EMULATOR_FAKE_DRIVER = True\n"));
        assert!(config.contains("SUSHY_EMULATOR_STATE_DIR = \"/run/bench/sushy-state\"\n"));
        assert_eq!(config.matches("'uuid'").count(), 3);
        assert!(config.contains(&system_uuid(2)));
        assert!(config.contains("'power_state': 'Off'"));
    }
}
