#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The container images as `unbounded-testbed images --containers` built them (the test
//! command builds them first; `images::cached_containers` finds them): each unpacked into a
//! directory without a container runtime, its entrypoint run there (`chroot`), its files
//! all in its SBOM with their digests, the bootserver's iPXE builds present with the
//! digests `images/containers/contents.lock` pins, the boot images installed by the
//! installer inside their own image (and a tampered set refused), and each layout written
//! again from its own contents with the same digest.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use unbounded_api::boot_images::{BootImageRole, BootImagesManifest, MANIFEST_FILE};
use unbounded_testbed::containers::{
    self, BOOT_IMAGES_DIR, BuiltImage, INSTALLED_IMAGES_DIR, IPXE_DIR, SBOM_PATH,
};
use unbounded_testbed::images;
use unbounded_testbed::oci::{self, ImageSpec, Layer, LayerCompression, LayerFile};

fn sha256(path: &Path) -> String {
    images::file_sha256(path).unwrap()
}

/// Unpacks an image (by its first reference's tag) into a new directory.
fn unpack(image: &BuiltImage) -> (tempfile::TempDir, serde_json::Value) {
    let root = tempfile::tempdir().unwrap();
    let tag = oci::tag_of(&image.references[0]);
    let config = oci::unpack(&image.layout, tag, root.path()).unwrap();
    (root, config)
}

/// Every regular file under `root`, by its absolute path in the image.
fn files(root: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, PathBuf>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let relative = path.strip_prefix(base).unwrap().display().to_string();
                out.insert(format!("/{relative}"), path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The SBOM's files: path → SHA-256.
fn sbom_files(sbom: &serde_json::Value) -> BTreeMap<String, String> {
    sbom["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let sha = f["checksums"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["algorithm"] == "SHA256")
                .unwrap()["checksumValue"]
                .as_str()
                .unwrap()
                .to_owned();
            (
                f["fileName"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches('.')
                    .to_owned(),
                sha,
            )
        })
        .collect()
}

fn chroot(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(root)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn each_image_runs_its_entrypoint_and_lists_every_file_in_its_sbom() {
    let built = images::cached_containers().unwrap();
    let names: Vec<&str> = built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(names, ["controller", "bootserver", "azure", "boot-images"]);
    for image in built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
    {
        let (root, config) = unpack(image);
        let entrypoint = config["config"]["Entrypoint"][0].as_str().unwrap();
        let output = chroot(root.path(), &[entrypoint, "--version"]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains(&built.version),
            "{}: {entrypoint} --version: {:?} {stdout} {}",
            image.name,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );

        let inside = fs::read(root.path().join(SBOM_PATH.trim_start_matches('/'))).unwrap();
        assert_eq!(
            inside,
            fs::read(&image.sbom).unwrap(),
            "{}: the SBOM beside the layout",
            image.name
        );
        let sbom: serde_json::Value = serde_json::from_slice(&inside).unwrap();
        assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
        let listed = sbom_files(&sbom);
        let present = files(root.path());
        for (path, file) in &present {
            if path == SBOM_PATH {
                continue;
            }
            assert_eq!(
                listed.get(path),
                Some(&sha256(file)),
                "{}: {path} in the SBOM with its sha256",
                image.name
            );
        }
        assert_eq!(
            listed.len(),
            present.len() - 1,
            "{}: nothing listed that is not there",
            image.name
        );
        // The binary's crates, with Cargo.lock's versions.
        let packages: Vec<(&str, &str)> = sbom["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["versionInfo"].as_str().unwrap(),
                )
            })
            .collect();
        let lock =
            fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).unwrap();
        let tokio_version = lock
            .split("[[package]]")
            .find(|block| block.contains("\nname = \"tokio\"\n"))
            .and_then(|block| block.lines().find_map(|l| l.strip_prefix("version = ")))
            .unwrap()
            .trim_matches('"');
        assert!(
            packages.contains(&("tokio", tokio_version)),
            "{}: tokio {tokio_version} in {packages:?}",
            image.name
        );
    }
}

