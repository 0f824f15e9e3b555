//! The pave's storage step: the disk chosen, laid out or reused, and mounted on
//! `/var/lib/machines` before anything of the node container is written, and the decision
//! whether the container already on it is started as it is.
//!
//! Order matters where a disk is wiped or formatted while something is mounted on the
//! mount point (a repave with `wipe: always`, or a layout that changed): kubelet's identity
//! is copied into the agent's state directory (RAM) first, so the new root gets it as a
//! repave always does, then the container is stopped and the filesystem unmounted, and only
//! then is the disk touched. A refusal, or a failure before the stop, leaves the running
//! container as it is.

use std::path::{Path, PathBuf};
use std::time::Duration;

use unbounded_api::ResolvedConfiguration;
use unbounded_api::storage::{StorageSpec, StorageStatus, WipeMethod};

use super::apply::{self, StorageError};
use super::probe::{self, Disk, DiskScope};
use super::{ContainerStep, Marker, Owner, Plan, Refusal, Wanted, decide_container, plan};
use crate::container_root::{self, ContainerRootError};
use crate::context::Context;
use crate::systemd::{self, SystemdError};

/// How long a wipe before a repave may take (an `overwrite` of a large disk is slow; the
/// pave waits for it).
pub const WIPE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Why the storage step failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageStepError {
    /// The plan refused: nothing was touched.
    #[error("storage: {0}")]
    Refused(#[from] Refusal),
    /// A tool or file operation failed.
    #[error("storage: {0}")]
    Failed(#[from] StorageError),
    /// The Machine has no UID.
    #[error("storage: the Machine has no UID to name its filesystem with")]
    NoUid,
    /// Keeping kubelet's identity failed.
    #[error("storage: {0}")]
    Root(#[from] ContainerRootError),
    /// The container could not be stopped.
    #[error("storage: stopping the node container before the disk is changed: {0}")]
    Stop(#[from] SystemdError),
    /// The blocking task panicked.
    #[error("storage: the blocking task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl StorageStepError {
    /// A short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(r) => r.reason(),
            Self::Failed(e) => e.reason(),
            Self::NoUid => "InvalidMachine",
            Self::Root(e) => e.reason(),
            Self::Stop(_) => "ContainerFailed",
            Self::Task(_) => "DiskFailed",
        }
    }
}

/// What the storage step did, for the pave.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Start the container on the disk as it is, or pave.
    pub step: ContainerStep,
    /// Where kubelet's identity was kept while the disk was changed, if it was.
    pub identity: Option<PathBuf>,
    /// For `status.agent.storage`.
    pub status: StorageStatus,
    /// The marker as written at this step (not complete unless started from disk).
    pub marker: Marker,
}

/// Where and for whom the storage step works.
#[derive(Debug, Clone)]
pub struct DiskInput {
    /// The mount point: the machines directory (`/var/lib/machines`).
    pub machines: PathBuf,
    /// The agent's state directory (RAM), where kubelet's identity is kept while the disk
    /// changes.
    pub state: PathBuf,
    /// The node container's name.
    pub node: String,
    /// The Machine's name.
    pub machine: String,
    /// The Machine's UID.
    pub machine_uid: Option<String>,
    /// Which disks are looked at ([`DiskScope::All`] on a machine).
    pub scope: DiskScope,
    /// The pool claim the Machine is under (`unbounded-cloud.io/claimed-at`), if any.
    pub claim: Option<String>,
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageStepError> + Send + 'static,
) -> Result<T, StorageStepError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(StorageStepError::Task)?
}

