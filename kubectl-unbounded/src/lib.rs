//! `kubectl unbounded`: Unbounded's Machines from kubectl.
//!
//! - `status`: a tree of configurations → versions → machines (or pools → machines) with
//!   each machine's phase, recorded → resolved version, Node, power, agent and the first
//!   condition that holds it up; `-o json|yaml`; `--watch`.
//! - `why <machine>`: one paragraph on why it is not Running.
//! - `reboot`, `shutdown`, `power on|off|cycle`, `pxe-boot`, `restart-service`, `repave`,
//!   `rollback --to N`, `apply`: the objects the controller, the providers and the agent act on,
//!   followed to the end.
//! - `logs <machine>`: the bootserver's lines that name it and its agent's (see [`logs`]).
//! - `console <machine>`: the serial console through the BMC (IPMI Serial-over-LAN, also where
//!   a Redfish BMC advertises it; see [`redfish_console`]).
//! - `completion <shell>`, and kubectl's plugin completion (`__complete`).
//!
//! Decisions are pure functions over plain data ([`status::build`], [`render::render`],
//! [`why::explain`], [`plan::plan`], [`progress`], [`complete::want`],
//! [`redfish_console::decide()`]); [`cluster`] and
//! [`act`] do the I/O. See docs/kubectl-plugin.md.

pub mod act;
pub mod cli;
pub mod cluster;
pub mod complete;
pub mod console;
pub mod error;
pub mod facts;
#[cfg(test)]
mod fixtures;
pub mod in_place;
pub mod logs;
pub mod plan;
pub mod progress;
pub mod redfish_console;
pub mod render;
pub mod status;
pub mod terminal;
pub mod why;

use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use unbounded_api::{Machine, MachineConfiguration, MachinePool};

use crate::cli::{ApplyArgs, Cli, Command, Output, PowerAction, RepaveThen, StatusArgs, VerbArgs};
use crate::error::Error;
use crate::facts::{Inventory, by_name};
use crate::plan::Verb;
use crate::status::{Filter, StatusTree};
use crate::terminal::Terminal;

/// Runs one command line.
pub async fn run(cli: Cli) -> Result<(), Error> {
    let terminal = Terminal::detect();
    match &cli.command {
        Command::Completion(args) => {
            std::io::stdout().write_all(&complete::script(args.shell))?;
            return Ok(());
        }
        Command::Complete(args) => return complete_words(&cli, &args.words).await,
        _ => {}
    }
    let client = cluster::client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    match cli.command {
        Command::Status(args) => status(&client, &args, &terminal).await,
        Command::Why(args) => why(&client, &args.machine, args.events).await,
        Command::Reboot(t) => verb(&client, Verb::Reboot, &t, &terminal).await,
        Command::Shutdown(t) => verb(&client, Verb::Shutdown, &t, &terminal).await,
        Command::PxeBoot(t) => verb(&client, Verb::PxeBoot, &t, &terminal).await,
        Command::Repave(r) => {
            let then = r.then.map(|t| match t {
                RepaveThen::PowerOff => unbounded_api::well_known::operations::POWER_OFF,
                RepaveThen::PxeBoot => unbounded_api::well_known::operations::PXE_BOOT,
            });
            verb(&client, Verb::Repave { then }, &r.target, &terminal).await
        }
        Command::Power(p) => {
            let v = match p.action {
                PowerAction::On => Verb::PowerOn,
                PowerAction::Off => Verb::PowerOff {
                    deallocate: p.deallocate,
                },
                PowerAction::Cycle => Verb::PowerCycle,
            };
            verb(&client, v, &p.target, &terminal).await
        }
        Command::RestartService(r) => {
            let v = Verb::RestartService { service: r.service };
            verb(&client, v, &r.target, &terminal).await
        }
        Command::Rollback(r) => {
            let machines =
                cluster::targets(&client, std::slice::from_ref(&r.machine), None).await?;
            let configurations = cluster::configurations(&client).await?;
            let v = Verb::Rollback { to: r.to };
            act::run(&client, &v, &machines, &configurations, &r.act, &terminal).await
        }
        Command::Apply(a) => apply(&client, &a, &terminal).await,
        Command::Logs(l) => {
            let options = logs::Options {
                follow: l.follow,
                since_seconds: l.since,
                namespace: l.bootserver_namespace,
            };
            logs::run(&client, &l.machine, &options).await
        }
        Command::Console(c) => console::run(&client, &c.machine, c.interactive).await,
        Command::Completion(_) | Command::Complete(_) => Ok(()),
    }
}

async fn verb(
    client: &Client,
    verb: Verb,
    target: &VerbArgs,
    terminal: &Terminal,
) -> Result<(), Error> {
    let machines = cluster::targets(client, &target.machines, target.selector.as_deref()).await?;
    let configurations = cluster::configurations(client).await?;
    act::run(
        client,
        &verb,
        &machines,
        &configurations,
        &target.act,
        terminal,
    )
    .await
}

