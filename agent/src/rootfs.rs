//! The node container's root file system: the node image fetched over HTTP, verified
//! (SHA-256) and only then unpacked into a staging directory, moved into place by the
//! caller; files written into it without following symlinks out of it.
//!
//! **Verify, then write.** The archive is downloaded into an unnamed file (`O_TMPFILE`) in
//! the directory that holds the container roots (the same file system: on a
//! network-booted host that is RAM, so the archive costs its size until it is unpacked,
//! and an agent that dies mid-download leaves nothing behind). Its SHA-256 is computed
//! while it is written; only when it matches the configuration's `image.sha256` is the
//! staging directory created and the archive unpacked from that file, with owners, modes
//! and xattrs. Nothing from an unverified archive ever lands in the staging directory: a
//! wrong digest, a truncated download or an oversized one leaves no staging directory,
//! and the previous container, if any, is untouched (it is removed only after a new root
//! is ready). The image may come over plain HTTP: the digest, not the transport, is what
//! makes it trusted.
//!
//! **Bounded.** A download larger than the configuration's `image.maxSizeBytes` (default
//! [`DEFAULT_MAX_IMAGE_BYTES`], 4 GiB) is refused: before its body is read when the server
//! announces its length, else as soon as the bytes received pass the limit.
//!
//! Writing, hashing and unpacking are blocking work and run on tokio's blocking pool, off
//! the agent's two async worker threads.

use std::fs;
use std::io::{Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

/// The largest node image downloaded when the configuration names no `maxSizeBytes`:
/// 4 GiB (the node image the testbed builds is about 100 MB compressed).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 4 << 30;

/// Errors of the root file system work.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// The image could not be downloaded.
    #[error("downloading the node image from {url}: {source}")]
    Download {
        /// Where from (no credentials are ever in it).
        url: String,
        /// Why.
        #[source]
        source: DownloadFailure,
    },
    /// The image is larger than allowed.
    #[error(
        "the node image from {url} is larger than the limit of {limit} bytes ({seen}); nothing was unpacked. If the image is meant to be this large, raise the configuration's image.maxSizeBytes"
    )]
    TooLarge {
        /// Where from.
        url: String,
        /// The limit.
        limit: u64,
        /// What showed it: the announced length or the bytes received.
        seen: String,
    },
    /// The digest does not match the configuration's `image.sha256`.
    #[error(
        "the node image from {url} has SHA-256 {actual}, but the configuration expects {expected}; nothing was unpacked"
    )]
    Checksum {
        /// Where from.
        url: String,
        /// What the configuration says.
        expected: String,
        /// What was downloaded.
        actual: String,
    },
    /// The archive is not a zstd-compressed tar (or it is truncated).
    #[error("unpacking the node image from {url}: {source}")]
    Unpack {
        /// Where from.
        url: String,
        /// Why.
        #[source]
        source: UnpackFailure,
    },
    /// A file could not be written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Which path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A path from the configuration is not acceptable.
    #[error("file {0:?} from the configuration: {1}")]
    BadPath(String, &'static str),
    /// A file's mode from the configuration is not octal permission bits.
    #[error(transparent)]
    Mode(#[from] BadMode),
}

/// Why the node image could not be downloaded.
#[derive(Debug, thiserror::Error)]
pub enum DownloadFailure {
    /// The request or its body failed (the client's error, its URL left out).
    #[error(transparent)]
    Http(reqwest::Error),
    /// The server answered with an error status.
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
}

/// Why the node image could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackFailure {
    /// The archive is not a zstd-compressed tar, or it is truncated.
    #[error(transparent)]
    Archive(std::io::Error),
    /// The blocking task that unpacks did not finish (it panicked).
    #[error("the blocking task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// The blocking task that writes the download did not finish (it panicked).
    #[error("the download writer failed: {0}")]
    Writer(#[source] tokio::task::JoinError),
}

/// A file's mode from the configuration that is not octal permission bits (`0644`, `600`).
/// Its own type so that [`crate::apply_files`]' comparable errors can keep it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("file {0:?} from the configuration: mode must be octal permission bits")]
pub struct BadMode(String);

impl RootfsError {
    /// A short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Download { .. } => "ImageDownloadFailed",
            Self::TooLarge { .. } => "ImageTooLarge",
            Self::Checksum { .. } => "ImageChecksumMismatch",
            Self::Unpack { .. } => "ImageUnpackFailed",
            Self::Io { .. } => "FilesystemError",
            Self::BadPath(..) | Self::Mode(_) => "InvalidFile",
        }
    }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RootfsError {
    let path = path.display().to_string();
    move |source| RootfsError::Io { what, path, source }
}

