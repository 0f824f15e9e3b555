//! QEMU VMs that network-boot from a tap device in a test's namespace, with the serial
//! console in a file so that a test can wait for what the booted system prints.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::failure::Failure;
use crate::netns::Netns;

/// Errors of VM handling.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// QEMU could not start.
    #[error("starting QEMU: {0}")]
    Start(String),
    /// QEMU could not start, on another error, which it keeps.
    #[error("starting QEMU: {0}")]
    NotStarted(#[source] Failure),
    /// The marker did not appear in time.
    #[error("no {marker:?} on the serial console after {seconds} s; the console said:\n{console}")]
    Timeout {
        /// What was awaited.
        marker: String,
        /// How long.
        seconds: u64,
        /// The tail of the console.
        console: String,
    },
}

/// The firmware a VM boots with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS; the NIC's iPXE ROM does the network boot.
    Bios,
    /// OVMF with the NIC ROM disabled: OVMF's own PXE fetches iPXE over TFTP.
    UefiPxe,
    /// OVMF with the NIC ROM disabled and PXE turned off: UEFI HTTP boot fetches iPXE.
    UefiHttp,
    /// OVMF with the NIC ROM disabled and PXE over IPv4 turned off: OVMF's own PXE goes
    /// straight to PXEv6 (DHCPv6, then the `tftp://[…]/` boot file URL over TFTPv6).
    UefiPxe6,
    /// OVMF with the NIC ROM disabled, both PXEs and the whole IPv4 stack turned off: UEFI
    /// HTTP boot over IPv6 (HTTPv4 first would cost about a minute on a link without
    /// DHCPv4). The boot menu's 3 s give the link-local address time to settle: without
    /// them HTTPv6 starts before it and fails with no Solicit at all.
    UefiHttp6,
}

/// The accelerator: KVM only when the CPU really offers hardware virtualisation (a nested,
/// software `/dev/kvm` without vmx/svm aborts guests), else TCG.
pub fn accelerator() -> &'static str {
    let cpu_has_vt = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "vmx" || w == "svm"));
    if cpu_has_vt && Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "tcg"
    }
}

/// QEMU arguments for a UEFI machine on a provisioning network without DHCPv4 (passed
/// through libvirt's `<qemu:commandline>`): the NIC's iPXE option ROM off, so that OVMF's
/// own PXE boots as a server's firmware would (DHCPv6, then TFTP over IPv6), and its PXE
/// over IPv4 off (about a minute of timeouts under TCG on such a link).
pub fn ovmf_pxe6_args() -> Vec<String> {
    ["-fw_cfg", NO_PXE4, "-global", "virtio-net-pci.romfile="]
        .map(str::to_owned)
        .to_vec()
}

/// Turns OVMF's PXE over IPv4 off.
const NO_PXE4: &str = "name=opt/org.tianocore/IPv4PXESupport,string=no";

/// The `-fw_cfg` values that turn OVMF's network boot entries off for `firmware`, so that
/// the one wanted comes first. OVMF tries PXEv4, PXEv6, HTTPv4, HTTPv6 in that order, and
/// each that finds no server costs about a minute under TCG.
fn uefi_network_knobs(firmware: Firmware) -> &'static [&'static str] {
    // Skips the PXEv6 attempt (a minute of timeouts on an IPv4-only link).
    const NO_PXE6: &str = "name=opt/org.tianocore/IPv6PXESupport,string=no";
    match firmware {
        Firmware::Bios => &[],
        Firmware::UefiPxe => &[NO_PXE6],
        Firmware::UefiHttp => &[NO_PXE6, NO_PXE4],
        Firmware::UefiPxe6 => &[NO_PXE4],
        Firmware::UefiHttp6 => &[
            NO_PXE6,
            NO_PXE4,
            "name=opt/org.tianocore/IPv4Support,string=no",
        ],
    }
}

/// OVMF's code and variables templates (Debian's `ovmf`).
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// A running VM, killed on drop.
#[derive(Debug)]
pub struct Vm {
    child: Child,
    serial: PathBuf,
    _dir: tempfile::TempDir,
}

