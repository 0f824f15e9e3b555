//! The agent's credentials, issued by the bootserver (Kubernetes backend only).
//!
//! 1. When a machine's iPXE fetches its script, the script's kernel command line gets a
//!    one-time **nonce** (`unbounded.nonce=…`), bound to that machine and to the address that
//!    fetched the script; a newer script replaces it. It is handed out only to a request from
//!    the machine's own address (its reservation or its DHCP lease; in proxy mode, where the
//!    leases are another server's, to the address that asked).
//! 2. The agent of that boot posts it to `POST /machines/<name>/credentials` from the same
//!    address and gets its ServiceAccount's token (TokenRequest, bounded lifetime), the API
//!    server's URL and CA, and — when it paves — a kubelet **bootstrap token** (a
//!    `bootstrap-token-*` Secret in kube-system with an expiry, owned by the Machine). The
//!    nonce is spent only when the token was minted.
//! 3. Later requests (refresh before expiry, a bootstrap token for a repave) authenticate with
//!    the current token (`Authorization: Bearer`), checked with a TokenReview: it must be this
//!    Machine's ServiceAccount, from the machine's address.
//!
//! The ServiceAccount and the role that scopes it to the Machine's own objects are the
//! controller's (`unbounded_api::agent`); until they exist the answer is 503 and the agent
//! retries, with the nonce still valid. Neither tokens nor nonces are ever logged: log lines
//! name the machine, the peer, the kind of request and the bootstrap token's public ID.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use ring::rand::{SecureRandom, SystemRandom};
use unbounded_api::agent::{self, CredentialRequest, Credentials, agent_username};

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
}

/// Why a credential request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The request does not come from the machine's address.
    #[error("a machine gets credentials only from its own address")]
    WrongAddress,
    /// Neither a nonce nor a token was presented.
    #[error("present this boot's nonce or a valid token")]
    Unauthenticated,
    /// The nonce was refused.
    #[error("nonce refused: {0}")]
    Nonce(NonceRefusal),
    /// The token is not this Machine's ServiceAccount's, or not valid.
    #[error("the presented token does not belong to this machine or is no longer valid")]
    BadToken,
    /// Too many requests for one machine.
    #[error("too many credential requests for this machine; retry in a minute")]
    RateLimited,
    /// The ServiceAccount does not exist yet (the controller creates it).
    #[error("the machine's ServiceAccount does not exist yet; retry shortly")]
    NotReady,
    /// Kubernetes refused or failed.
    #[error("the API server failed: {0}")]
    Kube(String),
}

impl IssueError {
    /// The HTTP status for this refusal.
    pub fn status(&self) -> u16 {
        match self {
            Self::WrongAddress | Self::Nonce(_) => 403,
            Self::Unauthenticated | Self::BadToken => 401,
            Self::RateLimited => 429,
            Self::NotReady | Self::Kube(_) => 503,
        }
    }

    /// A metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::WrongAddress => "wrong_address",
            Self::Unauthenticated => "unauthenticated",
            Self::Nonce(_) => "nonce_refused",
            Self::BadToken => "bad_token",
            Self::RateLimited => "rate_limited",
            Self::NotReady => "not_ready",
            Self::Kube(_) => "api_error",
        }
    }
}

/// Why a nonce was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NonceRefusal {
    /// No script with a nonce was served to this machine (or its nonce was spent).
    #[error("no unspent nonce was issued to this machine")]
    NoneIssued,
    /// It is not the nonce of the machine's latest script.
    #[error("it is not the nonce of this machine's latest boot script")]
    Mismatch,
    /// It expired.
    #[error("it expired")]
    Expired,
    /// It is being redeemed by another request right now.
    #[error("it is being redeemed by another request")]
    Busy,
}

#[derive(Debug, Clone)]
struct NonceEntry {
    value: String,
    ip: Ipv4Addr,
    expires_unix: u64,
    reserved: bool,
}

/// One-time nonces per machine, bound to the address their script was served to.
#[derive(Debug, Default)]
pub struct Nonces {
    entries: Mutex<HashMap<String, NonceEntry>>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Nonces {
    /// Records `value` as `machine`'s nonce for `ip` until `expires_unix`; the previous one
    /// is forgotten.
    pub fn insert(&self, machine: &str, value: String, ip: Ipv4Addr, expires_unix: u64) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                machine.to_owned(),
                NonceEntry {
                    value,
                    ip,
                    expires_unix,
                    reserved: false,
                },
            );
        }
    }

    /// The address the machine's current nonce is bound to.
    pub fn bound_ip(&self, machine: &str) -> Option<Ipv4Addr> {
        self.entries.lock().ok()?.get(machine).map(|e| e.ip)
    }

    /// Checks a presented nonce and reserves it (so that two requests cannot both use it).
    pub fn reserve(&self, machine: &str, presented: &str, now: u64) -> Result<(), NonceRefusal> {
        let mut entries = self.entries.lock().map_err(|_| NonceRefusal::Busy)?;
        let entry = entries.get_mut(machine).ok_or(NonceRefusal::NoneIssued)?;
        if !constant_time_eq(entry.value.as_bytes(), presented.as_bytes()) {
            return Err(NonceRefusal::Mismatch);
        }
        if entry.expires_unix <= now {
            entries.remove(machine);
            return Err(NonceRefusal::Expired);
        }
        if entry.reserved {
            return Err(NonceRefusal::Busy);
        }
        entry.reserved = true;
        Ok(())
    }

    /// Spends a reserved nonce.
    pub fn spend(&self, machine: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(machine);
        }
    }

    /// Releases a reservation (minting failed): the nonce may be presented again.
    pub fn release(&self, machine: &str) {
        if let Ok(mut entries) = self.entries.lock()
            && let Some(entry) = entries.get_mut(machine)
        {
            entry.reserved = false;
        }
    }
}

