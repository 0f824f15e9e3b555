//! `unbounded-testbed bench`: which benchmarks run, their sizes (the issue's, or a
//! seconds-long smoke), and the report folder (Markdown report, SVG charts, figures).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::bed::{Bed, BedError, Sizes};
use super::report::Report;
use super::{dhcp, http, pair, peers, storm, tftp};
use crate::bench::controller::probe;

/// A bootserver binary to measure instead of building this checkout's (a before/after
/// comparison: `UNBOUNDED_BENCH_BOOTSERVER=/path/to/unbounded-bootserver bench dhcp`). `bench
/// pair` uses the `dhcp-load` beside it when there is one.
pub const OTHER_BOOTSERVER: &str = "UNBOUNDED_BENCH_BOOTSERVER";

/// One benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// DHCP knee, cost per DORA and per DHCPv6 exchange, and crash.
    Dhcp,
    /// TFTP.
    Tftp,
    /// HTTP.
    Http,
    /// The boot storm.
    Storm,
    /// Two servers as a pair: ours against Kea's HA hot-standby pair, and ours through a
    /// kill.
    Pair,
    /// The controller at scale and the PXE provider.
    Controller,
}

impl Mode {
    /// Every benchmark, in the order `all` runs them.
    pub const ALL: [Mode; 6] = [
        Mode::Tftp,
        Mode::Http,
        Mode::Dhcp,
        Mode::Storm,
        Mode::Pair,
        Mode::Controller,
    ];

    /// Its name on the command line and in figure keys.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Dhcp => "dhcp",
            Mode::Tftp => "tftp",
            Mode::Http => "http",
            Mode::Storm => "storm",
            Mode::Pair => "pair",
            Mode::Controller => "controller",
        }
    }
}

/// Sizes of the network benchmarks.
#[derive(Debug, Clone)]
pub struct NetworkOptions {
    /// Release build of ours (debug for the smoke).
    pub release: bool,
    /// The DHCP knee search.
    pub dhcp: dhcp::search::Plan,
    /// The DHCP cost per DORA (and per DHCPv6 exchange) at fixed rates.
    pub dhcp_cost: dhcp::cost::CostPlan,
    /// Which parts of `dhcp` run (`--v6`: the DHCPv6 cost rows only).
    pub dhcp_parts: dhcp::Parts,
    /// Seconds before the crash (the run lasts twice that).
    pub crash_seconds: u32,
    /// File sizes.
    pub sizes: Sizes,
    /// wrk's load.
    pub http: http::Load,
    /// The storm.
    pub storm: storm::Plan,
    /// The pair benchmark.
    pub pair: pair::Plan,
}

impl NetworkOptions {
    /// The sizes.
    pub fn full() -> Self {
        Self {
            release: true,
            dhcp: dhcp::search::Plan {
                start: 250,
                max: 64_000,
                probe_seconds: 3,
                step_seconds: 30,
                steps: 4,
                clients: 50_000,
            },
            // Below every server's knee but dnsmasq's on this kind of machine (the issue's).
            dhcp_cost: dhcp::cost::CostPlan {
                rates: &[2000, 4000, 6000],
                // DHCPv6 lower: on this kind of machine, busy, kea-dhcp6 (1 thread) lost
                // 3.4% at 4000/s and 21% at 6000/s for 15 s (< 0.1% at 4000/s when quieter);
                // 2000/s is also a v4 row's rate.
                rates_v6: &[1000, 2000, 3000],
                seconds: 15,
                clients: 50_000,
            },
            dhcp_parts: dhcp::Parts::All,
            crash_seconds: 10,
            sizes: Sizes {
                big: 50 * 1024 * 1024,
                each: 1024 * 1024,
                concurrent: 20,
                kernel: 8 * 1024 * 1024,
            },
            http: http::Load {
                seconds: 10,
                connections: 32,
                image_connections: 4,
            },
            storm: storm::Plan {
                clients: 1000,
                wave: 100,
                interval_ms: 1000,
            },
            pair: pair::Plan {
                rates: &[1000, 2000],
                seconds: 10,
                unpaced_clients: 20_000,
                window: 64,
                storm_clients: 4000,
                storm_rate: 500,
            },
        }
    }

    /// A seconds-long run of every case that keeps the command working (CI).
    pub fn smoke() -> Self {
        Self {
            release: false,
            dhcp: dhcp::search::Plan {
                start: 100,
                max: 200,
                probe_seconds: 1,
                step_seconds: 1,
                steps: 1,
                clients: 1000,
            },
            dhcp_cost: dhcp::cost::CostPlan {
                rates: &[100],
                rates_v6: &[100],
                seconds: 1,
                clients: 1000,
            },
            dhcp_parts: dhcp::Parts::All,
            crash_seconds: 1,
            sizes: Sizes {
                big: 1024 * 1024,
                each: 64 * 1024,
                concurrent: 4,
                kernel: 256 * 1024,
            },
            http: http::Load {
                seconds: 1,
                connections: 4,
                image_connections: 2,
            },
            storm: storm::Plan {
                clients: 20,
                wave: 10,
                interval_ms: 200,
            },
            pair: pair::Plan {
                rates: &[100],
                seconds: 1,
                unpaced_clients: 200,
                window: 16,
                storm_clients: 200,
                storm_rate: 100,
            },
        }
    }
}

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The bench failed.
    #[error(transparent)]
    Bed(#[from] BedError),
    /// Building ours failed.
    #[error("building the bootserver: {0}")]
    Build(String),
    /// Building ours failed on cargo's or a file's error, which it keeps.
    #[error("building the bootserver: {0}")]
    NotBuilt(#[source] crate::images::ImagesError),
    /// The controller benchmark failed.
    #[error("controller benchmark: {0}")]
    Controller(String),
    /// The controller benchmark failed on another error, which it keeps.
    #[error("controller benchmark: {0}")]
    ControllerFailed(#[source] crate::failure::Cause),
}

/// The load averages (1, 5, 15 minutes) as `uptime` prints them.
pub fn load_averages() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|| "unknown".into())
}

