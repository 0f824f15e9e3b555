//! Repave requests on a Machine (`unbounded-cloud.io/repave: <RFC 3339 time>`), carried out
//! by the Machine reconciler: cordon and drain the Node the Machine recorded (through the
//! same drain code as Machine deletion: PodDisruptionBudgets honoured, at most
//! `--drain-timeout-seconds` after the request), delete it, so that the Machine records what
//! it resolves to now and the agent repaves with it, create the follow-up operation of
//! `unbounded-cloud.io/repave-then` if any (`powerOff` for a released PXE Machine,
//! `pxeBoot` for a remediated one), and mark the Machine `unbounded-cloud.io/repaving` until
//! it is Running again. With `powerOff` the machine is switched off *before* its Node is
//! deleted: a running kubelet registers a deleted Node again within seconds, and on a
//! machine that is then switched off nothing would ever remove it. Rolling updates and remediation request repaves this way; so may a
//! person (`kubectl annotate machine m1 unbounded-cloud.io/repave=$(date -u +%FT%TZ)`).
//!
//! The request applies to the Node recorded in `status.nodeRef` (by UID): a Node registered
//! after the repave is never drained for the same request, even when the controller reads a
//! stale copy of the Machine.
//!
//! Everything about repaving lives here, so that the Machine reconciler, rolling updates
//! ([`crate::rolling`]) and pools ([`crate::pool`]) call one room: this module decides
//! (reading a request, the next step, the names and patches), [`act`] carries it out
//! ([`request`] for owners, [`requested`], [`drain_and_delete`], [`settle`] and
//! [`announce`] for the Machine reconciler).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use unbounded_api::well_known::annotations;

use crate::rollout::elapsed;

pub mod act;

pub use act::{announce, drain_and_delete, request, requested, settle};

/// A repave request, read from a Machine's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepaveRequest {
    /// The annotation's value, as written.
    pub value: String,
    /// When it was requested.
    pub requested: Timestamp,
    /// The operation to create once the Node is deleted.
    pub then: Option<String>,
}

/// What a Machine's annotations say about repaving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestState {
    /// No request.
    None,
    /// A request to carry out.
    Requested(RepaveRequest),
    /// An annotation that is not an RFC 3339 time: reported, not acted on.
    Invalid(String),
}

/// Operations a repave may be followed by.
pub const FOLLOW_UPS: [&str; 2] = [
    unbounded_api::well_known::operations::POWER_OFF,
    unbounded_api::well_known::operations::PXE_BOOT,
];

/// Reads the request from a Machine's annotations.
pub fn read_request(annotations: &BTreeMap<String, String>) -> RequestState {
    let Some(value) = annotations.get(annotations::REPAVE) else {
        return RequestState::None;
    };
    let then = annotations.get(annotations::REPAVE_THEN).cloned();
    if let Some(op) = &then
        && !FOLLOW_UPS.contains(&op.as_str())
    {
        return RequestState::Invalid(format!(
            "{} must be one of {}, not {op:?}",
            annotations::REPAVE_THEN,
            FOLLOW_UPS.join(", ")
        ));
    }
    match value.parse::<Timestamp>() {
        Ok(requested) => RequestState::Requested(RepaveRequest {
            value: value.clone(),
            requested,
            then,
        }),
        Err(_) => RequestState::Invalid(format!(
            "{} must be an RFC 3339 time such as 2026-01-02T03:04:05Z (date -u +%FT%TZ), not {value:?}",
            annotations::REPAVE
        )),
    }
}

/// The `repaving` mark: since when the Machine has been repaved and not Running since.
pub fn repaving_since(annotations: &BTreeMap<String, String>) -> Option<Timestamp> {
    annotations
        .get(annotations::REPAVING)
        .and_then(|v| v.parse().ok())
}

/// The next step of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepaveStep {
    /// Drain the recorded Node, then delete it (when drained, or after the drain timeout).
    DrainAndDelete {
        /// The Node.
        node: String,
        /// The drain timeout has passed since the request: delete even if pods remain.
        timed_out: bool,
    },
    /// The recorded Node is gone (or there never was one): finish the request.
    Finish,
}

