//! Figures from outside the controller: its memory and CPU time from `/proc`, and the API
//! server's request counters from its `/metrics`.

use std::collections::BTreeMap;

/// Memory of a process, in KiB, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size (`VmHWM`).
    pub peak_kib: u64,
}

/// Parses the `VmRSS` and `VmHWM` lines of `/proc/<pid>/status`.
pub fn parse_memory(status: &str) -> Memory {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
    }
}

/// Reads a process's memory; `None` once it is gone.
pub fn memory(pid: u32) -> Option<Memory> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .map(|s| parse_memory(&s))
}

/// Resets a process's peak RSS to its current RSS (`/proc/<pid>/clear_refs`, value 5), so
/// that the next phase's peak is its own. Returns whether the kernel accepted it.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// User plus system CPU time of a process, in clock ticks, from `/proc/<pid>/stat`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A process's CPU time in seconds (assuming the usual 100 ticks per second).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / 100.0)
}

/// The 1-minute load average, from `/proc/loadavg`.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One `apiserver_request_total` series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestKey {
    /// `verb` (`GET`, `LIST`, `WATCH`, `POST`, `PATCH`, `APPLY`, `PUT`, `DELETE`).
    pub verb: String,
    /// `resource`, with `/subresource` when there is one.
    pub resource: String,
    /// `code`, the HTTP status.
    pub code: String,
}

/// Request counters by series.
pub type RequestCounts = BTreeMap<RequestKey, u64>;

/// Parses the `apiserver_request_total` series of the API server's Prometheus text output.
pub fn parse_request_counts(metrics: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = parse_labels(labels);
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        let subresource = label("subresource");
        let resource = if subresource.is_empty() {
            label("resource")
        } else {
            format!("{}/{subresource}", label("resource"))
        };
        let key = RequestKey {
            verb: label("verb"),
            resource,
            code: label("code"),
        };
        // Counters are integers; the text format writes them as floats.
        *counts.entry(key).or_insert(0) += value.max(0.0) as u64;
    }
    counts
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        // Label values here never contain escaped quotes.
        let Some((value, tail)) = after.split_once('"') else {
            break;
        };
        labels.insert(
            name.trim_start_matches(',').trim().to_owned(),
            value.to_owned(),
        );
        rest = tail;
    }
    labels
}

/// `after - before` per series (series that did not grow are left out).
pub fn difference(before: &RequestCounts, after: &RequestCounts) -> RequestCounts {
    after
        .iter()
        .filter_map(|(key, value)| {
            let grown = value.saturating_sub(before.get(key).copied().unwrap_or(0));
            (grown > 0).then(|| (key.clone(), grown))
        })
        .collect()
}

/// The requests answered 409 Conflict: writes over a copy older than the object (a
/// controller deciding from a cache that lags behind its own writes).
pub fn conflicts(counts: &RequestCounts) -> u64 {
    counts
        .iter()
        .filter(|(key, _)| key.code == "409")
        .map(|(_, n)| n)
        .sum()
}

/// Totals by verb.
pub fn by_verb(counts: &RequestCounts) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for (key, value) in counts {
        *totals.entry(key.verb.clone()).or_insert(0) += value;
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_from_status() {
        let status =
            "Name:\tunbounded-contr\nVmHWM:\t  183412 kB\nVmRSS:\t   91234 kB\nThreads:\t3\n";
        assert_eq!(
            parse_memory(status),
            Memory {
                rss_kib: 91_234,
                peak_kib: 183_412
            }
        );
        assert_eq!(parse_memory(""), Memory::default());
    }

    #[test]
    fn cpu_from_stat() {
        // A command name with spaces and parentheses, as the kernel writes it.
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 500 0 0 0 1234 56 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1_290));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn request_counters() {
        let before = parse_request_counts(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"unbounded-cloud.io\",resource=\"machines\",scope=\"resource\",subresource=\"status\",verb=\"APPLY\",version=\"v1alpha1\"} 10\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"events\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 4\n",
        );
        let after = parse_request_counts(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"unbounded-cloud.io\",resource=\"machines\",scope=\"resource\",subresource=\"status\",verb=\"APPLY\",version=\"v1alpha1\"} 25\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"events\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 4\n\
             apiserver_request_total{code=\"409\",component=\"apiserver\",dry_run=\"\",group=\"unbounded-cloud.io\",resource=\"machines\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 2e+00\n\
             apiserver_request_duration_seconds_bucket{verb=\"GET\",le=\"0.1\"} 99\n",
        );
        let grown = difference(&before, &after);
        assert_eq!(grown.len(), 2);
        let apply = RequestKey {
            verb: "APPLY".into(),
            resource: "machines/status".into(),
            code: "200".into(),
        };
        assert_eq!(grown[&apply], 15);
        assert_eq!(
            by_verb(&grown),
            BTreeMap::from([("APPLY".to_owned(), 15), ("PATCH".to_owned(), 2)])
        );
        assert_eq!(conflicts(&grown), 2);
        assert_eq!(conflicts(&before), 0);
    }
}
