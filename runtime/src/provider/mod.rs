//! The Provider contract (Cluster API's actuator, in Rust) and the reconcile loop that
//! calls it, written once for every provider (PXE in the bootserver, Azure in `azure`).
//!
//! The loop owns the provider's finalizer, its status fields (`status.power`,
//! `status.addresses`, condition `InfrastructureReady`, written with server-side apply under
//! the provider's field manager) and the backoff. A provider only answers:
//! - [`Provider::create`]: make the infrastructure exist and run (PXE: one-time network boot
//!   and power on). Called until it has succeeded once (`InfrastructureReady=True`).
//! - [`Provider::observe`]: what the infrastructure looks like now (PXE: power state),
//!   polled every [`Settings::poll`].
//! - [`Provider::delete`]: release it (PXE: power off; Azure: delete the VM, its NIC and
//!   disk). Called when the Machine is being deleted and its Node is gone (the controller
//!   drains and deletes the Node first), if [`Provider::must_release`] says so (by default:
//!   if it was ever provisioned, so a Machine whose BMC never answered is released at once).
//!
//! An observation may carry the infrastructure's provider ID: the loop records it in
//! `spec.providerID` when that is unset (and reports a mismatch when it differs). An
//! observation that finds the provisioned infrastructure gone ([`ProviderError::gone`])
//! turns `InfrastructureReady` False, so the loop calls `create` again, which decides
//! whether to recreate it (the Azure provider does not: it reports).
//!
//! Before `delete`, the disks: a Machine whose configuration wipes them on release is
//! powered off only once its agent reported them wiped, or held with the condition
//! `DisksWiped=False` (`WipeFailed`, `WipeTimedOut`) and its finalizer kept
//! ([`crate::release`] decides; [`Settings::wipe_timeouts`] bound the wait).
//!
//! Waiting for the Node is not a failure: it is retried every [`Settings::wait`] without
//! growing the backoff, and the loop watches Nodes, so a deleted Machine is released as soon
//! as its Node is gone.
//!
//! Every call must be idempotent. An error has a reason and a message for a person; it
//! never carries a credential, since both end up in the Machine's status and Events.
//!
//! ## Terminal failures
//!
//! Almost every failure is retried with the backoff and shows only as the
//! `InfrastructureReady` condition's reason: a BMC that times out, refuses the password or
//! is busy, a missing Secret, an API server hiccup, an Azure quota or throttling, a resource
//! group not created yet. Those can all heal without anyone touching the Machine, and a
//! Machine marked failed for them would be a false alarm that needs a person.
//!
//! A failure is terminal ([`ProviderError::terminal`]) only when the Machine's own spec, as
//! it is, can never be provisioned, so that retrying is pointless: the loop then writes
//! `status.failureReason` and `status.failureMessage` (the controller shows the phase
//! `Failed`), sets `InfrastructureReady=False` with the same reason for the Machine's
//! current generation, and stops calling the provider for it. A change of the spec (a new
//! `metadata.generation`) clears the failure and the loop tries again; deletion works as
//! for any Machine. The terminal reasons:
//! - `ProviderIDMismatch` (every provider): `spec.providerID`, immutable once set, names
//!   other infrastructure than the one the provider finds or creates for the Machine
//!   (a PXE Machine whose ID names none of its MACs, an Azure Machine whose spec now
//!   points at another VM);
//! - `BmcAddressInvalid` (PXE): the BMC address or CA bundle passes the CRD's checks but
//!   cannot be used (a port out of range, a Redfish path that names no system, credentials
//!   in the address, a CA bundle that is not PEM);
//! - `AzureInvalidParameter` (Azure), when Azure Resource Manager answers `400` to the
//!   request as specified (a VM size or image that does not exist): the same request is
//!   refused every time. `SkuNotAvailable` is not terminal (capacity and regional
//!   restrictions change), nor is any other Azure error.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use unbounded_api::well_known::conditions;
use unbounded_api::{
    Machine, MachineAddress, MachineConfigurationVersion, MachineProvider, PowerState, condition,
};

