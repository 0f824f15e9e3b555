//! DHCP: what each server itself spends per DORA at fixed offered rates below the knees.
//!
//! The knee ([`super::search`]) is decided as much by perfdhcp's share of the cores as by the
//! server; the CPU time the server's processes spent (`/proc/<pid>/stat`, the same way for
//! every server) divided by the ACKs they sent is not. Each server starts fresh (empty
//! lease file) for each rate, so every rate measures new clients, not renewals. Ours runs
//! twice: with its lease log on the bench's disk (every ACK `fdatasync`ed, as shipped) and on
//! tmpfs, where the sync costs next to nothing: the difference is the price of durability.

use super::super::bed::{Bed, BedError};
use super::super::chart::{self, Series};
use super::super::peers::KeaThreads;
use super::super::proc::Daemon;
use super::super::report::{Better, Cell, Report, Row, slug};
use super::perfdhcp;
use super::search::LOSS_LIMIT;

/// The rates and length of the cost runs.
#[derive(Debug, Clone, Copy)]
pub struct CostPlan {
    /// Offered DORA/s, each below every server's knee on this kind of machine.
    pub rates: &'static [u32],
    /// Seconds per rate.
    pub seconds: u32,
    /// Simulated clients.
    pub clients: u32,
}

/// Ours with the lease log on tmpfs: a reference for ours, not a peer.
const OURS_IN_MEMORY: &str = "ours, lease log on tmpfs";

/// The servers, in the order they run; the first is ours as shipped.
const SERVERS: [&str; 5] = [
    "ours",
    OURS_IN_MEMORY,
    "Kea 1 thread",
    "Kea 2 threads",
    "dnsmasq",
];

/// The target: ours at most this share of the best peer's CPU per DORA (the issue).
const TARGET: f64 = 0.7;

/// What one server spent at one rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostStep {
    /// Offered DORA/s.
    pub offered: u32,
    /// DISCOVERs sent.
    pub discovers: u64,
    /// ACKs received.
    pub acks: u64,
    /// The server's CPU time over the run, seconds.
    pub cpu_seconds: f64,
    /// The server's peak resident memory, KiB.
    pub peak_rss_kib: u64,
}

impl CostStep {
    /// The share of DISCOVERs that did not end in an ACK.
    pub fn loss(&self) -> f64 {
        if self.discovers == 0 {
            return 1.0;
        }
        1.0 - self.acks.min(self.discovers) as f64 / self.discovers as f64
    }

    /// CPU µs per completed DORA; `None` without ACKs.
    pub fn cpu_us_per_dora(&self) -> Option<f64> {
        (self.acks > 0).then(|| self.cpu_seconds * 1e6 / self.acks as f64)
    }

    /// The table cell: the cost, or no value when the server lost more than the knee allows
    /// at this rate (its cost per completed DORA then says little).
    pub fn cell(&self) -> Cell {
        let peak = self.peak_rss_kib as f64 / 1024.0;
        match self.cpu_us_per_dora() {
            Some(us) if self.loss() < LOSS_LIMIT => {
                Cell::with_note(us, format!("peak RSS {peak:.0} MiB"))
            }
            Some(us) => Cell::with_note(
                f64::NAN,
                format!(
                    "above its knee: {:.1}% lost, {us:.0} µs per completed DORA",
                    self.loss() * 100.0
                ),
            ),
            None => Cell::with_note(f64::NAN, "no ACK"),
        }
    }
}

fn start(bed: &Bed, server: &str) -> Result<Daemon, BedError> {
    match server {
        "ours" => bed.start_ours(&[], false),
        OURS_IN_MEMORY => bed.start_ours_leases_in_memory(),
        "Kea 1 thread" => bed.start_kea(KeaThreads::Single),
        "Kea 2 threads" => bed.start_kea(KeaThreads::Multi(2)),
        _ => bed.start_dnsmasq_dhcp(),
    }
}

fn measure(
    bed: &Bed,
    server: &str,
    rate: u32,
    plan: &CostPlan,
    say: &dyn Fn(String),
) -> Result<CostStep, BedError> {
    let mut daemon = start(bed, server)?;
    let before = daemon.tree_cpu_seconds();
    let out = perfdhcp(bed, rate, plan.seconds, plan.clients, "t")?;
    let step = CostStep {
        offered: rate,
        discovers: out.offer.sent,
        acks: out.ack.received,
        cpu_seconds: daemon.tree_cpu_seconds() - before,
        peak_rss_kib: daemon.peak_rss_kib(),
    };
    daemon.stop();
    say(format!(
        "dhcp cost {server}: {rate}/s for {} s: {} ACKs, {:.2}% lost, server CPU {:.2} s, {:.0} µs per DORA",
        plan.seconds,
        step.acks,
        step.loss() * 100.0,
        step.cpu_seconds,
        step.cpu_us_per_dora().unwrap_or(f64::NAN)
    ));
    Ok(step)
}

