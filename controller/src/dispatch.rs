//! The MachineOperation state machine, as pure decisions over plain data: what the controller
//! does next with one single-machine operation ([`plan_single`]) or one selector operation
//! ([`plan_parent`]). The reconciler in [`crate::operation`] gathers the facts and acts.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use unbounded_api::well_known::operations;
use unbounded_api::{ChildCounts, HandlerKind, MachineProvider, OperationState};

/// What the controller knows about an operation's own timing and state.
#[derive(Debug, Clone, PartialEq)]
pub struct Clock {
    /// Now.
    pub now: Timestamp,
    /// When the operation was created.
    pub created: Timestamp,
    /// `status.state`.
    pub state: Option<OperationState>,
    /// `status.completionTime`.
    pub completed: Option<Timestamp>,
    /// `spec.ttlSecondsAfterFinished`.
    pub ttl_seconds: Option<i64>,
}

/// The target Machine of a single-machine operation, as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetMachine {
    /// `spec.provider`.
    pub provider: MachineProvider,
    /// Whether the Machine is being deleted.
    pub deleting: bool,
}

/// Facts about one single-machine operation.
#[derive(Debug, Clone, PartialEq)]
pub struct SingleFacts<'a> {
    /// Timing and state.
    pub clock: Clock,
    /// `spec.operationName`.
    pub operation_name: &'a str,
    /// `spec.machineRef.name`.
    pub machine_name: &'a str,
    /// The Machine, or `None` when it does not exist.
    pub machine: Option<TargetMachine>,
    /// `spec.activeDeadlineSeconds` with its default.
    pub deadline_seconds: i64,
    /// `status.routedTo`.
    pub routed_to: Option<HandlerKind>,
    /// `status.handler`: who claimed it.
    pub handler: Option<&'a str>,
    /// The earliest unfinished operation on the same Machine created before this one.
    pub blocked_by: Option<&'a str>,
    /// The single-machine operation on the same Machine that created this one and owns it
    /// (an `applyConfiguration`'s `applyFiles`): it is part of that operation, which holds
    /// the Machine's turn, so it is never queued behind anything.
    pub part_of: Option<&'a str>,
}

/// What to do with a single-machine operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinglePlan {
    /// Nothing to write; look again after the duration (deadline, TTL) if any.
    Wait(Option<Duration>),
    /// Its turn has come: `Pending`, routed to the handler kind.
    Route {
        /// Who may claim it.
        to: HandlerKind,
        /// For a person.
        message: String,
        /// When the deadline falls.
        requeue: Duration,
    },
    /// An earlier operation on the same Machine runs first: `Pending`, not routed.
    Queue {
        /// For a person.
        message: String,
        /// When the deadline falls.
        requeue: Duration,
    },
    /// An operation the controller runs itself (`applyConfiguration`, [`crate::apply`]):
    /// its turn has come, run (or resume) it now.
    RunHere {
        /// When the deadline falls.
        requeue: Duration,
    },
    /// It cannot or did not succeed: `Failed` with the message.
    Fail(String),
    /// Finished longer ago than its TTL: delete it.
    Delete,
}

/// What to do with a selector operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentPlan {
    /// Nothing to write; look again after the duration if any.
    Wait(Option<Duration>),
    /// Create children for these Machines (the fan-out, before the first count is recorded).
    CreateChildren(Vec<String>),
    /// Record this state, message and counts.
    Report {
        /// The aggregate state.
        state: OperationState,
        /// For a person.
        message: String,
        /// The counts.
        counts: ChildCounts,
    },
    /// Finished longer ago than its TTL: delete it (its children go with it).
    Delete,
}

