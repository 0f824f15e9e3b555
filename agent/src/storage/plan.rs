//! Which disk, and what to do with it, decided from plain data before anything is touched.
//!
//! [`plan`] takes the configuration's rules, the disks as [`super::probe`] found them, the
//! disk the host booted from and this Machine's identity, and says one of:
//! - [`Plan::Reuse`]: a selected disk already carries this Machine's layout (a partition
//!   named `unbounded`, or the whole disk, holding a filesystem of the configured type
//!   whose UUID is the Machine's UID): mount it as it is;
//! - [`Plan::Format`]: lay the selected disk out anew (it is blank, or carries a layout
//!   Unbounded wrote for another Machine or in another shape, or carries foreign data and
//!   the configuration says `allowForeign`);
//! - [`Refusal`]: no disk matches, only the boot disk or disks in use match, or the disk
//!   carries foreign data without `allowForeign`. Nothing is written.
//!
//! The rules: a disk is a candidate when every rule given matches and it is not removable,
//! not the boot disk and has nothing mounted (except at the storage's own mount point, where
//! an agent restarted in the same boot finds it). Of the candidates, one with this
//! Machine's layout wins (so a rename of `sda` and `sdb` between boots never moves the
//! node's state), then one that is not foreign, then the smallest, then by serial, WWN,
//! by-path link and name: the result does not depend on the order the kernel lists disks in.
//! A disk no rule selected is never in a plan.

use std::cmp::Ordering;

use unbounded_api::storage::{DiskLayout, DiskSelector, Filesystem, StorageSpec};

use super::probe::{Disk, Signature};

/// The GPT partition name and the filesystem label Unbounded writes.
pub const LAYOUT_LABEL: &str = "unbounded";

/// 2^30.
const GIB: u64 = 1 << 30;

/// What to do with the chosen disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Mount `device` (the partition, or the disk itself for `wholeDisk`) as it is.
    Reuse {
        /// The disk.
        disk: String,
        /// The device holding this Machine's filesystem.
        device: String,
    },
    /// Erase what is on `disk`, lay it out and make the filesystem.
    Format {
        /// The disk.
        disk: String,
        /// What was on it before (for the log and the status), `None` when blank.
        previous: Option<Previous>,
    },
}

impl Plan {
    /// The disk the plan uses.
    pub fn disk(&self) -> &str {
        match self {
            Self::Reuse { disk, .. } | Self::Format { disk, .. } => disk,
        }
    }
}

/// What a disk carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// A layout Unbounded wrote, for another Machine or in another shape.
    Unbounded,
    /// Something else (described), wiped because `allowForeign` says so.
    Foreign(String),
}

/// Why nothing is done. Every refusal leaves every disk as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No disk matches the rules.
    #[error("no disk matches storage.disk ({rules}); the machine has {seen}")]
    NoMatch {
        /// The rules, for a person.
        rules: String,
        /// The disks seen, for a person.
        seen: String,
    },
    /// Only disks that may not be used match.
    #[error(
        "every disk that matches storage.disk is unusable: {0}; the disk the host booted from and disks with a mounted filesystem are never used"
    )]
    OnlyUnusable(String),
    /// The chosen disk carries data Unbounded did not write.
    #[error(
        "disk {disk} matches storage.disk but carries {found}, which Unbounded did not write; set storage.allowForeign: true if wiping it is intended"
    )]
    Foreign {
        /// The disk.
        disk: String,
        /// What is on it.
        found: String,
    },
}

impl Refusal {
    /// A short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoMatch { .. } => "NoDiskMatches",
            Self::OnlyUnusable(_) => "DiskInUse",
            Self::Foreign { .. } => "ForeignDisk",
        }
    }
}

/// Who the layout belongs to and where it is mounted.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// The Machine's UID: the filesystem's UUID.
    pub uid: &'a str,
    /// Where the storage is mounted (`/var/lib/machines`).
    pub mount_point: &'a str,
}

