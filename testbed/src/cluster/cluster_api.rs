//! Cluster API beside the local control plane: its core manager and clusterctl, built from
//! Cluster API's own Go module at [`CLUSTER_API_VERSION`] (`testbed/scripts/build-cluster-api.sh`)
//! and cached under `~/.cache/unbounded/cluster-api/<version>/` with the module's manifests
//! (`config/`: the core CRDs, RBAC, webhooks; `config/metadata.yaml`), and
//! [`CoreManager`], the core manager running against a [`LocalControlPlane`] (or any API
//! server an admin kubeconfig reaches, [`ManagerTarget`]: the lab's, for `scenario capi`)
//! with the core CRDs and Unbounded's provider CRDs (`deploy/cluster-api/crds`) applied.

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::binaries::run_build_script;
use super::boot::{free_port, tail};
use super::pki::self_signed_server;
use super::{
    ClusterError, LocalControlPlane, cache_dir, deploy_dir, find_program, io_err, run_kubectl,
};

/// The Cluster API release the testbed builds and runs (its contract: v1beta2).
pub const CLUSTER_API_VERSION: &str = "v1.13.6";

const BUILD_SCRIPT: &str = include_str!("../../scripts/build-cluster-api.sh");

/// How long the core manager may take to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How many times a start whose port was taken is tried, each with new ports.
const PORT_ATTEMPTS: u32 = 3;

/// The Cluster API binaries and manifests of [`CLUSTER_API_VERSION`].
#[derive(Debug, Clone)]
pub struct ClusterApiBinaries {
    /// The core controller manager (`sigs.k8s.io/cluster-api`'s main package).
    pub manager: PathBuf,
    /// clusterctl.
    pub clusterctl: PathBuf,
    /// The module's `config/` (`crd/bases`, `rbac`, `webhook`, ...).
    pub config: PathBuf,
    /// The module's `metadata.yaml` (release series → contract), kept in `config/`.
    pub metadata: PathBuf,
}

impl ClusterApiBinaries {
    /// Finds the binaries and manifests in the cache, building them there when missing (with
    /// progress on stderr; ~9 min on 2 cores). Concurrent callers wait for one build.
    pub fn ensure() -> Result<Self, ClusterError> {
        let dir = cache_dir().join("cluster-api").join(CLUSTER_API_VERSION);
        let found = Self::in_dir(&dir);
        if found.all_present() {
            return Ok(found);
        }
        eprintln!(
            "testbed: building Cluster API {CLUSTER_API_VERSION} (cluster-api-manager, clusterctl) into {} (first time only: ~9 min on 2 cores)",
            dir.display()
        );
        let lock = cache_dir()
            .join("cluster-api")
            .join(format!("{CLUSTER_API_VERSION}.lock"));
        run_build_script(
            BUILD_SCRIPT,
            "Cluster API",
            CLUSTER_API_VERSION,
            &lock,
            &[OsStr::new(CLUSTER_API_VERSION), dir.as_os_str()],
        )?;
        let built = Self::in_dir(&dir);
        for path in [&built.manager, &built.clusterctl, &built.metadata] {
            if !path.is_file() {
                return Err(missing(path, &dir));
            }
        }
        if !built.core_crds().is_dir() {
            return Err(missing(&built.core_crds(), &dir));
        }
        Ok(built)
    }

    fn in_dir(dir: &Path) -> Self {
        let config = dir.join("config");
        Self {
            manager: dir.join("cluster-api-manager"),
            clusterctl: dir.join("clusterctl"),
            metadata: config.join("metadata.yaml"),
            config,
        }
    }

    fn all_present(&self) -> bool {
        self.manager.is_file()
            && self.clusterctl.is_file()
            && self.metadata.is_file()
            && self.core_crds().is_dir()
    }

    /// The core CRDs (`config/crd/bases`): Cluster, Machine, MachineSet, ... as generated,
    /// without the conversion-webhook patches the module's kustomization adds.
    pub fn core_crds(&self) -> PathBuf {
        self.config.join("crd/bases")
    }
}

/// What the build should have left in `dir` and did not.
fn missing(path: &Path, dir: &Path) -> ClusterError {
    ClusterError::MissingProgram {
        program: path.display().to_string(),
        hint: format!(
            "testbed/scripts/build-cluster-api.sh {CLUSTER_API_VERSION} did not leave it; remove {} and try again",
            dir.display()
        ),
    }
}

/// Unbounded's Cluster API provider CRDs (UnboundedCluster, UnboundedMachine, UnboundedConfig
/// and their templates).
pub fn provider_crds() -> PathBuf {
    deploy_dir().join("cluster-api/crds")
}

static MANAGER_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The API server a [`CoreManager`] runs against: an admin kubeconfig that reaches it from
/// this host, the kubectl that applies the CRDs to it, and the directory under which the
/// manager's own directory (log, webhook certificates) is made.
#[derive(Debug, Clone, Copy)]
pub struct ManagerTarget<'a> {
    /// The admin kubeconfig (the manager's `--kubeconfig`).
    pub kubeconfig: &'a Path,
    /// kubectl.
    pub kubectl: &'a Path,
    /// Where `cluster-api-manager-<n>/` goes.
    pub data_dir: &'a Path,
}

