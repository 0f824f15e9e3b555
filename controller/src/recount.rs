//! When a configuration whose Machines changed is recounted (its version counts and status
//! written): once its Machines have been quiet for a moment, or, while they keep changing,
//! at the latest a while after the first change. While thousands of Machines record their
//! versions, each configuration's counts are then written every `max_wait`, not once per
//! Machine; a single change is counted `quiet` after it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How recounts are batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecountTiming {
    /// A configuration is recounted once no change came for this long…
    pub quiet: Duration,
    /// …or at the latest this long after the first change of the batch.
    pub max_wait: Duration,
}

/// Configurations waiting for a recount: when their batch began and when it last grew.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingRecounts {
    waiting: BTreeMap<String, (Instant, Instant)>,
}

impl PendingRecounts {
    /// A change of `configuration`'s Machines at `now`.
    pub fn mark(&mut self, configuration: String, now: Instant) {
        self.waiting
            .entry(configuration)
            .and_modify(|(_, last)| *last = now)
            .or_insert((now, now));
    }

    /// Several changes at `now`.
    pub fn mark_all(&mut self, configurations: impl IntoIterator<Item = String>, now: Instant) {
        for c in configurations {
            self.mark(c, now);
        }
    }

    /// Takes the configurations due for a recount at `now`.
    pub fn take_due(&mut self, now: Instant, timing: RecountTiming) -> Vec<String> {
        let due: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, (first, last))| {
                now.saturating_duration_since(*last) >= timing.quiet
                    || now.saturating_duration_since(*first) >= timing.max_wait
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &due {
            self.waiting.remove(name);
        }
        due
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_table() {
        let timing = RecountTiming {
            quiet: Duration::from_secs(2),
            max_wait: Duration::from_secs(10),
        };
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // (case, marks of "a" at these seconds, take at, due?)
        let cases: Vec<(&str, Vec<u64>, u64, bool)> = vec![
            ("a single change, not quiet yet", vec![0], 1, false),
            ("a single change, quiet long enough", vec![0], 2, true),
            ("changes keep coming: not quiet", vec![0, 3, 6, 8], 9, false),
            (
                "changes keep coming: the maximum wait",
                vec![0, 3, 6, 8, 9],
                10,
                true,
            ),
            ("quiet after a burst", vec![0, 1, 2], 4, true),
        ];
        for (case, marks, take_at, due) in cases {
            let mut pending = PendingRecounts::default();
            for m in marks {
                pending.mark("a".into(), at(m));
            }
            let taken = pending.take_due(at(take_at), timing);
            assert_eq!(taken == vec!["a".to_owned()], due, "{case}");
            assert_eq!(pending.is_empty(), due, "{case}: taken ones leave");
        }
    }

    #[test]
    fn a_new_batch_starts_after_a_take() {
        let timing = RecountTiming {
            quiet: Duration::from_secs(2),
            max_wait: Duration::from_secs(10),
        };
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut pending = PendingRecounts::default();
        pending.mark_all(["a".to_owned(), "b".to_owned()], at(0));
        pending.mark("b".into(), at(9));
        assert_eq!(pending.take_due(at(10), timing), vec!["a", "b"]);
        pending.mark("b".into(), at(11));
        assert!(
            pending.take_due(at(12), timing).is_empty(),
            "the batch began at 11"
        );
        assert_eq!(pending.take_due(at(13), timing), vec!["b"]);
    }
}
