//! TPM attestation before credentials (`unbounded_api::identity`): the challenges handed
//! out, and the pure decisions over what a machine presents.
//!
//! 1. `POST /machines/<name>/attestation` with the TPM's endorsement key (EK) and a fresh
//!    attestation key (AK): [`admit_endorsement`] checks the EK against the Machine's (or
//!    takes it on first use where allowed), the AK is checked to be a restricted signing
//!    key of a TPM, and [`Challenges::issue`] wraps a random secret to the EK for the AK's
//!    name (TPM2_MakeCredential). One pending challenge per machine: a newer one replaces
//!    it; it expires after [`CHALLENGE_SECONDS`].
//! 2. The credential request carries the activated secret and a quote by the AK over its
//!    SHA-256: [`Challenges::verify`] takes the challenge (once), compares the secret,
//!    verifies the quote and then [`measurements_match`] holds its PCRs against the boot's
//!    accepted measurement sets.
//!
//! Only a TPM that holds the EK can activate the secret, and only for an AK that lives in
//! the same TPM (ActivateCredential checks the AK's name); the quote then proves the PCRs
//! come from that TPM, now.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use unbounded_api::identity::AttestationProof;

use crate::identity::tpm::{self, Quote, RsaPublic, TpmError, hex, unhex};

/// How long a challenge may wait for its credential request.
pub const CHALLENGE_SECONDS: u64 = 120;

/// At most this many machines with a pending challenge (each is a few hundred bytes).
const MAX_PENDING: usize = 16_384;

pub use crate::backend::IdentityPolicy;

/// Why an attestation is refused. Each is a reason on the Machine's `TPMAttested`
/// condition and a Warning Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestationRefusal {
    /// The machine is in TPM mode and the request carries no attestation.
    #[error(
        "this Machine is in TPM identity mode: its agent must attest with its TPM (POST /machines/<name>/attestation) before it gets credentials"
    )]
    Missing,
    /// No EK is recorded and trust on first use is off.
    #[error(
        "no endorsement key is recorded for this Machine (spec.pxe.identity.endorsementKey) and trustOnFirstUse is off; the TPM presented {presented}"
    )]
    NoEndorsementKey {
        /// The presented EK's name.
        presented: String,
    },
    /// The TPM presented another EK.
    #[error("the TPM presented endorsement key {presented}, not the recorded {recorded}")]
    EndorsementKeyMismatch {
        /// The presented EK's name.
        presented: String,
        /// The recorded one.
        recorded: String,
    },
    /// A key or the quote is malformed or of an unsupported kind.
    #[error("{0}")]
    Tpm(TpmError),
    /// No challenge is pending (never asked, expired, or already used).
    #[error("no attestation challenge is pending for this machine (expired or used); attest again")]
    NoChallenge,
    /// The secret is not the challenge's: the TPM could not activate it.
    #[error(
        "the activated secret is not the challenge's: this is not the TPM of the endorsement key"
    )]
    WrongSecret,
    /// The PCRs match none of the boot's accepted measurement sets.
    #[error("the quoted PCRs match none of the boot's accepted measurements ({0})")]
    Measurements(String),
}

impl AttestationRefusal {
    /// The condition's and the Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "AttestationMissing",
            Self::NoEndorsementKey { .. } => "NoEndorsementKey",
            Self::EndorsementKeyMismatch { .. } => "EndorsementKeyMismatch",
            Self::Tpm(_) => "AttestationMalformed",
            Self::NoChallenge => "NoChallenge",
            Self::WrongSecret => "WrongSecret",
            Self::Measurements(_) => "MeasurementMismatch",
        }
    }
}

/// How an EK was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It is the recorded one.
    Recorded,
    /// None was recorded and trust on first use allows this one: record it once attested.
    FirstUse,
}

/// Whether a TPM with the EK named `presented` may attest as a machine with `policy`.
pub fn admit_endorsement(
    policy: &IdentityPolicy,
    presented: &[u8],
) -> Result<Admission, AttestationRefusal> {
    let presented = hex(presented);
    match &policy.endorsement_key {
        Some(recorded) if recorded.eq_ignore_ascii_case(&presented) => Ok(Admission::Recorded),
        Some(recorded) => Err(AttestationRefusal::EndorsementKeyMismatch {
            presented,
            recorded: recorded.to_ascii_lowercase(),
        }),
        None if policy.trust_on_first_use => Ok(Admission::FirstUse),
        None => Err(AttestationRefusal::NoEndorsementKey { presented }),
    }
}

