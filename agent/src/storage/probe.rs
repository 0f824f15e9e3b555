//! What is on the machine's disks, as plain data: hardware facts from sysfs, signatures
//! (partition table, filesystem, partition names) from `blkid -p`, mounts from
//! `/proc/self/mountinfo`.
//!
//! Why not `lsblk -J -O`: lsblk takes partition tables, filesystems and labels from udev's
//! database, and shows nothing for them where udev does not run (a container, an early
//! boot); `blkid -p` reads the device itself, so what the plan sees is what is on the disk.
//! The parsers are pure functions over text, tested here; [`read_disks`] runs them on a
//! root (`/` on a machine).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A signature `blkid` found: a filesystem, swap, RAID member, LVM physical volume….
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// `TYPE` (`ext4`, `xfs`, `swap`, `LVM2_member`), or `ambivalent` when blkid found
    /// several superblocks and would not choose.
    pub kind: String,
    /// `UUID`.
    pub uuid: Option<String>,
    /// `LABEL`.
    pub label: Option<String>,
}

/// A partition of a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Kernel name (`sda1`, `nvme0n1p1`, `loop0p1`).
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// GPT partition name (`PART_ENTRY_NAME`).
    pub label: Option<String>,
    /// What the partition holds.
    pub signature: Option<Signature>,
    /// Where it is mounted.
    pub mounts: Vec<String>,
}

/// A disk as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Kernel name (`sda`, `nvme0n1`); changes between boots, so no rule names it.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Removable media (USB sticks, card readers).
    pub removable: bool,
    /// The kernel refuses writes (`ro`).
    pub read_only: bool,
    /// Spinning (`queue/rotational`), when known.
    pub rotational: Option<bool>,
    /// Model.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// World Wide Name.
    pub wwn: Option<String>,
    /// Name of the disk's link in `/dev/disk/by-path`.
    pub by_path: Option<String>,
    /// Partition table type (`gpt`, `dos`).
    pub table: Option<String>,
    /// A signature on the disk itself (a filesystem without a partition table).
    pub signature: Option<Signature>,
    /// Partitions.
    pub partitions: Vec<Partition>,
    /// Where the disk itself is mounted.
    pub mounts: Vec<String>,
    /// What else holds the disk or one of its partitions, so that it must not be written:
    /// a device stacked on it (`held by md127`, `held by dm-0`: a software RAID, an LVM
    /// physical volume in use), an active swap area, or a device that cannot be read at all
    /// (`unreadable: …`: unknown is not blank).
    pub in_use: Vec<String>,
}

impl Disk {
    /// Why the disk must not be written, beside a mount: its first [`Disk::in_use`] reason.
    pub fn in_use_by(&self) -> Option<&str> {
        self.in_use.first().map(String::as_str)
    }

    /// Every mount point of the disk and its partitions.
    pub fn all_mounts(&self) -> impl Iterator<Item = &str> {
        self.mounts
            .iter()
            .chain(self.partitions.iter().flat_map(|p| p.mounts.iter()))
            .map(String::as_str)
    }

    /// A blank disk: no partition table, no signature, no partition.
    pub fn is_blank(&self) -> bool {
        self.table.is_none() && self.signature.is_none() && self.partitions.is_empty()
    }
}

/// What `blkid -p -o export` printed, key by key.
pub fn parse_blkid_export(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Signatures of one device: `(partition table type, signature, GPT partition name)` from
/// blkid's exit code and output. Exit code 2 is "nothing found", 8 "ambivalent" (more
/// than one superblock: foreign by any measure).
pub fn signatures_from_blkid(
    code: Option<i32>,
    text: &str,
) -> (Option<String>, Option<Signature>, Option<String>) {
    if code == Some(8) {
        let ambivalent = Signature {
            kind: "ambivalent".into(),
            uuid: None,
            label: None,
        };
        return (None, Some(ambivalent), None);
    }
    let fields = parse_blkid_export(text);
    let get = |k: &str| fields.get(k).filter(|v| !v.is_empty()).cloned();
    let signature = get("TYPE").map(|kind| Signature {
        kind,
        uuid: get("UUID"),
        label: get("LABEL"),
    });
    (get("PTTYPE"), signature, get("PART_ENTRY_NAME"))
}

/// Mount points by device number (`major:minor`) from `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut mounts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if let (Some(dev), Some(point)) = (fields.get(2), fields.get(4)) {
            mounts
                .entry((*dev).to_owned())
                .or_default()
                .push(unescape_mount(point));
        }
    }
    mounts
}

/// mountinfo writes space, tab, newline and backslash in paths as octal escapes.
fn unescape_mount(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')));
        match octal.and_then(|n| u8::try_from(n).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_trimmed(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!text.is_empty()).then(|| text.to_owned())
}

fn sorted_entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    out.sort();
    out
}

/// Block devices that are never disks for node state.
const NOT_DISKS: [&str; 9] = [
    "loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd", "mtdblock",
];

/// What [`read_disks`] reads.
#[derive(Debug, Clone)]
pub enum DiskScope {
    /// Every disk under `/sys/block` (loop, RAM, optical, device-mapper and RAID devices
    /// left out).
    All,
    /// Only these devices, by kernel name, whatever they are (tests use loop devices).
    Only(Vec<String>),
}

