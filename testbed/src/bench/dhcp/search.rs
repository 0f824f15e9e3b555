//! The DHCP knee search and perfdhcp's output, both pure.
//!
//! perfdhcp (Kea's load generator; it binds port 67 in the client namespace and acts as a
//! relay, giaddr set) offers DORA exchanges at a fixed rate from 50,000 simulated clients,
//! one step at a time. The knee is the highest offered rate at which less than 1% of the
//! full DORA exchanges were lost; its mean and 99th-percentile latencies come from
//! perfdhcp's per-exchange timestamps (`-x t`).
//!
//! The search ([`next_step`]) is a function of the steps so far: short probes that double
//! the rate until one loses ≥ 1%, then full-length steps that bisect between the highest
//! rate that held and the lowest that did not.

/// How the knee is searched.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The first probe's rate.
    pub start: u32,
    /// No rate above this is offered.
    pub max: u32,
    /// Seconds of a probe.
    pub probe_seconds: u32,
    /// Seconds of a full step (the issue: 30).
    pub step_seconds: u32,
    /// Full steps at most.
    pub steps: usize,
    /// Simulated clients (the issue: 50,000).
    pub clients: u32,
}

/// A step is held when it lost less than this share of full DORA exchanges.
pub const LOSS_LIMIT: f64 = 0.01;

/// What one step measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Offered DORA/s.
    pub offered: u32,
    /// Seconds it ran.
    pub seconds: u32,
    /// A short probe rather than a full step.
    pub probe: bool,
    /// DISCOVERs sent.
    pub discovers: u64,
    /// ACKs received.
    pub acks: u64,
    /// Completed DORA exchanges per second (ACKs / seconds: perfdhcp's own rate includes its
    /// drain time).
    pub dora_per_second: f64,
    /// Share of DISCOVERs without an ACK.
    pub loss: f64,
    /// DISCOVER → OFFER mean and 99th percentile, ms.
    pub offer_ms: (f64, f64),
    /// REQUEST → ACK mean and 99th percentile, ms.
    pub ack_ms: (f64, f64),
}

impl Step {
    /// Whether the step held (< 1% lost).
    pub fn held(&self) -> bool {
        self.discovers > 0 && self.loss < LOSS_LIMIT
    }
}

/// What the next step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Offer this rate, briefly.
    Probe(u32),
    /// Offer this rate for a full step.
    Step(u32),
    /// The search is over.
    Done,
}

fn round_rate(rate: u32) -> u32 {
    if rate >= 1000 {
        rate / 50 * 50
    } else {
        (rate / 5 * 5).max(5)
    }
}

/// The next step after `history`.
pub fn next_step(history: &[Step], plan: &Plan) -> Next {
    let probes: Vec<&Step> = history.iter().filter(|s| s.probe).collect();
    let full: Vec<&Step> = history.iter().filter(|s| !s.probe).collect();
    match probes.last() {
        None => return Next::Probe(plan.start.min(plan.max)),
        Some(last) if full.is_empty() && last.held() && last.offered < plan.max => {
            return Next::Probe(last.offered.saturating_mul(2).min(plan.max));
        }
        Some(_) => {}
    }
    if full.len() >= plan.steps {
        return Next::Done;
    }
    // The lowest rate that did not hold, probes included (a probe that held says little
    // about 30 s; one that did not hold says enough).
    let lowest_failed = history
        .iter()
        .filter(|s| !s.held())
        .map(|s| s.offered)
        .min();
    let highest_held = full
        .iter()
        .filter(|s| s.held())
        .map(|s| s.offered)
        .filter(|&r| lowest_failed.is_none_or(|f| r < f))
        .max();
    let candidate = match (highest_held, lowest_failed) {
        // No full step yet: the highest probe that held.
        (None, failed) if full.is_empty() => probes
            .iter()
            .filter(|s| s.held() && failed.is_none_or(|f| s.offered < f))
            .map(|s| s.offered)
            .max()
            .unwrap_or_else(|| round_rate(plan.start / 2)),
        // Full steps, none held: halve the lowest failure.
        (None, failed) => round_rate(failed.unwrap_or(plan.start) / 2),
        // Never failed: nothing above to look for.
        (Some(_), None) => return Next::Done,
        (Some(good), Some(bad)) => {
            if f64::from(bad - good) <= 0.1 * f64::from(good) {
                return Next::Done;
            }
            round_rate(good + (bad - good) / 2)
        }
    };
    if full.iter().any(|s| s.offered == candidate) || candidate == 0 {
        return Next::Done;
    }
    Next::Step(candidate)
}

