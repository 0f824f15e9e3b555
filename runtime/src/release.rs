//! The release of a Machine's disks: before a provider powers a deleted Machine off (or
//! deletes its VM), and before the controller powers off a PXE Machine a pool releases to
//! the inventory, the agent on it wipes the disks that carry this Machine's layout, as
//! the paved version's `spec.template.storage.wipe` says (`always` and `onRelease` wipe,
//! `never` does not), and reports it in `status.agent.releaseWipe`.
//!
//! [`decide_release`] decides from plain data what the provider loop (or, for a pool's
//! release and a `manual` Machine, the controller) does once the Node is gone or drained:
//! - **power off** when the agent reported the disks `Wiped` for this deletion or release
//!   ([`wipe_request`]: a report of an earlier release never counts), when nothing needs a
//!   wipe (no `storage` and no earlier layout left on a disk, `wipe: never`, no
//!   configuration, or no agent ever ran on the machine, so nothing of this Machine was
//!   written to a disk), or when the Machine carries the annotation
//!   `unbounded-cloud.io/release-without-wipe: "true"`;
//! - **wait** while the wipe is pending or under way, up to a timeout (counted from the
//!   moment the loop started waiting: the `DisksWiped` condition's transition time);
//! - **hold** when the agent reported `Failed`, or no `Wiped` came within the timeout: the
//!   condition `DisksWiped=False` says `WipeFailed` or `WipeTimedOut`, the provider's
//!   finalizer stays, so the Machine, and with it the hardware, is not handed on. A later
//!   `Wiped` (the agent retries a failed wipe) or the annotation releases it.
//!
//! Never a power-off of a Machine whose configuration wipes and whose wipe is not reported
//! done, unless skipped by the annotation (a property test below checks it over every
//! combination of facts).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use unbounded_api::storage::{ReleaseWipeStatus, StorageSpec, WipeMethod, WipeState};
use unbounded_api::well_known::{annotations, conditions, reasons};
use unbounded_api::{Machine, ResolvedConfiguration, condition};

/// What the configuration the Machine's disk was paved with says about release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Configured {
    /// No configuration version was ever resolved or paved: nothing was written.
    NoConfiguration,
    /// The version has no `storage`: the node's state lived in RAM.
    NoStorage,
    /// The version's `storage.wipe` and `storage.wipeMethod`.
    Storage {
        /// Whether release wipes (`always`, `onRelease`).
        wipes: bool,
        /// How.
        method: WipeMethod,
    },
    /// The version could not be read (deleted, or not readable): taken as wiping, since a
    /// disk might hold the node's state.
    Unreadable(String),
}

impl Configured {
    /// From a version's `storage`.
    pub fn from_storage(storage: Option<&StorageSpec>) -> Self {
        match storage {
            None => Self::NoStorage,
            Some(s) => Self::Storage {
                wipes: s.wipe().wipes_on_release(),
                method: s.wipe_method(),
            },
        }
    }

    /// Whether a release wipes, given whether the agent reported this Machine's layout on a
    /// disk (`status.agent.storage`): a version without `storage` paved after one with it
    /// leaves the earlier layout there, and the release wipes it (`fast`; the earlier
    /// version's policy is not known any more).
    fn wipes(&self, layout_on_disk: bool) -> bool {
        match self {
            Self::NoConfiguration => false,
            Self::NoStorage => layout_on_disk,
            Self::Storage { wipes, .. } => *wipes,
            Self::Unreadable(_) => true,
        }
    }

    fn method(&self) -> WipeMethod {
        match self {
            Self::Storage { method, .. } => *method,
            _ => WipeMethod::Fast,
        }
    }
}

/// How long the loop waits for a wipe to be reported `Wiped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WipeTimeouts {
    /// For `fast` (signatures and a discard: seconds to minutes).
    pub fast: Duration,
    /// For `overwrite` (every byte: hours on a large disk; longer than the agent's own
    /// limit, so that the agent's report of its failure arrives first).
    pub overwrite: Duration,
}

