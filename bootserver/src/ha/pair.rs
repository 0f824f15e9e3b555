//! The pair's state as this server sees it, moved by events, and what each state allows.
//! Pure: the time is an argument (seconds since the Unix epoch), the shells feed events.
//!
//! | state | allocates in | answers |
//! |---|---|---|
//! | up | its part | its hash half, and clients that waited ≥ 10 s |
//! | interrupted | its part | every client |
//! | partner down | its part; the partner's once the longest lease has passed | every client |
//! | recovering | nothing | nobody |
//!
//! Leases of the partner's part are extended only while the owner hears of it first (up) or
//! cannot serve (partner down: it recovers from this server before serving again); otherwise
//! not at all: the client keeps its address until the lease the owner knows ends.

use super::parts::{Half, Part};

/// How long a client's `secs` must say it has waited before the server that is not its
/// hash's answers it anyway (its partner is not answering it).
pub const TAKE_OVER_CLIENT_AFTER_SECS: u16 = 10;

/// The pair's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairState {
    /// The partner answers: every record reaches it before the ACK.
    Up,
    /// Nothing heard from the partner since `since`.
    Interrupted {
        /// Seconds since the Unix epoch.
        since: u64,
    },
    /// This server holds the partner's part fence (the partner's Lease had expired).
    PartnerDown {
        /// When it took the fence.
        fenced_at: u64,
    },
    /// Started without a book it can trust: nothing served until `until` (the longest
    /// lease after the start, when everything it may have lost has ended), or, when the
    /// partner's records make the book whole (`synced_suffices`), until they came.
    Recovering {
        /// Seconds since the Unix epoch.
        until: u64,
        /// The partner had taken this server's part ([`StartBook::Stale`]): what it did
        /// there is all in its records.
        synced_suffices: bool,
    },
}

impl PairState {
    /// The state's name in logs, metrics and status.
    pub fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Interrupted { .. } => "interrupted",
            Self::PartnerDown { .. } => "partner-down",
            Self::Recovering { .. } => "recovering",
        }
    }

    /// The state as one byte on the link (the partner shows it in its status).
    pub fn code(self) -> u8 {
        match self {
            Self::Up => 1,
            Self::Interrupted { .. } => 2,
            Self::PartnerDown { .. } => 3,
            Self::Recovering { .. } => 4,
        }
    }

    /// Every state's name, for metrics that show each.
    pub const NAMES: [&'static str; 4] = ["up", "interrupted", "partner-down", "recovering"];

    /// The name of the state `code` stands for, as a partner sent it.
    pub fn name_of_code(code: u8) -> &'static str {
        match code {
            1..=4 => Self::NAMES[usize::from(code - 1)],
            _ => "unknown",
        }
    }
}

/// Whether a lease made durable here may be acknowledged to its client: one of the
/// partner's part only once the partner, its owner, took it (it may have given the address
/// to someone else, or may once the lease it knows ends; found by the pair's property test).
pub fn may_acknowledge(in_partners_part: bool, partner_took: bool) -> bool {
    !in_partners_part || partner_took
}

/// The book a server starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartBook {
    /// Its own log, and nobody took its part meanwhile: it serves once the partner's
    /// catch-up came, or once `interrupted_after` passed without one (then alone).
    Trusted,
    /// Its own log, but the partner held its part's fence meanwhile: the partner's records
    /// make it whole.
    Stale,
    /// An empty disk, found at `lost_at` (a time kept durably beside the log, so that a
    /// restart during the wait waits on rather than trusting the new, thin log). The
    /// partner's records cannot make it whole: this server may have acknowledged leases
    /// the partner never heard of (while they could not talk) before it lost them, so it
    /// waits until any such lease has ended.
    Empty {
        /// Seconds since the Unix epoch.
        lost_at: u64,
    },
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The partner answered (a heartbeat or a replication acknowledgement).
    Heard,
    /// Time passed.
    Tick,
    /// A wait for the partner's acknowledgement of a record ran out.
    ReplicationTimedOut,
    /// This server took the partner's part fence.
    FenceTaken,
    /// Every record the partner holds is in this server's book.
    Synced,
    /// The partner recovered from this server and holds its fence again.
    PartnerRecovered,
}

/// One server's view of its pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    state: PairState,
    last_heard: Option<u64>,
    interrupted_after: u64,
    longest_lease: u64,
}

impl Pair {
    /// At start: with a book it can trust it waits a little for the partner's catch-up;
    /// otherwise it recovers first.
    pub fn starting(book: StartBook, now: u64, interrupted_after: u64, longest_lease: u64) -> Self {
        let state = match book {
            // What the partner did while this server was away is in the partner's
            // catch-up: a short wait for it keeps clients from moving to new addresses.
            StartBook::Trusted => PairState::Recovering {
                until: now.saturating_add(interrupted_after),
                synced_suffices: true,
            },
            StartBook::Stale => PairState::Recovering {
                until: now.saturating_add(longest_lease),
                synced_suffices: true,
            },
            StartBook::Empty { lost_at } => PairState::Recovering {
                until: lost_at.saturating_add(longest_lease),
                synced_suffices: false,
            },
        };
        Self {
            state,
            last_heard: None,
            interrupted_after,
            longest_lease,
        }
    }

