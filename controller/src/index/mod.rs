//! Indexes kept beside the reflector stores, so that the work of one watch event or one
//! reconcile is proportional to what it touches, not to the number of Machines.
//!
//! - [`machines::MachineIndex`]: Machines by label (for selectors), by the configuration
//!   they record or name, by Node name and provider ID, and the per-version Machine counts
//!   and per-phase counts, all maintained incrementally.
//! - [`catalog::Catalog`]: configurations (selector, priority) indexed by the labels their
//!   selectors require, and their versions (number, deployed): what selection needs, so a
//!   Machine's reconcile looks only at the configurations that may match it.
//! - [`operations::OperationIndex`]: single-machine operations by Machine and children by
//!   parent.
//! - [`pools::PoolIndex`]: MachinePools by the configuration they name, and the PXE pools
//!   short of Machines.
//!
//! The watch drivers in [`crate::runner`] update an index from every event right after the
//! reflector updated its store, and turn the difference between an object's old and new
//! keys into triggers ([`crate::triggers`]). Every index is plain data behind a lock
//! ([`Shared`]); its methods are pure and tested table by table.

pub mod catalog;
pub mod machines;
pub mod operations;
pub mod pools;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

use catalog::{Catalog, ConfigurationKeys, VersionKeys};
use machines::{MachineIndex, MachineKeys};
use operations::{NodeIndex, OperationIndex, OperationKeys};
use pools::{PoolIndex, PoolKeys};

/// One object's change as its index saw it: its keys before and after (`None`: it did not
/// exist, or no longer does).
#[derive(Debug, Clone, PartialEq)]
pub struct Change<Keys> {
    /// The object's name.
    pub name: String,
    /// Its keys before the change.
    pub old: Option<Keys>,
    /// Its keys after the change.
    pub new: Option<Keys>,
}

/// An index of one kind `K` by object name, as its watch keeps it: every update returns
/// what the index held before, so that the watch can tell what changed
/// ([`crate::watches::index_change`]).
pub trait KeyedIndex<K> {
    /// What the index keeps of one object.
    type Keys: Clone;
    /// The keys of an object.
    fn keys_of(object: &K) -> Self::Keys;
    /// Records an object's keys; returns the previous ones.
    fn apply_keys(&mut self, name: &str, keys: Self::Keys) -> Option<Self::Keys>;
    /// Forgets an object; returns its keys.
    fn remove_keys(&mut self, name: &str) -> Option<Self::Keys>;
    /// After a relist: forgets every object not in `present`; returns them with their keys.
    fn retain_keys(&mut self, present: &BTreeSet<String>) -> Vec<(String, Self::Keys)>;
}

/// Implements [`KeyedIndex`] with an index's own methods.
macro_rules! keyed_index {
    ($index:ty, $kind:ty, $keys:ty, $of:path, $apply:ident, $remove:ident, $retain:ident) => {
        impl KeyedIndex<$kind> for $index {
            type Keys = $keys;
            fn keys_of(object: &$kind) -> $keys {
                $of(object)
            }
            fn apply_keys(&mut self, name: &str, keys: $keys) -> Option<$keys> {
                self.$apply(name, keys)
            }
            fn remove_keys(&mut self, name: &str) -> Option<$keys> {
                self.$remove(name)
            }
            fn retain_keys(&mut self, present: &BTreeSet<String>) -> Vec<(String, $keys)> {
                self.$retain(present)
            }
        }
    };
}

keyed_index!(
    MachineIndex,
    Machine,
    MachineKeys,
    MachineKeys::of,
    apply,
    remove,
    retain
);
keyed_index!(
    PoolIndex,
    MachinePool,
    PoolKeys,
    PoolKeys::of,
    apply,
    remove,
    retain
);
keyed_index!(
    OperationIndex,
    MachineOperation,
    OperationKeys,
    OperationKeys::of,
    apply,
    remove,
    retain
);
keyed_index!(
    NodeIndex,
    Node,
    Option<String>,
    NodeIndex::provider_id,
    apply,
    remove,
    retain
);
keyed_index!(
    Catalog,
    MachineConfiguration,
    ConfigurationKeys,
    ConfigurationKeys::of,
    apply_configuration,
    remove_configuration,
    retain_configurations
);
keyed_index!(
    Catalog,
    MachineConfigurationVersion,
    VersionKeys,
    VersionKeys::of,
    apply_version,
    remove_version,
    retain_versions
);

