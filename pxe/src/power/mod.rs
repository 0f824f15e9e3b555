//! Power through a machine's BMC: one [`PowerDriver`] trait, a Redfish and an IPMI
//! implementation, and [`Bmc`], which picks one from the Machine's `spec.pxe.bmc.address`.
//!
//! | scheme | driver |
//! |---|---|
//! | `redfish://host[:port]/path`, `redfish+https://…` | Redfish over HTTPS |
//! | `redfish+http://…` | Redfish over plain HTTP (emulators, lab networks) |
//! | `ipmi://host[:port]` | IPMI v2.0 over LAN (RMCP+), port 623 by default |
//!
//! A Redfish path names the ComputerSystem (`/redfish/v1/Systems/<id>`); with only
//! `/redfish/v1` or no path, the BMC's single system is found from the Systems collection.
//!
//! Credentials ([`Credentials`]) come from the Machine's Secret. The password is kept in a
//! type whose `Debug` prints `<redacted>`, is sent only in the protocol's authentication,
//! and no error of this module carries it: errors name the BMC by its address, which holds
//! no user information (an address with `user:password@` is refused by [`BmcAddress::parse`]).
//! Every call has a timeout; [`with_retries`] retries transient failures with exponential
//! backoff and jitter. A driver [`Bmc::fenced_by`] a leader's term sends nothing once the
//! term is over ([`PowerError::NotLeading`], never retried), and waits for each answer only
//! as long as the term allows, so a BMC never acts on a command from a former leader after
//! the next one could have started.

pub mod ipmi;
pub mod ipmi_fru;
pub mod redfish;
pub mod redfish_inventory;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use unbounded_runtime::leader::{Term, TermEnded};

/// Errors of a power call. None of them carries a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PowerError {
    /// The BMC address is not one we can use.
    #[error("BMC address {address:?}: {message}")]
    Address {
        /// The address as written.
        address: String,
        /// What is wrong.
        message: String,
    },
    /// No connection (refused, no route, DNS, TLS handshake).
    #[error("BMC {bmc} is unreachable: {message}")]
    Unreachable {
        /// The BMC.
        bmc: String,
        /// What happened.
        message: String,
    },
    /// No answer in time.
    #[error("BMC {bmc} did not answer within {seconds} s")]
    Timeout {
        /// The BMC.
        bmc: String,
        /// The timeout.
        seconds: u64,
    },
    /// The BMC refused the credentials.
    #[error("BMC {bmc} refused the credentials (wrong user name or password?)")]
    Unauthorized {
        /// The BMC.
        bmc: String,
    },
    /// The BMC is busy (during POST, a task in progress): try again later.
    #[error("BMC {bmc} is busy: {message}")]
    Busy {
        /// The BMC.
        bmc: String,
        /// What it said.
        message: String,
    },
    /// The BMC answered with an error.
    #[error("BMC {bmc} failed: {message}")]
    Failed {
        /// The BMC.
        bmc: String,
        /// What it said.
        message: String,
    },
    /// Nothing was sent: the replica's leadership term is over (or ends too soon for an
    /// answer). The next leader acts.
    #[error("nothing sent to BMC {bmc}: {why}")]
    NotLeading {
        /// The BMC.
        bmc: String,
        /// Why the term refused.
        why: TermEnded,
    },
}

impl PowerError {
    /// The refusal of a command that `term` does not allow.
    pub fn not_leading(bmc: &str, why: TermEnded) -> Self {
        Self::NotLeading {
            bmc: bmc.to_owned(),
            why,
        }
    }

    /// Whether trying again may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::Busy { .. }
        )
    }

    /// Whether retrying can never help: the address (or CA bundle) in the Machine's spec
    /// cannot be used, whatever the BMC does. Everything else a BMC does may change: a
    /// refused password (the Secret may be fixed), an error answer, a timeout.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Address { .. })
    }

    /// A short reason for a condition (`BmcUnreachable`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Address { .. } => "BmcAddressInvalid",
            Self::Unreachable { .. } | Self::Timeout { .. } => "BmcUnreachable",
            Self::Unauthorized { .. } => "BmcAuthenticationFailed",
            Self::Busy { .. } => "BmcBusy",
            Self::Failed { .. } => "BmcError",
            Self::NotLeading { .. } => "NotLeading",
        }
    }
}

/// IPMI over LAN's port (RMCP+).
pub const IPMI_PORT: u16 = 623;

