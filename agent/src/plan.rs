//! What the agent does next, decided from plain data: the Machine as the controller left it,
//! its Node, and what is on this host (the paved container and its systemd unit).
//!
//! The rules, in order:
//! 1. A Machine being deleted is left alone (the controller drains, the provider powers off).
//! 2. A pave that was interrupted (agent restart, crash) starts over.
//! 3. Without a resolved configuration, or before its version object is read, wait.
//! 4. Nothing paved on this boot: pave the resolved version.
//! 5. The Node this container joined as is gone: wait until the controller has recorded
//!    the repave (it clears `status.nodeRef` and records the version the Machine resolves to
//!    now, which is how a rollback arrives), then pave that version again from scratch.
//! 6. A container that is not running is started, a bounded number of times per pave.
//! 7. A running container whose Node appeared: remember the Node's UID (rule 5 needs it).
//!
//! A version resolved while the Node exists is *not* applied (`OnDelete`): the machine keeps
//! what it runs until its Node is deleted.

use unbounded_api::ResolvedConfiguration;

/// How many times a paved container is started before the agent gives up until the next
/// pave (a container that fails at once would otherwise loop).
pub const MAX_STARTS: u32 = 5;

/// What was paved on this host during this boot (the agent's state file lives in RAM).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Paved {
    /// The container's (and Node's) name.
    pub container: String,
    /// The configuration version it was paved with.
    pub configuration: ResolvedConfiguration,
    /// The node image's SHA-256.
    pub image_sha256: String,
    /// The UID of the Node that registered from this container, once seen.
    #[serde(default)]
    pub joined_node_uid: Option<String>,
    /// How many times the container was started since it was paved.
    #[serde(default)]
    pub starts: u32,
    /// The Node address kubelet was given (`--node-ip`), so that an in-place change of
    /// kubelet's flags keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<crate::node_address::NodeIps>,
}

/// The node container's systemd unit, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// No unit loaded or nothing paved.
    Absent,
    /// `activating`.
    Starting,
    /// `active`.
    Running,
    /// `inactive` or `deactivating`.
    Stopped,
    /// `failed`.
    Failed,
}

impl ContainerState {
    /// The value reported in `status.agent.containerState`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Absent => "absent",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
        }
    }
}

/// Everything the decision is made from.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The Machine is being deleted.
    pub deleting: bool,
    /// Its pool releases it to the inventory and asked for the wipe of its disks
    /// (`unbounded-cloud.io/release-wipe`): nothing is paved or started any more.
    pub releasing: bool,
    /// `status.configuration`: what the controller resolved.
    pub desired: Option<&'a ResolvedConfiguration>,
    /// The MachineConfigurationVersion of `desired` has been read.
    pub version_loaded: bool,
    /// `status.nodeRef.uid` as the controller recorded it.
    pub recorded_node_uid: Option<&'a str>,
    /// The UID of the Node named `node_name`, if it exists.
    pub node_uid: Option<&'a str>,
    /// The Node (and container) name the Machine becomes.
    pub node_name: &'a str,
    /// What this boot paved, if anything.
    pub paved: Option<&'a Paved>,
    /// A pave was started and did not finish.
    pub interrupted: bool,
    /// The container unit's state.
    pub container: ContainerState,
    /// The Node's Ready condition message while it is not Ready.
    pub node_not_ready: Option<&'a str>,
    /// kubelet was restarted for a stuck start within the last minute.
    pub kubelet_recently_restarted: bool,
}

/// What kubelet says when its CSINode initialisation gave up because its Node did not exist
/// yet (a slow first registration): it retries with a backoff that grows to minutes, and the
/// Node stays NotReady meanwhile. A restart, now that the Node exists, clears it at once.
pub const CSINODE_STUCK: &str = "failed to initialize CSINode";

/// Why the agent waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// The Machine is being deleted.
    Deleting,
    /// The Machine is being released to the inventory.
    Releasing,
    /// No configuration version is resolved yet.
    NoConfiguration,
    /// The MachineConfigurationVersion has not been read yet.
    VersionNotLoaded(String),
    /// The Node was deleted; the controller has not recorded the repave yet.
    RepaveNotRecorded(String),
    /// The container failed too often.
    ContainerFailed(u32),
    /// The container is starting.
    ContainerStarting,
}

