//! Errors of Azure Resource Manager calls, and the condition reason each becomes.
//!
//! An Azure error keeps Azure's own `code` and `message` (what a person searches for) and is
//! classified into a reason for the Machine's `InfrastructureReady` condition:
//! `AzureQuotaExceeded`, `AzureAuthorizationFailed`, `AzureInvalidParameter`, `AzureNotFound`,
//! `AzureConflict`, `AzureRequestFailed`; a failed long-running operation is
//! `AzureOperationFailed` (or one of the first four when its code says so). No error carries a
//! token or a secret: requests are described by what they do, never by their headers.

use serde_json::Value;

/// Longest Azure message kept (they can embed long policy documents).
const MESSAGE_MAX: usize = 1024;

/// A failed ARM call. `action` says what was being done (`creating VM web-1`). Not
/// comparable: it keeps the client's errors, and callers compare its `reason()`.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// Azure answered with an error status.
    #[error("{action}: Azure answered {status} {code}: {message}")]
    Azure {
        /// What was being done.
        action: String,
        /// The HTTP status.
        status: u16,
        /// Azure's error code.
        code: String,
        /// Azure's error message.
        message: String,
    },
    /// A long-running operation ended `Failed` or `Canceled`.
    #[error("{action}: the operation ended {status}: {code}: {message}")]
    OperationFailed {
        /// What was being done.
        action: String,
        /// `Failed` or `Canceled`.
        status: String,
        /// Azure's error code.
        code: String,
        /// Azure's error message.
        message: String,
    },
    /// A long-running operation was still running when the provider stopped waiting.
    #[error(
        "{action}: still running after {seconds} s; the next reconcile looks again (Azure keeps working on it)"
    )]
    OperationTimedOut {
        /// What was being done.
        action: String,
        /// How long the provider waited.
        seconds: u64,
    },
    /// Still throttled (429) after the retries.
    #[error("{action}: Azure Resource Manager throttled the request (429){}", retry_hint(*.retry_after_seconds))]
    Throttled {
        /// What was being done.
        action: String,
        /// The last `Retry-After`.
        retry_after_seconds: Option<u64>,
    },
    /// A transient failure (5xx) that outlasted the retries.
    #[error("{action}: Azure Resource Manager is unavailable: {message}")]
    Unavailable {
        /// What was being done.
        action: String,
        /// The last answer: its status, Azure's code and message.
        message: String,
    },
    /// No connection or no complete answer, after the retries.
    #[error("{action}: Azure Resource Manager is unavailable: {}", unbounded_runtime::error_text::with_causes(.source))]
    Unreachable {
        /// What was being done.
        action: String,
        /// The HTTP client's last error.
        #[source]
        source: reqwest::Error,
    },
    /// No token could be obtained.
    #[error("getting an Azure token: {source}")]
    Authentication {
        /// Why (the identity platform's error; never the secret).
        #[source]
        source: azure_core::Error,
    },
    /// An answer that is not JSON.
    #[error("{action}: Azure's answer is not JSON: {source}")]
    NotJson {
        /// What was being done.
        action: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// An answer the provider does not understand, or a polling URL it will not follow.
    #[error("{action}: {message}")]
    Protocol {
        /// What was being done.
        action: String,
        /// What was wrong.
        message: String,
    },
}

fn retry_hint(seconds: Option<u64>) -> String {
    seconds.map_or_else(String::new, |s| {
        format!("; Azure asked to retry after {s} s")
    })
}

/// What kind of Azure error a code and status are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A quota or limit is used up.
    Quota,
    /// The identity may not do this.
    Authorization,
    /// The request is wrong (bad image, bad size, bad parameter).
    InvalidParameter,
    /// Something referenced does not exist (resource group, subnet, image).
    NotFound,
    /// The resource is in a state that forbids this now.
    Conflict,
    /// Anything else.
    Other,
}

impl ErrorClass {
    /// The condition reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Quota => "AzureQuotaExceeded",
            Self::Authorization => "AzureAuthorizationFailed",
            Self::InvalidParameter => "AzureInvalidParameter",
            Self::NotFound => "AzureNotFound",
            Self::Conflict => "AzureConflict",
            Self::Other => "AzureRequestFailed",
        }
    }
}

