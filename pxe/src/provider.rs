//! The PXE provider: `provider: pxe` Machines powered through their BMCs, on the shared
//! provider loop ([`unbounded_runtime::provider`]) and the MachineOperation handler API.
//!
//! - create: one-time PXE boot, then power on (the bootserver's DHCP/TFTP/HTTP take it
//!   from there); `InfrastructureReady=True`, `status.power`, `status.addresses` and
//!   `spec.providerID` ([`provider_id_of`], [`addresses_of`]);
//! - observe: the power state, every `pollSeconds`;
//! - delete: power off (graceful, forced after `gracefulShutdownSeconds`), once the
//!   controller has drained and deleted the Node. The DHCP reservation goes with the Machine.
//! - operations `powerOn`, `powerOff`, `powerCycle` and `pxeBoot` (one-time PXE, then a
//!   power cycle; or power on when off);
//! - the out-of-band inventory of Machines with a Redfish BMC
//!   ([`crate::inspection`]), through the same drivers and gates.
//!
//! Credentials come from the Machine's Secret (keys `username` and `password`), read from a
//! watch of its namespace ([`crate::secrets`]), so a rotated password takes effect as
//! soon as the watch delivers it; they are never logged or written anywhere. A Machine's
//! driver (for Redfish, its HTTP client) is built once and kept until the Machine's BMC
//! address, TLS settings or Secret change. Calls to one BMC are serialised (BMCs handle
//! concurrent sessions badly); different BMCs run in parallel.
//!
//! The provider ID is `pxe://<mac>`, the Machine's first MAC in lower-case colon form,
//! recorded once (`spec.providerID` is immutable): the kubelet registers its Node with it
//! and the controller finds the Machine's Node by it. An ID recorded earlier that names
//! another of the Machine's MACs is kept (the list was reordered); one that names none of
//! them is a terminal `ProviderIDMismatch`, as is a BMC address or CA bundle that cannot
//! be used (`BmcAddressInvalid`): see [`unbounded_runtime::provider`] for what is terminal and
//! why so little is. The addresses are the Machine's reservation (`spec.pxe.ipv4`, as
//! `InternalIP`): the address the bootserver's DHCP gives it. A pool address leased by
//! DHCP is not reported here: the lease store lives with the DHCP server, which may be
//! another bootserver (or another DHCP server, in ProxyDHCP mode) than the one whose
//! provider holds the Machine; the Node's own addresses (`kubectl get nodes -o wide`) show
//! where a Machine without a reservation is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{self, Store};
use kube::{Api, Client};
use tokio::sync::Semaphore;
use unbounded_api::well_known::{field_managers, finalizers, operations};
use unbounded_api::{
    Firmware, Machine, MachineAddress, MachineOperation, MachineProvider, PowerState, PxeSpec,
};
use unbounded_runtime::handler::{Execute, Outcome};
use unbounded_runtime::leader::Term;
use unbounded_runtime::provider::{Observed, Provider, ProviderError};

use crate::power::{
    Bmc, BmcAddress, Credentials, Power, PowerDriver, PowerError, Tls, with_retries,
};
use crate::secrets::BmcSecrets;
pub use crate::settings::PowerSettings;
use unbounded_api::mac::MacAddr;

/// The PXE provider.
#[allow(missing_debug_implementations)] // holds a kube Client
pub struct PxeProvider {
    secrets: BmcSecrets,
    settings: PowerSettings,
    per_bmc: Mutex<HashMap<BmcAddress, Arc<Semaphore>>>,
    drivers: Mutex<HashMap<String, (DriverKey, Arc<Bmc>)>>,
    /// The leadership term its BMC commands are sent in.
    term: Term,
}

/// What a Machine's driver was built from: a different key, a new driver.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DriverKey {
    address: String,
    secret_uid: String,
    secret_version: String,
    insecure_skip_verify: bool,
    ca_bundle: Option<String>,
}

fn failure(reason: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::new(reason, message)
}

fn power_failure(error: PowerError) -> ProviderError {
    if error.is_terminal() {
        ProviderError::terminal(error.reason(), error.to_string())
    } else {
        failure(error.reason(), error.to_string())
    }
}