impl Vm {
    /// Starts a VM in `ns` whose one NIC (`mac`) is attached to the tap device `tap`.
    pub fn start(ns: &Netns, tap: &str, mac: &str, firmware: Firmware) -> Result<Self, VmError> {
        let dir = tempfile::tempdir().map_err(|e| VmError::NotStarted(Failure::of(e)))?;
        let serial = dir.path().join("serial.log");
        let mut command = ns.command("qemu-system-x86_64");
        command.args([
            "-accel",
            accelerator(),
            "-m",
            "512",
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
            "-display",
            "none",
            "-netdev",
            &format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
        ]);
        command
            .arg("-serial")
            .arg(format!("file:{}", serial.display()));
        match firmware {
            Firmware::Bios => {
                command.args([
                    "-device",
                    &format!("virtio-net-pci,netdev=n0,mac={mac},bootindex=1"),
                ]);
            }
            Firmware::UefiPxe | Firmware::UefiHttp | Firmware::UefiPxe6 | Firmware::UefiHttp6 => {
                let vars = dir.path().join("OVMF_VARS.fd");
                std::fs::copy(OVMF_VARS, &vars).map_err(|e| VmError::NotStarted(Failure::of(e)))?;
                command
                    .args([
                        "-drive",
                        &format!("if=pflash,format=raw,readonly=on,file={OVMF_CODE}"),
                    ])
                    .arg("-drive")
                    .arg(format!("if=pflash,format=raw,file={}", vars.display()))
                    .args([
                        "-device",
                        &format!("virtio-net-pci,netdev=n0,mac={mac},romfile=,bootindex=1"),
                    ]);
                command.args(
                    uefi_network_knobs(firmware)
                        .iter()
                        .flat_map(|knob| ["-fw_cfg", knob]),
                );
                if firmware == Firmware::UefiHttp6 {
                    command.args(["-boot", "menu=on,splash-time=3000"]);
                }
            }
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| VmError::NotStarted(Failure::of(e)))?;
        Ok(Self {
            child,
            serial,
            _dir: dir,
        })
    }

    /// What the serial console printed so far.
    pub fn console(&self) -> String {
        std::fs::read(&self.serial)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Waits until a console line contains `marker`, and returns that line.
    pub fn wait_for(&self, marker: &str, timeout: Duration) -> Result<String, VmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let console = self.console();
            if let Some(line) = complete_lines(&console).find(|l| l.contains(marker)) {
                return Ok(line[line.find(marker).unwrap_or(0)..].trim().to_owned());
            }
            if Instant::now() > deadline {
                return Err(VmError::Timeout {
                    marker: marker.to_owned(),
                    seconds: timeout.as_secs(),
                    console: console_tail(&console, 3000),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of a console that are complete (newline-terminated): a line still being
/// written when the console is read would be cut short.
pub(crate) fn complete_lines(console: &str) -> impl Iterator<Item = &str> {
    console
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(str::trim_end)
}

/// The last `chars` characters of a console, for an error message.
pub(crate) fn console_tail(console: &str, chars: usize) -> String {
    let start = console
        .char_indices()
        .rev()
        .nth(chars.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    console[start..].to_owned()
}

/// Builds (once) the marker image: Debian's kernel and a busybox initramfs that prints
/// `UNBOUNDED-MARKER <kernel command line>` on the serial console and powers off.
pub fn marker_image() -> Result<PathBuf, VmError> {
    // Versioned: a changed init gets a new directory instead of a stale image.
    let dir = crate::cluster::cache_dir().join("marker-2");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-marker-image.sh");
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .status()
        .map_err(|e| {
            VmError::NotStarted(Failure::new(format!("running {}", script.display()), e))
        })?;
    if !status.success() {
        return Err(VmError::Start(format!("{} failed", script.display())));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::{Firmware, complete_lines, console_tail, uefi_network_knobs};

    #[test]
    fn each_uefi_variant_turns_off_the_network_boots_it_skips() {
        let pxe4 = "name=opt/org.tianocore/IPv4PXESupport,string=no";
        let pxe6 = "name=opt/org.tianocore/IPv6PXESupport,string=no";
        assert_eq!(uefi_network_knobs(Firmware::UefiPxe), [pxe6]);
        assert_eq!(uefi_network_knobs(Firmware::UefiHttp), [pxe6, pxe4]);
        assert_eq!(uefi_network_knobs(Firmware::UefiPxe6), [pxe4]);
        assert_eq!(
            uefi_network_knobs(Firmware::UefiHttp6),
            [pxe6, pxe4, "name=opt/org.tianocore/IPv4Support,string=no"]
        );
        assert!(uefi_network_knobs(Firmware::Bios).is_empty());
    }

    #[test]
    fn a_line_still_being_written_is_not_complete() {
        let lines: Vec<&str> = complete_lines("one\r\ntwo\nthr").collect();
        assert_eq!(lines, ["one", "two"]);
    }

    #[test]
    fn console_tail_keeps_the_last_characters() {
        assert_eq!(console_tail("abcdef", 3), "def");
        assert_eq!(console_tail("abc", 10), "abc");
        assert_eq!(console_tail("añb", 2), "ñb");
    }
}
