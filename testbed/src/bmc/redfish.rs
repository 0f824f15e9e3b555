//! sushy-tools' Redfish emulator over libvirt.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::libvirt::LIBVIRT_URI;
use super::{BmcError, Daemon, daemon_command, emulators_bin, free_port, spawn, wait_until};
use crate::failure::Failure;
use crate::netns::Netns;

/// sushy-tools' Redfish emulator on `127.0.0.1:<port>` over plain HTTP, with basic
/// authentication from a bcrypt htpasswd file.
#[derive(Debug)]
pub struct SushyEmulator {
    /// Its port.
    pub port: u16,
    _daemon: Daemon,
    dir: tempfile::TempDir,
}

impl SushyEmulator {
    /// Starts the emulator with one user, on the host's loopback.
    pub fn start(username: &str, password: &str) -> Result<Self, BmcError> {
        Self::start_in(None, username, password)
    }

    /// Starts the emulator with one user on the loopback of `ns` (or the host's).
    pub fn start_in(ns: Option<&Netns>, username: &str, password: &str) -> Result<Self, BmcError> {
        Self::start_bound(ns, "127.0.0.1", username, password)
    }

    /// Starts the emulator with one user on `address` (an address of `ns`, or of the host).
    pub fn start_bound(
        ns: Option<&Netns>,
        address: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, BmcError> {
        let bin = emulators_bin()?;
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let auth = dir.path().join("htpasswd");
        write_htpasswd(&bin, &auth, username, password)?;
        let config = dir.path().join("emulator.conf");
        std::fs::write(
            &config,
            format!(
                "SUSHY_EMULATOR_AUTH_FILE = '{}'\nSUSHY_EMULATOR_LIBVIRT_URI = '{LIBVIRT_URI}'\n",
                auth.display()
            ),
        )
        .map_err(Failure::of)?;
        let port = free_port(false)?;
        let mut command = daemon_command(ns, &bin.join("sushy-emulator"));
        command
            .arg("--config")
            .arg(&config)
            .args(["--interface", address, "--port", &port.to_string()])
            .args(["--libvirt-uri", LIBVIRT_URI]);
        let daemon = spawn(command, &dir.path().join("sushy.log"))?;
        let this = Self {
            port,
            _daemon: daemon,
            dir,
        };
        wait_until("sushy-emulator", Duration::from_secs(60), || match ns {
            None => std::net::TcpStream::connect((address, port)).is_ok(),
            Some(ns) => ns
                .exec(&[
                    "curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    &format!("http://{address}:{port}/"),
                ])
                .is_ok(),
        })
        .map_err(|e| Failure::around("", e, format!("\n{}", this.log())))?;
        Ok(this)
    }

    /// Starts the emulator with its fake driver on the host's loopback: no VMs and no
    /// libvirt, one powered-off system per `(uuid, mac)` whose power and boot override
    /// the emulator keeps in its own directory; no authentication (any credentials pass).
    pub fn start_fake(systems: &[(&str, &str)]) -> Result<Self, BmcError> {
        Self::start_fake_as(systems, None)
    }

    /// [`Self::start_fake`] with one user (basic authentication, as [`Self::start`]): other
    /// credentials get 401.
    pub fn start_fake_with_user(
        systems: &[(&str, &str)],
        username: &str,
        password: &str,
    ) -> Result<Self, BmcError> {
        Self::start_fake_as(systems, Some((username, password)))
    }

    fn start_fake_as(
        systems: &[(&str, &str)],
        user: Option<(&str, &str)>,
    ) -> Result<Self, BmcError> {
        let bin = emulators_bin()?;
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let auth_line = match user {
            Some((username, password)) => {
                let auth = dir.path().join("htpasswd");
                write_htpasswd(&bin, &auth, username, password)?;
                format!(
                    "SUSHY_EMULATOR_AUTH_FILE = {:?}\n",
                    auth.display().to_string()
                )
            }
            None => String::new(),
        };
        let systems: Vec<String> = systems
            .iter()
            .map(|(uuid, mac)| {
                format!(
                    "{{'uuid': '{uuid}', 'name': '{uuid}', 'power_state': 'Off', 'external_notifier': False, 'nics': [{{'mac': '{mac}', 'ip': '10.0.0.1'}}]}}"
                )
            })
            .collect();
        let config = dir.path().join("emulator.conf");
        std::fs::write(
            &config,
            format!(
                "{auth_line}SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = {:?}\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n  {}\n]\n",
                dir.path().join("state").display().to_string(),
                systems.join(",\n  ")
            ),
        )
        .map_err(Failure::of)?;
        Self::start_on_loopback(&bin, dir, &config, &[])
    }

    /// Starts the emulator with its libvirt driver over libvirt's in-process test driver
    /// (`test:///<file>`): no libvirtd and no VMs, but the domains of `node_xml` (a libvirt
    /// `<node>` document) as the real driver reads them: vCPUs, memory, NIC MACs, UUIDs.
    /// `extra_config` is appended to the emulator's configuration (Python; for
    /// `SUSHY_EMULATOR_STORAGE` and `SUSHY_EMULATOR_DRIVES`, say). No authentication.
    pub fn start_libvirt_test(node_xml: &str, extra_config: &str) -> Result<Self, BmcError> {
        let bin = emulators_bin()?;
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let node = dir.path().join("node.xml");
        std::fs::write(&node, node_xml).map_err(Failure::of)?;
        let uri = format!("test://{}", node.display());
        let config = dir.path().join("emulator.conf");
        std::fs::write(
            &config,
            format!("SUSHY_EMULATOR_LIBVIRT_URI = {uri:?}\n{extra_config}\n"),
        )
        .map_err(Failure::of)?;
        Self::start_on_loopback(&bin, dir, &config, &["--libvirt-uri", &uri])
    }

    /// Runs `sushy-emulator` from `bin` with `config` and `args` on a free port of the
    /// host's loopback, its log in `dir`, and waits until it accepts connections.
    fn start_on_loopback(
        bin: &std::path::Path,
        dir: tempfile::TempDir,
        config: &std::path::Path,
        args: &[&str],
    ) -> Result<Self, BmcError> {
        let port = free_port(false)?;
        let mut command = daemon_command(None, &bin.join("sushy-emulator"));
        command
            .arg("--config")
            .arg(config)
            .args(["--interface", "127.0.0.1", "--port", &port.to_string()])
            .args(args);
        let daemon = spawn(command, &dir.path().join("sushy.log"))?;
        let this = Self {
            port,
            _daemon: daemon,
            dir,
        };
        wait_until("sushy-emulator", Duration::from_secs(60), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .map_err(|e| Failure::around("", e, format!("\n{}", this.log())))?;
        Ok(this)
    }

    /// The emulator's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sushy.log")).unwrap_or_default()
    }
}

/// Writes a bcrypt htpasswd file with one user; the password reaches python through stdin,
/// never a command line.
fn write_htpasswd(
    bin: &std::path::Path,
    path: &std::path::Path,
    username: &str,
    password: &str,
) -> Result<(), BmcError> {
    let mut child = Command::new(bin.join("python"))
        .args([
            "-c",
            "import sys, bcrypt; u, p = sys.stdin.read().split('\\n', 1); \
             print(u + ':' + bcrypt.hashpw(p.encode(), bcrypt.gensalt()).decode())",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(Failure::of)?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        write!(stdin, "{username}\n{password}").map_err(Failure::of)?;
    }
    let out = child.wait_with_output().map_err(Failure::of)?;
    std::fs::write(path, &out.stdout).map_err(|e| Failure::of(e).into())
}