impl ManagerTarget<'_> {
    /// The local control plane as a target.
    pub fn of(cp: &LocalControlPlane) -> ManagerTarget<'_> {
        ManagerTarget {
            kubeconfig: cp.kubeconfig_path(),
            kubectl: &cp.binaries().kubectl,
            data_dir: cp.data_dir(),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, ClusterError> {
        let mut command = Command::new(self.kubectl);
        command.arg("--kubeconfig").arg(self.kubeconfig);
        run_kubectl(command, args, None)
    }
}

/// Cluster API's core controller manager running against a [`LocalControlPlane`] (or another
/// API server, [`CoreManager::start_against`]), as the admin user, without leader election, with the default feature gates (MachinePool on,
/// ClusterTopology and RuntimeSDK off).
///
/// It runs **without Cluster API's admission webhooks**: neither the
/// Validating/MutatingWebhookConfigurations nor the CRDs' conversion webhooks are applied.
/// The manager still serves its webhook endpoints, with a self-signed certificate, because it
/// will not run without one (an empty `--webhook-cert-dir` ends it at once: "Problem running
/// manager: open …/tls.crt: no such file or directory"); the API server never calls them. So:
/// - nothing is defaulted: objects must be created complete, as the webhooks would have
///   left them (a Cluster's refs with `apiGroup`, `kind` and `name`; a Machine with its
///   `cluster.x-k8s.io/cluster-name` label, a `v`-prefixed version and its timeouts; a
///   MachineDeployment with its selector, replicas and strategy);
/// - nothing is validated beyond the CRDs' schemas (immutable fields, cross-field rules);
/// - the CRDs convert with strategy `None`: use v1beta2 (the storage version) only.
///
/// Ready ([`CoreManager::start`] returns) means `/readyz` answers OK: the health and webhook
/// servers are up (~0.2 s after the start). The controllers start when their informers have
/// synced (~2 s later); the first Cluster whose infrastructure is of a kind not yet watched
/// starts a watch on that kind (~2 s more). Callers wait for an outcome, not for a time.
///
/// One manager per control plane at a time: two would both reconcile every object. The
/// process dies with the test binary (`PR_SET_PDEATHSIG`, from a thread that lives as long
/// as this value) and is killed when this is dropped; its directory (log, certificates)
/// stays in the control plane's data directory, so its log can be read after a failure.
#[derive(Debug)]
pub struct CoreManager {
    child: Option<Child>,
    keeper: Option<Keeper>,
    dir: PathBuf,
    log: PathBuf,
    health_port: u16,
    webhook_port: u16,
    args: Vec<String>,
    startup: Duration,
}

impl CoreManager {
    /// Applies the core CRDs and Unbounded's provider CRDs (server-side), writes the webhook
    /// serving certificate, starts the manager and waits until its `/readyz` answers OK
    /// (blocking; a few seconds). Fails with the end of its log if it exits or is not ready
    /// within two minutes.
    pub fn start(cp: &LocalControlPlane) -> Result<Self, ClusterError> {
        Self::start_against(ManagerTarget::of(cp))
    }

