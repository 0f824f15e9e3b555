//! TFTP: atftp (a neutral client) downloads the large file at blksize 1468 with windowsize
//! 1, 8 and 16 (RFC 7440; servers that do not put windowsize in their OACK send lock-step
//! anyway), and 20 files of 1 MiB at once, from ours, tftpd-hpa and dnsmasq. Every download
//! is checked against the file's sha256.

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Instant;

use super::bed::{Bed, BedError, files};
use super::chart;
use super::peers::NET;
use super::proc::{Daemon, ProcError};
use super::report::{Better, Cell, Report, Row};

const SERVERS: [&str; 3] = ["ours", "tftpd-hpa", "dnsmasq"];
const WINDOWS: [u32; 3] = [1, 8, 16];

fn start(bed: &Bed, server: &str) -> Result<Daemon, BedError> {
    match server {
        "ours" => bed.start_ours(&[], false),
        "tftpd-hpa" => bed.start_tftpd(),
        _ => bed.start_dnsmasq_tftp(),
    }
}

/// A size for people: `50 MiB`, `64 KiB`.
pub fn size_label(bytes: u64) -> String {
    if bytes >= 1024 * 1024 && bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

/// A size as a key part: `50mib`, `64kib`.
pub fn size_key(bytes: u64) -> String {
    size_label(bytes).replace(' ', "").to_lowercase()
}

/// The hex sha256 of a file.
pub fn sha256(path: &Path) -> Result<String, BedError> {
    let io = |source| BedError::Io {
        what: format!("reading {}", path.display()),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        context.update(buf.get(..n).unwrap_or_default());
    }
    Ok(context
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn atftp(bed: &Bed, remote: &str, local: &Path, window: Option<u32>) -> Result<Child, BedError> {
    let _ = std::fs::remove_file(local);
    let mut command = bed.client("atftp");
    command.args(["--option", "blksize 1468"]);
    if let Some(window) = window {
        command.args(["--option", &format!("windowsize {window}")]);
    }
    command
        .args(["-g", "-r", remote, "-l"])
        .arg(local)
        .arg(NET.server)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command.spawn().map_err(|source| {
        ProcError::Start {
            program: "atftp".into(),
            source,
        }
        .into()
    })
}

/// Downloads `remotes` at once; returns MB/s over all of them and the MB downloaded, or an
/// error when one failed or differs from its source.
fn download(
    bed: &Bed,
    remotes: &[String],
    window: Option<u32>,
    expected: &[String],
) -> Result<Result<(f64, f64), String>, BedError> {
    let got = bed.dir.join("got");
    std::fs::create_dir_all(&got).map_err(|source| BedError::Io {
        what: "creating the download directory".into(),
        source,
    })?;
    let locals: Vec<_> = remotes.iter().map(|r| got.join(r)).collect();
    let started = Instant::now();
    let children: Vec<Child> = remotes
        .iter()
        .zip(&locals)
        .map(|(remote, local)| atftp(bed, remote, local, window))
        .collect::<Result<_, _>>()?;
    let mut failures = Vec::new();
    for child in children {
        let output = child.wait_with_output().map_err(|source| BedError::Io {
            what: "waiting for atftp".into(),
            source,
        })?;
        if !output.status.success() {
            failures.push(String::from_utf8_lossy(&output.stderr).trim().to_owned());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut bytes = 0u64;
    for ((local, sum), remote) in locals.iter().zip(expected).zip(remotes) {
        bytes += std::fs::metadata(local).map_or(0, |m| m.len());
        if !local.exists() || sha256(local)? != *sum {
            failures.push(format!(
                "{remote}: the download differs from the file (sha256)"
            ));
        }
    }
    if let Some(first) = failures.first() {
        return Ok(Err(first.clone()));
    }
    let mb = bytes as f64 / 1e6;
    Ok(Ok((mb / seconds, mb)))
}

/// The target for every cost row: at most this share of the best peer's CPU per MB.
const COST_TARGET: f64 = 0.7;

/// A throughput row's twin: what the server spent per MB on the same downloads.
fn cost_row(row: &Row) -> Row {
    Row {
        mode: "tftp",
        case: format!("{}_cpu", row.case),
        what: format!("server CPU per MB: {}", row.what),
        metric: "cpu_ms_per_mb",
        unit: "ms",
        ours: None,
        peers: Vec::new(),
        better: Better::Lower,
        target: Some(COST_TARGET),
    }
}

/// CPU ms per MB; `NaN` when nothing was downloaded.
fn cpu_ms_per_mb(cpu_seconds: f64, mb: f64) -> f64 {
    if mb > 0.0 {
        cpu_seconds * 1e3 / mb
    } else {
        f64::NAN
    }
}

/// Every case on every server, the rows, and a chart of MB/s per windowsize.
pub fn run(
    bed: &Bed,
    report: &mut Report,
    charts: &mut Vec<(String, String)>,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let big_sum = sha256(&bed.tftp_root.join(files::BIG))?;
    let each: Vec<String> = (0..bed.sizes.concurrent).map(files::each).collect();
    let each_sums: Vec<String> = each
        .iter()
        .map(|f| sha256(&bed.tftp_root.join(f)))
        .collect::<Result<_, _>>()?;
    let mut rows: Vec<Row> = WINDOWS
        .iter()
        .map(|w| Row {
            mode: "tftp",
            case: format!("{}_w{w}", size_key(bed.sizes.big)),
            what: format!(
                "{}, blksize 1468, windowsize {w}",
                size_label(bed.sizes.big)
            ),
            metric: "mb_per_s",
            unit: "MB/s",
            ours: None,
            peers: Vec::new(),
            better: Better::Higher,
            target: (*w == 16).then_some(3.0),
        })
        .collect();
    rows.push(Row {
        mode: "tftp",
        case: format!("{}x{}", bed.sizes.concurrent, size_key(bed.sizes.each)),
        what: format!(
            "{} × {} at once, blksize 1468",
            bed.sizes.concurrent,
            size_label(bed.sizes.each)
        ),
        metric: "mb_per_s",
        unit: "MB/s",
        ours: None,
        peers: Vec::new(),
        better: Better::Higher,
        target: Some(1.5),
    });
    let mut cost_rows: Vec<Row> = rows.iter().map(cost_row).collect();
    for server in SERVERS {
        let daemon = start(bed, server)?;
        let cases: Vec<(Vec<String>, Option<u32>, Vec<String>)> = WINDOWS
            .iter()
            .map(|w| (vec![files::BIG.to_owned()], Some(*w), vec![big_sum.clone()]))
            .chain(std::iter::once((each.clone(), None, each_sums.clone())))
            .collect();
        for ((row, cost_row), (remotes, window, sums)) in
            rows.iter_mut().zip(cost_rows.iter_mut()).zip(cases)
        {
            let cpu_before = daemon.tree_cpu_seconds();
            let downloaded = download(bed, &remotes, window, &sums)?;
            let cpu = daemon.tree_cpu_seconds() - cpu_before;
            let (cell, cost) = match downloaded {
                Ok((rate, mb)) => {
                    let cost = cpu_ms_per_mb(cpu, mb);
                    say(format!(
                        "tftp {server}: {}: {rate:.1} MB/s, server CPU {cpu:.2} s ({cost:.2} ms per MB)",
                        row.what
                    ));
                    (Cell::new(rate), Cell::new(cost))
                }
                Err(failure) => {
                    say(format!("tftp {server}: {}: FAILED: {failure}", row.what));
                    report.problem(format!("tftp {server} {}: {failure}", row.what));
                    (
                        Cell::with_note(f64::NAN, "failed"),
                        Cell::with_note(f64::NAN, "failed"),
                    )
                }
            };
            if server == "ours" {
                row.ours = Some(cell);
                cost_row.ours = Some(cost);
            } else {
                row.peers.push((server.to_owned(), cell));
                cost_row.peers.push((server.to_owned(), cost));
            }
        }
        drop(daemon);
    }
    let categories: Vec<String> = rows.iter().map(|r| r.case.replace('_', " ")).collect();
    let series: Vec<(String, Vec<Option<f64>>)> = SERVERS
        .iter()
        .map(|server| {
            let values = rows
                .iter()
                .map(|row| {
                    if *server == "ours" {
                        row.ours.as_ref().map(|c| c.value)
                    } else {
                        row.peers
                            .iter()
                            .find(|(n, _)| n == server)
                            .map(|(_, c)| c.value)
                    }
                    .filter(|v| v.is_finite())
                })
                .collect();
            ((*server).to_owned(), values)
        })
        .collect();
    charts.push((
        "tftp.svg".into(),
        chart::bar_chart(
            "TFTP: MB/s per windowsize (atftp, blksize 1468)",
            "MB/s",
            &categories,
            &series,
        ),
    ));
    report.rows.extend(rows);
    report.rows.extend(cost_rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_throughput_row_has_a_cost_twin() {
        let row = Row {
            mode: "tftp",
            case: "50mib_w16".into(),
            what: "50 MiB, blksize 1468, windowsize 16".into(),
            metric: "mb_per_s",
            unit: "MB/s",
            ours: Some(Cell::new(273.0)),
            peers: Vec::new(),
            better: Better::Higher,
            target: Some(3.0),
        };
        let twin = cost_row(&row);
        assert_eq!(twin.case, "50mib_w16_cpu");
        assert_eq!(twin.metric, "cpu_ms_per_mb");
        assert_eq!(twin.better, Better::Lower);
        assert_eq!(twin.target, Some(COST_TARGET));
        assert_eq!(twin.ours, None);
        assert!((cpu_ms_per_mb(0.5, 52.4288) - 9.5367).abs() < 1e-3);
        assert!(cpu_ms_per_mb(0.5, 0.0).is_nan());
    }
}
