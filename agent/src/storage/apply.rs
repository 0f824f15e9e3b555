//! Carrying a [`super::Plan`] out with the real tools: `wipefs`, `sfdisk`, `partx`,
//! `mkfs.ext4`, `mount`, `umount`, `blkdiscard`. Every function is blocking (the pave runs
//! them on tokio's blocking pool) and takes the root that `/dev` and `/sys` hang from.
//!
//! Device nodes: on the host OS udev creates `/dev/sda1` when the kernel learns of a
//! partition. Where udev does not run (a container, the tests), the kernel is told of the
//! new partition table with `partx -u` (sfdisk's own re-read can fail silently on a loop
//! device), the partition is awaited in sysfs, and its node is made with `mknod` from the
//! device number sysfs gives when devtmpfs did not make it. Either way the agent never
//! guesses a partition's name: it reads it from sysfs.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use unbounded_api::storage::{DiskLayout, StorageSpec, WipeMethod};

use super::probe::Disk;
use super::{MARKER_PATH, Marker};
use crate::storage::plan::LAYOUT_LABEL;

/// Errors of the storage steps. A person reads them in the BootstrapReady condition.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A tool failed.
    #[error("{action}: `{command}` failed ({status}): {stderr}{hint}")]
    Command {
        /// What was being done.
        action: String,
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
        /// A hint for a person, or empty.
        hint: String,
    },
    /// A tool could not be started, given its input or waited for.
    #[error("{action}: `{command}` failed ({stage}): {source}{hint}")]
    NotRun {
        /// What was being done.
        action: String,
        /// The command line.
        command: String,
        /// Which part failed: `not started`, `stdin` or `not waited for`.
        stage: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
        /// A hint for a person, or empty.
        hint: String,
    },
    /// A file or device operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The new partition did not show up.
    #[error("the partition sfdisk wrote on {0} did not appear in /sys/block within 10 s")]
    NoPartition(String),
    /// A disk to wipe or format is in use otherwise: held by a RAID or LVM device, an active
    /// swap area, or unreadable.
    #[error("disk {disk} is in use ({why}): it is not wiped or formatted")]
    InUse {
        /// The disk.
        disk: String,
        /// Why.
        why: String,
    },
    /// A disk to wipe or format is mounted.
    #[error("disk {disk} is mounted at {mount}: it is not wiped while in use")]
    Mounted {
        /// The disk.
        disk: String,
        /// Where.
        mount: String,
    },
    /// The wipe ran out of time.
    #[error("wiping disk {disk} did not finish within {seconds} s ({done} of {size} bytes)")]
    Timeout {
        /// The disk.
        disk: String,
        /// The limit.
        seconds: u64,
        /// Bytes done.
        done: u64,
        /// Bytes in all.
        size: u64,
    },
}

