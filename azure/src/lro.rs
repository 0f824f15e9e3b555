//! Azure's long-running operations, as pure decisions (the client in [`crate::arm`] does the
//! waiting and the requests).
//!
//! A write that Azure finishes later answers `201 Created` or `202 Accepted` (sometimes `200`)
//! and says where to look:
//! - `Azure-AsyncOperation`: a status resource, `{"status": "InProgress" | "Succeeded" |
//!   "Failed" | "Canceled", "error": {"code", "message"}}`; preferred when both headers come;
//! - `Location` (on `202`): answered `202` while running, `200`/`204` when done, an error
//!   status when it failed;
//! - neither, on a PUT whose body's `provisioningState` is not terminal: the resource itself,
//!   until `Succeeded`, `Failed` or `Canceled`.
//!
//! Each poll waits the answer's `Retry-After` (or the policy's interval).

use serde_json::Value;

/// Where to look for the outcome of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Follow {
    /// Finished already.
    Done,
    /// Poll this `Azure-AsyncOperation` status URL.
    AsyncOperation(String),
    /// Poll this `Location` URL.
    Location(String),
    /// Poll the resource's `provisioningState`.
    Resource,
}

/// How to follow the first answer to a write.
pub fn follow(
    is_put: bool,
    status: u16,
    async_operation: Option<&str>,
    location: Option<&str>,
    body: &Value,
) -> Follow {
    if !(200..=202).contains(&status) {
        return Follow::Done;
    }
    if let Some(url) = async_operation.filter(|u| !u.is_empty()) {
        return Follow::AsyncOperation(url.to_owned());
    }
    if status == 202
        && let Some(url) = location.filter(|u| !u.is_empty())
    {
        return Follow::Location(url.to_owned());
    }
    let state = body["properties"]["provisioningState"].as_str();
    if is_put && state.is_some_and(|s| !is_terminal(s)) {
        return Follow::Resource;
    }
    Follow::Done
}

/// Whether a `provisioningState` is final.
pub fn is_terminal(state: &str) -> bool {
    matches!(
        state.to_ascii_lowercase().as_str(),
        "succeeded" | "failed" | "canceled" | "cancelled"
    )
}

/// Where an operation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Still running.
    Running,
    /// Done.
    Succeeded,
    /// Ended badly: `Failed` or `Canceled`, with Azure's code and message.
    Failed {
        /// `Failed` or `Canceled`.
        status: String,
        /// Azure's error code.
        code: String,
        /// Azure's error message.
        message: String,
    },
}

/// Reads an `Azure-AsyncOperation` status body.
pub fn async_operation_progress(body: &Value) -> Progress {
    let status = body["status"].as_str().unwrap_or_default();
    match status.to_ascii_lowercase().as_str() {
        "succeeded" => Progress::Succeeded,
        "failed" | "canceled" | "cancelled" => {
            let (code, message) = crate::error::operation_error_parts(body);
            Progress::Failed {
                status: status.to_owned(),
                code,
                message,
            }
        }
        _ => Progress::Running,
    }
}

/// Reads a `Location` poll's status; `None` for an error status (the caller reads its body).
/// While deleting, `404` means done.
pub fn location_progress(status: u16, deleting: bool) -> Option<Progress> {
    match status {
        202 => Some(Progress::Running),
        200 | 201 | 204 => Some(Progress::Succeeded),
        404 if deleting => Some(Progress::Succeeded),
        _ => None,
    }
}

