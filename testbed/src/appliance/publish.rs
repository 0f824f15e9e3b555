//! What the appliance and its pods pull from the lab's registry, and the lab's overlay
//! of `deploy/`.

use std::fs;
use std::path::Path;

use super::{BootArtifacts, PushedLayout, kubectl, step};
use crate::cluster::LocalControlPlane;
use crate::failure::Failure;
use crate::images::Images;
use crate::lab::base::{LAB_ADDRESS, LabError};
use crate::overlay::{self, PushedImage};
use crate::registry::RegistryAddress;

/// Pushes every container image `images --containers` built (the project's images and the
/// boot images image), as `unbounded/<name>`.
pub(super) fn push_images(
    registry: &RegistryAddress,
    images: &Images,
) -> Result<Vec<PushedLayout>, LabError> {
    let Some(built) = &images.containers else {
        return Err(step(
            "no container images were built: run `cargo run -p unbounded-testbed -- images --containers`",
        ));
    };
    built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
        .map(|image| {
            let reference = image
                .references
                .first()
                .ok_or_else(|| step(format!("the image {} has no reference", image.name)))?;
            let short = overlay::short_name(reference).to_owned();
            let tag = crate::oci::tag_of(reference).to_owned();
            let repository = format!("unbounded/{short}");
            let digest = registry.push_layout(&image.layout, &tag, &repository, &tag)?;
            Ok(PushedLayout {
                short_name: short,
                layout: image.layout.clone(),
                layout_tag: tag,
                repository,
                digest,
            })
        })
        .collect()
}

/// What a MachineConfiguration names to boot the set the boot-images image installs: paths
/// relative to the bootserver's image directory.
pub(super) fn installed_set_artifacts(images: &Images) -> Result<BootArtifacts, LabError> {
    let values = images
        .containers
        .as_ref()
        .and_then(|built| built.boot_images_manifest.configuration_values())
        .ok_or_else(|| {
            step("no boot image set was built: run `cargo run -p unbounded-testbed -- images --containers`")
        })?;
    Ok(BootArtifacts {
        kernel_url: values.kernel_url,
        initrd_url: values.initrd_url,
        node_url: values.image_url,
        node_sha256: values.image_sha256,
    })
}

/// Pushes the kernel, the initramfs and the node image as blobs; their URLs name them by
/// SHA-256.
pub(super) fn push_artifacts(
    registry: &RegistryAddress,
    images: &Images,
) -> Result<BootArtifacts, LabError> {
    let sha = |path: &Path| crate::images::file_sha256(path).map_err(LabError::from);
    let kernel = registry.push_blob(
        "unbounded/boot",
        &images.host.kernel,
        &sha(&images.host.kernel)?,
    )?;
    let initrd = registry.push_blob(
        "unbounded/boot",
        &images.host.initrd,
        &sha(&images.host.initrd)?,
    )?;
    let node = registry.push_blob("unbounded/boot", &images.node.archive, &images.node.sha256)?;
    Ok(BootArtifacts {
        kernel_url: kernel,
        initrd_url: initrd,
        node_url: node,
        node_sha256: images.node.sha256.clone(),
    })
}

/// Writes the lab's kustomization over `testbed/overlay` and applies it: the images by
/// digest, and the bootserver's configuration with discovery on, booting `machines`' host
/// OS ([`crate::lab::discovery`]).
pub(super) fn apply_overlay(
    plane: &LocalControlPlane,
    dir: &Path,
    pushed: &[PushedLayout],
    machines: &BootArtifacts,
) -> Result<(), LabError> {
    let base = overlay::testbed_overlay();
    let base = fs::canonicalize(&base).map_err(|e| Failure::new(base.display(), e))?;
    let rendered = kubectl(plane, &["kustomize", &base.display().to_string()], None)?;
    let pushed: Vec<PushedImage> = pushed
        .iter()
        .map(|p| PushedImage {
            short_name: p.short_name.clone(),
            repository: format!(
                "{LAB_ADDRESS}:{}/{}",
                crate::registry::REGISTRY_PORT,
                p.repository
            ),
            digest: p.digest.clone(),
        })
        .collect();
    let overrides = overlay::image_overrides(&overlay::manifest_images(&rendered), &pushed);
    let out = dir.join("overlay");
    fs::create_dir_all(&out).map_err(|e| Failure::new(out.display(), e))?;
    let out = fs::canonicalize(&out).map_err(|e| Failure::new(out.display(), e))?;
    let configmap = base.join("bootserver-config.yaml");
    let configmap =
        fs::read_to_string(&configmap).map_err(|e| Failure::new(configmap.display(), e))?;
    let discovery_patch = "bootserver-discovery.yaml";
    fs::write(
        out.join(discovery_patch),
        crate::lab::discovery::configmap_patch(&configmap, machines)?,
    )
    .map_err(|e| Failure::new(out.display(), e))?;
    fs::write(
        out.join("kustomization.yaml"),
        overlay::lab_kustomization(
            &overlay::relative_path(&out, &base),
            &overrides,
            &[discovery_patch],
        ),
    )
    .map_err(|e| Failure::new(out.display(), e))?;
    apply_tls_secret(plane, &out)?;
    kubectl(
        plane,
        &["apply", "--server-side", "-k", &out.display().to_string()],
        None,
    )?;
    Ok(())
}

/// The bootserver's TLS certificate and key (`http.tls` in the overlay's configuration): a
/// self-signed P-256 certificate for the appliance's address, made once per lab directory,
/// as the Secret `unbounded-bootserver-tls` (what cert-manager would write).
fn apply_tls_secret(plane: &LocalControlPlane, out: &Path) -> Result<(), LabError> {
    let (mut cert, mut key) = (out.join("tls.crt"), out.join("tls.key"));
    if !cert.exists() || !key.exists() {
        (cert, key) = crate::cluster::self_signed_server(out, "10.99.0.2")
            .map_err(|e| Failure::new("the bootserver's certificate", e))?;
    }
    // Its namespace first (deploy/ creates it too, after): the pod must find the Secret at
    // its first start.
    let namespace = crate::cluster::deploy_dir().join("namespace.yaml");
    kubectl(
        plane,
        &[
            "apply",
            "--server-side",
            "-f",
            &namespace.display().to_string(),
        ],
        None,
    )?;
    let secret = kubectl(
        plane,
        &[
            "create",
            "secret",
            "tls",
            "unbounded-bootserver-tls",
            "-n",
            "unbounded-system",
            &format!("--cert={}", cert.display()),
            &format!("--key={}", key.display()),
            "--dry-run=client",
            "-o",
            "yaml",
        ],
        None,
    )?;
    kubectl(plane, &["apply", "--server-side", "-f", "-"], Some(&secret))?;
    Ok(())
}
