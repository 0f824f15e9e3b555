//! The agent's credentials, issued by the bootserver (Kubernetes backend only).
//!
//! 1. When a machine's iPXE fetches its script, the script's kernel command line gets a
//!    one-time **nonce** (`unbounded.nonce=…`), bound to that machine and to the address that
//!    fetched the script; a newer script replaces it. It is handed out only to a peer the
//!    HTTP layer vouches for as that machine ([`crate::identity`]: its lease, its PXE
//!    exchange on port 4011, its link-layer address). With `http.tls` the script carries no
//!    nonce: the bootserver keeps it as this boot's **ticket**, redeemed over TLS only, from
//!    the address the script went to.
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
//!
//! **Busy is not refused.** What the agent may retry is answered 503 or 429 with
//! `Retry-After`, never 401/403 (which the agent takes as "this nonce is spent"): a nonce
//! whose mint is still under way (a second request while the API server is slow), a mint
//! that did not finish within `credentials.mintTimeoutSeconds` (default 20 s, below the
//! agent's 30 s request timeout, so that the agent hears the answer instead of giving up
//! while its nonce is reserved), a ServiceAccount that does not exist yet, an API server
//! error, too many requests. A nonce is spent only by a mint that succeeded; a mint that
//! failed, timed out or was abandoned (its client went away and the request was dropped)
//! releases it, so the agent can present it again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use prometheus_client::registry::Registry;
use ring::rand::{SecureRandom, SystemRandom};
use unbounded_api::agent::{CredentialRequest, Credentials, agent_username};
use unbounded_api::identity::{AttestationChallenge, AttestationRequest, IdentityMode};
use unbounded_runtime::tokens::{self, MintError};

use crate::nonce_file::{NonceFile, NonceFileError};

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
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
    last_ip: Mutex<HashMap<String, IpAddr>>,
    metrics: IssuerMetrics,
    challenges: Challenges,
    replays: Replays,
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
    pub peer: IpAddr,
    /// Whether it holds the machine's reservation or lease.
    pub holds_address: bool,
    /// Whether the bootserver knows machines' addresses (full DHCP).
    pub addresses_known: bool,
    /// The peer's link-layer address against the machine's MACs.
    pub link_layer: crate::identity::LinkLayer,
    /// The request came over TLS.
    pub secure: bool,
}

impl Issuer {
    /// An issuer over a cluster client; its nonces kept in `settings.nonce_file` (those
    /// still valid in it are accepted again) or in memory only.
    pub fn new(settings: IssuerSettings, client: kube::Client) -> Result<Self, NonceFileError> {
        let nonces = match &settings.nonce_file {
            Some(path) => Nonces::persistent(NonceFile::new(path), now_unix())?,
            None => Nonces::default(),
        };
        Ok(Self {
            settings,
            client,
            nonces,
            rate: RateLimit::default(),
            last_ip: Mutex::default(),
            metrics: IssuerMetrics::default(),
            challenges: Challenges::default(),
            replays: Replays::default(),
        })
    }