/// `apply`: plans by the controller's rule over what it reads, then creates and follows.
async fn apply(client: &Client, args: &ApplyArgs, terminal: &Terminal) -> Result<(), Error> {
    let target = &args.target;
    let machines = cluster::targets(client, &target.machines, target.selector.as_deref()).await?;
    let (inventory, versions) = futures::try_join!(
        cluster::inventory(client, None),
        cluster::configuration_versions(client),
    )?;
    let request = in_place::Request {
        version: args.version,
        disruptive: args.disruptive,
    };
    let actions = in_place::plan(
        request,
        &machines,
        &inventory,
        &in_place::templates(&versions),
    )?;
    let verb = Verb::Apply {
        version: args.version,
        disruptive: args.disruptive,
    };
    act::run_actions(client, &verb, &actions, &target.act, terminal).await
}

fn filter_of(args: &StatusArgs) -> Filter {
    Filter {
        names: args.machines.clone(),
        pool: args.pool.clone(),
        configuration: args.configuration.clone(),
        selector: args.selector.is_some(),
    }
}

/// Checks that what the filter names exists.
fn check_filter(filter: &Filter, inventory: &Inventory) -> Result<(), Error> {
    let missing = status::missing_names(&filter.names, &inventory.machines);
    if !missing.is_empty() {
        return Err(Error::UnknownMachines(missing));
    }
    if let Some(pool) = &filter.pool
        && !inventory
            .pools
            .iter()
            .any(|p| p.metadata.name.as_ref() == Some(pool))
    {
        return Err(Error::UnknownPool(pool.clone()));
    }
    if let Some(configuration) = &filter.configuration
        && !inventory
            .configurations
            .iter()
            .any(|c| c.metadata.name.as_ref() == Some(configuration))
    {
        return Err(Error::UnknownConfiguration(configuration.clone()));
    }
    Ok(())
}

/// The text of one snapshot in the chosen format.
fn format_tree(tree: &StatusTree, args: &StatusArgs, terminal: &Terminal) -> Result<String, Error> {
    match args.output {
        Output::Text => Ok(render::render(tree, terminal.style(args.color))),
        Output::Json if args.watch => serde_json::to_string(tree)
            .map(|s| s + "\n")
            .map_err(|e| Error::Render(Box::new(e))),
        Output::Json => serde_json::to_string_pretty(tree)
            .map(|s| s + "\n")
            .map_err(|e| Error::Render(Box::new(e))),
        Output::Yaml => {
            let yaml = serde_saphyr::to_string(tree).map_err(|e| Error::Render(Box::new(e)))?;
            Ok(if args.watch {
                format!("---\n{yaml}")
            } else {
                yaml
            })
        }
    }
}

async fn status(client: &Client, args: &StatusArgs, terminal: &Terminal) -> Result<(), Error> {
    let filter = filter_of(args);
    if args.watch {
        return watch_status(client, args, &filter, terminal).await;
    }
    let inventory = cluster::inventory(client, args.selector.as_deref()).await?;
    check_filter(&filter, &inventory)?;
    if args.selector.is_some() && inventory.machines.is_empty() {
        return Err(Error::EmptySelector(
            args.selector.clone().unwrap_or_default(),
        ));
    }
    let tree = status::build(&inventory, &filter, args.by, Timestamp::now());
    std::io::stdout().write_all(format_tree(&tree, args, terminal)?.as_bytes())?;
    Ok(())
}

