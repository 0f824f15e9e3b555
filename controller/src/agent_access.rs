//! Agent access: for every Machine whose agent may be running, its ServiceAccount
//! (`unbounded-machines/<machine>`), and a ClusterRole and binding that name exactly its own
//! objects ([`unbounded_api::agent::AgentAccess`]), all owned by the Machine. The role also
//! lists the MachineOperations routed to the agent: that is how the agent learns of them.
//!
//! Decided from plain data ([`desired_access`]), applied with server-side apply only when
//! the decision changed, so a resync costs no API request.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use unbounded_api::agent::{AGENT_NAMESPACE, AgentAccess, role_name, self_refresh_rules};
use unbounded_api::in_place::AgentApply;
use unbounded_api::well_known::{conditions, field_managers, labels, operations};
use unbounded_api::{HandlerKind, Machine, MachineOperation, MachineProvider, OperationState};

use crate::error::Error;
use crate::index::Shared;
use crate::index::operations::OperationIndex;

/// How long a finished operation stays readable by its agent (it may still be finishing
/// its own bookkeeping, such as a reboot's completion).
pub const FINISHED_GRACE: Duration = Duration::from_secs(600);

/// The label on every object this module creates.
pub const MANAGED_LABEL: &str = "unbounded-cloud.io/agent-access";

/// Whether a Machine's agent may be running: its provider has it up (InfrastructureReady),
/// it is `manual` (someone else runs it) or `azure` (the provider mints the VM's first
/// credentials before it creates the VM, so the ServiceAccount must exist first), or an
/// agent has already reported. Never a discovered Machine nobody has claimed yet
/// (`unbounded-cloud.io/discovery=waiting`): anyone on the provisioning network can have one
/// created, and its inspection agent needs no access.
pub fn agent_may_run(machine: &Machine) -> bool {
    if unbounded_api::well_known::discovery::is_waiting(machine.labels()) {
        return false;
    }
    let status = machine.status.as_ref();
    matches!(
        machine.spec.provider,
        MachineProvider::Manual | MachineProvider::Azure
    ) || status.is_some_and(|s| {
        s.agent.is_some()
            || unbounded_api::condition::is_true(&s.conditions, conditions::INFRASTRUCTURE_READY)
    })
}

/// Whether an operation is the agent's to read now, given the time in seconds since the
/// epoch. Returns the seconds until that changes, if it will.
fn operation_visible(operation: &MachineOperation, now: i64) -> (bool, Option<i64>) {
    let Some(status) = operation.status.as_ref() else {
        return (false, None);
    };
    if status.routed_to != Some(HandlerKind::Agent) {
        return (false, None);
    }
    match status.state {
        Some(OperationState::Pending | OperationState::InProgress) => (true, None),
        Some(OperationState::Complete | OperationState::Failed) => {
            let finished = status
                .completion_time
                .as_ref()
                .map_or(now, |t| t.0.as_second());
            let left = finished + FINISHED_GRACE.as_secs() as i64 - now;
            if left > 0 {
                (true, Some(left))
            } else {
                (false, None)
            }
        }
        None => (false, None),
    }
}

/// What a Machine's agent may touch, or `None` when no agent should run; plus when to look
/// again. The versions are the one it records, the one it pins, and those an `applyFiles`
/// routed to it names (it reads the target's files) (a finished operation leaves the role after [`FINISHED_GRACE`]).
pub fn desired_access<'a>(
    machine: &Machine,
    operations: impl IntoIterator<Item = &'a MachineOperation>,
    now: i64,
) -> (Option<AgentAccess>, Option<Duration>) {
    if !agent_may_run(machine) {
        return (None, None);
    }
    let name = machine.name_any();
    let mut versions = BTreeSet::new();
    if let Some(c) = machine
        .status
        .as_ref()
        .and_then(|s| s.configuration.as_ref())
    {
        versions.insert(c.version_name());
    }
    if let Some(r) = &machine.spec.configuration_ref
        && let Some(v) = r.version
    {
        versions.insert(unbounded_api::version_name(&r.name, v));
    }
    let mut names = BTreeSet::new();
    let mut next: Option<i64> = None;
    for operation in operations {
        let target = operation.spec.machine_ref.as_ref().map(|r| r.name.as_str());
        if target != Some(name.as_str()) {
            continue;
        }
        let (visible, change) = operation_visible(operation, now);
        if visible {
            names.insert(operation.name_any());
            // applyFiles: the agent reads the target version (and the one it holds).
            if operation.spec.operation_name == operations::APPLY_FILES
                && let Ok(apply) = AgentApply::from_parameters(&operation.spec.parameters)
            {
                versions.insert(apply.target_version_name());
                versions.insert(apply.from_version_name());
            }
        }
        if let Some(c) = change {
            next = Some(next.map_or(c, |n| n.min(c)));
        }
    }
    let access = AgentAccess {
        node: machine.node_name(),
        machine: name,
        versions,
        operations: names,
        self_refresh: machine.spec.provider != MachineProvider::Pxe,
    };
    (
        Some(access),
        next.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0) + 1)),
    )
}

