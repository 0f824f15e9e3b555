#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Property: never two leaders at once. Several replicas run the elector's loop (as
//! `Elector::acquire`, `Elector::lead` and `lead_repeatedly` do) against a simulated API
//! server that keeps one Lease with a `resourceVersion` and honours write preconditions, with
//! every decision made by the real [`Candidate`]. The network delivers each request late,
//! never (a stalled connection), or without its answer; processes crash and restart; each
//! replica's monotonic clock runs at its own rate, within ±10 % of real time, from its own
//! origin. At every instant at most one replica may believe it leads, and no write that names
//! a holder may land while another replica believes it leads.
//!
//! With clocks within ±2 % of each other (NTP keeps them within 0.05 %), a second property:
//! what a replica sends outside the API server (a BMC command) ends by its
//! [`Candidate::acts_end_by`], and no write naming another holder lands before that instant
//! of every term that replica has had.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256, a fixed seed); the tests
//! `clocks_beyond_the_assumption_give_two_leaders` and
//! `acts_need_clocks_closer_than_leadership_does` show both checks can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, RngSeed, TestRng, TestRunner};
use unbounded_runtime::leader::{Candidate, Decision, Read, Record, Tick, Timing};

/// Simulated time moves in steps of this many milliseconds.
const STEP_MS: u64 = 10;
/// How long each case runs, in simulated milliseconds.
const HORIZON_MS: u64 = 120_000;

/// What happens to one request. Delays are in thousandths of the request timeout, so that
/// every timing sees answers that come just in time and just too late.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// It reaches the server after `to` and its answer comes back `back` later.
    Delivered { to: u32, back: u32 },
    /// It never reaches the server: the connection stalled.
    Stalled,
    /// It reaches the server after `to`; the answer never comes back.
    AnswerLost { to: u32 },
    /// The process dies instead of sending it, and starts again after `after` ms.
    Crash { after: u32 },
}

#[derive(Debug, Clone)]
struct Stored {
    version: u64,
    holder: Option<String>,
    duration: Duration,
}

#[derive(Debug, Clone)]
enum Request {
    Get,
    Create {
        holder: String,
        duration: Duration,
    },
    Update {
        precondition: u64,
        holder: String,
        duration: Duration,
    },
}

#[derive(Debug, Clone)]
enum Answer {
    Got(Option<Stored>),
    Written(u64),
    Conflict,
}

/// What the replica's loop is doing.
#[derive(Debug, Clone, Copy)]
enum Shell {
    /// Waiting until this local instant for its next attempt.
    Sleeping { until: Tick },
    /// Waiting for the answer to its read (sent at `sent`) of the attempt started at `started`.
    Reading {
        attempt: u64,
        started: Tick,
        sent: Tick,
    },
    /// Waiting for the answer to its write.
    Writing {
        attempt: u64,
        started: Tick,
        sent: Tick,
    },
}

#[derive(Debug)]
enum Process {
    Dead { restarts_at: u64 },
    Alive { candidate: Candidate, shell: Shell },
}

#[derive(Debug)]
struct Replica {
    identity: String,
    /// Local milliseconds per 1,000 real ones.
    rate_permille: u64,
    offset_ms: u64,
    fates: Vec<Fate>,
    next_fate: usize,
    attempts: u64,
    process: Process,
    /// The latest real instant (ms) by which a command this replica sent may be answered.
    acts_end_by: u64,
}

impl Replica {
    fn local(&self, real_ms: u64) -> Tick {
        Duration::from_millis(self.offset_ms + real_ms * self.rate_permille / 1000)
    }

    fn fate(&mut self) -> Fate {
        let fate = self
            .fates
            .get(self.next_fate)
            .copied()
            .unwrap_or(Fate::Delivered { to: 2, back: 2 });
        self.next_fate += 1;
        fate
    }

    /// The real instant (ms, rounded up) at which this replica's clock reads `local`.
    fn real(&self, local: Tick) -> u64 {
        let local_ms = u64::try_from(local.as_millis()).unwrap();
        (local_ms.saturating_sub(self.offset_ms) * 1000).div_ceil(self.rate_permille)
    }

