#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The start-up check with the real binary, in a network namespace the test creates (a
//! bridge `br0` with 10.99.0.1/24): each bad configuration of issue 24 (a wrong interface,
//! an address not on it, a TFTP root without the iPXE builds, installed boot images whose
//! digest does not match) is named in the log and in `/readyz` (503, on `--probe-addr`),
//! and nothing is served: no DHCP, TFTP or HTTP socket is open. Fixed while it runs, it
//! starts by itself; run with exactly the pod's capabilities (NET_BIND_SERVICE, NET_RAW),
//! it serves and its log says what DHCP receive buffer it got.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{SERVER, bridge_namespace};
use unbounded_testbed::netns::Netns;

const PROBE: &str = "127.0.0.1:8081";

struct Running {
    child: Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the bootserver in `ns` with `config`; `capabilities` limits it to those (as the
/// Deployment does), else it runs with root's.
fn start(ns: &Netns, config: &str, capabilities: Option<&str>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootserver.yaml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("log");
    let out = std::fs::File::create(&log).unwrap();
    let mut command = ns.command("setpriv");
    command.args(["--pdeathsig", "KILL"]);
    if let Some(caps) = capabilities {
        command.args(["--inh-caps=-all", &format!("--bounding-set=-all,{caps}")]);
    }
    let child = command
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_unbounded-bootserver"))
        .args(["--config"])
        .arg(&path)
        .args(["--probe-addr", PROBE])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Running {
        child,
        log,
        _dir: dir,
    }
}

/// `/readyz` on the probe address: (status, body), once the start-up check has run (the
/// probe answers from the first moment, `starting` until the check has looked).
fn readyz(ns: &Netns, server: &mut Running) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = ns
            .command("curl")
            .args([
                "-s",
                "-w",
                "\n%{http_code}",
                &format!("http://{PROBE}/readyz"),
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if let Some((body, code)) = text.rsplit_once('\n')
            && let Ok(code) = code.trim().parse::<u16>()
            && code != 0
            && body.trim() != "starting"
        {
            return (code, body.to_owned());
        }
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("the bootserver exited with {status}:\n{}", server.log());
        }
        assert!(Instant::now() < deadline, "no /readyz:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ports the namespace listens on (UDP and TCP), from `ss`.
fn listening(ns: &Netns) -> Vec<String> {
    let output = ns.exec(&["ss", "-Hlnut"]).unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .collect()
}

/// The iPXE builds the machines below ask for, from Debian's package.
fn ipxe_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["undionly.kpxe", "snponly.efi"] {
        std::fs::copy(Path::new("/usr/lib/ipxe").join(file), dir.path().join(file)).unwrap();
    }
    dir
}

fn config(interface: &str, address: &str, tftp: &Path, images: &Path) -> String {
    format!(
        r#"interface: {interface}
serverAddress: {address}
routerAdvertisements: false
dhcp: {{mode: proxy}}
tftp: {{root: "{tftp}"}}
http: {{port: 8080, imagesDir: "{images}"}}
machines:
  - {{name: bios, macs: ["52:54:00:00:00:01"], firmware: bios, boot: {{kernel: vmlinuz, initrd: initrd.img}}}}
  - {{name: uefi, macs: ["52:54:00:00:00:02"], firmware: uefi, boot: {{kernel: vmlinuz, initrd: initrd.img}}}}
"#,
        tftp = tftp.display(),
        images = images.display()
    )
}

/// Installs a small set of boot images with the real installer; returns its version.
fn install_set(images: &Path) -> String {
    let set = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (name, role, bytes) in [
        ("vmlinuz", "kernel", b"kernel".as_slice()),
        ("initrd.img", "initrd", b"initrd"),
        ("node.tar.zst", "nodeImage", b"node image"),
    ] {
        std::fs::write(set.path().join(name), bytes).unwrap();
        let sha = ring_sha256(bytes);
        files.push(format!(
            r#"{{"name":"{name}","role":"{role}","size":{},"sha256":"{sha}"}}"#,
            bytes.len()
        ));
    }
    std::fs::write(
        set.path().join("manifest.json"),
        format!(r#"{{"version":"v1","files":[{}]}}"#, files.join(",")),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_unbounded-bootserver"))
        .args(["install-images", "--from"])
        .arg(set.path())
        .arg("--to")
        .arg(images)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    "v1".into()
}

fn ring_sha256(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn each_bad_configuration_is_named_in_the_log_and_readyz_and_nothing_is_served() {
    let ns = bridge_namespace("ubpf");
    let tftp = ipxe_root();
    let empty_tftp = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let damaged_images = tempfile::tempdir().unwrap();
    let version = install_set(damaged_images.path());
    let node = damaged_images.path().join(&version).join("node.tar.zst");
    std::fs::write(&node, b"node imagf").unwrap();

    let cases = [
        (
            "a wrong interface",
            config("eth7", SERVER, tftp.path(), images.path()),
            "interface eth7 does not exist on this host (its interfaces: br0, lo)".to_owned(),
        ),
        (
            "an address not on it",
            config("br0", "10.99.0.77", tftp.path(), images.path()),
            "serverAddress 10.99.0.77 is not an address of interface br0 (its IPv4 addresses: 10.99.0.1/24)".to_owned(),
        ),
        (
            "a TFTP root without the iPXE builds",
            config("br0", SERVER, empty_tftp.path(), images.path()),
            format!(
                "tftp.root {} has no usable undionly.kpxe (missing), which BIOS machines ask for",
                empty_tftp.path().display()
            ),
        ),
        (
            "a boot image whose digest does not match",
            config("br0", SERVER, tftp.path(), damaged_images.path()),
            format!("boot images {version}: node.tar.zst has sha256 {}", ring_sha256(b"node imagf")),
        ),
    ];
    for (case, text, expected) in cases {
        let mut server = start(&ns, &text, None);
        let (code, body) = readyz(&ns, &mut server);
        assert_eq!(code, 503, "{case}: {body}");
        assert!(body.contains(&expected), "{case}: /readyz says {body:?}");
        let log = server.log();
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains(&expected)),
            "{case}: the log:\n{log}"
        );
        assert!(log.contains("not serving"), "{case}:\n{log}");
        let open = listening(&ns);
        assert_eq!(open, [PROBE.to_owned()], "{case}: only the probe listens");
    }
}

#[test]
fn a_problem_fixed_while_it_waits_lets_it_start_with_the_pods_capabilities() {
    let ns = bridge_namespace("ubpg");
    let tftp = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    install_set(images.path());
    let mut server = start(
        &ns,
        &config("br0", SERVER, tftp.path(), images.path()),
        Some("+net_bind_service,+net_raw"),
    );
    let (code, body) = readyz(&ns, &mut server);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("snponly.efi (missing), which x86-64 UEFI machines ask for"),
        "{body}"
    );

    // The operator puts the builds in place: the next check passes and everything starts.
    for file in ["undionly.kpxe", "snponly.efi"] {
        std::fs::copy(
            Path::new("/usr/lib/ipxe").join(file),
            tftp.path().join(file),
        )
        .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = readyz(&ns, &mut server);
        if code == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {code} {body}:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = server.log();
    assert!(log.contains("preflight passed"), "{log}");
    let open = listening(&ns);
    // DHCP is bound to the interface (ss shows `0.0.0.0%br0:67`).
    for expected in ["%br0:67", "%br0:4011", "10.99.0.1:69", "10.99.0.1:8080"] {
        assert!(
            open.iter().any(|o| o.ends_with(expected)),
            "{expected} in {open:?}"
        );
    }
    // Without CAP_NET_ADMIN the receive buffer is what net.core.rmem_max allows, and the
    // log says so (and what to raise).
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let expected = if rmem_max >= 4 << 20 {
        "within net.core.rmem_max".to_owned()
    } else {
        format!(
            "DHCP receive buffer: {rmem_max} of the 4194304 bytes asked; net.core.rmem_max caps it and this process lacks CAP_NET_ADMIN"
        )
    };
    assert!(log.contains(&expected), "{expected}:\n{log}");
    assert!(!log.contains("forced past net.core.rmem_max"), "{log}");
    let healthz = ns
        .exec(&["curl", "-sf", &format!("http://{SERVER}:8080/healthz")])
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&healthz.stdout), "ok\n");
}
