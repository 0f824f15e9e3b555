//! The `applyConfiguration` operation, run by the controller: moves a running Machine to
//! another version of its configuration without a repave when every change can be applied
//! in place ([`unbounded_api::in_place::decide`]), and otherwise refuses, or, with
//! `disruptive: "true"`, requests a repave (cordon, drain, Node deletion: [`crate::repave`]).
//!
//! [`decide_step`] decides from plain data; [`run`] ([`act`]) carries the step out. The
//! Machine records the new version only once everything is applied: after the Node is
//! patched (in place), or by the repave itself (the Machine reconciler records what the
//! Machine resolves to when its Node is gone). The target must be what the Machine resolves to: a Machine pinned to
//! another version, or resolving to a newer one, would be moved back at its next repave.
//!
//! The agent's part of the table (files, kubelet's flags) goes to the Machine's agent as a
//! child operation, `applyFiles` ([`unbounded_api::in_place::AgentApply`]: configuration,
//! the recorded version, the target), owned by this operation and never queued behind
//! anything (this one holds the Machine's turn). The agent writes the files into the running
//! node container and restarts the units that read them, reporting each step in the child's
//! status; only when the child is Complete does the controller patch the Node and record the
//! version. A failed child fails this operation and nothing is recorded.
//!
//! A rolling update moves Machines in place only for changes the controller applies alone
//! ([`rolls_in_place`]): a change with agent steps restarts units (kubelet with new flags)
//! and is repaved in batches bounded by `maxUnavailable`, so that a bad flag cannot stop
//! every kubelet of a configuration at once.

pub mod act;

use std::collections::BTreeMap;

use unbounded_api::in_place::{AgentApply, ApplyPlan, decide};
use unbounded_api::well_known::operations;
use unbounded_api::{MachinePhase, MachineTemplate, ResolvedConfiguration};

pub use act::{create_rollout_operation, run};

/// Event reason: a version was applied in place.
pub const APPLIED_IN_PLACE: &str = "ConfigurationAppliedInPlace";
/// Event reason: a version needs a repave the operation may not carry out.
pub const REPAVE_REQUIRED: &str = "RepaveRequired";

/// The operation's parameters, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameters {
    /// The target version number.
    pub version: i64,
    /// Whether a cordon, drain and repave are allowed.
    pub disruptive: bool,
}

/// Reads the parameters (the CRD checks them too; this is the controller's own word).
pub fn parameters(raw: &BTreeMap<String, String>) -> Result<Parameters, String> {
    if let Some(unknown) = raw.keys().find(|k| {
        ![
            operations::VERSION_PARAMETER,
            operations::DISRUPTIVE_PARAMETER,
        ]
        .contains(&k.as_str())
    }) {
        return Err(format!(
            "applyConfiguration does not know the parameter {unknown:?} (known: version, disruptive)"
        ));
    }
    let version = raw
        .get(operations::VERSION_PARAMETER)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            "applyConfiguration needs the parameter version, a version number such as \"2\""
                .to_owned()
        })?;
    let disruptive = match raw
        .get(operations::DISRUPTIVE_PARAMETER)
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "the parameter disruptive must be \"true\" or \"false\", not {other:?}"
            ));
        }
    };
    Ok(Parameters {
        version,
        disruptive,
    })
}

/// What the controller knows when it runs an `applyConfiguration` operation.
#[derive(Debug, Clone)]
pub struct ApplyFacts<'a> {
    /// The checked parameters, or why they are wrong.
    pub parameters: Result<Parameters, String>,
    /// The Machine's name.
    pub machine: &'a str,
    /// The version the Machine records.
    pub recorded: Option<&'a ResolvedConfiguration>,
    /// What the Machine resolves to now.
    pub target: Option<&'a ResolvedConfiguration>,
    /// The template of the recorded version, if its object exists.
    pub recorded_template: Option<&'a MachineTemplate>,
    /// The template of the target version, if its object exists.
    pub target_template: Option<&'a MachineTemplate>,
    /// The Machine has a Node.
    pub has_node: bool,
    /// A repave is requested or under way on the Machine.
    pub repaving: bool,
    /// The Machine's phase.
    pub phase: Option<MachinePhase>,
    /// The `applyFiles` child operation, when it exists.
    pub agent: AgentPart<'a>,
}