/// A power state as a BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// On (also powering off).
    On,
    /// Off (also powering on).
    Off,
}

/// The user name and password of a BMC.
#[derive(Clone)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    password: String,
}

impl Credentials {
    /// Credentials from a user name and a password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The password, for the protocol's authentication only.
    pub(crate) fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How to reach a BMC, parsed from `spec.pxe.bmc.address`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BmcAddress {
    /// A Redfish service.
    Redfish {
        /// `https` or `http`.
        https: bool,
        /// `host[:port]`.
        authority: String,
        /// The ComputerSystem's path, or `None` to find the single one.
        system: Option<String>,
    },
    /// IPMI over LAN.
    Ipmi {
        /// The host.
        host: String,
        /// The UDP port (623).
        port: u16,
    },
}

/// Why a BMC address cannot be used (each reason is a variant, so that the kubectl plugin can
/// say it in its own words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// No `scheme://`.
    #[error("expected <scheme>://<host>…")]
    NoScheme,
    /// `user:password@` in the address.
    #[error("credentials belong in the Secret, not in the address")]
    UserInformation,
    /// No host, or a host with a bad port (`host:notaport`, `[v6]junk`).
    #[error("no host, or a bad port")]
    BadAuthority,
    /// An IPMI address with a path.
    #[error("an IPMI address has no path")]
    IpmiPath,
    /// A Redfish path other than a ComputerSystem's.
    #[error("a Redfish path is /redfish/v1/Systems/<id> (or empty)")]
    RedfishPath,
    /// Not one of the schemes.
    #[error("scheme must be redfish, redfish+https, redfish+http or ipmi")]
    Scheme,
}

/// `host[:port]` split into the host (brackets of an IPv6 literal removed) and the port as
/// written; `None` without a host, with a port that is not a number, or with junk after `]`.
pub fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return None,
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    Some((host, port))
}

impl BmcAddress {
    /// Parses an address; the error says what is wrong (and carries nothing of it).
    pub fn parse_address(address: &str) -> Result<Self, AddressError> {
        let (scheme, rest) = address.split_once("://").ok_or(AddressError::NoScheme)?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.contains('@') {
            return Err(AddressError::UserInformation);
        }
        let (host, port) = split_authority(authority).ok_or(AddressError::BadAuthority)?;
        match scheme {
            "redfish" | "redfish+https" | "redfish+http" => {
                let system = match path.trim_end_matches('/') {
                    "" | "/redfish/v1" | "/redfish/v1/Systems" => None,
                    p if p.starts_with("/redfish/v1/Systems/") => Some(p.to_owned()),
                    _ => return Err(AddressError::RedfishPath),
                };
                Ok(Self::Redfish {
                    https: scheme != "redfish+http",
                    authority: authority.to_owned(),
                    system,
                })
            }
            "ipmi" => {
                if !path.is_empty() && path != "/" {
                    return Err(AddressError::IpmiPath);
                }
                Ok(Self::Ipmi {
                    host: host.to_owned(),
                    port: port.unwrap_or(IPMI_PORT),
                })
            }
            _ => Err(AddressError::Scheme),
        }
    }

    /// Parses an address into the error the provider reports (the address without user
    /// information, and what is wrong).
    pub fn parse(address: &str) -> Result<Self, PowerError> {
        Self::parse_address(address).map_err(|why| PowerError::Address {
            // Never echo user information back.
            address: address
                .split_once('@')
                .map_or(address, |(_, h)| h)
                .to_owned(),
            message: why.to_string(),
        })
    }

    /// The host (without port or IPv6 brackets).
    pub fn host(&self) -> &str {
        match self {
            Self::Ipmi { host, .. } => host,
            Self::Redfish { authority, .. } => {
                split_authority(authority).map_or(authority.as_str(), |(host, _)| host)
            }
        }
    }

    /// The BMC as errors and logs name it: scheme, host and port, nothing else.
    pub fn display_name(&self) -> String {
        match self {
            Self::Redfish {
                https, authority, ..
            } => format!(
                "{}://{authority}",
                if *https {
                    "redfish+https"
                } else {
                    "redfish+http"
                }
            ),
            Self::Ipmi { host, port } => format!("ipmi://{host}:{port}"),
        }
    }
}

/// TLS settings of a Redfish BMC.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// Accept any certificate (only when the Machine asks for it).
    pub insecure_skip_verify: bool,
    /// PEM CA bundle that signed the BMC's certificate.
    pub ca_bundle: Option<String>,
}

