//! Starting a control plane: its data directory, PKI, the processes one after the other
//! (each waited for), the CRDs and policies.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::detached::is_zombie;
use super::pki::{generate_pki, write_kubeconfig};
use super::{
    ClusterError, Lifetime, LocalControlPlane, READY_TIMEOUT, cache_dir, deploy_dir, io_err,
};
use crate::ports::{Protocol, free_loopback_port};

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

impl LocalControlPlane {
    pub(super) fn boot(&mut self) -> Result<(), ClusterError> {
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
}

static DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh data directory on tmpfs when there is one (etcd fsyncs often), removing the
/// directories of test binaries that are gone.
pub(super) fn new_data_dir(lifetime: Lifetime) -> Result<PathBuf, ClusterError> {
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

pub(super) fn free_port() -> Result<u16, ClusterError> {
    free_loopback_port(Protocol::Tcp).map_err(io_err("finding a free port"))
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
