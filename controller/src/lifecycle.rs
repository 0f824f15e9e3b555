//! What the controller records on a Machine, decided from plain data: which configuration
//! version it keeps or gets, whether it is being repaved, its Node, its conditions and its
//! phase.
//!
//! The recorded `status.configuration` is sticky (`OnDelete`): it changes only when the
//! Machine has none yet, or when the Node of a Machine that had one disappears (repave; this
//! is how a pinned older version — a rollback — is applied).

use unbounded_api::well_known::{conditions, reasons};
use unbounded_api::{MachinePhase, NodeRef, ResolvedConfiguration};

use crate::selection::Resolution;

/// The Node of a Machine, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedNode {
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: Option<String>,
    /// Whether its Ready condition is True.
    pub ready: bool,
}

/// Everything the plan is made from.
#[derive(Debug, Clone)]
pub struct MachineFacts<'a> {
    /// The Machine is being deleted.
    pub deleting: bool,
    /// A terminal failure has been reported.
    pub failed: bool,
    /// `status.configuration` as recorded.
    pub recorded: Option<&'a ResolvedConfiguration>,
    /// `status.nodeRef` as recorded.
    pub recorded_node: Option<&'a NodeRef>,
    /// Selection's answer for the Machine as it is now.
    pub resolution: &'a Resolution,
    /// The Node, if it exists.
    pub node: Option<ObservedNode>,
    /// The provider's InfrastructureReady condition is True.
    pub infrastructure_ready: bool,
    /// The Node name the Machine becomes.
    pub node_name: &'a str,
    /// A repave was requested ([`crate::repave`]): without a Node, the Machine records what
    /// it resolves to now even if it never had one.
    pub repave_requested: bool,
}

/// A condition the controller owns, without timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionPlan {
    /// Condition type.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// Reason.
    pub reason: &'static str,
    /// Message for a person.
    pub message: String,
}

/// What the controller should record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePlan {
    /// The configuration version to record (and lock).
    pub configuration: Option<ResolvedConfiguration>,
    /// The Node was deleted under a Machine that had one: it is repaved.
    pub repave: bool,
    /// The Node reference to record.
    pub node_ref: Option<NodeRef>,
    /// The ConfigurationResolved condition.
    pub configuration_condition: ConditionPlan,
    /// The NodeReady condition.
    pub node_condition: ConditionPlan,
    /// The phase.
    pub phase: MachinePhase,
}

/// Decides what to record for a Machine.
pub fn plan_machine(facts: &MachineFacts<'_>) -> MachinePlan {
    let repave = (facts.recorded_node.is_some() || facts.repave_requested)
        && facts.node.is_none()
        && !facts.deleting;
    let kept = facts.recorded.filter(|_| !repave).cloned();
    let configuration = kept.clone().or_else(|| match facts.resolution {
        Resolution::Resolved {
            configuration,
            version,
        } => Some(ResolvedConfiguration {
            name: configuration.clone(),
            version: *version,
        }),
        _ => None,
    });

    let configuration_condition = match (&configuration, kept.is_some()) {
        (Some(current), true) => ConditionPlan {
            type_: conditions::CONFIGURATION_RESOLVED,
            status: true,
            reason: reasons::CONFIGURATION_RESOLVED,
            message: kept_message(current, facts.resolution),
        },
        (Some(current), false) => ConditionPlan {
            type_: conditions::CONFIGURATION_RESOLVED,
            status: true,
            reason: reasons::CONFIGURATION_RESOLVED,
            message: format!(
                "provisioned with {} version {}",
                current.name, current.version
            ),
        },
        (None, _) => unresolved_condition(facts.resolution),
    };

    let node_ref = facts.node.as_ref().map(|n| NodeRef {
        name: n.name.clone(),
        uid: n.uid.clone(),
    });
    let node_condition = match &facts.node {
        None => ConditionPlan {
            type_: conditions::NODE_READY,
            status: false,
            reason: reasons::NODE_NOT_FOUND,
            message: format!("waiting for Node {} to register", facts.node_name),
        },
        Some(node) if node.ready => ConditionPlan {
            type_: conditions::NODE_READY,
            status: true,
            reason: reasons::NODE_READY,
            message: format!("Node {} is Ready", node.name),
        },
        Some(node) => ConditionPlan {
            type_: conditions::NODE_READY,
            status: false,
            reason: reasons::NODE_NOT_READY,
            message: format!("Node {} is not Ready", node.name),
        },
    };

    let phase = compute_phase(&PhaseFacts {
        deleting: facts.deleting,
        failed: facts.failed,
        resolved: configuration.is_some(),
        infrastructure_ready: facts.infrastructure_ready,
        node: facts.node.as_ref().map(|n| n.ready),
    });

    MachinePlan {
        configuration,
        repave,
        node_ref,
        configuration_condition,
        node_condition,
        phase,
    }
}

