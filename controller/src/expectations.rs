//! Writes this controller made that its watches have not shown yet (the "expectations" of
//! Kubernetes' own controllers). A reconcile that reads a cache lagging behind the
//! controller's own write could otherwise act twice: a configuration reconciled again
//! before the watch delivered the version it just created sees no version and creates the
//! next number (a duplicate version under load); a version locked by one Machine looks
//! unlocked to the next Machine and is locked again (one request and one event per
//! Machine). An expectation ends when the watch shows the write, or after [`EXPECTATION_TTL`]
//! (the write was lost, or its effect undone by someone else), after which the caches
//! decide again.
//!
//! An expectation is recorded *before* its write is sent ([`expecting`]): the watch may
//! show the write before the API server's answer reaches the reconcile, and an
//! expectation recorded after that would wait for an event that has already passed,
//! holding its owner still until it expires. When the API server refuses the write (an
//! answer with a 4xx status: nothing was written), the expectation is retracted and what
//! it replaced is put back; when the outcome is unknown (no answer, a 5xx), it stays until
//! the watch shows the write or it expires, as a write that happened would.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Instant;

use crate::index::Shared;

// How long a write is expected to show in the watches at most: the statuses' record of
// their writes ([`crate::status_writes`]) needs it too, and imports nothing of this room.
pub use crate::status_writes::EXPECTATION_TTL;

/// Keys written at some instant and not yet seen.
#[derive(Debug, Clone)]
pub struct InFlight<K: Ord> {
    since: BTreeMap<K, Instant>,
}

impl<K: Ord> Default for InFlight<K> {
    fn default() -> Self {
        Self {
            since: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> InFlight<K> {
    /// A write of `key` at `now`; returns the expectation it replaces, for [`Self::restore`].
    pub fn expect(&mut self, key: K, now: Instant) -> Option<Instant> {
        self.since.insert(key, now)
    }

    /// Puts back what [`Self::expect`] replaced: the write did not happen.
    pub fn restore(&mut self, key: K, previous: Option<Instant>) {
        match previous {
            Some(at) => {
                self.since.insert(key, at);
            }
            None => {
                self.since.remove(&key);
            }
        }
    }

    /// The watch showed `key`.
    pub fn observed(&mut self, key: &K) {
        self.since.remove(key);
    }

    /// Whether `key` was written less than [`EXPECTATION_TTL`] before `now` and not seen.
    pub fn pending(&self, key: &K, now: Instant) -> bool {
        self.since
            .get(key)
            .is_some_and(|at| now.saturating_duration_since(*at) < EXPECTATION_TTL)
    }

    /// The keys in `range` pending at `now`.
    pub fn pending_in(&self, range: impl std::ops::RangeBounds<K>, now: Instant) -> Vec<K> {
        self.since
            .range(range)
            .filter(|(_, at)| now.saturating_duration_since(**at) < EXPECTATION_TTL)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Forgets expectations older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.since
            .retain(|_, at| now.saturating_duration_since(*at) < EXPECTATION_TTL);
    }
}

/// A change a group's owner (a MachinePool, or a configuration's rolling update) made to
/// one of its Machines, to be seen in the Machine watch before the owner decides again: a
/// lagging cache would otherwise claim a second Machine for one replica, or start a second
/// batch over a Machine whose repave request it does not see yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberChange {
    /// Created or claimed: the Machine carries the pool's label.
    Joined,
    /// Released: the Machine no longer carries the pool's label.
    Left,
    /// Deleted: being deleted, or gone.
    Deleting,
    /// A repave requested with this annotation value: the request, or its `repaving` mark.
    RepaveRequested(String),
}

/// What the Machine watch shows of a Machine, for [`MemberExpectations::observe`].
#[derive(Debug, Clone, Copy)]
pub struct ObservedMachine<'a> {
    /// The `unbounded-cloud.io/pool` label.
    pub pool: Option<&'a str>,
    /// The `unbounded-cloud.io/capi-machine` label (the claiming UnboundedMachine's UID).
    pub capi: Option<&'a str>,
    /// Being deleted.
    pub deleting: bool,
    /// The `unbounded-cloud.io/repave` annotation.
    pub repave: Option<&'a str>,
    /// The `unbounded-cloud.io/repaving` annotation.
    pub repaving: Option<&'a str>,
}

/// Changes to Machines that their owners made and the watch has not shown yet, by
/// `(machine, owner)`; an owner is `pool/<name>`, `configuration/<name>` or `capi/<uid>` (a
/// Cluster API UnboundedMachine).
#[derive(Debug, Default)]
pub struct MemberExpectations {
    pending: BTreeMap<(String, String), (MemberChange, Instant)>,
}

impl MemberExpectations {
    /// `owner` changed `machine` at `now`; returns the expectation it replaces, for
    /// [`Self::restore`].
    pub fn expect(
        &mut self,
        owner: &str,
        machine: &str,
        change: MemberChange,
        now: Instant,
    ) -> Option<(MemberChange, Instant)> {
        self.pending
            .insert((machine.to_owned(), owner.to_owned()), (change, now))
    }

