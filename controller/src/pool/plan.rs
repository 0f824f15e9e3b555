//! What a MachinePool does next, decided from its Machines as plain data: how many Machines
//! to add (create or claim), which to remove (delete or release), which to remediate, and
//! which to repave in the next rollout batch. One pass decides all four over the same facts,
//! so that they never work against each other (a Machine chosen for removal is neither
//! remediated nor repaved; remediations count as unavailable for the rollout).

use std::cmp::Reverse;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::rollout::{self, Member, RolloutState};

/// A pool's rollout settings, resolved against its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rolling {
    /// Machines that may be unavailable at once.
    pub max_unavailable: usize,
    /// Machines that may be created above replicas (pools that create Machines).
    pub max_surge: usize,
    /// How long a repave may take before its batch fails.
    pub progress_deadline: Duration,
}

/// Everything the plan is made from.
#[derive(Debug, Clone)]
pub struct PoolFacts<'a> {
    /// `spec.replicas`.
    pub replicas: usize,
    /// The pool creates its Machines (azure, manual); otherwise it claims them (pxe).
    pub creates: bool,
    /// Its Machines (being deleted included).
    pub members: &'a [Member],
    /// Free inventory Machines it could claim (pxe).
    pub claimable: usize,
    /// RollingUpdate settings; `None` for OnDelete.
    pub rolling: Option<Rolling>,
    /// `spec.paused`.
    pub paused: bool,
    /// `maxUnhealthy` resolved, when remediation is configured.
    pub max_unhealthy: Option<usize>,
    /// Now.
    pub now: Timestamp,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    /// Machines to create (azure, manual) or claim (pxe).
    pub add: usize,
    /// Machines a pxe pool needs but cannot find in the inventory.
    pub short: usize,
    /// Machines to delete (azure, manual) or release (pxe), in order.
    pub remove: Vec<String>,
    /// Unhealthy Machines to remediate: repave (pxe) or delete (azure, manual).
    pub remediate: Vec<String>,
    /// Out-of-date Machines to repave now (the rollout's next batch).
    pub repave: Vec<String>,
    /// Where the rollout stands.
    pub rollout: RolloutState,
    /// Where remediation stands.
    pub health: HealthState,
}

/// Remediation's state, for the MachinesHealthy condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthState {
    /// No Machine is unhealthy (or remediation is not configured).
    Healthy,
    /// These are unhealthy; some may wait for a remediation slot.
    Remediating {
        /// The unhealthy Machines.
        unhealthy: Vec<String>,
    },
    /// More are unhealthy than maxUnhealthy: none is remediated.
    TooManyUnhealthy {
        /// The unhealthy Machines.
        unhealthy: Vec<String>,
        /// maxUnhealthy.
        max: usize,
    },
}

/// The order in which Machines leave a pool that scales down: those annotated
/// `unbounded-cloud.io/delete-machine`, then unhealthy ones (unready ones among them first),
/// then those on an older configuration version (out of date, lowest version first), then the
/// newest; the name decides the rest.
pub fn removal_order(members: &[Member]) -> Vec<String> {
    let mut candidates: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    candidates.sort_by_key(|m| {
        (
            Reverse(m.delete_requested),
            Reverse(m.unhealthy.is_some() || !m.ready),
            Reverse(!m.up_to_date),
            m.version.unwrap_or(i64::MAX),
            Reverse(m.created),
            m.name.clone(),
        )
    });
    candidates.into_iter().map(|m| m.name.clone()).collect()
}