    /// The state.
    pub fn state(&self) -> PairState {
        self.state
    }

    /// The state after `event` at `now`.
    pub fn on(&mut self, event: Event, now: u64) {
        use PairState::{Interrupted, PartnerDown, Recovering, Up};
        // A catch-up came from the partner: it is there as much as when it answers.
        if matches!(event, Event::Heard | Event::Synced) {
            self.last_heard = Some(now);
        }
        self.state = match (self.state, event) {
            (Interrupted { .. }, Event::Heard) => Up,
            (Up, Event::ReplicationTimedOut) => Interrupted { since: now },
            (Up, Event::Tick)
                if self
                    .last_heard
                    .is_none_or(|heard| now.saturating_sub(heard) >= self.interrupted_after) =>
            {
                Interrupted {
                    since: self.last_heard.unwrap_or(now),
                }
            }
            (Recovering { until, .. }, Event::Tick) if now >= until => Interrupted { since: now },
            (
                Recovering {
                    synced_suffices: true,
                    ..
                },
                Event::Synced,
            ) => Up,
            (Interrupted { .. }, Event::FenceTaken) => PartnerDown { fenced_at: now },
            (PartnerDown { .. }, Event::PartnerRecovered) => Up,
            (state, _) => state,
        };
    }

    /// Whether this server may take the partner's part fence (when it has expired): only
    /// while the partner does not answer.
    pub fn may_take_fence(&self) -> bool {
        matches!(self.state, PairState::Interrupted { .. })
    }

    /// Whether this server answers clients at all.
    pub fn serves(&self) -> bool {
        !matches!(self.state, PairState::Recovering { .. })
    }

    /// Whether it may make a new binding at an address in `part` at `now`.
    pub fn allocates_in(&self, part: Part, now: u64) -> bool {
        match (part, self.state) {
            (_, PairState::Recovering { .. }) => false,
            (Part::Own | Part::Outside, _) => true,
            (Part::Partners, PairState::PartnerDown { fenced_at }) => {
                now >= fenced_at.saturating_add(self.longest_lease)
            }
            (Part::Partners, _) => false,
        }
    }

    /// Whether every record waits for the partner's acknowledgement before the ACK.
    pub fn replicates_before_ack(&self) -> bool {
        self.state == PairState::Up
    }

    /// Whether a lease of the partner's part may be extended: the partner hears of it
    /// first, or recovers from this server before serving.
    pub fn extends_partners_leases(&self) -> bool {
        matches!(self.state, PairState::Up | PairState::PartnerDown { .. })
    }

    /// Whether to answer a client that `answerer` hashes to, which says it has waited
    /// `secs` seconds; `mine` is this server's half.
    pub fn answers(&self, answerer: Half, mine: Half, secs: u16) -> bool {
        match self.state {
            PairState::Recovering { .. } => false,
            PairState::Up => answerer == mine || secs >= TAKE_OVER_CLIENT_AFTER_SECS,
            PairState::Interrupted { .. } | PairState::PartnerDown { .. } => true,
        }
    }
}