/// What the access reconciler shares.
pub struct AccessContext {
    /// The API client.
    pub client: Client,
    /// MachineOperations (the controller's store).
    pub operations: Store<MachineOperation>,
    /// Operations by Machine.
    operation_index: Shared<OperationIndex>,
    /// What was applied per Machine (by UID, so a recreated Machine is applied again).
    applied: Mutex<HashMap<String, AgentAccess>>,
}

impl std::fmt::Debug for AccessContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessContext").finish_non_exhaustive()
    }
}

impl AccessContext {
    /// A context over the controller's client, operation store and index.
    pub fn new(
        client: Client,
        operations: Store<MachineOperation>,
        operation_index: Shared<OperationIndex>,
    ) -> Self {
        Self {
            client,
            operations,
            operation_index,
            applied: Mutex::default(),
        }
    }
}

fn owner(machine: &Machine) -> Option<OwnerReference> {
    machine.controller_owner_ref(&()).map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = None;
        o
    })
}

fn meta(name: &str, namespace: Option<&str>, machine: &Machine) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(
            [
                (MANAGED_LABEL.to_owned(), "true".to_owned()),
                (labels::MACHINE.to_owned(), machine.name_any()),
            ]
            .into(),
        ),
        owner_references: owner(machine).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// Applies the ServiceAccount, ClusterRole and binding for one access (and the Role with
/// which an agent renews its own token, where it does). The API server accepts a role only
/// from a creator that holds every grant in it: deploy/rbac/controller.yaml must.
pub async fn apply_access(
    client: &Client,
    machine: &Machine,
    access: &AgentAccess,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(field_managers::CONTROLLER).force();
    let account = ServiceAccount {
        metadata: meta(&access.machine, Some(AGENT_NAMESPACE), machine),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), AGENT_NAMESPACE)
        .patch(&access.machine, &params, &Patch::Apply(&account))
        .await?;
    let role_name = role_name(&access.machine);
    let role = ClusterRole {
        metadata: meta(&role_name, None, machine),
        rules: Some(access.rules()),
        aggregation_rule: None,
    };
    Api::<ClusterRole>::all(client.clone())
        .patch(&role_name, &params, &Patch::Apply(&role))
        .await?;
    let subjects = Some(vec![Subject {
        kind: "ServiceAccount".into(),
        name: access.machine.clone(),
        namespace: Some(AGENT_NAMESPACE.into()),
        api_group: None,
    }]);
    let binding = ClusterRoleBinding {
        metadata: meta(&role_name, None, machine),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role_name.clone(),
        },
        subjects: subjects.clone(),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(&role_name, &params, &Patch::Apply(&binding))
        .await?;
    if access.self_refresh {
        let role = Role {
            metadata: meta(&role_name, Some(AGENT_NAMESPACE), machine),
            rules: Some(self_refresh_rules(&access.machine)),
        };
        Api::<Role>::namespaced(client.clone(), AGENT_NAMESPACE)
            .patch(&role_name, &params, &Patch::Apply(&role))
            .await?;
        let binding = RoleBinding {
            metadata: meta(&role_name, Some(AGENT_NAMESPACE), machine),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: role_name.clone(),
            },
            subjects,
        };
        Api::<RoleBinding>::namespaced(client.clone(), AGENT_NAMESPACE)
            .patch(&role_name, &params, &Patch::Apply(&binding))
            .await?;
    }
    Ok(())
}

