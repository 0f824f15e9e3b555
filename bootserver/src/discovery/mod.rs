//! Discovery (`unknownMachines: discover`): an unknown server boots the host OS in inspection
//! mode, its agent posts the in-band inventory here, and the bootserver records it as a
//! discovered Machine: provider `pxe`, the inventory's MACs, no configuration, phase
//! `Pending` with condition `Discovered` (reason `WaitingToBeClaimed`), and label
//! [`DISCOVERY_LABEL`]`=waiting` until an operator or a pool claims it.
//!
//! Discovery is an unauthenticated door onto the provisioning network, so [`decide`] — a pure
//! function over the report, the Machines known and the recent creations — bounds it before
//! anything is written:
//! - the body is at most [`DiscoveryLimits::max_body_bytes`] and the inventory passes
//!   `unbounded_api::inventory::validate` (lengths, characters, counts, numbers);
//! - at most [`DiscoveryLimits::creations_per_minute`] Machines are created in any minute, and
//!   at most [`DiscoveryLimits::max_unclaimed`] discovered Machines wait unclaimed;
//! - at most [`DiscoveryLimits::max_unclaimed_per_sender`] of them were sent from one
//!   sender (the /24 of the report's source address, recorded on the Machine so that the
//!   count is read back from the API after a restart): one network cannot fill the cap for
//!   every other;
//! - a discovered Machine is created with its **boot MAC only**: the one MAC the bootserver
//!   saw the sender hold ([`crate::identity`] vouches for the sender as that MAC before
//!   anything is decided). The report's other NICs are inventory facts, never the
//!   Machine's: a report cannot pre-register another server's MAC. A report whose boot MAC
//!   is a waiting Machine's updates that Machine's inventory (at most once a minute) and
//!   never its MACs; one that names a MAC of another Machine is refused, and one with a
//!   MAC of a declared or claimed Machine too (that machine's inventory comes from its own
//!   authenticated agent). A Machine's MACs change only by an operator;
//! - nothing here issues a credential: a discovered Machine has no configuration, and
//!   [`is_waiting`] is what the credential and boot-script paths check to refuse one.
//!
//! The name is `discovered-<boot MAC, 12 hex digits>`: the MAC the machine network-booted
//! from is unique on the provisioning network (two NICs with one MAC would already break
//! DHCP), always present, and the identity the bootserver already keys on. The SMBIOS UUID
//! and serial are not used: whitebox boards ship placeholder serials ("To Be Filled By
//! O.E.M.") and duplicated UUIDs. Both are kept in the inventory. A server whose boot NIC is
//! replaced is discovered again under a new name; the old Machine is deleted by hand.

use std::collections::BTreeSet;

use unbounded_api::inventory::{InventoryError, MachineInventorySpec, validate};

/// The condition a discovered Machine gets.
pub use unbounded_api::well_known::conditions::DISCOVERED as DISCOVERED_CONDITION;
/// [`DISCOVERY_LABEL`]'s value while nobody has claimed the Machine.
pub use unbounded_api::well_known::discovery::WAITING;
/// Whether a Machine's labels say it is discovered and unclaimed: such a Machine gets no
/// credentials and no machine boot script.
pub use unbounded_api::well_known::discovery::is_waiting;
/// The label a discovered Machine carries: `waiting` until claimed, then `claimed`.
pub use unbounded_api::well_known::labels::DISCOVERY as DISCOVERY_LABEL;
/// Its reason while unclaimed.
pub use unbounded_api::well_known::reasons::AWAITING_CLAIM as WAITING_REASON;
/// The kernel argument that starts the agent in inspection mode.
pub const INSPECT_KERNEL_ARG: &str = "unbounded.inspect=1";

mod settings;

pub use settings::{DiscoveryFile, DiscoveryLimits, DiscoverySettings};

/// A Machine the bootserver knows, as far as discovery cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownMachine {
    /// Its name.
    pub name: String,
    /// Its MACs, lower case.
    pub macs: BTreeSet<String>,
    /// Discovered and not claimed yet (label `discovery=waiting`).
    pub waiting: bool,
    /// When discovery last wrote its inventory (seconds on the decision's clock).
    pub last_report_at: Option<u64>,
    /// Who sent the report that created it ([`sender_of`]), as recorded on the Machine.
    pub sender: Option<String>,
}

/// One report: the inventory and the MAC the agent booted from.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Size of the request body.
    pub body_bytes: usize,
    /// The MAC the machine network-booted from (the agent's `BOOTIF`).
    pub boot_mac: String,
    /// What the agent collected.
    pub inventory: MachineInventorySpec,
    /// Who sent it ([`sender_of`]).
    pub sender: String,
}

/// The sender a report is counted against: the /24 of its source address (one segment
/// behind one relay, as DHCP sees it), or the whole address where it is IPv6.
pub fn sender_of(peer: std::net::IpAddr) -> String {
    match peer {
        std::net::IpAddr::V4(ip) => {
            let [a, b, c, _] = ip.octets();
            format!("{a}.{b}.{c}.0-24")
        }
        std::net::IpAddr::V6(ip) => ip.to_string().replace(':', "-"),
    }
}

