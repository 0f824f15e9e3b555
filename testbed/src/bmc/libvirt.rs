//! libvirtd (started by us) and the VM domains it runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{BmcError, Daemon, daemon_command, run, setup, spawn, wait_until};
use crate::failure::Failure;
use crate::netns::Netns;

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
            .map_err(|e| Failure::new(format!("opening {}", path.display()), e))?;
        file.lock()
            .map_err(|e| Failure::new(format!("locking {}", path.display()), e))?;
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
        for (pidfile, program) in [
            ("/run/libvirtd.pid", "libvirtd"),
            ("/run/virtlogd.pid", "virtlogd"),
        ] {
            stop_leftover_daemon(Path::new(pidfile), program);
        }
        let dir = tempfile::tempdir().map_err(Failure::of)?;
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
        .map_err(|e| Failure::around("", e, format!("\n{}", this.log())))?;
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

/// Stops the daemon a killed run left behind in `pidfile`, and removes the file. The PID is
/// signalled only while it still names `program`: PIDs wrap (`pid_max` is 32768 on the CI
/// machine), and a stale file's PID can name a test's own kube-apiserver by then (the likely
/// cause of a CI run where the API server refused connections right after libvirtd started).
fn stop_leftover_daemon(pidfile: &Path, program: &str) {
    let Ok(pid) = std::fs::read_to_string(pidfile) else {
        return;
    };
    let pid = pid.trim();
    if is_running_program(pid, program) {
        let _ = Command::new("kill").arg(pid).status();
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = std::fs::remove_file(pidfile);
}

/// Whether process `pid` is running `program` (its `comm`, as the kernel reports it).
fn is_running_program(pid: &str, program: &str) -> bool {
    pid.parse::<u32>().is_ok()
        && std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == program)
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
    /// Blank virtio disks of these many GiB (`vdb`, `vdc`, …; sparse qcow2: each costs what
    /// is written), outside the boot order, for the node's state (`spec.template.storage`).
    /// The first has the serial `data-<domain>`, the next `data2-<domain>`, and so on.
    pub data_disks_gib: Vec<u32>,
    /// The SMBIOS system serial the guest reads (`/sys/class/dmi/id/product_serial`), set
    /// through libvirt's `<sysinfo type='smbios'>`; QEMU's default (none) when unset.
    pub smbios_serial: Option<String>,
    /// More QEMU arguments, passed through libvirt's `<qemu:commandline>`: devices libvirt does
    /// not model (an IPMI system interface wired to an external BMC emulator, SMBIOS
    /// structures from a file).
    pub qemu_args: Vec<String>,
    /// A TPM 2.0 of its own (CRB interface, libvirt's swtpm emulator backend), whose state
    /// libvirt keeps with the domain: the same endorsement key on every boot.
    pub tpm: bool,
}

/// The kernel name of the lab's `index`th data disk (`vdb` first: `vda` is the boot disk).
pub fn data_disk_target(index: usize) -> String {
    let letter = u8::try_from(index).map_or('z', |i| char::from(b'b'.saturating_add(i).min(b'z')));
    format!("vd{letter}")
}

/// The serial of data disk `index` of domain `domain`: `data-<domain>`, then `data2-<domain>`…
pub fn data_disk_serial(index: usize, domain: &str) -> String {
    match index {
        0 => format!("data-{domain}"),
        _ => format!("data{}-{domain}", index + 1),
    }
}

impl Default for DomainOptions {
    fn default() -> Self {
        Self {
            uefi: false,
            memory_mib: 512,
            vcpus: 1,
            network_fallback: false,
            data_disks_gib: Vec::new(),
            smbios_serial: None,
            qemu_args: Vec::new(),
            tpm: true,
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
        let dir = tempfile::tempdir().map_err(Failure::of)?;
        let disk = dir.path().join("disk.qcow2");
        run(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("64M"))?;
        let mut data_disks = String::new();
        for (index, gib) in options.data_disks_gib.iter().enumerate() {
            let path = dir.path().join(format!("data{index}.qcow2"));
            run(Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2"])
                .arg(&path)
                .arg(format!("{gib}G")))?;
            // discard='unmap': the agent's wipe (blkdiscard) reaches the file, and a test
            // reading the disk back sees what the guest left.
            data_disks.push_str(&format!(
                "<disk type='file' device='disk'><driver name='qemu' type='qcow2' discard='unmap'/><source file='{}'/><target dev='{}' bus='virtio'/><serial>{}</serial></disk>",
                path.display(),
                data_disk_target(index),
                data_disk_serial(index, name),
            ));
        }
        let console = dir.path().join("console.log");
        let (loader, machine) = if uefi {
            let vars = dir.path().join("OVMF_VARS.fd");
            std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars).map_err(Failure::of)?;
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
        let (sysinfo, smbios) = options.smbios_serial.as_deref().map_or_else(
            || (String::new(), ""),
            |serial| {
                (
                    format!(
                        "<sysinfo type='smbios'><system><entry name='serial'>{}</entry></system></sysinfo>",
                        xml_text(serial)
                    ),
                    "<smbios mode='sysinfo'/>",
                )
            },
        );
        let qemu_args: String = options
            .qemu_args
            .iter()
            .map(|arg| format!("<qemu:arg value='{}'/>", xml_text(arg)))
            .collect();
        let tpm = if options.tpm {
            "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>"
        } else {
            ""
        };
        let qemu_commandline = if qemu_args.is_empty() {
            String::new()
        } else {
            format!("<qemu:commandline>{qemu_args}</qemu:commandline>")
        };
        let xml = format!(
            "<domain type='{kind}' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{memory}</memory>
  <vcpu>{vcpus}</vcpu>
  {sysinfo}
  <os><type arch='x86_64' machine='{machine}'>hvm</type>{loader}<boot dev='hd'/>{network_fallback}{smbios}</os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file='{disk}'/><target dev='vda' bus='virtio'/>
    </disk>
    {data_disks}
    <interface type='bridge'>
      <mac address='{mac}'/><source bridge='{bridge}'/><model type='virtio'/>
    </interface>
    <serial type='file'><source path='{console}' append='on'/><target port='0'/></serial>
    <graphics type='vnc' port='-1' listen='127.0.0.1'/>
    {tpm}
  </devices>
  {qemu_commandline}
</domain>",
            disk = disk.display(),
            console = console.display(),
        );
        let file = dir.path().join("domain.xml");
        std::fs::write(&file, xml).map_err(Failure::of)?;
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

/// `text` for an XML element's content.
fn xml_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", "--nvram", &self.name]);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_running_program, xml_text};

    /// A leftover PID file is acted on only while its PID runs the daemon it names.
    #[test]
    fn a_reused_pid_is_not_taken_for_the_daemon() {
        let own = std::process::id().to_string();
        let own_comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert!(is_running_program(&own, own_comm.trim()));
        assert!(!is_running_program(&own, "libvirtd"));
        assert!(!is_running_program("not-a-pid", "libvirtd"));
        assert!(!is_running_program("", "libvirtd"));
    }

    /// A serial is written into the domain's XML: markup in it stays text.
    #[test]
    fn smbios_values_are_escaped_for_xml() {
        assert_eq!(xml_text("TB-1"), "TB-1");
        assert_eq!(xml_text("a<b>&c</entry>"), "a&lt;b&gt;&amp;c&lt;/entry&gt;");
    }
}
