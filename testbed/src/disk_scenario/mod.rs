//! The `disks` scenario: the node's state on a machine's own disk (`spec.template.storage`,
//! docs/storage.md), on the lab's VMs: every one has a blank 20 GiB virtio disk (`vdb`), the
//! even-numbered ones a second of 24 GiB (`vdc`).
//!
//! On the first machine (one disk), the reboot figures on the same machine:
//! 1. a reboot with its node container in RAM: the agent downloads and unpacks the node
//!    image again (the baseline, timed);
//! 2. `storage: {}` added to the lab's configuration (a new version), pinned on it and
//!    applied by deleting its Node: the agent formats `vdb` and paves onto it (timed), and
//!    `status.agent.storage` says so;
//! 3. a reboot: the agent finds its layout and the container on the disk and starts it
//!    without a download (`containerReused`, timed);
//! 4. the Machine deleted (released): its agent wipes the disk (`wipe: onRelease`, the
//!    default) and reports `Wiped` before the provider powers the machine off and lets the
//!    Machine go; the disk's file read back on the host: no filesystem or partition table.
//!
//! On the second machine (two disks), the rules and the wipe policies:
//! 5. `disk: {minSizeGiB: 22}, wipe: never`: the agent picks `vdc`, and `vdb` stays blank;
//! 6. the machine shut down, a file written onto its filesystem from the host (a previous
//!    tenant's data), powered on: the container starts from the disk;
//! 7. a repave with `never`: the file is still there;
//! 8. `wipe: always`, applied with a repave: the disk is wiped and formatted, the file gone;
//! 9. back on the lab's version without storage (a repave): the node's state is in RAM and
//!    `status.agent.storage` says the earlier layout is `left` on `vdc`;
//! 10. released by a pool (claimed into `tb-disks-pool`, scaled to 0): the controller drains
//!    the Node and asks for the wipe, the agent wipes the left layout although its version
//!    has no storage, the power-off waits for its report, and `vdc` read back on the host
//!    carries no signature; then the machine is booted again.
//!
//! Each reboot is timed from the operation's creation to a Ready Node of the new boot (a
//! Node's Ready condition can still be the old boot's for a while). The load average is
//! noted beside each figure: under TCG a VM's boot is as fast as the host's idle CPU.

use std::process::Command;
use std::time::{Duration, Instant};

pub use timeline::{AgentPhase, RebootMark, RebootTimeline, last_agent_phase};

use crate::bmc::data_disk_serial;
use crate::lab::base::LabError;
use crate::scenario::{
    Lab, get, operation, patch_configuration, pin, ready_on_new_boot, repave, step, wait_complete,
    wait_until,
};

mod data_disk;
mod timeline;

use data_disk::DataDisk;

/// A file the scenario writes onto the second machine's filesystem from the host: what a
/// previous tenant would have left.
const TENANT_FILE: &str = "tenant-data";

/// What the scenario measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskFigures {
    /// Reboot → Ready with the node container in RAM (downloaded and unpacked again).
    pub reboot_ram: Timed,
    /// The agent's part of that boot.
    pub agent_ram: Option<AgentPhase>,
    /// That reboot's stages.
    pub stages_ram: RebootTimeline,
    /// Node deletion → Ready, paving onto a freshly formatted disk.
    pub pave_onto_disk: Timed,
    /// Reboot → Ready of the same machine with the node container started from the disk.
    pub reboot_from_disk: Timed,
    /// The agent's part of that boot.
    pub agent_disk: Option<AgentPhase>,
    /// That reboot's stages.
    pub stages_disk: RebootTimeline,
    /// Machine deletion → the disk wiped and the Machine gone.
    pub release: Timed,
}

/// A duration and the host's 1-minute load average when it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub took: Duration,
    pub load: String,
}

impl Timed {
    fn since(started: Instant) -> Self {
        Self {
            took: started.elapsed(),
            load: load_average(),
        }
    }

    fn of(took: Duration) -> Self {
        Self {
            took,
            load: load_average(),
        }
    }
}

