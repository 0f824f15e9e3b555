//! The storage plan carried out on real block devices: loop devices over sparse files, with
//! the real `wipefs`, `sfdisk`, `partx`, `mkfs.ext4`, `mount` and `blkdiscard`; every
//! outcome checked by reading the device back.
//!
//! They need root, loop devices and those tools (scripts/install-deps.sh installs them).
//! Without them each test fails and says what is missing: they are the only tests of the
//! wipe's safety, and one that passed without checking anything would hide a regression.
//! There is no udev here: the shell makes partition nodes
//! itself (see `unbounded_agent::storage::apply`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use unbounded_agent::storage::apply::{self, StorageError};
use unbounded_agent::storage::probe::{self, Disk, DiskScope};
use unbounded_agent::storage::shell::{DiskInput, pave_finished, prepare_disk, wipe_for_release};
use unbounded_agent::storage::{ContainerStep, Marker, Owner, Plan, Previous, Refusal, plan};
use unbounded_api::ResolvedConfiguration;
use unbounded_api::storage::{DiskSelector, StorageSpec, WipeMethod, WipePolicy};

const UID: &str = "3d5f1a8e-7c2b-4e0a-9f61-2b8c4d7e6a10";
const OTHER_UID: &str = "9b0e2c41-5a6d-4f3b-8e72-1c9d0a4b5e63";
const MIB: u64 = 1 << 20;

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if uid != "0" {
        return Some("not root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    for tool in [
        "losetup",
        "sfdisk",
        "partx",
        "wipefs",
        "mkfs.ext4",
        "dumpe2fs",
        "blkid",
        "blkdiscard",
        "mount",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not installed (scripts/install-deps.sh)"));
        }
    }
    None
}

/// Fails the test, saying why, when it cannot run here: a safety test that passes without
/// checking anything is a defect (CI and scripts/test have root and every tool).
fn require(test: &str) {
    if let Some(why) = unavailable() {
        panic!("{test}: needs root and loop devices: {why}");
    }
}

/// A loop device over a sparse file, detached (and unmounted) on drop.
struct LoopDisk {
    _dir: tempfile::TempDir,
    image: PathBuf,
    name: String,
    mount_point: PathBuf,
    /// The ramfs the image lives on ([`LoopDisk::without_discard`]).
    outer: Option<PathBuf>,
}

impl LoopDisk {
    fn new(size: u64, read_only: bool) -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let image = dir.path().join("disk.img");
        fs::File::create(&image).unwrap().set_len(size).unwrap();
        Self::attach(dir, image, read_only)
    }

    fn attach(dir: tempfile::TempDir, image: PathBuf, read_only: bool) -> Self {
        let mut args = vec!["-f", "--show", "-P"];
        if read_only {
            args.push("-r");
        }
        let out = Command::new("losetup")
            .args(&args)
            .arg(&image)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let device = String::from_utf8(out.stdout).unwrap();
        let name = device.trim().trim_start_matches("/dev/").to_owned();
        let mount_point = dir.path().join("machines");
        Self {
            _dir: dir,
            image,
            name,
            mount_point,
            outer: None,
        }
    }

    /// A disk that refuses discards, as many HDDs and some controllers do: its file lives on
    /// a ramfs, which cannot punch holes, so the loop device offers no discard and
    /// `blkdiscard` fails with "Operation not supported". (Not a queue limit set to 0 in
    /// sysfs: a loop device keeps that after it is detached, for the next test's disk.)
    /// Only what is written takes memory: a few dozen MiB.
    fn without_discard(size: u64) -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let outer = dir.path().join("ramfs");
        fs::create_dir(&outer).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(&outer)
            .output()
            .unwrap();
        assert!(mounted.status.success(), "{mounted:?}");
        let image = outer.join("disk.img");
        fs::File::create(&image).unwrap().set_len(size).unwrap();
        let mut disk = Self::attach(dir, image, false);
        disk.outer = Some(outer);
        disk
    }

    fn probe(&self) -> Disk {
        let disks = probe::read_disks(Path::new("/"), &DiskScope::Only(vec![self.name.clone()]));
        assert_eq!(disks.len(), 1, "{} not found in /sys/block", self.name);
        disks.into_iter().next().unwrap()
    }

    fn sha256(&self) -> Vec<u8> {
        let mut file = fs::File::open(&self.image).unwrap();
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        let mut buffer = vec![0u8; 4 * MIB as usize];
        loop {
            let n = file.read(&mut buffer).unwrap();
            if n == 0 {
                break;
            }
            context.update(&buffer[..n]);
        }
        context.finish().as_ref().to_vec()
    }

    fn read_at(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut file = fs::File::open(&self.image).unwrap();
        file.seek(SeekFrom::Start(offset)).unwrap();
        let mut bytes = vec![0u8; len];
        file.read_exact(&mut bytes).unwrap();
        bytes
    }

    /// Whether the image holds `needle` anywhere (grep: a byte scan of 1 GiB in a debug
    /// build takes a minute).
    fn contains(&self, needle: &str) -> bool {
        let status = Command::new("grep")
            .args(["-q", "-a", "-F", needle])
            .arg(&self.image)
            .status()
            .unwrap();
        status.success()
    }

    fn owner(&self) -> Owner<'_> {
        Owner {
            uid: UID,
            mount_point: self.mount_point.to_str().unwrap(),
        }
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount_point).output();
        let _ = Command::new("losetup")
            .args(["-d", &format!("/dev/{}", self.name)])
            .output();
        if let Some(outer) = &self.outer {
            let _ = Command::new("umount").arg(outer).output();
        }
    }
}