fn probe_one(name: &str) -> Result<Disk, StorageStepError> {
    probe::read_disks(Path::new("/"), &DiskScope::Only(vec![name.to_owned()]))
        .into_iter()
        .next()
        .ok_or_else(|| {
            StorageStepError::Failed(StorageError::Io {
                what: format!("reading disk {name} again"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
        })
}

/// [`prepare_disk`] for the agent's pave.
pub(crate) async fn prepare(
    ctx: &Context,
    machine_uid: Option<&str>,
    claim: Option<&str>,
    spec: &StorageSpec,
    configuration: &ResolvedConfiguration,
    image_sha256: &str,
    first_on_boot: bool,
) -> Result<Prepared, StorageStepError> {
    let input = DiskInput {
        machines: ctx.paths.machines.clone(),
        state: ctx.paths.state.clone(),
        node: ctx.node.clone(),
        machine: ctx.identity.machine.clone(),
        machine_uid: machine_uid.map(str::to_owned),
        scope: DiskScope::All,
        claim: claim.map(str::to_owned),
    };
    let unit = systemd::container_unit(&ctx.node);
    let stop = || ctx.host.stop(&unit, Duration::from_secs(120));
    prepare_disk(
        &input,
        spec,
        configuration,
        image_sha256,
        first_on_boot,
        stop,
    )
    .await
}

/// For a version without `storage`: the first disk that still carries this Machine's
/// layout from an earlier version (never the boot disk), reported as `left`, so that the
/// release wipes it (`unbounded_runtime::release`); `None` when there is none.
pub async fn layout_left(machine_uid: Option<&str>, scope: DiskScope) -> Option<StorageStatus> {
    let uid = machine_uid?.to_owned();
    blocking(move || {
        let disks = probe::read_disks(Path::new("/"), &scope);
        let booted = probe::boot_disk(&disks);
        let ours = crate::release::disks_of_machine(&disks, &uid, booted.as_deref());
        Ok(disks
            .iter()
            .find(|d| ours.contains(&d.name))
            .map(|disk| StorageStatus {
                disk: disk.name.clone(),
                serial: disk.serial.clone(),
                wwn: disk.wwn.clone(),
                size_bytes: i64::try_from(disk.size_bytes).unwrap_or(i64::MAX),
                action: LEFT.into(),
                container_reused: false,
            }))
    })
    .await
    .ok()
    .flatten()
}

/// `status.agent.storage.action` of a disk an earlier version's layout was left on.
pub const LEFT: &str = "left";

/// Chooses, lays out or reuses, and mounts the disk on `input.machines`; `stop` stops the
/// node container (called only when a mounted disk is about to be wiped or formatted).
pub async fn prepare_disk<F, Fut>(
    input: &DiskInput,
    spec: &StorageSpec,
    configuration: &ResolvedConfiguration,
    image_sha256: &str,
    first_on_boot: bool,
    stop: F,
) -> Result<Prepared, StorageStepError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), SystemdError>>,
{
    let uid = input.machine_uid.clone().ok_or(StorageStepError::NoUid)?;
    let mount_point = input.machines.clone();
    let scope = input.scope.clone();
    let claim = input.claim.clone();
    let (node, spec_owned, configuration_owned, sha) = (
        input.node.clone(),
        spec.clone(),
        configuration.clone(),
        image_sha256.to_owned(),
    );
    // Decide (and mount a disk that is reused, to read its marker).
    let (uid_c, mount_c) = (uid.clone(), mount_point.clone());
    let (planned, disk, step, previous_marker) = blocking(move || {
        let disks = probe::read_disks(Path::new("/"), &scope);
        let booted = probe::boot_disk(&disks);
        let owner = Owner {
            uid: &uid_c,
            mount_point: &mount_c.display().to_string(),
        };
        let planned = plan(&spec_owned, &disks, booted.as_deref(), &owner)?;
        let disk = disks
            .into_iter()
            .find(|d| d.name == planned.disk())
            .ok_or(Refusal::OnlyUnusable(planned.disk().to_owned()))?;
        let wanted = Wanted {
            container: &node,
            configuration: &configuration_owned,
            image_sha256: &sha,
            claim: claim.as_deref(),
        };
        let marker = match &planned {
            Plan::Reuse { device, .. } => {
                let device = apply::device_path(Path::new("/"), &disk.name, device)?;
                let mounts: Vec<String> = disk.all_mounts().map(str::to_owned).collect();
                apply::mount(&device, &mount_c, &mounts)?;
                apply::read_marker(&mount_c)
            }
            Plan::Format { .. } => None,
        };
        let step = decide_container(
            &planned,
            marker.as_ref(),
            &wanted,
            first_on_boot,
            spec_owned.wipe(),
        );
        Ok((planned, disk, step, marker))
    })
    .await?;

    let root = mount_point.join(&input.node);
    let changes_disk =
        step == ContainerStep::WipeThenPave || matches!(planned, Plan::Format { .. });
    let mut identity = None;
    if changes_disk {
        // Whatever is at the mount point now (a RAM root, or the disk's) may hold kubelet's
        // identity: keep it in RAM while the disk changes.
        let stash = input.state.join("kubelet-identity");
        let _ = tokio::fs::remove_dir_all(&stash).await;
        container_root::carry_kubelet_identity(&root, &stash).await?;
        identity = Some(stash);
    }
    let mounted_here = step == ContainerStep::WipeThenPave
        || disk
            .all_mounts()
            .any(|m| Path::new(m) == mount_point.as_path());
    if changes_disk && mounted_here {
        stop().await?;
        let m = mount_point.clone();
        blocking(move || Ok(apply::unmount(&m)?)).await?;
    }
    let action = match (&planned, step) {
        (Plan::Format { .. }, _) => "formatted",
        (_, ContainerStep::WipeThenPave) => "wiped",
        _ => "reused",
    };
    if changes_disk {
        let (spec_owned, uid_c, mount_c, name) = (
            spec.clone(),
            uid.clone(),
            mount_point.clone(),
            disk.name.clone(),
        );
        let wipe_first = step == ContainerStep::WipeThenPave;
        blocking(move || {
            if wipe_first {
                apply::wipe(
                    Path::new("/"),
                    &probe_one(&name)?,
                    spec_owned.wipe_method(),
                    WIPE_TIMEOUT,
                )?;
            }
            let device = apply::format(Path::new("/"), &probe_one(&name)?, &spec_owned, &uid_c)?;
            apply::mount(&device, &mount_c, &[])?;
            Ok(())
        })
        .await?;
    }
    let marker = match (step, previous_marker) {
        (ContainerStep::StartFromDisk, Some(m)) => m,
        _ => Marker {
            machine: input.machine.clone(),
            machine_uid: uid,
            container: Some(input.node.clone()),
            configuration: Some(configuration.clone()),
            image_sha256: Some(image_sha256.to_owned()),
            complete: false,
            claim: input.claim.clone(),
        },
    };
    if step != ContainerStep::StartFromDisk {
        let (m, mount_c) = (marker.clone(), mount_point.clone());
        blocking(move || Ok(apply::write_marker(&mount_c, &m)?)).await?;
    }
    println!(
        "unbounded-agent: storage on disk {} ({} GB, {action}): {}",
        disk.name,
        disk.size_bytes / 1_000_000_000,
        match step {
            ContainerStep::StartFromDisk => "the node container on it is started as it is",
            ContainerStep::Pave | ContainerStep::WipeThenPave =>
                "the node container is paved onto it",
        }
    );
    Ok(Prepared {
        step,
        identity,
        status: StorageStatus {
            disk: disk.name.clone(),
            serial: disk.serial.clone(),
            wwn: disk.wwn.clone(),
            size_bytes: i64::try_from(disk.size_bytes).unwrap_or(i64::MAX),
            action: action.into(),
            container_reused: step == ContainerStep::StartFromDisk,
        },
        marker,
    })
}

/// Records that the pave onto the disk finished: the next boot may start it as it is.
pub async fn pave_finished(machines: &Path, marker: &Marker) -> Result<(), StorageStepError> {
    let marker = Marker {
        complete: true,
        ..marker.clone()
    };
    let mount_point = machines.to_path_buf();
    blocking(move || Ok(apply::write_marker(&mount_point, &marker)?)).await
}

/// What a release wipe did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseWiped {
    /// The disks wiped (kernel names), none when no disk carried this Machine's layout.
    pub disks: Vec<String>,
    /// For a person: what each wipe did.
    pub summary: String,
}

/// The release wipe ([`crate::release`]): stops the node container (`stop`), unmounts the
/// storage from `input.machines` if a disk is mounted there, then wipes every disk that
/// carries this Machine's layout with `method`, each within `timeout`.
pub async fn wipe_for_release<F, Fut>(
    input: &DiskInput,
    method: WipeMethod,
    timeout: Duration,
    stop: F,
) -> Result<ReleaseWiped, StorageStepError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), SystemdError>>,
{
    let uid = input.machine_uid.clone().ok_or(StorageStepError::NoUid)?;
    stop().await?;
    let (mount_point, scope) = (input.machines.clone(), input.scope.clone());
    blocking(move || {
        let root = Path::new("/");
        let mounted_here = probe::read_disks(root, &scope).iter().any(|d| {
            d.all_mounts()
                .any(|m| Path::new(m) == mount_point.as_path())
        });
        if mounted_here {
            apply::unmount(&mount_point)?;
        }
        let disks = probe::read_disks(root, &scope);
        let booted = probe::boot_disk(&disks);
        let ours = crate::release::disks_of_machine(&disks, &uid, booted.as_deref());
        let mut summary = Vec::new();
        for disk in disks.iter().filter(|d| ours.contains(&d.name)) {
            let wiped = apply::wipe(root, disk, method, timeout)?;
            summary.push(match (method, &wiped.discard_failed) {
                (WipeMethod::Fast, None) => {
                    format!("{}: signatures erased, discarded", disk.name)
                }
                (WipeMethod::Fast, Some(why)) => format!(
                    "{}: signatures erased; the discard failed ({why}), so the first and last {} MiB of the disk and of each partition and the filesystem's backup superblocks were overwritten instead ({} bytes); the other blocks keep their old contents (wipeMethod: overwrite clears every byte)",
                    disk.name,
                    apply::ENDS_OVERWRITTEN >> 20,
                    wiped.zeroed_bytes
                ),
                (WipeMethod::Overwrite, _) => {
                    format!("{}: {} bytes overwritten", disk.name, wiped.zeroed_bytes)
                }
            });
        }
        let summary = if summary.is_empty() {
            "no disk carries this Machine's layout: nothing of it was written, nothing to wipe"
                .to_owned()
        } else {
            summary.join("; ")
        };
        Ok(ReleaseWiped {
            disks: ours,
            summary,
        })
    })
    .await
}