impl std::fmt::Display for Timed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} s (load {})", self.took.as_secs_f64(), self.load)
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Runs the scenario on the lab's first two machines.
pub fn disks(lab: &Lab, timeout: Duration, say: &dyn Fn(&str)) -> Result<DiskFigures, LabError> {
    let names = lab.machine_names();
    let (Some(first), Some(second)) = (names.first().cloned(), names.get(1).cloned()) else {
        return Err(step("the disks scenario needs two machines"));
    };
    let current = configuration_version(lab, &first)?;
    // Both pinned where they are, so that the versions this scenario makes reach only the
    // machine each is meant for.
    pin(lab, &first, current)?;
    pin(lab, &second, current)?;
    let figures = same_machine_reboots(lab, &first, timeout, say)?;
    wipe_policies(lab, &second, current, timeout, say)?;
    say(&format!(
        "disks: {first}: reboot from RAM {} ({}), pave onto a blank disk {}, reboot from disk {} ({}), release with the wipe {}",
        figures.reboot_ram,
        phase_text(figures.agent_ram),
        figures.pave_onto_disk,
        figures.reboot_from_disk,
        phase_text(figures.agent_disk),
        figures.release
    ));
    Ok(figures)
}

/// Steps 1–4 on `machine`.
fn same_machine_reboots(
    lab: &Lab,
    machine: &str,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<DiskFigures, LabError> {
    say(&format!("disks: reboot {machine} (node container in RAM)"));
    let ram = reboot(lab, machine, "tb-disks-reboot-ram", timeout)?;
    say(&format!(
        "disks: {machine} Ready {} after its reboot (container downloaded and unpacked); {}; stages: {}",
        ram.took,
        phase_text(ram.agent),
        ram.stages
    ));

    say("disks: adding storage: {} to the lab's configuration (a new version)");
    let version = new_version(lab, r#"{"spec":{"template":{"storage":{}}}}"#)?;
    pin(lab, machine, version)?;
    let pave_onto_disk = Timed::of(repave(lab, machine, timeout, say)?);
    let used = storage_status(lab, machine);
    // The lab's data disk carries the serial `data-<domain>` (the 64 MiB boot disk is
    // below the default 16 GiB and has none).
    if used.action != "formatted" || !used.serial.starts_with("data-") {
        return Err(step(format!(
            "{machine} paved on version {version} but its storage status is {used:?}"
        )));
    }
    say(&format!(
        "disks: {machine} paved onto {} ({} bytes, formatted) in {pave_onto_disk}",
        used.device, used.size
    ));

    say(&format!(
        "disks: reboot {machine} (node container on its disk)"
    ));
    let disk = reboot(lab, machine, "tb-disks-reboot-disk", timeout)?;
    let used = storage_status(lab, machine);
    if used.action != "reused" || used.container_reused != "true" {
        return Err(step(format!(
            "{machine} rebooted but did not start its container from the disk: {used:?}"
        )));
    }
    say(&format!(
        "disks: {machine} Ready {} after its reboot (container started from {}); {}; stages: {}",
        disk.took,
        used.device,
        phase_text(disk.agent),
        disk.stages
    ));

    say(&format!(
        "disks: deleting Machine {machine} (release: its disk is wiped first)"
    ));
    let domain = used.serial.trim_start_matches("data-").to_owned();
    let started = Instant::now();
    lab.kubectl(&["delete", "machine", machine, "--wait=false"], None)?;
    let mut wiped = false;
    wait_until(
        &format!("{machine}'s agent to wipe its disk and the Machine to go"),
        timeout,
        || {
            let state = get(lab, "machine", machine, "{.status.agent.releaseWipe.state}");
            wiped |= state == "Wiped";
            let exists = lab
                .kubectl(
                    &[
                        "get",
                        "machine",
                        machine,
                        "--ignore-not-found",
                        "-o",
                        "name",
                    ],
                    None,
                )
                .unwrap_or_default();
            (
                wiped && exists.trim().is_empty(),
                format!("releaseWipe {state:?}, Machine {:?}", exists.trim()),
            )
        },
    )?;
    let release = Timed::since(started);
    let left = DataDisk::of(&domain, 0)?.signatures()?;
    if !left.is_empty() {
        return Err(step(format!(
            "{machine} was released but its disk still carries: {left}"
        )));
    }
    say(&format!(
        "disks: {machine} released in {release}; its disk read back on the host: no signature left"
    ));
    Ok(DiskFigures {
        reboot_ram: ram.took,
        agent_ram: ram.agent,
        stages_ram: ram.stages,
        pave_onto_disk,
        reboot_from_disk: disk.took,
        agent_disk: disk.agent,
        stages_disk: disk.stages,
        release,
    })
}

/// Steps 5–8 on `machine`, which has two data disks.
fn wipe_policies(
    lab: &Lab,
    machine: &str,
    without_storage: i64,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<(), LabError> {
    say("disks: storage on the larger disk (minSizeGiB 22), wipe: never");
    let never = new_version(
        lab,
        r#"{"spec":{"template":{"storage":{"disk":{"minSizeGiB":22},"wipe":"never"}}}}"#,
    )?;
    pin(lab, machine, never)?;
    repave(lab, machine, timeout, say)?;
    let used = storage_status(lab, machine);
    // The second data disk's serial is `data2-<domain>` (the lab's VMs, `data_disk_serial`).
    let domain = used
        .serial
        .strip_prefix("data2-")
        .unwrap_or_default()
        .to_owned();
    if used.action != "formatted"
        || domain.is_empty()
        || used.serial != data_disk_serial(1, &domain)
    {
        return Err(step(format!(
            "{machine} should have formatted its second disk (serial data2-<domain>) but its storage status is {used:?}"
        )));
    }
    let chosen = DataDisk::of(&domain, 1)?;
    let other = DataDisk::of(&domain, 0)?.signatures()?;
    if !other.is_empty() {
        return Err(step(format!(
            "{machine}'s first disk, which no rule selected, was written: {other}"
        )));
    }
    say(&format!(
        "disks: {machine} paved onto {} ({}), its other disk untouched",
        used.device, used.serial
    ));

    say(&format!(
        "disks: shutting {machine} down to leave a file on its disk from the host"
    ));
    // Taken before the shutdown: the Node keeps the old boot's Ready condition for the node
    // controller's grace period, longer than a shutdown and power-on can take.
    let node_boot_before = get(lab, "node", machine, "{.status.nodeInfo.bootID}");
    operation(lab, "tb-disks-shutdown", machine, "shutdown", "")?;
    wait_complete(lab, "tb-disks-shutdown", timeout)?;
    wait_until(&format!("{machine}'s VM shut off"), timeout, || {
        let state = domain_state(&domain);
        (state == "shut off", state)
    })?;
    chosen.write_file(TENANT_FILE)?;
    let boot_before = get(lab, "machine", machine, "{.status.agent.bootID}");
    operation(lab, "tb-disks-power-on", machine, "powerOn", "")?;
    wait_complete(lab, "tb-disks-power-on", timeout)?;
    wait_ready_on_new_boot(lab, machine, &boot_before, &node_boot_before, timeout)?;
    let used = storage_status(lab, machine);
    if used.action != "reused" || used.container_reused != "true" {
        return Err(step(format!(
            "{machine} was powered on but did not start its container from the disk: {used:?}"
        )));
    }

    say(&format!("disks: repave {machine} with wipe: never"));
    repave(lab, machine, timeout, say)?;
    if !chosen.has_file(TENANT_FILE)? {
        return Err(step(format!(
            "{machine} was repaved with wipe: never but the file {TENANT_FILE} is gone"
        )));
    }
    say(&format!("disks: {machine} repaved; {TENANT_FILE} kept"));

    say("disks: wipe: always, applied with a repave");
    let always = new_version(
        lab,
        r#"{"spec":{"template":{"storage":{"disk":{"minSizeGiB":22},"wipe":"always"}}}}"#,
    )?;
    pin(lab, machine, always)?;
    repave(lab, machine, timeout, say)?;
    let used = storage_status(lab, machine);
    if chosen.has_file(TENANT_FILE)? {
        return Err(step(format!(
            "{machine} was repaved with wipe: always but {TENANT_FILE} is still there ({used:?})"
        )));
    }
    say(&format!(
        "disks: {machine} repaved with wipe: always ({}): {TENANT_FILE} gone",
        used.action
    ));

    say(&format!(
        "disks: {machine} back on version {without_storage} (no storage), applied with a repave"
    ));
    pin(lab, machine, without_storage)?;
    repave(lab, machine, timeout, say)?;
    let used = storage_status(lab, machine);
    if used.action != "left" || used.serial != data_disk_serial(1, &domain) {
        return Err(step(format!(
            "{machine} was repaved without storage: its earlier layout should be reported left on its second disk, but the storage status is {used:?}"
        )));
    }
    say(&format!(
        "disks: {machine} runs from RAM again; its earlier layout is reported left on {}",
        used.device
    ));
    released_by_a_pool(lab, machine, without_storage, &chosen, timeout, say)
}

/// Step 10: `machine`, running from RAM with an earlier layout left on `disk`, claimed by a
/// pool and released: wiped before the power-off, then booted again.
fn released_by_a_pool(
    lab: &Lab,
    machine: &str,
    version: i64,
    disk: &DataDisk,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<(), LabError> {
    const POOL: &str = "tb-disks-pool";
    const LABEL: &str = "tb-disks-release";
    say(&format!(
        "disks: {machine} claimed by pool {POOL}, then released (scaled to 0)"
    ));
    lab.kubectl(
        &[
            "label",
            "machine",
            machine,
            &format!("{LABEL}=true"),
            "--overwrite",
        ],
        None,
    )?;
    let pool = |replicas: u32| {
        format!(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {{name: {POOL}}}
spec:
  replicas: {replicas}
  template:
    spec:
      provider: pxe
      pxe: {{inventorySelector: {{matchLabels: {{{LABEL}: "true"}}}}}}
      configurationRef: {{name: testbed, version: {version}}}
"#
        )
    };
    lab.kubectl(&["apply", "-f", "-"], Some(&pool(1)))?;
    wait_until(&format!("{POOL} to claim {machine}"), timeout, || {
        let member = get(
            lab,
            "machine",
            machine,
            r"{.metadata.labels.unbounded-cloud\.io/pool}",
        );
        (member == POOL, format!("pool label {member:?}"))
    })?;
    let started = Instant::now();
    lab.kubectl(&["apply", "-f", "-"], Some(&pool(0)))?;
    wait_until(
        &format!("{machine}'s agent to wipe its left layout before the power-off"),
        timeout,
        || {
            let wipe = get(lab, "machine", machine, "{.status.agent.releaseWipe.state}");
            let request = get(
                lab,
                "machine",
                machine,
                "{.status.agent.releaseWipe.request}",
            );
            let power = get(lab, "machine", machine, "{.status.power}");
            (
                wipe == "Wiped" && !request.is_empty() && power == "Off",
                format!("releaseWipe {wipe:?} for {request:?}, power {power:?}"),
            )
        },
    )?;
    let took = Timed::since(started);
    let condition = get(
        lab,
        "machine",
        machine,
        "{.status.conditions[?(@.type==\"DisksWiped\")].reason}",
    );
    if condition != "Wiped" {
        return Err(step(format!(
            "{machine} was powered off after its release, but DisksWiped says {condition:?}"
        )));
    }
    let left = disk.signatures()?;
    if !left.is_empty() {
        return Err(step(format!(
            "{machine} was released by its pool but its disk still carries: {left}"
        )));
    }
    say(&format!(
        "disks: {machine} released by its pool in {took}: wiped first (DisksWiped Wiped), then powered off; its disk read back on the host: no signature left"
    ));
    // The lab as it was: the pool gone, the machine booted again.
    lab.kubectl(&["delete", "machinepool", POOL, "--wait=true"], None)?;
    lab.kubectl(&["label", "machine", machine, &format!("{LABEL}-")], None)?;
    pin(lab, machine, version)?;
    let boot_before = get(lab, "machine", machine, "{.status.agent.bootID}");
    operation(lab, "tb-disks-boot-again", machine, "pxeBoot", "")?;
    wait_complete(lab, "tb-disks-boot-again", timeout)?;
    wait_ready_on_new_boot(lab, machine, &boot_before, "", timeout)?;
    say(&format!("disks: {machine} booted again and Ready"));
    Ok(())
}

fn phase_text(phase: Option<AgentPhase>) -> String {
    phase.map_or_else(
        || "the agent's part not found on the console".to_owned(),
        |p| p.to_string(),
    )
}

/// Applies `patch` to the lab's configuration and waits for the version it makes.
fn new_version(lab: &Lab, patch: &str) -> Result<i64, LabError> {
    let before = latest_version(lab);
    patch_configuration(lab, patch)?;
    let mut made = 0;
    wait_until("a new version of testbed", Duration::from_secs(60), || {
        made = latest_version(lab);
        (made > before, made.to_string())
    })?;
    Ok(made)
}

fn latest_version(lab: &Lab) -> i64 {
    get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    )
    .parse()
    .unwrap_or(0)
}

fn configuration_version(lab: &Lab, machine: &str) -> Result<i64, LabError> {
    let recorded = get(lab, "machine", machine, "{.status.configuration.version}");
    recorded.parse().map_err(|_| {
        step(format!(
            "{machine} records no configuration version: {recorded:?}"
        ))
    })
}

fn domain_state(domain: &str) -> String {
    Command::new("virsh")
        .args(["-c", crate::bmc::LIBVIRT_URI, "domstate", domain])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Waits until the agent of `machine` reports a boot other than `boot_before` and its Node,
/// with a boot ID other than `node_boot_before`, is Ready.
fn wait_ready_on_new_boot(
    lab: &Lab,
    machine: &str,
    boot_before: &str,
    node_boot_before: &str,
    timeout: Duration,
) -> Result<(), LabError> {
    wait_until(&format!("{machine} Ready on its new boot"), timeout, || {
        ready_on_new_boot(lab, machine, boot_before, node_boot_before)
    })
}

/// What one reboot took.
struct Rebooted {
    took: Timed,
    agent: Option<AgentPhase>,
    stages: RebootTimeline,
}

/// A `reboot` operation on `machine`, timed until its Node is Ready on the new boot: the
/// agent reports a new boot ID and the Node a new one of its own (kubelet runs in the node
/// container, whose boot ID systemd-nspawn makes up: it is not the host's). The console is
/// read at each poll (once a second) for the stages between.
fn reboot(lab: &Lab, machine: &str, name: &str, timeout: Duration) -> Result<Rebooted, LabError> {
    let boot_before = get(lab, "machine", machine, "{.status.agent.bootID}");
    let node_boot_before = get(lab, "node", machine, "{.status.nodeInfo.bootID}");
    lab.kubectl(
        &["delete", "machineoperation", name, "--ignore-not-found"],
        None,
    )?;
    let lines_before = lab.console(machine).lines().count();
    let mut stages = RebootTimeline::default();
    let started = Instant::now();
    let observe = |stages: &mut RebootTimeline| {
        let console = lab.console(machine);
        stages.observe(
            console.lines().skip(lines_before),
            started.elapsed(),
            machine,
            name,
        );
    };
    operation(lab, name, machine, "reboot", "")?;
    wait_until(
        &format!("MachineOperation {name} Complete"),
        timeout,
        || {
            observe(&mut stages);
            let state = get(lab, "machineoperation", name, "{.status.state}");
            let message = get(lab, "machineoperation", name, "{.status.message}");
            (state == "Complete", format!("{state}: {message}"))
        },
    )?;
    wait_until(&format!("{machine} Ready on its new boot"), timeout, || {
        observe(&mut stages);
        ready_on_new_boot(lab, machine, &boot_before, &node_boot_before)
    })?;
    let took = Timed::since(started);
    stages.note(RebootMark::Ready, took.took);
    Ok(Rebooted {
        took,
        agent: last_agent_phase(&lab.console(machine), machine),
        stages,
    })
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
