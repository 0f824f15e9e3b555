//! The wipe of the node's disks when the Machine is released (deleted, or released by its
//! pool to the inventory), decided from plain data;
//! [`crate::storage::shell::wipe_for_release`] carries it out and the agent reports it in
//! `status.agent.releaseWipe` (with the release's request, if any), which the provider (or,
//! for a pool's release, the controller) waits for before it powers the machine off
//! (`unbounded_runtime::release`).
//!
//! The rules, in order:
//! 1. Only a Machine being deleted, or released with the controller's
//!    `unbounded-cloud.io/release-wipe` request (its Node drained), is released.
//! 2. Once the wipe is reported `Wiped` for this deletion or release, nothing more.
//! 3. Until the configuration version is read, wait (what it says decides).
//! 4. `wipe: never` wipes nothing; neither does a version without `storage`, unless an
//!    earlier version's layout is still on a disk (`status.agent.storage`): that is wiped
//!    `fast` (the provider reads the same facts and waits, or does not).
//! 5. A wipe that failed is tried again after a pause, [`MAX_WIPE_ATTEMPTS`] times in all;
//!    then the agent stays `Failed` (the provider holds the Machine: a person decides).
//! 6. A deleted Machine's Node must be gone first (`Pending`): the controller drains and
//!    deletes it, and the workloads must be gone before their disk is. A released Machine's
//!    request comes only once its Node is drained (the Node goes after the power-off).
//! 7. Otherwise wipe: stop the node container, unmount, wipe every disk that carries this
//!    Machine's layout ([`disks_of_machine`]).

use unbounded_api::storage::{StorageSpec, WipeMethod, WipeState};

use crate::storage::probe::Disk;

/// How many times a release wipe is tried before the agent gives up (until it restarts).
pub const MAX_WIPE_ATTEMPTS: u32 = 3;

/// What the agent knows about the configuration's storage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StorageKnown<'a> {
    /// The version has not been read yet.
    Unknown,
    /// The version has no `storage`.
    None,
    /// The version's `storage`.
    Spec(&'a StorageSpec),
}

/// Why the Machine lets its hardware go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Letting {
    /// It does not.
    No,
    /// It is being deleted.
    Deleted,
    /// Its pool releases it to the inventory and its Node is drained.
    Released,
}

/// Everything the release decision is made from.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseFacts<'a> {
    /// Whether (and why) the Machine lets its hardware go.
    pub letting: Letting,
    /// The storage of the version the machine was paved with (or resolved to).
    pub storage: StorageKnown<'a>,
    /// This Machine's layout is on a disk (`status.agent.storage`), whatever the version.
    pub layout_on_disk: bool,
    /// The Machine's Node exists.
    pub node_exists: bool,
    /// What the agent last reported.
    pub reported: Option<WipeState>,
    /// Wipes that failed so far (in this agent's life).
    pub failed_attempts: u32,
    /// The pause after the last failure is over.
    pub retry_due: bool,
}

/// What to do about the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Not being released.
    NotReleased,
    /// The configuration wipes nothing on release.
    NoWipe,
    /// Wait for the configuration version to be read.
    WaitForVersion,
    /// Report `Pending` and wait for the Node to be drained and deleted.
    WaitForNode,
    /// Stop, unmount and wipe with this method.
    Wipe(WipeMethod),
    /// A failed wipe waits for its retry.
    RetryLater,
    /// Failed too often: stay `Failed`.
    GaveUp,
    /// Wiped.
    Done,
}

