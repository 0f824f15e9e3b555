//! `tftp:` in the configuration file, resolved into [`TftpSettings`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// `tftp:` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TftpFile {
    root: Option<PathBuf>,
    port: Option<u16>,
}

/// The TFTP server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TftpSettings {
    /// The root (the iPXE binaries).
    pub root: PathBuf,
    /// The port (69).
    pub port: u16,
}

impl TftpSettings {
    /// Every value of `tftp:` is valid; the root the file leaves out is `default_root`, which
    /// depends on where the bootserver runs (the image carries its own iPXE builds).
    pub fn from_file(file: &TftpFile, default_root: &Path) -> Self {
        Self {
            root: file.root.clone().unwrap_or_else(|| default_root.to_owned()),
            port: file.port.unwrap_or(69),
        }
    }
}
