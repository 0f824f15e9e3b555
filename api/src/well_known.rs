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
    /// On every Machine of a MachinePool (with the pool as its controlling owner): the pool's
    /// name.
    pub const POOL: &str = "unbounded-cloud.io/pool";
    /// On a Machine that discovery created: [`super::discovery::WAITING`] until an operator
    /// or a pool claims it, then [`super::discovery::CLAIMED`].
    pub const DISCOVERY: &str = "unbounded-cloud.io/discovery";
    /// On a PXE Machine a Cluster API `UnboundedMachine` claimed, or an Azure Machine one
    /// created: that UnboundedMachine's UID (a label, so that the claim is one field two
    /// claimants conflict on, and so that the owner finds its Machine by selector; a
    /// cluster-scoped Machine cannot have a namespaced owner reference).
    pub const CAPI_MACHINE: &str = "unbounded-cloud.io/capi-machine";
}

/// The values of [`labels::DISCOVERY`], and the rule every component applies to them.
pub mod discovery {
    use std::collections::BTreeMap;

    /// Discovered, nobody has claimed it: it gets no configuration, no agent access, no
    /// credentials and no boot script of its own.
    pub const WAITING: &str = "waiting";
    /// Claimed by an operator (by hand) or a MachinePool: an ordinary Machine from then on.
    pub const CLAIMED: &str = "claimed";

    /// Whether a Machine's labels say it was discovered and waits to be claimed.
    pub fn is_waiting(labels: &BTreeMap<String, String>) -> bool {
        labels.get(super::labels::DISCOVERY).map(String::as_str) == Some(WAITING)
    }
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
    /// On a Machine of a MachinePool: remove this one first when the pool scales down (any
    /// value).
    pub const DELETE_MACHINE: &str = "unbounded-cloud.io/delete-machine";
    /// On a Machine: a request to repave it, as the RFC 3339 time of the request. The
    /// controller cordons and drains the Machine's recorded Node (PodDisruptionBudgets
    /// honoured, at most the drain timeout after the request), deletes it (the agent repaves
    /// with what the Machine resolves to then), and replaces this annotation with
    /// [`REPAVING`]. Rolling updates and remediation use it; so may a person. A Machine
    /// without a recorded Node has nothing to drain: the request is carried out at once.
    pub const REPAVE: &str = "unbounded-cloud.io/repave";
    /// On a Machine with [`REPAVE`]: a MachineOperation (`powerOff`, `pxeBoot`) to create
    /// once the Node is deleted.
    pub const REPAVE_THEN: &str = "unbounded-cloud.io/repave-then";
    /// On a Machine: the time of the repave request the controller carried out, until the
    /// Machine is Running again (a rollout's progress deadline counts from it).
    pub const REPAVING: &str = "unbounded-cloud.io/repaving";
    /// On a Machine discovery created: the sender of the report that created it (the /24
    /// of its source address), so that the per-sender cap is read back after a restart.
    pub const DISCOVERED_FROM: &str = "unbounded-cloud.io/discovered-from";
    /// On a PXE Machine a pool claimed: when (RFC 3339). Remediation's provisioning clock
    /// starts no earlier.
    pub const CLAIMED_AT: &str = "unbounded-cloud.io/claimed-at";
    /// On a PXE Machine a pool releases to the inventory: the time of the release (RFC 3339),
    /// written with the [`REPAVE`] request (followed by `powerOff`) that carries it out. The
    /// controller drains the Node, asks the agent to wipe ([`RELEASE_WIPE`]) and creates the
    /// `powerOff` only once the wipe is reported for this release (the gate of a deletion,
    /// `unbounded_runtime::release`). Removed when the repave is finished.
    pub const RELEASE: &str = "unbounded-cloud.io/release";
    /// On a Machine being released ([`RELEASE`]) whose Node is drained: the release's time,
    /// written by the controller. The agent stops the node container and wipes every disk
    /// that carries this Machine's layout, as the paved version's `storage.wipe` says, and
    /// reports `status.agent.releaseWipe` with this value in `request`.
    pub const RELEASE_WIPE: &str = "unbounded-cloud.io/release-wipe";
    /// On a Machine being deleted: `"true"` lets its provider power it off (and let go)
    /// without waiting for the agent's wipe of its disks, or after the wipe failed or timed
    /// out. For a person who has wiped the disks by other means or accepts that they are not.
    pub const RELEASE_WITHOUT_WIPE: &str = "unbounded-cloud.io/release-without-wipe";
    /// On a Machine: a request to read its inventory again, as any value that differs from
    /// the last request's (`$(date +%s)`, say). The bootserver reads the BMC over Redfish
    /// again, and the agent of a running machine reads the machine in band again; each
    /// records the value it answered in the MachineInventory's `reads` (one per source), so
    /// the annotation stays, a restart repeats nothing and a new value asks again.
    pub const REINSPECT: &str = "unbounded-cloud.io/reinspect";
    /// On a Machine with the [`super::labels::CAPI_MACHINE`] label: `<namespace>/<name>` of
    /// the `UnboundedMachine` it stands for, for people and for the watch that wakes it.
    pub const CAPI_MACHINE: &str = "unbounded-cloud.io/capi-machine";
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
    /// On a MachinePool: the controller releases (pxe) or deletes (azure, manual) its
    /// Machines before letting go.
    pub const POOL: &str = "unbounded-cloud.io/pool";
    /// On an `UnboundedMachine`: the controller releases (pxe, wiped) or deletes (azure) its
    /// Machine before letting go.
    pub const CAPI_MACHINE: &str = "unboundedmachine.infrastructure.cluster.x-k8s.io";

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