    /// Puts back what [`Self::expect`] replaced: the write did not happen.
    pub fn restore(
        &mut self,
        owner: &str,
        machine: &str,
        previous: Option<(MemberChange, Instant)>,
    ) {
        let key = (machine.to_owned(), owner.to_owned());
        match previous {
            Some(entry) => {
                self.pending.insert(key, entry);
            }
            None => {
                self.pending.remove(&key);
            }
        }
    }

    /// The watch shows `machine` like this (`None`: gone).
    pub fn observe(&mut self, machine: &str, seen: Option<ObservedMachine<'_>>) {
        let range = (machine.to_owned(), String::new())..;
        let met: Vec<(String, String)> = self
            .pending
            .range(range)
            .take_while(|((m, _), _)| m == machine)
            .filter(|((_, owner), (change, _))| match seen {
                None => true,
                Some(seen) => match change {
                    MemberChange::Joined => holds(owner, seen),
                    MemberChange::Left => !holds(owner, seen),
                    MemberChange::Deleting => seen.deleting,
                    MemberChange::RepaveRequested(value) => {
                        seen.repave == Some(value.as_str()) || seen.repaving == Some(value.as_str())
                    }
                },
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in met {
            self.pending.remove(&key);
        }
    }

    /// How many of `owner`'s changes are not seen yet at `now` (older than
    /// [`EXPECTATION_TTL`] count as lost).
    pub fn pending_for(&self, owner: &str, now: Instant) -> usize {
        self.pending
            .iter()
            .filter(|((_, o), (_, at))| {
                o == owner && now.saturating_duration_since(*at) < EXPECTATION_TTL
            })
            .count()
    }

    /// Whether any owner's claim of `machine` is not seen yet.
    pub fn joining(&self, machine: &str, now: Instant) -> bool {
        let range = (machine.to_owned(), String::new())..;
        self.pending
            .range(range)
            .take_while(|((m, _), _)| m == machine)
            .any(|(_, (change, at))| {
                *change == MemberChange::Joined
                    && now.saturating_duration_since(*at) < EXPECTATION_TTL
            })
    }

    /// Forgets expectations older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.pending
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < EXPECTATION_TTL);
    }
}

/// Whether the Machine as seen belongs to `owner`: `pool/<name>` by its pool label,
/// `capi/<uid>` by its Cluster API claim label.
fn holds(owner: &str, seen: ObservedMachine<'_>) -> bool {
    match owner.strip_prefix("capi/") {
        Some(uid) => seen.capi == Some(uid),
        None => owner.strip_prefix("pool/") == seen.pool,
    }
}

/// The controller's expectations.
#[derive(Debug, Default)]
pub struct Expectations {
    /// Versions created, as `(configuration, version)`.
    pub created_versions: InFlight<(String, i64)>,
    /// Versions marked deployed, by object name.
    pub locked_versions: InFlight<String>,
    /// Nodes deleted for a repave, by UID: not the Machine's Node any more, whatever a
    /// lagging cache shows.
    pub deleted_nodes: InFlight<String>,
    /// Changes owners made to their Machines.
    pub members: MemberExpectations,
    /// Machine statuses written over a copy the cache may still show.
    pub machine_statuses: crate::status_writes::SupersededCopies,
    /// MachineConfiguration statuses written over a copy the cache may still show.
    pub configuration_statuses: crate::status_writes::SupersededCopies,
}

/// A write the controller is about to make, which a watch will show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectation {
    /// A MachineConfigurationVersion created.
    CreatedVersion {
        /// Its configuration.
        configuration: String,
        /// Its number.
        version: i64,
    },
    /// A version marked deployed, by object name.
    LockedVersion(String),
    /// A Node deleted for a repave, by UID.
    DeletedNode(String),
    /// A change an owner makes to one of its Machines.
    Member {
        /// `pool/<name>` or `configuration/<name>`.
        owner: String,
        /// The Machine.
        machine: String,
        /// What changes.
        change: MemberChange,
    },
}

