//! The shell of discovery: a report posted to `POST /discovery/inventory` is decided by
//! [`discovery::decide`] over what the Kubernetes backend's index knows (a bounded view:
//! [`KubeBackend::discovery_view`]) and what this bootserver wrote itself in the last minutes
//! (its watch may not show those yet), and the decision is written:
//!
//! - **Create**: the Machine `discovered-<boot MAC>` (provider `pxe`, the MACs, architecture
//!   and firmware from the inventory, label `unbounded-cloud.io/discovery=waiting` and the
//!   hardware labels), its status (phase `Pending`, condition `Discovered=True`, reason
//!   `WaitingToBeClaimed`) and its `MachineInventory` (owned by it);
//! - **Update**: the inventory of the one waiting Machine the report's MACs meet, and its MACs
//!   and hardware labels, with a merge patch bound to the `resourceVersion` at which the
//!   index saw it `waiting` (an operator or a pool that claimed it meanwhile wins: the API
//!   server answers 409 and nothing changes);
//! - **Refuse**: nothing is written; the answer is the refusal's 4xx.
//!
//! Reports are decided and written one at a time (one lock), so that the per-minute rate and
//! the cap on waiting Machines hold whatever the concurrency. Every section of the inventory
//! is tagged `InBand` and stamped with the time the bootserver received it: the report's own
//! claims of source and time are not kept.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use unbounded_api::inventory::{DiscoveryReport, FactOrigin, FactSource, hardware_labels};
use unbounded_api::{Architecture, Machine};

use crate::backend::MacAddr;
use crate::discovery::{self, Decision, DiscoveryLimits, KnownMachine, Refusal, Report};
use crate::kube_backend::KubeBackend;

/// The field manager of discovery's writes.
pub const FIELD_MANAGER: &str = "unbounded-bootserver-discovery";

/// How long this bootserver remembers its own writes: longer than the decision's one-minute
/// windows, and than its watch takes to show them.
const REMEMBER_SECONDS: u64 = 300;

/// What a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The Machine was created.
    Created(String),
    /// The Machine's inventory was updated.
    Updated(String),
}

