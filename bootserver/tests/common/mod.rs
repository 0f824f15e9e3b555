//! Shared by the bootserver's network tests: a provisioning link in network namespaces that
//! the test creates, and the bootserver binary running in the server's namespace.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // a panic is the test failure report

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use unbounded_testbed::netns::Netns;

/// The server's address on every test link.
pub const SERVER: &str = "10.99.0.1";

/// A bootserver process in a namespace, killed on drop.
pub struct Bootserver {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    log: PathBuf,
    ns_name: String,
    env: Vec<(String, String)>,
    capture: Option<Child>,
    /// Where its HTTP answers (health, metrics).
    address: String,
}

impl Bootserver {
    /// Writes `config` (with `{dir}` replaced by the server's state directory) and starts the
    /// bootserver in `ns`; waits until HTTP answers.
    pub fn start(ns: &Netns, config: &str) -> Self {
        Self::start_with_env(ns, config, &[])
    }

    /// [`Bootserver::start`] with extra environment variables (such as `KUBECONFIG`).
    pub fn start_with_env(ns: &Netns, config: &str, env: &[(&str, &str)]) -> Self {
        Self::start_at(ns, config, env, SERVER)
    }

    /// [`Bootserver::start_with_env`] for a server whose address is not [`SERVER`].
    pub fn start_at(ns: &Netns, config: &str, env: &[(&str, &str)], address: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("bootserver.yaml");
        std::fs::write(
            &config_path,
            config.replace("{dir}", &dir.path().display().to_string()),
        )
        .unwrap();
        let mut server = Self {
            child: None,
            log: dir.path().join("bootserver.log"),
            dir,
            config: config_path,
            ns_name: ns.name().to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            capture: capture(ns),
            address: address.to_owned(),
        };
        server.spawn(ns);
        server
    }

    fn spawn(&mut self, ns: &Netns) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = ns
            .command("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(env!("CARGO_BIN_EXE_unbounded-bootserver"))
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "debug")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = ns
                .exec(&[
                    "curl",
                    "-sf",
                    "-o",
                    "/dev/null",
                    &format!("http://{}:8080/healthz", self.address),
                ])
                .is_ok();
            if ok {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("bootserver exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "bootserver not up:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server with SIGKILL (a crash) and starts it again on the same state.
    pub fn crash_and_restart(&mut self, ns: &Netns) {
        self.kill();
        self.spawn(ns);
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's Prometheus metrics, fetched from inside its namespace.
    pub fn metrics(&self, ns: &Netns) -> String {
        let out = ns
            .exec(&[
                "curl",
                "-sf",
                &format!("http://{}:8080/metrics", self.address),
            ])
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn namespace(&self) -> &str {
        &self.ns_name
    }
}

impl Drop for Bootserver {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut tcpdump) = self.capture.take() {
            let _ = tcpdump.kill();
            let _ = tcpdump.wait();
        }
    }
}

/// With `UNBOUNDED_CAPTURE_DIR` set, records the DHCP, TFTP and HTTP packets of the test's
/// namespace there (one pcap per server): the fuzz targets' seed corpora are cut from such
/// captures (`bootserver/fuzz/seeds-from-pcap.py`).
fn capture(ns: &Netns) -> Option<Child> {
    let dir = std::env::var_os("UNBOUNDED_CAPTURE_DIR")?;
    std::fs::create_dir_all(&dir).unwrap();
    let file = Path::new(&dir).join(format!("{}.pcap", ns.name()));
    let child = ns
        .command("tcpdump")
        .args(["-i", "any", "--immediate-mode", "-U", "-s", "0", "-w"])
        .arg(&file)
        .args(["udp port 67 or udp port 68 or udp port 4011 or udp port 69 or udp portrange 1024-65535 or tcp port 8080"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // tcpdump writes the file's header once it captures.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&file).map_or(0, |m| m.len()) < 24 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child)
}

/// The sum of a metric's samples whose line contains `filter`.
pub fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A full-DHCP configuration for the test link; `extra_machines` is YAML list items.
pub fn full_config(images: &Path, extra_machines: &str) -> String {
    format!(
        r#"interface: pxe0
serverAddress: {SERVER}
dhcp:
  mode: full
  leaseFile: "{{dir}}/leases.log"
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.250]
      gateway: {SERVER}
      dns: [{SERVER}]
      domain: lab.test
      leaseSeconds: 600
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
machines:
  - name: node-1
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.21
    firmware: bios
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
  - name: node-2
    macs: ["52:54:00:00:00:02"]
    firmware: uefi
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}
{extra_machines}"#,
        images = images.display()
    )
}

/// A directory with a small "kernel" and "initrd" for HTTP tests (the PXE tests use the
/// real marker image instead).
pub fn fake_images() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let kernel: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("vmlinuz"), kernel).unwrap();
    std::fs::write(dir.path().join("initrd.img"), b"initrd").unwrap();
    dir
}

