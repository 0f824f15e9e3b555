//! A real, local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and
//! (when asked, [`PlaneOptions::scheduler`]) kube-scheduler on loopback, with Unbounded's CRDs
//! and policies installed.
//!
//! Tests use [`LocalControlPlane::shared`] (one instance per test binary, its processes die
//! with the test binary); people use `unbounded-testbed cluster up|down`, which leaves the
//! processes running until `down`.
//!
//! The Kubernetes binaries are built from Kubernetes' own Go modules at
//! [`KUBERNETES_VERSION`] by `testbed/scripts/build-kubernetes.sh` and cached under
//! `~/.cache/unbounded/kubernetes-<version>/`; set `UNBOUNDED_KUBERNETES_BIN_DIR` to use
//! binaries of your own instead.
//!
//! Cluster API's core manager runs beside it in tests ([`CoreManager`], [`cluster_api`]),
//! built from Cluster API's Go module at [`CLUSTER_API_VERSION`] and cached the same way.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::Duration;

/// The Kubernetes release the control plane runs (matches k8s-openapi's `v1_35` feature).
pub const KUBERNETES_VERSION: &str = "v1.35.4";

/// Environment variable naming a directory with kube-apiserver, kube-controller-manager,
/// kube-scheduler, kubectl and kubelet to use instead of building them.
pub const BIN_DIR_ENV: &str = "UNBOUNDED_KUBERNETES_BIN_DIR";

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A program the control plane needs is missing.
    #[error("{program} not found: {hint}")]
    MissingProgram {
        /// The program.
        program: String,
        /// How to get it.
        hint: String,
    },
    /// Building the Kubernetes (or Cluster API) binaries failed.
    #[error("building {project} {version} failed (exit status {status}); see the output above")]
    Build {
        /// What was being built: Kubernetes, Cluster API.
        project: String,
        /// The version being built.
        version: String,
        /// Exit status of the build script.
        status: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A command ran but failed.
    #[error("{what} failed: {output}")]
    Command {
        /// What was being done.
        what: String,
        /// Its output.
        output: String,
    },
    /// A component did not become ready in time.
    #[error(
        "{component} did not become ready within {seconds} s; last lines of its log ({log}):\n{tail}"
    )]
    NotReady {
        /// The component.
        component: String,
        /// How long we waited.
        seconds: u64,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// A component exited during start-up.
    #[error("{component} exited during start-up; last lines of its log ({log}):\n{tail}")]
    Exited {
        /// The component.
        component: String,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// The kubeconfig could not be turned into a client.
    #[error("building a Kubernetes client from {path}: {source}")]
    Client {
        /// The kubeconfig.
        path: String,
        /// Why: kube's error reading it or building the client.
        #[source]
        source: crate::failure::Cause,
    },
    /// No `cluster up` state was found.
    #[error("no running local control plane recorded in {0}")]
    NotRunning(String),
    /// The recorded state could not be read.
    #[error("reading control plane state {path}: {source}")]
    State {
        /// The state file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// Where Unbounded caches expensive things: `$UNBOUNDED_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/unbounded`, else `~/.cache/unbounded`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("UNBOUNDED_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("unbounded");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/unbounded")
}

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// How the processes of a control plane relate to the process that starts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// The processes receive SIGKILL when the thread that started them ends (tests).
    TiedToThread,
    /// The processes outlive the starter (`cluster up`); stop them with [`stop_detached`].
    Detached,
}

/// What a control plane is started with, beyond the defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlaneOptions {
    /// Write an audit log of every write request (metadata only: who, what, when, the
    /// user agent and the answer), one JSON object a line, at
    /// [`LocalControlPlane::audit_log_path`].
    pub audit_log: bool,
    /// Also run kube-scheduler, so that pods get a Node (the lab, `cluster up`). Off for
    /// tests, whose fake Nodes and pods must stay where the test puts them.
    pub scheduler: bool,
    /// Serve MutatingAdmissionPolicy (beta in 1.35: a feature gate and the v1beta1 API) and
    /// apply `deploy/components/finalizer-at-creation`, so Machines are created with the
    /// controller's finalizer.
    pub finalizer_at_creation: bool,
}

