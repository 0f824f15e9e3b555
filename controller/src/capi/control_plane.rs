//! The `UnboundedControlPlane` reconciler: the control plane a Cluster's Unbounded machines
//! join already runs, so there is nothing to make. It is initialized once Cluster API can
//! reach it, that is once the Cluster's `<cluster>-kubeconfig` Secret exists (the operator
//! provides it: docs/cluster-api.md says with which rights), and it reports the version
//! the API server it talks to runs.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use unbounded_api::capi::{ControlPlaneInitialization, UnboundedControlPlane};
use unbounded_api::condition::{self, new_condition};

use super::decide::{self, conditions, conditions::reasons};
use super::objects;
use crate::context::Context;
use crate::error::{Error, kube_err};

/// How often a control plane without its kubeconfig Secret looks again.
const WAITING_RECHECK: Duration = Duration::from_secs(10);

/// The Cluster an object belongs to: its cluster-name label, else its owning Cluster.
fn cluster_of(object: &UnboundedControlPlane) -> Option<String> {
    objects::cluster_label(&object.metadata)
        .map(str::to_owned)
        .or_else(|| {
            object.owner_references().iter().find_map(|o| {
                let group = o.api_version.split('/').next().unwrap_or_default();
                (o.kind == "Cluster" && group == objects::CAPI_GROUP).then(|| o.name.clone())
            })
        })
}

/// Reconciles one UnboundedControlPlane.
#[tracing::instrument(skip_all, fields(unbounded_control_plane = %object.name_any()))]
pub async fn reconcile(
    object: Arc<UnboundedControlPlane>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("capi-control-plane");
    let generation = object.metadata.generation;
    let namespace = object.namespace().unwrap_or_default();
    let cluster = cluster_of(&object);
    let mut status = object.status.clone().unwrap_or_default();
    let paused = objects::is_paused(&ctx.client, &object.metadata, cluster.as_deref()).await?;
    condition::set(
        &mut status.conditions,
        decide::paused_condition(paused, generation),
    );
    let mut action = Action::requeue(ctx.settings.resync);
    if !paused {
        let kubeconfig = match &cluster {
            Some(cluster) => {
                let name = format!("{cluster}-kubeconfig");
                let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
                let found = api
                    .get_metadata_opt(&name)
                    .await
                    .map_err(kube_err(format!("reading Secret {namespace}/{name}")))?;
                Ok(found.map(|_| name.clone()).ok_or(name))
            }
            None => Err(String::new()),
        };
        let was = status
            .initialization
            .as_ref()
            .and_then(|i| i.control_plane_initialized)
            .unwrap_or(false);
        let initialized = was || kubeconfig.is_ok();
        status.initialization = Some(ControlPlaneInitialization {
            control_plane_initialized: Some(initialized),
        });
        if let Ok(info) = ctx.client.apiserver_version().await {
            status.version = Some(info.git_version);
        }
        let (reason, message) = match &kubeconfig {
            Ok(_) => (reasons::KUBECONFIG_FOUND, String::new()),
            Err(name) if name.is_empty() => (
                reasons::WAITING_FOR_KUBECONFIG,
                "no Cluster names this control plane yet (no cluster.x-k8s.io/cluster-name label or owning Cluster)".to_owned(),
            ),
            Err(name) => (
                reasons::WAITING_FOR_KUBECONFIG,
                format!("Secret {name} (the Cluster's kubeconfig, type cluster.x-k8s.io/secret) does not exist"),
            ),
        };
        if kubeconfig.is_err() {
            action = Action::requeue(WAITING_RECHECK);
        }
        condition::set(
            &mut status.conditions,
            new_condition(
                conditions::AVAILABLE,
                kubeconfig.is_ok(),
                reason,
                message,
                generation,
            ),
        );
    }
    objects::write_status(
        &ctx.client,
        object.as_ref(),
        object.status.as_ref(),
        &status,
    )
    .await?;
    Ok(action)
}
