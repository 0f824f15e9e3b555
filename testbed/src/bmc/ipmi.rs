//! OpenIPMI's `ipmi_sim`: IPMI over LAN, its chassis commands driving libvirt.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::libvirt::LIBVIRT_URI;
use super::{
    BmcError, Daemon, daemon_command, free_port, run, setup, spawn, spawn_group, wait_until,
};
use crate::failure::Failure;
use crate::netns::Netns;

/// OpenIPMI's `ipmi_sim`: an IPMI v2.0 LAN (RMCP+) BMC on `127.0.0.1:<port>` whose chassis
/// is a libvirt domain, through a `chassis_control` script that runs `virsh`. A one-time
/// PXE boot (boot flags, device PXE) starts the domain once with `<boot dev='network'/>`.
///
/// Not virtualbmc: `ipmi-rs` opens every session with an ASF presence ping, which pyghmi
/// (virtualbmc's IPMI server) does not answer; real BMCs and `ipmi_sim` do.
#[derive(Debug)]
pub struct IpmiSim {
    /// The IPMI UDP port.
    pub port: u16,
    /// The TCP port QEMU's `ipmi-bmc-extern` connects to, when the simulator is also the BMC
    /// inside a VM ([`Self::start_for_vm`]).
    pub vm_port: Option<u16>,
    address: String,
    login: Login,
    ns: Option<String>,
    daemon: Daemon,
    _sol_relay: Option<Daemon>,
    dir: tempfile::TempDir,
}

impl IpmiSim {
    /// Starts the simulator for `domain` with one administrator, on the host's loopback.
    pub fn start(domain: &str, username: &str, password: &str) -> Result<Self, BmcError> {
        Self::start_in(None, domain, username, password)
    }