fn small_disk_spec() -> StorageSpec {
    StorageSpec {
        disk: DiskSelector {
            min_size_gib: Some(1),
            ..DiskSelector::default()
        },
        ..StorageSpec::default()
    }
}

/// Formats and mounts `disk` as `uid`, writes a marker and `file`, unmounts.
fn pave_onto(disk: &LoopDisk, spec: &StorageSpec, file: &str, content: &str) {
    let seen = disk.probe();
    let planned = plan(spec, std::slice::from_ref(&seen), None, &disk.owner()).unwrap();
    assert!(matches!(planned, Plan::Format { .. }), "{planned:?}");
    let device = apply::format(Path::new("/"), &seen, spec, UID).unwrap();
    apply::mount(&device, &disk.mount_point, &[]).unwrap();
    let marker = Marker {
        machine: "node-1".into(),
        machine_uid: UID.into(),
        container: None,
        configuration: None,
        image_sha256: None,
        complete: false,
        claim: None,
    };
    apply::write_marker(&disk.mount_point, &marker).unwrap();
    fs::write(disk.mount_point.join(file), content).unwrap();
    apply::unmount(&disk.mount_point).unwrap();
}

#[test]
fn a_blank_disk_is_formatted_then_reused_with_its_files() {
    require("a_blank_disk_is_formatted_then_reused_with_its_files");
    let disk = LoopDisk::new(1 << 30, false);
    let spec = small_disk_spec();
    pave_onto(&disk, &spec, "kept.txt", "still here");

    // The next boot: the layout is recognised from the disk alone, and mounted as it is.
    let seen = disk.probe();
    assert_eq!(seen.table.as_deref(), Some("gpt"));
    let planned = plan(&spec, std::slice::from_ref(&seen), None, &disk.owner()).unwrap();
    let Plan::Reuse { device, .. } = &planned else {
        panic!("expected a reuse, got {planned:?}");
    };
    assert_eq!(device, &format!("{}p1", disk.name));
    apply::mount(&Path::new("/dev").join(device), &disk.mount_point, &[]).unwrap();
    assert_eq!(
        fs::read_to_string(disk.mount_point.join("kept.txt")).unwrap(),
        "still here"
    );
    assert_eq!(
        apply::read_marker(&disk.mount_point).map(|m| m.machine_uid),
        Some(UID.to_owned())
    );
    apply::unmount(&disk.mount_point).unwrap();

    // Another Machine on the same hardware: Unbounded's layout, formatted again (no flag).
    let other = Owner {
        uid: OTHER_UID,
        ..disk.owner()
    };
    assert_eq!(
        plan(&spec, std::slice::from_ref(&seen), None, &other),
        Ok(Plan::Format {
            disk: disk.name.clone(),
            previous: Some(Previous::Unbounded)
        })
    );
}