/// Whether `quoted` PCRs match every value of one of the `accepted` sets (none listed:
/// anything matches).
pub fn measurements_match(
    accepted: &[BTreeMap<u8, Vec<u8>>],
    quoted: &BTreeMap<u8, Vec<u8>>,
) -> Result<(), AttestationRefusal> {
    if accepted.is_empty()
        || accepted
            .iter()
            .any(|set| set.iter().all(|(i, v)| quoted.get(i) == Some(v)))
    {
        return Ok(());
    }
    let shown: Vec<String> = quoted
        .iter()
        .map(|(i, v)| format!("{i}={}", hex(v).get(..16).unwrap_or_default()))
        .collect();
    Err(AttestationRefusal::Measurements(format!(
        "quoted {}…",
        shown.join(" ")
    )))
}

/// PCR values as sent (`"4": "hex"`) into bytes; `None` when one is not an index or not hex.
pub fn parse_pcrs(pcrs: &BTreeMap<String, String>) -> Option<BTreeMap<u8, Vec<u8>>> {
    pcrs.iter()
        .map(|(i, v)| {
            let index = i.parse::<u8>().ok().filter(|i| *i < 24)?;
            let value = unhex(v).filter(|v| v.len() == 32)?;
            Some((index, value))
        })
        .collect()
}

/// Compares in time that does not depend on where the bytes differ.
fn same_secret(presented: &[u8], expected: &[u8; 32]) -> bool {
    presented.len() == expected.len()
        && presented
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

struct Pending {
    /// The EK's TPM name.
    endorsement_key: Vec<u8>,
    admission: Admission,
    attestation_key: RsaPublic,
    secret: [u8; 32],
    expires: u64,
}

/// What a verified attestation established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    /// The EK's name, hex.
    pub endorsement_key: String,
    /// Whether it is to be recorded (first use).
    pub admission: Admission,
    /// The quoted PCRs.
    pub pcrs: BTreeMap<u8, Vec<u8>>,
}

/// The pending challenges, one per machine.
#[derive(Default)]
pub struct Challenges {
    pending: Mutex<HashMap<String, Pending>>,
}

impl std::fmt::Debug for Challenges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenges").finish_non_exhaustive()
    }
}

