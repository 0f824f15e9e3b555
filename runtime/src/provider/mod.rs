//! The Provider contract (Cluster API's actuator, in Rust) and the reconcile loop that
//! calls it, written once for every provider (PXE in the bootserver, Azure in `azure`).
//!
//! The loop owns the provider's finalizer, its status fields (`status.power`,
//! `status.addresses`, condition `InfrastructureReady`, written with server-side apply under
//! the provider's field manager) and the backoff. A provider only answers:
//! - [`Provider::create`]: make the infrastructure exist and run (PXE: one-time network boot
//!   and power on). Called until it has succeeded once (`InfrastructureReady=True`).
//! - [`Provider::observe`]: what the infrastructure looks like now (PXE: power state),
//!   polled every [`Settings::poll`].
//! - [`Provider::delete`]: release it (PXE: power off; Azure: delete the VM, its NIC and
//!   disk). Called when the Machine is being deleted and its Node is gone (the controller
//!   drains and deletes the Node first), if [`Provider::must_release`] says so (by default:
//!   if it was ever provisioned, so a Machine whose BMC never answered is released at once).
//!
//! An observation may carry the infrastructure's provider ID: the loop records it in
//! `spec.providerID` when that is unset (and reports a mismatch when it differs). An
//! observation that finds the provisioned infrastructure gone ([`ProviderError::gone`])
//! turns `InfrastructureReady` False, so the loop calls `create` again, which decides
//! whether to recreate it (the Azure provider does not: it reports).
//!
//! Before `delete`, the disks: a Machine whose configuration wipes them on release is
//! powered off only once its agent reported them wiped, or held with the condition
//! `DisksWiped=False` (`WipeFailed`, `WipeTimedOut`) and its finalizer kept
//! ([`crate::release`] decides; [`Settings::wipe_timeouts`] bound the wait).
//!
//! Waiting for the Node is not a failure: it is retried every [`Settings::wait`] without
//! growing the backoff, and the loop watches Nodes, so a deleted Machine is released as soon
//! as its Node is gone.
//!
//! Every call must be idempotent. An error has a reason and a message for a person; it
//! never carries a credential, since both end up in the Machine's status and Events.
//!
//! ## Terminal failures
//!
//! Almost every failure is retried with the backoff and shows only as the
//! `InfrastructureReady` condition's reason: a BMC that times out, refuses the password or
//! is busy, a missing Secret, an API server hiccup, an Azure quota or throttling, a resource
//! group not created yet. Those can all heal without anyone touching the Machine, and a
//! Machine marked failed for them would be a false alarm that needs a person.
//!
//! A failure is terminal ([`ProviderError::terminal`]) only when the Machine's own spec, as
//! it is, can never be provisioned, so that retrying is pointless: the loop then writes
//! `status.failureReason` and `status.failureMessage` (the controller shows the phase
//! `Failed`), sets `InfrastructureReady=False` with the same reason for the Machine's
//! current generation, and stops calling the provider for it. A change of the spec (a new
//! `metadata.generation`) clears the failure and the loop tries again; deletion works as
//! for any Machine. The terminal reasons:
//! - `ProviderIDMismatch` (every provider): `spec.providerID`, immutable once set, names
//!   other infrastructure than the one the provider finds or creates for the Machine
//!   (a PXE Machine whose ID names none of its MACs, an Azure Machine whose spec now
//!   points at another VM);
//! - `BmcAddressInvalid` (PXE): the BMC address or CA bundle passes the CRD's checks but
//!   cannot be used (a port out of range, a Redfish path that names no system, credentials
//!   in the address, a CA bundle that is not PEM);
//! - `AzureInvalidParameter` (Azure), when Azure Resource Manager answers `400` to the
//!   request as specified (a VM size or image that does not exist): the same request is
//!   refused every time. `SkuNotAvailable` is not terminal (capacity and regional
//!   restrictions change), nor is any other Azure error.
//!
//! ## Where it lives
//!
//! `contract` (the trait, what a provider reports, [`next_step`]), `pacing` ([`Settings`],
//! [`LoopError`] and the wait after each), `provider_id` (recording `spec.providerID`),
//! `status` (the provider's status fields, by server-side apply) and `run` (the loop:
//! [`run`], [`run_with_operations`]); all used through this module.

mod contract;
mod pacing;
mod provider_id;
mod run;
mod status;

pub use contract::{Observed, Provider, ProviderError, Step, next_step};
pub use pacing::{LoopError, Settings, backoff, requeue_after};
pub use provider_id::{ProviderIdAction, provider_id_action};
pub use run::{run, run_with_operations};
