//! How the lab applies `deploy/`: through the kustomize overlay `testbed/overlay`
//! (the appliance's interface and address, the API server's address, node selectors), and
//! on top of it a kustomization the lab writes for each run that points every image of the
//! manifests at the copy the lab pushed to its registry, by digest.
//!
//! Which image is which is decided by the last component of its repository
//! (`unbounded/controller:0.1.0` is the built image whose reference ends in `/controller`),
//! so that an image that `images --containers` builds under any registry prefix replaces the
//! one the manifests name, and a new image (a new Deployment, an init container) needs no
//! change here. An image of the manifests that was not built is left as it is: its pods
//! cannot pull it, which the lab's wait for Running pods reports by name.

use std::path::{Path, PathBuf};

/// The overlay in the repository.
pub fn testbed_overlay() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("overlay")
}

/// One image the lab pushed: the last component of its repository (`controller`), and
/// where it is now (`10.99.0.1:5000/unbounded/controller`, `sha256:…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    /// The repository's last component.
    pub short_name: String,
    /// The repository in the lab's registry.
    pub repository: String,
    /// The manifest digest.
    pub digest: String,
}

/// A kustomize `images:` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOverride {
    /// The image name as the manifests write it, without tag or digest.
    pub name: String,
    /// Where it is pulled from instead.
    pub new_name: String,
    /// By this digest.
    pub digest: String,
}

/// The name of an image reference without its tag or digest
/// (`reg:5000/a/b:1@sha256:…` → `reg:5000/a/b`).
pub fn image_name(reference: &str) -> &str {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    match without_digest.rsplit_once(':') {
        // A colon after the last slash separates the tag; one before it is a registry port.
        Some((name, tag)) if !tag.contains('/') => name,
        _ => without_digest,
    }
}

/// The last component of an image's repository.
pub fn short_name(reference: &str) -> &str {
    let name = image_name(reference);
    name.rsplit('/').next().unwrap_or(name)
}

/// Every `image:` value in rendered manifests (YAML as `kubectl kustomize` prints it), each
/// once, in order of appearance.
pub fn manifest_images(rendered: &str) -> Vec<String> {
    let mut images: Vec<String> = Vec::new();
    for line in rendered.lines() {
        let trimmed = line.trim_start().trim_start_matches("- ");
        if let Some(value) = trimmed.strip_prefix("image:") {
            let value = value.trim().trim_matches('"').trim_matches('\'').to_owned();
            if !value.is_empty() && !images.contains(&value) {
                images.push(value);
            }
        }
    }
    images
}

/// The `images:` entries: each image of the manifests that was pushed, by its short name.
pub fn image_overrides(manifest_images: &[String], pushed: &[PushedImage]) -> Vec<ImageOverride> {
    manifest_images
        .iter()
        .filter_map(|image| {
            let short = short_name(image);
            pushed
                .iter()
                .find(|p| p.short_name == short)
                .map(|p| ImageOverride {
                    name: image_name(image).to_owned(),
                    new_name: p.repository.clone(),
                    digest: p.digest.clone(),
                })
        })
        .collect()
}

/// `to` as a path relative to the directory `from` (both absolute and without `..`):
/// kustomize accepts only relative paths as resources.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for part in &to[common..] {
        out.push(part);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The lab's kustomization: `base` (the repository's overlay, as a path relative to the
