//! The node's state on the machine's own disk (`spec.template.storage`).
//!
//! Decide first, then act:
//! 1. [`probe`] reads what is on the disks (sysfs, `blkid -p`, mountinfo) into plain data;
//! 2. [`plan::plan`] chooses the disk and says format, reuse or refuse (nothing touched);
//! 3. [`apply`] carries it out with the real tools (`wipefs`, `sfdisk`, `partx`,
//!    `mkfs.ext4`, `mount`, `blkdiscard`) and mounts the filesystem on `/var/lib/machines`;
//! 4. [`decide_container`] says, from the [`Marker`] the last pave left at the root of the
//!    filesystem, whether the node container on it is started as it is (same configuration
//!    version, same image), paved again onto the disk, or paved after a wipe.
//!
//! This Machine's layout is recognised without mounting anything: a GPT partition named
//! `unbounded` (or the whole disk) holding an ext4 filesystem labelled `unbounded` whose
//! UUID is the Machine's UID. Another Machine's layout (the same hardware under an earlier
//! Machine object) is Unbounded's to format again; anything else is foreign and is wiped
//! only with `allowForeign: true`.

use serde::{Deserialize, Serialize};
use unbounded_api::ResolvedConfiguration;
use unbounded_api::storage::WipePolicy;

pub mod apply;
pub mod plan;
pub mod probe;
pub mod shell;

pub use plan::{Owner, Plan, Previous, Refusal, plan};

/// Where the marker lives, relative to the root of the storage's filesystem.
pub const MARKER_PATH: &str = ".unbounded/layout.json";

/// What the filesystem holds, written by the agent at the root of the mounted filesystem:
/// whose it is and which node container it holds, so that a reboot knows whether the
/// container on the disk is the one the Machine should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The Machine's name.
    pub machine: String,
    /// The Machine's UID (also the filesystem's UUID).
    pub machine_uid: String,
    /// The node container's name (`/var/lib/machines/<container>`), once one is paved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The configuration version the container was paved with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ResolvedConfiguration>,
    /// The node image's SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_sha256: Option<String>,
    /// The pave finished: the container's root is whole. False from the moment a pave
    /// starts replacing it.
    #[serde(default)]
    pub complete: bool,
    /// The pool claim (`unbounded-cloud.io/claimed-at`) the Machine was paved under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// What the Machine should run now.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The container's name.
    pub container: &'a str,
    /// The configuration version.
    pub configuration: &'a ResolvedConfiguration,
    /// The node image's SHA-256.
    pub image_sha256: &'a str,
    /// The pool claim the Machine is under now (`unbounded-cloud.io/claimed-at`), if any.
    pub claim: Option<&'a str>,
}

/// Whether the node container is paved afresh or started from the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerStep {
    /// The container on the disk is the one wanted: start it, no download.
    StartFromDisk,
    /// Pave the container onto the mounted filesystem (the old root is replaced; other
    /// files on the filesystem stay).
    Pave,
    /// Wipe and format the disk again, then pave (`wipe: always` and something was paved
    /// on it before; or a PXE Machine released by one pool and claimed by another, when
    /// the configuration wipes on release).
    WipeThenPave,
}

