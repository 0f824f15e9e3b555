//! Network namespaces that a test creates for itself: a provisioning link between a
//! "server" and a "client" namespace (a veth pair), or a tap device for a QEMU VM. Nothing
//! touches the host's own interfaces; everything is deleted when the value is dropped.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Errors of namespace plumbing.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command failed.
    #[error("{command}: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr, or what is wrong.
        message: String,
    },
    /// A command or call could not run.
    #[error("{command}: {source}")]
    NotRun {
        /// The command line, or what was being done.
        command: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

fn run(args: &[&str]) -> Result<Output, NetnsError> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::NotRun {
            command: args.join(" "),
            source,
        })?;
    if !output.status.success() {
        return Err(NetnsError::Command {
            command: args.join(" "),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(output)
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short name (interface names have at most 15 characters).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id() % 100_000)
}

/// Namespaces this process created and has not deleted yet.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<String>> {
    // A panic while holding it leaves a plain list of names: still usable.
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deletes every namespace this process created and still holds (their veths go with
/// them). For a process ending on a signal, where no destructor runs.
pub fn delete_all_live() {
    for name in live().drain(..) {
        let _ = run(&["ip", "netns", "del", &name]);
    }
}

/// One network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace with its loopback up.
    pub fn new(prefix: &str) -> Result<Self, NetnsError> {
        let name = unique(prefix);
        run(&["ip", "netns", "add", &name])?;
        live().push(name.clone());
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip <args>` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<Output, NetnsError> {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Runs a command inside the namespace and returns its output, failing on a non-zero exit.
    pub fn exec(&self, args: &[&str]) -> Result<Output, NetnsError> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs `work` on a new thread of this process that has joined the namespace (its
    /// network namespace only): every socket the thread opens lives there, so in-process
    /// code can act as a client on the namespace's link (a machine at its own address).
    pub fn spawn_inside<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T, NetnsError>>, NetnsError> {
        let name = self.name.clone();
        let path = format!("/run/netns/{name}");
        let failed = move |source: std::io::Error| NetnsError::NotRun {
            command: format!("setns /run/netns/{name}"),
            source,
        };
        let file = std::fs::File::open(&path).map_err(failed.clone())?;
        std::thread::Builder::new()
            .name(format!("in-{}", self.name))
            .spawn(move || {
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&file),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| failed(e.into()))?;
                Ok(work())
            })
            .map_err(|source| NetnsError::NotRun {
                command: "spawning a thread".into(),
                source,
            })
    }

    /// Creates a tap device (for QEMU) with an address, up.
    pub fn tap(&self, name: &str, address_cidr: &str) -> Result<(), NetnsError> {
        self.ip(&["tuntap", "add", "dev", name, "mode", "tap"])?;
        self.ip(&["addr", "add", address_cidr, "dev", name])?;
        self.ip(&["link", "set", name, "up"])?;
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        live().retain(|n| n != &self.name);
        let _ = run(&["ip", "netns", "del", &self.name]);
    }
}

/// Two namespaces joined by a veth pair: the server side gets `server_cidr`, the client side
/// gets `client_mac` and no address (a DHCP client configures it).
#[derive(Debug)]
pub struct Link {
    /// The server's namespace.
    pub server: Netns,
    /// The client's namespace.
    pub client: Netns,
    /// The server's interface name.
    pub server_if: String,
    /// The client's interface name.
    pub client_if: String,
}

impl Link {
    /// Creates both namespaces and the veth pair between them.
    pub fn new(server_cidr: &str, client_mac: &str) -> Result<Self, NetnsError> {
        let server = Netns::new("ubs")?;
        let client = Netns::new("ubc")?;
        let server_if = "pxe0".to_owned();
        let client_if = "eth0".to_owned();
        let a = unique("va");
        let b = unique("vb");
        run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        run(&["ip", "link", "set", &a, "netns", server.name()])?;
        run(&["ip", "link", "set", &b, "netns", client.name()])?;
        server.ip(&["link", "set", &a, "name", &server_if])?;
        client.ip(&["link", "set", &b, "name", &client_if])?;
        client.ip(&["link", "set", &client_if, "address", client_mac])?;
        server.ip(&["addr", "add", server_cidr, "dev", &server_if])?;
        server.ip(&["link", "set", &server_if, "up"])?;
        client.ip(&["link", "set", &client_if, "up"])?;
        Ok(Self {
            server,
            client,
            server_if,
            client_if,
        })
    }
}

impl Link {
    /// Both namespaces and the veth pair, each side with its own address (benchmarks: the
    /// client side runs load generators and relay-mode DHCP clients).
    pub fn addressed(server_cidr: &str, client_cidr: &str) -> Result<Self, NetnsError> {
        let link = Self::new(server_cidr, "02:00:00:00:00:fe")?;
        link.client
            .ip(&["addr", "add", client_cidr, "dev", &link.client_if])?;
        Ok(link)
    }

    /// Another host on the client's side of the link: a namespace of its own whose `eth0`
    /// (a macvlan of the client's interface) has `mac` and `cidr`. Its frames reach the
    /// server with its own MAC, as a second machine on the same switch would.
    pub fn host(&self, mac: &str, cidr: &str) -> Result<Netns, NetnsError> {
        let host = Netns::new("ubh")?;
        let name = unique("mv");
        self.client.ip(&[
            "link",
            "add",
            "link",
            &self.client_if,
            "name",
            &name,
            "type",
            "macvlan",
            "mode",
            "bridge",
        ])?;
        self.client
            .ip(&["link", "set", &name, "netns", host.name()])?;
        host.ip(&["link", "set", &name, "name", "eth0"])?;
        host.ip(&["link", "set", "eth0", "address", mac])?;
        host.ip(&["addr", "add", cidr, "dev", "eth0"])?;
        host.ip(&["link", "set", "eth0", "up"])?;
        Ok(host)
    }
}

/// A TCP port inside a namespace that reaches a TCP address of the host's loopback (the
/// local API server), through a Unix socket: one `socat` listens in the namespace, one in
/// the host connects. Both are killed on drop, with every connection they forwarded: what
/// was reached through it is cut off at once.
#[derive(Debug)]
pub struct LoopbackForward {
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl LoopbackForward {
    /// Forwards `127.0.0.1:<port>` inside `ns` to `target` (e.g. `127.0.0.1:6443`) outside.
    pub fn new(ns: &Netns, port: u16, target: &str) -> Result<Self, NetnsError> {
        Self::bound(ns, "127.0.0.1", port, target)
    }

    /// Forwards `<bind>:<port>` inside `ns` (an address of the namespace, such as a
    /// bridge's that VMs reach, of either family) to `target` outside.
    pub fn bound(ns: &Netns, bind: &str, port: u16, target: &str) -> Result<Self, NetnsError> {
        let dir = tempfile::tempdir().map_err(|source| NetnsError::NotRun {
            command: "tempdir".into(),
            source,
        })?;
        let socket = dir.path().join("forward.sock");
        // Each socat leads a process group of its own, which holds the children it forks
        // per connection: dropping the forward kills the groups, established connections
        // included (a real outage, not only no new connections).
        let spawn = |command: &mut Command| {
            command
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|source| NetnsError::NotRun {
                    command: format!("{command:?}"),
                    source,
                })
        };
        let outside = spawn(
            Command::new("socat")
                .arg(format!("UNIX-LISTEN:{},fork", socket.display()))
                .arg(format!("TCP:{target}")),
        )?;
        let mut children = vec![outside];
        // The listening socket appears asynchronously.
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let inside = spawn(
            ns.command("socat")
                .arg(listen_spec(bind, port))
                .arg(format!("UNIX-CONNECT:{}", socket.display())),
        );
        match inside {
            Ok(child) => children.push(child),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e);
            }
        }
        Ok(Self {
            children,
            _dir: dir,
        })
    }
}

impl Drop for LoopbackForward {
    fn drop(&mut self) {
        for child in &mut self.children {
            // The whole group: the listener and every connection it forked.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A routed link from the host's namespace into a namespace: a veth pair with an address on
/// each end and a host route to `subnet` (the addresses behind the namespace's bridge)
/// through it; the namespace forwards between the two. Host processes then reach the
/// machines on that bridge: the API server reaches their kubelets (`kubectl logs`, `exec`),
/// a person's `curl` reaches their ports. Nothing of the host's existing interfaces or
/// routes is touched; the pair (and with it the route) is deleted on drop.
#[derive(Debug)]
pub struct HostRoute {
    host_if: String,
    ns_if: String,
}

impl HostRoute {
    /// Links `ns` to the host: `host_cidr` on the host's end, `ns_cidr` on the namespace's,
    /// and the host route `subnet via <ns address>`. Refused when the host already routes
    /// `subnet` (another lab, or a network of the host's own).
    pub fn new(
        ns: &Netns,
        host_cidr: &str,
        ns_cidr: &str,
        subnet: &str,
    ) -> Result<Self, NetnsError> {
        let taken = run(&["ip", "route", "show", subnet])?;
        let taken = String::from_utf8_lossy(&taken.stdout).trim().to_owned();
        // A lab killed before its destructors ran leaves its veth (and with it the route):
        // its name carries the pid of the process that made it; a dead one's is removed.
        if let Some((link, pid)) = stale_route_link(&taken)
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = run(&["ip", "link", "del", &link]);
        }
        let taken = run(&["ip", "route", "show", subnet])?;
        if !String::from_utf8_lossy(&taken.stdout).trim().is_empty() {
            return Err(NetnsError::Command {
                command: format!("ip route add {subnet}"),
                message: format!("the host already routes {subnet} (another lab running?)"),
            });
        }
        let host_if = unique("vh");
        let ns_if = unique("vn");
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ])?;
        let this = Self { host_if, ns_if };
        let via = ns_cidr.split('/').next().unwrap_or(ns_cidr);
        run(&["ip", "link", "set", &this.ns_if, "netns", ns.name()])?;
        run(&["ip", "addr", "add", host_cidr, "dev", &this.host_if])?;
        run(&["ip", "link", "set", &this.host_if, "up"])?;
        ns.ip(&["addr", "add", ns_cidr, "dev", &this.ns_if])?;
        ns.ip(&["link", "set", &this.ns_if, "up"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        run(&[
            "ip",
            "route",
            "add",
            subnet,
            "via",
            via,
            "dev",
            &this.host_if,
        ])?;
        Ok(this)
    }

    /// The same link for IPv6 too: `host_cidr` and `ns_cidr` (without duplicate address
    /// detection, so that they work at once) and the host route `subnet via <ns address>`.
    pub fn add_ipv6(
        &self,
        ns: &Netns,
        host_cidr: &str,
        ns_cidr: &str,
        subnet: &str,
    ) -> Result<(), NetnsError> {
        let via = ns_cidr.split('/').next().unwrap_or(ns_cidr);
        run(&[
            "ip",
            "-6",
            "addr",
            "add",
            host_cidr,
            "dev",
            &self.host_if,
            "nodad",
        ])?;
        ns.ip(&["-6", "addr", "add", ns_cidr, "dev", &self.ns_if, "nodad"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        run(&[
            "ip",
            "-6",
            "route",
            "add",
            subnet,
            "via",
            via,
            "dev",
            &self.host_if,
        ])?;
        Ok(())
    }
}

/// socat's listening address for `bind:port`: an IPv6 address needs its own keyword and
/// brackets.
fn listen_spec(bind: &str, port: u16) -> String {
    if bind.contains(':') {
        format!("TCP6-LISTEN:{port},bind=[{bind}],reuseaddr,fork")
    } else {
        format!("TCP-LISTEN:{port},bind={bind},reuseaddr,fork")
    }
}

/// The host link of a [`HostRoute`] in `ip route show <subnet>`'s answer, and the pid in
/// its name (`vh<pid mod 100000>x<n>`); `None` for a route through anything else.
pub fn stale_route_link(route: &str) -> Option<(String, u32)> {
    let mut words = route.split_whitespace();
    let link = words.by_ref().skip_while(|w| *w != "dev").nth(1)?;
    let pid = link.strip_prefix("vh")?.split_once('x')?.0.parse().ok()?;
    Some((link.to_owned(), pid))
}

impl Drop for HostRoute {
    fn drop(&mut self) {
        let _ = run(&["ip", "link", "del", &self.host_if]);
    }
}

#[cfg(test)]
mod host_route_tests {
    use super::*;

    #[test]
    fn a_route_through_a_lab_link_names_its_pid() {
        assert_eq!(
            stale_route_link("10.99.0.0/24 via 10.99.1.2 dev vh30437x1"),
            Some(("vh30437x1".into(), 30437))
        );
        assert_eq!(
            stale_route_link("10.99.0.0/24 via 192.0.2.1 dev eth0"),
            None
        );
        assert_eq!(stale_route_link("10.99.0.0/24 dev vhost0 scope link"), None);
        assert_eq!(stale_route_link(""), None);
    }
}
