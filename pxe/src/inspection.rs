//! The out-of-band inventory: for a Machine with a BMC, the bootserver (the PXE provider's
//! leader, which holds the BMC credentials) reads what the BMC holds about the machine
//! ([`crate::provider::PxeProvider::bmc_inventory`]) — a Redfish service's
//! ComputerSystem, Processors, Memory, Storage drives and EthernetInterfaces
//! ([`crate::power::redfish_inventory::parse`], sections tagged `Redfish`), or an IPMI BMC's
//! FRU device 0 ([`crate::power::ipmi_fru::parse`]: identity only, tagged `IpmiFru`) — and
//! folds it into the Machine's `MachineInventory` ([`unbounded_runtime::inventory::fold_into`]:
//! in-band sections outrank Redfish ones, which outrank FRU ones, so a read never clobbers
//! what a better source reported). The Machine's hardware labels follow the folded
//! inventory, so a pool can claim a machine that never booted.
//!
//! When ([`decide`], a pure function):
//! - once, on the first reconcile of a Machine with a BMC (the inventory records no read of
//!   that BMC's kind yet) — including a discovered Machine given a BMC when it is claimed;
//! - again when the Machine's `unbounded-cloud.io/reinspect` annotation holds a value the
//!   last read did not answer (the read records the value it answered, in the inventory's
//!   `reads`: nothing to remove, nothing repeated after a restart);
//! - never for a Machine the provider refuses (a terminal failure recorded, or a provider ID
//!   that names none of its MACs): its BMC may be another server's and is left alone;
//! - never in a loop: a failed read (BMC unreachable, refused credentials) is tried again
//!   after 30 s, doubling up to an hour, and only while a read is still wanted; a changed
//!   BMC address alone does not read again (ask with the annotation).
//!
//! A Machine without a BMC has only its in-band inventory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use unbounded_api::inventory::{FactSource, InventoryRead, MachineInventory};
use unbounded_api::well_known::annotations::REINSPECT;
use unbounded_api::{Machine, MachineProvider};

use crate::power::redfish_inventory;
use crate::provider::{BmcInventory, PxeProvider};

/// The field manager of the inventory and label writes.
pub const FIELD_MANAGER: &str = "unbounded-bootserver-redfish-inventory";

/// The first wait after a failed read; doubled per failure in a row up to [`MAX_RETRY`].
pub const FIRST_RETRY: Duration = Duration::from_secs(30);
/// The longest wait between failed reads.
pub const MAX_RETRY: Duration = Duration::from_secs(3600);

/// What [`decide`] looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts<'a> {
    /// The source the Machine's BMC reads as (`Redfish` or `IpmiFru`), `None` without a BMC.
    pub bmc: Option<FactSource>,
    /// The Machine is being deleted.
    pub deleting: bool,
    /// The provider refuses the Machine: a terminal failure is recorded, or its provider ID
    /// names none of its MACs (the BMC may be another server's, so it is left alone).
    pub refused: bool,
    /// The Machine's `unbounded-cloud.io/reinspect` value.
    pub reinspect: Option<&'a str>,
    /// The inventory's record of the last read of the BMC's kind, if any.
    pub last_read: Option<&'a InventoryRead>,
    /// Failed reads in a row and how long ago the last one ended.
    pub failures: Option<(u32, Duration)>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the Machine or its inventory changes.
    Idle,
    /// Read the BMC, answering this re-inspection value.
    Read {
        /// The annotation's value the read answers.
        reinspection: Option<String>,
    },
    /// A read is wanted, but the last one failed: look again after this long.
    RetryAfter(Duration),
}

