//! From one change to the objects it makes reconcile: each kind's change ([`Change`] of its
//! index keys) is decided by one function of [`Lookups`] into [`Reconciles`], which the watch
//! handlers ([`crate::watches`]) only send. The functions read the in-memory indexes and the
//! operations' store, nothing else, and are tested table by table.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::runtime::reflector::{ObjectRef, Store};
use unbounded_api::{MachineOperation, MachineProvider};

use super::{configuration_changes_selection, recounted_configurations, version_changes_selection};
use crate::index::catalog::{Catalog, ConfigurationKeys, VersionKeys};
use crate::index::machines::{MachineIndex, MachineKeys};
use crate::index::operations::{OperationIndex, OperationKeys};
use crate::index::pools::{PoolIndex, PoolKeys};
use crate::index::{Change, Shared};

/// The objects to reconcile, by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciles {
    /// Machines.
    pub machines: BTreeSet<String>,
    /// Machines whose agent access to reconcile ([`crate::agent_access`]).
    pub access: BTreeSet<String>,
    /// Configurations, now.
    pub configurations: BTreeSet<String>,
    /// Configurations to recount in the next batch ([`crate::recount`]).
    pub recount: BTreeSet<String>,
    /// MachineOperations.
    pub operations: BTreeSet<String>,
    /// MachinePools.
    pub pools: BTreeSet<String>,
}

/// What the decisions read besides the change: the indexes and the operations' store.
#[derive(Clone, Debug)]
pub struct Lookups {
    /// Machines.
    pub machines: Shared<MachineIndex>,
    /// Pools by configuration, and the short PXE pools.
    pub pools: Shared<PoolIndex>,
    /// Configurations and versions.
    pub catalog: Shared<Catalog>,
    /// Operations by Machine and by parent.
    pub operation_index: Shared<OperationIndex>,
    /// The operations themselves (whether they finished).
    pub operations: Store<MachineOperation>,
}

fn names<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    names.into_iter().map(str::to_owned).collect()
}

impl Lookups {
    /// A Machine's change: the Machine itself, its agent access while it exists, the
    /// configurations whose counts changed, the unfinished operations on it, its pool (and
    /// the short PXE pools a free Machine could serve), and the rolling configurations it
    /// records or names.
    pub fn after_machine(&self, change: &Change<MachineKeys>) -> Reconciles {
        let (old, new) = (change.old.as_ref(), change.new.as_ref());
        let (pools, configurations) = self.groups(old, new);
        Reconciles {
            machines: names([change.name.as_str()]),
            access: new.map(|_| change.name.clone()).into_iter().collect(),
            recount: recounted_configurations(old, new),
            operations: self.unfinished_operations_on(&change.name),
            pools,
            configurations,
        }
    }

    /// The pools and rolling configurations a Machine's change concerns: the pools it was
    /// or is in, the short PXE pools it could now serve, and (when its keys changed) the
    /// rolling configurations it records or names outside a pool.
    fn groups(
        &self,
        old: Option<&MachineKeys>,
        new: Option<&MachineKeys>,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut pools = names(
            [old, new]
                .into_iter()
                .flatten()
                .filter_map(MachineKeys::pool),
        );
        if let Some(keys) = new
            && keys.pool().is_none()
            && keys.provider == MachineProvider::Pxe
            && !keys.deleting
        {
            pools.extend(self.pools.read().short_pools_matching(&keys.labels));
        }
        if old == new {
            return (pools, BTreeSet::new());
        }
        let catalog = self.catalog.read();
        let rolling = names(
            [old, new]
                .into_iter()
                .flatten()
                .filter(|k| k.pool().is_none())
                .flat_map(MachineKeys::configurations)
                .filter(|c| catalog.configuration(c).is_some_and(|k| k.rolling)),
        );
        (pools, rolling)
    }

    /// A pool's change: the pool, while it exists.
    pub fn after_pool(change: &Change<PoolKeys>) -> Reconciles {
        Reconciles {
            pools: change
                .new
                .as_ref()
                .map(|_| change.name.clone())
                .into_iter()
                .collect(),
            ..Reconciles::default()
        }
    }

    /// A configuration's change: the configuration, and when what Machines resolve to may
    /// change, the pools that name it and the Machines it selected, selects, or that record
    /// or name it.
    pub fn after_configuration(&self, change: &Change<ConfigurationKeys>) -> Reconciles {
        let (old, new) = (change.old.as_ref(), change.new.as_ref());
        let mut reconciles = Reconciles {
            configurations: names([change.name.as_str()]),
            ..Reconciles::default()
        };
        if configuration_changes_selection(old, new) {
            reconciles.pools = self.pools_for_configuration(&change.name);
            let selectors: Vec<LabelSelector> = [old, new]
                .into_iter()
                .flatten()
                .filter_map(|k| k.selector.clone())
                .collect();
            reconciles.machines = self.affected_machines(&change.name, &selectors);
        }
        reconciles
    }

