//! `apply`: the plan of the `applyConfiguration` operation, decided before anything is
//! written, by the controller's own rule ([`unbounded_controller::apply::decide_step`]) over
//! what the plugin reads: each Machine's recorded version, the version it resolves to, the
//! two versions' templates and whether it has a Node. What the controller would refuse is
//! refused here, for the whole verb, with the controller's reason; a change that needs a
//! repave is refused without `--disruptive` and the flag is offered.
//!
//! The version applied is the one each Machine resolves to (`--version N` only checks that
//! it is N): the controller refuses any other, since the Machine's next repave would move it
//! back. Pure; [`crate::act`] creates the operations and follows them.

use std::collections::BTreeMap;

use kube::ResourceExt;
use unbounded_api::in_place::ApplyPlan;
use unbounded_api::{Machine, MachineConfigurationVersion, MachineTemplate, ResolvedConfiguration};
use unbounded_controller::apply::{ApplyFacts, ApplyStep, Parameters, decide_step};

use crate::facts::{Inventory, NodeReadiness, candidates, node_of, nodes_by_name, resolve};
use crate::plan::{Action, PlanError, Verb};

/// What `apply` was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `--version N`: the version every machine must resolve to (none: whatever it does).
    pub version: Option<i64>,
    /// `--disruptive`: a change that needs a repave may cordon, drain and repave.
    pub disruptive: bool,
}

/// The configuration versions' templates, by object name (`<configuration>-v<N>`).
pub type Templates<'a> = BTreeMap<&'a str, &'a MachineTemplate>;

/// Indexes the versions' templates by name.
pub fn templates(versions: &[MachineConfigurationVersion]) -> Templates<'_> {
    versions
        .iter()
        .filter_map(|v| Some((v.metadata.name.as_deref()?, &v.spec.template)))
        .collect()
}

/// The step the controller would take for `machine`, as it would decide it.
pub fn step(
    request: Request,
    machine: &Machine,
    inventory: &Inventory,
    templates: &Templates<'_>,
) -> ApplyStep {
    let candidates = candidates(&inventory.configurations);
    let target = unbounded_controller::members::resolved(&resolve(machine, &candidates));
    step_with(request, machine, target.as_ref(), inventory, templates)
}

fn step_with(
    request: Request,
    machine: &Machine,
    target: Option<&ResolvedConfiguration>,
    inventory: &Inventory,
    templates: &Templates<'_>,
) -> ApplyStep {
    let name = machine.name_any();
    let status = machine.status.as_ref();
    let recorded = status.and_then(|s| s.configuration.as_ref());
    let template = |c: Option<&ResolvedConfiguration>| {
        c.and_then(|c| templates.get(c.version_name().as_str()).copied())
    };
    let a = machine.annotations();
    let nodes = nodes_by_name(&inventory.nodes);
    decide_step(&ApplyFacts {
        parameters: Ok(Parameters {
            // Without --version: the version it resolves to (0 when none: the controller's
            // rule refuses that Machine before it reads the number).
            version: request
                .version
                .or(target.map(|t| t.version))
                .unwrap_or_default(),
            disruptive: request.disruptive,
        }),
        machine: &name,
        recorded,
        target,
        recorded_template: template(recorded),
        target_template: template(target),
        has_node: node_of(machine, &nodes).readiness != NodeReadiness::Missing,
        repaving: a.contains_key(unbounded_api::well_known::annotations::REPAVE)
            || a.contains_key(unbounded_api::well_known::annotations::REPAVING),
        phase: status.and_then(|s| s.phase),
        // A new operation: its agent part does not exist yet.
        agent: unbounded_controller::apply::AgentPart::Absent,
    })
}

/// What the in-place part of a plan changes, for a person.
fn in_place_summary(plan: &ApplyPlan) -> String {
    let mut parts = Vec::new();
    if let Some(labels) = &plan.labels {
        let mut change: Vec<String> = labels.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        change.extend(labels.remove.iter().map(|k| format!("{k}-")));
        parts.push(format!("Node labels {}", change.join(" ")));
    }
    if plan.taints.is_some() {
        parts.push("Node taints".to_owned());
    }
    if parts.is_empty() {
        "nothing changes on the machine; the version is recorded".to_owned()
    } else {
        format!("in place: {}", parts.join(", "))
    }
}