use crate::release::{
    Configured, ReleaseStep, WipeTimeouts, decide_release, facts_of, wiping_version,
};

/// What a provider reports about a Machine's infrastructure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The power state.
    pub power: PowerState,
    /// Addresses, when the provider knows them.
    pub addresses: Vec<MachineAddress>,
    /// The infrastructure's provider ID (`azure:///subscriptions/…`), recorded in
    /// `spec.providerID`; `None` when the provider has none to record.
    pub provider_id: Option<String>,
    /// What the infrastructure looks like, for the `InfrastructureReady` message (such as
    /// the VM's provisioning and power state); `None` for the default message.
    pub detail: Option<String>,
}

/// A provider call that failed: a reason for the condition, a message for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ProviderError {
    /// CamelCase reason (`BmcUnreachable`, `CredentialsMissing`, …).
    pub reason: String,
    /// What happened and what to do; never a credential.
    pub message: String,
    /// The infrastructure that was provisioned no longer exists: `InfrastructureReady` turns
    /// False with this reason and message.
    pub gone: bool,
    /// The Machine's spec can never be provisioned as it is (see the module's list):
    /// recorded in `status.failureReason`, not retried until the spec changes.
    pub terminal: bool,
}

impl ProviderError {
    /// A failure with this reason and message.
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
            gone: false,
            terminal: false,
        }
    }

    /// A failure that retrying cannot cure: the Machine's spec must change.
    pub fn terminal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            terminal: true,
            ..Self::new(reason, message)
        }
    }

    /// The provisioned infrastructure was found gone.
    pub fn gone(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            gone: true,
            ..Self::new(reason, message)
        }
    }
}

/// A provider of Machines.
pub trait Provider: Send + Sync + 'static {
    /// The `spec.provider` this provider owns.
    const KIND: MachineProvider;
    /// Its finalizer on Machines.
    const FINALIZER: &'static str;
    /// Its field manager for status.
    const FIELD_MANAGER: &'static str;

    /// Creates (or finds) and starts the infrastructure; idempotent.
    fn create(
        &self,
        machine: &Machine,
    ) -> impl Future<Output = Result<Observed, ProviderError>> + Send;
    /// Observes the infrastructure.
    fn observe(
        &self,
        machine: &Machine,
    ) -> impl Future<Output = Result<Observed, ProviderError>> + Send;
    /// Releases the infrastructure; idempotent.
    fn delete(&self, machine: &Machine) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// Whether a Machine being deleted needs [`Provider::delete`]. By default only one that
    /// was provisioned once; a provider whose failed `create` can leave resources behind
    /// (the Azure provider's NIC) says `true`.
    fn must_release(&self, machine: &Machine) -> bool {
        next_step(machine) == Step::Observe
    }
}

/// A provider shared (with its operation handler) behind an `Arc` is the provider itself:
/// every method forwards, `must_release` too.
impl<P: Provider> Provider for Arc<P> {
    const KIND: MachineProvider = P::KIND;
    const FINALIZER: &'static str = P::FINALIZER;
    const FIELD_MANAGER: &'static str = P::FIELD_MANAGER;

    fn create(
        &self,
        machine: &Machine,
    ) -> impl Future<Output = Result<Observed, ProviderError>> + Send {
        P::create(self, machine)
    }
    fn observe(
        &self,
        machine: &Machine,
    ) -> impl Future<Output = Result<Observed, ProviderError>> + Send {
        P::observe(self, machine)
    }
    fn delete(&self, machine: &Machine) -> impl Future<Output = Result<(), ProviderError>> + Send {
        P::delete(self, machine)
    }
    fn must_release(&self, machine: &Machine) -> bool {
        P::must_release(self, machine)
    }
}

