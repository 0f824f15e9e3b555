//! MachinePools, as their triggers need them: which pools a configuration change concerns,
//! and which short PXE pools a free Machine could serve.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use unbounded_api::{MachinePool, MachineProvider};

use crate::selection::selector_matches;

/// What the index keeps of a pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolKeys {
    /// The inventory selector of a PXE pool.
    pub inventory: Option<LabelSelector>,
    /// The configuration its template names (none: its Machines' labels select one).
    pub configuration: Option<String>,
}

impl PoolKeys {
    /// The keys of a pool.
    pub fn of(pool: &MachinePool) -> Self {
        let spec = &pool.spec.template.spec;
        Self {
            inventory: spec
                .pxe
                .as_ref()
                .filter(|_| spec.provider == MachineProvider::Pxe)
                .map(|p| p.inventory_selector.clone()),
            configuration: spec.configuration_ref.as_ref().map(|r| r.name.clone()),
        }
    }
}

/// Pools by name, and which PXE pools are short of Machines.
#[derive(Debug, Clone, Default)]
pub struct PoolIndex {
    pools: BTreeMap<String, PoolKeys>,
    short: BTreeSet<String>,
}

impl PoolIndex {
    /// Records a pool's keys; returns the previous ones.
    pub fn apply(&mut self, name: &str, keys: PoolKeys) -> Option<PoolKeys> {
        self.pools.insert(name.to_owned(), keys)
    }

    /// Forgets a pool; returns its keys.
    pub fn remove(&mut self, name: &str) -> Option<PoolKeys> {
        self.short.remove(name);
        self.pools.remove(name)
    }

    /// After a relist: forgets pools not in `present`; returns them with their keys.
    pub fn retain(&mut self, present: &BTreeSet<String>) -> Vec<(String, PoolKeys)> {
        self.short.retain(|name| present.contains(name));
        let (kept, gone): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.pools)
            .into_iter()
            .partition(|(name, _)| present.contains(name));
        self.pools = kept;
        gone.into_iter().collect()
    }

    /// Whether a PXE pool found too few free Machines at its last pass.
    pub fn set_short(&mut self, name: &str, short: bool) {
        if short && self.pools.contains_key(name) {
            self.short.insert(name.to_owned());
        } else {
            self.short.remove(name);
        }
    }

    /// The short PXE pools whose inventory selector matches a free Machine's labels.
    pub fn short_pools_matching(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        self.short
            .iter()
            .filter(|name| {
                self.pools
                    .get(*name)
                    .and_then(|k| k.inventory.as_ref())
                    .is_some_and(|s| selector_matches(Some(s), labels))
            })
            .cloned()
            .collect()
    }

    /// The pools whose Machines may resolve to `configuration`: those whose template names
    /// it, and those whose template names none.
    pub fn pools_for_configuration(&self, configuration: &str) -> Vec<String> {
        self.pools
            .iter()
            .filter(|(_, k)| {
                k.configuration
                    .as_deref()
                    .is_none_or(|c| c == configuration)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_index_table() {
        let rack = |r: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([("rack".to_owned(), r.to_owned())])),
            match_expressions: None,
        };
        let mut index = PoolIndex::default();
        index.apply(
            "pxe-a",
            PoolKeys {
                inventory: Some(rack("r1")),
                configuration: Some("general".into()),
            },
        );
        index.apply(
            "pxe-b",
            PoolKeys {
                inventory: Some(rack("r2")),
                configuration: None,
            },
        );
        index.apply(
            "azure",
            PoolKeys {
                inventory: None,
                configuration: Some("gpu".into()),
            },
        );
        let r1 = BTreeMap::from([("rack".to_owned(), "r1".to_owned())]);
        assert!(index.short_pools_matching(&r1).is_empty(), "none short");
        index.set_short("pxe-a", true);
        index.set_short("pxe-b", true);
        assert_eq!(index.short_pools_matching(&r1), vec!["pxe-a".to_owned()]);
        index.set_short("pxe-a", false);
        assert!(index.short_pools_matching(&r1).is_empty());
        assert_eq!(
            index.pools_for_configuration("general"),
            vec!["pxe-a".to_owned(), "pxe-b".to_owned()]
        );
        assert_eq!(
            index.pools_for_configuration("gpu"),
            vec!["azure".to_owned(), "pxe-b".to_owned()]
        );
        index.retain(&BTreeSet::from(["azure".to_owned()]));
        assert_eq!(
            index.pools_for_configuration("general"),
            Vec::<String>::new()
        );
        index.set_short("gone", true);
        assert!(index.short.is_empty(), "an unknown pool is never short");
    }
}