    /// A version's change: when what Machines resolve to may change, its configuration at
    /// once, the pools that name it and the Machines it selects or that record or name it;
    /// otherwise (a count, a finalizer) its configuration in the next recount batch.
    pub fn after_version(&self, change: &Change<VersionKeys>) -> Reconciles {
        let (old, new) = (change.old.as_ref(), change.new.as_ref());
        let Some(configuration) = new.or(old).map(|k| k.configuration.clone()) else {
            return Reconciles::default();
        };
        if !version_changes_selection(old, new) {
            return Reconciles {
                recount: BTreeSet::from([configuration]),
                ..Reconciles::default()
            };
        }
        let selector = self
            .catalog
            .read()
            .configuration(&configuration)
            .and_then(|c| c.selector.clone());
        Reconciles {
            pools: self.pools_for_configuration(&configuration),
            machines: self.affected_machines(&configuration, selector.as_slice()),
            configurations: BTreeSet::from([configuration]),
            ..Reconciles::default()
        }
    }

    /// A Node's change (its provider ID): the Machines whose Node it is, and their pools and
    /// rolling configurations.
    pub fn after_node(&self, change: &Change<Option<String>>) -> Reconciles {
        let provider_id = change
            .new
            .as_ref()
            .or(change.old.as_ref())
            .cloned()
            .flatten();
        let machines = self.machines.read();
        let of_node = machines.of_node(&change.name, provider_id.as_deref());
        let mut reconciles = Reconciles::default();
        for name in &of_node {
            let (pools, configurations) = self.groups(machines.get(name), None);
            reconciles.pools.extend(pools);
            reconciles.configurations.extend(configurations);
        }
        reconciles.machines = names(of_node);
        reconciles
    }

    /// An operation's change: the operation, its parents, and for one on a Machine, that
    /// Machine's agent access (its role lists the operations routed to it) and its
    /// unfinished operations (the next may run once this one finishes).
    pub fn after_operation(&self, change: &Change<OperationKeys>) -> Reconciles {
        let mut reconciles = Reconciles {
            operations: names([change.name.as_str()]),
            ..Reconciles::default()
        };
        let Some(keys) = change.new.as_ref().or(change.old.as_ref()) else {
            return reconciles;
        };
        reconciles
            .operations
            .extend(keys.parents.iter().map(|(name, _)| name.clone()));
        if let Some(machine) = &keys.machine {
            reconciles.access.insert(machine.clone());
            reconciles
                .operations
                .extend(self.unfinished_operations_on(machine));
        }
        reconciles
    }

    fn pools_for_configuration(&self, configuration: &str) -> BTreeSet<String> {
        self.pools
            .read()
            .pools_for_configuration(configuration)
            .into_iter()
            .collect()
    }

    /// Machines whose resolution may change with `configuration`: those its selectors
    /// (before and after a change) match, and those that record or name it.
    fn affected_machines(
        &self,
        configuration: &str,
        selectors: &[LabelSelector],
    ) -> BTreeSet<String> {
        let machines = self.machines.read();
        let mut affected = names(machines.of_configuration(configuration));
        for selector in selectors {
            affected.extend(names(machines.matching(Some(selector))));
        }
        affected
    }

