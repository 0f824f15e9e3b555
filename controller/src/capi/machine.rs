//! The `UnboundedMachine` reconciler: claims (pxe) or creates (azure) the Unbounded Machine
//! of one Cluster API Machine, reports it in the contract's terms, and releases it when
//! deleted. Decisions are [`super::decide`]'s; this is the I/O around them.
//!
//! The claim is the pools' ([`crate::pool::act::claim`]): a server-side apply, under the
//! UnboundedMachine's own field manager, of the claim label with the `resourceVersion` the
//! Machine was found free at. Two claimants of one Machine (two UnboundedMachines, or one
//! and a pool) conflict, and the loser tries the next free Machine. A Machine is found by
//! its claim label (the UnboundedMachine's UID), never by a name that could be reused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::capi::{CLUSTER_NAME_LABEL, UnboundedMachine};
use unbounded_api::well_known::{annotations, field_managers, finalizers, labels};
use unbounded_api::{ConfigurationRef, Machine, MachineProvider};

use super::decide::{self, Bootstrap, MachineFacts, Step, conditions::reasons};
use super::objects;
use crate::context::Context;
use crate::error::{Error, is_not_found, kube_err};
use crate::expectations::{Expectation, MemberChange, expecting};
use crate::pool;

/// How often an UnboundedMachine that is not provisioned looks again without a trigger.
const PROVISIONING_RECHECK: Duration = Duration::from_secs(10);
/// Free Machines tried per pass when claims are lost to others.
const CLAIM_ATTEMPTS: usize = 5;

/// The expectations' key of an UnboundedMachine's writes to its Machine.
pub fn owner_key(uid: &str) -> String {
    format!("capi/{uid}")
}

