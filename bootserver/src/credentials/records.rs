//! What an attestation leaves on the Machine: the endorsement key recorded on first use
//! (`spec.pxe.identity.endorsementKey`), and the `TPMAttested` condition, applied with the
//! bootserver's own field manager so that the controller's conditions are left alone.

use kube::api::{Api, Patch, PatchParams};
use unbounded_api::identity::CONDITION_TPM_ATTESTED;

use super::attestation::{AttestationRefusal, Attested};
use super::{IssueError, Issuer};

/// The indices of the PCRs that hold a measurement (not all zeros), as `0 1 2 4`: what the
/// firmware and boot loader measured on this machine's path.
fn measured(pcrs: &std::collections::BTreeMap<u8, Vec<u8>>) -> String {
    let list: Vec<String> = pcrs
        .iter()
        .filter(|(_, v)| v.iter().any(|b| *b != 0))
        .map(|(i, _)| i.to_string())
        .collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(" ")
    }
}

/// The field manager of the `TPMAttested` condition.
const FIELD_MANAGER: &str = "unbounded-bootserver-identity";

impl Issuer {
    /// Records `endorsement_key` on `machine` where none is recorded yet (trust on first
    /// use), bound to the resourceVersion read: an operator's concurrent change wins, and
    /// then this attestation is refused (the agent attests again against the new value).
    pub(super) async fn record_endorsement_key(
        &self,
        machine: &str,
        endorsement_key: &str,
    ) -> Result<(), IssueError> {
        let api = Api::<unbounded_api::Machine>::all(self.client.clone());
        let current = api.get(machine).await.map_err(IssueError::Kube)?;
        let recorded = current
            .spec
            .pxe
            .as_ref()
            .and_then(|p| p.identity.as_ref())
            .and_then(|i| i.endorsement_key.clone());
        if let Some(recorded) = recorded {
            return if recorded.eq_ignore_ascii_case(endorsement_key) {
                Ok(())
            } else {
                Err(IssueError::Attestation(
                    AttestationRefusal::EndorsementKeyMismatch {
                        presented: endorsement_key.to_owned(),
                        recorded,
                    },
                ))
            };
        }
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "spec": { "pxe": { "identity": { "endorsementKey": endorsement_key } } },
        });
        api.patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(IssueError::Kube)?;
        tracing::info!(
            machine,
            endorsement_key,
            "recorded the TPM's endorsement key on first use"
        );
        Ok(())
    }

    /// Sets the Machine's `TPMAttested` condition (in the background: the answer to the
    /// agent does not wait for it).
    pub(super) fn record_attestation(
        &self,
        machine: &str,
        outcome: Result<&Attested, &AttestationRefusal>,
    ) {
        let condition = match outcome {
            Ok(attested) => unbounded_api::condition::new_condition(
                CONDITION_TPM_ATTESTED,
                true,
                "Attested",
                format!(
                    "the TPM with endorsement key {} attested this boot; PCRs quoted: {}, of which measured (not zero): {}",
                    attested.endorsement_key,
                    attested.pcrs.len(),
                    measured(&attested.pcrs)
                ),
                None,
            ),
            Err(refusal) => unbounded_api::condition::new_condition(
                CONDITION_TPM_ATTESTED,
                false,
                refusal.reason(),
                refusal.to_string(),
                None,
            ),
        };
        match outcome {
            Err(refusal) => {
                tracing::warn!(machine, reason = refusal.reason(), %refusal, "TPM attestation refused");
            }
            // The values an operator lists in `boot.measurements` (no secret: a PCR is a
            // public digest of what was measured).
            Ok(attested) => {
                let pcrs: Vec<String> = attested
                    .pcrs
                    .iter()
                    .map(|(i, v)| format!("{i}={}", crate::identity::tpm::hex(v)))
                    .collect();
                tracing::info!(machine, pcrs = %pcrs.join(" "), "TPM attestation: quoted PCRs");
            }
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let api = Api::<unbounded_api::Machine>::all(self.client.clone());
        let machine = machine.to_owned();
        runtime.spawn(async move {
            let patch = serde_json::json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1",
                "kind": "Machine",
                "status": { "conditions": [condition] },
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            if let Err(error) = api
                .patch_status(&machine, &params, &Patch::Apply(&patch))
                .await
            {
                tracing::warn!(machine, %error, "could not set the TPMAttested condition");
            }
        });
    }
}
