//! Two DHCP servers as a pair on one provisioning network, measured in one run: our
//! bootservers as a pair (`ha:`, docs/bootserver.md "Two bootservers on one network": each
//! allocates in its half of the pool and writes every lease to its partner before the ACK,
//! lease logs on disk and synced) against Kea 2.2's HA hook in hot-standby (the primary
//! sends every lease update to the standby and waits for its answer before the ACK; memfile
//! persisted, as the single-Kea rows). Then a storm against our pair with one server killed
//! half-way.
//!
//! The topology is `bootserver/tests/pair.rs`'s, in namespaces this run creates:
//!
//! ```text
//!  [a] pxe0 10.96.0.1 ─┐                      ┌─ pxe0 10.96.0.3 [b]
//!                       └── br0 10.96.0.2 ───┘   (the relay: dhcp-load, in "lan")
//!  [a] ha0 10.95.0.1 ──────────────────────────── ha0 10.95.0.2 [b]   (the pair's link)
//! ```
//!
//! The load is `dhcp-load` (bootserver/src/bin), a relay that sends every message to both
//! servers, as a relay with two helper addresses does (perfdhcp sends to one server only).
//! Figures:
//! - **CPU per DORA of the pair**: both servers' CPU time (each in a CPU accounting cgroup
//!   of its own, as [`super::dhcp::cost`] measures one server) over the run, summed, per
//!   acknowledged client, at fixed offered rates (`--rate`), each pair fresh for each rate;
//!   and the DORA/s each pair reaches unpaced (`--window` clients in flight), with its CPU
//!   per DORA there. A pair that loses more than 1% at a rate has no cost there.
//! - **A storm with one server killed**: our pair, `kill -9` of `a` half-way through a
//!   paced storm; every client must get an address (failures: 0), no address may be
//!   acknowledged to two clients (duplicates: 0), and the takeover time is the longest
//!   DORA (first DISCOVER to ACK, `dhcp-load --latencies-out`) of a client still waiting
//!   at the kill or started after it.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::bed::{Bed, BedError};
use super::dhcp::search::LOSS_LIMIT;
use super::peers::{LEASE_SECONDS, SERVER_IF};
use super::proc::{Daemon, ProcError, in_namespace};
use super::report::{Better, Cell, Report, Row, human};
use crate::netns::{Netns, NetnsError};

/// Server `a`'s address on the provisioning network (the lower name: the lower half).
pub const A: &str = "10.96.0.1";
/// The relay's address (dhcp-load, in the `lan` namespace; giaddr).
pub const RELAY: &str = "10.96.0.2";
/// Server `b`'s address.
pub const B: &str = "10.96.0.3";
const SUBNET: &str = "10.96.0.0/16";
const POOL: (&str, &str) = ("10.96.1.0", "10.96.255.254");
/// The pair's own link (`ha0`), `a`'s and `b`'s ends.
const LINK: (&str, &str) = ("10.95.0.1", "10.95.0.2");
/// Our pair's link port.
const OUR_LINK_PORT: u16 = 8647;
/// Kea's HA listener port (its dedicated HTTP listener on the pair's link).
const KEA_HA_PORT: u16 = 8001;
/// Our HTTP port (metrics).
const HTTP_PORT: u16 = 8080;
/// Our pair's `interruptedAfterSeconds`; Kea's `max-response-delay` is the same.
const INTERRUPTED_AFTER_SECONDS: u32 = 3;
/// How long a pair may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(60);

/// The sizes of the pair benchmark.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Offered DORA/s of the cost rows, each pair fresh for each.
    pub rates: &'static [u32],
    /// Seconds per rate.
    pub seconds: u32,
    /// Clients of the unpaced run (0: no unpaced run).
    pub unpaced_clients: u32,
    /// Clients in flight in the unpaced run.
    pub window: usize,
    /// Clients of the storm with a kill.
    pub storm_clients: u32,
    /// Their offered rate (the kill comes half-way).
    pub storm_rate: u32,
}

/// The two pairs measured, in the order they run.
const OURS: &str = "ours";
const KEA: &str = "Kea HA hot-standby";

/// `kea-dhcp4`'s hooks directory: Debian's multiarch one, else the plain one.
fn kea_hooks() -> PathBuf {
    let multiarch = PathBuf::from(format!(
        "/usr/lib/{}-linux-gnu/kea/hooks",
        std::env::consts::ARCH
    ));
    if multiarch.join("libdhcp_ha.so").exists() {
        multiarch
    } else {
        PathBuf::from("/usr/lib/kea/hooks")
    }
}

