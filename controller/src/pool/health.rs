//! Which Machines of a pool are unhealthy (Cluster API's MachineHealthCheck, in the pool),
//! and how many may be remediated now.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::rollout::elapsed;

/// A remediation rule on the Node's Ready condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRule {
    /// `False` or `Unknown`.
    pub status: String,
    /// How long it must hold.
    pub timeout: Duration,
}

/// A pool's remediation rules, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Rules on the Node's Ready condition.
    pub node: Vec<NodeRule>,
    /// How long a Machine may be without a Ready Node after it was created, claimed or
    /// repaved, or after its Node stopped being Ready.
    pub provisioning_timeout: Duration,
}

/// What health is judged from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthFacts {
    /// The Node's Ready condition (`True`, `False`, `Unknown`) and since when, if the Node
    /// exists.
    pub node_ready: Option<(String, Timestamp)>,
    /// The Machine is Running on a Ready Node.
    pub ready: bool,
    /// Since when the Machine has been without a Ready Node at the latest: the latest of its
    /// creation, its claim, its last repave request, and its NodeReady condition turning
    /// False. `None`: its Node stopped being Ready (or went away) after the Machine last
    /// recorded it Ready, so the clock starts now; the Machine's own condition, written
    /// shortly, then dates it.
    pub unready_since: Option<Timestamp>,
}

/// The verdict on one Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Healthy, and stays so while nothing changes.
    Healthy,
    /// Healthy now; unhealthy after this long unless something changes.
    UnhealthyIn(Duration),
    /// Unhealthy: why.
    Unhealthy(String),
}

/// Judges one Machine.
pub fn assess(facts: &HealthFacts, rules: &Rules, now: Timestamp) -> Health {
    if facts.ready {
        return Health::Healthy;
    }
    let unready_since = facts.unready_since.unwrap_or(now);
    let mut soonest: Option<Duration> = None;
    let mut consider = |timeout: Duration, since: Timestamp, why: String| -> Option<Health> {
        let passed = elapsed(since, now);
        if passed >= timeout {
            return Some(Health::Unhealthy(why));
        }
        let left = timeout - passed;
        soonest = Some(soonest.map_or(left, |s| s.min(left)));
        None
    };
    if let Some((status, since)) = &facts.node_ready {
        // A Node that stopped being Ready before a repave or claim is judged from then.
        let since = (*since).max(unready_since);
        for rule in rules.node.iter().filter(|r| &r.status == status) {
            let why = format!(
                "its Node has been Ready={status} for more than {} s",
                rule.timeout.as_secs()
            );
            if let Some(verdict) = consider(rule.timeout, since, why) {
                return verdict;
            }
        }
    }
    let why = format!(
        "it has had no Ready Node for more than {} s",
        rules.provisioning_timeout.as_secs()
    );
    if let Some(verdict) = consider(rules.provisioning_timeout, unready_since, why) {
        return verdict;
    }
    soonest.map_or(Health::Healthy, Health::UnhealthyIn)
}

/// How many Machines may be remediated now. When more are unhealthy than `max_unhealthy`,
/// none (something larger is wrong: a switch, a power feed, a bad version); otherwise as many
/// as keep at most `max_unhealthy` out of service for repairs at once, counting those already
/// being repaved or replaced (`in_flight`).
pub fn remediation_budget(unhealthy: usize, in_flight: usize, max_unhealthy: usize) -> usize {
    if unhealthy > max_unhealthy {
        return 0;
    }
    max_unhealthy.saturating_sub(in_flight).min(unhealthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::tests::at;

    fn rules() -> Rules {
        Rules {
            node: vec![
                NodeRule {
                    status: "False".into(),
                    timeout: Duration::from_secs(300),
                },
                NodeRule {
                    status: "Unknown".into(),
                    timeout: Duration::from_secs(60),
                },
            ],
            provisioning_timeout: Duration::from_secs(1800),
        }
    }

    #[test]
    fn assess_table() {
        let facts = |node: Option<(&str, i64)>, ready: bool, unready_since: i64| HealthFacts {
            node_ready: node.map(|(s, t)| (s.to_owned(), at(t))),
            ready,
            unready_since: Some(at(unready_since)),
        };
        let unrecorded = |node: Option<(&str, i64)>| HealthFacts {
            node_ready: node.map(|(s, t)| (s.to_owned(), at(t))),
            ready: false,
            unready_since: None,
        };
        let cases = [
            (
                "ready",
                facts(Some(("True", 0)), true, 0),
                10_000,
                Health::Healthy,
            ),
            (
                "NotReady for 301 s",
                facts(Some(("False", 0)), false, 0),
                301,
                Health::Unhealthy("its Node has been Ready=False for more than 300 s".into()),
            ),
            (
                "NotReady for 100 s: 200 s to go",
                facts(Some(("False", 0)), false, 0),
                100,
                Health::UnhealthyIn(Duration::from_secs(200)),
            ),
            (
                "Unknown: its own, shorter timeout",
                facts(Some(("Unknown", 0)), false, 0),
                61,
                Health::Unhealthy("its Node has been Ready=Unknown for more than 60 s".into()),
            ),
            (
                "NotReady since before a repave: judged from the repave",
                facts(Some(("False", 0)), false, 200),
                301,
                Health::UnhealthyIn(Duration::from_secs(199)),
            ),
            (
                "no Node, stuck provisioning",
                facts(None, false, 0),
                1801,
                Health::Unhealthy("it has had no Ready Node for more than 1800 s".into()),
            ),
            (
                "no Node yet, in time",
                facts(None, false, 1000),
                1800,
                Health::UnhealthyIn(Duration::from_secs(1000)),
            ),
            (
                "Node deleted, the Machine still records it Ready: the clock starts now",
                unrecorded(None),
                5000,
                Health::UnhealthyIn(Duration::from_secs(1800)),
            ),
            (
                "Node NotReady for long, the Machine still records it Ready: judged from now",
                unrecorded(Some(("False", 0))),
                5000,
                Health::UnhealthyIn(Duration::from_secs(300)),
            ),
        ];
        for (case, facts, now, expected) in cases {
            assert_eq!(assess(&facts, &rules(), at(now)), expected, "{case}");
        }
    }

    /// The remediation budget, table by table.
    #[test]
    fn remediation_budget_table() {
        // (case, unhealthy, in flight, maxUnhealthy, expected)
        let cases = [
            ("none unhealthy", 0, 0, 2, 0),
            ("one of two allowed", 1, 0, 2, 1),
            ("three unhealthy, two allowed at a time", 2, 0, 3, 2),
            ("at the limit", 2, 0, 2, 2),
            ("more than maxUnhealthy: none", 3, 0, 2, 0),
            ("one in flight takes a slot", 2, 1, 2, 1),
            ("slots all in flight", 1, 2, 2, 0),
            ("maxUnhealthy 0 never remediates", 1, 0, 0, 0),
        ];
        for (case, unhealthy, in_flight, max, expected) in cases {
            assert_eq!(
                remediation_budget(unhealthy, in_flight, max),
                expected,
                "{case}"
            );
        }
    }
}
