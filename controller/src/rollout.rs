//! Rolling updates, decided: which out-of-date Machines to repave next so that at most
//! `maxUnavailable` of a group are unavailable, and when a batch has failed. The same rules
//! serve a MachinePool ([`crate::pool`]) and a MachineConfiguration whose update strategy is
//! `RollingUpdate` ([`crate::rolling`]).
//!
//! A Machine is **out of date** when the version it records is not the one it resolves to
//! now (a new version, or a pin to an older one: a rollback), and **available** when its
//! phase is Running, its Node is Ready and not cordoned, and no repave is requested or under
//! way. A repave is a request on the Machine ([`crate::repave`]): the Machine reconciler
//! cordons and drains its Node, deletes it, and the agent repaves with the version the
//! Machine resolves to then.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

/// One Machine of a group, as rollout and pool decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// When it was created (the newest is removed first when nothing else decides).
    pub created: Option<Timestamp>,
    /// Being deleted.
    pub deleting: bool,
    /// Records the version it resolves to (or resolves to nothing it could move to).
    pub up_to_date: bool,
    /// The version number it records (older ones are removed first).
    pub version: Option<i64>,
    /// A repave request can act on it now: its Node is the one it recorded, or it has none
    /// (the request makes it record what it resolves to now).
    pub repavable: bool,
    /// Its Node is Ready and it is Running.
    pub ready: bool,
    /// Ready, not cordoned, and no repave requested or under way.
    pub available: bool,
    /// A repave was requested and has not been carried out yet.
    pub repave_requested: bool,
    /// The time of the repave request carried out last, while the Machine has not been
    /// Running since (`unbounded-cloud.io/repaving`).
    pub repaving_since: Option<Timestamp>,
    /// Annotated `unbounded-cloud.io/delete-machine`.
    pub delete_requested: bool,
    /// Unhealthy by the pool's remediation rules: why.
    pub unhealthy: Option<String>,
}

impl Member {
    /// A repave of it is requested or under way (it is out of service because of us).
    pub fn in_repave(&self) -> bool {
        self.repave_requested || self.repaving_since.is_some()
    }
}

/// A count or a percentage of `total` (`"25%"`). Percentages round down, or up with
/// `round_up`; a malformed value (the CRD refuses them) counts as `fallback`.
pub fn scaled(value: Option<&IntOrString>, total: usize, round_up: bool, fallback: usize) -> usize {
    match value {
        None => fallback,
        Some(IntOrString::Int(n)) => usize::try_from(*n).unwrap_or(fallback),
        Some(IntOrString::String(s)) => {
            let Some(percent) = s.strip_suffix('%').and_then(|p| p.parse::<usize>().ok()) else {
                return fallback;
            };
            let product = total.saturating_mul(percent.min(100));
            if round_up {
                product.div_ceil(100)
            } else {
                product / 100
            }
        }
    }
}

/// `maxUnavailable` and `maxSurge` of `total` Machines, as Deployments resolve them:
/// maxUnavailable rounds down and maxSurge up, and when both come to 0, one Machine may be
/// unavailable (a rollout must be able to move).
pub fn unavailable_and_surge(
    max_unavailable: Option<&IntOrString>,
    max_surge: Option<&IntOrString>,
    total: usize,
) -> (usize, usize) {
    let surge = scaled(max_surge, total, true, 0);
    let unavailable = scaled(max_unavailable, total, false, 1);
    if unavailable == 0 && surge == 0 {
        (1, 0)
    } else {
        (unavailable, surge)
    }
}

/// Which Machines to repave now: every out-of-date Machine that is unavailable anyway
/// (repaving it costs no availability), and of the available ones as many as keep at most
/// `max_unavailable` of the group unavailable. Machines being deleted are not in the group;
/// a Machine whose new Node is not recorded yet waits until it is.
pub fn next_batch(members: &[Member], max_unavailable: usize) -> Vec<String> {
    let active: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    let unavailable = active.iter().filter(|m| !m.available).count();
    let mut budget = max_unavailable.saturating_sub(unavailable);
    // A Machine whose last repave did not bring it back may be repaved again (to another
    // target: a rollback); one with a request pending may not.
    let mut candidates: Vec<&&Member> = active
        .iter()
        .filter(|m| !m.up_to_date && !m.repave_requested && m.repavable)
        .collect();
    // Unavailable first (free), then by name, so that batches are predictable.
    candidates.sort_by(|a, b| a.available.cmp(&b.available).then(a.name.cmp(&b.name)));
    let mut batch = Vec::new();
    for m in candidates {
        if !m.available {
            batch.push(m.name.clone());
        } else if budget > 0 {
            budget -= 1;
            batch.push(m.name.clone());
        }
    }
    batch
}

