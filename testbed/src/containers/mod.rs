//! The project's container images, as `unbounded-testbed images --containers` builds them
//! ([`crate::images`] orders the steps and caches them):
//!
//! | image | holds | entrypoint, user |
//! |---|---|---|
//! | `unbounded/controller` | the controller, the CA bundle | `unbounded-controller`, 65532 |
//! | `unbounded/bootserver` | the bootserver, the CA bundle, the iPXE builds it serves in [`IPXE_DIR`] (its default TFTP root) | `unbounded-bootserver`, root (the Deployment drops every capability but NET_BIND_SERVICE and NET_RAW) |
//! | `unbounded/azure` | the Azure provider, the CA bundle | `unbounded-azure`, 65532 |
//! | `unbounded/boot-images` | one set of boot images (host OS kernel and initrd, node image, `manifest.json`) in [`BOOT_IMAGES_DIR`], and the bootserver binary that installs it | `unbounded-bootserver install-images --from /boot-images --to /var/lib/unbounded/images`, root |
//!
//! Each carries its SBOM ([`crate::sbom`], at [`SBOM_PATH`]; also written beside the
//! layout). The binaries are static (glibc `crt-static`) release builds whose source paths
//! are remapped, so that the same commit and toolchain give the same bytes on any checkout;
//! what else goes in is pinned in `images/containers/contents.lock` and checked by
//! `images/containers/build-contents.sh`. Same inputs, same digests (tested here with
//! small inputs; the layer writer is [`crate::oci`]).
//!
//! The boot images are an image of their own, tagged by the set's content version
//! ([`unbounded_api::boot_images::content_version`]) and by the project's version, so that
//! an operator rolls them like any image: the bootserver Deployment runs one init container
//! per version still in use, each installing its set next to the others
//! (`/var/lib/unbounded/images/<version>/`), and a MachineConfiguration names one version's
//! URLs and node image digest ([`BootImages::values`]). The set is stored as a plain
//! (uncompressed) layer: it is zstd already.
//!
//! Where things are: this file holds the three images of our binaries ([`project_image`])
//! and what a build records; `contents` reads what the recipe's output holds and the lock
//! pins; `boot_images` puts the boot images image together ([`boot_images_image`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use unbounded_api::boot_images::BootImagesManifest;

use crate::failure::Failure;
use crate::oci::{self, ImageSpec, Layer, LayerCompression, LayerFile, WrittenImage};
use crate::sbom::{self, Package, Sbom};

mod boot_images;
mod contents;

pub use boot_images::{BootImages, BootSet, boot_images_image};
pub use contents::{ContentLine, Contents, parse_contents};

/// Where the images are published, as `deploy/` names them.
pub const REPOSITORY: &str = "docker.io/unbounded";
/// Where each image carries its SBOM.
pub const SBOM_PATH: &str = "/usr/share/unbounded/sbom.spdx.json";
/// Where the bootserver image carries its iPXE builds (its default TFTP root).
pub const IPXE_DIR: &str = "/usr/share/unbounded/ipxe";
/// Where the images carry the CA bundle.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the boot images image carries its set.
pub const BOOT_IMAGES_DIR: &str = "/boot-images";
/// The boot images image's name.
pub const BOOT_IMAGES_NAME: &str = "boot-images";
/// Where the installer puts the sets on the appliance node (`http.imagesDir`).
pub const INSTALLED_IMAGES_DIR: &str = "/var/lib/unbounded/images";
/// The target of the static builds.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Why an image could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// An input could not be read, or is not what it must be.
    #[error("{0}")]
    Input(String),
    /// An input could not be read or checked, on another error, which it keeps.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// Writing the image failed.
    #[error(transparent)]
    Oci(#[from] oci::OciError),
}

/// One of the images of a binary of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectImage {
    /// Its name (`controller`): `docker.io/unbounded/<name>`.
    pub name: &'static str,
    /// The crate and binary it runs.
    pub package: &'static str,
    /// The user in its config.
    pub user: &'static str,
    /// Whether it carries the iPXE builds.
    pub ipxe: bool,
    /// One line for its label.
    pub description: &'static str,
}