impl PxeProvider {
    /// A provider using `client` for Secrets, sending BMC commands only within `term` (the
    /// leader's; [`Term::unbounded`] without leader election).
    pub fn new(client: Client, settings: PowerSettings, term: Term) -> Self {
        Self {
            secrets: BmcSecrets::new(client),
            settings,
            per_bmc: Mutex::new(HashMap::new()),
            drivers: Mutex::new(HashMap::new()),
            term,
        }
    }

    fn drivers(&self) -> std::sync::MutexGuard<'_, HashMap<String, (DriverKey, Arc<Bmc>)>> {
        // The map holds plain values: usable after a panic elsewhere.
        self.drivers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Machine's BMC with its credentials, and whether it boots UEFI.
    async fn bmc_of(
        &self,
        machine: &Machine,
    ) -> Result<(Arc<Bmc>, BmcAddress, bool), ProviderError> {
        let pxe = machine
            .spec
            .pxe
            .as_ref()
            .ok_or_else(|| failure("SpecInvalid", "a pxe Machine needs spec.pxe"))?;
        let bmc = pxe.bmc.as_ref().ok_or_else(|| {
            failure(
                "NoBmc",
                "spec.pxe.bmc is not set: power this machine on by hand",
            )
        })?;
        let address = BmcAddress::parse(&bmc.address).map_err(power_failure)?;
        let reference = &bmc.credentials_secret_ref;
        let secret = self
            .secrets
            .get(&reference.namespace, &reference.name)
            .await
            .map(|(secret, _source)| secret)
            .map_err(|e| {
                failure(
                    "CredentialsUnavailable",
                    format!(
                        "reading Secret {}/{}: {e}",
                        reference.namespace, reference.name
                    ),
                )
            })?
            .ok_or_else(|| {
                failure(
                    "CredentialsMissing",
                    format!(
                        "Secret {}/{} does not exist",
                        reference.namespace, reference.name
                    ),
                )
            })?;
        let value_of = |name: &str| -> Result<String, ProviderError> {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(name))
                .map(|v| {
                    String::from_utf8_lossy(&v.0)
                        .trim_end_matches('\n')
                        .to_owned()
                })
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|d| d.get(name).cloned())
                })
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    failure(
                        "CredentialsMissing",
                        format!(
                            "Secret {}/{} has no key {name:?}",
                            reference.namespace, reference.name
                        ),
                    )
                })
        };
        let uefi = pxe.firmware == Firmware::Uefi;
        let machine_name = machine.metadata.name.clone().unwrap_or_default();
        let key = DriverKey {
            address: bmc.address.clone(),
            secret_uid: secret.metadata.uid.clone().unwrap_or_default(),
            secret_version: secret.metadata.resource_version.clone().unwrap_or_default(),
            insecure_skip_verify: bmc.insecure_skip_verify.unwrap_or(false),
            ca_bundle: bmc.ca_bundle.clone(),
        };
        if let Some((built_from, driver)) = self.drivers().get(&machine_name)
            && *built_from == key
        {
            return Ok((driver.clone(), address, uefi));
        }
        let credentials = Credentials::new(value_of("username")?, value_of("password")?);
        let tls = Tls {
            insecure_skip_verify: key.insecure_skip_verify,
            ca_bundle: key.ca_bundle.clone(),
        };
        let driver = Arc::new(
            Bmc::new(&address, credentials, &tls, self.settings.timeout)
                .map_err(power_failure)?
                .fenced_by(self.term.clone()),
        );
        // Without a resourceVersion a change could not be told apart: build anew each call.
        if !key.secret_version.is_empty() {
            self.drivers().insert(machine_name, (key, driver.clone()));
        }
        Ok((driver, address, uefi))
    }

    /// Forgets a deleted Machine's driver.
    fn forget(&self, machine: &Machine) {
        if let Some(name) = &machine.metadata.name {
            self.drivers().remove(name);
        }
    }

    /// The one-at-a-time gate of a BMC.
    fn gate(&self, address: &BmcAddress) -> Arc<Semaphore> {
        let mut map = self
            .per_bmc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(address.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone()
    }

    /// Runs a power action on the Machine's BMC: one at a time per BMC, with retries.
    pub async fn act(
        &self,
        machine: &Machine,
        action: PowerAction,
    ) -> Result<Power, ProviderError> {
        let (bmc, address, uefi) = self.bmc_of(machine).await?;
        let gate = self.gate(&address);
        let _permit = gate
            .acquire()
            .await
            .map_err(|_| failure("ShuttingDown", "the provider is stopping"))?;
        let grace = self.settings.graceful_shutdown;
        let backoff = self.settings.backoff;
        match action {
            PowerAction::State => {}
            PowerAction::On => with_retries(backoff, || bmc.power_on())
                .await
                .map_err(power_failure)?,
            PowerAction::Off => with_retries(backoff, || bmc.power_off(grace))
                .await
                .map_err(power_failure)?,
            PowerAction::Cycle => with_retries(backoff, || bmc.power_cycle())
                .await
                .map_err(power_failure)?,
            PowerAction::PxeBootAndOn => {
                with_retries(backoff, || bmc.set_one_time_pxe_boot(uefi))
                    .await
                    .map_err(power_failure)?;
                with_retries(backoff, || bmc.power_on())
                    .await
                    .map_err(power_failure)?;
            }
            PowerAction::PxeBootAndCycle => {
                with_retries(backoff, || bmc.set_one_time_pxe_boot(uefi))
                    .await
                    .map_err(power_failure)?;
                with_retries(backoff, || bmc.power_cycle())
                    .await
                    .map_err(power_failure)?;
            }
        }
        with_retries(backoff, || bmc.power_state())
            .await
            .map_err(power_failure)
    }
}