/// Whether a request from `peer` may get credentials for a machine: from the machine's
/// address when we know it (full DHCP: reservation or lease), else from the address its
/// boot script (or its last credentials) went to.
pub fn address_allowed(
    holds_address: bool,
    addresses_known: bool,
    bound: Option<Ipv4Addr>,
    peer: Ipv4Addr,
) -> bool {
    if addresses_known {
        holds_address
    } else {
        bound == Some(peer)
    }
}

/// Allows `limit` requests per machine per minute.
#[derive(Debug, Default)]
struct RateLimit {
    windows: Mutex<HashMap<String, (u64, u32)>>,
}

impl RateLimit {
    fn allow(&self, machine: &str, now: u64, limit: u32) -> bool {
        let Ok(mut windows) = self.windows.lock() else {
            return false;
        };
        let minute = now / 60;
        let entry = windows.entry(machine.to_owned()).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 += 1;
        entry.1 <= limit
    }
}

/// Credential requests per machine per minute.
const REQUESTS_PER_MINUTE: u32 = 20;

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Random lower-case hex.
pub fn random_hex(bytes: usize) -> Option<String> {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new().fill(&mut buf).ok()?;
    Some(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Issues credentials.
pub struct Issuer {
    settings: IssuerSettings,
    client: kube::Client,
    nonces: Nonces,
    rate: RateLimit,
    /// Where each machine's last credentials went (refreshes come from there in proxy mode).
    last_ip: Mutex<HashMap<String, Ipv4Addr>>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("api_server", &self.settings.api_server)
            .finish_non_exhaustive()
    }
}

/// What the HTTP layer knows about the request's origin.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    /// The peer's address.
    pub peer: Ipv4Addr,
    /// Whether it holds the machine's reservation or lease.
    pub holds_address: bool,
    /// Whether the bootserver knows machines' addresses (full DHCP).
    pub addresses_known: bool,
}

impl Issuer {
    /// An issuer over a cluster client.
    pub fn new(settings: IssuerSettings, client: kube::Client) -> Self {
        Self {
            settings,
            client,
            nonces: Nonces::default(),
            rate: RateLimit::default(),
            last_ip: Mutex::default(),
        }
    }

    /// A new nonce for `machine`'s boot script served to `origin`, or `None` when that
    /// origin must not get one.
    pub fn nonce_for_script(&self, machine: &str, origin: Origin) -> Option<String> {
        if origin.addresses_known && !origin.holds_address {
            return None;
        }
        let value = random_hex(16)?;
        self.nonces.insert(
            machine,
            value.clone(),
            origin.peer,
            now_unix() + self.settings.nonce_seconds,
        );
        Some(value)
    }

    /// Answers a credential request for `machine`.
    pub async fn credentials(
        &self,
        machine: &str,
        origin: Origin,
        bearer: Option<&str>,
        request: &CredentialRequest,
    ) -> Result<Credentials, IssueError> {
        let now = now_unix();
        if !self.rate.allow(machine, now, REQUESTS_PER_MINUTE) {
            return Err(IssueError::RateLimited);
        }
        let bound = match (&request.nonce, bearer) {
            (Some(_), _) => self.nonces.bound_ip(machine),
            (None, Some(_)) => self
                .last_ip
                .lock()
                .ok()
                .and_then(|m| m.get(machine).copied()),
            (None, None) => return Err(IssueError::Unauthenticated),
        };
        if !address_allowed(
            origin.holds_address,
            origin.addresses_known,
            bound,
            origin.peer,
        ) {
            return Err(IssueError::WrongAddress);
        }
        let kind = if let Some(nonce) = &request.nonce {
            self.nonces
                .reserve(machine, nonce, now)
                .map_err(IssueError::Nonce)?;
            "nonce"
        } else {
            let token = bearer.ok_or(IssueError::Unauthenticated)?;
            self.review(machine, token).await?;
            "refresh"
        };
        let minted = self.mint(machine, request.bootstrap_token).await;
        if request.nonce.is_some() {
            match &minted {
                Ok(_) => self.nonces.spend(machine),
                Err(_) => self.nonces.release(machine),
            }
        }
        let (credentials, bootstrap_id) = minted?;
        if let Ok(mut last) = self.last_ip.lock() {
            last.insert(machine.to_owned(), origin.peer);
        }
        tracing::info!(
            machine,
            peer = %origin.peer,
            kind,
            bootstrap_token_id = bootstrap_id.as_deref().unwrap_or("-"),
            "issued agent credentials"
        );
        Ok(credentials)
    }

