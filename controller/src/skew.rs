//! Kubernetes' version skew policy between a kubelet and the API server, decided: a
//! kubelet may not be newer than the API server, and may be at most
//! [`MAX_KUBELET_MINORS_BEHIND`] minor versions older (the policy since Kubernetes 1.28).
//! A configuration's `kubernetes.version` is the kubelet its Machines run, so the
//! controller checks it against the API server's version before a Machine is paved with
//! it; the CRD can only check its form.
//!
//! Also here: whether a Node runs the kubelet its version asks for ([`kubelet_matches`]).

use std::cmp::Ordering;
use std::fmt;

/// The Machine condition that says whether its Node runs the kubelet its version asks for.
pub const KUBELET_VERSION_CONDITION: &str = "KubeletVersion";
/// Reason: the Node's kubelet is the one the version asks for.
pub const KUBELET_VERSION_MATCHES: &str = "KubeletVersionMatches";
/// Reason: the Node's kubelet is not the one the version asks for.
pub const KUBELET_VERSION_DIFFERS: &str = "KubeletVersionDiffers";

/// How many minor versions a kubelet may be behind the API server.
pub const MAX_KUBELET_MINORS_BEHIND: u64 = 3;

/// A Kubernetes release version, `v<major>.<minor>.<patch>` with an optional pre-release or
/// build suffix (ignored by the skew policy, which compares minor versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Patch version.
    pub patch: u64,
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Errors of the skew policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkewError {
    /// A version that does not read as `v1.35.4`.
    #[error("{0:?} is not a Kubernetes version such as v1.35.4")]
    Malformed(String),
    /// The kubelet would be newer than the API server.
    #[error(
        "kubelet {kubelet} is newer than the API server ({apiserver}): the skew policy allows a kubelet at the API server's minor version or up to {MAX_KUBELET_MINORS_BEHIND} older"
    )]
    KubeletNewer {
        /// The kubelet.
        kubelet: KubeVersion,
        /// The API server.
        apiserver: KubeVersion,
    },
    /// The kubelet would be more than the supported minors behind.
    #[error(
        "kubelet {kubelet} is more than {MAX_KUBELET_MINORS_BEHIND} minor versions older than the API server ({apiserver})"
    )]
    KubeletTooOld {
        /// The kubelet.
        kubelet: KubeVersion,
        /// The API server.
        apiserver: KubeVersion,
    },
}

impl SkewError {
    /// The condition reason for it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "KubernetesVersionMalformed",
            Self::KubeletNewer { .. } => "KubeletNewerThanAPIServer",
            Self::KubeletTooOld { .. } => "KubeletTooOld",
        }
    }
}

/// Reads `v1.35.4`, `1.35.4`, `v1.35.4-rc.1` or `v1.35.4+build` (the API server's
/// `gitVersion`).
pub fn parse(version: &str) -> Result<KubeVersion, SkewError> {
    let malformed = || SkewError::Malformed(version.to_owned());
    let core = version.strip_prefix('v').unwrap_or(version);
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    let mut number = || -> Result<u64, SkewError> {
        let part = parts.next().ok_or_else(malformed)?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        part.parse().map_err(|_| malformed())
    };
    let parsed = KubeVersion {
        major: number()?,
        minor: number()?,
        patch: number()?,
    };
    if parts.next().is_some() {
        return Err(malformed());
    }
    Ok(parsed)
}

/// Checks a kubelet version against the API server's.
pub fn check(kubelet: &str, apiserver: &str) -> Result<(), SkewError> {
    let (k, a) = (parse(kubelet)?, parse(apiserver)?);
    match (k.major.cmp(&a.major), k.minor.cmp(&a.minor)) {
        (Ordering::Greater, _) | (Ordering::Equal, Ordering::Greater) => {
            Err(SkewError::KubeletNewer {
                kubelet: k,
                apiserver: a,
            })
        }
        (Ordering::Less, _) => Err(SkewError::KubeletTooOld {
            kubelet: k,
            apiserver: a,
        }),
        _ if a.minor - k.minor > MAX_KUBELET_MINORS_BEHIND => Err(SkewError::KubeletTooOld {
            kubelet: k,
            apiserver: a,
        }),
        _ => Ok(()),
    }
}

/// Whether a Node's `status.nodeInfo.kubeletVersion` is the version a configuration asks
/// for (same major, minor and patch; a build suffix such as `+k3s1` is ignored). `None`
/// when either cannot be read.
pub fn kubelet_matches(wanted: &str, running: &str) -> Option<bool> {
    Some(parse(wanted).ok()? == parse(running).ok()?)
}

