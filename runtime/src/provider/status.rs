//! The provider's part of a Machine's status (`status.power`, `status.addresses`, condition
//! `InfrastructureReady`, `DisksWiped` while it waits for a wipe, and a terminal failure),
//! written with server-side apply under its field manager.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, PowerState, condition};

use super::contract::{Observed, Provider, ProviderError, Step};
use super::pacing::LoopError;

/// Writes the provider's status fields: power and addresses when observed, the
/// `InfrastructureReady` condition (True once created; False with the error's reason while
/// creating fails, when the infrastructure is gone or on a terminal failure; unchanged when
/// only an observation fails otherwise, with power `Unknown`), and `failureReason` and
/// `failureMessage` on a terminal failure (left out otherwise, which clears them: the
/// provider's field manager owns them).
pub(super) async fn write_status<P: Provider>(
    client: &Client,
    machine: &Machine,
    observed: Option<&Observed>,
    failure: Option<(&ProviderError, Step)>,
) -> Result<(), LoopError> {
    let current = machine.status.clone().unwrap_or_default();
    let generation = machine.metadata.generation;
    let ready_now = condition::is_true(&current.conditions, conditions::INFRASTRUCTURE_READY);
    let mut status = serde_json::Map::new();
    let condition = match (observed, failure) {
        (Some(o), _) => Some(condition::new_condition(
            conditions::INFRASTRUCTURE_READY,
            true,
            "Provisioned",
            o.detail
                .clone()
                .unwrap_or_else(|| "the infrastructure is created and powered on".into()),
            generation,
        )),
        (None, Some((error, step))) if step == Step::Create || error.gone || error.terminal => {
            Some(condition::new_condition(
                conditions::INFRASTRUCTURE_READY,
                false,
                &error.reason,
                error.message.clone(),
                generation,
            ))
        }
        (None, _) if ready_now => {
            condition::find(&current.conditions, conditions::INFRASTRUCTURE_READY).cloned()
        }
        (None, _) => None,
    };
    if let Some(mut c) = condition {
        // Keep the transition time when the meaning did not change.
        if let Some(old) = condition::find(&current.conditions, &c.type_)
            && condition::same_meaning(old, &c)
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
        status.insert("conditions".into(), json!([c]));
    }
    if let Some((error, _)) = failure
        && error.terminal
    {
        status.insert("failureReason".into(), json!(error.reason));
        status.insert("failureMessage".into(), json!(error.message));
    }
    match observed {
        Some(o) => {
            status.insert("power".into(), json!(o.power));
            if !o.addresses.is_empty() {
                status.insert("addresses".into(), json!(o.addresses));
            }
        }
        None => {
            status.insert("power".into(), json!(PowerState::Unknown));
        }
    }
    apply_status::<P>(client, machine, status, "writing the status of").await
}

/// Writes the `DisksWiped` condition, with the provider's other status fields as they are
/// (with server-side apply, a field the manager leaves out is removed). Its transition
/// time is kept while its status does not change: the wait's timeout counts from it.
pub(super) async fn write_release_condition<P: Provider>(
    client: &Client,
    machine: &Machine,
    mut wanted: Condition,
) -> Result<(), LoopError> {
    let current = machine.status.clone().unwrap_or_default();
    if let Some(old) = condition::find(&current.conditions, conditions::DISKS_WIPED)
        && old.status == wanted.status
    {
        wanted.last_transition_time = old.last_transition_time.clone();
    }
    let mut list: Vec<Condition> =
        condition::find(&current.conditions, conditions::INFRASTRUCTURE_READY)
            .cloned()
            .into_iter()
            .collect();
    list.push(wanted);
    let mut status = serde_json::Map::new();
    status.insert("conditions".into(), json!(list));
    if let Some(power) = current.power {
        status.insert("power".into(), json!(power));
    }
    if !current.addresses.is_empty() {
        status.insert("addresses".into(), json!(current.addresses));
    }
    if let Some(reason) = &current.failure_reason {
        status.insert("failureReason".into(), json!(reason));
    }
    if let Some(message) = &current.failure_message {
        status.insert("failureMessage".into(), json!(message));
    }
    apply_status::<P>(client, machine, status, "writing DisksWiped on").await
}

/// Applies the provider's part of a Machine's status (server-side apply, its field manager).
async fn apply_status<P: Provider>(
    client: &Client,
    machine: &Machine,
    status: serde_json::Map<String, serde_json::Value>,
    action: &str,
) -> Result<(), LoopError> {
    let body = json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "status": status,
    });
    Api::<Machine>::all(client.clone())
        .patch_status(
            &machine.name_any(),
            &PatchParams::apply(P::FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(drop)
        .map_err(|source| LoopError::Kube {
            action: format!("{action} Machine {}", machine.name_any()),
            source,
        })
}