/// The URL the machine fetches an image from: absolute URLs as they are, other values as
/// paths under the bootserver's `/images/`.
/// `None` for a relative URL on a machine without a bootserver.
pub fn image_url(url: &str, bootserver: Option<&str>) -> Option<String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Some(url.to_owned())
    } else {
        bootserver.map(|b| {
            format!(
                "{}/images/{}",
                b.trim_end_matches('/'),
                url.trim_start_matches('/')
            )
        })
    }
}

/// The download limit from the configuration's `image.maxSizeBytes` (the CRD allows only
/// 1 or more), else [`DEFAULT_MAX_IMAGE_BYTES`].
pub fn size_limit(configured: Option<i64>) -> u64 {
    configured
        .and_then(|b| u64::try_from(b).ok())
        .filter(|b| *b > 0)
        .unwrap_or(DEFAULT_MAX_IMAGE_BYTES)
}

/// The node image to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSource {
    /// Where from.
    pub url: String,
    /// The expected SHA-256 (lower-case hex).
    pub sha256: String,
    /// The most bytes to download.
    pub max_bytes: u64,
}

fn unpack(reader: impl std::io::Read, into: &Path) -> std::io::Result<()> {
    let decoder = zstd::stream::read::Decoder::new(reader)?;
    let mut archive = tar::Archive::new(decoder);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    archive.unpack(into)
}

/// Runs blocking work on tokio's blocking pool.
async fn off_workers<T: Send + 'static>(
    url: &str,
    work: impl FnOnce() -> Result<T, RootfsError> + Send + 'static,
) -> Result<T, RootfsError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RootfsError::Unpack {
            url: url.to_owned(),
            source: UnpackFailure::Task(e),
        })?
}

/// Downloads the image into an unnamed file beside `staging`, checks its size limit and
/// its SHA-256, and only then unpacks it into `staging` (created here; a leftover one is
/// removed first). On any failure `staging` does not exist afterwards. Returns the
/// archive's size.
pub async fn fetch_verify_unpack(
    http: &reqwest::Client,
    image: &ImageSource,
    staging: &Path,
) -> Result<u64, RootfsError> {
    let result = fetch_verify_unpack_inner(http, image, staging).await;
    if result.is_err() {
        let staging = staging.to_path_buf();
        let _ = tokio::task::spawn_blocking(move || {
            if staging.exists() {
                let _ = fs::remove_dir_all(&staging);
            }
        })
        .await;
    }
    result
}

