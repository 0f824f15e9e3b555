//! `applyFiles`: the agent's part of an `applyConfiguration` (see
//! `unbounded_api::in_place`). The controller creates it with the configuration, the version
//! the Machine records and the target ([`AgentApply`]); the agent reads both versions,
//! decides the steps with the same table the controller used
//! ([`unbounded_api::in_place::decide`], [`ApplyPlan::agent_steps`]), and carries them out
//! on the running node container: every file written into the container's root (atomically,
//! the same writer and the same rendering as a pave: [`crate::rootfs::write_file`],
//! [`crate::render::kubelet_env`]), then each unit named by a changed file (and
//! `kubelet.service` when its flags changed) restarted once, through the container's own
//! systemd. Each step is reported in the operation's status; the controller records the
//! version only once the operation is Complete.
//!
//! Decided first ([`check`], [`work`]: everything that can be refused — a mode, a flag, a
//! unit name, a change that needs a repave — is refused before anything is written), then
//! done ([`carry_out`]). It runs with the agent's state held (no pave at the same time), and
//! records the target as what the container holds, so that a resumed operation whose steps
//! all ran completes without running them again.
//!
//! A failed step leaves what was written written: the operation fails and says so, the
//! Machine keeps the version it records, and a repave (delete the Node) restores that one.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kube::api::Api;
use unbounded_api::in_place::{AgentApply, AgentStep, ApplyPlan, decide};
use unbounded_api::{MachineConfigurationVersion, MachineOperation, MachineTemplate};
use unbounded_runtime::handler::{self, Outcome};

use crate::container_root::{self, RootFile};
use crate::plan::Paved;
use crate::render::{self, KubeletInput};
use crate::rootfs;
use crate::systemd::{Systemd, valid_unit_name};

/// Why the agent's part cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyFilesError {
    /// The change needs a repave (the controller should not have asked).
    #[error("version {version} needs a repave, not an in-place apply: {why}")]
    NeedsRepave {
        /// The target version.
        version: i64,
        /// The repave reasons.
        why: String,
    },
    /// A file's mode is not octal permission bits.
    #[error("file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: rootfs::BadMode,
    },
    /// kubelet's flags cannot be rendered.
    #[error(transparent)]
    Render(#[from] render::RenderError),
    /// A `restartUnits` entry is not a unit name.
    #[error("{0:?} in restartUnits is not a systemd unit name (such as containerd.service)")]
    Unit(String),
}

/// What is on this host, as the agent's state and systemd say.
#[derive(Debug, Clone, Copy)]
pub struct ContainerFacts<'a> {
    /// The node container's name.
    pub node: &'a str,
    /// What this boot paved (and applied since).
    pub paved: Option<&'a Paved>,
    /// A pave was started and did not finish.
    pub paving: bool,
    /// The container's unit is active.
    pub running: bool,
}

/// Whether the agent's part can run now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// The container holds the `from` version: apply.
    Apply,
    /// The container holds the target already (a resumed operation whose steps all ran).
    AlreadyApplied,
    /// Not now: the operation stays InProgress and is resumed on the agent's next pass.
    Postpone(String),
    /// Never: fail the operation with this message.
    Refuse(String),
}

/// Decides whether the agent's part can run on this container.
pub fn check(apply: &AgentApply, facts: &ContainerFacts<'_>) -> Precondition {
    if facts.paving {
        return Precondition::Postpone("a pave of the node container is under way".into());
    }
    let Some(paved) = facts.paved.filter(|p| p.container == facts.node) else {
        return Precondition::Refuse(format!(
            "no node container {} is paved on this boot",
            facts.node
        ));
    };
    let held = &paved.configuration;
    if held.name == apply.configuration && held.version == apply.version {
        return Precondition::AlreadyApplied;
    }
    if held.name != apply.configuration || held.version != apply.from {
        return Precondition::Refuse(format!(
            "the node container holds {} version {}, not {} version {}: apply again from what the Machine records",
            held.name, held.version, apply.configuration, apply.from
        ));
    }
    if !facts.running {
        return Precondition::Refuse(format!(
            "the node container {} is not running: its units cannot be restarted (delete the Node to repave)",
            facts.node
        ));
    }
    Precondition::Apply
}

