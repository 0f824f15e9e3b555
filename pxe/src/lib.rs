//! Unbounded's PXE provider: `provider: pxe` Machines, which are bare-metal servers, powered
//! through their BMCs. The bootserver binary starts it beside its servers (DHCP, TFTP, HTTP),
//! under leader election; it owns nothing of the provisioning network.
//!
//! | room | what it does |
//! |---|---|
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
