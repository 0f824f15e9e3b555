//! Writes this controller made that its watches have not shown yet (the "expectations" of
//! Kubernetes' own controllers). A reconcile that reads a cache lagging behind the
//! controller's own write could otherwise act twice: a configuration reconciled again
//! before the watch delivered the version it just created sees no version and creates the
//! next number (a duplicate version under load); a version locked by one Machine looks
//! unlocked to the next Machine and is locked again (one request and one event per
//! Machine). An expectation ends when the watch shows the write, or after [`EXPECTATION_TTL`]
//! (the write was lost, or its effect undone by someone else), after which the caches
//! decide again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a write is expected to show in the watches at most.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

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
    /// A write of `key` at `now`.
    pub fn expect(&mut self, key: K, now: Instant) {
        self.since.insert(key, now);
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
    /// Being deleted.
    pub deleting: bool,
    /// The `unbounded-cloud.io/repave` annotation.
    pub repave: Option<&'a str>,
    /// The `unbounded-cloud.io/repaving` annotation.
    pub repaving: Option<&'a str>,
}

/// Changes to Machines that their owners made and the watch has not shown yet, by
/// `(machine, owner)`; an owner is `pool/<name>` or `configuration/<name>`.
#[derive(Debug, Default)]
pub struct MemberExpectations {
    pending: BTreeMap<(String, String), (MemberChange, Instant)>,
}

impl MemberExpectations {
    /// `owner` changed `machine` at `now`.
    pub fn expect(&mut self, owner: &str, machine: &str, change: MemberChange, now: Instant) {
        self.pending
            .insert((machine.to_owned(), owner.to_owned()), (change, now));
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
                    MemberChange::Joined => owner.strip_prefix("pool/") == seen.pool,
                    MemberChange::Left => owner.strip_prefix("pool/") != seen.pool,
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
}

impl Expectations {
    /// Forgets expectations older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.created_versions.expire(now);
        self.locked_versions.expire(now);
        self.deleted_nodes.expire(now);
        self.members.expire(now);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