/// An expectation as recorded, with what it replaced: handed back to
/// [`Expectations::retract`] when its write did not happen.
#[derive(Debug)]
#[must_use = "a recorded expectation is retracted when its write is refused"]
pub enum Recorded {
    /// A version creation, and the expectation of it it replaced.
    CreatedVersion((String, i64), Option<Instant>),
    /// A version lock, and the one it replaced.
    LockedVersion(String, Option<Instant>),
    /// A Node deletion, and the one it replaced.
    DeletedNode(String, Option<Instant>),
    /// An owner's change of a Machine, and the one it replaced.
    Member {
        /// The owner.
        owner: String,
        /// The Machine.
        machine: String,
        /// The owner's earlier expected change of the Machine.
        replaced: Option<(MemberChange, Instant)>,
    },
}

impl Expectations {
    /// Records `expectation` at `now`, before its write is sent.
    pub fn record(&mut self, expectation: Expectation, now: Instant) -> Recorded {
        match expectation {
            Expectation::CreatedVersion {
                configuration,
                version,
            } => {
                let key = (configuration, version);
                let replaced = self.created_versions.expect(key.clone(), now);
                Recorded::CreatedVersion(key, replaced)
            }
            Expectation::LockedVersion(name) => {
                let replaced = self.locked_versions.expect(name.clone(), now);
                Recorded::LockedVersion(name, replaced)
            }
            Expectation::DeletedNode(uid) => {
                let replaced = self.deleted_nodes.expect(uid.clone(), now);
                Recorded::DeletedNode(uid, replaced)
            }
            Expectation::Member {
                owner,
                machine,
                change,
            } => {
                let replaced = self.members.expect(&owner, &machine, change, now);
                Recorded::Member {
                    owner,
                    machine,
                    replaced,
                }
            }
        }
    }

    /// Takes back a recorded expectation whose write did not happen, putting back what it
    /// replaced.
    pub fn retract(&mut self, recorded: Recorded) {
        match recorded {
            Recorded::CreatedVersion(key, replaced) => {
                self.created_versions.restore(key, replaced);
            }
            Recorded::LockedVersion(name, replaced) => {
                self.locked_versions.restore(name, replaced);
            }
            Recorded::DeletedNode(uid, replaced) => self.deleted_nodes.restore(uid, replaced),
            Recorded::Member {
                owner,
                machine,
                replaced,
            } => self.members.restore(&owner, &machine, replaced),
        }
    }

    /// Forgets expectations older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.created_versions.expire(now);
        self.locked_versions.expire(now);
        self.deleted_nodes.expire(now);
        self.members.expire(now);
        self.machine_statuses.expire(now);
        self.configuration_statuses.expire(now);
    }

    /// The versions of `configuration` created less than [`EXPECTATION_TTL`] ago that are not
    /// among `seen` (the version numbers the cache holds).
    pub fn unseen_versions_of(&self, configuration: &str, seen: &[i64], now: Instant) -> Vec<i64> {
        self.created_versions
            .pending_in(
                (configuration.to_owned(), i64::MIN)..=(configuration.to_owned(), i64::MAX),
                now,
            )
            .into_iter()
            .map(|(_, version)| version)
            .filter(|version| !seen.contains(version))
            .collect()
    }
}

/// Whether a failed write certainly did not happen: the API server answered it with a
/// client error (refused, conflict, not found, invalid). Without an answer, or with a server
/// error, it may have been written.
pub trait WriteRefused {
    /// The write did not happen.
    fn write_refused(&self) -> bool;
}

impl WriteRefused for kube::Error {
    fn write_refused(&self) -> bool {
        matches!(self, kube::Error::Api(status) if (400..500).contains(&status.code))
    }
}

impl WriteRefused for crate::Error {
    fn write_refused(&self) -> bool {
        match self {
            Self::Kube { source, .. } => source.write_refused(),
            // Nothing was sent.
            Self::Serialize { .. } => true,
            Self::Finalizer(_) | Self::Waiting(_) | Self::StoreNotReady(_) => false,
        }
    }
}