impl PxeProvider {
    /// Reads what the Machine's BMC holds about its hardware (Redfish documents, or IPMI FRU
    /// device 0): through the same driver, credentials and one-at-a-time gate as power.
    pub async fn bmc_inventory(&self, machine: &Machine) -> Result<BmcInventory, ProviderError> {
        let (bmc, address, _) = self.bmc_of(machine).await?;
        let gate = self.gate(&address);
        let _permit = gate
            .acquire()
            .await
            .map_err(|_| failure("ShuttingDown", "the provider is stopping"))?;
        let backoff = self.settings.backoff;
        match bmc.as_ref() {
            Bmc::Redfish(redfish) => with_retries(backoff, || redfish.inventory_documents())
                .await
                .map(BmcInventory::Redfish),
            Bmc::Ipmi(ipmi) => with_retries(backoff, || ipmi.fru_bytes())
                .await
                .map(BmcInventory::IpmiFru),
        }
        .map_err(power_failure)
    }
}

/// What a BMC holds about its machine's hardware, as read.
#[derive(Debug, Clone)]
pub enum BmcInventory {
    /// A Redfish service's ComputerSystem and its members.
    Redfish(crate::power::redfish_inventory::RedfishDocuments),
    /// An IPMI BMC's FRU device 0.
    IpmiFru(Vec<u8>),
}

/// What to do with a machine's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Only read the state.
    State,
    /// Power on.
    On,
    /// Power off (graceful, then forced).
    Off,
    /// Power cycle.
    Cycle,
    /// One-time PXE boot, then power on.
    PxeBootAndOn,
    /// One-time PXE boot, then power cycle.
    PxeBootAndCycle,
}

/// The action an operation name asks for, or `None` for a name this provider does not run.
pub fn action_of(operation_name: &str) -> Option<PowerAction> {
    match operation_name {
        operations::POWER_ON => Some(PowerAction::On),
        operations::POWER_OFF => Some(PowerAction::Off),
        operations::POWER_CYCLE => Some(PowerAction::Cycle),
        operations::PXE_BOOT => Some(PowerAction::PxeBootAndCycle),
        _ => None,
    }
}

