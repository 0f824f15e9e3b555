//! Which configuration version a Machine gets (DESIGN.md, "Semantics the controller must get
//! exactly right"):
//!
//! - `configurationRef` with `version` → exactly that version;
//! - `configurationRef` with only a name → the newest version of that configuration;
//! - no `configurationRef` → among configurations whose `machineSelector` matches the
//!   Machine's labels, the highest `priority` (ties: the name that sorts first), then its
//!   newest *deployed* version, or version 1 if none is deployed yet; for a configuration
//!   whose update strategy is `RollingUpdate`, its newest version (the rolling update moves
//!   Machines onto it batch by batch, so the first batch is the canary);
//! - nothing matches → [`Resolution::NoMatch`]: the Machine waits in `Pending`;
//! - a Machine that discovery created and nobody has claimed yet (label
//!   `unbounded-cloud.io/discovery=waiting`) → [`Resolution::AwaitingClaim`], whatever its
//!   labels or reference say: anyone on the provisioning network can have it created, so it
//!   gets nothing until an operator or a pool claims it (the label becomes `claimed`).
//!
//! Whatever version a Machine is provisioned with becomes deployed (locked); that is the
//! caller's job. Rolling a selector-matched fleet of an `OnDelete` configuration forward
//! therefore goes through a canary: a Machine that names the configuration gets (and locks)
//! the newest version, after which every selector-matched Machine gets it at its next
//! repave. A `RollingUpdate` configuration needs no canary: its rollout repaves a first
//! batch, which locks the version, and pauses when a batch fails.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use unbounded_api::ConfigurationRef;

/// A version of a configuration, as selection needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    /// Version number.
    pub version: i64,
    /// Whether a machine has been provisioned with it.
    pub deployed: bool,
}

/// A MachineConfiguration, as selection needs it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its priority.
    pub priority: i32,
    /// Its update strategy is RollingUpdate: selector-matched Machines get its newest version
    /// (the rollout is the canary), not its newest deployed one.
    pub rolling: bool,
    /// Its machine selector (none: it applies only to Machines that name it).
    pub selector: Option<&'a LabelSelector>,
    /// Its existing versions, in any order.
    pub versions: Vec<VersionInfo>,
}

/// The outcome of selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Use this version.
    Resolved {
        /// Configuration name.
        configuration: String,
        /// Version number.
        version: i64,
    },
    /// No configuration's selector matches the Machine.
    NoMatch,
    /// Discovered and not claimed yet: no configuration whatever matches.
    AwaitingClaim,
    /// The Machine names a configuration that does not exist.
    ConfigurationNotFound {
        /// The name it gives.
        configuration: String,
    },
    /// The Machine pins a version that does not exist.
    VersionNotFound {
        /// Configuration name.
        configuration: String,
        /// The version it pins.
        version: i64,
    },
    /// The configuration exists but has no version yet (the controller creates version 1
    /// right after it sees the configuration).
    AwaitingFirstVersion {
        /// Configuration name.
        configuration: String,
    },
}

/// Whether a configuration's selector matches these labels. An absent selector matches
/// nothing; an empty one matches everything; one the API server would reject matches
/// nothing.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    match selector {
        None => false,
        Some(selector) => Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels)),
    }
}

