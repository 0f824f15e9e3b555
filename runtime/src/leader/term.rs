//! A leader's term as the code that acts on the outside world sees it.
//!
//! Dropping a leader's work stops what runs on the async runtime, but not a call already
//! handed to a blocking thread (an IPMI session), and not a request a BMC still holds. So
//! whatever sends a command first asks the [`Term`]: a command starts only while the term
//! lasts, and must be answered (or given up on) by the term's [`Candidate::acts_end_by`]
//! instant, which lies inside the gap before another replica can take the lease.
//!
//! The term is shared (`Clone` is cheap) and read from any thread: the elector extends it on
//! every renewal and ends it when it steps down; a term also ends by itself at its step-down
//! instant, even if the elector's task is never polled again.
//!
//! [`Candidate::acts_end_by`]: super::Candidate::acts_end_by

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The shortest wait a command is granted: less and a healthy BMC could not answer.
pub const SHORTEST_GRANT: Duration = Duration::from_millis(500);

/// Why a command may not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TermEnded {
    /// This replica no longer leads (or its step-down instant has passed).
    #[error("this replica no longer leads")]
    NotLeading,
    /// It still leads, but too briefly for an answer to come back inside the term.
    #[error("this replica's term ends in {left:?}, too soon for a command to be answered")]
    TooLate {
        /// What is left until the term's actions must have ended.
        left: Duration,
    },
}

/// One term of leadership (or, without an election, no limit at all).
#[derive(Debug, Clone)]
pub struct Term(Arc<Mutex<State>>);

#[derive(Debug, Clone, Copy)]
enum State {
    /// No leader election: one replica, always allowed.
    Unbounded,
    /// Leading until `step_down`; what it sends must end by `acts_end_by`.
    Leading {
        step_down: Instant,
        acts_end_by: Instant,
    },
    /// Over for good.
    Ended,
}

impl Term {
    /// A term without limits, for a component run without leader election.
    pub fn unbounded() -> Self {
        Self(Arc::new(Mutex::new(State::Unbounded)))
    }

    /// A term that has already ended (nothing may be sent).
    pub fn ended() -> Self {
        Self(Arc::new(Mutex::new(State::Ended)))
    }

    /// A new term, leading until `step_down`.
    pub(crate) fn leading(step_down: Instant, acts_end_by: Instant) -> Self {
        Self(Arc::new(Mutex::new(State::Leading {
            step_down,
            acts_end_by,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A renewal moved the step-down instant; an ended term stays ended.
    pub(crate) fn extend(&self, step_down: Instant, acts_end_by: Instant) {
        let mut state = self.lock();
        if let State::Leading { .. } = *state {
            *state = State::Leading {
                step_down,
                acts_end_by,
            };
        }
    }

    /// Ends the term for good.
    pub(crate) fn end(&self) {
        let mut state = self.lock();
        if let State::Leading { .. } = *state {
            *state = State::Ended;
        }
    }

    /// How long a command sent now may wait for its answer: `wanted`, or less when the term
    /// ends sooner. Refused when the term has ended or leaves less than [`SHORTEST_GRANT`].
    pub fn grant(&self, wanted: Duration) -> Result<Duration, TermEnded> {
        grant(*self.lock(), Instant::now(), wanted)
    }

    /// Whether a command that waits `needed` for its answer may be sent now.
    pub fn check(&self, needed: Duration) -> Result<(), TermEnded> {
        match self.grant(needed)? {
            granted if granted >= needed => Ok(()),
            left => Err(TermEnded::TooLate { left }),
        }
    }
}

/// The decision of [`Term::grant`], over plain data.
fn grant(state: State, now: Instant, wanted: Duration) -> Result<Duration, TermEnded> {
    match state {
        State::Unbounded => Ok(wanted),
        State::Ended => Err(TermEnded::NotLeading),
        State::Leading { step_down, .. } if now >= step_down => Err(TermEnded::NotLeading),
        State::Leading { acts_end_by, .. } => {
            let left = acts_end_by.saturating_duration_since(now);
            if left < SHORTEST_GRANT.min(wanted) {
                Err(TermEnded::TooLate { left })
            } else {
                Ok(wanted.min(left))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_table() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let leading = |step_down: u64, end: u64| State::Leading {
            step_down: now + s(step_down),
            acts_end_by: now + s(end),
        };
        let cases = [
            ("no election", State::Unbounded, s(30), Ok(s(30))),
            ("ended", State::Ended, s(1), Err(TermEnded::NotLeading)),
            ("plenty of term", leading(10, 12), s(5), Ok(s(5))),
            ("cut to the term's end", leading(10, 12), s(30), Ok(s(12))),
            (
                "past the step-down instant",
                leading(0, 2),
                s(1),
                Err(TermEnded::NotLeading),
            ),
        ];
        for (case, state, wanted, want) in cases {
            assert_eq!(grant(state, now, wanted), want, "{case}");
        }
        let almost = State::Leading {
            step_down: now + Duration::from_millis(100),
            acts_end_by: now + Duration::from_millis(300),
        };
        assert!(matches!(
            grant(almost, now, s(5)),
            Err(TermEnded::TooLate { .. })
        ));
    }

    #[test]
    fn an_ended_term_is_never_extended_and_a_check_needs_the_whole_wait() {
        let now = Instant::now();
        let term = Term::leading(now + Duration::from_secs(10), now + Duration::from_secs(12));
        assert_eq!(term.check(Duration::from_secs(5)), Ok(()));
        assert!(matches!(
            term.check(Duration::from_secs(60)),
            Err(TermEnded::TooLate { .. })
        ));
        let shared = term.clone();
        term.end();
        shared.extend(now + Duration::from_secs(20), now + Duration::from_secs(22));
        assert_eq!(
            shared.grant(Duration::from_secs(1)),
            Err(TermEnded::NotLeading)
        );
        assert_eq!(
            Term::ended().check(Duration::ZERO),
            Err(TermEnded::NotLeading)
        );
        assert_eq!(Term::unbounded().check(Duration::from_secs(3600)), Ok(()));
    }
}
