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

use crate::netns::Netns;

/// Errors of the BMC plumbing.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// A command failed or a daemon did not come up.
    #[error("{0}")]
    Setup(String),
}

fn setup(message: impl Into<String>) -> BmcError {
    BmcError::Setup(message.into())
}

fn run(command: &mut Command) -> Result<String, BmcError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| setup(format!("{command:?}: {e}")))?;
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
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(mut command: Command, log: &Path) -> Result<Daemon, BmcError> {
    let file = std::fs::File::create(log).map_err(|e| setup(e.to_string()))?;
    let err = file.try_clone().map_err(|e| setup(e.to_string()))?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map(Daemon)
        .map_err(|e| setup(format!("{command:?}: {e}")))
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

/// Every test domain's name starts with this; leftovers are removed when libvirtd starts.
pub const TEST_DOMAIN_PREFIX: &str = "ub-";

/// The libvirt URI the tests use.
pub const LIBVIRT_URI: &str = "qemu:///system";

/// virtlogd and libvirtd, in the foreground, inside a namespace.
#[derive(Debug)]
pub struct Libvirtd {
    _daemons: Vec<Daemon>,
    dir: tempfile::TempDir,
    // Dropped last: the daemons are gone before another test binary may start its own.
    _lock: MachineLock,
}

/// The lock that serialises libvirtd between test binaries and worktrees on one machine.
pub const LIBVIRTD_LOCK: &str = "/tmp/unbounded-vm.lock";

/// An exclusive `flock` on a file, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct MachineLock(#[allow(dead_code)] std::fs::File);

impl MachineLock {
    /// Blocks until the lock on `path` is ours.
    pub fn acquire(path: &Path) -> Result<Self, BmcError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| setup(format!("opening {}: {e}", path.display())))?;
        file.lock()
            .map_err(|e| setup(format!("locking {}: {e}", path.display())))?;
        Ok(Self(file))
    }
}

/// The shell run (in a mount namespace of its own) to start libvirtd. Where `/dev/kvm`
/// exists but cannot run guests, libvirtd re-probes QEMU's capabilities on every domain
/// definition whenever a `/dev/kvm` is accessible and its cached capabilities lack KVM
/// (20 s to minutes per `virsh define`, measured on a fresh machine; binding `/dev/null`
/// over it is not enough, since that is accessible too). So libvirtd gets a `/dev` without
/// `kvm`: a tmpfs holding a copy of every device node of the real `/dev`, with the
/// filesystems mounted under it (pts, shm, mqueue, hugepages) bound in again.
fn libvirtd_script(hide_kvm: bool, scratch: &Path) -> String {
    if !hide_kvm {
        return "exec /usr/sbin/libvirtd".to_owned();
    }
    let scratch_conf = scratch.with_extension("qemu.conf");
    let scratch = scratch.display();
    format!(
        "set -e
mkdir -p '{scratch}'
mount -t tmpfs -o mode=0755,nosuid unbounded-dev '{scratch}'
cp -ax /dev/. '{scratch}'/
rm -f '{scratch}/kvm'
for sub in pts shm mqueue hugepages; do
  if mountpoint -q /dev/$sub; then mkdir -p '{scratch}'/$sub; mount --bind /dev/$sub '{scratch}'/$sub; fi
done
mount --move '{scratch}' /dev
test ! -e /dev/kvm
# QEMU's own mount namespace would move /dev/pts, which here is a bind mount: libvirt fails
# with EINVAL. The copied /dev is private to this namespace already.
printf 'namespaces = []\n' > '{qemu_conf}'
mount --bind '{qemu_conf}' /etc/libvirt/qemu.conf
exec /usr/sbin/libvirtd",
        qemu_conf = scratch_conf.display(),
    )
}

impl Libvirtd {
    /// Starts both daemons in `ns`; a libvirtd left over from a killed run is stopped first.
    /// Holds a machine-wide lock (`/tmp/unbounded-vm.lock`) for its lifetime: there is
    /// one libvirtd socket per machine, so a second test binary waits for the first.
    pub fn start(ns: &Netns) -> Result<Self, BmcError> {
        let lock = MachineLock::acquire(Path::new(LIBVIRTD_LOCK))?;
        for pidfile in ["/run/libvirtd.pid", "/run/virtlogd.pid"] {
            if let Ok(pid) = std::fs::read_to_string(pidfile) {
                let _ = Command::new("kill").arg(pid.trim()).status();
                std::thread::sleep(Duration::from_millis(500));
                let _ = std::fs::remove_file(pidfile);
            }
        }
        let dir = tempfile::tempdir().map_err(|e| setup(e.to_string()))?;
        let virtlogd = spawn(
            daemon_command(Some(ns), Path::new("/usr/sbin/virtlogd")),
            &dir.path().join("virtlogd.log"),
        )?;
        let mut command = daemon_command(Some(ns), Path::new("unshare"));
        let hide_kvm = crate::qemu::accelerator() == "tcg" && Path::new("/dev/kvm").exists();
        command
            .args(["-m", "sh", "-c"])
            .arg(libvirtd_script(hide_kvm, &dir.path().join("dev")));
        let libvirtd = spawn(command, &dir.path().join("libvirtd.log"))?;
        let this = Self {
            _daemons: vec![virtlogd, libvirtd],
            dir,
            _lock: lock,
        };
        wait_until("libvirtd", Duration::from_secs(30), || {
            virsh(&["version"]).is_ok()
        })
        .map_err(|e| setup(format!("{e}\n{}", this.log())))?;
        // Test domains a killed run left behind (their definitions outlive libvirtd).
        for name in virsh(&["list", "--all", "--name"])?.lines() {
            if name.starts_with(TEST_DOMAIN_PREFIX) {
                let _ = virsh(&["destroy", name]);
                let _ = virsh(&["undefine", "--nvram", name]);
            }
        }
        Ok(this)
    }

