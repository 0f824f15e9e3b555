//! TFTP: read-only, confined to one directory, with `blksize`, `timeout`, `tsize` and
//! `windowsize` negotiation. It serves the iPXE binaries.
//!
//! A request goes through [`packet::parse_request`] (validation, options),
//! [`resolve`] (confinement) and [`packet::negotiate`], all pure and fuzzed
//! (`bootserver/fuzz`, target `tftp`); [`mod@serve`] is the socket loop, with each transfer in
//! its own task from its own port (RFC 1350's TIDs): at most [`serve::MAX_TRANSFERS`] at
//! once, a panic in one caught, logged and counted without touching the others.
//!
//! Our own implementation since issue 11 (it replaced `async-tftp` 0.4): that crate parses
//! requests in private code no fuzz target could reach, runs every transfer on one
//! executor behind a lock held across the handler's file open, and keeps a panicked
//! transfer's client in its in-progress set for good.

use std::path::{Component, Path, PathBuf};

pub mod packet;
pub mod serve;
pub mod settings;

pub use serve::serve;

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
    /// The server socket could not be opened.
    #[error("TFTP server on {addr}: {source}")]
    Server {
        /// Where.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
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

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutsideRoot => "outside_root",
            Self::NotFound => "not_found",
        }
    }
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
