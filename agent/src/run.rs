//! The agent's loop: obtain credentials, watch the Machine, its Node and its role, and on
//! every change (or every 15 s) run one pass ([`crate::reconcile`]: decide, act, report) and
//! start the operations the role routes to it ([`crate::operation_tasks`]). Every failure
//! becomes a condition and a retry with backoff; nothing here ends the process except a
//! lost identity.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Client;
use kube::api::Api;
use unbounded_api::agent::role_name;
use unbounded_api::{AgentStatus, Machine, MachineConfigurationVersion};

use crate::context::{Context, Paths};
use crate::credential_upkeep::{obtain_until_issued, refresh_forever};
use crate::credentials::{self, CredentialError, Store};
use crate::identity::Identity;
use crate::operation_tasks::consider_operations;
use crate::reconcile::Reconciler;
use crate::retry::loop_until;
use crate::status::Reporter;
use crate::systemd::{Systemd, SystemdError};
use crate::watch_one::watch_named;

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
    #[error("building the Kubernetes client for {server}: {source}")]
    Client {
        /// The API server.
        server: String,
        /// Why: the server URL or kube's client.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Http(#[source] reqwest::Error),
    /// The host's systemd is unreachable.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

/// Runs the agent until it fails for good.
pub async fn run(identity: Identity, paths: Paths) -> Result<(), AgentError> {
    let boot_id = crate::state::boot_id().map_err(AgentError::BootId)?;
    tracing::info!(machine = %identity.machine, bootserver = ?identity.bootserver, %boot_id, "unbounded-agent starting");
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(AgentError::Http)?;
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
    // Carried over so that this agent's first write does not drop a release wipe's report
    // (server-side apply removes what its manager no longer sends).
    let recorded_release_wipe = machine
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.release_wipe.clone());
    let ctx = Arc::new(Context {
        node: node.clone(),
        boot_id: boot_id.clone(),
        paths: paths.clone(),
        http,
        store,
        nodes: Api::all(client.clone()),
        operations: Api::all(client.clone()),
        versions: Api::all(client.clone()),
        host,
        reporter: Reporter::new(
            machines.clone(),
            &identity.machine,
            AgentStatus {
                version: Some(env!("CARGO_PKG_VERSION").to_owned()),
                boot_id: Some(boot_id.clone()),
                reboot: recorded_reboot,
                release_wipe: recorded_release_wipe,
                ..AgentStatus::default()
            },
        ),
        running_operations: Mutex::default(),
        kept: tokio::sync::Mutex::new(crate::state::KeptState::load(&paths.state, &boot_id)),
        identity: identity.clone(),
    });

    let mut machine_rx = watch_named(machines.clone(), identity.machine.clone());
    let mut node_rx = watch_named(Api::<Node>::all(client.clone()), node.clone());
    let mut role_rx = watch_named(
        Api::<ClusterRole>::all(client.clone()),
        role_name(&identity.machine),
    );
    let versions: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let mut reconciler = Reconciler::new();
    let inventory = crate::inventory_refresh::Refresher::default();
    loop {
        let machine = machine_rx.borrow_and_update().clone();
        let node_object = node_rx.borrow_and_update().clone();
        let role = role_rx.borrow_and_update().clone();
        if let Some(machine) = machine {
            if machine.node_name() != node {
                tracing::warn!(old = %node, new = %machine.node_name(), "the Node name changed; restarting");
                return Ok(());
            }
            reconciler
                .reconcile(&ctx, &versions, &machine, node_object.as_deref())
                .await;
            if let Some(role) = role {
                consider_operations(&ctx, &role, &machine);
            }
            inventory.consider(&client, &machine);
        }
        tokio::select! {
            _ = machine_rx.changed() => {}
            _ = node_rx.changed() => {}
            _ = role_rx.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(15)) => {}
        }
    }
}

fn kube_client(server: &str, store: &Store) -> Result<Client, AgentError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| AgentError::Client {
        server: server.to_owned(),
        source,
    };
    let config = credentials::client_config(server, store).map_err(err)?;
    Client::try_from(config).map_err(|e| err(e.into()))
}