/// Runs a provider as both providers do, until one part ends (each is meant to run for
/// ever, so the end is logged): a watch of every Machine into a store, the MachineOperation
/// handler that `operations` builds over that store (operations run by this provider, under
/// its field manager), and the provider loop over `provider`.
pub async fn run_with_operations<P, E>(
    client: Client,
    provider: Arc<P>,
    settings: Settings,
    operations: impl FnOnce(kube::runtime::reflector::Store<Machine>) -> E,
) where
    P: Provider,
    E: crate::handler::Execute,
{
    use kube::runtime::WatchStreamExt;
    let (machines, writer) = kube::runtime::reflector::store::<Machine>();
    let reflect = watcher(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .touched_objects()
    .for_each(|_| futures::future::ready(()));
    let handler = crate::handler::OperationHandler::new(
        client.clone(),
        unbounded_api::HandlerKind::Provider,
        P::FIELD_MANAGER,
        None,
        operations(machines),
    );
    let handle_operations = async move {
        if let Err(error) = handler.run().await {
            tracing::error!(provider = ?P::KIND, %error, "the operation handler stopped");
        }
    };
    tokio::select! {
        () = reflect => tracing::error!(provider = ?P::KIND, "the Machine watch of the provider ended"),
        () = handle_operations => {}
        () = run(client, provider, settings) => tracing::error!(provider = ?P::KIND, "the provider loop ended"),
    }
}

/// How the loop paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How often a provisioned Machine is observed.
    pub poll: Duration,
    /// The first wait after a failure; it doubles up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest wait after failures.
    pub max_backoff: Duration,
    /// How often a deleted Machine whose Node still exists is looked at again (besides the
    /// Node watch): fixed, since waiting is not failing.
    pub wait: Duration,
    /// How long a deleted Machine waits for its agent's wipe of its disks before it is held.
    pub wipe_timeouts: WipeTimeouts,
    /// How often a Machine held for its wipe is looked at again (besides its own changes).
    pub held: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(30),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            wait: Duration::from_secs(5),
            wipe_timeouts: WipeTimeouts::default(),
            held: Duration::from_secs(60),
        }
    }
}

/// What the loop does next for a Machine that is not being deleted (a pure decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Not provisioned yet: create.
    Create,
    /// Provisioned: observe.
    Observe,
    /// A terminal failure was recorded for the current spec: nothing until it changes.
    Failed,
}

/// Create until `InfrastructureReady` is True once, then observe; nothing while a terminal
/// failure is recorded for the Machine's current generation (the failure reason, and the
/// condition False with that reason for this generation).
pub fn next_step(machine: &Machine) -> Step {
    let status = machine.status.as_ref();
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let failed = status
        .and_then(|s| s.failure_reason.as_deref())
        .zip(condition::find(
            conditions,
            conditions::INFRASTRUCTURE_READY,
        ))
        .is_some_and(|(reason, c)| {
            c.status == "False"
                && c.reason == reason
                && c.observed_generation == machine.metadata.generation
        });
    if failed {
        Step::Failed
    } else if condition::is_true(conditions, conditions::INFRASTRUCTURE_READY) {
        Step::Observe
    } else {
        Step::Create
    }
}

/// What to do with `spec.providerID` after an observation (a pure decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderIdAction {
    /// Nothing to record, or already recorded.
    Keep,
    /// Record this one.
    Record(String),
    /// `spec.providerID` names other infrastructure (it is immutable once set).
    Mismatch {
        /// What the Machine says.
        recorded: String,
        /// What the provider found.
        observed: String,
    },
}

/// Decides what to do with `spec.providerID` given what the provider observed.
pub fn provider_id_action(recorded: Option<&str>, observed: Option<&str>) -> ProviderIdAction {
    match (recorded, observed) {
        (_, None) => ProviderIdAction::Keep,
        (None, Some(id)) => ProviderIdAction::Record(id.to_owned()),
        (Some(r), Some(o)) if r == o => ProviderIdAction::Keep,
        (Some(r), Some(o)) => ProviderIdAction::Mismatch {
            recorded: r.to_owned(),
            observed: o.to_owned(),
        },
    }
}

