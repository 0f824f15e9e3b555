//! One leader at a time, with a real fault: two controller replicas (the binary) elect a
//! leader through a Lease on a real API server; the leader's route to the API server goes
//! through a TCP proxy that the test **stalls** (bytes stop, nothing is closed) for longer
//! than the lease. The API server's audit log (each request with its user agent, which names
//! the replica) must show that the old leader sent its last write before the new leader took
//! the Lease, and the old leader must have exited (non-zero) before that moment too.
//!
//! Two faults: only the Lease's route stalls while the leader can still reach the API server
//! for everything else (the worst case: a leader that cannot renew but can write), and the
//! leader's whole route stalls. Its own test binary: the control plane writes an audit log.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use serde_json::{Value, json};
use unbounded_testbed::cluster::{LocalControlPlane, PlaneOptions};
use unbounded_testbed::stall::StallableForward;

/// The timing every replica runs with: a 10 s lease, renewed within 6 s, tried every second.
const TIMING: [&str; 6] = [
    "--leader-election-lease-duration",
    "10s",
    "--leader-election-renew-deadline",
    "6s",
    "--leader-election-retry-period",
    "1s",
];

/// One scenario at a time: every replica reconciles every object of the cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn plane() -> &'static LocalControlPlane {
    LocalControlPlane::shared_with(PlaneOptions::audited()).expect("control plane")
}

/// A controller replica (the binary), killed on drop.
struct Replica {
    child: Child,
    log: PathBuf,
}

