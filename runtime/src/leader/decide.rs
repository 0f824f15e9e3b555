//! The decisions of leader election, over plain data: what a replica makes of a read of the
//! Lease, and whether it still leads at a given instant. No I/O and no wall clock: instants
//! are readings of this process's monotonic clock ([`Tick`]), and the only thing taken from
//! the Lease to judge time is *that its record changed* (its `resourceVersion`), never the
//! holder's `renewTime`. See the module documentation of [`crate::leader`] for why this is
//! safe.

use std::time::Duration;

/// A reading of this process's monotonic clock: the time since an origin the caller chose.
/// Readings of two processes are never compared with each other.
pub type Tick = Duration;

/// How long a lease lasts, how long a leader keeps trying to renew it, and how often
/// replicas try. Valid by construction: `retry_period < renew_deadline < lease_duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

/// Timings that would break the guarantee, or that the Lease cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The Lease records its duration in whole seconds.
    #[error(
        "the lease duration must be a whole number of seconds from 1 to {max} (the Lease records seconds), not {duration:?}",
        max = i32::MAX
    )]
    LeaseDuration {
        /// The duration given.
        duration: Duration,
    },
    /// A leader must stop before its lease can expire for the others.
    #[error(
        "the renew deadline ({deadline:?}) must be shorter than the lease duration ({duration:?}): a leader stops at the deadline, and the others may take the lease only after the duration"
    )]
    DeadlineNotShorter {
        /// The renew deadline.
        deadline: Duration,
        /// The lease duration.
        duration: Duration,
    },
    /// A leader must get more than one try before its deadline.
    #[error(
        "the retry period ({retry:?}) must be longer than zero and shorter than the renew deadline ({deadline:?})"
    )]
    RetryPeriod {
        /// The retry period.
        retry: Duration,
        /// The renew deadline.
        deadline: Duration,
    },
}

impl Timing {
    /// client-go's defaults: a 15 s lease, renewed within 10 s, tried every 2 s.
    pub const DEFAULT: Timing = Timing {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// Checks `retry_period < renew_deadline < lease_duration` and that the lease duration is
    /// a whole number of seconds.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingError> {
        if lease_duration.subsec_nanos() != 0
            || lease_duration.is_zero()
            || lease_duration.as_secs() > i32::MAX as u64
        {
            return Err(TimingError::LeaseDuration {
                duration: lease_duration,
            });
        }
        if renew_deadline >= lease_duration {
            return Err(TimingError::DeadlineNotShorter {
                deadline: renew_deadline,
                duration: lease_duration,
            });
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(TimingError::RetryPeriod {
                retry: retry_period,
                deadline: renew_deadline,
            });
        }
        Ok(Self {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }

    /// How long the others wait, after they last saw the record change, before they take it.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// How long after the start of its last successful renewal a leader stops acting.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// How long a replica waits between two attempts.
    pub fn retry_period(&self) -> Duration {
        self.retry_period
    }

    /// How long one request to the API server may take: a quarter of the renew deadline, so
    /// that a leader whose requests hang still makes several attempts before it stops.
    pub fn request_timeout(&self) -> Duration {
        self.renew_deadline / 4
    }

    /// The lease duration as the Lease records it.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a read of the Lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read<'a> {
    /// There is no Lease.
    Absent,
    /// The Lease's record.
    Present(Record<'a>),
}

/// The parts of a Lease that leader election decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The object's `resourceVersion`: it changes with every write, so a new value means the
    /// record changed (a renewal, a takeover, a release).
    pub version: &'a str,
    /// `holderIdentity`; `None` or empty when the lease is free.
    pub holder: Option<&'a str>,
    /// `leaseDurationSeconds`: how long the holder promised to stay away from acting after its
    /// last renewal could have been seen.
    pub lease_duration: Option<Duration>,
}

/// What to do after a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, holding it.
    Create,
    /// Write this replica as the holder over the record just read, with its version as the
    /// precondition (a concurrent write makes this a conflict, and nobody wins twice).
    Claim(Claim),
    /// Another replica holds the lease and this one has not yet seen it unchanged for the
    /// lease duration: try again later.
    Follow {
        /// The holder.
        holder: String,
        /// How long, by this replica's clock, until the lease is ours to take if the record
        /// stays as it is.
        expires_in: Duration,
    },
    /// This replica was leading, but the Lease no longer names it: stop acting now.
    Lost {
        /// Who holds it now, if anyone.
        holder: Option<String>,
    },
}

/// How a claim changes the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The record already names this replica: renew it (same `acquireTime`, no transition).
    Renew,
    /// The record names nobody, or another replica whose lease expired as this replica saw
    /// it: take it (new `acquireTime`, one more transition).
    Take,
}