    async fn review(&self, machine: &str, token: &str) -> Result<(), IssueError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| IssueError::Kube(e.to_string()))?;
        let status = reviewed.status.unwrap_or_default();
        let username = status.user.and_then(|u| u.username);
        if status.authenticated == Some(true)
            && username.as_deref() == Some(&agent_username(machine))
        {
            Ok(())
        } else {
            Err(IssueError::BadToken)
        }
    }

    async fn mint(
        &self,
        machine: &str,
        bootstrap: bool,
    ) -> Result<(Credentials, Option<String>), IssueError> {
        let (token, expiration) =
            agent::mint_service_account_token(&self.client, machine, self.settings.token_seconds)
                .await
                .map_err(mint_error)?;
        let lifetime = u64::try_from(self.settings.token_seconds).unwrap_or(3600);
        let (bootstrap_token, bootstrap_id) = if bootstrap {
            let owner = Api::<unbounded_api::Machine>::all(self.client.clone())
                .get(machine)
                .await
                .map_err(|e| IssueError::Kube(e.to_string()))?;
            let seconds = u64::try_from(self.settings.bootstrap_token_seconds).unwrap_or(3600);
            let (token, id) = agent::create_bootstrap_token(&self.client, &owner, seconds)
                .await
                .map_err(mint_error)?;
            (Some(token), Some(id))
        } else {
            (None, None)
        };
        Ok((
            Credentials {
                token,
                expiration_timestamp: expiration,
                lifetime_seconds: lifetime,
                server: self.settings.api_server.clone(),
                certificate_authority: self.settings.ca_pem.clone(),
                bootstrap_token,
            },
            bootstrap_id,
        ))
    }
}

fn mint_error(error: agent::MintError) -> IssueError {
    match error {
        agent::MintError::NotReady => IssueError::NotReady,
        other => IssueError::Kube(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_single_use_bound_and_expire() {
        let nonces = Nonces::default();
        let ip = Ipv4Addr::new(10, 99, 0, 21);
        nonces.insert("m", "aaaa".into(), ip, 100);
        assert_eq!(nonces.bound_ip("m"), Some(ip));
        assert_eq!(nonces.reserve("m", "bbbb", 50), Err(NonceRefusal::Mismatch));
        assert_eq!(
            nonces.reserve("other", "aaaa", 50),
            Err(NonceRefusal::NoneIssued)
        );
        assert_eq!(nonces.reserve("m", "aaaa", 50), Ok(()));
        assert_eq!(
            nonces.reserve("m", "aaaa", 50),
            Err(NonceRefusal::Busy),
            "reserved"
        );
        nonces.release("m");
        assert_eq!(
            nonces.reserve("m", "aaaa", 50),
            Ok(()),
            "released after a failed mint"
        );
        nonces.spend("m");
        assert_eq!(
            nonces.reserve("m", "aaaa", 50),
            Err(NonceRefusal::NoneIssued),
            "spent"
        );
        nonces.insert("m", "cccc".into(), ip, 100);
        assert_eq!(nonces.reserve("m", "cccc", 100), Err(NonceRefusal::Expired));
        nonces.insert("m", "dddd".into(), ip, 100);
        nonces.insert("m", "eeee".into(), ip, 100);
        assert_eq!(
            nonces.reserve("m", "dddd", 50),
            Err(NonceRefusal::Mismatch),
            "replaced"
        );
    }

    #[test]
    fn address_rules() {
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(10, 0, 0, 2);
        let cases = [
            ("full DHCP, holds", true, true, None, a, true),
            ("full DHCP, does not hold", false, true, Some(a), a, false),
            ("proxy, bound to the peer", false, false, Some(a), a, true),
            ("proxy, bound elsewhere", false, false, Some(b), a, false),
            ("proxy, nothing bound", false, false, None, a, false),
        ];
        for (case, holds, known, bound, peer, expected) in cases {
            assert_eq!(
                address_allowed(holds, known, bound, peer),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn rate_limit_per_machine_per_minute() {
        let limit = RateLimit::default();
        for _ in 0..3 {
            assert!(limit.allow("m", 60, 3));
        }
        assert!(!limit.allow("m", 61, 3));
        assert!(limit.allow("n", 61, 3), "another machine");
        assert!(limit.allow("m", 120, 3), "next minute");
    }

    #[test]
    fn nonces_are_random_hex() {
        assert_ne!(random_hex(16), random_hex(16));
        assert_eq!(random_hex(16).unwrap().len(), 32);
    }
}
