//! Unbounded's agent: runs in the network-booted host OS of a machine and turns it into a
//! Node.
//!
//! 1. **Identity** ([`identity`]): the Machine's name, the bootserver's URL and a one-time
//!    nonce, from the kernel command line the bootserver's iPXE script wrote.
//! 2. **Credentials** ([`credentials`]): the nonce buys a ServiceAccount token scoped to this
//!    Machine (its own Machine, Node, configuration version and operations; see
//!    `unbounded_api::agent`), refreshed before it expires; each pave also gets a kubelet
//!    bootstrap token with an expiry.
//! 3. **Decide** ([`plan`]): from the Machine, its Node and what is on this host, whether to
//!    pave, start, wait or do nothing; the loop ([`run`]) runs one pass ([`reconcile`]) on
//!    every change of the Machine, its Node or its role.
//! 4. **Pave** ([`pave`], with [`rootfs`], [`render`], [`container_root`], [`systemd`]): fetch the node
//!    image (size-capped), verify its SHA-256, only then unpack it into a staging
//!    directory (off the async workers, as all filesystem work), write kubelet's files and the
//!    configuration's files into it, replace the old container with it, write
//!    `/etc/systemd/nspawn/<node>.nspawn` and start `systemd-nspawn@<node>.service` through
//!    systemd's D-Bus API. kubelet inside TLS-bootstraps and the Node joins.
//!    With `spec.template.storage`, the node container lives on a local disk ([`storage`]):
//!    chosen by rules, formatted or reused, mounted on `/var/lib/machines`; a reboot on the
//!    same version starts the container from it without a download.
//! 5. **Repave** when the Node it joined as is deleted, with the version the controller
//!    resolved then (a rollback is "pin an older version, delete the Node").
//! 6. **Release** ([`release`]): when the Machine is deleted and its configuration wipes
//!    its disks on release, the agent waits for the Node to be drained and deleted, stops
//!    the node container, unmounts and wipes every disk that carries this Machine's layout,
//!    and reports `status.agent.releaseWipe`; the provider powers off only after `Wiped`.
//! 7. **Operations** ([`operation_tasks`], deciding with [`operations`]): `reboot`,
//!    `shutdown` (logind) and `restartService` (systemd, in the node container or on the
//!    host); `applyFiles` ([`apply_files`]), the agent's part of an `applyConfiguration`:
//!    a version's changed files and kubelet flags written into the running container and
//!    the units that read them restarted, without a repave.
//!
//! Progress goes to the console (`unbounded-agent: …` lines) and to the Machine's status
//! (`status.agent`, condition `BootstrapReady`).

pub mod apply_files;
pub mod container_root;
pub mod context;
pub mod credential_upkeep;
pub mod credentials;
pub mod identity;
pub mod inspect;
pub mod inventory;
pub mod inventory_refresh;
pub mod kubelet_version;
pub mod log_file;
pub mod node_address;
pub mod operation_tasks;
pub mod operations;
pub mod pave;
pub mod plan;
pub mod reconcile;
pub mod release;
pub mod render;
pub mod retry;
pub mod rootfs;
pub mod run;
pub mod state;
pub mod status;
pub mod storage;
pub mod systemd;
pub mod tpm;
mod watch_one;

pub use identity::{CMDLINE_BOOTSERVER, CMDLINE_MACHINE, CMDLINE_NONCE};