/// Decides what the agent does about its Machine's release.
pub fn decide_release(facts: &ReleaseFacts<'_>) -> ReleaseAction {
    if facts.letting == Letting::No {
        return ReleaseAction::NotReleased;
    }
    if facts.reported == Some(WipeState::Wiped) {
        return ReleaseAction::Done;
    }
    let method = match facts.storage {
        StorageKnown::Unknown => return ReleaseAction::WaitForVersion,
        StorageKnown::None if facts.layout_on_disk => WipeMethod::Fast,
        StorageKnown::None => return ReleaseAction::NoWipe,
        StorageKnown::Spec(s) if !s.wipe().wipes_on_release() => return ReleaseAction::NoWipe,
        StorageKnown::Spec(s) => s.wipe_method(),
    };
    if facts.reported == Some(WipeState::Failed) {
        if facts.failed_attempts >= MAX_WIPE_ATTEMPTS {
            return ReleaseAction::GaveUp;
        }
        if !facts.retry_due {
            return ReleaseAction::RetryLater;
        }
    }
    if facts.node_exists && facts.letting == Letting::Deleted {
        return ReleaseAction::WaitForNode;
    }
    ReleaseAction::Wipe(method)
}

/// The disks that carry this Machine's layout: a filesystem whose UUID is the Machine's UID,
/// on the disk itself or on one of its partitions, whatever rules chose it (an older
/// version may have chosen another disk). Never the disk the host booted from. A disk with
/// nothing of this Machine's is not touched: nothing of it was written there.
pub fn disks_of_machine(disks: &[Disk], uid: &str, booted_from: Option<&str>) -> Vec<String> {
    let ours = |s: Option<&crate::storage::probe::Signature>| {
        s.and_then(|s| s.uuid.as_deref())
            .is_some_and(|u| u.eq_ignore_ascii_case(uid))
    };
    let mut names: Vec<String> = disks
        .iter()
        .filter(|d| booted_from != Some(d.name.as_str()))
        .filter(|d| {
            ours(d.signature.as_ref()) || d.partitions.iter().any(|p| ours(p.signature.as_ref()))
        })
        .map(|d| d.name.clone())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::probe::{Partition, Signature};
    use unbounded_api::storage::WipePolicy;

    fn spec(wipe: WipePolicy, method: WipeMethod) -> StorageSpec {
        StorageSpec {
            wipe: Some(wipe),
            wipe_method: Some(method),
            ..StorageSpec::default()
        }
    }

    #[test]
    fn release_table() {
        use ReleaseAction::*;
        let on_release = spec(WipePolicy::OnRelease, WipeMethod::Fast);
        let always = spec(WipePolicy::Always, WipeMethod::Overwrite);
        let never = spec(WipePolicy::Never, WipeMethod::Fast);
        let defaults = StorageSpec::default();
        let base = ReleaseFacts {
            letting: Letting::Deleted,
            storage: StorageKnown::Spec(&on_release),
            layout_on_disk: true,
            node_exists: false,
            reported: None,
            failed_attempts: 0,
            retry_due: true,
        };
        let cases = [
            (
                "not deleted",
                ReleaseFacts {
                    letting: Letting::No,
                    ..base
                },
                NotReleased,
            ),
            (
                "released by its pool, Node drained (still there): wipe",
                ReleaseFacts {
                    letting: Letting::Released,
                    node_exists: true,
                    ..base
                },
                Wipe(WipeMethod::Fast),
            ),
            (
                "released, never: nothing",
                ReleaseFacts {
                    letting: Letting::Released,
                    storage: StorageKnown::Spec(&never),
                    ..base
                },
                NoWipe,
            ),
            ("onRelease, Node gone: wipe", base, Wipe(WipeMethod::Fast)),
            (
                "always, overwrite",
                ReleaseFacts {
                    storage: StorageKnown::Spec(&always),
                    ..base
                },
                Wipe(WipeMethod::Overwrite),
            ),
            (
                "storage: {} wipes fast on release",
                ReleaseFacts {
                    storage: StorageKnown::Spec(&defaults),
                    ..base
                },
                Wipe(WipeMethod::Fast),
            ),
            (
                "never",
                ReleaseFacts {
                    storage: StorageKnown::Spec(&never),
                    ..base
                },
                NoWipe,
            ),
            (
                "no storage, an earlier layout on a disk: wipe it fast",
                ReleaseFacts {
                    storage: StorageKnown::None,
                    ..base
                },
                Wipe(WipeMethod::Fast),
            ),
            (
                "no storage, nothing on a disk",
                ReleaseFacts {
                    storage: StorageKnown::None,
                    layout_on_disk: false,
                    ..base
                },
                NoWipe,
            ),
            (
                "version not read yet",
                ReleaseFacts {
                    storage: StorageKnown::Unknown,
                    ..base
                },
                WaitForVersion,
            ),
            (
                "the Node is still there (draining)",
                ReleaseFacts {
                    node_exists: true,
                    ..base
                },
                WaitForNode,
            ),
            (
                "wiped: done, even if a Node came back",
                ReleaseFacts {
                    reported: Some(WipeState::Wiped),
                    node_exists: true,
                    ..base
                },
                Done,
            ),
            (
                "interrupted while wiping (agent restarted): wipe again",
                ReleaseFacts {
                    reported: Some(WipeState::Wiping),
                    ..base
                },
                Wipe(WipeMethod::Fast),
            ),
            (
                "failed, pause not over",
                ReleaseFacts {
                    reported: Some(WipeState::Failed),
                    failed_attempts: 1,
                    retry_due: false,
                    ..base
                },
                RetryLater,
            ),
            (
                "failed, pause over: again",
                ReleaseFacts {
                    reported: Some(WipeState::Failed),
                    failed_attempts: 1,
                    ..base
                },
                Wipe(WipeMethod::Fast),
            ),
            (
                "failed too often",
                ReleaseFacts {
                    reported: Some(WipeState::Failed),
                    failed_attempts: MAX_WIPE_ATTEMPTS,
                    ..base
                },
                GaveUp,
            ),
        ];
        for (case, facts, want) in cases {
            assert_eq!(decide_release(&facts), want, "{case}");
        }
    }

    fn disk(name: &str, signature: Option<&str>, partitions: &[Option<&str>]) -> Disk {
        let sig = |uuid: &str| Signature {
            kind: "ext4".into(),
            uuid: Some(uuid.into()),
            label: Some("unbounded".into()),
        };
        Disk {
            name: name.into(),
            size_bytes: 1 << 34,
            removable: false,
            read_only: false,
            rotational: Some(false),
            model: None,
            serial: None,
            wwn: None,
            by_path: None,
            table: (!partitions.is_empty()).then(|| "gpt".into()),
            signature: signature.map(sig),
            partitions: partitions
                .iter()
                .enumerate()
                .map(|(i, uuid)| Partition {
                    name: format!("{name}{}", i + 1),
                    size_bytes: 1 << 33,
                    label: Some("unbounded".into()),
                    signature: uuid.map(sig),
                    mounts: Vec::new(),
                })
                .collect(),
            mounts: Vec::new(),
            in_use: Vec::new(),
        }
    }

    #[test]
    fn only_disks_with_this_machines_filesystem_are_wiped() {
        let uid = "3d5f1a8e-7c2b-4e0a-9f61-2b8c4d7e6a10";
        let other = "9b0e2c41-5a6d-4f3b-8e72-1c9d0a4b5e63";
        let disks = [
            disk("sda", None, &[Some(uid)]),
            disk("sdb", Some(&uid.to_uppercase()), &[]),
            disk("sdc", None, &[Some(other)]),
            disk("sdd", None, &[]),
            disk("sde", None, &[None, Some(uid)]),
            disk("nvme0n1", Some(uid), &[]),
        ];
        assert_eq!(
            disks_of_machine(&disks, uid, Some("nvme0n1")),
            ["sda", "sdb", "sde"],
            "ours, on a partition or the whole disk; never another Machine's, a blank one or the boot disk"
        );
        assert!(disks_of_machine(&disks[2..4], uid, None).is_empty());
    }
}