/// Resolves the configuration version for a Machine with these labels and reference.
pub fn resolve(
    labels: &BTreeMap<String, String>,
    reference: Option<&ConfigurationRef>,
    candidates: &[Candidate<'_>],
) -> Resolution {
    if unbounded_api::well_known::discovery::is_waiting(labels) {
        return Resolution::AwaitingClaim;
    }
    match reference {
        Some(reference) => resolve_reference(reference, candidates),
        None => resolve_by_selector(labels, candidates),
    }
}

fn resolve_reference(reference: &ConfigurationRef, candidates: &[Candidate<'_>]) -> Resolution {
    let Some(candidate) = candidates.iter().find(|c| c.name == reference.name) else {
        return Resolution::ConfigurationNotFound {
            configuration: reference.name.clone(),
        };
    };
    match reference.version {
        Some(version) if candidate.versions.iter().any(|v| v.version == version) => {
            Resolution::Resolved {
                configuration: candidate.name.to_owned(),
                version,
            }
        }
        Some(version) => Resolution::VersionNotFound {
            configuration: candidate.name.to_owned(),
            version,
        },
        None => match candidate.versions.iter().map(|v| v.version).max() {
            Some(version) => Resolution::Resolved {
                configuration: candidate.name.to_owned(),
                version,
            },
            None => Resolution::AwaitingFirstVersion {
                configuration: candidate.name.to_owned(),
            },
        },
    }
}

fn resolve_by_selector(
    labels: &BTreeMap<String, String>,
    candidates: &[Candidate<'_>],
) -> Resolution {
    let best = candidates
        .iter()
        .filter(|c| selector_matches(c.selector, labels))
        // Highest priority first; among equals, the name that sorts first.
        .min_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(b.name)));
    let Some(best) = best else {
        return Resolution::NoMatch;
    };
    let newest_deployed = best
        .versions
        .iter()
        .filter(|v| v.deployed || best.rolling)
        .map(|v| v.version)
        .max();
    // None deployed yet: version 1, or the oldest that still exists if 1 was deleted.
    let version = newest_deployed.or_else(|| best.versions.iter().map(|v| v.version).min());
    match version {
        Some(version) => Resolution::Resolved {
            configuration: best.name.to_owned(),
            version,
        },
        None => Resolution::AwaitingFirstVersion {
            configuration: best.name.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }

    fn v(version: i64, deployed: bool) -> VersionInfo {
        VersionInfo { version, deployed }
    }

    fn reference(name: &str, version: Option<i64>) -> ConfigurationRef {
        ConfigurationRef {
            name: name.to_owned(),
            version,
        }
    }

    fn resolved(configuration: &str, version: i64) -> Resolution {
        Resolution::Resolved {
            configuration: configuration.to_owned(),
            version,
        }
    }

    #[test]
    fn explicit_reference_table() {
        let pool = match_labels(&[("pool", "a")]);
        let candidates = [Candidate {
            name: "general",
            priority: 0,
            rolling: false,
            selector: Some(&pool),
            versions: vec![v(1, true), v(2, true), v(3, false)],
        }];
        let cases = [
            (
                "pinned existing version is used exactly",
                reference("general", Some(1)),
                resolved("general", 1),
            ),
            (
                "pinned undeployed version is used",
                reference("general", Some(3)),
                resolved("general", 3),
            ),
            (
                "name only uses the newest version, deployed or not",
                reference("general", None),
                resolved("general", 3),
            ),
            (
                "pinned missing version",
                reference("general", Some(7)),
                Resolution::VersionNotFound {
                    configuration: "general".into(),
                    version: 7,
                },
            ),
            (
                "missing configuration",
                reference("other", None),
                Resolution::ConfigurationNotFound {
                    configuration: "other".into(),
                },
            ),
        ];
        for (case, reference, expected) in cases {
            // The reference wins over labels that match nothing.
            assert_eq!(
                resolve(&labels(&[]), Some(&reference), &candidates),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn selector_table() {
        let a = match_labels(&[("pool", "a")]);
        let everything = LabelSelector::default();
        let gpu = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "gpu".into(),
                    operator: "Exists".into(),
                    values: None,
                },
            ]),
        };
        // (case, candidates, machine labels, expected)
        type Case<'a> = (
            &'a str,
            Vec<Candidate<'a>>,
            Vec<(&'a str, &'a str)>,
            Resolution,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "highest priority wins",
                vec![
                    Candidate {
                        name: "low",
                        priority: 1,
                        rolling: false,
                        selector: Some(&a),
                        versions: vec![v(1, true)],
                    },
                    Candidate {
                        name: "high",
                        priority: 9,
                        rolling: false,
                        selector: Some(&a),
                        versions: vec![v(1, true)],
                    },
                ],
                vec![("pool", "a")],
                resolved("high", 1),
            ),
            (
                "ties go to the name that sorts first",
                vec![
                    Candidate {
                        name: "zeta",
                        priority: 5,
                        rolling: false,
                        selector: Some(&a),
                        versions: vec![v(1, true)],
                    },
                    Candidate {
                        name: "alpha",
                        priority: 5,
                        rolling: false,
                        selector: Some(&a),
                        versions: vec![v(1, true)],
                    },
                ],
                vec![("pool", "a")],
                resolved("alpha", 1),
            ),
            (
                "newest deployed version, not the newest",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&a),
                    versions: vec![v(1, true), v(2, true), v(3, false)],
                }],
                vec![("pool", "a")],
                resolved("c", 2),
            ),
            (
                "version 1 when none is deployed",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&a),
                    versions: vec![v(1, false)],
                }],
                vec![("pool", "a")],
                resolved("c", 1),
            ),
            (
                "oldest existing when version 1 is gone and none is deployed",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&a),
                    versions: vec![v(4, false), v(3, false)],
                }],
                vec![("pool", "a")],
                resolved("c", 3),
            ),
            (
                "no version yet",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&a),
                    versions: vec![],
                }],
                vec![("pool", "a")],
                Resolution::AwaitingFirstVersion {
                    configuration: "c".into(),
                },
            ),
            (
                "no selector matches",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&a),
                    versions: vec![v(1, true)],
                }],
                vec![("pool", "b")],
                Resolution::NoMatch,
            ),
            (
                "a configuration without selector is never chosen by labels",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: None,
                    versions: vec![v(1, true)],
                }],
                vec![("pool", "a")],
                Resolution::NoMatch,
            ),
            (
                "an empty selector matches every machine",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: false,
                    selector: Some(&everything),
                    versions: vec![v(1, true)],
                }],
                vec![],
                resolved("c", 1),
            ),
            (
                "match expressions count",
                vec![
                    Candidate {
                        name: "gpu",
                        priority: 10,
                        rolling: false,
                        selector: Some(&gpu),
                        versions: vec![v(1, true)],
                    },
                    Candidate {
                        name: "all",
                        priority: 0,
                        rolling: false,
                        selector: Some(&everything),
                        versions: vec![v(1, true)],
                    },
                ],
                vec![("gpu", "a100")],
                resolved("gpu", 1),
            ),
            (
                "a higher priority that does not match loses to a lower one that does",
                vec![
                    Candidate {
                        name: "gpu",
                        priority: 10,
                        rolling: false,
                        selector: Some(&gpu),
                        versions: vec![v(1, true)],
                    },
                    Candidate {
                        name: "all",
                        priority: 0,
                        rolling: false,
                        selector: Some(&everything),
                        versions: vec![v(1, true)],
                    },
                ],
                vec![("pool", "a")],
                resolved("all", 1),
            ),
            (
                "RollingUpdate: the newest version, deployed or not",
                vec![Candidate {
                    name: "c",
                    priority: 0,
                    rolling: true,
                    selector: Some(&a),
                    versions: vec![v(1, true), v(2, true), v(3, false)],
                }],
                vec![("pool", "a")],
                resolved("c", 3),
            ),
        ];
        for (case, candidates, machine_labels, expected) in cases {
            assert_eq!(
                resolve(&labels(&machine_labels), None, &candidates),
                expected,
                "{case}"
            );
        }
    }

    /// A discovered Machine nobody has claimed resolves to nothing, neither by a selector
    /// (even one that selects everything) nor by a reference; claimed, it resolves as any
    /// other Machine.
    #[test]
    fn a_waiting_discovered_machine_gets_no_configuration_until_claimed() {
        let everything = LabelSelector::default();
        let candidates = [Candidate {
            name: "general",
            priority: 0,
            rolling: false,
            selector: Some(&everything),
            versions: vec![v(1, true)],
        }];
        let named = reference("general", Some(1));
        let discovery = unbounded_api::well_known::labels::DISCOVERY;
        let cases = [
            (
                "waiting, by selector",
                Some("waiting"),
                None,
                Resolution::AwaitingClaim,
            ),
            (
                "waiting, by reference",
                Some("waiting"),
                Some(&named),
                Resolution::AwaitingClaim,
            ),
            (
                "claimed, by selector",
                Some("claimed"),
                None,
                resolved("general", 1),
            ),
            (
                "claimed, by reference",
                Some("claimed"),
                Some(&named),
                resolved("general", 1),
            ),
            ("never discovered", None, None, resolved("general", 1)),
            (
                "another value",
                Some("whatever"),
                None,
                resolved("general", 1),
            ),
        ];
        for (case, value, reference, expected) in cases {
            let mut machine_labels = labels(&[("rack", "r1")]);
            if let Some(value) = value {
                machine_labels.insert(discovery.to_owned(), value.to_owned());
            }
            assert_eq!(
                resolve(&machine_labels, reference, &candidates),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn invalid_selector_matches_nothing() {
        let bad = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Bogus".into(),
                    values: None,
                },
            ]),
        };
        assert!(!selector_matches(Some(&bad), &labels(&[("k", "v")])));
    }
}
