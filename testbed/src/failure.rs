//! An error that another error caused, with what was being done: the testbed's error enums
//! carry it (`#[error(transparent)]`) for the I/O, process and client errors of their steps,
//! so that the cause stays a source (`std::error::Error::source`), not only text.

use std::fmt;

/// Any error a step can meet.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Another error, and what was being done when it happened.
#[derive(Debug)]
pub struct Failure {
    /// Printed before the error: what was being done, and `": "`.
    before: String,
    source: Cause,
    /// Printed after the error: what the step saw, when it says more.
    after: String,
}

impl Failure {
    /// `source`, met while doing `what` (printed before it: `what: source`).
    pub fn new(
        what: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::around(format!("{what}: "), source, "")
    }

    /// `source` alone: its own text says what failed.
    pub fn of(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::around("", source, "")
    }

    /// `source` with text before and after it, as the step's message words it.
    pub fn around(
        before: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
        after: impl Into<String>,
    ) -> Self {
        Self {
            before: before.into(),
            source: Box::new(source),
            after: after.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.before, self.source, self.after)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_kept_and_printed_after_what_was_done() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let failure = Failure::new("reading /x", io());
        assert_eq!(failure.to_string(), format!("reading /x: {}", io()));
        assert!(std::error::Error::source(&failure).is_some());
        assert_eq!(Failure::of(io()).to_string(), io().to_string());
        assert_eq!(
            Failure::around("not JSON (", io(), "):\nthe output").to_string(),
            format!("not JSON ({}):\nthe output", io())
        );
    }
}