impl Default for WipeTimeouts {
    fn default() -> Self {
        Self {
            fast: Duration::from_secs(30 * 60),
            overwrite: Duration::from_secs(7 * 3600),
        }
    }
}

impl WipeTimeouts {
    /// The timeout for `method`.
    pub fn for_method(&self, method: WipeMethod) -> Duration {
        match method {
            WipeMethod::Fast => self.fast,
            WipeMethod::Overwrite => self.overwrite,
        }
    }
}

/// Everything the release decision is made from.
#[derive(Debug, Clone)]
pub struct ReleaseFacts<'a> {
    /// What the configuration says.
    pub configured: Configured,
    /// Whether an agent ever reported on this Machine (`status.agent.bootID`): without one,
    /// nothing of the Machine was written to a disk.
    pub agent_seen: bool,
    /// The agent reported this Machine's layout on a disk (`status.agent.storage`), whatever
    /// the running version does with it.
    pub layout_on_disk: bool,
    /// `status.agent.releaseWipe`, if it answers this deletion or release.
    pub reported: Option<&'a ReleaseWipeStatus>,
    /// The Machine carries `unbounded-cloud.io/release-without-wipe: "true"`.
    pub skip: bool,
    /// Since when the loop waits (the `DisksWiped` condition's transition time while it is
    /// False), `None` before the first wait.
    pub waiting_since: Option<Timestamp>,
    /// Now.
    pub now: Timestamp,
    /// The timeouts.
    pub timeouts: WipeTimeouts,
}

/// The configuration version whose storage the Machine's disks may hold: the one its agent
/// recorded as paved, else the one the controller resolved.
pub fn wiping_version(machine: &Machine) -> Option<&ResolvedConfiguration> {
    let status = machine.status.as_ref()?;
    status
        .agent
        .as_ref()
        .and_then(|a| a.paved.as_ref())
        .or(status.configuration.as_ref())
}

/// The release the agent's wipe answers: `None` for a deletion (which outranks a release
/// under way), else the controller's `unbounded-cloud.io/release-wipe` request, if any.
/// The agent writes it into its report, and the gate counts only a report with the same.
pub fn wipe_request(machine: &Machine) -> Option<&str> {
    if machine.metadata.deletion_timestamp.is_some() {
        return None;
    }
    machine
        .annotations()
        .get(annotations::RELEASE_WIPE)
        .map(String::as_str)
}

/// The facts about `machine` (its agent's report for this deletion or release, the
/// annotation, since when its `DisksWiped` condition has been False), with what its
/// version says.
pub fn facts_of(
    machine: &Machine,
    configured: Configured,
    now: Timestamp,
    timeouts: WipeTimeouts,
) -> ReleaseFacts<'_> {
    let status = machine.status.as_ref();
    let agent = status.and_then(|s| s.agent.as_ref());
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let request = wipe_request(machine);
    ReleaseFacts {
        configured,
        agent_seen: agent.is_some_and(|a| a.boot_id.is_some()),
        layout_on_disk: agent.is_some_and(|a| a.storage.is_some()),
        reported: agent
            .and_then(|a| a.release_wipe.as_ref())
            .filter(|r| r.request.as_deref() == request),
        skip: machine
            .annotations()
            .get(annotations::RELEASE_WITHOUT_WIPE)
            .is_some_and(|v| v == "true"),
        waiting_since: condition::find(conditions, conditions::DISKS_WIPED)
            .filter(|c| c.status == "False")
            .map(|c| c.last_transition_time.0),
        now,
        timeouts,
    }
}

/// What the provider loop does next for a deleted Machine whose Node is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseStep {
    /// Release the infrastructure (power off, delete the VM); `DisksWiped=True` with
    /// `reason` (`Wiped`, `WipeNotNeeded`), or False with `WipeSkipped`.
    PowerOff {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// Wait for the agent (`DisksWiped=False`, `WipePending`).
    Wait {
        /// What the loop waits for.
        message: String,
    },
    /// Keep the Machine: `DisksWiped=False` with `reason` (`WipeFailed`, `WipeTimedOut`).
    Hold {
        /// The condition's reason.
        reason: &'static str,
        /// What happened and what a person can do.
        message: String,
    },
}