/// Classifies an Azure error by its code first (the same code comes with different statuses)
/// and its status second.
pub fn classify(status: u16, code: &str, message: &str) -> ErrorClass {
    let quota_message = message.to_ascii_lowercase().contains("quota");
    match code {
        c if c.contains("Quota") => ErrorClass::Quota,
        "OperationNotAllowed" if quota_message => ErrorClass::Quota,
        "AuthorizationFailed"
        | "LinkedAuthorizationFailed"
        | "InvalidAuthenticationToken"
        | "InvalidAuthenticationTokenTenant"
        | "ExpiredAuthenticationToken"
        | "AuthenticationFailed" => ErrorClass::Authorization,
        "ResourceNotFound"
        | "ResourceGroupNotFound"
        | "SubscriptionNotFound"
        | "ParentResourceNotFound"
        | "NotFound"
        | "InvalidResourceReference"
        | "ImageNotFound"
        | "PlatformImageNotFound" => ErrorClass::NotFound,
        "InvalidParameter"
        | "InvalidRequestContent"
        | "InvalidRequestFormat"
        | "BadRequest"
        | "PropertyChangeNotAllowed"
        | "SkuNotAvailable"
        | "InvalidTemplate" => ErrorClass::InvalidParameter,
        _ => match status {
            401 | 403 => ErrorClass::Authorization,
            404 => ErrorClass::NotFound,
            400 => ErrorClass::InvalidParameter,
            409 => ErrorClass::Conflict,
            _ => ErrorClass::Other,
        },
    }
}

impl ArmError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Azure {
                status,
                code,
                message,
                ..
            } => classify(*status, code, message).reason(),
            Self::OperationFailed { code, message, .. } => match classify(0, code, message) {
                ErrorClass::Other | ErrorClass::Conflict => "AzureOperationFailed",
                class => class.reason(),
            },
            Self::OperationTimedOut { .. } => "AzureOperationTimedOut",
            Self::Throttled { .. } => "AzureThrottled",
            Self::Unavailable { .. } | Self::Unreachable { .. } => "AzureUnavailable",
            Self::Authentication { .. } => "AzureAuthenticationFailed",
            Self::NotJson { .. } | Self::Protocol { .. } => "AzureProtocolError",
        }
    }

    /// Whether Azure refused the request as specified, so that the same request is refused
    /// every time: `400` with an invalid-parameter code (a VM size or image that does not
    /// exist, a property that cannot change). Not `SkuNotAvailable`: capacity and regional
    /// restrictions change. A terminal failure of the Machine
    /// ([`unbounded_runtime::provider::ProviderError::terminal`]).
    pub fn is_terminal(&self) -> bool {
        match self {
            Self::Azure {
                status: 400,
                code,
                message,
                ..
            } => {
                code != "SkuNotAvailable"
                    && classify(400, code, message) == ErrorClass::InvalidParameter
            }
            _ => false,
        }
    }

    /// Whether Azure said the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Azure { status: 404, .. })
    }
}

/// Azure's `{code, message}` from an error body: ARM's `{"error": {...}}` or a bare
/// `{"code", "message"}`. An empty or foreign body gives the status text.
pub fn error_parts(status: u16, body: &str) -> (String, String) {
    let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = if value["error"].is_object() {
        &value["error"]
    } else {
        &value
    };
    let code = error["code"].as_str().unwrap_or_default();
    let message = error["message"].as_str().unwrap_or_default();
    let code = if code.is_empty() {
        format!("HTTP{status}")
    } else {
        code.to_owned()
    };
    let message = if message.is_empty() {
        body.chars().take(200).collect::<String>()
    } else {
        message.to_owned()
    };
    (code, shorten(&message))
}

/// Azure's `{code, message}` from a failed operation's status body.
pub fn operation_error_parts(body: &Value) -> (String, String) {
    let error = &body["error"];
    let code = error["code"]
        .as_str()
        .unwrap_or("OperationFailed")
        .to_owned();
    let message = error["message"].as_str().unwrap_or_default();
    (code, shorten(message))
}

