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

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The Kubernetes release the control plane runs (matches k8s-openapi's `v1_35` feature).
pub const KUBERNETES_VERSION: &str = "v1.35.4";

/// Environment variable naming a directory with kube-apiserver, kube-controller-manager,
/// kube-scheduler, kubectl and kubelet to use instead of building them.
pub const BIN_DIR_ENV: &str = "UNBOUNDED_KUBERNETES_BIN_DIR";

const BUILD_SCRIPT: &str = include_str!("../scripts/build-kubernetes.sh");
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
    /// Building the Kubernetes binaries failed.
    #[error("building Kubernetes {version} failed (exit status {status}); see the output above")]
    Build {
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
    #[error("building a Kubernetes client from {path}: {message}")]
    Client {
        /// The kubeconfig.
        path: String,
        /// Why.
        message: String,
    },
    /// No `cluster up` state was found.
    #[error("no running local control plane recorded in {0}")]
    NotRunning(String),
    /// The recorded state could not be read.
    #[error("reading control plane state {path}: {message}")]
    State {
        /// The state file.
        path: String,
        /// Why.
        message: String,
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

/// Paths of the Kubernetes binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
    /// kubelet.
    pub kubelet: PathBuf,
    /// etcd (Debian's etcd-server).
    pub etcd: PathBuf,
}

impl Binaries {
    /// Finds the binaries, building the Kubernetes ones into the cache when missing (with
    /// progress on stderr). Concurrent callers wait for one build.
    pub fn ensure() -> Result<Self, ClusterError> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let dir = cache_dir().join(format!("kubernetes-{KUBERNETES_VERSION}"));
                build_kubernetes(&dir)?;
                dir
            }
        };
        let in_dir = |name: &str| -> Result<PathBuf, ClusterError> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(ClusterError::MissingProgram {
                    program: path.display().to_string(),
                    hint: format!(
                        "unset {BIN_DIR_ENV} to build Kubernetes {KUBERNETES_VERSION}, or put the binary there"
                    ),
                })
            }
        };
        Ok(Self {
            kube_apiserver: in_dir("kube-apiserver")?,
            kube_controller_manager: in_dir("kube-controller-manager")?,
            kube_scheduler: in_dir("kube-scheduler")?,
            kubectl: in_dir("kubectl")?,
            kubelet: in_dir("kubelet")?,
            etcd: find_program(
                "etcd",
                "run scripts/install-deps.sh (Debian package etcd-server)",
            )?,
        })
    }
}

/// Builds the Kubernetes binaries into `out` unless they are there. Holds a lock file so that
/// test binaries started together build once.
fn build_kubernetes(out: &Path) -> Result<(), ClusterError> {
    let wanted = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
    ];
    if wanted.iter().all(|b| out.join(b).is_file()) {
        return Ok(());
    }
    find_program(
        "go",
        "install the Go toolchain (it builds Kubernetes from its Go modules)",
    )?;
    find_program("flock", "install util-linux")?;
    let parent = out.parent().unwrap_or(Path::new("/tmp"));
    fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
    let lock = parent.join(format!("kubernetes-{KUBERNETES_VERSION}.lock"));
    eprintln!(
        "testbed: building Kubernetes {KUBERNETES_VERSION} into {} (first time only: ~10 min on 2 cores)",
        out.display()
    );
    let mut child = Command::new("flock")
        .arg(&lock)
        .args(["bash", "-s", KUBERNETES_VERSION])
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io_err("starting the Kubernetes build"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(BUILD_SCRIPT.as_bytes())
            .map_err(io_err("passing the build script"))?;
    }
    let status = child
        .wait()
        .map_err(io_err("waiting for the Kubernetes build"))?;
    if !status.success() {
        return Err(ClusterError::Build {
            version: KUBERNETES_VERSION.to_owned(),
            status: status.to_string(),
        });
    }
    Ok(())
}

