//! Labels, annotations, finalizers, field managers, condition types and reasons that every
//! component agrees on.

/// The API group of every Unbounded resource.
pub const GROUP: &str = "unbounded-cloud.io";

/// Labels.
pub mod labels {
    /// On every single-machine MachineOperation: the Machine it targets, so that an agent's
    /// informer watches only its own operations.
    pub const MACHINE: &str = "unbounded-cloud.io/machine";
    /// On every MachineConfigurationVersion: the MachineConfiguration it belongs to.
    pub const CONFIGURATION: &str = "unbounded-cloud.io/configuration";
    /// On a child MachineOperation: the name of its parent (selector) operation.
    pub const PARENT_OPERATION: &str = "unbounded-cloud.io/parent-operation";
}

/// Annotations.
pub mod annotations {
    /// On a Node: the MachineConfiguration its machine runs.
    pub const MACHINE_CONFIGURATION: &str = "unbounded-cloud.io/machine-configuration";
    /// On a Node: the configuration version its machine runs.
    pub const MACHINE_CONFIGURATION_VERSION: &str =
        "unbounded-cloud.io/machine-configuration-version";
    /// On a Node: the Machine it belongs to.
    pub const MACHINE: &str = "unbounded-cloud.io/machine";
}

/// Finalizers.
pub mod finalizers {
    /// On a Machine: the controller drains and deletes its Node before letting go.
    pub const MACHINE: &str = "unbounded-cloud.io/machine";
    /// On a MachineConfigurationVersion that a Machine references: the safety net behind the
    /// ValidatingAdmissionPolicy that denies deleting it.
    pub const VERSION_IN_USE: &str = "unbounded-cloud.io/version-in-use";
    /// On a PXE Machine: the PXE provider powers the server off before letting go.
    pub const PXE_PROVIDER: &str = "unbounded-cloud.io/pxe-provider";
    /// On an Azure Machine: the Azure provider deletes the VM before letting go.
    pub const AZURE_PROVIDER: &str = "unbounded-cloud.io/azure-provider";

    /// The finalizers by which providers hold a Machine until its infrastructure is released.
    pub const PROVIDERS: [&str; 2] = [PXE_PROVIDER, AZURE_PROVIDER];
}

/// Operation names and who runs them.
pub mod operations {
    use crate::{HandlerKind, MachineProvider};

    /// Reboot the machine (agent); Complete once the machine is back with a new boot ID.
    pub const REBOOT: &str = "reboot";
    /// Shut the machine's OS down (agent).
    pub const SHUTDOWN: &str = "shutdown";
    /// Restart the systemd unit named by the parameter `service` (agent).
    pub const RESTART_SERVICE: &str = "restartService";
    /// Power the machine on (provider).
    pub const POWER_ON: &str = "powerOn";
    /// Power the machine off (provider).
    pub const POWER_OFF: &str = "powerOff";
    /// Power the machine off and on (provider).
    pub const POWER_CYCLE: &str = "powerCycle";
    /// Set a one-time network boot and power-cycle (the PXE provider's own operation).
    pub const PXE_BOOT: &str = "pxeBoot";
    /// Move the VM to another host in its region (the Azure provider's own operation).
    pub const REDEPLOY: &str = "redeploy";

    /// The parameter of `restartService`.
    pub const SERVICE_PARAMETER: &str = "service";
    /// The parameter of `powerOff` on an Azure Machine: `"true"` deallocates the VM (its
    /// compute is released and no longer billed) instead of only stopping it.
    pub const DEALLOCATE_PARAMETER: &str = "deallocate";

    /// What the agent runs, on every provider.
    pub const AGENT: [&str; 3] = [REBOOT, SHUTDOWN, RESTART_SERVICE];
    /// What every provider that manages infrastructure runs.
    pub const POWER: [&str; 3] = [POWER_ON, POWER_OFF, POWER_CYCLE];