/// Which of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `a`: the lower name (ours), Kea's primary.
    A,
    /// `b`: ours' partner, Kea's standby.
    B,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }

    fn address(self) -> &'static str {
        match self {
            Side::A => A,
            Side::B => B,
        }
    }

    fn link(self) -> &'static str {
        match self {
            Side::A => LINK.0,
            Side::B => LINK.1,
        }
    }

    fn other(self) -> Self {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// Our bootserver's configuration as one of the pair: the bench's (full DHCP, leases
/// durable in `lease_file`, no router advertisements, file backend) with the `ha:` section.
/// Both servers' subnets are the same; only the addresses and names differ.
pub fn ours_config(
    side: Side,
    lease_file: &Path,
    key_file: &Path,
    tftp_root: &Path,
    images_dir: &Path,
) -> String {
    let other = side.other();
    format!(
        "interface: {SERVER_IF}
serverAddress: {address}
routerAdvertisements: false
backend: file
dhcp:
  mode: full
  leaseFile: {leases}
  subnets:
    - subnet: {SUBNET}
      pool: [{first}, {last}]
      gateway: {A}
      leaseSeconds: {LEASE_SECONDS}
tftp: {{root: {tftp}}}
http: {{port: {HTTP_PORT}, imagesDir: {images}}}
ha:
  name: {name}
  partner: {{name: {partner}, address: \"{partner_link}:{OUR_LINK_PORT}\"}}
  listen: \"{own_link}:{OUR_LINK_PORT}\"
  keyFile: {key}
  interruptedAfterSeconds: {INTERRUPTED_AFTER_SECONDS}
",
        address = side.address(),
        leases = lease_file.display(),
        first = POOL.0,
        last = POOL.1,
        tftp = tftp_root.display(),
        images = images_dir.display(),
        name = side.name(),
        partner = other.name(),
        partner_link = other.link(),
        own_link = side.link(),
        key = key_file.display(),
    )
}

/// Kea 2.2's configuration as one of a hot-standby pair (`a` primary, `b` standby): the
/// single-Kea rows' (memfile persisted, the same subnet, pool, lifetime and router) plus
/// the HA hook with `libdhcp_lease_cmds`. Without kea-ctrl-agent, Kea 2.2's HA needs
/// multi-threading (its dedicated HTTP listener on the pair's link): one packet thread, as
/// the single-Kea row that does best here, a 1,024-packet queue. Failure detection as
/// ours': no answer to heartbeats (every second) for 3 s.
pub fn kea_config(side: Side, lease_file: &Path, control_socket: &Path, hooks: &Path) -> String {
    let peer = |s: Side, role: &str| {
        format!(
            r#"{{"name": "kea-{}", "url": "http://{}:{KEA_HA_PORT}/", "role": "{role}", "auto-failover": true}}"#,
            s.name(),
            s.link()
        )
    };
    format!(
        r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["{SERVER_IF}"], "dhcp-socket-type": "udp"}},
  "control-socket": {{"socket-type": "unix", "socket-name": "{socket}"}},
  "lease-database": {{"type": "memfile", "persist": true, "name": "{leases}", "lfc-interval": 3600}},
  "multi-threading": {{"enable-multi-threading": true, "thread-pool-size": 1, "packet-queue-size": 1024}},
  "valid-lifetime": {LEASE_SECONDS},
  "hooks-libraries": [
    {{"library": "{hooks}/libdhcp_lease_cmds.so"}},
    {{"library": "{hooks}/libdhcp_ha.so", "parameters": {{"high-availability": [{{
      "this-server-name": "kea-{this}",
      "mode": "hot-standby",
      "heartbeat-delay": 1000,
      "max-response-delay": {max_response},
      "max-ack-delay": 5000,
      "max-unacked-clients": 5,
      "multi-threading": {{"enable-multi-threading": true, "http-dedicated-listener": true,
                           "http-listener-threads": 0, "http-client-threads": 0}},
      "peers": [{primary}, {standby}]
    }}]}}}}
  ],
  "subnet4": [{{"id": 1, "subnet": "{SUBNET}", "pools": [{{"pool": "{first} - {last}"}}],
               "option-data": [{{"name": "routers", "data": "{A}"}}]}}],
  "loggers": [{{"name": "kea-dhcp4", "severity": "WARN", "output_options": [{{"output": "stderr"}}]}}]
}}}}
"#,
        socket = control_socket.display(),
        leases = lease_file.display(),
        hooks = hooks.display(),
        this = side.name(),
        max_response = INTERRUPTED_AFTER_SECONDS * 1000,
        primary = peer(Side::A, "primary"),
        standby = peer(Side::B, "standby"),
        first = POOL.0,
        last = POOL.1,
    )
}

/// The namespaces: `lan` (the bridge and the relay), `a` and `b`, each server's `pxe0` in
/// the bridge and `ha0` between the two. Deleted on drop.
#[derive(Debug)]
struct Lab {
    lan: Netns,
    a: Netns,
    b: Netns,
}

impl Lab {
    fn new() -> Result<Self, NetnsError> {
        let lan = Netns::new("upl")?;
        lan.ip(&["link", "add", "br0", "type", "bridge"])?;
        lan.ip(&["addr", "add", &format!("{RELAY}/16"), "dev", "br0"])?;
        lan.ip(&["link", "set", "br0", "up"])?;
        let (a, b) = (Netns::new("upa")?, Netns::new("upb")?);
        for (ns, port, side) in [(&a, "pa", Side::A), (&b, "pb", Side::B)] {
            // Both ends made inside the namespaces: nothing appears in the host's.
            lan.ip(&[
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                SERVER_IF,
                "netns",
                ns.name(),
            ])?;
            lan.ip(&["link", "set", port, "master", "br0"])?;
            lan.ip(&["link", "set", port, "up"])?;
            ns.ip(&[
                "addr",
                "add",
                &format!("{}/16", side.address()),
                "dev",
                SERVER_IF,
            ])?;
            ns.ip(&["link", "set", SERVER_IF, "up"])?;
        }
        a.ip(&[
            "link",
            "add",
            "ha0",
            "type",
            "veth",
            "peer",
            "name",
            "ha0",
            "netns",
            b.name(),
        ])?;
        for (ns, side) in [(&a, Side::A), (&b, Side::B)] {
            ns.ip(&["addr", "add", &format!("{}/30", side.link()), "dev", "ha0"])?;
            ns.ip(&["link", "set", "ha0", "up"])?;
        }
        Ok(Self { lan, a, b })
    }

