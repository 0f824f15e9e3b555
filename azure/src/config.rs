//! The provider's flags, validated once into [`Settings`].

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use crate::arm::LroPolicy;
use crate::credentials::AmbientIdentity;
use crate::custom_data::AgentSource;
use crate::retry::RetryPolicy;

/// `unbounded-azure`'s flags (each also an environment variable).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    version,
    about = "Unbounded's Azure provider: turns provider: azure Machines into Azure VMs"
)]
pub struct Flags {
    /// Cluster name, written into each VM's and NIC's `unbounded-cluster` tag.
    #[arg(long, env = "UNBOUNDED_CLUSTER_NAME")]
    pub cluster_name: String,
    /// The Kubernetes API server's URL as the VMs reach it: the agent and kubelet talk to it
    /// (in-cluster addresses such as kubernetes.default.svc are not reachable from a VM).
    #[arg(long, env = "UNBOUNDED_API_SERVER_URL")]
    pub api_server_url: String,
    /// The cluster's CA certificate (PEM) that the VMs trust for the API server.
    #[arg(
        long,
        env = "UNBOUNDED_CLUSTER_CA_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )]
    pub cluster_ca_file: PathBuf,
    /// Lifetime of the agent token a VM starts with; the agent renews it at 70 % of it, so a
    /// VM deallocated for longer than ~30 % of it must be recreated to join again.
    #[arg(long, default_value_t = 86_400)]
    pub agent_token_seconds: u64,
    /// Lifetime of the kubelet bootstrap token a VM starts with (its first join only).
    #[arg(long, default_value_t = 7_200)]
    pub bootstrap_token_seconds: u64,
    /// A bootserver's base URL as the VMs reach it, to resolve node image URLs that are
    /// relative (absolute http(s) image URLs need none).
    #[arg(long, env = "UNBOUNDED_BOOTSERVER_URL")]
    pub bootserver_url: Option<String>,
    /// Where VMs download the agent binary at first boot. Without it, the image must hold
    /// the agent at /usr/local/bin/unbounded-agent.
    #[arg(long, env = "UNBOUNDED_AGENT_URL", requires = "agent_sha256")]
    pub agent_url: Option<String>,
    /// The agent binary's SHA-256 (64 hex digits), checked before it is installed.
    #[arg(long, env = "UNBOUNDED_AGENT_SHA256", requires = "agent_url")]
    pub agent_sha256: Option<String>,
    /// The provider's own identity for Machines without spec.azure.credentialsSecretRef:
    /// `workload` (AKS workload identity), `managed` (managed identity), `none`, or `auto`
    /// (workload when AZURE_FEDERATED_TOKEN_FILE is set, otherwise managed).
    #[arg(long, env = "UNBOUNDED_AZURE_IDENTITY", default_value = "auto")]
    pub identity: String,
    /// Client ID of a user-assigned managed identity (with `--identity managed`).
    #[arg(long, env = "UNBOUNDED_MANAGED_IDENTITY_CLIENT_ID")]
    pub managed_identity_client_id: Option<String>,
    /// Azure Resource Manager's endpoint (another cloud's, such as
    /// https://management.usgovcloudapi.net).
    #[arg(
        long,
        env = "UNBOUNDED_ARM_ENDPOINT",
        default_value = "https://management.azure.com"
    )]
    pub arm_endpoint: String,
    /// The Microsoft identity platform's endpoint for tokens.
    #[arg(
        long,
        env = "AZURE_AUTHORITY_HOST",
        default_value = "https://login.microsoftonline.com"
    )]
    pub authority_host: String,
    /// PEM file with CA certificates to trust besides the system's (a TLS-inspecting proxy).
    #[arg(long, env = "UNBOUNDED_EXTRA_CA_FILE")]
    pub extra_ca_file: Option<PathBuf>,
    /// How often a provisioned Machine's VM is looked at.
    #[arg(long, default_value_t = 60)]
    pub poll_seconds: u64,
    /// The first wait after a failed reconcile; it doubles up to --max-backoff-seconds.
    #[arg(long, default_value_t = 10)]
    pub first_backoff_seconds: u64,
    /// The longest wait after failed reconciles.
    #[arg(long, default_value_t = 600)]
    pub max_backoff_seconds: u64,
    /// How long one long-running Azure operation is awaited before the reconcile gives up
    /// (and the next one looks again).
    #[arg(long, default_value_t = 1200)]
    pub operation_timeout_seconds: u64,
    /// Attempts of one request throttled (429) or failing transiently (5xx).
    #[arg(long, default_value_t = 5)]
    pub request_attempts: u32,
    /// Timeout of one HTTP request.
    #[arg(long, default_value_t = 60)]
    pub request_timeout_seconds: u64,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Leader election: only the replica that holds the Lease `unbounded-azure-provider`
    /// acts on Machines.
    /// Address of the health endpoints: /healthz (the process serves) and /readyz (the API
    /// server answers it).
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub probe_addr: std::net::SocketAddr,
    #[command(flatten)]
    pub election: unbounded_runtime::leader::ElectionFlags,
}

