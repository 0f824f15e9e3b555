//! The boot images image: one versioned set of boot images (host OS kernel and initrd, node
//! image, `manifest.json`) in [`BOOT_IMAGES_DIR`], with the bootserver binary that installs
//! it.

use std::path::{Path, PathBuf};

use unbounded_api::boot_images::{
    BootImageFile, BootImageRole, BootImagesManifest, ConfigurationValues, MANIFEST_FILE,
    content_version,
};

use super::{
    Assembled, BOOT_IMAGES_DIR, BOOT_IMAGES_NAME, ContainerError, INSTALLED_IMAGES_DIR, REPOSITORY,
    RustBinary, SBOM_PATH, labels,
};
use crate::failure::Failure;
use crate::oci::{ImageSpec, Layer, LayerCompression, LayerFile};
use crate::sbom::{self, Package, Sbom};

/// A set of boot images as the image builder found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSet {
    /// The host OS kernel.
    pub kernel: PathBuf,
    /// The host OS initrd.
    pub initrd: PathBuf,
    /// The node image.
    pub node: PathBuf,
    /// What the host OS is (its recipe's `manifest.txt`), for the SBOM.
    pub host_description: String,
    /// What the node image is.
    pub node_description: String,
}

/// The boot images image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootImages {
    /// The image.
    pub assembled: Assembled,
    /// The set's manifest.
    pub manifest: BootImagesManifest,
}

impl BootImages {
    /// What a MachineConfiguration names to boot this set.
    pub fn values(&self) -> Option<ConfigurationValues> {
        self.manifest.configuration_values()
    }
}

/// The boot images image: the set (and its manifest) as a plain layer, the installer (the
/// bootserver binary) and the SBOM as a gzip layer.
pub fn boot_images_image(
    installer: &RustBinary,
    set: &BootSet,
    version: &str,
    created: &str,
) -> Result<BootImages, ContainerError> {
    let parts: [(&str, BootImageRole, &Path, &str, &str); 3] = [
        (
            "vmlinuz",
            BootImageRole::Kernel,
            set.kernel.as_path(),
            "package:unbounded-host-os",
            "the host OS kernel (Debian's linux-image-amd64; images/host/build.sh)",
        ),
        (
            "initrd.img",
            BootImageRole::Initrd,
            set.initrd.as_path(),
            "package:unbounded-host-os",
            "the host OS root file system as a zstd cpio (images/host/build.sh)",
        ),
        (
            "node.tar.zst",
            BootImageRole::NodeImage,
            set.node.as_path(),
            "package:unbounded-node-image",
            "the node image (images/node/build.sh)",
        ),
    ];
    let mut entries = Vec::new();
    let mut sbom_files = Vec::new();
    let mut set_layer = Vec::new();
    for (name, role, source, package, origin) in parts {
        let path = format!("{BOOT_IMAGES_DIR}/{name}");
        let file = sbom::File::of_path(&path, source, vec![package.into()], origin)?;
        let size = std::fs::metadata(source)
            .map_err(|e| Failure::new(source.display(), e))?
            .len();
        entries.push(BootImageFile {
            name: name.into(),
            role,
            size,
            sha256: file.sha256.clone(),
        });
        set_layer.push(LayerFile::copy(path, source, 0o644));
        sbom_files.push(file);
    }
    let manifest = BootImagesManifest {
        version: content_version(&entries),
        files: entries,
        // The node image's kubelet: the testbed's release (images/node/build.sh).
        kubernetes_version: Some(crate::cluster::KUBERNETES_VERSION.to_owned()),
    };
    manifest.validate().map_err(Failure::of)?;
    let manifest_path = format!("{BOOT_IMAGES_DIR}/{MANIFEST_FILE}");
    let manifest_bytes = manifest.to_json();
    sbom_files.push(sbom::File::of_bytes(
        &manifest_path,
        &manifest_bytes,
        Vec::new(),
        "the set's manifest: each file's role, size and sha256 (what install-images verifies)",
    ));
    set_layer.push(LayerFile::bytes(manifest_path, manifest_bytes, 0o644));

    let (bin_layer, bin_file) = installer.image_file()?;
    sbom_files.push(bin_file);
    let mut packages = installer.packages.clone();
    for (key, name, description) in [
        (
            "package:unbounded-host-os",
            "unbounded-host-os",
            &set.host_description,
        ),
        (
            "package:unbounded-node-image",
            "unbounded-node-image",
            &set.node_description,
        ),
    ] {
        packages.push(Package {
            key: key.into(),
            name: name.into(),
            version: manifest.version.clone(),
            download: "NOASSERTION".into(),
            sha256: None,
            license: None,
            purl: None,
            purpose: "OPERATING-SYSTEM",
            depends_on: Vec::new(),
            comment: Some(description.clone()),
        });
    }
    let sbom = Sbom {
        name: format!("unbounded/{BOOT_IMAGES_NAME}"),
        version: manifest.version.clone(),
        files: sbom_files,
        packages,
    }
    .to_spdx(created);
    let entrypoint = [
        format!("/usr/local/bin/{}", installer.package),
        "install-images".into(),
        "--from".into(),
        BOOT_IMAGES_DIR.into(),
        "--to".into(),
        INSTALLED_IMAGES_DIR.into(),
    ];
    let spec = ImageSpec {
        references: vec![
            format!("{REPOSITORY}/{BOOT_IMAGES_NAME}:{}", manifest.version),
            format!("{REPOSITORY}/{BOOT_IMAGES_NAME}:{version}"),
        ],
        layers: vec![
            Layer {
                files: vec![bin_layer, LayerFile::bytes(SBOM_PATH, sbom.clone(), 0o644)],
                compression: LayerCompression::Gzip,
                comment: "the installer (unbounded-bootserver) and the SBOM".into(),
            },
            Layer {
                files: set_layer,
                compression: LayerCompression::None,
                comment: format!("boot images {} (compressed already)", manifest.version),
            },
        ],
        entrypoint: entrypoint.to_vec(),
        // It writes the node's hostPath; the Deployment drops every capability.
        user: "0:0".into(),
        env: Vec::new(),
        labels: labels(
            &format!("unbounded/{BOOT_IMAGES_NAME}"),
            "Unbounded's host OS and node images, one versioned set, with their installer",
            &manifest.version,
        ),
    };
    Ok(BootImages {
        assembled: Assembled { spec, sbom },
        manifest,
    })
}