    /// libvirtd's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("libvirtd.log")).unwrap_or_default()
    }
}

/// Runs `virsh -c qemu:///system <args>`.
pub fn virsh(args: &[&str]) -> Result<String, BmcError> {
    run(Command::new("virsh").args(["-c", LIBVIRT_URI]).args(args))
}

/// How a [`Domain`] is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainOptions {
    /// OVMF instead of SeaBIOS.
    pub uefi: bool,
    /// Memory.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Boot from the network after the (empty) disk, on every boot.
    pub network_fallback: bool,
}

impl Default for DomainOptions {
    fn default() -> Self {
        Self {
            uefi: false,
            memory_mib: 512,
            vcpus: 1,
            network_fallback: false,
        }
    }
}

/// A libvirt domain (TCG unless the CPU can do KVM) with an empty disk, first in the boot
/// order, and a NIC on `bridge`: it network-boots only when a BMC asks for it (or on every
/// boot with [`DomainOptions::network_fallback`]).
#[derive(Debug)]
pub struct Domain {
    /// The domain's name.
    pub name: String,
    /// Its UUID (Redfish names systems by it).
    pub uuid: String,
    dir: tempfile::TempDir,
}

impl Domain {
    /// Defines (does not start) the domain; `name` starts with [`TEST_DOMAIN_PREFIX`].
    pub fn define(name: &str, mac: &str, bridge: &str, uefi: bool) -> Result<Self, BmcError> {
        Self::define_with(
            name,
            mac,
            bridge,
            &DomainOptions {
                uefi,
                ..DomainOptions::default()
            },
        )
    }

