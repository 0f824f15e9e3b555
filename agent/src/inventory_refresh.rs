//! The running agent's in-band inventory: once each time the agent starts (hardware changes
//! need a power cycle, which restarts it), and again when its Machine's
//! `unbounded-cloud.io/reinspect` holds a value this agent has not answered. The read
//! ([`crate::inventory::collect_live`]: `/proc`, `/sys` and up to 35 s of LLDP) runs in
//! the background, one at a time, and is folded into the Machine's `MachineInventory` by the
//! rule every source follows ([`unbounded_runtime::inventory::fold_into`]: in-band sections
//! outrank Redfish ones), tagged `InBand` with the time and the request value it answered.
//!
//! The agent may write only its own MachineInventory (its role names it), and the admission
//! policy `unbounded-agent-writes` lets it write only in-band sections: it cannot forge what
//! the BMC said.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, ResourceExt};
use unbounded_api::Machine;
use unbounded_api::inventory::{FactSource, InventoryRead};
use unbounded_api::well_known::annotations::REINSPECT;

/// The field manager of the agent's inventory writes.
pub const FIELD_MANAGER: &str = "unbounded-agent-inventory";

/// Whether to read the machine now, and which request value the read answers: always on
/// the first look of this run (`answered` is `None`), then only for a request value that
/// this run has not answered.
pub fn refresh_due(
    answered: Option<&Option<String>>,
    reinspect: Option<&str>,
) -> Option<Option<String>> {
    let asked = reinspect.map(str::to_owned);
    match answered {
        None => Some(asked),
        Some(done) if asked.is_some() && *done != asked => Some(asked),
        Some(_) => None,
    }
}

/// Starts in-band reads as [`refresh_due`] says, one at a time.
#[derive(Debug, Default)]
pub struct Refresher {
    /// The request value of the last read started in this run (`None`: none started).
    answered: std::sync::Mutex<Option<Option<String>>>,
    running: Arc<AtomicBool>,
}

impl Refresher {
    /// Looks at the Machine and starts a read in the background if one is due and none runs.
    pub fn consider(&self, client: &Client, machine: &Machine) {
        if self.running.load(Ordering::Acquire) {
            return;
        }
        let reinspection = {
            let mut answered = self
                .answered
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = refresh_due(
                answered.as_ref(),
                machine.annotations().get(REINSPECT).map(String::as_str),
            );
            let Some(reinspection) = due else {
                return;
            };
            // Recorded before the read: a failed read is not retried in a loop (the next
            // start of the agent, or a new request value, reads again).
            *answered = Some(reinspection.clone());
            reinspection
        };
        self.running.store(true, Ordering::Release);
        let running = self.running.clone();
        let client = client.clone();
        let machine = machine.clone();
        tokio::spawn(async move {
            refresh(&client, &machine, reinspection).await;
            running.store(false, Ordering::Release);
        });
    }
}

/// Reads this machine and folds the read into its MachineInventory.
async fn refresh(client: &Client, machine: &Machine, reinspection: Option<String>) {
    let now = Time(unbounded_api::condition::now());
    let inventory = crate::inventory::collect_live(
        std::path::Path::new("/"),
        std::env::consts::ARCH,
        None,
        now.clone(),
        crate::inventory::lldp_capture::DEFAULT_WAIT,
    )
    .await;
    let record = InventoryRead {
        source: FactSource::InBand,
        observed_at: now,
        reinspection,
    };
    match unbounded_runtime::inventory::fold_into(client, machine, inventory, record, FIELD_MANAGER)
        .await
    {
        Ok(_) => println!("unbounded-agent: inventory read and written"),
        Err(error) => println!("unbounded-agent: the inventory was not written: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_the_agent_reads_its_machine() {
        let some = |v: &str| Some(v.to_owned());
        let cases = [
            ("first look of the run", None, None, Some(None)),
            (
                "first look, a request there",
                None,
                Some("r1"),
                Some(some("r1")),
            ),
            ("read, nothing asked", Some(None), None, None),
            (
                "asked after the read",
                Some(None),
                Some("r1"),
                Some(some("r1")),
            ),
            ("answered", Some(some("r1")), Some("r1"), None),
            (
                "asked again",
                Some(some("r1")),
                Some("r2"),
                Some(some("r2")),
            ),
            (
                "the request removed: nothing to answer",
                Some(some("r1")),
                None,
                None,
            ),
        ];
        for (case, answered, reinspect, want) in cases {
            assert_eq!(refresh_due(answered.as_ref(), reinspect), want, "{case}");
        }
    }
}
