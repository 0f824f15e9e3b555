//! OCI image layouts written without a container engine (no Docker daemon runs on these
//! machines): one gzip layer of files, an image config, a manifest and an index, as a
//! directory (`skopeo copy oci:<dir>:<tag> docker://…` pushes it) and as a tar of that
//! directory (`ctr images import <tar>` loads it).
//!
//! Layers are reproducible: entries sorted, owned by root, mtime 0, so the same inputs give
//! the same digests.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;

/// Errors while writing an image.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The image description is not valid.
    #[error("invalid image: {0}")]
    Invalid(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.into();
    move |source| OciError::Io { what, source }
}

/// One file of the image's single layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFile {
    /// Absolute path inside the image, such as `/usr/local/bin/unbounded-controller`.
    pub path: String,
    /// Where its content comes from.
    pub source: PathBuf,
    /// Unix mode bits, such as `0o755`.
    pub mode: u32,
}

/// What an image is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// Full reference, such as `ghcr.io/unbounded/controller:0.1.0`; its tag also names the
    /// image inside the layout.
    pub reference: String,
    /// The files of its one layer.
    pub files: Vec<LayerFile>,
    /// The entrypoint.
    pub entrypoint: Vec<String>,
    /// The user it runs as (`65532:65532` for a non-root user).
    pub user: String,
    /// Environment variables (`KEY=value`).
    pub env: Vec<String>,
}

/// Where an image was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenImage {
    /// The OCI layout directory.
    pub layout: PathBuf,
    /// A tar of the layout, for `ctr images import`.
    pub archive: PathBuf,
    /// The manifest's digest (`sha256:…`).
    pub manifest_digest: String,
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The tag of a reference (`…:tag`), `latest` when it has none.
pub fn tag_of(reference: &str) -> &str {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    last.split_once(':').map_or("latest", |(_, tag)| tag)
}

/// The parent directories a layer must list before its files, in order.
fn parent_directories(files: &[LayerFile]) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for file in files {
        let mut path = Path::new(file.path.trim_start_matches('/'));
        while let Some(parent) = path.parent() {
            if parent.as_os_str().is_empty() {
                break;
            }
            dirs.insert(parent.display().to_string());
            path = parent;
        }
    }
    dirs.into_iter().collect()
}

/// Validates paths: absolute, no `..`, no duplicates.
fn check_files(files: &[LayerFile]) -> Result<(), OciError> {
    let mut seen = BTreeSet::new();
    for file in files {
        let relative = file.path.trim_start_matches('/');
        if !file.path.starts_with('/')
            || relative.is_empty()
            || relative
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(OciError::Invalid(format!(
                "layer path {:?} must be absolute and normal",
                file.path
            )));
        }
        if !seen.insert(relative) {
            return Err(OciError::Invalid(format!(
                "layer path {:?} appears twice",
                file.path
            )));
        }
    }
    Ok(())
}

/// The uncompressed layer tar.
fn layer_tar(files: &[LayerFile]) -> Result<Vec<u8>, OciError> {
    check_files(files)?;
    let mut builder = tar::Builder::new(Vec::new());
    for dir in parent_directories(files) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder
            .append_data(&mut header, format!("{dir}/"), std::io::empty())
            .map_err(io(format!("adding directory {dir}")))?;
    }
    let mut sorted: Vec<&LayerFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for file in sorted {
        let content =
            fs::read(&file.source).map_err(io(format!("reading {}", file.source.display())))?;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(file.mode);
        header.set_size(content.len() as u64);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder
            .append_data(&mut header, file.path.trim_start_matches('/'), &content[..])
            .map_err(io(format!("adding {}", file.path)))?;
    }
    builder.into_inner().map_err(io("finishing the layer"))
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, OciError> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).map_err(io("compressing"))?;
    encoder.finish().map_err(io("compressing"))
}

/// Writes a blob and returns its descriptor fields (digest, size).
fn put_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, usize), OciError> {
    let hex = sha256_hex(bytes);
    fs::write(blobs.join(&hex), bytes).map_err(io("writing a blob"))?;
    Ok((format!("sha256:{hex}"), bytes.len()))
}

