//! The writes a MachinePool makes to its Machines: create and delete (azure, manual), claim
//! and release (pxe), keep them in step with the template, and request repaves. Each write
//! is remembered ([`crate::expectations::MemberExpectations`]) from before it is sent until
//! the Machine watch shows it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::well_known::{annotations, field_managers, labels, operations};
use unbounded_api::{Machine, MachinePool, MachineProvider, PowerState};

use crate::context::Context;
use crate::error::{Error, is_not_found, kube_err};
use crate::expectations::{Expectation, MemberChange, expecting};
use crate::repave;

/// The key of a pool's expectations.
pub fn owner_key(pool: &str) -> String {
    format!("pool/{pool}")
}

/// The pool as its Machines' controlling owner.
pub fn owner_reference(pool: &MachinePool) -> Option<OwnerReference> {
    let mut owner = pool.controller_owner_ref(&())?;
    owner.block_owner_deletion = Some(true);
    Some(owner)
}

/// Whether `machine` belongs to `pool`: its label names the pool and the pool is its
/// controlling owner (a label alone, set by someone else, does not make a member).
pub fn is_member(machine: &Machine, pool: &MachinePool) -> bool {
    let name = pool.name_any();
    machine.labels().get(labels::POOL) == Some(&name)
        && machine.owner_references().iter().any(|o| {
            o.controller == Some(true)
                && o.kind == "MachinePool"
                && Some(&o.uid) == pool.metadata.uid.as_ref()
        })
}

/// The labels every Machine of the pool carries.
pub fn member_labels(pool: &MachinePool) -> BTreeMap<String, String> {
    let mut all = pool
        .spec
        .template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    all.insert(labels::POOL.to_owned(), pool.name_any());
    all
}

fn template_annotations(pool: &MachinePool) -> BTreeMap<String, String> {
    pool.spec
        .template
        .metadata
        .as_ref()
        .map(|m| m.annotations.clone())
        .unwrap_or_default()
}

/// The name of the `index`-th Machine a pool creates.
pub fn machine_name(pool: &str, index: usize) -> String {
    format!("{pool}-{index}")
}

/// Creates a Machine from the template under a free `<pool>-<n>` name. Names are chosen
/// lowest first, so that a reconcile reading a cache that does not show its own creates yet
/// picks the same names and the API server refuses the duplicates (409).
pub async fn create(pool: &MachinePool, name: &str, ctx: &Context) -> Result<bool, Error> {
    let owner = owner_reference(pool);
    let spec = &pool.spec.template.spec;
    let mut machine_spec = json!({"provider": spec.provider});
    if let Some(azure) = &spec.azure {
        machine_spec["azure"] = json!(azure);
    }
    if let Some(reference) = &spec.configuration_ref {
        machine_spec["configurationRef"] = json!(reference);
    }
    let object: Machine = serde_json::from_value(json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "metadata": {
            "name": name,
            "labels": member_labels(pool),
            "annotations": template_annotations(pool),
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": machine_spec,
    }))
    .map_err(|source| Error::Serialize {
        what: format!("Machine {name}"),
        source,
    })?;
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let params = PostParams {
        dry_run: false,
        field_manager: Some(field_managers::pool(&pool.name_any())),
    };
    match expecting(
        &ctx.expectations,
        member(pool, name, MemberChange::Joined),
        api.create(&params, &object),
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(kube_err(format!("creating Machine {name}"))(e)),
    }
}

