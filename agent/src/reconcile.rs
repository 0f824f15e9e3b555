//! One pass of the agent's loop: the Machine (and the version it resolves to), its Node and
//! the container's unit read, the next step decided ([`crate::plan::decide`]), carried out
//! (pave, start, restart kubelet, remember the join) and reported. A failed step is retried
//! with a growing backoff, and the Machine's status says why and when.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::Api;
use unbounded_api::storage::{ReleaseWipeStatus, WipeMethod, WipeState};
use unbounded_api::{Machine, MachineConfigurationVersion, ResolvedConfiguration};
use unbounded_runtime::handler::Outcome;
use unbounded_runtime::release::wipe_request;

use crate::context::Context;
use crate::operation_tasks::restart_service;
use crate::operations::Scope;
use crate::pave::pave;
use crate::plan::{self, Action, ContainerState, Facts, Wait};
use crate::release::{Letting, ReleaseAction, ReleaseFacts, StorageKnown, decide_release};
use crate::retry::backoff;
use crate::state::KeptState;
use crate::status::{self, Readiness};
use crate::systemd;

/// What the loop remembers from one pass to the next.
pub(crate) struct Reconciler {
    /// Deployed (immutable) versions read so far.
    version_cache: BTreeMap<String, Arc<MachineConfigurationVersion>>,
    /// Failed steps in a row.
    failures: u32,
    /// No pave or start before this.
    retry_after: Option<Instant>,
    /// What the last failed step reported, said again until the retry: the plan's own
    /// readiness ("paving …") would otherwise replace it in the Machine's status at the next
    /// pass, and why a pave fails would show only for the seconds between two passes.
    last_failure: Option<Readiness>,
    /// When kubelet was last restarted for a Node that never registered.
    kubelet_restarted: Option<Instant>,
    /// The release wipe, once the Machine is being deleted.
    release: ReleaseProgress,
}

/// Where the release wipe is, as this agent knows it.
#[derive(Debug, Default)]
struct ReleaseProgress {
    /// The release request the progress is for (`None`: a deletion).
    request: Option<String>,
    /// Read from the Machine once per request (an agent restarted mid-release goes on from
    /// there).
    seeded: bool,
    /// The state last reported.
    reported: Option<WipeState>,
    /// Wipes that failed.
    failed_attempts: u32,
    /// No new attempt before this.
    retry_after: Option<Instant>,
}

/// The pause after a failed release wipe.
const WIPE_RETRY_PAUSE: Duration = Duration::from_secs(60);

impl Reconciler {
    /// Starts with nothing learnt (this boot's state is the context's).
    pub(crate) fn new() -> Self {
        Self {
            version_cache: BTreeMap::new(),
            failures: 0,
            retry_after: None,
            last_failure: None,
            kubelet_restarted: None,
            release: ReleaseProgress::default(),
        }
    }
}

/// What the agent reports while it waits to retry a failed pave or start: that failure, as
/// it was reported (the same text, so no new status write each pass), not the plan's
/// "paving …", which would hide why the machine has no Node.
fn while_backing_off(planned: Readiness, last_failure: Option<&Readiness>) -> Readiness {
    last_failure.cloned().unwrap_or(planned)
}

fn release_status(
    state: WipeState,
    method: WipeMethod,
    disks: Vec<String>,
    message: Option<String>,
    started_at: Option<Time>,
) -> ReleaseWipeStatus {
    ReleaseWipeStatus {
        state,
        method,
        disks,
        message,
        started_at,
        finished_at: None,
        request: None,
    }
}

/// The Ready condition's message of a Node that is not Ready.
fn node_not_ready_message(node: Option<&Node>) -> Option<&str> {
    let ready = node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (ready.status != "True").then(|| ready.message.as_deref().unwrap_or_default())
}

impl Reconciler {
    async fn version(
        &mut self,
        versions: &Api<MachineConfigurationVersion>,
        resolved: &ResolvedConfiguration,
    ) -> Option<Arc<MachineConfigurationVersion>> {
        let name = resolved.version_name();
        if let Some(v) = self.version_cache.get(&name) {
            return Some(v.clone());
        }
        match versions.get(&name).await {
            Ok(v) => {
                let v = Arc::new(v);
                // Deployed versions are immutable: caching them is safe.
                if v.status.as_ref().is_some_and(|s| s.deployed) {
                    self.version_cache.insert(name, v.clone());
                }
                Some(v)
            }
            Err(error) => {
                // 403 until the controller adds it to our role: the role's change wakes us.
                tracing::debug!(%error, version = %name, "version not readable yet");
                None
            }
        }
    }

