//! `--containers`: the project's container images and the boot images image, built from
//! the static release binaries and recorded in `containers.json`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cache::{Key, Progress, cached_build, file_sha256, run_logged};
use super::cargo::rust_binaries;
use super::{
    CNI_PLUGINS_VERSION, CONTAINERD_VERSION, HostImage, ImagesError, NodeImage, VERSION,
    images_cache, step_err, step_failed,
};
use crate::containers::{self, BootSet, BuiltContainers, BuiltImage, Contents, PROJECT_IMAGES};
use crate::failure::Failure;
use crate::oci::{self, ImageSpec};
use crate::sbom;

/// The code that writes the container images: part of their keys, so that a change to
/// how an image is put together rebuilds it.
pub(super) const IMAGE_WRITER: [&str; 5] = [
    include_str!("../oci.rs"),
    include_str!("../sbom.rs"),
    include_str!("../containers/mod.rs"),
    include_str!("../containers/contents.rs"),
    include_str!("../containers/boot_images.rs"),
];

pub(super) fn writer_key(key: Key) -> Key {
    IMAGE_WRITER
        .iter()
        .fold(key, |key, source| key.text("writer", source))
        .text("version", VERSION)
        .text("created", &sbom::creation_time())
}

/// Where `images --containers` records what it built.
pub fn containers_path() -> PathBuf {
    images_cache().join("containers.json")
}

/// The container images the last `images --containers` built, without building anything.
pub fn cached_containers() -> Result<BuiltContainers, ImagesError> {
    const RUN: &str = "): run `cargo run -p unbounded-testbed -- images --containers` first";
    let missing = |why: String| {
        step_err(
            "images",
            format!("no container images recorded ({why}{RUN}"),
        )
    };
    let text = fs::read_to_string(containers_path()).map_err(|e| {
        let before = format!(
            "no container images recorded ({}: ",
            containers_path().display()
        );
        step_failed("images", Failure::around(before, e, RUN))
    })?;
    let built: BuiltContainers = serde_json::from_str(&text).map_err(|e| {
        step_failed(
            "images",
            Failure::around("no container images recorded (", e, RUN),
        )
    })?;
    for image in built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
    {
        if !image.layout.join("index.json").exists() {
            return Err(missing(format!("{} is gone", image.layout.display())));
        }
    }
    Ok(built)
}

/// What `images/containers/build-contents.sh` makes: the iPXE builds and the CA bundle,
/// from the pinned Debian packages; each file checked again against the lock here, built
/// now or cached.
pub(super) fn container_contents(recipes: &Path) -> Result<(Contents, bool), ImagesError> {
    let script = recipes.join("containers/build-contents.sh");
    let lock_path = recipes.join("containers/contents.lock");
    let key = Key::default()
        .path("script", &script)?
        .path("lock", &lock_path)?
        .finish();
    let (dir, cached) = cached_build("contents", &key, |dir| {
        run_logged(
            "container contents",
            Command::new("bash").arg(&script).arg(dir),
            &dir.join("build.log"),
        )
    })?;
    let contents = Contents::read(&dir)?;
    let lock = fs::read_to_string(&lock_path)
        .map_err(|e| step_failed("container contents", Failure::new(lock_path.display(), e)))
        .and_then(|t| {
            containers::parse_contents(&t).map_err(|e| step_err("container contents", e))
        })?;
    for pinned in lock.iter().filter(|l| l.kind == "file") {
        let actual = file_sha256(&dir.join(&pinned.name))
            .map_err(|e| step_failed("container contents", e))?;
        if pinned.sha256.as_deref() != Some(actual.as_str()) {
            return Err(step_err(
                "container contents",
                format!(
                    "{}: sha256 {actual}, contents.lock pins {}",
                    pinned.name,
                    pinned.sha256.as_deref().unwrap_or("-")
                ),
            ));
        }
    }
    Ok((contents, cached))
}

pub(super) fn built_image(
    name: &str,
    dir: &Path,
    written: &oci::WrittenImage,
    spec: &ImageSpec,
) -> BuiltImage {
    BuiltImage {
        name: name.to_owned(),
        references: spec.references.clone(),
        layout: written.layout.clone(),
        archive: written.archive.clone(),
        manifest_digest: written.manifest_digest.clone(),
        sbom: dir.join("sbom.spdx.json"),
    }
}

/// The recorded image of a cached build directory.
pub(super) fn recorded(dir: &Path) -> Result<BuiltImage, ImagesError> {
    let path = dir.join("image.json");
    let text = fs::read_to_string(&path).map_err(|e| step_failed("images", Failure::of(e)))?;
    serde_json::from_str(&text).map_err(|e| step_failed("images", Failure::of(e)))
}

pub(super) fn record(dir: &Path, image: &BuiltImage) -> Result<(), ImagesError> {
    let text =
        serde_json::to_string_pretty(image).map_err(|e| step_failed("images", Failure::of(e)))?;
    fs::write(dir.join("image.json"), text).map_err(|e| step_failed("images", Failure::of(e)))
}

