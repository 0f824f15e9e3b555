//! Statuses this controller wrote over a copy that its cache may still show (Machines, and
//! MachineConfigurations: one record of each kind).
//!
//! A status write is sent over the object as read (its `resourceVersion`): a reconcile
//! that runs again before the watch delivers the write — something else the object
//! depends on changed meanwhile — reads the old copy, decides the same status and sends it
//! again, for the API server to refuse it (409). At a cold start that was one wasted
//! request per Machine now and then, and 71 for 100 configurations. A reconcile that reads
//! a superseded copy now stops there as the 409 would have stopped it (`Waiting`), without
//! the request: the watch's event of the write reconciles the object again.
//!
//! Recorded after the API server accepted the write, and kept when the watch shows the
//! write: a reconcile may have taken the old copy from the cache just before (measured: one
//! taken 1 ms before the watch delivered the write reached its status write 42 ms later).
//! Only the copy the write replaced is superseded, and a cache never goes back to it, so
//! the record can outlive the stale reads; it ends when the object is deleted, or after
//! [`EXPECTATION_TTL`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a write is expected to show in the watches at most.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// By object name: the `resourceVersion`s its last status write replaced, and when.
#[derive(Debug, Default)]
pub struct SupersededCopies {
    by_name: BTreeMap<String, (Vec<String>, Instant)>,
}

impl SupersededCopies {
    /// The status of `name` was written at `now`, replacing its copies at
    /// `resource_versions` (the copy read, and any this reconcile wrote before: a
    /// configuration's `latestVersion`, which the watch may show first).
    pub fn wrote_over(&mut self, name: &str, resource_versions: &[&str], now: Instant) {
        let copies = resource_versions.iter().map(|v| (*v).to_owned()).collect();
        self.by_name.insert(name.to_owned(), (copies, now));
    }

    /// Whether the copy of `name` at `resource_version` is one its status was written over
    /// less than [`EXPECTATION_TTL`] before `now` (after that the write is presumed lost,
    /// and the copy decides again).
    pub fn is_superseded(&self, name: &str, resource_version: &str, now: Instant) -> bool {
        self.by_name.get(name).is_some_and(|(copies, at)| {
            copies.iter().any(|c| c == resource_version)
                && now.saturating_duration_since(*at) < EXPECTATION_TTL
        })
    }

    /// `name` is deleted.
    pub fn forget(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// Forgets records older than [`EXPECTATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.by_name
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < EXPECTATION_TTL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_copy_is_superseded_until_the_next_write_the_deletion_or_the_ttl() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut copies = SupersededCopies::default();
        copies.wrote_over("m1", &["286"], at(0));

        assert!(copies.is_superseded("m1", "286", at(1)));
        assert!(
            !copies.is_superseded("m1", "287", at(1)),
            "the copy the write made"
        );
        assert!(!copies.is_superseded("m2", "286", at(1)), "another Machine");
        assert!(
            !copies.is_superseded("m1", "286", at(1) + EXPECTATION_TTL),
            "presumed lost"
        );

        copies.wrote_over("m1", &["287", "288"], at(3));
        assert!(
            !copies.is_superseded("m1", "286", at(3)),
            "the next write replaces the record"
        );
        assert!(copies.is_superseded("m1", "287", at(3)));
        assert!(
            copies.is_superseded("m1", "288", at(3)),
            "a copy this reconcile wrote before its status"
        );
        assert!(
            !copies.is_superseded("m1", "289", at(3)),
            "the status write's own"
        );
        copies.forget("m1");
        assert!(!copies.is_superseded("m1", "287", at(3)), "deleted");

        copies.wrote_over("m1", &["290"], at(3));
        copies.expire(at(3) + EXPECTATION_TTL);
        assert!(copies.by_name.is_empty());
    }
}