fn seconds(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// Time left until `created + seconds`, or `None` when it has passed.
fn remaining(clock: &Clock, from: Timestamp, after_seconds: i64) -> Option<Duration> {
    let elapsed = clock.now.as_second() - from.as_second();
    let left = after_seconds - elapsed;
    (left > 0).then(|| seconds(left))
}

/// A finished operation waits for its TTL, then goes.
fn after_finish(clock: &Clock) -> Option<bool> {
    if !clock.state.is_some_and(OperationState::is_finished) {
        return None;
    }
    Some(match clock.ttl_seconds {
        None => false,
        Some(ttl) => remaining(clock, clock.completed.unwrap_or(clock.now), ttl).is_none(),
    })
}

fn ttl_wait(clock: &Clock) -> Option<Duration> {
    let ttl = clock.ttl_seconds?;
    remaining(clock, clock.completed.unwrap_or(clock.now), ttl)
        // A second of slack so that the requeue lands after the deadline, not just before.
        .map(|d| d + Duration::from_secs(1))
}

fn who(kind: HandlerKind, machine: &str, provider: MachineProvider) -> String {
    match kind {
        HandlerKind::Agent => format!("the agent of Machine {machine}"),
        HandlerKind::Provider => format!("the {} provider", provider.as_str()),
    }
}

/// Decides the next step for a single-machine operation.
pub fn plan_single(facts: &SingleFacts<'_>) -> SinglePlan {
    let clock = &facts.clock;
    if let Some(expired) = after_finish(clock) {
        return if expired {
            SinglePlan::Delete
        } else {
            SinglePlan::Wait(ttl_wait(clock))
        };
    }
    let in_progress = clock.state == Some(OperationState::InProgress);
    let Some(machine) = facts.machine else {
        return SinglePlan::Fail(if in_progress {
            format!(
                "Machine {} was deleted while the operation ran",
                facts.machine_name
            )
        } else {
            format!("Machine {} does not exist", facts.machine_name)
        });
    };
    if facts.operation_name == operations::APPLY_FILES && facts.part_of.is_none() {
        return SinglePlan::Fail(format!(
            "{} is the agent's part of an {} and is created by it; create an {} operation instead",
            operations::APPLY_FILES,
            operations::APPLY_CONFIGURATION,
            operations::APPLY_CONFIGURATION
        ));
    }
    // Part of a running operation: that one holds the Machine's turn.
    let blocked_by = facts.blocked_by.filter(|_| facts.part_of.is_none());
    let runs_here = operations::CONTROLLER.contains(&facts.operation_name);
    let routed = operations::route(machine.provider, facts.operation_name);
    let Some(kind) = routed.or(runs_here.then_some(HandlerKind::Agent)) else {
        return SinglePlan::Fail(format!(
            "no handler runs operation '{}' on a {} Machine; known operations: {}",
            facts.operation_name,
            machine.provider.as_str(),
            operations::known(machine.provider).join(", "),
        ));
    };
    let Some(left) = remaining(clock, clock.created, facts.deadline_seconds) else {
        return SinglePlan::Fail(if in_progress {
            format!(
                "the operation did not finish within activeDeadlineSeconds ({}s){}",
                facts.deadline_seconds,
                facts
                    .handler
                    .map(|h| format!("; {h} was running it"))
                    .unwrap_or_default()
            )
        } else {
            format!(
                "no handler claimed the operation within activeDeadlineSeconds ({}s): is {} running?",
                facts.deadline_seconds,
                who(kind, facts.machine_name, machine.provider)
            )
        });
    };
    // A little slack, so that the deadline has passed when the requeue fires.
    let requeue = left + Duration::from_secs(1);
    if runs_here {
        if in_progress {
            return SinglePlan::RunHere { requeue };
        }
        if machine.deleting {
            return SinglePlan::Fail(format!("Machine {} is being deleted", facts.machine_name));
        }
        if let Some(earlier) = blocked_by {
            return SinglePlan::Queue {
                message: format!(
                    "waiting for operation {earlier} on Machine {} to finish",
                    facts.machine_name
                ),
                requeue,
            };
        }
        return SinglePlan::RunHere { requeue };
    }
    if in_progress || facts.routed_to.is_some() {
        return SinglePlan::Wait(Some(requeue));
    }
    if machine.deleting {
        return SinglePlan::Fail(format!("Machine {} is being deleted", facts.machine_name));
    }
    if let Some(earlier) = blocked_by {
        return SinglePlan::Queue {
            message: format!(
                "waiting for operation {earlier} on Machine {} to finish",
                facts.machine_name
            ),
            requeue,
        };
    }
    SinglePlan::Route {
        to: kind,
        message: format!(
            "waiting for {} to claim it",
            who(kind, facts.machine_name, machine.provider)
        ),
        requeue,
    }
}

/// A child of a selector operation: the Machine it targets and its state.
#[derive(Debug, Clone, PartialEq)]
pub struct Child<'a> {
    /// The target Machine.
    pub machine: &'a str,
    /// The child's name.
    pub name: &'a str,
    /// `status.state`.
    pub state: Option<OperationState>,
    /// `status.message`.
    pub message: Option<&'a str>,
}