    fn leading(&self, real_ms: u64) -> bool {
        match &self.process {
            Process::Alive { candidate, .. } => candidate.leading(self.local(real_ms)),
            Process::Dead { .. } => false,
        }
    }
}

/// A scenario: the timing, and per replica its clock and the fates of its requests.
#[derive(Debug, Clone)]
struct Scenario {
    timing: Timing,
    replicas: Vec<(u64, u64, Vec<Fate>)>,
    /// Check the acts property too (only meaningful for clocks within a few percent).
    check_acts: bool,
}

#[derive(Debug, Default)]
struct Outcome {
    /// Writes that named a new holder.
    takeovers: u32,
}

/// Runs a scenario; `Err` describes the first moment two replicas led at once.
fn simulate(scenario: &Scenario) -> Result<Outcome, String> {
    let timing = scenario.timing;
    let timeout = timing.request_timeout();
    let retry = timing.retry_period();
    let mut replicas: Vec<Replica> = scenario
        .replicas
        .iter()
        .enumerate()
        .map(|(i, (rate, offset, fates))| Replica {
            identity: format!("replica-{i}"),
            rate_permille: *rate,
            offset_ms: *offset,
            fates: fates.clone(),
            next_fate: 0,
            attempts: 0,
            acts_end_by: 0,
            process: Process::Alive {
                candidate: Candidate::new(format!("replica-{i}"), timing),
                shell: Shell::Sleeping {
                    until: Duration::ZERO,
                },
            },
        })
        .collect();
    let mut lease: Option<Stored> = None;
    let mut next_version = 1;
    let mut network = Network {
        timeout,
        ..Network::default()
    };
    let mut outcome = Outcome::default();
    let mut holder_before: Option<String> = None;

    let mut t = 0;
    while t <= HORIZON_MS {
        // The server, in arrival order.
        let due: Vec<_> = network
            .to_server
            .range(..(t + 1, 0))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            let Some(InFlight {
                from,
                attempt,
                request,
                back,
            }) = network.to_server.remove(&key)
            else {
                continue;
            };
            let answer = match request {
                Request::Get => Answer::Got(lease.clone()),
                Request::Create { holder, duration } => {
                    if lease.is_none() {
                        lease = Some(Stored {
                            version: next_version,
                            holder: Some(holder),
                            duration,
                        });
                        next_version += 1;
                        Answer::Written(next_version - 1)
                    } else {
                        Answer::Conflict
                    }
                }
                Request::Update {
                    precondition,
                    holder,
                    duration,
                } => {
                    if lease.as_ref().map(|l| l.version) == Some(precondition) {
                        lease = Some(Stored {
                            version: next_version,
                            holder: Some(holder),
                            duration,
                        });
                        next_version += 1;
                        Answer::Written(next_version - 1)
                    } else {
                        Answer::Conflict
                    }
                }
            };
            if let Answer::Written(_) = answer {
                let holder = lease.as_ref().and_then(|l| l.holder.clone());
                // The write lands now: nobody else may believe they lead.
                for r in &replicas {
                    if Some(&r.identity) != holder.as_ref() && r.leading(t) {
                        return Err(format!(
                            "at {t} ms a write naming {holder:?} landed while {} led",
                            r.identity
                        ));
                    }
                    if scenario.check_acts
                        && Some(&r.identity) != holder.as_ref()
                        && r.acts_end_by > t
                    {
                        return Err(format!(
                            "at {t} ms a write naming {holder:?} landed while {}'s acts may run until {} ms",
                            r.identity, r.acts_end_by
                        ));
                    }
                }
                if holder != holder_before {
                    outcome.takeovers += 1;
                    holder_before = holder;
                }
            }
            if let Some(back) = back {
                network.sequence += 1;
                network
                    .answers
                    .insert((t + back, network.sequence), (from, attempt, answer));
            }
        }

        for (index, replica) in replicas.iter_mut().enumerate() {
            let now = replica.local(t);
            // A dead process comes back with nothing but its identity.
            if let Process::Dead { restarts_at } = replica.process {
                if t >= restarts_at {
                    let identity = replica.identity.clone();
                    replica.process = Process::Alive {
                        candidate: Candidate::new(identity, timing),
                        shell: Shell::Sleeping { until: now },
                    };
                } else {
                    continue;
                }
            }
            let Process::Alive { candidate, shell } = &mut replica.process else {
                continue;
            };
            // The step-down timer comes first (`lead` races it, biased, against the rest):
            // the attempt in flight is dropped and the loop campaigns again at once.
            if candidate.step_down_at().is_some_and(|at| now >= at) {
                candidate.step_down();
                *shell = Shell::Sleeping { until: now };
            }
            // Answers that arrived by now, for the attempt still waiting.
            let arrived: Vec<_> = network
                .answers
                .range(..(t + 1, 0))
                .filter(|(_, (to, _, _))| *to == index)
                .map(|(k, _)| *k)
                .collect();
            for key in arrived {
                let Some((_, attempt_id, answer)) = network.answers.remove(&key) else {
                    continue;
                };
                match (*shell, answer) {
                    (
                        Shell::Reading {
                            attempt,
                            started,
                            sent,
                        },
                        Answer::Got(stored),
                    ) if attempt == attempt_id && now < sent + timeout => {
                        let version = stored.as_ref().map(|s| s.version.to_string());
                        let read = match (&stored, &version) {
                            (Some(s), Some(v)) => Read::Present(Record {
                                version: v,
                                holder: s.holder.as_deref(),
                                lease_duration: Some(s.duration),
                            }),
                            _ => Read::Absent,
                        };
                        let request = match candidate.observe(read, now) {
                            Decision::Follow { .. } => None,
                            Decision::Lost { .. } => {
                                candidate.step_down();
                                None
                            }
                            Decision::Create => Some(Request::Create {
                                holder: replica.identity.clone(),
                                duration: timing.lease_duration(),
                            }),
                            Decision::Claim(_) => match &stored {
                                Some(s) => Some(Request::Update {
                                    precondition: s.version,
                                    holder: replica.identity.clone(),
                                    duration: timing.lease_duration(),
                                }),
                                None => Some(Request::Create {
                                    holder: replica.identity.clone(),
                                    duration: timing.lease_duration(),
                                }),
                            },
                        };
                        *shell = match request {
                            None => Shell::Sleeping { until: now + retry },
                            Some(request) => {
                                let fate = {
                                    let f = replica
                                        .fates
                                        .get(replica.next_fate)
                                        .copied()
                                        .unwrap_or(Fate::Delivered { to: 2, back: 2 });
                                    replica.next_fate += 1;
                                    f
                                };
                                match network.send(fate, t, index, attempt, request) {
                                    Some(restarts_at) => {
                                        replica.process = Process::Dead { restarts_at };
                                        break;
                                    }
                                    None => Shell::Writing {
                                        attempt,
                                        started,
                                        sent: now,
                                    },
                                }
                            }
                        };
                    }
                    (
                        Shell::Writing {
                            attempt,
                            started,
                            sent,
                        },
                        Answer::Written(version),
                    ) if attempt == attempt_id && now < sent + timeout => {
                        candidate.claimed(started, &version.to_string(), now);
                        *shell = Shell::Sleeping { until: now + retry };
                    }
                    (Shell::Writing { attempt, sent, .. }, Answer::Conflict)
                        if attempt == attempt_id && now < sent + timeout =>
                    {
                        *shell = Shell::Sleeping { until: now + retry };
                    }
                    // An answer to an attempt given up on: dropped, as the real shell does.
                    _ => {}
                }
            }
            let Process::Alive { shell, .. } = &mut replica.process else {
                continue;
            };
            match *shell {
                // Each request is bounded by the request timeout.
                Shell::Reading { sent, .. } | Shell::Writing { sent, .. }
                    if now >= sent + timeout =>
                {
                    *shell = Shell::Sleeping { until: now + retry };
                }
                Shell::Sleeping { until } if now >= until => {
                    replica.attempts += 1;
                    let attempt = replica.attempts;
                    let fate = replica.fate();
                    match network.send(fate, t, index, attempt, Request::Get) {
                        Some(restarts_at) => replica.process = Process::Dead { restarts_at },
                        None => {
                            if let Process::Alive { shell, .. } = &mut replica.process {
                                *shell = Shell::Reading {
                                    attempt,
                                    started: now,
                                    sent: now,
                                };
                            }
                        }
                    }
                }
                _ => {}
            }
        }

        for replica in &mut replicas {
            if let Process::Alive { candidate, .. } = &replica.process
                && let Some(end) = candidate.acts_end_by()
            {
                replica.acts_end_by = replica.acts_end_by.max(replica.real(end));
            }
        }
        let leaders: Vec<&str> = replicas
            .iter()
            .filter(|r| r.leading(t))
            .map(|r| r.identity.as_str())
            .collect();
        if leaders.len() > 1 {
            return Err(format!("at {t} ms {leaders:?} all led"));
        }
        t += STEP_MS;
    }
    Ok(outcome)
}

