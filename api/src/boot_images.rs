//! Boot images as versioned sets: what the image builder (`unbounded-testbed images`), the
//! installer (`unbounded-bootserver install-images`) and the bootserver's start-up check
//! agree on.
//!
//! A set is one host OS (kernel and initrd) and one node image, listed with their sizes and
//! SHA-256 digests in a [`BootImagesManifest`] (`manifest.json`). The bootserver serves each
//! installed set from `<imagesDir>/<version>/`, so several versions sit side by side and a
//! MachineConfiguration names one of them by its URLs (relative URLs resolve against the
//! bootserver's `/images/`), with the node image's digest from the same manifest
//! ([`BootImagesManifest::configuration_values`]).
//!
//! A version never changes once installed (as a deployed MachineConfigurationVersion
//! never does): the installer refuses a manifest whose version is installed with other
//! contents. The image builder names each set by [`content_version`], a digest of what it
//! holds, so the same images always get the same version and different images never
//! share one; an operator who assembles a set by hand may choose any name that passes
//! [`valid_name`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The manifest's file name, inside the set's directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Why a manifest is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of the expected shape.
    #[error("the boot images manifest is not valid: {0}")]
    Parse(String),
    /// A version or file name that could escape its directory or is not a plain name.
    #[error(
        "{what} {name:?} is not a plain name (letters, digits, '.', '_', '-'; at most 128; not starting with '.')"
    )]
    Name {
        /// `version` or `file`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A digest that is not 64 lower-case hex digits.
    #[error("file {name}: sha256 {sha256:?} is not 64 lower-case hex digits")]
    Digest {
        /// The file.
        name: String,
        /// The digest as written.
        sha256: String,
    },
    /// A Kubernetes version not of the form `v1.35.4`.
    #[error("kubernetesVersion {0:?} is not a Kubernetes release such as v1.35.4")]
    KubernetesVersion(String),
    /// Two entries with one name, or two with one role.
    #[error("{0} appears twice in the manifest")]
    Duplicate(String),
    /// A kernel, an initrd or a node image is missing.
    #[error("the manifest lists no {0}")]
    MissingRole(BootImageRole),
}

/// What a file of a set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BootImageRole {
    /// The host OS kernel (`boot.kernelURL`).
    Kernel,
    /// The host OS initrd (`boot.initrdURL`).
    Initrd,
    /// The node container image (`image.url`, `image.sha256`).
    NodeImage,
}

impl std::fmt::Display for BootImageRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kernel => "kernel",
            Self::Initrd => "initrd",
            Self::NodeImage => "node image",
        })
    }
}

/// One file of a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootImageFile {
    /// Its name inside the set's directory (a plain name, no `/`).
    pub name: String,
    /// What it is.
    pub role: BootImageRole,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256 (64 lower-case hex digits).
    pub sha256: String,
}

/// A set of boot images (`manifest.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootImagesManifest {
    /// The set's version: its directory name under the images directory.
    pub version: String,
    /// Its files: exactly one kernel, one initrd and one node image.
    pub files: Vec<BootImageFile>,
    /// The kubelet the node image carries (`v1.35.4`), which a MachineConfiguration that
    /// selects the set names as `kubernetes.version` (the agent refuses a node image whose
    /// kubelet is another). Absent in a set assembled without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
}

/// The MachineConfiguration fields that select one set: `boot.kernelURL`,
/// `boot.initrdURL`, `image.url` and `image.sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigurationValues {
    /// `<version>/<kernel>`, relative to the bootserver's `/images/`.
    pub kernel_url: String,
    /// `<version>/<initrd>`.
    pub initrd_url: String,
    /// `<version>/<node image>`.
    pub image_url: String,
    /// The node image's SHA-256: what the agent verifies before it unpacks the image.
    pub image_sha256: String,
    /// `kubernetes.version`: the kubelet of the node image, when the manifest says.
    pub kubernetes_version: Option<String>,
}

impl ConfigurationValues {
    /// The values as the `spec.template` fragment of a MachineConfiguration (YAML).
    pub fn template_yaml(&self) -> String {
        let mut yaml = format!(
            "boot:\n  kernelURL: {}\n  initrdURL: {}\nimage:\n  url: {}\n  sha256: {}\n",
            self.kernel_url, self.initrd_url, self.image_url, self.image_sha256
        );
        if let Some(version) = &self.kubernetes_version {
            yaml.push_str(&format!("kubernetes:\n  version: {version}\n"));
        }
        yaml
    }
}