/// The work, concretely: the files to write into the container's root (path inside, bytes,
/// mode) and then the units to restart, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// Written first, all of them.
    pub writes: Vec<RootFile>,
    /// Restarted after every write, each once.
    pub restarts: Vec<String>,
}

impl Work {
    /// For a person: what was written.
    pub fn paths(&self) -> String {
        let paths: Vec<&str> = self.writes.iter().map(|(p, _, _)| p.as_str()).collect();
        paths.join(", ")
    }
}

/// Decides the work of moving the container from `old` to `new` (version `version`),
/// rendering kubelet's flags as a pave does. Everything is checked before anything is done.
pub fn work(
    old: &MachineTemplate,
    new: &MachineTemplate,
    version: i64,
    node: &str,
    node_ip: Option<crate::node_address::NodeIps>,
) -> Result<Work, ApplyFilesError> {
    let plan: ApplyPlan = decide(old, new);
    if plan.needs_repave() {
        return Err(ApplyFilesError::NeedsRepave {
            version,
            why: plan.repave_summary(),
        });
    }
    let kubernetes = new.kubernetes.clone().unwrap_or_default();
    let mut out = Work {
        writes: Vec::new(),
        restarts: Vec::new(),
    };
    for step in plan.agent_steps() {
        match step {
            AgentStep::WriteFile(file) => {
                let mode = rootfs::parse_mode(file.mode.as_deref()).map_err(|source| {
                    ApplyFilesError::File {
                        path: file.path.clone(),
                        source,
                    }
                })?;
                out.writes
                    .push((file.path.clone(), file.content.into_bytes(), mode));
            }
            AgentStep::WriteKubeletFlags(args) => {
                // The same flags file a pave writes (the server, token and provider ID are
                // not in it).
                let env = render::kubelet_env(&KubeletInput {
                    node_name: node,
                    server: "",
                    bootstrap_token: "",
                    provider_id: None,
                    labels: &kubernetes.node_labels,
                    taints: &kubernetes.node_taints,
                    extra_args: &args,
                    node_ip,
                })?;
                out.writes
                    .push((render::KUBELET_ENV.to_owned(), env.into_bytes(), 0o644));
            }
            AgentStep::Restart(unit) => {
                if !valid_unit_name(&unit) || !unit.contains('.') {
                    return Err(ApplyFilesError::Unit(unit));
                }
                out.restarts.push(unit);
            }
        }
    }
    Ok(out)
}

/// Restarts units in the node container: its own systemd in production
/// ([`Systemd::container`]); the only part that needs a running systemd, kept behind this
/// so that everything else runs in tests.
pub trait RestartUnits: Sync {
    /// Restarts `unit` and waits until it is active again.
    fn restart(&self, unit: &str) -> impl Future<Output = Result<(), String>> + Send;
}

/// The node container's systemd, reached through the bus socket bound out of it.
#[derive(Debug, Clone)]
pub struct ContainerSystemd {
    /// The container's system bus socket, as the host sees it.
    pub socket: String,
}

impl RestartUnits for ContainerSystemd {
    fn restart(&self, unit: &str) -> impl Future<Output = Result<(), String>> + Send {
        let (socket, unit) = (self.socket.clone(), unit.to_owned());
        async move {
            let systemd = Systemd::container(&socket)
                .await
                .map_err(|e| e.to_string())?;
            systemd
                .restart(&unit, Duration::from_secs(120))
                .await
                .map_err(|e| e.to_string())
        }
    }
}

/// Where the agent's part acts: the operation it reports on, and the container.
#[derive(Debug)]
pub struct Target<'a, U> {
    /// MachineOperations, as the agent may touch them.
    pub operations: &'a Api<MachineOperation>,
    /// The operation's name.
    pub name: &'a str,
    /// The field manager it was claimed under.
    pub field_manager: &'a str,
    /// The container's root on the host.
    pub root: &'a Path,
    /// Restarts units in the container.
    pub units: &'a U,
}