/// The server that answers a client while the pair is up: FNV-1a of its client identifier
/// (both servers are ours, so any stable hash serves; RFC 3074's would only matter beside
/// another implementation).
pub fn answerer(client_id: &[u8]) -> Half {
    let hash = client_id.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    if hash & 1 == 0 {
        Half::Lower
    } else {
        Half::Upper
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_700_000_000;
    const LONGEST: u64 = 3600;

    #[test]
    fn the_states_follow_the_design() {
        let mut pair = Pair::starting(StartBook::Trusted, T0, 10, LONGEST);
        assert!(!pair.serves(), "first the partner's catch-up");
        pair.on(Event::Tick, T0 + 10);
        assert_eq!(pair.state(), PairState::Interrupted { since: T0 + 10 });
        assert!(
            pair.serves() && !pair.replicates_before_ack(),
            "alone, once it waited"
        );
        let mut caught_up = Pair::starting(StartBook::Trusted, T0, 10, LONGEST);
        caught_up.on(Event::Synced, T0 + 1);
        assert_eq!(caught_up.state(), PairState::Up);
        pair.on(Event::Heard, T0 + 11);
        assert_eq!(pair.state(), PairState::Up);
        assert!(pair.replicates_before_ack() && pair.extends_partners_leases());
        pair.on(Event::Tick, T0 + 20);
        assert_eq!(pair.state(), PairState::Up, "9 s of silence is not 10");
        pair.on(Event::Tick, T0 + 21);
        assert_eq!(pair.state(), PairState::Interrupted { since: T0 + 11 });
        assert!(!pair.extends_partners_leases());
        assert!(!pair.allocates_in(Part::Partners, T0 + 21));
        pair.on(Event::FenceTaken, T0 + 60);
        assert_eq!(pair.state(), PairState::PartnerDown { fenced_at: T0 + 60 });
        assert!(!pair.allocates_in(Part::Partners, T0 + 60 + LONGEST - 1));
        assert!(pair.allocates_in(Part::Partners, T0 + 60 + LONGEST));
        pair.on(Event::Heard, T0 + 100);
        assert!(
            matches!(pair.state(), PairState::PartnerDown { .. }),
            "until it recovered"
        );
        pair.on(Event::PartnerRecovered, T0 + 120);
        assert_eq!(pair.state(), PairState::Up);
        pair.on(Event::ReplicationTimedOut, T0 + 121);
        assert_eq!(pair.state(), PairState::Interrupted { since: T0 + 121 });
    }

    #[test]
    fn a_stale_book_recovers_from_the_partner_and_an_empty_one_waits_out_the_longest_lease() {
        let mut pair = Pair::starting(StartBook::Stale, T0, 10, LONGEST);
        assert!(!pair.serves());
        assert!(!pair.allocates_in(Part::Own, T0));
        assert!(!pair.answers(Half::Lower, Half::Lower, 60));
        pair.on(Event::Heard, T0 + 1);
        assert!(!pair.serves(), "heard is not synced");
        pair.on(Event::Synced, T0 + 2);
        assert_eq!(pair.state(), PairState::Up);

        // An empty disk: the partner's records are not all it acknowledged.
        let mut empty = Pair::starting(StartBook::Empty { lost_at: T0 }, T0, 10, LONGEST);
        empty.on(Event::Synced, T0 + 2);
        assert!(!empty.serves(), "synced is not enough for an empty disk");

        let mut alone = Pair::starting(StartBook::Empty { lost_at: T0 }, T0, 10, LONGEST);
        alone.on(Event::Tick, T0 + LONGEST - 1);
        assert!(!alone.serves());
        alone.on(Event::Tick, T0 + LONGEST);
        assert_eq!(
            alone.state(),
            PairState::Interrupted {
                since: T0 + LONGEST
            }
        );
        assert!(alone.allocates_in(Part::Own, T0 + LONGEST));
    }

    #[test]
    fn while_up_each_client_has_one_answerer_unless_it_waited() {
        let mut pair = Pair::starting(StartBook::Trusted, T0, 10, LONGEST);
        pair.on(Event::Synced, T0);
        let client = b"\x01\x52\x54\x00\x00\x00\x01";
        let theirs = match answerer(client) {
            Half::Lower => Half::Upper,
            Half::Upper => Half::Lower,
        };
        assert!(pair.answers(answerer(client), answerer(client), 0));
        assert!(!pair.answers(answerer(client), theirs, 0));
        assert!(pair.answers(answerer(client), theirs, TAKE_OVER_CLIENT_AFTER_SECS));
        pair.on(Event::ReplicationTimedOut, T0 + 1);
        assert!(pair.answers(answerer(client), theirs, 0));
    }

    #[test]
    fn the_answerer_hash_splits_clients_about_evenly() {
        let lower = (0u16..1000)
            .filter(|n| answerer(&[1, 0x52, 0x54, 0, 0, (n >> 8) as u8, *n as u8]) == Half::Lower)
            .count();
        assert!((400..=600).contains(&lower), "{lower} of 1000");
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            Just(Event::Heard),
            Just(Event::Tick),
            Just(Event::ReplicationTimedOut),
            Just(Event::FenceTaken),
            Just(Event::Synced),
            Just(Event::PartnerRecovered),
        ]
    }

    proptest! {
        /// Whatever happens: a server never allocates in its partner's part unless it took
        /// the fence at least the longest lease ago, never serves while recovering, and only
        /// takes a fence while the partner does not answer.
        #[test]
        fn the_partners_part_only_after_the_fence_and_the_longest_lease(
            book in prop_oneof![Just(StartBook::Trusted), Just(StartBook::Stale), Just(StartBook::Empty { lost_at: T0 })],
            steps in proptest::collection::vec((event(), 0u64..2000), 1..60),
        ) {
            let mut pair = Pair::starting(book, T0, 10, LONGEST);
            let mut now = T0;
            let mut fenced_at = None;
            for (event, wait) in steps {
                now += wait;
                let before = pair.state();
                pair.on(event, now);
                if event == Event::FenceTaken && pair.state() != before {
                    let was_interrupted = matches!(before, PairState::Interrupted { .. });
                    prop_assert!(was_interrupted, "a fence taken in {:?}", before);
                    fenced_at = Some(now);
                }
                if pair.state() == PairState::Up {
                    fenced_at = None;
                }
                if pair.allocates_in(Part::Partners, now) {
                    let at = fenced_at.expect("allocating in the partner's part without its fence");
                    prop_assert!(now >= at + LONGEST);
                }
                if matches!(pair.state(), PairState::Recovering { .. }) {
                    prop_assert!(!pair.serves() && !pair.allocates_in(Part::Own, now));
                }
                // An empty disk serves only once the longest lease has passed.
                if matches!(book, StartBook::Empty { .. }) && pair.serves() {
                    prop_assert!(now >= T0 + LONGEST);
                }
            }
        }
    }
}