/// Writes `spec` as an OCI layout in `out_dir/layout` and a tar of it in
/// `out_dir/image.tar`. The directory is replaced.
pub fn write_image(spec: &ImageSpec, out_dir: &Path) -> Result<WrittenImage, OciError> {
    if spec.entrypoint.is_empty() {
        return Err(OciError::Invalid("an entrypoint is required".into()));
    }
    let layout = out_dir.join("layout");
    if layout.exists() {
        fs::remove_dir_all(&layout).map_err(io("clearing the old layout"))?;
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io("creating the layout"))?;

    let tar = layer_tar(&spec.files)?;
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    let (layer_digest, layer_size) = put_blob(&blobs, &gzip(&tar)?)?;

    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": spec.entrypoint,
            "User": spec.user,
            "Env": spec.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "unbounded-testbed images (one layer of static files)"}],
    });
    let config_bytes = serde_json::to_vec(&config).map_err(|e| OciError::Invalid(e.to_string()))?;
    let (config_digest, config_size) = put_blob(&blobs, &config_bytes)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest,
            "size": layer_size,
        }],
    });
    let manifest_bytes =
        serde_json::to_vec(&manifest).map_err(|e| OciError::Invalid(e.to_string()))?;
    let (manifest_digest, manifest_size) = put_blob(&blobs, &manifest_bytes)?;

    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                // skopeo and the OCI spec name an image in a layout by its tag; containerd's
                // import takes the full name from its own annotation.
                "org.opencontainers.image.ref.name": tag_of(&spec.reference),
                "io.containerd.image.name": spec.reference,
            },
        }],
    });
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).map_err(|e| OciError::Invalid(e.to_string()))?,
    )
    .map_err(io("writing index.json"))?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .map_err(io("writing oci-layout"))?;

    let archive = out_dir.join("image.tar");
    let file = fs::File::create(&archive).map_err(io("creating the archive"))?;
    let mut builder = tar::Builder::new(file);
    builder.mode(tar::HeaderMode::Deterministic);
    builder
        .append_dir_all(".", &layout)
        .map_err(io("archiving the layout"))?;
    builder.finish().map_err(io("archiving the layout"))?;
    Ok(WrittenImage {
        layout,
        archive,
        manifest_digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> LayerFile {
        LayerFile {
            path: path.into(),
            source: PathBuf::from("/dev/null"),
            mode: 0o644,
        }
    }

    #[test]
    fn tags_of_references() {
        let cases = [
            ("registry.k8s.io/pause:3.10.1", "3.10.1"),
            ("localhost:5000/unbounded/controller:0.1.0", "0.1.0"),
            ("localhost:5000/unbounded/controller", "latest"),
            ("controller", "latest"),
        ];
        for (reference, tag) in cases {
            assert_eq!(tag_of(reference), tag, "{reference}");
        }
    }

    #[test]
    fn parents_are_listed_once_in_order() {
        let dirs = parent_directories(&[file("/usr/local/bin/a"), file("/usr/share/b")]);
        assert_eq!(
            dirs,
            ["usr", "usr/local", "usr/local/bin", "usr/share"].map(String::from)
        );
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["relative", "/a/../b", "/", "/a//b"] {
            assert!(check_files(&[file(bad)]).is_err(), "{bad}");
        }
        assert!(check_files(&[file("/a"), file("/a")]).is_err());
    }

    #[test]
    fn layers_are_reproducible() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::write(&bin, b"\x7fELF...").unwrap();
        let spec = ImageSpec {
            reference: "example.invalid/x:1".into(),
            files: vec![LayerFile {
                path: "/usr/local/bin/x".into(),
                source: bin,
                mode: 0o755,
            }],
            entrypoint: vec!["/usr/local/bin/x".into()],
            user: "65532:65532".into(),
            env: vec![],
        };
        let a = write_image(&spec, &dir.path().join("a")).unwrap();
        let b = write_image(&spec, &dir.path().join("b")).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(a.layout.join("index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"][0]["digest"], a.manifest_digest.as_str());
    }
}