fn kept_message(current: &ResolvedConfiguration, resolution: &Resolution) -> String {
    let base = format!(
        "provisioned with {} version {}",
        current.name, current.version
    );
    match resolution {
        Resolution::Resolved {
            configuration,
            version,
        } if configuration != &current.name || *version != current.version => {
            format!(
                "{base}; {configuration} version {version} is applied when the Node is deleted (repave)"
            )
        }
        Resolution::Resolved { .. } => base,
        other => format!(
            "{base}; at the next repave: {}",
            unresolved_condition(other).message
        ),
    }
}

fn unresolved_condition(resolution: &Resolution) -> ConditionPlan {
    let (reason, message) = match resolution {
        Resolution::NoMatch | Resolution::Resolved { .. } => (
            reasons::CONFIGURATION_PENDING,
            "no MachineConfiguration matches this Machine's labels and spec.configurationRef is not set".to_owned(),
        ),
        Resolution::AwaitingClaim => (
            reasons::AWAITING_CLAIM,
            "discovered and waiting to be claimed: label it unbounded-cloud.io/discovery=claimed, or let a MachinePool claim it".to_owned(),
        ),
        Resolution::AwaitingFirstVersion { configuration } => (
            reasons::CONFIGURATION_PENDING,
            format!("waiting for the first version of MachineConfiguration {configuration}"),
        ),
        Resolution::ConfigurationNotFound { configuration } => (
            reasons::CONFIGURATION_NOT_FOUND,
            format!("spec.configurationRef names MachineConfiguration {configuration}, which does not exist"),
        ),
        Resolution::VersionNotFound { configuration, version } => (
            reasons::VERSION_NOT_FOUND,
            format!("spec.configurationRef pins version {version} of MachineConfiguration {configuration}, which does not exist"),
        ),
    };
    ConditionPlan {
        type_: conditions::CONFIGURATION_RESOLVED,
        status: false,
        reason,
        message,
    }
}

/// The `Discovered` condition of a Machine that discovery created (label
/// `unbounded-cloud.io/discovery`): `WaitingToBeClaimed` while it waits, `Claimed` once an
/// operator or a pool set the label to `claimed`, so that the condition the bootserver
/// wrote at discovery does not go on saying "waiting".
///
/// Once written it is written on every status write, also after the label is gone
/// (`has_condition`: the Machine carries a `Discovered` condition; then `Claimed`) and while
/// the Machine is deleted. The bootserver wrote the condition first, so its field manager
/// still owns the fields both wrote alike (type, status, transition time): a controller
/// write without the condition would drop only the controller's reason and message, and the
/// API server refuses the entry that is left (a claimed discovered Machine then stayed
/// `Deleting` for ever). `None` for any other Machine.
pub fn discovered_condition(
    labels: &std::collections::BTreeMap<String, String>,
    has_condition: bool,
) -> Option<ConditionPlan> {
    use unbounded_api::well_known::{discovery, labels::DISCOVERY};
    let waiting = (
        reasons::AWAITING_CLAIM,
        "discovered by network boot; claim it (label unbounded-cloud.io/discovery=claimed, or a MachinePool) to provision it",
    );
    let claimed = (
        reasons::CLAIMED,
        "discovered by network boot and claimed; provisioned like any other Machine",
    );
    let (reason, message) = match labels.get(DISCOVERY).map(String::as_str) {
        Some(discovery::WAITING) => waiting,
        Some(discovery::CLAIMED) => claimed,
        _ if has_condition => claimed,
        _ => return None,
    };
    Some(ConditionPlan {
        type_: unbounded_api::well_known::conditions::DISCOVERED,
        status: true,
        reason,
        message: message.to_owned(),
    })
}

/// What the phase is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseFacts {
    /// Being deleted.
    pub deleting: bool,
    /// A terminal failure was reported.
    pub failed: bool,
    /// A configuration version is recorded.
    pub resolved: bool,
    /// The provider reports its infrastructure ready.
    pub infrastructure_ready: bool,
    /// The Node: absent, or whether it is Ready.
    pub node: Option<bool>,
}