/// The power operations of a BMC. Every call is bounded by the driver's timeout.
pub trait PowerDriver: Send + Sync {
    /// The current power state.
    fn power_state(&self) -> impl Future<Output = Result<Power, PowerError>> + Send;
    /// Powers on (nothing if already on).
    fn power_on(&self) -> impl Future<Output = Result<(), PowerError>> + Send;
    /// Asks the OS to shut down; forces power off if it is still on after `grace`.
    fn power_off(&self, grace: Duration) -> impl Future<Output = Result<(), PowerError>> + Send;
    /// Power-cycles (forced off, then on) a machine that is on; powers on one that is off.
    fn power_cycle(&self) -> impl Future<Output = Result<(), PowerError>> + Send;
    /// Network-boots (PXE) on the next boot only; `uefi` selects the UEFI boot path.
    fn set_one_time_pxe_boot(
        &self,
        uefi: bool,
    ) -> impl Future<Output = Result<(), PowerError>> + Send;
}

/// A BMC of either kind.
#[derive(Debug, Clone)]
pub enum Bmc {
    /// Redfish.
    Redfish(redfish::RedfishBmc),
    /// IPMI.
    Ipmi(ipmi::IpmiBmc),
}

impl Bmc {
    /// A driver for `address` with these credentials; no I/O yet.
    pub fn new(
        address: &BmcAddress,
        credentials: Credentials,
        tls: &Tls,
        timeout: Duration,
    ) -> Result<Self, PowerError> {
        Ok(match address {
            BmcAddress::Redfish { .. } => Self::Redfish(redfish::RedfishBmc::new(
                address,
                credentials,
                tls,
                timeout,
            )?),
            BmcAddress::Ipmi { host, port } => {
                Self::Ipmi(ipmi::IpmiBmc::new(host, *port, credentials, timeout))
            }
        })
    }

    /// The same driver, sending commands only within `term` (a leader's; see
    /// [`unbounded_runtime::leader::Term`]). Without it a driver is not limited.
    pub fn fenced_by(self, term: Term) -> Self {
        match self {
            Self::Redfish(b) => Self::Redfish(b.fenced_by(term)),
            Self::Ipmi(b) => Self::Ipmi(b.fenced_by(term)),
        }
    }
}

impl PowerDriver for Bmc {
    async fn power_state(&self) -> Result<Power, PowerError> {
        match self {
            Self::Redfish(b) => b.power_state().await,
            Self::Ipmi(b) => b.power_state().await,
        }
    }
    async fn power_on(&self) -> Result<(), PowerError> {
        match self {
            Self::Redfish(b) => b.power_on().await,
            Self::Ipmi(b) => b.power_on().await,
        }
    }
    async fn power_off(&self, grace: Duration) -> Result<(), PowerError> {
        match self {
            Self::Redfish(b) => b.power_off(grace).await,
            Self::Ipmi(b) => b.power_off(grace).await,
        }
    }
    async fn power_cycle(&self) -> Result<(), PowerError> {
        match self {
            Self::Redfish(b) => b.power_cycle().await,
            Self::Ipmi(b) => b.power_cycle().await,
        }
    }
    async fn set_one_time_pxe_boot(&self, uefi: bool) -> Result<(), PowerError> {
        match self {
            Self::Redfish(b) => b.set_one_time_pxe_boot(uefi).await,
            Self::Ipmi(b) => b.set_one_time_pxe_boot(uefi).await,
        }
    }
}

/// Polls until the BMC reports power off (a forced off takes effect within seconds).
async fn wait_until_off(driver: &impl PowerDriver, bmc: &str) -> Result<(), PowerError> {
    for _ in 0..30 {
        if driver.power_state().await? == Power::Off {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(PowerError::Busy {
        bmc: bmc.to_owned(),
        message: "still on 30 s after a forced power off".into(),
    })
}

/// How [`with_retries`] backs off.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first wait.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Attempts in all (the first included).
    pub attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            max: Duration::from_secs(10),
            attempts: 4,
        }
    }
}

impl Backoff {
    /// The wait before attempt `n + 1` (n ≥ 1): doubling from `first`, capped at `max`,
    /// with up to 50 % of random jitter taken off so that many machines do not retry in step.
    pub fn wait(&self, n: u32, random: f64) -> Duration {
        let base = self
            .first
            .saturating_mul(1u32 << n.saturating_sub(1).min(16))
            .min(self.max);
        base.mul_f64(1.0 - 0.5 * random.clamp(0.0, 1.0))
    }
}