/// The four container images, each cached by its inputs; records them in
/// `containers.json`.
pub(super) fn container_images(
    progress: &mut Progress,
    recipes: &Path,
    host: &HostImage,
    node: &NodeImage,
    built: Vec<PathBuf>,
) -> Result<BuiltContainers, ImagesError> {
    let contents = progress.run("container contents (iPXE builds, CA certificates)", || {
        container_contents(recipes)
    })?;
    let binaries = progress.run(
        "controller, bootserver, Azure provider (SBOMs of their static builds)",
        || Ok((rust_binaries(built)?, false)),
    )?;
    let created = sbom::creation_time();
    let images = progress.run("container images (controller, bootserver, azure)", || {
        let mut all_cached = true;
        let mut out = Vec::new();
        for (image, binary) in PROJECT_IMAGES.iter().zip(&binaries) {
            let key = writer_key(Key::default())
                .text("image", image.name)
                .path("binary", &binary.path)?
                .path("contents", &contents.dir)?
                .path(
                    "lock",
                    &Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"),
                )?
                .finish();
            let mut built = None;
            let (dir, cached) = cached_build(&format!("image-{}", image.name), &key, |dir| {
                let assembled =
                    containers::project_image(image, binary, &contents, VERSION, &created)?;
                let written = containers::write(&assembled, dir)?;
                let b = built_image(image.name, dir, &written, &assembled.spec);
                record(dir, &b)?;
                built = Some(b);
                Ok(())
            })?;
            all_cached &= cached;
            out.push(match built {
                Some(b) => b,
                None => recorded(&dir)?,
            });
        }
        Ok((out, all_cached))
    })?;
    let bootserver = binaries
        .iter()
        .find(|b| b.package == "unbounded-bootserver")
        .ok_or_else(|| step_err("boot images", "no bootserver was built"))?;
    let (boot_images, manifest) = progress.run("boot images image (host OS, node image, installer)", || {
        let key = writer_key(Key::default())
            .path("installer", &bootserver.path)?
            .path("kernel", &host.kernel)?
            .path("initrd", &host.initrd)?
            .text("node", &node.sha256)
            .finish();
        let mut built = None;
        let (dir, cached) = cached_build("image-boot-images", &key, |dir| {
            let text = |path: &Path| {
                fs::read_to_string(path.with_file_name("manifest.txt"))
                    .unwrap_or_default()
                    .lines()
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let set = BootSet {
                kernel: host.kernel.clone(),
                initrd: host.initrd.clone(),
                node: node.archive.clone(),
                host_description: format!(
                    "Unbounded's host OS (images/host/build.sh): {}",
                    text(&host.kernel)
                ),
                node_description: format!(
                    "Unbounded's node image (images/node/build.sh): {}; containerd {CONTAINERD_VERSION}, CNI plugins {CNI_PLUGINS_VERSION}",
                    text(&node.archive)
                ),
            };
            let boot = containers::boot_images_image(bootserver, &set, VERSION, &created)?;
            let written = containers::write(&boot.assembled, dir)?;
            let b = built_image(containers::BOOT_IMAGES_NAME, dir, &written, &boot.assembled.spec);
            record(dir, &b)?;
            fs::write(dir.join("manifest.json"), boot.manifest.to_json())
                .map_err(|e| step_failed("boot images", Failure::of(e)))?;
            if let Some(values) = boot.values() {
                fs::write(
                    dir.join("machineconfiguration.yaml"),
                    format!(
                        "# spec.template of a MachineConfiguration that boots the set {v}\n# (installed by {r}):\n{}",
                        values.template_yaml(),
                        v = boot.manifest.version,
                        r = b.references.first().map_or("", String::as_str),
                    ),
                )
                .map_err(|e| step_failed("boot images", Failure::of(e)))?;
            }
            built = Some(b);
            Ok(())
        })?;
        let image = match built {
            Some(b) => b,
            None => recorded(&dir)?,
        };
        let manifest = fs::read(dir.join("manifest.json"))
            .map_err(|e| step_failed("boot images", Failure::of(e)))
            .and_then(|bytes| {
                unbounded_api::boot_images::BootImagesManifest::parse(&bytes)
                    .map_err(|e| step_failed("boot images", Failure::of(e)))
            })?;
        Ok(((image, manifest), cached))
    })?;
    let machine_configuration = boot_images
        .layout
        .with_file_name("machineconfiguration.yaml");
    let built = BuiltContainers {
        version: VERSION.to_owned(),
        images,
        boot_images,
        boot_images_manifest: manifest,
        machine_configuration,
    };
    let text =
        serde_json::to_string_pretty(&built).map_err(|e| step_failed("images", Failure::of(e)))?;
    fs::write(containers_path(), text).map_err(|e| step_failed("images", Failure::of(e)))?;
    Ok(built)
}
