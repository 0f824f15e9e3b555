//! Redfish over HTTPS (or HTTP for emulators) with HTTP basic authentication on every
//! request: no session to leak, expire or clean up, and every BMC supports it.
//!
//! Only three resources are needed (the ComputerSystem, its `Boot` property and its
//! `ComputerSystem.Reset` action), so this is a small client on reqwest with serde types
//! rather than a generated one: `redfish-codegen`, named in the design, is models only (no
//! client, last released in 2023), and `nv-redfish` pulls a second reqwest into the build.
//!
//! Actions that answer `202 Accepted` with a task monitor are followed until the task ends.
//! A BMC that refuses a boot override during POST answers 409 or 503: that is
//! [`PowerError::Busy`], which the caller retries later.
//!
//! Every request first asks the driver's leadership [`Term`]: none is sent once the term is
//! over, and each waits for its answer only as long as the term allows.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use unbounded_runtime::leader::Term;

use super::{BmcAddress, Credentials, Power, PowerDriver, PowerError, Tls};

/// A Redfish BMC.
#[derive(Debug, Clone)]
pub struct RedfishBmc {
    client: reqwest::Client,
    base: String,
    system: Option<String>,
    name: String,
    credentials: Credentials,
    timeout: Duration,
    term: Term,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct System {
    power_state: Option<String>,
    boot: Option<Boot>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Boot {
    boot_source_override_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Collection {
    #[serde(rename = "Members", default)]
    members: Vec<Link>,
}

#[derive(Debug, Deserialize)]
struct Link {
    #[serde(rename = "@odata.id")]
    id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Task {
    task_state: Option<String>,
    #[serde(default)]
    messages: Vec<TaskMessage>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TaskMessage {
    message: Option<String>,
}

/// A Redfish `PowerState` as on or off; transitions count as where they are going from.
pub fn parse_power_state(state: &str) -> Option<Power> {
    match state {
        "On" | "PoweringOff" | "Paused" => Some(Power::On),
        "Off" | "PoweringOn" => Some(Power::Off),
        _ => None,
    }
}

/// The most requests one inventory read makes (a 2-socket server with 32 DIMMs, 24 drives
/// and 8 NICs needs about 75).
pub const INVENTORY_REQUESTS: usize = 400;

/// A link's path when it stays on the BMC (`/redfish/v1/…`): a document that points
/// elsewhere is not followed, since every request carries the BMC's credentials.
pub fn local_path(link: &str) -> Option<String> {
    let path = link.split('#').next().unwrap_or_default();
    (path.starts_with("/redfish/v1/") && !path.contains("..") && !path.contains("//"))
        .then(|| path.to_owned())
}

/// The local paths of a `Members` (or `Drives`) array of links.
pub fn member_paths(links: Option<&serde_json::Value>) -> Vec<String> {
    links
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("@odata.id")?.as_str().and_then(local_path))
        .collect()
}

/// The `Boot` patch for a one-time PXE boot. The boot mode is set only when the BMC reports
/// a different one: many BMCs (and sushy-tools on libvirt) refuse to switch it, and a
/// machine already in its mode needs no switch.
pub fn pxe_once_patch(uefi: bool, current_mode: Option<&str>) -> serde_json::Value {
    let wanted = if uefi { "UEFI" } else { "Legacy" };
    let mut boot = json!({
        "BootSourceOverrideTarget": "Pxe",
        "BootSourceOverrideEnabled": "Once",
    });
    if current_mode.is_some_and(|m| m != wanted) {
        boot["BootSourceOverrideMode"] = json!(wanted);
    }
    json!({ "Boot": boot })
}

/// The error message of a Redfish error body (`error.message`, or the first extended info).
fn redfish_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        let error = v.get("error")?;
        error
            .get("@Message.ExtendedInfo")
            .and_then(|i| i.get(0)?.get("Message")?.as_str())
            .or_else(|| error.get("message")?.as_str())
            .map(str::to_owned)
    });
    message.unwrap_or_else(|| body.chars().take(200).collect())
}

/// Why a Redfish HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The CA bundle is not PEM.
    #[error("the CA bundle is not PEM: {0}")]
    CaBundle(#[source] reqwest::Error),
    /// reqwest refused the settings.
    #[error("HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

/// The HTTP client for one Redfish BMC, as the Machine's TLS settings say: the PXE
/// provider's and the kubectl plugin's console reads alike. Every request bounded by
/// `timeout`, a fresh connection per request (BMC web servers close idle keep-alive
/// connections early, sushy-tools' does, and a reused dead one fails the call), and a few
/// redirects followed (Redfish names systems by UUID; some BMCs redirect other names).
pub fn http_client(tls: &Tls, timeout: Duration) -> Result<reqwest::Client, ClientError> {
    // ring, as kube's client uses; a second install is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::limited(3));
    if tls.insecure_skip_verify {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    if let Some(pem) = &tls.ca_bundle {
        let certificates =
            reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(ClientError::CaBundle)?;
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder.build().map_err(ClientError::Build)
}

impl RedfishBmc {
    /// A driver for a Redfish address.
    pub fn new(
        address: &BmcAddress,
        credentials: Credentials,
        tls: &Tls,
        timeout: Duration,
    ) -> Result<Self, PowerError> {
        let BmcAddress::Redfish {
            https,
            authority,
            system,
        } = address
        else {
            return Err(PowerError::Address {
                address: address.display_name(),
                message: "not a Redfish address".into(),
            });
        };
        let name = address.display_name();
        let client = http_client(tls, timeout).map_err(|error| match error {
            ClientError::CaBundle(message) => PowerError::Address {
                address: name.clone(),
                message: format!("the CA bundle is not PEM: {message}"),
            },
            ClientError::Build(message) => PowerError::Failed {
                bmc: name.clone(),
                message: format!("HTTP client: {message}"),
            },
        })?;
        Ok(Self {
            client,
            base: format!("{}://{authority}", if *https { "https" } else { "http" }),
            system: system.clone(),
            name,
            credentials,
            timeout,
            term: Term::unbounded(),
        })
    }

    /// The same driver, sending only within `term`.
    pub fn fenced_by(self, term: Term) -> Self {
        Self { term, ..self }
    }

    /// A request with the credentials, bounded by what the term grants; refused when the
    /// term is over.
    fn authorized(
        &self,
        method: Method,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, PowerError> {
        let wait = self
            .term
            .grant(self.timeout)
            .map_err(|why| PowerError::not_leading(&self.name, why))?;
        Ok(self
            .client
            .request(method, format!("{}{path}", self.base))
            .timeout(wait)
            .basic_auth(
                &self.credentials.username,
                Some(self.credentials.password()),
            )
            .header("Accept", "application/json"))
    }

    /// One request; maps transport and status errors. Returns the status, the task
    /// monitor location and the body.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Option<String>, String), PowerError> {
        let mut request = self.authorized(method, path)?;
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| self.transport_error(&e))?;
        let status = response.status();
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response
            .text()
            .await
            .map_err(|e| self.transport_error(&e))?;
        self.answer(status, path, text)
            .map(|text| (status, location, text))
    }

    /// A success's body, or the error a status means.
    fn answer(&self, status: StatusCode, path: &str, text: String) -> Result<String, PowerError> {
        let bmc = self.name.clone();
        match status {
            s if s.is_success() => Ok(text),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(PowerError::Unauthorized { bmc })
            }
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => Err(PowerError::Busy {
                bmc,
                message: format!("{status}: {}", redfish_message(&text)),
            }),
            s if s.is_server_error() => Err(PowerError::Busy {
                bmc,
                message: format!("{status}: {}", redfish_message(&text)),
            }),
            _ => Err(PowerError::Failed {
                bmc,
                message: format!("{status} for {path}: {}", redfish_message(&text)),
            }),
        }
    }

    /// reqwest's error text names the URL, which holds no credentials (they go in a header).
    fn transport_error(&self, error: &reqwest::Error) -> PowerError {
        if error.is_timeout() {
            PowerError::Timeout {
                bmc: self.name.clone(),
                seconds: self.timeout.as_secs().max(1),
            }
        } else {
            PowerError::Unreachable {
                bmc: self.name.clone(),
                message: unbounded_runtime::error_text::with_causes(error),
            }
        }
    }

    /// The ComputerSystem's path: the configured one, or the single member of Systems.
    async fn system_path(&self) -> Result<String, PowerError> {
        if let Some(path) = &self.system {
            return Ok(path.clone());
        }
        let (_, _, body) = self
            .request(Method::GET, "/redfish/v1/Systems", None)
            .await?;
        let systems: Collection = serde_json::from_str(&body).map_err(|e| PowerError::Failed {
            bmc: self.name.clone(),
            message: format!("the Systems collection: {e}"),
        })?;
        match systems.members.as_slice() {
            [one] => Ok(one.id.clone()),
            members => Err(PowerError::Failed {
                bmc: self.name.clone(),
                message: format!(
                    "{} systems: name one in the address (/redfish/v1/Systems/<id>)",
                    members.len()
                ),
            }),
        }
    }

    /// A Redfish resource as JSON; `None` when the BMC does not have it (404), as many lack
    /// a collection (sushy-tools has no `Memory`, older iDRACs no `Storage`).
    async fn document(&self, path: &str) -> Result<Option<serde_json::Value>, PowerError> {
        let response = self
            .authorized(Method::GET, path)?
            .send()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let text = response
            .text()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let text = self.answer(status, path, text)?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| PowerError::Failed {
                bmc: self.name.clone(),
                message: format!("{path} is not JSON: {e}"),
            })
    }

    /// The members of the collection `link` (an `{"@odata.id": …}` of `owner`) points at.
    async fn members(
        &self,
        owner: &serde_json::Value,
        link: &str,
        budget: &mut usize,
    ) -> Result<Vec<serde_json::Value>, PowerError> {
        let Some(path) = owner
            .pointer(&format!("/{link}/@odata.id"))
            .and_then(serde_json::Value::as_str)
            .and_then(local_path)
        else {
            return Ok(Vec::new());
        };
        let Some(collection) = self.document(&path).await? else {
            return Ok(Vec::new());
        };
        let paths = member_paths(collection.get("Members"));
        self.documents(&paths, budget).await
    }

    /// The documents at `paths`, each costing one of the `budget`'s requests.
    async fn documents(
        &self,
        paths: &[String],
        budget: &mut usize,
    ) -> Result<Vec<serde_json::Value>, PowerError> {
        let mut documents = Vec::new();
        for path in paths {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            documents.extend(self.document(path).await?);
        }
        Ok(documents)
    }

    /// Reads what the inventory needs from the ComputerSystem: the system itself, the
    /// members of its Processors, Memory and EthernetInterfaces, and the Drives of each of
    /// its Storage members. At most [`INVENTORY_REQUESTS`] requests: a BMC that lists more
    /// members is read in part.
    pub async fn inventory_documents(
        &self,
    ) -> Result<super::redfish_inventory::RedfishDocuments, PowerError> {
        let path = self.system_path().await?;
        let system = self
            .document(&path)
            .await?
            .ok_or_else(|| PowerError::Failed {
                bmc: self.name.clone(),
                message: format!("{path} does not exist"),
            })?;
        let mut budget = INVENTORY_REQUESTS;
        let processors = self.members(&system, "Processors", &mut budget).await?;
        let memory = self.members(&system, "Memory", &mut budget).await?;
        let ethernet_interfaces = self
            .members(&system, "EthernetInterfaces", &mut budget)
            .await?;
        let mut drives = Vec::new();
        for storage in self.members(&system, "Storage", &mut budget).await? {
            let paths = member_paths(storage.get("Drives"));
            drives.extend(self.documents(&paths, &mut budget).await?);
        }
        Ok(super::redfish_inventory::RedfishDocuments {
            system,
            processors,
            memory,
            ethernet_interfaces,
            drives,
        })
    }

    async fn system(&self, path: &str) -> Result<System, PowerError> {
        let (_, _, body) = self.request(Method::GET, path, None).await?;
        serde_json::from_str(&body).map_err(|e| PowerError::Failed {
            bmc: self.name.clone(),
            message: format!("the ComputerSystem: {e}"),
        })
    }

    async fn reset(&self, reset_type: &str) -> Result<(), PowerError> {
        let system = self.system_path().await?;
        let path = format!("{system}/Actions/ComputerSystem.Reset");
        let (status, location, _) = self
            .request(
                Method::POST,
                &path,
                Some(json!({ "ResetType": reset_type })),
            )
            .await?;
        if status == StatusCode::ACCEPTED
            && let Some(monitor) = location
        {
            self.follow_task(&monitor).await?;
        }
        Ok(())
    }

    /// Polls a task monitor until the task is no longer running.
    async fn follow_task(&self, monitor: &str) -> Result<(), PowerError> {
        let path = monitor
            .strip_prefix(&self.base)
            .unwrap_or(monitor)
            .to_owned();
        for _ in 0..60 {
            let (status, _, body) = self.request(Method::GET, &path, None).await?;
            if status != StatusCode::ACCEPTED {
                let task: Option<Task> = serde_json::from_str(&body).ok();
                return match task.as_ref().and_then(|t| t.task_state.as_deref()) {
                    Some("Exception" | "Killed" | "Cancelled") => Err(PowerError::Failed {
                        bmc: self.name.clone(),
                        message: task
                            .and_then(|t| t.messages.into_iter().find_map(|m| m.message))
                            .unwrap_or_else(|| "the task failed".into()),
                    }),
                    _ => Ok(()),
                };
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err(PowerError::Timeout {
            bmc: self.name.clone(),
            seconds: 60,
        })
    }
}

impl PowerDriver for RedfishBmc {
    async fn power_state(&self) -> Result<Power, PowerError> {
        let system = self.system_path().await?;
        let parsed = self.system(&system).await?;
        let state = parsed.power_state.unwrap_or_default();
        parse_power_state(&state).ok_or_else(|| PowerError::Failed {
            bmc: self.name.clone(),
            message: format!("unknown PowerState {state:?}"),
        })
    }

    async fn power_on(&self) -> Result<(), PowerError> {
        if self.power_state().await? == Power::On {
            return Ok(());
        }
        self.reset("On").await
    }

    async fn power_off(&self, grace: Duration) -> Result<(), PowerError> {
        if self.power_state().await? == Power::Off {
            return Ok(());
        }
        // Not every BMC offers GracefulShutdown; then go straight to ForceOff.
        if self.reset("GracefulShutdown").await.is_ok() {
            let deadline = tokio::time::Instant::now() + grace;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if self.power_state().await? == Power::Off {
                    return Ok(());
                }
            }
        }
        tracing::info!(bmc = %self.name, "no shutdown within the grace period; forcing power off");
        self.reset("ForceOff").await
    }

    async fn power_cycle(&self) -> Result<(), PowerError> {
        // Off, then on: a real power cycle (a warm reset keeps device state that a freshly
        // booted kernel may trip over, and not every BMC offers a cycle of its own).
        if self.power_state().await? == Power::On {
            self.reset("ForceOff").await?;
            super::wait_until_off(self, &self.name).await?;
        }
        self.reset("On").await
    }

    async fn set_one_time_pxe_boot(&self, uefi: bool) -> Result<(), PowerError> {
        let system = self.system_path().await?;
        let current = self.system(&system).await?;
        let mode = current.boot.and_then(|b| b.boot_source_override_mode);
        self.request(
            Method::PATCH,
            &system,
            Some(pxe_once_patch(uefi, mode.as_deref())),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_links_on_the_bmc_are_followed() {
        let cases = [
            (
                "/redfish/v1/Systems/1/Processors",
                Some("/redfish/v1/Systems/1/Processors"),
            ),
            (
                "/redfish/v1/Systems/1/Storage/1#/StorageControllers/0",
                Some("/redfish/v1/Systems/1/Storage/1"),
            ),
            ("http://elsewhere.example/redfish/v1/Systems/1", None),
            ("//elsewhere.example/redfish/v1/", None),
            ("/redfish/v1/../../etc", None),
            ("/other/path", None),
            ("", None),
        ];
        for (link, want) in cases {
            assert_eq!(local_path(link).as_deref(), want, "{link}");
        }
        let members = serde_json::json!([
            {"@odata.id": "/redfish/v1/Systems/1/Memory/DIMM1"},
            {"@odata.id": "https://attacker.example/steal"},
            {"no": "id"}
        ]);
        assert_eq!(
            member_paths(Some(&members)),
            vec!["/redfish/v1/Systems/1/Memory/DIMM1"]
        );
        assert!(member_paths(None).is_empty());
    }

    #[test]
    fn power_states_table() {
        for (text, want) in [
            ("On", Some(Power::On)),
            ("PoweringOff", Some(Power::On)),
            ("Off", Some(Power::Off)),
            ("PoweringOn", Some(Power::Off)),
            ("", None),
            ("Sleeping", None),
        ] {
            assert_eq!(parse_power_state(text), want, "{text}");
        }
    }

    #[test]
    fn error_bodies_give_their_message() {
        let body = r#"{"error":{"code":"Base.1.0.GeneralError","message":"A general error",
            "@Message.ExtendedInfo":[{"Message":"The boot override cannot be set during POST."}]}}"#;
        assert_eq!(
            redfish_message(body),
            "The boot override cannot be set during POST."
        );
        assert_eq!(redfish_message(r#"{"error":{"message":"m"}}"#), "m");
        assert_eq!(redfish_message("plain"), "plain");
    }

    #[test]
    fn pxe_patch_is_once_and_switches_the_mode_only_when_it_differs() {
        let patch = pxe_once_patch(true, Some("Legacy"));
        assert_eq!(patch["Boot"]["BootSourceOverrideEnabled"], "Once");
        assert_eq!(patch["Boot"]["BootSourceOverrideTarget"], "Pxe");
        assert_eq!(patch["Boot"]["BootSourceOverrideMode"], "UEFI");
        for (uefi, mode) in [(true, Some("UEFI")), (false, Some("Legacy")), (false, None)] {
            let patch = pxe_once_patch(uefi, mode);
            assert!(
                patch["Boot"].get("BootSourceOverrideMode").is_none(),
                "{patch}"
            );
        }
    }
}