/// A request on its way to the server.
#[derive(Debug)]
struct InFlight {
    from: usize,
    attempt: u64,
    request: Request,
    /// When its answer arrives after it was served (ms), if ever.
    back: Option<u64>,
}

/// What is in flight, keyed by (real ms, sequence): to the server, and back to a replica.
#[derive(Debug, Default)]
struct Network {
    to_server: BTreeMap<(u64, u64), InFlight>,
    answers: BTreeMap<(u64, u64), (usize, u64, Answer)>,
    sequence: u64,
    timeout: Duration,
}

impl Network {
    /// Puts a request on the wire according to its fate; `Some(restart time)` if the process
    /// died instead.
    fn send(
        &mut self,
        fate: Fate,
        t: u64,
        from: usize,
        attempt: u64,
        request: Request,
    ) -> Option<u64> {
        self.sequence += 1;
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap();
        let scaled = |permille: u32| timeout_ms * u64::from(permille) / 1000;
        let (to, back) = match fate {
            Fate::Delivered { to, back } => (to, Some(scaled(back))),
            Fate::AnswerLost { to } => (to, None),
            Fate::Stalled => return None,
            Fate::Crash { after } => return Some(t + u64::from(after)),
        };
        let request = InFlight {
            from,
            attempt,
            request,
            back,
        };
        self.to_server
            .insert((t + scaled(to), self.sequence), request);
        None
    }
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        10 => (0u32..80, 0u32..80).prop_map(|(to, back)| Fate::Delivered { to, back }),
        4 => (0u32..1_200, 0u32..1_200).prop_map(|(to, back)| Fate::Delivered { to, back }),
        3 => Just(Fate::Stalled),
        2 => (0u32..1_200).prop_map(|to| Fate::AnswerLost { to }),
        1 => (0u32..20_000).prop_map(|after| Fate::Crash { after }),
    ]
}

