//! `status`: the tree of configurations → versions → machines (or pools → machines), built
//! by [`build`] from an [`Inventory`] read at one moment. Pure: the same inventory and the
//! same `now` give the same tree; [`crate::render`] draws it, `-o json|yaml` serialises it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;
use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, MachineConfiguration, MachinePool};
use unbounded_controller::selection::{Candidate, Resolution};

use crate::facts::{
    Blocker, Inventory, NodeFacts, NodesByName, candidates, first_blocker, node_of, nodes_by_name,
    pool_of, recorded, resolve, seconds_between,
};

/// How `status` groups machines.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// Configurations → versions → machines.
    #[default]
    Configuration,
    /// Pools → machines.
    Pool,
}

/// Which machines `status` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only these machines (empty: all).
    pub names: Vec<String>,
    /// Only the machines of this pool.
    pub pool: Option<String>,
    /// Only the machines whose recorded or resolved configuration is this one.
    pub configuration: Option<String>,
    /// A label selector narrowed the inventory (empty groups are then left out).
    pub selector: bool,
}

impl Filter {
    /// Whether only some machines are shown (then groups without machines are left out).
    fn narrows(&self) -> bool {
        !self.names.is_empty() || self.pool.is_some() || self.selector
    }
}

/// The tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusTree {
    /// `configuration` or `pool`.
    pub grouping: &'static str,
    /// The top-level groups.
    pub groups: Vec<Group>,
}

/// What a top-level group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GroupKind {
    /// A MachineConfiguration.
    Configuration,
    /// A MachinePool.
    Pool,
    /// The machines that have no configuration (or pool).
    Unassigned,
}

/// A configuration, a pool, or the machines without one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// What it is.
    pub kind: GroupKind,
    /// Its name (empty for [`GroupKind::Unassigned`]).
    pub name: String,
    /// A one-line summary for people.
    pub summary: String,
    /// Its first condition that is not True.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocker: Option<Blocker>,
    /// A configuration's versions that have machines, newest first, then the machines
    /// that record no version yet.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<VersionGroup>,
    /// A pool's (or the unassigned) machines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<MachineRow>,
}

/// The machines of one configuration version.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionGroup {
    /// The version, or `None` for machines that record none yet.
    pub version: Option<i64>,
    /// A one-line summary for people.
    pub summary: String,
    /// The machines.
    pub machines: Vec<MachineRow>,
}

/// One machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRow {
    /// The Machine's name.
    pub name: String,
    /// `pxe`, `azure` or `manual`.
    pub provider: &'static str,
    /// `status.phase` (`Deleting` once deletion started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'static str>,
    /// The configuration version it records (`status.configuration`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<VersionRef>,
    /// The version it resolves to now, by the controller's rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<VersionRef>,
    /// Why it resolves to nothing, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
    /// Its Node.
    pub node: NodeFacts,
    /// `status.power`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<&'static str>,
    /// What the agent reports of the node container (`rebooting` while a reboot runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The first thing that holds it up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocker: Option<Blocker>,
}

/// A configuration version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionRef {
    /// The MachineConfiguration.
    pub configuration: String,
    /// The version number.
    pub version: i64,
}

/// One machine's row.
pub fn machine_row(machine: &Machine, inventory: &Inventory, now: Timestamp) -> MachineRow {
    let facts = Shared {
        nodes: nodes_by_name(&inventory.nodes),
        candidates: candidates(&inventory.configurations),
    };
    row_with(machine, &facts, now)
}

/// What every row looks things up in, built once per tree.
struct Shared<'a> {
    nodes: NodesByName<'a>,
    candidates: Vec<Candidate<'a>>,
}