#[test]
fn the_bootserver_image_carries_the_pinned_ipxe_builds_as_its_tftp_root() {
    let built = images::cached_containers().unwrap();
    let image = built.image("bootserver").unwrap();
    let (root, config) = unpack(image);
    let env: Vec<&str> = config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        env.contains(&format!("UNBOUNDED_BOOTSERVER_TFTP_ROOT={IPXE_DIR}").as_str()),
        "{env:?}"
    );
    assert_eq!(config["config"]["User"], "0:0");

    let lock =
        containers::parse_contents(include_str!("../../images/containers/contents.lock")).unwrap();
    let sbom: serde_json::Value = serde_json::from_slice(&fs::read(&image.sbom).unwrap()).unwrap();
    let listed = sbom_files(&sbom);
    let mut seen = Vec::new();
    for line in lock
        .iter()
        .filter(|l| l.kind == "file" && l.name.starts_with("ipxe/"))
    {
        let path = format!("{IPXE_DIR}/{}", line.name.trim_start_matches("ipxe/"));
        let digest = sha256(&root.path().join(path.trim_start_matches('/')));
        assert_eq!(Some(digest.as_str()), line.sha256.as_deref(), "{path}");
        assert_eq!(listed.get(&path), Some(&digest), "{path} in the SBOM");
        seen.push(line.name.trim_start_matches("ipxe/").to_owned());
    }
    // The builds DHCP names for BIOS, x86-64 UEFI (either choice of uefiBootFile) and arm64
    // UEFI, where the bootserver looks for them.
    assert_eq!(
        seen,
        ["undionly.kpxe", "ipxe.efi", "snponly.efi", "arm64/ipxe.efi"]
    );
    // And the Debian packages they come from, each with the pinned .deb digest.
    for ipxe in lock.iter().filter(|l| l.kind == "deb" && l.name == "ipxe") {
        assert!(
            sbom["packages"].as_array().unwrap().iter().any(|p| {
                p["name"] == "ipxe"
                    && p["versionInfo"] == ipxe.version.as_deref().unwrap()
                    && p["checksums"][0]["checksumValue"] == ipxe.sha256.as_deref().unwrap()
            }),
            "{ipxe:?} in the SBOM"
        );
    }
}

#[test]
fn the_boot_images_install_from_their_own_image_and_a_tampered_set_is_refused() {
    let built = images::cached_containers().unwrap();
    let (root, config) = unpack(&built.boot_images);
    let entrypoint: Vec<String> = config["config"]["Entrypoint"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        entrypoint[1..],
        [
            "install-images",
            "--from",
            BOOT_IMAGES_DIR,
            "--to",
            INSTALLED_IMAGES_DIR
        ]
    );
    let manifest = BootImagesManifest::parse(
        &fs::read(root.path().join("boot-images").join(MANIFEST_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest, built.boot_images_manifest);
    assert_eq!(
        built.boot_images.references[0],
        format!(
            "{}/boot-images:{}",
            containers::REPOSITORY,
            manifest.version
        )
    );

    // What a MachineConfiguration names is what the set holds: the host and node images
    // `images` built in the same run, the node image by the digest the testbed's
    // configurations use.
    let values = manifest.configuration_values().unwrap();
    let current = images::cached().unwrap();
    let stale = "the boot images are not those of the last `images` run: run `images --containers`";
    assert_eq!(values.image_sha256, current.node.sha256, "{stale}");
    assert_eq!(
        manifest.file(BootImageRole::Kernel).unwrap().sha256,
        sha256(&current.host.kernel),
        "{stale}"
    );
    assert_eq!(
        manifest.file(BootImageRole::Initrd).unwrap().sha256,
        sha256(&current.host.initrd),
        "{stale}"
    );
    let snippet = fs::read_to_string(&built.machine_configuration).unwrap();
    assert!(snippet.contains(&values.template_yaml()), "{snippet}");

    let args: Vec<&str> = entrypoint.iter().map(String::as_str).collect();
    let first = chroot(root.path(), &args);
    assert!(first.status.success(), "{first:?}");
    assert!(
        String::from_utf8_lossy(&first.stdout)
            .contains(&format!("installed boot images {}", manifest.version))
    );
    let installed = root
        .path()
        .join(INSTALLED_IMAGES_DIR.trim_start_matches('/'))
        .join(&manifest.version);
    for file in &manifest.files {
        assert_eq!(
            sha256(&installed.join(&file.name)),
            file.sha256,
            "{}",
            file.name
        );
    }
    let again = chroot(root.path(), &args);
    assert!(
        again.status.success()
            && String::from_utf8_lossy(&again.stdout).contains("already installed"),
        "{again:?}"
    );

    // The same set with one byte of its node image changed.
    let tampered = root.path().join("tampered");
    fs::create_dir(&tampered).unwrap();
    for entry in fs::read_dir(root.path().join("boot-images")).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, tampered.join(path.file_name().unwrap())).unwrap();
    }
    let node = tampered.join("node.tar.zst");
    let mut bytes = fs::read(&node).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&node, bytes).unwrap();
    let refused = chroot(
        root.path(),
        &[
            args[0],
            "install-images",
            "--from",
            "/tampered",
            "--to",
            "/elsewhere",
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        stderr.contains(&format!(
            "refusing to install boot images {}",
            manifest.version
        )) && stderr.contains("node.tar.zst has sha256"),
        "{stderr}"
    );
    assert!(
        !root
            .path()
            .join("elsewhere")
            .join(&manifest.version)
            .exists(),
        "nothing installed"
    );
}

