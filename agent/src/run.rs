//! The agent's loop: obtain credentials, watch the Machine, its Node and its role, decide
//! ([`crate::plan::decide`]), act (pave, start, record), report, and run the operations the
//! role routes to it. Every failure becomes a condition and a retry with backoff; nothing
//! here ends the process except a lost identity.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::watch;
use unbounded_api::agent::{operations_in, role_name};
use unbounded_api::handler::{self, Claim, Outcome};
use unbounded_api::well_known::field_managers;
use unbounded_api::{
    AgentReboot, AgentStatus, HandlerKind, Machine, MachineConfigurationVersion, MachineOperation,
    ResolvedConfiguration,
};

use crate::credentials::{self, CredentialError, Store};
use crate::identity::Identity;
use crate::operations::{self, RebootStep, Request, Scope};
use crate::plan::{self, Action, ContainerState, Facts, PaveReason, Paved};
use crate::render::{self, KubeletInput};
use crate::rootfs::{self, RootfsError};
use crate::state::{LocalState, StateFile};
use crate::status::{self, Readiness};
use crate::systemd::{self, Systemd, SystemdError};

/// Where the agent keeps things on the host.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Credentials and local state (RAM on a network-booted host).
    pub state: PathBuf,
    /// Container roots (`<machines>/<node>`).
    pub machines: PathBuf,
    /// `.nspawn` settings files.
    pub nspawn: PathBuf,
    /// A credentials file to take over (machines that are not network-booted).
    pub credentials_file: PathBuf,
    /// Per-container directories bound over the container's `/run/dbus`.
    pub bus: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            state: PathBuf::from("/var/lib/unbounded"),
            machines: PathBuf::from("/var/lib/machines"),
            nspawn: PathBuf::from("/etc/systemd/nspawn"),
            credentials_file: PathBuf::from(unbounded_api::agent::CREDENTIALS_FILE),
            bus: PathBuf::from("/run/unbounded/bus"),
        }
    }
}