/// The provider ID of a PXE Machine: the recorded one when it names one of its MACs (any
/// case or separator), else `pxe://` and its first MAC in lower-case colon form; `None` for
/// a Machine without a usable MAC.
pub fn provider_id_of(pxe: &PxeSpec, recorded: Option<&str>) -> Option<String> {
    let macs: Vec<MacAddr> = pxe
        .mac_addresses
        .iter()
        .filter_map(|m| m.parse().ok())
        .collect();
    let names_one_of_ours = recorded
        .and_then(|id| id.strip_prefix(PROVIDER_ID_SCHEME))
        .and_then(|mac| mac.parse::<MacAddr>().ok())
        .is_some_and(|mac| macs.contains(&mac));
    if names_one_of_ours {
        return recorded.map(str::to_owned);
    }
    macs.first().map(|mac| format!("{PROVIDER_ID_SCHEME}{mac}"))
}

/// The scheme of PXE provider IDs.
pub const PROVIDER_ID_SCHEME: &str = "pxe://";

/// The addresses of a PXE Machine the provider knows: its reservation.
pub fn addresses_of(pxe: &PxeSpec) -> Vec<MachineAddress> {
    pxe.ipv4
        .iter()
        .map(|ip| MachineAddress {
            type_: "InternalIP".into(),
            address: ip.clone(),
        })
        .collect()
}

fn observed(machine: &Machine, power: Power) -> Observed {
    let pxe = machine.spec.pxe.as_ref();
    Observed {
        power: match power {
            Power::On => PowerState::On,
            Power::Off => PowerState::Off,
        },
        addresses: pxe.map(addresses_of).unwrap_or_default(),
        provider_id: pxe.and_then(|p| provider_id_of(p, machine.spec.provider_id.as_deref())),
        detail: None,
    }
}

/// Refuses a Machine whose recorded provider ID names none of its MACs, before its BMC is
/// touched: the server it describes is not the one the ID names (terminal: the ID is
/// immutable).
pub(crate) fn check_identity(machine: &Machine) -> Result<(), ProviderError> {
    let (Some(recorded), Some(pxe)) = (machine.spec.provider_id.as_deref(), &machine.spec.pxe)
    else {
        return Ok(());
    };
    match provider_id_of(pxe, Some(recorded)) {
        Some(id) if id != recorded => Err(ProviderError::terminal(
            "ProviderIDMismatch",
            format!(
                "spec.providerID is {recorded}, which names none of spec.pxe.macAddresses \
                 (expected {id}); spec.providerID is immutable: put its MAC back, or delete \
                 and recreate the Machine"
            ),
        )),
        _ => Ok(()),
    }
}

impl Provider for PxeProvider {
    const KIND: MachineProvider = MachineProvider::Pxe;
    const FINALIZER: &'static str = finalizers::PXE_PROVIDER;
    const FIELD_MANAGER: &'static str = field_managers::PXE_PROVIDER;

    async fn create(&self, machine: &Machine) -> Result<Observed, ProviderError> {
        check_identity(machine)?;
        self.act(machine, PowerAction::PxeBootAndOn)
            .await
            .map(|power| observed(machine, power))
    }

    async fn observe(&self, machine: &Machine) -> Result<Observed, ProviderError> {
        check_identity(machine)?;
        self.act(machine, PowerAction::State)
            .await
            .map(|power| observed(machine, power))
    }

    async fn delete(&self, machine: &Machine) -> Result<(), ProviderError> {
        if machine.spec.pxe.as_ref().is_some_and(|p| p.bmc.is_none()) {
            return Ok(()); // nothing we can power off
        }
        self.act(machine, PowerAction::Off).await?;
        self.forget(machine);
        Ok(())
    }
}

/// Runs `powerOn`, `powerOff`, `powerCycle` and `pxeBoot` on `pxe` Machines.
#[allow(missing_debug_implementations)] // holds a kube Client and a Store
pub struct PowerOperations {
    provider: Arc<PxeProvider>,
    machines: Store<Machine>,
    client: Client,
}

impl PowerOperations {
    /// The power operations of `provider`'s Machines, read from `machines`.
    pub fn new(provider: Arc<PxeProvider>, machines: Store<Machine>, client: Client) -> Self {
        Self {
            provider,
            machines,
            client,
        }
    }
}

