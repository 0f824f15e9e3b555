//! How a bare-metal machine proves who it is before it gets credentials, and what it sends
//! to prove it.
//!
//! - **`tpm`**: the machine is known by its TPM 2.0's endorsement key (EK). Its agent makes
//!   an attestation key (AK) in that TPM and asks for a challenge (`POST
//!   /machines/<name>/attestation`); the bootserver wraps a fresh secret to the EK, bound
//!   to the AK's name (TPM2_MakeCredential); only that TPM can unwrap it
//!   (TPM2_ActivateCredential), and only for that AK. The agent's credential request then
//!   carries the secret and a quote of its PCRs signed by the AK over a digest of the
//!   secret. No EK recorded, no attestation, another EK, a quote that does not verify or
//!   PCRs that match none of the boot's accepted measurements: no credentials.
//! - **`network`**: the weaker mode for machines without a TPM: what the bootserver saw of
//!   the machine on the provisioning network (its lease or PXE exchange, its link-layer
//!   address) and this boot's nonce or ticket. Chosen explicitly; a TPM-mode machine never
//!   falls back to it.
//!
//! Where the mode is set: a Machine's `spec.pxe.identity`, else its configuration version's
//! `template.identity`, else the bootserver's `identity.defaultMode`.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a machine proves who it is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IdentityMode {
    /// By its TPM 2.0's endorsement key, attested before anything is minted.
    Tpm,
    /// By what the bootserver saw of it on the provisioning network (no TPM).
    Network,
}

impl IdentityMode {
    /// The name as written in the resource.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tpm => "tpm",
            Self::Network => "network",
        }
    }
}

/// A machine's identity settings (`spec.pxe.identity` of a Machine, `template.identity` of
/// a MachineConfiguration; the Machine's fields win).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IdentitySpec {
    /// `tpm` or `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<IdentityMode>,
    /// The TPM's endorsement key, by its TPM name: `000b` and the SHA-256 of its public
    /// area, 68 hex digits (`tpm2_createek -c ek.ctx -G rsa && tpm2_readpublic -c ek.ctx`
    /// prints it as `name:`). Declared by the operator, learned at discovery, or recorded by
    /// the bootserver on first use where `trustOnFirstUse` allows. Only on a Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 68))]
    #[x_kube(validation = Rule::new("self.matches('^000[bB][0-9a-fA-F]{64}$')").message("endorsementKey must be a TPM name: 000b followed by 64 hex digits (tpm2_readpublic prints it)"))]
    pub endorsement_key: Option<String>,
    /// When no endorsement key is recorded, take the one of the first successful
    /// attestation and record it (trust on first use). Off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_on_first_use: Option<bool>,
}

impl IdentitySpec {
    /// This spec with `fallback`'s fields where it has none.
    pub fn or(&self, fallback: Option<&IdentitySpec>) -> IdentitySpec {
        let Some(fallback) = fallback else {
            return self.clone();
        };
        IdentitySpec {
            mode: self.mode.or(fallback.mode),
            endorsement_key: self
                .endorsement_key
                .clone()
                .or_else(|| fallback.endorsement_key.clone()),
            trust_on_first_use: self.trust_on_first_use.or(fallback.trust_on_first_use),
        }
    }
}

/// One set of PCR values (SHA-256 bank) a boot may show: PCR index (`"0"`…`"23"`) to its
/// value, 64 hex digits.
pub type PcrValues = BTreeMap<String, String>;

/// The schema of a list of [`PcrValues`]: at most 8 sets of 1 to 24 values, each 64 hex
/// digits (a pattern, not a CEL rule: cheap for the API server's cost budget), keyed by a
/// PCR index 0–23 (one small CEL rule over at most 24 keys).
pub fn measurements_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 8,
        "items": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 24,
            "additionalProperties": {
                "type": "string",
                "maxLength": 64,
                "pattern": "^[0-9a-fA-F]{64}$"
            },
            "x-kubernetes-validations": [{
                "rule": "self.all(k, k.matches('^([0-9]|1[0-9]|2[0-3])$'))",
                "message": "a measurement set is keyed by PCR index, 0 to 23"
            }]
        }
    })
}

/// What the agent sends for a challenge (`POST /machines/<name>/attestation`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestationRequest {
    /// The endorsement key's TPM2B_PUBLIC, hex.
    pub endorsement_key: String,
    /// The attestation key's TPM2B_PUBLIC, hex.
    pub attestation_key: String,
}

/// The bootserver's challenge: a credential only the machine's TPM can activate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttestationChallenge {
    /// What `tpm2_activatecredential -i` reads (tpm2-tools' header, the TPM2B_ID_OBJECT and
    /// the TPM2B_ENCRYPTED_SECRET), hex.
    pub credential: String,
    /// Seconds until the challenge expires.
    pub expires_in_seconds: u64,
}

/// The proof that comes with the first credential request of a TPM-mode boot.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestationProof {
    /// The activated secret, hex.
    pub secret: String,
    /// The quote's TPMS_ATTEST, hex; its qualifying data is the SHA-256 of the secret.
    pub quote: String,
    /// The quote's TPMT_SIGNATURE, hex.
    pub signature: String,
    /// The quoted PCR values (SHA-256 bank), by index.
    pub pcrs: PcrValues,
}

impl std::fmt::Debug for AttestationProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttestationProof")
            .field("secret", &"<redacted>")
            .field("pcrs", &self.pcrs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Lower-case hex, as TPM structures travel in JSON here.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from hex (either case); `None` when it is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The condition type the bootserver sets on a TPM-mode Machine.
pub const CONDITION_TPM_ATTESTED: &str = "TPMAttested";