/// One replica's side of the election: what it has seen of the Lease, and when it last
/// renewed it.
#[derive(Debug, Clone)]
pub struct Candidate {
    identity: String,
    timing: Timing,
    seen: Option<Seen>,
    renewed_at: Option<Tick>,
}

/// A version of the record and when this replica first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    version: String,
    at: Tick,
}

impl Candidate {
    /// A replica called `identity` that has seen nothing yet and does not lead.
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Self {
            identity: identity.into(),
            timing,
            seen: None,
            renewed_at: None,
        }
    }

    /// This replica's identity in the Lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Takes in a read of the Lease whose answer arrived at `now`, and decides.
    ///
    /// A record is judged by how long *this* replica has seen it unchanged: the clock
    /// starts when its version first appears in a read, so another replica's clock (its
    /// `renewTime`) never enters the decision.
    pub fn observe(&mut self, read: Read<'_>, now: Tick) -> Decision {
        let record = match read {
            Read::Absent => {
                self.seen = None;
                return match self.renewed_at {
                    Some(_) => Decision::Lost { holder: None },
                    None => Decision::Create,
                };
            }
            Read::Present(record) => record,
        };
        let first_seen = match &self.seen {
            Some(seen) if seen.version == record.version => seen.at,
            _ => {
                self.seen = Some(Seen {
                    version: record.version.to_owned(),
                    at: now,
                });
                now
            }
        };
        let holder = record.holder.filter(|h| !h.is_empty());
        match holder {
            // Ours: renew; or, when this process never led, a previous run of this replica
            // (same identity) held it, and that run is gone.
            Some(h) if h == self.identity => Decision::Claim(Claim::Renew),
            _ if self.renewed_at.is_some() => Decision::Lost {
                holder: holder.map(str::to_owned),
            },
            None => Decision::Claim(Claim::Take),
            Some(h) => {
                let duration = record
                    .lease_duration
                    .filter(|d| !d.is_zero())
                    .unwrap_or(self.timing.lease_duration);
                let expires = first_seen + duration;
                if now >= expires {
                    Decision::Claim(Claim::Take)
                } else {
                    Decision::Follow {
                        holder: h.to_owned(),
                        expires_in: expires - now,
                    }
                }
            }
        }
    }

    /// A claim whose attempt started at `started` (before the Lease was read) succeeded: the
    /// Lease is now at `version`, as the answer that arrived at `now` says. This replica leads
    /// until `started + renew_deadline`.
    ///
    /// `started` and not `now`: the write took effect somewhere between the two, and the
    /// others may have seen it from that moment on.
    pub fn claimed(&mut self, started: Tick, version: &str, now: Tick) {
        self.renewed_at = Some(started);
        self.seen = Some(Seen {
            version: version.to_owned(),
            at: now,
        });
    }

    /// Whether this replica may act at `now`.
    pub fn leading(&self, now: Tick) -> bool {
        self.step_down_at().is_some_and(|at| now < at)
    }

    /// When this replica must have stopped acting unless a renewal succeeds first; `None`
    /// when it does not lead.
    pub fn step_down_at(&self) -> Option<Tick> {
        self.renewed_at.map(|at| at + self.timing.renew_deadline)
    }

    /// The instant by which anything this replica sends to the outside world (a BMC command)
    /// must have been answered or given up on; `None` when it does not lead.
    ///
    /// Half of the gap between the renew deadline and the lease duration past the step-down:
    /// the other half is left for clocks that run at different rates and for answers that
    /// come late. Another replica takes the lease only after `lease duration` of its own
    /// clock, so an action bounded by this instant has ended before it can start while the
    /// clocks' rates differ by less than `gap / (2 × (renew deadline + gap / 2 + lease
    /// duration))`: 9 % at 15 s / 10 s, 5 % at the tightest timing the simulation draws
    /// (5 s / 4 s; it checks rates within ±2 %); NTP keeps rates within 0.05 %.
    pub fn acts_end_by(&self) -> Option<Tick> {
        let gap = self
            .timing
            .lease_duration
            .saturating_sub(self.timing.renew_deadline);
        self.step_down_at().map(|at| at + gap / 2)
    }

    /// Ends this replica's term (its work has stopped). It may lead again only through a new
    /// claim.
    pub fn step_down(&mut self) {
        self.renewed_at = None;
    }

    /// Whether a read shows a record this replica may release (it names this replica).
    pub fn may_release(&self, read: Read<'_>) -> bool {
        matches!(read, Read::Present(Record { holder: Some(h), .. }) if h == self.identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn record<'a>(version: &'a str, holder: Option<&'a str>, seconds: u64) -> Read<'a> {
        Read::Present(Record {
            version,
            holder,
            lease_duration: Some(s(seconds)),
        })
    }

    #[test]
    fn timing_is_validated() {
        let cases = [
            ((15, 10, 2), true),
            ((15, 14, 13), true),
            ((15, 15, 2), false),
            ((15, 16, 2), false),
            ((15, 10, 10), false),
            ((15, 10, 0), false),
            ((0, 0, 0), false),
        ];
        for ((d, r, p), ok) in cases {
            assert_eq!(Timing::new(s(d), s(r), s(p)).is_ok(), ok, "{d}/{r}/{p}");
        }
        assert!(matches!(
            Timing::new(Duration::from_millis(15_500), s(10), s(2)),
            Err(TimingError::LeaseDuration { .. })
        ));
        assert_eq!(
            Timing::DEFAULT.request_timeout(),
            Duration::from_millis(2500)
        );
        let message = Timing::new(s(10), s(10), s(2)).unwrap_err().to_string();
        assert!(
            message.contains("must be shorter than the lease duration"),
            "{message}"
        );
    }

    #[test]
    fn decisions_table() {
        // (case, reads: (version, holder, at seconds), expected decision of the last read)
        type Reads = &'static [(&'static str, Option<&'static str>, u64)];
        let follow = |expires_in: u64| Decision::Follow {
            holder: "other".into(),
            expires_in: s(expires_in),
        };
        let cases: [(&str, Reads, Decision); 8] = [
            (
                "free lease",
                &[("1", None, 0)],
                Decision::Claim(Claim::Take),
            ),
            (
                "empty holder",
                &[("1", Some(""), 0)],
                Decision::Claim(Claim::Take),
            ),
            (
                "a previous run of this replica",
                &[("1", Some("me"), 0)],
                Decision::Claim(Claim::Renew),
            ),
            ("just seen", &[("1", Some("other"), 100)], follow(15)),
            (
                "unchanged for less than its duration",
                &[("1", Some("other"), 100), ("1", Some("other"), 114)],
                follow(1),
            ),
            (
                "unchanged for its duration",
                &[("1", Some("other"), 100), ("1", Some("other"), 115)],
                Decision::Claim(Claim::Take),
            ),
            (
                "renewed: the clock starts again",
                &[
                    ("1", Some("other"), 100),
                    ("2", Some("other"), 110),
                    ("2", Some("other"), 120),
                ],
                follow(5),
            ),
            (
                // A long silence since the first read says nothing: only an unchanged record
                // seen for the duration does.
                "first read after a long time",
                &[("7", Some("other"), 10_000)],
                follow(15),
            ),
        ];
        for (case, reads, expected) in cases {
            let mut candidate = Candidate::new("me", Timing::DEFAULT);
            let mut last = None;
            for (version, holder, at) in reads {
                last = Some(candidate.observe(record(version, *holder, 15), s(*at)));
            }
            assert_eq!(last, Some(expected), "{case}");
        }
    }

    #[test]
    fn the_holders_duration_counts_not_ours() {
        let mut candidate = Candidate::new("me", Timing::DEFAULT);
        candidate.observe(record("1", Some("other"), 40), s(0));
        assert_eq!(
            candidate.observe(record("1", Some("other"), 40), s(20)),
            Decision::Follow {
                holder: "other".into(),
                expires_in: s(20)
            }
        );
        // No duration recorded: ours.
        let mut candidate = Candidate::new("me", Timing::DEFAULT);
        let no_duration = Read::Present(Record {
            version: "1",
            holder: Some("other"),
            lease_duration: None,
        });
        candidate.observe(no_duration, s(0));
        assert_eq!(
            candidate.observe(no_duration, s(15)),
            Decision::Claim(Claim::Take)
        );
    }

    #[test]
    fn no_lease_is_created_or_lost() {
        let mut candidate = Candidate::new("me", Timing::DEFAULT);
        assert_eq!(candidate.observe(Read::Absent, s(0)), Decision::Create);
        candidate.claimed(s(0), "1", s(1));
        assert_eq!(
            candidate.observe(Read::Absent, s(2)),
            Decision::Lost { holder: None }
        );
    }

    #[test]
    fn a_leader_leads_until_its_deadline_from_the_start_of_its_last_renewal() {
        let mut candidate = Candidate::new("me", Timing::DEFAULT);
        assert!(!candidate.leading(s(0)));
        assert_eq!(candidate.step_down_at(), None);
        // The attempt started at 5 and its answer came at 8: the deadline counts from 5.
        candidate.claimed(s(5), "1", s(8));
        assert!(candidate.leading(s(14)));
        assert!(!candidate.leading(s(15)));
        assert_eq!(candidate.step_down_at(), Some(s(15)));
        // Commands end by half the 5 s gap past the step-down.
        assert_eq!(candidate.acts_end_by(), Some(Duration::from_millis(17_500)));
        candidate.claimed(s(12), "2", s(13));
        assert!(candidate.leading(s(21)));
        assert!(!candidate.leading(s(22)));
        candidate.step_down();
        assert!(!candidate.leading(s(13)));
        assert_eq!(candidate.acts_end_by(), None);
    }

    #[test]
    fn a_leader_that_sees_another_holder_has_lost() {
        let mut candidate = Candidate::new("me", Timing::DEFAULT);
        candidate.claimed(s(0), "1", s(0));
        assert_eq!(
            candidate.observe(record("1", Some("me"), 15), s(2)),
            Decision::Claim(Claim::Renew)
        );
        assert_eq!(
            candidate.observe(record("2", Some("other"), 15), s(4)),
            Decision::Lost {
                holder: Some("other".into())
            }
        );
        assert_eq!(
            candidate.observe(record("3", None, 15), s(4)),
            Decision::Lost { holder: None }
        );
        // Stepped down, it follows like anyone else: version 3 was first seen at 4 s.
        candidate.step_down();
        assert_eq!(
            candidate.observe(record("3", Some("other"), 15), s(5)),
            Decision::Follow {
                holder: "other".into(),
                expires_in: s(14)
            }
        );
    }

    #[test]
    fn only_the_holder_releases() {
        let candidate = Candidate::new("me", Timing::DEFAULT);
        assert!(candidate.may_release(record("1", Some("me"), 15)));
        assert!(!candidate.may_release(record("1", Some("other"), 15)));
        assert!(!candidate.may_release(record("1", None, 15)));
        assert!(!candidate.may_release(Read::Absent));
    }
}
