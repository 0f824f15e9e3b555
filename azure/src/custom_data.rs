//! The VM's custom data: a cloud-init `#cloud-config` that installs the agent, writes its
//! identity and first credentials and starts it, so that an Azure VM joins exactly like a
//! PXE machine (whose kernel command line carries the same identity: `unbounded.machine`,
//! `unbounded.bootserver`, and whose bootserver hands out the first credentials).
//!
//! The contract with the agent (crate `agent/`, binary `unbounded-agent`):
//! - the agent is a single static binary, downloaded from the provider's `--agent-url` and
//!   checked against `--agent-sha256` (or already in the image, at [`AGENT_BINARY`]);
//! - it runs as the systemd unit [`AGENT_UNIT`] ([`agent_command`]) with its flags in the
//!   environment file [`AGENT_ENV_FILE`]: `UNBOUNDED_MACHINE`, `UNBOUNDED_BOOTSERVER_URL`
//!   (only when the provider has a `--bootserver-url`; it resolves relative node image
//!   URLs), and `UNBOUNDED_PROVIDER_ID` for the operator's eyes;
//! - its first credentials are the JSON file
//!   [`unbounded_api::agent::CREDENTIALS_FILE`] (mode 0600): a token of the Machine's agent
//!   ServiceAccount, the API server's URL and CA, and a kubelet bootstrap token. The agent
//!   takes the file over, removes it, and renews its token itself through the TokenRequest
//!   API (the controller's Role for it allows exactly that).
//!
//! The agent then does what it does on a PXE machine: reads its configuration version,
//! paves the node container, and kubelet joins. Custom data is fixed when the VM is
//! created, so it never carries the configuration version (a repave picks up a new version
//! as on bare metal). It does carry the two short-lived credentials above, as Cluster API's
//! Azure provider carries kubeadm's bootstrap token: Azure does not return custom data
//! through its API, and in the VM the agent deletes the file once it has taken it over (the
//! copy cloud-init's datasource keeps, `/var/lib/waagent/ovf-env.xml`, is root's only).

use serde::Serialize;

/// Where the agent binary is installed.
pub const AGENT_BINARY: &str = "/usr/local/bin/unbounded-agent";
/// The agent's systemd unit.
pub const AGENT_UNIT: &str = "unbounded-agent.service";
/// The agent's identity, as environment variables.
pub const AGENT_ENV_FILE: &str = "/etc/unbounded/agent.env";
/// The script that downloads and verifies the agent.
const INSTALL_SCRIPT: &str = "/usr/local/lib/unbounded/install-agent";

/// Where the agent comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSource {
    /// Downloaded at first boot and checked against its SHA-256.
    Download {
        /// An `http(s)` URL the VM can reach.
        url: String,
        /// The binary's SHA-256, 64 lower-case hex digits.
        sha256: String,
    },
    /// Already in the VM's image at [`AGENT_BINARY`].
    Preinstalled,
}

/// Everything the custom data is made of.
#[derive(Debug, Clone, Copy)]
pub struct AgentLaunch<'a> {
    /// The Machine's name.
    pub machine: &'a str,
    /// The bootserver's base URL, as seen from the VM, if any.
    pub bootserver_url: Option<&'a str>,
    /// The Machine's provider ID.
    pub provider_id: &'a str,
    /// Where the agent comes from.
    pub source: &'a AgentSource,
    /// The agent's first credentials, as the JSON the agent reads.
    pub credentials_json: &'a str,
}

/// The agent's command line, as the unit runs it: the agent reads its flags from the
/// environment ([`AGENT_ENV_FILE`]), so that an absent bootserver is an absent variable
/// rather than an empty argument. This is the one place the invocation is decided.
pub fn agent_command() -> Vec<&'static str> {
    vec![AGENT_BINARY]
}