fn row_with(machine: &Machine, shared: &Shared<'_>, now: Timestamp) -> MachineRow {
    let status = machine.status.as_ref();
    let phase = if machine.metadata.deletion_timestamp.is_some() {
        Some("Deleting")
    } else {
        status.and_then(|s| s.phase).map(|p| p.as_str())
    };
    let (resolved, unresolved) = match resolve(machine, &shared.candidates) {
        Resolution::Resolved {
            configuration,
            version,
        } => (
            Some(VersionRef {
                configuration,
                version,
            }),
            None,
        ),
        Resolution::NoMatch => (None, Some("no configuration matches".to_owned())),
        Resolution::AwaitingClaim => (
            None,
            Some(
                "discovered, waiting to be claimed (by a pool, or the label discovery=claimed)"
                    .to_owned(),
            ),
        ),
        Resolution::ConfigurationNotFound { configuration } => (
            None,
            Some(format!("configuration {configuration} does not exist")),
        ),
        Resolution::VersionNotFound {
            configuration,
            version,
        } => (
            None,
            Some(format!("{configuration} has no version {version}")),
        ),
        Resolution::AwaitingFirstVersion { configuration } => {
            (None, Some(format!("{configuration} has no version yet")))
        }
    };
    let agent = status.and_then(|s| s.agent.as_ref()).and_then(|a| {
        if a.reboot.is_some() {
            Some("rebooting".to_owned())
        } else {
            a.container_state.clone()
        }
    });
    MachineRow {
        name: machine.name_any(),
        provider: machine.spec.provider.as_str(),
        phase,
        recorded: recorded(machine).map(|(c, v)| VersionRef {
            configuration: c.to_owned(),
            version: v,
        }),
        resolved,
        unresolved,
        node: node_of(machine, &shared.nodes),
        power: status.and_then(|s| s.power).map(|p| match p {
            unbounded_api::PowerState::On => "On",
            unbounded_api::PowerState::Off => "Off",
            unbounded_api::PowerState::Unknown => "Unknown",
        }),
        agent,
        blocker: first_blocker(machine, now),
    }
}

/// The configuration a row is listed under: the one it records, else the one it resolves
/// to (or names).
fn configuration_of(machine: &Machine, row: &MachineRow) -> Option<String> {
    row.recorded
        .as_ref()
        .or(row.resolved.as_ref())
        .map(|v| v.configuration.clone())
        .or_else(|| {
            machine
                .spec
                .configuration_ref
                .as_ref()
                .map(|r| r.name.clone())
        })
}