/// Fates in runs, so that stalls and slow spells last.
fn fates() -> impl Strategy<Value = Vec<Fate>> {
    prop::collection::vec((fate(), 1usize..15), 0..60).prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(fate, n)| std::iter::repeat_n(fate, n))
            .collect()
    })
}

fn timing() -> impl Strategy<Value = Timing> {
    let ms = Duration::from_millis;
    // The tight ones (renew deadline close to the lease duration) most often: there the
    // margin for late answers and skewed clocks is thinnest.
    prop_oneof![
        1 => Just(Timing::DEFAULT),
        1 => Just(Timing::new(ms(8_000), ms(5_000), ms(1_000)).unwrap()),
        2 => Just(Timing::new(ms(4_000), ms(3_000), ms(500)).unwrap()),
        2 => Just(Timing::new(ms(5_000), ms(4_000), ms(1_000)).unwrap()),
    ]
}

/// Clock rates within ±10 % of real time: the assumption the documentation states holds
/// for ±20 % at 10 s / 15 s; this stays inside it for every timing above.
fn scenario() -> impl Strategy<Value = Scenario> {
    (
        timing(),
        prop::collection::vec((rate(), 0u64..1_000_000, fates()), 2..=4),
    )
        .prop_map(|(timing, replicas)| Scenario {
            timing,
            replicas,
            check_acts: false,
        })
}