/// An index shared by the watch driver that writes it and the reconcilers that read it.
#[derive(Debug, Default)]
pub struct Shared<T>(Arc<RwLock<T>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Shared<T> {
    /// Wraps an index.
    pub fn new(index: T) -> Self {
        Self(Arc::new(RwLock::new(index)))
    }

    /// Reads the index. A writer that panicked left a complete index behind (every update
    /// is applied in one call), so a poisoned lock is still readable.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the index.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where the objects a label selector may match are found. It is only a pre-filter: the
/// selector itself decides ([`crate::selection::selector_matches`]), so every answer here
/// must include every object the selector matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Narrowing {
    /// Only objects that carry one of these `(key, value)` labels.
    AnyOf(Vec<(String, String)>),
    /// Only objects that carry this label key, with any value.
    HasKey(String),
    /// Any object (the selector has no positive requirement: empty, `NotIn`,
    /// `DoesNotExist`, or an operator the API server would refuse).
    Everything,
}

/// The narrowest positive requirement of a selector: a `matchLabels` entry (one value)
/// first, else the `In` requirement with the fewest values, else an `Exists`.
pub fn narrowing(selector: &LabelSelector) -> Narrowing {
    if let Some((key, value)) = selector.match_labels.iter().flatten().next() {
        return Narrowing::AnyOf(vec![(key.clone(), value.clone())]);
    }
    let expressions = selector.match_expressions.iter().flatten();
    let operators = ["In", "NotIn", "Exists", "DoesNotExist"];
    if expressions
        .clone()
        .any(|e| !operators.contains(&e.operator.as_str()))
    {
        return Narrowing::Everything;
    }
    let narrowest_in = expressions
        .clone()
        .filter(|e| e.operator == "In")
        .min_by_key(|e| e.values.as_ref().map_or(0, Vec::len));
    if let Some(requirement) = narrowest_in {
        return Narrowing::AnyOf(
            requirement
                .values
                .iter()
                .flatten()
                .map(|v| (requirement.key.clone(), v.clone()))
                .collect(),
        );
    }
    match expressions.clone().find(|e| e.operator == "Exists") {
        Some(requirement) => Narrowing::HasKey(requirement.key.clone()),
        None => Narrowing::Everything,
    }
}

/// Names by label: `key → value → names`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelIndex {
    by_label: BTreeMap<String, BTreeMap<String, std::collections::BTreeSet<String>>>,
}

impl LabelIndex {
    /// Files `name` under each of its labels.
    pub fn insert(&mut self, name: &str, labels: &BTreeMap<String, String>) {
        for (key, value) in labels {
            self.by_label
                .entry(key.clone())
                .or_default()
                .entry(value.clone())
                .or_default()
                .insert(name.to_owned());
        }
    }

    /// Removes `name` from under each of these labels.
    pub fn remove(&mut self, name: &str, labels: &BTreeMap<String, String>) {
        for (key, value) in labels {
            let Some(values) = self.by_label.get_mut(key) else {
                continue;
            };
            if let Some(names) = values.get_mut(value) {
                names.remove(name);
                if names.is_empty() {
                    values.remove(value);
                }
            }
            if values.is_empty() {
                self.by_label.remove(key);
            }
        }
    }

