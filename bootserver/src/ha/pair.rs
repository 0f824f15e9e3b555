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
//! With fences (a Kubernetes Lease per part, [`Pair::with_fences`]), "its part" also needs
//! its own part's fence, or a partner that answers and says it does not hold that fence:
//! a server cut off from both the API server and its partner makes no new binding in its
//! part, because the partner may take the part once its fence expires.
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
        /// Since when the partner is back: this server makes no new binding in the
        /// partner's part, and hands the fence back once the offers it made there have
        /// lapsed ([`Pair::may_hand_back`]) and the partner has every record it wrote.
        handing_back: Option<u64>,
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
            Self::PartnerDown { .. } => PARTNER_DOWN,
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

/// [`PairState::PartnerDown`]'s code: a partner that reports it holds this server's fence.
const PARTNER_DOWN: u8 = 3;

/// How long after it stopped binding in the partner's part a server may hand that part's
/// fence back: an offer's hold, so that none it made there is still open.
pub const HAND_BACK_AFTER_SECS: u64 = crate::dhcp::allocate::OFFER_HOLD.as_secs();

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
    /// The partner's part fence it held is lost (its renewals failed).
    FenceLost,
    /// The partner answers again: stop binding in its part, to hand the fence back.
    HandingBack,
    /// This server took its own part's fence back from a partner that held it and let it
    /// expire without handing it back: what the partner did in this part is known only
    /// from its records.
    OwnFenceReturned,
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
    /// Whether this server holds its own part's fence (always, without fences).
    own_fence: bool,
    /// The state the partner last reported ([`Pair::reported_code`]), on this server's own
    /// connection; `None` when there is none.
    partner_reports: Option<u8>,
    /// When it stopped holding the partner's part without handing it back (its fence
    /// lost): its offers there may be open for an offer's hold more.
    left_partners_part_at: Option<u64>,
    /// No binding in its own part before this: it took its part back from a partner whose
    /// offers there may still be open.
    quiet_until: u64,
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
            own_fence: true,
            partner_reports: None,
            left_partners_part_at: None,
            quiet_until: 0,
        }
    }

    /// The state as this server reports it to its partner: "partner down" while it holds
    /// the partner's part, and for an offer's hold after it lost that part's fence (its
    /// offers there may still be open, so the partner must not bind there on its word).
    pub fn reported_code(&self, now: u64) -> u8 {
        let left_lately = self
            .left_partners_part_at
            .is_some_and(|at| now < at.saturating_add(HAND_BACK_AFTER_SECS));
        if left_lately {
            PARTNER_DOWN
        } else {
            self.state.code()
        }
    }

    /// A pair whose parts are fenced: this server's own part needs its fence (or an
    /// answering partner that does not hold it) before new bindings; none is held yet.
    pub fn with_fences(mut self) -> Self {
        self.own_fence = false;
        self
    }

    /// Whether this server holds its own part's fence now.
    pub fn set_own_fence(&mut self, held: bool) {
        self.own_fence = held;
    }

    /// What the partner reported of its state ([`PairState::code`]); `None` when its
    /// connection ended.
    pub fn partner_reported(&mut self, code: Option<u8>) {
        self.partner_reports = code;
    }

    /// Whether the partner answered within `interruptedAfterSeconds` of `now`.
    pub fn partner_answers(&self, now: u64) -> bool {
        self.last_heard
            .is_some_and(|heard| now.saturating_sub(heard) < self.interrupted_after)
    }

    /// The state.
    pub fn state(&self) -> PairState {
        self.state
    }

    /// The state after `event` at `now`.
    pub fn on(&mut self, event: Event, now: u64) {
        use PairState::{Interrupted, PartnerDown, Recovering, Up};
        if event == Event::FenceLost && matches!(self.state, PartnerDown { .. }) {
            self.left_partners_part_at = Some(now);
        }
        if event == Event::OwnFenceReturned {
            self.quiet_until = now.saturating_add(HAND_BACK_AFTER_SECS);
        }
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
            (Interrupted { .. }, Event::FenceTaken) => PartnerDown {
                fenced_at: now,
                handing_back: None,
            },
            (PartnerDown { .. }, Event::FenceLost) => Interrupted { since: now },
            (
                PartnerDown {
                    fenced_at,
                    handing_back: None,
                },
                Event::HandingBack,
            ) => PartnerDown {
                fenced_at,
                handing_back: Some(now),
            },
            (
                PartnerDown {
                    handing_back: Some(since),
                    ..
                },
                Event::PartnerRecovered,
            ) if now >= since.saturating_add(HAND_BACK_AFTER_SECS) => Up,
            // Already recovering: the stricter of the two waits.
            (
                Recovering {
                    until,
                    synced_suffices,
                },
                Event::OwnFenceReturned,
            ) => Recovering {
                until: until.max(now.saturating_add(self.longest_lease)),
                synced_suffices,
            },
            (_, Event::OwnFenceReturned) => Recovering {
                until: now.saturating_add(self.longest_lease),
                synced_suffices: true,
            },
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
            // A Machine's reservation is nobody's part: one Machine is one client.
            (Part::Outside, _) => true,
            (Part::Own, state) => {
                now >= self.quiet_until
                    && (self.own_fence
                        || state == PairState::Up
                            && self
                                .partner_reports
                                .is_some_and(|code| code != PARTNER_DOWN))
            }
            (
                Part::Partners,
                PairState::PartnerDown {
                    fenced_at,
                    handing_back: None,
                },
            ) => now >= fenced_at.saturating_add(self.longest_lease),
            (Part::Partners, _) => false,
        }
    }

    /// Whether a lease made durable here at an address in `part` may be acknowledged to
    /// its client, given whether the partner took it:
    /// - of the partner's part, only once the partner, its owner, took it (it may have
    ///   given the address to someone else, or may once the lease it knows ends; found by
    ///   the pair's property test), or while this server holds that part's fence;
    /// - of its own part, once the partner took it, or while it holds its own part's fence
    ///   (else the partner may take the part and, the longest lease later, give the address
    ///   again without knowing of this lease);
    /// - a reservation, always: one Machine is one client.
    pub fn may_acknowledge(&self, part: Part, partner_took: bool) -> bool {
        partner_took
            || match part {
                Part::Outside => true,
                Part::Own => self.own_fence,
                Part::Partners => matches!(
                    self.state,
                    PairState::PartnerDown {
                        handing_back: None,
                        ..
                    }
                ),
            }
    }

    /// Whether the partner's part fence may go back now: it stopped binding there long
    /// enough ago that every offer it made there has lapsed (the owner could otherwise
    /// offer an address this server still promises; found by the pair's property test).
    pub fn may_hand_back(&self, now: u64) -> bool {
        matches!(
            self.state,
            PairState::PartnerDown { handing_back: Some(since), .. }
                if now >= since.saturating_add(HAND_BACK_AFTER_SECS)
        )
    }

    /// Whether every record waits for the partner's acknowledgement before the ACK.
    pub fn replicates_before_ack(&self) -> bool {
        self.state == PairState::Up
    }

    /// Whether a lease of the partner's part may be extended: the partner hears of it
    /// first, or recovers from this server before serving.
    pub fn extends_partners_leases(&self) -> bool {
        matches!(
            self.state,
            PairState::Up
                | PairState::PartnerDown {
                    handing_back: None,
                    ..
                }
        )
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
        assert_eq!(
            pair.state(),
            PairState::PartnerDown {
                fenced_at: T0 + 60,
                handing_back: None
            }
        );
        assert!(!pair.allocates_in(Part::Partners, T0 + 60 + LONGEST - 1));
        assert!(pair.allocates_in(Part::Partners, T0 + 60 + LONGEST));
        pair.on(Event::Heard, T0 + 100);
        assert!(
            matches!(pair.state(), PairState::PartnerDown { .. }),
            "until it recovered"
        );
        pair.on(Event::PartnerRecovered, T0 + 110);
        assert!(
            matches!(pair.state(), PairState::PartnerDown { .. }),
            "not before it stopped binding in the partner's part"
        );
        pair.on(Event::HandingBack, T0 + 115);
        assert!(!pair.allocates_in(Part::Partners, T0 + 60 + LONGEST + 1));
        assert!(!pair.extends_partners_leases());
        assert!(!pair.may_hand_back(T0 + 115 + HAND_BACK_AFTER_SECS - 1));
        pair.on(Event::PartnerRecovered, T0 + 120);
        assert!(
            matches!(pair.state(), PairState::PartnerDown { .. }),
            "its offers there are still open"
        );
        assert!(pair.may_hand_back(T0 + 115 + HAND_BACK_AFTER_SECS));
        pair.on(Event::PartnerRecovered, T0 + 115 + HAND_BACK_AFTER_SECS);
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
    fn with_fences_its_own_part_needs_its_fence_or_a_partner_that_says_it_does_not_hold_it() {
        let mut pair = Pair::starting(StartBook::Trusted, T0, 10, LONGEST).with_fences();
        pair.on(Event::Synced, T0);
        assert!(!pair.allocates_in(Part::Own, T0), "nothing reported yet");
        assert!(
            pair.allocates_in(Part::Outside, T0),
            "reservations are nobody's part"
        );
        pair.partner_reported(Some(PairState::Up.code()));
        assert!(pair.allocates_in(Part::Own, T0));
        pair.partner_reported(Some(PARTNER_DOWN));
        assert!(
            !pair.allocates_in(Part::Own, T0),
            "the partner holds this part"
        );
        pair.set_own_fence(true);
        assert!(pair.allocates_in(Part::Own, T0), "its own fence");
        pair.partner_reported(None);
        pair.on(Event::Tick, T0 + 20);
        assert!(matches!(pair.state(), PairState::Interrupted { .. }));
        assert!(pair.allocates_in(Part::Own, T0 + 20), "its fence suffices");
        pair.set_own_fence(false);
        assert!(
            !pair.allocates_in(Part::Own, T0 + 20),
            "cut off from both: no new binding"
        );
        // Taken back from a partner that let it expire: its records make the book whole.
        pair.on(Event::OwnFenceReturned, T0 + 30);
        assert_eq!(
            pair.state(),
            PairState::Recovering {
                until: T0 + 30 + LONGEST,
                synced_suffices: true
            }
        );
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
            Just(Event::FenceLost),
            Just(Event::HandingBack),
            Just(Event::OwnFenceReturned),
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