/// What to do with a report.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Create the discovered Machine `name` with `macs` (its boot MAC) and its inventory.
    Create {
        /// The Machine's name.
        name: String,
        /// Its MACs, sorted.
        macs: Vec<String>,
    },
    /// Update the inventory of the discovered, unclaimed Machine `name`; its MACs stay.
    Update {
        /// The Machine's name.
        name: String,
        /// Its MACs (unchanged), sorted.
        macs: Vec<String>,
    },
    /// Write nothing.
    Refuse(Refusal),
}

/// Why a report was refused; each is also the `reason` label of the refusals metric and
/// maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Larger than the body limit (413).
    #[error("the report is larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The inventory breaks a limit (422).
    #[error("the inventory is invalid: {0}")]
    Invalid(InventoryError),
    /// The boot MAC is not a MAC, or not among the inventory's NICs (422).
    #[error("the boot MAC is not one of the inventory's NICs")]
    BootMacNotInInventory,
    /// A MAC belongs to a declared or claimed Machine (409).
    #[error("a MAC of the report belongs to Machine {0}, which is not waiting to be claimed")]
    Known(String),
    /// The MACs meet more than one Machine (409).
    #[error("the report's MACs belong to more than one Machine")]
    MacSetConflict,
    /// A MAC of the report belongs to a Machine that its boot MAC is not (409).
    #[error(
        "a MAC of the report belongs to Machine {0}, whose MACs do not include the report's boot MAC"
    )]
    OtherMachine(String),
    /// Too many discovered Machines from this sender wait unclaimed (429).
    #[error("{0} discovered Machines from this sender already wait to be claimed")]
    TooManyFromSender(usize),
    /// Too many creations in the last minute (429).
    #[error("too many Machines discovered in the last minute")]
    RateLimited,
    /// Too many discovered Machines wait unclaimed (429).
    #[error("{0} discovered Machines already wait to be claimed")]
    TooManyUnclaimed(usize),
    /// This Machine's inventory was written less than a minute ago (429).
    #[error("this Machine's inventory was written less than a minute ago")]
    TooSoon,
    /// More MACs than a Machine holds (`spec.pxe.macAddresses`, 422).
    #[error("the report has {0} MACs; a Machine holds at most {MAX_MACHINE_MACS}")]
    TooManyMacs(usize),
}

/// The most MACs a Machine holds (`spec.pxe.macAddresses`' `maxItems`).
pub const MAX_MACHINE_MACS: usize = 16;

impl Refusal {
    /// A fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Invalid(_) => "invalid",
            Self::BootMacNotInInventory => "boot_mac",
            Self::Known(_) => "known",
            Self::MacSetConflict => "mac_conflict",
            Self::OtherMachine(_) => "other_machine",
            Self::TooManyFromSender(_) => "too_many_from_sender",
            Self::RateLimited => "rate_limited",
            Self::TooManyUnclaimed(_) => "too_many_unclaimed",
            Self::TooSoon => "too_soon",
            Self::TooManyMacs(_) => "too_many_macs",
        }
    }

    /// The HTTP status that answers it: never 5xx (nothing here is the server's fault).
    /// 429 says "later may work"; the others say "this report never will".
    pub fn status(&self) -> u16 {
        match self {
            Self::TooLarge { .. } => 413,
            Self::Invalid(_) | Self::BootMacNotInInventory | Self::TooManyMacs(_) => 422,
            Self::Known(_) | Self::MacSetConflict | Self::OtherMachine(_) => 409,
            Self::RateLimited
            | Self::TooManyUnclaimed(_)
            | Self::TooManyFromSender(_)
            | Self::TooSoon => 429,
        }
    }
}

/// The name a discovered Machine gets from its boot MAC.
pub fn discovered_name(boot_mac: &str) -> String {
    format!(
        "discovered-{}",
        boot_mac.to_ascii_lowercase().replace(':', "")
    )
}

/// Where the Machine of a boot MAC stands, for the inspection agent's poll between reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// A discovered Machine with this MAC waits to be claimed.
    Waiting(String),
    /// A Machine with this MAC is not waiting (claimed, or declared by an operator).
    Claimed(String),
    /// No Machine has this MAC.
    Unknown,
}

/// Decides [`ClaimState`] for `boot_mac` (lower case) from the Machines that have it: a
/// Machine that is not waiting wins, as it does for a report ([`decide`]'s `known`).
pub fn claim_state(machines: &[KnownMachine], boot_mac: &str) -> ClaimState {
    let mut having = machines.iter().filter(|m| m.macs.contains(boot_mac));
    let first_waiting = having.clone().find(|m| m.waiting).map(|m| m.name.clone());
    match having.find(|m| !m.waiting) {
        Some(claimed) => ClaimState::Claimed(claimed.name.clone()),
        None => first_waiting.map_or(ClaimState::Unknown, ClaimState::Waiting),
    }
}

