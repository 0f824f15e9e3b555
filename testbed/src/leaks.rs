//! Secrets in logs: what the lab's logs and consoles must never show. A scan for the known
//! secrets (the BMC password) and for anything shaped like a credential the system hands
//! out (a ServiceAccount token, a JWT; a kubelet bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`).

/// A secret found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    /// What was found (never the secret itself).
    pub what: &'static str,
    /// The line it is on (1-based).
    pub line: usize,
}

fn token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// Whether `line` holds a JWT: `eyJ` then base64url, a dot, base64url, a dot.
fn has_jwt(line: &[u8]) -> bool {
    line.windows(3).enumerate().any(|(start, w)| {
        if w != b"eyJ" || start > 0 && token_char(line[start - 1]) {
            return false;
        }
        let mut parts = 0;
        let mut run = 0;
        for &b in &line[start..] {
            if token_char(b) {
                run += 1;
            } else if b == b'.' && run >= 10 {
                parts += 1;
                run = 0;
                if parts == 2 {
                    return true;
                }
            } else {
                return false;
            }
        }
        false
    })
}

/// Whether `line` holds a bootstrap token: six and sixteen lower-case alphanumerics around a
/// dot, not part of a longer word.
fn has_bootstrap_token(line: &[u8]) -> bool {
    let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (0..line.len().saturating_sub(22)).any(|start| {
        let end = start + 23;
        line[start..start + 6].iter().all(|b| word(*b))
            && line[start + 6] == b'.'
            && line[start + 7..end].iter().all(|b| word(*b))
            && (start == 0 || !(word(line[start - 1]) || line[start - 1] == b'.'))
            && line.get(end).is_none_or(|b| !(word(*b) || *b == b'.'))
    })
}

/// Every line of `text` that shows one of `secrets` or a credential.
pub fn find(text: &[u8], secrets: &[&str]) -> Vec<Leak> {
    let mut leaks = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let mut found = |what| leaks.push(Leak { what, line: i + 1 });
        if secrets
            .iter()
            .any(|s| !s.is_empty() && line.windows(s.len()).any(|w| w == s.as_bytes()))
        {
            found("a known secret");
        }
        if has_jwt(line) {
            found("a token (JWT)");
        }
        if has_bootstrap_token(line) {
            found("a bootstrap token");
        }
    }
    leaks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_credentials_are_found_and_nothing_else() {
        let jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJpc3MiOiJrdWJlcm5ldGVzIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ";
        let cases: [(&str, &str, Vec<&'static str>); 9] = [
            ("plain", "machine-1 is Running", vec![]),
            (
                "password",
                "connecting with tb-bmc-s3cret",
                vec!["a known secret"],
            ),
            (
                "jwt",
                &*format!("Authorization: Bearer {jwt}"),
                vec!["a token (JWT)"],
            ),
            (
                "bootstrap",
                "token abcdef.0123456789abcdef issued",
                vec!["a bootstrap token"],
            ),
            (
                "bootstrap at the start",
                "abcdef.0123456789abcdef",
                vec!["a bootstrap token"],
            ),
            (
                "a host name is not a token",
                "node-1.lab.test.example",
                vec![],
            ),
            (
                "longer words are not tokens",
                "xabcdef.0123456789abcdefx",
                vec![],
            ),
            (
                "a digest is not a token",
                "sha256:0123456789abcdef0123456789abcdef",
                vec![],
            ),
            (
                "base64 without dots",
                "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ",
                vec![],
            ),
        ];
        for (case, text, expected) in cases {
            let what: Vec<&str> = find(text.as_bytes(), &["tb-bmc-s3cret"])
                .into_iter()
                .map(|l| l.what)
                .collect();
            assert_eq!(what, expected, "{case}");
        }
        let leaks = find(b"one\ntwo tb-bmc-s3cret\n", &["tb-bmc-s3cret", ""]);
        assert_eq!(
            leaks,
            [Leak {
                what: "a known secret",
                line: 2
            }]
        );
    }
}