/// The knee: the full step with the highest offered rate that held.
pub fn knee(history: &[Step]) -> Option<&Step> {
    history
        .iter()
        .filter(|s| !s.probe && s.held())
        .max_by_key(|s| s.offered)
}

/// perfdhcp's counters for one exchange kind, and the delays of its completed exchanges.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exchange {
    /// Requests sent.
    pub sent: u64,
    /// Replies received.
    pub received: u64,
    /// Mean delay (perfdhcp's own), ms.
    pub mean_ms: f64,
    /// Every completed exchange's delay, ms (from `-x t`).
    pub delays_ms: Vec<f64>,
}

/// perfdhcp's DISCOVER–OFFER and REQUEST–ACK statistics (with `-6`: SOLICIT–ADVERTISE and
/// REQUEST–REPLY, the same two halves of an exchange).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerfdhcpOutput {
    /// DISCOVER → OFFER (v6: SOLICIT → ADVERTISE).
    pub offer: Exchange,
    /// REQUEST → ACK (v6: REQUEST → REPLY).
    pub ack: Exchange,
    /// Acknowledged leases (`-x l`): client identifier (hex) and address.
    pub acked_leases: Vec<(String, String)>,
}

/// Parses perfdhcp's report, `-4` or `-6` (with `-x t` and/or `-x l`).
pub fn parse_perfdhcp(text: &str) -> PerfdhcpOutput {
    #[derive(Clone, Copy, PartialEq)]
    enum Section {
        None,
        OfferStats,
        AckStats,
        OfferTimes,
        AckTimes,
        OfferLeases,
        AckLeases,
    }
    let mut out = PerfdhcpOutput::default();
    let mut section = Section::None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("***") {
            section = match line {
                l if l.contains("Statistics for: DISCOVER-OFFER")
                    || l.contains("Statistics for: SOLICIT-ADVERTISE") =>
                {
                    Section::OfferStats
                }
                l if l.contains("Statistics for: REQUEST-ACK")
                    || l.contains("Statistics for: REQUEST-REPLY") =>
                {
                    Section::AckStats
                }
                l if l.contains("Timestamps for packets: DISCOVER-OFFER")
                    || l.contains("Timestamps for packets: SOLICIT-ADVERTISE") =>
                {
                    Section::OfferTimes
                }
                l if l.contains("Timestamps for packets: REQUEST-ACK")
                    || l.contains("Timestamps for packets: REQUEST-REPLY") =>
                {
                    Section::AckTimes
                }
                l if l.contains("Leases for DISCOVER-OFFER") => Section::OfferLeases,
                l if l.contains("Leases for REQUEST-ACK") => Section::AckLeases,
                _ => Section::None,
            };
            continue;
        }
        let exchange = match section {
            Section::OfferStats | Section::OfferTimes => &mut out.offer,
            Section::AckStats | Section::AckTimes => &mut out.ack,
            Section::AckLeases => {
                let mut parts = line.split(',');
                if let (Some(id), Some(ip)) = (parts.next(), parts.next())
                    && !id.is_empty()
                    && ip.contains('.')
                {
                    out.acked_leases.push((id.to_owned(), ip.to_owned()));
                }
                continue;
            }
            Section::OfferLeases | Section::None => continue,
        };
        let value = |prefix: &str| -> Option<f64> {
            line.strip_prefix(prefix)?
                .trim()
                .trim_end_matches("ms")
                .trim()
                .parse()
                .ok()
        };
        if let Some(v) = value("sent packets:") {
            exchange.sent = v as u64;
        } else if let Some(v) = value("received packets:") {
            exchange.received = v as u64;
        } else if let Some(v) = value("avg delay:") {
            exchange.mean_ms = v;
        } else if let Some(rest) = line.strip_prefix("sent / received:")
            && let Some((sent, received)) = rest.split_once('/')
            && let (Ok(sent), Ok(received)) =
                (sent.trim().parse::<f64>(), received.trim().parse::<f64>())
        {
            exchange.delays_ms.push((received - sent) * 1000.0);
        }
    }
    out
}

