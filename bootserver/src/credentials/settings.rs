//! `credentials:` in the configuration file, validated into [`IssuerSettings`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use unbounded_api::identity::IdentityMode;

use crate::setting::InvalidSetting;

/// `credentials:` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialsFile {
    api_server: String,
    ca_file: Option<PathBuf>,
    token_seconds: Option<i64>,
    bootstrap_token_seconds: Option<i64>,
    nonce_seconds: Option<u64>,
    nonce_file: Option<PathBuf>,
    mint_timeout_seconds: Option<u64>,
    replay_seconds: Option<u64>,
    default_identity: Option<IdentityMode>,
}

/// Settings of the issuer (the `credentials` section of the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerSettings {
    /// The API server URL as machines reach it.
    pub api_server: String,
    /// The cluster's CA certificates (PEM), handed to agents.
    pub ca_pem: String,
    /// Lifetime of ServiceAccount tokens.
    pub token_seconds: i64,
    /// Lifetime of bootstrap tokens.
    pub bootstrap_token_seconds: i64,
    /// How long a nonce stays valid after its script was served.
    pub nonce_seconds: u64,
    /// Where the nonces are kept across restarts (`credentials.nonceFile`); memory only
    /// when `None`.
    pub nonce_file: Option<std::path::PathBuf>,
    /// How long one request may wait for the API server (token review and mint) before it
    /// is answered 503 with `Retry-After`: below the agent's request timeout.
    pub mint_timeout: Duration,
    /// How a Machine that sets no identity mode (nor its configuration) proves itself
    /// (`credentials.defaultIdentity`).
    pub default_identity: IdentityMode,
    /// For how long a spent nonce or ticket, presented again by the same address, gets the
    /// credentials it was spent for again (`credentials.replaySeconds`).
    pub replay_seconds: u64,
}

/// The in-cluster CA bundle, the default `credentials.caFile`.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// Reads the CA file it names (handed to agents).
impl TryFrom<&CredentialsFile> for IssuerSettings {
    type Error = InvalidSetting;

    fn try_from(c: &CredentialsFile) -> Result<Self, InvalidSetting> {
        let invalid = |m: String| InvalidSetting(format!("credentials.{m}"));
        if !c.api_server.starts_with("https://") {
            return Err(invalid(format!(
                "apiServer must be an https:// URL as machines reach it, not {:?}",
                c.api_server
            )));
        }
        let ca_file = c
            .ca_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(IN_CLUSTER_CA));
        let ca_pem = std::fs::read_to_string(&ca_file)
            .map_err(|e| invalid(format!("caFile {}: {e}", ca_file.display())))?;
        if !ca_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(invalid(format!(
                "caFile {} holds no PEM certificate",
                ca_file.display()
            )));
        }
        let seconds = |name: &str, value: Option<i64>, default: i64| {
            let v = value.unwrap_or(default);
            // TokenRequest refuses less than 10 minutes; a day bounds what a stolen token is
            // worth.
            if (600..=86_400).contains(&v) {
                Ok(v)
            } else {
                Err(invalid(format!(
                    "{name} must be between 600 and 86400, not {v}"
                )))
            }
        };
        let nonce_seconds = c.nonce_seconds.unwrap_or(1800);
        if !(60..=86_400).contains(&nonce_seconds) {
            return Err(invalid(format!(
                "nonceSeconds must be between 60 and 86400, not {nonce_seconds}"
            )));
        }
        // The agent gives up on a request after 30 s: the answer (503 + Retry-After) must
        // come before that, or the agent retries while its nonce is still reserved.
        let mint_timeout_seconds = c.mint_timeout_seconds.unwrap_or(20);
        if !(1..=25).contains(&mint_timeout_seconds) {
            return Err(invalid(format!(
                "mintTimeoutSeconds must be between 1 and 25 (below the agent's 30 s request timeout), not {mint_timeout_seconds}"
            )));
        }
        // Long enough for an agent whose answer was lost to ask again (it waits up to 30 s
        // for one answer), short beside the token's lifetime.
        let replay_seconds = c.replay_seconds.unwrap_or(120);
        if !(1..=600).contains(&replay_seconds) {
            return Err(invalid(format!(
                "replaySeconds must be between 1 and 600, not {replay_seconds}"
            )));
        }
        Ok(Self {
            replay_seconds,
            api_server: c.api_server.trim_end_matches('/').to_owned(),
            ca_pem,
            token_seconds: seconds("tokenSeconds", c.token_seconds, 3600)?,
            bootstrap_token_seconds: seconds(
                "bootstrapTokenSeconds",
                c.bootstrap_token_seconds,
                3600,
            )?,
            nonce_seconds,
            nonce_file: c.nonce_file.clone(),
            mint_timeout: Duration::from_secs(mint_timeout_seconds),
            default_identity: c.default_identity.unwrap_or(IdentityMode::Network),
        })
    }
}
