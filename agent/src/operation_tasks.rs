//! The operations the controller routes to this agent, each run by a task of its own: the
//! agent learns them from its role ([`unbounded_api::agent::operations_in`]), claims each
//! ([`unbounded_runtime::handler`]), runs it ([`crate::operations`] decides what a request
//! means and what a reboot's step is) and writes how it ended.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use unbounded_api::agent::operations_in;
use unbounded_api::well_known::field_managers;
use unbounded_api::{AgentReboot, HandlerKind, Machine};
use unbounded_runtime::handler::{self, Claim, Outcome};

use crate::apply_files::{ContainerFacts, ContainerSystemd, Target};
use crate::context::Context;
use crate::operations::{self, AfterRecord, RebootStep, Request, Scope};
use crate::plan::ContainerState;
use crate::systemd::Systemd;
use unbounded_api::MachineOperation;
use unbounded_api::in_place::AgentApply;

/// Starts work on the operations the role routes to this agent.
pub(crate) fn consider_operations(ctx: &Arc<Context>, role: &ClusterRole, machine: &Machine) {
    let names = operations_in(role.rules.as_deref().unwrap_or_default());
    let recorded_reboot = machine
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.reboot.clone());
    for name in names {
        {
            let Ok(mut running) = ctx.running_operations.lock() else {
                return;
            };
            if !running.insert(name.clone()) {
                continue;
            }
        }
        let ctx = ctx.clone();
        let recorded_reboot = recorded_reboot.clone();
        tokio::spawn(async move {
            if let Err(error) = handle_operation(&ctx, &name, recorded_reboot.as_ref()).await {
                tracing::warn!(%error, operation = %name, "handling the operation failed");
            }
            if let Ok(mut running) = ctx.running_operations.lock() {
                running.remove(&name);
            }
        });
    }
}

async fn handle_operation(
    ctx: &Context,
    name: &str,
    recorded_reboot: Option<&AgentReboot>,
) -> Result<(), handler::HandlerError> {
    let Ok(operation) = ctx.operations.get(name).await else {
        return Ok(());
    };
    let field_manager = field_managers::AGENT;
    let ours = |m: &str, n: &str| {
        m == ctx.identity.machine && unbounded_api::well_known::operations::AGENT.contains(&n)
    };
    let resumed = handler::resumable(&operation, field_manager);
    let operation = if resumed {
        operation
    } else if handler::claimable(&operation, HandlerKind::Agent, ours) {
        match handler::claim(&ctx.operations, field_manager, &operation).await? {
            Claim::Won(op) => *op,
            Claim::Lost => return Ok(()),
        }
    } else {
        return Ok(());
    };
    let request = operations::parse(&operation.spec.operation_name, &operation.spec.parameters);
    println!(
        "unbounded-agent: running {} ({name})",
        operation.spec.operation_name
    );
    if operation.spec.operation_name == unbounded_api::well_known::operations::APPLY_FILES {
        let Some(outcome) = apply_files(ctx, name, &operation).await else {
            // Postponed: still InProgress under our field manager, resumed on the next pass.
            return Ok(());
        };
        handler::finish(&ctx.operations, field_manager, name, &outcome).await?;
        return Ok(());
    }
    let outcome = match request {
        Err(message) => Outcome::Failed(message),
        Ok(Request::RestartService { unit, scope }) => restart_service(ctx, &unit, scope).await,
        Ok(Request::Shutdown) => {
            let finished = handler::finish(
                &ctx.operations,
                field_manager,
                name,
                &Outcome::Complete("shutting down".into()),
            )
            .await?;
            if finished {
                // The outcome is written first: a powered-off machine reports nothing.
                if let Err(error) = ctx.host.power_off().await {
                    tracing::error!(%error, "power off failed");
                }
            }
            return Ok(());
        }
        Ok(Request::Reboot) => {
            match operations::reboot_step(name, recorded_reboot, &ctx.boot_id) {
                RebootStep::Done { from } => {
                    let _ = ctx.reporter.report(|agent| agent.reboot = None, None).await;
                    Outcome::Complete(format!(
                        "the machine rebooted (boot ID {from} → {})",
                        ctx.boot_id
                    ))
                }
                RebootStep::RecordAndReboot => {
                    let record = AgentReboot {
                        operation: name.to_owned(),
                        from_boot_id: ctx.boot_id.clone(),
                    };
                    let reported = ctx
                        .reporter
                        .report(|agent| agent.reboot = Some(record), None)
                        .await;
                    match reported.map(operations::after_record) {
                        Err(error) => Outcome::Failed(format!(
                            "could not record the reboot before rebooting: {error}"
                        )),
                        Ok(AfterRecord::Postpone(reason)) => {
                            // Still InProgress under our field manager: the next pass resumes it.
                            println!("unbounded-agent: {name}: reboot postponed: {reason}");
                            return Ok(());
                        }
                        Ok(AfterRecord::Reboot) => {
                            println!("unbounded-agent: rebooting for {name}");
                            match ctx.host.reboot().await {
                                Err(error) => Outcome::Failed(error.to_string()),
                                Ok(()) => {
                                    // The next boot's agent completes it; if the machine is still
                                    // up long after, say so.
                                    tokio::time::sleep(Duration::from_secs(600)).await;
                                    Outcome::Failed("reboot requested, but the machine is still up after 10 minutes".into())
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    handler::finish(&ctx.operations, field_manager, name, &outcome).await?;
    Ok(())
}

/// Runs an `applyFiles` with this boot's state held (no pave meanwhile); records the target
/// as what the container holds once every step ran.
async fn apply_files(ctx: &Context, name: &str, operation: &MachineOperation) -> Option<Outcome> {
    let mut kept = ctx.kept.lock().await;
    let unit = crate::systemd::container_unit(&ctx.node);
    let running = matches!(
        ctx.host.unit_state(&unit).await,
        Ok((load, active)) if crate::systemd::container_state(&load, &active) == ContainerState::Running
    );
    let facts = ContainerFacts {
        node: &ctx.node,
        paved: kept.state.paved.as_ref(),
        paving: kept.state.paving.is_some(),
        running,
    };
    let root = ctx.paths.machines.join(&ctx.node);
    let units = ContainerSystemd {
        socket: ctx.bus_socket(),
    };
    let target = Target {
        operations: &ctx.operations,
        name,
        field_manager: field_managers::AGENT,
        root: &root,
        units: &units,
    };
    let (outcome, applied) =
        crate::apply_files::run(&target, &ctx.versions, &operation.spec.parameters, &facts).await;
    if applied
        && let (Some(paved), Ok(apply)) = (
            kept.state.paved.as_mut(),
            AgentApply::from_parameters(&operation.spec.parameters),
        )
    {
        paved.configuration.version = apply.version;
        kept.save();
    }
    outcome
}

pub(crate) async fn restart_service(ctx: &Context, unit: &str, scope: Scope) -> Outcome {
    let timeout = Duration::from_secs(120);
    let result = match scope {
        Scope::Host => ctx.host.restart(unit, timeout).await,
        Scope::Node => match Systemd::container(&ctx.bus_socket()).await {
            Ok(container) => container.restart(unit, timeout).await,
            Err(error) => Err(error),
        },
    };
    let place = match scope {
        Scope::Host => "the host",
        Scope::Node => "the node container",
    };
    match result {
        Ok(()) => Outcome::Complete(format!("{unit} restarted in {place} and is active")),
        Err(error) => Outcome::Failed(format!("restarting {unit} in {place}: {error}")),
    }
}
