//! The handler side of MachineOperations: what an agent or a provider writes to execute the
//! operations the controller routes to it.
//!
//! The protocol, all on the MachineOperation's status:
//! 1. The controller sets `state: Pending` and `routedTo` (`Agent` or `Provider`) when the
//!    operation's turn has come on its Machine.
//! 2. A handler of that kind that runs the operation's name on that Machine **claims** it:
//!    a server-side apply under its own field manager that sets `state: InProgress`,
//!    `startTime` and `handler`, with the `resourceVersion` it saw as a precondition. Of two
//!    handlers racing, exactly one wins; the other gets a conflict and lets go.
//! 3. The handler runs the operation and **finishes** it: `Complete` or `Failed` with a
//!    message, again with a precondition, so that an operation the controller has already
//!    failed (deadline, Machine deleted) is not overwritten.
//! 4. A handler that restarts finds its `InProgress` operations (`handler` is its field
//!    manager) and runs them again with `resumed = true`; an operation must therefore be
//!    safe to resume (a `reboot` checks whether the machine already came back).
//!
//! [`OperationHandler::run`] does all of it over a watch; [`claimable`], [`resumable`],
//! [`OperationHandler::claim`] and [`OperationHandler::finish`] are the pieces, for handlers
//! that drive their own loop.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use unbounded_api::well_known::labels;
use unbounded_api::{HandlerKind, MachineOperation, OperationState};

/// Errors of the handler side.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A call to the API server failed.
    #[error("{action} MachineOperation {name}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The operation.
        name: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// The watch ended.
    #[error("the watch of MachineOperations ended")]
    WatchEnded,
}

/// How an operation ended, with a message for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It worked.
    Complete(String),
    /// It did not; the message says why.
    Failed(String),
}

impl Outcome {
    fn state(&self) -> OperationState {
        match self {
            Self::Complete(_) => OperationState::Complete,
            Self::Failed(_) => OperationState::Failed,
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::Complete(m) | Self::Failed(m) => m,
        }
    }
}

/// What the result of a claim was.
#[derive(Debug)]
pub enum Claim {
    /// This handler owns the operation now (the updated object).
    Won(Box<MachineOperation>),
    /// Someone else changed the operation first (another handler claimed it, or the
    /// controller failed it).
    Lost,
}

/// Executes operations. Implemented by the agent and by each provider.
pub trait Execute: Send + Sync + 'static {
    /// Whether this handler runs `operation_name` on the Machine `machine`.
    fn handles(&self, machine: &str, operation_name: &str) -> bool;

    /// Runs the operation. `resumed` is true when this handler claimed it before and
    /// restarted since: the work may be half done (or done).
    fn execute(
        &self,
        operation: Arc<MachineOperation>,
        resumed: bool,
    ) -> impl Future<Output = Outcome> + Send;
}

/// The Machine a single-machine operation targets.
pub fn target(operation: &MachineOperation) -> Option<&str> {
    operation.spec.machine_ref.as_ref().map(|r| r.name.as_str())
}

/// Whether a handler of `kind` that runs `handles` should claim this operation now.
pub fn claimable(
    operation: &MachineOperation,
    kind: HandlerKind,
    handles: impl Fn(&str, &str) -> bool,
) -> bool {
    let Some(machine) = target(operation) else {
        return false;
    };
    let status = operation.status.as_ref();
    operation.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.state) == Some(OperationState::Pending)
        && status.and_then(|s| s.routed_to) == Some(kind)
        && handles(machine, &operation.spec.operation_name)
}

/// Whether this operation was claimed by the handler with `field_manager` and is still
/// running: after a restart, the handler resumes it.
pub fn resumable(operation: &MachineOperation, field_manager: &str) -> bool {
    let status = operation.status.as_ref();
    target(operation).is_some()
        && status.and_then(|s| s.state) == Some(OperationState::InProgress)
        && status.and_then(|s| s.handler.as_deref()) == Some(field_manager)
}

/// The operations a handler is working on: claimed (or resumed) and not yet finished,
/// its outcome written or found not to be its own any more. For a shutdown that waits for
/// work under way, and for tests that must know the handler is done with one.
#[derive(Debug, Clone, Default)]
pub struct WorkingOn(Arc<Mutex<BTreeSet<String>>>);

impl WorkingOn {
    /// Whether the handler is working on the operation `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(name)
    }
}

/// Executes the MachineOperations routed to one handler.
#[derive(Debug)]
pub struct OperationHandler<E> {
    api: Api<MachineOperation>,
    kind: HandlerKind,
    field_manager: String,
    label_selector: String,
    executor: Arc<E>,
    running: WorkingOn,
}

