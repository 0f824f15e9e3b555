//! Where the machine's own report contradicts its BMC.
//!
//! What the agent reports in band comes from the OS of whoever answers on the machine's
//! address, which the BMC's reading does not: so in band never replaces a section the BMC
//! read ([`super::outranks`]). When an in-band read says something else about a section
//! the BMC has read, the two views are kept apart, the difference is recorded in
//! `spec.disagreements`, and the Machine carries the label
//! `hardware.unbounded-cloud.io/disputed: "true"`, which keeps it out of every
//! hardware-requirement claim ([`super::HardwareRequirements::admits`]) and every pool's
//! free inventory until an operator resolves it: corrects the BMC, replaces the hardware,
//! or removes the disagreement (`kubectl patch mi <name> --type=json -p
//! '[{"op":"remove","path":"/spec/disagreements"}]'`, which the next in-band read that
//! still differs records again).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CpuFacts, FactSource, MachineInventorySpec, MemoryFacts, SystemFacts};

/// One section where the in-band report and the BMC differ.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disagreement {
    /// The section: `cpu`, `memory` or `system`.
    #[schemars(length(max = 16))]
    pub section: String,
    /// What the BMC read.
    #[schemars(length(max = 256))]
    pub bmc: String,
    /// What the in-band report said.
    #[schemars(length(max = 256))]
    pub in_band: String,
}

/// Memory sizes within this fraction (or 1 GiB) agree: the OS sees less than is installed
/// (firmware and kernel reservations), a BMC rounds.
const MEMORY_TOLERANCE_PERCENT: i64 = 10;

fn is_bmc(source: FactSource) -> bool {
    matches!(source, FactSource::Redfish | FactSource::IpmiFru)
}

fn cpu_summary(cpu: &CpuFacts) -> String {
    format!("{} {} threads", cpu.architecture, cpu.threads)
}

fn cpu_differs(bmc: &CpuFacts, in_band: &CpuFacts) -> bool {
    (bmc.threads > 0 && bmc.threads != in_band.threads)
        || (!bmc.architecture.is_empty() && bmc.architecture != in_band.architecture)
}

fn memory_differs(bmc: &MemoryFacts, in_band: &MemoryFacts) -> bool {
    let (a, b) = (bmc.total_bytes, in_band.total_bytes);
    let slack = (a.max(b) / 100 * MEMORY_TOLERANCE_PERCENT).max(1 << 30);
    a > 0 && (a - b).abs() > slack
}

fn system_summary(system: &SystemFacts) -> String {
    let part = |v: &Option<String>| v.as_deref().unwrap_or("-").to_owned();
    format!(
        "vendor {} product {} serial {}",
        part(&system.vendor),
        part(&system.product),
        part(&system.serial)
    )
    .chars()
    .take(256)
    .collect()
}

fn system_differs(bmc: &SystemFacts, in_band: &SystemFacts) -> bool {
    let differs = |a: &Option<String>, b: &Option<String>| match (a, b) {
        (Some(a), Some(b)) => !a.trim().eq_ignore_ascii_case(b.trim()),
        _ => false,
    };
    differs(&bmc.serial, &in_band.serial)
        || differs(&bmc.vendor, &in_band.vendor)
        || differs(&bmc.product, &in_band.product)
}

/// The disagreements between the BMC's sections `held` and an in-band `read` (only the
/// sections both have, the held one from a BMC).
pub fn between(held: &MachineInventorySpec, read: &MachineInventorySpec) -> Vec<Disagreement> {
    let mut found = Vec::new();
    let mut note = |section: &str, bmc: String, in_band: String| {
        found.push(Disagreement {
            section: section.to_owned(),
            bmc,
            in_band,
        });
    };
    if let (Some(b), Some(i)) = (&held.cpu, &read.cpu)
        && is_bmc(b.origin.source)
        && cpu_differs(b, i)
    {
        note("cpu", cpu_summary(b), cpu_summary(i));
    }
    if let (Some(b), Some(i)) = (&held.memory, &read.memory)
        && is_bmc(b.origin.source)
        && memory_differs(b, i)
    {
        note(
            "memory",
            format!("{} bytes", b.total_bytes),
            format!("{} bytes", i.total_bytes),
        );
    }
    if let (Some(b), Some(i)) = (&held.system, &read.system)
        && is_bmc(b.origin.source)
        && system_differs(b, i)
    {
        note("system", system_summary(b), system_summary(i));
    }
    found
}