/// Decides the next step of a request: the Node recorded in `status.nodeRef` is drained and
/// deleted if it is still the Machine's Node; any other Node (one registered after the
/// repave) is left alone.
pub fn next_step(
    request: &RepaveRequest,
    recorded_node_uid: Option<&str>,
    node: Option<(&str, Option<&str>)>,
    drain_timeout: Duration,
    now: Timestamp,
) -> RepaveStep {
    match (node, recorded_node_uid) {
        (Some((name, Some(uid))), Some(recorded)) if uid == recorded => {
            RepaveStep::DrainAndDelete {
                node: name.to_owned(),
                timed_out: elapsed(request.requested, now) > drain_timeout,
            }
        }
        _ => RepaveStep::Finish,
    }
}

/// The request as annotations to write with a merge patch: a request now, optionally
/// followed by an operation.
pub fn request_patch(now: Timestamp, then: Option<&str>) -> serde_json::Value {
    json!({"metadata": {"annotations": {
        annotations::REPAVE: format_time(now),
        annotations::REPAVE_THEN: then,
    }}})
}

/// RFC 3339 with second precision, as people write it.
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The follow-up operation's name: one per request, so that retries create it once.
pub fn follow_up_name(machine: &str, operation: &str, request: &RepaveRequest) -> String {
    crate::dispatch::child_name(
        machine,
        &format!(
            "{}-{}",
            operation.to_ascii_lowercase(),
            request.requested.as_second()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::tests::at;

    fn annotations(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn read_request_table() {
        let t = "2026-01-02T03:04:05Z";
        assert_eq!(read_request(&annotations(&[])), RequestState::None);
        match read_request(&annotations(&[(annotations::REPAVE, t)])) {
            RequestState::Requested(r) => {
                assert_eq!(r.value, t);
                assert_eq!(r.then, None);
                assert_eq!(format_time(r.requested), t);
            }
            other => panic!("{other:?}"),
        }
        match read_request(&annotations(&[
            (annotations::REPAVE, t),
            (annotations::REPAVE_THEN, "pxeBoot"),
        ])) {
            RequestState::Requested(r) => assert_eq!(r.then.as_deref(), Some("pxeBoot")),
            other => panic!("{other:?}"),
        }
        let invalid = [
            annotations(&[(annotations::REPAVE, "now")]),
            annotations(&[
                (annotations::REPAVE, t),
                (annotations::REPAVE_THEN, "reboot"),
            ]),
        ];
        for a in invalid {
            assert!(
                matches!(read_request(&a), RequestState::Invalid(_)),
                "{a:?}"
            );
        }
        assert_eq!(
            repaving_since(&annotations(&[(annotations::REPAVING, t)])).map(format_time),
            Some(t.to_owned())
        );
    }

    #[test]
    fn next_step_table() {
        let request = RepaveRequest {
            value: String::new(),
            requested: at(0),
            then: None,
        };
        let timeout = Duration::from_secs(300);
        let cases = [
            (
                "the recorded Node: drain",
                Some("u1"),
                Some(("n1", Some("u1"))),
                10,
                RepaveStep::DrainAndDelete {
                    node: "n1".into(),
                    timed_out: false,
                },
            ),
            (
                "after the drain timeout: delete anyway",
                Some("u1"),
                Some(("n1", Some("u1"))),
                301,
                RepaveStep::DrainAndDelete {
                    node: "n1".into(),
                    timed_out: true,
                },
            ),
            ("the Node is gone", Some("u1"), None, 10, RepaveStep::Finish),
            (
                "a new Node registered after the repave is left alone",
                Some("u1"),
                Some(("n1", Some("u2"))),
                10,
                RepaveStep::Finish,
            ),
            (
                "no recorded Node: nothing to drain",
                None,
                Some(("n1", Some("u2"))),
                10,
                RepaveStep::Finish,
            ),
        ];
        for (case, recorded, node, now, expected) in cases {
            assert_eq!(
                next_step(&request, recorded, node, timeout, at(now)),
                expected,
                "{case}"
            );
        }
        assert_eq!(
            follow_up_name("m1", "powerOff", &request),
            format!("m1-poweroff-{}", at(0).as_second())
        );
    }
}
