//! DHCP: the knee of each server under perfdhcp ([`search`]), what each spends per DORA
//! below it and, against Kea's DHCPv6 server, per DHCPv6 exchange ([`cost`]) and, for ours,
//! a `kill -9` in the middle of a run ([`crash`]).

pub mod cost;
pub mod crash;
pub mod search;

use super::bed::{Bed, BedError};
use super::chart::{self, Series};
use super::peers::{CLIENT_IF, KeaThreads, NET};
use super::proc::{Daemon, ProcError};
use super::report::{Better, Cell, Report, Row};
use search::{Next, Plan, Step};

/// The servers, in the order they run.
const SERVERS: [&str; 4] = ["ours", "Kea 1 thread", "Kea 2 threads", "dnsmasq"];

fn start(bed: &Bed, server: &str) -> Result<Daemon, BedError> {
    match server {
        "ours" => bed.start_ours(&[], false),
        "Kea 1 thread" => bed.start_kea(KeaThreads::Single),
        "Kea 2 threads" => bed.start_kea(KeaThreads::Multi(2)),
        _ => bed.start_dnsmasq_dhcp(),
    }
}

/// One perfdhcp run at `rate` DORA/s for `seconds` with the diagnostics `-x <diagnostics>`.
pub fn perfdhcp(
    bed: &Bed,
    rate: u32,
    seconds: u32,
    clients: u32,
    diagnostics: &str,
) -> Result<search::PerfdhcpOutput, ProcError> {
    let mut command = bed.client("perfdhcp");
    command
        .args(["-4", "-r", &rate.to_string(), "-R", &clients.to_string()])
        .args(["-p", &seconds.to_string(), "-x", diagnostics])
        .args(["-l", NET.client, NET.server]);
    run_perfdhcp(bed, command)
}

/// One `perfdhcp -6` run at `rate` exchanges/s (Solicit, Advertise, Request, Reply: no
/// Rapid Commit) for `seconds` with the diagnostics `-x <diagnostics>`: from the client's
/// link-local address on [`CLIENT_IF`] to `ff02::1:2`, as clients on the link send (no
/// relay: `-A` would simulate one).
pub fn perfdhcp6(
    bed: &Bed,
    rate: u32,
    seconds: u32,
    clients: u32,
    diagnostics: &str,
) -> Result<search::PerfdhcpOutput, ProcError> {
    let mut command = bed.client("perfdhcp");
    command.args(perfdhcp6_args(rate, seconds, clients, diagnostics));
    run_perfdhcp(bed, command)
}

