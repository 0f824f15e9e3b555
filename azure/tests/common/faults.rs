//! Misbehaviours the fake Azure Resource Manager plays on request: throttling, error answers,
//! operations that fail or never end, low remaining-request counts.

/// A misbehaviour to play, on requests with `method` whose lower-case path contains
/// `fragment`, the next `times` times.
#[derive(Debug, Clone)]
pub enum Fault {
    /// `429 Too Many Requests` with `Retry-After` and no requests left.
    Throttle {
        method: &'static str,
        fragment: String,
        times: u32,
        retry_after: u64,
    },
    /// An error status with an ARM error body.
    Error {
        method: &'static str,
        fragment: String,
        times: u32,
        status: u16,
        code: String,
        message: String,
    },
    /// The write is accepted but its asynchronous operation ends `Failed`.
    FailOperation {
        method: &'static str,
        fragment: String,
        times: u32,
        code: String,
        message: String,
    },
    /// The write is accepted but its asynchronous operation never ends.
    StallOperation {
        method: &'static str,
        fragment: String,
        times: u32,
    },
    /// The answer says this many requests are left (`x-ms-ratelimit-remaining-…`).
    Remaining {
        method: &'static str,
        fragment: String,
        times: u32,
        header: String,
        value: String,
    },
}

impl Fault {
    pub(crate) fn matches(&self, method: &str, path: &str) -> bool {
        let (m, fragment, times) = match self {
            Fault::Throttle {
                method,
                fragment,
                times,
                ..
            }
            | Fault::Error {
                method,
                fragment,
                times,
                ..
            }
            | Fault::FailOperation {
                method,
                fragment,
                times,
                ..
            }
            | Fault::StallOperation {
                method,
                fragment,
                times,
            }
            | Fault::Remaining {
                method,
                fragment,
                times,
                ..
            } => (method, fragment, times),
        };
        *times > 0 && *m == method && path.contains(&fragment.to_ascii_lowercase())
    }

    pub(crate) fn used(&mut self) {
        match self {
            Fault::Throttle { times, .. }
            | Fault::Error { times, .. }
            | Fault::FailOperation { times, .. }
            | Fault::StallOperation { times, .. }
            | Fault::Remaining { times, .. } => *times = times.saturating_sub(1),
        }
    }
}