    /// [`CoreManager::start`] against the API server `target` names (the lab's, whose
    /// admin kubeconfig reaches it from this host).
    pub fn start_against(target: ManagerTarget<'_>) -> Result<Self, ClusterError> {
        let binaries = ClusterApiBinaries::ensure()?;
        find_program("setpriv", "install util-linux")?;
        apply_crds(&target, &binaries)?;
        let dir = target.data_dir.join(format!(
            "cluster-api-manager-{}",
            MANAGER_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io_err(format!("clearing {}", dir.display())))?;
        }
        let certs = dir.join("webhook-certs");
        fs::create_dir_all(&certs).map_err(io_err(format!("creating {}", certs.display())))?;
        self_signed_server(&certs, "127.0.0.1")?;
        let mut attempt = 1;
        loop {
            let mut manager = Self::spawn(&target, &binaries, &dir, &certs, attempt)?;
            match manager.wait_ready() {
                Ok(()) => return Ok(manager),
                Err(e) if attempt < PORT_ATTEMPTS && lost_a_port(&e) => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    fn spawn(
        target: &ManagerTarget<'_>,
        binaries: &ClusterApiBinaries,
        dir: &Path,
        certs: &Path,
        attempt: u32,
    ) -> Result<Self, ClusterError> {
        let health_port = free_port()?;
        let webhook_port = free_port()?;
        let args = vec![
            format!("--kubeconfig={}", target.kubeconfig.display()),
            "--leader-elect=false".to_owned(),
            format!("--health-addr=127.0.0.1:{health_port}"),
            // Metrics and pprof over plain HTTP (no TokenReview per scrape), on a port
            // the kernel picks: nothing here reads them.
            "--diagnostics-address=127.0.0.1:0".to_owned(),
            "--insecure-diagnostics".to_owned(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", certs.display()),
        ];
        let log = dir.join(format!("cluster-api-manager.{attempt}.log"));
        let out = fs::File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err("duplicating a log handle"))?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&binaries.manager)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(dir);
        let (child, keeper) = spawn_kept(command)?;
        Ok(Self {
            child: Some(child),
            keeper: Some(keeper),
            dir: dir.to_path_buf(),
            log,
            health_port,
            webhook_port,
            args,
            startup: Duration::ZERO,
        })
    }

    fn wait_ready(&mut self) -> Result<(), ClusterError> {
        let started = Instant::now();
        loop {
            if http_ok(self.health_port, "/readyz") {
                self.startup = started.elapsed();
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(ClusterError::Exited {
                    component: format!("cluster-api-manager ({status})"),
                    log: self.log.display().to_string(),
                    tail: self.log_tail(30),
                });
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(ClusterError::NotReady {
                    component: "cluster-api-manager".to_owned(),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: self.log.display().to_string(),
                    tail: self.log_tail(30),
                });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// `Some(exit status)` once the manager has exited.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// The manager's log (klog's text format, standard output and error).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Its directory: the log and `webhook-certs/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where its health endpoints (`/healthz`, `/readyz`) are served, on 127.0.0.1.
    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// Its webhook server's port (all interfaces; nothing calls it, see [`CoreManager`]).
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// The flags it runs with (after the binary's path).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// From its start until `/readyz` answered OK.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Its process id (of `setpriv`, which execs the manager: the same process).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for CoreManager {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(keeper) = self.keeper.take() {
            drop(keeper.stop);
            let _ = keeper.thread.join();
        }
    }
}

/// The thread that started the manager: `PR_SET_PDEATHSIG` fires when the *thread* that
/// forked the child ends, so the manager is started from a thread of its own that waits
/// until the [`CoreManager`] is dropped (the caller's thread may be a runtime's worker that
/// ends sooner, such as tokio's blocking threads).
#[derive(Debug)]
struct Keeper {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

fn spawn_kept(mut command: Command) -> Result<(Child, Keeper), ClusterError> {
    let (child_tx, child_rx) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let thread = thread::Builder::new()
        .name("cluster-api-manager".into())
        .spawn(move || {
            let _ = child_tx.send(command.spawn());
            // Returns when the sender is dropped.
            let _ = stop_rx.recv();
        })
        .map_err(io_err(
            "spawning the thread that starts cluster-api-manager",
        ))?;
    let child = child_rx
        .recv()
        .map_err(|_| ClusterError::Command {
            what: "starting cluster-api-manager".to_owned(),
            output: "its starting thread ended".to_owned(),
        })?
        .map_err(io_err("starting cluster-api-manager"))?;
    Ok((child, Keeper { stop, thread }))
}

/// Applies the core CRDs and the provider CRDs and waits until they are Established.
fn apply_crds(
    target: &ManagerTarget<'_>,
    binaries: &ClusterApiBinaries,
) -> Result<(), ClusterError> {
    let core = binaries.core_crds();
    let provider = provider_crds();
    if !provider.is_dir() {
        return Err(ClusterError::Io {
            what: format!("reading {}", provider.display()),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let core = core.display().to_string();
    let provider = provider.display().to_string();
    target.kubectl(&["apply", "--server-side", "-f", &core, "-f", &provider])?;
    target.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ])?;
    Ok(())
}

/// Whether `GET path` on 127.0.0.1:`port` answers 200.
fn http_ok(port: u16, path: &str) -> bool {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0_u8; 16];
    let mut read = 0;
    while read < head.len() {
        match stream.read(&mut head[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    is_ok_status(&head[..read])
}

/// Whether an HTTP response starts with a 200 status line.
fn is_ok_status(head: &[u8]) -> bool {
    head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200")
}

/// The manager exited because a port chosen for it was taken in the meantime.
fn lost_a_port(error: &ClusterError) -> bool {
    matches!(error, ClusterError::Exited { tail, .. } if tail.contains("address already in use"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_200_status_line_is_ready() {
        assert!(is_ok_status(b"HTTP/1.1 200 OK\r\n"));
        assert!(!is_ok_status(b"HTTP/1.1 500 Internal"));
        assert!(!is_ok_status(b"HTTP/1.1 20"));
        assert!(!is_ok_status(b""));
    }

    #[test]
    fn the_manifests_are_found_beside_the_binaries() {
        let found = ClusterApiBinaries::in_dir(Path::new("/c/v1"));
        assert_eq!(found.manager, Path::new("/c/v1/cluster-api-manager"));
        assert_eq!(found.metadata, Path::new("/c/v1/config/metadata.yaml"));
        assert_eq!(found.core_crds(), Path::new("/c/v1/config/crd/bases"));
        assert!(!found.all_present());
    }
}
