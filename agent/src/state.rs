//! What the agent remembers between its own restarts within one boot: what it paved, and
//! whether a pave is in progress (a restart in the middle starts it over). Kept as JSON in
//! the state directory (RAM on a network-booted host); a file from another boot is ignored.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use unbounded_api::ResolvedConfiguration;

use crate::plan::Paved;

/// The agent's local state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalState {
    /// The boot this state belongs to.
    pub boot_id: String,
    /// A pave that was started (and not finished) with this version.
    #[serde(default)]
    pub paving: Option<ResolvedConfiguration>,
    /// What was paved.
    #[serde(default)]
    pub paved: Option<Paved>,
    /// What the last unpacked node image said of its kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_kubelet: Option<crate::kubelet_version::ImageKubelet>,
}

/// Reads and writes the state file.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("state.json"),
        }
    }

    /// The state of this boot (empty when the file is missing, unreadable or another boot's).
    pub fn load(&self, boot_id: &str) -> LocalState {
        let loaded = fs::read(&self.path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<LocalState>(&bytes).ok());
        match loaded {
            Some(state) if state.boot_id == boot_id => state,
            _ => LocalState {
                boot_id: boot_id.to_owned(),
                ..LocalState::default()
            },
        }
    }

    /// Writes the state (atomically: a crash leaves the old or the new file).
    pub fn save(&self, state: &LocalState) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        let temporary = self.path.with_extension("tmp");
        fs::write(&temporary, bytes)?;
        fs::File::open(&temporary)?.sync_all()?;
        fs::rename(&temporary, &self.path)
    }
}

/// This boot's state and the file that keeps it: whoever changes the state saves it at
/// once ([`KeptState::save`]).
#[derive(Debug)]
pub struct KeptState {
    file: StateFile,
    /// The state as last changed.
    pub state: LocalState,
}

impl KeptState {
    /// This boot's state from the state file in `dir`.
    pub fn load(dir: &Path, boot_id: &str) -> Self {
        let file = StateFile::new(dir);
        let state = file.load(boot_id);
        Self { file, state }
    }

    /// Writes the state; a failure is logged, and the agent goes on with the state it
    /// holds.
    pub fn save(&self) {
        if let Err(error) = self.file.save(&self.state) {
            tracing::warn!(%error, "writing the agent's state file failed");
        }
    }
}

/// The kernel's boot ID (a new random UUID on every boot).
pub fn boot_id() -> std::io::Result<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_boots_state_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        let state = LocalState {
            boot_id: "boot-a".into(),
            paving: Some(ResolvedConfiguration {
                name: "general".into(),
                version: 2,
            }),
            paved: None,
            image_kubelet: None,
        };
        file.save(&state).unwrap();
        assert_eq!(file.load("boot-a"), state);
        assert_eq!(file.load("boot-b").paving, None);
        assert_eq!(file.load("boot-b").boot_id, "boot-b");
    }
}
