//! Which serial console a Redfish BMC offers, and whether the plugin can open it.
//!
//! Redfish does not carry a console itself: it advertises where one is. Two places say so,
//! both read here:
//! - the ComputerSystem's `SerialConsole` (ComputerSystem v1.13 and later): one object per
//!   protocol, `IPMI`, `SSH`, `Telnet`, each with `ServiceEnabled` and `Port` (and, for a
//!   console shared with the manager's command line, the `ConsoleEntryCommand` that enters it);
//! - each of its Managers' `SerialConsole` (older, and deprecated in the schema in favour of
//!   the system's): `ServiceEnabled` and `ConnectTypesSupported` (`IPMI`, `SSH`, `Telnet`,
//!   `Oem`), the ports in the Manager's `NetworkProtocol` (`IPMI.Port`, `SSH.Port`).
//!
//! A Manager's `CommandShell` is the BMC's own command line, not the machine's console: it
//! is shown in what the BMC advertises, never opened.
//!
//! [`decide()`] picks the console from that plain data (pure, table-tested): IPMI
//! Serial-over-LAN first (the plugin opens it with ipmitool on the BMC's host and the
//! Machine's BMC credentials, as for an `ipmi://` BMC), else SSH, else Telnet, which the plugin
//! does not open (ssh takes a password only from a terminal or an askpass program, telnet
//! sends it in clear) but names, so that the operator can; else nothing. A service is
//! counted unless the BMC says it is disabled (`ServiceEnabled: false`, or the Manager's
//! `NetworkProtocol` turning the protocol off): a BMC that does not say is tried, and ipmitool
//! reports what the BMC answers. [`read_advertised`] is the thin shell that GETs the
//! ComputerSystem, its Managers (`Links.ManagedBy`, else every member of
//! `/redfish/v1/Managers`) and their `NetworkProtocol`.
//!
//! Where things are: this file holds what a BMC advertises ([`Advertised`] and its parts, as
//! Redfish writes them); [`mod@decide`] picks the console from it and describes it for the
//! operator; [`read`] is the shell that asks the BMC.

use serde::Deserialize;

pub mod decide;
pub mod read;

pub use self::decide::{OtherProtocol, Route, decide, describe};
pub use self::read::{RedfishEndpoint, RedfishError, read_advertised};

/// A `SerialConsole` object, of a ComputerSystem (per-protocol objects) or of a Manager
/// (`ServiceEnabled` and `ConnectTypesSupported`); both shapes are read from either place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SerialConsole {
    /// The Manager's switch for its serial console service.
    pub service_enabled: Option<bool>,
    /// The Manager's protocols (`IPMI`, `SSH`, `Telnet`, `Oem`).
    pub connect_types_supported: Option<Vec<String>>,
    /// The system's IPMI Serial-over-LAN service.
    #[serde(rename = "IPMI")]
    pub ipmi: Option<ConsoleProtocol>,
    /// The system's SSH console service.
    #[serde(rename = "SSH")]
    pub ssh: Option<ConsoleProtocol>,
    /// The system's Telnet console service.
    pub telnet: Option<ConsoleProtocol>,
}

/// One console protocol of a ComputerSystem's `SerialConsole`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConsoleProtocol {
    /// Whether the service is on.
    pub service_enabled: Option<bool>,
    /// Its port.
    pub port: Option<i64>,
    /// What to type to reach the system's console from the manager's command line.
    pub console_entry_command: Option<String>,
}

/// A Manager's `CommandShell`: its own command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CommandShell {
    /// Whether it is on.
    pub service_enabled: Option<bool>,
    /// Its protocols.
    pub connect_types_supported: Option<Vec<String>>,
}

/// The parts of a Manager's `NetworkProtocol` the consoles use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkProtocol {
    /// IPMI over LAN.
    #[serde(rename = "IPMI")]
    pub ipmi: Option<ProtocolSetting>,
    /// SSH.
    #[serde(rename = "SSH")]
    pub ssh: Option<ProtocolSetting>,
    /// Telnet.
    pub telnet: Option<ProtocolSetting>,
}

/// One protocol of a `NetworkProtocol`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ProtocolSetting {
    /// Whether it is on.
    pub protocol_enabled: Option<bool>,
    /// Its port.
    pub port: Option<i64>,
}

/// What one Manager advertises.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagerConsoles {
    /// Its `@odata.id`.
    pub id: String,
    /// Its `SerialConsole`.
    pub serial_console: Option<SerialConsole>,
    /// Its `CommandShell`.
    pub command_shell: Option<CommandShell>,
    /// Its `NetworkProtocol`, when it links one.
    pub network_protocol: Option<NetworkProtocol>,
}

/// What a BMC advertises for one ComputerSystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advertised {
    /// The system's `SerialConsole`.
    pub system: Option<SerialConsole>,
    /// Its Managers.
    pub managers: Vec<ManagerConsoles>,
}
