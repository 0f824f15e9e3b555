//! The kubelet a node image carries against the one its configuration asks for
//! (`kubernetes.version`). A node image says which kubelet it holds in
//! [`KUBELET_VERSION_FILE`] (the image builder writes what `kubelet --version` printed); the
//! agent reads it from the unpacked root and starts nothing whose kubelet is another: a
//! configuration that changes `kubernetes.version` must name a node image of that version,
//! and one that names the wrong image is refused on the machine before the old container is
//! stopped, with a message that names both versions.

use std::path::Path;

/// Where a node image says which kubelet it carries (one line, such as `v1.35.4`).
pub const KUBELET_VERSION_FILE: &str = "usr/share/unbounded/kubelet-version";

/// Why a node image is refused for its kubelet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KubeletVersionError {
    /// The image does not say which kubelet it carries.
    #[error(
        "the configuration asks for kubelet {wanted}, and the node image does not say which kubelet it carries (no release in /{KUBELET_VERSION_FILE}): build it with `unbounded-testbed images` or write that file"
    )]
    Unlabelled {
        /// `kubernetes.version`.
        wanted: String,
    },
    /// The image carries another kubelet.
    #[error(
        "the configuration asks for kubelet {wanted}, and its node image carries kubelet {carried}: give the configuration the node image of {wanted} (or set kubernetes.version to {carried})"
    )]
    Differs {
        /// `kubernetes.version`.
        wanted: String,
        /// What the image says.
        carried: String,
    },
}

/// Decides whether an image that carries `carried` (the first line of its
/// [`KUBELET_VERSION_FILE`], if it has one) may run for a configuration that asks for
/// `wanted`. No version asked for: any kubelet.
pub(crate) fn check(
    wanted: Option<&str>,
    carried: Option<&str>,
) -> Result<(), KubeletVersionError> {
    let Some(wanted) = wanted.map(str::trim).filter(|w| !w.is_empty()) else {
        return Ok(());
    };
    let carried = carried
        .and_then(|text| text.lines().next())
        .map(str::trim)
        .filter(|c| !c.is_empty());
    match carried {
        None => Err(KubeletVersionError::Unlabelled {
            wanted: wanted.to_owned(),
        }),
        Some(carried) if carried == wanted => Ok(()),
        Some(carried) => Err(KubeletVersionError::Differs {
            wanted: wanted.to_owned(),
            carried: carried.chars().take(64).collect(),
        }),
    }
}

/// What a node image (by its digest) said of its kubelet when it was last unpacked: kept in
/// the agent's state, so that a configuration refused for its kubelet is refused again
/// without downloading and unpacking the same image at every retry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageKubelet {
    /// The image's SHA-256.
    pub sha256: String,
    /// What it said ([`carried`]).
    pub carried: Option<String>,
}

/// Decides, before any download, whether the image `sha256` is already known to carry
/// another kubelet than `wanted` (from `known`, the last unpacked image's record).
pub(crate) fn known_refusal(
    wanted: Option<&str>,
    sha256: &str,
    known: Option<&ImageKubelet>,
) -> Result<(), KubeletVersionError> {
    match known {
        Some(known) if known.sha256 == sha256 => check(wanted, known.carried.as_deref()),
        _ => Ok(()),
    }
}

