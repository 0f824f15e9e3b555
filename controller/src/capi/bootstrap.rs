//! The `UnboundedConfig` reconciler, the bootstrap side of the contract: resolves which
//! configuration version the Cluster API Machine's agent runs
//! ([`super::decide::resolve_configuration`]) and writes it into the bootstrap data Secret
//! (`<config name>`, owned by the UnboundedConfig, type `cluster.x-k8s.io/secret`).
//!
//! The Secret is written once: Cluster API makes a new Machine (and a new UnboundedConfig)
//! for a new version, and a Machine's configuration never changes behind its back.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::capi::{
    BootstrapInitialization, CLUSTER_NAME_LABEL, UnboundedConfig, UnboundedConfigStatus,
};
use unbounded_api::condition::{self, new_condition};
use unbounded_api::well_known::field_managers;

use super::decide::{self, conditions, conditions::reasons};
use super::objects;
use crate::context::Context;
use crate::error::{Error, kube_err};

/// How often an UnboundedConfig without a Secret looks again (a version may be made).
const UNRESOLVED_RECHECK: Duration = Duration::from_secs(10);

/// The Secret type Cluster API gives its bootstrap data.
const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// Reconciles one UnboundedConfig.
#[tracing::instrument(skip_all, fields(unbounded_config = %object.name_any()))]
pub async fn reconcile(object: Arc<UnboundedConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("capi-config");
    let namespace = object.namespace().unwrap_or_default();
    let generation = object.metadata.generation;
    let mut status = object.status.clone().unwrap_or_default();
    let owner = match objects::owning_machine(&object.metadata) {
        Some(name) => objects::read_machine(&ctx.client, &namespace, name).await?,
        None => None,
    };
    let cluster = objects::cluster_label(&object.metadata)
        .map(str::to_owned)
        .or_else(|| owner.as_ref().and_then(|o| o.cluster_name.clone()));
    let paused = objects::is_paused(&ctx.client, &object.metadata, cluster.as_deref()).await?;
    let set = |status: &mut UnboundedConfigStatus,
               type_: &str,
               ok: bool,
               reason: &str,
               message: String| {
        condition::set(
            &mut status.conditions,
            new_condition(type_, ok, reason, message, generation),
        );
    };
    condition::set(
        &mut status.conditions,
        decide::paused_condition(paused, generation),
    );
    let secret_made = status.data_secret_name.is_some();
    let action = match (&owner, paused || secret_made) {
        (_, true) => Action::requeue(ctx.settings.resync),
        (None, false) => {
            set(
                &mut status,
                conditions::READY,
                false,
                reasons::WAITING_FOR_OWNER,
                "no Cluster API Machine owns this UnboundedConfig yet".to_owned(),
            );
            Action::requeue(UNRESOLVED_RECHECK)
        }
        (Some(machine), false) => {
            let versions: Vec<_> = ctx
                .versions_of(&object.spec.configuration_ref.name)
                .iter()
                .map(|v| v.as_ref().clone())
                .collect();
            match decide::resolve_configuration(
                &object.spec.configuration_ref,
                machine.version.as_deref(),
                &versions,
            ) {
                Err(unresolved) => {
                    set(
                        &mut status,
                        conditions::CONFIGURATION_RESOLVED,
                        false,
                        unresolved.reason,
                        unresolved.message.clone(),
                    );
                    set(
                        &mut status,
                        conditions::READY,
                        false,
                        unresolved.reason,
                        unresolved.message,
                    );
                    Action::requeue(UNRESOLVED_RECHECK)
                }
                Ok(reference) => {
                    let version = reference.version.unwrap_or_default();
                    set(
                        &mut status,
                        conditions::CONFIGURATION_RESOLVED,
                        true,
                        conditions::CONFIGURATION_RESOLVED,
                        format!(
                            "{} v{version}{}",
                            reference.name,
                            machine
                                .version
                                .as_deref()
                                .map(|k| format!(" (Kubernetes {k})"))
                                .unwrap_or_default()
                        ),
                    );
                    match write_secret(&object, &reference, cluster.as_deref(), &ctx).await? {
                        Ok(name) => {
                            status.data_secret_name = Some(name);
                            status.initialization = Some(BootstrapInitialization {
                                data_secret_created: Some(true),
                            });
                            set(
                                &mut status,
                                conditions::READY,
                                true,
                                reasons::DATA_SECRET_CREATED,
                                String::new(),
                            );
                            Action::requeue(ctx.settings.resync)
                        }
                        Err(why) => {
                            set(
                                &mut status,
                                conditions::READY,
                                false,
                                reasons::SECRET_NAME_TAKEN,
                                why,
                            );
                            Action::requeue(UNRESOLVED_RECHECK)
                        }
                    }
                }
            }
        }
    };
    objects::write_status(
        &ctx.client,
        object.as_ref(),
        object.status.as_ref(),
        &status,
    )
    .await?;
    Ok(action)
}

/// Creates the data Secret, or finds the one this UnboundedConfig made before. `Err`
/// (inside `Ok`) when a Secret of that name exists and is someone else's.
async fn write_secret(
    object: &UnboundedConfig,
    reference: &unbounded_api::ConfigurationRef,
    cluster: Option<&str>,
    ctx: &Context,
) -> Result<Result<String, String>, Error> {
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut owner = object
        .controller_owner_ref(&())
        .into_iter()
        .collect::<Vec<_>>();
    for o in &mut owner {
        o.block_owner_deletion = Some(true);
    }
    let mut labels = json!({});
    if let Some(cluster) = cluster {
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
    }
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": owner},
        "type": SECRET_TYPE,
        "stringData": decide::bootstrap_data(reference),
    }))
    .map_err(|source| Error::Serialize {
        what: format!("Secret {namespace}/{name}"),
        source,
    })?;
    let params = PostParams {
        dry_run: false,
        field_manager: Some(field_managers::CONTROLLER.to_owned()),
    };
    match api.create(&params, &secret).await {
        Ok(_) => Ok(Ok(name)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(kube_err(format!("reading Secret {namespace}/{name}")))?;
            let ours = existing
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == object.metadata.uid.as_ref());
            Ok(if ours {
                Ok(name)
            } else {
                Err(format!(
                    "Secret {name} exists and is not this UnboundedConfig's"
                ))
            })
        }
        Err(e) => Err(kube_err(format!("creating Secret {namespace}/{name}"))(e)),
    }
}