impl ReleaseStep {
    /// The `DisksWiped` condition's status.
    pub fn condition_status(&self) -> bool {
        matches!(
            self,
            Self::PowerOff {
                reason: reasons::WIPED | reasons::WIPE_NOT_NEEDED,
                ..
            }
        )
    }

    /// The condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::PowerOff { reason, .. } | Self::Hold { reason, .. } => reason,
            Self::Wait { .. } => reasons::WIPE_PENDING,
        }
    }

    /// The condition's message.
    pub fn message(&self) -> &str {
        match self {
            Self::PowerOff { message, .. }
            | Self::Hold { message, .. }
            | Self::Wait { message } => message,
        }
    }
}

const RECOURSE: &str = "the Machine is kept so that the hardware is not handed on with its data; \
    fix the machine so that its agent can wipe (it retries), or wipe the disks by other means \
    and annotate the Machine unbounded-cloud.io/release-without-wipe=true";

/// Decides whether a deleted Machine is powered off now, waited on, or held.
pub fn decide_release(facts: &ReleaseFacts<'_>) -> ReleaseStep {
    let reported = facts.reported;
    if let Some(r) = reported.filter(|r| r.state == WipeState::Wiped) {
        let disks = if r.disks.is_empty() {
            "no disk carried this Machine's layout".to_owned()
        } else {
            format!("disks {} wiped", r.disks.join(", "))
        };
        return ReleaseStep::PowerOff {
            reason: reasons::WIPED,
            message: format!("{disks} by the agent ({} wipe)", r.method.as_str()),
        };
    }
    if !facts.configured.wipes(facts.layout_on_disk) || !facts.agent_seen {
        let why = match (&facts.configured, facts.agent_seen) {
            (Configured::NoConfiguration, _) => "no configuration was ever resolved",
            (Configured::NoStorage, _) => {
                "the configuration keeps the node's state in RAM and no disk carries this Machine's layout"
            }
            (Configured::Storage { wipes: false, .. }, _) => {
                "the configuration says storage.wipe: never"
            }
            _ => "no agent ever ran on the machine: nothing was written to its disks",
        };
        return ReleaseStep::PowerOff {
            reason: reasons::WIPE_NOT_NEEDED,
            message: format!("no wipe on release: {why}"),
        };
    }
    if facts.skip {
        return ReleaseStep::PowerOff {
            reason: reasons::WIPE_SKIPPED,
            message: "released without a wipe: the Machine is annotated unbounded-cloud.io/release-without-wipe=true".into(),
        };
    }
    if let Some(r) = reported.filter(|r| r.state == WipeState::Failed) {
        return ReleaseStep::Hold {
            reason: reasons::WIPE_FAILED,
            message: format!(
                "the agent could not wipe the disks: {}; {RECOURSE}",
                r.message.as_deref().unwrap_or("no message")
            ),
        };
    }
    let method = reported.map_or_else(|| facts.configured.method(), |r| r.method);
    let timeout = facts.timeouts.for_method(method);
    let waited = facts
        .waiting_since
        .map(|since| facts.now.duration_since(since))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let doing = match (reported.map(|r| r.state), &facts.configured) {
        (Some(WipeState::Wiping), _) => "the agent is wiping the disks".to_owned(),
        (Some(WipeState::Pending), _) => {
            "the agent waits for the Node to be gone before it wipes".to_owned()
        }
        (_, Configured::Unreadable(why)) => format!(
            "the configuration version could not be read ({why}); waiting for the agent's wipe report"
        ),
        (_, Configured::NoStorage) => "the configuration keeps the node's state in RAM, but an earlier version's layout is on a disk; waiting for the agent to wipe it".to_owned(),
        _ => "waiting for the agent to report the wipe of the disks".to_owned(),
    };
    if waited >= timeout {
        return ReleaseStep::Hold {
            reason: reasons::WIPE_TIMED_OUT,
            message: format!(
                "no wipe reported within {} s ({doing}; a powered-off machine cannot wipe); {RECOURSE}",
                timeout.as_secs()
            ),
        };
    }
    ReleaseStep::Wait {
        message: format!(
            "{doing} ({} wipe; held as WipeTimedOut after {} s)",
            method.as_str(),
            timeout.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    fn report(state: WipeState) -> ReleaseWipeStatus {
        ReleaseWipeStatus {
            state,
            method: WipeMethod::Fast,
            disks: vec!["sda".into()],
            message: Some("wipefs: Permission denied".into()),
            started_at: None,
            finished_at: None,
            request: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    const WIPES: Configured = Configured::Storage {
        wipes: true,
        method: WipeMethod::Fast,
    };
    const OVERWRITES: Configured = Configured::Storage {
        wipes: true,
        method: WipeMethod::Overwrite,
    };
    const NEVER: Configured = Configured::Storage {
        wipes: false,
        method: WipeMethod::Fast,
    };

    /// (case, configured, agent seen, reported, skip, waiting since, now, reason)
    type Case<'a> = (
        &'a str,
        Configured,
        bool,
        Option<&'a ReleaseWipeStatus>,
        bool,
        Option<i64>,
        i64,
        &'a str,
    );

    #[test]
    fn release_table() {
        let wiped = report(WipeState::Wiped);
        let failed = report(WipeState::Failed);
        let wiping = report(WipeState::Wiping);
        let pending = report(WipeState::Pending);
        let fast = WipeTimeouts::default().fast.as_secs() as i64;
        let overwrite = WipeTimeouts::default().overwrite.as_secs() as i64;
        let cases: Vec<Case<'_>> = vec![
            (
                "wiped: power off",
                WIPES,
                true,
                Some(&wiped),
                false,
                Some(0),
                10,
                reasons::WIPED,
            ),
            (
                "wiped after the timeout: power off",
                WIPES,
                true,
                Some(&wiped),
                false,
                Some(0),
                fast * 3,
                reasons::WIPED,
            ),
            (
                "never: at once",
                NEVER,
                true,
                None,
                false,
                None,
                0,
                reasons::WIPE_NOT_NEEDED,
            ),
            (
                "no storage: at once",
                Configured::NoStorage,
                true,
                None,
                false,
                None,
                0,
                reasons::WIPE_NOT_NEEDED,
            ),
            (
                "no configuration: at once",
                Configured::NoConfiguration,
                true,
                None,
                false,
                None,
                0,
                reasons::WIPE_NOT_NEEDED,
            ),
            (
                "no agent ever ran: at once",
                WIPES,
                false,
                None,
                false,
                None,
                0,
                reasons::WIPE_NOT_NEEDED,
            ),
            (
                "first look: wait",
                WIPES,
                true,
                None,
                false,
                None,
                0,
                reasons::WIPE_PENDING,
            ),
            (
                "agent pending: wait",
                WIPES,
                true,
                Some(&pending),
                false,
                Some(0),
                5,
                reasons::WIPE_PENDING,
            ),
            (
                "agent wiping: wait",
                WIPES,
                true,
                Some(&wiping),
                false,
                Some(0),
                fast - 1,
                reasons::WIPE_PENDING,
            ),
            (
                "wiping past the timeout: hold",
                WIPES,
                true,
                Some(&wiping),
                false,
                Some(0),
                fast,
                reasons::WIPE_TIMED_OUT,
            ),
            (
                "no report past the timeout: hold",
                WIPES,
                true,
                None,
                false,
                Some(0),
                fast + 1,
                reasons::WIPE_TIMED_OUT,
            ),
            (
                "overwrite gets its own timeout",
                OVERWRITES,
                true,
                None,
                false,
                Some(0),
                fast + 1,
                reasons::WIPE_PENDING,
            ),
            (
                "overwrite past its timeout: hold",
                OVERWRITES,
                true,
                None,
                false,
                Some(0),
                overwrite,
                reasons::WIPE_TIMED_OUT,
            ),
            (
                "failed: hold",
                WIPES,
                true,
                Some(&failed),
                false,
                Some(0),
                5,
                reasons::WIPE_FAILED,
            ),
            (
                "failed, annotated: power off",
                WIPES,
                true,
                Some(&failed),
                true,
                Some(0),
                5,
                reasons::WIPE_SKIPPED,
            ),
            (
                "timed out, annotated: power off",
                WIPES,
                true,
                None,
                true,
                Some(0),
                fast * 2,
                reasons::WIPE_SKIPPED,
            ),
            (
                "annotated before any wait: power off",
                WIPES,
                true,
                None,
                true,
                None,
                0,
                reasons::WIPE_SKIPPED,
            ),
            (
                "unreadable version: wait",
                Configured::Unreadable("404".into()),
                true,
                None,
                false,
                Some(0),
                5,
                reasons::WIPE_PENDING,
            ),
            (
                "unreadable version past the timeout: hold",
                Configured::Unreadable("404".into()),
                true,
                None,
                false,
                Some(0),
                fast,
                reasons::WIPE_TIMED_OUT,
            ),
        ];
        for (case, configured, agent_seen, reported, skip, since, now, reason) in cases {
            let step = decide_release(&ReleaseFacts {
                configured,
                agent_seen,
                layout_on_disk: false,
                reported,
                skip,
                waiting_since: since.map(at),
                now: at(now),
                timeouts: WipeTimeouts::default(),
            });
            assert_eq!(step.reason(), reason, "{case}: {step:?}");
            let powers_off = matches!(step, ReleaseStep::PowerOff { .. });
            assert_eq!(
                powers_off,
                [
                    reasons::WIPED,
                    reasons::WIPE_NOT_NEEDED,
                    reasons::WIPE_SKIPPED
                ]
                .contains(&reason),
                "{case}"
            );
        }
    }

    #[test]
    fn a_hold_says_what_to_do() {
        let failed = report(WipeState::Failed);
        let step = decide_release(&ReleaseFacts {
            configured: WIPES,
            agent_seen: true,
            layout_on_disk: true,
            reported: Some(&failed),
            skip: false,
            waiting_since: Some(at(0)),
            now: at(1),
            timeouts: WipeTimeouts::default(),
        });
        assert!(
            step.message().contains("wipefs: Permission denied"),
            "{step:?}"
        );
        assert!(
            step.message()
                .contains("unbounded-cloud.io/release-without-wipe=true"),
            "{step:?}"
        );
        assert!(!step.condition_status());
    }

    fn configured() -> impl Strategy<Value = Configured> {
        prop_oneof![
            Just(Configured::NoConfiguration),
            Just(Configured::NoStorage),
            any::<(bool, bool)>().prop_map(|(wipes, overwrite)| Configured::Storage {
                wipes,
                method: if overwrite {
                    WipeMethod::Overwrite
                } else {
                    WipeMethod::Fast
                },
            }),
            Just(Configured::Unreadable("forbidden".into())),
        ]
    }

    fn state() -> impl Strategy<Value = Option<WipeState>> {
        prop_oneof![
            Just(None),
            Just(Some(WipeState::Pending)),
            Just(Some(WipeState::Wiping)),
            Just(Some(WipeState::Wiped)),
            Just(Some(WipeState::Failed)),
        ]
    }

    /// The invariant: a Machine whose configuration wipes on release (or cannot be read, or
    /// keeps its state in RAM while an earlier layout is left on a disk), on which an agent
    /// ran, is powered off only once its wipe is reported `Wiped` or a
    /// person said to skip it; never because time passed. And a Machine that needs no wipe
    /// is never held.
    #[test]
    fn never_powered_off_with_its_disks_unwiped() {
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 512,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &[27; 32]),
        );
        let facts = (
            configured(),
            any::<(bool, bool)>(),
            state(),
            any::<bool>(),
            proptest::option::of(0i64..100_000),
            0i64..200_000,
        );
        runner
            .run(
                &facts,
                |(configured, (agent_seen, layout_on_disk), state, skip, since, now)| {
                    let reported = state.map(report);
                    let wipes = match configured {
                        Configured::NoConfiguration | Configured::Storage { wipes: false, .. } => {
                            false
                        }
                        Configured::NoStorage => layout_on_disk,
                        _ => true,
                    };
                    let step = decide_release(&ReleaseFacts {
                        configured,
                        agent_seen,
                        layout_on_disk,
                        reported: reported.as_ref(),
                        skip,
                        waiting_since: since.map(at),
                        now: at(now),
                        timeouts: WipeTimeouts::default(),
                    });
                    let powers_off = matches!(step, ReleaseStep::PowerOff { .. });
                    let needed = wipes && agent_seen;
                    let done = state == Some(WipeState::Wiped);
                    if powers_off && needed {
                        prop_assert!(done || skip, "powered off unwiped: {step:?}");
                    }
                    if !needed || done || skip {
                        prop_assert!(powers_off, "held without a reason: {step:?}");
                    }
                    prop_assert_eq!(
                        step.condition_status(),
                        powers_off && step.reason() != reasons::WIPE_SKIPPED
                    );
                    Ok(())
                },
            )
            .unwrap();
    }

    fn machine(deleting: bool, release_wipe: Option<&str>, reported: Option<&str>) -> Machine {
        let mut annotations = serde_json::Map::new();
        if let Some(value) = release_wipe {
            annotations.insert(annotations::RELEASE_WIPE.into(), value.into());
        }
        let report = reported.map(
            |request| serde_json::json!({"state": "Wiped", "method": "fast", "request": request}),
        );
        serde_json::from_value(serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {
                "name": "m1",
                "annotations": annotations,
                "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
            },
            "spec": {"provider": "pxe"},
            "status": {"agent": {
                "bootID": "b1",
                "storage": {"disk": "sda", "sizeBytes": 1, "action": "left"},
                "releaseWipe": report.unwrap_or_else(
                    || serde_json::json!({"state": "Wiped", "method": "fast"})
                ),
            }},
        }))
        .unwrap()
    }

    /// A report counts only for the deletion or release it answers: a `Wiped` of an earlier
    /// release (or of none) never lets a later one power off unwiped.
    #[test]
    fn only_the_report_for_this_request_counts() {
        let cases = [
            // (case, deleting, release-wipe annotation, report's request, counts)
            ("deletion, deletion's report", true, None, None, true),
            (
                "deletion, an earlier release's report",
                true,
                None,
                Some("t1"),
                false,
            ),
            ("deletion mid-release", true, Some("t1"), Some("t1"), false),
            (
                "release, its own report",
                false,
                Some("t2"),
                Some("t2"),
                true,
            ),
            (
                "release, an earlier release's",
                false,
                Some("t2"),
                Some("t1"),
                false,
            ),
            (
                "release, a report with no request",
                false,
                Some("t2"),
                None,
                false,
            ),
        ];
        for (case, deleting, annotation, request, counts) in cases {
            let m = machine(deleting, annotation, request);
            let facts = facts_of(&m, WIPES, at(0), WipeTimeouts::default());
            assert_eq!(facts.reported.is_some(), counts, "{case}");
            assert!(facts.layout_on_disk, "{case}");
            let step = decide_release(&facts);
            assert_eq!(step.reason() == reasons::WIPED, counts, "{case}: {step:?}");
        }
        // A version without storage, with an earlier layout left on a disk: waits for it.
        let m = machine(false, Some("t3"), Some("t2"));
        let step = decide_release(&facts_of(
            &m,
            Configured::NoStorage,
            at(0),
            WipeTimeouts::default(),
        ));
        assert_eq!(step.reason(), reasons::WIPE_PENDING, "{step:?}");
        assert!(
            step.message().contains("earlier version's layout"),
            "{step:?}"
        );
    }
}