/// Whether `disk` matches every rule of `rules`.
pub fn selects(rules: &DiskSelector, disk: &Disk) -> bool {
    let min = u64::try_from(rules.min_size_gib())
        .unwrap_or(0)
        .saturating_mul(GIB);
    let max = rules
        .max_size_gib
        .map(|m| u64::try_from(m).unwrap_or(0).saturating_mul(GIB));
    let same = |rule: &Option<String>, fact: &Option<String>| {
        rule.as_ref()
            .is_none_or(|r| fact.as_deref() == Some(r.as_str()))
    };
    !disk.removable
        && disk.size_bytes >= min
        && max.is_none_or(|m| disk.size_bytes <= m)
        && rules.rotational.is_none_or(|r| disk.rotational == Some(r))
        && same(&rules.model, &disk.model)
        && same(&rules.serial, &disk.serial)
        && same(&rules.wwn, &disk.wwn)
        && same(&rules.by_path, &disk.by_path)
}

/// What a disk carries, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Carries {
    /// This Machine's layout, on this device.
    Ours(String),
    Blank,
    Unbounded,
    Foreign(String),
}

fn is_ours(signature: Option<&Signature>, spec: &StorageSpec, owner: &Owner<'_>) -> bool {
    signature.is_some_and(|s| {
        s.kind == spec.filesystem().as_str()
            && s.uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(owner.uid))
    })
}

/// A filesystem Unbounded makes (one of the filesystems it offers, with its label).
fn unbounded_label(signature: Option<&Signature>) -> bool {
    signature.is_some_and(|s| {
        s.label.as_deref() == Some(LAYOUT_LABEL) && s.kind == Filesystem::Ext4.as_str()
    })
}

fn carries(disk: &Disk, spec: &StorageSpec, owner: &Owner<'_>) -> Carries {
    match spec.layout() {
        DiskLayout::WholeDisk
            if disk.table.is_none()
                && disk.partitions.is_empty()
                && is_ours(disk.signature.as_ref(), spec, owner) =>
        {
            return Carries::Ours(disk.name.clone());
        }
        DiskLayout::Partition
            if disk.table.as_deref() == Some("gpt")
                && disk.signature.is_none()
                && disk.partitions.len() == 1 =>
        {
            if let Some(p) = disk.partitions.first().filter(|p| {
                p.label.as_deref() == Some(LAYOUT_LABEL)
                    && is_ours(p.signature.as_ref(), spec, owner)
            }) {
                return Carries::Ours(p.name.clone());
            }
        }
        _ => {}
    }
    if disk.is_blank() {
        return Carries::Blank;
    }
    // Unbounded's own: a whole-disk filesystem with its label, or a GPT whose partitions
    // are all named and labelled by it (an empty one is what a wipe interrupted after the
    // table left).
    let whole = disk.table.is_none()
        && disk.partitions.is_empty()
        && unbounded_label(disk.signature.as_ref());
    let gpt = disk.table.as_deref() == Some("gpt")
        && disk.signature.is_none()
        && disk.partitions.iter().all(|p| {
            p.label.as_deref() == Some(LAYOUT_LABEL)
                && p.signature
                    .as_ref()
                    .is_none_or(|s| unbounded_label(Some(s)))
        });
    if whole || gpt {
        return Carries::Unbounded;
    }
    Carries::Foreign(describe(disk))
}

/// What is on a disk, for a person.
fn describe(disk: &Disk) -> String {
    let mut parts = Vec::new();
    if let Some(table) = &disk.table {
        parts.push(format!("a {table} partition table"));
    }
    if let Some(s) = &disk.signature {
        parts.push(format!("a {} signature", s.kind));
    }
    for p in &disk.partitions {
        let what = p
            .signature
            .as_ref()
            .map(|s| s.kind.clone())
            .unwrap_or_else(|| "no filesystem".into());
        parts.push(format!("partition {} ({what})", p.name));
    }
    if parts.is_empty() {
        "partitions".into()
    } else {
        parts.join(", ")
    }
}

