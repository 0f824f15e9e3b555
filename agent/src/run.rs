//! The agent's loop: obtain credentials, watch the Machine, its Node and its role, decide
//! ([`crate::plan::decide`]), act (pave, start, record), report, and run the operations the
//! role routes to it. Every failure becomes a condition and a retry with backoff; nothing
//! here ends the process except a lost identity.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
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

use crate::container_root::{self, ContainerRootError};
use crate::credential_upkeep::{obtain_until_issued, refresh_forever};
use crate::credentials::{self, CredentialError, Store};
use crate::identity::Identity;
use crate::operations::{self, AfterRecord, RebootStep, Request, Scope};
use crate::plan::{self, Action, ContainerState, Facts, PaveReason, Paved};
use crate::render::{self, KubeletInput};
use crate::retry::{backoff, loop_until};
use crate::rootfs::{self, RootfsError};
use crate::state::{LocalState, StateFile};
use crate::status::{self, Readiness, Reporter};
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
    #[error(transparent)]
    Root(#[from] ContainerRootError),
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
            Self::Root(e) => e.reason(),
        }
    }
}

/// What the loop and the operation tasks share.
struct Shared {
    identity: Identity,
    node: String,
    boot_id: String,
    paths: Paths,
    nodes: Api<Node>,
    operations: Api<MachineOperation>,
    host: Systemd,
    reporter: Reporter,
    running_operations: Mutex<BTreeSet<String>>,
}

impl Shared {
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
    let credentials = obtain_until_issued(&http, &identity, &store, false).await;
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
        nodes: Api::all(client.clone()),
        operations: Api::all(client.clone()),
        host,
        reporter: Reporter::new(
            machines.clone(),
            &identity.machine,
            AgentStatus {
                version: Some(env!("CARGO_PKG_VERSION").to_owned()),
                boot_id: Some(boot_id.clone()),
                reboot: recorded_reboot,
                ..AgentStatus::default()
            },
        ),
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
                let _ = shared
                    .reporter
                    .report(|_| {}, Some(readiness.clone()))
                    .await;
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
            .reporter
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
        let source = rootfs::ImageSource {
            url,
            sha256: image.sha256.clone(),
            max_bytes: rootfs::size_limit(image.max_size_bytes),
        };
        let started = Instant::now();
        let bytes = rootfs::fetch_verify_unpack(&self.http, &source, &staging).await?;
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
        let writes = rendered
            .into_iter()
            .map(|(path, content, mode)| (path.to_owned(), content.into_bytes(), mode))
            .chain(
                files
                    .into_iter()
                    .map(|(path, content, mode)| (path, content.into_bytes(), mode)),
            )
            .collect();
        container_root::write_files(&staging, writes).await?;
        let root = shared.paths.machines.join(&shared.node);
        // The Node's identity survives a repave (kubelet's client certificate and
        // kubeconfig), so it joins again without a new bootstrap token, as the same Node user.
        container_root::carry_kubelet_identity(&root, &staging).await?;
        // The new root is ready: only now does the old container go.
        let unit = systemd::container_unit(&shared.node);
        shared.host.stop(&unit, Duration::from_secs(120)).await?;
        if reason == PaveReason::NodeDeleted {
            remove_reregistered_node(&shared.nodes, &shared.node).await;
        }
        container_root::replace(&staging, &root).await?;
        container_root::write_settings(&shared.paths.nspawn, &shared.node, nspawn, &bus_dir)
            .await?;
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
                    let _ = shared
                        .reporter
                        .report(|agent| agent.reboot = None, None)
                        .await;
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
                    let reported = shared
                        .reporter
                        .report(|agent| agent.reboot = Some(record), None)
                        .await;
                    match reported.map(operations::after_record) {
                        Err(error) => Outcome::Failed(format!(
                            "could not record the reboot before rebooting: {error}"
                        )),
                        Ok(AfterRecord::Postpone(reason)) => {
                            // Still InProgress under our field manager: the next pass resumes it.
                            println!("unbounded-agent: {name}: reboot postponed: {reason}");
                            return Ok(());
                        }
                        Ok(AfterRecord::Reboot) => {
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
