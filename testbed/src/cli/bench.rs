//! `bench` and the clients it runs in the namespaces (`bench-client`).

use std::path::PathBuf;

use unbounded_testbed::bench::suite::{self, Mode};
use unbounded_testbed::bench::{self, report::Report, scale};
use unbounded_testbed::failure::Failure;

use crate::cli::lab::wait_for_termination;
use crate::{BenchClientCommand, BenchMode, CliError};

pub(crate) fn run_bench(
    mode: BenchMode,
    smoke: bool,
    out: Option<PathBuf>,
    publish: bool,
    v6: bool,
) -> Result<(), CliError> {
    if publish && smoke {
        return Err(Failure::of(bench::publish::PublishError::Smoke).into());
    }
    if v6 && mode != BenchMode::Dhcp {
        return Err(CliError::Other(
            "--v6 selects the DHCPv6 rows of `bench dhcp`: use it with `dhcp`".into(),
        ));
    }
    if v6 && publish {
        return Err(Failure::of(bench::publish::PublishError::Partial).into());
    }
    let modes: Vec<Mode> = match mode {
        BenchMode::Dhcp => vec![Mode::Dhcp],
        BenchMode::Tftp => vec![Mode::Tftp],
        BenchMode::Http => vec![Mode::Http],
        BenchMode::Storm => vec![Mode::Storm],
        BenchMode::Pair => vec![Mode::Pair],
        BenchMode::Controller => vec![Mode::Controller],
        BenchMode::All => Mode::ALL.to_vec(),
    };
    let started = suite::timestamp();
    let out = out.unwrap_or_else(suite::default_out);
    let work = out.join("run");
    std::fs::create_dir_all(&work).map_err(|e| Failure::new(work.display(), e))?;
    // The command as it is typed (`bench all`), not the modes it ran: the docs quote it,
    // and `docs_commands` checks that what they quote runs.
    let named = match (mode, modes.as_slice()) {
        (BenchMode::All, _) | (_, []) => "all",
        (_, [first, ..]) => first.name(),
    };
    let command = format!(
        "unbounded-testbed bench {named}{}{}",
        if v6 { " --v6" } else { "" },
        if smoke { " --smoke" } else { "" }
    );
    let say = |line: String| eprintln!("bench: {line}");
    say(format!("report folder: {}", out.display()));
    // Stopped by a signal, no destructor runs: the namespaces would outlive the run. (The
    // servers and clients inside them die with this process: PR_SET_PDEATHSIG.)
    std::thread::spawn(|| {
        if wait_for_termination() {
            eprintln!("bench: stopped by a signal; deleting its network namespaces");
            unbounded_testbed::netns::delete_all_live();
            std::process::exit(130);
        }
    });
    let mut report = Report::default();
    let mut charts = Vec::new();
    let mut network = if smoke {
        suite::NetworkOptions::smoke()
    } else {
        suite::NetworkOptions::full()
    };
    if v6 {
        network.dhcp_parts = bench::dhcp::Parts::V6Cost;
    }
    let result = suite::run_network(&modes, &network, &work, &mut report, &mut charts, &say)
        .and_then(|()| {
            if !modes.contains(&Mode::Controller) {
                return Ok(());
            }
            let options = if smoke {
                scale::ScaleOptions::smoke()
            } else {
                scale::ScaleOptions::full()
            };
            say("== controller".into());
            suite::with_load(Mode::Controller, &mut report, |report| {
                scale::run(&options, &work, report, &say)
            })
        });
    if let Err(error) = &result {
        report.problem(format!("the run stopped: {error}"));
    }
    let mut chart_names = Vec::new();
    for (name, svg) in &charts {
        std::fs::write(out.join(name), svg)
            .map_err(|e| Failure::new(format!("writing {name}"), e))?;
        chart_names.push(name.clone());
    }
    let markdown = report.markdown(&suite::header(&command, &started), &chart_names);
    std::fs::write(out.join("report.md"), &markdown)
        .map_err(|e| Failure::new("writing report.md", e))?;
    std::fs::write(
        out.join("figures.txt"),
        report.figure_lines().join("\n") + "\n",
    )
    .map_err(|e| Failure::new("writing figures.txt", e))?;
    println!("{}", suite::header(&command, &started));
    print!("{}", report.table());
    for note in &report.notes {
        println!("- {note}");
    }
    for line in report.figure_lines() {
        println!("{line}");
    }
    println!("report: {}", out.join("report.md").display());
    result.map_err(Failure::of)?;
    if publish {
        let provenance = bench::publish::Provenance::here(&command, &started);
        let written = bench::publish::publish(
            &bench::publish::default_page(),
            &modes,
            &report,
            &charts,
            &provenance,
        )
        .map_err(Failure::of)?;
        for path in written {
            println!("published: {}", path.display());
        }
    }
    if let Some(first) = report.problems.first() {
        return Err(CliError::Other(format!(
            "{} problem(s), the first: {first}",
            report.problems.len()
        )));
    }
    Ok(())
}

pub(crate) fn bench_client(command: BenchClientCommand) -> Result<(), CliError> {
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::of)?;
    let json = match command {
        BenchClientCommand::Storm(args) => runtime
            .block_on(bench::clients::storm(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
        BenchClientCommand::DhcpAcks(args) => runtime
            .block_on(bench::clients::acks(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
        BenchClientCommand::DhcpCheck(args) => runtime
            .block_on(bench::clients::check(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
    }
    .map_err(CliError::Other)?;
    println!("{json}");
    Ok(())
}
