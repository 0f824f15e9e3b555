//! The MachineConfiguration reconciler: keeps its MachineConfigurationVersions in step with
//! its template ([`crate::versioning`]), counts the Machines that reference each version,
//! guards referenced versions with a finalizer, prunes old ones, and reports it all in the
//! configuration's status ([`status`]).

pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::well_known::{field_managers, finalizers, labels, reasons};
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, VersionSummary, version_name,
};

use crate::context::Context;
use crate::error::{Error, is_not_found, kube_err};
use crate::expectations::{Expectation, expecting};
use crate::versioning::{self, ExistingVersion, VersionAction};
use status::{StatusPlan, write_status};

/// Reconciles one MachineConfiguration.
#[tracing::instrument(skip_all, fields(configuration = %configuration.name_any()))]
pub async fn reconcile(
    configuration: Arc<MachineConfiguration>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("configuration");
    if configuration.metadata.deletion_timestamp.is_some() {
        // Its versions go with it through their ownerReference (garbage collection); the
        // admission policy keeps referenced ones until no Machine uses them.
        Ok(Action::await_change())
    } else {
        apply(&configuration, &ctx).await
    }
}

/// For each version number of `configuration`, how many Machines reference it: the version
/// they were provisioned with (`status.configuration`) or the one they pin
/// (`spec.configurationRef.version`, which a repave will apply). The definition of the
/// counts; the controller keeps the same counts incrementally in
/// [`crate::index::machines::MachineIndex`] rather than scanning every Machine.
pub fn machine_counts(configuration: &str, machines: &[Arc<Machine>]) -> BTreeMap<i64, i64> {
    let mut counts = BTreeMap::new();
    for machine in machines {
        let mut versions = BTreeSet::new();
        if let Some(c) = machine
            .status
            .as_ref()
            .and_then(|s| s.configuration.as_ref())
            && c.name == configuration
        {
            versions.insert(c.version);
        }
        if let Some(r) = &machine.spec.configuration_ref
            && r.name == configuration
            && let Some(v) = r.version
        {
            versions.insert(v);
        }
        for v in versions {
            *counts.entry(v).or_insert(0) += 1;
        }
    }
    counts
}