/// The agent's environment file.
pub fn agent_environment(launch: &AgentLaunch<'_>) -> String {
    let mut env = format!("UNBOUNDED_MACHINE={}\n", launch.machine);
    if let Some(bootserver) = launch.bootserver_url {
        env += &format!("UNBOUNDED_BOOTSERVER_URL={bootserver}\n");
    }
    env += &format!("UNBOUNDED_PROVIDER_ID={}\n", launch.provider_id);
    env
}

fn agent_unit() -> String {
    format!(
        "[Unit]\n\
         Description=Unbounded agent\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         EnvironmentFile={AGENT_ENV_FILE}\n\
         ExecStart={}\n\
         Restart=always\n\
         RestartSec=5\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        agent_command().join(" ")
    )
}

/// Downloads with retries (the network may come up late), verifies, installs. Its arguments
/// are the URL and the checksum, so neither is ever parsed by a shell.
const INSTALL_SCRIPT_TEXT: &str = r#"#!/bin/sh
# Installs the Unbounded agent: download (retrying while the network comes up), verify the
# SHA-256, install. Arguments: URL SHA256.
set -eu
url="$1"
sum="$2"
tmp="/usr/local/bin/.unbounded-agent.download"
n=0
until curl --fail --silent --show-error --location --output "$tmp" "$url"; do
  n=$((n + 1))
  if [ "$n" -ge 30 ]; then
    echo "unbounded: could not download the agent from $url" >&2
    exit 1
  fi
  sleep 10
done
echo "$sum  $tmp" | sha256sum -c -
install -m 0755 "$tmp" /usr/local/bin/unbounded-agent
rm -f "$tmp"
"#;

#[derive(Serialize)]
struct CloudConfig {
    write_files: Vec<WriteFile>,
    runcmd: Vec<Vec<String>>,
}

#[derive(Serialize)]
struct WriteFile {
    path: &'static str,
    permissions: &'static str,
    owner: &'static str,
    content: String,
}

/// Errors rendering custom data.
#[derive(Debug, thiserror::Error)]
#[error("rendering the VM's custom data: {0}")]
pub struct RenderError(#[source] serde_saphyr::SerializeError);

/// Renders the `#cloud-config` document.
pub fn render(launch: &AgentLaunch<'_>) -> Result<String, RenderError> {
    let mut write_files = vec![
        WriteFile {
            path: AGENT_ENV_FILE,
            permissions: "0644",
            owner: "root:root",
            content: agent_environment(launch),
        },
        WriteFile {
            path: unbounded_api::agent::CREDENTIALS_FILE,
            permissions: "0600",
            owner: "root:root",
            content: launch.credentials_json.to_owned(),
        },
        WriteFile {
            path: "/etc/systemd/system/unbounded-agent.service",
            permissions: "0644",
            owner: "root:root",
            content: agent_unit(),
        },
    ];
    let mut runcmd = Vec::new();
    if let AgentSource::Download { url, sha256 } = launch.source {
        write_files.push(WriteFile {
            path: INSTALL_SCRIPT,
            permissions: "0755",
            owner: "root:root",
            content: INSTALL_SCRIPT_TEXT.to_owned(),
        });
        runcmd.push(vec![INSTALL_SCRIPT.to_owned(), url.clone(), sha256.clone()]);
    }
    runcmd.push(vec!["systemctl".into(), "daemon-reload".into()]);
    runcmd.push(vec![
        "systemctl".into(),
        "enable".into(),
        "--now".into(),
        AGENT_UNIT.into(),
    ]);
    let yaml = serde_saphyr::to_string(&CloudConfig {
        write_files,
        runcmd,
    })
    .map_err(RenderError)?;
    Ok(format!("#cloud-config\n{yaml}"))
}

/// The custom data as the VM's `osProfile.customData` wants it: base64.
pub fn encode(cloud_config: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(cloud_config)
}

#[cfg(test)]
#[path = "custom_data_tests.rs"]
mod tests;
