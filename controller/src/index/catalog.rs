//! Configurations and their versions, as selection needs them, with configurations indexed
//! by the labels their selectors require: a Machine's reconcile looks only at the
//! configurations that may match its labels (and the one it names), not at all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use unbounded_api::{MachineConfiguration, MachineConfigurationVersion, UpdateStrategyType};

use super::{Narrowing, narrowing};
use crate::selection::{Candidate, VersionInfo};

/// What the catalog keeps of a MachineConfiguration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigurationKeys {
    /// `spec.machineSelector`.
    pub selector: Option<LabelSelector>,
    /// `spec.priority`.
    pub priority: i32,
    /// `spec.updateStrategy.type` is RollingUpdate.
    pub rolling: bool,
    /// Being deleted.
    pub deleting: bool,
}

impl ConfigurationKeys {
    /// The keys of a configuration.
    pub fn of(configuration: &MachineConfiguration) -> Self {
        Self {
            selector: configuration.spec.machine_selector.clone(),
            priority: configuration.spec.priority,
            rolling: configuration.spec.update_strategy_type() == UpdateStrategyType::RollingUpdate,
            deleting: configuration.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// What the catalog keeps of a MachineConfigurationVersion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionKeys {
    /// `spec.configurationName`.
    pub configuration: String,
    /// `spec.version`.
    pub version: i64,
    /// `status.deployed`.
    pub deployed: bool,
    /// Being deleted.
    pub deleting: bool,
}

impl VersionKeys {
    /// The keys of a version.
    pub fn of(version: &MachineConfigurationVersion) -> Self {
        Self {
            configuration: version.spec.configuration_name.clone(),
            version: version.spec.version,
            deployed: version.status.as_ref().is_some_and(|s| s.deployed),
            deleting: version.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// A configuration with its versions, owned, ready to be borrowed as a [`Candidate`].
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedCandidate {
    /// Its name.
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// Its update strategy is RollingUpdate.
    pub rolling: bool,
    /// Its selector.
    pub selector: Option<LabelSelector>,
    /// Its versions that are not being deleted.
    pub versions: Vec<VersionInfo>,
}

impl OwnedCandidate {
    /// As selection takes it.
    pub fn borrowed(&self) -> Candidate<'_> {
        Candidate {
            name: &self.name,
            priority: self.priority,
            rolling: self.rolling,
            selector: self.selector.as_ref(),
            versions: self.versions.clone(),
        }
    }
}

/// Configurations and versions.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    configurations: BTreeMap<String, ConfigurationKeys>,
    versions: HashMap<String, VersionKeys>,
    versions_of: BTreeMap<String, BTreeSet<String>>,
    by_label: HashMap<(String, String), BTreeSet<String>>,
    by_label_key: HashMap<String, BTreeSet<String>>,
    unnarrowed: BTreeSet<String>,
}

impl Catalog {
    /// Records a configuration's keys; returns the previous ones.
    pub fn apply_configuration(
        &mut self,
        name: &str,
        keys: ConfigurationKeys,
    ) -> Option<ConfigurationKeys> {
        let old = self.remove_configuration(name);
        if let Some(selector) = &keys.selector {
            match narrowing(selector) {
                Narrowing::AnyOf(pairs) => {
                    for pair in pairs {
                        self.by_label
                            .entry(pair)
                            .or_default()
                            .insert(name.to_owned());
                    }
                }
                Narrowing::HasKey(key) => {
                    self.by_label_key
                        .entry(key)
                        .or_default()
                        .insert(name.to_owned());
                }
                Narrowing::Everything => {
                    self.unnarrowed.insert(name.to_owned());
                }
            }
        }
        self.configurations.insert(name.to_owned(), keys);
        old
    }

    /// Forgets a configuration; returns its keys.
    pub fn remove_configuration(&mut self, name: &str) -> Option<ConfigurationKeys> {
        let keys = self.configurations.remove(name)?;
        if let Some(selector) = &keys.selector {
            match narrowing(selector) {
                Narrowing::AnyOf(pairs) => {
                    for pair in pairs {
                        if let Some(names) = self.by_label.get_mut(&pair) {
                            names.remove(name);
                            if names.is_empty() {
                                self.by_label.remove(&pair);
                            }
                        }
                    }
                }
                Narrowing::HasKey(key) => {
                    if let Some(names) = self.by_label_key.get_mut(&key) {
                        names.remove(name);
                        if names.is_empty() {
                            self.by_label_key.remove(&key);
                        }
                    }
                }
                Narrowing::Everything => {
                    self.unnarrowed.remove(name);
                }
            }
        }
        Some(keys)
    }

    /// Records a version's keys (by the version object's name); returns the previous ones.
    pub fn apply_version(&mut self, name: &str, keys: VersionKeys) -> Option<VersionKeys> {
        let old = self.remove_version(name);
        self.versions_of
            .entry(keys.configuration.clone())
            .or_default()
            .insert(name.to_owned());
        self.versions.insert(name.to_owned(), keys);
        old
    }

    /// Forgets a version; returns its keys.
    pub fn remove_version(&mut self, name: &str) -> Option<VersionKeys> {
        let keys = self.versions.remove(name)?;
        if let Some(names) = self.versions_of.get_mut(&keys.configuration) {
            names.remove(name);
            if names.is_empty() {
                self.versions_of.remove(&keys.configuration);
            }
        }
        Some(keys)
    }

    /// After a relist of configurations: forgets those not in `present`.
    pub fn retain_configurations(
        &mut self,
        present: &BTreeSet<String>,
    ) -> Vec<(String, ConfigurationKeys)> {
        let gone: Vec<String> = self
            .configurations
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|n| self.remove_configuration(&n).map(|k| (n, k)))
            .collect()
    }

    /// After a relist of versions: forgets those not in `present`.
    pub fn retain_versions(&mut self, present: &BTreeSet<String>) -> Vec<(String, VersionKeys)> {
        let gone: Vec<String> = self
            .versions
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|n| self.remove_version(&n).map(|k| (n, k)))
            .collect()
    }

    /// A configuration's keys.
    pub fn configuration(&self, name: &str) -> Option<&ConfigurationKeys> {
        self.configurations.get(name)
    }

    /// Every configuration's name.
    pub fn configuration_names(&self) -> impl Iterator<Item = &str> {
        self.configurations.keys().map(String::as_str)
    }

    /// The names of a configuration's version objects that are not being deleted.
    pub fn version_names_of(&self, configuration: &str) -> Vec<String> {
        self.versions_of
            .get(configuration)
            .into_iter()
            .flatten()
            .filter(|n| self.versions.get(*n).is_some_and(|v| !v.deleting))
            .cloned()
            .collect()
    }

    /// How many configurations (not being deleted) have no version yet.
    pub fn awaiting_first_version(&self) -> usize {
        self.configurations
            .iter()
            .filter(|(name, keys)| !keys.deleting && self.version_infos(name).is_empty())
            .count()
    }

    /// The configurations (not being deleted) that selection must consider for a Machine
    /// with these labels that names `named`: those whose selector may match the labels and
    /// the named one. Selection over these decides exactly as over all of them.
    pub fn candidates_for(
        &self,
        labels: &BTreeMap<String, String>,
        named: Option<&str>,
    ) -> Vec<OwnedCandidate> {
        let mut names: BTreeSet<&str> = self.unnarrowed.iter().map(String::as_str).collect();
        for (key, value) in labels {
            if let Some(found) = self.by_label.get(&(key.clone(), value.clone())) {
                names.extend(found.iter().map(String::as_str));
            }
            if let Some(found) = self.by_label_key.get(key) {
                names.extend(found.iter().map(String::as_str));
            }
        }
        names.extend(named);
        names
            .into_iter()
            .filter_map(|name| {
                let keys = self.configurations.get(name).filter(|k| !k.deleting)?;
                Some(OwnedCandidate {
                    name: name.to_owned(),
                    priority: keys.priority,
                    rolling: keys.rolling,
                    selector: keys.selector.clone(),
                    versions: self.version_infos(name),
                })
            })
            .collect()
    }

    fn version_infos(&self, configuration: &str) -> Vec<VersionInfo> {
        self.versions_of
            .get(configuration)
            .into_iter()
            .flatten()
            .filter_map(|n| self.versions.get(n))
            .filter(|v| !v.deleting)
            .map(|v| VersionInfo {
                version: v.version,
                deployed: v.deployed,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::{Resolution, resolve};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use unbounded_api::ConfigurationRef;

    fn labels(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn match_labels(list: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(labels(list)),
            match_expressions: None,
        })
    }

    fn expressions(list: &[(&str, &str, &[&str])]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(
                list.iter()
                    .map(|(key, op, values)| LabelSelectorRequirement {
                        key: (*key).into(),
                        operator: (*op).into(),
                        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
                    })
                    .collect(),
            ),
        })
    }

    fn configuration(selector: Option<LabelSelector>, priority: i32) -> ConfigurationKeys {
        ConfigurationKeys {
            selector,
            priority,
            rolling: false,
            deleting: false,
        }
    }

    fn version(configuration: &str, version: i64, deployed: bool) -> VersionKeys {
        VersionKeys {
            configuration: configuration.into(),
            version,
            deployed,
            deleting: false,
        }
    }

    fn catalog() -> Catalog {
        let mut c = Catalog::default();
        let configurations = [
            ("rack-r1", configuration(match_labels(&[("rack", "r1")]), 1)),
            (
                "rack-r1-high",
                configuration(match_labels(&[("rack", "r1")]), 5),
            ),
            (
                "racks-12",
                configuration(expressions(&[("rack", "In", &["r1", "r2"])]), 3),
            ),
            (
                "gpu",
                configuration(expressions(&[("gpu", "Exists", &[])]), 9),
            ),
            (
                "not-r1",
                configuration(expressions(&[("rack", "NotIn", &["r1"])]), 0),
            ),
            (
                "everything",
                configuration(Some(LabelSelector::default()), -1),
            ),
            ("named-only", configuration(None, 100)),
            (
                "gone",
                ConfigurationKeys {
                    deleting: true,
                    ..configuration(Some(LabelSelector::default()), 1000)
                },
            ),
        ];
        for (name, keys) in configurations {
            c.apply_configuration(name, keys);
            c.apply_version(&format!("{name}-v1"), version(name, 1, true));
        }
        c.apply_version("rack-r1-high-v2", version("rack-r1-high", 2, true));
        c.apply_version(
            "rack-r1-high-v3",
            VersionKeys {
                deleting: true,
                ..version("rack-r1-high", 3, true)
            },
        );
        c
    }

    fn all_candidates(c: &Catalog) -> Vec<OwnedCandidate> {
        c.configuration_names()
            .filter(|n| !c.configuration(n).is_some_and(|k| k.deleting))
            .map(|n| {
                let keys = c.configuration(n).cloned().unwrap_or_default();
                OwnedCandidate {
                    name: n.to_owned(),
                    priority: keys.priority,
                    rolling: keys.rolling,
                    selector: keys.selector,
                    versions: c.version_infos(n),
                }
            })
            .collect()
    }

    /// Selection over the catalog's candidates decides what selection over every
    /// configuration decides, for every kind of Machine.
    #[test]
    fn candidates_decide_as_all_configurations_do() {
        let c = catalog();
        let all = all_candidates(&c);
        let all_borrowed: Vec<Candidate<'_>> = all.iter().map(OwnedCandidate::borrowed).collect();
        let machines: Vec<(BTreeMap<String, String>, Option<ConfigurationRef>)> = vec![
            (labels(&[("rack", "r1")]), None),
            (labels(&[("rack", "r2")]), None),
            (labels(&[("rack", "r3")]), None),
            (labels(&[("rack", "r1"), ("gpu", "a100")]), None),
            (labels(&[]), None),
            (
                labels(&[("rack", "r1")]),
                Some(ConfigurationRef {
                    name: "named-only".into(),
                    version: None,
                }),
            ),
            (
                labels(&[]),
                Some(ConfigurationRef {
                    name: "rack-r1-high".into(),
                    version: Some(3),
                }),
            ),
            (
                labels(&[]),
                Some(ConfigurationRef {
                    name: "missing".into(),
                    version: None,
                }),
            ),
        ];
        for (machine_labels, reference) in machines {
            let owned =
                c.candidates_for(&machine_labels, reference.as_ref().map(|r| r.name.as_str()));
            let borrowed: Vec<Candidate<'_>> = owned.iter().map(OwnedCandidate::borrowed).collect();
            assert_eq!(
                resolve(&machine_labels, reference.as_ref(), &borrowed),
                resolve(&machine_labels, reference.as_ref(), &all_borrowed),
                "{machine_labels:?} {reference:?}"
            );
        }
    }

    #[test]
    fn candidates_table() {
        let c = catalog();
        let names = |l: &[(&str, &str)], named: Option<&str>| -> Vec<String> {
            c.candidates_for(&labels(l), named)
                .into_iter()
                .map(|o| o.name)
                .collect()
        };
        assert_eq!(
            names(&[("rack", "r1")], None),
            vec![
                "everything",
                "not-r1",
                "rack-r1",
                "rack-r1-high",
                "racks-12"
            ],
            "by label, plus the selectors nothing narrows"
        );
        assert_eq!(
            names(&[("gpu", "x")], Some("named-only")),
            vec!["everything", "gpu", "named-only", "not-r1"]
        );
        let high = c
            .candidates_for(&labels(&[("rack", "r1")]), None)
            .into_iter()
            .find(|o| o.name == "rack-r1-high")
            .map(|o| {
                let mut v: Vec<i64> = o.versions.iter().map(|v| v.version).collect();
                v.sort_unstable();
                v
            });
        assert_eq!(
            high,
            Some(vec![1, 2]),
            "a version being deleted is left out"
        );
        assert_eq!(
            resolve(
                &labels(&[("rack", "r1")]),
                None,
                &c.candidates_for(&labels(&[("rack", "r1")]), None)
                    .iter()
                    .map(OwnedCandidate::borrowed)
                    .collect::<Vec<_>>()
            ),
            Resolution::Resolved {
                configuration: "rack-r1-high".into(),
                version: 2
            }
        );
    }

    #[test]
    fn changes_and_relists_keep_the_index_exact() {
        let mut c = catalog();
        // rack-r1 moves to rack r2: no longer a candidate for r1.
        let old =
            c.apply_configuration("rack-r1", configuration(match_labels(&[("rack", "r2")]), 1));
        assert_eq!(old.map(|k| k.priority), Some(1));
        let for_r1 = c.candidates_for(&labels(&[("rack", "r1")]), None);
        assert!(!for_r1.iter().any(|o| o.name == "rack-r1"));
        assert!(
            c.candidates_for(&labels(&[("rack", "r2")]), None)
                .iter()
                .any(|o| o.name == "rack-r1")
        );
        let present: BTreeSet<String> = ["gpu".to_owned()].into();
        let gone = c.retain_configurations(&present);
        assert_eq!(gone.len(), 7);
        assert_eq!(
            c.candidates_for(&labels(&[("rack", "r1"), ("gpu", "y")]), None)
                .into_iter()
                .map(|o| o.name)
                .collect::<Vec<_>>(),
            vec!["gpu"]
        );
        let versions: BTreeSet<String> = ["gpu-v1".to_owned()].into();
        c.retain_versions(&versions);
        assert_eq!(c.version_names_of("gpu"), vec!["gpu-v1"]);
        assert!(c.version_names_of("rack-r1-high").is_empty());
        assert_eq!(c.awaiting_first_version(), 0);
        c.apply_configuration("new", configuration(None, 0));
        assert_eq!(c.awaiting_first_version(), 1);
        c.apply_version(
            "new-v1",
            VersionKeys {
                deleting: true,
                ..version("new", 1, false)
            },
        );
        assert_eq!(
            c.awaiting_first_version(),
            1,
            "a version being deleted does not count"
        );
        c.apply_version("new-v1", version("new", 1, false));
        assert_eq!(c.awaiting_first_version(), 0);
    }
}
