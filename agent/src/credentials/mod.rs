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

pub mod pinned;
mod store;

use std::fs;
use std::time::Duration;

use unbounded_api::agent::{CredentialRequest, Credentials};
use unbounded_api::identity::{
    AttestationChallenge, AttestationProof, AttestationRequest, hex, unhex,
};
use unbounded_runtime::tokens::MintError;

pub use self::store::{Store, StoredMeta, import, now_unix, parse_time, refresh_at};
use crate::identity::Identity;

/// Errors while obtaining credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The bootserver could not be reached.
    #[error("asking the bootserver at {bootserver} for credentials: {}", unbounded_runtime::error_text::with_causes(&**.source))]
    Unreachable {
        /// The bootserver's base URL.
        bootserver: String,
        /// Why: the HTTP client's error (its URL left out: no token or nonce is ever in it),
        /// or the pinned TLS client that could not be built.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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
    #[error("renewing the token through the API server at {server}: {source}")]
    Renewal {
        /// The API server.
        server: String,
        /// Why: the server URL, the client or the TokenRequest (never a token).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whether trying again may help.
        retryable: bool,
    },
    /// The answer was not understood. A description, not the parser's error: serde's
    /// messages may quote a value, and these answers and files hold tokens.
    #[error("the bootserver's answer was not understood: {0}")]
    Malformed(String),
    /// The answer's body could not be read as the JSON expected.
    #[error("the bootserver's answer was not understood: {0}")]
    Undecodable(#[source] reqwest::Error),
    /// The stored metadata could not be encoded (it holds no secret).
    #[error("the bootserver's answer was not understood: {0}")]
    MetaEncoding(#[source] serde_json::Error),
    /// The machine's TPM could not attest it (no TPM, a failed TPM command).
    #[error("attesting this machine with its TPM: {0}")]
    Tpm(#[from] crate::tpm::TpmError),
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
            | Self::Tpm(_)
            | Self::Malformed(_)
            | Self::Undecodable(_)
            | Self::MetaEncoding(_) => RetryHint::Slowly,
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

/// How to authenticate a credential request.
#[derive(Clone, PartialEq, Eq)]
pub enum Proof {
    /// The nonce of this boot.
    Nonce(String),
    /// This boot's ticket, held by the bootserver (TLS only).
    Ticket,
    /// A valid token.
    Token(String),
}

impl std::fmt::Debug for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Nonce(_) => "Nonce(<redacted>)",
            Self::Ticket => "Ticket",
            Self::Token(_) => "Token(<redacted>)",
        })
    }
}

/// Chooses how to authenticate: a valid stored token, else this boot's unspent nonce.
pub fn choose_proof(
    stored: Option<(String, StoredMeta)>,
    nonce: Option<&str>,
    ticket: bool,
    nonce_used: bool,
) -> Option<Proof> {
    if let Some((token, _)) = stored {
        return Some(Proof::Token(token));
    }
    match nonce {
        _ if nonce_used => None,
        Some(n) => Some(Proof::Nonce(n.to_owned())),
        None => ticket.then_some(Proof::Ticket),
    }
}