    /// The names a narrowing points at; `None` for [`Narrowing::Everything`].
    pub fn narrowed(&self, narrowing: &Narrowing) -> Option<std::collections::BTreeSet<&str>> {
        match narrowing {
            Narrowing::Everything => None,
            Narrowing::AnyOf(pairs) => Some(
                pairs
                    .iter()
                    .filter_map(|(k, v)| self.by_label.get(k)?.get(v))
                    .flatten()
                    .map(String::as_str)
                    .collect(),
            ),
            Narrowing::HasKey(key) => Some(
                self.by_label
                    .get(key)
                    .into_iter()
                    .flat_map(|values| values.values().flatten())
                    .map(String::as_str)
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Narrowing {
        Narrowing::AnyOf(
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn narrowing_table() {
        let labels = |list: &[(&str, &str)]| {
            Some(
                list.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        let cases: Vec<(&str, LabelSelector, Narrowing)> = vec![
            (
                "empty selector",
                LabelSelector::default(),
                Narrowing::Everything,
            ),
            (
                "matchLabels",
                LabelSelector {
                    match_labels: labels(&[("rack", "r1")]),
                    match_expressions: None,
                },
                pairs(&[("rack", "r1")]),
            ),
            (
                "matchLabels wins over expressions",
                LabelSelector {
                    match_labels: labels(&[("rack", "r1")]),
                    match_expressions: Some(vec![requirement("pool", "In", &["a", "b"])]),
                },
                pairs(&[("rack", "r1")]),
            ),
            (
                "the In with the fewest values",
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![
                        requirement("rack", "In", &["r1", "r2", "r3"]),
                        requirement("pool", "In", &["a"]),
                    ]),
                },
                pairs(&[("pool", "a")]),
            ),
            (
                "In before Exists",
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![
                        requirement("gpu", "Exists", &[]),
                        requirement("rack", "In", &["r1", "r2"]),
                    ]),
                },
                pairs(&[("rack", "r1"), ("rack", "r2")]),
            ),
            (
                "Exists",
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![
                        requirement("rack", "NotIn", &["r1"]),
                        requirement("gpu", "Exists", &[]),
                    ]),
                },
                Narrowing::HasKey("gpu".into()),
            ),
            (
                "only negative requirements",
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![
                        requirement("rack", "NotIn", &["r1"]),
                        requirement("gpu", "DoesNotExist", &[]),
                    ]),
                },
                Narrowing::Everything,
            ),
            (
                "an operator the API server refuses",
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![requirement("rack", "Bogus", &["r1"])]),
                },
                Narrowing::Everything,
            ),
        ];
        for (case, selector, expected) in cases {
            assert_eq!(narrowing(&selector), expected, "{case}");
        }
    }

    #[test]
    fn label_index_table() {
        let labels = |list: &[(&str, &str)]| -> BTreeMap<String, String> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let mut index = LabelIndex::default();
        index.insert("a", &labels(&[("rack", "r1"), ("gpu", "yes")]));
        index.insert("b", &labels(&[("rack", "r2")]));
        index.insert("c", &labels(&[("rack", "r1")]));
        let names = |n: &Narrowing, index: &LabelIndex| -> Option<Vec<String>> {
            index
                .narrowed(n)
                .map(|s| s.into_iter().map(str::to_owned).collect())
        };
        let cases: Vec<(&str, Narrowing, Option<Vec<&str>>)> = vec![
            ("one pair", pairs(&[("rack", "r1")]), Some(vec!["a", "c"])),
            (
                "several pairs",
                pairs(&[("rack", "r1"), ("rack", "r2")]),
                Some(vec!["a", "b", "c"]),
            ),
            ("a pair nobody has", pairs(&[("rack", "r9")]), Some(vec![])),
            ("a key", Narrowing::HasKey("gpu".into()), Some(vec!["a"])),
            ("everything", Narrowing::Everything, None),
        ];
        for (case, narrowing, expected) in cases {
            assert_eq!(
                names(&narrowing, &index),
                expected.map(|v| v.into_iter().map(str::to_owned).collect()),
                "{case}"
            );
        }
        index.remove("a", &labels(&[("rack", "r1"), ("gpu", "yes")]));
        assert_eq!(
            names(&Narrowing::HasKey("gpu".into()), &index),
            Some(vec![])
        );
        index.remove("b", &labels(&[("rack", "r2")]));
        index.remove("c", &labels(&[("rack", "r1")]));
        assert_eq!(index, LabelIndex::default(), "emptied entries are dropped");
    }
}
