//! The `UnboundedCluster` reconciler: nothing is made for a Cluster (its machines join the
//! API server its `controlPlaneEndpoint` names), so it is provisioned once the endpoint is
//! set, and it offers the PXE inventory's failure domains ([`super::decide::failure_domains`]).

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use unbounded_api::MachineProvider;
use unbounded_api::capi::{MachineInitialization, UnboundedCluster};
use unbounded_api::condition::{self, new_condition};

use super::decide::{self, conditions, conditions::reasons};
use super::objects;
use crate::context::Context;
use crate::error::Error;

/// Reconciles one UnboundedCluster.
#[tracing::instrument(skip_all, fields(unbounded_cluster = %object.name_any()))]
pub async fn reconcile(object: Arc<UnboundedCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("capi-cluster");
    let generation = object.metadata.generation;
    let mut status = object.status.clone().unwrap_or_default();
    let paused = objects::is_paused(
        &ctx.client,
        &object.metadata,
        objects::cluster_label(&object.metadata),
    )
    .await?;
    condition::set(
        &mut status.conditions,
        decide::paused_condition(paused, generation),
    );
    if !paused {
        let endpoint = object.spec.control_plane_endpoint.is_some();
        let was = status
            .initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false);
        status.initialization = Some(MachineInitialization {
            provisioned: Some(was || endpoint),
        });
        let machines = ctx.machines.state();
        status.failure_domains = decide::failure_domains(
            machines
                .iter()
                .filter(|m| m.spec.provider == MachineProvider::Pxe)
                .filter_map(|m| m.metadata.labels.as_ref()),
        );
        let (reason, message) = if was || endpoint {
            (reasons::ENDPOINT_SET, String::new())
        } else {
            (
                reasons::WAITING_FOR_ENDPOINT,
                "spec.controlPlaneEndpoint is not set".to_owned(),
            )
        };
        condition::set(
            &mut status.conditions,
            new_condition(
                conditions::READY,
                was || endpoint,
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
    Ok(Action::requeue(ctx.settings.resync))
}