/// What the image unpacked at `root` says of its kubelet: the first line of
/// [`KUBELET_VERSION_FILE`] when it names a release (`v1.35.4`), else `None` (it says
/// nothing). Only a release is taken, and the file is read inside the root only: what the
/// agent reports of it cannot be the content of another file (a symlink to a host secret).
pub(crate) fn carried(root: &Path) -> Option<String> {
    let bytes = crate::rootfs::read_inside(root, &format!("/{KUBELET_VERSION_FILE}"), 256)?;
    let text = String::from_utf8_lossy(&bytes);
    let first = text.lines().next()?.trim();
    unbounded_api::boot_images::valid_release(first).then(|| first.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_version_asked_for_takes_any_image() {
        assert_eq!(check(None, None), Ok(()));
        assert_eq!(check(None, Some("v1.34.4\n")), Ok(()));
        assert_eq!(check(Some(""), Some("v1.34.4")), Ok(()));
    }

    #[test]
    fn the_same_kubelet_runs() {
        assert_eq!(check(Some("v1.35.4"), Some("v1.35.4\n")), Ok(()));
    }

    #[test]
    fn another_kubelet_is_refused_naming_both() {
        let err = check(Some("v1.35.4"), Some("v1.34.4\n")).unwrap_err();
        assert_eq!(
            err,
            KubeletVersionError::Differs {
                wanted: "v1.35.4".into(),
                carried: "v1.34.4".into()
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("v1.35.4") && message.contains("v1.34.4"),
            "{message}"
        );
        // A patch release is another kubelet.
        assert!(check(Some("v1.35.4"), Some("v1.35.3")).is_err());
    }

    #[test]
    fn an_image_that_says_nothing_is_refused_when_a_version_is_asked_for() {
        for carried in [None, Some(""), Some("\n")] {
            assert_eq!(
                check(Some("v1.35.4"), carried),
                Err(KubeletVersionError::Unlabelled {
                    wanted: "v1.35.4".into()
                })
            );
        }
    }

    #[test]
    fn a_long_claim_is_cut_in_the_message() {
        let long = "v".repeat(10_000);
        let Err(KubeletVersionError::Differs { carried, .. }) = check(Some("v1.35.4"), Some(&long))
        else {
            panic!("not refused");
        };
        assert_eq!(carried.len(), 64);
    }

    #[test]
    fn a_known_image_is_refused_before_its_download() {
        let known = ImageKubelet {
            sha256: "a".repeat(64),
            carried: Some("v1.35.4".into()),
        };
        // The same image, another kubelet asked for: refused at once.
        assert!(matches!(
            known_refusal(Some("v1.34.4"), &"a".repeat(64), Some(&known)),
            Err(KubeletVersionError::Differs { .. })
        ));
        // The same image and its kubelet, another image, or nothing known: download it.
        assert_eq!(
            known_refusal(Some("v1.35.4"), &"a".repeat(64), Some(&known)),
            Ok(())
        );
        assert_eq!(
            known_refusal(Some("v1.34.4"), &"b".repeat(64), Some(&known)),
            Ok(())
        );
        assert_eq!(
            known_refusal(Some("v1.34.4"), &"a".repeat(64), None),
            Ok(())
        );
        // An image known to say nothing, with a version asked for.
        let silent = ImageKubelet {
            carried: None,
            ..known
        };
        assert!(matches!(
            known_refusal(Some("v1.34.4"), &"a".repeat(64), Some(&silent)),
            Err(KubeletVersionError::Unlabelled { .. })
        ));
    }

    #[test]
    fn reads_what_the_unpacked_image_says() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(carried(root.path()), None);
        let file = root.path().join(KUBELET_VERSION_FILE);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "v1.34.4\n").unwrap();
        assert_eq!(carried(root.path()).as_deref(), Some("v1.34.4"));
        // Anything but a release says nothing (and is never repeated in a message).
        std::fs::write(&file, "token=s3cret\n").unwrap();
        assert_eq!(carried(root.path()), None);
    }

    #[test]
    fn a_symlink_out_of_the_image_is_not_read() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "v9.9.9\n").unwrap();
        let file = root.path().join(KUBELET_VERSION_FILE);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&secret, &file).unwrap();
        assert_eq!(carried(root.path()), None);
        // A directory on the way that leads out is no better.
        std::fs::remove_file(&file).unwrap();
        std::fs::remove_dir(file.parent().unwrap()).unwrap();
        std::fs::create_dir_all(host.path().join("unbounded")).unwrap();
        std::fs::write(host.path().join("unbounded/kubelet-version"), "v9.9.9\n").unwrap();
        std::os::unix::fs::symlink(host.path().join("unbounded"), file.parent().unwrap()).unwrap();
        assert_eq!(carried(root.path()), None);
    }
}
