//! `why <machine>`: one paragraph that answers "why is this machine not Running" from its
//! first blocking condition, its recent Events, the operations still open on it and what its
//! agent last reported. Pure: [`explain`] over plain data.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use unbounded_api::well_known::annotations;
use unbounded_api::{Machine, MachineOperation};

use crate::facts::{NodeFacts, NodeReadiness, first_blocker, seconds_between};
use crate::render::{blocker_text, short_duration};
use crate::status::{MachineRow, machine_row};

/// An Event about the machine, as `why` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFact {
    /// `Normal` or `Warning`.
    pub type_: String,
    /// Its reason.
    pub reason: String,
    /// Its note.
    pub note: String,
    /// When it last happened.
    pub last_seen: Timestamp,
    /// How often it happened.
    pub count: i32,
}

impl EventFact {
    /// Reads an `events.k8s.io/v1` Event (its series' last time, else its own).
    pub fn from_event(event: &k8s_openapi::api::events::v1::Event) -> Option<Self> {
        let last_seen = event
            .series
            .as_ref()
            .map(|s| s.last_observed_time.0)
            .or_else(|| event.event_time.as_ref().map(|t| t.0))
            .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0))
            .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
        Some(Self {
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            note: event.note.clone().unwrap_or_default(),
            last_seen,
            count: event
                .series
                .as_ref()
                .map(|s| s.count)
                .or(event.deprecated_count)
                .unwrap_or(1),
        })
    }
}

/// The sentence about the machine's state: Running and Ready, or what holds it up.
fn state_sentence(machine: &Machine, row: &MachineRow, now: Timestamp) -> String {
    let name = machine.name_any();
    let phase = row.phase.unwrap_or("not yet reported");
    let node = node_sentence(&row.node);
    if let Some(blocker) = first_blocker(machine, now) {
        let held = match blocker.condition.as_str() {
            "Failed" => "it failed".to_owned(),
            "Status" => "nothing has reported on it".to_owned(),
            _ => format!("it waits on {}", blocker.condition),
        };
        return format!(
            "Machine {name} is {phase}: {held} ({}). {node}",
            blocker_text(&blocker)
        );
    }
    if phase == "Running" {
        return format!("Machine {name} is Running: nothing holds it up. {node}");
    }
    format!("Machine {name} is {phase}, and no condition says why. {node}")
}

fn node_sentence(node: &NodeFacts) -> String {
    let cordoned = if node.cordoned { ", cordoned" } else { "" };
    match node.readiness {
        NodeReadiness::Missing => format!("Its Node {} does not exist.", node.name),
        NodeReadiness::Ready => format!("Its Node {} is Ready{cordoned}.", node.name),
        NodeReadiness::NotReady => format!("Its Node {} is not Ready{cordoned}.", node.name),
        NodeReadiness::Unknown => format!(
            "Its Node {} has an unknown readiness (kubelet stopped reporting){cordoned}.",
            node.name
        ),
    }
}

fn version_sentence(row: &MachineRow) -> Option<String> {
    match (&row.recorded, &row.resolved, &row.unresolved) {
        (Some(r), Some(s), _) if r != s => Some(format!(
            "It runs {} v{} and resolves to {} v{}: the next repave moves it.",
            r.configuration, r.version, s.configuration, s.version
        )),
        (Some(r), Some(_), _) => Some(format!("It runs {} v{}.", r.configuration, r.version)),
        (_, _, Some(why)) => Some(format!("Its configuration: {why}.")),
        (None, Some(s), _) => Some(format!(
            "It will be provisioned with {} v{}.",
            s.configuration, s.version
        )),
        (Some(r), None, None) => Some(format!("It runs {} v{}.", r.configuration, r.version)),
        (None, None, None) => None,
    }
}

fn repave_sentence(machine: &Machine) -> Option<String> {
    let a = machine.annotations();
    if let Some(at) = a.get(annotations::REPAVE) {
        return Some(format!(
            "A repave was requested at {at}: the controller drains and deletes its Node."
        ));
    }
    a.get(annotations::REPAVING)
        .map(|at| format!("It is being repaved (requested at {at})."))
}

fn agent_sentence(machine: &Machine) -> String {
    let Some(agent) = machine.status.as_ref().and_then(|s| s.agent.as_ref()) else {
        return "Its agent has not reported.".to_owned();
    };
    let mut parts = Vec::new();
    if let Some(v) = &agent.version {
        parts.push(format!("agent {v}"));
    }
    if let Some(b) = &agent.boot_id {
        parts.push(format!("boot {b}"));
    }
    if let Some(c) = &agent.container_state {
        parts.push(format!("container {c}"));
    }
    if let Some(p) = &agent.paved {
        parts.push(format!("paved with {} v{}", p.name, p.version));
    }
    if let Some(r) = &agent.reboot {
        parts.push(format!(
            "rebooting for {} from boot {}",
            r.operation, r.from_boot_id
        ));
    }
    if parts.is_empty() {
        "Its agent reported nothing yet.".to_owned()
    } else {
        format!("Its agent last reported: {}.", parts.join(", "))
    }
}

fn operations_sentence(operations: &[MachineOperation]) -> Option<String> {
    let open: Vec<String> = operations
        .iter()
        .filter(|o| {
            !o.status
                .as_ref()
                .and_then(|s| s.state)
                .is_some_and(|s| s.is_finished())
        })
        .map(|o| {
            let state = o
                .status
                .as_ref()
                .and_then(|s| s.state)
                .map_or("Pending", |s| s.as_str());
            format!("{} {} ({state})", o.spec.operation_name, o.name_any())
        })
        .collect();
    (!open.is_empty()).then(|| format!("Open operations: {}.", open.join(", ")))
}