/// Errors that end the agent (systemd starts it again).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The boot ID could not be read.
    #[error("reading the boot ID: {0}")]
    BootId(#[source] std::io::Error),
    /// The state directory is unusable.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client for {server}: {message}")]
    Client {
        /// The API server.
        server: String,
        /// Why.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Http(String),
    /// The host's systemd is unreachable.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

/// Why a pave failed.
#[derive(Debug, thiserror::Error)]
enum PaveError {
    #[error("the configuration version has no node image (spec.template.image)")]
    NoImage,
    #[error(
        "the node image URL {0:?} is relative, and this machine has no bootserver to resolve it against: give the configuration an absolute http(s) URL"
    )]
    RelativeImage(String),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error("the credentials carried no bootstrap token")]
    NoBootstrapToken,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl PaveError {
    fn reason(&self) -> &'static str {
        match self {
            Self::NoImage | Self::RelativeImage(_) | Self::Render(_) => {
                status::reasons::INVALID_CONFIGURATION
            }
            Self::Rootfs(e) => e.reason(),
            Self::Credentials(_) | Self::NoBootstrapToken => status::reasons::CREDENTIALS_FAILED,
            Self::Systemd(_) => status::reasons::CONTAINER_FAILED,
            Self::Io { .. } => "FilesystemError",
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PaveError {
    let what = what.into();
    move |source| PaveError::Io { what, source }
}

/// Exponential backoff with jitter, from `base` up to `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(max);
    // Up to 25 % less, so that many agents restarted together spread out.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = exp.mul_f64(f64::from(nanos % 1000) / 4000.0);
    exp.saturating_sub(jitter)
}

/// The agent's status as last written, so that a write happens only on change.
#[derive(Debug, Default)]
struct Reported {
    agent: AgentStatus,
    readiness: Option<Readiness>,
    written: Option<(AgentStatus, Readiness)>,
}

/// What the loop and the operation tasks share.
struct Shared {
    identity: Identity,
    node: String,
    boot_id: String,
    paths: Paths,
    machines: Api<Machine>,
    nodes: Api<Node>,
    operations: Api<MachineOperation>,
    host: Systemd,
    reported: tokio::sync::Mutex<Reported>,
    running_operations: Mutex<BTreeSet<String>>,
}

impl Shared {
    /// Writes the agent's status when it changed.
    async fn report(
        &self,
        change: impl FnOnce(&mut AgentStatus),
        readiness: Option<Readiness>,
    ) -> Result<(), kube::Error> {
        let mut reported = self.reported.lock().await;
        change(&mut reported.agent);
        if let Some(r) = readiness {
            reported.readiness = Some(r);
        }
        let Some(readiness) = reported.readiness.clone() else {
            return Ok(());
        };
        let current = (reported.agent.clone(), readiness);
        if reported.written.as_ref() == Some(&current) {
            return Ok(());
        }
        status::apply(
            &self.machines,
            &self.identity.machine,
            &current.0,
            &current.1,
            None,
        )
        .await?;
        reported.written = Some(current);
        Ok(())
    }

    fn bus_socket(&self) -> String {
        self.paths
            .bus
            .join(&self.node)
            .join("system_bus_socket")
            .display()
            .to_string()
    }
}

/// Runs the agent until it fails for good.
pub async fn run(identity: Identity, paths: Paths) -> Result<(), AgentError> {
    let boot_id = crate::state::boot_id().map_err(AgentError::BootId)?;
    tracing::info!(machine = %identity.machine, bootserver = ?identity.bootserver, %boot_id, "unbounded-agent starting");
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| AgentError::Http(e.to_string()))?;
    let store = Store::new(&paths.state)?;
    if credentials::import(&store, &paths.credentials_file)? {
        println!(
            "unbounded-agent: took over the credentials file {}",
            paths.credentials_file.display()
        );
    }
    let credentials = obtain_with_backoff(&http, &identity, &store, false).await;
    println!(
        "unbounded-agent: credentials obtained for {}",
        identity.machine
    );
    let client = kube_client(&credentials.server, &store)?;
    tokio::spawn(refresh_forever(
        http.clone(),
        identity.clone(),
        store.clone(),
    ));

    let machines: Api<Machine> = Api::all(client.clone());
    let machine = loop_until("reading the Machine", || machines.get(&identity.machine)).await;
    let node = machine.node_name();
    let host = Systemd::host().await?;
    let recorded_reboot = machine
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.reboot.clone());
    let shared = Arc::new(Shared {
        node: node.clone(),
        boot_id: boot_id.clone(),
        paths: paths.clone(),
        machines: machines.clone(),
        nodes: Api::all(client.clone()),
        operations: Api::all(client.clone()),
        host,
        reported: tokio::sync::Mutex::new(Reported {
            agent: AgentStatus {
                version: Some(env!("CARGO_PKG_VERSION").to_owned()),
                boot_id: Some(boot_id.clone()),
                reboot: recorded_reboot,
                ..AgentStatus::default()
            },
            ..Reported::default()
        }),
        running_operations: Mutex::default(),
        identity: identity.clone(),
    });

    let mut machine_rx = watch_named(machines.clone(), identity.machine.clone());
    let mut node_rx = watch_named(Api::<Node>::all(client.clone()), node.clone());
    let mut role_rx = watch_named(
        Api::<ClusterRole>::all(client.clone()),
        role_name(&identity.machine),
    );
    let versions: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let mut loop_state = LoopState {
        state_file: StateFile::new(&paths.state),
        local: StateFile::new(&paths.state).load(&boot_id),
        version_cache: BTreeMap::new(),
        failures: 0,
        retry_after: None,
        http,
        store,
        kubelet_restarted: None,
    };
    loop {
        let machine = machine_rx.borrow_and_update().clone();
        let node_object = node_rx.borrow_and_update().clone();
        let role = role_rx.borrow_and_update().clone();
        if let Some(machine) = machine {
            if machine.node_name() != node {
                tracing::warn!(old = %node, new = %machine.node_name(), "the Node name changed; restarting");
                return Ok(());
            }
            loop_state
                .reconcile(&shared, &versions, &machine, node_object.as_deref())
                .await;
            if let Some(role) = role {
                consider_operations(&shared, &role, &machine);
            }
        }
        tokio::select! {
            _ = machine_rx.changed() => {}
            _ = node_rx.changed() => {}
            _ = role_rx.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(15)) => {}
        }
    }
}

struct LoopState {
    state_file: StateFile,
    local: LocalState,
    version_cache: BTreeMap<String, Arc<MachineConfigurationVersion>>,
    failures: u32,
    retry_after: Option<Instant>,
    http: reqwest::Client,
    store: Store,
    kubelet_restarted: Option<Instant>,
}

