//! The appliance VM under QEMU.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{MAC, NAME};
use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::netns::Netns;
use crate::process::Process;

/// The appliance VM: QEMU with the host OS's kernel and initramfs (plus the seed archive),
/// a NIC on the bridge through a tap, the serial console in a file.
#[derive(Debug)]
pub(super) struct ApplianceVm {
    pub(super) process: Process,
    pub(super) console: PathBuf,
    pub(super) started: Instant,
}

impl ApplianceVm {
    pub(super) fn start(
        ns: &Netns,
        dir: &Path,
        kernel: &Path,
        initrd: &Path,
        memory_mib: u32,
        vcpus: u32,
    ) -> Result<Self, LabError> {
        let tap = "tapappliance";
        for args in [
            &["tuntap", "add", "dev", tap, "mode", "tap"][..],
            &["link", "set", tap, "master", "br0"],
            &["link", "set", tap, "up"],
        ] {
            ns.ip(args).map_err(Failure::of)?;
        }
        let console = dir.join("appliance-console.log");
        let args: Vec<String> = vec![
            "-accel".into(),
            crate::qemu::accelerator().into(),
            "-machine".into(),
            "pc".into(),
            "-m".into(),
            memory_mib.to_string(),
            "-smp".into(),
            vcpus.to_string(),
            "-display".into(),
            "none".into(),
            "-monitor".into(),
            "none".into(),
            "-serial".into(),
            format!("file:{}", console.display()),
            "-kernel".into(),
            kernel.display().to_string(),
            "-initrd".into(),
            initrd.display().to_string(),
            "-append".into(),
            // quiet: the kernel's own log over an emulated UART costs seconds.
            format!("console=ttyS0 quiet systemd.show_status=true unbounded.machine={NAME}"),
            "-netdev".into(),
            format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac={MAC},romfile="),
            "-device".into(),
            "virtio-rng-pci".into(),
        ];
        let process = Process::spawn(
            "appliance VM",
            Some(ns),
            Path::new("qemu-system-x86_64"),
            &args,
            &[],
            dir.join("appliance-qemu.log"),
        )?;
        Ok(Self {
            process,
            console,
            started: Instant::now(),
        })
    }

    pub(super) fn console(&self) -> String {
        fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}