async fn fetch_verify_unpack_inner(
    http: &reqwest::Client,
    image: &ImageSource,
    staging: &Path,
) -> Result<u64, RootfsError> {
    let url = image.url.as_str();
    let download = |source: DownloadFailure| RootfsError::Download {
        url: url.to_owned(),
        source,
    };
    let too_large = |seen: String| RootfsError::TooLarge {
        url: url.to_owned(),
        limit: image.max_bytes,
        seen,
    };
    let parent = staging
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let leftover = staging.to_path_buf();
    // An unnamed file in the roots' directory: gone when closed, or when the agent dies.
    let archive = off_workers(url, move || {
        if leftover.exists() {
            fs::remove_dir_all(&leftover).map_err(io_err("removing", &leftover))?;
        }
        fs::create_dir_all(&parent).map_err(io_err("creating", &parent))?;
        tempfile::tempfile_in(&parent).map_err(io_err("creating a download file in", &parent))
    })
    .await?;

    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| download(DownloadFailure::Http(e.without_url())))?;
    if !response.status().is_success() {
        return Err(download(DownloadFailure::Status(response.status())));
    }
    if let Some(length) = response.content_length()
        && length > image.max_bytes
    {
        return Err(too_large(format!("the server announced {length} bytes")));
    }

    // Writing and hashing happen on a blocking thread; this task only moves bytes to it
    // and counts them against the limit.
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let writer = tokio::task::spawn_blocking(move || {
        let mut archive = archive;
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        while let Some(chunk) = rx.blocking_recv() {
            digest.update(&chunk);
            archive.write_all(&chunk)?;
        }
        Ok::<_, std::io::Error>((archive, digest.finish()))
    });
    let mut total = 0u64;
    let mut stream = response.bytes_stream();
    let mut failure = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                total += chunk.len() as u64;
                if total > image.max_bytes {
                    failure = Some(too_large(format!("received {total} bytes so far")));
                    break;
                }
                if tx.send(chunk).await.is_err() {
                    // The writer stopped (a full disk): its error says why.
                    break;
                }
            }
            Err(e) => {
                failure = Some(download(DownloadFailure::Http(e.without_url())));
                break;
            }
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| RootfsError::Unpack {
        url: url.to_owned(),
        source: UnpackFailure::Writer(e),
    })?;
    if let Some(error) = failure {
        return Err(error);
    }
    let (mut archive, digest) = written.map_err(io_err("writing the download beside", staging))?;
    let actual = hex(digest.as_ref());
    if actual != image.sha256 {
        return Err(RootfsError::Checksum {
            url: url.to_owned(),
            expected: image.sha256.clone(),
            actual,
        });
    }

    // Verified: only now does anything land in the staging directory.
    let target = staging.to_path_buf();
    let source = url.to_owned();
    off_workers(url, move || {
        archive
            .rewind()
            .map_err(io_err("rewinding the download for", &target))?;
        fs::create_dir(&target).map_err(io_err("creating", &target))?;
        unpack(archive, &target).map_err(|e| RootfsError::Unpack {
            url: source,
            source: UnpackFailure::Archive(e),
        })
    })
    .await?;
    Ok(total)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Checks a path from the configuration: absolute, normal, no `..`.
fn relative_inside(path: &str) -> Result<PathBuf, RootfsError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(RootfsError::BadPath(path.into(), "must be absolute"));
    }
    // `Path::components` drops `.` and repeated slashes silently: check the text itself.
    if path
        .split('/')
        .skip(1)
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err(RootfsError::BadPath(
            path.into(),
            "must not contain '.', '..' or '//'",
        ));
    }
    let mut out = PathBuf::new();
    for component in p.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(c) => out.push(c),
            _ => {
                return Err(RootfsError::BadPath(
                    path.into(),
                    "must not contain '.' or '..'",
                ));
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(RootfsError::BadPath(path.into(), "names no file"));
    }
    Ok(out)
}