/// The `p`-th percentile (0–100) of some values (nearest rank); NaN for none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A step's figures from perfdhcp's output.
pub fn step_of(offered: u32, seconds: u32, probe: bool, out: &PerfdhcpOutput) -> Step {
    let discovers = out.offer.sent;
    let acks = out.ack.received;
    let loss = if discovers == 0 {
        1.0
    } else {
        1.0 - (acks.min(discovers) as f64 / discovers as f64)
    };
    Step {
        offered,
        seconds,
        probe,
        discovers,
        acks,
        dora_per_second: acks as f64 / f64::from(seconds.max(1)),
        loss,
        offer_ms: (out.offer.mean_ms, percentile(&out.offer.delays_ms, 99.0)),
        ack_ms: (out.ack.mean_ms, percentile(&out.ack.delays_ms, 99.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: Plan = Plan {
        start: 250,
        max: 64_000,
        probe_seconds: 3,
        step_seconds: 30,
        steps: 4,
        clients: 50_000,
    };

    fn step(offered: u32, probe: bool, held: bool) -> Step {
        Step {
            offered,
            seconds: if probe { 3 } else { 30 },
            probe,
            discovers: 1000,
            acks: if held { 1000 } else { 900 },
            dora_per_second: 0.0,
            loss: if held { 0.0 } else { 0.1 },
            offer_ms: (0.0, 0.0),
            ack_ms: (0.0, 0.0),
        }
    }

    /// Runs the search against a server that holds every rate up to `capacity`.
    fn search(capacity: u32, plan: &Plan) -> Vec<Step> {
        let mut history = Vec::new();
        for _ in 0..40 {
            match next_step(&history, plan) {
                Next::Probe(r) => history.push(step(r, true, r <= capacity)),
                Next::Step(r) => history.push(step(r, false, r <= capacity)),
                Next::Done => return history,
            }
        }
        panic!("the search did not end: {history:?}");
    }

    #[test]
    fn probes_double_until_one_fails_then_full_steps_bisect() {
        let history = search(6000, &PLAN);
        let probes: Vec<u32> = history
            .iter()
            .filter(|s| s.probe)
            .map(|s| s.offered)
            .collect();
        assert_eq!(probes, vec![250, 500, 1000, 2000, 4000, 8000]);
        let full: Vec<u32> = history
            .iter()
            .filter(|s| !s.probe)
            .map(|s| s.offered)
            .collect();
        assert_eq!(full, vec![4000, 6000, 7000, 6500]);
        assert_eq!(knee(&history).map(|s| s.offered), Some(6000));
    }

    #[test]
    fn a_slow_server_is_measured_below_the_first_probe() {
        let history = search(150, &PLAN);
        let found = knee(&history).map(|s| s.offered);
        assert!(
            found.is_some_and(|k| (125..=150).contains(&k)),
            "{history:?}"
        );
        assert!(history.iter().filter(|s| !s.probe).count() <= PLAN.steps);
    }

    #[test]
    fn a_probe_that_held_but_a_full_step_that_did_not_halves() {
        // Holds 3 s at 4000 but not 30 s: the full step at 4000 fails, the next is 2000.
        let mut history = vec![
            step(250, true, true),
            step(500, true, true),
            step(1000, true, true),
            step(2000, true, true),
            step(4000, true, true),
            step(8000, true, false),
            step(4000, false, false),
        ];
        assert_eq!(next_step(&history, &PLAN), Next::Step(2000));
        history.push(step(2000, false, true));
        assert_eq!(next_step(&history, &PLAN), Next::Step(3000));
    }

    #[test]
    fn a_server_faster_than_the_maximum_stops_there() {
        let plan = Plan { max: 1000, ..PLAN };
        let history = search(1_000_000, &plan);
        assert_eq!(knee(&history).map(|s| s.offered), Some(1000));
    }

    #[test]
    fn the_search_ends_when_the_bracket_is_narrow() {
        let history = vec![
            step(8000, true, false),
            step(6000, false, true),
            step(6500, false, false),
        ];
        assert_eq!(next_step(&history, &PLAN), Next::Done);
    }

    const OUTPUT: &str = "Running: perfdhcp -4 -r 200 -R 50000 -p 1 -x t -l 10.97.0.2 10.97.0.1
***Rate statistics***
Rate: 198.855 4-way exchanges/second, expected rate: 200
***Statistics for: DISCOVER-OFFER***
sent packets: 199
received packets: 199
drops: 0
avg delay: 1.043 ms
***Statistics for: REQUEST-ACK***
sent packets: 199
received packets: 197
avg delay: 0.324 ms
***Timestamps for packets: DISCOVER-OFFER***
sent / received: 000000.000061 / 000000.000491
sent / received: 000000.010140 / 000000.013977
***Timestamps for packets: REQUEST-ACK***
sent / received: 000000.000600 / 000000.000900
***Leases for REQUEST-ACK***
client_id,adrress,prefix
01000c01020304,10.97.1.0,
01000c01020305,10.97.1.1,
";

    #[test]
    fn perfdhcp_output_is_read_with_delays_and_leases() {
        let out = parse_perfdhcp(OUTPUT);
        assert_eq!((out.offer.sent, out.offer.received), (199, 199));
        assert_eq!((out.ack.sent, out.ack.received), (199, 197));
        assert!((out.offer.mean_ms - 1.043).abs() < 1e-9);
        assert_eq!(out.offer.delays_ms.len(), 2);
        assert!((out.offer.delays_ms[1] - 3.837).abs() < 1e-6);
        assert!((out.ack.delays_ms[0] - 0.3).abs() < 1e-6);
        assert_eq!(
            out.acked_leases,
            vec![
                ("01000c01020304".to_owned(), "10.97.1.0".to_owned()),
                ("01000c01020305".to_owned(), "10.97.1.1".to_owned()),
            ]
        );
        let s = step_of(200, 1, false, &out);
        assert_eq!((s.discovers, s.acks), (199, 197));
        assert!((s.loss - 2.0 / 199.0).abs() < 1e-9);
        assert!(!s.held());
        assert!((s.dora_per_second - 197.0).abs() < 1e-9);
        assert!((s.offer_ms.1 - 3.837).abs() < 1e-6);
    }

    /// perfdhcp -6's report (abridged: the same lines, other section names).
    const OUTPUT6: &str = "Running: perfdhcp -6 -r 1000 -R 50000 -p 5 -x t -l eth0
Scenario: basic.
Multi-thread mode enabled.
***Rate statistics***
Rate: 999.678 4-way exchanges/second, expected rate: 1000

***Malformed Packets***
Malformed packets: 0
***Statistics for: SOLICIT-ADVERTISE***
sent packets: 4999
received packets: 4998
drops: 1
drops ratio: 0.02 %
orphans: 0
rejected leases: 0
non unique addresses: 0

min delay: 0.052 ms
avg delay: 0.472 ms
max delay: 9.870 ms
std deviation: 1.033 ms
collected packets: 0

***Statistics for: REQUEST-REPLY***
sent packets: 4998
received packets: 4990
drops: 8
drops ratio: 0.160 %
orphans: 0
rejected leases: 0
non unique addresses: 0

min delay: 0.048 ms
avg delay: 0.326 ms
max delay: 10.690 ms
std deviation: 0.688 ms
collected packets: 0

***Timestamps for packets: SOLICIT-ADVERTISE***
sent / received: 000000.000061 / 000000.002975
***Timestamps for packets: REQUEST-REPLY***
sent / received: 000000.006913 / 000000.007462
sent / received: 000000.007510 / 000000.007792
";

    #[test]
    fn perfdhcp6_output_is_read_as_the_same_two_halves() {
        let out = parse_perfdhcp(OUTPUT6);
        assert_eq!((out.offer.sent, out.offer.received), (4999, 4998));
        assert_eq!((out.ack.sent, out.ack.received), (4998, 4990));
        assert!((out.offer.mean_ms - 0.472).abs() < 1e-9);
        assert!((out.ack.mean_ms - 0.326).abs() < 1e-9);
        assert_eq!(out.offer.delays_ms.len(), 1);
        assert!((out.offer.delays_ms[0] - 2.914).abs() < 1e-6);
        assert_eq!(out.ack.delays_ms.len(), 2);
        assert!((out.ack.delays_ms[1] - 0.282).abs() < 1e-6);
        // Loss counts whole exchanges: Solicits sent against Replies received.
        let s = step_of(1000, 5, false, &out);
        assert_eq!((s.discovers, s.acks), (4999, 4990));
        assert!((s.loss - 9.0 / 4999.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 99.0).is_nan());
    }
}
