//! The shell around [`crate::plan`]: confirm, apply the actions, then follow them with one
//! live progress line until every machine is done or failed.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use unbounded_api::well_known::labels;
use unbounded_api::{
    Machine, MachineConfiguration, MachineOperation, MachineOperationSpec, MachineRef,
};

use crate::cli::ActArgs;
use crate::error::Error;
use crate::plan::{Action, Verb, needs_confirmation, plan};
use crate::progress::{Progress, operation_stage, repave_stage};
use crate::terminal::Terminal;

/// On every MachineOperation one invocation of the plugin creates: the same value, so that
/// one watch follows them all.
pub const BATCH_LABEL: &str = "kubectl.unbounded-cloud.io/batch";

/// The field manager of the plugin's writes.
pub const FIELD_MANAGER: &str = "kubectl-unbounded";

/// What was applied, for following it.
#[derive(Debug, Clone, Default)]
struct Applied {
    /// The batch label's value on the operations.
    batch: String,
    /// Machine → the repave time it was annotated with, and the version of a rollback.
    repaves: BTreeMap<String, (String, Option<i64>)>,
    /// Machine → the operation created on it.
    operations: BTreeMap<String, String>,
}

/// Plans `verb` on `machines`, asks when many are affected, applies it and follows it.
pub async fn run(
    client: &Client,
    verb: &Verb,
    machines: &[Machine],
    configurations: &[MachineConfiguration],
    args: &ActArgs,
    terminal: &Terminal,
) -> Result<(), Error> {
    let actions = plan(verb, machines, configurations)?;
    run_actions(client, verb, &actions, args, terminal).await
}

/// Asks when many are affected, applies `actions` (planned for `verb`) and follows them.
pub async fn run_actions(
    client: &Client,
    verb: &Verb,
    actions: &[Action],
    args: &ActArgs,
    terminal: &Terminal,
) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    if args.dry_run {
        writeln!(
            out,
            "Dry run: nothing is changed. {} would:",
            verb.command()
        )?;
        for action in actions {
            writeln!(out, "  {}", action.describe())?;
        }
        return Ok(());
    }
    if needs_confirmation(actions.len(), args.confirm_above, args.yes, args.dry_run) {
        confirm(verb, actions, terminal, &mut out)?;
    }
    let applied = apply(client, actions, args.active_deadline).await?;
    for action in actions {
        writeln!(out, "{}", done_line(action, &applied))?;
    }
    if args.no_wait {
        return Ok(());
    }
    drop(out);
    follow(client, verb, &applied, args, terminal).await
}

fn done_line(action: &Action, applied: &Applied) -> String {
    match action {
        Action::CreateOperation {
            machine,
            operation_name,
            ..
        } => format!(
            "created MachineOperation {} ({operation_name} on {machine})",
            applied.operations.get(machine).map_or("?", String::as_str)
        ),
        Action::Repave { machine, then } => format!(
            "requested a repave of {machine} at {}{}",
            applied.repaves.get(machine).map_or("?", |r| r.0.as_str()),
            then.map(|t| format!(", then {t}")).unwrap_or_default()
        ),
        Action::Rollback {
            machine,
            configuration,
            version,
            ..
        } => format!("pinned {machine} to {configuration} v{version} and requested a repave"),
        Action::ApplyConfiguration {
            machine,
            configuration,
            version,
            ..
        } => format!(
            "created MachineOperation {} (applyConfiguration of {configuration} v{version} on {machine})",
            applied.operations.get(machine).map_or("?", String::as_str)
        ),
    }
}

fn confirm(
    verb: &Verb,
    actions: &[Action],
    terminal: &Terminal,
    out: &mut impl Write,
) -> Result<(), Error> {
    let names: Vec<&str> = actions.iter().map(Action::machine).collect();
    if !terminal.stdin_tty {
        return Err(Error::NotConfirmed(format!(
            "{} would act on {} machines ({}); standard input is not a terminal to confirm: pass --yes",
            verb.command(),
            names.len(),
            names.join(", ")
        )));
    }
    write!(
        out,
        "{} {} machines ({})? [y/N] ",
        verb.command(),
        names.len(),
        names.join(", ")
    )?;
    out.flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Error::NotConfirmed(
            "not confirmed: nothing was changed".to_owned(),
        ))
    }
}

