//! Unbounded's PXE provider: `provider: pxe` Machines, which are bare-metal servers, powered
//! through their BMCs. The bootserver binary starts it beside its servers (DHCP, TFTP, HTTP),
//! under leader election; it owns nothing of the provisioning network.
//!
//! | room | what it does |
//! |---|---|
//! | [`run`] | starts the parts below, under the leader's term |
//! | [`provider`] | the provider loop's contract for PXE Machines (create: one-time PXE boot and power on; observe; delete: wipe gate, power off) and the power MachineOperations |
//! | [`power`] | the BMC drivers (Redfish, IPMI) behind one trait, the BMC address parser (the kubectl plugin's too), retries, the leadership fence |
//! | [`inspection`] | what a BMC reads of its machine's hardware (Redfish documents, IPMI FRU), folded into the MachineInventory |
//! | [`secrets`] | BMC credentials from the Secrets Machines name, through a watch per namespace |
//! | [`settings`] | the `power:` settings, validated |

pub mod inspection;
pub mod power;
pub mod provider;
pub mod secrets;
pub mod settings;

use std::sync::Arc;

use kube::Client;
use unbounded_runtime::leader::Term;

use crate::provider::{PowerOperations, PxeProvider};
use crate::settings::PowerSettings;

/// Runs the PXE provider until one of its parts ends: the provider loop and its power
/// operations, and the BMC inventory reads, sending BMC commands only within `term`.
pub async fn run(client: Client, settings: PowerSettings, term: Term) {
    let provider = Arc::new(PxeProvider::new(client.clone(), settings, term));
    let operations = |machines| PowerOperations::new(provider.clone(), machines, client.clone());
    let inspection = inspection::run(client.clone(), provider.clone());
    tokio::select! {
        () = unbounded_runtime::provider::run_with_operations(
            client.clone(),
            provider.clone(),
            settings.loop_settings,
            operations,
        ) => {}
        () = inspection => tracing::error!("the Redfish inventory reads ended"),
    }
}
