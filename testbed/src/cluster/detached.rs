//! `cluster up|down`: a control plane that outlives the command, recorded so that `down`
//! stops exactly what `up` started.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{ClusterError, Lifetime, LocalControlPlane, PlaneOptions, cache_dir, io_err};

/// What `cluster up` records so that `cluster down` stops exactly what it started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DetachedState {
    /// The data directory.
    pub dir: PathBuf,
    /// The kubeconfig of the admin user.
    pub kubeconfig: PathBuf,
    /// `(component, pid, executable)` of each process started.
    pub processes: Vec<(String, u32, PathBuf)>,
}

/// The file in which `cluster up` records what it started.
pub fn detached_state_path() -> PathBuf {
    cache_dir().join("cluster/state.json")
}

/// Starts a control plane that outlives this process and records it for [`stop_detached`].
pub fn start_detached() -> Result<DetachedState, ClusterError> {
    let state_path = detached_state_path();
    if state_path.exists() {
        // A previous `up` that was never taken down: stop it first so ports and state are clean.
        stop_detached()?;
    }
    let plane = LocalControlPlane::start_with(
        Lifetime::Detached,
        PlaneOptions {
            scheduler: true,
            ..PlaneOptions::default()
        },
    )?;
    let state = plane.detach();
    if let Some(parent) = state_path.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("creating {}", parent.display())))?;
    }
    let json = serde_json::to_vec_pretty(&state).map_err(|e| ClusterError::State {
        path: state_path.display().to_string(),
        source: e,
    })?;
    fs::write(&state_path, json).map_err(io_err(format!("writing {}", state_path.display())))?;
    Ok(state)
}

/// Stops exactly the processes that [`start_detached`] recorded (checking each pid still runs
/// the recorded executable) and removes its data directory.
pub fn stop_detached() -> Result<DetachedState, ClusterError> {
    let state_path = detached_state_path();
    let text = match fs::read_to_string(&state_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClusterError::NotRunning(state_path.display().to_string()));
        }
        Err(e) => return Err(io_err(format!("reading {}", state_path.display()))(e)),
    };
    let state: DetachedState = serde_json::from_str(&text).map_err(|e| ClusterError::State {
        path: state_path.display().to_string(),
        source: e,
    })?;
    for (name, pid, exe) in state.processes.iter().rev() {
        let running = fs::read_link(format!("/proc/{pid}/exe")).ok();
        if running.as_deref() != Some(exe.as_path()) {
            eprintln!("testbed: {name} (pid {pid}) is no longer running");
            continue;
        }
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists()
            && !is_zombie(*pid)
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(100));
        }
        if Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(*pid) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
    let _ = fs::remove_dir_all(&state.dir);
    fs::remove_file(&state_path).map_err(io_err(format!("removing {}", state_path.display())))?;
    Ok(state)
}

pub(super) fn is_zombie(pid: u32) -> bool {
    let mut stat = String::new();
    fs::File::open(format!("/proc/{pid}/stat"))
        .and_then(|mut f| f.read_to_string(&mut stat))
        .is_ok_and(|_| {
            // The state follows the parenthesised command name.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
}