impl PlaneOptions {
    /// The defaults with [`PlaneOptions::audit_log`].
    pub fn audited() -> Self {
        Self {
            audit_log: true,
            ..Self::default()
        }
    }
}

/// A running etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler).
#[derive(Debug)]
pub struct LocalControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    binaries: Binaries,
    children: Vec<(String, Child)>,
    lifetime: Lifetime,
    options: PlaneOptions,
}

static SHARED: OnceLock<Result<LocalControlPlane, String>> = OnceLock::new();

impl LocalControlPlane {
    /// The control plane shared by every test of this test binary, started on first use
    /// (blocking: a few seconds when the binaries are cached). Its processes are killed when
    /// the test binary exits.
    pub fn shared() -> Result<&'static LocalControlPlane, ClusterError> {
        Self::shared_with(PlaneOptions::default())
    }

    /// [`LocalControlPlane::shared`], started with `options` if this is the first call of
    /// the test binary (later calls get the same control plane whatever they ask).
    pub fn shared_with(options: PlaneOptions) -> Result<&'static LocalControlPlane, ClusterError> {
        let result = SHARED.get_or_init(|| {
            // A thread that lives as long as the process: the processes are tied to it with
            // PR_SET_PDEATHSIG, so they die with the test binary, not with the first test.
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = thread::Builder::new()
                .name("local-control-plane".into())
                .spawn(move || {
                    let started = LocalControlPlane::start_with(Lifetime::TiedToThread, options)
                        .map_err(|e| e.to_string());
                    let _ = tx.send(started);
                    loop {
                        thread::park();
                    }
                });
            match spawned {
                Ok(_) => rx
                    .recv()
                    .unwrap_or_else(|_| Err("control plane thread ended".to_owned())),
                Err(e) => Err(format!("spawning the control plane thread: {e}")),
            }
        });
        result.as_ref().map_err(|message| ClusterError::Command {
            what: "starting the shared local control plane".to_owned(),
            output: message.clone(),
        })
    }

    /// Starts a new control plane in a fresh directory and installs the CRDs and policies.
    pub fn start(lifetime: Lifetime) -> Result<Self, ClusterError> {
        Self::start_with(lifetime, PlaneOptions::default())
    }

    /// [`LocalControlPlane::start`] with `options`.
    pub fn start_with(lifetime: Lifetime, options: PlaneOptions) -> Result<Self, ClusterError> {
        let binaries = Binaries::ensure()?;
        find_program(
            "openssl",
            "run scripts/install-deps.sh (Debian package openssl)",
        )?;
        let mut attempt = 1;
        loop {
            let dir = new_data_dir(lifetime)?;
            let mut plane = Self {
                kubeconfig: dir.join("admin.kubeconfig"),
                server: String::new(),
                dir,
                binaries: binaries.clone(),
                children: Vec::new(),
                lifetime,
                options,
            };
            match plane.boot() {
                Ok(()) => return Ok(plane),
                // Dropping the plane stops what it started and removes its directory.
                Err(e) if attempt < PORT_ATTEMPTS && lost_a_port(&e) => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// The admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's audit log (JSON lines), when started with
    /// [`PlaneOptions::audit_log`].
    pub fn audit_log_path(&self) -> Option<PathBuf> {
        self.options.audit_log.then(|| self.dir.join("audit.log"))
    }

    /// The API server's URL.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The data directory (certificates, logs, etcd data).
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// The process id of a component (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`).
    pub fn pid(&self, component: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(name, _)| name == component)
            .map(|(_, child)| child.id())
    }

    /// The binaries this control plane runs.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A `kubectl` command already pointed at this control plane.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.binaries.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// Runs kubectl and returns its stdout, or its stderr as the error.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<String, ClusterError> {
        run_kubectl(self.kubectl(), args, None)
    }

    /// Runs kubectl with `stdin` as its input (`apply -f -`); stdout, or stderr as the error.
    pub fn kubectl_with_input(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, ClusterError> {
        run_kubectl(self.kubectl(), args, stdin)
    }

    /// A new Kubernetes client for the current tokio runtime, as the admin user.
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Leaves the processes running and returns what `stop_detached` needs to stop them.
    pub fn detach(mut self) -> DetachedState {
        let processes = self
            .children
            .drain(..)
            .map(|(name, child)| {
                let exe = match name.as_str() {
                    "etcd" => self.binaries.etcd.clone(),
                    "kube-apiserver" => self.binaries.kube_apiserver.clone(),
                    "kube-scheduler" => self.binaries.kube_scheduler.clone(),
                    _ => self.binaries.kube_controller_manager.clone(),
                };
                let exe = fs::canonicalize(&exe).unwrap_or(exe);
                (name, child.id(), exe)
            })
            .collect();
        let state = DetachedState {
            dir: self.dir.clone(),
            kubeconfig: self.kubeconfig.clone(),
            processes,
        };
        // Nothing left to stop on drop; keep the directory.
        self.lifetime = Lifetime::Detached;
        state
    }
}

impl Drop for LocalControlPlane {
    fn drop(&mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.lifetime == Lifetime::TiedToThread {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// How many times a start-up that lost a port is tried, each with new ports.
const PORT_ATTEMPTS: u32 = 3;

/// A component exited because the port chosen for it was taken between [`boot::free_port`]
/// finding it free and the component binding it: another process (a parallel test binary,
/// an outgoing connection's ephemeral port) got there first. Nothing about the plane is
/// wrong, so the start is tried again with new ports.
fn lost_a_port(error: &ClusterError) -> bool {
    matches!(error, ClusterError::Exited { tail, .. } if tail.contains("address already in use"))
}

/// Runs a kubectl `command` (already pointed at a cluster) with `args` and optional input:
/// its stdout, or its stderr as the error.
pub fn run_kubectl(
    command: Command,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ClusterError> {
    let out = kubectl_output(command, args, stdin)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ClusterError::Command {
            what: format!("kubectl {}", args.join(" ")),
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Runs kubectl (`command`) with `args`, `stdin` written to it; its whole output, whatever
/// its exit status.
pub fn kubectl_output(
    mut command: Command,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<std::process::Output, ClusterError> {
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(io_err("running kubectl"))?;
    if let (Some(mut input), Some(text)) = (child.stdin.take(), stdin) {
        input
            .write_all(text.as_bytes())
            .map_err(io_err("writing kubectl's input"))?;
    }
    child
        .wait_with_output()
        .map_err(io_err("waiting for kubectl"))
}

/// Builds a client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ClusterError> {
    let err = |source: crate::failure::Cause| ClusterError::Client {
        path: path.display().to_string(),
        source,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.into()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.into()))?;
    kube::Client::try_from(config).map_err(|e| err(e.into()))
}

mod binaries;
mod boot;
pub mod cluster_api;
mod detached;
mod pki;
pub use pki::{ServerPki, ca_and_server, pkcs8_der, self_signed_server};

pub use binaries::{Binaries, find_program, kubelet_of};
use boot::new_data_dir;
pub use cluster_api::{CLUSTER_API_VERSION, ClusterApiBinaries, CoreManager, ManagerTarget};
pub use detached::{DetachedState, detached_state_path, start_detached, stop_detached};

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(tail: &str) -> ClusterError {
        ClusterError::Exited {
            component: "etcd".to_owned(),
            log: "/dev/shm/x/etcd.log".to_owned(),
            tail: tail.to_owned(),
        }
    }

    #[test]
    fn only_a_component_that_lost_its_port_is_started_again() {
        // etcd's and kube-apiserver's own words when the port was taken.
        assert!(lost_a_port(&exited(
            "etcdmain: listen tcp 127.0.0.1:34017: bind: address already in use"
        )));
        assert!(lost_a_port(&exited(
            "failed to create listener: failed to listen on 127.0.0.1:6443: listen tcp \
             127.0.0.1:6443: bind: address already in use"
        )));
        assert!(!lost_a_port(&exited(
            "etcdmain: open /x/etcd: permission denied"
        )));
        assert!(!lost_a_port(&ClusterError::NotReady {
            component: "kube-apiserver".to_owned(),
            seconds: 60,
            log: String::new(),
            tail: "bind: address already in use".to_owned(),
        }));
    }
}
