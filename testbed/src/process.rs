//! The lab's own child processes (components on the host, QEMU, the registry): each logs to
//! a file, dies with the thread that started it (`PR_SET_PDEATHSIG`, through `setpriv`) and
//! is killed and reaped when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::netns::Netns;

/// A child process killed (and reaped) on drop.
#[derive(Debug)]
pub struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args` and `env` (in `ns`, or the host's namespace), its output
    /// in `log`.
    pub fn spawn(
        name: &'static str,
        ns: Option<&Netns>,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Result<Self, LabError> {
        let file = fs::File::create(&log).map_err(|e| Failure::new(log.display(), e))?;
        let err = file.try_clone().map_err(Failure::of)?;
        let mut command = match ns {
            Some(ns) => ns.command("setpriv"),
            None => Command::new("setpriv"),
        };
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        let child = command
            .spawn()
            .map_err(|e| Failure::new(format!("starting {name} ({})", program.display()), e))?;
        Ok(Self { name, child, log })
    }

    /// `Some(why)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited ({status})", self.name)),
            _ => None,
        }
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log, headed by its name.
    pub fn tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "--- {} ({}):\n{}",
            self.name,
            self.log.display(),
            tail_text(&text, lines)
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of `text`.
pub fn tail_text(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
