//! Which reconciles a change makes necessary, decided from an object's keys before and after
//! the change (absent: created or deleted). The runner turns these decisions into triggers
//! through the indexes, so a change touches only the objects whose decisions depend on it.
//!
//! - A Machine is reconciled on every change of its own; the configurations it counts
//!   towards are recounted only when what it records or pins changed.
//! - A configuration's selector, priority or deletion changes which configuration Machines
//!   resolve to: the Machines it selected or selects, and those that record or name it, are
//!   reconciled. A template change only changes versions (see below).
//! - A version appearing, disappearing or becoming deployed changes what Machines resolve to
//!   (newest, newest deployed): the same Machines are reconciled. A version's count or
//!   finalizer changing does not; its configuration is recounted.
//!
//! [`fan_out`] turns each kind's change, through the indexes, into the objects to
//! reconcile.

use std::collections::BTreeSet;

pub mod fan_out;

pub use fan_out::{Lookups, Reconciles};

use crate::index::catalog::{ConfigurationKeys, VersionKeys};
use crate::index::machines::MachineKeys;

/// The configurations whose version counts change when a Machine goes from `old` to `new`.
pub fn recounted_configurations(
    old: Option<&MachineKeys>,
    new: Option<&MachineKeys>,
) -> BTreeSet<String> {
    let before = old.map(MachineKeys::counted_versions).unwrap_or_default();
    let after = new.map(MachineKeys::counted_versions).unwrap_or_default();
    before
        .symmetric_difference(&after)
        .map(|(configuration, _)| (*configuration).to_owned())
        .collect()
}

/// Whether a configuration's change can change what Machines resolve to.
pub fn configuration_changes_selection(
    old: Option<&ConfigurationKeys>,
    new: Option<&ConfigurationKeys>,
) -> bool {
    old != new
}

/// Whether a version's change can change what Machines resolve to.
pub fn version_changes_selection(old: Option<&VersionKeys>, new: Option<&VersionKeys>) -> bool {
    old != new
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::collections::BTreeMap;
    use unbounded_api::MachinePhase;

    fn machine(recorded: Option<(&str, i64)>, named: Option<(&str, Option<i64>)>) -> MachineKeys {
        MachineKeys {
            labels: BTreeMap::new(),
            recorded: recorded.map(|(c, v)| (c.to_owned(), v)),
            named: named.map(|(c, v)| (c.to_owned(), v)),
            node_name: "n".into(),
            provider_id: None,
            phase: MachinePhase::Pending,
            deleting: false,
            provider: unbounded_api::MachineProvider::Manual,
            repave: (None, None),
        }
    }

    #[test]
    fn recount_table() {
        let set = |names: &[&str]| -> BTreeSet<String> {
            names.iter().map(|n| (*n).to_owned()).collect()
        };
        type Case = (
            &'static str,
            Option<MachineKeys>,
            Option<MachineKeys>,
            BTreeSet<String>,
        );
        let cases: Vec<Case> = vec![
            (
                "a status echo that records nothing new",
                Some(machine(Some(("a", 1)), None)),
                Some(MachineKeys {
                    phase: MachinePhase::Provisioning,
                    ..machine(Some(("a", 1)), None)
                }),
                set(&[]),
            ),
            (
                "first version recorded",
                Some(machine(None, None)),
                Some(machine(Some(("a", 1)), None)),
                set(&["a"]),
            ),
            (
                "repave onto a new version",
                Some(machine(Some(("a", 1)), None)),
                Some(machine(Some(("a", 2)), None)),
                set(&["a"]),
            ),
            (
                "moved to another configuration",
                Some(machine(Some(("a", 1)), None)),
                Some(machine(Some(("b", 1)), None)),
                set(&["a", "b"]),
            ),
            (
                "pinning the version it records changes no count",
                Some(machine(Some(("a", 1)), None)),
                Some(machine(Some(("a", 1)), Some(("a", Some(1))))),
                set(&[]),
            ),
            (
                "pinning an older version counts it",
                Some(machine(Some(("a", 2)), None)),
                Some(machine(Some(("a", 2)), Some(("a", Some(1))))),
                set(&["a"]),
            ),
            (
                "naming without a version counts nothing",
                Some(machine(None, None)),
                Some(machine(None, Some(("a", None)))),
                set(&[]),
            ),
            (
                "created",
                None,
                Some(machine(Some(("a", 1)), Some(("b", Some(2))))),
                set(&["a", "b"]),
            ),
            (
                "deleted",
                Some(machine(Some(("a", 1)), None)),
                None,
                set(&["a"]),
            ),
        ];
        for (case, old, new, expected) in cases {
            assert_eq!(
                recounted_configurations(old.as_ref(), new.as_ref()),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn selection_table() {
        let configuration = |priority: i32, selector: Option<LabelSelector>| ConfigurationKeys {
            selector,
            priority,
            rolling: false,
            deleting: false,
        };
        let everything = Some(LabelSelector::default());
        let cases = vec![
            (
                "status-only change",
                Some(configuration(1, everything.clone())),
                Some(configuration(1, everything.clone())),
                false,
            ),
            (
                "priority",
                Some(configuration(1, everything.clone())),
                Some(configuration(2, everything.clone())),
                true,
            ),
            (
                "selector",
                Some(configuration(1, everything.clone())),
                Some(configuration(1, None)),
                true,
            ),
            (
                "update strategy (RollingUpdate resolves to the newest version)",
                Some(configuration(1, everything.clone())),
                Some(ConfigurationKeys {
                    rolling: true,
                    ..configuration(1, everything.clone())
                }),
                true,
            ),
            ("created", None, Some(configuration(1, None)), true),
            ("deleted", Some(configuration(1, None)), None, true),
        ];
        for (case, old, new, expected) in cases {
            assert_eq!(
                configuration_changes_selection(old.as_ref(), new.as_ref()),
                expected,
                "{case}"
            );
        }

        let version = |deployed: bool| VersionKeys {
            configuration: "a".into(),
            version: 1,
            deployed,
            deleting: false,
        };
        let cases = vec![
            (
                "count or finalizer change",
                Some(version(false)),
                Some(version(false)),
                false,
            ),
            ("deployed", Some(version(false)), Some(version(true)), true),
            ("created", None, Some(version(false)), true),
            ("deleted", Some(version(true)), None, true),
            (
                "being deleted",
                Some(version(true)),
                Some(VersionKeys {
                    deleting: true,
                    ..version(true)
                }),
                true,
            ),
        ];
        for (case, old, new, expected) in cases {
            assert_eq!(
                version_changes_selection(old.as_ref(), new.as_ref()),
                expected,
                "{case}"
            );
        }
    }
}