    fn ns(&self, side: Side) -> &Netns {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }
}

/// A running pair.
struct Pair {
    a: Daemon,
    b: Daemon,
}

impl Pair {
    fn cpu_seconds(&self) -> (f64, f64) {
        (self.a.tree_cpu_seconds(), self.b.tree_cpu_seconds())
    }

    fn peak_rss_mib(&self) -> (f64, f64) {
        (
            self.a.peak_rss_kib() as f64 / 1024.0,
            self.b.peak_rss_kib() as f64 / 1024.0,
        )
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BedError {
    let what = what.into();
    move |source| BedError::Io { what, source }
}

/// A fresh directory `dir/name`.
fn fresh_dir(dir: &Path, name: &str) -> Result<PathBuf, BedError> {
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
    Ok(path)
}

/// What the bench needs besides the lab: where files go and the programs.
struct Setup<'a> {
    bed: &'a Bed,
    dhcp_load: &'a Path,
    dir: PathBuf,
    key: PathBuf,
}

impl Setup<'_> {
    /// Starts our pair with fresh lease logs; ready when both say the pair is up.
    fn start_ours(&self, lab: &Lab, run: &str) -> Result<Pair, BedError> {
        let start = |side: Side| -> Result<Daemon, BedError> {
            let dir = fresh_dir(&self.dir, &format!("{run}-ours-{}", side.name()))?;
            let text = ours_config(
                side,
                &dir.join("leases.log"),
                &self.key,
                &self.bed.tftp_root,
                &self.bed.images_dir,
            );
            let config = dir.join("bootserver.yaml");
            std::fs::write(&config, text).map_err(io(format!("writing {}", config.display())))?;
            let mut command = in_namespace(lab.ns(side), &self.bed.ours.display().to_string());
            command.arg("--config").arg(&config).env("RUST_LOG", "warn");
            let mut daemon = Daemon::start(
                &format!("ours-{}", side.name()),
                command,
                &dir.join("bootserver.log"),
            )?;
            daemon.wait_listening(67, true, UP_TIMEOUT)?;
            Ok(daemon)
        };
        let mut pair = Pair {
            a: start(Side::A)?,
            b: start(Side::B)?,
        };
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let states = [
                our_state(&lab.lan, Side::A.address()),
                our_state(&lab.lan, Side::B.address()),
            ];
            if states.iter().all(|s| s == "up") {
                return Ok(pair);
            }
            for daemon in [&mut pair.a, &mut pair.b] {
                if !daemon.running() {
                    return Err(not_up(daemon, "exited before the pair was up".into()));
                }
            }
            if Instant::now() > deadline {
                return Err(not_up(
                    &pair.a,
                    format!(
                        "pair not up after {} s: a {}, b {}; b's log:\n{}",
                        UP_TIMEOUT.as_secs(),
                        states[0],
                        states[1],
                        pair.b.log_tail(20)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts Kea's hot-standby pair with fresh lease files; ready when both are in the
    /// `hot-standby` state.
    fn start_kea(&self, lab: &Lab, run: &str) -> Result<Pair, BedError> {
        let hooks = kea_hooks();
        let start = |side: Side| -> Result<(Daemon, PathBuf), BedError> {
            let dir = fresh_dir(&self.dir, &format!("{run}-kea-{}", side.name()))?;
            let socket = dir.join("control.sock");
            let text = kea_config(side, &dir.join("leases.csv"), &socket, &hooks);
            let config = dir.join("kea.json");
            std::fs::write(&config, text).map_err(io(format!("writing {}", config.display())))?;
            let mut command = in_namespace(lab.ns(side), "kea-dhcp4");
            command
                .arg("-c")
                .arg(&config)
                .env("KEA_PIDFILE_DIR", &dir)
                .env("KEA_LOCKFILE_DIR", &dir);
            let mut daemon = Daemon::start(
                &format!("kea-{}", side.name()),
                command,
                &dir.join("kea.log"),
            )?;
            daemon.wait_listening(67, true, UP_TIMEOUT)?;
            Ok((daemon, socket))
        };
        let (a, socket_a) = start(Side::A)?;
        let (b, socket_b) = start(Side::B)?;
        let mut pair = Pair { a, b };
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            let states = [kea_state(&socket_a), kea_state(&socket_b)];
            if states.iter().all(|s| s == "hot-standby") {
                return Ok(pair);
            }
            for daemon in [&mut pair.a, &mut pair.b] {
                if !daemon.running() {
                    return Err(not_up(daemon, "exited before the pair was up".into()));
                }
            }
            if Instant::now() > deadline {
                return Err(not_up(
                    &pair.a,
                    format!(
                        "HA not in hot-standby after {} s: a {}, b {}; b's log:\n{}",
                        UP_TIMEOUT.as_secs(),
                        states[0],
                        states[1],
                        pair.b.log_tail(20)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn start(&self, lab: &Lab, server: &str, run: &str) -> Result<Pair, BedError> {
        if server == OURS {
            self.start_ours(lab, run)
        } else {
            self.start_kea(lab, run)
        }
    }

    /// dhcp-load in the `lan` namespace, sending every message to both servers.
    fn load(&self, lab: &Lab, load: &Load, name: &str) -> Result<LoadOutput, BedError> {
        let mut command = in_namespace(&lab.lan, &self.dhcp_load.display().to_string());
        command.args(load.args());
        if load.files {
            command
                .arg("--leases-out")
                .arg(self.dir.join(format!("{name}-leases.txt")))
                .arg("--latencies-out")
                .arg(self.dir.join(format!("{name}-latencies.txt")));
        }
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ProcError::Start {
                program: "dhcp-load".into(),
                source,
            })?;
        parse_load_output(&command, &output)
    }
}

fn not_up(daemon: &Daemon, what: String) -> BedError {
    BedError::Proc(ProcError::NotReady {
        program: daemon.name.clone(),
        what,
        log: "its directory under the run folder".into(),
        tail: daemon.log_tail(20),
    })
}

/// One dhcp-load run.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Clients.
    pub clients: u32,
    /// New clients per second; `None`: unpaced.
    pub rate: Option<u32>,
    /// Clients in flight at most.
    pub window: usize,
    /// Seconds before a client is given up.
    pub timeout_seconds: u32,
    /// Write the leases and latencies files.
    pub files: bool,
}

impl Load {
    /// dhcp-load's arguments (without the output files).
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["--relay", RELAY, "--server", A, "--server", B, "--clients"]
            .map(str::to_owned)
            .to_vec();
        args.push(self.clients.to_string());
        args.extend(["--window".to_owned(), self.window.to_string()]);
        args.extend([
            "--timeout-seconds".to_owned(),
            self.timeout_seconds.to_string(),
        ]);
        if let Some(rate) = self.rate {
            args.extend(["--rate".to_owned(), rate.to_string()]);
        }
        args
    }
}

/// What dhcp-load printed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadOutput {
    /// Clients started.
    pub clients: u32,
    /// Clients acknowledged.
    pub acked: u32,
    /// NAKs.
    pub naks: u32,
    /// Clients given up.
    pub lost: u32,
    /// Seconds from the first DISCOVER to the last answer or give-up.
    pub seconds: f64,
}

impl LoadOutput {
    /// Clients without an address.
    pub fn failed(&self) -> u32 {
        self.clients.saturating_sub(self.acked)
    }

    /// The share of clients without an address.
    pub fn loss(&self) -> f64 {
        if self.clients == 0 {
            return 1.0;
        }
        f64::from(self.failed()) / f64::from(self.clients)
    }

    /// Acknowledged clients per second.
    pub fn dora_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            f64::from(self.acked) / self.seconds
        } else {
            0.0
        }
    }
}

/// dhcp-load's summary line (`clients=… acked=… naks=… lost=… seconds=… dora_per_second=…`).
pub fn parse_load(text: &str) -> Option<LoadOutput> {
    let line = text.lines().rev().find(|l| l.starts_with("clients="))?;
    let fields: HashMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect();
    let int = |k: &str| fields.get(k)?.parse::<u32>().ok();
    Some(LoadOutput {
        clients: int("clients")?,
        acked: int("acked")?,
        naks: int("naks")?,
        lost: int("lost")?,
        seconds: fields.get("seconds")?.parse().ok()?,
    })
}

fn parse_load_output(
    command: &Command,
    output: &std::process::Output,
) -> Result<LoadOutput, BedError> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    // It exits 1 when some client got no address: a figure, not an error.
    match (output.status.code(), parse_load(&stdout)) {
        (Some(0 | 1), Some(parsed)) => Ok(parsed),
        _ => Err(ProcError::Failed {
            command: format!("{command:?}"),
            status: output.status.to_string(),
            output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
        }
        .into()),
    }
}

/// `GET http://<address>:8080<path>` from inside `ns`; the body, or empty on any failure.
fn http_get(ns: &Netns, address: &str, path: &str) -> String {
    let target = format!("{address}:{HTTP_PORT}");
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let Ok(handle) = ns.spawn_inside(move || -> std::io::Result<String> {
        let addr: std::net::SocketAddr = target.parse().map_err(std::io::Error::other)?;
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(request.as_bytes())?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    }) else {
        return String::new();
    };
    match handle.join() {
        Ok(Ok(Ok(text))) => text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The pair's state a server of ours reports (`unbounded_bootserver_pair_state{state=…} 1`),
/// or `none`.
fn our_state(lan: &Netns, address: &str) -> String {
    pair_state(&http_get(lan, address, "/metrics"))
}

/// The state whose `unbounded_bootserver_pair_state` is 1 in a metrics text, or `none`.
pub fn pair_state(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with("unbounded_bootserver_pair_state{"))
        .find(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(1.0))
        .and_then(|l| l.split("state=\"").nth(1)?.split('"').next())
        .unwrap_or("none")
        .to_owned()
}

/// A Kea server's HA state (`ha-heartbeat` on its control socket), or `none`.
fn kea_state(socket: &Path) -> String {
    kea_command(socket, r#"{"command": "ha-heartbeat"}"#)
        .ok()
        .and_then(|answer| answer["arguments"]["state"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "none".into())
}

/// One command on a Kea control socket; its JSON answer.
fn kea_command(socket: &Path, command: &str) -> std::io::Result<serde_json::Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Kea may keep the connection open: the answer ends when it parses.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&answer) {
            return Ok(value);
        }
        match stream.read(&mut chunk)? {
            0 => return serde_json::from_slice(&answer).map_err(std::io::Error::other),
            n => answer.extend_from_slice(chunk.get(..n).unwrap_or_default()),
        }
    }
}

/// What one pair spent on one load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairStep {
    /// What dhcp-load saw.
    pub load: LoadOutput,
    /// `a`'s and `b`'s CPU time over the run, seconds.
    pub cpu_seconds: (f64, f64),
    /// `a`'s and `b`'s peak resident memory, MiB.
    pub peak_rss_mib: (f64, f64),
}

impl PairStep {
    /// Both servers' CPU µs per acknowledged client; `None` without one.
    pub fn cpu_us_per_dora(&self) -> Option<f64> {
        (self.load.acked > 0)
            .then(|| (self.cpu_seconds.0 + self.cpu_seconds.1) * 1e6 / f64::from(self.load.acked))
    }

    fn summary(&self) -> String {
        format!(
            "{} DORA/s; CPU a {:.2} s + b {:.2} s; peak RSS {:.0} + {:.0} MiB",
            human(self.load.dora_per_second()),
            self.cpu_seconds.0,
            self.cpu_seconds.1,
            self.peak_rss_mib.0,
            self.peak_rss_mib.1
        )
    }

    /// The cost cell: none when more than 1% of the clients got no address.
    pub fn cost_cell(&self) -> Cell {
        match self.cpu_us_per_dora() {
            Some(us) if self.load.loss() < LOSS_LIMIT => Cell::with_note(us, self.summary()),
            Some(us) => Cell::with_note(
                f64::NAN,
                format!(
                    "above its knee: {:.1}% of clients without an address, {us:.0} µs per completed DORA",
                    self.load.loss() * 100.0
                ),
            ),
            None => Cell::with_note(f64::NAN, "no ACK"),
        }
    }

    /// The throughput cell, its CPU per DORA in the note.
    pub fn rate_cell(&self) -> Cell {
        Cell::with_note(
            self.load.dora_per_second(),
            format!(
                "{:.1}% without an address; {} µs CPU per DORA, a {:.2} s + b {:.2} s",
                self.load.loss() * 100.0,
                human(self.cpu_us_per_dora().unwrap_or(f64::NAN)),
                self.cpu_seconds.0,
                self.cpu_seconds.1
            ),
        )
    }
}

fn measure(
    setup: &Setup<'_>,
    lab: &Lab,
    server: &str,
    run: &str,
    load: &Load,
    say: &dyn Fn(String),
) -> Result<PairStep, BedError> {
    let pair = setup.start(lab, server, run)?;
    let before = pair.cpu_seconds();
    let out = setup.load(lab, load, &format!("{run}-{}", super::report::slug(server)))?;
    let after = pair.cpu_seconds();
    let step = PairStep {
        load: out,
        cpu_seconds: (after.0 - before.0, after.1 - before.1),
        peak_rss_mib: pair.peak_rss_mib(),
    };
    drop(pair);
    say(format!(
        "pair {server} {run}: {} of {} clients acknowledged ({} NAKs, {} given up) in {:.1} s; {}; {} µs per DORA",
        out.acked,
        out.clients,
        out.naks,
        out.lost,
        out.seconds,
        step.summary(),
        human(step.cpu_us_per_dora().unwrap_or(f64::NAN)),
    ));
    Ok(step)
}

/// What the storm with a kill found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KillVerdict {
    /// Addresses acknowledged to more than one client.
    pub duplicates: usize,
    /// Clients acknowledged.
    pub acked: usize,
    /// The longest DORA of a client done before the kill, seconds.
    pub before_max: f64,
    /// Clients in flight at the kill (began before it, acknowledged after it).
    pub in_flight: usize,
    /// The longest DORA of those, seconds.
    pub in_flight_max: f64,
    /// The longest DORA of a client that finished after the kill (in flight at it, or
    /// started after it), seconds: the takeover time.
    pub takeover: f64,
    /// Clients acknowledged after the kill.
    pub acked_after: usize,
}

/// Judges the storm: `leases` are `<mac> <ip>` lines, `latencies` `<mac> <began µs> <acked
/// µs>` lines, `kill_us` the kill's wall clock (µs since the epoch).
pub fn judge_kill(leases: &str, latencies: &str, kill_us: u128) -> KillVerdict {
    let mut holders: HashMap<&str, std::collections::HashSet<&str>> = HashMap::new();
    let mut acked = 0;
    for (mac, ip) in leases.lines().filter_map(|l| l.split_once(' ')) {
        acked += 1;
        holders.entry(ip.trim()).or_default().insert(mac);
    }
    let duplicates = holders.values().filter(|macs| macs.len() > 1).count();
    let mut verdict = KillVerdict {
        duplicates,
        acked,
        ..KillVerdict::default()
    };
    for line in latencies.lines() {
        let mut fields = line.split_whitespace().skip(1);
        let (Some(Ok(began)), Some(Ok(done))) = (
            fields.next().map(str::parse::<u128>),
            fields.next().map(str::parse::<u128>),
        ) else {
            continue;
        };
        let seconds = done.saturating_sub(began) as f64 / 1e6;
        if done < kill_us {
            verdict.before_max = verdict.before_max.max(seconds);
            continue;
        }
        verdict.acked_after += 1;
        verdict.takeover = verdict.takeover.max(seconds);
        if began < kill_us {
            verdict.in_flight += 1;
            verdict.in_flight_max = verdict.in_flight_max.max(seconds);
        }
    }
    verdict
}

fn now_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The storm against our pair with `a` killed half-way.
fn kill_storm(
    setup: &Setup<'_>,
    lab: &Lab,
    plan: &Plan,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let mut pair = setup.start_ours(lab, "kill")?;
    let load = Load {
        clients: plan.storm_clients,
        rate: Some(plan.storm_rate),
        // Room for every client: the pace holds while the survivor takes over.
        window: plan.storm_clients as usize,
        timeout_seconds: 40,
        files: true,
    };
    let half = Duration::from_secs_f64(
        f64::from(plan.storm_clients) / f64::from(plan.storm_rate.max(1)) / 2.0,
    );
    say(format!(
        "pair kill: {} clients at {}/s to both; kill -9 of a after {:.1} s",
        plan.storm_clients,
        plan.storm_rate,
        half.as_secs_f64()
    ));
    let name = "kill-ours";
    let mut command = in_namespace(&lab.lan, &setup.dhcp_load.display().to_string());
    command
        .args(load.args())
        .arg("--leases-out")
        .arg(setup.dir.join(format!("{name}-leases.txt")))
        .arg("--latencies-out")
        .arg(setup.dir.join(format!("{name}-latencies.txt")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().map_err(|source| ProcError::Start {
        program: "dhcp-load".into(),
        source,
    })?;
    std::thread::sleep(half);
    let survivor_before = our_state(&lab.lan, B);
    let kill_us = now_us();
    pair.a.kill_hard();
    let output = child.wait_with_output().map_err(|source| ProcError::Io {
        what: "waiting for dhcp-load".into(),
        source,
    })?;
    let out = parse_load_output(&command, &output)?;
    let survivor_after = our_state(&lab.lan, B);
    drop(pair);
    let read = |what: &str| {
        let path = setup.dir.join(format!("{name}-{what}.txt"));
        std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))
    };
    let verdict = judge_kill(&read("leases")?, &read("latencies")?, kill_us);
    let failed = out.failed();
    for (key, value) in [
        ("clients", f64::from(out.clients)),
        ("failed", f64::from(failed)),
        ("duplicates", verdict.duplicates as f64),
        ("before_max_s", verdict.before_max),
        ("in_flight", verdict.in_flight as f64),
        ("in_flight_max_s", verdict.in_flight_max),
        ("acked_after_kill", verdict.acked_after as f64),
        ("seconds", out.seconds),
    ] {
        report.figure(format!("pair.kill.ours.{key}"), value);
    }
    let in_flight = match verdict.in_flight {
        0 => "none in flight at the kill".to_owned(),
        n => format!(
            "{n} in flight at the kill, the longest {:.2} s",
            verdict.in_flight_max
        ),
    };
    let note = format!(
        "{failed} of {} clients without an address, {} addresses acknowledged to two clients; longest DORA before the kill {:.2} s; {} clients acknowledged after it, {in_flight}; the survivor {survivor_before} before the kill, {survivor_after} after the storm",
        human(f64::from(out.clients)),
        verdict.duplicates,
        verdict.before_max,
        verdict.acked_after,
    );
    say(format!(
        "pair kill: takeover {:.2} s; {note}",
        verdict.takeover
    ));
    if failed > 0 {
        report.problem(format!(
            "pair: {failed} clients got no address in the storm with a kill"
        ));
    }
    if verdict.duplicates > 0 {
        report.problem(format!(
            "pair: {} addresses acknowledged to two clients in the storm with a kill",
            verdict.duplicates
        ));
    }
    report.rows.push(Row {
        mode: "pair",
        case: "kill".into(),
        what: format!(
            "storm of {} clients at {}/s to both, kill -9 of one server half-way: takeover (the longest DORA of a client the kill touched)",
            human(f64::from(plan.storm_clients)),
            plan.storm_rate
        ),
        metric: "takeover_s",
        unit: "s",
        ours: Some(Cell::with_note(verdict.takeover, note)),
        peers: Vec::new(),
        better: Better::Lower,
        target: None,
    });
    Ok(())
}

/// Runs the pair benchmark: the cost rows at each rate and unpaced (ours and Kea's pair,
/// each fresh for each), then the storm with a kill (ours).
pub fn run(
    bed: &Bed,
    dhcp_load: &Path,
    plan: &Plan,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let dir = fresh_dir(&bed.dir, "pair")?;
    let key = dir.join("pair.key");
    // The pair's shared key: 32 random bytes in hex (both servers read the same file).
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(io("reading /dev/urandom"))?;
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&key, format!("{hex}\n")).map_err(io(format!("writing {}", key.display())))?;
    let setup = Setup {
        bed,
        dhcp_load,
        dir,
        key,
    };
    say("pair: creating the namespaces (a bridge, two servers, the pair's link)".into());
    let lab = Lab::new()?;
    let mut rows: Vec<Row> = plan
        .rates
        .iter()
        .map(|rate| Row {
            mode: "pair",
            case: format!("cpu_{rate}"),
            what: format!(
                "server CPU per DORA, both servers of the pair summed, at {rate}/s offered, dhcp-load relay to both, {} s",
                plan.seconds
            ),
            metric: "cpu_us_per_dora",
            unit: "µs",
            ours: None,
            peers: Vec::new(),
            better: Better::Lower,
            // docs/bootserver.md: a pair of ours no worse than Kea's pair.
            target: Some(1.0),
        })
        .collect();
    let mut unpaced = Row {
        mode: "pair",
        case: "unpaced".into(),
        what: format!(
            "DORA/s of the pair, dhcp-load relay to both, {} clients, {} in flight",
            human(f64::from(plan.unpaced_clients)),
            plan.window
        ),
        metric: "dora_per_s",
        unit: "DORA/s",
        ours: None,
        peers: Vec::new(),
        better: Better::Higher,
        target: None,
    };
    for server in [OURS, KEA] {
        let key = super::report::slug(server);
        for (row, rate) in rows.iter_mut().zip(plan.rates) {
            let load = Load {
                clients: rate * plan.seconds,
                rate: Some(*rate),
                window: 4096,
                timeout_seconds: 5,
                files: false,
            };
            let step = measure(&setup, &lab, server, &format!("r{rate}"), &load, say)?;
            report.figure(
                format!("pair.cpu_{rate}.{key}.loss_percent"),
                step.load.loss() * 100.0,
            );
            report.figure(
                format!("pair.cpu_{rate}.{key}.dora_per_s"),
                step.load.dora_per_second(),
            );
            let cell = step.cost_cell();
            if server == OURS {
                row.ours = Some(cell);
            } else {
                row.peers.push((server.to_owned(), cell));
            }
        }
        if plan.unpaced_clients > 0 {
            let load = Load {
                clients: plan.unpaced_clients,
                rate: None,
                window: plan.window,
                timeout_seconds: 5,
                files: false,
            };
            let step = measure(&setup, &lab, server, "unpaced", &load, say)?;
            report.figure(
                format!("pair.unpaced.{key}.cpu_us_per_dora"),
                step.cpu_us_per_dora().unwrap_or(f64::NAN),
            );
            report.figure(
                format!("pair.unpaced.{key}.loss_percent"),
                step.load.loss() * 100.0,
            );
            let cell = step.rate_cell();
            if server == OURS {
                unpaced.ours = Some(cell);
            } else {
                unpaced.peers.push((server.to_owned(), cell));
            }
        }
    }
    report.rows.extend(rows);
    if plan.unpaced_clients > 0 {
        report.rows.push(unpaced);
    }
    kill_storm(&setup, &lab, plan, report, say)?;
    report.note(format!(
        "pair: each server in a network namespace of its own on one bridge, the pair's link on a veth of its own; dhcp-load (a relay) sends every message to both; ours with its lease logs on disk, synced before each ACK, `interruptedAfterSeconds: {INTERRUPTED_AFTER_SECONDS}`; Kea 2.2 with libdhcp_ha (hot-standby, HA+MT, heartbeat 1 s, max-response-delay {INTERRUPTED_AFTER_SECONDS} s) and libdhcp_lease_cmds, memfile persisted, 1 packet thread"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_pair_configurations_differ_only_in_who_is_who() {
        let config = |side| {
            ours_config(
                side,
                Path::new("/r/leases.log"),
                Path::new("/r/pair.key"),
                Path::new("/r/tftp"),
                Path::new("/r/images"),
            )
        };
        let (a, b) = (config(Side::A), config(Side::B));
        for expected in [
            "serverAddress: 10.96.0.1\n",
            "  name: a\n",
            "  partner: {name: b, address: \"10.95.0.2:8647\"}\n",
            "  listen: \"10.95.0.1:8647\"\n",
            "  keyFile: /r/pair.key\n",
            "  interruptedAfterSeconds: 3\n",
            "  mode: full\n",
            "      pool: [10.96.1.0, 10.96.255.254]\n",
        ] {
            assert!(a.contains(expected), "{expected:?} in\n{a}");
        }
        assert!(b.contains("  partner: {name: a, address: \"10.95.0.1:8647\"}\n"));
        assert!(b.contains("serverAddress: 10.96.0.3\n"));
        // The subnets are the same on both.
        let subnets = |text: &str| {
            text.split("subnets:")
                .nth(1)
                .and_then(|s| s.split("tftp:").next())
                .map(str::to_owned)
        };
        assert_eq!(subnets(&a), subnets(&b));
        assert!(!a.contains("dhcp6"));
    }

    #[test]
    fn kea_configurations_are_a_hot_standby_pair_with_persisted_leases() {
        let parse = |side| {
            let text = kea_config(
                side,
                Path::new("/r/leases.csv"),
                Path::new("/r/control.sock"),
                Path::new("/hooks"),
            );
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{e}\n{text}"))
        };
        let (a, b) = (parse(Side::A), parse(Side::B));
        let dhcp = &a["Dhcp4"];
        assert_eq!(dhcp["lease-database"]["persist"], true);
        assert_eq!(dhcp["multi-threading"]["enable-multi-threading"], true);
        assert_eq!(dhcp["multi-threading"]["thread-pool-size"], 1);
        assert_eq!(dhcp["control-socket"]["socket-name"], "/r/control.sock");
        let hooks = dhcp["hooks-libraries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(hooks[0]["library"], "/hooks/libdhcp_lease_cmds.so");
        assert_eq!(hooks[1]["library"], "/hooks/libdhcp_ha.so");
        let ha = &hooks[1]["parameters"]["high-availability"][0];
        assert_eq!(ha["mode"], "hot-standby");
        assert_eq!(ha["this-server-name"], "kea-a");
        assert_eq!(ha["max-response-delay"], 3000);
        assert_eq!(ha["multi-threading"]["http-dedicated-listener"], true);
        assert_eq!(ha["peers"][0]["role"], "primary");
        assert_eq!(ha["peers"][0]["url"], "http://10.95.0.1:8001/");
        assert_eq!(ha["peers"][1]["role"], "standby");
        let ha_b = &b["Dhcp4"]["hooks-libraries"][1]["parameters"]["high-availability"][0];
        assert_eq!(ha_b["this-server-name"], "kea-b");
        assert_eq!(ha_b["peers"], ha["peers"]);
    }

    #[test]
    fn dhcp_load_sends_to_both_paced_or_not() {
        let mut load = Load {
            clients: 20_000,
            rate: Some(2000),
            window: 4096,
            timeout_seconds: 5,
            files: false,
        };
        assert_eq!(
            load.args().join(" "),
            "--relay 10.96.0.2 --server 10.96.0.1 --server 10.96.0.3 --clients 20000 --window 4096 --timeout-seconds 5 --rate 2000"
        );
        load.rate = None;
        assert!(!load.args().iter().any(|a| a == "--rate"));
    }

    #[test]
    fn the_load_summary_is_parsed_and_judged() {
        let out = parse_load(
            "clients=20000 acked=19900 naks=0 lost=100 seconds=10.00 dora_per_second=1990\n",
        )
        .unwrap_or_default();
        assert_eq!(out.failed(), 100);
        assert!((out.loss() - 0.005).abs() < 1e-9);
        assert!((out.dora_per_second() - 1990.0).abs() < 1e-9);
        assert_eq!(parse_load("garbage"), None);
        let step = PairStep {
            load: out,
            cpu_seconds: (1.0, 0.99),
            peak_rss_mib: (20.0, 21.0),
        };
        assert!((step.cost_cell().value - 100.0).abs() < 1e-9);
        let lossy = PairStep {
            load: LoadOutput {
                acked: 19_000,
                ..out
            },
            ..step
        };
        assert!(lossy.cost_cell().value.is_nan());
        assert!(lossy.cost_cell().note.starts_with("above its knee: 5.0%"));
    }

    #[test]
    fn the_pair_state_is_the_one_set_to_one() {
        let metrics = "# HELP x\nunbounded_bootserver_pair_state{state=\"up\"} 1\nunbounded_bootserver_pair_state{state=\"interrupted\"} 0\n";
        assert_eq!(pair_state(metrics), "up");
        let interrupted = "unbounded_bootserver_pair_state{state=\"up\"} 0\nunbounded_bootserver_pair_state{state=\"interrupted\"} 1\n";
        assert_eq!(pair_state(interrupted), "interrupted");
        assert_eq!(pair_state(""), "none");
    }

    #[test]
    fn the_kill_is_judged_by_addresses_and_waits() {
        let leases = "02:00:00:00:00:01 10.96.1.1\n02:00:00:00:00:02 10.96.1.2\n02:00:00:00:00:03 10.96.1.2\n";
        let latencies = "02:00:00:00:00:01 1000000 1001000\n02:00:00:00:00:02 1500000 5500000\n02:00:00:00:00:03 3000000 3100000\n";
        let verdict = judge_kill(leases, latencies, 2_000_000);
        assert_eq!(verdict.duplicates, 1);
        assert_eq!(verdict.acked, 3);
        assert!((verdict.before_max - 0.001).abs() < 1e-9);
        assert_eq!(verdict.in_flight, 1);
        assert!((verdict.in_flight_max - 4.0).abs() < 1e-9);
        assert!((verdict.takeover - 4.0).abs() < 1e-9);
        assert_eq!(verdict.acked_after, 2);
    }
}