/// The Ready condition's message of a Node that is not Ready.
fn node_not_ready_message(node: Option<&Node>) -> Option<&str> {
    let ready = node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (ready.status != "True").then(|| ready.message.as_deref().unwrap_or_default())
}

impl LoopState {
    fn save(&self) {
        if let Err(error) = self.state_file.save(&self.local) {
            tracing::warn!(%error, "writing the agent's state file failed");
        }
    }

    async fn version(
        &mut self,
        versions: &Api<MachineConfigurationVersion>,
        resolved: &ResolvedConfiguration,
    ) -> Option<Arc<MachineConfigurationVersion>> {
        let name = resolved.version_name();
        if let Some(v) = self.version_cache.get(&name) {
            return Some(v.clone());
        }
        match versions.get(&name).await {
            Ok(v) => {
                let v = Arc::new(v);
                // Deployed versions are immutable: caching them is safe.
                if v.status.as_ref().is_some_and(|s| s.deployed) {
                    self.version_cache.insert(name, v.clone());
                }
                Some(v)
            }
            Err(error) => {
                // 403 until the controller adds it to our role: the role's change wakes us.
                tracing::debug!(%error, version = %name, "version not readable yet");
                None
            }
        }
    }

    async fn reconcile(
        &mut self,
        shared: &Shared,
        versions: &Api<MachineConfigurationVersion>,
        machine: &Machine,
        node: Option<&Node>,
    ) {
        let status = machine.status.as_ref();
        let desired = status.and_then(|s| s.configuration.clone());
        let version = match &desired {
            Some(d) => self.version(versions, d).await,
            None => None,
        };
        let unit = systemd::container_unit(&shared.node);
        let container = match shared.host.unit_state(&unit).await {
            Ok((load, active)) if self.local.paved.is_some() => {
                systemd::container_state(&load, &active)
            }
            Ok(_) => ContainerState::Absent,
            Err(error) => {
                tracing::warn!(%error, "reading the container's unit failed");
                ContainerState::Absent
            }
        };
        let node_uid = node.and_then(|n| n.meta().uid.clone());
        let action = plan::decide(&Facts {
            deleting: machine.metadata.deletion_timestamp.is_some(),
            desired: desired.as_ref(),
            version_loaded: version.is_some(),
            recorded_node_uid: status
                .and_then(|s| s.node_ref.as_ref())
                .and_then(|r| r.uid.as_deref()),
            node_uid: node_uid.as_deref(),
            node_name: &shared.node,
            paved: self.local.paved.as_ref(),
            interrupted: self.local.paving.is_some(),
            container,
            node_not_ready: node_not_ready_message(node),
            kubelet_recently_restarted: self
                .kubelet_restarted
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60)),
        });
        let paved_label = self.local.paved.as_ref().map(|p| {
            format!(
                "{} version {}",
                p.configuration.name, p.configuration.version
            )
        });
        let mut readiness = status::readiness(&action, container, paved_label.as_deref());
        let backing_off = self.retry_after.is_some_and(|t| Instant::now() < t);
        match &action {
            Action::Pave { .. } | Action::Start if backing_off => {}
            Action::Pave {
                configuration,
                reason,
            } => {
                let Some(version) = version else { return };
                println!(
                    "unbounded-agent: paving {} with {} version {} ({})",
                    shared.node,
                    configuration.name,
                    configuration.version,
                    reason.as_str()
                );
                let _ = shared.report(|_| {}, Some(readiness.clone())).await;
                match self
                    .pave(shared, machine, configuration, &version, *reason)
                    .await
                {
                    Ok(()) => {
                        self.failures = 0;
                        self.retry_after = None;
                        println!("unbounded-agent: node container {} started", shared.node);
                        readiness = Readiness {
                            ready: true,
                            reason: status::reasons::CONTAINER_RUNNING.into(),
                            message: format!(
                                "node container paved with {} version {} is running",
                                configuration.name, configuration.version
                            ),
                        };
                    }
                    Err(error) => {
                        println!("unbounded-agent: pave failed: {error}");
                        readiness = self.failed(error.reason(), &error.to_string());
                    }
                }
            }
            Action::Start => {
                if let Some(paved) = self.local.paved.as_mut() {
                    paved.starts += 1;
                }
                self.save();
                match shared.host.start(&unit, Duration::from_secs(120)).await {
                    Ok(()) => {
                        self.failures = 0;
                        self.retry_after = None;
                    }
                    Err(error) => {
                        readiness =
                            self.failed(status::reasons::CONTAINER_FAILED, &error.to_string());
                    }
                }
            }
            Action::RestartKubelet => {
                self.kubelet_restarted = Some(Instant::now());
                println!(
                    "unbounded-agent: kubelet on {} gave up initialising CSINode before its Node existed; restarting it",
                    shared.node
                );
                if let Outcome::Failed(message) =
                    restart_service(shared, "kubelet.service", Scope::Node).await
                {
                    tracing::warn!(message, "restarting kubelet failed");
                }
            }
            Action::RecordJoin(uid) => {
                println!(
                    "unbounded-agent: Node {} registered (uid {uid})",
                    shared.node
                );
                if let Some(paved) = self.local.paved.as_mut() {
                    paved.joined_node_uid = Some(uid.clone());
                }
                self.save();
            }
            Action::Wait(_) | Action::Steady => {}
        }
        let container = match shared.host.unit_state(&unit).await {
            Ok((load, active)) if self.local.paved.is_some() => {
                systemd::container_state(&load, &active)
            }
            _ => ContainerState::Absent,
        };
        let paved = self.local.paved.as_ref().map(|p| p.configuration.clone());
        if let Err(error) = shared
            .report(
                |agent| {
                    agent.container_state = Some(container.as_str().to_owned());
                    agent.paved = paved;
                },
                Some(readiness),
            )
            .await
        {
            tracing::warn!(%error, "reporting status failed");
        }
    }

    fn failed(&mut self, reason: &str, message: &str) -> Readiness {
        self.failures += 1;
        let wait = backoff(
            self.failures,
            Duration::from_secs(5),
            Duration::from_secs(300),
        );
        self.retry_after = Some(Instant::now() + wait);
        tracing::warn!(reason, message, retry_in = ?wait, "pave step failed");
        Readiness {
            ready: false,
            reason: reason.to_owned(),
            message: format!("{message} (retrying in {} s)", wait.as_secs()),
        }
    }

    async fn pave(
        &mut self,
        shared: &Shared,
        machine: &Machine,
        configuration: &ResolvedConfiguration,
        version: &MachineConfigurationVersion,
        reason: PaveReason,
    ) -> Result<(), PaveError> {
        let template = &version.spec.template;
        let image = template.image.as_ref().ok_or(PaveError::NoImage)?;
        let kubernetes = template.kubernetes.clone().unwrap_or_default();
        let bus_dir = shared.paths.bus.join(&shared.node);
        // Everything that can be refused is checked before anything changes.
        let nspawn =
            render::nspawn_settings(template.nspawn.as_ref(), &bus_dir.display().to_string())?;
        let mut files = Vec::new();
        for file in &template.files {
            files.push((
                file.path.clone(),
                file.content.clone(),
                rootfs::parse_mode(file.mode.as_deref())?,
            ));
        }
        let empty_check = KubeletInput {
            node_name: &shared.node,
            server: "",
            bootstrap_token: "",
            provider_id: machine.spec.provider_id.as_deref(),
            labels: &kubernetes.node_labels,
            taints: &kubernetes.node_taints,
            extra_args: &kubernetes.kubelet_extra_args,
        };
        render::kubelet_env(&empty_check)?;

        self.local.paving = Some(configuration.clone());
        self.save();
        let staging = shared
            .paths
            .machines
            .join(format!(".{}.staging", shared.node));
        let url = rootfs::image_url(&image.url, shared.identity.bootserver.as_deref())
            .ok_or_else(|| PaveError::RelativeImage(image.url.clone()))?;
        let started = Instant::now();
        let bytes = rootfs::fetch_and_unpack(&self.http, &url, &image.sha256, &staging).await?;
        println!(
            "unbounded-agent: node image {} MB fetched, verified and unpacked in {:.1} s",
            bytes / 1_000_000,
            started.elapsed().as_secs_f64()
        );
        let credentials =
            credentials::obtain(&self.http, &shared.identity, &self.store, true).await?;
        let token = credentials
            .bootstrap_token
            .clone()
            .ok_or(PaveError::NoBootstrapToken)?;
        let input = KubeletInput {
            server: &credentials.server,
            bootstrap_token: &token,
            ..empty_check
        };
        let rendered = [
            (render::KUBELET_ENV, render::kubelet_env(&input)?, 0o644),
            (
                render::KUBELET_CONFIG,
                render::kubelet_config(&input),
                0o644,
            ),
            (
                render::BOOTSTRAP_KUBECONFIG,
                render::bootstrap_kubeconfig(&input),
                0o600,
            ),
            (
                render::CA_FILE,
                credentials.certificate_authority.clone(),
                0o644,
            ),
        ];
        for (path, content, mode) in &rendered {
            rootfs::write_file(&staging, path, content.as_bytes(), *mode)?;
        }
        for (path, content, mode) in &files {
            rootfs::write_file(&staging, path, content.as_bytes(), *mode)?;
        }
        let root = shared.paths.machines.join(&shared.node);
        // The Node's identity survives a repave: kubelet's client certificate (it rotates
        // itself) and kubeconfig move into the new root, so it joins again without a new
        // bootstrap token and as the same Node user.
        preserve_kubelet_identity(&root, &staging)?;
        // The new root is ready: only now does the old container go.
        let unit = systemd::container_unit(&shared.node);
        shared.host.stop(&unit, Duration::from_secs(120)).await?;
        if reason == PaveReason::NodeDeleted {
            remove_reregistered_node(&shared.nodes, &shared.node).await;
        }
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(io(format!("removing {}", root.display())))?;
        }
        std::fs::rename(&staging, &root)
            .map_err(io(format!("moving the new root to {}", root.display())))?;
        std::fs::create_dir_all(&shared.paths.nspawn)
            .map_err(io("creating the nspawn directory"))?;
        std::fs::write(
            shared.paths.nspawn.join(format!("{}.nspawn", shared.node)),
            nspawn,
        )
        .map_err(io("writing the nspawn settings"))?;
        reset_dir(&bus_dir)?;
        self.local.paved = Some(Paved {
            container: shared.node.clone(),
            configuration: configuration.clone(),
            image_sha256: image.sha256.clone(),
            joined_node_uid: None,
            starts: 1,
        });
        self.local.paving = None;
        self.save();
        shared.host.start(&unit, Duration::from_secs(120)).await?;
        Ok(())
    }
}