/// The provider's validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Cluster name (tag value).
    pub cluster_name: String,
    /// The bootserver's URL for the agent, if any.
    pub bootserver_url: Option<String>,
    /// The API server as the VMs reach it.
    pub api_server_url: String,
    /// The cluster CA the VMs trust (PEM).
    pub cluster_ca_pem: String,
    /// Lifetime of a VM's first agent token.
    pub agent_token_seconds: u64,
    /// Lifetime of a VM's kubelet bootstrap token.
    pub bootstrap_token_seconds: u64,
    /// Where the agent comes from.
    pub agent: AgentSource,
    /// The provider's own identity.
    pub identity: AmbientIdentity,
    /// ARM's endpoint.
    pub arm_endpoint: Url,
    /// The token endpoint's host.
    pub authority_host: Url,
    /// Extra trusted CA certificates (PEM).
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Retries of single requests.
    pub retry: RetryPolicy,
    /// Long-running operations.
    pub lro: LroPolicy,
    /// The provider loop's pacing.
    pub loop_settings: unbounded_runtime::provider::Settings,
}

/// A flag with a bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A URL that does not parse.
    #[error("--{flag}: {value:?} is not a URL: {source}")]
    NotAUrl {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The parser's error.
        #[source]
        source: url::ParseError,
    },
    /// A URL with the wrong scheme or no host.
    #[error("--{flag}: {message}")]
    Url {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A bad value.
    #[error("--{flag}: {message}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The cluster's CA file cannot be read.
    #[error("--cluster-ca-file: {path}: {source}")]
    ClusterCaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA file cannot be read.
    #[error("--extra-ca-file {path}: {source}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn url(flag: &'static str, value: &str, schemes: &[&str]) -> Result<Url, ConfigError> {
    let parsed = Url::parse(value).map_err(|source| ConfigError::NotAUrl {
        flag,
        value: value.to_owned(),
        source,
    })?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(ConfigError::Url {
            flag,
            message: format!("{value:?} must be a {} URL", schemes.join(" or ")),
        });
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::Url {
            flag,
            message: format!("{value:?} has no host"),
        });
    }
    Ok(parsed)
}

fn positive(flag: &'static str, seconds: u64) -> Result<Duration, ConfigError> {
    if seconds == 0 {
        return Err(ConfigError::Invalid {
            flag,
            message: "must be at least 1".into(),
        });
    }
    Ok(Duration::from_secs(seconds))
}

