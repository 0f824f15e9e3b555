//! The servers compared, each as people would run it, and their configurations (pure
//! functions of a [`Net`] (and, for DHCPv6, a [`Net6`]) and paths, tested below): ours;
//! Kea 2.2 (memfile, leases persisted, single- or multi-threaded; `kea-dhcp4`, and
//! `kea-dhcp6` for the v6 rows); dnsmasq (DHCP with `no-ping`, or TFTP only); tftpd-hpa;
//! nginx with `sendfile`. [`install`] installs the peers and clients from
//! Debian's packages (`scripts/install-bench-deps.sh`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use super::proc::ProcError;

const INSTALL_SCRIPT: &str = include_str!("../../../scripts/install-bench-deps.sh");

/// Installs what is missing of Kea (DHCPv4 and DHCPv6), perfdhcp, dnsmasq, tftpd-hpa, nginx, atftp and wrk
/// (without starting their services on the host).
pub fn install() -> Result<(), ProcError> {
    let mut child = Command::new("bash")
        .arg("-s")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| ProcError::Start {
            program: "install-bench-deps.sh".into(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(INSTALL_SCRIPT.as_bytes())
            .map_err(|source| ProcError::Io {
                what: "feeding install-bench-deps.sh".into(),
                source,
            })?;
    }
    let status = child.wait().map_err(|source| ProcError::Io {
        what: "running install-bench-deps.sh".into(),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(ProcError::Failed {
            command: "scripts/install-bench-deps.sh".into(),
            status: status.to_string(),
            output: "see its output above".into(),
        })
    }
}

/// The benchmark link: the server side, the client side (load generators, relay address)
/// and the DHCP pool, all in one /16 that nothing else on the machine uses.
#[derive(Debug, Clone, Copy)]
pub struct Net {
    /// The server's address.
    pub server: &'static str,
    /// The client side's address (perfdhcp's relay address, giaddr).
    pub client: &'static str,
    /// The subnet.
    pub subnet: &'static str,
    /// Its netmask.
    pub netmask: &'static str,
    /// The pool's first and last address (65,279 addresses, more than the 50,000 clients).
    pub pool: (&'static str, &'static str),
    /// The HTTP port of every HTTP server.
    pub http_port: u16,
}

/// The one benchmark network.
pub const NET: Net = Net {
    server: "10.97.0.1",
    client: "10.97.0.2",
    subnet: "10.97.0.0/16",
    netmask: "255.255.0.0",
    pool: ("10.97.1.0", "10.97.255.254"),
    http_port: 8080,
};

/// The server's interface in its namespace (`netns::Link`).
pub const SERVER_IF: &str = "pxe0";

/// The client's interface in its namespace (`netns::Link`): perfdhcp -6 sends from its
/// link-local address.
pub const CLIENT_IF: &str = "eth0";

/// The IPv6 side of the benchmark link: no relay (perfdhcp -6 sends to `ff02::1:2` from
/// the client's link-local address, as a client on the link does), so the servers choose
/// the prefix by the interface the Solicit came in on.
#[derive(Debug, Clone, Copy)]
pub struct Net6 {
    /// The server's address on [`SERVER_IF`] (added without duplicate address detection).
    pub server: &'static str,
    /// The prefix.
    pub prefix: &'static str,
    /// The pool's first and last address (2^32 - 2^16 addresses: far more than the
    /// simulated clients, so that neither server's allocation ever searches a full pool).
    pub pool: (&'static str, &'static str),
}

/// The one IPv6 benchmark network.
pub const NET6: Net6 = Net6 {
    server: "fd00:99::1",
    prefix: "fd00:99::/64",
    pool: ("fd00:99::1:0", "fd00:99::ffff:ffff"),
};

/// Preferred lifetime of a DHCPv6 address (as [`LEASE_SECONDS`]); the valid lifetime is
/// twice it (ours' default).
pub const PREFERRED_SECONDS: u32 = LEASE_SECONDS;

/// Lease time given by every DHCP server (long enough never to expire during a run).
pub const LEASE_SECONDS: u32 = 3600;

/// One machine our bootserver knows (the iPXE script route and the boot storm).
#[derive(Debug, Clone)]
pub struct BenchMachine {
    /// Its name.
    pub name: String,
    /// Its MAC, `aa:bb:…`.
    pub mac: String,
}

/// Our bootserver's configuration: full DHCP with durable leases on the benchmark subnet,
/// TFTP from `tftp_root`, HTTP images from `images_dir`, the given machines (BIOS, booting
/// `vmlinuz` and `initrd.img`), no router advertisements (nothing on the link needs them).
pub fn ours_config(
    net: &Net,
    lease_file: &Path,
    tftp_root: &Path,
    images_dir: &Path,
    machines: &[BenchMachine],
) -> String {
    let mut out = format!(
        "interface: {SERVER_IF}
serverAddress: {server}
routerAdvertisements: false
backend: file
dhcp:
  mode: full
  leaseFile: {leases}
  subnets:
    - subnet: {subnet}
      pool: [{first}, {last}]
      gateway: {server}
      leaseSeconds: {LEASE_SECONDS}
tftp: {{root: {tftp}}}
http: {{port: {port}, imagesDir: {images}}}
",
        server = net.server,
        leases = lease_file.display(),
        subnet = net.subnet,
        first = net.pool.0,
        last = net.pool.1,
        tftp = tftp_root.display(),
        port = net.http_port,
        images = images_dir.display(),
    );
    if machines.is_empty() {
        return out;
    }
    out.push_str("machines:\n");
    for m in machines {
        let _ = writeln!(
            out,
            "  - {{name: {}, macs: [\"{}\"], firmware: bios, boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}}}}",
            m.name, m.mac
        );
    }
    out
}

/// Our bootserver's `dhcp6:` section (appended to [`ours_config`]): full DHCPv6 on
/// [`SERVER_IF`] with the prefix and pool of `net6`, our address as the DNS server (as
/// Kea's `dns-servers`), lifetimes as Kea's. Rapid Commit stays on, as shipped: perfdhcp
/// does not ask for it, so every exchange is the four messages.
pub fn ours_dhcp6_section(net6: &Net6) -> String {
    format!(
        "dhcp6:
  mode: full
  serverAddress: {server}
  subnets:
    - prefix: {prefix}
      pool: [{first}, {last}]
      dns: [{server}]
      preferredSeconds: {PREFERRED_SECONDS}
      validSeconds: {valid}
",
        server = net6.server,
        prefix = net6.prefix,
        first = net6.pool.0,
        last = net6.pool.1,
        valid = 2 * PREFERRED_SECONDS,
    )
}

/// Kea's threading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeaThreads {
    /// Kea's default on 2.2: one thread.
    Single,
    /// `enable-multi-threading` with this many threads.
    Multi(u32),
}

/// Kea 2.2's configuration: memfile with the lease file persisted, relayed clients of the
/// benchmark subnet, a 1,024-packet queue when multi-threaded (with the default of 64 it
/// drops packets at 3,000/s, TESTBED-NOTES.md), lease file cleanup hourly (never during a
/// run), warnings only.
pub fn kea_config(net: &Net, lease_file: &Path, threads: KeaThreads) -> String {
    let threading = match threads {
        KeaThreads::Single => r#"{"enable-multi-threading": false}"#.to_owned(),
        KeaThreads::Multi(n) => format!(
            r#"{{"enable-multi-threading": true, "thread-pool-size": {n}, "packet-queue-size": 1024}}"#
        ),
    };
    format!(
        r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["{SERVER_IF}"], "dhcp-socket-type": "udp"}},
  "lease-database": {{"type": "memfile", "persist": true, "name": "{leases}", "lfc-interval": 3600}},
  "multi-threading": {threading},
  "valid-lifetime": {LEASE_SECONDS},
  "subnet4": [{{"id": 1, "subnet": "{subnet}", "pools": [{{"pool": "{first} - {last}"}}],
               "option-data": [{{"name": "routers", "data": "{server}"}}]}}],
  "loggers": [{{"name": "kea-dhcp4", "severity": "WARN", "output_options": [{{"output": "stderr"}}]}}]
}}}}
"#,
        leases = lease_file.display(),
        subnet = net.subnet,
        first = net.pool.0,
        last = net.pool.1,
        server = net.server,
    )
}

