//! The report for people (a table) and for scripts (one `figure` line per number), and the
//! release build of the controller the benchmark runs.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::probe::{self, RequestCounts};
use super::{BenchError, Phase, Report};
use crate::failure::Failure;

const MIB: f64 = 1024.0;

/// The report as a table, with the requests by verb of each phase.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let phases: Vec<(&str, &Phase)> = [
        ("converge", Some(&report.converge)),
        ("change", report.change.as_ref()),
    ]
    .into_iter()
    .filter_map(|(name, phase)| phase.map(|p| (name, p)))
    .collect();
    let _ = writeln!(
        out,
        "| phase | seconds | controller peak RSS | controller CPU | API requests | peak requests/s | kube-apiserver CPU | etcd CPU | kube-controller-manager CPU | kube-apiserver peak RSS | load average |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, phase) in &phases {
        let seconds = phase
            .seconds
            .map_or_else(|| "not done".to_owned(), |s| format!("{s:.1}"));
        let _ = writeln!(
            out,
            "| {name} | {seconds} | {:.0} MiB | {:.1} s | {} | {:.0} | {:.1} s | {:.1} s | {:.1} s | {:.0} MiB | {:.1} → {:.1} |",
            phase.peak_rss_kib as f64 / MIB,
            phase.cpu_seconds,
            total(&phase.requests),
            phase.peak_requests_per_second,
            phase.apiserver_cpu_seconds,
            phase.etcd_cpu_seconds,
            phase.kcm_cpu_seconds,
            phase.apiserver_peak_rss_kib as f64 / MIB,
            phase.load_average.0,
            phase.load_average.1,
        );
    }
    let _ = writeln!(out);
    for (name, phase) in &phases {
        let _ = writeln!(out, "{name}: requests by verb: {}", verbs(&phase.requests));
        let _ = writeln!(out, "{name}: by resource: {}", resources(&phase.requests));
        if let Some(problem) = &phase.progress.first_problem {
            let _ = writeln!(out, "{name}: still wrong: {problem}");
        }
    }
    let _ = writeln!(
        out,
        "quiet ({} requests after convergence): {}",
        total(&report.quiet_requests),
        verbs(&report.quiet_requests)
    );
    out
}

/// One line per figure: `figure controller.<phase>.<name> <value>`.
pub fn figure_lines(report: &Report) -> Vec<String> {
    let mut lines = vec![format!(
        "figure controller.setup.seconds {:.1}",
        report.setup_seconds
    )];
    let phases = [
        ("converge", Some(&report.converge)),
        ("change", report.change.as_ref()),
    ];
    for (name, phase) in phases {
        let Some(phase) = phase else { continue };
        let seconds = phase
            .seconds
            .map_or_else(|| "nan".to_owned(), |s| format!("{s:.1}"));
        lines.push(format!("figure controller.{name}.seconds {seconds}"));
        lines.push(format!(
            "figure controller.{name}.peak_rss_mib {:.1}",
            phase.peak_rss_kib as f64 / MIB
        ));
        lines.push(format!(
            "figure controller.{name}.cpu_seconds {:.1}",
            phase.cpu_seconds
        ));
        lines.push(format!(
            "figure controller.{name}.apiserver_cpu_seconds {:.1}",
            phase.apiserver_cpu_seconds
        ));
        lines.push(format!(
            "figure controller.{name}.etcd_cpu_seconds {:.1}",
            phase.etcd_cpu_seconds
        ));
        lines.push(format!(
            "figure controller.{name}.requests {}",
            total(&phase.requests)
        ));
        lines.push(format!(
            "figure controller.{name}.peak_requests_per_second {:.0}",
            phase.peak_requests_per_second
        ));
        lines.push(format!(
            "figure controller.{name}.conflicts {}",
            probe::conflicts(&phase.requests)
        ));
        for (verb, count) in probe::by_verb(&phase.requests) {
            lines.push(format!("figure controller.{name}.requests.{verb} {count}"));
        }
    }
    lines.push(format!(
        "figure controller.quiet.requests {}",
        total(&report.quiet_requests)
    ));
    lines
}

fn total(counts: &RequestCounts) -> u64 {
    counts.values().sum()
}

fn verbs(counts: &RequestCounts) -> String {
    let parts: Vec<String> = probe::by_verb(counts)
        .into_iter()
        .map(|(verb, n)| format!("{verb} {n}"))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

fn resources(counts: &RequestCounts) -> String {
    let mut by: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for (key, n) in counts {
        *by.entry((key.verb.clone(), key.resource.clone()))
            .or_insert(0) += n;
        if !key.code.starts_with('2') {
            *by.entry((key.verb.clone(), format!("{} ({})", key.resource, key.code)))
                .or_insert(0) += n;
        }
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    rows.iter()
        .take(12)
        .map(|((verb, resource), n)| format!("{verb} {resource} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Builds the controller in release mode with cargo and returns the binary's path.
pub fn build_release_controller() -> Result<PathBuf, BenchError> {
    crate::images::host_build(&["unbounded-controller"], true)
        .map_err(|e| Failure::new("building the release controller", e))?
        .into_iter()
        .next()
        .ok_or_else(|| BenchError::Controller {
            what: "building the release controller".into(),
            message: "cargo built no unbounded-controller".into(),
        })
}
