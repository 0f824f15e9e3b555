//! The live progress line of a verb: where each machine's operation or repave is, counted
//! into one line, and whether everything is finished. Pure: [`operation_stage`] and
//! [`repave_stage`] read one object, [`Progress`] counts.

use std::collections::BTreeMap;

use kube::ResourceExt;
use unbounded_api::well_known::annotations;
use unbounded_api::{Machine, MachineOperation, MachinePhase, OperationState};

use crate::render::short_duration;

/// Where one machine's part of a verb is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Waiting (an operation not yet claimed; a repave not yet taken up).
    Pending,
    /// Under way (an operation claimed; a Node being drained or the machine repaved).
    Running,
    /// Done.
    Done,
    /// Failed, with the reason.
    Failed(String),
}

impl Stage {
    /// Whether nothing more will happen.
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::Done | Self::Failed(_))
    }
}

/// The stage of a MachineOperation.
pub fn operation_stage(operation: &MachineOperation) -> Stage {
    let status = operation.status.as_ref();
    match status.and_then(|s| s.state) {
        None | Some(OperationState::Pending) => Stage::Pending,
        Some(OperationState::InProgress) => Stage::Running,
        Some(OperationState::Complete) => Stage::Done,
        Some(OperationState::Failed) => Stage::Failed(
            status
                .and_then(|s| s.message.clone())
                .unwrap_or_else(|| "failed".to_owned()),
        ),
    }
}

/// The stage of a repave requested at `requested_at` (and of a rollback to `version`): the
/// request is pending while the annotation still holds it, running while the controller
/// marks the machine as repaving, done once the machine is Running again without either
/// (on `version`, for a rollback).
pub fn repave_stage(machine: &Machine, requested_at: &str, version: Option<i64>) -> Stage {
    let a = machine.annotations();
    let status = machine.status.as_ref();
    if status.and_then(|s| s.phase) == Some(MachinePhase::Failed) {
        return Stage::Failed(
            status
                .and_then(|s| s.failure_message.clone().or(s.failure_reason.clone()))
                .unwrap_or_else(|| "the Machine failed".to_owned()),
        );
    }
    if a.get(annotations::REPAVE).map(String::as_str) == Some(requested_at) {
        return Stage::Pending;
    }
    if a.contains_key(annotations::REPAVE) || a.contains_key(annotations::REPAVING) {
        return Stage::Running;
    }
    let running = status.and_then(|s| s.phase) == Some(MachinePhase::Running);
    let on_version = version.is_none_or(|v| {
        status
            .and_then(|s| s.configuration.as_ref())
            .is_some_and(|c| c.version == v)
    });
    if running && on_version {
        Stage::Done
    } else {
        Stage::Running
    }
}

/// Every machine's stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Machine → stage.
    pub stages: BTreeMap<String, Stage>,
}

impl Progress {
    /// Starts with every machine pending.
    pub fn new<'a>(machines: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            stages: machines
                .into_iter()
                .map(|m| (m.to_owned(), Stage::Pending))
                .collect(),
        }
    }

    /// Records a machine's stage (a finished stage is kept: it does not go back).
    pub fn update(&mut self, machine: &str, stage: Stage) {
        if let Some(current) = self.stages.get_mut(machine)
            && !current.is_finished()
        {
            *current = stage;
        }
    }

    /// Whether every machine is finished.
    pub fn finished(&self) -> bool {
        self.stages.values().all(Stage::is_finished)
    }

    /// The machines that failed, with why.
    pub fn failures(&self) -> Vec<(&str, &str)> {
        self.stages
            .iter()
            .filter_map(|(m, s)| match s {
                Stage::Failed(why) => Some((m.as_str(), why.as_str())),
                _ => None,
            })
            .collect()
    }

    /// `reboot: 3/5 done, 1 failed, 1 running · 42s`.
    pub fn line(&self, verb: &str, elapsed_seconds: i64) -> String {
        let count = |f: fn(&Stage) -> bool| self.stages.values().filter(|s| f(s)).count();
        let done = count(|s| *s == Stage::Done);
        let failed = count(|s| matches!(s, Stage::Failed(_)));
        let running = count(|s| *s == Stage::Running);
        let pending = count(|s| *s == Stage::Pending);
        let mut parts = vec![format!("{done}/{} done", self.stages.len())];
        for (n, word) in [
            (failed, "failed"),
            (running, "running"),
            (pending, "pending"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        format!(
            "{verb}: {} · {}",
            parts.join(", "),
            short_duration(elapsed_seconds)
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::{machine, operation};

    #[test]
    fn operation_stages() {
        let cases = [
            (None, Stage::Pending),
            (Some("Pending"), Stage::Pending),
            (Some("InProgress"), Stage::Running),
            (Some("Complete"), Stage::Done),
            (Some("Failed"), Stage::Failed("reboot Failed".into())),
        ];
        for (state, expected) in cases {
            assert_eq!(
                operation_stage(&operation("o", "m", "reboot", state)),
                expected,
                "{state:?}"
            );
        }
    }

    #[test]
    fn repave_stages() {
        let at = "2026-11-26T12:00:00Z";
        let with = |annotations: serde_json::Value, status: serde_json::Value| {
            let mut m = machine("m", json!({}), json!({}), status);
            m.metadata.annotations = serde_json::from_value(annotations).unwrap();
            m
        };
        let running_v =
            |v: i64| json!({"phase": "Running", "configuration": {"name": "c", "version": v}});
        let cases = [
            (
                with(json!({"unbounded-cloud.io/repave": at}), running_v(1)),
                None,
                Stage::Pending,
            ),
            (
                with(
                    json!({"unbounded-cloud.io/repave": "2026-11-26T12:00:05Z"}),
                    running_v(1),
                ),
                None,
                Stage::Running,
            ),
            (
                with(
                    json!({"unbounded-cloud.io/repaving": at}),
                    json!({"phase": "Provisioning"}),
                ),
                None,
                Stage::Running,
            ),
            (with(json!({}), running_v(1)), None, Stage::Done),
            (with(json!({}), running_v(2)), Some(1), Stage::Running),
            (with(json!({}), running_v(1)), Some(1), Stage::Done),
            (
                with(json!({}), json!({"phase": "Provisioning"})),
                None,
                Stage::Running,
            ),
            (
                with(
                    json!({"unbounded-cloud.io/repaving": at}),
                    json!({"phase": "Failed", "failureMessage": "image rejected"}),
                ),
                None,
                Stage::Failed("image rejected".into()),
            ),
        ];
        for (i, (m, version, expected)) in cases.into_iter().enumerate() {
            assert_eq!(repave_stage(&m, at, version), expected, "case {i}");
        }
    }

    #[test]
    fn the_line_counts_and_finished_stages_stay() {
        let mut p = Progress::new(["a", "b", "c", "d"]);
        assert_eq!(p.line("reboot", 3), "reboot: 0/4 done, 4 pending · 3s");
        p.update("a", Stage::Done);
        p.update("b", Stage::Failed("no agent".into()));
        p.update("c", Stage::Running);
        p.update("zz", Stage::Done); // not ours: ignored
        assert_eq!(
            p.line("reboot", 75),
            "reboot: 1/4 done, 1 failed, 1 running, 1 pending · 75s"
        );
        assert!(!p.finished());
        p.update("a", Stage::Running); // a finished stage does not go back
        p.update("c", Stage::Done);
        p.update("d", Stage::Done);
        assert!(p.finished());
        assert_eq!(p.failures(), [("b", "no agent")]);
        assert_eq!(p.line("reboot", 200), "reboot: 3/4 done, 1 failed · 3m");
    }
}