/// Decides what happens to the node container on the disk. `first_on_boot` is true for the
/// first pave of a boot (the agent's in-memory state is empty), false for a repave or an
/// interrupted pave within the boot.
pub fn decide_container(
    plan: &Plan,
    marker: Option<&Marker>,
    wanted: &Wanted<'_>,
    first_on_boot: bool,
    wipe: WipePolicy,
) -> ContainerStep {
    let Plan::Reuse { .. } = plan else {
        // A new filesystem: nothing on it to keep or wipe.
        return ContainerStep::Pave;
    };
    let paved_before = marker.is_some_and(|m| m.configuration.is_some());
    // A PXE Machine a pool released goes back to the inventory powered off, with its
    // disk as the last member left it (the same Machine object, so the same layout). The
    // next claim wipes it before anything of the new member is paved or started.
    let reclaimed = marker.is_some_and(|m| m.claim.as_deref() != wanted.claim);
    if wipe.wipes_on_release() && paved_before && reclaimed {
        return ContainerStep::WipeThenPave;
    }
    let same = marker.is_some_and(|m| {
        m.complete
            && m.container.as_deref() == Some(wanted.container)
            && m.configuration.as_ref() == Some(wanted.configuration)
            && m.image_sha256.as_deref() == Some(wanted.image_sha256)
    });
    if first_on_boot && same {
        return ContainerStep::StartFromDisk;
    }
    if wipe == WipePolicy::Always && paved_before {
        ContainerStep::WipeThenPave
    } else {
        ContainerStep::Pave
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_step_table() {
        let v1 = ResolvedConfiguration {
            name: "general".into(),
            version: 1,
        };
        let v2 = ResolvedConfiguration {
            name: "general".into(),
            version: 2,
        };
        let sha = "a".repeat(64);
        let wanted = Wanted {
            container: "node-1",
            configuration: &v1,
            image_sha256: &sha,
            claim: None,
        };
        let claimed = "2026-11-26T08:00:00Z";
        let wanted_claimed = Wanted {
            claim: Some(claimed),
            ..wanted
        };
        let marker = Marker {
            machine: "node-1".into(),
            machine_uid: "uid".into(),
            container: Some("node-1".into()),
            configuration: Some(v1.clone()),
            image_sha256: Some(sha.clone()),
            complete: true,
            claim: None,
        };
        let claimed_before = Marker {
            claim: Some("2026-11-25T10:00:00Z".into()),
            ..marker.clone()
        };
        let same_claim = Marker {
            claim: Some(claimed.into()),
            ..marker.clone()
        };
        let reuse = Plan::Reuse {
            disk: "sda".into(),
            device: "sda1".into(),
        };
        let format = Plan::Format {
            disk: "sda".into(),
            previous: None,
        };
        let fresh = Marker {
            container: None,
            configuration: None,
            image_sha256: None,
            complete: false,
            ..marker.clone()
        };
        let other_version = Marker {
            configuration: Some(v2),
            ..marker.clone()
        };
        let other_image = Marker {
            image_sha256: Some("b".repeat(64)),
            ..marker.clone()
        };
        let incomplete = Marker {
            complete: false,
            ..marker.clone()
        };
        let renamed = Marker {
            container: Some("node-2".into()),
            ..marker.clone()
        };
        use ContainerStep::*;
        use WipePolicy::*;
        let cases = [
            (
                "reboot, same version and image",
                &reuse,
                Some(&marker),
                true,
                OnRelease,
                StartFromDisk,
            ),
            (
                "reboot, same: always does not wipe a reboot",
                &reuse,
                Some(&marker),
                true,
                Always,
                StartFromDisk,
            ),
            (
                "repave within the boot keeps files (never)",
                &reuse,
                Some(&marker),
                false,
                Never,
                Pave,
            ),
            (
                "repave within the boot keeps files (onRelease)",
                &reuse,
                Some(&marker),
                false,
                OnRelease,
                Pave,
            ),
            (
                "repave within the boot wipes (always)",
                &reuse,
                Some(&marker),
                false,
                Always,
                WipeThenPave,
            ),
            (
                "reboot into another version (onRelease)",
                &reuse,
                Some(&other_version),
                true,
                OnRelease,
                Pave,
            ),
            (
                "reboot into another version (always)",
                &reuse,
                Some(&other_version),
                true,
                Always,
                WipeThenPave,
            ),
            (
                "another image",
                &reuse,
                Some(&other_image),
                true,
                Never,
                Pave,
            ),
            (
                "a pave that did not finish is not started",
                &reuse,
                Some(&incomplete),
                true,
                Never,
                Pave,
            ),
            (
                "another container name",
                &reuse,
                Some(&renamed),
                true,
                OnRelease,
                Pave,
            ),
            ("no marker (lost): pave", &reuse, None, true, Always, Pave),
            (
                "formatted, never paved: nothing to wipe",
                &reuse,
                Some(&fresh),
                true,
                Always,
                Pave,
            ),
            (
                "a new filesystem",
                &format,
                Some(&marker),
                true,
                Always,
                Pave,
            ),
        ];
        for (name, plan, marker, first, wipe, want) in cases {
            assert_eq!(
                decide_container(plan, marker, &wanted, first, wipe),
                want,
                "{name}"
            );
        }
        // A pool claim: (case, marker, wanted, policy, step).
        let claims = [
            (
                "claimed by a pool after another: wiped even on the same version",
                &marker,
                &wanted_claimed,
                OnRelease,
                WipeThenPave,
            ),
            (
                "claimed again by another pool",
                &claimed_before,
                &wanted_claimed,
                Always,
                WipeThenPave,
            ),
            (
                "released to the inventory, then paved unclaimed",
                &claimed_before,
                &wanted,
                OnRelease,
                WipeThenPave,
            ),
            (
                "never keeps it across claims (the same version starts from the disk)",
                &claimed_before,
                &wanted_claimed,
                Never,
                StartFromDisk,
            ),
            (
                "the same claim: a reboot starts from the disk",
                &same_claim,
                &wanted_claimed,
                OnRelease,
                StartFromDisk,
            ),
            (
                "formatted under another claim, never paved: nothing to wipe",
                &Marker {
                    configuration: None,
                    ..claimed_before.clone()
                },
                &wanted_claimed,
                OnRelease,
                Pave,
            ),
        ];
        for (name, marker, wanted, wipe, want) in claims {
            assert_eq!(
                decide_container(&reuse, Some(marker), wanted, true, wipe),
                want,
                "{name}"
            );
        }
    }
}
