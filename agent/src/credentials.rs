//! The agent's credentials: a ServiceAccount token scoped to its own Machine, kept in the
//! agent's state directory readable by root only, and refreshed before it expires. kube's
//! client reads the token from its file (re-read every minute), so a refresh needs no new
//! client. Two sources:
//! - **the bootserver** (network-booted machines): the first token for the one-time nonce
//!   of this boot, later ones for the current token; the bootserver checks the address;
//! - **a credentials file** (machines that are not network-booted: an Azure VM's custom
//!   data, a `manual` machine): [`import`] takes it over and removes it; the agent then
//!   renews its token itself through the TokenRequest API (its Role allows exactly that, on
//!   its own ServiceAccount), and its kubelet joins with the bootstrap token from the file.
//!
//! What an answer of the bootserver means is decided by [`classify`], a pure function of
//! the status, `Retry-After` and the kind of proof sent: 429 and 5xx are **retry** (after
//! `Retry-After`: the nonce's mint is still under way, the API server is slow, the
//! ServiceAccount is not there yet), 401/403 to a nonce is **spent** (never sent again),
//! anything else is **fatal** for that request (said on the console, tried again once a
//! minute). A request waits [`REQUEST_TIMEOUT`] for its answer, longer than the
//! bootserver's own deadline for the API server (`credentials.mintTimeoutSeconds`, at most
//! 25 s), so a slow mint comes back as 503 rather than as a request the agent abandoned.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use unbounded_api::agent::{CredentialRequest, Credentials, MintError};

use crate::identity::Identity;

/// Errors while obtaining credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The bootserver could not be reached.
    #[error("asking the bootserver at {bootserver} for credentials: {message}")]
    Unreachable {
        /// The bootserver's base URL.
        bootserver: String,
        /// Why (no token or nonce is ever in it).
        message: String,
    },
    /// The bootserver asked to try again later (busy, not ready, slow, rate limited).
    #[error("the bootserver cannot issue credentials now ({status}): {message}")]
    RetryLater {
        /// HTTP status.
        status: u16,
        /// How long it asked to wait.
        after: Duration,
        /// What it said.
        message: String,
    },
    /// The bootserver refused this boot's nonce for good; it is marked spent.
    #[error("the bootserver refused this boot's nonce ({status}): {message}")]
    NonceRefused {
        /// HTTP status.
        status: u16,
        /// What it said.
        message: String,
    },
    /// The bootserver refused in a way that trying the same request again does not fix.
    #[error("the bootserver refused credentials ({status}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// What it said.
        message: String,
    },
    /// Nothing is left to authenticate with.
    #[error(
        "no way to authenticate: the nonce of this boot was used and no valid token is stored; reboot the machine (a network boot brings a new nonce)"
    )]
    Exhausted,
    /// A self-renewing machine's token expired before it was renewed (the machine was off
    /// for longer than the token's lifetime).
    #[error(
        "the token from the credentials file expired before it could be renewed: give the machine a new credentials file (for an Azure VM: delete and recreate its Machine)"
    )]
    Expired,
    /// No bootserver and no credentials file.
    #[error(
        "no source of credentials: no bootserver (unbounded.bootserver= or --bootserver) and no credentials file"
    )]
    NoSource,
    /// The API server refused to renew the token.
    #[error("renewing the token through the API server at {server}: {message}")]
    Renewal {
        /// The API server.
        server: String,
        /// Why (never a token).
        message: String,
        /// Whether trying again may help.
        retryable: bool,
    },
    /// The answer was not understood.
    #[error("the bootserver's answer was not understood: {0}")]
    Malformed(String),
    /// The credential files could not be written.
    #[error("storing credentials in {path}: {source}")]
    Store {
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// When to try again after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    /// After exactly this long (the bootserver said so).
    After(Duration),
    /// Soon, backing off (a network error, a full disk).
    Backoff,
    /// Only slowly: nothing changes without someone acting (a spent nonce, an expired
    /// token, a refusal).
    Slowly,
}

