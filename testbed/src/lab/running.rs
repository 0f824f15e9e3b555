//! What scenarios reach a lab through: the running [`Lab`] itself, or the one another
//! process started (`up`), recorded in `state.json`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::base::{LabError, kubectl, run_kubectl};
use super::{Lab, write};
use crate::appliance::PodsInfo;
use crate::failure::Failure;

impl crate::scenario::LabAccess for Lab {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
        kubectl(&self.plane, args, stdin)
    }

    fn machine_names(&self) -> Vec<String> {
        self.machines.iter().map(|m| m.name.clone()).collect()
    }

    fn console(&self, machine: &str) -> String {
        self.machines
            .iter()
            .find(|m| m.name == machine)
            .map(|m| m.domain.console())
            .unwrap_or_default()
    }

    fn pods(&self) -> Option<PodsInfo> {
        self.appliance().map(|a| a.info.clone())
    }

    fn netns(&self) -> Option<String> {
        Some(self.ns.name().to_owned())
    }
}

impl Lab {
    /// The provisioning network's namespace.
    pub fn netns_name(&self) -> &str {
        self.ns.name()
    }
}

/// What `testbed up` records about the lab it left running (`<cache>/testbed/state.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunningLab {
    /// The supervising process (`unbounded-testbed serve`).
    pub pid: u32,
    /// Its executable, to check the pid still is it.
    pub exe: PathBuf,
    /// Logs and generated files.
    pub dir: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
    /// `(machine, serial console file)`.
    pub machines: Vec<(String, PathBuf)>,
    /// What a lab running the pods offers scenarios (absent for host binaries).
    #[serde(default)]
    pub pods: Option<PodsInfo>,
    /// The provisioning network's namespace (absent in a state an older testbed wrote).
    #[serde(default)]
    pub netns: Option<String>,
}

impl RunningLab {
    /// Where it is recorded.
    pub fn state_path() -> PathBuf {
        crate::cluster::cache_dir().join("testbed/state.json")
    }

    /// The recorded lab, if its supervisor still runs.
    pub fn load() -> Option<Self> {
        let text = fs::read_to_string(Self::state_path()).ok()?;
        let lab: Self = serde_json::from_str(&text).ok()?;
        let running = fs::read_link(format!("/proc/{}/exe", lab.pid)).ok()?;
        (program_path(&running) == program_path(&lab.exe)).then_some(lab)
    }

    /// Records it.
    pub fn save(&self) -> Result<(), LabError> {
        let path = Self::state_path();
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(Failure::of)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(Failure::of)?;
        write(&path, &text)
    }
}

impl crate::scenario::LabAccess for RunningLab {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
        let mut command = Command::new(&self.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        run_kubectl(command, args, stdin)
    }

    fn machine_names(&self) -> Vec<String> {
        self.machines.iter().map(|(n, _)| n.clone()).collect()
    }

    fn console(&self, machine: &str) -> String {
        self.machines
            .iter()
            .find(|(n, _)| n == machine)
            .and_then(|(_, path)| fs::read(path).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn pods(&self) -> Option<PodsInfo> {
        self.pods.clone()
    }

    fn netns(&self) -> Option<String> {
        self.netns.clone()
    }
}

/// The program's path as it was started: a binary rebuilt while it runs shows as
/// "<path> (deleted)" in `/proc/<pid>/exe` (and in `current_exe`) for the process running it.
pub fn program_path(path: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuilt_binary_is_still_the_lab() {
        let built = Path::new("/w/target/debug/unbounded-testbed");
        assert_eq!(
            program_path(Path::new("/w/target/debug/unbounded-testbed (deleted)")),
            built
        );
        assert_eq!(program_path(built), built);
    }
}
