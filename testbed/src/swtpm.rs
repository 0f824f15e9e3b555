//! A software TPM 2.0 (swtpm) for tests: its own state directory (so its own endorsement
//! seed and EK), listening on TCP inside a network namespace, where in-process code that
//! joined the namespace (an agent acting as a machine) reaches it through tpm2-tools'
//! `swtpm:` TCTI. The VMs of the lab get theirs from libvirt (`<tpm>` with the emulator
//! backend) instead.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::netns::{Netns, NetnsError};

/// A running swtpm; killed when dropped.
#[derive(Debug)]
pub struct Swtpm {
    child: Child,
    ns: String,
    port: u16,
    _state: tempfile::TempDir,
}

fn failed(what: &str, message: impl Into<String>) -> NetnsError {
    NetnsError::Command {
        command: what.to_owned(),
        message: message.into(),
    }
}

fn not_run(what: &str) -> impl FnOnce(std::io::Error) -> NetnsError {
    let command = what.to_owned();
    move |source| NetnsError::NotRun { command, source }
}

impl Swtpm {
    /// Starts an swtpm in `ns` on `port` (its control channel on `port + 1`), manufactured
    /// fresh (a new endorsement seed), and waits until it answers.
    pub fn start(ns: &Netns, port: u16) -> Result<Self, NetnsError> {
        let state = tempfile::tempdir().map_err(not_run("swtpm state"))?;
        ns.ip(&["link", "set", "lo", "up"])?;
        let child = ns
            .command("swtpm")
            .args([
                "socket",
                "--tpm2",
                "--tpmstate",
                &format!("dir={}", state.path().display()),
                "--server",
                &format!("type=tcp,port={port},bindaddr=127.0.0.1"),
                "--ctrl",
                &format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
                "--flags",
                "not-need-init,startup-clear",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(not_run("swtpm (install-deps.sh installs it)"))?;
        let tpm = Self {
            child,
            ns: ns.name().to_owned(),
            port,
            _state: state,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while tpm.tool(&["tpm2_getrandom", "8", "--hex"]).is_err() {
            if Instant::now() > deadline {
                return Err(failed("swtpm", "did not answer within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(tpm)
    }

    /// The TCTI that reaches it from inside its namespace.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// Runs a tpm2-tools command against it (inside its namespace); its standard output.
    pub fn tool(&self, args: &[&str]) -> Result<String, NetnsError> {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", &self.ns, "env"])
            .arg(format!("TPM2TOOLS_TCTI={}", self.tcti()))
            .args(args)
            .output()
            .map_err(not_run(args.first().copied().unwrap_or("tpm2")))?;
        if !output.status.success() {
            return Err(failed(
                args.first().copied().unwrap_or("tpm2"),
                String::from_utf8_lossy(&output.stderr),
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Extends SHA-256 PCR `index` with `digest` (as a boot loader measuring an image).
    pub fn extend(&self, index: u8, digest: &[u8; 32]) -> Result<(), NetnsError> {
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.tool(&["tpm2_pcrextend", &format!("{index}:sha256={hex}")])
            .map(|_| ())
    }

    /// The TPM name of its RSA endorsement key (`000b…`), as `tpm2_readpublic` prints it.
    pub fn endorsement_key_name(&self) -> Result<String, NetnsError> {
        let dir = tempfile::tempdir().map_err(not_run("tpm2 work"))?;
        let ctx = dir.path().join("ek.ctx").display().to_string();
        self.tool(&["tpm2_createek", "-c", &ctx, "-G", "rsa"])?;
        let _ = self.tool(&["tpm2_flushcontext", "-t"]);
        let out = self.tool(&["tpm2_readpublic", "-c", &ctx])?;
        let _ = self.tool(&["tpm2_flushcontext", "-t"]);
        out.lines()
            .find_map(|l| l.trim().strip_prefix("name: "))
            .map(str::to_owned)
            .ok_or_else(|| failed("tpm2_readpublic", "no name in its output"))
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