/// The name prefix of an operation on `machine` (the API server adds a suffix).
fn operation_prefix(machine: &str, operation_name: &str) -> String {
    // Names may be 200 characters (the API's limit for operations); keep room for the suffix.
    let machine: String = machine.chars().take(150).collect();
    format!("{machine}-{}-", operation_name.to_lowercase())
}

async fn apply(
    client: &Client,
    actions: &[Action],
    active_deadline: Option<i64>,
) -> Result<Applied, Error> {
    let now = Timestamp::now();
    // The controller's own format for the request (RFC 3339, seconds).
    let requested_at = unbounded_controller::repave::format_time(now);
    let mut applied = Applied {
        batch: format!("{}-{}", now.as_second(), std::process::id()),
        ..Applied::default()
    };
    let operations: Api<MachineOperation> = Api::all(client.clone());
    let machines: Api<Machine> = Api::all(client.clone());
    for action in actions {
        match action {
            Action::CreateOperation {
                machine,
                operation_name,
                parameters,
            } => {
                let name = create_operation(
                    &operations,
                    machine,
                    operation_name,
                    parameters.clone(),
                    active_deadline,
                    &applied,
                )
                .await?;
                applied.operations.insert(machine.clone(), name);
            }
            Action::ApplyConfiguration { machine, .. } => {
                let name = create_operation(
                    &operations,
                    machine,
                    unbounded_api::well_known::operations::APPLY_CONFIGURATION,
                    action.operation_parameters(),
                    active_deadline,
                    &applied,
                )
                .await?;
                applied.operations.insert(machine.clone(), name);
            }
            Action::Repave { machine, then } => {
                // The controller's request patch: it also clears the follow-up of an older
                // request.
                let patch = unbounded_controller::repave::request_patch(now, *then);
                machines
                    .patch(machine, &patch_params(), &Patch::Merge(patch))
                    .await
                    .map_err(Error::api(format!(
                        "annotating {machine} for a repave{}",
                        progress_note(&applied)
                    )))?;
                applied
                    .repaves
                    .insert(machine.clone(), (requested_at.clone(), None));
            }
            Action::Rollback {
                machine,
                configuration,
                version,
                ..
            } => {
                // One write: the pin and the request land together, so the repave cannot run
                // with the old version.
                let mut patch = unbounded_controller::repave::request_patch(now, None);
                patch["spec"] =
                    json!({"configurationRef": {"name": configuration, "version": version}});
                machines
                    .patch(machine, &patch_params(), &Patch::Merge(patch))
                    .await
                    .map_err(Error::api(format!("pinning {machine} to v{version}")))?;
                applied
                    .repaves
                    .insert(machine.clone(), (requested_at.clone(), Some(*version)));
            }
        }
    }
    Ok(applied)
}

/// Creates one MachineOperation on `machine`, labelled with the batch; returns its name.
async fn create_operation(
    api: &Api<MachineOperation>,
    machine: &str,
    operation_name: &str,
    parameters: BTreeMap<String, String>,
    active_deadline: Option<i64>,
    applied: &Applied,
) -> Result<String, Error> {
    let object = MachineOperation {
        metadata: ObjectMeta {
            generate_name: Some(operation_prefix(machine, operation_name)),
            labels: Some(BTreeMap::from([
                (labels::MACHINE.to_owned(), machine.to_owned()),
                (BATCH_LABEL.to_owned(), applied.batch.clone()),
            ])),
            ..ObjectMeta::default()
        },
        spec: MachineOperationSpec {
            machine_ref: Some(MachineRef {
                name: machine.to_owned(),
            }),
            machine_selector: None,
            operation_name: operation_name.to_owned(),
            parameters,
            ttl_seconds_after_finished: None,
            active_deadline_seconds: active_deadline,
        },
        status: None,
    };
    let created = api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            },
            &object,
        )
        .await
        .map_err(Error::api(format!(
            "creating the {operation_name} operation on {machine}{}",
            progress_note(applied)
        )))?;
    Ok(created.name_any())
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

fn progress_note(applied: &Applied) -> String {
    let done: Vec<&str> = applied
        .operations
        .keys()
        .chain(applied.repaves.keys())
        .map(String::as_str)
        .collect();
    if done.is_empty() {
        " (nothing was changed)".to_owned()
    } else {
        format!(" (already done for: {})", done.join(", "))
    }
}

