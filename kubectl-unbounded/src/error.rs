//! The plugin's errors and their exit codes: 2 for input the plugin refuses (unknown
//! machines, a selector that matches nothing, a verb a machine cannot carry out, no
//! confirmation), 1 for everything that went wrong while acting or reading.

use crate::plan::PlanError;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig{what}: {source}")]
    Kubeconfig {
        /// The file, when one was named (`": <path>"`), else empty.
        what: String,
        /// What the client library said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request to the API server failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Machines named on the command line do not exist.
    #[error("no Machine named {}", .0.join(", "))]
    UnknownMachines(Vec<String>),
    /// A label selector matched no Machine.
    #[error("no Machine matches the selector {0:?}")]
    EmptySelector(String),
    /// `--pool` names no MachinePool.
    #[error("no MachinePool named {0}")]
    UnknownPool(String),
    /// `--configuration` names no MachineConfiguration.
    #[error("no MachineConfiguration named {0}")]
    UnknownConfiguration(String),
    /// The verb is refused.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// More machines than `--confirm-above` and no confirmation.
    #[error("{0}")]
    NotConfirmed(String),
    /// Some machines' part of the verb failed.
    #[error("{0}")]
    Failed(String),
    /// Following stopped at `--timeout` or on Ctrl-C.
    #[error("{0}")]
    TimedOut(String),
    /// Writing to the terminal failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// The machine has no console the plugin can open.
    #[error(transparent)]
    NoConsole(#[from] NoConsole),
    /// Opening the console failed (never with a credential in the message).
    #[error("console: {0}")]
    Console(String),
    /// ipmitool could not be started.
    #[error("console: running ipmitool (Debian package ipmitool): {0}")]
    Ipmitool(#[source] std::io::Error),
    /// Reading what a Redfish BMC advertises failed (never with a credential in the message).
    #[error("console: {0}")]
    Redfish(#[from] crate::redfish_console::RedfishError),
    /// A watch failed before it had listed everything.
    #[error("watching: {0}")]
    Watch(#[source] kube::runtime::watcher::Error),
    /// Rendering JSON or YAML failed.
    #[error("rendering the output: {0}")]
    Render(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::UnknownMachines(_)
            | Self::EmptySelector(_)
            | Self::UnknownPool(_)
            | Self::UnknownConfiguration(_)
            | Self::Plan(_)
            | Self::NoConsole(_)
            | Self::NotConfirmed(_) => 2,
            // The API server refuses a malformed label selector with 400 Bad Request.
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } if status.code == 400 => 2,
            _ => 1,
        }
    }

    /// Wraps a client error with what was being done.
    pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Api { what, source }
    }
}

/// Why a machine has no console the plugin can open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoConsole {
    /// Not a PXE Machine.
    #[error(
        "{machine} is a {provider} Machine: the console is a BMC's, and only pxe Machines have one"
    )]
    NotPxe {
        /// The Machine.
        machine: String,
        /// Its provider.
        provider: &'static str,
    },
    /// No `spec.pxe.bmc`.
    #[error("{0} has no BMC (spec.pxe.bmc): there is no serial console to reach")]
    NoBmc(String),
    /// A Redfish BMC whose serial console is SSH or Telnet, which the plugin does not open.
    #[error(
        "{machine}: its Redfish BMC offers a serial console over {protocol} only, which the plugin does not open (ssh takes a password only from a terminal or an askpass program; telnet sends it in clear): {how}"
    )]
    NotOpened {
        /// The Machine.
        machine: String,
        /// `SSH` or `Telnet`.
        protocol: &'static str,
        /// What to run instead (names the Secret, never holds a credential).
        how: String,
    },
    /// A Redfish BMC that offers no serial console (or only disabled ones).
    #[error("{machine}: this BMC offers no console we can open ({bmc} advertises: {advertised})")]
    NothingOffered {
        /// The Machine.
        machine: String,
        /// The BMC (scheme, host, port).
        bmc: String,
        /// What it advertises.
        advertised: String,
    },
    /// An address that cannot be read.
    #[error("{machine}: the BMC address {address:?} {reason}")]
    BadAddress {
        /// The Machine.
        machine: String,
        /// The address, user information left out.
        address: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}