/// Redraws the status whenever a Machine, configuration, pool or Node changes: reflectors
/// keep the four lists, any event redraws, and only a changed drawing is printed (on a
/// terminal in place, once a second at most for the ages; otherwise appended).
async fn watch_status(
    client: &Client,
    args: &StatusArgs,
    filter: &Filter,
    terminal: &Terminal,
) -> Result<(), Error> {
    let machine_config = match &args.selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let (machines, mw) = reflector::store::<Machine>();
    let (configurations, cw) = reflector::store::<MachineConfiguration>();
    let (pools, pw) = reflector::store::<MachinePool>();
    let (nodes, nw) = reflector::store::<Node>();
    let streams = vec![
        reflector(mw, watcher(Api::all(client.clone()), machine_config))
            .default_backoff()
            .map(|e| e.map(|_| ()))
            .boxed(),
        reflector(
            cw,
            watcher(Api::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .map(|e| e.map(|_| ()))
        .boxed(),
        reflector(
            pw,
            watcher(Api::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .map(|e| e.map(|_| ()))
        .boxed(),
        reflector(
            nw,
            watcher(Api::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .map(|e| e.map(|_| ()))
        .boxed(),
    ];
    let mut events = futures::stream::select_all(streams);
    let ready = async {
        let _ = machines.wait_until_ready().await;
        let _ = configurations.wait_until_ready().await;
        let _ = pools.wait_until_ready().await;
        let _ = nodes.wait_until_ready().await;
    };
    // The stores fill only while their streams are polled.
    let mut ready = std::pin::pin!(ready);
    loop {
        tokio::select! {
            () = &mut ready => break,
            event = events.next() => if let Some(Err(e)) = event {
                return Err(Error::Watch(e));
            },
        }
    }
    let snapshot = || {
        let mut inventory = Inventory {
            machines: machines.state().iter().map(|m| (**m).clone()).collect(),
            configurations: configurations
                .state()
                .iter()
                .map(|c| (**c).clone())
                .collect(),
            pools: pools.state().iter().map(|p| (**p).clone()).collect(),
            nodes: nodes.state().iter().map(|n| (**n).clone()).collect(),
        };
        by_name(&mut inventory.machines);
        inventory
    };
    check_filter(filter, &snapshot())?;
    let mut last = String::new();
    let mut interrupt = interrupts()?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let tree = status::build(&snapshot(), filter, args.by, Timestamp::now());
        let text = format_tree(&tree, args, terminal)?;
        if text != last {
            let mut out = std::io::stdout().lock();
            if terminal.stdout_tty {
                // Home and clear: the new drawing replaces the old one.
                write!(out, "\x1b[H\x1b[2J{text}")?;
            } else if args.output == Output::Text && !last.is_empty() {
                write!(out, "\n{text}")?;
            } else {
                write!(out, "{text}")?;
            }
            out.flush()?;
            last = text;
        }
        tokio::select! {
            _ = tick.tick(), if terminal.stdout_tty => {}
            event = events.next() => if event.is_none() { return Ok(()) },
            _ = interrupt.recv() => return Ok(()),
        }
    }
}

/// Ctrl-C, listened for from now on. A SIGINT that arrives while a loop is busy elsewhere
/// waits for its next `recv`; a `tokio::signal::ctrl_c()` made anew in each turn of a loop
/// misses one that comes between two turns (tokio's handler is installed by then, so the
/// signal no longer ends the process either), and the plugin followed on until its timeout.
pub(crate) fn interrupts() -> std::io::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
}

async fn why(client: &Client, name: &str, event_limit: usize) -> Result<(), Error> {
    let machines = cluster::targets(client, &[name.to_owned()], None).await?;
    let Some(machine) = machines.first() else {
        return Err(Error::UnknownMachines(vec![name.to_owned()]));
    };
    let inventory = cluster::inventory(client, None).await?;
    let (events, operations) = futures::try_join!(
        cluster::machine_events(client, machine),
        cluster::machine_operations(client, name),
    )?;
    let events: Vec<why::EventFact> = events
        .iter()
        .filter_map(why::EventFact::from_event)
        .collect();
    let text = why::explain(
        machine,
        &inventory,
        &events,
        &operations,
        event_limit,
        Timestamp::now(),
    );
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
}

/// `__complete`: candidates for the last word. Lookup errors offer nothing rather than fail:
/// a completion must never print an error into the command line.
async fn complete_words(cli: &Cli, words: &[String]) -> Result<(), Error> {
    let prefix = words.last().cloned().unwrap_or_default();
    let want = complete::want(words);
    let names = match want {
        complete::Want::Words(list) => list,
        complete::Want::Nothing => Vec::new(),
        lookup => {
            // The global flags may sit among the words being completed.
            let flag = |name: &str| {
                words
                    .iter()
                    .position(|w| w == name)
                    .and_then(|i| words.get(i + 1))
                    .cloned()
            };
            let kubeconfig = cli
                .kubeconfig
                .clone()
                .or_else(|| flag("--kubeconfig").map(Into::into));
            let context = cli.context.clone().or_else(|| flag("--context"));
            match cluster::client(kubeconfig.as_deref(), context.as_deref()).await {
                Ok(client) => lookup_names(&client, &lookup).await.unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        }
    };
    std::io::stdout().write_all(complete::protocol_lines(&names, &prefix).as_bytes())?;
    Ok(())
}

async fn lookup_names(client: &Client, want: &complete::Want) -> Result<Vec<String>, Error> {
    let inventory = cluster::inventory(client, None).await?;
    let names = |list: Vec<Option<String>>| list.into_iter().flatten().collect();
    Ok(match want {
        complete::Want::Machines => names(
            inventory
                .machines
                .into_iter()
                .map(|m| m.metadata.name)
                .collect(),
        ),
        complete::Want::Pools => names(
            inventory
                .pools
                .into_iter()
                .map(|p| p.metadata.name)
                .collect(),
        ),
        complete::Want::Configurations => names(
            inventory
                .configurations
                .into_iter()
                .map(|c| c.metadata.name)
                .collect(),
        ),
        _ => Vec::new(),
    })
}