/// A number in [0, 1) that differs from call to call (jitter needs no cryptography).
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

/// Runs `call` until it succeeds, fails for good, or `backoff.attempts` are spent.
pub async fn with_retries<T, F, Fut>(backoff: Backoff, mut call: F) -> Result<T, PowerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PowerError>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(error) if error.is_transient() && attempt < backoff.attempts => {
                tracing::debug!(%error, attempt, "BMC call failed; retrying");
                tokio::time::sleep(backoff.wait(attempt, jitter())).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_table() {
        let redfish = |https, authority: &str, system: Option<&str>| BmcAddress::Redfish {
            https,
            authority: authority.into(),
            system: system.map(Into::into),
        };
        let cases = [
            (
                "redfish+https://10.0.0.5/redfish/v1/Systems/1",
                redfish(true, "10.0.0.5", Some("/redfish/v1/Systems/1")),
            ),
            (
                "redfish://bmc.example:8443",
                redfish(true, "bmc.example:8443", None),
            ),
            (
                "redfish+http://127.0.0.1:8000/redfish/v1/",
                redfish(false, "127.0.0.1:8000", None),
            ),
            (
                "ipmi://10.0.0.6",
                BmcAddress::Ipmi {
                    host: "10.0.0.6".into(),
                    port: 623,
                },
            ),
            (
                "ipmi://127.0.0.1:6230",
                BmcAddress::Ipmi {
                    host: "127.0.0.1".into(),
                    port: 6230,
                },
            ),
            // An IPv6 literal without a port (read as a bad port before the kubectl
            // plugin's parser and this one became one).
            (
                "ipmi://[fd00::6]",
                BmcAddress::Ipmi {
                    host: "fd00::6".into(),
                    port: 623,
                },
            ),
            (
                "ipmi://[fd00::6]:700",
                BmcAddress::Ipmi {
                    host: "fd00::6".into(),
                    port: 700,
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(BmcAddress::parse(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn bad_addresses_are_refused_without_echoing_credentials() {
        assert_eq!(
            BmcAddress::parse_address("ipmi://10.0.0.6/path"),
            Err(AddressError::IpmiPath)
        );
        assert_eq!(
            BmcAddress::parse_address("redfish://[fd00::5]x/redfish/v1"),
            Err(AddressError::BadAuthority)
        );
        for text in [
            "10.0.0.5",
            "http://10.0.0.5/redfish/v1",
            "redfish+https:///redfish/v1",
            "redfish://10.0.0.5/somewhere/else",
            "ipmi://10.0.0.6:notaport",
            "ipmi://10.0.0.6/path",
            "redfish://admin:hunter2@10.0.0.5/redfish/v1",
        ] {
            let error = BmcAddress::parse(text).unwrap_err();
            assert!(!error.to_string().contains("hunter2"), "{error}");
            assert_eq!(error.reason(), "BmcAddressInvalid");
        }
    }

    #[test]
    fn credentials_do_not_debug_print_the_password() {
        let c = Credentials::new("admin", "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.password(), "hunter2");
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_below_the_base() {
        let b = Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(5),
            attempts: 10,
        };
        assert_eq!(b.wait(1, 0.0), Duration::from_secs(1));
        assert_eq!(b.wait(2, 0.0), Duration::from_secs(2));
        assert_eq!(b.wait(3, 0.0), Duration::from_secs(4));
        assert_eq!(b.wait(4, 0.0), Duration::from_secs(5));
        assert_eq!(b.wait(40, 0.0), Duration::from_secs(5));
        assert_eq!(b.wait(2, 1.0), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_a_permanent_error_or_the_attempt_limit() {
        let bmc = || "ipmi://x:623".to_owned();
        let mut calls = 0;
        let result: Result<(), _> = with_retries(Backoff::default(), || {
            calls += 1;
            async {
                Err(PowerError::Timeout {
                    bmc: bmc(),
                    seconds: 1,
                })
            }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, Backoff::default().attempts);

        let mut calls = 0;
        let result: Result<(), _> = with_retries(Backoff::default(), || {
            calls += 1;
            async { Err(PowerError::Unauthorized { bmc: bmc() }) }
        })
        .await;
        assert_eq!(result, Err(PowerError::Unauthorized { bmc: bmc() }));
        assert_eq!(calls, 1, "a wrong password is not retried");
    }
}