async fn apply(configuration: &MachineConfiguration, ctx: &Context) -> Result<Action, Error> {
    let name = configuration.name_any();
    let versions = ctx.versions_of(&name);
    let seen: Vec<i64> = versions.iter().map(|v| v.spec.version).collect();
    let unseen = ctx
        .expectations
        .read()
        .unseen_versions_of(&name, &seen, Instant::now());
    if !unseen.is_empty() {
        // The cache has not shown a version this controller just created: deciding now
        // would take it for deleted and create it again under the next number.
        tracing::debug!(configuration = %name, ?unseen, "waiting for the watch to show new versions");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let recorded_latest = configuration
        .status
        .as_ref()
        .map_or(0, |s| s.latest_version);
    let existing: Vec<ExistingVersion<'_>> = versions
        .iter()
        .map(|v| ExistingVersion {
            version: v.spec.version,
            deployed: v.status.as_ref().is_some_and(|s| s.deployed),
            template: &v.spec.template,
        })
        .collect();
    // The status below is written only over the configuration as read (or as this
    // reconcile changed it): a stale copy must not roll latestVersion back.
    let mut resource_version = configuration.resource_version();
    let action =
        versioning::next_version_action(&configuration.spec.template, recorded_latest, &existing);
    let mut latest = versioning::latest_version(recorded_latest, &existing);

    match action {
        VersionAction::UpToDate => {}
        VersionAction::Create { version } => {
            expecting(
                &ctx.expectations,
                Expectation::CreatedVersion {
                    configuration: name.clone(),
                    version,
                },
                write_version(configuration, version, ctx),
            )
            .await?;
            latest = latest.max(version);
            // Record the number at once, so that it is never handed out again.
            resource_version = write_latest(configuration, latest, ctx).await?;
            ctx.event(
                configuration,
                EventType::Normal,
                reasons::VERSION_CREATED,
                format!(
                    "created {} (version {version})",
                    version_name(&name, version)
                ),
            )
            .await;
        }
        VersionAction::UpdateNewest { version } => {
            write_version(configuration, version, ctx).await?;
            ctx.event(
                configuration,
                EventType::Normal,
                reasons::VERSION_UPDATED,
                format!(
                    "copied the changed template into {} (not deployed yet)",
                    version_name(&name, version)
                ),
            )
            .await;
        }
    }

    let counts = ctx.machine_index.read().counts_of(&name);
    for version in &versions {
        sync_version_usage(
            version,
            counts.get(&version.spec.version).copied().unwrap_or(0),
            ctx,
        )
        .await?;
    }

    let mut summaries: Vec<VersionSummary> = versions
        .iter()
        .map(|v| VersionSummary {
            name: v.name_any(),
            version: v.spec.version,
            deployed: v.status.as_ref().is_some_and(|s| s.deployed),
            machine_count: counts.get(&v.spec.version).copied().unwrap_or(0),
        })
        .collect();
    if let VersionAction::Create { version } = action
        && !summaries.iter().any(|s| s.version == version)
    {
        summaries.push(VersionSummary {
            name: version_name(&name, version),
            version,
            deployed: false,
            machine_count: counts.get(&version).copied().unwrap_or(0),
        });
    }

    // Prune only after latestVersion is recorded, so that a deleted number is never reused.
    let referenced: BTreeSet<i64> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(v, _)| *v)
        .collect();
    let numbers: Vec<i64> = summaries.iter().map(|s| s.version).collect();
    let prune = versioning::versions_to_prune(
        &numbers,
        &referenced,
        configuration.spec.revision_history_limit(),
    );
    let rollout = crate::rolling::roll(configuration, ctx).await?;
    write_status(
        configuration,
        resource_version.as_deref(),
        StatusPlan {
            latest,
            versions: summaries
                .into_iter()
                .filter(|s| !prune.contains(&s.version))
                .collect(),
            rollout: rollout.as_ref(),
        },
        ctx,
    )
    .await?;
    for version in prune {
        let version_object = version_name(&name, version);
        let api: Api<MachineConfigurationVersion> = Api::all(ctx.client.clone());
        match api.delete(&version_object, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.event(
                    configuration,
                    EventType::Normal,
                    reasons::VERSION_PRUNED,
                    format!(
                        "deleted {version_object}: revisionHistoryLimit is {}",
                        configuration.spec.revision_history_limit()
                    ),
                )
                .await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(kube_err(format!("pruning {version_object}"))(e)),
        }
    }
    let wait = rollout
        .and_then(|r| r.recheck)
        .map_or(ctx.settings.resync, |r| {
            (r + Duration::from_secs(1)).min(ctx.settings.resync)
        });
    Ok(Action::requeue(wait))
}

/// Creates or updates version `version` with the configuration's template (server-side
/// apply under the controller's field manager). Applying a deployed version's spec is
/// refused by the CRD's transition rule, which makes the next reconcile create a new one.
async fn write_version(
    configuration: &MachineConfiguration,
    version: i64,
    ctx: &Context,
) -> Result<(), Error> {
    let name = configuration.name_any();
    let object_name = version_name(&name, version);
    let owner = configuration
        .controller_owner_ref(&())
        .map(|o| json!([o]))
        .unwrap_or(json!([]));
    let body = json!({
        "apiVersion": MachineConfigurationVersion::api_version(&()),
        "kind": MachineConfigurationVersion::kind(&()),
        "metadata": {
            "name": object_name,
            "labels": {labels::CONFIGURATION: name},
            "ownerReferences": owner,
        },
        "spec": {
            "configurationName": name,
            "version": version,
            "template": configuration.spec.template,
        },
    });
    let api: Api<MachineConfigurationVersion> = Api::all(ctx.client.clone());
    api.patch(
        &object_name,
        &PatchParams::apply(field_managers::CONTROLLER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(kube_err(format!("writing {object_name}")))?;
    Ok(())
}

async fn write_latest(
    configuration: &MachineConfiguration,
    latest: i64,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let api: Api<MachineConfiguration> = Api::all(ctx.client.clone());
    let written = api
        .patch_status(
            &configuration.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"latestVersion": latest}})),
        )
        .await
        .map_err(kube_err(format!(
            "recording latestVersion of {}",
            configuration.name_any()
        )))?;
    Ok(written.resource_version())
}