/// Reconciles one Machine's agent access.
#[tracing::instrument(skip_all, fields(machine = %machine.name_any()))]
pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<AccessContext>) -> Result<Action, Error> {
    if machine.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the objects with the Machine; until then the agent
        // keeps what it had.
        return Ok(Action::await_change());
    }
    let now = unbounded_api::condition::now().as_second();
    let names = ctx.operation_index.read().on_machine(&machine.name_any());
    let operations: Vec<Arc<MachineOperation>> = names
        .iter()
        .filter_map(|n| {
            ctx.operations
                .get(&kube::runtime::reflector::ObjectRef::new(n))
        })
        .collect();
    let (desired, next) = desired_access(&machine, operations.iter().map(|o| o.as_ref()), now);
    let Some(desired) = desired else {
        return Ok(Action::await_change());
    };
    let uid = machine.uid().unwrap_or_default();
    let unchanged = ctx
        .applied
        .lock()
        .map(|a| a.get(&uid) == Some(&desired))
        .unwrap_or(false);
    if !unchanged {
        apply_access(&ctx.client, &machine, &desired)
            .await
            .map_err(|source| Error::Kube {
                action: "applying agent access".into(),
                source,
            })?;
        if let Ok(mut applied) = ctx.applied.lock() {
            applied.insert(uid, desired);
        }
    }
    Ok(next.map_or_else(Action::await_change, Action::requeue))
}