impl<E: Execute> OperationHandler<E> {
    /// A handler of `kind` that writes under `field_manager`. `machine` narrows the watch to
    /// one Machine's operations (an agent); `None` watches every single-machine operation
    /// (a provider).
    pub fn new(
        client: Client,
        kind: HandlerKind,
        field_manager: impl Into<String>,
        machine: Option<&str>,
        executor: E,
    ) -> Self {
        let label_selector = match machine {
            Some(name) => format!("{}={name}", labels::MACHINE),
            None => labels::MACHINE.to_owned(),
        };
        Self {
            api: Api::all(client),
            kind,
            field_manager: field_manager.into(),
            label_selector,
            executor: Arc::new(executor),
            running: WorkingOn::default(),
        }
    }

    /// What the handler is working on (a view that stays current after [`Self::run`]).
    pub fn working_on(&self) -> WorkingOn {
        self.running.clone()
    }

    /// Watches, claims, executes and finishes operations until the watch fails for good.
    ///
    /// The operations it runs are tasks owned by this future: dropping it (a provider that
    /// stops leading) stops them too, so no BMC or VM call is made after that.
    pub async fn run(self) -> Result<(), HandlerError> {
        let this = Arc::new(self);
        let config = watcher::Config::default().labels(&this.label_selector);
        let mut stream = watcher(this.api.clone(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut running = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(operation)) => {
                        if let Some(work) = this.clone().consider(operation) {
                            running.spawn(work);
                        }
                    }
                    Some(Err(error)) => tracing::warn!(%error, "MachineOperation watch error; retrying"),
                    None => break,
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        Err(HandlerError::WatchEnded)
    }

    /// The work on one observed operation, when it is ours to claim or to resume.
    fn consider(
        self: Arc<Self>,
        operation: MachineOperation,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let executor = self.executor.clone();
        let claim = claimable(&operation, self.kind, |m, n| executor.handles(m, n));
        let resume = resumable(&operation, &self.field_manager);
        if !claim && !resume {
            return None;
        }
        let name = operation.name_any();
        {
            let mut running = self.running.0.lock().ok()?;
            if !running.insert(name.clone()) {
                return None;
            }
        }
        Some(async move {
            if let Err(error) = self.work(operation, resume).await {
                tracing::warn!(%error, operation = %name, "operation handling failed");
            }
            if let Ok(mut running) = self.running.0.lock() {
                running.remove(&name);
            }
        })
    }

    async fn work(&self, operation: MachineOperation, resumed: bool) -> Result<(), HandlerError> {
        let operation = if resumed {
            operation
        } else {
            match self.claim(&operation).await? {
                Claim::Won(operation) => *operation,
                Claim::Lost => return Ok(()),
            }
        };
        let name = operation.name_any();
        tracing::info!(operation = %name, name = %operation.spec.operation_name, resumed, "executing");
        let outcome = self.executor.execute(Arc::new(operation), resumed).await;
        tracing::info!(operation = %name, outcome = ?outcome.state(), "finished");
        self.finish(&name, &outcome).await.map(|_| ())
    }

    /// Claims a Pending operation (see [`claim`]).
    pub async fn claim(&self, operation: &MachineOperation) -> Result<Claim, HandlerError> {
        claim(&self.api, &self.field_manager, operation).await
    }

    /// Writes how an operation ended (see [`finish`]).
    pub async fn finish(&self, name: &str, outcome: &Outcome) -> Result<bool, HandlerError> {
        finish(&self.api, &self.field_manager, name, outcome).await
    }
}

/// Claims a Pending operation: `InProgress` under `field_manager`, with the observed
/// `resourceVersion` as a precondition. For handlers that drive their own loop (the agent
/// learns its operations from its role rather than a label watch).
pub async fn claim(
    api: &Api<MachineOperation>,
    field_manager: &str,
    operation: &MachineOperation,
) -> Result<Claim, HandlerError> {
    let name = operation.name_any();
    let patch = json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "MachineOperation",
        "metadata": {"name": name, "resourceVersion": operation.resource_version()},
        "status": {
            "state": OperationState::InProgress,
            "startTime": Time(unbounded_api::condition::now()),
            "handler": field_manager,
            "message": format!("{field_manager} is running it"),
        },
    });
    let params = PatchParams::apply(field_manager).force();
    match api
        .patch_status(&name, &params, &Patch::Apply(&patch))
        .await
    {
        Ok(updated) => Ok(Claim::Won(Box::new(updated))),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
            Ok(Claim::Lost)
        }
        Err(source) => Err(HandlerError::Kube {
            action: "claiming",
            name,
            source,
        }),
    }
}