/// How candidates are ranked: ours first, then not foreign, then the smallest, then a
/// stable key.
fn rank(a: &(&Disk, Carries), b: &(&Disk, Carries)) -> Ordering {
    let class = |c: &Carries| match c {
        Carries::Ours(_) => 0,
        Carries::Blank | Carries::Unbounded => 1,
        Carries::Foreign(_) => 2,
    };
    let key = |d: &Disk| {
        (
            d.size_bytes,
            d.serial.clone(),
            d.wwn.clone(),
            d.by_path.clone(),
            d.name.clone(),
        )
    };
    class(&a.1)
        .cmp(&class(&b.1))
        .then_with(|| key(a.0).cmp(&key(b.0)))
}

/// Decides which disk holds the node's state and what to do with it.
pub fn plan(
    spec: &StorageSpec,
    disks: &[Disk],
    booted_from: Option<&str>,
    owner: &Owner<'_>,
) -> Result<Plan, Refusal> {
    let selected: Vec<&Disk> = disks.iter().filter(|d| selects(&spec.disk, d)).collect();
    if selected.is_empty() {
        return Err(Refusal::NoMatch {
            rules: describe_rules(&spec.disk),
            seen: describe_disks(disks),
        });
    }
    let mut unusable = Vec::new();
    let mut candidates: Vec<(&Disk, Carries)> = Vec::new();
    for disk in selected {
        if booted_from == Some(disk.name.as_str()) {
            unusable.push(format!("{} (the boot disk)", disk.name));
        } else if let Some(m) = disk.all_mounts().find(|m| *m != owner.mount_point) {
            unusable.push(format!("{} (mounted at {m})", disk.name));
        } else if let Some(why) = disk.in_use_by() {
            unusable.push(format!("{} ({why})", disk.name));
        } else {
            candidates.push((disk, carries(disk, spec, owner)));
        }
    }
    candidates.sort_by(rank);
    let Some((disk, carried)) = candidates.into_iter().next() else {
        unusable.sort();
        return Err(Refusal::OnlyUnusable(unusable.join(", ")));
    };
    let name = disk.name.clone();
    match carried {
        Carries::Ours(device) => Ok(Plan::Reuse { disk: name, device }),
        Carries::Blank => Ok(Plan::Format {
            disk: name,
            previous: None,
        }),
        Carries::Unbounded => Ok(Plan::Format {
            disk: name,
            previous: Some(Previous::Unbounded),
        }),
        Carries::Foreign(found) if spec.allow_foreign => Ok(Plan::Format {
            disk: name,
            previous: Some(Previous::Foreign(found)),
        }),
        Carries::Foreign(found) => Err(Refusal::Foreign { disk: name, found }),
    }
}

fn describe_rules(rules: &DiskSelector) -> String {
    let mut parts = vec![format!("at least {} GiB", rules.min_size_gib())];
    if let Some(max) = rules.max_size_gib {
        parts.push(format!("at most {max} GiB"));
    }
    if let Some(r) = rules.rotational {
        parts.push(if r { "rotational" } else { "not rotational" }.into());
    }
    for (what, value) in [
        ("model", &rules.model),
        ("serial", &rules.serial),
        ("wwn", &rules.wwn),
        ("byPath", &rules.by_path),
    ] {
        if let Some(v) = value {
            parts.push(format!("{what} {v:?}"));
        }
    }
    parts.push("not removable".into());
    parts.join(", ")
}