impl StorageError {
    /// A short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "WipeTimedOut",
            Self::Mounted { .. } | Self::InUse { .. } => "DiskInUse",
            Self::Command { .. } | Self::NotRun { .. } | Self::Io { .. } | Self::NoPartition(_) => {
                "DiskFailed"
            }
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StorageError {
    let what = what.into();
    move |source| StorageError::Io { what, source }
}

/// Runs a tool; stdin gets `input` when given.
fn run(
    action: &str,
    disk: &Disk,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, StorageError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let hint = if disk.read_only {
        format!(" (the kernel reports disk {} read-only)", disk.name)
    } else {
        String::new()
    };
    let not_run = |stage: &'static str| {
        let (action, command, hint) = (action.to_owned(), command.clone(), hint.clone());
        move |source: std::io::Error| StorageError::NotRun {
            action,
            command,
            stage,
            source,
            hint,
        }
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(not_run("not started"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).map_err(not_run("stdin"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(not_run("not waited for"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(StorageError::Command {
            action: action.to_owned(),
            command,
            status: out.status.to_string(),
            stderr: stderr.trim().chars().take(600).collect(),
            hint,
        })
    }
}

/// The device node of `name`, made from sysfs' device number when it is missing.
fn device_node(root: &Path, name: &str, sys_dir: &Path) -> Result<PathBuf, StorageError> {
    let node = root.join("dev").join(name);
    if node.exists() {
        return Ok(node);
    }
    let dev = fs::read_to_string(sys_dir.join("dev"))
        .map_err(io(format!("reading the device number of {name}")))?;
    let (major, minor) = dev.trim().split_once(':').unwrap_or(("", ""));
    let status = Command::new("mknod")
        .arg(&node)
        .args(["b", major, minor])
        .status()
        .map_err(io(format!("making the device node of {name}")))?;
    if !status.success() && !node.exists() {
        return Err(StorageError::Io {
            what: format!("making the device node {}", node.display()),
            source: std::io::Error::other(status.to_string()),
        });
    }
    Ok(node)
}

/// The device node of `device` (the disk itself, or one of its partitions), made when
/// missing.
pub fn device_path(root: &Path, disk: &str, device: &str) -> Result<PathBuf, StorageError> {
    let dir = if device == disk {
        sys_block(root, disk)
    } else {
        sys_block(root, disk).join(device)
    };
    device_node(root, device, &dir)
}

fn sys_block(root: &Path, disk: &str) -> PathBuf {
    root.join("sys/block").join(disk)
}

/// The partitions of `disk` the kernel knows, by name, with their sysfs directories.
fn kernel_partitions(root: &Path, disk: &str) -> Vec<(String, PathBuf)> {
    let mut parts: Vec<(String, PathBuf)> = fs::read_dir(sys_block(root, disk))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    parts.sort();
    parts
}

fn refuse_mounted(disk: &Disk) -> Result<(), StorageError> {
    if let Some(mount) = disk.all_mounts().next() {
        return Err(StorageError::Mounted {
            disk: disk.name.clone(),
            mount: mount.to_owned(),
        });
    }
    match disk.in_use_by() {
        Some(why) => Err(StorageError::InUse {
            disk: disk.name.clone(),
            why: why.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Erases every signature (filesystems on the partitions first, then the partition table
/// with its backup and the protective MBR) and tells the kernel the partitions are gone.
fn erase_signatures(root: &Path, disk: &Disk, action: &str) -> Result<(), StorageError> {
    let node = device_node(root, &disk.name, &sys_block(root, &disk.name))?;
    let mut targets = kernel_partitions(root, &disk.name)
        .into_iter()
        .map(|(name, dir)| device_node(root, &name, &dir))
        .collect::<Result<Vec<_>, _>>()?;
    // The partitions first, the disk itself last.
    targets.push(node.clone());
    for target in &targets {
        run(
            action,
            disk,
            "wipefs",
            &["-a", "-q", &target.display().to_string()],
            None,
        )?;
    }
    // The kernel keeps the old partitions until told; nothing to delete is fine.
    let _ = run(
        action,
        disk,
        "partx",
        &["-d", &node.display().to_string()],
        None,
    );
    Ok(())
}

/// Lays `disk` out as `spec` says and makes the filesystem, its UUID the Machine's UID.
/// Returns the device that holds the filesystem (`/dev/sdb1`, or the disk itself).
pub fn format(
    root: &Path,
    disk: &Disk,
    spec: &StorageSpec,
    machine_uid: &str,
) -> Result<PathBuf, StorageError> {
    let action = format!("formatting disk {}", disk.name);
    refuse_mounted(disk)?;
    erase_signatures(root, disk, &action)?;
    let disk_node = device_node(root, &disk.name, &sys_block(root, &disk.name))?;
    let disk_path = disk_node.display().to_string();
    let device = match spec.layout() {
        DiskLayout::WholeDisk => disk_node,
        DiskLayout::Partition => {
            let script = format!("label: gpt\ntype=linux, name=\"{LAYOUT_LABEL}\"\n");
            run(
                &action,
                disk,
                "sfdisk",
                &["-q", "--wipe", "always", &disk_path],
                Some(&script),
            )?;
            // Tell the kernel (sfdisk's re-read may not have); "nothing to update" is fine.
            let _ = run(&action, disk, "partx", &["-u", &disk_path], None);
            let deadline = Instant::now() + Duration::from_secs(10);
            let (name, dir) = loop {
                if let Some(part) = kernel_partitions(root, &disk.name).into_iter().next() {
                    break part;
                }
                if Instant::now() > deadline {
                    return Err(StorageError::NoPartition(disk.name.clone()));
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            device_node(root, &name, &dir)?
        }
    };
    run(
        &action,
        disk,
        "mkfs.ext4",
        &[
            "-F",
            "-q",
            "-U",
            machine_uid,
            "-L",
            LAYOUT_LABEL,
            &device.display().to_string(),
        ],
        None,
    )?;
    Ok(device)
}

/// Mounts `device` (ext4) on `mount_point`, unless it is mounted there already (an agent
/// restarted within the boot).
pub fn mount(device: &Path, mount_point: &Path, mounted: &[String]) -> Result<(), StorageError> {
    if mounted.iter().any(|m| Path::new(m) == mount_point) {
        return Ok(());
    }
    fs::create_dir_all(mount_point).map_err(io(format!("creating {}", mount_point.display())))?;
    let status = Command::new("mount")
        .args(["-t", "ext4", "-o", "noatime"])
        .arg(device)
        .arg(mount_point)
        .output()
        .map_err(io("running mount"))?;
    if status.status.success() {
        Ok(())
    } else {
        Err(StorageError::Command {
            action: format!("mounting {} on {}", device.display(), mount_point.display()),
            command: "mount".into(),
            status: status.status.to_string(),
            stderr: String::from_utf8_lossy(&status.stderr).trim().to_owned(),
            hint: String::new(),
        })
    }
}

/// Unmounts `mount_point`.
pub fn unmount(mount_point: &Path) -> Result<(), StorageError> {
    let out = Command::new("umount")
        .arg(mount_point)
        .output()
        .map_err(io("running umount"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(StorageError::Command {
            action: format!("unmounting {}", mount_point.display()),
            command: "umount".into(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            hint: String::new(),
        })
    }
}

/// The marker at the root of the mounted filesystem; `None` when absent or unreadable
/// (the container on the disk is then paved again, never trusted).
pub fn read_marker(mount_point: &Path) -> Option<Marker> {
    let bytes = fs::read(mount_point.join(MARKER_PATH)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the marker (atomically and durably: a crash leaves the old or the new one).
pub fn write_marker(mount_point: &Path, marker: &Marker) -> Result<(), StorageError> {
    let path = mount_point.join(MARKER_PATH);
    let dir = path.parent().unwrap_or(mount_point);
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let bytes = serde_json::to_vec_pretty(marker).map_err(|e| StorageError::Io {
        what: "encoding the marker".into(),
        source: std::io::Error::other(e),
    })?;
    let temporary = path.with_extension("tmp");
    let mut file =
        fs::File::create(&temporary).map_err(io(format!("writing {}", temporary.display())))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(io(format!("writing {}", temporary.display())))?;
    fs::rename(&temporary, &path).map_err(io(format!("writing {}", path.display())))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

/// What a wipe did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiped {
    /// The device accepted a discard of every block.
    pub discarded: bool,
    /// Bytes overwritten with zeroes.
    pub zeroed_bytes: u64,
    /// A `fast` wipe whose discard failed: why (what `blkdiscard` printed). The ends of the
    /// disk and of each partition were overwritten instead ([`ENDS_OVERWRITTEN`]).
    pub discard_failed: Option<String>,
}

/// How much of each end of the disk and of each partition a `fast` wipe overwrites when the
/// discard fails: where partition tables (and the GPT backup), filesystem superblocks and
/// RAID/LVM headers live, so that nothing there can be read or mounted again. The backup
/// superblocks ext4 spreads over the filesystem are overwritten too.
pub const ENDS_OVERWRITTEN: u64 = 4 << 20;

/// The ext4 backup superblocks of the filesystem on `device` (`dumpe2fs`), as byte ranges
/// relative to `device`'s start; none when it holds no ext4 filesystem.
fn backup_superblocks(device: &Path) -> Vec<(u64, u64)> {
    let Ok(output) = Command::new("dumpe2fs").arg(device).output() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let block_size: Option<u64> = text
        .lines()
        .find_map(|l| l.strip_prefix("Block size:"))
        .and_then(|v| v.trim().parse().ok());
    let Some(block_size) = block_size else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.split("Backup superblock at ").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .map(|block: u64| (block * block_size, block_size))
        .collect()
}

/// Zeroes the first and last [`ENDS_OVERWRITTEN`] bytes of each `(offset, length)` region
/// of the device `node`; returns the bytes written.
fn overwrite_ends(node: &Path, regions: &[(u64, u64)]) -> Result<u64, StorageError> {
    let mut device = fs::OpenOptions::new()
        .write(true)
        .open(node)
        .map_err(io(format!(
            "opening {} to overwrite its ends",
            node.display()
        )))?;
    let zeroes = vec![0u8; usize::try_from(ENDS_OVERWRITTEN).unwrap_or(4 << 20)];
    let mut written = 0u64;
    for &(offset, length) in regions {
        let span = length.min(ENDS_OVERWRITTEN);
        let starts = if length <= span {
            vec![offset]
        } else {
            vec![offset, offset + length - span]
        };
        for start in starts {
            device
                .seek(SeekFrom::Start(start))
                .and_then(|_| device.write_all(&zeroes[..usize::try_from(span).unwrap_or(0)]))
                .map_err(io(format!(
                    "overwriting {} at byte {start}",
                    node.display()
                )))?;
            written += span;
        }
    }
    device
        .sync_all()
        .map_err(io(format!("flushing {}", node.display())))?;
    Ok(written)
}

/// What a `fast` wipe overwrites should the discard fail, as byte ranges of the disk: each
/// partition the kernel knows (sysfs, 512-byte sectors) and the disk itself, and the ext4
/// backup superblocks on either; read before the signatures are erased.
fn regions_to_overwrite(root: &Path, disk: &Disk) -> Result<Vec<(u64, u64)>, StorageError> {
    let sectors = |dir: &Path, file: &str| -> Option<u64> {
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    };
    let mut regions = vec![(0, disk.size_bytes)];
    regions.extend(backup_superblocks(&device_node(
        root,
        &disk.name,
        &sys_block(root, &disk.name),
    )?));
    for (name, dir) in kernel_partitions(root, &disk.name) {
        let (Some(start), Some(size)) = (sectors(&dir, "start"), sectors(&dir, "size")) else {
            continue;
        };
        let (start, size) = (start * 512, size * 512);
        regions.push((start, size));
        let node = device_node(root, &name, &dir)?;
        regions.extend(
            backup_superblocks(&node)
                .into_iter()
                .map(|(offset, length)| (start + offset, length)),
        );
    }
    Ok(regions
        .into_iter()
        .filter(|(_, length)| *length > 0)
        .collect())
}

/// Wipes `disk` as `method` says, within `timeout`. The disk must not be mounted.
pub fn wipe(
    root: &Path,
    disk: &Disk,
    method: WipeMethod,
    timeout: Duration,
) -> Result<Wiped, StorageError> {
    let action = format!("wiping disk {}", disk.name);
    refuse_mounted(disk)?;
    let regions = match method {
        WipeMethod::Fast => regions_to_overwrite(root, disk)?,
        WipeMethod::Overwrite => Vec::new(),
    };
    erase_signatures(root, disk, &action)?;
    let node = device_node(root, &disk.name, &sys_block(root, &disk.name))?;
    match method {
        WipeMethod::Fast => {
            match run(
                &action,
                disk,
                "blkdiscard",
                &[&node.display().to_string()],
                None,
            ) {
                Ok(_) => Ok(Wiped {
                    discarded: true,
                    zeroed_bytes: 0,
                    discard_failed: None,
                }),
                // A device without discard (many HDDs, some virtual disks, a controller
                // that refuses it): the signatures alone are not enough (ext4 keeps backup
                // superblocks, so `e2fsck -b` would bring the filesystem back), so the ends
                // of the disk and of each partition and every backup superblock are
                // overwritten, and the report says that the other blocks keep their
                // contents.
                Err(error) => {
                    let zeroed_bytes = overwrite_ends(&node, &regions)?;
                    Ok(Wiped {
                        discarded: false,
                        zeroed_bytes,
                        discard_failed: Some(match error {
                            StorageError::Command { stderr, .. } => stderr.trim().to_owned(),
                            other => other.to_string(),
                        }),
                    })
                }
            }
        }
        WipeMethod::Overwrite => {
            let deadline = Instant::now() + timeout;
            let mut device = fs::OpenOptions::new()
                .write(true)
                .open(&node)
                .map_err(io(format!("opening {} to overwrite it", node.display())))?;
            let zeroes = vec![0u8; 4 << 20];
            let mut done = 0u64;
            while done < disk.size_bytes {
                if Instant::now() > deadline {
                    return Err(StorageError::Timeout {
                        disk: disk.name.clone(),
                        seconds: timeout.as_secs(),
                        done,
                        size: disk.size_bytes,
                    });
                }
                let chunk = usize::try_from((disk.size_bytes - done).min(zeroes.len() as u64))
                    .unwrap_or(zeroes.len());
                device
                    .write_all(&zeroes[..chunk])
                    .map_err(io(format!("overwriting {} at byte {done}", node.display())))?;
                done += chunk as u64;
            }
            device
                .sync_all()
                .map_err(io(format!("flushing {}", node.display())))?;
            Ok(Wiped {
                discarded: false,
                zeroed_bytes: done,
                discard_failed: None,
            })
        }
    }
}