    /// Registers the issuer's metrics: `unbounded_bootserver_credential_requests_in_flight`
    /// (waiting for the API server) and `unbounded_bootserver_credentials_refused{reason}`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("unbounded_bootserver");
        r.register(
            "credential_requests_in_flight",
            "Credential requests waiting for the API server (token review, mint)",
            self.metrics.in_flight.clone(),
        );
        r.register(
            "credentials_refused",
            "Credential requests answered with an error, by reason",
            self.metrics.refused.clone(),
        );
    }

    /// A new nonce for `machine`'s boot script served to `peer`, which the caller has
    /// vouched for as that machine ([`crate::identity::vouch`]): bound to `peer`, replacing
    /// the machine's previous one. An error when it could not be recorded (the nonce file):
    /// then no script may carry it.
    pub fn nonce_for_script(
        &self,
        machine: &str,
        peer: IpAddr,
    ) -> Result<Option<String>, NonceFileError> {
        let Some(value) = random_hex(16) else {
            return Ok(None);
        };
        self.nonces.insert(
            machine,
            &value,
            peer,
            now_unix() + self.settings.nonce_seconds,
        )?;
        Ok(Some(value))
    }

    /// How a machine with `policy` proves who it is.
    pub fn identity_mode(&self, policy: &IdentityPolicy) -> IdentityMode {
        policy.mode.unwrap_or(self.settings.default_identity)
    }

    /// A TPM attestation challenge for `machine` ([`attestation`]): from an origin that
    /// passes the link-layer check, for a Machine in TPM mode whose EK this is (or may be,
    /// on first use).
    pub fn challenge(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        origin: Origin,
        request: &AttestationRequest,
    ) -> Result<AttestationChallenge, IssueError> {
        let result = self.make_challenge(machine, policy, origin, request);
        if let Err(error) = &result {
            self.count_refusal(error);
            if let IssueError::Attestation(refusal) = error {
                self.record_attestation(machine, Err(refusal));
            }
        }
        result
    }

    fn make_challenge(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        origin: Origin,
        request: &AttestationRequest,
    ) -> Result<AttestationChallenge, IssueError> {
        let now = now_unix();
        if self.identity_mode(policy) != IdentityMode::Tpm {
            return Err(IssueError::NotTpmMode);
        }
        if !self.rate.allow(machine, now, REQUESTS_PER_MINUTE) {
            return Err(IssueError::RateLimited {
                retry_after: 60 - now % 60,
            });
        }
        // The address rules of the credential request itself: another host, even off-link,
        // must not displace a booting machine's pending challenge.
        if matches!(origin.link_layer, crate::identity::LinkLayer::Other(_))
            || !address_allowed(
                origin.holds_address,
                origin.addresses_known,
                self.nonces.bound_ip(machine),
                origin.peer,
            )
        {
            return Err(IssueError::WrongAddress);
        }
        let malformed = |what| {
            IssueError::Attestation(AttestationRefusal::Tpm(
                crate::identity::tpm::TpmError::Malformed(what),
            ))
        };
        let ek = crate::identity::tpm::unhex(&request.endorsement_key)
            .ok_or_else(|| malformed("endorsement key"))?;
        let ak = crate::identity::tpm::unhex(&request.attestation_key)
            .ok_or_else(|| malformed("attestation key"))?;
        let blob = self
            .challenges
            .issue(machine, policy, &ek, &ak, now)
            .map_err(IssueError::Attestation)?;
        Ok(AttestationChallenge {
            credential: crate::identity::tpm::hex(&blob),
            expires_in_seconds: attestation::CHALLENGE_SECONDS,
        })
    }

    fn count_refusal(&self, error: &IssueError) {
        self.metrics
            .refused
            .get_or_create(&RefusalLabel {
                reason: error.reason(),
            })
            .inc();
    }

    /// Answers a credential request for `machine`, whose identity settings are `policy`.
    pub async fn credentials(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        origin: Origin,
        bearer: Option<&str>,
        request: &CredentialRequest,
    ) -> Result<Credentials, IssueError> {
        let result = self.issue(machine, policy, origin, bearer, request).await;
        if let Err(error) = &result {
            self.count_refusal(error);
        }
        result
    }

    async fn issue(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        origin: Origin,
        bearer: Option<&str>,
        request: &CredentialRequest,
    ) -> Result<Credentials, IssueError> {
        let now = now_unix();
        if !self.rate.allow(machine, now, REQUESTS_PER_MINUTE) {
            return Err(IssueError::RateLimited {
                retry_after: 60 - now % 60,
            });
        }
        // The answer to a nonce or ticket that was spent a moment ago was lost on its way
        // (a reset connection, an agent killed mid-request): the same address asking with
        // the same proof gets the same credentials again, nothing new minted.
        // Never to hardware that is not the machine's, and in TPM mode only with a fresh
        // attestation (the agent attests again with every request of a boot).
        if bearer.is_none()
            && !matches!(origin.link_layer, crate::identity::LinkLayer::Other(_))
            && let Some(proof) = ReplayProof::of(request, origin.secure)
            && let Some(credentials) =
                self.replays
                    .get(machine, &proof, origin.peer, request.bootstrap_token, now)
            && (self.identity_mode(policy) != IdentityMode::Tpm
                || request.attestation.as_ref().is_some_and(|attestation| {
                    self.challenges
                        .verify(machine, policy, attestation, now)
                        .is_ok()
                }))
        {
            tracing::info!(machine, peer = %origin.peer, "credentials sent again for a proof spent moments ago (its answer was lost)");
            return Ok(credentials);
        }
        let bound = match (&request.nonce, request.ticket, bearer) {
            (Some(_), _, _) | (None, true, _) => self.nonces.bound_ip(machine),
            // A refresh comes from where the last credentials went; a bootserver that
            // restarted since has forgotten that (it is kept in memory), and then an on-link
            // peer whose link-layer address is the machine's stands for it: the token review
            // below still proves whose token it is.
            (None, false, Some(_)) => self
                .last_ip
                .lock()
                .ok()
                .and_then(|m| m.get(machine).copied())
                .or_else(|| {
                    (origin.link_layer == crate::identity::LinkLayer::Matches)
                        .then_some(origin.peer)
                }),
            (None, false, None) => return Err(IssueError::Unauthenticated),
        };
        if matches!(origin.link_layer, crate::identity::LinkLayer::Other(_))
            || !address_allowed(
                origin.holds_address,
                origin.addresses_known,
                bound,
                origin.peer,
            )
        {
            return Err(IssueError::WrongAddress);
        }
        let reservation = match (&request.nonce, request.ticket) {
            (Some(nonce), _) => Some(
                self.nonces
                    .reserve(machine, nonce, now)
                    .map_err(IssueError::Nonce)?,
            ),
            // A ticket is no secret (the bootserver holds it, bound to the address its
            // script went to): it is redeemed only over TLS, where the answer is.
            (None, true) if !origin.secure => return Err(IssueError::TicketNeedsTls),
            (None, true) => Some(
                self.nonces
                    .reserve_ticket(machine, origin.peer, now)
                    .map_err(IssueError::Nonce)?,
            ),
            (None, false) => None,
        };
        // The first credentials of a TPM-mode boot go only to the holder of its TPM.
        let attested = match (&reservation, self.identity_mode(policy)) {
            (Some(_), IdentityMode::Tpm) => {
                let verdict = request
                    .attestation
                    .as_ref()
                    .ok_or(AttestationRefusal::Missing)
                    .and_then(|proof| self.challenges.verify(machine, policy, proof, now));
                match verdict {
                    Ok(attested) => Some(attested),
                    Err(refusal) => {
                        self.record_attestation(machine, Err(&refusal));
                        return Err(IssueError::Attestation(refusal));
                    }
                }
            }
            _ => None,
        };
        let kind = match (reservation.is_some(), request.ticket) {
            (true, true) => "ticket",
            (true, false) => "nonce",
            (false, _) => "refresh",
        };
        let _in_flight = InFlight::new(&self.metrics.in_flight);
        let deadline = self.settings.mint_timeout;
        let (credentials, bootstrap_id) = tokio::time::timeout(deadline, async {
            if reservation.is_none() {
                let token = bearer.ok_or(IssueError::Unauthenticated)?;
                self.review(machine, token).await?;
            }
            if let Some(attested) = attested
                .as_ref()
                .filter(|a| a.admission == Admission::FirstUse)
            {
                self.record_endorsement_key(machine, &attested.endorsement_key)
                    .await?;
            }
            self.mint(machine, request.bootstrap_token).await
        })
        .await
        .map_err(|_| IssueError::TimedOut(deadline.as_secs()))??;
        // Only a successful mint spends the nonce; every other way out of here (an error,
        // the timeout, the request being dropped) releases it.
        if let Some(reservation) = reservation {
            reservation.spend();
            if let Some(proof) = ReplayProof::of(request, origin.secure) {
                self.replays.insert(
                    machine,
                    Replay {
                        proof,
                        peer: origin.peer,
                        bootstrap: request.bootstrap_token,
                        credentials: credentials.clone(),
                        until: now + self.settings.replay_seconds,
                    },
                    now,
                );
            }
        }
        if let Ok(mut last) = self.last_ip.lock() {
            last.insert(machine.to_owned(), origin.peer);
        }
        if let Some(attested) = &attested {
            self.record_attestation(machine, Ok(attested));
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
            .map_err(IssueError::Kube)?;
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
            tokens::mint_service_account_token(&self.client, machine, self.settings.token_seconds)
                .await
                .map_err(mint_error)?;
        let lifetime = u64::try_from(self.settings.token_seconds).unwrap_or(3600);
        let (bootstrap_token, bootstrap_id) = if bootstrap {
            let owner = Api::<unbounded_api::Machine>::all(self.client.clone())
                .get(machine)
                .await
                .map_err(IssueError::Kube)?;
            let seconds = u64::try_from(self.settings.bootstrap_token_seconds).unwrap_or(3600);
            let (token, id) = tokens::create_bootstrap_token(&self.client, &owner, seconds)
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
                tls_sha256: Vec::new(),
            },
            bootstrap_id,
        ))
    }
}