/// The Machines whose repave did not bring them back within `deadline`: they record the
/// version they resolve to (so the repave was to the current target), and have not been
/// Running since a repave requested more than `deadline` ago. A rollback (another target)
/// makes them out of date again, which ends the failure.
pub fn failed_repaves(members: &[Member], deadline: Duration, now: Timestamp) -> Vec<String> {
    members
        .iter()
        .filter(|m| !m.deleting && m.up_to_date && !m.available)
        .filter(|m| {
            m.repaving_since
                .is_some_and(|since| elapsed(since, now) > deadline)
        })
        .map(|m| m.name.clone())
        .collect()
}

/// When the next of the repaves under way passes `deadline` (to look again then).
pub fn next_deadline(members: &[Member], deadline: Duration, now: Timestamp) -> Option<Duration> {
    members
        .iter()
        .filter(|m| !m.deleting && !m.available)
        .filter_map(|m| m.repaving_since)
        .map(|since| deadline.saturating_sub(elapsed(since, now)))
        .filter(|left| !left.is_zero())
        .min()
}

/// Time from `since` to `now` (zero when `since` is in the future).
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// Where a rollout stands, for conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutState {
    /// Every Machine records what it resolves to.
    UpToDate,
    /// Batches are under way.
    RollingOut {
        /// Machines up to date.
        updated: usize,
        /// Machines in the group.
        total: usize,
        /// Machines being repaved now.
        repaving: Vec<String>,
    },
    /// No batch starts: the pool is paused.
    Paused {
        /// Machines out of date.
        outdated: usize,
    },
    /// No batch starts: these repaves did not bring their Machines back in time.
    Failed {
        /// The Machines.
        machines: Vec<String>,
    },
    /// OnDelete: out-of-date Machines wait for their Node to be deleted.
    WaitingForNodeDeletion {
        /// Machines out of date.
        outdated: usize,
    },
}

/// What a rollout is doing, and whether it may start a batch.
pub fn rollout_state(
    members: &[Member],
    rolling: bool,
    paused: bool,
    failed: Vec<String>,
) -> RolloutState {
    let active: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    let outdated = active.iter().filter(|m| !m.up_to_date).count();
    let repaving: Vec<String> = active
        .iter()
        .filter(|m| m.in_repave() && !m.available)
        .map(|m| m.name.clone())
        .collect();
    if outdated == 0 && repaving.is_empty() {
        return RolloutState::UpToDate;
    }
    if !rolling {
        return if outdated == 0 {
            RolloutState::UpToDate
        } else {
            RolloutState::WaitingForNodeDeletion { outdated }
        };
    }
    if !failed.is_empty() {
        return RolloutState::Failed { machines: failed };
    }
    if paused && outdated > 0 {
        return RolloutState::Paused { outdated };
    }
    RolloutState::RollingOut {
        updated: active.len() - outdated,
        total: active.len(),
        repaving,
    }
}

impl RolloutState {
    /// Whether new batches may start.
    pub fn may_start_batches(&self) -> bool {
        matches!(self, Self::RollingOut { .. })
    }
}

