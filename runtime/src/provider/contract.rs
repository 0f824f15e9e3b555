//! What a provider answers ([`Provider`]: create, observe, delete) and what it reports
//! ([`Observed`], [`ProviderError`]), and when the loop calls which ([`next_step`]).

use std::future::Future;
use std::sync::Arc;

use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, MachineAddress, MachineProvider, PowerState, condition};

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