    /// The unfinished single-machine operations on a Machine.
    pub fn unfinished_operations_on(&self, machine: &str) -> BTreeSet<String> {
        let names = self.operation_index.read().on_machine(machine);
        names
            .into_iter()
            .filter(|name| {
                self.operations.get(&ObjectRef::new(name)).is_some_and(|o| {
                    !o.status
                        .as_ref()
                        .and_then(|s| s.state)
                        .is_some_and(|s| s.is_finished())
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;
    use serde_json::json;
    use std::collections::BTreeMap;
    use unbounded_api::well_known::labels;

    fn set(list: &[&str]) -> BTreeSet<String> {
        names(list.iter().copied())
    }

    fn rack(value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([("rack".to_owned(), value.to_owned())])),
            ..LabelSelector::default()
        }
    }

    fn machine(
        labels: &[(&str, &str)],
        recorded: Option<(&str, i64)>,
        provider: MachineProvider,
    ) -> MachineKeys {
        MachineKeys {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            recorded: recorded.map(|(c, v)| (c.to_owned(), v)),
            named: None,
            node_name: "n1".into(),
            provider_id: None,
            phase: unbounded_api::MachinePhase::Running,
            deleting: false,
            provider,
            repave: (None, None),
        }
    }

    fn change<K>(name: &str, old: Option<K>, new: Option<K>) -> Change<K> {
        Change {
            name: name.into(),
            old,
            new,
        }
    }

    /// A small house: configurations `a` (rack r1, OnDelete) and `roll` (rack r2,
    /// RollingUpdate); pools `p1` (names `a`) and `short` (PXE, rack r9, short); Machines
    /// `m1` (rack r1, records a, pool p1, Node n1) and `m2` (rack r2); operations on m1:
    /// `op1` running, `op2` finished.
    fn house() -> (Lookups, Writer<MachineOperation>) {
        let (operations, mut writer) = reflector::store::<MachineOperation>();
        let lookups = Lookups {
            machines: Shared::new(MachineIndex::default()),
            pools: Shared::new(PoolIndex::default()),
            catalog: Shared::new(Catalog::default()),
            operation_index: Shared::new(OperationIndex::default()),
            operations,
        };
        {
            let mut catalog = lookups.catalog.write();
            let configuration = |selector, rolling| ConfigurationKeys {
                selector: Some(selector),
                priority: 0,
                rolling,
                deleting: false,
            };
            catalog.apply_configuration("a", configuration(rack("r1"), false));
            catalog.apply_configuration("roll", configuration(rack("r2"), true));
        }
        {
            let mut pools = lookups.pools.write();
            let pool = |inventory, configuration: Option<&str>| PoolKeys {
                inventory,
                configuration: configuration.map(str::to_owned),
            };
            pools.apply("p1", pool(None, Some("a")));
            pools.apply("short", pool(Some(rack("r9")), Some("roll")));
            pools.set_short("short", true);
        }
        {
            let mut machines = lookups.machines.write();
            machines.apply(
                "m1",
                machine(
                    &[("rack", "r1"), (labels::POOL, "p1")],
                    Some(("a", 1)),
                    MachineProvider::Manual,
                ),
            );
            machines.apply(
                "m2",
                MachineKeys {
                    node_name: "n2".into(),
                    ..machine(&[("rack", "r2")], None, MachineProvider::Manual)
                },
            );
        }
        for (name, state) in [("op1", None), ("op2", Some("Complete"))] {
            let operation: MachineOperation = serde_json::from_value(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
                "metadata": {"name": name},
                "spec": {"machineRef": {"name": "m1"}, "operationName": "reboot"},
                "status": {"state": state},
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            lookups
                .operation_index
                .write()
                .apply(name, OperationKeys::of(&operation));
            writer.apply_watcher_event(&watcher::Event::Apply(operation));
        }
        (lookups, writer)
    }

    #[test]
    fn machine_changes() {
        let (lookups, _writer) = house();
        let in_p1 = |recorded| {
            machine(
                &[("rack", "r1"), (labels::POOL, "p1")],
                recorded,
                MachineProvider::Manual,
            )
        };
        let free = |recorded| machine(&[("rack", "r2")], recorded, MachineProvider::Manual);
        let cases = [
            (
                "created in a pool: itself, its access, its count, its operations, its pool",
                change("m1", None, Some(in_p1(Some(("a", 1))))),
                Reconciles {
                    machines: set(&["m1"]),
                    access: set(&["m1"]),
                    recount: set(&["a"]),
                    operations: set(&["op1"]),
                    pools: set(&["p1"]),
                    ..Reconciles::default()
                },
            ),
            (
                "a status echo outside a pool: no recount, no rolling configuration",
                change(
                    "m1",
                    Some(free(Some(("roll", 1)))),
                    Some(free(Some(("roll", 1)))),
                ),
                Reconciles {
                    machines: set(&["m1"]),
                    access: set(&["m1"]),
                    operations: set(&["op1"]),
                    ..Reconciles::default()
                },
            ),
            (
                "recording a rolling configuration's version outside a pool",
                change("m1", Some(free(None)), Some(free(Some(("roll", 2))))),
                Reconciles {
                    machines: set(&["m1"]),
                    access: set(&["m1"]),
                    recount: set(&["roll"]),
                    operations: set(&["op1"]),
                    configurations: set(&["roll"]),
                    ..Reconciles::default()
                },
            ),
            (
                "a pool's Machine does not trigger its configuration's rollout",
                change("m1", Some(in_p1(None)), Some(in_p1(Some(("roll", 2))))),
                Reconciles {
                    machines: set(&["m1"]),
                    access: set(&["m1"]),
                    recount: set(&["roll"]),
                    operations: set(&["op1"]),
                    pools: set(&["p1"]),
                    ..Reconciles::default()
                },
            ),
            (
                "deleted: no access to keep",
                change("m1", Some(in_p1(Some(("a", 1)))), None),
                Reconciles {
                    machines: set(&["m1"]),
                    recount: set(&["a"]),
                    operations: set(&["op1"]),
                    pools: set(&["p1"]),
                    ..Reconciles::default()
                },
            ),
            (
                "a free PXE Machine: the short pools its labels match",
                change(
                    "m3",
                    None,
                    Some(machine(&[("rack", "r9")], None, MachineProvider::Pxe)),
                ),
                Reconciles {
                    machines: set(&["m3"]),
                    access: set(&["m3"]),
                    pools: set(&["short"]),
                    ..Reconciles::default()
                },
            ),
        ];
        for (case, change, expected) in cases {
            assert_eq!(lookups.after_machine(&change), expected, "{case}");
        }
    }

    #[test]
    fn configuration_and_version_changes() {
        let (lookups, _writer) = house();
        let keys = |selector, priority| ConfigurationKeys {
            selector: Some(selector),
            priority,
            rolling: false,
            deleting: false,
        };
        let cases = [
            (
                "unchanged keys (a template change): only itself",
                change("a", Some(keys(rack("r1"), 0)), Some(keys(rack("r1"), 0))),
                Reconciles {
                    configurations: set(&["a"]),
                    ..Reconciles::default()
                },
            ),
            (
                "its selector moved: the Machines of both selectors, its pools",
                change("a", Some(keys(rack("r1"), 0)), Some(keys(rack("r2"), 0))),
                Reconciles {
                    configurations: set(&["a"]),
                    machines: set(&["m1", "m2"]),
                    pools: set(&["p1"]),
                    ..Reconciles::default()
                },
            ),
        ];
        for (case, change, expected) in cases {
            assert_eq!(lookups.after_configuration(&change), expected, "{case}");
        }

        let version = |deployed| VersionKeys {
            configuration: "a".into(),
            version: 1,
            deployed,
            deleting: false,
        };
        let cases = [
            (
                "a count or finalizer: recounted in a batch",
                change("a-v1", Some(version(false)), Some(version(false))),
                Reconciles {
                    recount: set(&["a"]),
                    ..Reconciles::default()
                },
            ),
            (
                "deployed: its configuration, its pools, the Machines it selects",
                change("a-v1", Some(version(false)), Some(version(true))),
                Reconciles {
                    configurations: set(&["a"]),
                    machines: set(&["m1"]),
                    pools: set(&["p1"]),
                    ..Reconciles::default()
                },
            ),
        ];
        for (case, change, expected) in cases {
            assert_eq!(lookups.after_version(&change), expected, "{case}");
        }
    }

    #[test]
    fn node_pool_and_operation_changes() {
        let (lookups, _writer) = house();
        assert_eq!(
            lookups.after_node(&change("n1", Some(None), None)),
            Reconciles {
                machines: set(&["m1"]),
                pools: set(&["p1"]),
                ..Reconciles::default()
            },
            "a deleted Node: its Machine and that one's pool"
        );
        assert_eq!(
            lookups.after_node(&change("n9", None, Some(None))),
            Reconciles::default(),
            "a Node no Machine has"
        );
        let pool = PoolKeys::default();
        assert_eq!(
            Lookups::after_pool(&change("p1", None, Some(pool.clone()))),
            Reconciles {
                pools: set(&["p1"]),
                ..Reconciles::default()
            }
        );
        assert_eq!(
            Lookups::after_pool(&change("p1", Some(pool), None)),
            Reconciles::default(),
            "a deleted pool: nothing to reconcile"
        );
        let on_m1 = OperationKeys {
            machine: Some("m1".into()),
            parents: vec![("parent".into(), "uid".into())],
        };
        assert_eq!(
            lookups.after_operation(&change("op3", None, Some(on_m1.clone()))),
            Reconciles {
                operations: set(&["op3", "parent", "op1"]),
                access: set(&["m1"]),
                ..Reconciles::default()
            },
            "itself, its parent, its Machine's access and unfinished operations"
        );
        assert_eq!(
            lookups.after_operation(&change("op3", Some(on_m1), None)),
            lookups.after_operation(&change(
                "op3",
                None,
                Some(OperationKeys {
                    machine: Some("m1".into()),
                    parents: vec![("parent".into(), "uid".into())],
                })
            )),
            "a deleted operation reaches what it reached"
        );
    }
}
