//! Reads what rollout and pool decisions need about a Machine out of the stores: the
//! version it resolves to now, its Node, and the facts of [`crate::rollout::Member`] and
//! [`crate::pool::health::HealthFacts`]. Lookups by name and through the indexes only.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use unbounded_api::condition;
use unbounded_api::well_known::{annotations, conditions};
use unbounded_api::{ConfigurationRef, Machine, MachinePhase, ResolvedConfiguration};

use crate::context::Context;
use crate::index::catalog::OwnedCandidate;
use crate::pool::health::HealthFacts;
use crate::repave;
use crate::rollout::Member;
use crate::selection::{self, Resolution};

/// What a Machine with these labels and this reference resolves to now.
pub fn resolve_target(
    ctx: &Context,
    labels: &BTreeMap<String, String>,
    reference: Option<&ConfigurationRef>,
) -> Resolution {
    let owned = ctx
        .catalog
        .read()
        .candidates_for(labels, reference.map(|r| r.name.as_str()));
    let candidates: Vec<_> = owned.iter().map(OwnedCandidate::borrowed).collect();
    selection::resolve(labels, reference, &candidates)
}

/// The resolved version, if selection resolves one.
pub fn resolved(resolution: &Resolution) -> Option<ResolvedConfiguration> {
    match resolution {
        Resolution::Resolved {
            configuration,
            version,
        } => Some(ResolvedConfiguration {
            name: configuration.clone(),
            version: *version,
        }),
        _ => None,
    }
}

/// The Ready condition of a Node: status and since when.
pub fn node_ready(node: &Node) -> Option<(String, Timestamp)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            (
                c.status.clone(),
                c.last_transition_time
                    .as_ref()
                    .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            )
        })
}

/// Everything known about one Machine of a group.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The rollout's view.
    pub member: Member,
    /// Remediation's view.
    pub health: HealthFacts,
    /// What it records.
    pub recorded: Option<ResolvedConfiguration>,
    /// What it resolves to.
    pub target: Option<ResolvedConfiguration>,
    /// It records what it resolves to.
    pub updated: bool,
}

/// Builds the facts of `machine`, which resolves to `target`.
pub fn facts_of(ctx: &Context, machine: &Machine, target: Option<ResolvedConfiguration>) -> Facts {
    let status = machine.status.clone().unwrap_or_default();
    let node = crate::machine::find_node(machine, ctx);
    let ready_condition = node.as_deref().and_then(node_ready);
    let node_ready = ready_condition.as_ref().is_some_and(|(s, _)| s == "True");
    let cordoned = node
        .as_ref()
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let recorded_uid = status.node_ref.as_ref().and_then(|n| n.uid.clone());
    // A repave request acts on the recorded Node, or re-resolves a Machine that has none; a
    // Node the Machine has not recorded yet is left alone.
    let repavable = node
        .as_ref()
        .is_none_or(|n| n.metadata.uid.is_some() && n.metadata.uid == recorded_uid);
    let annotations = machine.annotations();
    let repave_requested = !matches!(
        repave::read_request(annotations),
        repave::RequestState::None
    );
    let repaving_since = repave::repaving_since(annotations);
    let deleting = machine.metadata.deletion_timestamp.is_some();
    let ready = node_ready && status.phase == Some(MachinePhase::Running);
    let available =
        ready && !cordoned && !repave_requested && repaving_since.is_none() && !deleting;
    let recorded = status.configuration.clone();
    let updated = recorded.is_some() && recorded == target;
    // Nothing to roll to, or nothing recorded yet (the first resolution is not a rollout).
    let up_to_date = target.is_none() || recorded.is_none() || recorded == target;
    let created = machine.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let stamp = |key: &str| {
        annotations
            .get(key)
            .and_then(|v| v.parse::<Timestamp>().ok())
    };
    let node_condition = condition::find(&status.conditions, conditions::NODE_READY);
    let unready_transition = node_condition
        .filter(|c| c.status != "True")
        .map(|c| c.last_transition_time.0);
    // The Machine still says Ready while its Node is gone or not Ready: the Machine handler
    // has not dated the change yet, and the last repave or claim must not stand in for it
    // (a Node deleted minutes after its repave would be remediated at once).
    let unrecorded = !node_ready && node_condition.is_some_and(|c| c.status == "True");
    let unready_since = (!unrecorded).then(|| {
        [
            created,
            stamp(annotations::CLAIMED_AT),
            repaving_since,
            unready_transition,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH)
    });
    Facts {
        member: Member {
            name: machine.name_any(),
            created,
            deleting,
            up_to_date,
            version: recorded.as_ref().map(|c| c.version),
            repavable,
            ready,
            available,
            repave_requested,
            repaving_since,
            delete_requested: annotations.contains_key(annotations::DELETE_MACHINE),
            unhealthy: None,
        },
        health: HealthFacts {
            node_ready: ready_condition,
            ready,
            unready_since,
        },
        recorded,
        target,
        updated,
    }
}

/// Machines by name from the store, skipping names it no longer holds.
pub fn machines_named<'a>(
    ctx: &Context,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<Arc<Machine>> {
    names
        .into_iter()
        .filter_map(|n| {
            ctx.machines
                .get(&kube::runtime::reflector::ObjectRef::new(n))
        })
        .collect()
}