/// Whether `name` may be a version or a file name: 1–128 of ASCII letters, digits, `.`,
/// `_`, `-`, not starting with `.` (so never `.`, `..` or a hidden name the installer uses
/// for its work in progress).
pub fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `v<major>.<minor>.<patch>`, digits only (at most 4 each): a Kubernetes release.
pub fn valid_release(version: &str) -> bool {
    let Some(numbers) = version.strip_prefix('v') else {
        return false;
    };
    let parts: Vec<&str> = numbers.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| (1..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

fn valid_sha256(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The version the image builder gives a set: the first 16 hex digits of the SHA-256 over
/// each file's role, name, size and digest (in role order), so that it names the contents
/// and nothing else.
pub fn content_version(files: &[BootImageFile]) -> String {
    let mut sorted: Vec<&BootImageFile> = files.iter().collect();
    sorted.sort_by(|a, b| (a.role, &a.name).cmp(&(b.role, &b.name)));
    let mut text = String::new();
    for file in sorted {
        text.push_str(&format!(
            "{:?} {} {} {}\n",
            file.role, file.name, file.size, file.sha256
        ));
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl BootImagesManifest {
    /// Parses and validates a manifest.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        let manifest: Self =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse(e.to_string()))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// The manifest as written to `manifest.json` (pretty, with a final newline).
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Checks names, digests and that each role appears exactly once.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if !valid_name(&self.version) {
            return Err(ManifestError::Name {
                what: "version",
                name: self.version.clone(),
            });
        }
        if let Some(version) = &self.kubernetes_version
            && !valid_release(version)
        {
            return Err(ManifestError::KubernetesVersion(version.clone()));
        }
        let mut names = BTreeSet::new();
        let mut roles = BTreeSet::new();
        for file in &self.files {
            if !valid_name(&file.name) || file.name == MANIFEST_FILE {
                return Err(ManifestError::Name {
                    what: "file",
                    name: file.name.clone(),
                });
            }
            if !valid_sha256(&file.sha256) {
                return Err(ManifestError::Digest {
                    name: file.name.clone(),
                    sha256: file.sha256.clone(),
                });
            }
            if !names.insert(file.name.as_str()) {
                return Err(ManifestError::Duplicate(format!("file {}", file.name)));
            }
            if !roles.insert(file.role) {
                return Err(ManifestError::Duplicate(format!("the {}", file.role)));
            }
        }
        for role in [
            BootImageRole::Kernel,
            BootImageRole::Initrd,
            BootImageRole::NodeImage,
        ] {
            if !roles.contains(&role) {
                return Err(ManifestError::MissingRole(role));
            }
        }
        Ok(())
    }

    /// The file with a role.
    pub fn file(&self, role: BootImageRole) -> Option<&BootImageFile> {
        self.files.iter().find(|f| f.role == role)
    }

    /// The MachineConfiguration values that select this set (`None` for a manifest that
    /// lacks a role; a validated one never does).
    pub fn configuration_values(&self) -> Option<ConfigurationValues> {
        let url = |role| {
            self.file(role)
                .map(|f| format!("{}/{}", self.version, f.name))
        };
        Some(ConfigurationValues {
            kernel_url: url(BootImageRole::Kernel)?,
            initrd_url: url(BootImageRole::Initrd)?,
            image_url: url(BootImageRole::NodeImage)?,
            image_sha256: self.file(BootImageRole::NodeImage)?.sha256.clone(),
            kubernetes_version: self.kubernetes_version.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, role: BootImageRole, digit: char) -> BootImageFile {
        BootImageFile {
            name: name.into(),
            role,
            size: 3,
            sha256: digit.to_string().repeat(64),
        }
    }

    fn good() -> BootImagesManifest {
        let files = vec![
            file("vmlinuz", BootImageRole::Kernel, 'a'),
            file("initrd.img", BootImageRole::Initrd, 'b'),
            file("node.tar.zst", BootImageRole::NodeImage, 'c'),
        ];
        BootImagesManifest {
            version: content_version(&files),
            files,
            kubernetes_version: Some("v1.35.4".into()),
        }
    }

    #[test]
    fn a_manifest_round_trips_and_names_its_urls() {
        let manifest = good();
        assert_eq!(
            BootImagesManifest::parse(&manifest.to_json()),
            Ok(manifest.clone())
        );
        let values = manifest.configuration_values().unwrap();
        let v = &manifest.version;
        assert_eq!(values.kernel_url, format!("{v}/vmlinuz"));
        assert_eq!(values.initrd_url, format!("{v}/initrd.img"));
        assert_eq!(values.image_url, format!("{v}/node.tar.zst"));
        assert_eq!(values.image_sha256, "c".repeat(64));
        assert!(
            values
                .template_yaml()
                .contains(&format!("  sha256: {}\n", "c".repeat(64)))
        );
        assert_eq!(values.kubernetes_version.as_deref(), Some("v1.35.4"));
        assert!(
            values
                .template_yaml()
                .ends_with("kubernetes:\n  version: v1.35.4\n")
        );
    }

    #[test]
    fn a_release_is_three_plain_numbers() {
        for good in ["v1.34.4", "v1.35.0", "v2.0.10"] {
            assert!(valid_release(good), "{good}");
        }
        for bad in [
            "1.34.4",
            "v1.34",
            "v1.34.4-rc.1",
            "v1.34.4/../x",
            "v1..4",
            "",
            "v1.34.4 ",
            "va.b.c",
            "v1.34.44444",
        ] {
            assert!(!valid_release(bad), "{bad}");
        }
    }

    #[test]
    fn the_kubernetes_version_is_optional_and_checked() {
        let mut manifest = good();
        manifest.kubernetes_version = None;
        let json = manifest.to_json();
        assert!(!String::from_utf8_lossy(&json).contains("kubernetesVersion"));
        let parsed = BootImagesManifest::parse(&json).unwrap();
        let values = parsed.configuration_values().unwrap();
        assert!(!values.template_yaml().contains("kubernetes"));
        for bad in ["1.35.4", "v1.35", "v1.35.4-rc.0", "v1.35.4\nx"] {
            manifest.kubernetes_version = Some(bad.into());
            assert_eq!(
                manifest.validate(),
                Err(ManifestError::KubernetesVersion(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_content_version_follows_the_contents_only() {
        let manifest = good();
        assert_eq!(manifest.version.len(), 16);
        let mut reordered = manifest.files.clone();
        reordered.reverse();
        assert_eq!(content_version(&reordered), manifest.version, "order");
        for change in 0..3 {
            let mut files = manifest.files.clone();
            match change {
                0 => files[2].sha256 = "d".repeat(64),
                1 => files[1].size += 1,
                _ => files[0].name = "vmlinuz-2".into(),
            }
            assert_ne!(content_version(&files), manifest.version, "change {change}");
        }
    }

    #[test]
    fn bad_manifests_say_what_is_wrong() {
        type Edit = fn(&mut BootImagesManifest);
        let cases: [(&str, Edit, &str); 9] = [
            (
                "version with a slash",
                |m| m.version = "a/b".into(),
                "version \"a/b\"",
            ),
            (
                "version ..",
                |m| m.version = "..".into(),
                "not a plain name",
            ),
            ("empty version", |m| m.version.clear(), "not a plain name"),
            (
                "file escaping",
                |m| m.files[0].name = "../vmlinuz".into(),
                "file \"../vmlinuz\"",
            ),
            (
                "file named like the manifest",
                |m| m.files[0].name = MANIFEST_FILE.into(),
                "manifest.json",
            ),
            (
                "upper-case digest",
                |m| m.files[1].sha256 = "B".repeat(64),
                "64 lower-case hex",
            ),
            (
                "duplicate name",
                |m| m.files[1].name = "vmlinuz".into(),
                "file vmlinuz appears twice",
            ),
            (
                "duplicate role",
                |m| m.files[1].role = BootImageRole::Kernel,
                "the kernel appears twice",
            ),
            (
                "missing role",
                |m| {
                    m.files.pop();
                },
                "no node image",
            ),
        ];
        for (case, edit, expected) in cases {
            let mut manifest = good();
            edit(&mut manifest);
            let error = BootImagesManifest::parse(&manifest.to_json())
                .expect_err(case)
                .to_string();
            assert!(error.contains(expected), "{case}: {error}");
        }
        let unknown = br#"{"version":"v1","files":[],"extra":1}"#;
        assert!(matches!(
            BootImagesManifest::parse(unknown),
            Err(ManifestError::Parse(_))
        ));
    }
}