/// The three images `deploy/` runs.
pub const PROJECT_IMAGES: [ProjectImage; 3] = [
    ProjectImage {
        name: "controller",
        package: "unbounded-controller",
        user: "65532:65532",
        ipxe: false,
        description: "Unbounded's controller",
    },
    ProjectImage {
        name: "bootserver",
        package: "unbounded-bootserver",
        // Ports 67, 69, 4011 and SO_BINDTODEVICE need capabilities that a non-root user
        // cannot keep in a pod; the Deployment runs it as root with only NET_BIND_SERVICE
        // and NET_RAW.
        user: "0:0",
        ipxe: true,
        description: "Unbounded's bootserver (DHCP, TFTP, HTTP/iPXE, PXE provider) with the iPXE builds it serves",
    },
    ProjectImage {
        name: "azure",
        package: "unbounded-azure",
        user: "65532:65532",
        ipxe: false,
        description: "Unbounded's Azure provider",
    },
];

impl ProjectImage {
    /// `docker.io/unbounded/<name>:<version>`.
    pub fn reference(&self, version: &str) -> String {
        format!("{REPOSITORY}/{}:{version}", self.name)
    }
}

/// A static release build of one of our binaries and what went into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RustBinary {
    /// The crate (and binary) name.
    pub package: String,
    /// The executable.
    pub path: PathBuf,
    /// Its SBOM packages ([`sbom::rust_packages`]).
    pub packages: Vec<Package>,
}

impl RustBinary {
    fn key(&self) -> String {
        self.packages
            .iter()
            .find(|p| p.purpose == "APPLICATION" && p.name == self.package)
            .map_or_else(|| format!("crate:{}", self.package), |p| p.key.clone())
    }

    fn image_file(&self) -> Result<(LayerFile, sbom::File), ContainerError> {
        let path = format!("/usr/local/bin/{}", self.package);
        let file = sbom::File::of_path(
            &path,
            &self.path,
            vec![self.key()],
            "cargo build --release (static, glibc crt-static) of this workspace",
        )?;
        Ok((LayerFile::copy(path, &self.path, 0o755), file))
    }
}

fn labels(title: &str, description: &str, version: &str) -> Vec<(String, String)> {
    [
        ("org.opencontainers.image.title", title),
        ("org.opencontainers.image.description", description),
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// An image with its SBOM, ready to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled {
    /// The image.
    pub spec: ImageSpec,
    /// Its SBOM (SPDX 2.3 JSON), also inside the image.
    pub sbom: Vec<u8>,
}

/// One of [`PROJECT_IMAGES`] from its binary and the recipe's contents.
pub fn project_image(
    image: &ProjectImage,
    binary: &RustBinary,
    contents: &Contents,
    version: &str,
    created: &str,
) -> Result<Assembled, ContainerError> {
    let mut layer = Vec::new();
    let mut files = Vec::new();
    let (bin_layer, bin_file) = binary.image_file()?;
    layer.push(bin_layer);
    files.push(bin_file);
    let mut wanted: Vec<String> = Vec::new();
    let mut add = |name: &str, path: &str| -> Result<(), ContainerError> {
        let (l, f) = contents.image_file(name, path)?;
        wanted.extend(f.from.iter().cloned());
        layer.push(l);
        files.push(f);
        Ok(())
    };
    add("ca-certificates.crt", CA_BUNDLE)?;
    let mut env = vec![format!("SSL_CERT_FILE={CA_BUNDLE}")];
    if image.ipxe {
        let names: Vec<String> = contents
            .files_under("ipxe/")
            .map(|l| l.name.clone())
            .collect();
        for name in names {
            let path = format!("{IPXE_DIR}/{}", name.trim_start_matches("ipxe/"));
            add(&name, &path)?;
        }
        env.push(format!("UNBOUNDED_BOOTSERVER_TFTP_ROOT={IPXE_DIR}"));
    }
    let mut packages = binary.packages.clone();
    packages.extend(contents.packages(&wanted));
    let sbom = Sbom {
        name: format!("unbounded/{}", image.name),
        version: version.to_owned(),
        files,
        packages,
    }
    .to_spdx(created);
    layer.push(LayerFile::bytes(SBOM_PATH, sbom.clone(), 0o644));
    Ok(Assembled {
        spec: ImageSpec {
            references: vec![image.reference(version)],
            layers: vec![Layer {
                files: layer,
                compression: LayerCompression::Gzip,
                comment: format!("{}, its contents and its SBOM", image.package),
            }],
            entrypoint: vec![format!("/usr/local/bin/{}", binary.package)],
            user: image.user.to_owned(),
            env,
            labels: labels(
                &format!("unbounded/{}", image.name),
                image.description,
                version,
            ),
        },
        sbom,
    })
}

/// Writes an assembled image into `out_dir` (layout, archive) and its SBOM beside them.
pub fn write(assembled: &Assembled, out_dir: &Path) -> Result<WrittenImage, ContainerError> {
    let written = oci::write_image(&assembled.spec, out_dir)?;
    let path = out_dir.join("sbom.spdx.json");
    std::fs::write(&path, &assembled.sbom).map_err(|e| Failure::new(path.display(), e))?;
    Ok(written)
}

/// A built image, as `images` records it for the testbed and the tests
/// (`~/.cache/unbounded/images/containers.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuiltImage {
    /// Its name (`controller`, `boot-images`).
    pub name: String,
    /// Its references (the first is the one to use).
    pub references: Vec<String>,
    /// The OCI layout (`skopeo copy oci:<layout>:<tag> …`).
    pub layout: PathBuf,
    /// A tar of the layout (`ctr -n k8s.io images import <archive>`).
    pub archive: PathBuf,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// The SBOM beside the layout.
    pub sbom: PathBuf,
}

