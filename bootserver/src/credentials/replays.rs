//! The credentials of a nonce or ticket spent moments ago, kept for
//! `credentials.replaySeconds`: when the answer that carried them is lost, the agent asks
//! again with the same proof from the same address and gets the same credentials, instead
//! of a refusal that would leave it waiting for the next boot. Memory only (a restart
//! forgets them: then the agent's nonce is spent, as before), one per machine, never the
//! nonce itself: its SHA-256.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use unbounded_api::agent::{CredentialRequest, Credentials};

/// Which proof was spent.
#[derive(Clone, PartialEq, Eq)]
pub enum ReplayProof {
    /// A nonce, by its SHA-256.
    Nonce([u8; 32]),
    /// This boot's ticket (over TLS).
    Ticket,
}

impl ReplayProof {
    /// The proof a request carries, if it is a nonce or a ticket over TLS.
    pub fn of(request: &CredentialRequest, secure: bool) -> Option<Self> {
        match (&request.nonce, request.ticket) {
            (Some(nonce), _) => {
                let digest = ring::digest::digest(&ring::digest::SHA256, nonce.as_bytes());
                let mut bytes = [0u8; 32];
                bytes.copy_from_slice(digest.as_ref());
                Some(Self::Nonce(bytes))
            }
            (None, true) if secure => Some(Self::Ticket),
            _ => None,
        }
    }
}

/// What was answered.
pub struct Replay {
    /// The proof spent.
    pub proof: ReplayProof,
    /// Where the answer went.
    pub peer: IpAddr,
    /// Whether it carried a bootstrap token.
    pub bootstrap: bool,
    /// The answer.
    pub credentials: Credentials,
    /// Until when it may be sent again (seconds since the epoch).
    pub until: u64,
}

/// The last answer per machine.
#[derive(Default)]
pub struct Replays {
    last: Mutex<HashMap<String, Replay>>,
}

impl std::fmt::Debug for Replays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replays").finish_non_exhaustive()
    }
}

/// At most this many answers are kept (one per machine that got credentials within the
/// window).
const MAX_KEPT: usize = 16_384;

impl Replays {
    /// Keeps `replay` as `machine`'s last answer (at `now`, when the expired are dropped).
    pub fn insert(&self, machine: &str, replay: Replay, now: u64) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.len() >= MAX_KEPT {
            last.retain(|_, r| r.until > now);
        }
        last.insert(machine.to_owned(), replay);
    }

    /// The answer to send again: the same proof, from the same address, asking for the same
    /// (with or without a bootstrap token), within the window.
    pub fn get(
        &self,
        machine: &str,
        proof: &ReplayProof,
        peer: IpAddr,
        bootstrap: bool,
        now: u64,
    ) -> Option<Credentials> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let replay = last.get(machine)?;
        (replay.proof == *proof
            && replay.peer == peer
            && replay.bootstrap == bootstrap
            && now < replay.until)
            .then(|| replay.credentials.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(token: &str) -> Credentials {
        Credentials {
            token: token.into(),
            expiration_timestamp: "2026-01-01T00:00:00Z".into(),
            lifetime_seconds: 3600,
            server: "https://10.99.0.1:6443".into(),
            certificate_authority: String::new(),
            bootstrap_token: None,
            tls_sha256: Vec::new(),
        }
    }

    #[test]
    fn only_the_same_proof_from_the_same_address_within_the_window_gets_it_again() {
        let replays = Replays::default();
        let a = IpAddr::from([10, 99, 0, 21]);
        let request = |nonce: &str| CredentialRequest {
            nonce: Some(nonce.into()),
            ..CredentialRequest::default()
        };
        let proof = ReplayProof::of(&request("n1"), false).unwrap();
        replays.insert(
            "m",
            Replay {
                proof: proof.clone(),
                peer: a,
                bootstrap: false,
                credentials: credentials("t1"),
                until: 100,
            },
            0,
        );
        assert_eq!(
            replays.get("m", &proof, a, false, 99).map(|c| c.token),
            Some("t1".into())
        );
        let other = ReplayProof::of(&request("n2"), false).unwrap();
        let cases = [
            ("another nonce", "m", &other, a, false, 99),
            (
                "another address",
                "m",
                &proof,
                IpAddr::from([10, 99, 0, 50]),
                false,
                99,
            ),
            ("with a bootstrap token now", "m", &proof, a, true, 99),
            ("after the window", "m", &proof, a, false, 100),
            ("another machine", "n", &proof, a, false, 99),
        ];
        for (case, machine, proof, peer, bootstrap, now) in cases {
            assert!(
                replays.get(machine, proof, peer, bootstrap, now).is_none(),
                "{case}"
            );
        }
        let ticket = CredentialRequest {
            ticket: true,
            ..CredentialRequest::default()
        };
        assert!(
            ReplayProof::of(&ticket, false).is_none(),
            "a ticket over plain HTTP"
        );
        assert!(ReplayProof::of(&ticket, true).is_some());
    }
}