/// Follows what was applied until it is finished, failed, or `--timeout` passes.
async fn follow(
    client: &Client,
    verb: &Verb,
    applied: &Applied,
    args: &ActArgs,
    terminal: &Terminal,
) -> Result<(), Error> {
    let machines: Vec<&str> = applied
        .operations
        .keys()
        .chain(applied.repaves.keys())
        .map(String::as_str)
        .collect();
    let mut progress = Progress::new(machines);
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let mut printer = LinePrinter::new(terminal.stdout_tty);

    let mut events = if applied.operations.is_empty() {
        let api: Api<Machine> = Api::all(client.clone());
        // One machine: watch only it (a fleet's every Machine is a lot to list for one).
        let config = match applied.repaves.keys().collect::<Vec<_>>().as_slice() {
            [only] => watcher::Config::default().fields(&format!("metadata.name={only}")),
            _ => watcher::Config::default(),
        };
        watcher(api, config)
            .default_backoff()
            .applied_objects()
            .map(|m| m.map(|m| Followed::Machine(Box::new(m))))
            .boxed()
    } else {
        let api: Api<MachineOperation> = Api::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{BATCH_LABEL}={}", applied.batch));
        watcher(api, config)
            .default_backoff()
            .applied_objects()
            .map(|o| o.map(|o| Followed::Operation(Box::new(o))))
            .boxed()
    };
    let mut interrupt = crate::interrupts()?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
        printer.show(&progress.line(verb.command(), elapsed))?;
        if progress.finished() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                printer.end()?;
                let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
                return Err(Error::TimedOut(format!(
                    "stopped following after {}s: {} (the work goes on; `kubectl unbounded status` shows it)",
                    args.timeout,
                    progress.line(verb.command(), elapsed)
                )));
            }
            _ = tick.tick(), if terminal.stdout_tty => {}
            _ = interrupt.recv() => {
                printer.end()?;
                let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
                return Err(Error::TimedOut(format!(
                    "stopped following: {} (the work goes on; `kubectl unbounded status` shows it)",
                    progress.line(verb.command(), elapsed)
                )));
            }
            event = events.next() => match event {
                Some(Ok(Followed::Operation(op))) => {
                    if let Some(machine) = op.spec.machine_ref.as_ref().map(|r| r.name.clone())
                        && applied.operations.get(&machine) == Some(&op.name_any())
                    {
                        progress.update(&machine, operation_stage(&op));
                    }
                }
                Some(Ok(Followed::Machine(machine))) => {
                    let name = machine.name_any();
                    if let Some((at, version)) = applied.repaves.get(&name) {
                        progress.update(&name, repave_stage(&machine, at, *version));
                    }
                }
                // The watcher retries with backoff; the deadline bounds the wait.
                Some(Err(_)) => {}
                None => break,
            },
        }
    }
    printer.end()?;
    let failures = progress.failures();
    if failures.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = failures
        .iter()
        .map(|(m, why)| format!("  {m}: {why}"))
        .collect();
    Err(Error::Failed(format!(
        "{} failed on {} of {} machines:\n{}",
        verb.command(),
        failures.len(),
        progress.stages.len(),
        lines.join("\n")
    )))
}

enum Followed {
    Operation(Box<MachineOperation>),
    Machine(Box<Machine>),
}

/// Prints the progress line: redrawn in place on a terminal, a new line on each change
/// otherwise (a log keeps every step).
struct LinePrinter {
    tty: bool,
    last: String,
}

impl LinePrinter {
    fn new(tty: bool) -> Self {
        Self {
            tty,
            last: String::new(),
        }
    }

    fn show(&mut self, line: &str) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        if self.tty {
            write!(out, "\r\x1b[K{line}")?;
            out.flush()?;
        } else {
            // Without a terminal only the counts matter: leave the elapsed time out of the
            // comparison so that a line is printed per change, not per second.
            let counts = line.rsplit_once(" · ").map_or(line, |(c, _)| c);
            if counts != self.last {
                writeln!(out, "{line}")?;
                self.last = counts.to_owned();
            }
        }
        Ok(())
    }

    fn end(&mut self) -> std::io::Result<()> {
        if self.tty {
            writeln!(std::io::stdout().lock())?;
        }
        Ok(())
    }
}
