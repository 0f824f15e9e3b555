//! What the benchmarks measured, as rows (ours against the peers, with the ratio) and as
//! figures (one `figure <key> <value>` line each, for scripts), rendered as the Markdown
//! report.

use std::fmt::Write as _;

/// One measured value and what to say beside it (latency, load, …).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The value, in the row's unit.
    pub value: f64,
    /// A short note (`mean 0.9 ms, p99 2.1 ms`), or empty.
    pub note: String,
}

impl Cell {
    /// A value without a note.
    pub fn new(value: f64) -> Self {
        Self {
            value,
            note: String::new(),
        }
    }

    /// A value with a note.
    pub fn with_note(value: f64, note: impl Into<String>) -> Self {
        Self {
            value,
            note: note.into(),
        }
    }
}

/// Which way a row's metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughput: more is better, and the target is a least ratio.
    Higher,
    /// Cost (CPU per operation, memory): less is better, and the target is a most ratio.
    Lower,
}

/// One row of the table: ours and the peers on one case.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The benchmark (`dhcp`, `tftp`, …), first part of each figure's key.
    pub mode: &'static str,
    /// The case as a key (`50mib_w16`).
    pub case: String,
    /// The case for people (`50 MiB, blksize 1468, windowsize 16`).
    pub what: String,
    /// The metric as a key (`mb_per_s`).
    pub metric: &'static str,
    /// Its unit for people (`MB/s`).
    pub unit: &'static str,
    /// Ours, when it ran.
    pub ours: Option<Cell>,
    /// Each peer by name.
    pub peers: Vec<(String, Cell)>,
    /// Which way is better.
    pub better: Better,
    /// The target ratio against the best peer, when the issue sets one (a least ratio for
    /// [`Better::Higher`], a most ratio for [`Better::Lower`]).
    pub target: Option<f64>,
}

impl Row {
    /// The best peer (highest value, or lowest positive one for a cost), if any ran.
    pub fn best_peer(&self) -> Option<&(String, Cell)> {
        let measured = self.peers.iter().filter(|(_, c)| c.value.is_finite());
        match self.better {
            Better::Higher => measured.max_by(|a, b| a.1.value.total_cmp(&b.1.value)),
            // A cost of zero is no measurement (a process that did not run).
            Better::Lower => measured
                .filter(|(_, c)| c.value > 0.0)
                .min_by(|a, b| a.1.value.total_cmp(&b.1.value)),
        }
    }

    /// Ours divided by the best peer.
    pub fn ratio(&self) -> Option<f64> {
        let ours = self.ours.as_ref()?.value;
        let (_, best) = self.best_peer()?;
        (best.value > 0.0).then(|| ours / best.value)
    }

    /// Whether the target is met; `None` without a target or a ratio.
    pub fn meets_target(&self) -> Option<bool> {
        let (ratio, target) = (self.ratio()?, self.target?);
        Some(match self.better {
            Better::Higher => ratio >= target,
            Better::Lower => ratio <= target,
        })
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// The comparison rows.
    pub rows: Vec<Row>,
    /// Figures that are no row of their own (latencies, CPU, memory, counts).
    pub extra: Vec<(String, f64)>,
    /// Lines said under the table (per mode: load, what was checked).
    pub notes: Vec<String>,
    /// What went wrong (a failed boot, a lost lease): the command fails after the report.
    pub problems: Vec<String>,
}

impl Report {
    /// Adds a figure that is no row of its own.
    pub fn figure(&mut self, key: impl Into<String>, value: f64) {
        self.extra.push((key.into(), value));
    }

    /// Adds a note under the table.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// Records a problem.
    pub fn problem(&mut self, line: impl Into<String>) {
        self.problems.push(line.into());
    }

    /// Appends another report's rows, figures, notes and problems.
    pub fn merge(&mut self, other: Report) {
        self.rows.extend(other.rows);
        self.extra.extend(other.extra);
        self.notes.extend(other.notes);
        self.problems.extend(other.problems);
    }

