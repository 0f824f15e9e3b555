//! OCI image layouts written without a container engine (no Docker daemon runs on these
//! machines): layers of files (gzip, or plain for contents that are compressed already),
//! an image config, a manifest and an index, as a directory (`skopeo copy oci:<dir>:<tag>
//! docker://…` pushes it) and as a tar of that directory (`ctr images import <tar>` loads
//! it).
//!
//! Reproducible: entries sorted, owned by root, mtime 0, no creation time in the config, the
//! gzip header without a time or name, the layout's tar sorted with fixed metadata; the same
//! inputs give the same bytes, so the same digests. Files are streamed (the boot images
//! are hundreds of MB).

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
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
    /// A JSON document of the image could not be written or read.
    #[error("invalid image: {0}")]
    Json(#[source] serde_json::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.into();
    move |source| OciError::Io { what, source }
}

/// Where a file's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// A file on this machine (streamed).
    Path(PathBuf),
    /// Bytes written by the builder (an SBOM, a manifest).
    Bytes(Vec<u8>),
}

/// One file of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFile {
    /// Absolute path inside the image, such as `/usr/local/bin/unbounded-controller`.
    pub path: String,
    /// Where its content comes from.
    pub source: FileSource,
    /// Unix mode bits, such as `0o755`.
    pub mode: u32,
}

impl LayerFile {
    /// A file copied from this machine.
    pub fn copy(path: impl Into<String>, source: impl Into<PathBuf>, mode: u32) -> Self {
        Self {
            path: path.into(),
            source: FileSource::Path(source.into()),
            mode,
        }
    }

    /// A file with the given bytes.
    pub fn bytes(path: impl Into<String>, bytes: Vec<u8>, mode: u32) -> Self {
        Self {
            path: path.into(),
            source: FileSource::Bytes(bytes),
            mode,
        }
    }
}

/// How a layer is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCompression {
    /// `tar+gzip` (binaries, text).
    Gzip,
    /// Plain `tar`: for contents compressed already (zstd initrds and node images), where
    /// gzip would cost minutes of CPU and save nothing.
    None,
}

/// One layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its files.
    pub files: Vec<LayerFile>,
    /// How it is stored.
    pub compression: LayerCompression,
    /// What it holds, for the config's history.
    pub comment: String,
}

/// What an image is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// Full references, such as `docker.io/unbounded/controller:0.1.0`; each tag names the
    /// image inside the layout (one manifest, several names). At least one.
    pub references: Vec<String>,
    /// Its layers, bottom first.
    pub layers: Vec<Layer>,
    /// The entrypoint.
    pub entrypoint: Vec<String>,
    /// The user it runs as (`65532:65532` for a non-root user).
    pub user: String,
    /// Environment variables (`KEY=value`).
    pub env: Vec<String>,
    /// Labels of the image config (`org.opencontainers.image.*`).
    pub labels: Vec<(String, String)>,
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
    /// The layers' digests as stored (`sha256:…`), bottom first.
    pub layer_digests: Vec<String>,
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

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    context: ring::digest::Context,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            context: ring::digest::Context::new(&ring::digest::SHA256),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (
            self.inner,
            format!("sha256:{}", hex(self.context.finish().as_ref())),
            self.bytes,
        )
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.context.update(buf.get(..n).unwrap_or_default());
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Writes the layer's tar into `out`: parent directories first, then the files by path.
fn write_layer_tar<W: Write>(files: &[LayerFile], out: W) -> Result<W, OciError> {
    check_files(files)?;
    let mut builder = tar::Builder::new(out);
    for dir in parent_directories(files) {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        builder
            .append_data(&mut h, format!("{dir}/"), std::io::empty())
            .map_err(io(format!("adding directory {dir}")))?;
    }
    let mut sorted: Vec<&LayerFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for file in sorted {
        let name = file.path.trim_start_matches('/');
        match &file.source {
            FileSource::Bytes(bytes) => {
                let mut h = header(tar::EntryType::Regular, file.mode, bytes.len() as u64);
                builder
                    .append_data(&mut h, name, &bytes[..])
                    .map_err(io(format!("adding {}", file.path)))?;
            }
            FileSource::Path(source) => {
                let reader =
                    fs::File::open(source).map_err(io(format!("reading {}", source.display())))?;
                let size = reader
                    .metadata()
                    .map_err(io(format!("reading {}", source.display())))?
                    .len();
                let mut h = header(tar::EntryType::Regular, file.mode, size);
                // A file that grows while it is copied must not make the entry lie.
                builder
                    .append_data(&mut h, name, reader.take(size))
                    .map_err(io(format!("adding {}", file.path)))?;
            }
        }
    }
    builder.into_inner().map_err(io("finishing a layer"))
}