/// Decides the pool's next steps.
pub fn plan_pool(facts: &PoolFacts<'_>) -> PoolPlan {
    let active: Vec<&Member> = facts.members.iter().filter(|m| !m.deleting).collect();
    let outdated = active.iter().filter(|m| !m.up_to_date).count();
    let failed = facts
        .rolling
        .map(|r| rollout::failed_repaves(facts.members, r.progress_deadline, facts.now))
        .unwrap_or_default();
    let rollout =
        rollout::rollout_state(facts.members, facts.rolling.is_some(), facts.paused, failed);
    let surging = facts.creates
        && rollout.may_start_batches()
        && facts.rolling.is_some_and(|r| r.max_surge > 0)
        && outdated > 0;

    // Scale: to replicas, or while surging to replicas plus surge, and during a surge the
    // out-of-date Machines go as availability allows.
    let (add, mut remove) = match facts.rolling.filter(|_| surging) {
        Some(r) => surge_steps(&active, facts.replicas, r),
        None => {
            let add = facts.replicas.saturating_sub(active.len());
            let excess = active.len().saturating_sub(facts.replicas);
            let mut order = removal_order(facts.members);
            order.truncate(excess);
            (add, order)
        }
    };
    let (add, short) = if facts.creates {
        (add, 0)
    } else {
        (
            add.min(facts.claimable),
            add.saturating_sub(facts.claimable),
        )
    };
    remove.dedup();

    // Remediate what stays.
    let staying: Vec<&Member> = active
        .iter()
        .copied()
        .filter(|m| !remove.contains(&m.name))
        .collect();
    // A repave under way restarts the health clock: a Machine is unhealthy again only when
    // its repave did not bring it back in time.
    let unhealthy: Vec<String> = staying
        .iter()
        .filter(|m| m.unhealthy.is_some() && !m.repave_requested)
        .map(|m| m.name.clone())
        .collect();
    let (remediate, health) = match facts.max_unhealthy {
        None => (Vec::new(), HealthState::Healthy),
        Some(_) if unhealthy.is_empty() => (Vec::new(), HealthState::Healthy),
        Some(max) => {
            let in_flight = facts
                .members
                .iter()
                .filter(|m| {
                    m.deleting
                        || m.repave_requested
                        || (m.repaving_since.is_some() && m.unhealthy.is_none())
                })
                .count();
            let budget = crate::pool::health::remediation_budget(unhealthy.len(), in_flight, max);
            let chosen = unhealthy.iter().take(budget).cloned().collect();
            let state = if unhealthy.len() > max {
                HealthState::TooManyUnhealthy { unhealthy, max }
            } else {
                HealthState::Remediating { unhealthy }
            };
            (chosen, state)
        }
    };

    // Repave in place what is out of date (not while surging: surplus Machines replace).
    let repave = match facts.rolling {
        Some(r) if rollout.may_start_batches() && !surging => {
            let group: Vec<Member> = staying
                .iter()
                .map(|m| {
                    if remediate.contains(&m.name) {
                        Member {
                            available: false,
                            repave_requested: true,
                            ..(*m).clone()
                        }
                    } else {
                        (*m).clone()
                    }
                })
                .collect();
            rollout::next_batch(&group, r.max_unavailable)
        }
        _ => Vec::new(),
    };

    PoolPlan {
        add,
        short,
        remove,
        remediate,
        repave,
        rollout,
        health,
    }
}