    /// One `figure <key> <value>` line per number: every cell of every row, each row's
    /// ratio, then the extra figures.
    pub fn figure_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for row in &self.rows {
            let key =
                |server: &str| format!("{}.{}.{}.{}", row.mode, row.case, slug(server), row.metric);
            if let Some(ours) = &row.ours {
                lines.push(format!("figure {} {}", key("ours"), number(ours.value)));
            }
            for (peer, cell) in &row.peers {
                lines.push(format!("figure {} {}", key(peer), number(cell.value)));
            }
            if let Some(ratio) = row.ratio() {
                lines.push(format!(
                    "figure {}.{}.ratio {}",
                    row.mode,
                    row.case,
                    number(ratio)
                ));
            }
        }
        for (key, value) in &self.extra {
            lines.push(format!("figure {key} {}", number(*value)));
        }
        lines
    }

    /// The table in Markdown.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "| what | ours | peers, same run | ratio | target |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for row in &self.rows {
            let ours = row
                .ours
                .as_ref()
                .map_or_else(|| "—".to_owned(), |c| cell_text(c, row.unit));
            let peers = if row.peers.is_empty() {
                "—".to_owned()
            } else {
                row.peers
                    .iter()
                    .map(|(name, c)| format!("{name} {}", cell_text(c, row.unit)))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let ratio = row.ratio().map_or_else(
                || "—".to_owned(),
                |r| {
                    let against = row.best_peer().map(|(n, _)| n.as_str()).unwrap_or("");
                    format!("{r:.2}× {against}")
                },
            );
            let sign = match row.better {
                Better::Higher => "≥",
                Better::Lower => "≤",
            };
            let target = match (row.target, row.meets_target()) {
                (Some(t), Some(true)) => format!("{sign} {t}×: met"),
                (Some(t), Some(false)) => format!("{sign} {t}×: missed"),
                (Some(t), None) => format!("{sign} {t}×"),
                (None, _) => String::new(),
            };
            let _ = writeln!(
                out,
                "| {} {} | {ours} | {peers} | {ratio} | {target} |",
                row.mode, row.what
            );
        }
        out
    }

    /// The whole report: header, table, notes, chart links, figures.
    pub fn markdown(&self, header: &str, charts: &[String]) -> String {
        let mut out = String::new();
        out.push_str(header);
        out.push('\n');
        out.push_str(&self.table());
        out.push('\n');
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        for problem in &self.problems {
            let _ = writeln!(out, "- **problem**: {problem}");
        }
        if !charts.is_empty() {
            out.push('\n');
            for chart in charts {
                let _ = writeln!(out, "![{chart}]({chart})");
            }
        }
        out.push_str("\n```\n");
        for line in self.figure_lines() {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("```\n");
        out
    }
}

fn cell_text(cell: &Cell, unit: &str) -> String {
    let value = human(cell.value);
    if cell.note.is_empty() {
        format!("{value} {unit}")
    } else {
        format!("{value} {unit} ({})", cell.note)
    }
}