/// Everything `images --containers` built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuiltContainers {
    /// The project's version (the tag of the three images).
    pub version: String,
    /// The controller, bootserver and Azure provider images.
    pub images: Vec<BuiltImage>,
    /// The boot images image.
    pub boot_images: BuiltImage,
    /// The set it installs.
    pub boot_images_manifest: BootImagesManifest,
    /// A MachineConfiguration `spec.template` fragment that selects the set.
    pub machine_configuration: PathBuf,
}

impl BuiltContainers {
    /// The image named `name`.
    pub fn image(&self, name: &str) -> Option<&BuiltImage> {
        self.images
            .iter()
            .chain(std::iter::once(&self.boot_images))
            .find(|i| i.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const LOCKISH: &str = "deb ipxe 1.0 {ipxe_deb} debian/bookworm\n\
        deb ipxe 1.21 {ipxe_new_deb} debian/trixie\n\
        deb ca-certificates 2025 {ca_deb} debian-security/bookworm-security\n\
        file ipxe/undionly.kpxe - {undionly} deb:ipxe@bookworm:/usr/lib/ipxe/undionly.kpxe\n\
        file ipxe/snponly.efi - {snponly} deb:ipxe@bookworm:/usr/lib/ipxe/snponly.efi\n\
        file ipxe/arm64/ipxe.efi - {arm64} deb:ipxe@trixie:/usr/lib/ipxe/ipxe-arm64.efi\n\
        file ca-certificates.crt - {ca} bundle:ca-certificates@bookworm-security:/usr/share/ca-certificates/mozilla\n";

    /// A recipe output of small files, as `build-contents.sh` writes it.
    fn contents(dir: &Path) -> Contents {
        let files: [(&str, &str, &[u8]); 4] = [
            ("ipxe/undionly.kpxe", "{undionly}", b"undionly"),
            ("ipxe/snponly.efi", "{snponly}", b"snponly"),
            ("ipxe/arm64/ipxe.efi", "{arm64}", b"arm64 ipxe"),
            (
                "ca-certificates.crt",
                "{ca}",
                b"-----BEGIN CERTIFICATE-----\n",
            ),
        ];
        let mut text = LOCKISH
            .replace("{ipxe_deb}", &"1".repeat(64))
            .replace("{ipxe_new_deb}", &"3".repeat(64))
            .replace("{ca_deb}", &"2".repeat(64));
        for (name, key, bytes) in files {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, bytes).unwrap();
            text = text.replace(key, &oci::sha256_hex(bytes));
        }
        fs::write(dir.join("contents.txt"), &text).unwrap();
        Contents::read(dir).unwrap()
    }

    fn binary(dir: &Path) -> RustBinary {
        let path = dir.join("unbounded-bootserver");
        fs::write(&path, b"\x7fELF bootserver").unwrap();
        let crates = vec![sbom::Crate {
            name: "unbounded-bootserver".into(),
            version: "0.1.0".into(),
            local: true,
            license: Some("Apache-2.0".into()),
        }];
        RustBinary {
            package: "unbounded-bootserver".into(),
            path,
            packages: sbom::rust_packages(
                "unbounded-bootserver",
                &crates,
                &Default::default(),
                "1.95.0",
                "2.36",
            ),
        }
    }

    fn inputs(dir: &Path) -> (RustBinary, Contents, BootSet) {
        let contents_dir = dir.join("contents");
        fs::create_dir_all(&contents_dir).unwrap();
        let set = BootSet {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            node: dir.join("node.tar.zst"),
            host_description: "kernel 6.1".into(),
            node_description: "kubelet v1.35.4".into(),
        };
        fs::write(&set.kernel, b"kernel").unwrap();
        fs::write(&set.initrd, vec![1u8; 50_000]).unwrap();
        fs::write(&set.node, vec![2u8; 80_000]).unwrap();
        (binary(dir), contents(&contents_dir), set)
    }

    /// The reproducibility test: the same small inputs, put in other places at other times,
    /// give the same images byte for byte (manifest digests, archives, SBOMs).
    #[test]
    fn the_same_inputs_give_the_same_images() {
        let dir = tempfile::tempdir().unwrap();
        let build = |name: &str| {
            let here = dir.path().join(name);
            fs::create_dir_all(&here).unwrap();
            let (binary, contents, set) = inputs(&here);
            let image = &PROJECT_IMAGES[1];
            let bootserver =
                project_image(image, &binary, &contents, "0.1.0", "1970-01-01T00:00:00Z").unwrap();
            let boot = boot_images_image(&binary, &set, "0.1.0", "1970-01-01T00:00:00Z").unwrap();
            let a = write(&bootserver, &here.join("out-bootserver")).unwrap();
            let b = write(&boot.assembled, &here.join("out-boot")).unwrap();
            (a, b, bootserver.sbom, boot.manifest)
        };
        let first = build("first");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = build("second");
        assert_eq!(
            first.0.manifest_digest, second.0.manifest_digest,
            "bootserver image"
        );
        assert_eq!(
            first.1.manifest_digest, second.1.manifest_digest,
            "boot images image"
        );
        assert_eq!(
            fs::read(&first.0.archive).unwrap(),
            fs::read(&second.0.archive).unwrap()
        );
        assert_eq!(
            fs::read(&first.1.archive).unwrap(),
            fs::read(&second.1.archive).unwrap()
        );
        assert_eq!(first.2, second.2, "SBOM");
        assert_eq!(first.3, second.3, "boot images manifest");

        // And a change of one input byte changes the digest.
        let changed = dir.path().join("changed");
        fs::create_dir_all(&changed).unwrap();
        let (binary, _, set) = inputs(&changed);
        fs::write(&set.node, vec![3u8; 80_000]).unwrap();
        let boot = boot_images_image(&binary, &set, "0.1.0", "1970-01-01T00:00:00Z").unwrap();
        assert_ne!(boot.manifest.version, first.3.version);
        let written = write(&boot.assembled, &changed.join("out")).unwrap();
        assert_ne!(written.manifest_digest, first.1.manifest_digest);
    }

    #[test]
    fn the_bootserver_image_serves_its_bundled_ipxe_builds() {
        let dir = tempfile::tempdir().unwrap();
        let (binary, contents, _) = inputs(dir.path());
        let assembled = project_image(
            &PROJECT_IMAGES[1],
            &binary,
            &contents,
            "0.1.0",
            "1970-01-01T00:00:00Z",
        )
        .unwrap();
        let paths: Vec<&str> = assembled.spec.layers[0]
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/usr/local/bin/unbounded-bootserver",
                CA_BUNDLE,
                "/usr/share/unbounded/ipxe/undionly.kpxe",
                "/usr/share/unbounded/ipxe/snponly.efi",
                "/usr/share/unbounded/ipxe/arm64/ipxe.efi",
                SBOM_PATH,
            ]
        );
        assert!(
            assembled
                .spec
                .env
                .contains(&format!("UNBOUNDED_BOOTSERVER_TFTP_ROOT={IPXE_DIR}"))
        );
        let doc: serde_json::Value = serde_json::from_slice(&assembled.sbom).unwrap();
        let file = doc["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["fileName"] == "./usr/share/unbounded/ipxe/snponly.efi")
            .unwrap();
        assert_eq!(
            file["checksums"][1]["checksumValue"],
            oci::sha256_hex(b"snponly")
        );
        // Each Debian package a file comes from, once per suite, with its pinned .deb digest
        // and a purl naming its release.
        let debs: Vec<(&str, &str, &str, &str)> = doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            // (the static C library is a Debian package too, but not a pinned download)
            .filter(|p| {
                p["checksums"].is_array()
                    && p["comment"].as_str().unwrap_or("").starts_with("Debian")
            })
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["versionInfo"].as_str().unwrap(),
                    p["checksums"][0]["checksumValue"].as_str().unwrap(),
                    p["externalRefs"][0]["referenceLocator"].as_str().unwrap(),
                )
            })
            .collect();
        let (one, two, three) = ("1".repeat(64), "2".repeat(64), "3".repeat(64));
        assert_eq!(
            debs,
            [
                (
                    "ca-certificates",
                    "2025",
                    two.as_str(),
                    "pkg:deb/debian/ca-certificates@2025?arch=all&distro=bookworm"
                ),
                (
                    "ipxe",
                    "1.0",
                    one.as_str(),
                    "pkg:deb/debian/ipxe@1.0?arch=all&distro=bookworm"
                ),
                (
                    "ipxe",
                    "1.21",
                    three.as_str(),
                    "pkg:deb/debian/ipxe@1.21?arch=all&distro=trixie"
                ),
            ]
        );
        let names: Vec<&str> = doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"unbounded-bootserver"), "{names:?}");

        // A file that differs from what the recipe recorded is refused.
        fs::write(contents.dir.join("ipxe/undionly.kpxe"), b"tampered").unwrap();
        let error =
            project_image(&PROJECT_IMAGES[1], &binary, &contents, "0.1.0", "x").unwrap_err();
        assert!(
            error.to_string().contains("undionly.kpxe: sha256"),
            "{error}"
        );
    }

    /// Every image `deploy/` runs is one `images --containers` builds, by the reference it
    /// names (a short name is Docker Hub's).
    #[test]
    fn deploy_runs_the_images_this_builds() {
        let version = crate::images::VERSION;
        let built: Vec<String> = PROJECT_IMAGES
            .iter()
            .map(|i| i.reference(version))
            .chain([format!("{REPOSITORY}/{BOOT_IMAGES_NAME}:{version}")])
            .collect();
        let mut named = Vec::new();
        for (file, text) in [
            (
                "controller",
                include_str!("../../../deploy/controller.yaml"),
            ),
            (
                "bootserver",
                include_str!("../../../deploy/bootserver.yaml"),
            ),
            ("azure", include_str!("../../../deploy/azure.yaml")),
        ] {
            for image in text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("image: "))
            {
                assert!(
                    built.contains(&format!("docker.io/{image}")),
                    "deploy/{file}.yaml runs {image}, which is not built: {built:?}"
                );
                named.push(image.split(':').next().unwrap_or(image).to_owned());
            }
        }
        named.sort();
        assert_eq!(
            named,
            [
                "unbounded/azure",
                "unbounded/boot-images",
                "unbounded/bootserver",
                "unbounded/controller"
            ]
        );
    }

    #[test]
    fn the_contents_format_is_strict() {
        assert!(parse_contents("# comment\n\nfile a - - -\n").is_ok());
        for bad in [
            "file a - -\n",
            "blob a - - -\n",
            "src a - - -\n",
            "file a - - - extra\n",
        ] {
            assert!(parse_contents(bad).is_err(), "{bad}");
        }
        let lock = include_str!("../../../images/containers/contents.lock");
        let lines = parse_contents(lock).unwrap();
        let files: Vec<&str> = lines
            .iter()
            .filter(|l| l.kind == "file")
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(
            files,
            [
                "ipxe/undionly.kpxe",
                "ipxe/ipxe.efi",
                "ipxe/snponly.efi",
                "ipxe/arm64/ipxe.efi",
                "ca-certificates.crt"
            ]
        );
    }
}