/// Kea 2.2's DHCPv6 configuration, the v6 twin of [`kea_config`]: memfile with the lease
/// file persisted, the prefix on [`SERVER_IF`] (`interface`: clients on the link, not
/// relayed), the same pool, lifetimes and DNS option as ours, its server DUID kept in
/// `data_dir` (not in `/var/lib/kea`), warnings only.
pub fn kea6_config(net6: &Net6, lease_file: &Path, data_dir: &Path, threads: KeaThreads) -> String {
    let threading = match threads {
        KeaThreads::Single => r#"{"enable-multi-threading": false}"#.to_owned(),
        KeaThreads::Multi(n) => format!(
            r#"{{"enable-multi-threading": true, "thread-pool-size": {n}, "packet-queue-size": 1024}}"#
        ),
    };
    format!(
        r#"{{"Dhcp6": {{
  "interfaces-config": {{"interfaces": ["{SERVER_IF}"]}},
  "data-directory": "{data}",
  "lease-database": {{"type": "memfile", "persist": true, "name": "{leases}", "lfc-interval": 3600}},
  "multi-threading": {threading},
  "preferred-lifetime": {PREFERRED_SECONDS},
  "valid-lifetime": {valid},
  "subnet6": [{{"id": 1, "subnet": "{prefix}", "interface": "{SERVER_IF}",
               "pools": [{{"pool": "{first} - {last}"}}],
               "option-data": [{{"name": "dns-servers", "data": "{server}"}}]}}],
  "loggers": [{{"name": "kea-dhcp6", "severity": "WARN", "output_options": [{{"output": "stderr"}}]}}]
}}}}
"#,
        data = data_dir.display(),
        leases = lease_file.display(),
        valid = 2 * PREFERRED_SECONDS,
        prefix = net6.prefix,
        first = net6.pool.0,
        last = net6.pool.1,
        server = net6.server,
    )
}

