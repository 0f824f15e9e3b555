#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Real firmware network-boots through the bootserver, in standalone mode: QEMU (TCG on
//! machines without usable KVM) with SeaBIOS and its NIC's iPXE ROM, with OVMF's own PXE
//! fetching iPXE over TFTP, and with UEFI HTTP boot; in full-DHCP mode and in ProxyDHCP mode
//! beside dnsmasq. Each
//! boot ends in the marker image, which prints its kernel command line: the test reads the
//! machine's identity from it.

mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;
use unbounded_testbed::netns::{Netns, unique};
use unbounded_testbed::qemu::{Firmware, Vm, marker_image};

/// Long enough for TCG on 2 busy cores (measured 25–40 s per boot).
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

fn standalone_config(mode: &str, images: &std::path::Path) -> String {
    let subnets = if mode == "full" {
        "  subnets:\n    - subnet: 10.99.0.0/24\n      pool: [10.99.0.100, 10.99.0.199]\n      gateway: 10.99.0.1\n"
    } else {
        ""
    };
    format!(
        r#"interface: br0
serverAddress: 10.99.0.1
dhcp:
  mode: {mode}
  leaseFile: "{{dir}}/leases.log"
{subnets}tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
machines:
  - name: bios-node
    macs: ["52:54:00:00:01:01"]
    firmware: bios
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
  - name: uefi-node
    macs: ["52:54:00:00:01:02"]
    firmware: uefi
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
"#,
        images = images.display()
    )
}

/// The provisioning network: a bridge `br0` (10.99.0.1) in the server's namespace with the
/// VM's tap device on it.
fn provisioning_network() -> (Netns, String) {
    let ns = bridge_namespace("ubp");
    let tap = unique("tap");
    ns.ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])
        .unwrap();
    ns.ip(&["link", "set", &tap, "master", "br0"]).unwrap();
    ns.ip(&["link", "set", &tap, "up"]).unwrap();
    (ns, tap)
}

/// Boots a VM through the bootserver in `mode` (`full`, or `proxy` beside dnsmasq) to the
/// marker, and checks that it booted as `machine`.
fn boot_to_marker(mode: &str, firmware: Firmware, mac: &str, machine: &str) {
    let images = marker_image().unwrap();
    let (ns, tap) = provisioning_network();
    let dnsmasq = (mode == "proxy").then(|| start_dnsmasq(&ns));
    let server = Bootserver::start(&ns, &standalone_config(mode, &images));
    let started = std::time::Instant::now();
    let vm = Vm::start(&ns, &tap, mac, firmware).unwrap();
    let line = vm
        .wait_for("UNBOUNDED-MARKER", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\nbootserver log:\n{}", server.log()));
    eprintln!(
        "{mode} DHCP, {firmware:?}: marker after {:.1} s: {line}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        line.contains(&format!("unbounded.machine={machine}")),
        "{line}"
    );
    assert!(
        line.contains("unbounded.bootserver=http://10.99.0.1:8080"),
        "{line}"
    );
    if std::env::var_os("UNBOUNDED_SHOW_CONSOLE").is_some() {
        eprintln!("{}", vm.console());
    }
    if firmware == Firmware::UefiHttp {
        // With PXE off, OVMF can only have loaded iPXE over HTTP.
        let metrics = server.metrics(&ns);
        assert_eq!(
            metric(&metrics, "unbounded_bootserver_tftp_transfers_total", ""),
            0.0,
            "{metrics}"
        );
    }
    if firmware == Firmware::UefiPxe {
        // OVMF's own PXE loaded iPXE from our TFTP server.
        let metrics = server.metrics(&ns);
        assert!(
            metric(&metrics, "unbounded_bootserver_tftp_transfers_total", "") >= 1.0,
            "{metrics}"
        );
    }
    if let Some(dnsmasq) = dnsmasq {
        // iPXE was offered no boot file on port 67 and asked for it on port 4011, from the
        // address dnsmasq gave it: the exchange that vouches for a machine's address in
        // proxy mode (docs/security.md).
        let log = server.log();
        assert!(
            log.lines().any(|l| l.contains("PXE boot-server exchange")
                && l.contains(mac)
                && l.contains("10.99.0.")),
            "no port-4011 exchange from {mac}:\n{log}"
        );
        // We answered with boot information; the address is dnsmasq's (we have no pool here).
        let metrics = server.metrics(&ns);
        assert!(
            metric(&metrics, "unbounded_bootserver_dhcp_sent_total", "") >= 1.0,
            "{metrics}"
        );
        let leases = std::fs::read_to_string(dnsmasq.dir.path().join("leases")).unwrap();
        assert!(
            leases.contains(&format!("{mac} 10.99.0.")),
            "dnsmasq leased the address: {leases}"
        );
    }
}

#[test]
fn bios_boots_to_the_marker_with_full_dhcp() {
    boot_to_marker("full", Firmware::Bios, "52:54:00:00:01:01", "bios-node");
}

#[test]
fn uefi_http_boot_reaches_the_marker_with_full_dhcp() {
    boot_to_marker("full", Firmware::UefiHttp, "52:54:00:00:01:02", "uefi-node");
}

#[test]
fn uefi_boots_through_tftp_ipxe_to_the_marker_with_full_dhcp() {
    boot_to_marker("full", Firmware::UefiPxe, "52:54:00:00:01:02", "uefi-node");
}

/// dnsmasq in a namespace of its own, on the same bridge: the site's DHCP server.
struct Dnsmasq {
    child: Child,
    _ns: Netns,
    dir: tempfile::TempDir,
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_dnsmasq(provisioning: &Netns) -> Dnsmasq {
    let ns = Netns::new("ubd").unwrap();
    let (a, b) = (unique("vd"), unique("ve"));
    let out = std::process::Command::new("ip")
        .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for (end, target) in [(&a, provisioning.name()), (&b, ns.name())] {
        let out = std::process::Command::new("ip")
            .args(["link", "set", end, "netns", target])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    provisioning
        .ip(&["link", "set", &a, "master", "br0"])
        .unwrap();
    provisioning.ip(&["link", "set", &a, "up"]).unwrap();
    ns.ip(&["addr", "add", "10.99.0.254/24", "dev", &b])
        .unwrap();
    ns.ip(&["link", "set", &b, "up"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let child = ns
        .command("setpriv")
        .args([
            "--pdeathsig",
            "KILL",
            "--",
            "dnsmasq",
            "--no-daemon",
            "--port=0",
        ])
        .arg(format!("--interface={b}"))
        .args([
            "--bind-interfaces",
            "--dhcp-range=10.99.0.50,10.99.0.99,255.255.255.0,600",
            "--dhcp-authoritative",
            "--no-ping",
            "--user=root",
            "--log-dhcp",
        ])
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.path().join("leases").display()
        ))
        .arg(format!("--pid-file={}", dir.path().join("pid").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Dnsmasq {
        child,
        _ns: ns,
        dir,
    }
}

#[test]
fn bios_boots_to_the_marker_with_proxy_dhcp_beside_dnsmasq() {
    boot_to_marker("proxy", Firmware::Bios, "52:54:00:00:01:01", "bios-node");
}

#[test]
fn uefi_boots_to_the_marker_with_proxy_dhcp_beside_dnsmasq() {
    boot_to_marker("proxy", Firmware::UefiPxe, "52:54:00:00:01:02", "uefi-node");
}