/// Runs busybox udhcpc once in `ns` with extra arguments; returns the environment its
/// script saw on "bound" (empty when no lease was obtained) and its output.
pub fn udhcpc(ns: &Netns, extra: &[&str]) -> (Vec<(String, String)>, String) {
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    let script = dir.path().join("script.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] && env > {}\nexit 0\n",
            env_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut args = vec![
        "busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "4", "-T", "1", "-A", "1",
    ];
    let script_arg = script.display().to_string();
    args.extend(["-s", &script_arg]);
    args.extend_from_slice(extra);
    let mut command = ns.command(args[0]);
    command.args(&args[1..]);
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let env = std::fs::read_to_string(&env_file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    (env, text)
}

pub fn get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// A namespace with a bridge `br0` holding the server's address (10.99.0.1/24): the
/// provisioning network that VMs' NICs join.
pub fn bridge_namespace(prefix: &str) -> Netns {
    let ns = Netns::new(prefix).unwrap();
    ns.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    ns.ip(&["addr", "add", &format!("{SERVER}/24"), "dev", "br0"])
        .unwrap();
    ns.ip(&["link", "set", "br0", "up"]).unwrap();
    ns
}

/// Where the local API server listens on the host's loopback (the target of a
/// [`unbounded_testbed::netns::LoopbackForward`] on the namespace's port 6443).
pub fn api_server_target(cp: &unbounded_testbed::cluster::LocalControlPlane) -> String {
    let port = cp.server_url().rsplit(':').next().unwrap_or_default();
    format!("127.0.0.1:{port}")
}

/// A kubeconfig for a process in a namespace: the admin kubeconfig pointed at
/// `https://127.0.0.1:6443`, where a forwarder to [`api_server_target`] listens.
pub fn namespace_kubeconfig(
    cp: &unbounded_testbed::cluster::LocalControlPlane,
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    std::fs::write(
        &kubeconfig,
        text.replace(cp.server_url(), "https://127.0.0.1:6443"),
    )
    .unwrap();
    (dir, kubeconfig)
}

/// A full-DHCP configuration on the bridge of [`bridge_namespace`], serving `images`;
/// `extra` (top-level keys: `backend:`, `power:`, a `machines:` list) is appended.
pub fn bridge_config(images: &Path, extra: &str) -> String {
    format!(
        r#"interface: br0
serverAddress: {SERVER}
dhcp:
  mode: full
  leaseFile: "{{dir}}/leases.log"
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.199]
      gateway: {SERVER}
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
{extra}"#,
        images = images.display()
    )
}

/// What iPXE does after a ProxyDHCP offer without a boot file: a DHCPREQUEST to the
/// bootserver's port 4011 from `ip` (its address from the other DHCP server, also in
/// `ciaddr`), with `mac` in `chaddr` and iPXE's user class, sent from inside `ns`. Returns
/// the boot file of the answer, or `None` when nothing came within 3 s.
pub fn pxe_exchange(ns: &Netns, mac: &str, ip: &str) -> Option<String> {
    use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable};
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let chaddr: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let mut request = Message::default();
    request
        .set_opcode(Opcode::BootRequest)
        .set_xid(0x5ee_d4011)
        .set_ciaddr(ip)
        .set_chaddr(&chaddr);
    let opts = request.opts_mut();
    opts.insert(DhcpOption::MessageType(MessageType::Request));
    opts.insert(DhcpOption::ServerIdentifier(SERVER.parse().unwrap()));
    opts.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00007:UNDI:003010".to_vec(),
    ));
    opts.insert(DhcpOption::ClientSystemArchitecture(
        dhcproto::v4::Architecture::from(7),
    ));
    opts.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    let bytes = request.to_vec().unwrap();
    ns.spawn_inside(move || {
        let socket = std::net::UdpSocket::bind((ip, 68)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        socket.send_to(&bytes, (SERVER, 4011)).unwrap();
        let mut buf = [0u8; 1500];
        let (len, _) = socket.recv_from(&mut buf).ok()?;
        let reply = Message::decode(&mut Decoder::new(&buf[..len])).ok()?;
        match reply.opts().get(OptionCode::BootfileName) {
            Some(DhcpOption::BootfileName(name)) => {
                Some(String::from_utf8_lossy(name).into_owned())
            }
            _ => None,
        }
    })
    .unwrap()
    .join()
    .unwrap()
    .unwrap()
}

/// A veth pair between two namespaces, named `a.1` and `b.1` there, both up.
pub fn veth(a: (&Netns, &str), b: (&Netns, &str)) {
    let (x, y) = (
        unbounded_testbed::netns::unique("va"),
        unbounded_testbed::netns::unique("vb"),
    );
    let run = |args: &[&str]| {
        let status = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "ip {args:?}");
    };
    run(&["link", "add", &x, "type", "veth", "peer", "name", &y]);
    run(&["link", "set", &x, "netns", a.0.name()]);
    run(&["link", "set", &y, "netns", b.0.name()]);
    a.0.ip(&["link", "set", &x, "name", a.1]).unwrap();
    b.0.ip(&["link", "set", &y, "name", b.1]).unwrap();
    a.0.ip(&["link", "set", a.1, "up"]).unwrap();
    b.0.ip(&["link", "set", b.1, "up"]).unwrap();
}

/// Runs ISC dhclient once on `eth0` of `ns` with this lease file and `args` before it (`-6`
/// for DHCPv6, `-D LL` …), its scripts turned off; returns its output. After binding,
/// dhclient goes to the background: it is stopped.
pub fn dhclient_once(ns: &Netns, leases: &Path, args: &[&str]) -> String {
    let pid = leases.with_extension("pid");
    let out = ns
        .command("timeout")
        .args(["60", "dhclient", "-1", "-v", "-sf", "/bin/true"])
        .args(args)
        .arg("-lf")
        .arg(leases)
        .arg("-pf")
        .arg(&pid)
        .arg("eth0")
        .output()
        .unwrap();
    if let Ok(text) = std::fs::read_to_string(&pid)
        && !text.trim().is_empty()
    {
        let _ = std::process::Command::new("kill").arg(text.trim()).status();
    }
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
