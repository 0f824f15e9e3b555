//! Emulated BMCs driving real QEMU VMs through libvirt: [`Libvirtd`] (started by us: PID 1
//! is not systemd on these machines), [`Domain`] (a VM that network-boots on a bridge of a
//! test's namespace), [`SushyEmulator`] (Redfish) and [`IpmiSim`] (IPMI over LAN).
//!
//! libvirtd is one per machine (its socket is `/run/libvirt/libvirt-sock`), so a test binary
//! starts one and runs its VM tests one at a time. It runs inside the test's namespace so
//! that the taps it creates for VMs join that namespace's bridge; the emulators listen on
//! a loopback (or, for a bootserver that runs on a VM of that bridge, on the bridge's
//! address) and reach libvirtd through its Unix socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::failure::Failure;
use crate::netns::Netns;
use crate::ports::{Protocol, free_loopback_port};

/// Errors of the BMC plumbing.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// A command failed or a daemon did not come up.
    #[error("{0}")]
    Setup(String),
    /// Setting up failed on another error, which it keeps.
    #[error(transparent)]
    Failed(#[from] Failure),
}

fn setup(message: impl Into<String>) -> BmcError {
    BmcError::Setup(message.into())
}

fn run(command: &mut Command) -> Result<String, BmcError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::new(format!("{command:?}"), e))?;
    if !output.status.success() {
        return Err(setup(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), BmcError> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            return Err(setup(format!("{what} did not come up within {timeout:?}")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The virtualenv's `bin` with sushy-emulator, installed once.
pub fn emulators_bin() -> Result<PathBuf, BmcError> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-bmc-emulators.sh");
    let out = run(Command::new("bash").arg(&script))?;
    Ok(PathBuf::from(out.trim()))
}

/// A child killed (and reaped) on drop; it also dies with the test (`PR_SET_PDEATHSIG`).
#[derive(Debug)]
/// A daemon, killed when dropped; with `group`, its whole process group (a daemon that
/// forks per connection, such as `socat … fork`: a forked child keeps no parent-death
/// signal, so killing the parent alone would leave the children running).
struct Daemon {
    child: Child,
    group: bool,
}

impl Daemon {
    /// Sends `signal` (a `kill` name: STOP, CONT) to the daemon.
    fn signal(&self, signal: &str) -> Result<(), BmcError> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .map_err(|e| Failure::new(format!("kill -{signal}"), e))?;
        if status.success() {
            Ok(())
        } else {
            Err(setup(format!("kill -{signal} {} failed", self.child.id())))
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.group {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(command: Command, log: &Path) -> Result<Daemon, BmcError> {
    spawn_daemon(command, log, false)
}

/// [`spawn`] in a process group of its own, all of which is killed with it.
fn spawn_group(mut command: Command, log: &Path) -> Result<Daemon, BmcError> {
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    spawn_daemon(command, log, true)
}

fn spawn_daemon(mut command: Command, log: &Path, group: bool) -> Result<Daemon, BmcError> {
    let file = std::fs::File::create(log).map_err(Failure::of)?;
    let err = file.try_clone().map_err(Failure::of)?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map(|child| Daemon { child, group })
        .map_err(|e| Failure::new(format!("{command:?}"), e).into())
}

/// `setpriv --pdeathsig KILL -- <program>` inside `ns` (or the host when `None`).
fn daemon_command(ns: Option<&Netns>, program: &Path) -> Command {
    let mut command = match ns {
        Some(ns) => ns.command("setpriv"),
        None => Command::new("setpriv"),
    };
    command.args(["--pdeathsig", "KILL", "--"]).arg(program);
    command
}

/// A free TCP or UDP port on loopback (see [`crate::ports`]).
pub fn free_port(udp: bool) -> Result<u16, BmcError> {
    let protocol = if udp { Protocol::Udp } else { Protocol::Tcp };
    free_loopback_port(protocol).map_err(|e| Failure::of(e).into())
}

pub mod fru;
mod ipmi;
mod libvirt;
mod redfish;
pub mod smbios;

pub use ipmi::IpmiSim;
pub use libvirt::{
    Domain, DomainOptions, LIBVIRT_URI, LIBVIRTD_LOCK, Libvirtd, MachineLock, TEST_DOMAIN_PREFIX,
    data_disk_serial, data_disk_target, virsh,
};
pub use redfish::SushyEmulator;
