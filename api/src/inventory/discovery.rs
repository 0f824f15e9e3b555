//! What an inspection agent and the bootserver's discovery routes say to each other: the
//! routes, the refusal header, and the report.

use serde::{Deserialize, Serialize};

use super::MachineInventorySpec;

/// The bootserver's route an inspection agent posts its [`DiscoveryReport`] to.
pub const DISCOVERY_REPORT_PATH: &str = "/discovery/inventory";

/// The bootserver's route an inspection agent polls between reports: `GET
/// /discovery/claim/<boot MAC>` answers 200 while the machine's Machine waits, 409 with
/// [`REFUSAL_HEADER`] `known` once it is claimed (the agent reboots into its own boot), and
/// 404 when no Machine has the MAC (the agent reports again).
pub const DISCOVERY_CLAIM_PATH: &str = "/discovery/claim";

/// The response header that names why the bootserver refused a report (a fixed label such
/// as `known`, `rate_limited`, `invalid`).
pub const REFUSAL_HEADER: &str = "unbounded-refusal";

/// What the agent in inspection mode posts to the bootserver's discovery route: its inventory
/// and the MAC it network-booted from. Nothing in it authenticates the machine; the
/// bootserver bounds what it can do (`bootserver/src/discovery/`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryReport {
    /// The MAC the machine network-booted from (the kernel's `BOOTIF`).
    pub boot_mac: String,
    /// What the agent read.
    pub inventory: MachineInventorySpec,
    /// The TPM name of the machine's endorsement key, where it has a TPM: recorded on the
    /// Machine discovery creates (`spec.pxe.identity.endorsementKey`), so that the machine,
    /// once claimed, attests with that TPM and no other (`crate::identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endorsement_key: Option<String>,
}

/// Whether `name` is a TPM name of a SHA-256 key: `000b` and 64 hex digits.
pub fn is_tpm_name(name: &str) -> bool {
    name.len() == 68
        && name
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("000b"))
        && name.bytes().all(|b| b.is_ascii_hexdigit())
}