/// Writes `content` at `path` inside `root` with `mode`, creating parent directories, and
/// refusing to follow a symlink anywhere on the way (an image must not redirect a write to
/// the host).
pub fn write_file(root: &Path, path: &str, content: &[u8], mode: u32) -> Result<(), RootfsError> {
    let relative = relative_inside(path)?;
    let mut current = root.to_path_buf();
    let parts: Vec<_> = relative.components().collect();
    let (last, parents) = parts
        .split_last()
        .ok_or_else(|| RootfsError::BadPath(path.into(), "names no file"))?;
    for part in parents {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(RootfsError::BadPath(
                    path.into(),
                    "a directory on the way is a symlink",
                ));
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(RootfsError::BadPath(
                    path.into(),
                    "a parent is not a directory",
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(&current).map_err(io_err("creating", &current))?;
                fs::set_permissions(&current, fs::Permissions::from_mode(0o755))
                    .map_err(io_err("setting permissions of", &current))?;
            }
            Err(e) => return Err(io_err("inspecting", &current)(e)),
        }
    }
    current.push(last);
    if fs::symlink_metadata(&current).is_ok_and(|m| m.file_type().is_symlink() || m.is_dir()) {
        return Err(RootfsError::BadPath(
            path.into(),
            "exists as a symlink or a directory",
        ));
    }
    let temporary = current.with_extension("unbounded-tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc_o_nofollow())
        .open(&temporary)
        .map_err(io_err("writing", &temporary))?;
    file.write_all(content)
        .map_err(io_err("writing", &temporary))?;
    file.sync_all().map_err(io_err("syncing", &temporary))?;
    fs::set_permissions(&temporary, fs::Permissions::from_mode(mode))
        .map_err(io_err("setting permissions of", &temporary))?;
    fs::rename(&temporary, &current).map_err(io_err("renaming", &current))
}

/// Reads at most `limit` bytes of the file at `path` inside `root`: `None` when it is missing,
/// unreadable, or resolves (through a symlink anywhere on the way) outside `root`, so that an
/// image cannot make the agent read a file of the host.
pub fn read_inside(root: &Path, path: &str, limit: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let relative = relative_inside(path).ok()?;
    let resolved = fs::canonicalize(root.join(relative)).ok()?;
    if !resolved.starts_with(fs::canonicalize(root).ok()?) || !resolved.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    fs::File::open(&resolved)
        .ok()?
        .take(limit)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// `O_NOFOLLOW` on Linux.
const fn libc_o_nofollow() -> i32 {
    0o400000
}

/// Parses an octal mode such as `0644` or `600`.
pub fn parse_mode(mode: Option<&str>) -> Result<u32, BadMode> {
    let text = mode.unwrap_or("0644");
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| BadMode(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_urls() {
        assert_eq!(
            image_url("node.tar.zst", Some("http://10.99.0.1:8080/")).as_deref(),
            Some("http://10.99.0.1:8080/images/node.tar.zst")
        );
        assert_eq!(
            image_url("/nodes/v1.tar.zst", Some("http://b")).as_deref(),
            Some("http://b/images/nodes/v1.tar.zst")
        );
        assert_eq!(
            image_url("https://m/x", None).as_deref(),
            Some("https://m/x")
        );
        assert_eq!(image_url("node.tar.zst", None), None);
    }

    #[test]
    fn writes_are_confined_to_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        write_file(&root, "/etc/unbounded/a.conf", b"x", 0o600).unwrap();
        let meta = fs::metadata(root.join("etc/unbounded/a.conf")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read(root.join("etc/unbounded/a.conf")).unwrap(), b"x");

        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        assert!(write_file(&root, "/escape/x", b"x", 0o644).is_err());
        std::os::unix::fs::symlink(outside.join("f"), root.join("link")).unwrap();
        assert!(write_file(&root, "/link", b"x", 0o644).is_err());
        assert!(!outside.join("x").exists() && !outside.join("f").exists());
        for bad in ["relative", "/a/../b", "/", "/./a"] {
            assert!(write_file(&root, bad, b"x", 0o644).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode(None).unwrap(), 0o644);
        assert_eq!(parse_mode(Some("0600")).unwrap(), 0o600);
        assert_eq!(parse_mode(Some("755")).unwrap(), 0o755);
        assert!(parse_mode(Some("999")).is_err());
    }

    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            builder.append_data(&mut header, path, *content).unwrap();
        }
        zstd::encode_all(&builder.into_inner().unwrap()[..], 3).unwrap()
    }

    #[test]
    fn unpacks_a_zstd_tar_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = archive(&[("etc/hostname", b"node\n")]);
        unpack(&bytes[..], dir.path()).unwrap();
        assert_eq!(
            fs::read(dir.path().join("etc/hostname")).unwrap(),
            b"node\n"
        );
        let truncated = &bytes[..bytes.len() / 2];
        assert!(unpack(truncated, &dir.path().join("t")).is_err());
        assert!(unpack(&b"not an archive"[..], &dir.path().join("g")).is_err());
    }
}