    /// One pass: decide from the Machine, its Node and this host, act, report.
    pub(crate) async fn reconcile(
        &mut self,
        ctx: &Context,
        versions: &Api<MachineConfigurationVersion>,
        machine: &Machine,
        node: Option<&Node>,
    ) {
        // Held for the whole pass: an applyFiles never runs during a pave.
        let mut kept_guard = ctx.kept.lock().await;
        let kept: &mut KeptState = &mut kept_guard;
        let status = machine.status.as_ref();
        let desired = status.and_then(|s| s.configuration.clone());
        let version = match &desired {
            Some(d) => self.version(versions, d).await,
            None => None,
        };
        let unit = systemd::container_unit(&ctx.node);
        let container = match ctx.host.unit_state(&unit).await {
            Ok((load, active)) if kept.state.paved.is_some() => {
                systemd::container_state(&load, &active)
            }
            Ok(_) => ContainerState::Absent,
            Err(error) => {
                tracing::warn!(%error, "reading the container's unit failed");
                ContainerState::Absent
            }
        };
        let node_uid = node.and_then(|n| n.meta().uid.clone());
        let action = plan::decide(&Facts {
            deleting: machine.metadata.deletion_timestamp.is_some(),
            releasing: wipe_request(machine).is_some(),
            desired: desired.as_ref(),
            version_loaded: version.is_some(),
            recorded_node_uid: status
                .and_then(|s| s.node_ref.as_ref())
                .and_then(|r| r.uid.as_deref()),
            node_uid: node_uid.as_deref(),
            node_name: &ctx.node,
            paved: kept.state.paved.as_ref(),
            interrupted: kept.state.paving.is_some(),
            container,
            node_not_ready: node_not_ready_message(node),
            kubelet_recently_restarted: self
                .kubelet_restarted
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60)),
        });
        let paved_label = kept.state.paved.as_ref().map(|p| {
            format!(
                "{} version {}",
                p.configuration.name, p.configuration.version
            )
        });
        let mut readiness = status::readiness(&action, container, paved_label.as_deref());
        let backing_off = self.retry_after.is_some_and(|t| Instant::now() < t);
        match &action {
            Action::Pave { .. } | Action::Start if backing_off => {
                readiness = while_backing_off(readiness, self.last_failure.as_ref());
            }
            Action::Pave {
                configuration,
                reason,
            } => {
                let Some(version) = version else { return };
                println!(
                    "unbounded-agent: paving {} with {} version {} ({})",
                    ctx.node,
                    configuration.name,
                    configuration.version,
                    reason.as_str()
                );
                let _ = ctx.reporter.report(|_| {}, Some(readiness.clone())).await;
                match pave(ctx, kept, machine, configuration, &version, *reason).await {
                    Ok(()) => {
                        self.succeeded();
                        println!("unbounded-agent: node container {} started", ctx.node);
                        readiness = Readiness {
                            ready: true,
                            reason: status::reasons::CONTAINER_RUNNING.into(),
                            message: format!(
                                "node container paved with {} version {} is running",
                                configuration.name, configuration.version
                            ),
                        };
                    }
                    Err(error) => {
                        println!("unbounded-agent: pave failed: {error}");
                        readiness = self.failed(error.reason(), &error.to_string());
                    }
                }
            }
            Action::Start => {
                if let Some(paved) = kept.state.paved.as_mut() {
                    paved.starts += 1;
                }
                kept.save();
                match ctx.host.start(&unit, Duration::from_secs(120)).await {
                    Ok(()) => {
                        self.succeeded();
                    }
                    Err(error) => {
                        readiness =
                            self.failed(status::reasons::CONTAINER_FAILED, &error.to_string());
                    }
                }
            }
            Action::RestartKubelet => {
                self.kubelet_restarted = Some(Instant::now());
                println!(
                    "unbounded-agent: kubelet on {} gave up initialising CSINode before its Node existed; restarting it",
                    ctx.node
                );
                if let Outcome::Failed(message) =
                    restart_service(ctx, "kubelet.service", Scope::Node).await
                {
                    tracing::warn!(message, "restarting kubelet failed");
                }
            }
            Action::RecordJoin(uid) => {
                println!("unbounded-agent: Node {} registered (uid {uid})", ctx.node);
                if let Some(paved) = kept.state.paved.as_mut() {
                    paved.joined_node_uid = Some(uid.clone());
                }
                kept.save();
            }
            Action::Wait(_) | Action::Steady => {}
        }
        let container = match ctx.host.unit_state(&unit).await {
            Ok((load, active)) if kept.state.paved.is_some() => {
                systemd::container_state(&load, &active)
            }
            _ => ContainerState::Absent,
        };
        let paved = kept.state.paved.as_ref().map(|p| p.configuration.clone());
        if let Err(error) = ctx
            .reporter
            .report(
                |agent| {
                    agent.container_state = Some(container.as_str().to_owned());
                    agent.paved = paved;
                },
                Some(readiness),
            )
            .await
        {
            tracing::warn!(%error, "reporting status failed");
        }
        if matches!(action, Action::Wait(Wait::Deleting | Wait::Releasing)) {
            let paved = kept.state.paved.as_ref().map(|p| p.configuration.clone());
            self.release(ctx, versions, machine, node.is_some(), paved)
                .await;
        }
    }

    /// The release of a Machine being deleted: the wipe of its disks, as its configuration
    /// says ([`crate::release`]), reported in `status.agent.releaseWipe`.
    async fn release(
        &mut self,
        ctx: &Context,
        versions: &Api<MachineConfigurationVersion>,
        machine: &Machine,
        node_exists: bool,
        paved: Option<ResolvedConfiguration>,
    ) {
        let status = machine.status.as_ref();
        let request = wipe_request(machine).map(str::to_owned);
        if self.release.request != request {
            self.release = ReleaseProgress {
                request: request.clone(),
                ..ReleaseProgress::default()
            };
        }
        if !self.release.seeded {
            self.release.seeded = true;
            // Only a report for this deletion or release counts.
            self.release.reported = status
                .and_then(|s| s.agent.as_ref())
                .and_then(|a| a.release_wipe.as_ref())
                .filter(|w| w.request == request)
                .map(|w| w.state);
        }
        let letting = match (&machine.metadata.deletion_timestamp, &request) {
            (Some(_), _) => Letting::Deleted,
            (None, Some(_)) => Letting::Released,
            (None, None) => Letting::No,
        };
        let layout_on_disk = status
            .and_then(|s| s.agent.as_ref())
            .is_some_and(|a| a.storage.is_some());
        // The version paved on this boot, else the one the controller resolved (a pave
        // may have written to the disk before the agent restarted).
        let resolved = paved.or_else(|| status.and_then(|s| s.configuration.clone()));
        let version = match &resolved {
            Some(r) => self.version(versions, r).await,
            None => None,
        };
        let storage = match (&resolved, &version) {
            (None, _) => StorageKnown::None,
            (Some(_), None) => StorageKnown::Unknown,
            (Some(_), Some(v)) => v
                .spec
                .template
                .storage
                .as_ref()
                .map_or(StorageKnown::None, StorageKnown::Spec),
        };
        let action = decide_release(&ReleaseFacts {
            letting,
            storage,
            layout_on_disk,
            node_exists,
            reported: self.release.reported,
            failed_attempts: self.release.failed_attempts,
            retry_due: self.release.retry_after.is_none_or(|t| Instant::now() >= t),
        });
        let method = match action {
            ReleaseAction::WaitForNode if self.release.reported != Some(WipeState::Pending) => {
                let method = match storage {
                    StorageKnown::Spec(s) => s.wipe_method(),
                    _ => WipeMethod::Fast,
                };
                self.report_wipe(
                    ctx,
                    release_status(
                        WipeState::Pending,
                        method,
                        Vec::new(),
                        Some("waiting for the Node to be drained and deleted".into()),
                        None,
                    ),
                )
                .await;
                return;
            }
            ReleaseAction::Wipe(method) => method,
            _ => return,
        };
        let started = Some(Time(unbounded_api::condition::now()));
        println!(
            "unbounded-agent: the Machine is being {}: stopping the node container and wiping its disks ({} wipe)",
            if letting == Letting::Deleted {
                "deleted"
            } else {
                "released to the inventory"
            },
            method.as_str()
        );
        self.report_wipe(
            ctx,
            release_status(WipeState::Wiping, method, Vec::new(), None, started.clone()),
        )
        .await;
        let input = crate::storage::shell::DiskInput {
            machines: ctx.paths.machines.clone(),
            state: ctx.paths.state.clone(),
            node: ctx.node.clone(),
            machine: ctx.identity.machine.clone(),
            machine_uid: machine.metadata.uid.clone(),
            scope: crate::storage::probe::DiskScope::All,
            claim: None,
        };
        let unit = systemd::container_unit(&ctx.node);
        let stop = || ctx.host.stop(&unit, Duration::from_secs(120));
        let result = crate::storage::shell::wipe_for_release(
            &input,
            method,
            crate::storage::shell::WIPE_TIMEOUT,
            stop,
        )
        .await;
        let finished = Some(Time(unbounded_api::condition::now()));
        let report = match result {
            Ok(wiped) => {
                println!("unbounded-agent: release wipe done: {}", wiped.summary);
                ReleaseWipeStatus {
                    finished_at: finished,
                    ..release_status(
                        WipeState::Wiped,
                        method,
                        wiped.disks,
                        Some(wiped.summary),
                        started,
                    )
                }
            }
            Err(error) => {
                self.release.failed_attempts += 1;
                self.release.retry_after = Some(Instant::now() + WIPE_RETRY_PAUSE);
                println!("unbounded-agent: release wipe failed: {error}");
                let tries = if self.release.failed_attempts >= crate::release::MAX_WIPE_ATTEMPTS {
                    "given up".to_owned()
                } else {
                    format!("tried again in {} s", WIPE_RETRY_PAUSE.as_secs())
                };
                ReleaseWipeStatus {
                    finished_at: finished,
                    ..release_status(
                        WipeState::Failed,
                        method,
                        Vec::new(),
                        Some(format!(
                            "{error} (attempt {} of {}; {tries})",
                            self.release.failed_attempts,
                            crate::release::MAX_WIPE_ATTEMPTS
                        )),
                        started,
                    )
                }
            }
        };
        self.report_wipe(ctx, report).await;
    }

    /// Records the release wipe's state and writes it (a failed write goes out with the
    /// next one: the ledger keeps it).
    async fn report_wipe(&mut self, ctx: &Context, wipe: ReleaseWipeStatus) {
        self.release.reported = Some(wipe.state);
        let wipe = ReleaseWipeStatus {
            request: self.release.request.clone(),
            ..wipe
        };
        if let Err(error) = ctx
            .reporter
            .report(|agent| agent.release_wipe = Some(wipe), None)
            .await
        {
            tracing::warn!(%error, "reporting the release wipe failed");
        }
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_after = None;
        self.last_failure = None;
    }

    fn failed(&mut self, reason: &str, message: &str) -> Readiness {
        self.failures += 1;
        let wait = backoff(
            self.failures,
            Duration::from_secs(5),
            Duration::from_secs(300),
        );
        self.retry_after = Some(Instant::now() + wait);
        tracing::warn!(reason, message, retry_in = ?wait, "pave step failed");
        let readiness = Readiness {
            ready: false,
            reason: reason.to_owned(),
            message: format!("{message} (retrying in {} s)", wait.as_secs()),
        };
        self.last_failure = Some(readiness.clone());
        readiness
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readiness(reason: &str, message: &str) -> Readiness {
        Readiness {
            ready: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_failure_stays_reported_until_the_retry() {
        let planned = readiness(status::reasons::PAVING, "paving with testbed version 3");
        let failure = readiness(
            status::reasons::INVALID_CONFIGURATION,
            "the configuration asks for kubelet v1.34.4, and its node image carries kubelet v1.35.4 (retrying in 10 s)",
        );
        assert_eq!(while_backing_off(planned.clone(), Some(&failure)), failure);
        assert_eq!(while_backing_off(planned.clone(), None), planned);
    }

    #[test]
    fn success_forgets_the_failure_and_a_failure_is_remembered() {
        let mut reconciler = Reconciler::new();
        let reported = reconciler.failed(status::reasons::CONTAINER_FAILED, "start failed");
        assert_eq!(reconciler.last_failure.as_ref(), Some(&reported));
        assert!(reported.message.starts_with("start failed (retrying in "));
        assert!(reconciler.retry_after.is_some());
        reconciler.succeeded();
        assert_eq!(reconciler.last_failure, None);
        assert_eq!(reconciler.retry_after, None);
        assert_eq!(reconciler.failures, 0);
    }
}
