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

/// The controller's expectations.
#[derive(Debug, Default)]
pub struct Expectations {
    /// Versions created, as `(configuration, version)`.
    pub created_versions: InFlight<(String, i64)>,
    /// Versions marked deployed, by object name.
    pub locked_versions: InFlight<String>,
}

impl Expectations {
    /// Forgets expectations older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.created_versions.expire(now);
        self.locked_versions.expire(now);
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
}