/// A surge rollout's scale steps: up to `replicas + min(maxSurge, out of date)` Machines,
/// and out-of-date Machines removed while at least `replicas - maxUnavailable` stay
/// available (an unavailable out-of-date Machine costs nothing to remove).
fn surge_steps(active: &[&Member], replicas: usize, rolling: Rolling) -> (usize, Vec<String>) {
    let outdated: Vec<&&Member> = active.iter().filter(|m| !m.up_to_date).collect();
    let want = replicas + rolling.max_surge.min(outdated.len());
    let add = want.saturating_sub(active.len());
    let available = active.iter().filter(|m| m.available).count();
    let min_available = replicas.saturating_sub(rolling.max_unavailable);
    let mut budget = available.saturating_sub(min_available);
    // Never below replicas in number while new Machines are still to come.
    let mut room = (active.len() + add).saturating_sub(replicas);
    let owned: Vec<Member> = outdated.iter().map(|m| (***m).clone()).collect();
    let mut remove = Vec::new();
    for name in removal_order(&owned) {
        if room == 0 {
            break;
        }
        let Some(m) = owned.iter().find(|m| m.name == name) else {
            continue;
        };
        if !m.available {
            remove.push(name);
            room -= 1;
        } else if budget > 0 {
            budget -= 1;
            remove.push(name);
            room -= 1;
        }
    }
    (add, remove)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::tests::{at, member, outdated, unavailable};

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    fn facts(members: &[Member]) -> PoolFacts<'_> {
        PoolFacts {
            replicas: members.iter().filter(|m| !m.deleting).count(),
            creates: true,
            members,
            claimable: 0,
            rolling: Some(Rolling {
                max_unavailable: 1,
                max_surge: 0,
                progress_deadline: Duration::from_secs(600),
            }),
            paused: false,
            max_unhealthy: None,
            now: at(1000),
        }
    }

    /// The choice of Machines to remove, table by table.
    #[test]
    fn removal_order_table() {
        let created = |m: Member, s: i64| Member {
            created: Some(at(s)),
            ..m
        };
        let cases: Vec<(&str, Vec<Member>, Vec<String>)> = vec![
            (
                "the newest first",
                vec![
                    created(member("old"), 0),
                    created(member("new"), 100),
                    created(member("mid"), 50),
                ],
                names(&["new", "mid", "old"]),
            ),
            (
                "annotated delete-machine before all",
                vec![
                    created(unavailable(outdated("sick")), 100),
                    Member {
                        delete_requested: true,
                        ..created(member("chosen"), 0)
                    },
                ],
                names(&["chosen", "sick"]),
            ),
            (
                "unhealthy before out of date",
                vec![
                    created(outdated("stale"), 100),
                    Member {
                        unhealthy: Some("no Node".into()),
                        ..created(member("sick"), 0)
                    },
                ],
                names(&["sick", "stale"]),
            ),
            (
                "older version before newer, before the newest Machine",
                vec![
                    created(member("fresh"), 200),
                    Member {
                        version: Some(3),
                        ..created(outdated("v3"), 0)
                    },
                    created(outdated("v1"), 0),
                ],
                names(&["v1", "v3", "fresh"]),
            ),
            (
                "Machines being deleted are not chosen again",
                vec![
                    Member {
                        deleting: true,
                        ..member("going")
                    },
                    member("a"),
                ],
                names(&["a"]),
            ),
        ];
        for (case, members, expected) in cases {
            assert_eq!(removal_order(&members), expected, "{case}");
        }
    }

    #[test]
    fn scale_table() {
        let three = vec![member("a"), member("b"), member("c")];
        let plan = plan_pool(&PoolFacts {
            replicas: 5,
            ..facts(&three)
        });
        assert_eq!((plan.add, plan.short), (2, 0), "create two");
        let plan = plan_pool(&PoolFacts {
            replicas: 5,
            creates: false,
            claimable: 1,
            ..facts(&three)
        });
        assert_eq!(
            (plan.add, plan.short),
            (1, 1),
            "claim the one free, one short"
        );
        let annotated = vec![
            member("a"),
            Member {
                delete_requested: true,
                ..member("b")
            },
            member("c"),
        ];
        let plan = plan_pool(&PoolFacts {
            replicas: 2,
            ..facts(&annotated)
        });
        assert_eq!(plan.remove, names(&["b"]));
        let plan = plan_pool(&PoolFacts {
            replicas: 0,
            ..facts(&three)
        });
        assert_eq!(plan.remove.len(), 3, "scale to zero");
    }

    #[test]
    fn remediation_and_rollout_share_the_budget() {
        let sick = |name: &str| Member {
            unhealthy: Some("no Node".into()),
            ..unavailable(member(name))
        };
        let members = vec![sick("s1"), outdated("o1"), outdated("o2"), member("ok")];
        let plan = plan_pool(&PoolFacts {
            max_unhealthy: Some(1),
            ..facts(&members)
        });
        assert_eq!(plan.remediate, names(&["s1"]));
        assert!(
            plan.repave.is_empty(),
            "the remediation holds the one unavailable slot: {:?}",
            plan.repave
        );
        assert_eq!(
            plan.health,
            HealthState::Remediating {
                unhealthy: names(&["s1"])
            }
        );

        let members = vec![sick("s1"), sick("s2"), member("ok")];
        let plan = plan_pool(&PoolFacts {
            max_unhealthy: Some(1),
            ..facts(&members)
        });
        assert!(plan.remediate.is_empty(), "beyond maxUnhealthy");
        assert!(matches!(
            plan.health,
            HealthState::TooManyUnhealthy { max: 1, .. }
        ));

        // A Machine being removed is not remediated.
        let members = vec![sick("s1"), member("ok")];
        let plan = plan_pool(&PoolFacts {
            replicas: 1,
            max_unhealthy: Some(1),
            ..facts(&members)
        });
        assert_eq!(plan.remove, names(&["s1"]));
        assert!(plan.remediate.is_empty());
    }

    #[test]
    fn rollout_in_place_paused_and_failed() {
        let members: Vec<Member> = (1..=6).map(|i| outdated(&format!("m{i}"))).collect();
        let plan = plan_pool(&PoolFacts {
            rolling: Some(Rolling {
                max_unavailable: 2,
                max_surge: 0,
                progress_deadline: Duration::from_secs(600),
            }),
            ..facts(&members)
        });
        assert_eq!(plan.repave, names(&["m1", "m2"]));
        let plan = plan_pool(&PoolFacts {
            paused: true,
            ..facts(&members)
        });
        assert!(plan.repave.is_empty());
        assert_eq!(plan.rollout, RolloutState::Paused { outdated: 6 });
        let plan = plan_pool(&PoolFacts {
            rolling: None,
            ..facts(&members)
        });
        assert!(plan.repave.is_empty());
        assert_eq!(
            plan.rollout,
            RolloutState::WaitingForNodeDeletion { outdated: 6 }
        );

        let mut members = members;
        members[0] = Member {
            repaving_since: Some(at(0)),
            ..unavailable(member("m1"))
        };
        let plan = plan_pool(&facts(&members));
        assert!(plan.repave.is_empty(), "a failed batch pauses the rollout");
        assert_eq!(
            plan.rollout,
            RolloutState::Failed {
                machines: names(&["m1"])
            }
        );
    }

    #[test]
    fn surge_replaces_instead_of_repaving() {
        let rolling = Some(Rolling {
            max_unavailable: 0,
            max_surge: 1,
            progress_deadline: Duration::from_secs(600),
        });
        let members = vec![outdated("o1"), outdated("o2"), outdated("o3")];
        let plan = plan_pool(&PoolFacts {
            rolling,
            ..facts(&members)
        });
        assert_eq!((plan.add, plan.remove.clone()), (1, vec![]), "surge one");
        assert!(plan.repave.is_empty());

        // The new one is available: one old one may go.
        let mut members = members;
        members.push(member("n1"));
        let plan = plan_pool(&PoolFacts {
            replicas: 3,
            rolling,
            ..facts(&members)
        });
        assert_eq!(plan.add, 0);
        assert_eq!(plan.remove, names(&["o1"]));

        // The new one is not available yet: nothing goes.
        let last = members.len() - 1;
        members[last] = unavailable(member("n1"));
        let plan = plan_pool(&PoolFacts {
            replicas: 3,
            rolling,
            ..facts(&members)
        });
        assert_eq!((plan.add, plan.remove.len()), (0, 0));
    }
}
