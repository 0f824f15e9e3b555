//! Machines by what their decisions and the decisions of others depend on.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use unbounded_api::well_known::{annotations, labels};
use unbounded_api::{Machine, MachinePhase, MachineProvider};

use super::{LabelIndex, narrowing};
use crate::selection::selector_matches;

/// What the index keeps of one Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineKeys {
    /// Its labels (for selectors).
    pub labels: BTreeMap<String, String>,
    /// `status.configuration` as `(configuration, version)`.
    pub recorded: Option<(String, i64)>,
    /// `spec.configurationRef` as `(configuration, version)`.
    pub named: Option<(String, Option<i64>)>,
    /// The Node name it becomes.
    pub node_name: String,
    /// `spec.providerID`.
    pub provider_id: Option<String>,
    /// `status.phase` (Pending when unset).
    pub phase: MachinePhase,
    /// Being deleted.
    pub deleting: bool,
    /// `spec.provider`.
    pub provider: MachineProvider,
    /// The `unbounded-cloud.io/repave` and `unbounded-cloud.io/repaving` annotations (a
    /// rollout waits on them).
    pub repave: (Option<String>, Option<String>),
}

impl MachineKeys {
    /// The keys of a Machine.
    pub fn of(machine: &Machine) -> Self {
        let status = machine.status.as_ref();
        Self {
            labels: machine.labels().clone(),
            recorded: status
                .and_then(|s| s.configuration.as_ref())
                .map(|c| (c.name.clone(), c.version)),
            named: machine
                .spec
                .configuration_ref
                .as_ref()
                .map(|r| (r.name.clone(), r.version)),
            node_name: machine.node_name(),
            provider_id: machine.spec.provider_id.clone(),
            phase: status
                .and_then(|s| s.phase)
                .unwrap_or(MachinePhase::Pending),
            deleting: machine.metadata.deletion_timestamp.is_some(),
            provider: machine.spec.provider,
            repave: (
                machine.annotations().get(annotations::REPAVE).cloned(),
                machine.annotations().get(annotations::REPAVING).cloned(),
            ),
        }
    }

    /// The MachinePool its label names.
    pub fn pool(&self) -> Option<&str> {
        self.labels.get(labels::POOL).map(String::as_str)
    }

    /// The versions this Machine counts towards: the one it records and the one it pins
    /// (which a repave will apply), each once. The same rule as
    /// [`crate::configuration::machine_counts`].
    pub fn counted_versions(&self) -> BTreeSet<(&str, i64)> {
        let mut versions = BTreeSet::new();
        if let Some((c, v)) = &self.recorded {
            versions.insert((c.as_str(), *v));
        }
        if let Some((c, Some(v))) = &self.named {
            versions.insert((c.as_str(), *v));
        }
        versions
    }

    /// The configurations this Machine records or names.
    pub fn configurations(&self) -> BTreeSet<&str> {
        self.recorded
            .iter()
            .map(|(c, _)| c.as_str())
            .chain(self.named.iter().map(|(c, _)| c.as_str()))
            .collect()
    }
}

/// Machines by label, by configuration, by Node, and their counts.
#[derive(Debug, Clone, Default)]
pub struct MachineIndex {
    keys: HashMap<String, MachineKeys>,
    labels: LabelIndex,
    by_configuration: HashMap<String, BTreeSet<String>>,
    by_node_name: HashMap<String, BTreeSet<String>>,
    by_provider_id: HashMap<String, BTreeSet<String>>,
    counts: HashMap<String, BTreeMap<i64, i64>>,
    phases: BTreeMap<MachinePhase, i64>,
}

fn file(map: &mut HashMap<String, BTreeSet<String>>, key: &str, name: &str) {
    map.entry(key.to_owned())
        .or_default()
        .insert(name.to_owned());
}

fn unfile(map: &mut HashMap<String, BTreeSet<String>>, key: &str, name: &str) {
    if let Some(names) = map.get_mut(key) {
        names.remove(name);
        if names.is_empty() {
            map.remove(key);
        }
    }
}

impl MachineIndex {
    /// Records a Machine's new keys; returns its previous ones.
    pub fn apply(&mut self, name: &str, keys: MachineKeys) -> Option<MachineKeys> {
        let old = self.remove(name);
        self.labels.insert(name, &keys.labels);
        for c in keys.configurations() {
            file(&mut self.by_configuration, c, name);
        }
        file(&mut self.by_node_name, &keys.node_name, name);
        if let Some(p) = &keys.provider_id {
            file(&mut self.by_provider_id, p, name);
        }
        for (c, v) in keys.counted_versions() {
            *self
                .counts
                .entry(c.to_owned())
                .or_default()
                .entry(v)
                .or_insert(0) += 1;
        }
        *self.phases.entry(keys.phase).or_insert(0) += 1;
        self.keys.insert(name.to_owned(), keys);
        old
    }