/// The wait after `failures` consecutive failures: doubling, capped, never zero.
pub fn backoff(settings: &Settings, failures: u32) -> Duration {
    settings
        .first_backoff
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(settings.max_backoff)
}

/// When to look at a Machine again after `error`, the `failures`-th in a row: waiting
/// (for the Node) at the fixed [`Settings::wait`], failures with the backoff.
pub fn requeue_after(settings: &Settings, error: &LoopError, failures: u32) -> Duration {
    match error {
        LoopError::WaitingForNode(_) | LoopError::WaitingForWipe(_) => settings.wait,
        LoopError::WipeHeld { .. } => settings.held,
        LoopError::Provider(_) | LoopError::Kube { .. } | LoopError::Finalizer(_) => {
            backoff(settings, failures)
        }
    }
}

/// Errors of the loop itself.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The provider failed (reported in status and an Event already).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A call to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// Adding or removing the provider's finalizer failed.
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<LoopError>>),
    /// The Node still exists: the controller drains and deletes it first.
    #[error("waiting for Node {0} to be drained and deleted")]
    WaitingForNode(String),
    /// The agent has not reported the disks wiped yet.
    #[error("{0}")]
    WaitingForWipe(String),
    /// The wipe failed or timed out: the Machine is kept (`DisksWiped=False`).
    #[error("{reason}: {message}")]
    WipeHeld {
        /// `WipeFailed` or `WipeTimedOut`.
        reason: &'static str,
        /// What happened and what to do.
        message: String,
    },
}

struct Context<P> {
    provider: P,
    client: Client,
    recorder: Recorder,
    settings: Settings,
    failures: Mutex<HashMap<String, u32>>,
}

/// Runs the loop for every Machine of `P::KIND` until the watch ends.
pub async fn run<P: Provider>(client: Client, provider: P, settings: Settings) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: P::FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let context = Arc::new(Context {
        provider,
        client: client.clone(),
        recorder,
        settings,
        failures: Mutex::new(HashMap::new()),
    });
    let controller = Controller::new(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    );
    let machines = controller.store();
    // A deleted Machine waits for its Node: reconcile it the moment the Node changes or
    // goes. Only Machines being deleted, so Node status updates never poll a BMC.
    let waiting_on = move |node: Node| {
        let name = node.name_any();
        machines
            .state()
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some() && m.node_name() == name)
            .map(|m| ObjectRef::from_obj(m.as_ref()))
            .collect::<Vec<_>>()
    };
    controller
        .watches(
            Api::<Node>::all(client),
            watcher::Config::default(),
            waiting_on,
        )
        .run(reconcile::<P>, error_policy::<P>, context)
        .for_each(|_| async {})
        .await;
}

