//! What the agent's loop and its operation tasks share: where things are kept on the host
//! ([`Paths`]) and, once the agent has its credentials, its identity, its clients and its
//! reporter ([`Context`]).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use unbounded_api::{MachineConfigurationVersion, MachineOperation};

use crate::credentials::Store;
use crate::identity::Identity;
use crate::state::KeptState;
use crate::status::Reporter;
use crate::systemd::Systemd;

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
    /// The agent's log directory, bound read-only into the container
    /// ([`crate::log_file`]).
    pub log: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            state: PathBuf::from("/var/lib/unbounded"),
            machines: PathBuf::from("/var/lib/machines"),
            nspawn: PathBuf::from("/etc/systemd/nspawn"),
            credentials_file: PathBuf::from(unbounded_api::agent::CREDENTIALS_FILE),
            bus: PathBuf::from("/run/unbounded/bus"),
            log: PathBuf::from(crate::log_file::LOG_DIR),
        }
    }
}

/// What the loop and the operation tasks share, fixed for the agent's life (a change of the
/// Node's name restarts the agent).
pub(crate) struct Context {
    pub(crate) identity: Identity,
    /// The Node's (and the container's) name.
    pub(crate) node: String,
    pub(crate) boot_id: String,
    pub(crate) paths: Paths,
    /// Fetches node images and talks to the bootserver.
    pub(crate) http: reqwest::Client,
    /// The credentials kept on disk.
    pub(crate) store: Store,
    pub(crate) nodes: Api<Node>,
    pub(crate) operations: Api<MachineOperation>,
    /// MachineConfigurationVersions (those the role names are readable).
    pub(crate) versions: Api<MachineConfigurationVersion>,
    /// The host's systemd.
    pub(crate) host: Systemd,
    pub(crate) reporter: Reporter,
    /// The operations a task is working on, so that each has one task.
    pub(crate) running_operations: Mutex<BTreeSet<String>>,
    /// This boot's state (what was paved). Held by the loop's pass (a pave) and by an
    /// `applyFiles`, so that the two never change the container at the same time.
    pub(crate) kept: tokio::sync::Mutex<KeptState>,
}

impl Context {
    /// The container's system bus, as the host sees it.
    pub(crate) fn bus_socket(&self) -> String {
        self.paths
            .bus
            .join(&self.node)
            .join("system_bus_socket")
            .display()
            .to_string()
    }
}
