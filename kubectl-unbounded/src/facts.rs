//! What the plugin reads from the cluster, as plain data, and the facts about one machine
//! that `status`, `why` and the verbs all derive from it: the first condition that holds it
//! up, its Node's readiness, the version it resolves to.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;
use unbounded_api::well_known::{conditions, labels};
use unbounded_api::{Machine, MachineConfiguration, MachinePool, UpdateStrategyType};
use unbounded_controller::selection::{self, Candidate, Resolution, VersionInfo};

/// Everything `status` needs, read at one moment.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Machines (already narrowed by a label selector, when one was given).
    pub machines: Vec<Machine>,
    /// All MachineConfigurations.
    pub configurations: Vec<MachineConfiguration>,
    /// All MachinePools.
    pub pools: Vec<MachinePool>,
    /// All Nodes.
    pub nodes: Vec<Node>,
}

/// The Machine conditions in the order a machine passes them: the first one that is not True
/// is what holds it up.
pub const LIFECYCLE_CONDITIONS: [&str; 4] = [
    conditions::CONFIGURATION_RESOLVED,
    conditions::INFRASTRUCTURE_READY,
    conditions::BOOTSTRAP_READY,
    conditions::NODE_READY,
];

/// Why a machine is not (yet) where it should be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// The condition type, or `Failed` for a terminal failure, or `Status` when nothing has
    /// reported yet.
    pub condition: String,
    /// The condition's status (`False`, `Unknown`), empty for a failure.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// Since when (the condition's last transition), RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// How long, in seconds, at the moment the facts were read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_seconds: Option<i64>,
}

/// The first thing that holds a machine up, or `None` when nothing does: a terminal failure
/// first, then the lifecycle conditions in order, then any other condition that is not True.
/// A machine nobody has reported on yet gets a `Status` blocker.
pub fn first_blocker(machine: &Machine, now: Timestamp) -> Option<Blocker> {
    let Some(status) = &machine.status else {
        return Some(Blocker {
            condition: "Status".to_owned(),
            status: String::new(),
            reason: "NoStatus".to_owned(),
            message: "the controller has not reported on this Machine yet".to_owned(),
            since: None,
            for_seconds: None,
        });
    };
    if let Some(reason) = &status.failure_reason {
        return Some(Blocker {
            condition: "Failed".to_owned(),
            status: String::new(),
            reason: reason.clone(),
            message: status.failure_message.clone().unwrap_or_default(),
            since: None,
            for_seconds: None,
        });
    }
    let not_true =
        |c: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| c.status != "True";
    let lifecycle = LIFECYCLE_CONDITIONS
        .iter()
        .filter_map(|t| status.conditions.iter().find(|c| c.type_ == *t))
        .find(not_true);
    let other = || {
        status
            .conditions
            .iter()
            .filter(|c| !LIFECYCLE_CONDITIONS.contains(&c.type_.as_str()))
            .find(not_true)
    };
    lifecycle.or_else(other).map(|c| {
        let since = c.last_transition_time.0;
        Blocker {
            condition: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: Some(since.to_string()),
            for_seconds: Some(seconds_between(since, now)),
        }
    })
}

/// Whole seconds from `earlier` to `later` (0 when the clocks disagree).
pub fn seconds_between(earlier: Timestamp, later: Timestamp) -> i64 {
    (later.as_second() - earlier.as_second()).max(0)
}

/// A Node's readiness, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NodeReadiness {
    /// No Node.
    Missing,
    /// Ready=True.
    Ready,
    /// Ready=False.
    NotReady,
    /// Ready=Unknown or absent (kubelet stopped reporting).
    Unknown,
}

impl NodeReadiness {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "-",
            Self::Ready => "Ready",
            Self::NotReady => "NotReady",
            Self::Unknown => "Unknown",
        }
    }
}

/// A machine's Node as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    /// The Node's name (recorded in `status.nodeRef`, else the name the Machine becomes).
    pub name: String,
    /// Its readiness.
    pub readiness: NodeReadiness,
    /// Cordoned (`spec.unschedulable`).
    pub cordoned: bool,
}

/// Nodes by name (a fleet's thousands of machines each look theirs up).
pub type NodesByName<'a> = BTreeMap<&'a str, &'a Node>;

/// Indexes `nodes` by name.
pub fn nodes_by_name(nodes: &[Node]) -> NodesByName<'_> {
    nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect()
}