/// Writes a layer as a blob; returns (blob digest, blob size, diff ID).
fn put_layer(blobs: &Path, layer: &Layer) -> Result<(String, u64, String), OciError> {
    let partial = blobs.join(".layer.partial");
    let file = fs::File::create(&partial).map_err(io("creating a layer"))?;
    let stored = Hashing::new(std::io::BufWriter::new(file));
    let (stored, diff_id) = match layer.compression {
        LayerCompression::Gzip => {
            // flate2's default header has no time and no name: reproducible.
            let encoder = GzEncoder::new(stored, Compression::default());
            let tar = write_layer_tar(&layer.files, Hashing::new(encoder))?;
            let (encoder, diff_id, _) = tar.finish();
            (
                encoder.finish().map_err(io("compressing a layer"))?,
                diff_id,
            )
        }
        LayerCompression::None => {
            let tar = write_layer_tar(&layer.files, Hashing::new(stored))?;
            let (stored, diff_id, _) = tar.finish();
            (stored, diff_id)
        }
    };
    let (buffered, digest, size) = stored.finish();
    let file = buffered.into_inner().map_err(|e| OciError::Io {
        what: "writing a layer".into(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io("writing a layer"))?;
    let hex = digest.trim_start_matches("sha256:");
    fs::rename(&partial, blobs.join(hex)).map_err(io("storing a layer"))?;
    Ok((digest, size, diff_id))
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
    if spec.references.is_empty() {
        return Err(OciError::Invalid("a reference is required".into()));
    }
    let layout = out_dir.join("layout");
    if layout.exists() {
        fs::remove_dir_all(&layout).map_err(io("clearing the old layout"))?;
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io("creating the layout"))?;

    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    let mut history = Vec::new();
    let mut layer_digests = Vec::new();
    for layer in &spec.layers {
        let (digest, size, diff_id) = put_layer(&blobs, layer)?;
        let media_type = match layer.compression {
            LayerCompression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            LayerCompression::None => "application/vnd.oci.image.layer.v1.tar",
        };
        descriptors.push(json!({"mediaType": media_type, "digest": digest, "size": size}));
        diff_ids.push(diff_id);
        history.push(json!({"created_by": format!("unbounded-testbed images: {}", layer.comment)}));
        layer_digests.push(digest);
    }

    let labels: serde_json::Map<String, serde_json::Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": spec.entrypoint,
            "User": spec.user,
            "Env": spec.env,
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    });
    let config_bytes = serde_json::to_vec(&config).map_err(OciError::Json)?;
    let (config_digest, config_size) = put_blob(&blobs, &config_bytes)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": descriptors,
    });
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(OciError::Json)?;
    let (manifest_digest, manifest_size) = put_blob(&blobs, &manifest_bytes)?;

    let manifests: Vec<serde_json::Value> = spec
        .references
        .iter()
        .map(|reference| {
            json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    // skopeo and the OCI spec name an image in a layout by its tag;
                    // containerd's import takes the full name from its own annotation.
                    "org.opencontainers.image.ref.name": tag_of(reference),
                    "io.containerd.image.name": reference,
                },
            })
        })
        .collect();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    });
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).map_err(OciError::Json)?,
    )
    .map_err(io("writing index.json"))?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .map_err(io("writing oci-layout"))?;

    let archive = out_dir.join("image.tar");
    archive_layout(&layout, &archive)?;
    Ok(WrittenImage {
        layout,
        archive,
        manifest_digest,
        layer_digests,
    })
}