fn shorten(message: &str) -> String {
    if message.chars().count() <= MESSAGE_MAX {
        return message.to_owned();
    }
    let mut short: String = message.chars().take(MESSAGE_MAX).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_request_as_specified_is_terminal() {
        let azure = |status: u16, code: &str| ArmError::Azure {
            action: "creating VM m".into(),
            status,
            code: code.into(),
            message: String::new(),
        };
        let cases = [
            (
                "a VM size that does not exist",
                azure(400, "InvalidParameter"),
                true,
            ),
            (
                "an image that does not exist",
                azure(400, "InvalidTemplate"),
                true,
            ),
            (
                "capacity or a regional restriction",
                azure(400, "SkuNotAvailable"),
                false,
            ),
            ("quota", azure(400, "QuotaExceeded"), false),
            (
                "not found: may be created later",
                azure(404, "ResourceGroupNotFound"),
                false,
            ),
            (
                "authorization: may be granted later",
                azure(403, "AuthorizationFailed"),
                false,
            ),
            ("a conflict", azure(409, "Conflict"), false),
            (
                "throttled",
                ArmError::Throttled {
                    action: "x".into(),
                    retry_after_seconds: None,
                },
                false,
            ),
        ];
        for (case, error, terminal) in cases {
            assert_eq!(error.is_terminal(), terminal, "{case}");
        }
    }

    #[test]
    fn classification_table() {
        let cases = [
            (
                409,
                "OperationNotAllowed",
                "Operation could not be completed as it results in exceeding approved Total Regional Cores quota.",
                "AzureQuotaExceeded",
            ),
            (409, "QuotaExceeded", "", "AzureQuotaExceeded"),
            (
                409,
                "OperationNotAllowed",
                "The operation is not allowed while the VM is being deallocated.",
                "AzureConflict",
            ),
            (
                403,
                "AuthorizationFailed",
                "does not have authorization to perform action",
                "AzureAuthorizationFailed",
            ),
            (
                403,
                "LinkedAuthorizationFailed",
                "",
                "AzureAuthorizationFailed",
            ),
            (
                401,
                "InvalidAuthenticationToken",
                "",
                "AzureAuthorizationFailed",
            ),
            (403, "SomethingNew", "", "AzureAuthorizationFailed"),
            (
                400,
                "InvalidParameter",
                "The value of parameter imageReference.sku is invalid.",
                "AzureInvalidParameter",
            ),
            (409, "SkuNotAvailable", "", "AzureInvalidParameter"),
            (400, "SomethingNew", "", "AzureInvalidParameter"),
            (
                404,
                "ResourceGroupNotFound",
                "Resource group 'rg' could not be found.",
                "AzureNotFound",
            ),
            (
                400,
                "InvalidResourceReference",
                "Resource /subscriptions/s/.../subnets/x referenced by resource ... was not found.",
                "AzureNotFound",
            ),
            (404, "SomethingNew", "", "AzureNotFound"),
            (409, "Conflict", "", "AzureConflict"),
            (500, "InternalServerError", "", "AzureRequestFailed"),
        ];
        for (status, code, message, reason) in cases {
            let error = ArmError::Azure {
                action: "creating VM x".into(),
                status,
                code: code.into(),
                message: message.into(),
            };
            assert_eq!(error.reason(), reason, "{status} {code}");
        }
    }

    #[test]
    fn operation_failures_keep_their_class_when_it_says_more() {
        let failed = |code: &str, message: &str| ArmError::OperationFailed {
            action: "creating VM x".into(),
            status: "Failed".into(),
            code: code.into(),
            message: message.into(),
        };
        assert_eq!(
            failed("AllocationFailed", "no capacity").reason(),
            "AzureOperationFailed"
        );
        assert_eq!(
            failed("OSProvisioningTimedOut", "").reason(),
            "AzureOperationFailed"
        );
        assert_eq!(failed("QuotaExceeded", "").reason(), "AzureQuotaExceeded");
        assert_eq!(failed("ImageNotFound", "").reason(), "AzureNotFound");
        let message = failed("AllocationFailed", "no capacity").to_string();
        assert_eq!(
            message,
            "creating VM x: the operation ended Failed: AllocationFailed: no capacity"
        );
    }

    #[test]
    fn error_bodies() {
        let cases = [
            (
                409,
                r#"{"error": {"code": "OperationNotAllowed", "message": "quota", "details": []}}"#,
                ("OperationNotAllowed", "quota"),
            ),
            (
                400,
                r#"{"code": "BadRequest", "message": "bad"}"#,
                ("BadRequest", "bad"),
            ),
            (502, "", ("HTTP502", "")),
            (503, "<html>down</html>", ("HTTP503", "<html>down</html>")),
        ];
        for (status, body, (code, message)) in cases {
            assert_eq!(
                error_parts(status, body),
                (code.to_owned(), message.to_owned()),
                "{body}"
            );
        }
        let long = format!(
            r#"{{"error": {{"code": "X", "message": "{}"}}}}"#,
            "m".repeat(5000)
        );
        assert_eq!(error_parts(400, &long).1.chars().count(), MESSAGE_MAX + 1);
    }

    #[test]
    fn throttled_message_names_retry_after() {
        let e = ArmError::Throttled {
            action: "reading VM x".into(),
            retry_after_seconds: Some(17),
        };
        assert_eq!(
            e.to_string(),
            "reading VM x: Azure Resource Manager throttled the request (429); Azure asked to retry after 17 s"
        );
        assert_eq!(e.reason(), "AzureThrottled");
    }
}