/// Claims a free PXE Machine: a server-side apply under the pool's own field manager of the
/// pool's label, its controlling ownerReference, the template's labels, annotations and
/// configurationRef, with the `resourceVersion` it was found free at. A second pool claiming
/// the same Machine conflicts on the label (another manager owns it with another value) or
/// on the resourceVersion, and moves on. A Machine found powered off is repaved with a
/// `pxeBoot` (it boots into the pool's configuration).
pub async fn claim(pool: &MachinePool, machine: &Machine, ctx: &Context) -> Result<bool, Error> {
    let name = machine.name_any();
    let now = Timestamp::now();
    let mut member_annotations = template_annotations(pool);
    member_annotations.insert(annotations::CLAIMED_AT.to_owned(), repave::format_time(now));
    let mut body = json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "metadata": {
            "name": name,
            "resourceVersion": machine.resource_version(),
            "labels": member_labels(pool),
            "annotations": member_annotations,
            "ownerReferences": owner_reference(pool).into_iter().collect::<Vec<_>>(),
        },
    });
    if let Some(reference) = &pool.spec.template.spec.configuration_ref {
        body["spec"] = json!({"configurationRef": reference});
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(&field_managers::pool(&pool.name_any()));
    let claimed = expecting(
        &ctx.expectations,
        member(pool, &name, MemberChange::Joined),
        api.patch(&name, &params, &Patch::Apply(&body)),
    )
    .await;
    match claimed {
        Ok(_) => {}
        // 409: another pool (or writer) got there first; 404: gone; 422: not a PXE Machine
        // any more, or changed so that the claim is invalid.
        Err(kube::Error::Api(s)) if [404, 409, 422].contains(&s.code) => {
            tracing::debug!(pool = %pool.name_any(), machine = %name, code = s.code, "claim lost");
            return Ok(false);
        }
        Err(e) => return Err(kube_err(format!("claiming Machine {name}"))(e)),
    }
    after_claim(machine, owner_key(&pool.name_any()), ctx).await?;
    Ok(true)
}

/// What follows a claim, a pool's or a Cluster API UnboundedMachine's (`owner`: the
/// expectations' key): a discovered Machine stops waiting (a merge patch, not part of the
/// claim's apply: discovery owns that label, and an apply of another value would
/// conflict; should this fail, a pool's [`sync`] flips it at its next pass), and one found
/// powered off is repaved with a `pxeBoot`, so that it boots into its new configuration.
pub async fn after_claim(machine: &Machine, owner: String, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    if let Some(patch) = claimed_discovery_patch(machine) {
        let api: Api<Machine> = Api::all(ctx.client.clone());
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "marking discovered Machine {name} claimed"
            )))?;
    }
    let powered_off = machine.status.as_ref().and_then(|s| s.power) == Some(PowerState::Off);
    if powered_off {
        repave::request(
            ctx,
            owner,
            &name,
            Some(operations::PXE_BOOT),
            Timestamp::now(),
        )
        .await?;
    }
    Ok(())
}

/// The merge patch that marks a discovered Machine claimed (label
/// `unbounded-cloud.io/discovery=claimed`), or `None` when it is not waiting.
pub fn claimed_discovery_patch(machine: &Machine) -> Option<Value> {
    unbounded_api::well_known::discovery::is_waiting(machine.labels()).then(|| {
        json!({"metadata": {"labels": {
            labels::DISCOVERY: unbounded_api::well_known::discovery::CLAIMED,
        }}})
    })
}

/// Releases a PXE Machine to the inventory: removes the pool's label, ownerReference,
/// claim time and what the template gave it (labels and annotations with the template's
/// values, configurationRef when it is the template's), and requests a repave followed by
/// `powerOff`, marked as a release (`unbounded-cloud.io/release`): the controller drains
/// the Node, has the agent wipe the disks under the releasing tenant's policy (the gate of
/// a deletion, [`crate::repave::act::drain_and_delete`]), then the PXE provider powers it
/// off and the Node is deleted (the Machine, unclaimed, records no configuration).
pub async fn release(pool: &MachinePool, machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    let now = Timestamp::now();
    let mut label_patch = serde_json::Map::new();
    label_patch.insert(labels::POOL.to_owned(), Value::Null);
    for (key, value) in member_labels(pool) {
        if machine.labels().get(&key) == Some(&value) {
            label_patch.insert(key, Value::Null);
        }
    }
    let mut annotation_patch = serde_json::Map::new();
    for (key, value) in template_annotations(pool) {
        if machine.annotations().get(&key) == Some(&value) {
            annotation_patch.insert(key, Value::Null);
        }
    }
    annotation_patch.extend(release_marks(now));
    let owners: Vec<&OwnerReference> = machine
        .owner_references()
        .iter()
        .filter(|o| Some(&o.uid) != pool.metadata.uid.as_ref())
        .collect();
    let mut patch = json!({
        "metadata": {
            "resourceVersion": machine.resource_version(),
            "labels": label_patch,
            "annotations": annotation_patch,
            "ownerReferences": owners,
        }
    });
    if machine.spec.configuration_ref.is_some()
        && machine.spec.configuration_ref == pool.spec.template.spec.configuration_ref
    {
        patch["spec"] = json!({"configurationRef": null});
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let released = expecting(
        &ctx.expectations,
        member(pool, &name, MemberChange::Left),
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match released {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Waiting(format!(
            "Machine {name} changed while being released"
        ))),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("releasing Machine {name}"))(e)),
    }
}