/// The KubeletVersion condition of a Machine: whether its Node's kubelet (`running`) is the
/// one its version asks for (`wanted`). `None` while either is unknown (no Node yet, or a
/// version without `kubernetes.version`).
pub fn kubelet_condition(
    wanted: Option<&str>,
    running: Option<&str>,
) -> Option<(bool, &'static str, String)> {
    let (wanted, running) = (wanted?, running?);
    Some(match kubelet_matches(wanted, running) {
        Some(true) => (
            true,
            KUBELET_VERSION_MATCHES,
            format!("the Node runs kubelet {running}, as its version asks"),
        ),
        _ => (
            false,
            KUBELET_VERSION_DIFFERS,
            format!("the Node runs kubelet {running}, but its version asks for {wanted}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_table() {
        let v = |major, minor, patch| {
            Ok(KubeVersion {
                major,
                minor,
                patch,
            })
        };
        assert_eq!(parse("v1.35.4"), v(1, 35, 4));
        assert_eq!(parse("1.34.2"), v(1, 34, 2));
        assert_eq!(parse("v1.35.0-rc.1"), v(1, 35, 0));
        assert_eq!(parse("v1.35.4+k3s1"), v(1, 35, 4));
        for bad in [
            "",
            "v1.35",
            "v1.35.4.1",
            "vx.y.z",
            "v1..4",
            "v1.35.-4",
            "latest",
        ] {
            assert_eq!(parse(bad), Err(SkewError::Malformed(bad.into())), "{bad}");
        }
    }

    #[test]
    fn check_table() {
        let cases = [
            ("same release", "v1.35.4", "v1.35.4", None),
            ("newer patch of the same minor", "v1.35.9", "v1.35.4", None),
            ("one minor older", "v1.34.2", "v1.35.4", None),
            ("three minors older", "v1.32.0", "v1.35.4", None),
            (
                "four minors older",
                "v1.31.9",
                "v1.35.4",
                Some("KubeletTooOld"),
            ),
            (
                "one minor newer",
                "v1.36.0",
                "v1.35.4",
                Some("KubeletNewerThanAPIServer"),
            ),
            (
                "another major, newer",
                "v2.0.0",
                "v1.35.4",
                Some("KubeletNewerThanAPIServer"),
            ),
            (
                "another major, older",
                "v0.35.0",
                "v1.35.4",
                Some("KubeletTooOld"),
            ),
            (
                "malformed",
                "v1.35",
                "v1.35.4",
                Some("KubernetesVersionMalformed"),
            ),
        ];
        for (case, kubelet, apiserver, expected) in cases {
            assert_eq!(
                check(kubelet, apiserver).err().map(|e| e.reason()),
                expected,
                "{case}"
            );
        }
        let message = check("v1.36.0", "v1.35.4").err().map(|e| e.to_string());
        assert_eq!(
            message.as_deref(),
            Some(
                "kubelet v1.36.0 is newer than the API server (v1.35.4): the skew policy allows a kubelet at the API server's minor version or up to 3 older"
            )
        );
    }

    #[test]
    fn kubelet_matches_table() {
        assert_eq!(kubelet_matches("v1.35.4", "v1.35.4"), Some(true));
        assert_eq!(kubelet_matches("v1.35.4", "v1.35.4+k3s1"), Some(true));
        assert_eq!(kubelet_matches("v1.35.4", "v1.34.2"), Some(false));
        assert_eq!(kubelet_matches("v1.35.4", "unknown"), None);
    }

    #[test]
    fn kubelet_condition_table() {
        assert_eq!(kubelet_condition(None, Some("v1.35.4")), None);
        assert_eq!(kubelet_condition(Some("v1.35.4"), None), None);
        assert_eq!(
            kubelet_condition(Some("v1.35.4"), Some("v1.35.4")).map(|c| (c.0, c.1)),
            Some((true, KUBELET_VERSION_MATCHES))
        );
        assert_eq!(
            kubelet_condition(Some("v1.35.4"), Some("v1.34.2")),
            Some((
                false,
                KUBELET_VERSION_DIFFERS,
                "the Node runs kubelet v1.34.2, but its version asks for v1.35.4".into()
            ))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(28), ..ProptestConfig::default() })]

        /// The policy as a whole: accepted exactly when the majors agree and the kubelet's
        /// minor is within [apiserver - 3, apiserver]; patches never matter.
        #[test]
        fn accepted_exactly_within_the_window(
            km in 0u64..3, kmin in 0u64..60, kp in 0u64..30,
            am in 0u64..3, amin in 0u64..60, ap in 0u64..30,
        ) {
            let verdict = check(&format!("v{km}.{kmin}.{kp}"), &format!("v{am}.{amin}.{ap}"));
            let within = km == am && kmin <= amin && amin - kmin <= MAX_KUBELET_MINORS_BEHIND;
            prop_assert_eq!(verdict.is_ok(), within);
        }
    }
}