/// The same, with clocks within ±2 % of real time, checking acts too.
fn close_clocks_scenario() -> impl Strategy<Value = Scenario> {
    let rate = prop_oneof![Just(980u64), Just(1020), 980u64..=1020];
    (
        timing(),
        prop::collection::vec((rate, 0u64..1_000_000, fates()), 2..=4),
    )
        .prop_map(|(timing, replicas)| Scenario {
            timing,
            replicas,
            check_acts: true,
        })
}

/// Local milliseconds per 1,000 real ones, often at the bounds.
fn rate() -> impl Strategy<Value = u64> {
    prop_oneof![Just(900u64), Just(1100), 900u64..=1100]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

#[test]
fn never_two_leaders_at_once() {
    run(scenario());
}

#[test]
fn acts_end_before_anyone_else_leads() {
    run(close_clocks_scenario());
}

fn run(scenarios: impl Strategy<Value = Scenario>) {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x5eed_1ead),
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config.clone(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x1e; 32]),
    );
    let takeovers = std::cell::Cell::new(0);
    runner
        .run(&scenarios, |scenario| {
            let outcome = simulate(&scenario).map_err(TestCaseError::fail)?;
            takeovers.set(takeovers.get() + outcome.takeovers);
            Ok(())
        })
        .unwrap();
    let takeovers = takeovers.get();
    // The cases did exercise leadership changing hands, not only one long reign.
    assert!(
        takeovers > config.cases,
        "only {takeovers} takeovers in {} cases",
        config.cases
    );
}

fn quick(n: usize) -> Vec<Fate> {
    vec![Fate::Delivered { to: 2, back: 2 }; n]
}

#[test]
fn a_stalled_leader_is_replaced_and_never_overlaps() {
    // replica-0 takes the lease (a read and a create), renews a few times, then every
    // request stalls; replica-1 takes over.
    let mut stalled = quick(8);
    stalled.extend(vec![Fate::Stalled; 500]);
    let scenario = Scenario {
        timing: Timing::DEFAULT,
        replicas: vec![(1000, 0, stalled), (1000, 7_000, quick(1_000))],
        check_acts: true,
    };
    let outcome = simulate(&scenario).unwrap();
    assert!(outcome.takeovers >= 2, "{outcome:?}");
}

#[test]
fn clocks_beyond_the_assumption_give_two_leaders() {
    // The same stall, but the leader's clock runs 30 % slow and the follower's 30 % fast:
    // 10 s of the leader's are 14.3 s, 15 s of the follower's are 11.5 s. The model must
    // see the overlap, or its check is blind.
    let mut stalled = quick(8);
    stalled.extend(vec![Fate::Stalled; 500]);
    let scenario = Scenario {
        timing: Timing::DEFAULT,
        replicas: vec![(700, 0, stalled), (1300, 7_000, quick(1_000))],
        check_acts: false,
    };
    let error = simulate(&scenario).unwrap_err();
    assert!(error.contains("led"), "{error}");
}

#[test]
fn acts_need_clocks_closer_than_leadership_does() {
    // The leader's clock 18 % slow, the follower's 18 % fast: the leader stops (at 10 s of
    // its clock, 12.2 s after its last renewal started) before the follower takes over (15 s
    // of its clock after it first saw that renewal: 12.7 s and up), so there is one leader
    // at a time, but a command granted until 12.5 s of the leader's clock (15.2 s) could
    // still be answered after the takeover. The check must see it.
    let mut stalled = quick(8);
    stalled.extend(vec![Fate::Stalled; 500]);
    let replicas = vec![(820, 0, stalled), (1180, 7_000, quick(1_000))];
    let leadership_only = Scenario {
        timing: Timing::DEFAULT,
        replicas: replicas.clone(),
        check_acts: false,
    };
    simulate(&leadership_only).unwrap();
    let error = simulate(&Scenario {
        timing: Timing::DEFAULT,
        replicas,
        check_acts: true,
    })
    .unwrap_err();
    assert!(error.contains("acts may run"), "{error}");
}
