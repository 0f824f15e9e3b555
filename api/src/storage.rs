//! `spec.template.storage`: which of the machine's own disks holds the node's state, how it
//! is laid out, and when it is wiped.
//!
//! One disk holds `/var/lib/machines`, the root of the node container; containerd's state
//! (`/var/lib/containerd`), kubelet's (`/var/lib/kubelet`), pod ephemeral storage and
//! container logs (`/var/log/pods`) all live inside that root, so they are on the disk too.
//! Without `storage` everything stays in RAM, as before.
//!
//! The disk is chosen by rules that survive a rename of the kernel's device names (size,
//! rotational, model, serial, WWN, by-path link), never by `sda`. The agent decides from
//! plain data what to do with the disks it finds (`unbounded_agent::storage::plan`):
//! format, reuse, or refuse and touch nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The smallest disk the default rule takes, in GiB.
pub const DEFAULT_MIN_SIZE_GIB: i64 = 16;

/// The machine's local disk that holds the node's state.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Which disk: every rule given must match, and of the disks that match, the one that
    /// already carries this Machine's layout wins, then the smallest. Without rules: the
    /// smallest non-removable disk of at least 16 GiB. Removable disks, the disk the host
    /// booted from and disks with a mounted filesystem are never taken.
    #[serde(default)]
    pub disk: DiskSelector,
    /// `partition` (default): a GPT with one partition over the whole disk.
    /// `wholeDisk`: the filesystem on the disk itself, no partition table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<DiskLayout>,
    /// The filesystem: `ext4` (default, and the only one for now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Filesystem>,
    /// When the disk is wiped: `onRelease` (default: when the Machine is deleted or leaves
    /// its pool), `always` (also whenever the node container is paved anew: a repave or a
    /// new version; a reboot on the same version keeps it), `never` (not even on release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<WipePolicy>,
    /// How: `fast` (default: filesystem and partition table signatures erased with
    /// `wipefs`, then the whole disk discarded with `blkdiscard` where the device supports
    /// it) or `overwrite` (every byte written with zeroes: slow, for disks that cannot
    /// discard or when the data must not be recoverable from the flash's spare blocks through
    /// the device's interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe_method: Option<WipeMethod>,
    /// The chosen disk may carry a partition table or filesystem that Unbounded did not
    /// write (an installed OS, another tool's data): wiping it is intended. Without it the
    /// agent refuses such a disk and writes nothing to it.
    #[serde(default)]
    pub allow_foreign: bool,
}

impl StorageSpec {
    /// `layout` with its default applied.
    pub fn layout(&self) -> DiskLayout {
        self.layout.unwrap_or_default()
    }

    /// `filesystem` with its default applied.
    pub fn filesystem(&self) -> Filesystem {
        self.filesystem.unwrap_or_default()
    }

    /// `wipe` with its default applied.
    pub fn wipe(&self) -> WipePolicy {
        self.wipe.unwrap_or_default()
    }

    /// `wipeMethod` with its default applied.
    pub fn wipe_method(&self) -> WipeMethod {
        self.wipe_method.unwrap_or_default()
    }
}

/// Rules that choose a disk. Every rule given must match.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minSizeGiB) || !has(self.maxSizeGiB) || self.minSizeGiB <= self.maxSizeGiB").message("storage.disk.minSizeGiB must not be above maxSizeGiB"))]
pub struct DiskSelector {
    /// The smallest size, in GiB (2^30 bytes). Default 16.
    #[serde(
        rename = "minSizeGiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self >= 1").message("storage.disk.minSizeGiB must be 1 or more"))]
    pub min_size_gib: Option<i64>,
    /// The largest size, in GiB.
    #[serde(
        rename = "maxSizeGiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self >= 1").message("storage.disk.maxSizeGiB must be 1 or more"))]
    pub max_size_gib: Option<i64>,
    /// `true`: only spinning disks; `false`: only solid-state ones (as the kernel reports
    /// `queue/rotational`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    /// The disk's model, exactly as the kernel reports it (`lsblk -o MODEL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,
    /// The disk's serial number, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub serial: Option<String>,
    /// The disk's World Wide Name (`wwn`, as `lsblk -o WWN` shows it, such as
    /// `0x5000c500a1b2c3d4` or `eui.…`), exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub wwn: Option<String>,
    /// The name of the disk's link in `/dev/disk/by-path` (where it is plugged in), such as
    /// `pci-0000:00:1f.2-ata-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("!self.contains('/')").message("storage.disk.byPath is the link's name in /dev/disk/by-path, without a '/'"))]
    pub by_path: Option<String>,
}

