//! Why a credential request was refused, and what the agent is told: the HTTP status, when
//! to retry, the metric label.

use unbounded_runtime::tokens::MintError;

use super::attestation::AttestationRefusal;
use super::nonces::NonceRefusal;

/// Why a credential request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The request does not come from the machine's address.
    #[error("a machine gets credentials only from its own address")]
    WrongAddress,
    /// A ticket was presented over plain HTTP.
    #[error("a ticket is redeemed over HTTPS only")]
    TicketNeedsTls,
    /// Neither a nonce nor a token was presented.
    #[error("present this boot's nonce or a valid token")]
    Unauthenticated,
    /// The nonce was refused.
    #[error("nonce refused: {0}")]
    Nonce(#[source] NonceRefusal),
    /// The token is not this Machine's ServiceAccount's, or not valid.
    #[error("the presented token does not belong to this machine or is no longer valid")]
    BadToken,
    /// Too many requests for one machine.
    #[error("too many credential requests for this machine; retry in {retry_after} s")]
    RateLimited {
        /// Seconds until the next window.
        retry_after: u64,
    },
    /// The ServiceAccount does not exist yet (the controller creates it).
    #[error("the machine's ServiceAccount does not exist yet; retry shortly")]
    NotReady,
    /// The API server did not answer in time; nothing was spent.
    #[error("the API server did not answer within {0} s; retry shortly")]
    TimedOut(u64),
    /// Kubernetes refused or failed.
    #[error("the API server failed: {0}")]
    Kube(#[source] kube::Error),
    /// Minting a token failed (other than the ServiceAccount not existing yet).
    #[error(transparent)]
    Mint(MintError),
    /// The Machine is in TPM identity mode and its TPM did not attest it.
    #[error("TPM attestation refused: {0}")]
    Attestation(#[source] AttestationRefusal),
    /// A challenge was asked for a Machine that is not in TPM identity mode.
    #[error("this Machine is in network identity mode: it has nothing to attest")]
    NotTpmMode,
}

/// What the agent is told to wait before it retries a request that the bootserver could
/// not answer now (`Retry-After`, seconds).
pub mod retry_after {
    /// A nonce whose mint is under way: it ends (issued or released) within the mint
    /// timeout.
    pub const BUSY: u64 = 2;
    /// The ServiceAccount is not there yet, the API server failed or was too slow.
    pub const UNAVAILABLE: u64 = 5;
    /// What only an operator can change (an endorsement key to record) or a new
    /// attestation fixes: the agent keeps its nonce and asks again slowly.
    pub const OPERATOR: u64 = 30;
}

impl IssueError {
    /// The HTTP status for this refusal: 401/403 only for what no retry of the same
    /// request can change (the agent marks a nonce refused that way as spent); 429/503 for
    /// what it should retry.
    pub fn status(&self) -> u16 {
        match self {
            Self::Nonce(NonceRefusal::Busy) => 503,
            Self::Attestation(refusal) if attestation_retryable(refusal) => 409,
            Self::NotTpmMode => 409,
            Self::WrongAddress | Self::Nonce(_) | Self::TicketNeedsTls | Self::Attestation(_) => {
                403
            }
            Self::Unauthenticated | Self::BadToken => 401,
            Self::RateLimited { .. } => 429,
            Self::NotReady | Self::TimedOut(_) | Self::Kube(_) | Self::Mint(_) => 503,
        }
    }

    /// Seconds the client should wait before it retries (`Retry-After`), for the answers
    /// that say "retry"; `None` for refusals.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Nonce(NonceRefusal::Busy) => Some(retry_after::BUSY),
            Self::RateLimited { retry_after } => Some(*retry_after),
            Self::Attestation(refusal) if attestation_retryable(refusal) => {
                Some(retry_after::OPERATOR)
            }
            Self::NotTpmMode => Some(retry_after::OPERATOR),
            Self::NotReady | Self::TimedOut(_) | Self::Kube(_) | Self::Mint(_) => {
                Some(retry_after::UNAVAILABLE)
            }
            Self::WrongAddress
            | Self::Nonce(_)
            | Self::TicketNeedsTls
            | Self::Attestation(_)
            | Self::Unauthenticated
            | Self::BadToken => None,
        }
    }

    /// A metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::WrongAddress => "wrong_address",
            Self::TicketNeedsTls => "ticket_needs_tls",
            Self::Unauthenticated => "unauthenticated",
            Self::Nonce(NonceRefusal::Busy) => "nonce_busy",
            Self::Nonce(_) => "nonce_refused",
            Self::BadToken => "bad_token",
            Self::RateLimited { .. } => "rate_limited",
            Self::NotReady => "not_ready",
            Self::TimedOut(_) => "api_timeout",
            Self::Kube(_) | Self::Mint(_) => "api_error",
            Self::Attestation(_) => "attestation",
            Self::NotTpmMode => "not_tpm_mode",
        }
    }
}

/// Refusals an operator's change or a fresh attestation can cure without a new boot (the
/// agent keeps its nonce): an EK to record, a challenge that expired. A secret the TPM could
/// not activate, a forged quote, PCRs of another boot chain are not.
fn attestation_retryable(refusal: &AttestationRefusal) -> bool {
    matches!(
        refusal,
        AttestationRefusal::Missing
            | AttestationRefusal::NoEndorsementKey { .. }
            | AttestationRefusal::EndorsementKeyMismatch { .. }
            | AttestationRefusal::NoChallenge
    )
}