impl Replica {
    fn start(
        identity: &str,
        lease: &str,
        kubeconfig: &Path,
        lease_kubeconfig: Option<&Path>,
        dir: &Path,
    ) -> Self {
        let log = dir.join(format!("{identity}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(env!("CARGO_BIN_EXE_unbounded-controller"))
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--leader-election-namespace",
                "default",
                "--lease-name",
                lease,
                "--leader-election-identity",
                identity,
            ])
            .args(TIMING);
        if let Some(path) = lease_kubeconfig {
            command.arg("--leader-election-kubeconfig").arg(path);
        }
        let child = command
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,unbounded_runtime=debug")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start unbounded-controller");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The admin kubeconfig with the API server's address replaced by `proxy`'s.
fn kubeconfig_through(proxy: &StallableForward, dir: &Path, name: &str) -> PathBuf {
    let cp = plane();
    let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    let text = text.replace(cp.server_url(), &format!("https://{}", proxy.address()));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn api_server_addr() -> SocketAddr {
    plane()
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap()
}

async fn holder(client: &kube::Client, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get_opt(lease)
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

/// One write request as the audit log records it.
#[derive(Debug, Clone)]
struct Write {
    received: Timestamp,
    completed: Timestamp,
    verb: String,
    resource: String,
    name: String,
    code: i64,
}

/// The writes (create, update, patch, delete) whose user agent names `identity`, in the order
/// the API server received them.
fn writes_by(identity: &str) -> Vec<Write> {
    let path = plane().audit_log_path().expect("audit log");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let marker = format!("({identity})");
    let mut writes: Vec<Write> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["userAgent"]
                    .as_str()
                    .is_some_and(|a| a.ends_with(&marker))
        })
        .map(|e| Write {
            received: e["requestReceivedTimestamp"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
            completed: e["stageTimestamp"].as_str().unwrap().parse().unwrap(),
            verb: e["verb"].as_str().unwrap_or_default().to_owned(),
            resource: e["objectRef"]["resource"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            name: e["objectRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            code: e["responseStatus"]["code"].as_i64().unwrap_or(0),
        })
        .collect();
    writes.sort_by_key(|w| w.received);
    writes
}

/// The moment the API server received the write with which `identity` took `lease`.
fn took_lease(identity: &str, lease: &str) -> Option<Timestamp> {
    writes_by(identity)
        .into_iter()
        .find(|w| {
            w.resource == "leases"
                && w.name == lease
                && (w.verb == "update" || w.verb == "create")
                && (200..300).contains(&w.code)
        })
        .map(|w| w.received)
}

/// Keeps creating MachineConfigurations (each one gets a first version and a status from the
/// leader: writes) until dropped.
struct Workload(tokio::task::JoinHandle<()>);

impl Workload {
    fn start(client: kube::Client, prefix: &str) -> Self {
        let prefix = prefix.to_owned();
        Self(tokio::spawn(async move {
            for n in 0.. {
                create_configuration(
                    &client,
                    &format!("{prefix}-{n}"),
                    json!({"template": template("k0")}),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Records when the test first saw `replica` exited (wall clock, as the audit log's).
fn watch_exit(replica: Arc<Mutex<Replica>>) -> Arc<Mutex<Option<(ExitStatus, SystemTime)>>> {
    let exit = Arc::new(Mutex::new(None));
    let seen = exit.clone();
    std::thread::spawn(move || {
        loop {
            if let Some(status) = replica.lock().unwrap().child.try_wait().unwrap() {
                *seen.lock().unwrap() = Some((status, SystemTime::now()));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    exit
}

async fn wait_long<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scenario: `a` leads, `b` follows, `a`'s route stalls (only the Lease's, or all of it).
async fn stalled_leader_stops_before_the_new_one_starts(prefix: &str, stall_everything: bool) {
    let _serial = SERIAL.lock().await;
    let cp = plane();
    let client = cp.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lease = format!("{prefix}-lease");
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));

    let proxy = StallableForward::start(&api_server_addr().to_string()).unwrap();
    let through_proxy = kubeconfig_through(&proxy, dir.path(), "proxied.kubeconfig");
    let direct = cp.kubeconfig_path();
    let replica_a = if stall_everything {
        Replica::start(&a, &lease, &through_proxy, None, dir.path())
    } else {
        Replica::start(&a, &lease, direct, Some(&through_proxy), dir.path())
    };
    let replica_a = Arc::new(Mutex::new(replica_a));
    let log_a = || replica_a.lock().unwrap().log();
    wait_long(&format!("{a} to lead"), Duration::from_secs(60), || async {
        (holder(&client, &lease).await.as_deref() == Some(a.as_str())).then_some(())
    })
    .await;
    let replica_b = Replica::start(&b, &lease, direct, None, dir.path());
    wait_long(
        &format!("{b} to follow"),
        Duration::from_secs(60),
        || async { replica_b.log().contains("following").then_some(()) },
    )
    .await;

    // The leader at work: its writes are in the audit log under its name.
    let workload = Workload::start(client.clone(), prefix);
    wait_long(&format!("{a} writing"), Duration::from_secs(60), || async {
        writes_by(&a)
            .iter()
            .any(|w| w.resource == "machineconfigurationversions")
            .then_some(())
    })
    .await;
    assert_eq!(holder(&client, &lease).await.as_deref(), Some(a.as_str()));
    let exit_a = watch_exit(replica_a.clone());
    assert!(
        exit_a.lock().unwrap().is_none(),
        "{a} ran until the stall:\n{}",
        log_a()
    );

    let stalled_at = Timestamp::now();
    proxy.stall();
    // A sign that the leader's requests reach the proxy and go no further.
    wait_long(
        &format!("{a}'s bytes held at the proxy"),
        Duration::from_secs(30),
        || async { (proxy.holding() > 0).then_some(()) },
    )
    .await;
    wait_long(
        &format!("{b} to take the lease"),
        Duration::from_secs(60),
        || async { (holder(&client, &lease).await.as_deref() == Some(b.as_str())).then_some(()) },
    )
    .await;
    // The new leader at work, for a while.
    wait_long(&format!("{b} writing"), Duration::from_secs(60), || async {
        (writes_by(&b)
            .iter()
            .filter(|w| w.resource == "machineconfigurationversions")
            .count()
            >= 5)
            .then_some(())
    })
    .await;
    drop(workload);

    let taken = took_lease(&b, &lease).expect("the new leader's Lease write is in the audit log");
    assert!(
        taken > stalled_at,
        "{b} took the lease only after the stall"
    );
    let writes_a = writes_by(&a);
    let last_a = writes_a
        .last()
        .expect("the old leader wrote before the stall");
    let late: Vec<&Write> = writes_a.iter().filter(|w| w.received >= taken).collect();
    assert!(
        late.is_empty(),
        "{a} went on writing after {b} took the lease at {taken}: {} writes, the first {:?}\n{a}'s log:\n{}",
        late.len(),
        late.first(),
        log_a()
    );
    assert!(last_a.completed < taken);
    let exit = *exit_a.lock().unwrap();
    let Some((status, exited_at)) = exit else {
        panic!(
            "{a} still runs after {b} took the lease at {taken}:\n{}",
            log_a()
        );
    };
    assert!(!status.success(), "{a} exits non-zero: {status}");
    let exited_at = Timestamp::try_from(exited_at).unwrap();
    assert!(
        exited_at < taken,
        "{a} exited at {exited_at}, after {b} took the lease at {taken}"
    );
    assert!(log_a().contains("stopped leading"), "{}", log_a());
    eprintln!(
        "{prefix}: stall at {stalled_at}; {a}'s last write received at {}, {a} exited at {exited_at}, {b} took the lease at {taken} ({:.1} s after the exit)",
        last_a.received,
        taken.duration_since(exited_at).as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_lease_route_stalls_stops_writing_before_the_next_one_leads() {
    stalled_leader_stops_before_the_new_one_starts("le-lease", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_connection_stalls_exits_before_the_next_one_leads() {
    stalled_leader_stops_before_the_new_one_starts("le-all", true).await;
}

/// Kubernetes stops a pod with SIGTERM. The leader must treat it as a request to stop:
/// release its Lease and exit 0, so that the follower leads at its next try instead of after
/// the lease expires (in a container the binary is PID 1, where an unhandled SIGTERM is
/// ignored: the pod lingers for its grace period and the Lease stays held).
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_with_sigterm_releases_its_lease_and_exits_cleanly() {
    let _serial = SERIAL.lock().await;
    let cp = plane();
    let client = cp.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lease = "le-term-lease";
    let (a, b) = ("le-term-a", "le-term-b");
    let direct = cp.kubeconfig_path();
    let mut replica_a = Replica::start(a, lease, direct, None, dir.path());
    wait_long(&format!("{a} to lead"), Duration::from_secs(60), || async {
        (holder(&client, lease).await.as_deref() == Some(a)).then_some(())
    })
    .await;
    let replica_b = Replica::start(b, lease, direct, None, dir.path());
    wait_long(
        &format!("{b} to follow"),
        Duration::from_secs(60),
        || async { replica_b.log().contains("following").then_some(()) },
    )
    .await;

    let pid = replica_a.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let status = wait_long(&format!("{a} to exit"), Duration::from_secs(30), || {
        let status = replica_a.child.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(
        status.success(),
        "{a} exits 0 on SIGTERM, not killed by it: {status}\n{}",
        replica_a.log()
    );
    // Released before the exit: the Lease no longer names the old leader.
    let after_exit = holder(&client, lease).await;
    assert_ne!(
        after_exit.as_deref(),
        Some(a),
        "{a} exited still holding the Lease\n{}",
        replica_a.log()
    );
    assert!(replica_a.log().contains("SIGTERM"), "{}", replica_a.log());
    wait_long(&format!("{b} to lead"), Duration::from_secs(30), || async {
        (holder(&client, lease).await.as_deref() == Some(b)).then_some(())
    })
    .await;
}

/// The answer's status line of `GET <path>` on `addr` (plain HTTP/1.0).
fn http_status(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return "no connection".into();
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// A replica is ready while the API server answers it, and not while its route to the API
/// server is stalled (leader or follower alike): what the Deployment's readinessProbe asks.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_is_ready_only_while_the_api_server_answers_it() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = StallableForward::start(&api_server_addr().to_string()).unwrap();
    let through_proxy = kubeconfig_through(&proxy, dir.path(), "proxied.kubeconfig");
    let replica = Replica::start(
        "le-ready",
        "le-ready-lease",
        &through_proxy,
        None,
        dir.path(),
    );
    let addr = wait_long(
        "the probe address in the log",
        Duration::from_secs(30),
        || {
            let log = replica.log();
            let addr = log
                .lines()
                .find(|l| l.contains("serving /metrics, /healthz and /readyz"))
                .and_then(|l| l.split("127.0.0.1:").nth(1))
                .map(|rest| {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    format!("127.0.0.1:{port}")
                });
            async move { addr }
        },
    )
    .await;
    wait_long("ready", Duration::from_secs(30), || {
        let ok = http_status(&addr, "/readyz").contains("200");
        async move { ok.then_some(()) }
    })
    .await;
    proxy.stall();
    let status = http_status(&addr, "/readyz");
    assert!(status.contains("503"), "{status}\n{}", replica.log());
    assert!(
        http_status(&addr, "/healthz").contains("200"),
        "alive all the same"
    );
    proxy.resume();
    wait_long("ready again", Duration::from_secs(30), || {
        let ok = http_status(&addr, "/readyz").contains("200");
        async move { ok.then_some(()) }
    })
    .await;
}
