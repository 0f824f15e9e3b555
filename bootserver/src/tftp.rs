//! TFTP (async-tftp): read-only, confined to one directory, with blksize, tsize and
//! windowsize negotiation. It serves the iPXE binaries.

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_tftp::packet;
use async_tftp::server::{Handler, TftpServerBuilder};
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

use crate::metrics::Metrics;

/// Errors of the TFTP service.
#[derive(Debug, thiserror::Error)]
pub enum TftpError {
    /// The root directory is unusable.
    #[error("TFTP root {path}: {source}")]
    Root {
        /// The root.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server could not start or stopped.
    #[error("TFTP server on {addr}: {source}")]
    Server {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: async_tftp::Error,
    },
}

/// Why a path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Absolute, `..`, or escaping the root through a symbolic link.
    OutsideRoot,
    /// Not there, or not a regular file.
    NotFound,
}

/// Resolves a requested path inside `root` (canonical). Only plain names are allowed, and the
/// canonical result must still be inside the root, so that neither `..` nor a symbolic link
/// leads out.
pub fn resolve(root: &Path, requested: &Path) -> Result<PathBuf, Refusal> {
    let mut relative = PathBuf::new();
    for component in requested.components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(Refusal::OutsideRoot);
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(Refusal::NotFound);
    }
    let canonical = std::fs::canonicalize(root.join(&relative)).map_err(|_| Refusal::NotFound)?;
    if !canonical.starts_with(root) {
        return Err(Refusal::OutsideRoot);
    }
    if !canonical.is_file() {
        return Err(Refusal::NotFound);
    }
    Ok(canonical)
}

/// The read-only, confined handler.
#[derive(Debug)]
pub struct ConfinedDir {
    root: PathBuf,
    metrics: Arc<Metrics>,
}

impl ConfinedDir {
    /// A handler serving files under `root`.
    pub fn new(root: &Path, metrics: Arc<Metrics>) -> Result<Self, TftpError> {
        let root = std::fs::canonicalize(root).map_err(|source| TftpError::Root {
            path: root.to_owned(),
            source,
        })?;
        Ok(Self { root, metrics })
    }
}

/// A file being sent, counting its bytes into the TFTP bytes metric as they are read.
#[derive(Debug)]
pub struct CountingReader {
    file: Compat<tokio::fs::File>,
    bytes: prometheus_client::metrics::counter::Counter,
}

impl futures::AsyncRead for CountingReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.file).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.bytes.inc_by(*n as u64);
        }
        polled
    }
}

impl Handler for ConfinedDir {
    type Reader = CountingReader;
    type Writer = futures::io::Sink;

    async fn read_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
    ) -> Result<(Self::Reader, Option<u64>), packet::Error> {
        let resolved = match resolve(&self.root, path) {
            Ok(p) => p,
            Err(refusal) => {
                self.metrics.tftp_refused("refused");
                tracing::info!(%client, path = %path.display(), ?refusal, "TFTP request refused");
                return Err(match refusal {
                    Refusal::OutsideRoot => packet::Error::PermissionDenied,
                    Refusal::NotFound => packet::Error::FileNotFound,
                });
            }
        };
        let file = tokio::fs::File::open(&resolved)
            .await
            .map_err(|_| packet::Error::FileNotFound)?;
        let size = file.metadata().await.ok().map(|m| m.len());
        self.metrics.tftp_transfers.inc();
        tracing::debug!(%client, path = %resolved.display(), ?size, "TFTP transfer");
        Ok((
            CountingReader {
                file: file.compat(),
                bytes: self.metrics.tftp_bytes.clone(),
            },
            size,
        ))
    }

    async fn write_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
        _size: Option<u64>,
    ) -> Result<Self::Writer, packet::Error> {
        self.metrics.tftp_refused("refused");
        tracing::info!(%client, path = %path.display(), "TFTP write refused: the server is read-only");
        Err(packet::Error::IllegalOperation)
    }
}

/// Serves TFTP on `addr` until the future is dropped. Bind to the interface's address, not
/// 0.0.0.0: each transfer opens its own socket on the listening IP.
pub async fn serve(addr: SocketAddr, root: &Path, metrics: Arc<Metrics>) -> Result<(), TftpError> {
    let handler = ConfinedDir::new(root, metrics)?;
    let server = TftpServerBuilder::with_handler(handler)
        .bind(addr)
        .block_size_limit(1468)
        .window_size_limit(16)
        .build()
        .await
        .map_err(|source| TftpError::Server { addr, source })?;
    server
        .serve()
        .await
        .map_err(|source| TftpError::Server { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_paths_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "no").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("undionly.kpxe"), "ipxe").unwrap();
        std::fs::create_dir(root.join("arm64")).unwrap();
        std::fs::write(root.join("arm64/snponly.efi"), "ipxe").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("undionly.kpxe"), root.join("inside-link")).unwrap();

        let cases: [(&str, Result<&str, Refusal>); 11] = [
            ("undionly.kpxe", Ok("undionly.kpxe")),
            ("./undionly.kpxe", Ok("undionly.kpxe")),
            ("arm64/snponly.efi", Ok("arm64/snponly.efi")),
            ("inside-link", Ok("undionly.kpxe")),
            ("../secret", Err(Refusal::OutsideRoot)),
            ("arm64/../../secret", Err(Refusal::OutsideRoot)),
            ("/etc/passwd", Err(Refusal::OutsideRoot)),
            ("escape", Err(Refusal::OutsideRoot)),
            ("missing", Err(Refusal::NotFound)),
            ("arm64", Err(Refusal::NotFound)),
            ("", Err(Refusal::NotFound)),
        ];
        for (requested, expected) in cases {
            let got = resolve(&root, Path::new(requested));
            let expected = expected.map(|p| root.join(p));
            assert_eq!(got, expected, "{requested:?}");
        }
    }
}
