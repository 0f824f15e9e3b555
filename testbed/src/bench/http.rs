//! HTTP: wrk (a neutral client; two threads, keep-alive) against ours and nginx (with
//! `sendfile`): a 1 KiB file and the large image (req/s, MB/s, mean and 99th-percentile
//! latency), and our per-machine iPXE script route against nginx's 1 KiB static file.
//! wrk's summary is printed by a small Lua `done` hook, so that the figures are exact.

use super::bed::{Bed, BedError, files};
use super::clients::{dhcp::format_mac, storm_mac};
use super::peers::{BenchMachine, NET};
use super::proc::{Daemon, ProcError, run_client};
use super::report::{Better, Cell, Report, Row};

const WRK_SCRIPT: &str = r#"done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d %d %.1f %.1f\n", summary.requests, summary.bytes,
    summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency.mean, latency:percentile(99)))
end
"#;

/// wrk's summary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WrkResult {
    /// Requests completed.
    pub requests: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds it ran.
    pub seconds: f64,
    /// Errors (connection, read, write, non-2xx status, timeout).
    pub errors: u64,
    /// Mean latency, ms.
    pub mean_ms: f64,
    /// 99th-percentile latency, ms.
    pub p99_ms: f64,
}

impl WrkResult {
    /// Requests per second.
    pub fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// MB (10⁶ bytes) per second.
    pub fn mb_per_second(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }
}

/// Reads the `WRK …` line the Lua hook prints.
pub fn parse_wrk(text: &str) -> Option<WrkResult> {
    let line = text.lines().find_map(|l| l.strip_prefix("WRK "))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let int = |i: usize| f.get(i)?.parse::<u64>().ok();
    let float = |i: usize| f.get(i)?.parse::<f64>().ok();
    let micros = int(2)?;
    (micros > 0).then_some(())?;
    Some(WrkResult {
        requests: int(0)?,
        bytes: int(1)?,
        seconds: micros as f64 / 1e6,
        errors: int(3)?,
        mean_ms: float(4)? / 1000.0,
        p99_ms: float(5)? / 1000.0,
    })
}

/// How wrk loads the server.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Seconds per case.
    pub seconds: u32,
    /// Connections for the small responses.
    pub connections: u32,
    /// Connections for the large image.
    pub image_connections: u32,
}