/// Reads a resource's `provisioningState`.
pub fn resource_progress(body: &Value) -> Progress {
    let state = body["properties"]["provisioningState"]
        .as_str()
        .unwrap_or("Succeeded");
    match state.to_ascii_lowercase().as_str() {
        "succeeded" => Progress::Succeeded,
        "failed" | "canceled" | "cancelled" => Progress::Failed {
            status: state.to_owned(),
            code: format!("ProvisioningState{state}"),
            message: format!("the resource's provisioningState is {state}"),
        },
        _ => Progress::Running,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn how_to_follow() {
        let creating = json!({"properties": {"provisioningState": "Creating"}});
        let done = json!({"properties": {"provisioningState": "Succeeded"}});
        let none = json!({});
        let cases = [
            (
                "PUT 201 with both headers: async operation",
                true,
                201,
                Some("https://a/op"),
                Some("https://a/loc"),
                &creating,
                Follow::AsyncOperation("https://a/op".into()),
            ),
            (
                "POST 202 with Location",
                false,
                202,
                None,
                Some("https://a/loc"),
                &none,
                Follow::Location("https://a/loc".into()),
            ),
            (
                "DELETE 202 with both",
                false,
                202,
                Some("https://a/op"),
                Some("https://a/loc"),
                &none,
                Follow::AsyncOperation("https://a/op".into()),
            ),
            (
                "PUT 201 creating, no header: the resource",
                true,
                201,
                None,
                None,
                &creating,
                Follow::Resource,
            ),
            (
                "PUT 200 succeeded: done",
                true,
                200,
                None,
                None,
                &done,
                Follow::Done,
            ),
            (
                "PUT 200 with Location but not 202: done",
                true,
                200,
                None,
                Some("https://a/loc"),
                &done,
                Follow::Done,
            ),
            (
                "POST 200: done",
                false,
                200,
                None,
                None,
                &none,
                Follow::Done,
            ),
            (
                "DELETE 204: done",
                false,
                204,
                None,
                None,
                &none,
                Follow::Done,
            ),
            (
                "POST 202 without a header: done",
                false,
                202,
                None,
                None,
                &none,
                Follow::Done,
            ),
            (
                "errors are not followed",
                true,
                409,
                Some("https://a/op"),
                None,
                &none,
                Follow::Done,
            ),
        ];
        for (case, is_put, status, op, loc, body, expected) in cases {
            assert_eq!(follow(is_put, status, op, loc, body), expected, "{case}");
        }
    }

    #[test]
    fn async_operation_bodies() {
        let failed = json!({"status": "Failed", "error": {"code": "AllocationFailed", "message": "no capacity"}});
        let cases = [
            (json!({"status": "InProgress"}), Progress::Running),
            (json!({"status": "Accepted"}), Progress::Running),
            (json!({}), Progress::Running),
            (
                json!({"status": "Succeeded", "startTime": "2024-01-01T00:00:00Z"}),
                Progress::Succeeded,
            ),
            (
                failed,
                Progress::Failed {
                    status: "Failed".into(),
                    code: "AllocationFailed".into(),
                    message: "no capacity".into(),
                },
            ),
            (
                json!({"status": "Canceled"}),
                Progress::Failed {
                    status: "Canceled".into(),
                    code: "OperationFailed".into(),
                    message: String::new(),
                },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(async_operation_progress(&body), expected, "{body}");
        }
    }

    #[test]
    fn location_statuses() {
        assert_eq!(location_progress(202, false), Some(Progress::Running));
        assert_eq!(location_progress(200, false), Some(Progress::Succeeded));
        assert_eq!(location_progress(204, true), Some(Progress::Succeeded));
        assert_eq!(location_progress(404, true), Some(Progress::Succeeded));
        assert_eq!(location_progress(404, false), None);
        assert_eq!(location_progress(500, false), None);
    }

    #[test]
    fn provisioning_states() {
        assert!(is_terminal("Succeeded") && is_terminal("failed") && is_terminal("Canceled"));
        assert!(!is_terminal("Creating") && !is_terminal("Updating") && !is_terminal("Deleting"));
        assert_eq!(
            resource_progress(&json!({"properties": {"provisioningState": "Updating"}})),
            Progress::Running
        );
        assert_eq!(
            resource_progress(&json!({"properties": {"provisioningState": "Succeeded"}})),
            Progress::Succeeded
        );
        assert!(matches!(
            resource_progress(&json!({"properties": {"provisioningState": "Failed"}})),
            Progress::Failed { .. }
        ));
    }
}