#[test]
fn a_whole_disk_layout_is_reused() {
    require("a_whole_disk_layout_is_reused");
    let disk = LoopDisk::new(1 << 30, false);
    let spec = StorageSpec {
        layout: Some(unbounded_api::storage::DiskLayout::WholeDisk),
        ..small_disk_spec()
    };
    pave_onto(&disk, &spec, "kept.txt", "whole");
    let seen = disk.probe();
    assert_eq!(seen.table, None);
    assert_eq!(
        plan(&spec, std::slice::from_ref(&seen), None, &disk.owner()),
        Ok(Plan::Reuse {
            disk: disk.name.clone(),
            device: disk.name.clone()
        })
    );
}

#[test]
fn a_foreign_disk_is_refused_and_left_byte_for_byte() {
    require("a_foreign_disk_is_refused_and_left_byte_for_byte");
    let disk = LoopDisk::new(1 << 30, false);
    let node = format!("/dev/{}", disk.name);
    let out = Command::new("sh")
        .args(["-c", &format!("printf 'label: dos\\ntype=83\\n' | sfdisk -q {node} && partx -u {node}; mkfs.ext4 -q -F -L data {node}p1 || true")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = disk.sha256();
    let spec = small_disk_spec();
    let seen = disk.probe();
    let refused = plan(&spec, std::slice::from_ref(&seen), None, &disk.owner());
    let Err(Refusal::Foreign { found, .. }) = &refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert!(found.contains("dos partition table"), "{found}");
    assert_eq!(disk.sha256(), before, "a refused disk is not written");

    // With allowForeign the same disk is intended to be wiped: it is formatted.
    let allowed = StorageSpec {
        allow_foreign: true,
        ..spec
    };
    let planned = plan(&allowed, std::slice::from_ref(&seen), None, &disk.owner()).unwrap();
    assert!(
        matches!(
            &planned,
            Plan::Format {
                previous: Some(Previous::Foreign(_)),
                ..
            }
        ),
        "{planned:?}"
    );
    apply::format(Path::new("/"), &seen, &allowed, UID).unwrap();
    let after = disk.probe();
    assert_eq!(after.table.as_deref(), Some("gpt"));
    assert_eq!(
        plan(&allowed, std::slice::from_ref(&after), None, &disk.owner()),
        Ok(Plan::Reuse {
            disk: disk.name.clone(),
            device: format!("{}p1", disk.name)
        })
    );
}

#[test]
fn a_fast_wipe_leaves_no_signature_and_discards_the_data() {
    require("a_fast_wipe_leaves_no_signature_and_discards_the_data");
    let disk = LoopDisk::new(1 << 30, false);
    let secret = "previous tenant's data ".repeat(200);
    pave_onto(&disk, &small_disk_spec(), "tenant.txt", &secret);
    Command::new("sync").status().unwrap();
    assert!(disk.contains(&secret[..40]), "the file reached the image");
    assert_eq!(&disk.read_at(512, 8), b"EFI PART");

    let wiped = apply::wipe(
        Path::new("/"),
        &disk.probe(),
        WipeMethod::Fast,
        Duration::from_secs(60),
    )
    .unwrap();
    let seen = disk.probe();
    assert!(seen.is_blank(), "signatures left: {seen:?}");
    assert_eq!(disk.read_at(512, 8), vec![0; 8], "primary GPT header");
    assert_eq!(
        disk.read_at((1 << 30) - 512, 8),
        vec![0; 8],
        "backup GPT header"
    );
    assert_eq!(disk.read_at(510, 2), vec![0; 2], "protective MBR");
    // A loop device over a file on ext4 discards by punching holes.
    assert!(wiped.discarded, "{wiped:?}");
    assert_eq!(wiped.discard_failed, None);
    assert!(
        !disk.contains(&secret[..40]),
        "discarded blocks read back as zeroes"
    );
}

/// A device that refuses the discard: the fast wipe says so and overwrites the ends of the disk and of the
/// partition and every ext4 backup superblock, so that nothing can be mounted or recovered
/// with `e2fsck -b`; the data blocks in between do keep their contents, as the report says.
#[test]
fn a_fast_wipe_without_discard_overwrites_the_ends_and_every_superblock_and_says_so() {
    require("a_fast_wipe_without_discard_overwrites_the_ends_and_every_superblock_and_says_so");
    let size = 1u64 << 30;
    let disk = LoopDisk::without_discard(size);
    let secret = "previous tenant's data ".repeat(200);
    pave_onto(&disk, &small_disk_spec(), "tenant.txt", &secret);
    Command::new("sync").status().unwrap();
    let partition = format!("{}p1", disk.name);
    let sysfs = format!("/sys/block/{}/{partition}", disk.name);
    let sectors = |f: &str| -> u64 {
        fs::read_to_string(format!("{sysfs}/{f}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (start, length) = (sectors("start") * 512, sectors("size") * 512);
    let dump = Command::new("dumpe2fs")
        .arg(format!("/dev/{partition}"))
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    let backups: Vec<u64> = dump
        .lines()
        .filter_map(|l| l.split("Backup superblock at ").nth(1))
        .map(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(backups.len() >= 2, "backup superblocks: {dump}");

    let wiped = apply::wipe(
        Path::new("/"),
        &disk.probe(),
        WipeMethod::Fast,
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(!wiped.discarded, "{wiped:?}");
    let why = wiped.discard_failed.clone().unwrap();
    assert!(why.contains("not supported"), "{why}");
    assert!(disk.probe().is_blank(), "signatures left");
    let ends = apply::ENDS_OVERWRITTEN as usize;
    let zero = vec![0u8; ends];
    for (what, offset) in [
        ("the disk's start", 0),
        ("the disk's end", size - ends as u64),
        ("the partition's start", start),
        ("the partition's end", start + length - ends as u64),
    ] {
        assert!(disk.read_at(offset, ends) == zero, "{what} is not zeroes");
    }
    for block in backups {
        assert!(
            disk.read_at(start + block * 4096, 4096) == vec![0u8; 4096],
            "the backup superblock at block {block} is left"
        );
    }
    // What the report says stays, stays: the file's blocks were not overwritten.
    assert!(disk.contains(&secret[..40]));
}

#[test]
fn an_overwrite_wipe_leaves_only_zeroes() {
    require("an_overwrite_wipe_leaves_only_zeroes");
    let size = 64 * MIB;
    let disk = LoopDisk::new(size, false);
    // Data everywhere, not only where a filesystem would put it.
    fs::write(&disk.image, vec![0xa5u8; size as usize]).unwrap();
    let wiped = apply::wipe(
        Path::new("/"),
        &disk.probe(),
        WipeMethod::Overwrite,
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(wiped.zeroed_bytes, size);
    let bytes = fs::read(&disk.image).unwrap();
    assert_eq!(bytes.len() as u64, size);
    assert!(
        bytes.iter().all(|b| *b == 0),
        "a byte is not zero after the overwrite"
    );
}

#[test]
fn a_disk_that_fails_mid_format_says_so_and_is_unchanged() {
    require("a_disk_that_fails_mid_format_says_so_and_is_unchanged");
    let disk = LoopDisk::new(1 << 30, true);
    let before = disk.sha256();
    let spec = small_disk_spec();
    let seen = disk.probe();
    assert!(seen.read_only);
    let planned = plan(&spec, std::slice::from_ref(&seen), None, &disk.owner()).unwrap();
    assert!(matches!(planned, Plan::Format { .. }));
    let err = apply::format(Path::new("/"), &seen, &spec, UID).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, StorageError::Command { .. }), "{err:?}");
    assert!(
        message.contains(&format!("formatting disk {}", disk.name)),
        "{message}"
    );
    assert!(message.contains("read-only"), "{message}");
    assert_eq!(err.reason(), "DiskFailed");
    assert_eq!(disk.sha256(), before, "nothing was written");
    assert!(!disk.mount_point.exists(), "nothing was mounted");
}

#[test]
fn a_mounted_disk_is_not_wiped() {
    require("a_mounted_disk_is_not_wiped");
    let disk = LoopDisk::new(1 << 30, false);
    let spec = small_disk_spec();
    pave_onto(&disk, &spec, "f", "x");
    let device = PathBuf::from(format!("/dev/{}p1", disk.name));
    apply::mount(&device, &disk.mount_point, &[]).unwrap();
    let err = apply::wipe(
        Path::new("/"),
        &disk.probe(),
        WipeMethod::Fast,
        Duration::from_secs(60),
    )
    .unwrap_err();
    assert!(matches!(err, StorageError::Mounted { .. }), "{err:?}");
    assert_eq!(fs::read_to_string(disk.mount_point.join("f")).unwrap(), "x");
}

/// An active swap area on a disk: in use, never a candidate (not even with
/// `allowForeign`), never wiped: its signature stays and nothing outside it is written.
#[test]
fn an_active_swap_disk_is_refused_and_not_written() {
    require("an_active_swap_disk_is_refused_and_not_written");
    let disk = LoopDisk::new(1 << 30, false);
    let node = format!("/dev/{}", disk.name);
    let run = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A small swap area (16 MiB of the 1 GiB disk) at the lowest priority: the kernel may
    // page to it while the test runs, so its pages are not compared; the signature and
    // the rest of the disk are.
    run(&["mkswap", &node, "16384"]);
    run(&["swapon", "--priority", "0", &node]);
    struct SwapOff(String);
    impl Drop for SwapOff {
        fn drop(&mut self) {
            let _ = Command::new("swapoff").arg(&self.0).output();
        }
    }
    let _off = SwapOff(node.clone());
    let tail_before = disk.read_at((1 << 30) - 64 * MIB, 64 * MIB as usize);
    let seen = disk.probe();
    assert!(
        seen.in_use_by().is_some_and(|w| w.contains("active swap")),
        "{seen:?}"
    );
    let spec = StorageSpec {
        allow_foreign: true,
        ..small_disk_spec()
    };
    let planned = plan(&spec, std::slice::from_ref(&seen), None, &disk.owner());
    assert!(
        matches!(&planned, Err(Refusal::OnlyUnusable(why)) if why.contains("swap")),
        "{planned:?}"
    );
    let err = apply::wipe(
        Path::new("/"),
        &seen,
        WipeMethod::Fast,
        Duration::from_secs(60),
    )
    .unwrap_err();
    assert!(matches!(err, StorageError::InUse { .. }), "{err:?}");
    assert_eq!(
        disk.read_at(4096 - 10, 10),
        b"SWAPSPACE2",
        "the swap signature is where mkswap put it"
    );
    assert_eq!(
        disk.read_at((1 << 30) - 64 * MIB, 64 * MIB as usize),
        tail_before,
        "nothing else of the disk was written"
    );
}

/// A device that cannot be opened is unknown, not blank: blkid answers "nothing found" (exit
/// 2) for it as for a blank disk, and before, it was formatted. Here the probe's root has
/// the real `/sys` and `/proc` but no device node for the disk, as when `/dev` lacks it or
/// it cannot be opened.
#[test]
fn an_unreadable_device_is_unknown_not_blank() {
    require("an_unreadable_device_is_unknown_not_blank");
    let disk = LoopDisk::new(20 << 30, false);
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/sys", root.path().join("sys")).unwrap();
    std::os::unix::fs::symlink("/proc", root.path().join("proc")).unwrap();
    fs::create_dir(root.path().join("dev")).unwrap();
    let seen = probe::read_disks(root.path(), &DiskScope::Only(vec![disk.name.clone()]));
    assert_eq!(seen.len(), 1, "{} in /sys/block", disk.name);
    let seen = &seen[0];
    assert!(
        seen.in_use_by()
            .is_some_and(|w| w.starts_with("unreadable")),
        "{seen:?}"
    );
    let spec = StorageSpec {
        allow_foreign: true,
        ..StorageSpec::default()
    };
    let planned = plan(&spec, std::slice::from_ref(seen), None, &disk.owner());
    assert!(
        matches!(&planned, Err(Refusal::OnlyUnusable(why)) if why.contains("unreadable")),
        "{planned:?}"
    );
}

fn disk_input(disk: &LoopDisk, state: &Path) -> DiskInput {
    DiskInput {
        machines: disk.mount_point.clone(),
        state: state.to_path_buf(),
        node: "node-1".into(),
        machine: "m-1".into(),
        machine_uid: Some(UID.into()),
        scope: DiskScope::Only(vec![disk.name.clone()]),
        claim: None,
    }
}

/// The pave's storage step over a machine's life: a first pave formats, a reboot on the
/// same version starts the container from the disk, a repave with `wipe: never` keeps a
/// file on the disk and one with `wipe: always` removes it (after stopping the container
/// and keeping kubelet's identity in RAM).
#[tokio::test]
async fn the_storage_step_formats_reuses_and_wipes_as_the_policy_says() {
    require("the_storage_step_formats_reuses_and_wipes_as_the_policy_says");
    let disk = LoopDisk::new(1 << 30, false);
    let state = tempfile::tempdir().unwrap();
    let input = disk_input(&disk, state.path());
    let v1 = ResolvedConfiguration {
        name: "general".into(),
        version: 1,
    };
    let sha = "a".repeat(64);
    let never = StorageSpec {
        wipe: Some(WipePolicy::Never),
        ..small_disk_spec()
    };
    let stops = std::sync::atomic::AtomicU32::new(0);
    let stop = || async {
        stops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    };
    let machines = &disk.mount_point;
    let root = machines.join("node-1");

    // First boot: a blank disk is formatted and mounted; the pave writes the root.
    let first = prepare_disk(&input, &never, &v1, &sha, true, stop)
        .await
        .unwrap();
    assert_eq!(first.step, ContainerStep::Pave);
    assert_eq!(
        (first.status.action.as_str(), first.status.container_reused),
        ("formatted", false)
    );
    assert_eq!(first.status.disk, disk.name);
    fs::create_dir_all(root.join("var/lib/kubelet/pki")).unwrap();
    fs::write(
        root.join("var/lib/kubelet/pki/kubelet-client-current.pem"),
        "cert",
    )
    .unwrap();
    fs::write(machines.join("outside-the-root.txt"), "kept by never").unwrap();
    assert!(
        !apply::read_marker(machines).unwrap().complete,
        "not complete before the pave ends"
    );
    pave_finished(machines, &first.marker).await.unwrap();

    // Reboot on the same version and image: started from the disk as it is.
    apply::unmount(machines).unwrap();
    let rebooted = prepare_disk(&input, &never, &v1, &sha, true, stop)
        .await
        .unwrap();
    assert_eq!(rebooted.step, ContainerStep::StartFromDisk);
    assert_eq!(
        (
            rebooted.status.action.as_str(),
            rebooted.status.container_reused
        ),
        ("reused", true)
    );
    assert!(
        root.join("var/lib/kubelet/pki/kubelet-client-current.pem")
            .exists()
    );

    // Reboot into another image: paved again onto the disk, nothing wiped.
    apply::unmount(machines).unwrap();
    let other = "b".repeat(64);
    let new_image = prepare_disk(&input, &never, &v1, &other, true, stop)
        .await
        .unwrap();
    assert_eq!(new_image.step, ContainerStep::Pave);
    assert_eq!(
        fs::read_to_string(machines.join("outside-the-root.txt")).unwrap(),
        "kept by never"
    );
    pave_finished(machines, &new_image.marker).await.unwrap();

    // A repave within the boot with `never`: the file stays, the container is not stopped
    // by the storage step (the pave replaces the root itself).
    let repave = prepare_disk(&input, &never, &v1, &other, false, stop)
        .await
        .unwrap();
    assert_eq!(repave.step, ContainerStep::Pave);
    assert!(machines.join("outside-the-root.txt").exists());
    assert_eq!(stops.load(std::sync::atomic::Ordering::SeqCst), 0);
    pave_finished(machines, &repave.marker).await.unwrap();

    // The same repave with `always`: the container is stopped, the disk wiped and
    // formatted again, kubelet's identity kept in RAM for the new root.
    let always = StorageSpec {
        wipe: Some(WipePolicy::Always),
        ..small_disk_spec()
    };
    let wiped = prepare_disk(&input, &always, &v1, &other, false, stop)
        .await
        .unwrap();
    assert_eq!(wiped.step, ContainerStep::WipeThenPave);
    assert_eq!(wiped.status.action, "wiped");
    assert_eq!(stops.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        !machines.join("outside-the-root.txt").exists(),
        "always removes it"
    );
    assert!(!root.exists());
    let identity = wiped.identity.unwrap();
    assert_eq!(
        fs::read_to_string(identity.join("var/lib/kubelet/pki/kubelet-client-current.pem"))
            .unwrap(),
        "cert"
    );
    let marker = apply::read_marker(machines).unwrap();
    assert_eq!((marker.machine_uid.as_str(), marker.complete), (UID, false));
}

/// A disk the plan refuses is left byte for byte, and the running container is not stopped.
#[tokio::test]
async fn the_storage_step_refuses_a_foreign_disk_without_touching_anything() {
    require("the_storage_step_refuses_a_foreign_disk_without_touching_anything");
    let disk = LoopDisk::new(1 << 30, false);
    let node = format!("/dev/{}", disk.name);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "someone", &node])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = disk.sha256();
    let state = tempfile::tempdir().unwrap();
    let v1 = ResolvedConfiguration {
        name: "general".into(),
        version: 1,
    };
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let stop = || async {
        stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    };
    let err = prepare_disk(
        &disk_input(&disk, state.path()),
        &small_disk_spec(),
        &v1,
        &"a".repeat(64),
        true,
        stop,
    )
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "ForeignDisk", "{err}");
    assert!(err.to_string().contains("allowForeign"), "{err}");
    assert_eq!(disk.sha256(), before);
    assert!(!stopped.load(std::sync::atomic::Ordering::SeqCst));
    assert!(!disk.mount_point.exists(), "nothing mounted");
}

/// The release wipe ([`wipe_for_release`]): with this Machine's disk mounted where the
/// node container lives, it stops the container, unmounts, and wipes that disk (no
/// signature left, the file's bytes gone); a disk with another Machine's layout, and a blank
/// one, in the same scope are left byte for byte.
#[tokio::test]
async fn the_release_wipe_stops_unmounts_and_wipes_only_this_machines_disk() {
    require("the_release_wipe_stops_unmounts_and_wipes_only_this_machines_disk");
    let ours = LoopDisk::new(1 << 30, false);
    let theirs = LoopDisk::new(1 << 30, false);
    let blank = LoopDisk::new(1 << 30, false);
    let spec = small_disk_spec();
    let secret = "this tenant's data ".repeat(200);
    pave_onto(&ours, &spec, "tenant.txt", &secret);
    let seen = theirs.probe();
    let device = apply::format(Path::new("/"), &seen, &spec, OTHER_UID).unwrap();
    apply::mount(&device, &theirs.mount_point, &[]).unwrap();
    fs::write(theirs.mount_point.join("kept.txt"), "another Machine's").unwrap();
    apply::unmount(&theirs.mount_point).unwrap();
    Command::new("sync").status().unwrap();
    let (theirs_before, blank_before) = (theirs.sha256(), blank.sha256());
    assert!(ours.contains(&secret[..40]), "the file reached the image");
    // As during the pave: this Machine's disk mounted on the machines directory.
    let ours_device = PathBuf::from(format!("/dev/{}p1", ours.name));
    apply::mount(&ours_device, &ours.mount_point, &[]).unwrap();

    let state = tempfile::tempdir().unwrap();
    let input = DiskInput {
        scope: DiskScope::Only(vec![
            ours.name.clone(),
            theirs.name.clone(),
            blank.name.clone(),
        ]),
        ..disk_input(&ours, state.path())
    };
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let stop = || async {
        stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    };
    let wiped = wipe_for_release(&input, WipeMethod::Fast, Duration::from_secs(120), stop)
        .await
        .unwrap();
    assert!(stopped.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(wiped.disks, vec![ours.name.clone()], "{}", wiped.summary);
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(ours.mount_point.to_str().unwrap()),
        "still mounted"
    );
    let seen = ours.probe();
    assert!(seen.is_blank(), "signatures left: {seen:?}");
    assert!(wiped.summary.contains("discarded"), "{}", wiped.summary);
    assert!(!ours.contains(&secret[..40]), "the tenant's bytes are gone");
    assert_eq!(theirs.sha256(), theirs_before, "another Machine's disk");
    assert_eq!(blank.sha256(), blank_before, "a blank disk");

    // Again (an agent restarted mid-wipe): nothing of this Machine's is left, nothing to do.
    let again = wipe_for_release(
        &input,
        WipeMethod::Fast,
        Duration::from_secs(120),
        || async { Ok(()) },
    )
    .await
    .unwrap();
    assert!(again.disks.is_empty(), "{again:?}");
    assert!(
        again.summary.contains("nothing to wipe"),
        "{}",
        again.summary
    );
}