/// Where the agent's part (the `applyFiles` child) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentPart<'a> {
    /// Not created yet.
    Absent,
    /// Created, not finished; its message.
    Running(&'a str),
    /// Failed; its message.
    Failed(&'a str),
    /// Complete; its message.
    Complete(&'a str),
}

/// The next step of an `applyConfiguration` operation.
#[derive(Debug, Clone, PartialEq)]
pub enum ApplyStep {
    /// It cannot be done: Failed with the message.
    Fail(String),
    /// Done: Complete with the message.
    Complete(String),
    /// Create the `applyFiles` child for the agent's part.
    StartAgent {
        /// Its parameters.
        apply: AgentApply,
        /// What the agent will do, for a person.
        summary: String,
    },
    /// Patch the Node, then record the target (the agent's part, if any, is done).
    ApplyInPlace {
        /// What to apply.
        plan: Box<ApplyPlan>,
        /// The version to record.
        target: ResolvedConfiguration,
        /// What the agent reported, when it had a part.
        agent: Option<String>,
    },
    /// Request a repave (disruptive): the repave records the target.
    RequestRepave {
        /// Why, for a person.
        why: String,
    },
    /// InProgress: look again later.
    Wait(String),
}

/// Decides the next step.
pub fn decide_step(facts: &ApplyFacts<'_>) -> ApplyStep {
    let parameters = match &facts.parameters {
        Ok(p) => *p,
        Err(why) => return ApplyStep::Fail(why.clone()),
    };
    let machine = facts.machine;
    let Some(recorded) = facts.recorded else {
        return ApplyStep::Fail(format!(
            "Machine {machine} records no configuration version yet: it is provisioned with what it resolves to, there is nothing to apply"
        ));
    };
    let Some(target) = facts.target else {
        return ApplyStep::Fail(format!(
            "Machine {machine} resolves to no configuration version now (see its ConfigurationResolved condition)"
        ));
    };
    if target.name != recorded.name {
        return ApplyStep::Fail(format!(
            "Machine {machine} runs {} but resolves to {}: moving to another configuration takes a repave (delete its Node)",
            recorded.name, target.name
        ));
    }
    if target.version != parameters.version {
        return ApplyStep::Fail(format!(
            "Machine {machine} resolves to {} version {}, not version {}: pin spec.configurationRef.version to {} first (otherwise its next repave would move it back)",
            target.name, target.version, parameters.version, parameters.version
        ));
    }
    if recorded.version == target.version {
        return if facts.repaving || facts.phase != Some(MachinePhase::Running) {
            ApplyStep::Wait(format!(
                "Machine {machine} records {} version {}; waiting for it to be Running",
                target.name, target.version
            ))
        } else {
            ApplyStep::Complete(format!(
                "Machine {machine} runs {} version {}",
                target.name, target.version
            ))
        };
    }
    if facts.repaving {
        return ApplyStep::Wait(format!(
            "a repave of Machine {machine} is requested or under way"
        ));
    }
    let (Some(old), Some(new)) = (facts.recorded_template, facts.target_template) else {
        return ApplyStep::Fail(format!(
            "cannot compare {} version {} with version {}: a MachineConfigurationVersion is missing",
            target.name, recorded.version, target.version
        ));
    };
    let plan = decide(old, new);
    let repave = plan.repave_summary();
    if !repave.is_empty() {
        let what = format!(
            "version {} of {} needs a repave: {repave}",
            target.version, target.name
        );
        return if parameters.disruptive {
            ApplyStep::RequestRepave { why: what }
        } else {
            ApplyStep::Fail(format!(
                "{what}; not done because the operation is not disruptive (set parameters.disruptive: \"true\" to cordon, drain and repave)"
            ))
        };
    }
    if (plan.has_node_steps() || plan.has_agent_steps()) && !facts.has_node {
        return ApplyStep::Wait(format!("waiting for the Node of Machine {machine}"));
    }
    let agent = if plan.has_agent_steps() {
        match facts.agent {
            AgentPart::Absent => {
                return ApplyStep::StartAgent {
                    apply: AgentApply {
                        configuration: target.name.clone(),
                        from: recorded.version,
                        version: target.version,
                    },
                    summary: agent_summary(&plan),
                };
            }
            AgentPart::Running(message) => {
                return ApplyStep::Wait(format!("the agent of Machine {machine}: {message}"));
            }
            AgentPart::Failed(message) => {
                return ApplyStep::Fail(format!(
                    "the agent of Machine {machine} could not apply version {} of {} in place: {message}; the Machine still records version {} (fix the configuration and apply again, or delete the Node to repave with the recorded version)",
                    target.version, target.name, recorded.version
                ));
            }
            AgentPart::Complete(message) => Some(message.to_owned()),
        }
    } else {
        None
    };
    ApplyStep::ApplyInPlace {
        plan: Box::new(plan),
        target: target.clone(),
        agent,
    }
}

/// What the agent's part does, for a person: the files, kubelet's flags, the units.
pub fn agent_summary(plan: &ApplyPlan) -> String {
    let mut parts = Vec::new();
    if !plan.files.is_empty() {
        let paths: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
        parts.push(format!("write {}", paths.join(", ")));
    }
    if plan.kubelet_args.is_some() {
        parts.push("rewrite kubelet's flags".to_owned());
    }
    if !plan.restart_units.is_empty() {
        let units: Vec<&str> = plan.restart_units.iter().map(String::as_str).collect();
        parts.push(format!("restart {}", units.join(", ")));
    }
    parts.join("; ")
}

/// The name of the `applyFiles` child of an `applyConfiguration` operation.
pub fn agent_operation_name(operation: &str) -> String {
    crate::dispatch::child_name(operation, "files")
}

/// Whether moving from `old` to `new` is applied entirely in place by this controller (no
/// repave, no agent step): a rolling update then moves the Machine through an
/// `applyConfiguration` operation instead of a repave, outside the `maxUnavailable` budget
/// (nothing is cordoned or drained).
pub fn rolls_in_place(old: &MachineTemplate, new: &MachineTemplate) -> bool {
    let plan = decide(old, new);
    !plan.needs_repave() && !plan.has_agent_steps()
}

/// The name of the `applyConfiguration` operation a rolling update creates for a Machine
/// and version: one per pair, so that retries create it once.
pub fn rollout_operation_name(machine: &str, version: i64) -> String {
    crate::dispatch::child_name(machine, &format!("apply-v{version}"))
}

/// What an in-place apply changed, for a person.
fn applied_summary(plan: &ApplyPlan) -> String {
    let mut parts = Vec::new();
    if plan.labels.is_some() {
        parts.push("Node labels");
    }
    if plan.taints.is_some() {
        parts.push("Node taints");
    }
    if plan.has_agent_steps() {
        parts.push("files and units in the node container");
    }
    if parts.is_empty() {
        "nothing to change on the machine".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::KubernetesSpec;

    fn cfg(version: i64) -> ResolvedConfiguration {
        ResolvedConfiguration {
            name: "general".into(),
            version,
        }
    }

    fn labels(tier: &str) -> MachineTemplate {
        MachineTemplate {
            kubernetes: Some(KubernetesSpec {
                version: Some("v1.35.4".into()),
                node_labels: [("tier".to_owned(), tier.to_owned())].into(),
                ..KubernetesSpec::default()
            }),
            ..MachineTemplate::default()
        }
    }

    fn kubernetes(version: &str) -> MachineTemplate {
        MachineTemplate {
            kubernetes: Some(KubernetesSpec {
                version: Some(version.into()),
                node_labels: [("tier".to_owned(), "a".to_owned())].into(),
                ..KubernetesSpec::default()
            }),
            ..MachineTemplate::default()
        }
    }

    fn params(version: i64, disruptive: bool) -> Result<Parameters, String> {
        Ok(Parameters {
            version,
            disruptive,
        })
    }

    #[test]
    fn parameters_table() {
        let p = |pairs: &[(&str, &str)]| {
            parameters(
                &pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        assert_eq!(p(&[("version", "2")]), params(2, false));
        assert_eq!(
            p(&[("version", "3"), ("disruptive", "true")]),
            params(3, true)
        );
        assert!(p(&[]).is_err_and(|e| e.contains("needs the parameter version")));
        assert!(p(&[("version", "0")]).is_err());
        assert!(
            p(&[("version", "2"), ("disruptive", "yes")]).is_err_and(|e| e.contains("\"yes\""))
        );
        assert!(p(&[("version", "2"), ("force", "1")]).is_err_and(|e| e.contains("\"force\"")));
    }

    #[test]
    fn decide_step_table() {
        let (v1, v2) = (cfg(1), cfg(2));
        let (old, new_labels, new_k8s) = (labels("a"), labels("b"), kubernetes("v1.34.2"));
        let base = ApplyFacts {
            parameters: params(2, false),
            machine: "m1",
            recorded: Some(&v1),
            target: Some(&v2),
            recorded_template: Some(&old),
            target_template: Some(&new_labels),
            has_node: true,
            repaving: false,
            phase: Some(MachinePhase::Running),
            agent: AgentPart::Absent,
        };
        let kind = |s: &ApplyStep| match s {
            ApplyStep::Fail(m) => format!("fail: {m}"),
            ApplyStep::Complete(m) => format!("complete: {m}"),
            ApplyStep::ApplyInPlace { target, agent, .. } => {
                format!("in place: v{}, agent: {agent:?}", target.version)
            }
            ApplyStep::StartAgent { apply, summary } => {
                format!(
                    "agent: {} v{}→v{}: {summary}",
                    apply.configuration, apply.from, apply.version
                )
            }
            ApplyStep::RequestRepave { why } => format!("repave: {why}"),
            ApplyStep::Wait(m) => format!("wait: {m}"),
        };
        let cases: Vec<(&str, ApplyFacts<'_>, &str)> = vec![
            (
                "a label change: in place",
                base.clone(),
                "in place: v2, agent: None",
            ),
            (
                "a Kubernetes version change, not disruptive: refused",
                ApplyFacts {
                    target_template: Some(&new_k8s),
                    ..base.clone()
                },
                "fail: version 2 of general needs a repave: kubernetes.version changed; not done because the operation is not disruptive",
            ),
            (
                "a Kubernetes version change, disruptive: repave",
                ApplyFacts {
                    target_template: Some(&new_k8s),
                    parameters: params(2, true),
                    ..base.clone()
                },
                "repave: version 2 of general needs a repave: kubernetes.version changed",
            ),
            (
                "the repave under way: wait",
                ApplyFacts {
                    recorded: Some(&v2),
                    repaving: true,
                    phase: Some(MachinePhase::Provisioning),
                    ..base.clone()
                },
                "wait: Machine m1 records general version 2; waiting for it to be Running",
            ),
            (
                "recorded and Running: complete",
                ApplyFacts {
                    recorded: Some(&v2),
                    ..base.clone()
                },
                "complete: Machine m1 runs general version 2",
            ),
            (
                "the Machine resolves to another version: refused",
                ApplyFacts {
                    parameters: params(3, true),
                    ..base.clone()
                },
                "fail: Machine m1 resolves to general version 2, not version 3: pin spec.configurationRef.version to 3 first",
            ),
            (
                "nothing recorded: nothing to apply",
                ApplyFacts {
                    recorded: None,
                    ..base.clone()
                },
                "fail: Machine m1 records no configuration version yet",
            ),
            (
                "a repave requested by someone else: wait",
                ApplyFacts {
                    repaving: true,
                    ..base.clone()
                },
                "wait: a repave of Machine m1 is requested or under way",
            ),
            (
                "labels without a Node: wait for it",
                ApplyFacts {
                    has_node: false,
                    ..base.clone()
                },
                "wait: waiting for the Node of Machine m1",
            ),
            (
                "a missing version object: refused",
                ApplyFacts {
                    recorded_template: None,
                    ..base.clone()
                },
                "fail: cannot compare general version 1 with version 2",
            ),
            (
                "bad parameters",
                ApplyFacts {
                    parameters: Err("bad".into()),
                    ..base.clone()
                },
                "fail: bad",
            ),
        ];
        for (case, facts, expected) in cases {
            let got = kind(&decide_step(&facts));
            assert!(got.starts_with(expected), "{case}: {got}");
        }
    }

    #[test]
    fn rolls_in_place_table() {
        let mut kubelet = labels("a");
        if let Some(k) = kubelet.kubernetes.as_mut() {
            k.kubelet_extra_args.insert("max-pods".into(), "50".into());
        }
        let cases = [
            ("same", labels("a"), labels("a"), true),
            ("a label", labels("a"), labels("b"), true),
            (
                "the Kubernetes version",
                labels("a"),
                kubernetes("v1.34.2"),
                false,
            ),
            ("kubelet flags (agent)", labels("a"), kubelet, false),
        ];
        for (case, old, new, expected) in cases {
            assert_eq!(rolls_in_place(&old, &new), expected, "{case}");
        }
        assert_eq!(rollout_operation_name("m1", 3), "m1-apply-v3");
    }

    /// Files and kubelet flags go to the agent first (an applyFiles child), and the version
    /// is recorded only once the agent completed; a failed agent fails the operation.
    #[test]
    fn agent_steps_go_to_the_agent_before_anything_is_recorded() {
        let (v1, v2) = (cfg(1), cfg(2));
        let old = labels("a");
        let mut new = labels("b");
        if let Some(k) = new.kubernetes.as_mut() {
            k.kubelet_extra_args.insert("max-pods".into(), "50".into());
        }
        new.files.push(unbounded_api::FileSpec {
            path: "/etc/containerd/conf.d/x.toml".into(),
            content: "x".into(),
            mode: None,
            restart_units: vec!["containerd.service".into()],
        });
        let facts = ApplyFacts {
            parameters: params(2, false),
            machine: "m1",
            recorded: Some(&v1),
            target: Some(&v2),
            recorded_template: Some(&old),
            target_template: Some(&new),
            has_node: true,
            repaving: false,
            phase: Some(MachinePhase::Running),
            agent: AgentPart::Absent,
        };
        assert_eq!(
            decide_step(&facts),
            ApplyStep::StartAgent {
                apply: AgentApply {
                    configuration: "general".into(),
                    from: 1,
                    version: 2
                },
                summary: "write /etc/containerd/conf.d/x.toml; rewrite kubelet's flags; restart containerd.service, kubelet.service".into(),
            }
        );
        let step = |agent| {
            decide_step(&ApplyFacts {
                agent,
                ..facts.clone()
            })
        };
        assert_eq!(
            step(AgentPart::Running("restarting kubelet.service")),
            ApplyStep::Wait("the agent of Machine m1: restarting kubelet.service".into())
        );
        assert!(matches!(
            step(AgentPart::Failed("kubelet.service failed")),
            ApplyStep::Fail(m) if m.contains("kubelet.service failed") && m.contains("still records version 1")
        ));
        assert!(matches!(
            step(AgentPart::Complete("done")),
            ApplyStep::ApplyInPlace { agent: Some(m), plan, .. } if m == "done" && plan.labels.is_some()
        ));
        assert_eq!(
            decide_step(&ApplyFacts {
                has_node: false,
                ..facts.clone()
            }),
            ApplyStep::Wait("waiting for the Node of Machine m1".into()),
            "the agent's part needs a running node container"
        );
        // A person's (or a rollout's) disruptive flag changes nothing: no repave for files.
        assert!(matches!(
            decide_step(&ApplyFacts {
                parameters: params(2, true),
                ..facts.clone()
            }),
            ApplyStep::StartAgent { .. }
        ));
    }
}
