//! A real LLDP sender, Debian's `lldpd`, standing in for a switch: in a namespace the test or
//! the lab created, announcing on one interface every 2 s (a switch's default is 30 s; the
//! agent's capture waits at most 35 s either way). The agent's LLDP tests run it on a veth
//! end; `scenario discovery` runs it on the lab's bridge, whose own frames reach every VM.

use std::process::{Child, Command, Stdio};

/// Errors of starting the sender.
#[derive(Debug, thiserror::Error)]
pub enum LldpError {
    /// Its directory, configuration or process could not be made.
    #[error("lldpd: {0}")]
    Start(#[source] std::io::Error),
}

/// `lldpd` announcing on one interface; killed on drop.
#[derive(Debug)]
pub struct Lldpd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Lldpd {
    /// Starts it in namespace `netns` on `interface` (its port ID is the interface's name),
    /// with system name `system_name` and, when given, the port description.
    pub fn start(
        netns: &str,
        interface: &str,
        system_name: &str,
        port_description: Option<&str>,
    ) -> Result<Self, LldpError> {
        let fail = LldpError::Start;
        let dir = tempfile::tempdir().map_err(fail)?;
        // lldpd's configuration runs through lldpcli as lldpd's own unprivileged user: it
        // must reach the control socket in this directory.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .map_err(fail)?;
        let mut config = format!(
            "configure system hostname {system_name}\n\
             configure lldp tx-interval 2\n\
             configure lldp portidsubtype ifname\n"
        );
        if let Some(description) = port_description {
            config.push_str(&format!(
                "configure ports {interface} lldp portdescription \"{description}\"\n"
            ));
        }
        let config_path = dir.path().join("lldpd.conf");
        std::fs::write(&config_path, config).map_err(fail)?;
        let log = std::fs::File::create(dir.path().join("lldpd.log")).map_err(fail)?;
        // `-I` with the exact name: lldpd sends on it even when it is a bridge.
        let child = Command::new("ip")
            .args(["netns", "exec", netns, "lldpd", "-d", "-u"])
            .arg(dir.path().join("lldpd.socket"))
            .args(["-I", interface, "-C", interface, "-O"])
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(fail)?)
            .stderr(log)
            .spawn()
            .map_err(fail)?;
        Ok(Self { child, dir })
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("lldpd.log")).unwrap_or_default()
    }
}

impl Drop for Lldpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
