//! The `disks` scenario: the node's state on a machine's own disk (`spec.template.storage`,
//! docs/storage.md), on the lab's VMs, each of which has a blank 20 GiB virtio disk (`vdb`).
//!
//! 1. A reboot of a machine whose node container lives in RAM: the agent downloads and
//!    unpacks the node image again (the baseline, timed).
//! 2. `storage: {}` added to the lab's configuration (a new version), pinned on another
//!    machine and applied by deleting its Node: the agent formats `vdb` and paves onto it
//!    (timed), and the Machine's `status.agent.storage` says so.
//! 3. That machine rebooted: the agent finds its layout and the container on the disk and
//!    starts it without a download (`containerReused`, timed).
//! 4. That Machine deleted (released): its agent wipes the disk (`wipe: onRelease`, the
//!    default) and reports `Wiped` before the provider powers the machine off and lets the
//!    Machine go; the scenario then reads the disk's file back on the host: no filesystem
//!    or partition table left. (The lab has one Machine fewer afterwards.)
//!
//! Each reboot is timed from the operation's creation to a Ready Node of the new boot (a
//! Node's Ready condition can still be the old boot's for a while).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::lab::base::LabError;
use crate::scenario::{
    Lab, get, operation, patch_configuration, pin, repave, step, wait_complete, wait_until,
};

/// What the scenario measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskFigures {
    /// Reboot → Ready with the node container in RAM (downloaded and unpacked again).
    pub reboot_ram: Duration,
    /// Node deletion → Ready, paving onto a freshly formatted disk.
    pub pave_onto_disk: Duration,
    /// Reboot → Ready with the node container started from the disk.
    pub reboot_from_disk: Duration,
    /// Machine deletion → the disk wiped and the Machine gone.
    pub release: Duration,
}