    /// Defines (does not start) a domain with `options`.
    pub fn define_with(
        name: &str,
        mac: &str,
        bridge: &str,
        options: &DomainOptions,
    ) -> Result<Self, BmcError> {
        let uefi = options.uefi;
        let dir = tempfile::tempdir().map_err(|e| setup(e.to_string()))?;
        let disk = dir.path().join("disk.qcow2");
        run(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("64M"))?;
        let console = dir.path().join("console.log");
        let (loader, machine) = if uefi {
            let vars = dir.path().join("OVMF_VARS.fd");
            std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars)
                .map_err(|e| setup(e.to_string()))?;
            (
                format!(
                    "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader><nvram>{}</nvram>",
                    vars.display()
                ),
                "q35",
            )
        } else {
            ("<bios useserial='yes'/>".to_owned(), "pc")
        };
        let uuid = run(Command::new("cat").arg("/proc/sys/kernel/random/uuid"))?
            .trim()
            .to_owned();
        let kind = if crate::qemu::accelerator() == "kvm" {
            "kvm"
        } else {
            "qemu"
        };
        let memory = options.memory_mib;
        let vcpus = options.vcpus;
        // A server whose OS lives in RAM boots from the network on every boot: its empty
        // disk fails and the firmware moves on to the NIC.
        let network_fallback = if options.network_fallback {
            "<boot dev='network'/>"
        } else {
            ""
        };
        let xml = format!(
            "<domain type='{kind}'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{memory}</memory>
  <vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='{machine}'>hvm</type>{loader}<boot dev='hd'/>{network_fallback}</os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file='{disk}'/><target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <mac address='{mac}'/><source bridge='{bridge}'/><model type='virtio'/>
    </interface>
    <serial type='file'><source path='{console}' append='on'/><target port='0'/></serial>
    <graphics type='vnc' port='-1' listen='127.0.0.1'/>
  </devices>
</domain>",
            disk = disk.display(),
            console = console.display(),
        );
        let file = dir.path().join("domain.xml");
        std::fs::write(&file, xml).map_err(|e| setup(e.to_string()))?;
        virsh(&["define", &file.display().to_string()])?;
        Ok(Self {
            name: name.to_owned(),
            uuid,
            dir,
        })
    }

    /// The serial console's file.
    pub fn console_path(&self) -> PathBuf {
        self.dir.path().join("console.log")
    }

    /// What the serial console printed so far (across boots: the file is appended).
    pub fn console(&self) -> String {
        std::fs::read(self.dir.path().join("console.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Waits until the console shows `marker` `count` times; returns the last such line.
    pub fn wait_for(
        &self,
        marker: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<String, BmcError> {
        let deadline = Instant::now() + timeout;
        loop {
            let console = self.console();
            let lines: Vec<&str> = crate::qemu::complete_lines(&console)
                .filter(|l| l.contains(marker))
                .collect();
            if lines.len() >= count {
                return Ok(lines[count - 1].trim().to_owned());
            }
            if Instant::now() > deadline {
                let tail = crate::qemu::console_tail(&console, 2000);
                return Err(setup(format!(
                    "{}: {marker:?} seen {} of {count} times in {timeout:?}; console ends:\n{tail}",
                    self.name,
                    lines.len()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// libvirt's state of the domain (`running`, `shut off`, …).
    pub fn state(&self) -> String {
        virsh(&["domstate", &self.name])
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", "--nvram", &self.name]);
    }
}

/// A free TCP or UDP port on loopback (bound once and released).
pub fn free_port(udp: bool) -> Result<u16, BmcError> {
    let port = if udp {
        std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr())
    } else {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|s| s.local_addr())
    };
    port.map(|a| a.port()).map_err(|e| setup(e.to_string()))
}

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
        let dir = tempfile::tempdir().map_err(|e| setup(e.to_string()))?;
        let auth = dir.path().join("htpasswd");
        // The password reaches python through stdin, never a command line.
        let mut child = Command::new(bin.join("python"))
            .args([
                "-c",
                "import sys, bcrypt; u, p = sys.stdin.read().split('\\n', 1); \
                 print(u + ':' + bcrypt.hashpw(p.encode(), bcrypt.gensalt()).decode())",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| setup(e.to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            write!(stdin, "{username}\n{password}").map_err(|e| setup(e.to_string()))?;
        }
        let out = child.wait_with_output().map_err(|e| setup(e.to_string()))?;
        std::fs::write(&auth, &out.stdout).map_err(|e| setup(e.to_string()))?;
        let config = dir.path().join("emulator.conf");
        std::fs::write(
            &config,
            format!(
                "SUSHY_EMULATOR_AUTH_FILE = '{}'\nSUSHY_EMULATOR_LIBVIRT_URI = '{LIBVIRT_URI}'\n",
                auth.display()
            ),
        )
        .map_err(|e| setup(e.to_string()))?;
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
        .map_err(|e| setup(format!("{e}\n{}", this.log())))?;
        Ok(this)
    }

    /// Starts the emulator with its fake driver on the host's loopback: no VMs and no
    /// libvirt, one powered-off system per `(uuid, mac)` whose power and boot override
    /// the emulator keeps in its own directory; no authentication (any credentials pass).
    pub fn start_fake(systems: &[(&str, &str)]) -> Result<Self, BmcError> {
        let bin = emulators_bin()?;
        let dir = tempfile::tempdir().map_err(|e| setup(e.to_string()))?;
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
                "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = {:?}\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n  {}\n]\n",
                dir.path().join("state").display().to_string(),
                systems.join(",\n  ")
            ),
        )
        .map_err(|e| setup(e.to_string()))?;
        let port = free_port(false)?;
        let mut command = daemon_command(None, &bin.join("sushy-emulator"));
        command.arg("--config").arg(&config).args([
            "--interface",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
        let daemon = spawn(command, &dir.path().join("sushy.log"))?;
        let this = Self {
            port,
            _daemon: daemon,
            dir,
        };
        wait_until("sushy-emulator", Duration::from_secs(60), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .map_err(|e| setup(format!("{e}\n{}", this.log())))?;
        Ok(this)
    }

    /// The emulator's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sushy.log")).unwrap_or_default()
    }
}

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
    _daemon: Daemon,
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
        let dir = tempfile::tempdir().map_err(|e| setup(e.to_string()))?;
        let port = free_port(true)?;
        let script = dir.path().join("chassis.sh");
        std::fs::write(&script, chassis_script(domain, dir.path()))
            .map_err(|e| setup(e.to_string()))?;
        run(Command::new("chmod").arg("+x").arg(&script))?;
        let conf = dir.path().join("lan.conf");
        std::fs::write(
            &conf,
            format!(
                "name \"ubsim\"\nset_working_mc 0x20\n  startlan 1\n    addr {address} {port}\n    priv_limit admin\n    allowed_auths_callback none md5\n    allowed_auths_user none md5\n    allowed_auths_operator none md5\n    allowed_auths_admin none md5\n    guid a123456789abcdefa123456789abcdef\n  endlan\n  chassis_control \"{}\"\nuser 2 true \"{username}\" \"{password}\" admin 10 none md5\n",
                script.display()
            ),
        )
        .map_err(|e| setup(e.to_string()))?;
        let emu = dir.path().join("sim.emu");
        std::fs::write(
            &emu,
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n",
        )
        .map_err(|e| setup(e.to_string()))?;
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).map_err(|e| setup(e.to_string()))?;
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
            _daemon: daemon,
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
        .map_err(|e| setup(format!("{e}\n{}", this.log())))?;
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
        .map_err(|e| setup(format!("{e}\n{}", this.log())))?;
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

    /// The chassis calls so far (`get power`, `set power 1`, `set boot pxe`, …).
    pub fn chassis_calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default()
    }
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