impl CredentialError {
    /// When trying again may help.
    pub fn retry_hint(&self) -> RetryHint {
        match self {
            Self::RetryLater { after, .. } => RetryHint::After(*after),
            Self::Unreachable { .. } | Self::Store { .. } => RetryHint::Backoff,
            Self::Renewal { retryable, .. } if *retryable => RetryHint::Backoff,
            Self::Renewal { .. }
            | Self::NonceRefused { .. }
            | Self::Refused { .. }
            | Self::Exhausted
            | Self::Expired
            | Self::NoSource
            | Self::Malformed(_) => RetryHint::Slowly,
        }
    }

    /// Whether trying again soon may help.
    pub fn is_retryable(&self) -> bool {
        self.retry_hint() != RetryHint::Slowly
    }
}

/// How long one credential request waits for its answer: longer than the bootserver's
/// deadline for the API server (at most 25 s), so that the bootserver answers first.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the agent waits when the bootserver says "retry" without a usable `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The longest `Retry-After` the agent honours (a larger value is taken as this).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What an answer of the bootserver means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Credentials were issued.
    Issued,
    /// Nothing was spent: ask again after this long.
    RetryAfter(Duration),
    /// The nonce was refused for good (spent, replaced by a newer boot's, expired, or not
    /// for this address): it must never be sent again.
    Spent,
    /// Refused in a way that the same request again does not fix (a token refused, a bad
    /// request, an unknown machine, a bootserver without credentials).
    Fatal,
}

/// Which kind of proof a request carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofKind {
    /// This boot's nonce.
    Nonce,
    /// A token.
    Token,
}

/// Decides what the bootserver's answer means: 200 issued; 429, 408 and 5xx retry (after
/// `Retry-After`, in seconds, within 1 s–5 min); 401/403 to a nonce spent; everything else
/// fatal. A 401/403 to a token leaves the token alone: it is still what the Kubernetes
/// client authenticates with, until it expires.
pub fn classify(status: u16, retry_after: Option<&str>, proof: ProofKind) -> Verdict {
    match status {
        200 => Verdict::Issued,
        408 | 429 | 500..=599 => Verdict::RetryAfter(
            retry_after
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(DEFAULT_RETRY_AFTER, |s| {
                    Duration::from_secs(s).clamp(Duration::from_secs(1), MAX_RETRY_AFTER)
                }),
        ),
        401 | 403 if proof == ProofKind::Nonce => Verdict::Spent,
        _ => Verdict::Fatal,
    }
}

/// What is stored beside the token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredMeta {
    /// The API server URL.
    pub server: String,
    /// Expiry, seconds since the epoch.
    pub expires_unix: u64,
    /// Lifetime when issued, in seconds.
    pub lifetime_seconds: u64,
    /// The nonce of this boot has been spent.
    pub nonce_used: bool,
    /// The token came from a credentials file and is renewed through the API server.
    #[serde(default)]
    pub self_refresh: bool,
}

