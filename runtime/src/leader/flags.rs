//! The leader-election flags every component shares, and the API configuration they imply.

use std::path::PathBuf;
use std::time::Duration;

use super::{ElectionConfig, Timing, TimingError};

/// Leader-election flags (`#[command(flatten)]` them into a component's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ElectionFlags {
    /// Run without leader election: this replica acts as if it led (one replica only; tests
    /// and standalone set-ups).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "UNBOUNDED_LEADER_ELECTION_NAMESPACE",
        default_value = "unbounded-system"
    )]
    pub leader_election_namespace: String,
    /// Name of the leader-election Lease (default: the component's, such as
    /// `unbounded-controller` or `unbounded-pxe-provider`).
    #[arg(long)]
    pub lease_name: Option<String>,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// How long others wait, after they last saw the Lease change, before they take it
    /// (whole seconds: `15s`).
    #[arg(
        long,
        env = "UNBOUNDED_LEADER_ELECTION_LEASE_DURATION",
        default_value = "15s",
        value_parser = parse_duration
    )]
    pub leader_election_lease_duration: Duration,
    /// How long after the start of its last successful renewal a leader stops acting
    /// (shorter than the lease duration).
    #[arg(
        long,
        env = "UNBOUNDED_LEADER_ELECTION_RENEW_DEADLINE",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub leader_election_renew_deadline: Duration,
    /// How often the Lease is read and written (shorter than the renew deadline).
    #[arg(
        long,
        env = "UNBOUNDED_LEADER_ELECTION_RETRY_PERIOD",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub leader_election_retry_period: Duration,
    /// A kubeconfig for the Lease's client only (default: the component's own API
    /// configuration).
    #[arg(long, env = "UNBOUNDED_LEADER_ELECTION_KUBECONFIG")]
    pub leader_election_kubeconfig: Option<PathBuf>,
}

/// Why leader election could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The timings are invalid.
    #[error("leader election: {0}")]
    Timing(#[from] TimingError),
    /// The Lease's kubeconfig could not be used.
    #[error("leader election: the kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

impl ElectionFlags {
    /// This replica's identity: the flag, else `$POD_NAME`, else [`default_identity`].
    pub fn identity(&self) -> String {
        self.leader_election_identity
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(default_identity)
    }

    /// The election's configuration, validated; `None` with `--no-leader-election`.
    pub fn config(&self, default_lease_name: &str) -> Result<Option<ElectionConfig>, SetupError> {
        if self.no_leader_election {
            return Ok(None);
        }
        let timing = Timing::new(
            self.leader_election_lease_duration,
            self.leader_election_renew_deadline,
            self.leader_election_retry_period,
        )?;
        Ok(Some(ElectionConfig {
            namespace: self.leader_election_namespace.clone(),
            lease_name: self
                .lease_name
                .clone()
                .unwrap_or_else(|| default_lease_name.to_owned()),
            identity: self.identity(),
            timing,
        }))
    }

    /// The API configuration of the Lease's client: `--leader-election-kubeconfig`, else a
    /// copy of `base` (the component's). It gets a connection pool of its own either way.
    pub async fn lease_api_config(&self, base: &kube::Config) -> Result<kube::Config, SetupError> {
        let Some(path) = &self.leader_election_kubeconfig else {
            return Ok(base.clone());
        };
        let error = |message: String| SetupError::Kubeconfig {
            path: path.display().to_string(),
            message,
        };
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|e| error(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| error(e.to_string()))?;
        config.headers.extend(
            base.headers
                .iter()
                .filter(|(name, _)| *name == http::header::USER_AGENT)
                .cloned(),
        );
        Ok(config)
    }
}

/// The host name and process id: unique among running replicas where there is no pod name.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// Names this component and replica in the `User-Agent` of every request made with
/// `config`, so that the API server's audit log tells replicas apart.
pub fn name_user_agent(config: &mut kube::Config, component: &str, identity: &str) {
    let agent = format!("{component}/{} ({identity})", env!("CARGO_PKG_VERSION"));
    // An identity that is not a valid header value (it came from a flag) is left out.
    let value = http::HeaderValue::from_str(&agent).or_else(|_| {
        http::HeaderValue::from_str(&format!("{component}/{}", env!("CARGO_PKG_VERSION")))
    });
    if let Ok(value) = value {
        config
            .headers
            .retain(|(name, _)| *name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
}

/// Parses `15s`, `500ms` or `2m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write 15s, 500ms or 2m"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "m" => number
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text:?} is too long")),
        _ => Err(format!("{text:?}: the unit must be ms, s or m")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        election: ElectionFlags,
    }

    #[test]
    fn durations_parse() {
        let cases = [
            ("15s", Ok(Duration::from_secs(15))),
            ("500ms", Ok(Duration::from_millis(500))),
            ("2m", Ok(Duration::from_secs(120))),
            ("15", Err("has no unit")),
            ("s", Err("whole number")),
            ("1.5s", Err("the unit must be")),
            ("5h", Err("the unit must be")),
        ];
        for (text, expected) in cases {
            match (parse_duration(text), expected) {
                (Ok(d), Ok(e)) => assert_eq!(d, e, "{text}"),
                (Err(message), Err(words)) => assert!(message.contains(words), "{text}: {message}"),
                (got, expected) => panic!("{text}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn flags_become_a_validated_config() {
        let flags = Flags::parse_from([
            "x",
            "--leader-election-identity",
            "pod-a",
            "--leader-election-lease-duration",
            "8s",
            "--leader-election-renew-deadline",
            "5s",
            "--leader-election-retry-period",
            "500ms",
        ]);
        let config = flags
            .election
            .config("unbounded-pxe-provider")
            .unwrap()
            .unwrap();
        assert_eq!(config.lease_name, "unbounded-pxe-provider");
        assert_eq!(config.namespace, "unbounded-system");
        assert_eq!(config.identity, "pod-a");
        assert_eq!(config.timing.renew_deadline(), Duration::from_secs(5));

        let off = Flags::parse_from(["x", "--no-leader-election"]);
        assert!(off.election.config("l").unwrap().is_none());

        let bad = Flags::parse_from(["x", "--leader-election-renew-deadline", "20s"]);
        let message = bad.election.config("l").unwrap_err().to_string();
        assert!(
            message.contains("must be shorter than the lease duration"),
            "{message}"
        );
    }

    #[test]
    fn the_user_agent_names_the_replica() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        name_user_agent(&mut config, "unbounded-controller", "pod-a");
        name_user_agent(&mut config, "unbounded-controller", "pod-b");
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| *n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            agents,
            [format!(
                "unbounded-controller/{} (pod-b)",
                env!("CARGO_PKG_VERSION")
            )]
        );
    }
}