impl Challenges {
    /// A challenge for `machine`'s TPM: checks the EK and the AK, wraps a fresh secret,
    /// replaces the machine's pending challenge. Returns the credential blob.
    pub fn issue(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        endorsement_key: &[u8],
        attestation_key: &[u8],
        now: u64,
    ) -> Result<Vec<u8>, AttestationRefusal> {
        let ek = RsaPublic::parse(endorsement_key, "endorsement key")
            .map_err(AttestationRefusal::Tpm)?;
        ek.check_endorsement().map_err(AttestationRefusal::Tpm)?;
        let admission = admit_endorsement(policy, &ek.name)?;
        let ak = RsaPublic::parse(attestation_key, "attestation key")
            .map_err(AttestationRefusal::Tpm)?;
        ak.check_attestation().map_err(AttestationRefusal::Tpm)?;
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| AttestationRefusal::Tpm(TpmError::Randomness))?;
        let blob = tpm::make_credential(&ek, &ak.name, &secret).map_err(AttestationRefusal::Tpm)?;
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pending.len() >= MAX_PENDING {
            pending.retain(|_, p| p.expires > now);
        }
        pending.insert(
            machine.to_owned(),
            Pending {
                endorsement_key: ek.name.clone(),
                admission,
                attestation_key: ak,
                secret,
                expires: now + CHALLENGE_SECONDS,
            },
        );
        Ok(blob)
    }

    /// Verifies `proof` against `machine`'s pending challenge, which it uses up whatever the
    /// outcome (a wrong guess gets no second try at the same secret).
    pub fn verify(
        &self,
        machine: &str,
        policy: &IdentityPolicy,
        proof: &AttestationProof,
        now: u64,
    ) -> Result<Attested, AttestationRefusal> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(machine)
            .filter(|p| p.expires > now)
            .ok_or(AttestationRefusal::NoChallenge)?;
        let secret = unhex(&proof.secret).unwrap_or_default();
        if !same_secret(&secret, &pending.secret) {
            return Err(AttestationRefusal::WrongSecret);
        }
        let malformed = |what| AttestationRefusal::Tpm(TpmError::Malformed(what));
        let message = unhex(&proof.quote).ok_or_else(|| malformed("quote"))?;
        let signature = unhex(&proof.signature).ok_or_else(|| malformed("quote signature"))?;
        let pcrs = parse_pcrs(&proof.pcrs).ok_or_else(|| malformed("PCR values"))?;
        let qualifying = ring::digest::digest(&ring::digest::SHA256, &pending.secret);
        let quoted = Quote {
            message: &message,
            signature: &signature,
        }
        .verify(&pending.attestation_key, qualifying.as_ref(), &pcrs)
        .map_err(AttestationRefusal::Tpm)?;
        // The Machine's policy may have changed since the challenge (an operator recorded
        // or replaced the EK): the EK is admitted again against it.
        let admission = match admit_endorsement(policy, &pending.endorsement_key)? {
            Admission::Recorded => Admission::Recorded,
            Admission::FirstUse => pending.admission,
        };
        measurements_match(&policy.measurements, &quoted.pcrs)?;
        Ok(Attested {
            endorsement_key: hex(&pending.endorsement_key),
            admission,
            pcrs: quoted.pcrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::identity::IdentityMode;

    const EK_NAME: &str = "000b214546304e687ff6bc0d110f72149e986760b93a757fa568ce2e5229237d9396";

    #[test]
    fn an_endorsement_key_is_the_recorded_one_or_taken_on_first_use_only_where_allowed() {
        let presented = unhex(EK_NAME).unwrap();
        let recorded = |ek: &str, tofu| IdentityPolicy {
            mode: Some(IdentityMode::Tpm),
            endorsement_key: Some(ek.to_owned()),
            trust_on_first_use: tofu,
            measurements: vec![],
        };
        let cases = [
            (
                "recorded, same",
                recorded(EK_NAME, false),
                Ok(Admission::Recorded),
            ),
            (
                "recorded in capitals",
                recorded(&EK_NAME.to_ascii_uppercase(), false),
                Ok(Admission::Recorded),
            ),
            (
                "recorded, another, even with trust on first use",
                recorded(&format!("000b{}", "1".repeat(64)), true),
                Err("EndorsementKeyMismatch"),
            ),
            (
                "none recorded, first use allowed",
                IdentityPolicy {
                    trust_on_first_use: true,
                    ..IdentityPolicy::default()
                },
                Ok(Admission::FirstUse),
            ),
            (
                "none recorded, first use not allowed",
                IdentityPolicy::default(),
                Err("NoEndorsementKey"),
            ),
        ];
        for (case, policy, expected) in cases {
            let got = admit_endorsement(&policy, &presented).map_err(|e| e.reason());
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn pcrs_must_match_one_accepted_set_whole() {
        let v = |b: u8| vec![b; 32];
        let quoted: BTreeMap<u8, Vec<u8>> = [(0, v(1)), (4, v(2)), (7, v(3))].into();
        let set = |pairs: &[(u8, u8)]| -> BTreeMap<u8, Vec<u8>> {
            pairs.iter().map(|(i, b)| (*i, v(*b))).collect()
        };
        assert!(measurements_match(&[], &quoted).is_ok(), "none listed");
        assert!(measurements_match(&[set(&[(4, 2)])], &quoted).is_ok());
        assert!(
            measurements_match(&[set(&[(4, 9)]), set(&[(0, 1), (7, 3)])], &quoted).is_ok(),
            "the second set"
        );
        assert!(
            measurements_match(&[set(&[(4, 2), (7, 9)])], &quoted).is_err(),
            "one value of the set differs"
        );
        assert!(
            measurements_match(&[set(&[(9, 0)])], &quoted).is_err(),
            "a PCR that was not quoted"
        );
    }

    #[test]
    fn pcr_values_are_indices_and_sha256_digests() {
        let good: BTreeMap<String, String> = [("4".into(), "ab".repeat(32))].into();
        assert_eq!(parse_pcrs(&good).unwrap()[&4], vec![0xab; 32]);
        for (i, v) in [
            ("24", "ab".repeat(32)),
            ("x", "ab".repeat(32)),
            ("4", "ab".repeat(20)),
            ("4", "zz".repeat(32)),
        ] {
            assert!(parse_pcrs(&[(i.to_owned(), v)].into()).is_none(), "{i}");
        }
    }
}