/// Deletes the Node that the old container's kubelet registered again after the operator
/// deleted it (kubelet does so within seconds): the new kubelet would find it and never
/// apply its own labels and taints to an existing Node, so a rollback that changes them
/// would not show. The old container is stopped, so nothing registers it again before the
/// new kubelet does. Not fatal: without it the Node keeps its old labels, as said.
async fn remove_reregistered_node(nodes: &Api<Node>, name: &str) {
    match nodes
        .delete(name, &kube::api::DeleteParams::default())
        .await
    {
        Ok(_) => {
            println!("unbounded-agent: removed Node {name}, which the old kubelet registered again")
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => println!(
            "unbounded-agent: could not remove the re-registered Node {name} ({error}); its labels and taints stay as the old kubelet left them"
        ),
    }
}

/// What of kubelet's state identifies the Node (relative to a container root).
const KUBELET_IDENTITY: [&str; 2] = ["var/lib/kubelet/pki", "var/lib/kubelet/kubeconfig"];

fn preserve_kubelet_identity(old_root: &Path, new_root: &Path) -> Result<(), PaveError> {
    for relative in KUBELET_IDENTITY {
        let from = old_root.join(relative);
        if !from.exists() {
            continue;
        }
        let to = new_root.join(relative);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        copy_tree(&from, &to)?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), PaveError> {
    let meta =
        std::fs::symlink_metadata(from).map_err(io(format!("reading {}", from.display())))?;
    if meta.file_type().is_symlink() {
        // kubelet-client-current.pem is a symlink to the dated certificate beside it.
        let target = std::fs::read_link(from).map_err(io(format!("reading {}", from.display())))?;
        let _ = std::fs::remove_file(to);
        std::os::unix::fs::symlink(&target, to).map_err(io(format!("linking {}", to.display())))
    } else if meta.is_dir() {
        std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
        let entries = std::fs::read_dir(from).map_err(io(format!("reading {}", from.display())))?;
        for entry in entries {
            let entry = entry.map_err(io(format!("reading {}", from.display())))?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(io(format!("copying {}", from.display())))
    }
}

fn reset_dir(dir: &Path) -> Result<(), PaveError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(format!("clearing {}", dir.display())))?;
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))
}