impl DiskSelector {
    /// `minSizeGiB` with its default applied.
    pub fn min_size_gib(&self) -> i64 {
        self.min_size_gib.unwrap_or(DEFAULT_MIN_SIZE_GIB)
    }
}

/// How the disk is laid out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DiskLayout {
    /// A GPT with one Linux partition over the disk, labelled `unbounded`.
    #[default]
    Partition,
    /// The filesystem on the whole disk, no partition table.
    WholeDisk,
}

/// The filesystem made on the disk.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Filesystem {
    /// ext4.
    #[default]
    Ext4,
}

impl Filesystem {
    /// The name `blkid` reports for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ext4 => "ext4",
        }
    }
}

/// When the disk is wiped.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WipePolicy {
    /// When the node container is paved anew (repave, new version) and on release.
    Always,
    /// Only when the Machine is released.
    #[default]
    OnRelease,
    /// Never.
    Never,
}

/// How a disk is wiped.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WipeMethod {
    /// Signatures erased (`wipefs`), then the disk discarded (`blkdiscard`) where supported.
    #[default]
    Fast,
    /// Every byte overwritten with zeroes.
    Overwrite,
}

impl WipeMethod {
    /// The name as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Overwrite => "overwrite",
        }
    }
}

/// What the agent used for the node's state, in `status.agent.storage`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageStatus {
    /// The disk's kernel name at this boot (`sda`, `nvme0n1`): for a person; it may change.
    pub disk: String,
    /// The disk's serial number, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The disk's World Wide Name, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    /// The disk's size in bytes.
    pub size_bytes: i64,
    /// What the agent did with it at this boot: `formatted` (a new layout), `reused` (this
    /// Machine's layout was already there), `wiped` (wiped before a pave, as `wipe: always`
    /// says), `left` (the running version keeps the node's state in RAM; an earlier
    /// version's layout is still on this disk, and a release wipes it).
    pub action: String,
    /// The node container was started from the disk as it was (same configuration version
    /// and image), without a download.
    #[serde(default)]
    pub container_reused: bool,
}

/// The wipe of the Machine's disks when it is released (deleted), in
/// `status.agent.releaseWipe`. The agent writes it; the provider powers the machine off only
/// once it says `Wiped` (or the configuration does not wipe on release, or the wait timed
/// out and an operator said to go on): see `unbounded_runtime::release`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseWipeStatus {
    /// `Pending` (the agent saw the deletion and waits for the Node to be drained and
    /// deleted), `Wiping`, `Wiped` or `Failed`.
    pub state: WipeState,
    /// How the disks are (or were) wiped.
    pub method: WipeMethod,
    /// The disks wiped or being wiped, by their kernel name at this boot; empty when no disk
    /// carries this Machine's layout (nothing of it was written: nothing to wipe).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub disks: Vec<String>,
    /// What happened, for a person (the failing command and what it printed, on `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the wipe started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it ended (`Wiped` or `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The release to the inventory this report answers (the Machine's
    /// `unbounded-cloud.io/release-wipe` value); unset for a deletion. A report of an
    /// earlier release never counts for a later one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// Where a release wipe is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum WipeState {
    /// The agent saw the deletion; it wipes once the Node is drained and deleted.
    Pending,
    /// The node container is stopped and the disks are being wiped.
    Wiping,
    /// Every disk that carried this Machine's layout is wiped.
    Wiped,
    /// The wipe failed; the message says why.
    Failed,
}

impl WipeState {
    /// The name as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Wiping => "Wiping",
            Self::Wiped => "Wiped",
            Self::Failed => "Failed",
        }
    }
}

impl WipePolicy {
    /// Whether the disk is wiped when the Machine is released.
    pub fn wipes_on_release(self) -> bool {
        matches!(self, Self::Always | Self::OnRelease)
    }
}
