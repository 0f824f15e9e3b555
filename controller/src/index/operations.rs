//! MachineOperations by the Machine they act on and by their parent, and Nodes by provider
//! ID: the lookups that otherwise scan every operation or Node.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use unbounded_api::MachineOperation;

/// What the index keeps of a MachineOperation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationKeys {
    /// `spec.machineRef.name`.
    pub machine: Option<String>,
    /// `(name, uid)` of the MachineOperations that own it.
    pub parents: Vec<(String, String)>,
}

impl OperationKeys {
    /// The keys of an operation.
    pub fn of(operation: &MachineOperation) -> Self {
        Self {
            machine: operation.spec.machine_ref.as_ref().map(|r| r.name.clone()),
            parents: operation
                .metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|r| r.kind == "MachineOperation")
                .map(|r| (r.name.clone(), r.uid.clone()))
                .collect(),
        }
    }
}

/// A multimap from a key to names, dropping emptied keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Names(HashMap<String, BTreeSet<String>>);

impl Names {
    fn insert(&mut self, key: &str, name: &str) {
        self.0
            .entry(key.to_owned())
            .or_default()
            .insert(name.to_owned());
    }

    fn remove(&mut self, key: &str, name: &str) {
        if let Some(names) = self.0.get_mut(key) {
            names.remove(name);
            if names.is_empty() {
                self.0.remove(key);
            }
        }
    }

    fn get(&self, key: &str) -> impl Iterator<Item = &str> {
        self.0.get(key).into_iter().flatten().map(String::as_str)
    }
}

/// Operations by Machine and by parent.
#[derive(Debug, Clone, Default)]
pub struct OperationIndex {
    keys: HashMap<String, OperationKeys>,
    by_machine: Names,
    by_parent_uid: Names,
}

impl OperationIndex {
    /// Records an operation's keys; returns the previous ones.
    pub fn apply(&mut self, name: &str, keys: OperationKeys) -> Option<OperationKeys> {
        let old = self.remove(name);
        if let Some(m) = &keys.machine {
            self.by_machine.insert(m, name);
        }
        for (_, uid) in &keys.parents {
            self.by_parent_uid.insert(uid, name);
        }
        self.keys.insert(name.to_owned(), keys);
        old
    }

    /// Forgets an operation; returns its keys.
    pub fn remove(&mut self, name: &str) -> Option<OperationKeys> {
        let keys = self.keys.remove(name)?;
        if let Some(m) = &keys.machine {
            self.by_machine.remove(m, name);
        }
        for (_, uid) in &keys.parents {
            self.by_parent_uid.remove(uid, name);
        }
        Some(keys)
    }

    /// After a relist: forgets every operation not in `present`.
    pub fn retain(&mut self, present: &BTreeSet<String>) -> Vec<(String, OperationKeys)> {
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

    /// The single-machine operations on a Machine.
    pub fn on_machine(&self, machine: &str) -> Vec<String> {
        self.by_machine.get(machine).map(str::to_owned).collect()
    }

    /// The children of the operation with this UID.
    pub fn children_of(&self, parent_uid: &str) -> Vec<String> {
        self.by_parent_uid
            .get(parent_uid)
            .map(str::to_owned)
            .collect()
    }
}

/// Nodes by `spec.providerID`.
#[derive(Debug, Clone, Default)]
pub struct NodeIndex {
    provider_ids: HashMap<String, Option<String>>,
    by_provider_id: Names,
}

impl NodeIndex {
    /// The provider ID of a Node.
    pub fn provider_id(node: &Node) -> Option<String> {
        node.spec.as_ref().and_then(|s| s.provider_id.clone())
    }

    /// Records a Node and its provider ID; returns whether it was known, with its previous
    /// provider ID.
    pub fn apply(&mut self, name: &str, provider_id: Option<String>) -> Option<Option<String>> {
        let old = self.remove(name);
        if let Some(id) = &provider_id {
            self.by_provider_id.insert(id, name);
        }
        self.provider_ids.insert(name.to_owned(), provider_id);
        old
    }

    /// Forgets a Node; returns whether it was known, with its provider ID.
    pub fn remove(&mut self, name: &str) -> Option<Option<String>> {
        let id = self.provider_ids.remove(name)?;
        if let Some(id) = &id {
            self.by_provider_id.remove(id, name);
        }
        Some(id)
    }

    /// After a relist: forgets every Node not in `present`; returns the forgotten ones
    /// with their provider IDs.
    pub fn retain(&mut self, present: &BTreeSet<String>) -> Vec<(String, Option<String>)> {
        let gone: Vec<String> = self
            .provider_ids
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|name| self.remove(&name).map(|id| (name, id)))
            .collect()
    }

    /// The Node with this provider ID (the first by name if several claim it).
    pub fn with_provider_id(&self, provider_id: &str) -> Option<String> {
        self.by_provider_id
            .get(provider_id)
            .next()
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(machine: Option<&str>, parents: &[&str]) -> OperationKeys {
        OperationKeys {
            machine: machine.map(str::to_owned),
            parents: parents
                .iter()
                .map(|p| (format!("name-of-{p}"), (*p).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn operations_table() {
        let mut index = OperationIndex::default();
        index.apply("parent", keys(None, &[]));
        index.apply("parent-m1", keys(Some("m1"), &["uid-p"]));
        index.apply("parent-m2", keys(Some("m2"), &["uid-p"]));
        index.apply("reboot-m1", keys(Some("m1"), &[]));
        assert_eq!(index.on_machine("m1"), vec!["parent-m1", "reboot-m1"]);
        assert_eq!(index.children_of("uid-p"), vec!["parent-m1", "parent-m2"]);
        assert!(index.on_machine("m3").is_empty());

        // An operation's machine never changes (its spec is immutable), but a re-apply with
        // other keys must still move it.
        index.apply("reboot-m1", keys(Some("m3"), &[]));
        assert_eq!(index.on_machine("m1"), vec!["parent-m1"]);
        assert_eq!(index.on_machine("m3"), vec!["reboot-m1"]);

        index.remove("parent-m1");
        assert_eq!(index.children_of("uid-p"), vec!["parent-m2"]);
        let present: BTreeSet<String> = ["parent".to_owned()].into();
        let mut gone: Vec<String> = index.retain(&present).into_iter().map(|(n, _)| n).collect();
        gone.sort_unstable();
        assert_eq!(gone, vec!["parent-m2", "reboot-m1"]);
        assert!(index.children_of("uid-p").is_empty());
    }

    #[test]
    fn nodes_by_provider_id() {
        let mut index = NodeIndex::default();
        index.apply("n1", Some("pxe://aa".into()));
        index.apply("n2", None);
        assert_eq!(index.with_provider_id("pxe://aa"), Some("n1".into()));
        index.apply("n1", Some("pxe://bb".into()));
        assert_eq!(index.with_provider_id("pxe://aa"), None);
        assert_eq!(index.with_provider_id("pxe://bb"), Some("n1".into()));
        let mut gone = index.retain(&BTreeSet::from(["n2".to_owned()]));
        gone.sort();
        assert_eq!(gone, vec![("n1".to_owned(), Some("pxe://bb".to_owned()))]);
        assert_eq!(index.with_provider_id("pxe://bb"), None);
        assert_eq!(index.remove("n2"), Some(None));
        assert_eq!(index.remove("n2"), None);
    }
}