impl Execute for PowerOperations {
    fn handles(&self, machine: &str, operation_name: &str) -> bool {
        action_of(operation_name).is_some()
            && self
                .machines
                .get(&reflector::ObjectRef::new(machine))
                .is_some_and(|m| m.spec.provider == MachineProvider::Pxe)
    }

    async fn execute(&self, operation: Arc<MachineOperation>, _resumed: bool) -> Outcome {
        // A resumed power action is simply done again: each is safe to repeat (a repeated
        // cycle boots the machine once more, which is what was asked).
        let Some(action) = action_of(&operation.spec.operation_name) else {
            return Outcome::Failed(format!(
                "the PXE provider does not run {:?}",
                operation.spec.operation_name
            ));
        };
        let Some(name) = unbounded_runtime::handler::target(&operation) else {
            return Outcome::Failed("no target Machine".into());
        };
        let machines: Api<Machine> = Api::all(self.client.clone());
        let machine = match machines.get_opt(name).await {
            Ok(Some(m)) => m,
            Ok(None) => return Outcome::Failed(format!("Machine {name} does not exist")),
            Err(e) => return Outcome::Failed(format!("reading Machine {name}: {e}")),
        };
        match self.provider.act(&machine, action).await {
            Ok(power) => Outcome::Complete(format!(
                "{} done; power is {}",
                operation.spec.operation_name,
                if power == Power::On { "on" } else { "off" }
            )),
            Err(error) => Outcome::Failed(format!("{}: {}", error.reason, error.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_map_to_actions() {
        assert_eq!(action_of("powerOn"), Some(PowerAction::On));
        assert_eq!(action_of("powerOff"), Some(PowerAction::Off));
        assert_eq!(action_of("powerCycle"), Some(PowerAction::Cycle));
        assert_eq!(action_of("pxeBoot"), Some(PowerAction::PxeBootAndCycle));
        assert_eq!(action_of("reboot"), None);
    }

    #[test]
    fn the_provider_id_is_the_first_mac_unless_one_of_ours_is_recorded() {
        let pxe = |macs: &[&str]| -> PxeSpec {
            serde_json::from_value(serde_json::json!({"macAddresses": macs})).unwrap()
        };
        let cases = [
            (
                "first MAC, lower case",
                pxe(&["52:54:00:AA:BB:01", "52:54:00:aa:bb:02"]),
                None,
                Some("pxe://52:54:00:aa:bb:01"),
            ),
            (
                "dashes become colons",
                pxe(&["52-54-00-aa-bb-01"]),
                None,
                Some("pxe://52:54:00:aa:bb:01"),
            ),
            (
                "a recorded ID naming another of its MACs stays",
                pxe(&["52:54:00:aa:bb:01", "52:54:00:aa:bb:02"]),
                Some("pxe://52:54:00:AA:BB:02"),
                Some("pxe://52:54:00:AA:BB:02"),
            ),
            (
                "a recorded ID naming none: the first MAC (a mismatch)",
                pxe(&["52:54:00:aa:bb:01"]),
                Some("pxe://52:54:00:aa:bb:09"),
                Some("pxe://52:54:00:aa:bb:01"),
            ),
            (
                "another scheme: the first MAC (a mismatch)",
                pxe(&["52:54:00:aa:bb:01"]),
                Some("azure:///subscriptions/x"),
                Some("pxe://52:54:00:aa:bb:01"),
            ),
            ("no usable MAC", pxe(&["zz"]), None, None),
        ];
        for (case, pxe, recorded, expected) in cases {
            assert_eq!(
                provider_id_of(&pxe, recorded).as_deref(),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn the_reservation_is_the_address() {
        let pxe: PxeSpec = serde_json::from_value(
            serde_json::json!({"macAddresses": ["52:54:00:aa:bb:01"], "ipv4": "10.0.0.7"}),
        )
        .unwrap();
        assert_eq!(
            addresses_of(&pxe),
            [MachineAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.7".into()
            }]
        );
        let none: PxeSpec =
            serde_json::from_value(serde_json::json!({"macAddresses": ["52:54:00:aa:bb:01"]}))
                .unwrap();
        assert!(addresses_of(&none).is_empty());
    }
}