/// perfdhcp -6's arguments (see [`perfdhcp6`]).
pub fn perfdhcp6_args(rate: u32, seconds: u32, clients: u32, diagnostics: &str) -> Vec<String> {
    [
        "-6",
        "-r",
        &rate.to_string(),
        "-R",
        &clients.to_string(),
        "-p",
        &seconds.to_string(),
        "-x",
        diagnostics,
        "-l",
        CLIENT_IF,
        "all",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn run_perfdhcp(
    bed: &Bed,
    mut command: std::process::Command,
) -> Result<search::PerfdhcpOutput, ProcError> {
    // perfdhcp exits 3 when some exchanges did not complete: that is a figure, not an error.
    let output = command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ProcError::Start {
            program: "perfdhcp".into(),
            source,
        })?;
    if !matches!(output.status.code(), Some(0 | 3)) {
        return Err(ProcError::Failed {
            command: format!("{command:?}"),
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    // The last run's report, for a person who wants to look.
    let _ = std::fs::write(bed.dir.join("perfdhcp-last.txt"), text.as_bytes());
    Ok(search::parse_perfdhcp(&text))
}

/// Searches one server's knee.
fn knee_of(
    bed: &Bed,
    server: &str,
    plan: &Plan,
    say: &dyn Fn(String),
) -> Result<Vec<Step>, BedError> {
    let mut daemon = start(bed, server)?;
    let mut history = Vec::new();
    loop {
        let (rate, probe) = match search::next_step(&history, plan) {
            Next::Probe(rate) => (rate, true),
            Next::Step(rate) => (rate, false),
            Next::Done => break,
        };
        let seconds = if probe {
            plan.probe_seconds
        } else {
            plan.step_seconds
        };
        let out = perfdhcp(bed, rate, seconds, plan.clients, "t")?;
        let step = search::step_of(rate, seconds, probe, &out);
        say(format!(
            "dhcp {server}: {} {rate}/s for {seconds} s: {:.0} DORA/s, {:.2}% lost, offer {:.2} ms (p99 {:.2}), ack {:.2} ms (p99 {:.2})",
            if probe { "probe" } else { "step" },
            step.dora_per_second,
            step.loss * 100.0,
            step.offer_ms.0,
            step.offer_ms.1,
            step.ack_ms.0,
            step.ack_ms.1,
        ));
        history.push(step);
        if !daemon.running() {
            return Err(ProcError::NotReady {
                program: server.to_owned(),
                what: "exited during the run".into(),
                log: String::new(),
                tail: daemon.log_tail(20),
            }
            .into());
        }
    }
    daemon.stop();
    Ok(history)
}

/// Which parts of `bench dhcp` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    /// The knees, the v4 and v6 cost rows, the crash.
    All,
    /// The DHCPv6 cost rows only (`bench dhcp --v6`).
    V6Cost,
}

/// The knee of every server, a chart of DORA/s against the offered rate, the cost rows (v4,
/// then v6), and ours through a crash; or only the v6 cost rows.
#[allow(clippy::too_many_arguments)]
pub fn run(
    bed: &Bed,
    plan: &Plan,
    cost_plan: &cost::CostPlan,
    crash_seconds: u32,
    parts: Parts,
    report: &mut Report,
    charts: &mut Vec<(String, String)>,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    if parts == Parts::V6Cost {
        return cost::run(bed, cost_plan, cost::Family::V6, report, charts, say);
    }
    let mut row = Row {
        mode: "dhcp",
        case: "knee".into(),
        what: format!(
            "knee (< 1% loss of full DORA), perfdhcp relay, {} clients, {} s steps",
            super::report::human(f64::from(plan.clients)),
            plan.step_seconds
        ),
        metric: "dora_per_s",
        unit: "DORA/s",
        ours: None,
        peers: Vec::new(),
        better: Better::Higher,
        target: Some(1.5),
    };
    let mut series = Vec::new();
    for server in SERVERS {
        let history = knee_of(bed, server, plan, say)?;
        let key = super::report::slug(server);
        series.push(Series {
            name: server.to_owned(),
            points: history
                .iter()
                .map(|s| (f64::from(s.offered), s.dora_per_second))
                .collect(),
        });
        let cell = match search::knee(&history) {
            Some(k) => {
                for (name, value) in [
                    ("offered", f64::from(k.offered)),
                    ("offer_mean_ms", k.offer_ms.0),
                    ("offer_p99_ms", k.offer_ms.1),
                    ("ack_mean_ms", k.ack_ms.0),
                    ("ack_p99_ms", k.ack_ms.1),
                    ("loss_percent", k.loss * 100.0),
                ] {
                    report.figure(format!("dhcp.knee.{key}.{name}"), value);
                }
                Cell::with_note(
                    k.dora_per_second,
                    format!(
                        "offered {}/s; DISCOVER→OFFER {:.2} ms, p99 {:.2}; REQUEST→ACK {:.2} ms, p99 {:.2}",
                        k.offered, k.offer_ms.0, k.offer_ms.1, k.ack_ms.0, k.ack_ms.1
                    ),
                )
            }
            None => Cell::with_note(0.0, "lost ≥ 1% at every rate tried"),
        };
        if server == "ours" {
            row.ours = Some(cell);
        } else {
            row.peers.push((server.to_owned(), cell));
        }
    }
    charts.push((
        "dhcp.svg".into(),
        chart::line_chart(
            "DHCP: completed DORA/s against offered rate (perfdhcp, relay)",
            "offered DORA/s",
            "completed DORA/s",
            &series,
        ),
    ));
    report.rows.push(row);
    cost::run(bed, cost_plan, cost::Family::V4, report, charts, say)?;
    cost::run(bed, cost_plan, cost::Family::V6, report, charts, say)?;
    crash::run(bed, crash_seconds, report, say)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfdhcp6_offers_the_four_message_exchange_on_the_link() {
        let args = perfdhcp6_args(2000, 15, 50_000, "t");
        let text = args.join(" ");
        assert_eq!(text, "-6 -r 2000 -R 50000 -p 15 -x t -l eth0 all");
        // No Rapid Commit (-c: two messages), no simulated relay (-A), addresses only.
        for absent in ["-c", "-A", "-e", "-i"] {
            assert!(!args.iter().any(|a| a == absent), "{absent} in {text}");
        }
    }
}
