//! MachineOperations on Azure Machines, through the handler API of
//! [`unbounded_runtime::handler`]:
//!
//! | operation | VM action |
//! |---|---|
//! | `powerOn` | `start` |
//! | `powerOff` | `powerOff` (the OS is shut down, the VM stays allocated and billed); with parameter `deallocate: "true"`, `deallocate` (compute released) |
//! | `powerCycle` | `restart` |
//! | `redeploy` | `redeploy` (moves the VM to another host and starts it) |
//!
//! Each action is a long-running operation; the operation completes when Azure reports it
//! done, with the VM's power state in its message. A resumed operation (the provider
//! restarted while it ran) runs the action again: each is safe to repeat.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Api;
use kube::runtime::reflector::{self, Store};
use unbounded_api::well_known::operations;
use unbounded_api::{MachineOperation, MachineProvider};
use unbounded_runtime::handler::{Execute, Outcome};

use crate::provider::AzureProvider;

/// A VM action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmAction {
    /// Start.
    Start,
    /// Shut down, keep the allocation.
    PowerOff,
    /// Shut down and release the compute.
    Deallocate,
    /// Restart.
    Restart,
    /// Move to another host.
    Redeploy,
}

impl VmAction {
    /// The ARM action's name (the last segment of its path).
    pub fn arm_name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::PowerOff => "powerOff",
            Self::Deallocate => "deallocate",
            Self::Restart => "restart",
            Self::Redeploy => "redeploy",
        }
    }
}

/// The action an operation asks for: `Ok(None)` for a name this provider does not run, an
/// error for a bad parameter.
pub fn action_of(
    name: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<Option<VmAction>, String> {
    let action = match name {
        operations::POWER_ON => VmAction::Start,
        operations::POWER_OFF => match parameters
            .get(operations::DEALLOCATE_PARAMETER)
            .map(String::as_str)
        {
            None | Some("false") => VmAction::PowerOff,
            Some("true") => VmAction::Deallocate,
            Some(other) => {
                return Err(format!(
                    "parameter {} must be \"true\" or \"false\", not {other:?}",
                    operations::DEALLOCATE_PARAMETER
                ));
            }
        },
        operations::POWER_CYCLE => VmAction::Restart,
        operations::REDEPLOY => VmAction::Redeploy,
        _ => return Ok(None),
    };
    Ok(Some(action))
}

/// Runs `powerOn`, `powerOff`, `powerCycle` and `redeploy` on `azure` Machines.
#[allow(missing_debug_implementations)] // holds a kube Client and a Store
pub struct AzureOperations {
    provider: Arc<AzureProvider>,
    machines: Store<unbounded_api::Machine>,
    client: kube::Client,
}

impl AzureOperations {
    /// Operations on the Machines of `machines` (a reflector store).
    pub fn new(
        provider: Arc<AzureProvider>,
        machines: Store<unbounded_api::Machine>,
        client: kube::Client,
    ) -> Self {
        Self {
            provider,
            machines,
            client,
        }
    }
}

impl Execute for AzureOperations {
    fn handles(&self, machine: &str, operation_name: &str) -> bool {
        action_of(operation_name, &BTreeMap::new()).is_ok_and(|a| a.is_some())
            && self
                .machines
                .get(&reflector::ObjectRef::new(machine))
                .is_some_and(|m| m.spec.provider == MachineProvider::Azure)
    }

    async fn execute(&self, operation: Arc<MachineOperation>, _resumed: bool) -> Outcome {
        let name = &operation.spec.operation_name;
        let action = match action_of(name, &operation.spec.parameters) {
            Ok(Some(action)) => action,
            Ok(None) => {
                return Outcome::Failed(format!("the Azure provider does not run {name:?}"));
            }
            Err(message) => return Outcome::Failed(message),
        };
        let Some(target) = unbounded_runtime::handler::target(&operation) else {
            return Outcome::Failed("no target Machine".into());
        };
        let machines: Api<unbounded_api::Machine> = Api::all(self.client.clone());
        let machine = match machines.get_opt(target).await {
            Ok(Some(m)) => m,
            Ok(None) => return Outcome::Failed(format!("Machine {target} does not exist")),
            Err(e) => return Outcome::Failed(format!("reading Machine {target}: {e}")),
        };
        match self.provider.act(&machine, action.arm_name()).await {
            Ok(view) => Outcome::Complete(format!(
                "{name} done ({}); {}",
                action.arm_name(),
                view.describe(target)
            )),
            Err(error) => Outcome::Failed(format!("{}: {}", error.reason, error.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_and_parameters() {
        let none = BTreeMap::new();
        let with = |value: &str| {
            BTreeMap::from([(
                operations::DEALLOCATE_PARAMETER.to_owned(),
                value.to_owned(),
            )])
        };
        let cases = [
            ("powerOn", none.clone(), Ok(Some(VmAction::Start))),
            ("powerOff", none.clone(), Ok(Some(VmAction::PowerOff))),
            ("powerOff", with("false"), Ok(Some(VmAction::PowerOff))),
            ("powerOff", with("true"), Ok(Some(VmAction::Deallocate))),
            (
                "powerOff",
                with("yes"),
                Err("parameter deallocate must be \"true\" or \"false\", not \"yes\"".to_owned()),
            ),
            ("powerCycle", none.clone(), Ok(Some(VmAction::Restart))),
            ("redeploy", none.clone(), Ok(Some(VmAction::Redeploy))),
            ("reboot", none.clone(), Ok(None)),
            ("pxeBoot", none.clone(), Ok(None)),
        ];
        for (name, parameters, expected) in cases {
            assert_eq!(
                action_of(name, &parameters),
                expected,
                "{name} {parameters:?}"
            );
        }
        let arm: Vec<&str> = [
            VmAction::Start,
            VmAction::PowerOff,
            VmAction::Deallocate,
            VmAction::Restart,
            VmAction::Redeploy,
        ]
        .iter()
        .map(|a| a.arm_name())
        .collect();
        assert_eq!(
            arm,
            ["start", "powerOff", "deallocate", "restart", "redeploy"]
        );
    }
}