/// A number for people: thousands separated, fewer decimals for larger numbers.
pub fn human(value: f64) -> String {
    if !value.is_finite() {
        return "n/a".to_owned();
    }
    if value.abs() >= 1000.0 {
        let whole = value.round() as i64;
        let digits = whole.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if whole < 0 {
            format!("-{grouped}")
        } else {
            grouped
        }
    } else if value.abs() >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A number for scripts.
fn number(value: f64) -> String {
    if value.is_finite() {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        "nan".to_owned()
    }
}

/// A name as a key part: lower case, `-` for anything but letters, digits and `_`.
pub fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ours: Option<f64>, peers: &[(&str, f64)], target: Option<f64>) -> Row {
        Row {
            mode: "tftp",
            case: "50mib_w16".into(),
            what: "50 MiB, windowsize 16".into(),
            metric: "mb_per_s",
            unit: "MB/s",
            ours: ours.map(Cell::new),
            peers: peers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), Cell::new(*v)))
                .collect(),
            better: Better::Higher,
            target,
        }
    }

    #[test]
    fn the_ratio_is_against_the_best_peer() {
        let r = row(
            Some(90.0),
            &[("tftpd-hpa", 45.0), ("dnsmasq", 30.0)],
            Some(3.0),
        );
        assert_eq!(r.best_peer().map(|(n, _)| n.as_str()), Some("tftpd-hpa"));
        assert_eq!(r.ratio(), Some(2.0));
        assert_eq!(r.meets_target(), Some(false));
        let met = row(Some(150.0), &[("tftpd-hpa", 45.0)], Some(3.0));
        assert_eq!(met.meets_target(), Some(true));
        assert_eq!(row(None, &[("a", 1.0)], Some(1.0)).ratio(), None);
        assert_eq!(row(Some(1.0), &[], None).ratio(), None);
        assert_eq!(row(Some(1.0), &[("a", 0.0)], None).ratio(), None);
        assert_eq!(row(Some(1.0), &[("a", 2.0)], None).meets_target(), None);
    }

    #[test]
    fn for_a_cost_the_best_peer_is_the_cheapest_and_the_target_a_ceiling() {
        let mut r = row(
            Some(154.0),
            &[
                ("Kea 1 thread", 113.0),
                ("Kea 2 threads", 163.0),
                ("dnsmasq", 0.0),
            ],
            Some(0.7),
        );
        r.better = Better::Lower;
        // A zero cost is no measurement: dnsmasq is not the best.
        assert_eq!(r.best_peer().map(|(n, _)| n.as_str()), Some("Kea 1 thread"));
        let ratio = r.ratio().unwrap_or_default();
        assert!((ratio - 154.0 / 113.0).abs() < 1e-9);
        assert_eq!(r.meets_target(), Some(false));
        r.ours = Some(Cell::new(70.0));
        assert_eq!(r.meets_target(), Some(true));
        let table = Report {
            rows: vec![r],
            ..Report::default()
        }
        .table();
        assert!(
            table.contains("| 0.62× Kea 1 thread | ≤ 0.7×: met |"),
            "{table}"
        );
    }

    #[test]
    fn every_number_becomes_one_figure_line() {
        let mut report = Report {
            rows: vec![row(Some(90.0), &[("tftpd-hpa", 45.5)], Some(3.0))],
            ..Report::default()
        };
        report.figure("tftp.50mib_w16.ours.sha256_ok", 1.0);
        assert_eq!(
            report.figure_lines(),
            vec![
                "figure tftp.50mib_w16.ours.mb_per_s 90",
                "figure tftp.50mib_w16.tftpd-hpa.mb_per_s 45.5",
                "figure tftp.50mib_w16.ratio 1.978",
                "figure tftp.50mib_w16.ours.sha256_ok 1",
            ]
        );
    }

    #[test]
    fn the_table_says_ratio_and_target() {
        let report = Report {
            rows: vec![
                row(
                    Some(90.0),
                    &[("tftpd-hpa", 45.0), ("dnsmasq", 40.0)],
                    Some(3.0),
                ),
                row(Some(5.0), &[], None),
            ],
            ..Report::default()
        };
        let table = report.table();
        assert!(table.contains(
            "| tftp 50 MiB, windowsize 16 | 90 MB/s | tftpd-hpa 45 MB/s; dnsmasq 40 MB/s | 2.00× tftpd-hpa | ≥ 3×: missed |"
        ), "{table}");
        // Whole numbers without decimals, as `human` writes them.
        assert!(
            table.contains("| tftp 50 MiB, windowsize 16 | 5 MB/s | — | — |  |"),
            "{table}"
        );
    }

    #[test]
    fn numbers_for_people_and_keys() {
        assert_eq!(human(42349.4), "42,349");
        assert_eq!(human(1_234_567.0), "1,234,567");
        assert_eq!(human(826.3), "826");
        assert_eq!(human(38.64), "38.6");
        assert_eq!(human(0.864), "0.86");
        assert_eq!(human(20.0), "20");
        assert_eq!(human(f64::NAN), "n/a");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::INFINITY), "nan");
        assert_eq!(slug("Kea 2 threads"), "kea-2-threads");
    }
}
