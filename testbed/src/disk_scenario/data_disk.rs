//! The lab VMs' data disks as the disks scenario reads and writes them from the host.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bmc::data_disk_target;
use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::scenario::step;

/// A data disk of a lab VM, read and written on the host through a raw copy of its qcow2
/// file (`qemu-img -U` reads it while the VM runs; the copy's journal is replayed when it is
/// mounted).
pub(super) struct DataDisk {
    file: PathBuf,
}

impl DataDisk {
    /// Data disk `index` of libvirt domain `domain`.
    pub(super) fn of(domain: &str, index: usize) -> Result<Self, LabError> {
        let target = data_disk_target(index);
        let disks = run(Command::new("virsh").args([
            "-c",
            crate::bmc::LIBVIRT_URI,
            "domblklist",
            domain,
            "--details",
        ]))?;
        let file = disks
            .lines()
            .map(str::split_whitespace)
            .find_map(|mut f| match (f.next(), f.next(), f.next(), f.next()) {
                (Some("file"), Some("disk"), Some(t), Some(path)) if t == target => {
                    Some(PathBuf::from(path))
                }
                _ => None,
            })
            .ok_or_else(|| step(format!("{domain} has no data disk {target}: {disks}")))?;
        Ok(Self { file })
    }

    fn raw_copy(&self, dir: &Path) -> Result<PathBuf, LabError> {
        let raw = dir.join("data.raw");
        run(Command::new("qemu-img")
            .args(["convert", "-U", "-O", "raw"])
            .arg(&self.file)
            .arg(&raw))?;
        Ok(raw)
    }

    /// The signatures (filesystems, partition tables) `wipefs` finds; empty when none.
    pub(super) fn signatures(&self) -> Result<String, LabError> {
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let raw = self.raw_copy(dir.path())?;
        // Without -a, wipefs only lists what it would erase.
        Ok(run(Command::new("wipefs").arg(&raw))?.trim().to_owned())
    }

    /// Whether the filesystem the agent made (label `unbounded`) holds `name` at its root.
    pub(super) fn has_file(&self, name: &str) -> Result<bool, LabError> {
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let raw = self.raw_copy(dir.path())?;
        let mounted = Mounted::filesystem_of(&raw, &dir.path().join("mnt"))?;
        let found = mounted.path.join(name).exists();
        mounted.release()?;
        Ok(found)
    }

    /// Writes `name` at the root of the agent's filesystem; the VM must be off.
    pub(super) fn write_file(&self, name: &str) -> Result<(), LabError> {
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let raw = self.raw_copy(dir.path())?;
        let mounted = Mounted::filesystem_of(&raw, &dir.path().join("mnt"))?;
        std::fs::write(mounted.path.join(name), "a previous tenant's data\n")
            .map_err(|e| Failure::new(format!("writing {name} onto the disk"), e))?;
        mounted.release()?;
        let back = dir.path().join("data.qcow2");
        run(Command::new("qemu-img")
            .args(["convert", "-O", "qcow2"])
            .arg(&raw)
            .arg(&back))?;
        std::fs::copy(&back, &self.file)
            .map(|_| ())
            .map_err(|e| Failure::new(format!("writing {}", self.file.display()), e).into())
    }
}

/// The filesystem labelled `unbounded` of a raw disk image, mounted through a loop device.
struct Mounted {
    path: PathBuf,
    device: String,
}

impl Mounted {
    fn filesystem_of(raw: &Path, at: &Path) -> Result<Self, LabError> {
        std::fs::create_dir_all(at).map_err(Failure::of)?;
        let device = run(Command::new("losetup")
            .args(["--find", "--show", "--partscan"])
            .arg(raw))?
        .trim()
        .to_owned();
        // No udev here: partx makes the partitions' device nodes, and blkid (not lsblk,
        // which reads udev's database) reads their labels.
        let detach = || {
            let _ = run(Command::new("partx").args(["-d", &device]));
            let _ = run(Command::new("losetup").args(["-d", &device]));
        };
        let _ = run(Command::new("partx").args(["-u", &device]));
        let listing =
            run(Command::new("lsblk").args(["-lnpo", "NAME", &device])).unwrap_or_default();
        let filesystem = listing.split_whitespace().find(|name| {
            run(Command::new("blkid").args(["-o", "value", "-s", "LABEL", name]))
                .is_ok_and(|label| label.trim() == "unbounded")
        });
        let Some(filesystem) = filesystem.map(str::to_owned) else {
            detach();
            return Err(step(format!(
                "no filesystem labelled unbounded on the disk (devices: {listing:?})"
            )));
        };
        if let Err(e) = run(Command::new("mount").arg(&filesystem).arg(at)) {
            detach();
            return Err(e);
        }
        Ok(Self {
            path: at.to_path_buf(),
            device,
        })
    }

    fn release(self) -> Result<(), LabError> {
        run(Command::new("umount").arg(&self.path))?;
        let _ = run(Command::new("partx").args(["-d", &self.device]));
        run(Command::new("losetup").args(["-d", &self.device]))?;
        Ok(())
    }
}

fn run(command: &mut Command) -> Result<String, LabError> {
    let out = command
        .output()
        .map_err(|e| Failure::new(format!("running {command:?}"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(step(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