/// One row per rate (ours against the peers), the reference of ours without the price of
/// `fdatasync` in ours' note, and a chart of CPU per DORA against the offered rate.
pub fn run(
    bed: &Bed,
    plan: &CostPlan,
    report: &mut Report,
    charts: &mut Vec<(String, String)>,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let mut rows: Vec<Row> = plan
        .rates
        .iter()
        .map(|rate| Row {
            mode: "dhcp",
            case: format!("cpu_{rate}"),
            what: format!(
                "server CPU per DORA at {rate}/s offered, perfdhcp relay, {} s",
                plan.seconds
            ),
            metric: "cpu_us_per_dora",
            unit: "µs",
            ours: None,
            peers: Vec::new(),
            better: Better::Lower,
            target: Some(TARGET),
        })
        .collect();
    let mut series = Vec::new();
    let mut in_memory = Vec::new();
    for server in SERVERS {
        let mut points = Vec::new();
        for (row, rate) in rows.iter_mut().zip(plan.rates) {
            let step = measure(bed, server, *rate, plan, say)?;
            let key = format!("dhcp.cpu_{rate}.{}", slug(server));
            report.figure(format!("{key}.loss_percent"), step.loss() * 100.0);
            report.figure(
                format!("{key}.peak_rss_mib"),
                step.peak_rss_kib as f64 / 1024.0,
            );
            let cell = step.cell();
            if cell.value.is_finite() {
                points.push((f64::from(*rate), cell.value));
            }
            match server {
                "ours" => row.ours = Some(cell),
                OURS_IN_MEMORY => {
                    report.figure(
                        format!("{key}.cpu_us_per_dora"),
                        step.cpu_us_per_dora().unwrap_or(f64::NAN),
                    );
                    in_memory.push(cell);
                }
                peer => row.peers.push((peer.to_owned(), cell)),
            }
        }
        series.push(Series {
            name: server.to_owned(),
            points,
        });
    }
    let _ = std::fs::remove_file(Bed::memory_leases());
    for (row, memory) in rows.iter_mut().zip(in_memory) {
        if let Some(ours) = row.ours.as_mut() {
            ours.note = with_reference(&ours.note, &memory);
        }
    }
    charts.push((
        "dhcp-cpu.svg".into(),
        chart::line_chart(
            "DHCP: server CPU per DORA against offered rate (lower is better)",
            "offered DORA/s",
            "CPU µs per DORA",
            &series,
        ),
    ));
    report.rows.extend(rows);
    Ok(())
}

/// Ours' note with the in-memory reference beside it.
fn with_reference(note: &str, memory: &Cell) -> String {
    let reference = if memory.value.is_finite() {
        format!(
            "{} µs with the lease log on tmpfs",
            super::super::report::human(memory.value)
        )
    } else {
        format!("lease log on tmpfs: {}", memory.note)
    };
    if note.is_empty() {
        reference
    } else {
        format!("{note}; {reference}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(discovers: u64, acks: u64, cpu_seconds: f64) -> CostStep {
        CostStep {
            offered: 2000,
            discovers,
            acks,
            cpu_seconds,
            peak_rss_kib: 20 * 1024,
        }
    }

    #[test]
    fn cost_is_cpu_per_completed_dora_below_the_knee() {
        let below = step(30_000, 29_990, 3.0);
        assert!((below.cpu_us_per_dora().unwrap_or_default() - 100.03).abs() < 0.01);
        let cell = below.cell();
        assert!((cell.value - 100.03).abs() < 0.01);
        assert_eq!(cell.note, "peak RSS 20 MiB");
    }

    #[test]
    fn above_the_knee_or_without_acks_there_is_no_cost_to_compare() {
        let above = step(30_000, 20_000, 3.0).cell();
        assert!(above.value.is_nan());
        assert!(
            above.note.starts_with("above its knee: 33.3% lost"),
            "{}",
            above.note
        );
        let silent = step(30_000, 0, 0.5);
        assert_eq!(silent.cpu_us_per_dora(), None);
        assert_eq!(silent.cell().note, "no ACK");
        assert_eq!(step(0, 0, 0.0).loss(), 1.0);
    }

    #[test]
    fn ours_names_the_price_of_durability() {
        let memory = Cell::with_note(80.0, "peak RSS 20 MiB");
        assert_eq!(
            with_reference("peak RSS 21 MiB", &memory),
            "peak RSS 21 MiB; 80 µs with the lease log on tmpfs"
        );
        let failed = Cell::with_note(f64::NAN, "no ACK");
        assert_eq!(with_reference("", &failed), "lease log on tmpfs: no ACK");
    }
}