/// The wait after `failures` failed reads in a row.
pub fn retry_wait(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

/// Whether (and when) to read a Machine's BMC.
pub fn decide(facts: &Facts<'_>) -> Next {
    if facts.bmc.is_none() || facts.deleting || facts.refused {
        return Next::Idle;
    }
    let wanted = match (facts.last_read, facts.reinspect) {
        (None, _) => true,
        (Some(read), Some(asked)) => read.reinspection.as_deref() != Some(asked),
        (Some(_), None) => false,
    };
    if !wanted {
        return Next::Idle;
    }
    if let Some((count, since)) = facts.failures {
        let wait = retry_wait(count);
        if since < wait {
            return Next::RetryAfter(wait - since);
        }
    }
    Next::Read {
        reinspection: facts.reinspect.map(str::to_owned),
    }
}

/// The source a Machine's BMC reads as, by its address's scheme: `Redfish` for
/// `redfish…://`, `IpmiFru` for `ipmi://`; `None` for a Machine without a BMC or not `pxe`.
fn bmc_source(machine: &Machine) -> Option<FactSource> {
    if machine.spec.provider != MachineProvider::Pxe {
        return None;
    }
    let address = &machine.spec.pxe.as_ref()?.bmc.as_ref()?.address;
    if address.starts_with("redfish") {
        Some(FactSource::Redfish)
    } else if address.starts_with("ipmi") {
        Some(FactSource::IpmiFru)
    } else {
        None
    }
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The BMC (or its credentials) failed.
    #[error("{0}")]
    Bmc(unbounded_runtime::provider::ProviderError),
    /// The documents are not a ComputerSystem's.
    #[error("{0}")]
    Parse(#[from] redfish_inventory::RedfishInventoryError),
    /// The FRU data cannot be read.
    #[error("{0}")]
    Fru(#[from] crate::power::ipmi_fru::FruError),
    /// Writing the inventory failed.
    #[error("{0}")]
    Write(#[from] unbounded_runtime::inventory::InventoryWriteError),
    /// Writing the hardware labels failed.
    #[error("writing the hardware labels of Machine {machine}: {source}")]
    Labels {
        /// The Machine.
        machine: String,
        /// What the API server said.
        source: kube::Error,
    },
    /// Reading the inventory failed.
    #[error("reading MachineInventory {name}: {source}")]
    Get {
        /// The inventory's name.
        name: String,
        /// What the API server said.
        source: kube::Error,
    },
}

struct Context {
    client: Client,
    provider: Arc<PxeProvider>,
    /// Failed reads in a row, by Machine, and when the last ended (not kept across restarts:
    /// a restart tries once more).
    failures: Mutex<HashMap<String, (u32, Instant)>>,
}

impl Context {
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u32, Instant)>> {
        // Plain values: usable after a panic elsewhere.
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reads, parses and folds one Machine's BMC inventory, then its hardware labels.
async fn read(
    ctx: &Context,
    machine: &Machine,
    reinspection: Option<String>,
) -> Result<(), ReadError> {
    let read = ctx
        .provider
        .bmc_inventory(machine)
        .await
        .map_err(ReadError::Bmc)?;
    let now = Time(unbounded_api::condition::now());
    let (sections, source) = match read {
        BmcInventory::Redfish(documents) => (
            redfish_inventory::parse(&documents, now.clone())?,
            FactSource::Redfish,
        ),
        BmcInventory::IpmiFru(bytes) => (
            crate::power::ipmi_fru::parse(&bytes, now.clone())?,
            FactSource::IpmiFru,
        ),
    };
    let record = InventoryRead {
        source,
        observed_at: now,
        reinspection,
    };
    let folded = unbounded_runtime::inventory::fold_into(
        &ctx.client,
        machine,
        sections,
        record,
        FIELD_MANAGER,
    )
    .await?;
    let labels = unbounded_api::inventory::labels::hardware_label_patch(machine.labels(), &folded);
    let changes = labels.iter().any(|(k, v)| match v {
        serde_json::Value::String(v) => machine.labels().get(k) != Some(v),
        _ => true,
    });
    if changes {
        Api::<Machine>::all(ctx.client.clone())
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": {"labels": labels}})),
            )
            .await
            .map_err(|source| ReadError::Labels {
                machine: machine.name_any(),
                source,
            })?;
    }
    Ok(())
}

async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, ReadError> {
    let name = machine.name_any();
    let bmc = bmc_source(&machine);
    let Some(source) = bmc else {
        ctx.failures().remove(&name);
        return Ok(Action::await_change());
    };
    let inventory = Api::<MachineInventory>::all(ctx.client.clone())
        .get_opt(&name)
        .await
        .map_err(|source| ReadError::Get {
            name: name.clone(),
            source,
        })?;
    let failures = ctx
        .failures()
        .get(&name)
        .map(|(count, at)| (*count, at.elapsed()));
    let facts = Facts {
        bmc,
        deleting: machine.metadata.deletion_timestamp.is_some(),
        refused: machine
            .status
            .as_ref()
            .is_some_and(|s| s.failure_reason.is_some())
            || crate::provider::check_identity(&machine).is_err(),
        reinspect: machine.annotations().get(REINSPECT).map(String::as_str),
        last_read: inventory.as_ref().and_then(|i| i.spec.read_of(source)),
        failures,
    };
    match decide(&facts) {
        Next::Idle => Ok(Action::await_change()),
        Next::RetryAfter(wait) => Ok(Action::requeue(wait)),
        Next::Read { reinspection } => match read(&ctx, &machine, reinspection).await {
            Ok(()) => {
                ctx.failures().remove(&name);
                tracing::info!(machine = %name, ?source, "read the inventory from the BMC");
                Ok(Action::await_change())
            }
            Err(error) => {
                let count = {
                    let mut failures = ctx.failures();
                    let entry = failures.entry(name.clone()).or_insert((0, Instant::now()));
                    *entry = (entry.0.saturating_add(1), Instant::now());
                    entry.0
                };
                // The error names the BMC by address only, never a credential.
                tracing::warn!(machine = %name, %error, failures = count, "reading the inventory from the BMC failed");
                Ok(Action::requeue(retry_wait(count)))
            }
        },
    }
}

fn error_policy(_machine: Arc<Machine>, error: &ReadError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "Redfish inventory: reconcile failed");
    Action::requeue(FIRST_RETRY)
}

/// Reads the BMC inventories of `pxe` Machines, through `provider`'s drivers, until the
/// watch ends. Run by the PXE provider's leader ([`crate::run`]).
pub async fn run(client: Client, provider: Arc<PxeProvider>) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        provider,
        failures: Mutex::new(HashMap::new()),
    });
    Controller::new(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<MachineInventory>::all(client),
        watcher::Config::default(),
    )
    .run(reconcile, error_policy, ctx)
    .for_each(|_| futures::future::ready(()))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(reinspection: Option<&str>) -> InventoryRead {
        InventoryRead {
            source: FactSource::Redfish,
            observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            reinspection: reinspection.map(str::to_owned),
        }
    }

    #[test]
    fn when_the_bmc_is_read() {
        let done = read(None);
        let answered_a = read(Some("a"));
        let base = Facts {
            bmc: Some(FactSource::Redfish),
            deleting: false,
            refused: false,
            reinspect: None,
            last_read: None,
            failures: None,
        };
        let read_now = |r: Option<&str>| Next::Read {
            reinspection: r.map(str::to_owned),
        };
        let secs = Duration::from_secs;
        let cases = [
            ("first reconcile with a BMC", base.clone(), read_now(None)),
            (
                "first reconcile, a request already there",
                Facts {
                    reinspect: Some("a"),
                    ..base.clone()
                },
                read_now(Some("a")),
            ),
            (
                "read once, nothing asked",
                Facts {
                    last_read: Some(&done),
                    ..base.clone()
                },
                Next::Idle,
            ),
            (
                "asked again with a new value",
                Facts {
                    last_read: Some(&answered_a),
                    reinspect: Some("b"),
                    ..base.clone()
                },
                read_now(Some("b")),
            ),
            (
                "the value was answered: never again (restarts included)",
                Facts {
                    last_read: Some(&answered_a),
                    reinspect: Some("a"),
                    ..base.clone()
                },
                Next::Idle,
            ),
            (
                "no BMC",
                Facts {
                    bmc: None,
                    ..base.clone()
                },
                Next::Idle,
            ),
            (
                "being deleted",
                Facts {
                    deleting: true,
                    ..base.clone()
                },
                Next::Idle,
            ),
            (
                "refused by the provider (terminal failure or foreign provider ID)",
                Facts {
                    refused: true,
                    reinspect: Some("a"),
                    ..base.clone()
                },
                Next::Idle,
            ),
            (
                "failed once 10 s ago: wait 20 s more",
                Facts {
                    failures: Some((1, secs(10))),
                    ..base.clone()
                },
                Next::RetryAfter(secs(20)),
            ),
            (
                "failed three times, 2 min ago: 120 s is due",
                Facts {
                    failures: Some((3, secs(120))),
                    ..base.clone()
                },
                read_now(None),
            ),
            (
                "failures do not matter once nothing is wanted",
                Facts {
                    last_read: Some(&done),
                    failures: Some((9, secs(0))),
                    ..base.clone()
                },
                Next::Idle,
            ),
        ];
        for (case, facts, want) in cases {
            assert_eq!(decide(&facts), want, "{case}");
        }
    }

    #[test]
    fn retries_back_off_to_an_hour() {
        let waits: Vec<u64> = [1, 2, 3, 7, 8, 40]
            .into_iter()
            .map(|n| retry_wait(n).as_secs())
            .collect();
        assert_eq!(waits, vec![30, 60, 120, 1920, 3600, 3600]);
    }
}