/// Facts about one selector operation.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentFacts<'a> {
    /// Timing and state.
    pub clock: Clock,
    /// The Machines the selector matches now (sorted); used only before the fan-out.
    pub matched: Vec<&'a str>,
    /// `status.children.total`, once recorded: the fan-out is done and fixed.
    pub recorded_total: Option<i64>,
    /// The existing children.
    pub children: Vec<Child<'a>>,
    /// The current `status.message`, so that an unchanged report writes nothing.
    pub message: Option<&'a str>,
    /// The current `status.children`.
    pub counts: Option<&'a ChildCounts>,
}

/// How many failed children a message names before it says "and N more".
const NAMED_FAILURES: usize = 3;

/// Decides the next step for a selector operation.
pub fn plan_parent(facts: &ParentFacts<'_>) -> ParentPlan {
    let clock = &facts.clock;
    if let Some(expired) = after_finish(clock) {
        return if expired {
            ParentPlan::Delete
        } else {
            ParentPlan::Wait(ttl_wait(clock))
        };
    }
    if facts.recorded_total.is_none() {
        if facts.matched.is_empty() && facts.children.is_empty() {
            return ParentPlan::Report {
                state: OperationState::Complete,
                message: "the selector matched no Machine; nothing to do".into(),
                counts: ChildCounts::default(),
            };
        }
        let missing: Vec<String> = facts
            .matched
            .iter()
            .filter(|m| !facts.children.iter().any(|c| c.machine == **m))
            .map(|m| (*m).to_owned())
            .collect();
        if !missing.is_empty() {
            return ParentPlan::CreateChildren(missing);
        }
    }
    let counts = count(facts);
    let (state, message) = aggregate(&counts, &facts.children);
    let unchanged = facts.clock.state == Some(state)
        && facts.message == Some(message.as_str())
        && facts.counts == Some(&counts);
    if unchanged {
        return ParentPlan::Wait(None);
    }
    ParentPlan::Report {
        state,
        message,
        counts,
    }
}

fn count(facts: &ParentFacts<'_>) -> ChildCounts {
    let existing = i64::try_from(facts.children.len()).unwrap_or(i64::MAX);
    let total = facts.recorded_total.unwrap_or(existing).max(existing);
    let mut counts = ChildCounts {
        total,
        ..ChildCounts::default()
    };
    for child in &facts.children {
        match child.state {
            None | Some(OperationState::Pending) => counts.pending += 1,
            Some(OperationState::InProgress) => counts.active += 1,
            Some(OperationState::Complete) => counts.complete += 1,
            Some(OperationState::Failed) => counts.failed += 1,
        }
    }
    // A child deleted before its parent finished never reports: it counts as failed.
    counts.failed += total - existing;
    counts
}