/// Reconciles one UnboundedMachine.
#[tracing::instrument(skip_all, fields(unbounded_machine = %object.name_any()))]
pub async fn reconcile(object: Arc<UnboundedMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("capi-machine");
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<UnboundedMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, finalizers::CAPI_MACHINE, object, |event| async {
        match event {
            FinalizerEvent::Apply(object) => apply(&object, &ctx).await,
            FinalizerEvent::Cleanup(object) => cleanup(&object, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn uid(object: &UnboundedMachine) -> String {
    object.metadata.uid.clone().unwrap_or_default()
}

/// The Machine an UnboundedMachine claimed or created, as the cache shows it.
fn claimed_in_cache(object: &UnboundedMachine, ctx: &Context) -> Option<Arc<Machine>> {
    let selector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some([(labels::CAPI_MACHINE.to_owned(), uid(object))].into()),
        ..Default::default()
    };
    let names: Vec<String> = ctx
        .machine_index
        .read()
        .matching(Some(&selector))
        .into_iter()
        .map(str::to_owned)
        .collect();
    crate::members::machines_named(ctx, names.iter().map(String::as_str))
        .into_iter()
        .next()
}

async fn apply(object: &UnboundedMachine, ctx: &Context) -> Result<Action, Error> {
    let uid = uid(object);
    if ctx
        .expectations
        .read()
        .members
        .pending_for(&owner_key(&uid), Instant::now())
        > 0
    {
        // A claim the cache does not show yet: deciding now would claim a second Machine.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let namespace = object.namespace().unwrap_or_default();
    let owner_name = objects::owning_machine(&object.metadata).map(str::to_owned);
    let owner = match &owner_name {
        Some(name) => objects::read_machine(&ctx.client, &namespace, name).await?,
        None => None,
    };
    let cluster = objects::cluster_label(&object.metadata)
        .map(str::to_owned)
        .or_else(|| owner.as_ref().and_then(|o| o.cluster_name.clone()));
    let paused = objects::is_paused(&ctx.client, &object.metadata, cluster.as_deref()).await?;
    let bootstrap_data = match owner.as_ref().and_then(|o| o.data_secret_name.as_deref()) {
        Some(secret) => Some(read_bootstrap_secret(ctx, &namespace, secret).await?),
        None => None,
    };
    let bootstrap = match &bootstrap_data {
        None => Bootstrap::NotYet,
        Some(Ok(reference)) => Bootstrap::Ready(reference),
        Some(Err(why)) => Bootstrap::Invalid(why),
    };
    let claimed = claimed_in_cache(object, ctx);
    let facts = MachineFacts {
        paused,
        has_owner: owner.is_some(),
        bootstrap,
        claimed: claimed.as_deref(),
        provider_id: object.spec.provider_id.as_deref(),
        creates: object.spec.provider == MachineProvider::Azure,
    };
    let mut waiting = None;
    match decide::next_step(&facts) {
        Step::Paused | Step::Wait | Step::Report => {}
        Step::Claim(reference) => {
            waiting = claim(object, &reference, cluster.as_deref(), ctx).await?;
            if waiting.is_none() {
                // Claimed: the watch brings the Machine, and the next pass reports it.
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
        }
        Step::Create(reference) => {
            create(object, &reference, cluster.as_deref(), ctx).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Step::SetProviderId(id) => {
            set_provider_id(object, &id, ctx).await?;
            return Ok(Action::await_change());
        }
    }
    let status = decide::machine_status(
        &facts,
        object.status.as_ref(),
        waiting.as_ref().map(|(r, m)| (*r, m.clone())),
        object.metadata.generation,
    );
    objects::write_status(&ctx.client, object, object.status.as_ref(), &status).await?;
    let provisioned = status
        .initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        .unwrap_or(false);
    Ok(if provisioned || paused {
        Action::requeue(ctx.settings.resync)
    } else {
        Action::requeue(PROVISIONING_RECHECK)
    })
}

/// The configuration reference in the Cluster API Machine's bootstrap data Secret, or why
/// there is none to use (the reason goes into a condition; the Secret's content never
/// does).
async fn read_bootstrap_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Result<ConfigurationRef, String>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = api.get_opt(name).await.map_err(kube_err(format!(
        "reading bootstrap data Secret {namespace}/{name}"
    )))?;
    let Some(secret) = secret else {
        return Ok(Err(format!(
            "the bootstrap data Secret {name} does not exist"
        )));
    };
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| data.get(key).map(|ByteString(bytes)| bytes.as_slice());
    Ok(decide::read_bootstrap_data(field("format"), field("value")))
}

/// Claims the first free PXE Machine that will have it. Returns `None` once claimed, or the
/// reason and message it waits with.
async fn claim(
    object: &UnboundedMachine,
    reference: &ConfigurationRef,
    cluster: Option<&str>,
    ctx: &Context,
) -> Result<Option<(&'static str, String)>, Error> {
    let Some(pxe) = &object.spec.pxe else {
        return Ok(Some((
            reasons::NO_FREE_MACHINE,
            "spec.pxe is not set".to_owned(),
        )));
    };
    let free = pool::gather::free_inventory(
        ctx,
        &pxe.inventory_selector,
        pxe.hardware_requirements.as_ref(),
    );
    for machine in free.iter().take(CLAIM_ATTEMPTS) {
        if claim_one(object, machine, reference, cluster, ctx).await? {
            pool::act::after_claim(machine, owner_key(&uid(object)), ctx).await?;
            if decide::repave_on_claim(machine, reference) {
                // Warm, on another version: repaved onto the claimed one (its Node drained
                // and deleted, the agent paves it), provisioned only then.
                crate::repave::request(
                    ctx,
                    owner_key(&uid(object)),
                    &machine.name_any(),
                    None,
                    Timestamp::now(),
                )
                .await?;
            }
            tracing::info!(machine = %machine.name_any(), "claimed");
            ctx.event(
                object,
                EventType::Normal,
                reasons::CLAIMED,
                format!(
                    "claimed Machine {} for {} v{}",
                    machine.name_any(),
                    reference.name,
                    reference.version.unwrap_or_default()
                ),
            )
            .await;
            return Ok(None);
        }
    }
    let matching = ctx
        .machine_index
        .read()
        .matching(Some(&pxe.inventory_selector))
        .len();
    Ok(Some((
        reasons::NO_FREE_MACHINE,
        format!(
            "no free PXE Machine meets the selector and hardware requirements ({matching} match the selector, {} of them free and admitted)",
            free.len()
        ),
    )))
}

/// The claim labels and annotations an UnboundedMachine puts on its Machine.
fn claim_metadata(object: &UnboundedMachine, cluster: Option<&str>) -> (Value, Value) {
    let mut labels = json!({labels::CAPI_MACHINE: uid(object)});
    if let Some(cluster) = cluster {
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
    }
    let annotations = json!({
        annotations::CAPI_MACHINE: format!(
            "{}/{}",
            object.namespace().unwrap_or_default(),
            object.name_any()
        ),
        annotations::CLAIMED_AT: crate::repave::format_time(Timestamp::now()),
    });
    (labels, annotations)
}

/// One claim attempt; `false` when another claimant got there first (or the Machine
/// changed or went since the cache showed it free).
async fn claim_one(
    object: &UnboundedMachine,
    machine: &Machine,
    reference: &ConfigurationRef,
    cluster: Option<&str>,
    ctx: &Context,
) -> Result<bool, Error> {
    let name = machine.name_any();
    let (labels, annotations) = claim_metadata(object, cluster);
    let body = json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "metadata": {
            "name": name,
            "resourceVersion": machine.resource_version(),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"configurationRef": reference},
    });
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(&field_managers::capi_machine(&uid(object)));
    let claimed = expecting(
        &ctx.expectations,
        Expectation::Member {
            owner: owner_key(&uid(object)),
            machine: name.clone(),
            change: MemberChange::Joined,
        },
        api.patch(&name, &params, &Patch::Apply(&body)),
    )
    .await;
    match claimed {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if [404, 409, 422].contains(&s.code) => {
            tracing::debug!(machine = %name, code = s.code, "claim lost");
            Ok(false)
        }
        Err(e) => Err(kube_err(format!("claiming Machine {name}"))(e)),
    }
}

/// The name of the Azure Machine an UnboundedMachine creates: `<namespace>-<name>`, cut
/// to a Node name's 63 characters with its UID's start when longer.
pub fn azure_machine_name(namespace: &str, name: &str, uid: &str) -> String {
    let full = format!("{namespace}-{name}");
    if full.len() <= 63 {
        return full;
    }
    let suffix: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let head: String = full.chars().take(63 - 1 - suffix.len()).collect();
    format!("{}-{suffix}", head.trim_end_matches('-'))
}

async fn create(
    object: &UnboundedMachine,
    reference: &ConfigurationRef,
    cluster: Option<&str>,
    ctx: &Context,
) -> Result<(), Error> {
    let name = azure_machine_name(
        &object.namespace().unwrap_or_default(),
        &object.name_any(),
        &uid(object),
    );
    let (labels, annotations) = claim_metadata(object, cluster);
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"provider": "azure", "azure": object.spec.azure, "configurationRef": reference},
    }))
    .map_err(|source| Error::Serialize {
        what: format!("Machine {name}"),
        source,
    })?;
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let params = PostParams {
        dry_run: false,
        field_manager: Some(field_managers::capi_machine(&uid(object))),
    };
    let created = expecting(
        &ctx.expectations,
        Expectation::Member {
            owner: owner_key(&uid(object)),
            machine: name.clone(),
            change: MemberChange::Joined,
        },
        api.create(&params, &machine),
    )
    .await;
    match created {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Waiting(format!(
            "a Machine named {name} exists and is not this UnboundedMachine's"
        ))),
        Err(e) => Err(kube_err(format!("creating Machine {name}"))(e)),
    }
}

