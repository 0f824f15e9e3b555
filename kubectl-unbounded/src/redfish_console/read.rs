//! The shell that asks a Redfish BMC what it advertises: the ComputerSystem, its Managers
//! and their `NetworkProtocol`, over the PXE provider's HTTP client.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use super::{Advertised, CommandShell, ManagerConsoles, NetworkProtocol, SerialConsole};

/// How long one Redfish request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Errors reading what a Redfish BMC advertises. None carries a credential: the password
/// travels in the Authorization header, never in a URL or a message.
#[derive(Debug, thiserror::Error)]
pub enum RedfishError {
    /// No connection or no answer.
    #[error("the Redfish BMC {bmc} is unreachable: {}", unbounded_runtime::error_text::with_causes(.source))]
    Unreachable {
        /// The BMC (scheme, host, port).
        bmc: String,
        /// What the HTTP client said (its text is printed with its causes: reqwest's own
        /// says only "error sending request").
        #[source]
        source: reqwest::Error,
    },
    /// 401 or 403.
    #[error(
        "the Redfish BMC {bmc} refused the credentials of the Secret {secret} (wrong user name or password?)"
    )]
    Unauthorized {
        /// The BMC.
        bmc: String,
        /// `namespace/name` of the Secret.
        secret: String,
    },
    /// Another error status.
    #[error("the Redfish BMC {bmc} answered {status} for {path}")]
    Status {
        /// The BMC.
        bmc: String,
        /// The resource.
        path: String,
        /// The status.
        status: StatusCode,
    },
    /// A body that is not the resource asked for.
    #[error("the Redfish BMC {bmc}: {path} is not a {what}: {source}")]
    Malformed {
        /// The BMC.
        bmc: String,
        /// The resource.
        path: String,
        /// What it should have been.
        what: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// No system named in the address, and not exactly one in `/redfish/v1/Systems`.
    #[error(
        "the Redfish BMC {bmc} has {count} systems: name one in the address (/redfish/v1/Systems/<id>)"
    )]
    WhichSystem {
        /// The BMC.
        bmc: String,
        /// How many it has.
        count: usize,
    },
    /// The TLS settings of the Machine cannot be used.
    #[error("the Redfish BMC {bmc}: {source}")]
    Tls {
        /// The BMC.
        bmc: String,
        /// What is wrong: the PXE provider's client refused them.
        #[source]
        source: unbounded_pxe::power::redfish::ClientError,
    },
}

/// Where a Redfish BMC is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishEndpoint {
    /// `http` or `https`.
    pub https: bool,
    /// `host[:port]` as in the address.
    pub authority: String,
    /// The ComputerSystem's path, or `None` for the single member of Systems.
    pub system: Option<String>,
    /// Accept any certificate.
    pub insecure_skip_verify: bool,
    /// PEM CA bundle of the BMC's certificate.
    pub ca_bundle: Option<String>,
}

impl RedfishEndpoint {
    /// The BMC as messages name it: scheme, host and port.
    pub fn display_name(&self) -> String {
        format!(
            "{}://{}",
            if self.https {
                "redfish+https"
            } else {
                "redfish+http"
            },
            self.authority
        )
    }
}

#[derive(Debug, Deserialize)]
struct Link {
    #[serde(rename = "@odata.id")]
    id: String,
}

#[derive(Debug, Deserialize)]
struct Collection {
    #[serde(rename = "Members", default)]
    members: Vec<Link>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SystemLinks {
    #[serde(default)]
    managed_by: Option<Vec<Link>>,
}

/// A ComputerSystem document (what the console needs of it).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct System {
    pub(super) serial_console: Option<SerialConsole>,
    #[serde(default)]
    links: Option<SystemLinks>,
}

/// A Manager document (what the console needs of it).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Manager {
    pub(super) serial_console: Option<SerialConsole>,
    pub(super) command_shell: Option<CommandShell>,
    network_protocol: Option<Link>,
}