fn describe_disks(disks: &[Disk]) -> String {
    if disks.is_empty() {
        return "no disks".into();
    }
    let mut seen: Vec<String> = disks
        .iter()
        .map(|d| {
            let gib = d.size_bytes as f64 / GIB as f64;
            let removable = if d.removable { ", removable" } else { "" };
            format!("{} ({gib:.1} GiB{removable})", d.name)
        })
        .collect();
    seen.sort();
    seen.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::probe::Partition;
    use proptest::prelude::*;

    const UID: &str = "6f1c1a52-2a57-4a47-9d1b-1d4b6c0e9a11";
    const OWNER: Owner<'static> = Owner {
        uid: UID,
        mount_point: "/var/lib/machines",
    };

    fn disk(name: &str, gib: u64) -> Disk {
        Disk {
            name: name.into(),
            size_bytes: gib * GIB,
            removable: false,
            read_only: false,
            rotational: Some(false),
            model: Some("QEMU HARDDISK".into()),
            serial: Some(format!("serial-{name}")),
            wwn: None,
            by_path: Some(format!("pci-{name}")),
            table: None,
            signature: None,
            partitions: vec![],
            mounts: vec![],
            in_use: vec![],
        }
    }

    fn fs(kind: &str, uuid: &str, label: Option<&str>) -> Option<Signature> {
        Some(Signature {
            kind: kind.into(),
            uuid: Some(uuid.into()),
            label: label.map(str::to_owned),
        })
    }

    /// A disk with Unbounded's partition layout, the filesystem's UUID `uuid`.
    fn laid_out(name: &str, gib: u64, uuid: &str) -> Disk {
        Disk {
            table: Some("gpt".into()),
            partitions: vec![Partition {
                name: format!("{name}1"),
                size_bytes: gib * GIB - (1 << 20),
                label: Some(LAYOUT_LABEL.into()),
                signature: fs("ext4", uuid, Some(LAYOUT_LABEL)),
                mounts: vec![],
            }],
            ..disk(name, gib)
        }
    }

    fn foreign(name: &str, gib: u64) -> Disk {
        Disk {
            table: Some("dos".into()),
            partitions: vec![Partition {
                name: format!("{name}1"),
                size_bytes: gib * GIB,
                label: None,
                signature: fs("ntfs", "A1B2", None),
                mounts: vec![],
            }],
            ..disk(name, gib)
        }
    }

    fn spec(rules: DiskSelector) -> StorageSpec {
        StorageSpec {
            disk: rules,
            ..StorageSpec::default()
        }
    }

    fn format(disk: &str, previous: Option<Previous>) -> Result<Plan, Refusal> {
        Ok(Plan::Format {
            disk: disk.into(),
            previous,
        })
    }

    #[test]
    fn plan_table() {
        let default = spec(DiskSelector::default());
        let allow = StorageSpec {
            allow_foreign: true,
            ..default.clone()
        };
        let whole = StorageSpec {
            layout: Some(DiskLayout::WholeDisk),
            ..default.clone()
        };
        let removable = Disk {
            removable: true,
            ..disk("sdc", 64)
        };
        let mounted = Disk {
            mounts: vec!["/srv".into()],
            ..disk("sdd", 40)
        };
        let ours_mounted = Disk {
            partitions: vec![Partition {
                mounts: vec!["/var/lib/machines".into()],
                ..laid_out("sde", 50, UID).partitions[0].clone()
            }],
            ..laid_out("sde", 50, UID)
        };
        let whole_ours = Disk {
            signature: fs("ext4", UID, Some(LAYOUT_LABEL)),
            ..disk("sdf", 30)
        };
        let by_serial = spec(DiskSelector {
            serial: Some("serial-sdb".into()),
            ..DiskSelector::default()
        });
        let hdd = spec(DiskSelector {
            rotational: Some(true),
            ..DiskSelector::default()
        });
        let range = spec(DiskSelector {
            min_size_gib: Some(100),
            max_size_gib: Some(200),
            ..DiskSelector::default()
        });
        type Case = (
            &'static str,
            StorageSpec,
            Vec<Disk>,
            Option<&'static str>,
            Result<Plan, Refusal>,
        );
        let cases: Vec<Case> = vec![
            (
                "the smallest of at least 16 GiB",
                default.clone(),
                vec![disk("sda", 500), disk("sdb", 8), disk("sdc", 100)],
                None,
                format("sdc", None),
            ),
            (
                "this Machine's layout wins over a smaller blank disk",
                default.clone(),
                vec![disk("sda", 20), laid_out("sdb", 100, UID)],
                None,
                Ok(Plan::Reuse {
                    disk: "sdb".into(),
                    device: "sdb1".into(),
                }),
            ),
            (
                "another Machine's layout is formatted",
                default.clone(),
                vec![laid_out("sda", 100, "00000000-0000-0000-0000-000000000000")],
                None,
                format("sda", Some(Previous::Unbounded)),
            ),
            (
                "our UUID on another filesystem type is not ours",
                default.clone(),
                vec![Disk {
                    partitions: vec![Partition {
                        signature: fs("xfs", UID, Some(LAYOUT_LABEL)),
                        ..laid_out("sda", 50, UID).partitions[0].clone()
                    }],
                    ..laid_out("sda", 50, UID)
                }],
                None,
                Err(Refusal::Foreign {
                    disk: "sda".into(),
                    found: "a gpt partition table, partition sda1 (xfs)".into(),
                }),
            ),
            (
                "foreign refused, nothing else matches",
                default.clone(),
                vec![foreign("sda", 100)],
                None,
                Err(Refusal::Foreign {
                    disk: "sda".into(),
                    found: "a dos partition table, partition sda1 (ntfs)".into(),
                }),
            ),
            (
                "foreign with allowForeign is formatted",
                allow.clone(),
                vec![foreign("sda", 100)],
                None,
                format(
                    "sda",
                    Some(Previous::Foreign(
                        "a dos partition table, partition sda1 (ntfs)".into(),
                    )),
                ),
            ),
            (
                "a blank disk is preferred over a smaller foreign one",
                default.clone(),
                vec![foreign("sda", 20), disk("sdb", 200)],
                None,
                format("sdb", None),
            ),
            (
                "with allowForeign, still a blank one before a foreign one",
                allow.clone(),
                vec![foreign("sda", 20), disk("sdb", 200)],
                None,
                format("sdb", None),
            ),
            (
                "no disk large enough",
                default.clone(),
                vec![disk("sda", 8), removable.clone()],
                None,
                Err(Refusal::NoMatch {
                    rules: "at least 16 GiB, not removable".into(),
                    seen: "sda (8.0 GiB), sdc (64.0 GiB, removable)".into(),
                }),
            ),
            (
                "no disks at all",
                default.clone(),
                vec![],
                None,
                Err(Refusal::NoMatch {
                    rules: "at least 16 GiB, not removable".into(),
                    seen: "no disks".into(),
                }),
            ),
            (
                "only the boot disk matches",
                default.clone(),
                vec![disk("sda", 100)],
                Some("sda"),
                Err(Refusal::OnlyUnusable("sda (the boot disk)".into())),
            ),
            (
                "the boot disk is passed over",
                default.clone(),
                vec![disk("sda", 100), disk("sdb", 200)],
                Some("sda"),
                format("sdb", None),
            ),
            (
                "a disk with a mount elsewhere is in use",
                default.clone(),
                vec![mounted.clone()],
                None,
                Err(Refusal::OnlyUnusable("sdd (mounted at /srv)".into())),
            ),
            (
                "our own mount (agent restarted) is reused",
                default.clone(),
                vec![ours_mounted],
                None,
                Ok(Plan::Reuse {
                    disk: "sde".into(),
                    device: "sde1".into(),
                }),
            ),
            (
                "whole-disk layout reused",
                whole.clone(),
                vec![whole_ours.clone()],
                None,
                Ok(Plan::Reuse {
                    disk: "sdf".into(),
                    device: "sdf".into(),
                }),
            ),
            (
                "a whole-disk layout when partitions are configured: formatted",
                default.clone(),
                vec![whole_ours],
                None,
                format("sdf", Some(Previous::Unbounded)),
            ),
            (
                "a partition layout when whole disk is configured: formatted",
                whole,
                vec![laid_out("sda", 40, UID)],
                None,
                format("sda", Some(Previous::Unbounded)),
            ),
            (
                "by serial, whatever the size order",
                by_serial,
                vec![disk("sda", 20), disk("sdb", 900)],
                None,
                format("sdb", None),
            ),
            (
                "rotational only",
                hdd.clone(),
                vec![disk("sda", 20)],
                None,
                Err(Refusal::NoMatch {
                    rules: "at least 16 GiB, rotational, not removable".into(),
                    seen: "sda (20.0 GiB)".into(),
                }),
            ),
            (
                "size range",
                range,
                vec![
                    disk("sda", 99),
                    disk("sdb", 201),
                    disk("sdc", 150),
                    disk("sdd", 200),
                ],
                None,
                format("sdc", None),
            ),
            (
                "an empty GPT left by Unbounded (interrupted) is Unbounded's",
                default.clone(),
                vec![Disk {
                    table: Some("gpt".into()),
                    ..disk("sda", 20)
                }],
                None,
                format("sda", Some(Previous::Unbounded)),
            ),
            (
                "an unreadable disk (ambivalent) is foreign",
                default.clone(),
                vec![Disk {
                    signature: Some(Signature {
                        kind: "ambivalent".into(),
                        uuid: None,
                        label: None,
                    }),
                    ..disk("sda", 20)
                }],
                None,
                Err(Refusal::Foreign {
                    disk: "sda".into(),
                    found: "a ambivalent signature".into(),
                }),
            ),
        ];
        for (name, spec, disks, booted, want) in cases {
            assert_eq!(plan(&spec, &disks, booted, &OWNER), want, "{name}");
        }
    }

    #[test]
    fn refusals_name_what_to_do() {
        let err = plan(
            &spec(DiskSelector::default()),
            &[foreign("sda", 100)],
            None,
            &OWNER,
        )
        .unwrap_err();
        assert!(err.to_string().contains("allowForeign: true"), "{err}");
        assert_eq!(err.reason(), "ForeignDisk");
    }

    fn arb_signature() -> impl Strategy<Value = Option<Signature>> {
        prop_oneof![
            Just(None),
            Just(fs("ext4", UID, Some(LAYOUT_LABEL))),
            Just(fs(
                "ext4",
                "11111111-1111-1111-1111-111111111111",
                Some(LAYOUT_LABEL)
            )),
            Just(fs("xfs", "22", None)),
            Just(fs("xfs", "44", Some(LAYOUT_LABEL))),
            Just(fs("swap", "33", None)),
        ]
    }

    prop_compose! {
        fn arb_disk(index: usize)(
            gib in prop_oneof![Just(8u64), Just(16), Just(20), Just(100), Just(500)],
            removable in any::<bool>(),
            rotational in proptest::option::of(any::<bool>()),
            serial in proptest::option::of(prop_oneof![Just("A".to_owned()), Just("B".to_owned())]),
            table in proptest::option::of(prop_oneof![Just("gpt".to_owned()), Just("dos".to_owned())]),
            whole in arb_signature(),
            parts in proptest::collection::vec((proptest::option::of(Just(LAYOUT_LABEL.to_owned())), arb_signature(), any::<bool>()), 0..3),
        ) -> Disk {
            let name = format!("sd{}", char::from(b'a' + u8::try_from(index).unwrap_or(0)));
            Disk {
                partitions: parts.into_iter().enumerate().map(|(i, (label, signature, mounted))| Partition {
                    name: format!("{name}{}", i + 1),
                    size_bytes: GIB,
                    label,
                    signature,
                    mounts: if mounted { vec!["/data".into()] } else { vec![] },
                }).collect(),
                size_bytes: gib * GIB,
                removable,
                rotational,
                serial,
                table,
                signature: whole,
                ..disk(&name, gib)
            }
        }
    }

    fn arb_disks() -> impl Strategy<Value = Vec<Disk>> {
        (0usize..6).prop_flat_map(|n| (0..n).map(arb_disk).collect::<Vec<_>>())
    }

    fn arb_spec() -> impl Strategy<Value = StorageSpec> {
        (
            proptest::option::of(prop_oneof![Just(1i64), Just(16), Just(50)]),
            proptest::option::of(prop_oneof![Just(20i64), Just(200)]),
            proptest::option::of(any::<bool>()),
            proptest::option::of(prop_oneof![Just("A".to_owned()), Just("C".to_owned())]),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(min, max, rotational, serial, whole, allow_foreign)| StorageSpec {
                    disk: DiskSelector {
                        min_size_gib: min,
                        max_size_gib: max,
                        rotational,
                        serial,
                        ..DiskSelector::default()
                    },
                    layout: whole.then_some(DiskLayout::WholeDisk),
                    allow_foreign,
                    ..StorageSpec::default()
                },
            )
    }

    /// The oracle, written apart from `carries`: a disk holds data Unbounded did not write
    /// when it has a table other than GPT, partitions without a table, a table and a
    /// whole-disk signature, or any partition or signature without Unbounded's names.
    fn written_by_someone_else(d: &Disk) -> bool {
        let labelled = |s: &Signature| s.label.as_deref() == Some(LAYOUT_LABEL) && s.kind == "ext4";
        d.table.as_deref().is_some_and(|t| t != "gpt")
            || (d.table.is_none() && !d.partitions.is_empty())
            || (d.table.is_some() && d.signature.is_some())
            || d.signature.as_ref().is_some_and(|s| !labelled(s))
            || d.partitions.iter().any(|p| {
                p.label.as_deref() != Some(LAYOUT_LABEL)
                    || p.signature.as_ref().is_some_and(|s| !labelled(s))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, rng_seed: proptest::test_runner::RngSeed::Fixed(27), ..ProptestConfig::default() })]

        /// Whatever the disks: the plan's disk is one the rules select, not the boot disk,
        /// not in use, and formatted over foreign data only with `allowForeign`; a reused
        /// disk really carries this Machine's filesystem; and the plan does not depend on
        /// the order the disks are listed in.
        #[test]
        fn the_plan_touches_only_what_it_may(
            spec in arb_spec(),
            disks in arb_disks(),
            boot in proptest::option::of(0usize..6),
            rotation in 0usize..6,
        ) {
            let booted = boot.and_then(|i| disks.get(i)).map(|d| d.name.clone());
            let result = plan(&spec, &disks, booted.as_deref(), &OWNER);
            let mut shuffled = disks.clone();
            shuffled.reverse();
            let len = shuffled.len().max(1);
            shuffled.rotate_left(rotation % len);
            prop_assert_eq!(&plan(&spec, &shuffled, booted.as_deref(), &OWNER), &result, "order changed the plan");
            let Ok(chosen) = result else { return Ok(()) };
            let disk = disks.iter().find(|d| d.name == chosen.disk());
            prop_assert!(disk.is_some());
            let disk = disk.unwrap();
            // The rules restated, apart from `selects`.
            let rules = &spec.disk;
            prop_assert!(!disk.removable, "a removable disk");
            prop_assert!(disk.size_bytes >= u64::try_from(rules.min_size_gib.unwrap_or(16)).unwrap() * GIB, "too small");
            prop_assert!(rules.max_size_gib.is_none_or(|m| disk.size_bytes <= u64::try_from(m).unwrap() * GIB), "too large");
            prop_assert!(rules.rotational.is_none_or(|r| disk.rotational == Some(r)), "rotational");
            prop_assert!(rules.serial.as_ref().is_none_or(|s| disk.serial.as_deref() == Some(s.as_str())), "serial");
            prop_assert!(Some(disk.name.as_str()) != booted.as_deref(), "the boot disk");
            prop_assert!(disk.all_mounts().all(|m| m == OWNER.mount_point), "a disk in use");
            match &chosen {
                Plan::Format { previous, .. } => {
                    let foreign = written_by_someone_else(disk);
                    prop_assert!(!foreign || spec.allow_foreign, "foreign data without allowForeign");
                    prop_assert_eq!(matches!(previous, Some(Previous::Foreign(_))), foreign);
                    prop_assert!(!disk.is_blank() || previous.is_none());
                }
                Plan::Reuse { device, .. } => {
                    let signature = if device == &disk.name {
                        disk.signature.as_ref()
                    } else {
                        disk.partitions.iter().find(|p| &p.name == device).and_then(|p| p.signature.as_ref())
                    };
                    prop_assert!(is_ours(signature, &spec, &OWNER));
                }
            }
        }
    }
}