/// The credential files in the agent's state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// When a token of `lifetime` that expires at `expires` should be refreshed: at 70 % of its
/// lifetime, and never later than 2 minutes before it expires.
pub fn refresh_at(expires_unix: u64, lifetime_seconds: u64) -> u64 {
    let early = lifetime_seconds.saturating_mul(3) / 10;
    expires_unix.saturating_sub(early.max(120))
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parses an RFC 3339 timestamp into seconds since the epoch.
pub fn parse_time(text: &str) -> Option<u64> {
    let ts: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

impl Store {
    /// The store in `dir` (created 0700 when missing).
    pub fn new(dir: &Path) -> Result<Self, CredentialError> {
        fs::create_dir_all(dir).map_err(|source| CredentialError::Store {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The token file (what the Kubernetes client reads).
    pub fn token_path(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// The CA file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn meta_path(&self) -> PathBuf {
        self.dir.join("credentials.json")
    }

    fn bootstrap_path(&self) -> PathBuf {
        self.dir.join("bootstrap-token")
    }

    /// The kubelet bootstrap token a credentials file brought, if any.
    pub fn bootstrap_token(&self) -> Option<String> {
        fs::read_to_string(self.bootstrap_path())
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    }

    /// What is stored, if anything.
    pub fn meta(&self) -> Option<StoredMeta> {
        let bytes = fs::read(self.meta_path()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The stored token, if any.
    pub fn token(&self) -> Option<String> {
        fs::read_to_string(self.token_path())
            .ok()
            .map(|t| t.trim().to_owned())
    }

    /// Whether a stored token is valid for at least another minute.
    pub fn valid_token(&self, now: u64) -> Option<(String, StoredMeta)> {
        let meta = self.meta()?;
        let token = self.token()?;
        (meta.expires_unix > now + 60 && !token.is_empty()).then_some((token, meta))
    }

    fn write_private(&self, path: &Path, content: &[u8]) -> Result<(), CredentialError> {
        let err = |source| CredentialError::Store {
            path: path.display().to_string(),
            source,
        };
        let temporary = path.with_extension("tmp");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(err)?;
        file.write_all(content).map_err(err)?;
        fs::rename(&temporary, path).map_err(err)
    }

    /// Stores credentials (token 0600, CA, metadata).
    pub fn save(
        &self,
        credentials: &Credentials,
        nonce_used: bool,
        self_refresh: bool,
    ) -> Result<StoredMeta, CredentialError> {
        let expires_unix = parse_time(&credentials.expiration_timestamp).ok_or_else(|| {
            CredentialError::Malformed(format!(
                "expirationTimestamp {:?}",
                credentials.expiration_timestamp
            ))
        })?;
        self.write_private(
            &self.ca_path(),
            credentials.certificate_authority.as_bytes(),
        )?;
        self.write_private(&self.token_path(), credentials.token.as_bytes())?;
        let meta = StoredMeta {
            server: credentials.server.clone(),
            expires_unix,
            lifetime_seconds: credentials.lifetime_seconds,
            nonce_used,
            self_refresh,
        };
        let bytes =
            serde_json::to_vec(&meta).map_err(|e| CredentialError::Malformed(e.to_string()))?;
        self.write_private(&self.meta_path(), &bytes)?;
        Ok(meta)
    }

    /// Records that the nonce was spent even though no credentials were stored (the
    /// bootserver refused them for good): never send it twice.
    pub fn mark_nonce_used(&self) -> Result<(), CredentialError> {
        let meta = self.meta().unwrap_or(StoredMeta {
            server: String::new(),
            expires_unix: 0,
            lifetime_seconds: 0,
            nonce_used: true,
            self_refresh: false,
        });
        let meta = StoredMeta {
            nonce_used: true,
            ..meta
        };
        let bytes =
            serde_json::to_vec(&meta).map_err(|e| CredentialError::Malformed(e.to_string()))?;
        self.write_private(&self.meta_path(), &bytes)
    }
}

/// How to authenticate a credential request.
#[derive(Clone, PartialEq, Eq)]
pub enum Proof {
    /// The nonce of this boot.
    Nonce(String),
    /// A valid token.
    Token(String),
}

impl std::fmt::Debug for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Nonce(_) => "Nonce(<redacted>)",
            Self::Token(_) => "Token(<redacted>)",
        })
    }
}

/// Chooses how to authenticate: a valid stored token, else this boot's unspent nonce.
pub fn choose_proof(
    stored: Option<(String, StoredMeta)>,
    nonce: Option<&str>,
    nonce_used: bool,
) -> Option<Proof> {
    if let Some((token, _)) = stored {
        return Some(Proof::Token(token));
    }
    match nonce {
        Some(n) if !nonce_used => Some(Proof::Nonce(n.to_owned())),
        _ => None,
    }
}

/// Takes over the credentials file at `path`, if there is one: stores its token, CA and
/// bootstrap token privately, marks the store as self-renewing and removes the file (it
/// holds a credential). Returns whether a file was imported.
pub fn import(store: &Store, path: &Path) -> Result<bool, CredentialError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(CredentialError::Store {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let credentials: Credentials = serde_json::from_slice(&bytes).map_err(|e| {
        // Only the position and the kind of error: serde's own message may quote a value,
        // and this file holds tokens.
        CredentialError::Malformed(format!(
            "credentials file {}: not the expected JSON ({:?} error at line {}, column {})",
            path.display(),
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    store.save(&credentials, true, true)?;
    if let Some(token) = &credentials.bootstrap_token {
        store.write_private(&store.bootstrap_path(), token.as_bytes())?;
    }
    fs::remove_file(path).map_err(|source| CredentialError::Store {
        path: path.display().to_string(),
        source,
    })?;
    Ok(true)
}

/// A Kubernetes client configuration that authenticates with the stored token (re-read
/// from its file, so a renewal needs no new client) and trusts the stored CA.
pub fn client_config(server: &str, store: &Store) -> Result<kube::Config, String> {
    let mut config = kube::Config::new(server.parse().map_err(|e| format!("{e}"))?);
    config.root_cert_file = Some(store.ca_path());
    config.auth_info.token_file = Some(store.token_path().display().to_string());
    config.read_timeout = Some(Duration::from_secs(330));
    Ok(config)
}

/// Renews a self-renewing machine's token through the TokenRequest API with the token it
/// still has, for the same lifetime, and stores it.
async fn renew_self(
    identity: &Identity,
    store: &Store,
    meta: StoredMeta,
    bootstrap_token: bool,
) -> Result<Credentials, CredentialError> {
    if store.valid_token(now_unix()).is_none() {
        return Err(CredentialError::Expired);
    }
    let renewal = |message: String, retryable: bool| CredentialError::Renewal {
        server: meta.server.clone(),
        message,
        retryable,
    };
    let config = client_config(&meta.server, store).map_err(|m| renewal(m, false))?;
    let client = kube::Client::try_from(config).map_err(|e| renewal(e.to_string(), true))?;
    let seconds = i64::try_from(meta.lifetime_seconds.max(600)).unwrap_or(3600);
    let (token, expiration_timestamp) =
        unbounded_api::agent::mint_service_account_token(&client, &identity.machine, seconds)
            .await
            .map_err(|e| match e {
                MintError::NotReady => renewal(e.to_string(), true),
                MintError::Kube(m) => renewal(m, true),
                MintError::Randomness => renewal(e.to_string(), false),
            })?;
    let certificate_authority =
        fs::read_to_string(store.ca_path()).map_err(|source| CredentialError::Store {
            path: store.ca_path().display().to_string(),
            source,
        })?;
    let credentials = Credentials {
        token,
        expiration_timestamp,
        lifetime_seconds: meta.lifetime_seconds,
        server: meta.server.clone(),
        certificate_authority,
        bootstrap_token: bootstrap_token.then(|| store.bootstrap_token()).flatten(),
    };
    store.save(&credentials, true, true)?;
    Ok(credentials)
}

/// Obtains fresh credentials and stores them: from the API server for a self-renewing
/// machine, else from the bootserver.
pub async fn obtain(
    http: &reqwest::Client,
    identity: &Identity,
    store: &Store,
    bootstrap_token: bool,
) -> Result<Credentials, CredentialError> {
    if let Some(meta) = store.meta().filter(|m| m.self_refresh) {
        return renew_self(identity, store, meta, bootstrap_token).await;
    }
    let bootserver = identity
        .bootserver
        .as_deref()
        .ok_or(CredentialError::NoSource)?;
    let now = now_unix();
    let nonce_used = store.meta().is_some_and(|m| m.nonce_used);
    let proof = choose_proof(
        store.valid_token(now),
        identity.nonce.as_deref(),
        nonce_used,
    )
    .ok_or(CredentialError::Exhausted)?;
    let url = format!("{bootserver}/machines/{}/credentials", identity.machine);
    let mut request = http.post(&url).timeout(REQUEST_TIMEOUT);
    let body = match &proof {
        Proof::Nonce(nonce) => CredentialRequest {
            nonce: Some(nonce.clone()),
            bootstrap_token,
        },
        Proof::Token(token) => {
            request = request.bearer_auth(token);
            CredentialRequest {
                nonce: None,
                bootstrap_token,
            }
        }
    };
    let response = request
        .json(&body)
        .send()
        .await
        .map_err(|e| CredentialError::Unreachable {
            bootserver: bootserver.to_owned(),
            message: e.without_url().to_string(),
        })?;
    let status = response.status().as_u16();
    let kind = match proof {
        Proof::Nonce(_) => ProofKind::Nonce,
        Proof::Token(_) => ProofKind::Token,
    };
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let verdict = classify(status, retry_after.as_deref(), kind);
    if verdict != Verdict::Issued {
        let message: String = response
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        let message = message.trim().to_owned();
        return Err(match verdict {
            Verdict::RetryAfter(after) => CredentialError::RetryLater {
                status,
                after,
                message,
            },
            Verdict::Spent => {
                store.mark_nonce_used()?;
                CredentialError::NonceRefused { status, message }
            }
            Verdict::Fatal | Verdict::Issued => CredentialError::Refused { status, message },
        });
    }
    let credentials: Credentials = response
        .json()
        .await
        .map_err(|e| CredentialError::Malformed(e.without_url().to_string()))?;
    store.save(
        &credentials,
        nonce_used || matches!(proof, Proof::Nonce(_)),
        false,
    )?;
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_retry_spent_or_fatal() {
        use ProofKind::{Nonce, Token};
        let s = Duration::from_secs;
        let cases = [
            (200, None, Nonce, Verdict::Issued),
            (200, None, Token, Verdict::Issued),
            // Busy (a mint under way), not ready, slow API server: retry, nonce kept.
            (503, Some("2"), Nonce, Verdict::RetryAfter(s(2))),
            (503, Some(" 7 "), Token, Verdict::RetryAfter(s(7))),
            (429, Some("40"), Nonce, Verdict::RetryAfter(s(40))),
            (503, None, Nonce, Verdict::RetryAfter(DEFAULT_RETRY_AFTER)),
            (
                503,
                Some("Wed, 21 Oct 2015 07:28:00 GMT"),
                Nonce,
                Verdict::RetryAfter(DEFAULT_RETRY_AFTER),
            ),
            (503, Some("0"), Nonce, Verdict::RetryAfter(s(1))),
            (
                503,
                Some("86400"),
                Nonce,
                Verdict::RetryAfter(MAX_RETRY_AFTER),
            ),
            (
                503,
                Some("-3"),
                Nonce,
                Verdict::RetryAfter(DEFAULT_RETRY_AFTER),
            ),
            (500, None, Nonce, Verdict::RetryAfter(DEFAULT_RETRY_AFTER)),
            (502, None, Nonce, Verdict::RetryAfter(DEFAULT_RETRY_AFTER)),
            (504, Some("3"), Token, Verdict::RetryAfter(s(3))),
            (408, None, Nonce, Verdict::RetryAfter(DEFAULT_RETRY_AFTER)),
            // A nonce refused for good.
            (403, None, Nonce, Verdict::Spent),
            (401, None, Nonce, Verdict::Spent),
            (403, Some("5"), Nonce, Verdict::Spent),
            // A refused token is not thrown away: the API client still uses it.
            (401, None, Token, Verdict::Fatal),
            (403, None, Token, Verdict::Fatal),
            // Configuration or client errors: nothing spent, no quick retry.
            (400, None, Nonce, Verdict::Fatal),
            (404, None, Nonce, Verdict::Fatal),
            (405, None, Token, Verdict::Fatal),
            (201, None, Nonce, Verdict::Fatal),
            (302, None, Nonce, Verdict::Fatal),
        ];
        for (status, retry_after, proof, expected) in cases {
            assert_eq!(
                classify(status, retry_after, proof),
                expected,
                "{status} {retry_after:?} {proof:?}"
            );
        }
    }

    #[test]
    fn only_a_refused_nonce_is_spent_and_busy_is_retried_as_told() {
        let busy = CredentialError::RetryLater {
            status: 503,
            after: Duration::from_secs(2),
            message: "busy".into(),
        };
        assert_eq!(busy.retry_hint(), RetryHint::After(Duration::from_secs(2)));
        assert!(busy.is_retryable());
        let spent = CredentialError::NonceRefused {
            status: 403,
            message: "spent".into(),
        };
        assert_eq!(spent.retry_hint(), RetryHint::Slowly);
        assert_eq!(CredentialError::Exhausted.retry_hint(), RetryHint::Slowly);
    }

    #[test]
    fn refresh_happens_at_seventy_percent_or_two_minutes_before() {
        assert_eq!(refresh_at(10_000, 3600), 10_000 - 1080);
        assert_eq!(refresh_at(10_000, 300), 10_000 - 120);
        assert_eq!(refresh_at(100, 3600), 0);
    }

    #[test]
    fn proof_prefers_a_valid_token_then_an_unspent_nonce() {
        let meta = StoredMeta {
            server: "s".into(),
            expires_unix: 0,
            lifetime_seconds: 0,
            nonce_used: true,
            self_refresh: false,
        };
        assert!(matches!(
            choose_proof(Some(("t".into(), meta)), Some("n"), true),
            Some(Proof::Token(t)) if t == "t"
        ));
        assert!(matches!(
            choose_proof(None, Some("n"), false),
            Some(Proof::Nonce(n)) if n == "n"
        ));
        assert!(choose_proof(None, Some("n"), true).is_none());
        assert!(choose_proof(None, None, false).is_none());
    }

    #[test]
    fn store_round_trip_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path()).unwrap();
        let credentials = Credentials {
            token: "tok".into(),
            expiration_timestamp: "2099-01-01T00:00:00Z".into(),
            lifetime_seconds: 3600,
            server: "https://10.99.0.1:6443".into(),
            certificate_authority: "-----BEGIN CERTIFICATE-----\n".into(),
            bootstrap_token: None,
        };
        store.save(&credentials, true, false).unwrap();
        let (token, meta) = store.valid_token(now_unix()).unwrap();
        assert_eq!(token, "tok");
        assert!(meta.nonce_used);
        let mode = fs::metadata(store.token_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(store.valid_token(meta.expires_unix).is_none(), "expired");
    }

    #[test]
    fn a_credentials_file_is_taken_over_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("state")).unwrap();
        let file = dir.path().join("credentials.json");
        assert!(!import(&store, &file).unwrap(), "no file, nothing imported");
        let credentials = Credentials {
            token: "tok".into(),
            expiration_timestamp: "2099-01-01T00:00:00Z".into(),
            lifetime_seconds: 86_400,
            server: "https://api.example:6443".into(),
            certificate_authority: "-----BEGIN CERTIFICATE-----\n".into(),
            bootstrap_token: Some("abcdef.0123456789abcdef".into()),
        };
        fs::write(&file, serde_json::to_vec(&credentials).unwrap()).unwrap();
        assert!(import(&store, &file).unwrap());
        assert!(!file.exists(), "the file with the credential is removed");
        let meta = store.meta().unwrap();
        assert!(meta.self_refresh && meta.nonce_used);
        assert_eq!(meta.lifetime_seconds, 86_400);
        assert_eq!(store.token().as_deref(), Some("tok"));
        assert_eq!(
            store.bootstrap_token().as_deref(),
            Some("abcdef.0123456789abcdef")
        );
        let mode = fs::metadata(store.bootstrap_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        fs::write(
            &file,
            b"{\"token\": \"tok\", \"lifetimeSeconds\": \"s3cret-value\"}",
        )
        .unwrap();
        let error = import(&store, &file).unwrap_err().to_string();
        assert!(error.contains("credentials file"), "{error}");
        assert!(
            !error.contains("s3cret-value"),
            "no value in the error: {error}"
        );
        assert!(
            file.exists(),
            "a file that was not understood is left for the operator"
        );
    }
}