fn events_sentence(events: &[EventFact], limit: usize, now: Timestamp) -> String {
    let mut recent: Vec<&EventFact> = events.iter().collect();
    recent.sort_by_key(|e| std::cmp::Reverse(e.last_seen));
    recent.truncate(limit);
    if recent.is_empty() {
        return "No recent Events.".to_owned();
    }
    let items: Vec<String> = recent
        .iter()
        .map(|e| {
            let times = if e.count > 1 {
                format!(" (x{})", e.count)
            } else {
                String::new()
            };
            let warning = if e.type_ == "Warning" { "Warning " } else { "" };
            format!(
                "{} ago {warning}{}{times}: {}",
                short_duration(seconds_between(e.last_seen, now)),
                e.reason,
                e.note
            )
        })
        .collect();
    format!("Recent Events: {}.", items.join("; "))
}

/// The paragraph `why` prints for `machine`, given its Events and its operations.
pub fn explain(
    machine: &Machine,
    inventory: &crate::facts::Inventory,
    events: &[EventFact],
    operations: &[MachineOperation],
    event_limit: usize,
    now: Timestamp,
) -> String {
    let row = machine_row(machine, inventory, now);
    let mut sentences = vec![state_sentence(machine, &row, now)];
    sentences.extend(version_sentence(&row));
    sentences.extend(repave_sentence(machine));
    sentences.extend(operations_sentence(operations));
    sentences.push(agent_sentence(machine));
    sentences.push(events_sentence(events, event_limit, now));
    sentences.join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::facts::Inventory;
    use crate::fixtures::{condition, configuration, machine, node, now, operation, running};

    fn event(reason: &str, note: &str, at: &str, count: i32) -> EventFact {
        EventFact {
            type_: if reason.starts_with("Fail") {
                "Warning"
            } else {
                "Normal"
            }
            .to_owned(),
            reason: reason.to_owned(),
            note: note.to_owned(),
            last_seen: at.parse().unwrap(),
            count,
        }
    }

    #[test]
    fn a_stuck_machine_gets_its_blocker_events_operations_and_agent_report() {
        let m = machine(
            "m",
            json!({}),
            json!({"configurationRef": {"name": "gpu"}}),
            json!({
                "phase": "Provisioning",
                "configuration": {"name": "gpu", "version": 1},
                "agent": {"version": "0.1.0", "bootID": "b7", "containerState": "paving"},
                "conditions": [
                    condition("ConfigurationResolved", "True", "ConfigurationResolved", "", "2026-11-26T10:00:00Z"),
                    condition("BootstrapReady", "False", "ImageFetch", "fetching http://boot/node.tar", "2026-11-26T11:48:00Z"),
                ],
            }),
        );
        let inventory = Inventory {
            machines: vec![m.clone()],
            configurations: vec![configuration("gpu", 0, None, &[(1, true)])],
            ..Inventory::default()
        };
        let events = vec![
            event("Old", "long ago", "2026-11-26T09:00:00Z", 1),
            event(
                "FailedFetch",
                "connection refused",
                "2026-11-26T11:59:00Z",
                3,
            ),
            event("ConfigurationResolved", "gpu v1", "2026-11-26T10:00:00Z", 1),
        ];
        let operations = vec![
            operation("m-reboot-x", "m", "reboot", Some("Pending")),
            operation("m-reboot-old", "m", "reboot", Some("Complete")),
        ];
        let text = explain(&m, &inventory, &events, &operations, 2, now());
        assert_eq!(
            text,
            "Machine m is Provisioning: it waits on BootstrapReady (BootstrapReady=False ImageFetch 12m: \
fetching http://boot/node.tar). Its Node m does not exist. It runs gpu v1. \
Open operations: reboot m-reboot-x (Pending). \
Its agent last reported: agent 0.1.0, boot b7, container paving. \
Recent Events: 60s ago Warning FailedFetch (x3): connection refused; 2h ago ConfigurationResolved: gpu v1."
        );
    }

    #[test]
    fn a_running_machine_is_held_up_by_nothing_and_one_out_of_date_says_so() {
        let m = running("r", "gpu", 1);
        let inventory = Inventory {
            machines: vec![m.clone()],
            configurations: vec![configuration(
                "gpu",
                0,
                Some(json!({})),
                &[(1, true), (2, true)],
            )],
            nodes: vec![node("r", true)],
            ..Inventory::default()
        };
        let text = explain(&m, &inventory, &[], &[], 5, now());
        assert!(
            text.starts_with("Machine r is Running: nothing holds it up. Its Node r is Ready."),
            "{text}"
        );
        assert!(
            text.contains("It runs gpu v1 and resolves to gpu v2: the next repave moves it."),
            "{text}"
        );
        assert!(text.ends_with("No recent Events."), "{text}");
    }

    #[test]
    fn a_machine_without_status_or_configuration() {
        let m = machine("n", json!({}), json!({}), serde_json::Value::Null);
        let text = explain(&m, &Inventory::default(), &[], &[], 5, now());
        assert!(
            text.starts_with("Machine n is not yet reported: nothing has reported on it"),
            "{text}"
        );
        assert!(
            text.contains("Its configuration: no configuration matches."),
            "{text}"
        );
        assert!(text.contains("Its agent has not reported."), "{text}");
    }
}
