//! `spec.providerID`: recorded from what the provider observed when unset, a terminal
//! failure when it names other infrastructure (it is immutable once set).

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use unbounded_api::Machine;

use super::contract::{Observed, Provider, ProviderError};

/// What to do with `spec.providerID` after an observation (a pure decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderIdAction {
    /// Nothing to record, or already recorded.
    Keep,
    /// Record this one.
    Record(String),
    /// `spec.providerID` names other infrastructure (it is immutable once set).
    Mismatch {
        /// What the Machine says.
        recorded: String,
        /// What the provider found.
        observed: String,
    },
}

/// Decides what to do with `spec.providerID` given what the provider observed.
pub fn provider_id_action(recorded: Option<&str>, observed: Option<&str>) -> ProviderIdAction {
    match (recorded, observed) {
        (_, None) => ProviderIdAction::Keep,
        (None, Some(id)) => ProviderIdAction::Record(id.to_owned()),
        (Some(r), Some(o)) if r == o => ProviderIdAction::Keep,
        (Some(r), Some(o)) => ProviderIdAction::Mismatch {
            recorded: r.to_owned(),
            observed: o.to_owned(),
        },
    }
}

/// Records the observed provider ID in `spec.providerID` (server-side apply under the
/// provider's field manager), or fails when the Machine names other infrastructure.
pub(super) async fn record_provider_id<P: Provider>(
    client: &Client,
    machine: &Machine,
    observed: &Observed,
) -> Result<(), ProviderError> {
    match provider_id_action(
        machine.spec.provider_id.as_deref(),
        observed.provider_id.as_deref(),
    ) {
        ProviderIdAction::Keep => Ok(()),
        ProviderIdAction::Mismatch { recorded, observed } => Err(ProviderError::terminal(
            "ProviderIDMismatch",
            format!(
                "spec.providerID is {recorded} but the provider's infrastructure is {observed}; \
                 spec.providerID is immutable: delete and recreate the Machine"
            ),
        )),
        ProviderIdAction::Record(id) => {
            let body = json!({
                "apiVersion": Machine::api_version(&()),
                "kind": Machine::kind(&()),
                "spec": {"providerID": id},
            });
            Api::<Machine>::all(client.clone())
                .patch(
                    &machine.name_any(),
                    &PatchParams::apply(P::FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map(drop)
                .map_err(|e| {
                    ProviderError::new(
                        "ProviderIDNotRecorded",
                        format!("recording spec.providerID {id}: {e}"),
                    )
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_id_table() {
        use ProviderIdAction::*;
        let cases = [
            (None, None, Keep),
            (Some("azure:///a"), None, Keep),
            (None, Some("azure:///a"), Record("azure:///a".into())),
            (Some("azure:///a"), Some("azure:///a"), Keep),
            (
                Some("azure:///a"),
                Some("azure:///b"),
                Mismatch {
                    recorded: "azure:///a".into(),
                    observed: "azure:///b".into(),
                },
            ),
        ];
        for (recorded, observed, expected) in cases {
            assert_eq!(
                provider_id_action(recorded, observed),
                expected,
                "{recorded:?} {observed:?}"
            );
        }
    }
}
