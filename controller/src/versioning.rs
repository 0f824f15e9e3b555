//! How a MachineConfiguration's template becomes numbered MachineConfigurationVersions.
//!
//! - A new configuration gets `<name>-v1`.
//! - A change of `spec.template` is copied into the newest version while it is not deployed;
//!   once it is deployed, the change creates version `latestVersion + 1`.
//! - Numbers are never reused: the next number is one more than the highest ever seen, in
//!   `status.latestVersion` or among the versions that exist (which covers a controller that
//!   crashed between creating a version and recording it).
//! - `revisionHistoryLimit` keeps the newest N versions and never deletes one that a Machine
//!   references.

use std::collections::BTreeSet;

use unbounded_api::MachineTemplate;

/// A version that exists, as versioning needs it.
#[derive(Debug, Clone, Copy)]
pub struct ExistingVersion<'a> {
    /// Version number.
    pub version: i64,
    /// Whether a machine has been provisioned with it.
    pub deployed: bool,
    /// Its template.
    pub template: &'a MachineTemplate,
}

/// What to do so that the versions reflect the configuration's template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionAction {
    /// The newest version already holds the template.
    UpToDate,
    /// Create this version with the template.
    Create {
        /// The new version number.
        version: i64,
    },
    /// Copy the template into this (newest, undeployed) version.
    UpdateNewest {
        /// The version to update.
        version: i64,
    },
}

/// The highest version number ever created.
pub fn latest_version(recorded: i64, existing: &[ExistingVersion<'_>]) -> i64 {
    existing
        .iter()
        .map(|v| v.version)
        .fold(recorded.max(0), i64::max)
}

/// Decides how the versions should change for `template`.
pub fn next_version_action(
    template: &MachineTemplate,
    recorded_latest: i64,
    existing: &[ExistingVersion<'_>],
) -> VersionAction {
    let latest = latest_version(recorded_latest, existing);
    match existing.iter().max_by_key(|v| v.version) {
        Some(newest) if newest.template == template => VersionAction::UpToDate,
        Some(newest) if !newest.deployed && newest.version == latest => {
            VersionAction::UpdateNewest {
                version: newest.version,
            }
        }
        // Newest deployed, or every version deleted (or the newest deleted): a new number.
        _ => VersionAction::Create {
            version: latest + 1,
        },
    }
}

/// The versions to delete so that at most `limit` remain, newest kept first, never one in
/// `referenced`.
pub fn versions_to_prune(existing: &[i64], referenced: &BTreeSet<i64>, limit: usize) -> Vec<i64> {
    let mut newest_first = existing.to_vec();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    newest_first.dedup();
    newest_first
        .into_iter()
        .skip(limit.max(1))
        .filter(|v| !referenced.contains(v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::{BootSpec, KubernetesSpec};

    fn template(kernel: &str) -> MachineTemplate {
        MachineTemplate {
            boot: Some(BootSpec {
                kernel_url: kernel.into(),
                initrd_url: "initrd".into(),
                kernel_args: vec![],
                measurements: vec![],
            }),
            kubernetes: Some(KubernetesSpec::default()),
            ..MachineTemplate::default()
        }
    }

    #[test]
    fn next_version_table() {
        let a = template("a");
        let b = template("b");
        let ev = |version, deployed, template| ExistingVersion {
            version,
            deployed,
            template,
        };
        let cases: Vec<(
            &str,
            i64,
            Vec<ExistingVersion<'_>>,
            &MachineTemplate,
            VersionAction,
        )> = vec![
            (
                "a new configuration gets v1",
                0,
                vec![],
                &a,
                VersionAction::Create { version: 1 },
            ),
            (
                "unchanged template",
                1,
                vec![ev(1, false, &a)],
                &a,
                VersionAction::UpToDate,
            ),
            (
                "unchanged template of a deployed version",
                1,
                vec![ev(1, true, &a)],
                &a,
                VersionAction::UpToDate,
            ),
            (
                "change copied into the undeployed newest",
                1,
                vec![ev(1, false, &a)],
                &b,
                VersionAction::UpdateNewest { version: 1 },
            ),
            (
                "change after deploy creates the next",
                1,
                vec![ev(1, true, &a)],
                &b,
                VersionAction::Create { version: 2 },
            ),
            (
                "numbers are not reused after the newest was deleted",
                3,
                vec![ev(1, true, &a)],
                &b,
                VersionAction::Create { version: 4 },
            ),
            (
                "an older undeployed version is not the newest",
                3,
                vec![ev(2, false, &a)],
                &b,
                VersionAction::Create { version: 4 },
            ),
            (
                "all versions deleted",
                5,
                vec![],
                &a,
                VersionAction::Create { version: 6 },
            ),
            (
                "crash after create, before status: the existing version counts",
                1,
                vec![ev(1, true, &a), ev(2, false, &b)],
                &b,
                VersionAction::UpToDate,
            ),
            (
                "crash after create, then another change: update it, do not skip",
                1,
                vec![ev(1, true, &a), ev(2, false, &b)],
                &a,
                VersionAction::UpdateNewest { version: 2 },
            ),
        ];
        for (case, recorded, existing, wanted, expected) in cases {
            assert_eq!(
                next_version_action(wanted, recorded, &existing),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn latest_version_is_the_highest_seen() {
        let a = template("a");
        let existing = [ExistingVersion {
            version: 7,
            deployed: true,
            template: &a,
        }];
        assert_eq!(latest_version(3, &existing), 7);
        assert_eq!(latest_version(9, &existing), 9);
        assert_eq!(latest_version(0, &[]), 0);
    }

    #[test]
    fn prune_table() {
        // (case, existing, referenced, limit, expected pruned)
        type Case = (&'static str, Vec<i64>, Vec<i64>, usize, Vec<i64>);
        let cases: Vec<Case> = vec![
            ("within the limit", vec![1, 2, 3], vec![], 5, vec![]),
            (
                "oldest beyond the limit",
                vec![1, 2, 3, 4, 5],
                vec![],
                3,
                vec![2, 1],
            ),
            (
                "a referenced old version is kept",
                vec![1, 2, 3, 4, 5],
                vec![1],
                3,
                vec![2],
            ),
            (
                "order of input does not matter",
                vec![5, 1, 4, 2, 3],
                vec![],
                2,
                vec![3, 2, 1],
            ),
            (
                "a limit of zero still keeps the newest",
                vec![1, 2],
                vec![],
                0,
                vec![1],
            ),
            (
                "referenced newest versions do not let older ones survive",
                vec![1, 2, 3],
                vec![3],
                1,
                vec![2, 1],
            ),
        ];
        for (case, existing, referenced, limit, expected) in cases {
            let referenced: BTreeSet<i64> = referenced.into_iter().collect();
            assert_eq!(
                versions_to_prune(&existing, &referenced, limit),
                expected,
                "{case}"
            );
        }
    }
}
