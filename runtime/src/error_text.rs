//! An error and its causes on one line, for messages that must say more than an HTTP
//! client's own text ("error sending request"): the causes say whether the connection was
//! refused, timed out, or met a certificate that was not the expected one. No request of
//! ours carries a secret in its URL, so the causes name none.

/// `error: cause: cause of cause…`.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_follows_on_the_line() {
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(with_causes(&error), "outer: connection refused");
        assert_eq!(with_causes(&std::io::Error::other("alone")), "alone");
    }
}