    /// A provider's own operation names, beside [`POWER`].
    pub fn provider_specific(provider: MachineProvider) -> &'static [&'static str] {
        match provider {
            MachineProvider::Pxe => &[PXE_BOOT],
            MachineProvider::Azure => &[REDEPLOY],
            MachineProvider::Manual => &[],
        }
    }

    /// Who runs `name` on a Machine of `provider`, or `None` when nobody does. A `manual`
    /// Machine has no provider to power it.
    pub fn route(provider: MachineProvider, name: &str) -> Option<HandlerKind> {
        if AGENT.contains(&name) {
            return Some(HandlerKind::Agent);
        }
        let has_provider = provider != MachineProvider::Manual;
        (has_provider && (POWER.contains(&name) || provider_specific(provider).contains(&name)))
            .then_some(HandlerKind::Provider)
    }

    /// The names that some handler runs on a Machine of `provider`, for messages.
    pub fn known(provider: MachineProvider) -> Vec<&'static str> {
        let mut names = AGENT.to_vec();
        if provider != MachineProvider::Manual {
            names.extend(POWER);
            names.extend(provider_specific(provider));
        }
        names
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn routing_table() {
            let cases = [
                (MachineProvider::Pxe, "reboot", Some(HandlerKind::Agent)),
                (
                    MachineProvider::Manual,
                    "restartService",
                    Some(HandlerKind::Agent),
                ),
                (
                    MachineProvider::Pxe,
                    "powerCycle",
                    Some(HandlerKind::Provider),
                ),
                (
                    MachineProvider::Azure,
                    "powerOff",
                    Some(HandlerKind::Provider),
                ),
                (MachineProvider::Pxe, "pxeBoot", Some(HandlerKind::Provider)),
                (MachineProvider::Azure, "pxeBoot", None),
                (
                    MachineProvider::Azure,
                    "redeploy",
                    Some(HandlerKind::Provider),
                ),
                (MachineProvider::Pxe, "redeploy", None),
                (MachineProvider::Manual, "powerOn", None),
                (MachineProvider::Pxe, "selfDestruct", None),
            ];
            for (provider, name, expected) in cases {
                assert_eq!(route(provider, name), expected, "{provider:?} {name}");
            }
        }

        #[test]
        fn known_names_are_exactly_the_routed_ones() {
            for provider in [
                MachineProvider::Pxe,
                MachineProvider::Azure,
                MachineProvider::Manual,
            ] {
                for name in known(provider) {
                    assert!(route(provider, name).is_some(), "{provider:?} {name}");
                }
            }
        }
    }
}

/// Server-side apply field managers, one per component.
pub mod field_managers {
    /// The controller.
    pub const CONTROLLER: &str = "unbounded-controller";
    /// The PXE provider in the bootserver.
    pub const PXE_PROVIDER: &str = "unbounded-pxe-provider";
    /// The Azure provider.
    pub const AZURE_PROVIDER: &str = "unbounded-azure-provider";
    /// The agent in the booted OS.
    pub const AGENT: &str = "unbounded-agent";
}

/// Condition types.
pub mod conditions {
    /// Machine: a configuration version was resolved (controller).
    pub const CONFIGURATION_RESOLVED: &str = "ConfigurationResolved";
    /// Machine: the infrastructure is up (provider).
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// Machine: the node container is paved and kubelet bootstrapped (agent).
    pub const BOOTSTRAP_READY: &str = "BootstrapReady";
    /// Machine: the Node exists and is Ready (controller).
    pub const NODE_READY: &str = "NodeReady";
    /// MachineConfiguration: the update strategy is carried out (controller).
    pub const UPDATE_STRATEGY_SUPPORTED: &str = "UpdateStrategySupported";
}

/// Condition reasons and Event reasons.
pub mod reasons {
    /// No MachineConfiguration matches the Machine yet.
    pub const CONFIGURATION_PENDING: &str = "ConfigurationPending";
    /// A configuration version was resolved.
    pub const CONFIGURATION_RESOLVED: &str = "ConfigurationResolved";
    /// The referenced MachineConfiguration does not exist.
    pub const CONFIGURATION_NOT_FOUND: &str = "ConfigurationNotFound";
    /// The referenced version does not exist.
    pub const VERSION_NOT_FOUND: &str = "VersionNotFound";
    /// A version became deployed (immutable).
    pub const VERSION_LOCKED: &str = "VersionLocked";
    /// A version was created.
    pub const VERSION_CREATED: &str = "VersionCreated";
    /// A version's template was updated before it was deployed.
    pub const VERSION_UPDATED: &str = "VersionUpdated";
    /// A version was deleted by revisionHistoryLimit.
    pub const VERSION_PRUNED: &str = "VersionPruned";
    /// The Node was annotated with its configuration.
    pub const NODE_ANNOTATED: &str = "NodeAnnotated";
    /// The Node has not appeared yet.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// The Node exists but is not Ready.
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    /// The Node is Ready.
    pub const NODE_READY: &str = "NodeReady";
    /// The Node was deleted: the machine is repaved.
    pub const REPAVE: &str = "Repave";
    /// The Machine is being drained before deletion.
    pub const DRAINING: &str = "Draining";
    /// The update strategy is not yet carried out.
    pub const NOT_SUPPORTED: &str = "NotSupported";
    /// The update strategy is carried out.
    pub const SUPPORTED: &str = "Supported";
    /// A MachineOperation failed (Event on the operation).
    pub const OPERATION_FAILED: &str = "OperationFailed";
    /// A selector MachineOperation created its children (Event on the operation).
    pub const FANNED_OUT: &str = "FannedOut";
}