    /// Move a running Machine to another configuration version (the parameter `version`),
    /// applying in place what can be ([`crate::in_place`]) and repaving for the rest only
    /// with `disruptive: "true"` (run by the controller).
    pub const APPLY_CONFIGURATION: &str = "applyConfiguration";
    /// The parameter of `applyConfiguration`: the target version number.
    pub const VERSION_PARAMETER: &str = "version";
    /// The parameter of `applyConfiguration`: `"true"` allows a cordon, drain and repave
    /// when a change cannot be applied in place (default `"false"`).
    pub const DISRUPTIVE_PARAMETER: &str = "disruptive";
    /// What the controller runs itself, on every provider.
    pub const CONTROLLER: [&str; 1] = [APPLY_CONFIGURATION];
    /// The agent's part of an `applyConfiguration`: write the files a version changes
    /// (`files[]`, kubelet's flags) into the running node container and restart the units
    /// that read them. Created by the controller only, as a child of the `applyConfiguration`
    /// it belongs to (one created by anyone else is failed: the agent would change the
    /// machine without the Machine recording it).
    pub const APPLY_FILES: &str = "applyFiles";
    /// The parameter of `applyFiles`: the configuration's name.
    pub const CONFIGURATION_PARAMETER: &str = "configuration";
    /// The parameter of `applyFiles`: the version the Machine records (what the container
    /// holds now); `version` is the target.
    pub const FROM_PARAMETER: &str = "from";

    /// The parameter of `restartService`.
    pub const SERVICE_PARAMETER: &str = "service";
    /// The parameter of `powerOff` on an Azure Machine: `"true"` deallocates the VM (its
    /// compute is released and no longer billed) instead of only stopping it.
    pub const DEALLOCATE_PARAMETER: &str = "deallocate";

    /// What the agent runs, on every provider.
    pub const AGENT: [&str; 4] = [REBOOT, SHUTDOWN, RESTART_SERVICE, APPLY_FILES];
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

    /// The names that some handler runs on a Machine of `provider` and a person may create,
    /// for messages (not [`APPLY_FILES`]: `applyConfiguration` creates it).
    pub fn known(provider: MachineProvider) -> Vec<&'static str> {
        let mut names: Vec<&'static str> =
            AGENT.into_iter().filter(|n| *n != APPLY_FILES).collect();
        names.extend(CONTROLLER);
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
                    // The controller runs its own names; nothing is routed for them.
                    assert!(
                        route(provider, name).is_some() || CONTROLLER.contains(&name),
                        "{provider:?} {name}"
                    );
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
    /// The controller's `DisksWiped` condition of a PXE Machine its pool releases (a
    /// manager of its own: the condition is written apart from the Machine's status).
    pub const CONTROLLER_RELEASE: &str = "unbounded-controller-release";

    /// A MachinePool's own field manager, with which it claims PXE Machines: two pools
    /// claiming one Machine conflict on its `unbounded-cloud.io/pool` label.
    pub fn pool(name: &str) -> String {
        format!("unbounded-pool-{name}")
    }

    /// A Cluster API `UnboundedMachine`'s own field manager (by UID), with which it claims a
    /// PXE Machine: two claimants conflict on the Machine's
    /// [`super::labels::CAPI_MACHINE`] label.
    pub fn capi_machine(uid: &str) -> String {
        format!("unbounded-capi-{uid}")
    }
}