/// Why a report wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The decision refused it.
    #[error(transparent)]
    Refused(Refusal),
    /// The boot MAC is not a MAC address.
    #[error("bootMac {0:?} is not a MAC address")]
    BootMac(String),
    /// A Machine of the name exists although the index does not know it yet.
    #[error("a Machine named {0} exists already")]
    NameTaken(String),
    /// The Machine was claimed (or changed) between the decision and the write.
    #[error("Machine {0} was claimed or changed meanwhile; nothing was written")]
    ClaimedMeanwhile(String),
    /// The Machine this bootserver created is not in its cache yet.
    #[error("Machine {0} is not in the bootserver's cache yet; retry shortly")]
    NotCached(String),
    /// The API server refused the object as invalid (our validation let it through).
    #[error("the API server refused the {what}: {source}")]
    Rejected {
        /// `Machine` or `MachineInventory`.
        what: &'static str,
        /// The API server's message, or the error that kept the object from being built.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server failed; the report may be sent again.
    #[error("the API server failed: {0}")]
    Kube(#[source] kube::Error),
}

impl DiscoveryError {
    /// The HTTP status: 4xx for what the report did, 503 only for the API server's failure.
    pub fn status(&self) -> u16 {
        match self {
            Self::Refused(refusal) => refusal.status(),
            Self::BootMac(_) | Self::Rejected { .. } => 422,
            Self::NameTaken(_) | Self::ClaimedMeanwhile(_) => 409,
            Self::Kube(_) | Self::NotCached(_) => 503,
        }
    }

    /// A fixed metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Refused(refusal) => refusal.label(),
            Self::BootMac(_) => "boot_mac",
            Self::NameTaken(_) => "name_taken",
            Self::ClaimedMeanwhile(_) => "claimed_meanwhile",
            Self::Rejected { .. } => "rejected",
            Self::Kube(_) => "api_error",
            Self::NotCached(_) => "not_cached",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What this bootserver wrote lately.
#[derive(Debug, Default)]
struct Memory {
    /// When it created Machines (seconds).
    creations: VecDeque<u64>,
    /// The Machines it wrote: when, with which MACs, and for which sender.
    written: HashMap<String, (u64, BTreeSet<String>, String)>,
}

impl Memory {
    fn forget_before(&mut self, horizon: u64) {
        while self.creations.front().is_some_and(|t| *t < horizon) {
            self.creations.pop_front();
        }
        self.written.retain(|_, (at, _, _)| *at >= horizon);
    }

    /// The index's view completed with our own writes: a Machine we wrote and the index
    /// does not show yet is there (waiting), and each Machine we wrote has its time.
    fn complete(&self, mut view: Vec<KnownMachine>, macs: &BTreeSet<String>) -> Vec<KnownMachine> {
        for machine in &mut view {
            if let Some((at, _, _)) = self.written.get(&machine.name) {
                machine.last_report_at = Some(*at);
            }
        }
        for (name, (at, written_macs, sender)) in &self.written {
            if view.iter().any(|m| &m.name == name) || written_macs.is_disjoint(macs) {
                continue;
            }
            view.push(KnownMachine {
                name: name.clone(),
                macs: written_macs.clone(),
                waiting: true,
                last_report_at: Some(*at),
                sender: Some(sender.clone()),
            });
        }
        view
    }
}

/// Decides and writes discovery reports.
pub struct DiscoveryWriter {
    client: Client,
    backend: Arc<KubeBackend>,
    limits: DiscoveryLimits,
    memory: tokio::sync::Mutex<Memory>,
    outcomes: Family<OutcomeLabel, Counter>,
}

impl std::fmt::Debug for DiscoveryWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryWriter")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn rejected_or_failed(what: &'static str, error: kube::Error) -> DiscoveryError {
    match &error {
        kube::Error::Api(status) if status.code == 422 || status.code == 400 => {
            DiscoveryError::Rejected {
                what,
                source: status.message.clone().into(),
            }
        }
        _ => DiscoveryError::Kube(error),
    }
}

impl DiscoveryWriter {
    /// A writer over the cluster's Machines.
    pub fn new(client: Client, backend: Arc<KubeBackend>, limits: DiscoveryLimits) -> Self {
        Self {
            client,
            backend,
            limits,
            memory: tokio::sync::Mutex::default(),
            outcomes: Family::default(),
        }
    }

    /// The bounds it decides with.
    pub fn limits(&self) -> &DiscoveryLimits {
        &self.limits
    }

    /// Registers `unbounded_bootserver_discovery_reports{outcome}`: `created`, `updated`, or
    /// the refusal's reason.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("unbounded_bootserver")
            .register(
                "discovery_reports",
                "Discovery reports, by outcome (created, updated, or why refused)",
                self.outcomes.clone(),
            );
    }

    /// Counts one report with the outcome `label` (the shell counts what it refuses before
    /// [`DiscoveryWriter::report`]: a body too large, not JSON, from the wrong address).
    pub fn count_outcome(&self, label: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabel { outcome: label })
            .inc();
    }

    /// Where the Machine of `boot_mac` stands (from the bootserver's Machine index; no API
    /// call), for the inspection agent's poll between reports.
    pub fn claim_state(&self, boot_mac: MacAddr) -> discovery::ClaimState {
        let view = self.backend.discovery_view(
            &[boot_mac],
            &discovery::discovered_name(&boot_mac.to_string()),
        );
        discovery::claim_state(&view, &boot_mac.to_string())
    }

    /// Decides and writes one report of `body_bytes` bytes from `sender`
    /// ([`discovery::sender_of`]).
    pub async fn report(
        &self,
        report: DiscoveryReport,
        body_bytes: usize,
        sender: String,
    ) -> Result<Outcome, DiscoveryError> {
        let result = self.decide_and_write(report, body_bytes, sender).await;
        self.count_outcome(match &result {
            Ok(Outcome::Created(_)) => "created",
            Ok(Outcome::Updated(_)) => "updated",
            Err(error) => error.label(),
        });
        result
    }

    async fn decide_and_write(
        &self,
        report: DiscoveryReport,
        body_bytes: usize,
        sender: String,
    ) -> Result<Outcome, DiscoveryError> {
        let boot_mac: MacAddr = report
            .boot_mac
            .parse()
            .map_err(|_| DiscoveryError::BootMac(report.boot_mac.chars().take(64).collect()))?;
        let DiscoveryReport {
            inventory,
            endorsement_key,
            ..
        } = report;
        let endorsement_key = match endorsement_key {
            Some(key) if unbounded_api::inventory::is_tpm_name(&key) => {
                Some(key.to_ascii_lowercase())
            }
            Some(_) => {
                return Err(DiscoveryError::Rejected {
                    what: "report",
                    source: "endorsementKey is not a TPM name (000b and 64 hex digits)".into(),
                });
            }
            None => None,
        };
        let report = Report {
            body_bytes,
            boot_mac: boot_mac.to_string(),
            inventory,
            sender,
        };
        let macs: BTreeSet<String> = report.inventory.mac_set().into_iter().collect();
        let parsed: Vec<MacAddr> = macs.iter().filter_map(|m| m.parse().ok()).collect();
        let name = discovery::discovered_name(&report.boot_mac);

        let mut memory = self.memory.lock().await;
        let now = now_unix();
        memory.forget_before(now.saturating_sub(REMEMBER_SECONDS));
        let view = memory.complete(self.backend.discovery_view(&parsed, &name), &macs);
        let creations: Vec<u64> = memory.creations.iter().copied().collect();
        let decision = discovery::decide(&self.limits, &view, &creations, &report, now);
        let mut inventory = report.inventory;
        inventory.stamp(&FactOrigin {
            source: FactSource::InBand,
            observed_at: Time(unbounded_api::condition::now()),
        });
        match decision {
            Decision::Refuse(refusal) => Err(DiscoveryError::Refused(refusal)),
            Decision::Create { name, macs } => {
                // Counted before the write: a create that failed half-way still spent its
                // place in the minute (the rate bounds attempts on the API server too).
                memory.creations.push_back(now);
                self.create(
                    &name,
                    &macs,
                    &report.sender,
                    endorsement_key.as_deref(),
                    inventory,
                )
                .await?;
                memory.written.insert(
                    name.clone(),
                    (now, macs.into_iter().collect(), report.sender.clone()),
                );
                tracing::info!(machine = %name, "discovery: created a Machine waiting to be claimed");
                Ok(Outcome::Created(name))
            }
            Decision::Update { name, macs } => {
                self.update(&name, &macs, inventory).await?;
                memory.written.insert(
                    name.clone(),
                    (now, macs.into_iter().collect(), report.sender.clone()),
                );
                tracing::info!(machine = %name, "discovery: updated the inventory of a waiting Machine");
                Ok(Outcome::Updated(name))
            }
        }
    }

    async fn create(
        &self,
        name: &str,
        macs: &[String],
        sender: &str,
        endorsement_key: Option<&str>,
        inventory: unbounded_api::inventory::MachineInventorySpec,
    ) -> Result<(), DiscoveryError> {
        let mut labels = hardware_labels(&inventory);
        labels.insert(
            discovery::DISCOVERY_LABEL.to_owned(),
            discovery::WAITING.to_owned(),
        );
        let architecture = match inventory.cpu.as_ref().map(|c| c.architecture.as_str()) {
            Some("aarch64" | "arm64") => Architecture::Arm64,
            _ => Architecture::X86_64,
        };
        let firmware = inventory
            .firmware
            .as_ref()
            .map(|f| f.mode)
            .unwrap_or_default();
        let mut machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {unbounded_api::well_known::annotations::DISCOVERED_FROM: sender},
            },
            "spec": {
                "provider": "pxe",
                "pxe": {"macAddresses": macs, "architecture": architecture, "firmware": firmware},
            },
        }))
        .map_err(|e| DiscoveryError::Rejected {
            what: "Machine",
            source: e.into(),
        })?;
        // Learned at discovery: the TPM the inspection read is the one this Machine attests
        // with once claimed (a report's word, as trust on first use is: docs/security.md).
        if let (Some(key), Some(pxe)) = (endorsement_key, machine.spec.pxe.as_mut()) {
            pxe.identity = Some(unbounded_api::identity::IdentitySpec {
                endorsement_key: Some(key.to_owned()),
                ..Default::default()
            });
        }
        let machines = Api::<Machine>::all(self.client.clone());
        let created = match machines
            .create(
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PostParams::default()
                },
                &machine,
            )
            .await
        {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Err(DiscoveryError::NameTaken(name.to_owned()));
            }
            Err(error) => return Err(rejected_or_failed("Machine", error)),
        };
        let condition = unbounded_api::condition::new_condition(
            discovery::DISCOVERED_CONDITION,
            true,
            discovery::WAITING_REASON,
            "discovered by network boot; claim it (label unbounded-cloud.io/discovery=claimed, or a MachinePool) to provision it",
            None,
        );
        let status = serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "status": {"phase": "Pending", "conditions": [condition]},
        });
        machines
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&status),
            )
            .await
            .map_err(|e| rejected_or_failed("Machine status", e))?;
        self.write_inventory(&created, inventory).await
    }

    async fn update(
        &self,
        name: &str,
        macs: &[String],
        inventory: unbounded_api::inventory::MachineInventorySpec,
    ) -> Result<(), DiscoveryError> {
        let Some(seen) = self.backend.machine(name) else {
            return Err(DiscoveryError::NotCached(name.to_owned()));
        };
        if !discovery::is_waiting(seen.labels()) {
            return Err(DiscoveryError::ClaimedMeanwhile(name.to_owned()));
        }
        let labels =
            unbounded_api::inventory::labels::hardware_label_patch(seen.labels(), &inventory);
        // Bound to the version at which the index saw it waiting: a claim since then makes
        // the API server answer 409, and nothing changes.
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": seen.resource_version(), "labels": labels},
            "spec": {"pxe": {"macAddresses": macs}},
        });
        let machines = Api::<Machine>::all(self.client.clone());
        let machine = match machines
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(machine) => machine,
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                return Err(DiscoveryError::ClaimedMeanwhile(name.to_owned()));
            }
            Err(error) => return Err(rejected_or_failed("Machine", error)),
        };
        self.write_inventory(&machine, inventory).await
    }

    /// Folds the in-band report into the MachineInventory of `machine` (created, owned by
    /// it, when absent), by the rule every source's writer follows
    /// ([`unbounded_runtime::inventory::fold_into`]).
    async fn write_inventory(
        &self,
        machine: &Machine,
        spec: unbounded_api::inventory::MachineInventorySpec,
    ) -> Result<(), DiscoveryError> {
        let record = unbounded_api::inventory::InventoryRead {
            source: FactSource::InBand,
            observed_at: Time(unbounded_api::condition::now()),
            reinspection: None,
        };
        unbounded_runtime::inventory::fold_into(&self.client, machine, spec, record, FIELD_MANAGER)
            .await
            .map(drop)
            .map_err(|error| match error {
                unbounded_runtime::inventory::InventoryWriteError::Kube { source, .. } => {
                    rejected_or_failed("MachineInventory", source)
                }
                other => DiscoveryError::Rejected {
                    what: "MachineInventory",
                    source: other.into(),
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(name: &str, macs: &[&str]) -> KnownMachine {
        KnownMachine {
            name: name.into(),
            macs: macs.iter().map(|m| (*m).to_owned()).collect(),
            waiting: true,
            last_report_at: None,
            sender: None,
        }
    }

    /// A Machine this bootserver wrote and its watch does not show yet still counts: a second
    /// report of its MACs is an update (too soon), not a second Machine.
    #[test]
    fn own_writes_complete_the_index_view() {
        let mut memory = Memory::default();
        memory.written.insert(
            "discovered-a".into(),
            (100, ["aa:00:00:00:00:01".to_owned()].into(), "s".into()),
        );
        memory.written.insert(
            "discovered-b".into(),
            (90, ["bb:00:00:00:00:01".to_owned()].into(), "s".into()),
        );
        let macs: BTreeSet<String> = ["aa:00:00:00:00:01".to_owned()].into();
        let view = memory.complete(vec![known("discovered-b", &["bb:00:00:00:00:01"])], &macs);
        let summary: Vec<(&str, Option<u64>)> = view
            .iter()
            .map(|m| (m.name.as_str(), m.last_report_at))
            .collect();
        assert_eq!(
            summary,
            vec![("discovered-b", Some(90)), ("discovered-a", Some(100))]
        );
        memory.creations.extend([10, 200]);
        memory.forget_before(100);
        assert_eq!(memory.creations, [200]);
        assert!(memory.written.contains_key("discovered-a"));
        assert!(!memory.written.contains_key("discovered-b"));
    }
}