/// Retries failed applies after a short while.
pub fn error_policy(machine: Arc<Machine>, error: &Error, _ctx: Arc<AccessContext>) -> Action {
    tracing::warn!(machine = %machine.name_any(), %error, "agent access failed");
    Action::requeue(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use unbounded_api::{
        MachineOperationSpec, MachineOperationStatus, MachineRef, MachineSpec, MachineStatus,
        ResolvedConfiguration,
    };

    fn machine(provider: MachineProvider, infra: bool) -> Machine {
        let mut m = Machine::new(
            "m1",
            MachineSpec {
                provider,
                pxe: None,
                azure: None,
                configuration_ref: Some(unbounded_api::ConfigurationRef {
                    name: "general".into(),
                    version: Some(1),
                }),
                provider_id: None,
                node_name: Some("n1".into()),
            },
        );
        m.status = Some(MachineStatus {
            configuration: Some(ResolvedConfiguration {
                name: "general".into(),
                version: 2,
            }),
            conditions: vec![unbounded_api::condition::new_condition(
                conditions::INFRASTRUCTURE_READY,
                infra,
                "Provisioned",
                "",
                None,
            )],
            ..MachineStatus::default()
        });
        m
    }

    fn op(
        name: &str,
        target: &str,
        routed: Option<HandlerKind>,
        state: OperationState,
        done_at: Option<i64>,
    ) -> MachineOperation {
        let mut o = MachineOperation::new(
            name,
            MachineOperationSpec {
                machine_ref: Some(MachineRef {
                    name: target.into(),
                }),
                machine_selector: None,
                operation_name: "reboot".into(),
                parameters: Default::default(),
                ttl_seconds_after_finished: None,
                active_deadline_seconds: None,
            },
        );
        o.status = Some(MachineOperationStatus {
            state: Some(state),
            routed_to: routed,
            completion_time: done_at
                .map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())),
            ..MachineOperationStatus::default()
        });
        o
    }

    #[test]
    fn no_access_before_the_machine_is_up() {
        let (access, _) = desired_access(&machine(MachineProvider::Pxe, false), [], 0);
        assert!(access.is_none());
        let (access, _) = desired_access(&machine(MachineProvider::Manual, false), [], 0);
        let access = access.expect("a manual machine's agent may run at any time");
        assert!(access.self_refresh, "a manual machine renews its own token");
        let (access, _) = desired_access(&machine(MachineProvider::Azure, false), [], 0);
        let access = access.expect("an Azure VM's identity exists before the VM");
        assert!(access.self_refresh);
        let (access, _) = desired_access(&machine(MachineProvider::Pxe, true), [], 0);
        assert!(
            !access
                .expect("an infrastructure-ready PXE machine")
                .self_refresh,
            "a PXE machine renews through the bootserver"
        );
    }

    /// Whatever its status says, a waiting discovered Machine gets no ServiceAccount or role;
    /// claimed, it does again.
    #[test]
    fn no_access_for_a_discovered_machine_until_it_is_claimed() {
        let discovery = unbounded_api::well_known::labels::DISCOVERY;
        for (provider, value, access) in [
            (MachineProvider::Pxe, "waiting", false),
            (MachineProvider::Manual, "waiting", false),
            (MachineProvider::Pxe, "claimed", true),
            (MachineProvider::Manual, "claimed", true),
        ] {
            let mut m = machine(provider, true);
            m.labels_mut().insert(discovery.into(), value.into());
            assert_eq!(
                desired_access(&m, [], 0).0.is_some(),
                access,
                "{provider:?} {value}"
            );
        }
    }

    #[test]
    fn access_names_recorded_and_pinned_versions_and_routed_operations() {
        let now = 10_000;
        let ops = [
            op(
                "running",
                "m1",
                Some(HandlerKind::Agent),
                OperationState::InProgress,
                None,
            ),
            op(
                "pending-routed",
                "m1",
                Some(HandlerKind::Agent),
                OperationState::Pending,
                None,
            ),
            op("queued", "m1", None, OperationState::Pending, None),
            op(
                "for-provider",
                "m1",
                Some(HandlerKind::Provider),
                OperationState::Pending,
                None,
            ),
            op(
                "other-machine",
                "m2",
                Some(HandlerKind::Agent),
                OperationState::Pending,
                None,
            ),
            op(
                "just-done",
                "m1",
                Some(HandlerKind::Agent),
                OperationState::Complete,
                Some(now - 60),
            ),
            op(
                "long-done",
                "m1",
                Some(HandlerKind::Agent),
                OperationState::Failed,
                Some(now - 3600),
            ),
        ];
        let (access, next) = desired_access(&machine(MachineProvider::Pxe, true), ops.iter(), now);
        let access = access.unwrap();
        assert_eq!(access.node, "n1");
        assert_eq!(
            access.versions,
            BTreeSet::from(["general-v1".to_owned(), "general-v2".to_owned()])
        );
        assert_eq!(
            access.operations,
            BTreeSet::from([
                "just-done".to_owned(),
                "pending-routed".to_owned(),
                "running".to_owned()
            ])
        );
        assert_eq!(
            next,
            Some(Duration::from_secs(541)),
            "re-evaluated when just-done expires"
        );
    }

    /// An `applyFiles` routed to the agent adds its target version (the agent reads the
    /// files it writes); one that is not routed to it yet, or is long finished, does not.
    #[test]
    fn an_apply_files_operation_adds_its_target_version() {
        let apply = |name: &str, routed, state, done_at| {
            let mut o = op(name, "m1", routed, state, done_at);
            o.spec.operation_name = operations::APPLY_FILES.into();
            o.spec.parameters = AgentApply {
                configuration: "general".into(),
                from: 2,
                version: if name == "queued" { 5 } else { 3 },
            }
            .to_parameters();
            o
        };
        let now = 10_000;
        let m = machine(MachineProvider::Pxe, true);
        let routed = apply(
            "routed",
            Some(HandlerKind::Agent),
            OperationState::Pending,
            None,
        );
        let queued = apply("queued", None, OperationState::Pending, None);
        let (access, _) = desired_access(&m, [&routed, &queued], now);
        assert_eq!(
            access.unwrap().versions,
            BTreeSet::from([
                "general-v1".to_owned(),
                "general-v2".to_owned(),
                "general-v3".to_owned()
            ])
        );
        let done = apply(
            "done",
            Some(HandlerKind::Agent),
            OperationState::Complete,
            Some(now - 3600),
        );
        let (access, _) = desired_access(&m, [&done], now);
        assert!(!access.unwrap().versions.contains("general-v3"));
    }
}