/// A Kubernetes client configuration that authenticates with the stored token (re-read
/// from its file, so a renewal needs no new client) and trusts the stored CA.
/// The error is the URL's parse error (boxed: its type is the `http` crate's).
pub fn client_config(
    server: &str,
    store: &Store,
) -> Result<kube::Config, Box<dyn std::error::Error + Send + Sync>> {
    let mut config = kube::Config::new(server.parse()?);
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
    let renewal = |source: Box<dyn std::error::Error + Send + Sync>, retryable: bool| {
        CredentialError::Renewal {
            server: meta.server.clone(),
            source,
            retryable,
        }
    };
    let config = client_config(&meta.server, store).map_err(|e| renewal(e, false))?;
    let client = kube::Client::try_from(config).map_err(|e| renewal(e.into(), true))?;
    let seconds = i64::try_from(meta.lifetime_seconds.max(600)).unwrap_or(3600);
    let (token, expiration_timestamp) =
        unbounded_runtime::tokens::mint_service_account_token(&client, &identity.machine, seconds)
            .await
            .map_err(|e| {
                let retryable = match e {
                    MintError::NotReady | MintError::Kube(_) | MintError::NoStatus => true,
                    MintError::Randomness => false,
                };
                renewal(e.into(), retryable)
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
        tls_sha256: Vec::new(),
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
    // Where the bootserver speaks TLS, credentials are asked for there only, from the
    // certificate this boot pinned: nothing secret crosses the network in clear.
    let pinned;
    let (bootserver, http) = match &identity.secure {
        Some(secure) => {
            pinned = pinned::client(pins(secure.sha256, store)).map_err(|e| {
                CredentialError::Unreachable {
                    bootserver: secure.url.clone(),
                    source: e.into(),
                }
            })?;
            (secure.url.as_str(), &pinned)
        }
        None => (
            identity
                .bootserver
                .as_deref()
                .ok_or(CredentialError::NoSource)?,
            http,
        ),
    };
    // Asked from a link-local address, the bootserver refuses (no Machine's address) and
    // the agent would wait a minute: wait for the leased address as for the network.
    if let Some(why) = crate::node_address::not_yet_addressed(bootserver) {
        return Err(CredentialError::Unreachable {
            bootserver: bootserver.to_owned(),
            source: why.into(),
        });
    }
    let now = now_unix();
    let nonce_used = store.meta().is_some_and(|m| m.nonce_used);
    let proof = choose_proof(
        store.valid_token(now),
        identity.nonce.as_deref(),
        identity.ticket,
        nonce_used,
    )
    .ok_or(CredentialError::Exhausted)?;
    // A TPM-mode boot proves its TPM with its first request; a refresh's token was issued
    // to that TPM's holder already.
    let attestation = match (&identity.attest, &proof) {
        (Some(attestor), Proof::Nonce(_) | Proof::Ticket) => {
            Some(attest(http, bootserver, identity, attestor, store).await?)
        }
        _ => None,
    };
    let url = format!("{bootserver}/machines/{}/credentials", identity.machine);
    let mut request = http.post(&url).timeout(REQUEST_TIMEOUT);
    let body = match &proof {
        Proof::Nonce(nonce) => CredentialRequest {
            nonce: Some(nonce.clone()),
            bootstrap_token,
            ticket: false,
            attestation,
        },
        Proof::Ticket => CredentialRequest {
            nonce: None,
            bootstrap_token,
            ticket: true,
            attestation,
        },
        Proof::Token(token) => {
            request = request.bearer_auth(token);
            CredentialRequest {
                nonce: None,
                bootstrap_token,
                ticket: false,
                attestation: None,
            }
        }
    };
    let response = request
        .json(&body)
        .send()
        .await
        .map_err(|e| CredentialError::Unreachable {
            bootserver: bootserver.to_owned(),
            source: e.without_url().into(),
        })?;
    let status = response.status().as_u16();
    let kind = match proof {
        Proof::Nonce(_) | Proof::Ticket => ProofKind::Nonce,
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
        .map_err(|e| CredentialError::Undecodable(e.without_url()))?;
    store.save(
        &credentials,
        nonce_used || matches!(proof, Proof::Nonce(_) | Proof::Ticket),
        false,
    )?;
    Ok(credentials)
}

/// The certificates the agent accepts at the bootserver's TLS endpoint: the one its boot
/// pinned, and those the bootserver's last TLS answer named (a rotation's next one).
fn pins(boot: [u8; 32], store: &Store) -> Vec<[u8; 32]> {
    let mut pins = vec![boot];
    for learned in store.meta().map(|m| m.tls_pins).unwrap_or_default() {
        if let Some(pin) = unhex(&learned).and_then(|b| <[u8; 32]>::try_from(b).ok())
            && !pins.contains(&pin)
        {
            pins.push(pin);
        }
    }
    pins
}

/// The TPM attestation of this boot: the EK and a new AK to the bootserver, its challenge
/// activated, a quote over the SHA-256 of the secret.
async fn attest(
    http: &reqwest::Client,
    bootserver: &str,
    identity: &Identity,
    attestor: &crate::identity::Attestor,
    store: &Store,
) -> Result<AttestationProof, CredentialError> {
    let tpm = match &attestor.tcti {
        Some(tcti) => crate::tpm::Tpm {
            tcti: Some(tcti.clone()),
            dir: store.tpm_dir(),
        },
        None => crate::tpm::Tpm::system(&store.tpm_dir())?,
    };
    let keys = tpm.keys().await?;
    let url = format!("{bootserver}/machines/{}/attestation", identity.machine);
    let unreachable = |e: reqwest::Error| CredentialError::Unreachable {
        bootserver: bootserver.to_owned(),
        source: e.without_url().into(),
    };
    let response = http
        .post(&url)
        .timeout(REQUEST_TIMEOUT)
        .json(&AttestationRequest {
            endorsement_key: hex(&keys.endorsement),
            attestation_key: hex(&keys.attestation),
        })
        .send()
        .await
        .map_err(unreachable)?;
    let status = response.status().as_u16();
    if status != 200 {
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let message: String = response.text().await.unwrap_or_default();
        let message = message.trim().chars().take(300).collect();
        // A refused challenge spends nothing: the nonce is not in it.
        return Err(
            match classify(status, retry_after.as_deref(), ProofKind::Token) {
                Verdict::RetryAfter(after) => CredentialError::RetryLater {
                    status,
                    after,
                    message,
                },
                _ => CredentialError::Refused { status, message },
            },
        );
    }
    let challenge: AttestationChallenge = response
        .json()
        .await
        .map_err(|e| CredentialError::Undecodable(e.without_url()))?;
    let credential = unhex(&challenge.credential)
        .ok_or_else(|| CredentialError::Malformed("the challenge is not hex".into()))?;
    let secret = tpm.activate(&credential).await?;
    let qualifying = ring::digest::digest(&ring::digest::SHA256, &secret);
    let quote = tpm.quote(qualifying.as_ref()).await?;
    tracing::info!(
        machine = %identity.machine,
        pcrs = quote.pcrs.len(),
        "TPM attestation: challenge activated, PCRs quoted"
    );
    Ok(AttestationProof {
        secret: hex(&secret),
        quote: hex(&quote.message),
        signature: hex(&quote.signature),
        pcrs: quote.pcrs,
    })
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
    fn proof_prefers_a_valid_token_then_an_unspent_nonce() {
        let meta = StoredMeta {
            server: "s".into(),
            expires_unix: 0,
            lifetime_seconds: 0,
            nonce_used: true,
            self_refresh: false,
            tls_pins: Vec::new(),
        };
        assert!(matches!(
            choose_proof(Some(("t".into(), meta)), Some("n"), false, true),
            Some(Proof::Token(t)) if t == "t"
        ));
        assert!(matches!(
            choose_proof(None, Some("n"), true, false),
            Some(Proof::Nonce(n)) if n == "n"
        ));
        assert!(choose_proof(None, Some("n"), false, true).is_none());
        assert!(choose_proof(None, None, false, false).is_none());
        assert_eq!(choose_proof(None, None, true, false), Some(Proof::Ticket));
        assert!(
            choose_proof(None, None, true, true).is_none(),
            "a redeemed ticket"
        );
    }
}