/// Decides what a report does. `recent_creations` are the times (seconds) Machines were
/// created by discovery; `now` is the same clock.
pub fn decide(
    limits: &DiscoveryLimits,
    machines: &[KnownMachine],
    recent_creations: &[u64],
    report: &Report,
    now: u64,
) -> Decision {
    use Decision::Refuse;
    if report.body_bytes > limits.max_body_bytes {
        return Refuse(Refusal::TooLarge {
            max: limits.max_body_bytes,
        });
    }
    if let Err(e) = validate(&report.inventory) {
        return Refuse(Refusal::Invalid(e));
    }
    let macs: BTreeSet<String> = report.inventory.mac_set().into_iter().collect();
    let boot_mac = report.boot_mac.to_ascii_lowercase();
    if !macs.contains(&boot_mac) {
        return Refuse(Refusal::BootMacNotInInventory);
    }
    if macs.len() > MAX_MACHINE_MACS {
        return Refuse(Refusal::TooManyMacs(macs.len()));
    }
    let met: Vec<&KnownMachine> = machines
        .iter()
        .filter(|m| !m.macs.is_disjoint(&macs))
        .collect();
    if let Some(known) = met.iter().find(|m| !m.waiting) {
        return Refuse(Refusal::Known(known.name.clone()));
    }
    match met.as_slice() {
        [] => {
            let unclaimed = machines.iter().filter(|m| m.waiting).count();
            if unclaimed >= limits.max_unclaimed {
                return Refuse(Refusal::TooManyUnclaimed(unclaimed));
            }
            let from_sender = machines
                .iter()
                .filter(|m| m.waiting && m.sender.as_deref() == Some(report.sender.as_str()))
                .count();
            if from_sender >= limits.max_unclaimed_per_sender {
                return Refuse(Refusal::TooManyFromSender(from_sender));
            }
            let last_minute = recent_creations
                .iter()
                .filter(|t| now.saturating_sub(**t) < 60)
                .count();
            if last_minute >= limits.creations_per_minute {
                return Refuse(Refusal::RateLimited);
            }
            let name = discovered_name(&boot_mac);
            // A Machine of that name with other MACs (its boot NIC moved to another server):
            // the MAC sets would overlap under one name; refuse rather than merge two servers.
            if machines.iter().any(|m| m.name == name) {
                return Refuse(Refusal::MacSetConflict);
            }
            // Only the boot MAC: the one the sender was vouched for as holding.
            Decision::Create {
                name,
                macs: vec![boot_mac],
            }
        }
        [one] => {
            // The report may describe its own Machine only: a MAC of another one (which a
            // sender could name to have it joined to a Machine it boots as) is refused.
            if !one.macs.contains(&boot_mac) {
                return Refuse(Refusal::OtherMachine(one.name.clone()));
            }
            if one
                .last_report_at
                .is_some_and(|t| now.saturating_sub(t) < 60)
            {
                return Refuse(Refusal::TooSoon);
            }
            Decision::Update {
                name: one.name.clone(),
                macs: one.macs.iter().cloned().collect(),
            }
        }
        _ => Refuse(Refusal::MacSetConflict),
    }
}

/// The iPXE script an unknown machine gets with discovery on: the host OS (`kernel_url`,
/// `initrd_url`, already absolute) in inspection mode, with the bootserver's URL and the MAC
/// it booted from, and no Machine name and no nonce: the inspection agent can only post its
/// inventory. `extra_args` (`discovery.boot.args`: a console, say) come before Unbounded's,
/// so that none of them shadows one (the kernel's last value wins). A value iPXE would
/// expand or cut (`$`, `#`, control characters) is refused.
pub fn inspection_script(
    kernel_url: &str,
    initrd_url: &str,
    extra_args: &[String],
    http_base: &str,
    boot_mac: &str,
) -> String {
    let mut args = vec!["initrd=initrd".to_owned()];
    args.extend(extra_args.iter().cloned());
    args.extend([
        INSPECT_KERNEL_ARG.to_owned(),
        format!("unbounded.bootserver={http_base}"),
        format!(
            "BOOTIF=01-{}",
            boot_mac.to_ascii_lowercase().replace(':', "-")
        ),
    ]);
    let unsafe_value = |v: &str| {
        v.chars()
            .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '$' | '#'))
    };
    if [kernel_url, initrd_url, http_base, boot_mac]
        .into_iter()
        .chain(extra_args.iter().map(String::as_str))
        .any(unsafe_value)
    {
        return crate::boot::refusal(
            "discovery: refusing a boot value with a space, a control character, '$' or '#'",
        );
    }
    format!(
        "#!ipxe\necho Unbounded: inspecting {boot_mac} (discovery)\nkernel {kernel_url} {}\ninitrd --name initrd {initrd_url}\nboot\n",
        args.join(" ")
    )
}

#[cfg(test)]
mod tests;