impl Wait {
    /// A message for a person.
    pub fn message(&self) -> String {
        match self {
            Self::Deleting => "the Machine is being deleted".into(),
            Self::Releasing => "the Machine is being released to the inventory".into(),
            Self::NoConfiguration => {
                "waiting for the controller to resolve a configuration version".into()
            }
            Self::VersionNotLoaded(name) => {
                format!("waiting for MachineConfigurationVersion {name}")
            }
            Self::RepaveNotRecorded(node) => format!(
                "Node {node} was deleted; waiting for the controller to record the version to repave with"
            ),
            Self::ContainerFailed(starts) => format!(
                "the node container failed {starts} times; see `journalctl -u systemd-nspawn@<node>` on the machine; delete the Node to repave"
            ),
            Self::ContainerStarting => "the node container is starting".into(),
        }
    }
}

/// Why a pave happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaveReason {
    /// Nothing is paved on this boot.
    Initial,
    /// A previous pave did not finish.
    Interrupted,
    /// The Node was deleted (repave; also how a rollback is applied).
    NodeDeleted,
    /// The Machine's Node name changed.
    NodeNameChanged,
}

impl PaveReason {
    /// A short word for logs and the condition message.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "first pave on this boot",
            Self::Interrupted => "an interrupted pave starts over",
            Self::NodeDeleted => "repave: the Node was deleted",
            Self::NodeNameChanged => "repave: the Node name changed",
        }
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing can be done now.
    Wait(Wait),
    /// Stop and remove any container, then pave this version and start it.
    Pave {
        /// The version to pave.
        configuration: ResolvedConfiguration,
        /// Why.
        reason: PaveReason,
    },
    /// Start the paved container.
    Start,
    /// Remember that the Node with this UID registered from the container.
    RecordJoin(String),
    /// Restart kubelet inside the container (a start that is stuck, see [`CSINODE_STUCK`]).
    RestartKubelet,
    /// Everything is as it should be.
    Steady,
}