/// dnsmasq as a DHCP server only (no DNS: `port=0`), with `no-ping` (its default pings
/// each address before offering it: under 10 DORA/s), room for every simulated client, and
/// its lease file.
pub fn dnsmasq_dhcp_args(net: &Net, lease_file: &Path, pid_file: &Path) -> Vec<String> {
    let mut args = dnsmasq_common(pid_file);
    args.extend([
        format!(
            "--dhcp-range={},{},{},{LEASE_SECONDS}",
            net.pool.0, net.pool.1, net.netmask
        ),
        format!("--dhcp-leasefile={}", lease_file.display()),
        "--dhcp-lease-max=100000".into(),
        "--dhcp-authoritative".into(),
        "--no-ping".into(),
        format!("--interface={SERVER_IF}"),
        "--bind-interfaces".into(),
    ]);
    args
}

/// dnsmasq as a TFTP server only.
pub fn dnsmasq_tftp_args(net: &Net, root: &Path, pid_file: &Path) -> Vec<String> {
    let mut args = dnsmasq_common(pid_file);
    args.extend([
        "--enable-tftp".into(),
        format!("--tftp-root={}", root.display()),
        format!("--listen-address={}", net.server),
        "--bind-interfaces".into(),
    ]);
    args
}

fn dnsmasq_common(pid_file: &Path) -> Vec<String> {
    vec![
        "--keep-in-foreground".into(),
        "--conf-file=/dev/null".into(),
        "--port=0".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--user=root".into(),
        "--log-facility=-".into(),
        format!("--pid-file={}", pid_file.display()),
    ]
}

/// tftpd-hpa in the foreground, confined to `root` (`-s`), on the server address.
pub fn tftpd_args(net: &Net, root: &Path) -> Vec<String> {
    vec![
        "--foreground".into(),
        "--secure".into(),
        "--user".into(),
        "root".into(),
        "--address".into(),
        format!("{}:69", net.server),
        root.display().to_string(),
    ]
}