impl Settings {
    /// Validates the flags; `env_has_workload_identity` says whether
    /// `AZURE_FEDERATED_TOKEN_FILE` is set (for `--identity auto`).
    pub fn from_flags(flags: &Flags, env_has_workload_identity: bool) -> Result<Self, ConfigError> {
        let cluster_name = flags.cluster_name.trim().to_owned();
        if cluster_name.is_empty() || cluster_name.chars().count() > 256 {
            return Err(ConfigError::Invalid {
                flag: "cluster-name",
                message: "must be 1 to 256 characters (an Azure tag value)".into(),
            });
        }
        // Validated as URLs; kept as written (they go into the VM's agent configuration).
        if let Some(bootserver) = &flags.bootserver_url {
            url("bootserver-url", bootserver, &["http", "https"])?;
        }
        url("api-server-url", &flags.api_server_url, &["https"])?;
        let cluster_ca_pem = std::fs::read_to_string(&flags.cluster_ca_file).map_err(|source| {
            ConfigError::ClusterCaFile {
                path: flags.cluster_ca_file.display().to_string(),
                source,
            }
        })?;
        if !cluster_ca_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::Invalid {
                flag: "cluster-ca-file",
                message: format!(
                    "{}: no PEM certificate in it",
                    flags.cluster_ca_file.display()
                ),
            });
        }
        for (flag, seconds) in [
            ("agent-token-seconds", flags.agent_token_seconds),
            ("bootstrap-token-seconds", flags.bootstrap_token_seconds),
        ] {
            // The API server's minimum for TokenRequest is 10 minutes.
            if !(600..=30 * 86_400).contains(&seconds) {
                return Err(ConfigError::Invalid {
                    flag,
                    message: "must be between 600 and 2592000 seconds".into(),
                });
            }
        }
        let agent = match (&flags.agent_url, &flags.agent_sha256) {
            (Some(u), Some(sum)) => {
                url("agent-url", u, &["http", "https"])?;
                let sum = sum.trim().to_ascii_lowercase();
                if sum.len() != 64 || !sum.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(ConfigError::Invalid {
                        flag: "agent-sha256",
                        message: "must be 64 hex digits".into(),
                    });
                }
                AgentSource::Download {
                    url: u.clone(),
                    sha256: sum,
                }
            }
            (None, None) => AgentSource::Preinstalled,
            _ => {
                return Err(ConfigError::Invalid {
                    flag: "agent-url",
                    message: "--agent-url and --agent-sha256 go together".into(),
                });
            }
        };
        let identity = match flags.identity.as_str() {
            "workload" => AmbientIdentity::Workload,
            "managed" => AmbientIdentity::Managed {
                client_id: flags.managed_identity_client_id.clone(),
            },
            "none" => AmbientIdentity::None,
            "auto" if env_has_workload_identity => AmbientIdentity::Workload,
            "auto" => AmbientIdentity::Managed {
                client_id: flags.managed_identity_client_id.clone(),
            },
            other => {
                return Err(ConfigError::Invalid {
                    flag: "identity",
                    message: format!("{other:?} is not one of auto, workload, managed, none"),
                });
            }
        };
        let extra_ca_pem = match &flags.extra_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| ConfigError::CaFile {
                path: path.display().to_string(),
                source,
            })?),
            None => None,
        };
        if flags.request_attempts == 0 {
            return Err(ConfigError::Invalid {
                flag: "request-attempts",
                message: "must be at least 1".into(),
            });
        }
        Ok(Self {
            cluster_name,
            bootserver_url: flags.bootserver_url.clone(),
            api_server_url: flags.api_server_url.clone(),
            cluster_ca_pem,
            agent_token_seconds: flags.agent_token_seconds,
            bootstrap_token_seconds: flags.bootstrap_token_seconds,
            agent,
            identity,
            arm_endpoint: url("arm-endpoint", &flags.arm_endpoint, &["https"])?,
            authority_host: url("authority-host", &flags.authority_host, &["https"])?,
            extra_ca_pem,
            request_timeout: positive("request-timeout-seconds", flags.request_timeout_seconds)?,
            retry: RetryPolicy {
                attempts: flags.request_attempts,
                ..RetryPolicy::default()
            },
            lro: LroPolicy {
                timeout: positive("operation-timeout-seconds", flags.operation_timeout_seconds)?,
                ..LroPolicy::default()
            },
            loop_settings: unbounded_runtime::provider::Settings {
                poll: positive("poll-seconds", flags.poll_seconds)?,
                first_backoff: positive("first-backoff-seconds", flags.first_backoff_seconds)?,
                max_backoff: positive("max-backoff-seconds", flags.max_backoff_seconds)?,
                ..unbounded_runtime::provider::Settings::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// A CA file for the tests of this process (its content is only checked to be PEM).
    fn ca_file() -> &'static str {
        static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PATH.get_or_init(|| {
            let path =
                std::env::temp_dir().join(format!("unbounded-azure-ca-{}.pem", std::process::id()));
            std::fs::write(
                &path,
                "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            )
            .unwrap();
            path.display().to_string()
        })
    }

    fn flags(extra: &[&str]) -> Result<Flags, clap::Error> {
        let mut args = vec!["unbounded-azure", "--cluster-name", "prod"];
        for (flag, value) in [
            ("--api-server-url", "https://api.prod.example:6443"),
            ("--cluster-ca-file", ca_file()),
        ] {
            // A case that gives the flag itself replaces the default (clap refuses both).
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        Flags::try_parse_from(args)
    }

    #[test]
    fn defaults() {
        let s = Settings::from_flags(&flags(&[]).unwrap(), false).unwrap();
        assert_eq!(s.arm_endpoint.as_str(), "https://management.azure.com/");
        assert_eq!(s.agent, AgentSource::Preinstalled);
        assert_eq!(s.identity, AmbientIdentity::Managed { client_id: None });
        assert_eq!(s.bootserver_url, None);
        assert_eq!(s.agent_token_seconds, 86_400);
        assert!(s.cluster_ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let s = Settings::from_flags(&flags(&[]).unwrap(), true).unwrap();
        assert_eq!(s.identity, AmbientIdentity::Workload);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let sum = "A".repeat(64);
        let cases: [(&[&str], &str); 11] = [
            (&["--api-server-url", "http://api:6443"], "--api-server-url"),
            (&["--cluster-ca-file", "/proc/version"], "--cluster-ca-file"),
            (&["--agent-token-seconds", "60"], "--agent-token-seconds"),
            (&["--bootserver-url", "10.0.0.2"], "--bootserver-url"),
            (
                &["--arm-endpoint", "http://management.azure.com"],
                "--arm-endpoint",
            ),
            (&["--authority-host", "nonsense"], "--authority-host"),
            (&["--identity", "root"], "--identity"),
            (
                &["--agent-url", "ftp://x/agent", "--agent-sha256", &sum],
                "--agent-url",
            ),
            (
                &["--agent-url", "https://x/agent", "--agent-sha256", "abc"],
                "--agent-sha256",
            ),
            (&["--poll-seconds", "0"], "--poll-seconds"),
            (
                &["--extra-ca-file", "/nonexistent/ca.pem"],
                "--extra-ca-file",
            ),
        ];
        for (extra, flag) in cases {
            let error = Settings::from_flags(&flags(extra).unwrap(), false).unwrap_err();
            assert!(error.to_string().starts_with(flag), "{extra:?}: {error}");
        }
        // clap itself refuses a URL without its checksum.
        assert!(flags(&["--agent-url", "https://x/agent"]).is_err());
    }

    #[test]
    fn the_checksum_is_kept_lower_case() {
        let sum = "AB".repeat(32);
        let s = Settings::from_flags(
            &flags(&["--agent-url", "https://x/agent", "--agent-sha256", &sum]).unwrap(),
            false,
        )
        .unwrap();
        assert_eq!(
            s.agent,
            AgentSource::Download {
                url: "https://x/agent".into(),
                sha256: "ab".repeat(32)
            }
        );
    }
}
