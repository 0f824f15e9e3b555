//! A Machine's Node: which one it is, and the annotations that say what it runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use unbounded_api::well_known::{annotations, reasons};
use unbounded_api::{Machine, ResolvedConfiguration};

use crate::context::Context;
use crate::error::{Error, kube_err};

/// The Node of a Machine: by name (`spec.nodeName`, default the Machine's name), else by
/// `spec.providerID`; never one this controller deleted for a repave that the watch still
/// shows.
pub fn find_node(machine: &Machine, ctx: &Context) -> Option<Arc<Node>> {
    let by_name = ctx.nodes.get(&ObjectRef::new(&machine.node_name()));
    let node = by_name.or_else(|| {
        let provider_id = machine.spec.provider_id.as_deref()?;
        let name = ctx.node_index.read().with_provider_id(provider_id)?;
        ctx.nodes.get(&ObjectRef::new(&name))
    })?;
    let deleted = node.metadata.uid.as_ref().is_some_and(|uid| {
        ctx.expectations
            .read()
            .deleted_nodes
            .pending(uid, Instant::now())
    });
    (!deleted).then_some(node)
}

pub(super) fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Annotates the Node with its configuration and version unless it already is.
pub(super) async fn annotate_node(
    node: &Node,
    configuration: &ResolvedConfiguration,
    machine: &Machine,
    ctx: &Context,
) -> Result<(), Error> {
    let wanted: BTreeMap<&str, String> = BTreeMap::from([
        (
            annotations::MACHINE_CONFIGURATION,
            configuration.name.clone(),
        ),
        (
            annotations::MACHINE_CONFIGURATION_VERSION,
            configuration.version.to_string(),
        ),
        (annotations::MACHINE, machine.name_any()),
    ]);
    let current = node.annotations();
    if wanted.iter().all(|(k, v)| current.get(*k) == Some(v)) {
        return Ok(());
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let node_name = node.name_any();
    api.patch(
        &node_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": wanted}})),
    )
    .await
    .map_err(kube_err(format!("annotating Node {node_name}")))?;
    ctx.event(
        machine,
        EventType::Normal,
        reasons::NODE_ANNOTATED,
        format!(
            "annotated Node {node_name} with {} version {}",
            configuration.name, configuration.version
        ),
    )
    .await;
    Ok(())
}