/// Writes how an operation ended, unless it is no longer `field_manager`'s (the controller
/// failed it meanwhile, or it was deleted). Returns whether the outcome was written.
pub async fn finish(
    api: &Api<MachineOperation>,
    field_manager: &str,
    name: &str,
    outcome: &Outcome,
) -> Result<bool, HandlerError> {
    let fields = json!({
        "state": outcome.state(),
        "completionTime": Time(unbounded_api::condition::now()),
        "message": outcome.message(),
    });
    write_own_status(api, field_manager, name, "finishing", fields).await
}

/// Writes a step's message on an operation `field_manager` is running (still `InProgress`),
/// unless it is no longer its own. Returns whether it was written.
pub async fn progress(
    api: &Api<MachineOperation>,
    field_manager: &str,
    name: &str,
    message: &str,
) -> Result<bool, HandlerError> {
    let fields = json!({"state": OperationState::InProgress, "message": message});
    write_own_status(api, field_manager, name, "reporting progress on", fields).await
}

/// Server-side applies `fields` (plus the claim's `startTime` and `handler`, so that nothing
/// the handler owns is dropped) to the status of an operation that is still
/// `field_manager`'s; false when it is not (or is gone). A conflict means the object changed
/// between read and write: read again, decide again; a handful of rounds is plenty, nothing
/// else writes in a loop.
async fn write_own_status(
    api: &Api<MachineOperation>,
    field_manager: &str,
    name: &str,
    action: &'static str,
    fields: serde_json::Value,
) -> Result<bool, HandlerError> {
    let kube_err = |action, source| HandlerError::Kube {
        action,
        name: name.to_owned(),
        source,
    };
    for _ in 0..5 {
        let Some(current) = api
            .get_opt(name)
            .await
            .map_err(|e| kube_err("reading", e))?
        else {
            return Ok(false);
        };
        if !resumable(&current, field_manager) {
            return Ok(false);
        }
        let start_time = current.status.as_ref().and_then(|s| s.start_time.clone());
        let mut status = fields.clone();
        if let Some(status) = status.as_object_mut() {
            status.insert("startTime".into(), json!(start_time));
            status.insert("handler".into(), json!(field_manager));
        }
        let patch = json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "MachineOperation",
            "metadata": {"name": name, "resourceVersion": current.resource_version()},
            "status": status,
        });
        let params = PatchParams::apply(field_manager).force();
        match api.patch_status(name, &params, &Patch::Apply(&patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(source) => return Err(kube_err(action, source)),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::{MachineOperationSpec, MachineOperationStatus, MachineRef};

    fn operation(
        state: Option<OperationState>,
        routed: Option<HandlerKind>,
        handler: Option<&str>,
    ) -> MachineOperation {
        let mut op = MachineOperation::new(
            "op",
            MachineOperationSpec {
                machine_ref: Some(MachineRef { name: "m1".into() }),
                machine_selector: None,
                operation_name: "reboot".into(),
                parameters: Default::default(),
                ttl_seconds_after_finished: None,
                active_deadline_seconds: None,
            },
        );
        op.status = Some(MachineOperationStatus {
            state,
            routed_to: routed,
            handler: handler.map(str::to_owned),
            ..Default::default()
        });
        op
    }

    #[test]
    fn claimable_table() {
        let all = |_: &str, _: &str| true;
        let cases = [
            (
                "routed to us",
                Some(OperationState::Pending),
                Some(HandlerKind::Agent),
                true,
            ),
            (
                "not routed yet (queued)",
                Some(OperationState::Pending),
                None,
                false,
            ),
            (
                "routed to the provider",
                Some(OperationState::Pending),
                Some(HandlerKind::Provider),
                false,
            ),
            (
                "already claimed",
                Some(OperationState::InProgress),
                Some(HandlerKind::Agent),
                false,
            ),
            (
                "finished",
                Some(OperationState::Complete),
                Some(HandlerKind::Agent),
                false,
            ),
            ("no status yet", None, None, false),
        ];
        for (case, state, routed, expected) in cases {
            let op = operation(state, routed, None);
            assert_eq!(claimable(&op, HandlerKind::Agent, all), expected, "{case}");
        }
        let op = operation(
            Some(OperationState::Pending),
            Some(HandlerKind::Agent),
            None,
        );
        assert!(
            !claimable(&op, HandlerKind::Agent, |m, _| m == "m2"),
            "another machine's"
        );
        assert!(
            !claimable(&op, HandlerKind::Agent, |_, n| n == "shutdown"),
            "a name we do not run"
        );
    }

    #[test]
    fn resumable_only_our_in_progress() {
        let ours = operation(
            Some(OperationState::InProgress),
            Some(HandlerKind::Agent),
            Some("me"),
        );
        assert!(resumable(&ours, "me"));
        assert!(!resumable(&ours, "someone-else"));
        let done = operation(
            Some(OperationState::Complete),
            Some(HandlerKind::Agent),
            Some("me"),
        );
        assert!(!resumable(&done, "me"));
    }
}