    /// Forgets a Machine; returns its keys.
    pub fn remove(&mut self, name: &str) -> Option<MachineKeys> {
        let keys = self.keys.remove(name)?;
        self.labels.remove(name, &keys.labels);
        for c in keys.configurations() {
            unfile(&mut self.by_configuration, c, name);
        }
        unfile(&mut self.by_node_name, &keys.node_name, name);
        if let Some(p) = &keys.provider_id {
            unfile(&mut self.by_provider_id, p, name);
        }
        for (c, v) in keys.counted_versions() {
            if let Some(versions) = self.counts.get_mut(c) {
                if let Some(n) = versions.get_mut(&v) {
                    *n -= 1;
                    if *n <= 0 {
                        versions.remove(&v);
                    }
                }
                if versions.is_empty() {
                    self.counts.remove(c);
                }
            }
        }
        if let Some(n) = self.phases.get_mut(&keys.phase) {
            *n -= 1;
        }
        Some(keys)
    }

    /// After a relist: forgets every Machine not in `present`; returns the forgotten ones.
    pub fn retain(&mut self, present: &BTreeSet<String>) -> Vec<(String, MachineKeys)> {
        let gone: Vec<String> = self
            .keys
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|n| self.remove(&n).map(|k| (n, k)))
            .collect()
    }

    /// The keys of a Machine.
    pub fn get(&self, name: &str) -> Option<&MachineKeys> {
        self.keys.get(name)
    }

    /// Number of Machines.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every Machine's name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// For each version number of `configuration`, how many Machines record or pin it
    /// (versions no Machine references are absent).
    pub fn counts_of(&self, configuration: &str) -> BTreeMap<i64, i64> {
        self.counts.get(configuration).cloned().unwrap_or_default()
    }

    /// Machines that record or name `configuration`.
    pub fn of_configuration(&self, configuration: &str) -> impl Iterator<Item = &str> {
        self.by_configuration
            .get(configuration)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// Machines whose labels `selector` matches (none for an absent selector).
    pub fn matching(&self, selector: Option<&LabelSelector>) -> Vec<&str> {
        let Some(selector) = selector else {
            return Vec::new();
        };
        let candidates: Box<dyn Iterator<Item = &str>> =
            match self.labels.narrowed(&narrowing(selector)) {
                Some(names) => Box::new(names.into_iter()),
                None => Box::new(self.names()),
            };
        // The selector is parsed once, not once per Machine.
        let parsed = kube::core::Selector::try_from(selector.clone()).ok();
        candidates
            .filter(|name| {
                let Some(keys) = self.keys.get(*name) else {
                    return false;
                };
                match &parsed {
                    Some(s) => kube::core::SelectorExt::matches(s, &keys.labels),
                    None => selector_matches(Some(selector), &keys.labels),
                }
            })
            .collect()
    }

    /// Machines whose Node this is: by name, or by provider ID.
    pub fn of_node(&self, node_name: &str, provider_id: Option<&str>) -> BTreeSet<&str> {
        let by_name = self.by_node_name.get(node_name).into_iter().flatten();
        let by_id = provider_id
            .and_then(|p| self.by_provider_id.get(p))
            .into_iter()
            .flatten();
        by_name.chain(by_id).map(String::as_str).collect()
    }

    /// Machines per phase.
    pub fn phase_counts(&self) -> BTreeMap<MachinePhase, i64> {
        self.phases.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::machine_counts;
    use std::sync::Arc;
    use unbounded_api::{
        ConfigurationRef, MachineProvider, MachineSpec, MachineStatus, ResolvedConfiguration,
    };

    fn machine(
        name: &str,
        labels: &[(&str, &str)],
        recorded: Option<(&str, i64)>,
        named: Option<(&str, Option<i64>)>,
    ) -> Machine {
        let mut m = Machine::new(
            name,
            MachineSpec {
                provider: MachineProvider::Manual,
                pxe: None,
                azure: None,
                configuration_ref: named.map(|(name, version)| ConfigurationRef {
                    name: name.into(),
                    version,
                }),
                provider_id: Some(format!("pxe://{name}")),
                node_name: None,
            },
        );
        m.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        m.status = Some(MachineStatus {
            configuration: recorded.map(|(name, version)| ResolvedConfiguration {
                name: name.into(),
                version,
            }),
            ..MachineStatus::default()
        });
        m
    }

    fn fleet() -> Vec<Machine> {
        vec![
            machine("m1", &[("rack", "r1")], Some(("a", 1)), None),
            machine(
                "m2",
                &[("rack", "r1")],
                Some(("a", 1)),
                Some(("a", Some(1))),
            ),
            machine(
                "m3",
                &[("rack", "r2")],
                Some(("a", 2)),
                Some(("a", Some(1))),
            ),
            machine("m4", &[("rack", "r2")], Some(("b", 1)), None),
            machine("m5", &[], None, Some(("a", None))),
            machine("m6", &[("gpu", "yes")], None, Some(("a", Some(3)))),
        ]
    }

    fn index_of(machines: &[Machine]) -> MachineIndex {
        let mut index = MachineIndex::default();
        for m in machines {
            index.apply(&m.name_any(), MachineKeys::of(m));
        }
        index
    }

    /// The incremental counts are the counts `machine_counts` computes over all Machines,
    /// after any sequence of changes.
    #[test]
    fn counts_match_the_full_count_after_every_change() {
        let mut machines = fleet();
        let mut index = index_of(&machines);
        let check = |index: &MachineIndex, machines: &[Machine], step: &str| {
            let arcs: Vec<Arc<Machine>> = machines.iter().cloned().map(Arc::new).collect();
            for c in ["a", "b", "c"] {
                assert_eq!(index.counts_of(c), machine_counts(c, &arcs), "{step}: {c}");
            }
        };
        check(&index, &machines, "initial");

        // m5 records a version; m1 moves to a2 (repave); m4 is deleted; m6 unpins.
        let changes: Vec<(&str, Option<Machine>)> = vec![
            (
                "m5",
                Some(machine("m5", &[], Some(("a", 2)), Some(("a", None)))),
            ),
            (
                "m1",
                Some(machine("m1", &[("rack", "r1")], Some(("a", 2)), None)),
            ),
            ("m4", None),
            ("m6", Some(machine("m6", &[("gpu", "yes")], None, None))),
            (
                "m7",
                Some(machine("m7", &[], Some(("c", 1)), Some(("c", Some(1))))),
            ),
        ];
        for (name, change) in changes {
            machines.retain(|m| m.name_any() != name);
            match change {
                Some(m) => {
                    index.apply(name, MachineKeys::of(&m));
                    machines.push(m);
                }
                None => {
                    index.remove(name);
                }
            }
            check(&index, &machines, name);
        }
        assert_eq!(
            index.counts_of("c"),
            BTreeMap::from([(1, 1)]),
            "pinned and recorded count once"
        );
    }

    #[test]
    fn queries_table() {
        let index = index_of(&fleet());
        let selector = |labels: &[(&str, &str)]| LabelSelector {
            match_labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            match_expressions: None,
        };
        let mut matched = index.matching(Some(&selector(&[("rack", "r1")])));
        matched.sort_unstable();
        assert_eq!(matched, vec!["m1", "m2"]);
        let mut everything = index.matching(Some(&LabelSelector::default()));
        everything.sort_unstable();
        assert_eq!(everything, vec!["m1", "m2", "m3", "m4", "m5", "m6"]);
        assert!(
            index.matching(None).is_empty(),
            "no selector matches nothing"
        );
        assert!(
            index
                .matching(Some(&selector(&[("rack", "r1"), ("gpu", "yes")])))
                .is_empty(),
            "every requirement counts, not only the indexed one"
        );

        let mut of_a: Vec<&str> = index.of_configuration("a").collect();
        of_a.sort_unstable();
        assert_eq!(of_a, vec!["m1", "m2", "m3", "m5", "m6"]);
        assert_eq!(index.of_configuration("b").collect::<Vec<_>>(), vec!["m4"]);

        assert_eq!(index.of_node("m3", None), BTreeSet::from(["m3"]));
        assert_eq!(
            index.of_node("other", Some("pxe://m4")),
            BTreeSet::from(["m4"]),
            "found by provider ID"
        );
        assert!(index.of_node("other", Some("pxe://none")).is_empty());
        assert_eq!(index.phase_counts()[&MachinePhase::Pending], 6);
    }

    /// Selector queries through the index give what filtering every Machine gives.
    #[test]
    fn matching_equals_a_full_scan() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let machines = fleet();
        let index = index_of(&machines);
        let req = |key: &str, op: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        };
        let selectors = vec![
            LabelSelector::default(),
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("rack", "In", &["r1", "r2"])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("rack", "NotIn", &["r1"])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("gpu", "Exists", &[])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("gpu", "DoesNotExist", &[])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("rack", "Bogus", &["r1"])]),
            },
        ];
        for selector in selectors {
            let mut from_index = index.matching(Some(&selector));
            from_index.sort_unstable();
            let mut scanned: Vec<String> = machines
                .iter()
                .filter(|m| selector_matches(Some(&selector), m.labels()))
                .map(|m| m.name_any())
                .collect();
            scanned.sort_unstable();
            assert_eq!(from_index, scanned, "{selector:?}");
        }
    }

    #[test]
    fn relist_forgets_what_is_gone() {
        let mut index = index_of(&fleet());
        let present: BTreeSet<String> = ["m1", "m2"].iter().map(|s| (*s).to_owned()).collect();
        let mut gone: Vec<String> = index.retain(&present).into_iter().map(|(n, _)| n).collect();
        gone.sort_unstable();
        assert_eq!(gone, vec!["m3", "m4", "m5", "m6"]);
        assert_eq!(index.len(), 2);
        assert_eq!(index.counts_of("a"), BTreeMap::from([(1, 2)]));
        assert!(index.counts_of("b").is_empty());
        assert!(index.of_node("m4", Some("pxe://m4")).is_empty());
    }
}