fn wrk(bed: &Bed, path: &str, connections: u32, seconds: u32) -> Result<WrkResult, BedError> {
    let script = bed.dir.join("wrk-report.lua");
    std::fs::write(&script, WRK_SCRIPT).map_err(|source| BedError::Io {
        what: "writing the wrk script".into(),
        source,
    })?;
    let mut command = bed.client("wrk");
    command
        .args(["-t2", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .arg("-s")
        .arg(&script)
        .arg(format!("http://{}:{}{path}", NET.server, NET.http_port));
    let stdout = run_client(command)?;
    parse_wrk(&stdout).ok_or_else(|| {
        ProcError::Failed {
            command: format!("wrk {path}"),
            status: "no summary".into(),
            output: stdout,
        }
        .into()
    })
}

struct Case {
    case: &'static str,
    what: String,
    path_ours: String,
    path_peer: Option<String>,
    image: bool,
    target: f64,
}

/// Every case against ours and nginx.
pub fn run(
    bed: &Bed,
    load: &Load,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let machine = BenchMachine {
        name: "storm-0000".into(),
        mac: format_mac(&storm_mac(0)),
    };
    let small = format!("/images/{}", files::SMALL);
    let big = format!("/images/{}", files::BIG);
    let cases = [
        Case {
            case: "1kib",
            what: format!("1 KiB file, wrk -t2 -c{}", load.connections),
            path_ours: small.clone(),
            path_peer: Some(small.clone()),
            image: false,
            target: 0.9,
        },
        Case {
            case: "image",
            what: format!(
                "{} image, wrk -t2 -c{}",
                super::tftp::size_label(bed.sizes.big),
                load.image_connections
            ),
            path_ours: big.clone(),
            path_peer: Some(big),
            image: true,
            target: 0.9,
        },
        Case {
            case: "ipxe_script",
            what: format!(
                "iPXE script route (ours) against the 1 KiB static file (nginx), wrk -t2 -c{}",
                load.connections
            ),
            path_ours: format!("/boot.ipxe?mac={}", machine.mac),
            // The same figure as the 1 KiB case: nginx has no script route.
            path_peer: None,
            image: false,
            target: 1.0,
        },
    ];
    let mut ours_cells = Vec::new();
    {
        let mut daemon = bed.start_ours(std::slice::from_ref(&machine), false)?;
        for case in &cases {
            ours_cells.push(measure(
                bed,
                load,
                report,
                say,
                ("ours", &mut daemon),
                case.case,
                &case.path_ours,
                case.image,
            )?);
        }
    }
    let mut peer_cells = Vec::new();
    {
        let mut daemon = bed.start_nginx()?;
        for case in &cases {
            let cell = match &case.path_peer {
                Some(path) => Some(measure(
                    bed,
                    load,
                    report,
                    say,
                    ("nginx", &mut daemon),
                    case.case,
                    path,
                    case.image,
                )?),
                None => None,
            };
            peer_cells.push(cell);
        }
    }
    let nginx_small = peer_cells.first().cloned().flatten();
    let mut cost_rows = Vec::new();
    for ((case, ours), peer) in cases.iter().zip(ours_cells).zip(peer_cells) {
        let peer = peer.or_else(|| nginx_small.clone());
        let peers = |cell: fn(&Measured) -> Cell| {
            peer.as_ref()
                .map(|m| ("nginx".to_owned(), cell(m)))
                .into_iter()
                .collect::<Vec<_>>()
        };
        report.rows.push(Row {
            mode: "http",
            case: case.case.to_owned(),
            what: case.what.clone(),
            metric: if case.image { "mb_per_s" } else { "req_per_s" },
            unit: if case.image { "MB/s" } else { "req/s" },
            ours: Some(ours.throughput.clone()),
            peers: peers(|m| m.throughput.clone()),
            better: Better::Higher,
            target: Some(case.target),
        });
        cost_rows.push(Row {
            mode: "http",
            case: format!("{}_cpu", case.case),
            what: format!(
                "server CPU per {}: {}",
                if case.image { "MB" } else { "request" },
                case.what
            ),
            metric: if case.image {
                "cpu_ms_per_mb"
            } else {
                "cpu_us_per_request"
            },
            unit: if case.image { "ms" } else { "µs" },
            ours: Some(ours.cost.clone()),
            peers: peers(|m| m.cost.clone()),
            better: Better::Lower,
            target: Some(COST_TARGET),
        });
    }
    report.rows.extend(cost_rows);
    Ok(())
}

/// The target for every cost row: at most nginx's CPU per request and per MB (the issue).
const COST_TARGET: f64 = 1.0;

/// What one case measured on one server: its throughput and what the server's processes
/// spent per request (µs) or per MB (ms) for it.
#[derive(Debug, Clone)]
struct Measured {
    throughput: Cell,
    cost: Cell,
}

/// CPU µs per request, or CPU ms per MB for an image; `NaN` when nothing was served.
fn cost_of(cpu_seconds: f64, result: &WrkResult, image: bool) -> f64 {
    let served = if image {
        result.bytes as f64 / 1e6
    } else {
        result.requests as f64
    };
    if served <= 0.0 {
        return f64::NAN;
    }
    let scale = if image { 1e3 } else { 1e6 };
    cpu_seconds * scale / served
}

fn report_figures(report: &mut Report, key: &str, result: &WrkResult) {
    for (name, value) in [
        ("req_per_s", result.requests_per_second()),
        ("mb_per_s", result.mb_per_second()),
        ("mean_ms", result.mean_ms),
        ("p99_ms", result.p99_ms),
        ("errors", result.errors as f64),
    ] {
        report.figure(format!("{key}.{name}"), value);
    }
}

/// One wrk run of one case against one server.
#[allow(clippy::too_many_arguments)]
fn measure(
    bed: &Bed,
    load: &Load,
    report: &mut Report,
    say: &dyn Fn(String),
    (server, daemon): (&str, &mut Daemon),
    case: &str,
    path: &str,
    image: bool,
) -> Result<Measured, BedError> {
    let connections = if image {
        load.image_connections
    } else {
        load.connections
    };
    let cpu_before = daemon.tree_cpu_seconds();
    let result = wrk(bed, path, connections, load.seconds)?;
    let cpu = daemon.tree_cpu_seconds() - cpu_before;
    let cost = cost_of(cpu, &result, image);
    report_figures(
        report,
        &format!("http.{case}.{}", super::report::slug(server)),
        &result,
    );
    say(format!(
        "http {server} {path}: {:.0} req/s, {:.1} MB/s, mean {:.2} ms, p99 {:.2} ms, {} errors, server CPU {cpu:.2} s ({cost:.2} {})",
        result.requests_per_second(),
        result.mb_per_second(),
        result.mean_ms,
        result.p99_ms,
        result.errors,
        if image {
            "ms per MB"
        } else {
            "µs per request"
        }
    ));
    if result.errors > 0 {
        report.problem(format!("http {server} {path}: {} errors", result.errors));
    }
    if !daemon.running() {
        report.problem(format!("http {server} exited during {path}"));
    }
    let value = if image {
        result.mb_per_second()
    } else {
        result.requests_per_second()
    };
    Ok(Measured {
        throughput: Cell::with_note(
            value,
            format!("mean {:.2} ms, p99 {:.2} ms", result.mean_ms, result.p99_ms),
        ),
        cost: Cell::with_note(
            cost,
            format!("at {}", super::report::human(value)) + if image { " MB/s" } else { " req/s" },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_server_cpu_per_request_or_per_mb() {
        let result = WrkResult {
            requests: 200_000,
            bytes: 500_000_000,
            seconds: 10.0,
            errors: 0,
            mean_ms: 1.0,
            p99_ms: 2.0,
        };
        // 3.44 s of CPU: 17.2 µs per request, 6.88 ms per MB.
        assert!((cost_of(3.44, &result, false) - 17.2).abs() < 1e-9);
        assert!((cost_of(3.44, &result, true) - 6.88).abs() < 1e-9);
        let nothing = WrkResult {
            requests: 0,
            bytes: 0,
            ..result
        };
        assert!(cost_of(1.0, &nothing, false).is_nan());
    }

    #[test]
    fn the_summary_line_is_read() {
        let text = "Running 3s test @ http://10.97.0.1:8080/images/1k.bin\nWRK 212932 269140000 3070000 0 2840.5 56190.0\n";
        let r = parse_wrk(text).unwrap_or_else(|| panic!("not parsed"));
        assert_eq!((r.requests, r.errors), (212_932, 0));
        assert!((r.seconds - 3.07).abs() < 1e-9);
        assert!((r.requests_per_second() - 69_358.9).abs() < 0.1);
        assert!((r.mb_per_second() - 87.668).abs() < 0.001);
        assert!((r.mean_ms - 2.8405).abs() < 1e-9);
        assert!((r.p99_ms - 56.19).abs() < 1e-9);
        assert_eq!(parse_wrk("no summary"), None);
        assert_eq!(parse_wrk("WRK 1 2 0 0 1 1"), None);
    }
}