    /// Starts the simulator on the loopback of `ns` (or the host's).
    pub fn start_in(
        ns: Option<&Netns>,
        domain: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, BmcError> {
        Self::start_bound(ns, "127.0.0.1", domain, username, password)
    }

    /// Starts the simulator on `address` (an address of `ns`, or of the host).
    pub fn start_bound(
        ns: Option<&Netns>,
        address: &str,
        domain: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, BmcError> {
        Self::start_inner(ns, address, domain, username, password, Extras::default())
    }

    /// Like [`Self::start_bound`], and also the BMC *inside* a VM: it listens on a TCP port
    /// (at `address`) for QEMU's `ipmi-bmc-extern` ([`Self::qemu_args`]: a KCS system
    /// interface wired to it), so that the guest reaches it in band through its IPMI device,
    /// as a server's OS reaches its BMC. No chassis control: the VM's power stays with
    /// whoever else drives it.
    pub fn start_for_vm(
        ns: Option<&Netns>,
        address: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, BmcError> {
        let extras = Extras {
            vm: true,
            ..Extras::default()
        };
        Self::start_inner(ns, address, "", username, password, extras)
    }

    /// The QEMU arguments that give a VM this simulator as its BMC: a socket to
    /// [`Self::vm_port`] (reconnecting: the simulator may start after the VM), an external
    /// BMC on it and an ISA KCS interface (which QEMU describes in SMBIOS type 38 and ACPI).
    pub fn qemu_args(&self) -> Vec<String> {
        let Some(port) = self.vm_port else {
            return Vec::new();
        };
        [
            "-chardev".to_owned(),
            format!(
                "socket,id=ubipmi,host={},port={port},reconnect=10",
                self.address
            ),
            "-device".to_owned(),
            "ipmi-bmc-extern,id=ubbmc,chardev=ubipmi".to_owned(),
            "-device".to_owned(),
            "isa-ipmi-kcs,bmc=ubbmc".to_owned(),
        ]
        .to_vec()
    }

    /// Configures the BMC's LAN channel 1 as a BMC's own DHCP client or an administrator
    /// would: a static `ip` and the channel's `mac` (Set LAN Configuration Parameters, over
    /// the simulator's LAN interface).
    pub fn set_lan(&self, ip: &str, mac: &str) -> Result<(), BmcError> {
        for args in [["ipsrc", "static"], ["ipaddr", ip], ["macaddr", mac]] {
            let mut ipmitool = match &self.ns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns, "ipmitool"]);
                    c
                }
                None => Command::new("ipmitool"),
            };
            ipmitool
                .args(["-I", "lanplus", "-C", "3", "-H", &self.address])
                .args([
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    &self.login.username,
                    "-E",
                ])
                .args(["lan", "set", "1"])
                .args(args)
                .env("IPMI_PASSWORD", &self.login.password)
                .stdin(Stdio::null());
            // Not `run`: its error shows the command, and this one's environment holds the
            // password.
            let output = ipmitool
                .output()
                .map_err(|e| Failure::new(format!("ipmitool lan set 1 {args:?}"), e))?;
            if !output.status.success() {
                return Err(setup(format!(
                    "ipmitool lan set 1 {args:?} on {}:{}: {}",
                    self.address,
                    self.port,
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// Like [`Self::start_bound`], with `fru` as FRU device 0 (the machine's identity:
    /// [`super::fru`] builds one).
    pub fn start_with_fru(
        ns: Option<&Netns>,
        address: &str,
        domain: &str,
        username: &str,
        password: &str,
        fru: &[u8],
    ) -> Result<Self, BmcError> {
        let extras = Extras {
            fru: Some(fru),
            ..Extras::default()
        };
        Self::start_inner(ns, address, domain, username, password, extras)
    }

    /// Like [`Self::start_bound`], with Serial-over-LAN showing the domain's serial console
    /// file `console`, read-only: ipmi_sim connects its SOL "serial port" (`tcp:`) when a
    /// session is activated, to a `socat` in `ns` that runs `tail -F` of the file for each
    /// connection (the bytes written from then on; keystrokes are dropped). Not a TCP
    /// chardev of the domain itself: since QEMU 5.1 a socket chardev without a client fails
    /// the guest's writes, and the console file (which scenarios wait on) would lose them.
    pub fn start_with_console(
        ns: Option<&Netns>,
        address: &str,
        domain: &str,
        username: &str,
        password: &str,
        console: &Path,
    ) -> Result<Self, BmcError> {
        let extras = Extras {
            console: Some(console),
            ..Extras::default()
        };
        Self::start_inner(ns, address, domain, username, password, extras)
    }

    fn start_inner(
        ns: Option<&Netns>,
        address: &str,
        domain: &str,
        username: &str,
        password: &str,
        extras: Extras<'_>,
    ) -> Result<Self, BmcError> {
        let Extras { console, fru, vm } = extras;
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let port = free_port(true)?;
        let (chassis_line, vm_port) = if vm {
            let vm_port = free_port(false)?;
            (
                format!("  serial kcs {address} {vm_port} codec VM\n"),
                Some(vm_port),
            )
        } else {
            let script = dir.path().join("chassis.sh");
            std::fs::write(&script, chassis_script(domain, dir.path())).map_err(Failure::of)?;
            run(Command::new("chmod").arg("+x").arg(&script))?;
            (
                format!("  chassis_control \"{}\"\n", script.display()),
                None,
            )
        };
        let (sol_line, sol_relay) = match console {
            Some(console) => {
                let sol_port = free_port(false)?;
                let mut relay = daemon_command(ns, Path::new("socat"));
                relay
                    .arg(format!(
                        "TCP-LISTEN:{sol_port},bind={address},reuseaddr,fork"
                    ))
                    .arg(format!("EXEC:tail -c 0 -F {}", console.display()));
                let relay = spawn_group(relay, &dir.path().join("sol-relay.log"))?;
                (
                    format!("  sol \"tcp:{address}:{sol_port}\" 115200\n"),
                    Some(relay),
                )
            }
            None => (String::new(), None),
        };
        let conf = dir.path().join("lan.conf");
        std::fs::write(
            &conf,
            format!(
                "name \"ubsim\"\nset_working_mc 0x20\n  startlan 1\n    addr {address} {port}\n    priv_limit admin\n    allowed_auths_callback none md5\n    allowed_auths_user none md5\n    allowed_auths_operator none md5\n    allowed_auths_admin none md5\n    guid a123456789abcdefa123456789abcdef\n  endlan\n{chassis_line}{sol_line}user 2 true \"{username}\" \"{password}\" admin 10 none md5\n",
            ),
        )
        .map_err(Failure::of)?;
        let emu = dir.path().join("sim.emu");
        // Device support 0x9f includes the FRU inventory device.
        let fru_line = fru.map_or_else(String::new, |bytes| {
            let data: Vec<String> = bytes.iter().map(|b| format!("{b:#04x}")).collect();
            format!(
                "mc_add_fru_data 0x20 0 {:#x} data {}\n",
                bytes.len(),
                data.join(" ")
            )
        });
        std::fs::write(
            &emu,
            format!(
                "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n{fru_line}mc_enable 0x20\n"
            ),
        )
        .map_err(Failure::of)?;
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).map_err(Failure::of)?;
        let mut command = daemon_command(ns, Path::new("ipmi_sim"));
        command
            .arg("-c")
            .arg(&conf)
            .arg("-f")
            .arg(&emu)
            .arg("-n")
            .arg("-s")
            .arg(&state);
        let daemon = spawn(command, &dir.path().join("ipmi_sim.log"))?;
        let this = Self {
            port,
            vm_port,
            address: address.to_owned(),
            login: Login {
                username: username.to_owned(),
                password: password.to_owned(),
            },
            ns: ns.map(|ns| ns.name().to_owned()),
            daemon,
            _sol_relay: sol_relay,
            dir,
        };
        // Listening first: an ipmitool session started before the port is bound spends ~10 s
        // in its own retries.
        let hex_port = format!(":{port:04X} ");
        wait_until("ipmi_sim's UDP port", Duration::from_secs(60), || {
            let udp = match ns {
                Some(ns) => ns
                    .exec(&["cat", "/proc/net/udp"])
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default(),
                None => std::fs::read_to_string("/proc/net/udp").unwrap_or_default(),
            };
            udp.lines().any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|local| format!("{local} ").ends_with(&hex_port))
            })
        })
        .map_err(|e| Failure::around("", e, format!("\n{}", this.log())))?;
        // Ready when it answers a session (ipmitool reads the password from the environment).
        wait_until("ipmi_sim", Duration::from_secs(90), || {
            let mut ipmitool = match ns {
                Some(ns) => ns.command("ipmitool"),
                None => Command::new("ipmitool"),
            };
            // Cipher suite 3 named: ipmitool otherwise asks for the channel's cipher suites,
            // which ipmi_sim does not answer, and every call takes ~10 s.
            ipmitool
                .args([
                    "-I",
                    "lanplus",
                    "-C",
                    "3",
                    "-H",
                    address,
                    "-p",
                    &port.to_string(),
                ])
                .args(["-U", username, "-E", "chassis", "power", "status"])
                .env("IPMI_PASSWORD", password)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map_err(|e| Failure::around("", e, format!("\n{}", this.log())))?;
        Ok(this)
    }

    /// The simulator's output and every chassis call it made.
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!(
            "{}\nchassis calls:\n{}",
            read("ipmi_sim.log"),
            read("calls.log")
        )
    }

    /// Stops the simulator (SIGSTOP): packets sent to it wait in its socket, unanswered, as
    /// at a BMC that hangs, until [`Self::thaw`]; then it serves them all.
    pub fn freeze(&self) -> Result<(), BmcError> {
        self.daemon.signal("STOP")
    }

    /// Lets a frozen simulator run on (SIGCONT).
    pub fn thaw(&self) -> Result<(), BmcError> {
        self.daemon.signal("CONT")
    }

    /// The chassis calls so far (`get power`, `set power 1`, `set boot pxe`, …).
    pub fn chassis_calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default()
    }
}

/// The administrator [`IpmiSim::set_lan`] logs in as; its `Debug` leaves the password out.
struct Login {
    username: String,
    password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// What a simulator carries beyond its LAN channel and administrator.
#[derive(Debug, Default, Clone, Copy)]
struct Extras<'a> {
    /// Serial-over-LAN showing this console file.
    console: Option<&'a Path>,
    /// FRU device 0.
    fru: Option<&'a [u8]>,
    /// The BMC of a VM (QEMU's `ipmi-bmc-extern`) instead of a libvirt chassis script.
    vm: bool,
}

/// The `chassis_control` script: `get <items>` prints `item:value` lines, `set <item>
/// <value>…` acts, on one libvirt domain.
fn chassis_script(domain: &str, dir: &Path) -> String {
    let dir = dir.display();
    format!(
        r#"#!/bin/sh
# ipmi_sim chassis control for libvirt domain {domain}
virsh() {{ command virsh -q -c {LIBVIRT_URI} "$@"; }}
echo "$@" >> {dir}/calls.log
op=$1; shift
running() {{ [ "$(virsh domstate {domain})" = running ]; }}
case "$op" in
  get)
    for item in "$@"; do
      case $item in
        power) if running; then echo power:1; else echo power:0; fi ;;
        boot) echo boot:default ;;
      esac
    done ;;
  set)
    while [ $# -ge 2 ]; do
      case "$1 $2" in
        "power 1")
          if ! running; then
            if [ -e {dir}/pxe-once ]; then
              virsh dumpxml --inactive {domain} > {dir}/saved.xml
              sed "s|<boot dev='hd'/>|<boot dev='network'/>|" {dir}/saved.xml > {dir}/pxe.xml
              virsh define {dir}/pxe.xml >/dev/null
              virsh start {domain} >/dev/null
              virsh define {dir}/saved.xml >/dev/null
              rm -f {dir}/pxe-once
            else
              virsh start {domain} >/dev/null
            fi
          fi ;;
        "power 0") running && virsh destroy {domain} >/dev/null ;;
        "shutdown 1") running && virsh shutdown {domain} >/dev/null ;;
        "reset 1") running && virsh reset {domain} >/dev/null ;;
        "boot pxe") touch {dir}/pxe-once ;;
        "boot "*) rm -f {dir}/pxe-once ;;
      esac
      shift 2
    done ;;
esac
exit 0
"#
    )
}