/// The annotations that release a claimed PXE Machine, a pool's or a Cluster API
/// UnboundedMachine's: its claim time gone, a repave followed by `powerOff` requested and
/// marked as a release, so that the power-off waits for the agent's wipe (the gate of a
/// deletion, [`crate::repave::act::drain_and_delete`]) and no one claims it meanwhile
/// ([`crate::pool::gather::is_free`] refuses a Machine with a repave pending).
pub fn release_marks(now: Timestamp) -> serde_json::Map<String, Value> {
    let mut marks = serde_json::Map::new();
    marks.insert(annotations::CLAIMED_AT.to_owned(), Value::Null);
    marks.insert(
        annotations::REPAVE.to_owned(),
        json!(repave::format_time(now)),
    );
    marks.insert(
        annotations::RELEASE.to_owned(),
        json!(repave::format_time(now)),
    );
    marks.insert(
        annotations::REPAVE_THEN.to_owned(),
        json!(operations::POWER_OFF),
    );
    marks
}

/// Deletes a Machine (its finalizer drains it and the provider releases its VM).
pub async fn delete(pool: &MachinePool, name: &str, ctx: &Context) -> Result<(), Error> {
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let deleted = expecting(
        &ctx.expectations,
        member(pool, name, MemberChange::Deleting),
        api.delete(name, &DeleteParams::default()),
    )
    .await;
    match deleted {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("deleting Machine {name}"))(e)),
    }
}

/// Requests a repave of a member ([`repave::request`]), now.
pub async fn request_repave(
    pool: &MachinePool,
    name: &str,
    then: Option<&str>,
    ctx: &Context,
) -> Result<(), Error> {
    let owner = owner_key(&pool.name_any());
    repave::request(ctx, owner, name, then, Timestamp::now()).await
}

/// Brings a member's labels, annotations and configurationRef in step with the template
/// (a merge patch of what differs; labels and annotations removed from the template stay
/// on Machines the pool created). Returns whether it wrote.
pub async fn sync(pool: &MachinePool, machine: &Machine, ctx: &Context) -> Result<bool, Error> {
    let mut label_patch = serde_json::Map::new();
    for (key, value) in member_labels(pool) {
        if machine.labels().get(&key) != Some(&value) {
            label_patch.insert(key, json!(value));
        }
    }
    // A member still marked waiting (its claim's flip failed) is claimed.
    if unbounded_api::well_known::discovery::is_waiting(machine.labels()) {
        label_patch.insert(
            labels::DISCOVERY.to_owned(),
            json!(unbounded_api::well_known::discovery::CLAIMED),
        );
    }
    let mut annotation_patch = serde_json::Map::new();
    for (key, value) in template_annotations(pool) {
        if machine.annotations().get(&key) != Some(&value) {
            annotation_patch.insert(key, json!(value));
        }
    }
    let wanted_ref = &pool.spec.template.spec.configuration_ref;
    let ref_differs = &machine.spec.configuration_ref != wanted_ref
        // A claimed Machine's own reference stays when the template names none.
        && (wanted_ref.is_some() || pool.spec.template.spec.provider != MachineProvider::Pxe);
    if label_patch.is_empty() && annotation_patch.is_empty() && !ref_differs {
        return Ok(false);
    }
    let mut patch = json!({"metadata": {"labels": label_patch, "annotations": annotation_patch}});
    if ref_differs {
        // A merge patch merges objects: an unset version must be written as null.
        patch["spec"] = match wanted_ref {
            Some(r) => json!({"configurationRef": {"name": r.name, "version": r.version}}),
            None => json!({"configurationRef": null}),
        };
    }
    let name = machine.name_any();
    let api: Api<Machine> = Api::all(ctx.client.clone());
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(kube_err(format!(
            "updating Machine {name} from its pool's template"
        ))(e)),
    }
}

/// The pool's expectation of its change of `machine`.
fn member(pool: &MachinePool, machine: &str, change: MemberChange) -> Expectation {
    Expectation::Member {
        owner: owner_key(&pool.name_any()),
        machine: machine.to_owned(),
        change,
    }
}