/// Names for a message: the first few, then how many more.
pub fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An available, up-to-date Machine with a Node.
    pub(crate) fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            created: None,
            deleting: false,
            up_to_date: true,
            version: Some(2),
            repavable: true,
            ready: true,
            available: true,
            repave_requested: false,
            repaving_since: None,
            delete_requested: false,
            unhealthy: None,
        }
    }

    pub(crate) fn outdated(name: &str) -> Member {
        Member {
            up_to_date: false,
            version: Some(1),
            ..member(name)
        }
    }

    pub(crate) fn unavailable(m: Member) -> Member {
        Member {
            available: false,
            ready: false,
            ..m
        }
    }

    pub(crate) fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn scaled_table() {
        let int = |n| Some(IntOrString::Int(n));
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        let cases = [
            ("absent", None, 10, false, 1),
            ("a number", int(3), 10, false, 3),
            ("25% of 10 rounds down", pct("25%"), 10, false, 2),
            ("25% of 10 rounds up", pct("25%"), 10, true, 3),
            ("0%", pct("0%"), 10, true, 0),
            ("100%", pct("100%"), 7, false, 7),
            ("malformed", pct("lots"), 10, false, 1),
            ("negative", int(-1), 10, false, 1),
        ];
        for (case, value, total, up, expected) in cases {
            assert_eq!(scaled(value.as_ref(), total, up, 1), expected, "{case}");
        }
    }

    #[test]
    fn unavailable_and_surge_table() {
        let int = |n| Some(IntOrString::Int(n));
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        let cases = [
            ("defaults", None, None, 6, (1, 0)),
            (
                "both zero: one may be unavailable",
                int(0),
                int(0),
                6,
                (1, 0),
            ),
            ("surge only", int(0), int(1), 6, (0, 1)),
            ("percentages", pct("25%"), pct("25%"), 6, (1, 2)),
            (
                "10% of 4 rounds to 0 without surge",
                pct("10%"),
                None,
                4,
                (1, 0),
            ),
            ("two", int(2), None, 6, (2, 0)),
        ];
        for (case, u, s, total, expected) in cases {
            assert_eq!(
                unavailable_and_surge(u.as_ref(), s.as_ref(), total),
                expected,
                "{case}"
            );
        }
    }

    /// The batch size of a rollout, table by table.
    #[test]
    fn next_batch_table() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let in_repave = |m: Member| Member {
            repave_requested: true,
            available: false,
            ..m
        };
        let cases: Vec<(&str, Vec<Member>, usize, Vec<String>)> = vec![
            ("all up to date", vec![member("a"), member("b")], 2, vec![]),
            (
                "maxUnavailable 2 of 6 outdated: two at a time, by name",
                (1..=6).map(|i| outdated(&format!("m{i}"))).collect(),
                2,
                names(&["m1", "m2"]),
            ),
            (
                "one repaving already: one more",
                vec![
                    in_repave(outdated("m1")),
                    outdated("m2"),
                    outdated("m3"),
                    outdated("m4"),
                ],
                2,
                names(&["m2"]),
            ),
            (
                "budget used up by an unready up-to-date Machine",
                vec![unavailable(member("m1")), outdated("m2")],
                1,
                vec![],
            ),
            (
                "an unavailable outdated Machine is repaved at no cost",
                vec![unavailable(outdated("m9")), outdated("m1"), outdated("m2")],
                1,
                names(&["m9"]),
            ),
            (
                "both: the free one and one within the budget",
                vec![unavailable(outdated("m9")), outdated("m1"), outdated("m2")],
                2,
                names(&["m9", "m1"]),
            ),
            (
                "a repave that did not come back may be repaved again (rollback)",
                vec![Member {
                    repaving_since: Some(at(0)),
                    ..unavailable(outdated("m1"))
                }],
                1,
                names(&["m1"]),
            ),
            (
                "a Node not recorded yet: the Machine waits",
                vec![Member {
                    repavable: false,
                    ..unavailable(outdated("m1"))
                }],
                1,
                vec![],
            ),
            (
                "Machines being deleted are not in the group",
                vec![
                    Member {
                        deleting: true,
                        ..unavailable(member("gone"))
                    },
                    outdated("m1"),
                ],
                1,
                names(&["m1"]),
            ),
            (
                "maxUnavailable 0 repaves only unavailable ones",
                vec![outdated("m1"), unavailable(outdated("m2"))],
                0,
                names(&["m2"]),
            ),
        ];
        for (case, members, max, expected) in cases {
            assert_eq!(next_batch(&members, max), expected, "{case}");
        }
    }

    #[test]
    fn failed_repaves_and_states() {
        let deadline = Duration::from_secs(600);
        let repaving = |m: Member, since: i64| Member {
            repaving_since: Some(at(since)),
            ..unavailable(m)
        };
        let members = vec![
            repaving(member("late"), 0),
            repaving(member("in-time"), 500),
            // A rollback made it out of date again: not a failure.
            repaving(outdated("rolled-back"), 0),
            outdated("m4"),
        ];
        let failed = failed_repaves(&members, deadline, at(700));
        assert_eq!(failed, vec!["late".to_owned()]);
        assert_eq!(
            next_deadline(&members, deadline, at(700)),
            Some(Duration::from_secs(400))
        );
        assert_eq!(
            rollout_state(&members, true, false, failed.clone()),
            RolloutState::Failed {
                machines: vec!["late".into()]
            }
        );
        assert!(!rollout_state(&members, true, false, failed).may_start_batches());
        assert_eq!(
            rollout_state(&members, true, true, vec![]),
            RolloutState::Paused { outdated: 2 }
        );
        assert_eq!(
            rollout_state(&members, false, false, vec![]),
            RolloutState::WaitingForNodeDeletion { outdated: 2 }
        );
        let rolling = rollout_state(&members, true, false, vec![]);
        assert!(rolling.may_start_batches());
        assert_eq!(
            rolling,
            RolloutState::RollingOut {
                updated: 2,
                total: 4,
                repaving: vec!["late".into(), "in-time".into(), "rolled-back".into()],
            }
        );
        assert_eq!(
            rollout_state(&[member("a")], true, true, vec![]),
            RolloutState::UpToDate
        );
        assert_eq!(some_names(&["a".into(), "b".into()]), "a, b");
        let many: Vec<String> = (0..7).map(|i| format!("m{i}")).collect();
        assert_eq!(some_names(&many), "m0, m1, m2, m3, m4 and 2 more");
    }
}