/// A tar of the layout with its entries sorted and fixed metadata (the same layout gives
/// the same archive on any machine).
fn archive_layout(layout: &Path, archive: &Path) -> Result<(), OciError> {
    let mut entries = Vec::new();
    collect_entries(layout, layout, &mut entries)?;
    entries.sort();
    let file = fs::File::create(archive).map_err(io("creating the archive"))?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
    for (relative, path, is_dir) in entries {
        if is_dir {
            let mut h = header(tar::EntryType::Directory, 0o755, 0);
            builder
                .append_data(&mut h, format!("{relative}/"), std::io::empty())
                .map_err(io("archiving the layout"))?;
        } else {
            let reader = fs::File::open(&path).map_err(io("archiving the layout"))?;
            let size = reader.metadata().map_err(io("archiving the layout"))?.len();
            let mut h = header(tar::EntryType::Regular, 0o644, size);
            builder
                .append_data(&mut h, &relative, reader.take(size))
                .map_err(io("archiving the layout"))?;
        }
    }
    let writer = builder.into_inner().map_err(io("archiving the layout"))?;
    let file = writer.into_inner().map_err(|e| OciError::Io {
        what: "archiving the layout".into(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io("archiving the layout"))
}

fn collect_entries(
    base: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf, bool)>,
) -> Result<(), OciError> {
    for entry in fs::read_dir(dir).map_err(io("reading the layout"))? {
        let path = entry.map_err(io("reading the layout"))?.path();
        let relative = path
            .strip_prefix(base)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if path.is_dir() {
            out.push((relative, path.clone(), true));
            collect_entries(base, &path, out)?;
        } else {
            out.push((relative, path, false));
        }
    }
    Ok(())
}

/// Reads a layout back: the manifest of `tag`, its config and its layers' files as
/// unpacked into `into` (regular files and directories only; any other entry, or a path
/// that leaves `into`, is an error). For tests and checks of built images.
pub fn unpack(layout: &Path, tag: &str, into: &Path) -> Result<serde_json::Value, OciError> {
    let read_json = |path: PathBuf| -> Result<serde_json::Value, OciError> {
        let bytes = fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        serde_json::from_slice(&bytes).map_err(OciError::Json)
    };
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index = read_json(layout.join("index.json"))?;
    let entry = index["manifests"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag)
        })
        .ok_or_else(|| OciError::Invalid(format!("no image tagged {tag} in the layout")))?;
    let manifest = read_json(blob(entry["digest"].as_str().unwrap_or_default()))?;
    let config = read_json(blob(
        manifest["config"]["digest"].as_str().unwrap_or_default(),
    ))?;
    fs::create_dir_all(into).map_err(io("creating the root"))?;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let path = blob(layer["digest"].as_str().unwrap_or_default());
        let file = fs::File::open(&path).map_err(io(format!("reading {}", path.display())))?;
        let reader: Box<dyn Read> = if layer["mediaType"]
            .as_str()
            .is_some_and(|m| m.ends_with("+gzip"))
        {
            Box::new(flate2::read::GzDecoder::new(file))
        } else {
            Box::new(file)
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(io("reading a layer"))? {
            let mut entry = entry.map_err(io("reading a layer"))?;
            let kind = entry.header().entry_type();
            if !(kind.is_file() || kind.is_dir()) {
                return Err(OciError::Invalid(format!(
                    "a layer holds a {kind:?} entry; only files and directories are expected"
                )));
            }
            if !entry.unpack_in(into).map_err(io("unpacking a layer"))? {
                return Err(OciError::Invalid("a layer entry leaves the root".into()));
            }
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> LayerFile {
        LayerFile::bytes(path, Vec::new(), 0o644)
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

    fn spec(dir: &Path) -> ImageSpec {
        let bin = dir.join("bin");
        fs::write(&bin, b"\x7fELF...").unwrap();
        ImageSpec {
            references: vec!["example.invalid/x:1".into(), "example.invalid/x:v1".into()],
            layers: vec![
                Layer {
                    files: vec![
                        LayerFile::copy("/usr/local/bin/x", bin, 0o755),
                        LayerFile::bytes("/etc/x.json", b"{}".to_vec(), 0o644),
                    ],
                    compression: LayerCompression::Gzip,
                    comment: "the binary".into(),
                },
                Layer {
                    files: vec![LayerFile::bytes("/data/blob", vec![7; 100_000], 0o644)],
                    compression: LayerCompression::None,
                    comment: "data".into(),
                },
            ],
            entrypoint: vec!["/usr/local/bin/x".into()],
            user: "65532:65532".into(),
            env: vec![],
            labels: vec![("org.opencontainers.image.version".into(), "1".into())],
        }
    }

    #[test]
    fn images_are_reproducible_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_image(
            &spec(&dir.path().join("in-a").tap_mkdir()),
            &dir.path().join("a"),
        )
        .unwrap();
        // Other source files (other mtimes, other paths) with the same contents.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = write_image(
            &spec(&dir.path().join("in-b").tap_mkdir()),
            &dir.path().join("b"),
        )
        .unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(fs::read(&a.archive).unwrap(), fs::read(&b.archive).unwrap());
        assert_eq!(a.layer_digests.len(), 2);

        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(a.layout.join("index.json")).unwrap()).unwrap();
        let tags: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["digest"], a.manifest_digest.as_str());
                m["annotations"]["org.opencontainers.image.ref.name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(tags, ["1", "v1"]);

        let root = dir.path().join("root");
        let config = unpack(&a.layout, "v1", &root).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/x");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            "1"
        );
        assert_eq!(
            fs::read(root.join("usr/local/bin/x")).unwrap(),
            b"\x7fELF..."
        );
        assert_eq!(fs::read(root.join("data/blob")).unwrap(), vec![7; 100_000]);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(root.join("usr/local/bin/x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // The plain layer's blob is the tar itself: its digest is its diff ID.
        let layers = config["rootfs"]["diff_ids"].as_array().unwrap();
        assert_eq!(layers[1], a.layer_digests[1].as_str());
        assert_ne!(layers[0], a.layer_digests[0].as_str());
    }

    trait TapMkdir {
        fn tap_mkdir(self) -> Self;
    }

    impl TapMkdir for PathBuf {
        fn tap_mkdir(self) -> Self {
            fs::create_dir_all(&self).unwrap();
            self
        }
    }
}