/// A layout written again from its own unpacked files, modes and config has the same
/// manifest digest: the writer is a function of the contents (the cheap unit test of
/// `containers` does the same from the inputs).
#[test]
fn each_layout_is_reproduced_from_its_own_contents() {
    let built = images::cached_containers().unwrap();
    for image in &built.images {
        let tag = oci::tag_of(&image.references[0]);
        let root = tempfile::tempdir().unwrap();
        let config = oci::unpack(&image.layout, tag, root.path()).unwrap();
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(image.layout.join("index.json")).unwrap()).unwrap();
        let blob = |digest: &str| {
            image
                .layout
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"))
        };
        let manifest: serde_json::Value = serde_json::from_slice(
            &fs::read(blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let mut layers = Vec::new();
        for (i, layer) in manifest["layers"].as_array().unwrap().iter().enumerate() {
            let file = fs::File::open(blob(layer["digest"].as_str().unwrap())).unwrap();
            let gzip = layer["mediaType"].as_str().unwrap().ends_with("+gzip");
            let reader: Box<dyn std::io::Read> = if gzip {
                Box::new(flate2::read::GzDecoder::new(file))
            } else {
                Box::new(file)
            };
            let mut files = Vec::new();
            for entry in tar::Archive::new(reader).entries().unwrap() {
                let entry = entry.unwrap();
                if entry.header().entry_type().is_file() {
                    let path = entry.path().unwrap().display().to_string();
                    files.push(LayerFile::copy(
                        format!("/{path}"),
                        root.path().join(&path),
                        entry.header().mode().unwrap(),
                    ));
                }
            }
            layers.push(Layer {
                files,
                compression: if gzip {
                    LayerCompression::Gzip
                } else {
                    LayerCompression::None
                },
                comment: config["history"][i]["created_by"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("unbounded-testbed images: ")
                    .to_owned(),
            });
        }
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap().to_owned())
                .collect()
        };
        let spec = ImageSpec {
            references: image.references.clone(),
            layers,
            entrypoint: strings(&config["config"]["Entrypoint"]),
            user: config["config"]["User"].as_str().unwrap().to_owned(),
            env: strings(&config["config"]["Env"]),
            labels: config["config"]["Labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect(),
        };
        let out = tempfile::tempdir().unwrap();
        let written = oci::write_image(&spec, out.path()).unwrap();
        assert_eq!(
            written.manifest_digest, image.manifest_digest,
            "{}",
            image.name
        );
    }
}