/// Reads the disks under `<root>/sys/block`, probing each device node under `<root>/dev`
/// with `blkid -p` (root is needed to read a device).
pub fn read_disks(root: &Path, scope: &DiskScope) -> Vec<Disk> {
    let mounts = fs::read_to_string(root.join("proc/self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default();
    let swaps = fs::read_to_string(root.join("proc/swaps"))
        .map(|t| parse_swaps(&t))
        .unwrap_or_default();
    let by_path = sorted_entries(&root.join("dev/disk/by-path"));
    let mounts_of = |dir: &Path| {
        read_trimmed(&dir.join("dev"))
            .and_then(|dev| mounts.get(&dev).cloned())
            .unwrap_or_default()
    };
    sorted_entries(&root.join("sys/block"))
        .into_iter()
        .filter(|(name, _)| match scope {
            DiskScope::All => !NOT_DISKS.iter().any(|p| name.starts_with(p)),
            DiskScope::Only(names) => names.contains(name),
        })
        .filter_map(|(name, dir)| {
            let sectors: u64 = read_trimmed(&dir.join("size"))?.parse().ok()?;
            let device = dir.join("device");
            let node = root.join("dev").join(&name);
            let mut in_use = users(&dir, &name, &swaps);
            if let Err(error) = readable(&node) {
                in_use.push(format!("unreadable: {error}"));
            }
            let (table, signature, _) = probe(&node);
            let partitions: Vec<Partition> = sorted_entries(&dir)
                .into_iter()
                .filter(|(_, p)| p.join("partition").exists())
                .map(|(part, pdir)| {
                    in_use.extend(users(&pdir, &part, &swaps));
                    let (_, signature, label) = probe(&root.join("dev").join(&part));
                    Partition {
                        size_bytes: read_trimmed(&pdir.join("size"))
                            .and_then(|s| s.parse::<u64>().ok())
                            .unwrap_or(0)
                            .saturating_mul(512),
                        mounts: mounts_of(&pdir),
                        name: part,
                        label,
                        signature,
                    }
                })
                .collect();
            Some(Disk {
                by_path: by_path
                    .iter()
                    .find(|(link, path)| {
                        !link.contains("-part")
                            && fs::read_link(path)
                                .ok()
                                .is_some_and(|t| t.file_name().is_some_and(|f| f == name.as_str()))
                    })
                    .map(|(link, _)| link.clone()),
                // sysfs counts 512-byte sectors whatever the device's block size.
                size_bytes: sectors.saturating_mul(512),
                removable: read_trimmed(&dir.join("removable")).as_deref() == Some("1"),
                read_only: read_trimmed(&dir.join("ro")).as_deref() == Some("1"),
                rotational: read_trimmed(&dir.join("queue/rotational")).map(|r| r == "1"),
                model: read_trimmed(&device.join("model")),
                serial: read_trimmed(&device.join("serial"))
                    .or_else(|| read_trimmed(&dir.join("serial"))),
                wwn: read_trimmed(&device.join("wwid")).or_else(|| read_trimmed(&dir.join("wwid"))),
                mounts: mounts_of(&dir),
                table,
                signature,
                partitions,
                in_use,
                name,
            })
        })
        .collect()
}

/// The devices stacked on `dir`'s block device (`holders/`: md, dm) and whether `name` is
/// an active swap area.
fn users(dir: &Path, name: &str, swaps: &[String]) -> Vec<String> {
    let mut users: Vec<String> = sorted_entries(&dir.join("holders"))
        .into_iter()
        .map(|(holder, _)| format!("{name} held by {holder}"))
        .collect();
    if swaps.iter().any(|s| s == name) {
        users.push(format!("{name} is an active swap area"));
    }
    users
}

/// The kernel names of the active swap areas in `/proc/swaps` (`/dev/sda2` → `sda2`).
pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|device| device.strip_prefix("/dev/"))
        .map(str::to_owned)
        .collect()
}

/// Whether the device's first sector can be read: blkid says "nothing found" (exit 2) for a
/// device it could not open too, and that must never read as blank.
fn readable(device: &Path) -> Result<(), std::io::Error> {
    use std::io::Read;
    let mut sector = [0u8; 512];
    fs::File::open(device)?.read_exact(&mut sector)
}

/// `blkid -p` on one device node. A device that cannot be read shows as ambivalent: the plan
/// then treats it as foreign, never as blank.
fn probe(device: &Path) -> (Option<String>, Option<Signature>, Option<String>) {
    match Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .output()
    {
        Ok(out) if matches!(out.status.code(), Some(0 | 2 | 8)) => {
            signatures_from_blkid(out.status.code(), &String::from_utf8_lossy(&out.stdout))
        }
        _ => signatures_from_blkid(Some(8), ""),
    }
}