fn aggregate(counts: &ChildCounts, children: &[Child<'_>]) -> (OperationState, String) {
    let total = counts.total;
    if counts.complete == total {
        return (
            OperationState::Complete,
            format!("all {total} operations completed"),
        );
    }
    if counts.pending + counts.active == 0 {
        let mut failed: Vec<String> = children
            .iter()
            .filter(|c| c.state == Some(OperationState::Failed))
            .take(NAMED_FAILURES)
            .map(|c| match c.message {
                Some(m) => format!("{} ({m})", c.name),
                None => c.name.to_owned(),
            })
            .collect();
        let named = i64::try_from(failed.len()).unwrap_or(0);
        if counts.failed > named {
            failed.push(format!("and {} more", counts.failed - named));
        }
        return (
            OperationState::Failed,
            format!(
                "{} of {total} operations failed: {}",
                counts.failed,
                failed.join("; ")
            ),
        );
    }
    let started = counts.active + counts.complete + counts.failed > 0;
    let state = if started {
        OperationState::InProgress
    } else {
        OperationState::Pending
    };
    (
        state,
        format!(
            "{} pending, {} running, {} complete, {} failed of {total}",
            counts.pending, counts.active, counts.complete, counts.failed
        ),
    )
}

/// The name of the child of `parent` for `machine`: `<parent>-<machine>`, shortened with a
/// hash when that would exceed the 253 characters of an object name.
pub fn child_name(parent: &str, machine: &str) -> String {
    const MAX: usize = 253;
    let full = format!("{parent}-{machine}");
    if full.len() <= MAX {
        return full;
    }
    // FNV-1a: stable across releases, unlike the standard library's hasher.
    let hash = machine.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!("-{hash:016x}");
    let keep = MAX - suffix.len();
    let mut short = full;
    // Names are ASCII (DNS subdomains), so any byte index is a character boundary.
    short.truncate(keep);
    let short = short.trim_end_matches(['-', '.']).to_owned();
    format!("{short}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn clock(now: i64, state: Option<OperationState>) -> Clock {
        Clock {
            now: ts(now),
            created: ts(0),
            state,
            completed: None,
            ttl_seconds: None,
        }
    }

    fn single(now: i64, state: Option<OperationState>) -> SingleFacts<'static> {
        SingleFacts {
            clock: clock(now, state),
            operation_name: "powerCycle",
            machine_name: "m1",
            machine: Some(TargetMachine {
                provider: MachineProvider::Pxe,
                deleting: false,
            }),
            deadline_seconds: 60,
            routed_to: None,
            handler: None,
            blocked_by: None,
            part_of: None,
        }
    }

    #[test]
    fn single_operation_table() {
        use HandlerKind::{Agent, Provider};
        use OperationState::*;
        let fail = |s: &str| SinglePlan::Fail(s.to_owned());
        let route = |to, message: &str, requeue| SinglePlan::Route {
            to,
            message: message.to_owned(),
            requeue: Duration::from_secs(requeue),
        };
        let mut cases: Vec<(&str, SingleFacts<'static>, SinglePlan)> = Vec::new();

        cases.push((
            "new power operation goes to the provider",
            single(10, None),
            route(Provider, "waiting for the pxe provider to claim it", 51),
        ));
        let mut f = single(0, Some(Pending));
        f.operation_name = "reboot";
        cases.push((
            "reboot goes to the agent",
            f,
            route(Agent, "waiting for the agent of Machine m1 to claim it", 61),
        ));
        let mut f = single(10, None);
        f.blocked_by = Some("earlier");
        cases.push((
            "an earlier operation runs first",
            f,
            SinglePlan::Queue {
                message: "waiting for operation earlier on Machine m1 to finish".into(),
                requeue: Duration::from_secs(51),
            },
        ));
        let mut f = single(10, Some(Pending));
        f.routed_to = Some(Provider);
        cases.push((
            "routed and unclaimed waits for the deadline",
            f,
            SinglePlan::Wait(Some(Duration::from_secs(51))),
        ));
        let mut f = single(60, Some(Pending));
        f.routed_to = Some(Provider);
        cases.push((
            "nobody claimed it by the deadline",
            f,
            fail("no handler claimed the operation within activeDeadlineSeconds (60s): is the pxe provider running?"),
        ));
        let mut f = single(61, Some(InProgress));
        f.handler = Some("unbounded-pxe-provider");
        cases.push((
            "running past the deadline",
            f,
            fail("the operation did not finish within activeDeadlineSeconds (60s); unbounded-pxe-provider was running it"),
        ));
        let mut f = single(10, None);
        f.operation_name = "applyConfiguration";
        cases.push((
            "applyConfiguration runs in the controller",
            f,
            SinglePlan::RunHere {
                requeue: Duration::from_secs(51),
            },
        ));
        let mut f = single(10, Some(Pending));
        f.operation_name = "applyConfiguration";
        f.blocked_by = Some("earlier");
        cases.push((
            "applyConfiguration waits its turn too",
            f,
            SinglePlan::Queue {
                message: "waiting for operation earlier on Machine m1 to finish".into(),
                requeue: Duration::from_secs(51),
            },
        ));
        let mut f = single(10, None);
        f.operation_name = "applyFiles";
        f.blocked_by = Some("m1-apply-v2");
        f.part_of = Some("m1-apply-v2");
        cases.push((
            "applyFiles, part of the running applyConfiguration, goes to the agent at once",
            f,
            route(Agent, "waiting for the agent of Machine m1 to claim it", 51),
        ));
        let mut f = single(10, None);
        f.operation_name = "applyFiles";
        cases.push((
            "applyFiles created by a person is refused",
            f,
            fail("applyFiles is the agent's part of an applyConfiguration and is created by it; create an applyConfiguration operation instead"),
        ));
        let mut f = single(61, Some(InProgress));
        f.operation_name = "applyConfiguration";
        f.handler = Some("unbounded-controller");
        cases.push((
            "applyConfiguration past its deadline fails",
            f,
            fail("the operation did not finish within activeDeadlineSeconds (60s); unbounded-controller was running it"),
        ));
        let mut f = single(1, None);
        f.machine = None;
        cases.push(("missing machine", f, fail("Machine m1 does not exist")));
        let mut f = single(1, Some(InProgress));
        f.machine = None;
        cases.push((
            "machine deleted while running",
            f,
            fail("Machine m1 was deleted while the operation ran"),
        ));
        let mut f = single(1, None);
        f.machine = Some(TargetMachine {
            provider: MachineProvider::Pxe,
            deleting: true,
        });
        cases.push((
            "machine being deleted",
            f,
            fail("Machine m1 is being deleted"),
        ));
        let mut f = single(1, None);
        f.operation_name = "selfDestruct";
        cases.push((
            "unknown name",
            f,
            fail("no handler runs operation 'selfDestruct' on a pxe Machine; known operations: reboot, shutdown, restartService, applyConfiguration, powerOn, powerOff, powerCycle, pxeBoot"),
        ));
        let mut f = single(1, None);
        f.machine = Some(TargetMachine {
            provider: MachineProvider::Manual,
            deleting: false,
        });
        cases.push((
            "power on a manual machine",
            f,
            fail("no handler runs operation 'powerCycle' on a manual Machine; known operations: reboot, shutdown, restartService, applyConfiguration"),
        ));
        let mut f = single(100, Some(Complete));
        f.clock.completed = Some(ts(90));
        cases.push(("finished without TTL stays", f, SinglePlan::Wait(None)));
        let mut f = single(100, Some(Failed));
        f.clock.completed = Some(ts(90));
        f.clock.ttl_seconds = Some(30);
        cases.push((
            "finished within TTL waits",
            f,
            SinglePlan::Wait(Some(Duration::from_secs(21))),
        ));
        let mut f = single(120, Some(Complete));
        f.clock.completed = Some(ts(90));
        f.clock.ttl_seconds = Some(30);
        cases.push(("TTL passed", f, SinglePlan::Delete));
        let mut f = single(120, Some(Complete));
        f.machine = None;
        f.clock.completed = Some(ts(90));
        cases.push((
            "finished operation of a deleted machine is left alone",
            f,
            SinglePlan::Wait(None),
        ));

        for (case, facts, expected) in cases {
            assert_eq!(plan_single(&facts), expected, "{case}");
        }
    }

    fn parent(now: i64) -> ParentFacts<'static> {
        ParentFacts {
            clock: clock(now, None),
            matched: vec![],
            recorded_total: None,
            children: vec![],
            message: None,
            counts: None,
        }
    }

    fn child(machine: &'static str, state: Option<OperationState>) -> Child<'static> {
        Child {
            machine,
            name: machine,
            state,
            message: if state == Some(OperationState::Failed) {
                Some("BMC unreachable")
            } else {
                None
            },
        }
    }

    #[test]
    fn parent_operation_table() {
        use OperationState::*;
        let counts = |total, pending, active, complete, failed| ChildCounts {
            total,
            pending,
            active,
            complete,
            failed,
        };
        let report = |state, message: &str, counts| ParentPlan::Report {
            state,
            message: message.to_owned(),
            counts,
        };
        let mut cases: Vec<(&str, ParentFacts<'static>, ParentPlan)> = Vec::new();

        cases.push((
            "matches nothing",
            parent(0),
            report(
                Complete,
                "the selector matched no Machine; nothing to do",
                counts(0, 0, 0, 0, 0),
            ),
        ));
        let mut f = parent(0);
        f.matched = vec!["a", "b", "c"];
        f.children = vec![child("b", None)];
        cases.push((
            "fan-out creates the missing children",
            f,
            ParentPlan::CreateChildren(vec!["a".into(), "c".into()]),
        ));
        let mut f = parent(0);
        f.matched = vec!["a", "b"];
        f.children = vec![child("a", None), child("b", Some(Pending))];
        cases.push((
            "all children exist: first report fixes the total",
            f,
            report(
                Pending,
                "2 pending, 0 running, 0 complete, 0 failed of 2",
                counts(2, 2, 0, 0, 0),
            ),
        ));
        let mut f = parent(0);
        f.recorded_total = Some(2);
        f.matched = vec!["a", "b", "late"];
        f.children = vec![child("a", Some(InProgress)), child("b", Some(Complete))];
        cases.push((
            "machines labelled after the fan-out are not added",
            f,
            report(
                InProgress,
                "0 pending, 1 running, 1 complete, 0 failed of 2",
                counts(2, 0, 1, 1, 0),
            ),
        ));
        let mut f = parent(0);
        f.recorded_total = Some(2);
        f.children = vec![child("a", Some(Complete)), child("b", Some(Complete))];
        cases.push((
            "all complete",
            f,
            report(
                Complete,
                "all 2 operations completed",
                counts(2, 0, 0, 2, 0),
            ),
        ));
        let mut f = parent(0);
        f.recorded_total = Some(3);
        f.children = vec![
            child("a", Some(Complete)),
            child("b", Some(Failed)),
            child("c", Some(InProgress)),
        ];
        cases.push((
            "a failure while others still run keeps it in progress",
            f,
            report(
                InProgress,
                "0 pending, 1 running, 1 complete, 1 failed of 3",
                counts(3, 0, 1, 1, 1),
            ),
        ));
        let mut f = parent(0);
        f.recorded_total = Some(6);
        f.children = vec![
            child("a", Some(Complete)),
            child("b", Some(Failed)),
            child("c", Some(Failed)),
            child("d", Some(Failed)),
            child("e", Some(Failed)),
        ];
        cases.push((
            "failed once nothing runs; a vanished child counts as failed",
            f,
            report(
                Failed,
                "5 of 6 operations failed: b (BMC unreachable); c (BMC unreachable); d (BMC unreachable); and 2 more",
                counts(6, 0, 0, 1, 5),
            ),
        ));
        let mut f = parent(0);
        f.recorded_total = Some(1);
        f.clock.state = Some(Pending);
        f.children = vec![child("a", Some(Pending))];
        f.message = Some("1 pending, 0 running, 0 complete, 0 failed of 1");
        let same = counts(1, 1, 0, 0, 0);
        f.counts = Some(Box::leak(Box::new(same)));
        cases.push(("unchanged writes nothing", f, ParentPlan::Wait(None)));
        let mut f = parent(200);
        f.clock.state = Some(Complete);
        f.clock.completed = Some(ts(100));
        f.clock.ttl_seconds = Some(100);
        cases.push(("TTL passed", f, ParentPlan::Delete));

        for (case, facts, expected) in cases {
            assert_eq!(plan_parent(&facts), expected, "{case}");
        }
    }

    #[test]
    fn child_names() {
        assert_eq!(child_name("cycle", "m1"), "cycle-m1");
        let long = "m".repeat(250);
        let name = child_name("cycle", &long);
        assert_eq!(name.len(), 253);
        assert_ne!(name, child_name("cycle", &"m".repeat(249)));
        assert_eq!(name, child_name("cycle", &long), "stable");
    }
}