/// nginx as it serves static files: `sendfile`, `tcp_nopush`, `tcp_nodelay`, one worker
/// per core, no access log, keep-alive without a request limit. Its workers run as root, as
/// ours does: the files live under the bench's own directory, which may be private
/// (`mktemp -d` makes it 0700), and www-data could not read them.
pub fn nginx_config(net: &Net, root: &Path, run_dir: &Path) -> String {
    let run = run_dir.display();
    format!(
        "user root;
worker_processes auto;
daemon off;
pid {run}/nginx.pid;
error_log {run}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 10000000;
  default_type application/octet-stream;
  client_body_temp_path {run}/tmp-body;
  proxy_temp_path {run}/tmp-proxy;
  fastcgi_temp_path {run}/tmp-fastcgi;
  uwsgi_temp_path {run}/tmp-uwsgi;
  scgi_temp_path {run}/tmp-scgi;
  server {{
    listen {server}:{port};
    location /images/ {{ alias {root}/; }}
  }}
}}
",
        server = net.server,
        port = net.http_port,
        root = root.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_configuration_is_one_our_bootserver_accepts() {
        let machines = vec![BenchMachine {
            name: "storm-0001".into(),
            mac: "02:00:00:00:00:01".into(),
        }];
        let text = ours_config(
            &NET,
            Path::new("/run/b/leases.log"),
            Path::new("/run/b/tftp"),
            Path::new("/run/b/images"),
            &machines,
        );
        assert!(text.contains("leaseFile: /run/b/leases.log"));
        assert!(text.contains("pool: [10.97.1.0, 10.97.255.254]"));
        assert!(text.contains("macs: [\"02:00:00:00:00:01\"]"));
        assert!(text.contains("routerAdvertisements: false"));
    }

    #[test]
    fn kea_configurations_are_json_with_persisted_leases() {
        for threads in [KeaThreads::Single, KeaThreads::Multi(2)] {
            let text = kea_config(&NET, Path::new("/run/b/kea.csv"), threads);
            let parsed: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let dhcp = &parsed["Dhcp4"];
            assert_eq!(dhcp["lease-database"]["persist"], true);
            assert_eq!(dhcp["lease-database"]["name"], "/run/b/kea.csv");
            assert_eq!(
                dhcp["subnet4"][0]["pools"][0]["pool"],
                "10.97.1.0 - 10.97.255.254"
            );
            assert_eq!(
                dhcp["multi-threading"]["enable-multi-threading"],
                threads != KeaThreads::Single
            );
        }
        let multi = kea_config(&NET, Path::new("/l"), KeaThreads::Multi(2));
        assert!(multi.contains(r#""thread-pool-size": 2"#));
        assert!(multi.contains(r#""packet-queue-size": 1024"#));
    }

    #[test]
    fn our_dhcp6_section_follows_the_v4_configuration_at_top_level() {
        let base = ours_config(
            &NET,
            Path::new("/run/b/leases.log"),
            Path::new("/run/b/tftp"),
            Path::new("/run/b/images"),
            &[],
        );
        let section = ours_dhcp6_section(&NET6);
        // A top-level key of its own, after the v4 configuration's last line.
        assert!(base.ends_with('\n'));
        assert!(section.starts_with("dhcp6:\n  mode: full\n"), "{section}");
        for expected in [
            "  serverAddress: fd00:99::1\n",
            "    - prefix: fd00:99::/64\n",
            "      pool: [fd00:99::1:0, fd00:99::ffff:ffff]\n",
            "      dns: [fd00:99::1]\n",
            "      preferredSeconds: 3600\n",
            "      validSeconds: 7200\n",
        ] {
            assert!(section.contains(expected), "{expected:?} in\n{section}");
        }
        // Two-space indentation only, no tabs (YAML).
        assert!(!section.contains('\t'));
        assert!(section.lines().skip(1).all(|l| l.starts_with("  ")));
    }

    #[test]
    fn the_pool_holds_every_simulated_client_and_lies_in_the_prefix() {
        let first: std::net::Ipv6Addr = NET6.pool.0.parse().unwrap_or_else(|e| panic!("{e}"));
        let last: std::net::Ipv6Addr = NET6.pool.1.parse().unwrap_or_else(|e| panic!("{e}"));
        let server: std::net::Ipv6Addr = NET6.server.parse().unwrap_or_else(|e| panic!("{e}"));
        let size = u128::from(last) - u128::from(first) + 1;
        assert!(size >= 10 * 50_000, "{size}");
        let (network, len) = NET6.prefix.split_once('/').unwrap_or_default();
        let network: std::net::Ipv6Addr = network.parse().unwrap_or_else(|e| panic!("{e}"));
        let mask = u128::MAX << (128 - len.parse::<u32>().unwrap_or(128));
        for ip in [first, last, server] {
            assert_eq!(u128::from(ip) & mask, u128::from(network), "{ip}");
        }
        assert!(!(first..=last).contains(&server));
    }

    #[test]
    fn kea6_configurations_are_json_with_persisted_leases_on_the_link() {
        for threads in [KeaThreads::Single, KeaThreads::Multi(2)] {
            let text = kea6_config(
                &NET6,
                Path::new("/run/b/kea6.csv"),
                Path::new("/run/b/kea6"),
                threads,
            );
            let parsed: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let dhcp = &parsed["Dhcp6"];
            assert_eq!(dhcp["lease-database"]["type"], "memfile");
            assert_eq!(dhcp["lease-database"]["persist"], true);
            assert_eq!(dhcp["lease-database"]["name"], "/run/b/kea6.csv");
            assert_eq!(dhcp["data-directory"], "/run/b/kea6");
            assert_eq!(dhcp["interfaces-config"]["interfaces"][0], SERVER_IF);
            let subnet = &dhcp["subnet6"][0];
            assert_eq!(subnet["subnet"], "fd00:99::/64");
            // Clients on the link, not relayed: the subnet is chosen by the interface.
            assert_eq!(subnet["interface"], SERVER_IF);
            assert_eq!(
                subnet["pools"][0]["pool"],
                "fd00:99::1:0 - fd00:99::ffff:ffff"
            );
            assert_eq!(subnet["option-data"][0]["data"], "fd00:99::1");
            assert_eq!(dhcp["preferred-lifetime"], 3600);
            assert_eq!(dhcp["valid-lifetime"], 7200);
            assert_eq!(dhcp["loggers"][0]["name"], "kea-dhcp6");
            assert_eq!(
                dhcp["multi-threading"]["enable-multi-threading"],
                threads != KeaThreads::Single
            );
        }
    }

    #[test]
    fn dnsmasq_never_pings_and_serves_no_dns() {
        let dhcp = dnsmasq_dhcp_args(&NET, Path::new("/l"), Path::new("/p"));
        for expected in [
            "--no-ping",
            "--port=0",
            "--dhcp-range=10.97.1.0,10.97.255.254,255.255.0.0,3600",
            "--dhcp-lease-max=100000",
        ] {
            assert!(dhcp.iter().any(|a| a == expected), "{expected} in {dhcp:?}");
        }
        let tftp = dnsmasq_tftp_args(&NET, Path::new("/srv/tftp"), Path::new("/p"));
        assert!(tftp.iter().any(|a| a == "--tftp-root=/srv/tftp"));
        assert!(!tftp.iter().any(|a| a.starts_with("--dhcp-range")));
    }

    #[test]
    fn nginx_uses_sendfile_and_serves_images() {
        let text = nginx_config(&NET, Path::new("/srv/images"), Path::new("/run/b"));
        assert!(text.contains("sendfile on;"));
        assert!(text.contains("listen 10.97.0.1:8080;"));
        assert!(text.contains("location /images/ { alias /srv/images/; }"));
        assert!(text.contains("daemon off;"));
    }

    #[test]
    fn tftpd_is_confined_and_in_the_foreground() {
        let args = tftpd_args(&NET, Path::new("/srv/tftp"));
        assert_eq!(args.last().map(String::as_str), Some("/srv/tftp"));
        assert!(args.iter().any(|a| a == "--secure"));
        assert!(args.iter().any(|a| a == "10.97.0.1:69"));
    }
}
