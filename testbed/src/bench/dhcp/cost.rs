//! DHCP: what each server itself spends per DORA at fixed offered rates below the knees,
//! and per DHCPv6 exchange against Kea's DHCPv6 server.
//!
//! The knee ([`super::search`]) is decided as much by perfdhcp's share of the cores as by the
//! server; the CPU time the server's processes spent (their CPU accounting cgroup, the same
//! way for every server) divided by the exchanges they completed is not. Each server starts
//! fresh (empty lease file) for each rate, so every rate measures new clients, not renewals.
//! Ours runs twice: with its lease log on the bench's disk (every ACK `fdatasync`ed, as
//! shipped) and on tmpfs, where the sync costs next to nothing: the difference is the price
//! of durability.
//!
//! The v6 rows ([`Family::V6`]) measure the same way with `perfdhcp -6` on the link
//! (Solicit, Advertise, Request, Reply; no relay, no Rapid Commit): ours with DHCPv6 on
//! (its lease log the same, synced before each Reply that promises an address) and on
//! tmpfs, against `kea-dhcp6` single-threaded with a persisted memfile.

use super::super::bed::{Bed, BedError};
use super::super::chart::{self, Series};
use super::super::peers::KeaThreads;
use super::super::proc::Daemon;
use super::super::report::{Better, Cell, Report, Row, slug};
use super::search::{LOSS_LIMIT, PerfdhcpOutput};
use super::{perfdhcp, perfdhcp6};

/// The rates and length of the cost runs.
#[derive(Debug, Clone, Copy)]
pub struct CostPlan {
    /// Offered DORA/s, each below every server's knee on this kind of machine.
    pub rates: &'static [u32],
    /// Offered DHCPv6 exchanges/s, each below ours' and Kea's DHCPv6 knees.
    pub rates_v6: &'static [u32],
    /// Seconds per rate.
    pub seconds: u32,
    /// Simulated clients.
    pub clients: u32,
}

/// Ours with the lease log on tmpfs: a reference for ours, not a peer.
const OURS_IN_MEMORY: &str = "ours, lease log on tmpfs";

/// The DHCPv4 servers, in the order they run; the first is ours as shipped.
const SERVERS: [&str; 5] = [
    "ours",
    OURS_IN_MEMORY,
    "Kea 1 thread",
    "Kea 2 threads",
    "dnsmasq",
];

/// The DHCPv6 servers, in the order they run (dnsmasq's DHCPv6 needs router advertisements
/// and is not what the issue compares with).
const SERVERS_V6: [&str; 3] = ["ours", OURS_IN_MEMORY, "Kea 1 thread"];

/// The target: ours at most this share of the best peer's CPU per DORA (the issue).
const TARGET: f64 = 0.7;

/// Which DHCP a set of cost rows measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// DHCPv4: DORA, perfdhcp -4 as a relay.
    V4,
    /// DHCPv6: Solicit, Advertise, Request, Reply, perfdhcp -6 on the link.
    V6,
}