/// Finds a program on PATH.
pub fn find_program(name: &str, hint: &str) -> Result<PathBuf, ClusterError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| ClusterError::MissingProgram {
            program: name.to_owned(),
            hint: hint.to_owned(),
        })
}

/// How the processes of a control plane relate to the process that starts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// The processes receive SIGKILL when the thread that started them ends (tests).
    TiedToThread,
    /// The processes outlive the starter (`cluster up`); stop them with [`stop_detached`].
    Detached,
}

/// What `cluster up` records so that `cluster down` stops exactly what it started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DetachedState {
    /// The data directory.
    pub dir: PathBuf,
    /// The kubeconfig of the admin user.
    pub kubeconfig: PathBuf,
    /// `(component, pid, executable)` of each process started.
    pub processes: Vec<(String, u32, PathBuf)>,
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

/// A Machine created (dry run) to see [`PlaneOptions::finalizer_at_creation`]'s policy act.
const FINALIZER_PROBE: &str = "apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {name: finalizer-policy-probe}
spec: {provider: manual}
";

/// The audit policy of [`PlaneOptions::audit_log`]: writes at the Metadata level, once each
/// (when the answer has been sent), nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

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
        let dir = new_data_dir(lifetime)?;
        let mut plane = Self {
            kubeconfig: dir.join("admin.kubeconfig"),
            server: String::new(),
            dir,
            binaries,
            children: Vec::new(),
            lifetime,
            options,
        };
        plane.boot()?;
        Ok(plane)
    }

    fn boot(&mut self) -> Result<(), ClusterError> {
        let pki = self.dir.join("pki");
        fs::create_dir_all(&pki).map_err(io_err("creating the pki directory"))?;
        generate_pki(&pki)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let api_port = free_port()?;
        self.server = format!("https://127.0.0.1:{api_port}");
        let p = |name: &str| pki.join(name).display().to_string();

        write_kubeconfig(
            &self.kubeconfig,
            &self.server,
            &p("ca.crt"),
            &p("admin.crt"),
            &p("admin.key"),
        )?;
        let kcm_kubeconfig = self.dir.join("controller-manager.kubeconfig");
        write_kubeconfig(
            &kcm_kubeconfig,
            &self.server,
            &p("ca.crt"),
            &p("kcm.crt"),
            &p("kcm.key"),
        )?;
        let scheduler_kubeconfig = self.dir.join("scheduler.kubeconfig");
        write_kubeconfig(
            &scheduler_kubeconfig,
            &self.server,
            &p("ca.crt"),
            &p("scheduler.crt"),
            &p("scheduler.key"),
        )?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_args = vec![
            "--name".into(),
            "unbounded".into(),
            "--data-dir".into(),
            self.dir.join("etcd").display().to_string(),
            "--listen-client-urls".into(),
            etcd_url.clone(),
            "--advertise-client-urls".into(),
            etcd_url.clone(),
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("unbounded={peer_url}"),
            "--log-level".into(),
            "warn".into(),
        ];
        let etcd = self.binaries.etcd.clone();
        self.spawn("etcd", &etcd, &etcd_args)?;

        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!(
                "--kubelet-client-certificate={}",
                p("apiserver-kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            // Only a setting: nothing routes to this range.
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--enable-bootstrap-token-auth=true".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if self.options.finalizer_at_creation {
            apiserver_args.extend([
                "--feature-gates=MutatingAdmissionPolicy=true".into(),
                "--runtime-config=admissionregistration.k8s.io/v1beta1=true".into(),
            ]);
        }
        if self.options.audit_log {
            let policy = self.dir.join("audit-policy.yaml");
            fs::write(&policy, AUDIT_POLICY)
                .map_err(io_err(format!("writing {}", policy.display())))?;
            apiserver_args.extend([
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", self.dir.join("audit.log").display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
            ]);
        }
        let apiserver = self.binaries.kube_apiserver.clone();
        self.spawn("kube-apiserver", &apiserver, &apiserver_args)?;
        self.wait_ready("kube-apiserver", || {
            self.kubectl_output(&["get", "--raw", "/readyz"])
                .is_ok_and(|out| out.trim() == "ok")
        })?;

        let kcm_args: Vec<String> = vec![
            format!("--kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            format!("--service-account-private-key-file={}", p("sa.key")),
            format!("--root-ca-file={}", p("ca.crt")),
            format!("--cluster-signing-cert-file={}", p("ca.crt")),
            format!("--cluster-signing-key-file={}", p("ca.key")),
            "--controllers=*,bootstrapsigner,tokencleaner".into(),
            "--use-service-account-credentials=true".into(),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ];
        let kcm = self.binaries.kube_controller_manager.clone();
        self.spawn("kube-controller-manager", &kcm, &kcm_args)?;
        if self.options.scheduler {
            self.start_scheduler(&scheduler_kubeconfig)?;
        }

        self.install_manifests()?;
        // The service-account controller creating `default` shows the controller manager's
        // controllers (garbage collection among them) are running.
        self.wait_ready("kube-controller-manager", || {
            self.kubectl_output(&[
                "get",
                "serviceaccount",
                "default",
                "-n",
                "default",
                "-o",
                "name",
            ])
            .is_ok()
        })?;
        Ok(())
    }

    /// kube-scheduler with its own identity (`system:kube-scheduler`, which the API server's
    /// bootstrap RBAC binds), one instance, no leader election; ready when its `/healthz`
    /// answers (an unauthenticated path).
    fn start_scheduler(&mut self, kubeconfig: &Path) -> Result<(), ClusterError> {
        let port = free_port()?;
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ];
        let scheduler = self.binaries.kube_scheduler.clone();
        self.spawn("kube-scheduler", &scheduler, &args)?;
        let url = format!("https://127.0.0.1:{port}/healthz");
        self.wait_ready("kube-scheduler", || {
            Command::new("curl")
                .args(["-sk", "--max-time", "2", &url])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"ok")
        })
    }

    fn install_manifests(&self) -> Result<(), ClusterError> {
        let deploy = deploy_dir();
        let mut args = vec!["apply".to_owned(), "--server-side".to_owned()];
        for sub in ["crds", "policies"] {
            let path = deploy.join(sub);
            if path.is_dir() {
                args.push("-f".to_owned());
                args.push(path.display().to_string());
            }
        }
        if self.options.finalizer_at_creation {
            args.push("-f".to_owned());
            args.push(
                deploy
                    .join("components/finalizer-at-creation/policy.yaml")
                    .display()
                    .to_string(),
            );
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.kubectl_output(&refs)?;
        self.kubectl_output(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ])?;
        if self.options.finalizer_at_creation {
            // The API server applies a new policy once its informer has it: ready when a
            // server-side dry-run create comes back with the finalizer.
            self.wait_ready("kube-apiserver", || {
                self.kubectl_with_input(
                    &[
                        "create",
                        "--dry-run=server",
                        "-f",
                        "-",
                        "-o",
                        "jsonpath={.metadata.finalizers}",
                    ],
                    Some(FINALIZER_PROBE),
                )
                .is_ok_and(|out| out.contains("unbounded-cloud.io/machine"))
            })?;
        }
        Ok(())
    }

    fn spawn(
        &mut self,
        component: &str,
        program: &Path,
        args: &[String],
    ) -> Result<(), ClusterError> {
        let log_path = self.dir.join(format!("{component}.log"));
        let log = fs::File::create(&log_path)
            .map_err(io_err(format!("creating {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_err("duplicating a log handle"))?;
        let mut command = match self.lifetime {
            Lifetime::TiedToThread => {
                // setpriv sets PR_SET_PDEATHSIG, which survives the exec into the component.
                let mut c = Command::new("setpriv");
                c.args(["--pdeathsig", "KILL", "--"]).arg(program);
                c
            }
            Lifetime::Detached => {
                let mut c = Command::new("setsid");
                c.arg(program);
                c
            }
        };
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .current_dir(&self.dir);
        let child = command
            .spawn()
            .map_err(io_err(format!("starting {component}")))?;
        self.children.push((component.to_owned(), child));
        Ok(())
    }

    fn wait_ready(&self, component: &str, ready: impl Fn() -> bool) -> Result<(), ClusterError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let log = self.dir.join(format!("{component}.log"));
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(name) = self.exited_component() {
                let log = self.dir.join(format!("{name}.log"));
                return Err(ClusterError::Exited {
                    component: name,
                    tail: tail(&log, 30),
                    log: log.display().to_string(),
                });
            }
            if Instant::now() > deadline {
                return Err(ClusterError::NotReady {
                    component: component.to_owned(),
                    seconds: READY_TIMEOUT.as_secs(),
                    tail: tail(&log, 30),
                    log: log.display().to_string(),
                });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn exited_component(&self) -> Option<String> {
        // Only `Child::try_wait` needs &mut; a kill(0) probe through /proc is enough here.
        self.children
            .iter()
            .find(|(_, child)| {
                !Path::new(&format!("/proc/{}", child.id())).exists() || is_zombie(child.id())
            })
            .map(|(name, _)| name.clone())
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

/// Runs a kubectl `command` (already pointed at a cluster) with `args` and optional input:
/// its stdout, or its stderr as the error.
pub fn run_kubectl(
    mut command: Command,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ClusterError> {
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
    let out = child
        .wait_with_output()
        .map_err(io_err("waiting for kubectl"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ClusterError::Command {
            what: format!("kubectl {}", args.join(" ")),
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Builds a client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ClusterError> {
    let err = |message: String| ClusterError::Client {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// The file in which `cluster up` records what it started.
pub fn detached_state_path() -> PathBuf {
    cache_dir().join("cluster/state.json")
}

/// Starts a control plane that outlives this process and records it for [`stop_detached`].
pub fn start_detached() -> Result<DetachedState, ClusterError> {
    let state_path = detached_state_path();
    if state_path.exists() {
        // A previous `up` that was never taken down: stop it first so ports and state are clean.
        stop_detached()?;
    }
    let plane = LocalControlPlane::start_with(
        Lifetime::Detached,
        PlaneOptions {
            scheduler: true,
            ..PlaneOptions::default()
        },
    )?;
    let state = plane.detach();
    if let Some(parent) = state_path.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
    }
    let json = serde_json::to_vec_pretty(&state).map_err(|e| ClusterError::State {
        path: state_path.display().to_string(),
        message: e.to_string(),
    })?;
    fs::write(&state_path, json).map_err(io_err(format!("writing {}", state_path.display())))?;
    Ok(state)
}

/// Stops exactly the processes that [`start_detached`] recorded (checking each pid still runs
/// the recorded executable) and removes its data directory.
pub fn stop_detached() -> Result<DetachedState, ClusterError> {
    let state_path = detached_state_path();
    let text = match fs::read_to_string(&state_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClusterError::NotRunning(state_path.display().to_string()));
        }
        Err(e) => return Err(io_err(format!("reading {}", state_path.display()))(e)),
    };
    let state: DetachedState = serde_json::from_str(&text).map_err(|e| ClusterError::State {
        path: state_path.display().to_string(),
        message: e.to_string(),
    })?;
    for (name, pid, exe) in state.processes.iter().rev() {
        let running = fs::read_link(format!("/proc/{pid}/exe")).ok();
        if running.as_deref() != Some(exe.as_path()) {
            eprintln!("testbed: {name} (pid {pid}) is no longer running");
            continue;
        }
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists()
            && !is_zombie(*pid)
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(100));
        }
        if Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(*pid) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
    let _ = fs::remove_dir_all(&state.dir);
    fs::remove_file(&state_path).map_err(io_err(format!("removing {}", state_path.display())))?;
    Ok(state)
}

fn is_zombie(pid: u32) -> bool {
    let mut stat = String::new();
    fs::File::open(format!("/proc/{pid}/stat"))
        .and_then(|mut f| f.read_to_string(&mut stat))
        .is_ok_and(|_| {
            // The state follows the parenthesised command name.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
}

static DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh data directory on tmpfs when there is one (etcd fsyncs often), removing the
/// directories of test binaries that are gone.
fn new_data_dir(lifetime: Lifetime) -> Result<PathBuf, ClusterError> {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    if let Ok(entries) = fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("unbounded-cp-") else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    let name = match lifetime {
        Lifetime::TiedToThread => format!(
            "unbounded-cp-{}-{}",
            std::process::id(),
            DIR_COUNTER.fetch_add(1, Ordering::Relaxed)
        ),
        // One per cache directory, so that a test's `cluster up` (with its own cache
        // directory) never touches the cluster a person runs.
        Lifetime::Detached => {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            cache_dir().hash(&mut hasher);
            format!("unbounded-cluster-{:016x}", hasher.finish())
        }
    };
    let dir = base.join(name);
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io_err(format!("clearing {}", dir.display())))?;
    }
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    Ok(dir)
}

fn free_port() -> Result<u16, ClusterError> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_err("finding a free port"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(io_err("reading a free port"))
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn run_openssl(args: &[&str], dir: &Path) -> Result<(), ClusterError> {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running openssl"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterError::Command {
            what: format!("openssl {}", args.first().copied().unwrap_or_default()),
            output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// A certificate to issue from the local CA.
struct CertRequest<'a> {
    name: &'a str,
    subject: &'a str,
    usage: &'a str,
    alt_names: Option<&'a str>,
}

/// Generates the CA, the API server's serving certificate, client certificates and the
/// service-account key pair (ECDSA P-256: quick to generate).
fn generate_pki(dir: &Path) -> Result<(), ClusterError> {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=unbounded-local-ca",
    ]);
    run_openssl(&ca, dir)?;

    let certs = [
        CertRequest {
            name: "apiserver",
            subject: "/CN=kube-apiserver",
            usage: "serverAuth",
            alt_names: Some(
                // 10.99.0.1: the testbed's provisioning bridge, where VMs reach it.
                "IP:127.0.0.1,IP:10.99.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1",
            ),
        },
        CertRequest {
            name: "admin",
            subject: "/O=system:masters/CN=unbounded-admin",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "kcm",
            subject: "/CN=system:kube-controller-manager",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "scheduler",
            subject: "/CN=system:kube-scheduler",
            usage: "clientAuth",
            alt_names: None,
        },
        CertRequest {
            name: "apiserver-kubelet-client",
            subject: "/O=system:masters/CN=kube-apiserver-kubelet-client",
            usage: "clientAuth",
            alt_names: None,
        },
    ];
    for cert in certs {
        let key = format!("{}.key", cert.name);
        let csr = format!("{}.csr", cert.name);
        let crt = format!("{}.crt", cert.name);
        let ext = format!("{}.ext", cert.name);
        let mut ext_text = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={}\n",
            cert.usage
        );
        if let Some(alt) = cert.alt_names {
            ext_text.push_str(&format!("subjectAltName={alt}\n"));
        }
        fs::write(dir.join(&ext), ext_text)
            .map_err(io_err("writing a certificate extension file"))?;
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", cert.subject]);
        run_openssl(&req, dir)?;
        run_openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "3650",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
            dir,
        )?;
    }
    run_openssl(
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "sa.key",
        ],
        dir,
    )?;
    run_openssl(&["ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"], dir)?;
    Ok(())
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &str,
    cert: &str,
    key: &str,
) -> Result<(), ClusterError> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: unbounded-local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: unbounded-local
  context:
    cluster: unbounded-local
    user: user
current-context: unbounded-local
"
    );
    fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))
}