/// The `apply` actions on `machines`, or why it is refused (then nothing is written).
pub fn plan(
    request: Request,
    machines: &[Machine],
    inventory: &Inventory,
    templates: &Templates<'_>,
) -> Result<Vec<Action>, PlanError> {
    let verb = Verb::Apply {
        version: request.version,
        disruptive: request.disruptive,
    };
    if machines.is_empty() {
        return Err(PlanError::NoMachines {
            verb: verb.command(),
        });
    }
    let candidates = candidates(&inventory.configurations);
    let mut actions = Vec::new();
    let mut refusals = Vec::new();
    for machine in machines {
        let name = machine.name_any();
        if machine.metadata.deletion_timestamp.is_some() {
            refusals.push((name, "the Machine is being deleted".to_owned()));
            continue;
        }
        let target = unbounded_controller::members::resolved(&resolve(machine, &candidates));
        let decided = step_with(request, machine, target.as_ref(), inventory, templates);
        let what = match decided {
            ApplyStep::Fail(why) => {
                // The same Machine with --disruptive: if the controller would then repave,
                // the refusal is only for want of the flag.
                let with_flag = Request {
                    disruptive: true,
                    ..request
                };
                let why = match step_with(with_flag, machine, target.as_ref(), inventory, templates)
                {
                    ApplyStep::RequestRepave { why } if !request.disruptive => format!(
                        "{why}: pass --disruptive to cordon, drain and repave it (its Node is replaced)"
                    ),
                    _ => why,
                };
                refusals.push((name, why));
                continue;
            }
            ApplyStep::Complete(message) => format!("{message}: nothing to apply"),
            ApplyStep::Wait(message) => message,
            ApplyStep::RequestRepave { why } => {
                format!("{why}: cordon, drain, delete its Node and repave")
            }
            ApplyStep::ApplyInPlace { plan, .. } => in_place_summary(&plan),
            ApplyStep::StartAgent { summary, .. } => format!("in place, by the agent: {summary}"),
        };
        // Every step but Fail has a target (the controller's rule fails without one).
        let Some(target) = target else {
            refusals.push((name, "resolves to no configuration version".to_owned()));
            continue;
        };
        actions.push(Action::ApplyConfiguration {
            machine: name,
            configuration: target.name,
            from: machine
                .status
                .as_ref()
                .and_then(|s| s.configuration.as_ref())
                .map(|c| c.version),
            version: target.version,
            disruptive: request.disruptive,
            what,
        });
    }
    if !refusals.is_empty() {
        return Err(PlanError::Refused {
            verb: verb.command(),
            refusals,
        });
    }
    Ok(actions)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::{Value, json};

    use super::*;
    use crate::fixtures::{configuration, node, running};

    fn version(configuration: &str, n: i64, template: Value) -> MachineConfigurationVersion {
        serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfigurationVersion",
            "metadata": {"name": format!("{configuration}-v{n}")},
            "spec": {"configurationName": configuration, "version": n, "template": template},
        }))
        .unwrap()
    }

    fn template(tier: &str, kubernetes: &str) -> Value {
        json!({"kubernetes": {"version": kubernetes, "nodeLabels": {"tier": tier}}})
    }

    /// gpu v1 (tier=a, 1.35.4), v2 (tier=b: in place), v3 (1.34.2: a repave).
    fn world(with_node: bool) -> (Inventory, Vec<MachineConfigurationVersion>) {
        let inventory = Inventory {
            configurations: vec![configuration(
                "gpu",
                0,
                None,
                &[(1, true), (2, true), (3, true)],
            )],
            nodes: if with_node {
                vec![node("m", true)]
            } else {
                vec![]
            },
            ..Inventory::default()
        };
        let versions = vec![
            version("gpu", 1, template("a", "v1.35.4")),
            version("gpu", 2, template("b", "v1.35.4")),
            version("gpu", 3, template("b", "v1.34.2")),
        ];
        (inventory, versions)
    }

    fn pinned(name: &str, recorded: i64, pin: Option<i64>) -> Machine {
        let mut m = running(name, "gpu", recorded);
        m.spec.configuration_ref = Some(unbounded_api::ConfigurationRef {
            name: "gpu".into(),
            version: pin,
        });
        m
    }

    /// Each case: the machine, the request, and the action's description or a word of the
    /// refusal.
    #[test]
    fn apply_is_planned_by_the_controllers_rule() {
        let (inventory, versions) = world(true);
        let t = templates(&versions);
        let ask = |version, disruptive| Request {
            version,
            disruptive,
        };
        let cases: Vec<(Machine, Request, Result<&str, &str>)> = vec![
            // v1 → v2 changes a Node label only: in place.
            (
                pinned("m", 1, Some(2)),
                ask(None, false),
                Ok("in place: Node labels tier=b"),
            ),
            (pinned("m", 1, Some(2)), ask(Some(2), false), Ok("in place")),
            // It resolves to v2, not v3: the controller would refuse; so does the plugin.
            (
                pinned("m", 1, Some(2)),
                ask(Some(3), false),
                Err("pin spec.configurationRef.version to 3 first"),
            ),
            // v2 → v3 changes Kubernetes: refused without the flag, which is offered.
            (
                pinned("m", 2, Some(3)),
                ask(None, false),
                Err("needs a repave: kubernetes.version changed: pass --disruptive"),
            ),
            (
                pinned("m", 2, Some(3)),
                ask(None, true),
                Ok("needs a repave: kubernetes.version changed: cordon, drain"),
            ),
            // Already there: created, and it completes at once.
            (
                pinned("m", 2, Some(2)),
                ask(None, false),
                Ok("runs gpu version 2: nothing to apply"),
            ),
            // Not pinned to a version: it resolves to the latest.
            (
                pinned("m", 2, None),
                ask(None, false),
                Err("pass --disruptive"),
            ),
            (
                pinned("m", 1, None),
                ask(Some(2), true),
                Err("resolves to gpu version 3"),
            ),
            // No recorded version, no configuration.
            (
                crate::fixtures::machine("m", json!({}), json!({}), json!({})),
                ask(None, true),
                Err("records no configuration version yet"),
            ),
        ];
        for (i, (machine, request, expected)) in cases.into_iter().enumerate() {
            let got = plan(request, std::slice::from_ref(&machine), &inventory, &t);
            match (&got, expected) {
                (Ok(actions), Ok(word)) => {
                    let Action::ApplyConfiguration { what, .. } = &actions[0] else {
                        panic!("case {i}: {actions:?}")
                    };
                    assert!(what.contains(word), "case {i}: {what:?} lacks {word:?}");
                }
                (Err(PlanError::Refused { refusals, .. }), Err(word)) => {
                    assert!(
                        refusals[0].1.contains(word),
                        "case {i}: {:?} lacks {word:?}",
                        refusals[0].1
                    );
                }
                _ => panic!("case {i}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_action_carries_the_parameters_the_controller_reads() {
        let (inventory, versions) = world(true);
        let t = templates(&versions);
        let request = Request {
            version: None,
            disruptive: true,
        };
        let actions = plan(request, &[pinned("m", 2, Some(3))], &inventory, &t).unwrap();
        let Action::ApplyConfiguration {
            configuration,
            from,
            version,
            disruptive,
            ..
        } = &actions[0]
        else {
            panic!("{actions:?}")
        };
        assert_eq!(
            (configuration.as_str(), *from, *version, *disruptive),
            ("gpu", Some(2), 3, true)
        );
        let parameters = actions[0].operation_parameters();
        assert_eq!(
            unbounded_controller::apply::parameters(&parameters),
            Ok(Parameters {
                version: 3,
                disruptive: true
            })
        );
        assert!(
            actions[0]
                .describe()
                .starts_with("create MachineOperation applyConfiguration on m (disruptive=true, version=3): gpu v2 → v3, "),
            "{}",
            actions[0].describe()
        );
    }

    #[test]
    fn one_machine_refused_refuses_all_and_no_node_waits() {
        let (inventory, versions) = world(false);
        let t = templates(&versions);
        let request = Request {
            version: None,
            disruptive: false,
        };
        // Without a Node the label change waits for it (the controller's Wait): created.
        let actions = plan(request, &[pinned("m", 1, Some(2))], &inventory, &t).unwrap();
        let Action::ApplyConfiguration { what, .. } = &actions[0] else {
            panic!()
        };
        assert!(what.contains("waiting for the Node"), "{what}");
        let err = plan(
            request,
            &[pinned("a", 1, Some(2)), pinned("b", 2, Some(3))],
            &inventory,
            &t,
        )
        .unwrap_err();
        let PlanError::Refused { refusals, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].0, "b");
        assert!(
            err.to_string()
                .starts_with("apply refused, nothing was changed:")
        );
        assert_eq!(
            plan(request, &[], &inventory, &t),
            Err(PlanError::NoMachines { verb: "apply" })
        );
    }
}