/// Makes `write` with `expectation` recorded first, and retracts it when the write was
/// refused (see the module's documentation for why in this order).
pub async fn expecting<T, E: WriteRefused>(
    expectations: &Shared<Expectations>,
    expectation: Expectation,
    write: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let recorded = expectations.write().record(expectation, Instant::now());
    let result = write.await;
    if let Err(error) = &result
        && error.write_refused()
    {
        expectations.write().retract(recorded);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expectations_table() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut e = Expectations::default();
        e.created_versions.expect(("mc-a".into(), 2), at(0));
        e.created_versions.expect(("mc-ab".into(), 1), at(0));
        e.locked_versions.expect("mc-a-v1".into(), at(0));

        assert_eq!(e.unseen_versions_of("mc-a", &[1], at(1)), vec![2]);
        assert!(
            e.unseen_versions_of("mc-a", &[1, 2], at(1)).is_empty(),
            "the cache already holds it (the watch was faster than the expectation)"
        );
        assert!(
            e.unseen_versions_of("mc", &[], at(1)).is_empty(),
            "a name that is a prefix is another configuration"
        );
        assert!(e.locked_versions.pending(&"mc-a-v1".to_owned(), at(1)));

        e.created_versions.observed(&("mc-a".into(), 2));
        assert!(
            e.unseen_versions_of("mc-a", &[], at(1)).is_empty(),
            "seen by the watch"
        );
        assert_eq!(e.unseen_versions_of("mc-ab", &[], at(29)), vec![1]);
        assert!(
            e.unseen_versions_of("mc-ab", &[], at(30)).is_empty(),
            "expired: the caches decide again"
        );
        assert!(!e.locked_versions.pending(&"mc-a-v1".to_owned(), at(30)));

        e.created_versions.expire(at(30));
        e.locked_versions.expire(at(30));
        assert!(e.created_versions.since.is_empty());
        assert!(e.locked_versions.since.is_empty());
    }

    #[test]
    fn member_expectations_table() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let seen = |pool: Option<&'static str>, repave: Option<&'static str>| ObservedMachine {
            pool,
            capi: None,
            deleting: false,
            repave,
            repaving: None,
        };
        let mut e = MemberExpectations::default();
        e.expect("pool/a", "m1", MemberChange::Joined, at(0));
        e.expect("pool/b", "m1", MemberChange::Joined, at(0));
        e.expect(
            "pool/a",
            "m2",
            MemberChange::RepaveRequested("t1".into()),
            at(0),
        );
        e.expect("pool/a", "m3", MemberChange::Left, at(0));
        e.expect("pool/a", "m10", MemberChange::Deleting, at(0));
        assert_eq!(e.pending_for("pool/a", at(1)), 4);
        assert!(e.joining("m1", at(1)));

        e.observe("m1", Some(seen(Some("a"), None)));
        assert_eq!(e.pending_for("pool/a", at(1)), 3, "a's claim is seen");
        assert_eq!(
            e.pending_for("pool/b", at(1)),
            1,
            "b's is not: a won (b's claim conflicted); it expires"
        );
        e.observe("m2", Some(seen(None, Some("t0"))));
        assert_eq!(e.pending_for("pool/a", at(1)), 3, "another request");
        e.observe(
            "m2",
            Some(ObservedMachine {
                repaving: Some("t1"),
                ..seen(None, None)
            }),
        );
        e.observe("m3", Some(seen(None, None)));
        assert_eq!(e.pending_for("pool/a", at(1)), 1);
        e.observe("m1", None);
        assert_eq!(
            e.pending_for("pool/a", at(1)),
            1,
            "m10 is not m1's neighbour"
        );
        assert_eq!(e.pending_for("pool/a", at(30)), 0, "expired");
        e.observe("m10", None);
        assert_eq!(e.pending_for("pool/a", at(1)), 0, "gone counts as deleted");
        assert!(!e.joining("m1", at(1)));
    }

    /// A Cluster API claim is seen by its claim label (the UID), not the pool label, and a
    /// pool's claim of the same Machine does not meet it.
    #[test]
    fn a_cluster_api_claim_is_seen_by_its_label() {
        let now = Instant::now();
        let seen = |pool: Option<&'static str>, capi: Option<&'static str>| ObservedMachine {
            pool,
            capi,
            deleting: false,
            repave: None,
            repaving: None,
        };
        let mut e = MemberExpectations::default();
        e.expect("capi/u1", "m1", MemberChange::Joined, now);
        e.observe("m1", Some(seen(Some("u1"), None)));
        assert_eq!(
            e.pending_for("capi/u1", now),
            1,
            "a pool named u1 is not the claim"
        );
        e.observe("m1", Some(seen(None, Some("u2"))));
        assert_eq!(e.pending_for("capi/u1", now), 1, "another claimant's label");
        e.observe("m1", Some(seen(None, Some("u1"))));
        assert_eq!(e.pending_for("capi/u1", now), 0);
        e.expect("capi/u1", "m1", MemberChange::Left, now);
        e.observe("m1", Some(seen(None, Some("u1"))));
        assert_eq!(e.pending_for("capi/u1", now), 1, "still claimed");
        e.observe("m1", Some(seen(None, None)));
        assert_eq!(e.pending_for("capi/u1", now), 0, "released");
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    fn repave_of(machine: &str, value: &str) -> Expectation {
        Expectation::Member {
            owner: "pool/p".into(),
            machine: machine.into(),
            change: MemberChange::RepaveRequested(value.into()),
        }
    }

    fn seen_repave(value: &str) -> ObservedMachine<'_> {
        ObservedMachine {
            pool: Some("p"),
            capi: None,
            deleting: false,
            repave: Some(value),
            repaving: None,
        }
    }

    /// The watch shows the write while its answer is still on the way: the expectation is
    /// met, because it was recorded before the write was sent. Recorded after the answer
    /// (the order this replaced), the same sequence leaves it pending until it expires.
    #[tokio::test]
    async fn the_watch_showing_a_write_before_its_answer_meets_the_expectation() {
        let shared = Shared::new(Expectations::default());
        let watch = shared.clone();
        let written = expecting(&shared, repave_of("m1", "t1"), async move {
            // The Machine watch delivers the write here, before the answer.
            watch.write().members.observe("m1", Some(seen_repave("t1")));
            Ok::<_, kube::Error>(())
        })
        .await;
        assert!(written.is_ok());
        assert_eq!(
            shared.read().members.pending_for("pool/p", Instant::now()),
            0,
            "met by the event that came before the answer"
        );

        let mut late = Expectations::default();
        late.members.observe("m2", Some(seen_repave("t1")));
        let _ = late.record(repave_of("m2", "t1"), Instant::now());
        assert_eq!(
            late.members.pending_for("pool/p", Instant::now()),
            1,
            "recorded after its event: nothing will meet it"
        );
    }

    /// A refused write takes its expectation back and puts back the one it replaced; a
    /// write whose outcome is unknown keeps it.
    #[tokio::test]
    async fn a_refused_write_retracts_its_expectation() {
        let now = Instant::now();
        type Outcome = Result<(), kube::Error>;
        let cases: [(&str, Outcome, bool, usize); 5] = [
            ("written", Ok(()), false, 1),
            ("conflict: not written", Err(api_error(409)), true, 0),
            ("not found: not written", Err(api_error(404)), true, 0),
            (
                "server error: may be written",
                Err(api_error(504)),
                false,
                1,
            ),
            (
                "no answer: may be written",
                Err(kube::Error::Service("connection reset by peer".into())),
                false,
                1,
            ),
        ];
        for (case, outcome, retracted, pending) in cases {
            let shared = Shared::new(Expectations::default());
            let result = expecting(&shared, repave_of("m1", "t1"), async { outcome }).await;
            assert_eq!(
                result
                    .as_ref()
                    .err()
                    .is_some_and(WriteRefused::write_refused),
                retracted,
                "{case}"
            );
            assert_eq!(
                shared.read().members.pending_for("pool/p", now),
                pending,
                "{case}"
            );
        }

        // What a refused write replaced comes back: an earlier request still waits for its
        // event.
        let shared = Shared::new(Expectations::default());
        let earlier = shared.write().record(repave_of("m1", "t0"), now);
        drop(earlier);
        let refused = expecting(&shared, repave_of("m1", "t1"), async {
            Err::<(), _>(api_error(409))
        })
        .await;
        assert!(refused.is_err());
        let mut e = shared.write();
        e.members.observe("m1", Some(seen_repave("t1")));
        assert_eq!(
            e.members.pending_for("pool/p", now),
            1,
            "t0 is back, not t1"
        );
        e.members.observe("m1", Some(seen_repave("t0")));
        assert_eq!(e.members.pending_for("pool/p", now), 0);

        // The same for the other kinds.
        let mut e = Expectations::default();
        let kinds = [
            Expectation::CreatedVersion {
                configuration: "mc".into(),
                version: 2,
            },
            Expectation::LockedVersion("mc-v1".into()),
            Expectation::DeletedNode("uid-1".into()),
        ];
        for kind in kinds {
            let recorded = e.record(kind.clone(), now);
            e.retract(recorded);
        }
        assert!(e.unseen_versions_of("mc", &[], now).is_empty());
        assert!(!e.locked_versions.pending(&"mc-v1".to_owned(), now));
        assert!(!e.deleted_nodes.pending(&"uid-1".to_owned(), now));
    }
}