/// kustomization's directory) with `overrides`, and `patches` (files beside the
/// kustomization).
pub fn lab_kustomization(base: &Path, overrides: &[ImageOverride], patches: &[&str]) -> String {
    let mut out = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         # Written by unbounded-testbed for this run: testbed/overlay with the images\n\
         # the lab pushed to its registry, by digest.\nresources:\n  - {}\n",
        base.display()
    );
    if !patches.is_empty() {
        out.push_str("patches:\n");
        for patch in patches {
            out.push_str(&format!("  - path: {patch}\n"));
        }
    }
    if !overrides.is_empty() {
        out.push_str("images:\n");
        for o in overrides {
            out.push_str(&format!(
                "  - name: {}\n    newName: {}\n    digest: {}\n",
                o.name, o.new_name, o.digest
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kustomize refuses an absolute resource ("new root … cannot be absolute"): the lab's
    /// kustomization names the repository's overlay relative to its own directory.
    #[test]
    fn resources_are_named_relative_to_the_kustomization() {
        let cases = [
            (
                "/root/.cache/unbounded/testbed/run/overlay",
                "/work/repo/testbed/overlay",
                "../../../../../../work/repo/testbed/overlay",
            ),
            ("/a/b/lab", "/a/b/testbed/overlay", "../testbed/overlay"),
            ("/a/b", "/a/b/c", "c"),
            ("/a/b", "/a/b", "."),
            ("/", "/x/y", "x/y"),
        ];
        for (from, to, expected) in cases {
            let got = relative_path(Path::new(from), Path::new(to));
            assert_eq!(got, PathBuf::from(expected), "{from} → {to}");
            assert!(got.is_relative());
        }
    }

    #[test]
    fn names_without_tags_or_digests() {
        let cases = [
            (
                "unbounded/controller:0.1.0",
                "unbounded/controller",
                "controller",
            ),
            (
                "docker.io/unbounded/bootserver:0.1.0",
                "docker.io/unbounded/bootserver",
                "bootserver",
            ),
            (
                "10.99.0.1:5000/unbounded/azure@sha256:ab",
                "10.99.0.1:5000/unbounded/azure",
                "azure",
            ),
            (
                "10.99.0.1:5000/unbounded/x:1@sha256:ab",
                "10.99.0.1:5000/unbounded/x",
                "x",
            ),
            ("10.99.0.1:5000/plain", "10.99.0.1:5000/plain", "plain"),
            ("busybox", "busybox", "busybox"),
        ];
        for (reference, name, short) in cases {
            assert_eq!(image_name(reference), name, "{reference}");
            assert_eq!(short_name(reference), short, "{reference}");
        }
    }

    #[test]
    fn images_are_read_from_containers_and_init_containers_once() {
        let rendered = "spec:\n  initContainers:\n  - image: unbounded/boot-artifacts:0.1.0\n    name: a\n  containers:\n  - name: b\n    image: \"unbounded/bootserver:0.1.0\"\n---\n      - image: unbounded/bootserver:0.1.0\n        imagePullPolicy: IfNotPresent\n";
        assert_eq!(
            manifest_images(rendered),
            [
                "unbounded/boot-artifacts:0.1.0",
                "unbounded/bootserver:0.1.0"
            ]
        );
    }

    #[test]
    fn only_pushed_images_are_overridden_matched_by_short_name() {
        let pushed = [
            PushedImage {
                short_name: "controller".into(),
                repository: "10.99.0.1:5000/unbounded/controller".into(),
                digest: "sha256:c".into(),
            },
            PushedImage {
                short_name: "bootserver".into(),
                repository: "10.99.0.1:5000/unbounded/bootserver".into(),
                digest: "sha256:b".into(),
            },
        ];
        let images = [
            "unbounded/controller:0.1.0".to_owned(),
            "ghcr.io/x/bootserver:0.2.0".to_owned(),
            "unbounded/azure:0.1.0".to_owned(),
        ];
        let overrides = image_overrides(&images, &pushed);
        assert_eq!(
            overrides,
            [
                ImageOverride {
                    name: "unbounded/controller".into(),
                    new_name: "10.99.0.1:5000/unbounded/controller".into(),
                    digest: "sha256:c".into(),
                },
                ImageOverride {
                    name: "ghcr.io/x/bootserver".into(),
                    new_name: "10.99.0.1:5000/unbounded/bootserver".into(),
                    digest: "sha256:b".into(),
                },
            ]
        );
        let text = lab_kustomization(
            Path::new("../../repo/testbed/overlay"),
            &overrides,
            &["bootserver-discovery.yaml"],
        );
        assert!(
            text.contains("patches:\n  - path: bootserver-discovery.yaml\n"),
            "{text}"
        );
        assert!(
            text.contains("resources:\n  - ../../repo/testbed/overlay\n"),
            "{text}"
        );
        assert!(
            text.contains("  - name: ghcr.io/x/bootserver\n    newName: 10.99.0.1:5000/unbounded/bootserver\n    digest: sha256:b\n"),
            "{text}"
        );
    }
}