async fn step<U>(target: &Target<'_, U>, message: &str) {
    println!("unbounded-agent: {}: {message}", target.name);
    if let Err(error) = handler::progress(
        target.operations,
        target.field_manager,
        target.name,
        message,
    )
    .await
    {
        tracing::warn!(%error, "reporting a step of {} failed", target.name);
    }
}

/// Carries the work out, reporting each step; the outcome to finish the operation with.
pub async fn carry_out<U: RestartUnits>(target: &Target<'_, U>, work: Work) -> Outcome {
    let written = work.paths();
    if !work.writes.is_empty() {
        step(target, &format!("writing {written}")).await;
        if let Err(error) = container_root::write_files(target.root, work.writes).await {
            return Outcome::Failed(format!("writing {written}: {error}"));
        }
    }
    let total = work.restarts.len();
    for (i, unit) in work.restarts.iter().enumerate() {
        step(
            target,
            &format!("wrote {written}; restarting {unit} ({} of {total})", i + 1),
        )
        .await;
        if let Err(error) = target.units.restart(unit).await {
            return Outcome::Failed(format!(
                "wrote {written}, but restarting {unit} in the node container failed: {error}"
            ));
        }
    }
    let restarted = if total == 0 {
        "nothing to restart".to_owned()
    } else {
        format!("restarted {}", work.restarts.join(", "))
    };
    Outcome::Complete(format!("wrote {written}; {restarted}"))
}

/// What reading a version gave.
async fn template(
    versions: &Api<MachineConfigurationVersion>,
    name: &str,
) -> Result<MachineTemplate, String> {
    versions
        .get(name)
        .await
        .map(|v| v.spec.template)
        .map_err(|e| format!("reading MachineConfigurationVersion {name}: {e}"))
}