fn mint_error(error: MintError) -> IssueError {
    match error {
        MintError::NotReady => IssueError::NotReady,
        other => IssueError::Mint(other),
    }
}

pub mod attestation;
mod limits;
mod nonces;
mod records;
mod refusal;
mod replays;
pub mod settings;

pub use crate::backend::IdentityPolicy;
use attestation::{Admission, AttestationRefusal, Challenges};
pub use limits::address_allowed;
use limits::{InFlight, IssuerMetrics, REQUESTS_PER_MINUTE, RateLimit, RefusalLabel};
pub use nonces::{NonceRefusal, Nonces, Reservation};
pub use refusal::{IssueError, retry_after};
use replays::{Replay, ReplayProof, Replays};
pub use settings::IssuerSettings;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_single_use_bound_and_expire() {
        let nonces = Nonces::default();
        let ip = IpAddr::from([10, 99, 0, 21]);
        nonces.insert("m", "aaaa", ip, 100).unwrap();
        assert_eq!(nonces.bound_ip("m"), Some(ip));
        assert_eq!(
            nonces.reserve("m", "bbbb", 50).err(),
            Some(NonceRefusal::Mismatch)
        );
        assert_eq!(
            nonces.reserve("other", "aaaa", 50).err(),
            Some(NonceRefusal::NoneIssued)
        );
        let reservation = nonces.reserve("m", "aaaa", 50).unwrap();
        assert_eq!(
            nonces.reserve("m", "aaaa", 50).err(),
            Some(NonceRefusal::Busy),
            "reserved"
        );
        drop(reservation);
        let reservation = nonces.reserve("m", "aaaa", 50).expect(
            "released when the reservation is dropped (a failed, timed-out or abandoned mint)",
        );
        reservation.spend();
        assert_eq!(
            nonces.reserve("m", "aaaa", 50).err(),
            Some(NonceRefusal::NoneIssued),
            "spent"
        );
        nonces.insert("m", "cccc", ip, 100).unwrap();
        assert_eq!(
            nonces.reserve("m", "cccc", 100).err(),
            Some(NonceRefusal::Expired)
        );
        nonces.insert("m", "dddd", ip, 100).unwrap();
        nonces.insert("m", "eeee", ip, 100).unwrap();
        assert_eq!(
            nonces.reserve("m", "dddd", 50).err(),
            Some(NonceRefusal::Mismatch),
            "replaced"
        );
    }

    #[test]
    fn a_ticket_is_redeemed_once_and_only_from_the_address_its_script_went_to() {
        let nonces = Nonces::default();
        let (ip, other) = (IpAddr::from([10, 99, 0, 21]), IpAddr::from([10, 99, 0, 50]));
        nonces.insert("m", "never-shown", ip, 100).unwrap();
        assert_eq!(
            nonces.reserve_ticket("m", other, 50).err(),
            Some(NonceRefusal::Mismatch)
        );
        assert_eq!(
            nonces.reserve_ticket("n", ip, 50).err(),
            Some(NonceRefusal::NoneIssued)
        );
        let reservation = nonces.reserve_ticket("m", ip, 50).unwrap();
        assert_eq!(
            nonces.reserve_ticket("m", ip, 50).err(),
            Some(NonceRefusal::Busy)
        );
        reservation.spend();
        assert_eq!(
            nonces.reserve_ticket("m", ip, 50).err(),
            Some(NonceRefusal::NoneIssued),
            "spent"
        );
        nonces.insert("m", "again", ip, 100).unwrap();
        assert_eq!(
            nonces.reserve_ticket("m", ip, 100).err(),
            Some(NonceRefusal::Expired)
        );
    }

    #[test]
    fn nonces_in_a_file_outlive_the_process_until_spent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.json");
        let ip = IpAddr::from([10, 99, 0, 21]);
        let before = Nonces::persistent(NonceFile::new(&path), 0).unwrap();
        before.insert("m", "aaaa", ip, 100).unwrap();
        before.insert("n", "bbbb", ip, 100).unwrap();
        drop(before);
        // A new process: the script served by the old one is still honoured.
        let after = Nonces::persistent(NonceFile::new(&path), 50).unwrap();
        assert_eq!(after.bound_ip("m"), Some(ip));
        assert_eq!(
            after.reserve("m", "zzzz", 50).err(),
            Some(NonceRefusal::Mismatch)
        );
        after.reserve("m", "aaaa", 50).unwrap().spend();
        drop(after);
        let again = Nonces::persistent(NonceFile::new(&path), 50).unwrap();
        assert_eq!(
            again.reserve("m", "aaaa", 50).err(),
            Some(NonceRefusal::NoneIssued),
            "spent before the restart: spent after it"
        );
        assert!(again.reserve("n", "bbbb", 50).is_ok());
        drop(again);
        let expired = Nonces::persistent(NonceFile::new(&path), 100).unwrap();
        assert!(expired.is_empty(), "expired while no process ran");
    }

    #[test]
    fn a_nonce_that_cannot_be_written_is_not_issued() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/nonces.json");
        let ip = IpAddr::from([10, 99, 0, 21]);
        let nonces = Nonces::persistent(NonceFile::new(&path), 0).unwrap();
        let error = nonces.insert("m", "aaaa", ip, 100).unwrap_err().to_string();
        assert!(error.contains("gone/nonces.json"), "{error}");
        assert!(!error.contains("aaaa"), "no nonce in errors: {error}");
        assert_eq!(
            nonces.reserve("m", "aaaa", 50).err(),
            Some(NonceRefusal::NoneIssued)
        );
    }

    #[test]
    fn a_newer_script_s_nonce_survives_the_end_of_an_older_mint() {
        let nonces = Nonces::default();
        let ip = IpAddr::from([10, 99, 0, 21]);
        nonces.insert("m", "old", ip, 100).unwrap();
        let reservation = nonces.reserve("m", "old", 50).unwrap();
        // The machine rebooted and fetched a new script while the old mint ran.
        nonces.insert("m", "new", ip, 100).unwrap();
        reservation.spend();
        let reservation = nonces
            .reserve("m", "new", 50)
            .expect("not spent by the old mint");
        nonces.insert("m", "newer", ip, 100).unwrap();
        drop(reservation);
        assert!(nonces.reserve("m", "newer", 50).is_ok());
    }

    #[test]
    fn busy_and_unavailable_say_retry_refusals_do_not() {
        use NonceRefusal as N;
        let cases = [
            (IssueError::Nonce(N::Busy), 503, Some(retry_after::BUSY)),
            (IssueError::NotReady, 503, Some(retry_after::UNAVAILABLE)),
            (
                IssueError::TimedOut(20),
                503,
                Some(retry_after::UNAVAILABLE),
            ),
            (
                IssueError::Kube(kube::Error::TlsRequired),
                503,
                Some(retry_after::UNAVAILABLE),
            ),
            (IssueError::RateLimited { retry_after: 17 }, 429, Some(17)),
            (IssueError::Nonce(N::NoneIssued), 403, None),
            (IssueError::Nonce(N::Mismatch), 403, None),
            (IssueError::Nonce(N::Expired), 403, None),
            (IssueError::WrongAddress, 403, None),
            (IssueError::TicketNeedsTls, 403, None),
            (IssueError::Unauthenticated, 401, None),
            (IssueError::BadToken, 401, None),
        ];
        for (error, status, retry) in cases {
            assert_eq!(error.status(), status, "{error}");
            assert_eq!(error.retry_after(), retry, "{error}");
            // What the agent may retry never comes as 401/403 (it would spend its nonce).
            assert_eq!(retry.is_some(), !matches!(status, 401 | 403), "{error}");
        }
    }

    #[test]
    fn address_rules() {
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
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