impl Family {
    /// The servers, in the order they run; the first is ours as shipped.
    pub fn servers(self) -> &'static [&'static str] {
        match self {
            Family::V4 => &SERVERS,
            Family::V6 => &SERVERS_V6,
        }
    }

    /// The offered rates of `plan`.
    pub fn rates(self, plan: &CostPlan) -> &'static [u32] {
        match self {
            Family::V4 => plan.rates,
            Family::V6 => plan.rates_v6,
        }
    }

    /// One exchange, for people (`µs per …`).
    pub fn exchange(self) -> &'static str {
        match self {
            Family::V4 => "DORA",
            Family::V6 => "exchange",
        }
    }

    /// The row's case key at `rate` (`cpu_2000`, `cpu6_2000`), the middle of its figures'
    /// keys.
    pub fn case(self, rate: u32) -> String {
        match self {
            Family::V4 => format!("cpu_{rate}"),
            Family::V6 => format!("cpu6_{rate}"),
        }
    }

    /// The row's description.
    pub fn what(self, rate: u32, seconds: u32) -> String {
        match self {
            Family::V4 => {
                format!("server CPU per DORA at {rate}/s offered, perfdhcp relay, {seconds} s")
            }
            Family::V6 => format!(
                "v6 server CPU per exchange (Solicit, Advertise, Request, Reply) at {rate}/s offered, perfdhcp -6 on the link, {seconds} s"
            ),
        }
    }

    /// The row's metric key.
    pub fn metric(self) -> &'static str {
        match self {
            Family::V4 => "cpu_us_per_dora",
            Family::V6 => "cpu_us_per_exchange",
        }
    }

    /// The row's target ratio: the issue sets one for DHCPv4 only.
    pub fn target(self) -> Option<f64> {
        match self {
            Family::V4 => Some(TARGET),
            Family::V6 => None,
        }
    }

    /// The chart's file name (its mode, `dhcp`, before the first `-`), title and axes.
    fn chart(self) -> [&'static str; 4] {
        match self {
            Family::V4 => [
                "dhcp-cpu.svg",
                "DHCP: server CPU per DORA against offered rate (lower is better)",
                "offered DORA/s",
                "CPU µs per DORA",
            ],
            Family::V6 => [
                "dhcp-v6-cpu.svg",
                "DHCPv6: server CPU per exchange against offered rate (lower is better)",
                "offered exchanges/s",
                "CPU µs per exchange",
            ],
        }
    }

    fn start(self, bed: &Bed, server: &str) -> Result<Daemon, BedError> {
        match (self, server) {
            (Family::V4, "ours") => bed.start_ours(&[], false),
            (Family::V4, OURS_IN_MEMORY) => bed.start_ours_leases_in_memory(),
            (Family::V4, "Kea 1 thread") => bed.start_kea(KeaThreads::Single),
            (Family::V4, "Kea 2 threads") => bed.start_kea(KeaThreads::Multi(2)),
            (Family::V4, _) => bed.start_dnsmasq_dhcp(),
            (Family::V6, "ours") => bed.start_ours6(false),
            (Family::V6, OURS_IN_MEMORY) => bed.start_ours6(true),
            (Family::V6, "Kea 2 threads") => bed.start_kea6(KeaThreads::Multi(2)),
            (Family::V6, _) => bed.start_kea6(KeaThreads::Single),
        }
    }

    fn load(
        self,
        bed: &Bed,
        rate: u32,
        plan: &CostPlan,
    ) -> Result<PerfdhcpOutput, super::super::proc::ProcError> {
        match self {
            Family::V4 => perfdhcp(bed, rate, plan.seconds, plan.clients, "t"),
            Family::V6 => perfdhcp6(bed, rate, plan.seconds, plan.clients, "t"),
        }
    }
}

/// What one server spent at one rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostStep {
    /// DHCPv4 or DHCPv6.
    pub family: Family,
    /// Offered DORA/s (v6: exchanges/s).
    pub offered: u32,
    /// DISCOVERs sent (v6: Solicits).
    pub discovers: u64,
    /// ACKs received (v6: Replies to Requests).
    pub acks: u64,
    /// The server's CPU time over the run, seconds.
    pub cpu_seconds: f64,
    /// The server's peak resident memory, KiB.
    pub peak_rss_kib: u64,
}

impl CostStep {
    /// The share of DISCOVERs (Solicits) that did not end in an ACK (a Reply).
    pub fn loss(&self) -> f64 {
        if self.discovers == 0 {
            return 1.0;
        }
        1.0 - self.acks.min(self.discovers) as f64 / self.discovers as f64
    }

    /// CPU µs per completed DORA (v6: exchange); `None` without ACKs.
    pub fn cpu_us_per_dora(&self) -> Option<f64> {
        (self.acks > 0).then(|| self.cpu_seconds * 1e6 / self.acks as f64)
    }

    /// The table cell: the cost, or no value when the server lost more than the knee allows
    /// at this rate (its cost per completed exchange then says little).
    pub fn cell(&self) -> Cell {
        let peak = self.peak_rss_kib as f64 / 1024.0;
        match self.cpu_us_per_dora() {
            Some(us) if self.loss() < LOSS_LIMIT => {
                Cell::with_note(us, format!("peak RSS {peak:.0} MiB"))
            }
            Some(us) => Cell::with_note(
                f64::NAN,
                format!(
                    "above its knee: {:.1}% lost, {us:.0} µs per completed {}",
                    self.loss() * 100.0,
                    self.family.exchange()
                ),
            ),
            None => Cell::with_note(
                f64::NAN,
                match self.family {
                    Family::V4 => "no ACK",
                    Family::V6 => "no Reply",
                },
            ),
        }
    }
}

fn measure(
    bed: &Bed,
    family: Family,
    server: &str,
    rate: u32,
    plan: &CostPlan,
    say: &dyn Fn(String),
) -> Result<CostStep, BedError> {
    let mut daemon = family.start(bed, server)?;
    let before = daemon.tree_cpu_seconds();
    let out = family.load(bed, rate, plan)?;
    let step = CostStep {
        family,
        offered: rate,
        discovers: out.offer.sent,
        acks: out.ack.received,
        cpu_seconds: daemon.tree_cpu_seconds() - before,
        peak_rss_kib: daemon.peak_rss_kib(),
    };
    daemon.stop();
    let (label, acks) = match family {
        Family::V4 => ("dhcp cost", "ACKs"),
        Family::V6 => ("dhcp v6 cost", "Replies"),
    };
    say(format!(
        "{label} {server}: {rate}/s for {} s: {} {acks}, {:.2}% lost, server CPU {:.2} s, {:.0} µs per {}",
        plan.seconds,
        step.acks,
        step.loss() * 100.0,
        step.cpu_seconds,
        step.cpu_us_per_dora().unwrap_or(f64::NAN),
        family.exchange(),
    ));
    Ok(step)
}

