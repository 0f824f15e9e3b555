//! What Unbounded's components run on, apart from the types they agree on
//! (`unbounded-api`, which does no I/O), as kube-rs keeps `kube-runtime` apart from
//! `kube-core`:
//!
//! - [`leader`]: the leader election that the controller, the PXE provider (in the
//!   bootserver) and the Azure provider share, so that at most one replica of each acts at a
//!   time;
//! - [`provider`]: the Provider contract and the reconcile loop every infrastructure provider
//!   runs on (PXE in the bootserver, Azure in `azure`);
//! - [`release`]: whether a deleted Machine is powered off now, or waits for (or is held
//!   until) the agent's wipe of its disks;
//! - [`handler`]: claiming, running and finishing the MachineOperations routed to an agent or
//!   a provider;
//! - [`tokens`]: minting an agent's ServiceAccount token and kubelet's bootstrap token;
//! - [`inventory`]: folding one source's read into a Machine's `MachineInventory`;
//! - [`error_text`]: an error and its causes on one line, for messages.

pub mod error_text;
pub mod handler;
pub mod inventory;
pub mod leader;
pub mod probes;
pub mod provider;
pub mod release;
pub mod shutdown;
pub mod tokens;