/// Keeps a version's `status.machineCount` and its in-use finalizer in step with the count.
async fn sync_version_usage(
    version: &MachineConfigurationVersion,
    count: i64,
    ctx: &Context,
) -> Result<(), Error> {
    let name = version.name_any();
    let api: Api<MachineConfigurationVersion> = Api::all(ctx.client.clone());
    let has_finalizer = version
        .finalizers()
        .iter()
        .any(|f| f == finalizers::VERSION_IN_USE);
    if count > 0 && !has_finalizer {
        let mut list = version.finalizers().to_vec();
        list.push(finalizers::VERSION_IN_USE.to_owned());
        patch_finalizers(&api, &name, version, list).await?;
    }
    let recorded = version.status.as_ref().map_or(0, |s| s.machine_count);
    if recorded != count {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"machineCount": count}})),
        )
        .await
        .map_err(kube_err(format!("recording the machine count of {name}")))?;
    }
    if count == 0 && has_finalizer {
        let list = version
            .finalizers()
            .iter()
            .filter(|f| f.as_str() != finalizers::VERSION_IN_USE)
            .cloned()
            .collect();
        patch_finalizers(&api, &name, version, list).await?;
    }
    Ok(())
}

/// Replaces the finalizer list, guarded by the resourceVersion it was computed from so that
/// another writer's finalizer is never dropped.
async fn patch_finalizers(
    api: &Api<MachineConfigurationVersion>,
    name: &str,
    version: &MachineConfigurationVersion,
    list: Vec<String>,
) -> Result<(), Error> {
    let patch = json!({
        "metadata": {"resourceVersion": version.resource_version(), "finalizers": list}
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(kube_err(format!("updating the finalizers of {name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::{
        ConfigurationRef, MachineProvider, MachineSpec, MachineStatus, ResolvedConfiguration,
    };

    fn machine(recorded: Option<(&str, i64)>, pinned: Option<(&str, Option<i64>)>) -> Arc<Machine> {
        let mut m = Machine::new(
            "m",
            MachineSpec {
                provider: MachineProvider::Manual,
                pxe: None,
                azure: None,
                configuration_ref: pinned.map(|(name, version)| ConfigurationRef {
                    name: name.into(),
                    version,
                }),
                provider_id: None,
                node_name: None,
            },
        );
        m.status = Some(MachineStatus {
            configuration: recorded.map(|(name, version)| ResolvedConfiguration {
                name: name.into(),
                version,
            }),
            ..MachineStatus::default()
        });
        Arc::new(m)
    }

    #[test]
    fn machine_counts_table() {
        let machines = vec![
            machine(Some(("a", 1)), None),
            machine(Some(("a", 1)), Some(("a", Some(1)))),
            machine(Some(("a", 2)), Some(("a", Some(1)))),
            machine(Some(("b", 1)), None),
            machine(None, Some(("a", None))),
            machine(None, Some(("a", Some(3)))),
        ];
        let counts = machine_counts("a", &machines);
        // v1: two provisioned with it + one pinning it for its next repave.
        assert_eq!(counts, BTreeMap::from([(1, 3), (2, 1), (3, 1)]));
        assert_eq!(machine_counts("b", &machines), BTreeMap::from([(1, 1)]));
        assert!(machine_counts("c", &machines).is_empty());
    }
}