/// One row per rate (ours against the peers), the reference of ours without the price of
/// `fdatasync` in ours' note, and a chart of CPU per exchange against the offered rate; for
/// `family`'s rates and servers (none without rates).
pub fn run(
    bed: &Bed,
    plan: &CostPlan,
    family: Family,
    report: &mut Report,
    charts: &mut Vec<(String, String)>,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let rates = family.rates(plan);
    if rates.is_empty() {
        return Ok(());
    }
    if family == Family::V6 {
        bed.ipv6()?;
    }
    let mut rows: Vec<Row> = rates
        .iter()
        .map(|rate| Row {
            mode: "dhcp",
            case: family.case(*rate),
            what: family.what(*rate, plan.seconds),
            metric: family.metric(),
            unit: "µs",
            ours: None,
            peers: Vec::new(),
            better: Better::Lower,
            target: family.target(),
        })
        .collect();
    let mut series = Vec::new();
    let mut in_memory = Vec::new();
    for server in family.servers() {
        let mut points = Vec::new();
        for (row, rate) in rows.iter_mut().zip(rates) {
            let step = measure(bed, family, server, *rate, plan, say)?;
            let key = format!("dhcp.{}.{}", family.case(*rate), slug(server));
            report.figure(format!("{key}.loss_percent"), step.loss() * 100.0);
            report.figure(
                format!("{key}.peak_rss_mib"),
                step.peak_rss_kib as f64 / 1024.0,
            );
            let cell = step.cell();
            if cell.value.is_finite() {
                points.push((f64::from(*rate), cell.value));
            }
            match *server {
                "ours" => row.ours = Some(cell),
                OURS_IN_MEMORY => {
                    report.figure(
                        format!("{key}.{}", family.metric()),
                        step.cpu_us_per_dora().unwrap_or(f64::NAN),
                    );
                    in_memory.push(cell);
                }
                peer => row.peers.push((peer.to_owned(), cell)),
            }
        }
        series.push(Series {
            name: (*server).to_owned(),
            points,
        });
    }
    let _ = std::fs::remove_file(Bed::memory_leases());
    for (row, memory) in rows.iter_mut().zip(in_memory) {
        if let Some(ours) = row.ours.as_mut() {
            ours.note = with_reference(&ours.note, &memory);
        }
    }
    let [file, title, x, y] = family.chart();
    charts.push((file.into(), chart::line_chart(title, x, y, &series)));
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
            family: Family::V4,
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
    fn a_v6_step_speaks_of_exchanges_and_replies() {
        let v6 = |acks| CostStep {
            family: Family::V6,
            ..step(30_000, acks, 3.0)
        };
        assert!((v6(29_990).cell().value - 100.03).abs() < 0.01);
        let above = v6(15_000).cell();
        assert!(above.value.is_nan());
        assert!(
            above.note.ends_with("200 µs per completed exchange"),
            "{}",
            above.note
        );
        assert_eq!(v6(0).cell().note, "no Reply");
    }

    #[test]
    fn v6_rows_have_their_own_keys_servers_and_chart() {
        assert_eq!(Family::V4.case(2000), "cpu_2000");
        assert_eq!(Family::V6.case(2000), "cpu6_2000");
        assert_ne!(Family::V4.metric(), Family::V6.metric());
        assert_eq!(
            Family::V6.servers(),
            &["ours", OURS_IN_MEMORY, "Kea 1 thread"]
        );
        assert_eq!(Family::V6.target(), None);
        assert_eq!(Family::V4.target(), Some(TARGET));
        let plan = CostPlan {
            rates: &[2000, 4000],
            rates_v6: &[1000],
            seconds: 15,
            clients: 50_000,
        };
        assert_eq!(Family::V4.rates(&plan), &[2000, 4000]);
        assert_eq!(Family::V6.rates(&plan), &[1000]);
        assert!(
            Family::V6
                .what(1000, 15)
                .starts_with("v6 server CPU per exchange")
        );
        // Published with the dhcp block: the chart's name starts with its mode.
        for family in [Family::V4, Family::V6] {
            assert_eq!(family.chart()[0].split(['.', '-']).next(), Some("dhcp"));
        }
        assert_ne!(Family::V4.chart()[0], Family::V6.chart()[0]);
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