/// Cluster API's phase from the facts.
pub fn compute_phase(facts: &PhaseFacts) -> MachinePhase {
    if facts.deleting {
        MachinePhase::Deleting
    } else if facts.failed {
        MachinePhase::Failed
    } else if !facts.resolved {
        MachinePhase::Pending
    } else if facts.node == Some(true) {
        MachinePhase::Running
    } else if facts.node.is_some() || facts.infrastructure_ready {
        MachinePhase::Provisioned
    } else {
        MachinePhase::Provisioning
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, version: i64) -> ResolvedConfiguration {
        ResolvedConfiguration {
            name: name.into(),
            version,
        }
    }

    fn resolved(name: &str, version: i64) -> Resolution {
        Resolution::Resolved {
            configuration: name.into(),
            version,
        }
    }

    fn node(ready: bool) -> Option<ObservedNode> {
        Some(ObservedNode {
            name: "n1".into(),
            uid: Some("u1".into()),
            ready,
        })
    }

    fn facts<'a>(
        recorded: Option<&'a ResolvedConfiguration>,
        recorded_node: Option<&'a NodeRef>,
        resolution: &'a Resolution,
        node: Option<ObservedNode>,
    ) -> MachineFacts<'a> {
        MachineFacts {
            deleting: false,
            failed: false,
            recorded,
            recorded_node,
            resolution,
            node,
            infrastructure_ready: false,
            node_name: "n1",
            repave_requested: false,
        }
    }

    #[test]
    fn phase_table() {
        let base = PhaseFacts {
            deleting: false,
            failed: false,
            resolved: true,
            infrastructure_ready: false,
            node: None,
        };
        let cases = [
            (
                "deleting wins",
                PhaseFacts {
                    deleting: true,
                    failed: true,
                    ..base
                },
                MachinePhase::Deleting,
            ),
            (
                "failed",
                PhaseFacts {
                    failed: true,
                    ..base
                },
                MachinePhase::Failed,
            ),
            (
                "unresolved is pending",
                PhaseFacts {
                    resolved: false,
                    node: Some(true),
                    ..base
                },
                MachinePhase::Pending,
            ),
            ("resolved, nothing yet", base, MachinePhase::Provisioning),
            (
                "infrastructure ready",
                PhaseFacts {
                    infrastructure_ready: true,
                    ..base
                },
                MachinePhase::Provisioned,
            ),
            (
                "node not ready",
                PhaseFacts {
                    node: Some(false),
                    ..base
                },
                MachinePhase::Provisioned,
            ),
            (
                "node ready",
                PhaseFacts {
                    node: Some(true),
                    ..base
                },
                MachinePhase::Running,
            ),
        ];
        for (case, facts, expected) in cases {
            assert_eq!(compute_phase(&facts), expected, "{case}");
        }
    }

    #[test]
    fn first_resolution_is_recorded() {
        let resolution = resolved("general", 1);
        let plan = plan_machine(&facts(None, None, &resolution, None));
        assert_eq!(plan.configuration, Some(cfg("general", 1)));
        assert!(!plan.repave);
        assert_eq!(plan.phase, MachinePhase::Provisioning);
        assert!(plan.configuration_condition.status);
    }

    #[test]
    fn recorded_version_sticks_while_the_node_lives() {
        let recorded = cfg("general", 1);
        let node_ref = NodeRef {
            name: "n1".into(),
            uid: Some("u1".into()),
        };
        let resolution = resolved("general", 2);
        let plan = plan_machine(&facts(
            Some(&recorded),
            Some(&node_ref),
            &resolution,
            node(true),
        ));
        assert_eq!(plan.configuration, Some(cfg("general", 1)));
        assert_eq!(plan.phase, MachinePhase::Running);
        assert!(
            plan.configuration_condition
                .message
                .contains("version 2 is applied when the Node is deleted")
        );
    }

    #[test]
    fn node_deleted_repaves_with_the_current_resolution() {
        let recorded = cfg("general", 2);
        let node_ref = NodeRef {
            name: "n1".into(),
            uid: Some("u1".into()),
        };
        // Rollback: the Machine now pins version 1.
        let resolution = resolved("general", 1);
        let plan = plan_machine(&facts(Some(&recorded), Some(&node_ref), &resolution, None));
        assert!(plan.repave);
        assert_eq!(plan.configuration, Some(cfg("general", 1)));
        assert_eq!(plan.node_ref, None);
        assert_eq!(plan.phase, MachinePhase::Provisioning);
    }

    #[test]
    fn node_not_seen_yet_is_not_a_repave() {
        let recorded = cfg("general", 2);
        let resolution = resolved("general", 3);
        let plan = plan_machine(&facts(Some(&recorded), None, &resolution, None));
        assert!(!plan.repave);
        assert_eq!(plan.configuration, Some(cfg("general", 2)));
    }

    #[test]
    fn a_repave_request_without_a_node_records_the_current_resolution() {
        let recorded = cfg("general", 2);
        let resolution = resolved("general", 1);
        let plan = plan_machine(&MachineFacts {
            repave_requested: true,
            ..facts(Some(&recorded), None, &resolution, None)
        });
        assert!(plan.repave);
        assert_eq!(plan.configuration, Some(cfg("general", 1)));
        // With a Node (one registered after the request), the request changes nothing.
        let plan = plan_machine(&MachineFacts {
            repave_requested: true,
            ..facts(Some(&recorded), None, &resolution, node(true))
        });
        assert!(!plan.repave);
        assert_eq!(plan.configuration, Some(cfg("general", 2)));
    }

    #[test]
    fn the_discovered_condition_follows_the_label() {
        let discovery = unbounded_api::well_known::labels::DISCOVERY;
        let cases = [
            (None, false, None),
            (Some("waiting"), false, Some(reasons::AWAITING_CLAIM)),
            (Some("claimed"), false, Some(reasons::CLAIMED)),
            (Some("something else"), false, None),
            (Some("waiting"), true, Some(reasons::AWAITING_CLAIM)),
            (Some("claimed"), true, Some(reasons::CLAIMED)),
            // The label gone or changed, the condition written: kept, as claimed.
            (None, true, Some(reasons::CLAIMED)),
            (Some("something else"), true, Some(reasons::CLAIMED)),
        ];
        for (value, has_condition, reason) in cases {
            let labels: std::collections::BTreeMap<String, String> = value
                .map(|v| (discovery.to_owned(), v.to_owned()))
                .into_iter()
                .collect();
            let plan = discovered_condition(&labels, has_condition);
            assert_eq!(
                plan.as_ref().map(|p| p.reason),
                reason,
                "{value:?} {has_condition}"
            );
            assert!(plan.is_none_or(|p| p.status && p.type_ == "Discovered"));
        }
    }

    #[test]
    fn unresolved_conditions_table() {
        let cases = [
            (
                Resolution::NoMatch,
                reasons::CONFIGURATION_PENDING,
                "no MachineConfiguration matches",
            ),
            (
                Resolution::ConfigurationNotFound {
                    configuration: "x".into(),
                },
                reasons::CONFIGURATION_NOT_FOUND,
                "MachineConfiguration x, which does not exist",
            ),
            (
                Resolution::VersionNotFound {
                    configuration: "x".into(),
                    version: 9,
                },
                reasons::VERSION_NOT_FOUND,
                "pins version 9 of MachineConfiguration x",
            ),
            (
                Resolution::AwaitingFirstVersion {
                    configuration: "x".into(),
                },
                reasons::CONFIGURATION_PENDING,
                "waiting for the first version",
            ),
            (
                Resolution::AwaitingClaim,
                reasons::AWAITING_CLAIM,
                "discovered and waiting to be claimed",
            ),
        ];
        for (resolution, reason, message) in cases {
            let plan = plan_machine(&facts(None, None, &resolution, None));
            assert_eq!(plan.phase, MachinePhase::Pending, "{resolution:?}");
            assert_eq!(plan.configuration, None);
            assert!(!plan.configuration_condition.status);
            assert_eq!(plan.configuration_condition.reason, reason);
            assert!(
                plan.configuration_condition.message.contains(message),
                "{}",
                plan.configuration_condition.message
            );
        }
    }

    #[test]
    fn a_broken_reference_does_not_unset_a_running_machine() {
        let recorded = cfg("general", 1);
        let node_ref = NodeRef {
            name: "n1".into(),
            uid: None,
        };
        let resolution = Resolution::ConfigurationNotFound {
            configuration: "gone".into(),
        };
        let plan = plan_machine(&facts(
            Some(&recorded),
            Some(&node_ref),
            &resolution,
            node(true),
        ));
        assert_eq!(plan.configuration, Some(cfg("general", 1)));
        assert!(plan.configuration_condition.status);
        assert!(
            plan.configuration_condition
                .message
                .contains("gone, which does not exist")
        );
    }
}