/// Runs the scenario on the lab's first two machines.
pub fn disks(lab: &Lab, timeout: Duration, say: &dyn Fn(&str)) -> Result<DiskFigures, LabError> {
    let names = lab.machine_names();
    let (Some(ram), Some(disk)) = (names.first().cloned(), names.get(1).cloned()) else {
        return Err(step("the disks scenario needs two machines"));
    };
    say(&format!("disks: reboot {ram} (node container in RAM)"));
    let reboot_ram = reboot(lab, &ram, "tb-disks-reboot-ram", timeout)?;
    say(&format!(
        "disks: {ram} Ready {:.1} s after its reboot (container downloaded and unpacked)",
        reboot_ram.as_secs_f64()
    ));

    let before = get(lab, "machine", &disk, "{.status.configuration.version}");
    let before: i64 = before.parse().map_err(|_| {
        step(format!(
            "{disk} records no configuration version: {before:?}"
        ))
    })?;
    say("disks: adding storage: {} to the lab's configuration (a new version)");
    patch_configuration(lab, r#"{"spec":{"template":{"storage":{}}}}"#)?;
    let mut with_storage = 0;
    wait_until("a version with storage", Duration::from_secs(60), || {
        let latest = get(
            lab,
            "machineconfiguration",
            "testbed",
            "{.status.latestVersion}",
        );
        with_storage = latest.parse().unwrap_or(0);
        (with_storage > before, latest)
    })?;
    pin(lab, &disk, with_storage)?;
    let pave_onto_disk = repave(lab, &disk, timeout, say)?;
    let used = storage_status(lab, &disk);
    // The lab's data disk carries the serial `data-<domain>` (the 64 MiB boot disk is
    // below the default 16 GiB and has none).
    if used.action != "formatted" || !used.serial.starts_with("data-") {
        return Err(step(format!(
            "{disk} paved on version {with_storage} but its storage status is {used:?}"
        )));
    }
    say(&format!(
        "disks: {disk} paved onto {} ({} bytes, formatted) in {:.1} s",
        used.device,
        used.size,
        pave_onto_disk.as_secs_f64()
    ));

    say(&format!(
        "disks: reboot {disk} (node container on its disk)"
    ));
    let reboot_from_disk = reboot(lab, &disk, "tb-disks-reboot-disk", timeout)?;
    let used = storage_status(lab, &disk);
    if used.action != "reused" || used.container_reused != "true" {
        return Err(step(format!(
            "{disk} rebooted but did not start its container from the disk: {used:?}"
        )));
    }
    say(&format!(
        "disks: {disk} Ready {:.1} s after its reboot (container started from {})",
        reboot_from_disk.as_secs_f64(),
        used.device
    ));

    say(&format!(
        "disks: deleting Machine {disk} (release: its disk is wiped first)"
    ));
    let domain = used.serial.trim_start_matches("data-").to_owned();
    let started = Instant::now();
    lab.kubectl(&["delete", "machine", &disk, "--wait=false"], None)?;
    let mut wiped = false;
    wait_until(
        &format!("{disk}'s agent to wipe its disk and the Machine to go"),
        timeout,
        || {
            let state = get(lab, "machine", &disk, "{.status.agent.releaseWipe.state}");
            wiped |= state == "Wiped";
            let exists = lab
                .kubectl(
                    &["get", "machine", &disk, "--ignore-not-found", "-o", "name"],
                    None,
                )
                .unwrap_or_default();
            (
                wiped && exists.trim().is_empty(),
                format!("releaseWipe {state:?}, Machine {:?}", exists.trim()),
            )
        },
    )?;
    let release = started.elapsed();
    let left = disk_signatures(&domain)?;
    if !left.is_empty() {
        return Err(step(format!(
            "{disk} was released but its disk still carries: {left}"
        )));
    }
    say(&format!(
        "disks: {disk} released in {:.1} s; its disk read back on the host: no signature left",
        release.as_secs_f64()
    ));
    say(&format!(
        "disks: reboot from RAM {:.1} s, pave onto a blank disk {:.1} s, reboot from disk {:.1} s, release with the wipe {:.1} s",
        reboot_ram.as_secs_f64(),
        pave_onto_disk.as_secs_f64(),
        reboot_from_disk.as_secs_f64(),
        release.as_secs_f64()
    ));
    Ok(DiskFigures {
        reboot_ram,
        pave_onto_disk,
        reboot_from_disk,
        release,
    })
}

/// A `reboot` operation on `machine`, timed until its Node is Ready on the new boot: the
/// agent reports a new boot ID and the Node a new one of its own (kubelet runs in the node
/// container, whose boot ID systemd-nspawn makes up: it is not the host's).
fn reboot(lab: &Lab, machine: &str, name: &str, timeout: Duration) -> Result<Duration, LabError> {
    let boot_before = get(lab, "machine", machine, "{.status.agent.bootID}");
    let node_boot_before = get(lab, "node", machine, "{.status.nodeInfo.bootID}");
    lab.kubectl(
        &["delete", "machineoperation", name, "--ignore-not-found"],
        None,
    )?;
    let started = Instant::now();
    operation(lab, name, machine, "reboot", "")?;
    wait_complete(lab, name, timeout)?;
    wait_until(&format!("{machine} Ready on its new boot"), timeout, || {
        let boot = get(lab, "machine", machine, "{.status.agent.bootID}");
        let node_boot = get(lab, "node", machine, "{.status.nodeInfo.bootID}");
        let ready = get(
            lab,
            "node",
            machine,
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        );
        (
            !boot.is_empty()
                && boot != boot_before
                && !node_boot.is_empty()
                && node_boot != node_boot_before
                && ready == "True",
            format!("agent boot {boot}, Node boot {node_boot}, Ready {ready}"),
        )
    })?;
    Ok(started.elapsed())
}

/// `status.agent.storage` as the scenario reads it.
#[derive(Debug, Clone, Default)]
struct StorageStatus {
    device: String,
    serial: String,
    size: String,
    action: String,
    container_reused: String,
}

fn storage_status(lab: &Lab, machine: &str) -> StorageStatus {
    let field = |path: &str| {
        get(
            lab,
            "machine",
            machine,
            &format!("{{.status.agent.storage.{path}}}"),
        )
    };
    StorageStatus {
        device: field("disk"),
        serial: field("serial"),
        size: field("sizeBytes"),
        action: field("action"),
        container_reused: field("containerReused"),
    }
}

/// The signatures (filesystems, partition tables) `wipefs` finds on the data disk of libvirt
/// domain `domain`, read on the host from a raw copy of its qcow2 file; empty when none.
fn disk_signatures(domain: &str) -> Result<String, LabError> {
    let run = |command: &mut Command| -> Result<String, LabError> {
        let out = command
            .output()
            .map_err(|e| step(format!("running {command:?}: {e}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(step(format!(
                "{command:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
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
            (Some("file"), Some("disk"), Some("vdb"), Some(path)) => Some(path.to_owned()),
            _ => None,
        })
        .ok_or_else(|| step(format!("{domain} has no data disk vdb: {disks}")))?;
    let copy = tempfile::tempdir().map_err(|e| step(e.to_string()))?;
    let raw = copy.path().join("data.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "raw", &file])
        .arg(&raw))?;
    // Without -a, wipefs only lists what it would erase.
    Ok(run(Command::new("wipefs").arg(&raw))?.trim().to_owned())
}