/// Runs a claimed `applyFiles` operation on the container `facts` describe. Returns the
/// outcome (`None` to postpone: the operation stays InProgress) and whether the container
/// now holds the target (the caller records it).
pub async fn run<U: RestartUnits>(
    target: &Target<'_, U>,
    versions: &Api<MachineConfigurationVersion>,
    parameters: &std::collections::BTreeMap<String, String>,
    facts: &ContainerFacts<'_>,
) -> (Option<Outcome>, bool) {
    let apply = match AgentApply::from_parameters(parameters) {
        Ok(a) => a,
        Err(message) => return (Some(Outcome::Failed(message)), false),
    };
    match check(&apply, facts) {
        Precondition::Postpone(why) => {
            step(target, &format!("waiting: {why}")).await;
            return (None, false);
        }
        Precondition::Refuse(why) => return (Some(Outcome::Failed(why)), false),
        Precondition::AlreadyApplied => {
            return (
                Some(Outcome::Complete(format!(
                    "the node container holds {} version {} already",
                    apply.configuration, apply.version
                ))),
                true,
            );
        }
        Precondition::Apply => {}
    }
    let (old, new) = match (
        template(versions, &apply.from_version_name()).await,
        template(versions, &apply.target_version_name()).await,
    ) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(e), _) | (_, Err(e)) => return (Some(Outcome::Failed(e)), false),
    };
    let node_ip = facts.paved.and_then(|p| p.node_ip);
    let work = match work(&old, &new, apply.version, facts.node, node_ip) {
        Ok(w) => w,
        Err(error) => return (Some(Outcome::Failed(error.to_string())), false),
    };
    let outcome = carry_out(target, work).await;
    let applied = matches!(outcome, Outcome::Complete(_));
    (Some(outcome), applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::{FileSpec, KubernetesSpec, ResolvedConfiguration};

    fn paved(version: i64) -> Paved {
        Paved {
            container: "n1".into(),
            configuration: ResolvedConfiguration {
                name: "general".into(),
                version,
            },
            image_sha256: "x".into(),
            joined_node_uid: None,
            starts: 1,
            node_ip: None,
        }
    }

    #[test]
    fn check_table() {
        let apply = AgentApply {
            configuration: "general".into(),
            from: 1,
            version: 2,
        };
        let (v1, v2, v3) = (paved(1), paved(2), paved(3));
        let facts = |paved: Option<&'static Paved>, paving, running| ContainerFacts {
            node: "n1",
            paved,
            paving,
            running,
        };
        // Leaked so that the table's facts can borrow them for 'static: a test.
        let (v1, v2, v3): (&'static Paved, &'static Paved, &'static Paved) = (
            Box::leak(Box::new(v1)),
            Box::leak(Box::new(v2)),
            Box::leak(Box::new(v3)),
        );
        let cases = [
            (
                "holds from, running: apply",
                facts(Some(v1), false, true),
                "Apply",
            ),
            (
                "holds the target: done",
                facts(Some(v2), false, true),
                "AlreadyApplied",
            ),
            (
                "a pave under way: later",
                facts(Some(v1), true, true),
                "Postpone",
            ),
            ("nothing paved: refused", facts(None, false, true), "Refuse"),
            (
                "another version: refused",
                facts(Some(v3), false, true),
                "Refuse",
            ),
            (
                "not running: refused",
                facts(Some(v1), false, false),
                "Refuse",
            ),
        ];
        for (case, facts, expected) in cases {
            let got = format!("{:?}", check(&apply, &facts));
            assert!(got.starts_with(expected), "{case}: {got}");
        }
    }

    fn template(files: Vec<FileSpec>, args: &[(&str, &str)]) -> MachineTemplate {
        MachineTemplate {
            files,
            kubernetes: Some(KubernetesSpec {
                node_labels: [("rack".to_owned(), "r1".to_owned())].into(),
                kubelet_extra_args: args
                    .iter()
                    .map(|(a, b)| ((*a).into(), (*b).into()))
                    .collect(),
                ..KubernetesSpec::default()
            }),
            ..MachineTemplate::default()
        }
    }

    fn file(path: &str, content: &str, mode: Option<&str>, units: &[&str]) -> FileSpec {
        FileSpec {
            path: path.into(),
            content: content.into(),
            mode: mode.map(str::to_owned),
            restart_units: units.iter().map(|u| (*u).to_owned()).collect(),
        }
    }

    #[test]
    fn work_table() {
        let a = file("/etc/a", "1", None, &["containerd.service"]);
        let a2 = file("/etc/a", "2", Some("0600"), &["containerd.service"]);
        let w = work(
            &template(vec![a.clone()], &[]),
            &template(vec![a2.clone()], &[("max-pods", "50")]),
            2,
            "n1",
            // The address the pave gave kubelet stays in its flags.
            Some(crate::node_address::NodeIps::single(
                std::net::IpAddr::from([10, 99, 0, 21]),
            )),
        )
        .unwrap();
        assert_eq!(
            w.writes,
            vec![
                ("/etc/a".to_owned(), b"2".to_vec(), 0o600),
                (
                    render::KUBELET_ENV.to_owned(),
                    b"# Written by unbounded-agent from the MachineConfigurationVersion.\nKUBELET_ARGS=\"--hostname-override=n1 --node-labels=rack=r1 --node-ip=10.99.0.21 --max-pods=50\"\n".to_vec(),
                    0o644
                ),
            ]
        );
        assert_eq!(w.restarts, ["containerd.service", "kubelet.service"]);

        let refused = [
            (
                "a removed file needs a repave",
                template(vec![a.clone()], &[]),
                template(vec![], &[]),
                "needs a repave",
            ),
            (
                "a bad mode",
                template(vec![], &[]),
                template(vec![file("/etc/b", "x", Some("999"), &[])], &[]),
                "file /etc/b",
            ),
            (
                "a reserved kubelet flag",
                template(vec![], &[]),
                template(vec![], &[("kubeconfig", "/x")]),
                "kubeletExtraArgs",
            ),
            (
                "a unit without its suffix",
                template(vec![], &[]),
                template(vec![file("/etc/b", "x", None, &["containerd"])], &[]),
                "not a systemd unit name",
            ),
        ];
        for (case, old, new, part) in refused {
            let error = work(&old, &new, 2, "n1", None).unwrap_err().to_string();
            assert!(error.contains(part), "{case}: {error}");
        }
    }
}