fn first_not_true(conditions: &[Condition], order: &[&str], now: Timestamp) -> Option<Blocker> {
    let ordered = order
        .iter()
        .filter_map(|t| conditions.iter().find(|c| c.type_ == *t));
    let others = conditions
        .iter()
        .filter(|c| !order.contains(&c.type_.as_str()));
    ordered.chain(others).find(|c| c.status != "True").map(|c| {
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

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

fn configuration_summary(configuration: &MachineConfiguration, machines: usize) -> String {
    let status = configuration.status.clone().unwrap_or_default();
    let latest = status
        .versions
        .iter()
        .find(|v| v.version == status.latest_version);
    let latest = match latest {
        Some(v) if v.deployed => format!("latest v{} (deployed)", v.version),
        Some(v) => format!("latest v{}", v.version),
        None if status.latest_version > 0 => format!("latest v{}", status.latest_version),
        None => "no version yet".to_owned(),
    };
    let strategy = match configuration.spec.update_strategy_type() {
        unbounded_api::UpdateStrategyType::OnDelete => "OnDelete",
        unbounded_api::UpdateStrategyType::RollingUpdate => "RollingUpdate",
    };
    format!(
        "{latest}, {strategy}, priority {}, {}",
        configuration.spec.priority,
        plural(machines, "machine")
    )
}

fn pool_summary(pool: &MachinePool) -> String {
    let status = pool.status.clone().unwrap_or_default();
    let mut summary = format!(
        "{} pool, {}/{} ready, {} updated",
        pool.spec.template.spec.provider.as_str(),
        status.ready_replicas,
        pool.spec.replicas,
        status.updated_replicas
    );
    if let Some(r) = &pool.spec.template.spec.configuration_ref {
        summary.push_str(&format!(", configuration {}", r.name));
        if let Some(v) = r.version {
            summary.push_str(&format!(" v{v}"));
        }
    }
    if pool.spec.paused {
        summary.push_str(", paused");
    }
    summary
}

/// The names asked for that no machine in `machines` has.
pub fn missing_names(names: &[String], machines: &[Machine]) -> Vec<String> {
    let present: BTreeSet<String> = machines.iter().map(ResourceExt::name_any).collect();
    names
        .iter()
        .filter(|n| !present.contains(*n))
        .cloned()
        .collect()
}

/// Builds the tree of `inventory`'s machines that pass `filter`, grouped by `by` (a pool
/// filter groups by pool).
pub fn build(inventory: &Inventory, filter: &Filter, by: GroupBy, now: Timestamp) -> StatusTree {
    let by = if filter.pool.is_some() {
        GroupBy::Pool
    } else {
        by
    };
    let shared = Shared {
        nodes: nodes_by_name(&inventory.nodes),
        candidates: candidates(&inventory.configurations),
    };
    let mut rows: Vec<(&Machine, MachineRow)> = inventory
        .machines
        .iter()
        .filter(|m| filter.names.is_empty() || filter.names.contains(&m.name_any()))
        .filter(|m| filter.pool.is_none() || pool_of(m) == filter.pool.as_deref())
        .map(|m| (m, row_with(m, &shared, now)))
        .filter(|(m, row)| match &filter.configuration {
            None => true,
            Some(c) => {
                configuration_of(m, row).as_deref() == Some(c)
                    || row.resolved.as_ref().is_some_and(|r| &r.configuration == c)
            }
        })
        .collect();
    rows.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    match by {
        GroupBy::Configuration => by_configuration(inventory, filter, rows, now),
        GroupBy::Pool => by_pool(inventory, filter, rows, now),
    }
}

fn by_configuration(
    inventory: &Inventory,
    filter: &Filter,
    rows: Vec<(&Machine, MachineRow)>,
    now: Timestamp,
) -> StatusTree {
    // configuration → version (None: not recorded yet) → rows
    let mut grouped: BTreeMap<Option<String>, BTreeMap<Option<i64>, Vec<MachineRow>>> =
        BTreeMap::new();
    for (machine, row) in rows {
        let configuration = configuration_of(machine, &row);
        let version = row
            .recorded
            .as_ref()
            .filter(|r| Some(&r.configuration) == configuration.as_ref())
            .map(|r| r.version);
        grouped
            .entry(configuration)
            .or_default()
            .entry(version)
            .or_default()
            .push(row);
    }
    let mut groups = Vec::new();
    let mut configurations: Vec<&MachineConfiguration> = inventory.configurations.iter().collect();
    configurations.sort_by_key(|c| c.name_any());
    let wanted = |name: &str| filter.configuration.as_deref().is_none_or(|c| c == name);
    for configuration in configurations {
        let name = configuration.name_any();
        let versions = grouped.remove(&Some(name.clone())).unwrap_or_default();
        if !wanted(&name) || (versions.is_empty() && filter.narrows()) {
            continue;
        }
        let summaries = configuration
            .status
            .as_ref()
            .map(|s| s.versions.clone())
            .unwrap_or_default();
        let machines = versions.values().map(Vec::len).sum();
        groups.push(Group {
            kind: GroupKind::Configuration,
            summary: configuration_summary(configuration, machines),
            blocker: configuration.status.as_ref().and_then(|s| {
                first_not_true(
                    &s.conditions,
                    &[
                        conditions::UPDATE_STRATEGY_SUPPORTED,
                        conditions::UP_TO_DATE,
                    ],
                    now,
                )
            }),
            versions: version_groups(versions, |v| {
                summaries.iter().find(|s| s.version == v).map(|s| {
                    if s.deployed {
                        "deployed".to_owned()
                    } else {
                        "not deployed".to_owned()
                    }
                })
            }),
            machines: Vec::new(),
            name,
        });
    }
    // Machines that name a configuration that does not exist, then those with none.
    let unassigned = grouped.remove(&None);
    for (name, versions) in grouped {
        let name = name.unwrap_or_default();
        if !wanted(&name) {
            continue;
        }
        groups.push(Group {
            kind: GroupKind::Configuration,
            summary: "does not exist".to_owned(),
            blocker: None,
            versions: version_groups(versions, |_| None),
            machines: Vec::new(),
            name,
        });
    }
    if let Some(versions) = unassigned {
        groups.push(Group {
            kind: GroupKind::Unassigned,
            name: String::new(),
            summary: "no configuration".to_owned(),
            blocker: None,
            versions: Vec::new(),
            machines: versions.into_values().flatten().collect(),
        });
    }
    StatusTree {
        grouping: "configuration",
        groups,
    }
}

fn version_groups(
    versions: BTreeMap<Option<i64>, Vec<MachineRow>>,
    describe: impl Fn(i64) -> Option<String>,
) -> Vec<VersionGroup> {
    // Newest first; the machines that record no version last.
    let mut out: Vec<VersionGroup> = versions
        .into_iter()
        .rev()
        .map(|(version, machines)| {
            let count = plural(machines.len(), "machine");
            let summary = match version.and_then(&describe) {
                Some(state) => format!("{state}, {count}"),
                None if version.is_none() => format!("no version recorded yet, {count}"),
                None => count,
            };
            VersionGroup {
                version,
                summary,
                machines,
            }
        })
        .collect();
    // BTreeMap orders None first, so after `rev` it is last: as wanted.
    out.shrink_to_fit();
    out
}

fn by_pool(
    inventory: &Inventory,
    filter: &Filter,
    rows: Vec<(&Machine, MachineRow)>,
    now: Timestamp,
) -> StatusTree {
    let mut grouped: BTreeMap<Option<String>, Vec<MachineRow>> = BTreeMap::new();
    for (machine, row) in rows {
        grouped
            .entry(pool_of(machine).map(str::to_owned))
            .or_default()
            .push(row);
    }
    let mut pools: Vec<&MachinePool> = inventory.pools.iter().collect();
    pools.sort_by_key(|p| p.name_any());
    let mut groups = Vec::new();
    for pool in pools {
        let name = pool.name_any();
        let machines = grouped.remove(&Some(name.clone())).unwrap_or_default();
        if filter.pool.as_deref().is_some_and(|p| p != name)
            || (machines.is_empty() && (filter.narrows() || filter.configuration.is_some()))
        {
            continue;
        }
        groups.push(Group {
            kind: GroupKind::Pool,
            summary: pool_summary(pool),
            blocker: pool.status.as_ref().and_then(|s| {
                first_not_true(
                    &s.conditions,
                    &[
                        conditions::SCALED,
                        conditions::UP_TO_DATE,
                        conditions::MACHINES_HEALTHY,
                    ],
                    now,
                )
            }),
            versions: Vec::new(),
            machines,
            name,
        });
    }
    let unassigned = grouped.remove(&None);
    // Machines labelled with a pool that does not exist (any more).
    for (name, machines) in grouped {
        groups.push(Group {
            kind: GroupKind::Pool,
            name: name.unwrap_or_default(),
            summary: "does not exist".to_owned(),
            blocker: None,
            versions: Vec::new(),
            machines,
        });
    }
    if let Some(machines) = unassigned {
        groups.push(Group {
            kind: GroupKind::Unassigned,
            name: String::new(),
            summary: "in no pool".to_owned(),
            blocker: None,
            versions: Vec::new(),
            machines,
        });
    }
    StatusTree {
        grouping: "pool",
        groups,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::{condition, configuration, machine, node, now, pool, running};

    fn names(rows: &[MachineRow]) -> Vec<&str> {
        rows.iter().map(|r| r.name.as_str()).collect()
    }

    /// gpu (selector gpu=true, v1 deployed, v2 deployed), cpu (no selector, v1):
    /// a, b on gpu v2; c on gpu v1 (pinned, so it stays); d not yet provisioned (selected
    /// by gpu); e names cpu; f matches nothing; g names a configuration that is gone.
    fn lab() -> Inventory {
        let gpu = configuration(
            "gpu",
            10,
            Some(json!({"matchLabels": {"gpu": "true"}})),
            &[(1, true), (2, true)],
        );
        let cpu = configuration("cpu", 0, None, &[(1, false)]);
        let mut a = running("a", "gpu", 2);
        a.metadata.labels = Some(crate::facts::label_map(&[("gpu", "true")]));
        let mut b = running("b", "gpu", 2);
        b.metadata.labels = a.metadata.labels.clone();
        let c = machine(
            "c",
            json!({"gpu": "true"}),
            json!({"configurationRef": {"name": "gpu", "version": 1}}),
            running("c", "gpu", 1)
                .status
                .map(|s| serde_json::to_value(s).unwrap())
                .unwrap(),
        );
        let d = machine(
            "d",
            json!({"gpu": "true"}),
            json!({}),
            json!({"phase": "Pending"}),
        );
        let e = machine(
            "e",
            json!({}),
            json!({"configurationRef": {"name": "cpu"}}),
            json!({}),
        );
        let f = machine(
            "f",
            json!({}),
            json!({}),
            json!({"phase": "Pending", "conditions": [condition(
                "ConfigurationResolved", "False", "ConfigurationPending",
                "no MachineConfiguration matches", "2026-11-26T11:00:00Z")]}),
        );
        let g = machine(
            "g",
            json!({}),
            json!({"configurationRef": {"name": "gone"}}),
            json!({}),
        );
        Inventory {
            machines: vec![a, b, c, d, e, f, g],
            configurations: vec![cpu, gpu],
            pools: Vec::new(),
            nodes: vec![node("a", true), node("b", false)],
        }
    }

    #[test]
    fn configurations_hold_versions_newest_first_then_the_unrecorded() {
        let tree = build(&lab(), &Filter::default(), GroupBy::Configuration, now());
        type Shape<'a> = (
            GroupKind,
            &'a str,
            Vec<(Option<i64>, Vec<&'a str>)>,
            Vec<&'a str>,
        );
        let shape: Vec<Shape<'_>> = tree
            .groups
            .iter()
            .map(|g| {
                (
                    g.kind,
                    g.name.as_str(),
                    g.versions
                        .iter()
                        .map(|v| (v.version, names(&v.machines)))
                        .collect(),
                    names(&g.machines),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (
                    GroupKind::Configuration,
                    "cpu",
                    vec![(None, vec!["e"])],
                    vec![]
                ),
                (
                    GroupKind::Configuration,
                    "gpu",
                    vec![
                        (Some(2), vec!["a", "b"]),
                        (Some(1), vec!["c"]),
                        (None, vec!["d"])
                    ],
                    vec![]
                ),
                (
                    GroupKind::Configuration,
                    "gone",
                    vec![(None, vec!["g"])],
                    vec![]
                ),
                (GroupKind::Unassigned, "", vec![], vec!["f"]),
            ]
        );
    }

    #[test]
    fn rows_carry_recorded_and_resolved_versions_by_the_controllers_rule() {
        let tree = build(&lab(), &Filter::default(), GroupBy::Configuration, now());
        let row = |name: &str| {
            tree.groups
                .iter()
                .flat_map(|g| {
                    g.versions
                        .iter()
                        .flat_map(|v| v.machines.iter())
                        .chain(&g.machines)
                })
                .find(|r| r.name == name)
                .unwrap()
                .clone()
        };
        let v = |c: &str, n: i64| {
            Some(VersionRef {
                configuration: c.to_owned(),
                version: n,
            })
        };
        // Selector-matched, newest deployed: v2.
        assert_eq!(
            (row("a").recorded, row("a").resolved),
            (v("gpu", 2), v("gpu", 2))
        );
        // Pinned to v1.
        assert_eq!(
            (row("c").recorded, row("c").resolved),
            (v("gpu", 1), v("gpu", 1))
        );
        // Not provisioned yet: resolves to gpu v2.
        assert_eq!((row("d").recorded, row("d").resolved), (None, v("gpu", 2)));
        // Names cpu: its newest version.
        assert_eq!(row("e").resolved, v("cpu", 1));
        assert_eq!(
            row("f").unresolved.as_deref(),
            Some("no configuration matches")
        );
        assert_eq!(
            row("g").unresolved.as_deref(),
            Some("configuration gone does not exist")
        );
        assert_eq!(row("a").node.readiness, crate::facts::NodeReadiness::Ready);
        assert_eq!(
            row("b").node.readiness,
            crate::facts::NodeReadiness::NotReady
        );
        assert_eq!(
            row("c").node.readiness,
            crate::facts::NodeReadiness::Missing
        );
        let f = row("f").blocker.unwrap();
        assert_eq!(
            (f.condition.as_str(), f.reason.as_str(), f.for_seconds),
            ("ConfigurationResolved", "ConfigurationPending", Some(3600))
        );
        assert_eq!(row("a").blocker, None);
        assert_eq!(row("a").agent.as_deref(), Some("running"));
    }

    #[test]
    fn filters_narrow_machines_and_drop_empty_groups() {
        let inventory = lab();
        let cases: Vec<(Filter, Vec<&str>)> = vec![
            (
                Filter {
                    names: vec!["c".into(), "f".into()],
                    ..Filter::default()
                },
                vec!["c", "f"],
            ),
            (
                Filter {
                    configuration: Some("gpu".into()),
                    ..Filter::default()
                },
                vec!["a", "b", "c", "d"],
            ),
            (
                Filter {
                    configuration: Some("cpu".into()),
                    ..Filter::default()
                },
                vec!["e"],
            ),
        ];
        for (filter, expected) in cases {
            let tree = build(&inventory, &filter, GroupBy::Configuration, now());
            let shown: Vec<&str> = tree
                .groups
                .iter()
                .flat_map(|g| {
                    g.versions
                        .iter()
                        .flat_map(|v| v.machines.iter())
                        .chain(&g.machines)
                })
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(shown, expected, "{filter:?}");
            assert!(
                tree.groups
                    .iter()
                    .all(|g| !g.versions.is_empty() || !g.machines.is_empty()),
                "{filter:?}: no empty group"
            );
        }
    }

    #[test]
    fn an_unfiltered_tree_lists_configurations_without_machines() {
        let mut inventory = lab();
        inventory.machines.clear();
        let tree = build(
            &inventory,
            &Filter::default(),
            GroupBy::Configuration,
            now(),
        );
        let groups: Vec<&str> = tree.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(groups, ["cpu", "gpu"]);
        assert_eq!(
            tree.groups[1].summary,
            "latest v2 (deployed), OnDelete, priority 10, 0 machines"
        );
    }

    #[test]
    fn pools_hold_their_machines_and_a_pool_filter_groups_by_pool() {
        let mut inventory = lab();
        inventory.pools = vec![pool("web", "pxe", 2, 1), pool("idle", "azure", 0, 0)];
        for m in &mut inventory.machines {
            if ["a", "b"].contains(&m.metadata.name.as_deref().unwrap_or_default()) {
                m.metadata.labels.get_or_insert_default().insert(
                    unbounded_api::well_known::labels::POOL.to_owned(),
                    "web".to_owned(),
                );
            }
        }
        let tree = build(&inventory, &Filter::default(), GroupBy::Pool, now());
        assert_eq!(tree.grouping, "pool");
        let shape: Vec<(GroupKind, &str, Vec<&str>)> = tree
            .groups
            .iter()
            .map(|g| (g.kind, g.name.as_str(), names(&g.machines)))
            .collect();
        assert_eq!(
            shape,
            vec![
                (GroupKind::Pool, "idle", vec![]),
                (GroupKind::Pool, "web", vec!["a", "b"]),
                (GroupKind::Unassigned, "", vec!["c", "d", "e", "f", "g"]),
            ]
        );
        assert_eq!(tree.groups[1].summary, "pxe pool, 1/2 ready, 2 updated");
        let only_web = Filter {
            pool: Some("web".into()),
            ..Filter::default()
        };
        let tree = build(&inventory, &only_web, GroupBy::Configuration, now());
        let shape: Vec<(&str, Vec<&str>)> = tree
            .groups
            .iter()
            .map(|g| (g.name.as_str(), names(&g.machines)))
            .collect();
        assert_eq!(shape, vec![("web", vec!["a", "b"])]);
    }

    #[test]
    fn missing_names_are_reported() {
        let inventory = lab();
        assert_eq!(
            missing_names(&["a".into(), "zz".into(), "yy".into()], &inventory.machines),
            ["zz", "yy"]
        );
        assert!(missing_names(&[], &inventory.machines).is_empty());
    }
}