async fn reconcile<P: Provider>(
    machine: Arc<Machine>,
    ctx: Arc<Context<P>>,
) -> Result<Action, LoopError> {
    // `spec.provider` is immutable (CEL), so a Machine is ours for its whole life or never.
    if machine.spec.provider != P::KIND {
        return Ok(Action::await_change());
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let result = finalizer(&api, P::FINALIZER, machine, |event| async {
        match event {
            Finalizer::Apply(m) => apply(&m, &ctx).await,
            Finalizer::Cleanup(m) => cleanup(&m, &ctx).await,
        }
    })
    .await;
    match result {
        Ok(action) => Ok(action),
        Err(kube::runtime::finalizer::Error::ApplyFailed(e))
        | Err(kube::runtime::finalizer::Error::CleanupFailed(e)) => Err(e),
        Err(e) => Err(LoopError::Finalizer(Box::new(e))),
    }
}

async fn apply<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<Action, LoopError> {
    let step = next_step(machine);
    let result = match step {
        Step::Create => ctx.provider.create(machine).await,
        Step::Observe => ctx.provider.observe(machine).await,
        // Retrying cannot help; a change of the spec brings the Machine back here.
        Step::Failed => return Ok(Action::await_change()),
    };
    let name = machine.name_any();
    let result = match result {
        Ok(observed) => record_provider_id(ctx, machine, &observed)
            .await
            .map(|()| observed),
        Err(error) => Err(error),
    };
    match result {
        Ok(observed) => {
            if step == Step::Create {
                event(
                    ctx,
                    machine,
                    EventType::Normal,
                    "Provisioned",
                    "infrastructure created and powered on",
                )
                .await;
            }
            write_status(ctx, machine, Some(&observed), None).await?;
            if let Ok(mut f) = ctx.failures.lock() {
                f.remove(&name);
            }
            Ok(Action::requeue(ctx.settings.poll))
        }
        Err(error) => {
            warn(ctx, machine, &error).await;
            write_status(ctx, machine, None, Some((&error, step))).await?;
            Err(error.into())
        }
    }
}

/// Records the observed provider ID in `spec.providerID` (server-side apply under the
/// provider's field manager), or fails when the Machine names other infrastructure.
async fn record_provider_id<P: Provider>(
    ctx: &Context<P>,
    machine: &Machine,
    observed: &Observed,
) -> Result<(), ProviderError> {
    match provider_id_action(
        machine.spec.provider_id.as_deref(),
        observed.provider_id.as_deref(),
    ) {
        ProviderIdAction::Keep => Ok(()),
        ProviderIdAction::Mismatch { recorded, observed } => Err(ProviderError::terminal(
            "ProviderIDMismatch",
            format!(
                "spec.providerID is {recorded} but the provider's infrastructure is {observed}; \
                 spec.providerID is immutable: delete and recreate the Machine"
            ),
        )),
        ProviderIdAction::Record(id) => {
            let body = json!({
                "apiVersion": Machine::api_version(&()),
                "kind": Machine::kind(&()),
                "spec": {"providerID": id},
            });
            Api::<Machine>::all(ctx.client.clone())
                .patch(
                    &machine.name_any(),
                    &PatchParams::apply(P::FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map(drop)
                .map_err(|e| {
                    ProviderError::new(
                        "ProviderIDNotRecorded",
                        format!("recording spec.providerID {id}: {e}"),
                    )
                })
        }
    }
}

async fn cleanup<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<Action, LoopError> {
    let node = machine.node_name();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if nodes
        .get_opt(&node)
        .await
        .map_err(|source| LoopError::Kube {
            action: format!("reading Node {node}"),
            source,
        })?
        .is_some()
    {
        return Err(LoopError::WaitingForNode(node));
    }
    // By default, never provisioned (its BMC refused us, say): nothing was powered on,
    // nothing to release, and a broken BMC set-up must not keep the Machine from going away.
    if ctx.provider.must_release(machine) {
        release_disks(machine, ctx).await?;
        if let Err(error) = ctx.provider.delete(machine).await {
            warn(ctx, machine, &error).await;
            return Err(error.into());
        }
        event(
            ctx,
            machine,
            EventType::Normal,
            "Released",
            "infrastructure released",
        )
        .await;
    }
    Ok(Action::await_change())
}

/// What the configuration the Machine's disk was paved with says
/// ([`crate::release::wiping_version`]).
async fn configured<P>(machine: &Machine, ctx: &Context<P>) -> Configured {
    let Some(resolved) = wiping_version(machine) else {
        return Configured::NoConfiguration;
    };
    let name = resolved.version_name();
    match Api::<MachineConfigurationVersion>::all(ctx.client.clone())
        .get_opt(&name)
        .await
    {
        Ok(Some(version)) => Configured::from_storage(version.spec.template.storage.as_ref()),
        Ok(None) => Configured::Unreadable(format!("{name} does not exist")),
        Err(e) => Configured::Unreadable(format!("reading {name}: {e}")),
    }
}

/// The release of the disks ([`crate::release`]): `Ok` once the machine may be powered off;
/// the `DisksWiped` condition says why it waits or is held.
async fn release_disks<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<(), LoopError> {
    let configured = configured(machine, ctx).await;
    let step = decide_release(&facts_of(
        machine,
        configured,
        condition::now(),
        ctx.settings.wipe_timeouts,
    ));
    let wanted = condition::new_condition(
        conditions::DISKS_WIPED,
        step.condition_status(),
        step.reason(),
        step.message(),
        machine.metadata.generation,
    );
    let current = machine
        .status
        .as_ref()
        .and_then(|s| condition::find(&s.conditions, conditions::DISKS_WIPED));
    if current.is_none_or(|c| !condition::same_meaning(c, &wanted)) {
        if let ReleaseStep::Hold { reason, message } = &step {
            event(ctx, machine, EventType::Warning, reason, message).await;
        }
        write_release_condition(ctx, machine, wanted).await?;
    }
    match step {
        ReleaseStep::PowerOff { .. } => Ok(()),
        ReleaseStep::Wait { message } => Err(LoopError::WaitingForWipe(message)),
        ReleaseStep::Hold { reason, message } => Err(LoopError::WipeHeld { reason, message }),
    }
}

/// Writes the `DisksWiped` condition, with the provider's other status fields as they are
/// (with server-side apply, a field the manager leaves out is removed). Its transition
/// time is kept while its status does not change: the wait's timeout counts from it.
async fn write_release_condition<P: Provider>(
    ctx: &Context<P>,
    machine: &Machine,
    mut wanted: Condition,
) -> Result<(), LoopError> {
    let current = machine.status.clone().unwrap_or_default();
    if let Some(old) = condition::find(&current.conditions, conditions::DISKS_WIPED)
        && old.status == wanted.status
    {
        wanted.last_transition_time = old.last_transition_time.clone();
    }
    let mut list: Vec<Condition> =
        condition::find(&current.conditions, conditions::INFRASTRUCTURE_READY)
            .cloned()
            .into_iter()
            .collect();
    list.push(wanted);
    let mut status = serde_json::Map::new();
    status.insert("conditions".into(), json!(list));
    if let Some(power) = current.power {
        status.insert("power".into(), json!(power));
    }
    if !current.addresses.is_empty() {
        status.insert("addresses".into(), json!(current.addresses));
    }
    if let Some(reason) = &current.failure_reason {
        status.insert("failureReason".into(), json!(reason));
    }
    if let Some(message) = &current.failure_message {
        status.insert("failureMessage".into(), json!(message));
    }
    apply_status::<P>(ctx, machine, status, "writing DisksWiped on").await
}

/// Applies the provider's part of a Machine's status (server-side apply, its field manager).
async fn apply_status<P: Provider>(
    ctx: &Context<P>,
    machine: &Machine,
    status: serde_json::Map<String, serde_json::Value>,
    action: &str,
) -> Result<(), LoopError> {
    let body = json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "status": status,
    });
    Api::<Machine>::all(ctx.client.clone())
        .patch_status(
            &machine.name_any(),
            &PatchParams::apply(P::FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(drop)
        .map_err(|source| LoopError::Kube {
            action: format!("{action} Machine {}", machine.name_any()),
            source,
        })
}

fn error_policy<P: Provider>(
    machine: Arc<Machine>,
    error: &LoopError,
    ctx: Arc<Context<P>>,
) -> Action {
    if let LoopError::WaitingForNode(_)
    | LoopError::WaitingForWipe(_)
    | LoopError::WipeHeld { .. } = error
    {
        tracing::debug!(machine = %machine.name_any(), %error, "waiting");
        return Action::requeue(requeue_after(&ctx.settings, error, 0));
    }
    let failures = ctx.failures.lock().map_or(1, |mut f| {
        let n = f.entry(machine.name_any()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    tracing::info!(machine = %machine.name_any(), %error, failures, "provider reconcile failed");
    Action::requeue(requeue_after(&ctx.settings, error, failures))
}

/// A provider failure as a Warning Event (its reason and message, never a credential).
async fn warn<P>(ctx: &Context<P>, machine: &Machine, error: &ProviderError) {
    event(
        ctx,
        machine,
        EventType::Warning,
        &error.reason,
        &error.message,
    )
    .await;
}

async fn event<P>(ctx: &Context<P>, machine: &Machine, type_: EventType, reason: &str, note: &str) {
    let _ = ctx
        .recorder
        .publish(
            &Event {
                type_,
                reason: reason.into(),
                note: Some(note.into()),
                action: "Provision".into(),
                secondary: None,
            },
            &machine.object_ref(&()),
        )
        .await;
}

/// Writes the provider's status fields: power and addresses when observed, the
/// `InfrastructureReady` condition (True once created; False with the error's reason while
/// creating fails, when the infrastructure is gone or on a terminal failure; unchanged when
/// only an observation fails otherwise, with power `Unknown`), and `failureReason` and
/// `failureMessage` on a terminal failure (left out otherwise, which clears them: the
/// provider's field manager owns them).
async fn write_status<P: Provider>(
    ctx: &Context<P>,
    machine: &Machine,
    observed: Option<&Observed>,
    failure: Option<(&ProviderError, Step)>,
) -> Result<(), LoopError> {
    let current = machine.status.clone().unwrap_or_default();
    let generation = machine.metadata.generation;
    let ready_now = condition::is_true(&current.conditions, conditions::INFRASTRUCTURE_READY);
    let mut status = serde_json::Map::new();
    let condition = match (observed, failure) {
        (Some(o), _) => Some(condition::new_condition(
            conditions::INFRASTRUCTURE_READY,
            true,
            "Provisioned",
            o.detail
                .clone()
                .unwrap_or_else(|| "the infrastructure is created and powered on".into()),
            generation,
        )),
        (None, Some((error, step))) if step == Step::Create || error.gone || error.terminal => {
            Some(condition::new_condition(
                conditions::INFRASTRUCTURE_READY,
                false,
                &error.reason,
                error.message.clone(),
                generation,
            ))
        }
        (None, _) if ready_now => {
            condition::find(&current.conditions, conditions::INFRASTRUCTURE_READY).cloned()
        }
        (None, _) => None,
    };
    if let Some(mut c) = condition {
        // Keep the transition time when the meaning did not change.
        if let Some(old) = condition::find(&current.conditions, &c.type_)
            && condition::same_meaning(old, &c)
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
        status.insert("conditions".into(), json!([c]));
    }
    if let Some((error, _)) = failure
        && error.terminal
    {
        status.insert("failureReason".into(), json!(error.reason));
        status.insert("failureMessage".into(), json!(error.message));
    }
    match observed {
        Some(o) => {
            status.insert("power".into(), json!(o.power));
            if !o.addresses.is_empty() {
                status.insert("addresses".into(), json!(o.addresses));
            }
        }
        None => {
            status.insert("power".into(), json!(PowerState::Unknown));
        }
    }
    apply_status::<P>(ctx, machine, status, "writing the status of").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap() {
        let s = Settings {
            poll: Duration::from_secs(30),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(60),
            wait: Duration::from_secs(3),
            ..Settings::default()
        };
        let waits: Vec<u64> = (1..=6).map(|n| backoff(&s, n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
    }

    #[test]
    fn waiting_for_the_node_is_not_a_failure() {
        let s = Settings::default();
        let waiting = LoopError::WaitingForNode("n".into());
        let failed = LoopError::Provider(ProviderError::new("BmcUnreachable", ""));
        let cases = [
            (&waiting, 1, s.wait),
            (&waiting, 40, s.wait),
            (&failed, 1, s.first_backoff),
            (&failed, 40, s.max_backoff),
            (&LoopError::WaitingForWipe("w".into()), 7, s.wait),
            (
                &LoopError::WipeHeld {
                    reason: "WipeFailed",
                    message: String::new(),
                },
                7,
                s.held,
            ),
            (
                &LoopError::Kube {
                    action: "x".into(),
                    source: kube::Error::TlsRequired,
                },
                2,
                s.first_backoff * 2,
            ),
        ];
        for (error, failures, expected) in cases {
            assert_eq!(
                requeue_after(&s, error, failures),
                expected,
                "{error} after {failures}"
            );
        }
    }

    #[test]
    fn provider_id_table() {
        use ProviderIdAction::*;
        let cases = [
            (None, None, Keep),
            (Some("azure:///a"), None, Keep),
            (None, Some("azure:///a"), Record("azure:///a".into())),
            (Some("azure:///a"), Some("azure:///a"), Keep),
            (
                Some("azure:///a"),
                Some("azure:///b"),
                Mismatch {
                    recorded: "azure:///a".into(),
                    observed: "azure:///b".into(),
                },
            ),
        ];
        for (recorded, observed, expected) in cases {
            assert_eq!(
                provider_id_action(recorded, observed),
                expected,
                "{recorded:?} {observed:?}"
            );
        }
    }

    #[test]
    fn a_terminal_failure_holds_until_the_spec_changes() {
        let machine = |generation: i64, reason: Option<&str>, condition: (bool, &str, i64)| {
            let mut m = Machine::new(
                "m",
                serde_json::from_value(json!({"provider": "pxe"})).unwrap(),
            );
            m.metadata.generation = Some(generation);
            m.status = Some(unbounded_api::MachineStatus {
                failure_reason: reason.map(str::to_owned),
                conditions: vec![condition::new_condition(
                    conditions::INFRASTRUCTURE_READY,
                    condition.0,
                    condition.1,
                    "",
                    Some(condition.2),
                )],
                ..Default::default()
            });
            m
        };
        let cases = [
            (
                "recorded for this generation",
                machine(
                    3,
                    Some("BmcAddressInvalid"),
                    (false, "BmcAddressInvalid", 3),
                ),
                Step::Failed,
            ),
            (
                "the spec changed since: try again",
                machine(
                    4,
                    Some("BmcAddressInvalid"),
                    (false, "BmcAddressInvalid", 3),
                ),
                Step::Create,
            ),
            (
                "a transient failure is retried",
                machine(3, None, (false, "BmcUnreachable", 3)),
                Step::Create,
            ),
            (
                "a reason left over from another failure does not hold",
                machine(3, Some("BmcAddressInvalid"), (false, "BmcUnreachable", 3)),
                Step::Create,
            ),
            (
                "failed while observing, after the spec changed: observe again",
                machine(5, Some("ProviderIDMismatch"), (true, "Provisioned", 5)),
                Step::Observe,
            ),
        ];
        for (case, machine, expected) in cases {
            assert_eq!(next_step(&machine), expected, "{case}");
        }
    }

    #[test]
    fn create_until_ready_then_observe() {
        let mut machine = Machine::new(
            "m",
            serde_json::from_value(json!({"provider": "pxe"})).unwrap(),
        );
        assert_eq!(next_step(&machine), Step::Create);
        let mut status = unbounded_api::MachineStatus::default();
        status.conditions.push(condition::new_condition(
            conditions::INFRASTRUCTURE_READY,
            false,
            "BmcUnreachable",
            "",
            None,
        ));
        machine.status = Some(status.clone());
        assert_eq!(next_step(&machine), Step::Create);
        status.conditions = vec![condition::new_condition(
            conditions::INFRASTRUCTURE_READY,
            true,
            "Provisioned",
            "",
            None,
        )];
        machine.status = Some(status);
        assert_eq!(next_step(&machine), Step::Observe);
    }
}