/// The Node a machine became (by `status.nodeRef`, else by the name it becomes).
pub fn node_of(machine: &Machine, nodes: &NodesByName<'_>) -> NodeFacts {
    let name = machine
        .status
        .as_ref()
        .and_then(|s| s.node_ref.as_ref())
        .map_or_else(|| machine.node_name(), |r| r.name.clone());
    let node = nodes.get(name.as_str()).copied();
    let readiness = match node {
        None => NodeReadiness::Missing,
        Some(node) => {
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
            match ready.map(|c| c.status.as_str()) {
                Some("True") => NodeReadiness::Ready,
                Some("False") => NodeReadiness::NotReady,
                _ => NodeReadiness::Unknown,
            }
        }
    };
    let cordoned = node
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    NodeFacts {
        name,
        readiness,
        cordoned,
    }
}

/// The configurations as the controller's selection sees them (built once for many
/// machines).
pub fn candidates(configurations: &[MachineConfiguration]) -> Vec<Candidate<'_>> {
    configurations.iter().map(candidate).collect()
}

/// The configuration version a machine resolves to now, by the controller's own rule
/// (`unbounded_controller::selection::resolve`), among `candidates`.
pub fn resolve(machine: &Machine, candidates: &[Candidate<'_>]) -> Resolution {
    selection::resolve(
        machine.labels(),
        machine.spec.configuration_ref.as_ref(),
        candidates,
    )
}

fn candidate(configuration: &MachineConfiguration) -> Candidate<'_> {
    Candidate {
        name: configuration.metadata.name.as_deref().unwrap_or_default(),
        priority: configuration.spec.priority,
        rolling: configuration.spec.update_strategy_type() == UpdateStrategyType::RollingUpdate,
        selector: configuration.spec.machine_selector.as_ref(),
        versions: configuration
            .status
            .as_ref()
            .map(|s| {
                s.versions
                    .iter()
                    .map(|v| VersionInfo {
                        version: v.version,
                        deployed: v.deployed,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The pool a machine belongs to (its `unbounded-cloud.io/pool` label).
pub fn pool_of(machine: &Machine) -> Option<&str> {
    machine.labels().get(labels::POOL).map(String::as_str)
}

/// The configuration version a machine records (`status.configuration`).
pub fn recorded(machine: &Machine) -> Option<(&str, i64)> {
    machine
        .status
        .as_ref()
        .and_then(|s| s.configuration.as_ref())
        .map(|c| (c.name.as_str(), c.version))
}

/// Sorts objects by name, so that every output lists them in the same order.
pub fn by_name<K: ResourceExt>(objects: &mut [K]) {
    objects.sort_by_key(ResourceExt::name_any);
}

/// Labels as a map (for tests and callers that build machines).
pub fn label_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::{condition, machine, now};

    #[test]
    fn the_first_blocker_follows_the_lifecycle_order() {
        let t = "2026-11-26T11:55:00Z";
        let with = |conditions: Vec<serde_json::Value>, extra: serde_json::Value| {
            let mut status = json!({"conditions": conditions});
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                status[k] = v;
            }
            machine("m", json!({}), json!({}), status)
        };
        let cases: Vec<(Machine, Option<(&str, &str)>)> = vec![
            (
                machine("m", json!({}), json!({}), serde_json::Value::Null),
                Some(("Status", "NoStatus")),
            ),
            (
                with(
                    vec![
                        condition("NodeReady", "False", "NodeNotFound", "", t),
                        condition("BootstrapReady", "False", "Paving", "pulling", t),
                        condition(
                            "ConfigurationResolved",
                            "True",
                            "ConfigurationResolved",
                            "",
                            t,
                        ),
                    ],
                    json!({}),
                ),
                Some(("BootstrapReady", "Paving")),
            ),
            (
                with(
                    vec![
                        condition("NodeReady", "Unknown", "NodeNotReady", "", t),
                        condition("Custom", "False", "Other", "", t),
                    ],
                    json!({}),
                ),
                Some(("NodeReady", "NodeNotReady")),
            ),
            (
                with(
                    vec![
                        condition("NodeReady", "True", "NodeReady", "", t),
                        condition("Custom", "False", "Other", "", t),
                    ],
                    json!({}),
                ),
                Some(("Custom", "Other")),
            ),
            (
                with(
                    vec![condition("NodeReady", "False", "NodeNotFound", "", t)],
                    json!({"failureReason": "ImageRejected", "failureMessage": "sha256 mismatch"}),
                ),
                Some(("Failed", "ImageRejected")),
            ),
            (
                with(
                    vec![condition("NodeReady", "True", "NodeReady", "", t)],
                    json!({}),
                ),
                None,
            ),
        ];
        for (m, expected) in cases {
            let got = first_blocker(&m, now());
            assert_eq!(
                got.as_ref()
                    .map(|b| (b.condition.as_str(), b.reason.as_str())),
                expected,
                "{:?}",
                m.status
            );
            if let Some(b) = got.filter(|b| b.since.is_some()) {
                assert_eq!(b.for_seconds, Some(300));
            }
        }
    }
}
