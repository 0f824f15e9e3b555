//! Installs what the testbed needs on a Debian machine (through `scripts/install-deps.sh`).

use std::io::Write;
use std::process::{Command, Stdio};

const INSTALL_SCRIPT: &str = include_str!("../../scripts/install-deps.sh");

/// Errors while installing dependencies.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The installer could not be started.
    #[error("starting the dependency installer: {0}")]
    Start(#[source] std::io::Error),
    /// The installer failed.
    #[error("installing dependencies failed ({0}); see the output above")]
    Failed(String),
}

/// Runs the dependency installer, which installs only the packages that are missing, with
/// its progress on this process's terminal.
pub fn install_dependencies() -> Result<(), SetupError> {
    let mut child = Command::new("bash")
        .arg("-s")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(SetupError::Start)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(INSTALL_SCRIPT.as_bytes())
            .map_err(SetupError::Start)?;
    }
    let status = child.wait().map_err(SetupError::Start)?;
    if status.success() {
        Ok(())
    } else {
        Err(SetupError::Failed(status.to_string()))
    }
}