/// Decides the next action.
pub fn decide(facts: &Facts<'_>) -> Action {
    if facts.deleting {
        return Action::Wait(Wait::Deleting);
    }
    if facts.releasing {
        return Action::Wait(Wait::Releasing);
    }
    let Some(desired) = facts.desired else {
        return Action::Wait(Wait::NoConfiguration);
    };
    if !facts.version_loaded {
        return Action::Wait(Wait::VersionNotLoaded(desired.version_name()));
    }
    let pave = |reason| Action::Pave {
        configuration: desired.clone(),
        reason,
    };
    if facts.interrupted {
        return pave(PaveReason::Interrupted);
    }
    let Some(paved) = facts.paved else {
        return pave(PaveReason::Initial);
    };
    if paved.container != facts.node_name {
        return pave(PaveReason::NodeNameChanged);
    }
    if let Some(joined) = paved.joined_node_uid.as_deref()
        && facts.node_uid != Some(joined)
    {
        return if facts.recorded_node_uid == Some(joined) {
            Action::Wait(Wait::RepaveNotRecorded(facts.node_name.to_owned()))
        } else {
            pave(PaveReason::NodeDeleted)
        };
    }
    match facts.container {
        ContainerState::Absent | ContainerState::Stopped | ContainerState::Failed
            if paved.starts >= MAX_STARTS =>
        {
            Action::Wait(Wait::ContainerFailed(paved.starts))
        }
        ContainerState::Absent | ContainerState::Stopped | ContainerState::Failed => Action::Start,
        ContainerState::Starting => Action::Wait(Wait::ContainerStarting),
        ContainerState::Running => match (facts.node_uid, &paved.joined_node_uid) {
            (Some(uid), None) => Action::RecordJoin(uid.to_owned()),
            (Some(_), Some(_))
                if facts
                    .node_not_ready
                    .is_some_and(|m| m.contains(CSINODE_STUCK))
                    && !facts.kubelet_recently_restarted =>
            {
                Action::RestartKubelet
            }
            _ => Action::Steady,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(version: i64) -> ResolvedConfiguration {
        ResolvedConfiguration {
            name: "general".into(),
            version,
        }
    }

    fn paved(version: i64, joined: Option<&str>, starts: u32) -> Paved {
        Paved {
            container: "node-1".into(),
            configuration: conf(version),
            image_sha256: "0".repeat(64),
            joined_node_uid: joined.map(str::to_owned),
            starts,
            node_ip: None,
        }
    }

    #[test]
    fn decision_table() {
        let v1 = conf(1);
        let v2 = conf(2);
        let fresh = paved(1, None, 1);
        let joined = paved(1, Some("uid-a"), 1);
        let failing = paved(1, None, MAX_STARTS);
        let joined_v2 = paved(2, Some("uid-a"), 1);
        let base = Facts {
            deleting: false,
            releasing: false,
            desired: Some(&v1),
            version_loaded: true,
            recorded_node_uid: None,
            node_uid: None,
            node_name: "node-1",
            paved: None,
            interrupted: false,
            container: ContainerState::Absent,
            node_not_ready: None,
            kubelet_recently_restarted: false,
        };
        let pave = |c: &ResolvedConfiguration, reason| Action::Pave {
            configuration: c.clone(),
            reason,
        };
        let cases: Vec<(&str, Facts<'_>, Action)> = vec![
            (
                "deleting",
                Facts {
                    deleting: true,
                    releasing: true,
                    ..base.clone()
                },
                Action::Wait(Wait::Deleting),
            ),
            (
                "released: nothing paved or started",
                Facts {
                    releasing: true,
                    ..base.clone()
                },
                Action::Wait(Wait::Releasing),
            ),
            (
                "nothing resolved",
                Facts {
                    desired: None,
                    ..base.clone()
                },
                Action::Wait(Wait::NoConfiguration),
            ),
            (
                "version object not read",
                Facts {
                    version_loaded: false,
                    ..base.clone()
                },
                Action::Wait(Wait::VersionNotLoaded("general-v1".into())),
            ),
            ("first pave", base.clone(), pave(&v1, PaveReason::Initial)),
            (
                "interrupted pave starts over",
                Facts {
                    interrupted: true,
                    paved: Some(&fresh),
                    ..base.clone()
                },
                pave(&v1, PaveReason::Interrupted),
            ),
            (
                "paved, stopped: start",
                Facts {
                    paved: Some(&fresh),
                    container: ContainerState::Stopped,
                    ..base.clone()
                },
                Action::Start,
            ),
            (
                "paved, failed too often",
                Facts {
                    paved: Some(&failing),
                    container: ContainerState::Failed,
                    ..base.clone()
                },
                Action::Wait(Wait::ContainerFailed(MAX_STARTS)),
            ),
            (
                "starting",
                Facts {
                    paved: Some(&fresh),
                    container: ContainerState::Starting,
                    ..base.clone()
                },
                Action::Wait(Wait::ContainerStarting),
            ),
            (
                "running, Node appeared",
                Facts {
                    paved: Some(&fresh),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    ..base.clone()
                },
                Action::RecordJoin("uid-a".into()),
            ),
            (
                "running, joined, Node there",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    recorded_node_uid: Some("uid-a"),
                    ..base.clone()
                },
                Action::Steady,
            ),
            (
                "a newer version while the Node exists is not applied (OnDelete)",
                Facts {
                    desired: Some(&v2),
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    recorded_node_uid: Some("uid-a"),
                    ..base.clone()
                },
                Action::Steady,
            ),
            (
                "Node deleted, controller not caught up",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    recorded_node_uid: Some("uid-a"),
                    ..base.clone()
                },
                Action::Wait(Wait::RepaveNotRecorded("node-1".into())),
            ),
            (
                "Node deleted, repave recorded (rollback to v1 from a v2 container)",
                Facts {
                    desired: Some(&v1),
                    paved: Some(&joined_v2),
                    container: ContainerState::Running,
                    ..base.clone()
                },
                pave(&v1, PaveReason::NodeDeleted),
            ),
            (
                "Node replaced by another UID",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-b"),
                    recorded_node_uid: Some("uid-b"),
                    ..base.clone()
                },
                pave(&v1, PaveReason::NodeDeleted),
            ),
            (
                "kubelet stuck on CSINode after a slow registration",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    recorded_node_uid: Some("uid-a"),
                    node_not_ready: Some(
                        "failed to initialize CSINode: error updating CSINode annotation: timed out waiting for the condition; caused by: nodes \"node-1\" not found",
                    ),
                    ..base.clone()
                },
                Action::RestartKubelet,
            ),
            (
                "... but not again within a minute",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    recorded_node_uid: Some("uid-a"),
                    node_not_ready: Some("failed to initialize CSINode: x"),
                    kubelet_recently_restarted: true,
                    ..base.clone()
                },
                Action::Steady,
            ),
            (
                "NotReady for another reason is kubelet's business",
                Facts {
                    paved: Some(&joined),
                    container: ContainerState::Running,
                    node_uid: Some("uid-a"),
                    recorded_node_uid: Some("uid-a"),
                    node_not_ready: Some("container runtime network not ready"),
                    ..base.clone()
                },
                Action::Steady,
            ),
            (
                "Node name changed",
                Facts {
                    paved: Some(&fresh),
                    node_name: "node-2",
                    ..base.clone()
                },
                pave(&v1, PaveReason::NodeNameChanged),
            ),
        ];
        for (case, facts, expected) in cases {
            assert_eq!(decide(&facts), expected, "{case}");
        }
    }
}