/// A Redfish reader with basic authentication on every request (no session to clean up).
struct Reader<'a> {
    client: reqwest::Client,
    base: String,
    endpoint: &'a RedfishEndpoint,
    username: &'a str,
    password: &'a str,
    secret: &'a str,
}

impl Reader<'_> {
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<T, RedfishError> {
        let bmc = self.endpoint.display_name();
        // Links are paths; a BMC may write them absolute.
        let url = if path.starts_with("http://") || path.starts_with("https://") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base)
        };
        let unreachable = |source: reqwest::Error| RedfishError::Unreachable {
            bmc: bmc.clone(),
            source,
        };
        let response = self
            .client
            .get(&url)
            .basic_auth(self.username, Some(self.password))
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(RedfishError::Unauthorized {
                bmc,
                secret: self.secret.to_owned(),
            });
        }
        if !status.is_success() {
            return Err(RedfishError::Status {
                bmc,
                path: path.to_owned(),
                status,
            });
        }
        let body = response.bytes().await.map_err(unreachable)?;
        serde_json::from_slice(&body).map_err(|source| RedfishError::Malformed {
            bmc,
            path: path.to_owned(),
            what,
            source,
        })
    }
}

fn http_client(endpoint: &RedfishEndpoint) -> Result<reqwest::Client, RedfishError> {
    let tls = unbounded_pxe::power::Tls {
        insecure_skip_verify: endpoint.insecure_skip_verify,
        ca_bundle: endpoint.ca_bundle.clone(),
    };
    // The PXE provider's client: the same TLS settings mean the same trust.
    unbounded_pxe::power::redfish::http_client(&tls, REQUEST_TIMEOUT).map_err(|source| {
        RedfishError::Tls {
            bmc: endpoint.display_name(),
            source,
        }
    })
}

/// Reads what the BMC advertises for the Machine's system: the ComputerSystem, its Managers
/// and their `NetworkProtocol` (a `NetworkProtocol` that cannot be read only loses its ports).
/// `secret` (`namespace/name`) is named in an authentication error.
pub async fn read_advertised(
    endpoint: &RedfishEndpoint,
    username: &str,
    password: &str,
    secret: &str,
) -> Result<Advertised, RedfishError> {
    let reader = Reader {
        client: http_client(endpoint)?,
        base: format!(
            "{}://{}",
            if endpoint.https { "https" } else { "http" },
            endpoint.authority
        ),
        endpoint,
        username,
        password,
        secret,
    };
    let system_path = match &endpoint.system {
        Some(path) => path.clone(),
        None => {
            let systems: Collection = reader
                .get("/redfish/v1/Systems", "ComputerSystem collection")
                .await?;
            match systems.members.as_slice() {
                [one] => one.id.clone(),
                members => {
                    return Err(RedfishError::WhichSystem {
                        bmc: endpoint.display_name(),
                        count: members.len(),
                    });
                }
            }
        }
    };
    let system: System = reader.get(&system_path, "ComputerSystem").await?;
    let manager_paths: Vec<String> = match system.links.and_then(|l| l.managed_by) {
        Some(links) if !links.is_empty() => links.into_iter().map(|l| l.id).collect(),
        _ => {
            let managers: Collection = reader
                .get("/redfish/v1/Managers", "Manager collection")
                .await?;
            managers.members.into_iter().map(|l| l.id).collect()
        }
    };
    let mut managers = Vec::new();
    for path in manager_paths {
        let manager: Manager = reader.get(&path, "Manager").await?;
        let network_protocol = match &manager.network_protocol {
            Some(link) => reader
                .get::<NetworkProtocol>(&link.id, "ManagerNetworkProtocol")
                .await
                .ok(),
            None => None,
        };
        managers.push(ManagerConsoles {
            id: path,
            serial_console: manager.serial_console,
            command_shell: manager.command_shell,
            network_protocol,
        });
    }
    Ok(Advertised {
        system: system.serial_console,
        managers,
    })
}