/// Runs `mode`, noting the machine's load before and after.
pub fn with_load<T>(
    mode: Mode,
    report: &mut Report,
    run: impl FnOnce(&mut Report) -> Result<T, SuiteError>,
) -> Result<T, SuiteError> {
    let before = probe::load_average().unwrap_or(f64::NAN);
    let start_text = load_averages();
    let result = run(report);
    let after = probe::load_average().unwrap_or(f64::NAN);
    report.figure(format!("{}.load1.before", mode.name()), before);
    report.figure(format!("{}.load1.after", mode.name()), after);
    report.note(format!(
        "`{}`: load average {start_text} before, {} after",
        mode.name(),
        load_averages()
    ));
    result
}

/// Runs the network benchmarks among `modes` on one bench.
pub fn run_network(
    modes: &[Mode],
    options: &NetworkOptions,
    work: &Path,
    report: &mut Report,
    charts: &mut Vec<(String, String)>,
    say: &dyn Fn(String),
) -> Result<(), SuiteError> {
    let network: Vec<Mode> = modes
        .iter()
        .copied()
        .filter(|m| *m != Mode::Controller)
        .collect();
    if network.is_empty() {
        return Ok(());
    }
    say("installing the peers and clients that are missing (Debian packages)".into());
    peers::install().map_err(BedError::from)?;
    // Another build of the bootserver, for a before/after comparison on one machine (the
    // harness and the peers stay this checkout's; `bench pair`'s load generator, dhcp-load,
    // is the one built beside it when there is one).
    let built = match std::env::var_os(OTHER_BOOTSERVER) {
        Some(path) => {
            say(format!(
                "measuring the bootserver at {} ({OTHER_BOOTSERVER})",
                Path::new(&path).display()
            ));
            let ours = PathBuf::from(path);
            // The pair's load generator: the one built beside that binary (a build of the
            // whole other tree has it), else this checkout's.
            let beside = ours.with_file_name("dhcp-load");
            let mut built = vec![ours];
            if beside.exists() {
                built.push(beside);
            } else if network.contains(&Mode::Pair) {
                built.extend(
                    crate::images::host_build(&["dhcp-load"], options.release)
                        .map_err(SuiteError::NotBuilt)?,
                );
            }
            built
        }
        None => {
            say(format!(
                "building our bootserver ({})",
                if options.release { "release" } else { "debug" }
            ));
            crate::images::host_build(&["unbounded-bootserver", "dhcp-load"], options.release)
                .map_err(SuiteError::NotBuilt)?
        }
    };
    let ours = built
        .first()
        .ok_or_else(|| SuiteError::Build("no binary".into()))?;
    let dhcp_load = built.get(1);
    say("creating the namespaces and the files served".into());
    let bed = Bed::new(work, ours, options.sizes)?;
    for mode in network {
        say(format!("== {}", mode.name()));
        with_load(mode, report, |report| {
            match mode {
                Mode::Dhcp => dhcp::run(
                    &bed,
                    &options.dhcp,
                    &options.dhcp_cost,
                    options.crash_seconds,
                    options.dhcp_parts,
                    report,
                    charts,
                    say,
                )?,
                Mode::Tftp => tftp::run(&bed, report, charts, say)?,
                Mode::Http => http::run(&bed, &options.http, report, say)?,
                Mode::Storm => storm::run(&bed, &options.storm, report, say)?,
                Mode::Pair => {
                    let dhcp_load = dhcp_load
                        .ok_or_else(|| SuiteError::Build("dhcp-load was not built".into()))?;
                    pair::run(&bed, dhcp_load, &options.pair, report, say)?;
                }
                Mode::Controller => {}
            }
            Ok(())
        })?;
    }
    // The served files are large and random; the configurations and logs stay.
    for dir in [&bed.tftp_root, &bed.images_dir, &bed.dir.join("got")] {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// The report's heading: what ran, on what, and how to read it.
pub fn header(command: &str, started: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Unbounded benchmark ({started})\n");
    let _ = writeln!(
        out,
        "`{command}` on {}. Client and server share these cores, and other work on the \
         machine moves every figure: each row's figures come from one run, ours and the peers \
         back to back, and the ratio is the result. Every server runs in a network namespace \
         of its own, the clients in another, joined by a veth pair.",
        machine()
    );
    out
}

/// This machine for people: `2 cores (<CPU model>)`.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    format!("{cores} cores ({model})")
}

/// A name for a report folder: the time now as `YYYYmmdd-HHMMSS` (UTC).
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The calendar date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The default report folder.
pub fn default_out() -> PathBuf {
    crate::cluster::cache_dir().join("bench").join(timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
    }

    #[test]
    fn the_header_says_that_the_ratio_is_the_result() {
        let text = header("unbounded-testbed bench all", "20260101-000000");
        assert!(text.contains("share these"));
        assert!(text.contains("the ratio is the result"));
    }
}