/// The disk that holds the host's root filesystem (`/`), when it is on a disk: a machine
/// that network-booted has its root in RAM and none.
pub fn boot_disk(disks: &[Disk]) -> Option<String> {
    disks
        .iter()
        .find(|d| d.all_mounts().any(|m| m == "/"))
        .map(|d| d.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_output_table() {
        let gpt = "DEVNAME=/dev/loop0\nPTUUID=fefe\nPTTYPE=gpt\n";
        assert_eq!(
            signatures_from_blkid(Some(0), gpt),
            (Some("gpt".into()), None, None)
        );
        let part = "DEVNAME=/dev/loop0p1\nUUID=0b5e\nBLOCK_SIZE=4096\nTYPE=ext4\nLABEL=unbounded\nUSAGE=filesystem\nPART_ENTRY_SCHEME=gpt\nPART_ENTRY_NAME=unbounded\nPART_ENTRY_NUMBER=1\n";
        assert_eq!(
            signatures_from_blkid(Some(0), part),
            (
                None,
                Some(Signature {
                    kind: "ext4".into(),
                    uuid: Some("0b5e".into()),
                    label: Some("unbounded".into())
                }),
                Some("unbounded".into())
            )
        );
        assert_eq!(signatures_from_blkid(Some(2), ""), (None, None, None));
        let (_, ambivalent, _) = signatures_from_blkid(Some(8), "");
        assert_eq!(ambivalent.map(|s| s.kind).as_deref(), Some("ambivalent"));
    }

    /// md and dm devices stacked on a disk (a software RAID member, an LVM physical volume
    /// in use) show in `holders/`; this machine's kernel has neither md nor dm, so the
    /// sysfs tree is written here, the way the kernel lays it out.
    #[test]
    fn a_disk_held_by_md_or_dm_is_in_use() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys/block");
        for (disk, holder, part_holder) in [
            ("vdx", Some("md127"), None),
            ("vdy", None, Some("dm-0")),
            ("vdz", None, None),
        ] {
            let dir = sys.join(disk);
            fs::create_dir_all(dir.join("holders")).unwrap();
            fs::write(dir.join("size"), "2097152\n").unwrap();
            if let Some(holder) = holder {
                fs::create_dir_all(dir.join("holders").join(holder)).unwrap();
            }
            let part = dir.join(format!("{disk}1"));
            fs::create_dir_all(part.join("holders")).unwrap();
            fs::write(part.join("partition"), "1\n").unwrap();
            fs::write(part.join("size"), "2095104\n").unwrap();
            if let Some(holder) = part_holder {
                fs::create_dir_all(part.join("holders").join(holder)).unwrap();
            }
            fs::create_dir_all(root.path().join("dev")).unwrap();
            for node in [disk.to_owned(), format!("{disk}1")] {
                fs::write(root.path().join("dev").join(node), vec![0u8; 4096]).unwrap();
            }
        }
        fs::create_dir_all(root.path().join("proc")).unwrap();
        fs::write(
            root.path().join("proc/swaps"),
            "Filename Type Size Used Priority\n/dev/vdz1 partition 1 0 -2\n",
        )
        .unwrap();
        let disks = read_disks(root.path(), &DiskScope::All);
        let in_use: Vec<(&str, Option<&str>)> = disks
            .iter()
            .map(|d| (d.name.as_str(), d.in_use_by()))
            .collect();
        assert_eq!(
            in_use,
            [
                ("vdx", Some("vdx held by md127")),
                ("vdy", Some("vdy1 held by dm-0")),
                ("vdz", Some("vdz1 is an active swap area")),
            ]
        );
    }

    #[test]
    fn active_swap_areas_by_kernel_name() {
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                     /dev/sda2                               partition\t8388604\t\t0\t\t-2\n\
                     /swapfile                               file\t\t1048572\t\t0\t\t-3\n\
                     /dev/dm-1                               partition\t4194300\t\t0\t\t-4\n";
        assert_eq!(parse_swaps(swaps), ["sda2", "dm-1"]);
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }

    #[test]
    fn mountinfo_by_device() {
        let text = "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n\
                    40 22 259:3 / /var/lib/my\\040disk rw - ext4 /dev/nvme0n1p3 rw\n\
                    41 22 0:25 / /run rw - tmpfs tmpfs rw\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts["259:2"], vec!["/"]);
        assert_eq!(mounts["259:3"], vec!["/var/lib/my disk"]);
        assert_eq!(mounts["0:25"], vec!["/run"]);
    }

    #[test]
    fn boot_disk_is_the_one_holding_root() {
        let disk = |name: &str, mount: &str| Disk {
            name: name.into(),
            size_bytes: 1 << 30,
            removable: false,
            read_only: false,
            rotational: None,
            model: None,
            serial: None,
            wwn: None,
            by_path: None,
            table: Some("gpt".into()),
            signature: None,
            partitions: vec![Partition {
                name: format!("{name}1"),
                size_bytes: 1 << 29,
                label: None,
                signature: None,
                mounts: vec![mount.into()],
            }],
            mounts: vec![],
            in_use: vec![],
        };
        let disks = [disk("sda", "/data"), disk("sdb", "/")];
        assert_eq!(boot_disk(&disks).as_deref(), Some("sdb"));
        assert_eq!(boot_disk(&disks[..1]), None);
    }
}