/// Condition types.
pub mod conditions {
    /// Machine: discovery created it (bootserver); reason `WaitingToBeClaimed`, then
    /// `Claimed` (controller).
    pub const DISCOVERED: &str = "Discovered";
    /// Machine: a configuration version was resolved (controller).
    pub const CONFIGURATION_RESOLVED: &str = "ConfigurationResolved";
    /// Machine: the infrastructure is up (provider).
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// Machine: the node container is paved and kubelet bootstrapped (agent).
    pub const BOOTSTRAP_READY: &str = "BootstrapReady";
    /// Machine: the Node exists and is Ready (controller).
    pub const NODE_READY: &str = "NodeReady";
    /// Machine being deleted: its disks are wiped as its configuration says before the
    /// provider powers it off (provider). Reasons in [`super::reasons`]: `WipePending`,
    /// `Wiped`, `WipeNotNeeded`, `WipeFailed`, `WipeTimedOut`, `WipeSkipped`.
    pub const DISKS_WIPED: &str = "DisksWiped";
    /// MachineConfiguration: the update strategy is carried out (controller).
    pub const UPDATE_STRATEGY_SUPPORTED: &str = "UpdateStrategySupported";
    /// MachineConfiguration (RollingUpdate) and MachinePool: every Machine records the version
    /// it resolves to; False while a rollout runs, is paused or waits (OnDelete).
    pub const UP_TO_DATE: &str = "UpToDate";
    /// MachinePool: it holds `replicas` Machines.
    pub const SCALED: &str = "Scaled";
    /// MachinePool: no Machine is unhealthy, or remediation is under way.
    pub const MACHINES_HEALTHY: &str = "MachinesHealthy";
}

/// Condition reasons and Event reasons.
pub mod reasons {
    /// ConfigurationResolved is False: the Machine was discovered and waits to be claimed
    /// (label `unbounded-cloud.io/discovery=waiting`).
    pub const AWAITING_CLAIM: &str = "WaitingToBeClaimed";
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
    /// A deleted Machine waits for its provider to release the infrastructure (remove its
    /// finalizer).
    pub const WAITING_FOR_PROVIDER: &str = "WaitingForProvider";
    /// The update strategy is not yet carried out.
    pub const NOT_SUPPORTED: &str = "NotSupported";
    /// The update strategy is carried out.
    pub const SUPPORTED: &str = "Supported";
    /// A MachineOperation failed (Event on the operation).
    pub const OPERATION_FAILED: &str = "OperationFailed";
    /// A selector MachineOperation created its children (Event on the operation).
    pub const FANNED_OUT: &str = "FannedOut";

    /// A repave was requested (Event on the Machine) or carried out.
    pub const REPAVE_REQUESTED: &str = "RepaveRequested";
    /// A repave annotation that cannot be read.
    pub const INVALID_REPAVE_REQUEST: &str = "InvalidRepaveRequest";
    /// Every Machine records the version it resolves to.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// A rollout batch was started (Event), or batches are under way (condition).
    pub const ROLLING_OUT: &str = "RollingOut";
    /// A rollout batch failed its progress deadline: no new batch starts.
    pub const BATCH_FAILED: &str = "BatchFailed";
    /// The pool's `spec.paused` holds the rollout.
    pub const PAUSED: &str = "Paused";
    /// OnDelete: out-of-date Machines wait for their Node to be deleted.
    pub const WAITING_FOR_NODE_DELETION: &str = "WaitingForNodeDeletion";
    /// The pool holds its replicas.
    pub const AT_REPLICAS: &str = "AtReplicas";
    /// The pool created or claimed Machines.
    pub const SCALING_UP: &str = "ScalingUp";
    /// The pool deleted or released Machines.
    pub const SCALING_DOWN: &str = "ScalingDown";
    /// A PXE pool has fewer free Machines to claim than it needs.
    pub const INVENTORY_SHORT: &str = "InventoryShort";
    /// A PXE pool claimed a Machine (Event); and the reason of a discovered Machine's
    /// `Discovered` condition once it is claimed (by hand or by a pool).
    pub const CLAIMED: &str = "Claimed";
    /// A PXE pool released a Machine to the inventory (Event).
    pub const RELEASED: &str = "Released";
    /// No Machine is unhealthy.
    pub const HEALTHY: &str = "Healthy";
    /// Unhealthy Machines are remediated (condition), or one was (Event).
    pub const REMEDIATING: &str = "Remediating";
    /// More Machines are unhealthy than maxUnhealthy: none is remediated.
    pub const TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthy";
    /// DisksWiped False: the provider waits for the agent's wipe before powering off.
    pub const WIPE_PENDING: &str = "WipePending";
    /// DisksWiped True: the agent reported the disks wiped.
    pub const WIPED: &str = "Wiped";
    /// DisksWiped True: the configuration does not wipe on release (`never`, no storage,
    /// nothing was paved).
    pub const WIPE_NOT_NEEDED: &str = "WipeNotNeeded";
    /// DisksWiped False: the agent reported the wipe failed; the Machine is kept.
    pub const WIPE_FAILED: &str = "WipeFailed";
    /// DisksWiped False: no wipe was reported in time; the Machine is kept.
    pub const WIPE_TIMED_OUT: &str = "WipeTimedOut";
    /// DisksWiped False: released without a wipe, as the Machine's
    /// `unbounded-cloud.io/release-without-wipe` annotation said.
    pub const WIPE_SKIPPED: &str = "WipeSkipped";
}