async fn set_provider_id(object: &UnboundedMachine, id: &str, ctx: &Context) -> Result<(), Error> {
    let api: Api<UnboundedMachine> =
        Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
    let patch = json!({"spec": {"providerID": id}});
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(kube_err(format!(
        "setting the provider ID of UnboundedMachine {}",
        object.name_any()
    )))?;
    Ok(())
}

/// Releases (pxe) or deletes (azure) the Machine, found by its claim label in the API (not
/// the cache: a claim the cache does not show yet must not be left behind). A Machine that
/// is gone is nothing to wait for. A paused object is left as it is.
async fn cleanup(object: &UnboundedMachine, ctx: &Context) -> Result<Action, Error> {
    let cluster = objects::cluster_label(&object.metadata);
    if objects::is_paused(&ctx.client, &object.metadata, cluster).await? {
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let selector = format!("{}={}", labels::CAPI_MACHINE, uid(object));
    let claimed = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_err(format!(
            "listing the Machines of UnboundedMachine {}",
            object.name_any()
        )))?;
    let mut waiting = Vec::new();
    for machine in &claimed.items {
        match machine.spec.provider {
            MachineProvider::Pxe => release(object, machine, ctx).await?,
            _ => {
                delete(machine, ctx).await?;
                waiting.push(machine.name_any());
            }
        }
    }
    if !waiting.is_empty() {
        return Err(Error::Waiting(format!(
            "Machine {} is being deleted",
            waiting.join(", ")
        )));
    }
    Ok(Action::await_change())
}

/// Gives a claimed PXE Machine back to the inventory: the claim and what came with it
/// removed, a release repave requested ([`pool::act::release_marks`]): drained, wiped as
/// its configuration says, powered off, and only then free again.
async fn release(object: &UnboundedMachine, machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    let mut annotation_patch = pool::act::release_marks(Timestamp::now());
    annotation_patch.insert(annotations::CAPI_MACHINE.to_owned(), Value::Null);
    let mut label_patch = serde_json::Map::new();
    label_patch.insert(labels::CAPI_MACHINE.to_owned(), Value::Null);
    if machine.labels().get(CLUSTER_NAME_LABEL)
        == objects::cluster_label(&object.metadata)
            .map(str::to_owned)
            .as_ref()
    {
        label_patch.insert(CLUSTER_NAME_LABEL.to_owned(), Value::Null);
    }
    let patch = json!({
        "metadata": {
            "resourceVersion": machine.resource_version(),
            "labels": label_patch,
            "annotations": annotation_patch,
        },
        "spec": {"configurationRef": null},
    });
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let released = expecting(
        &ctx.expectations,
        Expectation::Member {
            owner: owner_key(&uid(object)),
            machine: name.clone(),
            change: MemberChange::Left,
        },
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match released {
        Ok(_) => {
            tracing::info!(machine = %name, "released: wiped and powered off before it is free again");
            ctx.event(
                object,
                EventType::Normal,
                reasons::RELEASED,
                format!("released Machine {name}: drained, wiped and powered off before it is free again"),
            )
            .await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Waiting(format!(
            "Machine {name} changed while being released"
        ))),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("releasing Machine {name}"))(e)),
    }
}

async fn delete(machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    if machine.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("deleting Machine {name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_machine_names_fit_a_node_name() {
        assert_eq!(
            azure_machine_name("tenant-a", "md-0-x7k", "1234"),
            "tenant-a-md-0-x7k"
        );
        let long = azure_machine_name(
            "a-very-long-namespace-name-for-tenants",
            "cluster-one-md-0-abcdefgh-xyz12",
            "0f3c9a4e-7b2d-4c1e-9f00-123456789abc",
        );
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-0f3c9a4e"), "{long}");
    }
}