/// Starts work on the operations the role routes to this agent.
fn consider_operations(shared: &Arc<Shared>, role: &ClusterRole, machine: &Machine) {
    let names = operations_in(role.rules.as_deref().unwrap_or_default());
    let recorded_reboot = machine
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.reboot.clone());
    for name in names {
        {
            let Ok(mut running) = shared.running_operations.lock() else {
                return;
            };
            if !running.insert(name.clone()) {
                continue;
            }
        }
        let shared = shared.clone();
        let recorded_reboot = recorded_reboot.clone();
        tokio::spawn(async move {
            if let Err(error) = handle_operation(&shared, &name, recorded_reboot.as_ref()).await {
                tracing::warn!(%error, operation = %name, "handling the operation failed");
            }
            if let Ok(mut running) = shared.running_operations.lock() {
                running.remove(&name);
            }
        });
    }
}

async fn handle_operation(
    shared: &Shared,
    name: &str,
    recorded_reboot: Option<&AgentReboot>,
) -> Result<(), handler::HandlerError> {
    let Ok(operation) = shared.operations.get(name).await else {
        return Ok(());
    };
    let field_manager = field_managers::AGENT;
    let ours = |m: &str, n: &str| {
        m == shared.identity.machine && unbounded_api::well_known::operations::AGENT.contains(&n)
    };
    let resumed = handler::resumable(&operation, field_manager);
    let operation = if resumed {
        operation
    } else if handler::claimable(&operation, HandlerKind::Agent, ours) {
        match handler::claim(&shared.operations, field_manager, &operation).await? {
            Claim::Won(op) => *op,
            Claim::Lost => return Ok(()),
        }
    } else {
        return Ok(());
    };
    let request = operations::parse(&operation.spec.operation_name, &operation.spec.parameters);
    println!(
        "unbounded-agent: running {} ({name})",
        operation.spec.operation_name
    );
    let outcome = match request {
        Err(message) => Outcome::Failed(message),
        Ok(Request::RestartService { unit, scope }) => restart_service(shared, &unit, scope).await,
        Ok(Request::Shutdown) => {
            let finished = handler::finish(
                &shared.operations,
                field_manager,
                name,
                &Outcome::Complete("shutting down".into()),
            )
            .await?;
            if finished {
                // The outcome is written first: a powered-off machine reports nothing.
                if let Err(error) = shared.host.power_off().await {
                    tracing::error!(%error, "power off failed");
                }
            }
            return Ok(());
        }
        Ok(Request::Reboot) => {
            match operations::reboot_step(name, recorded_reboot, &shared.boot_id) {
                RebootStep::Done { from } => {
                    let _ = shared.report(|agent| agent.reboot = None, None).await;
                    Outcome::Complete(format!(
                        "the machine rebooted (boot ID {from} → {})",
                        shared.boot_id
                    ))
                }
                RebootStep::RecordAndReboot => {
                    let record = AgentReboot {
                        operation: name.to_owned(),
                        from_boot_id: shared.boot_id.clone(),
                    };
                    match shared
                        .report(|agent| agent.reboot = Some(record), None)
                        .await
                    {
                        Err(error) => Outcome::Failed(format!(
                            "could not record the reboot before rebooting: {error}"
                        )),
                        Ok(()) => {
                            println!("unbounded-agent: rebooting for {name}");
                            match shared.host.reboot().await {
                                Err(error) => Outcome::Failed(error.to_string()),
                                Ok(()) => {
                                    // The next boot's agent completes it; if the machine is still
                                    // up long after, say so.
                                    tokio::time::sleep(Duration::from_secs(600)).await;
                                    Outcome::Failed("reboot requested, but the machine is still up after 10 minutes".into())
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    handler::finish(&shared.operations, field_manager, name, &outcome).await?;
    Ok(())
}

async fn restart_service(shared: &Shared, unit: &str, scope: Scope) -> Outcome {
    let timeout = Duration::from_secs(120);
    let result = match scope {
        Scope::Host => shared.host.restart(unit, timeout).await,
        Scope::Node => match Systemd::container(&shared.bus_socket()).await {
            Ok(container) => container.restart(unit, timeout).await,
            Err(error) => Err(error),
        },
    };
    let place = match scope {
        Scope::Host => "the host",
        Scope::Node => "the node container",
    };
    match result {
        Ok(()) => Outcome::Complete(format!("{unit} restarted in {place} and is active")),
        Err(error) => Outcome::Failed(format!("restarting {unit} in {place}: {error}")),
    }
}

fn kube_client(server: &str, store: &Store) -> Result<Client, AgentError> {
    let err = |message: String| AgentError::Client {
        server: server.to_owned(),
        message,
    };
    let config = credentials::client_config(server, store).map_err(err)?;
    Client::try_from(config).map_err(|e| err(e.to_string()))
}

async fn obtain_with_backoff(
    http: &reqwest::Client,
    identity: &Identity,
    store: &Store,
    bootstrap: bool,
) -> unbounded_api::agent::Credentials {
    let mut attempt = 0;
    loop {
        match credentials::obtain(http, identity, store, bootstrap).await {
            Ok(c) => return c,
            Err(error) => {
                let max = Duration::from_secs(60);
                // What cannot succeed without a new credential (a spent nonce, an expired
                // token) is not retried quickly: it is said once a minute.
                let wait = if error.is_retryable() {
                    backoff(attempt, Duration::from_secs(1), max)
                } else {
                    max
                };
                attempt += 1;
                // On the console too: a machine that cannot authenticate must say why.
                println!(
                    "unbounded-agent: {error}; trying again in {} s",
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn refresh_forever(http: reqwest::Client, identity: Identity, store: Store) {
    loop {
        let now = credentials::now_unix();
        let at = store.meta().map_or(now + 60, |m| {
            credentials::refresh_at(m.expires_unix, m.lifetime_seconds)
        });
        tokio::time::sleep(Duration::from_secs(at.saturating_sub(now).max(5))).await;
        let _ = obtain_with_backoff(&http, &identity, &store, false).await;
        tracing::info!("credentials refreshed");
    }
}

async fn loop_until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(error) => {
                let wait = backoff(attempt, Duration::from_secs(1), Duration::from_secs(30));
                attempt += 1;
                println!(
                    "unbounded-agent: {what}: {error}; retrying in {} s",
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Watches one object by name; the receiver holds it (or `None` while it does not exist).
fn watch_named<K>(api: Api<K>, name: String) -> watch::Receiver<Option<Arc<K>>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut initial: Option<Arc<K>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(obj)) => {
                    let _ = tx.send(Some(Arc::new(obj)));
                }
                Ok(watcher::Event::Delete(_)) => {
                    let _ = tx.send(None);
                }
                Ok(watcher::Event::Init) => initial = None,
                Ok(watcher::Event::InitApply(obj)) => initial = Some(Arc::new(obj)),
                Ok(watcher::Event::InitDone) => {
                    let _ = tx.send(initial.take());
                }
                Err(error) => tracing::debug!(%error, object = %name, "watch error; retrying"),
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_identity_moves_into_the_new_root() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        let pki = old.join("var/lib/kubelet/pki");
        std::fs::create_dir_all(&pki).unwrap();
        std::fs::write(pki.join("kubelet-client-2026.pem"), "cert").unwrap();
        std::os::unix::fs::symlink(
            "kubelet-client-2026.pem",
            pki.join("kubelet-client-current.pem"),
        )
        .unwrap();
        std::fs::write(old.join("var/lib/kubelet/kubeconfig"), "kc").unwrap();
        std::fs::write(old.join("var/lib/kubelet/other"), "not identity").unwrap();
        std::fs::create_dir_all(&new).unwrap();
        preserve_kubelet_identity(&old, &new).unwrap();
        let moved = new.join("var/lib/kubelet/pki/kubelet-client-current.pem");
        assert_eq!(std::fs::read_to_string(&moved).unwrap(), "cert");
        assert!(
            std::fs::symlink_metadata(&moved)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(new.join("var/lib/kubelet/kubeconfig")).unwrap(),
            "kc"
        );
        assert!(!new.join("var/lib/kubelet/other").exists());
        preserve_kubelet_identity(&dir.path().join("absent"), &new).unwrap();
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        for attempt in 0..20 {
            let d = backoff(attempt, base, max);
            let ceiling = base.saturating_mul(1 << attempt.min(16)).min(max);
            assert!(
                d <= ceiling && d >= ceiling.mul_f64(0.74),
                "{attempt}: {d:?}"
            );
        }
    }
}
