//! The bench: two network namespaces joined by a veth pair (deleted on drop), the files the
//! servers serve, and one way to start each server in the server namespace and each client
//! in the client namespace. IPv6 on the link ([`Bed::ipv6`]) only for the DHCPv6 rows.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::peers::{self, BenchMachine, CLIENT_IF, KeaThreads, NET, NET6, SERVER_IF};
use super::proc::{Daemon, ProcError, in_namespace};
use crate::netns::{Link, NetnsError};

/// Errors of setting up the bench.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    /// Namespace plumbing failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A process failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// An interface's IPv6 link-local address did not become usable (duplicate address
    /// detection still running, or failed).
    #[error("no usable IPv6 link-local address on {interface} after {seconds} s:\n{output}")]
    NoLinkLocal {
        /// The interface.
        interface: String,
        /// How long it was waited for.
        seconds: u64,
        /// What `ip -6 addr show` said last.
        output: String,
    },
    /// A file could not be written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BedError {
    let what = what.into();
    move |source| BedError::Io { what, source }
}

/// Sizes of the files served.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// The large TFTP and HTTP file (50 MiB).
    pub big: u64,
    /// Each of the concurrently fetched TFTP files (1 MiB).
    pub each: u64,
    /// How many of those (20).
    pub concurrent: usize,
    /// The storm's kernel.
    pub kernel: u64,
}

/// The files, by name under both the TFTP root and the images directory.
pub mod files {
    /// The large file.
    pub const BIG: &str = "big.bin";
    /// The 1 KiB file.
    pub const SMALL: &str = "1k.bin";
    /// The storm's kernel and initrd.
    pub const KERNEL: &str = "vmlinuz";
    /// The storm's initrd.
    pub const INITRD: &str = "initrd.img";
    /// The BIOS iPXE build.
    pub const UNDIONLY: &str = "undionly.kpxe";

    /// The `i`-th file fetched concurrently.
    pub fn each(i: usize) -> String {
        format!("each-{i:02}.bin")
    }
}

/// The DHCPv6 server port.
pub const DHCP6_SERVER_PORT: u16 = 547;

/// The state of an interface's link-local address, from `ip -6 addr show dev <if> scope
/// link`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLocal {
    /// None yet (the interface just came up).
    Missing,
    /// Duplicate address detection is still running: it cannot be bound yet.
    Tentative,
    /// Detection failed: it never becomes usable.
    Failed,
    /// Usable.
    Usable,
}

/// What `ip -6 addr show dev <if> scope link` says of the interface's link-local address.
pub fn link_local(text: &str) -> LinkLocal {
    let Some(line) = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("inet6 fe80:"))
    else {
        return LinkLocal::Missing;
    };
    let flags: Vec<&str> = line.split_whitespace().collect();
    if flags.contains(&"dadfailed") {
        LinkLocal::Failed
    } else if flags.contains(&"tentative") {
        LinkLocal::Tentative
    } else {
        LinkLocal::Usable
    }
}

/// The link and the files.
#[derive(Debug)]
pub struct Bed {
    /// The namespaces.
    pub link: Link,
    /// The run's working directory (configurations, logs, lease files).
    pub dir: PathBuf,
    /// The TFTP root.
    pub tftp_root: PathBuf,
    /// The HTTP images directory.
    pub images_dir: PathBuf,
    /// Our bootserver binary.
    pub ours: PathBuf,
    /// The sizes used.
    pub sizes: Sizes,
}

impl Bed {
    /// Creates the namespaces and writes the files (random content: nothing compresses or
    /// deduplicates them).
    pub fn new(dir: &Path, ours: &Path, sizes: Sizes) -> Result<Self, BedError> {
        let tftp_root = dir.join("tftp");
        let images_dir = dir.join("images");
        for d in [&tftp_root, &images_dir] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        let mut random = std::fs::File::open("/dev/urandom").map_err(io("opening /dev/urandom"))?;
        let mut write = |path: PathBuf, size: u64| -> Result<(), BedError> {
            let mut file =
                std::fs::File::create(&path).map_err(io(format!("creating {}", path.display())))?;
            std::io::copy(&mut (&mut random).take(size), &mut file)
                .map_err(io(format!("writing {}", path.display())))?;
            Ok(())
        };
        write(tftp_root.join(files::BIG), sizes.big)?;
        for i in 0..sizes.concurrent {
            write(tftp_root.join(files::each(i)), sizes.each)?;
        }
        write(images_dir.join(files::SMALL), 1024)?;
        write(images_dir.join(files::KERNEL), sizes.kernel)?;
        write(images_dir.join(files::INITRD), 64 * 1024)?;
        let copy = |from: &Path, to: &Path| {
            std::fs::copy(from, to)
                .map(drop)
                .map_err(io(format!("copying {}", from.display())))
        };
        copy(&tftp_root.join(files::BIG), &images_dir.join(files::BIG))?;
        // The real BIOS iPXE build when Debian's ipxe package is there, else a stand-in of
        // its size.
        let undionly = Path::new("/usr/lib/ipxe/undionly.kpxe");
        if undionly.exists() {
            copy(undionly, &tftp_root.join(files::UNDIONLY))?;
        } else {
            write(tftp_root.join(files::UNDIONLY), 70 * 1024)?;
        }
        let link = Link::addressed(&format!("{}/16", NET.server), &format!("{}/16", NET.client))?;
        Ok(Self {
            link,
            dir: dir.to_owned(),
            tftp_root,
            images_dir,
            ours: ours.to_owned(),
            sizes,
        })
    }

    fn write(&self, name: &str, text: &str) -> Result<PathBuf, BedError> {
        let path = self.dir.join(name);
        let mut file =
            std::fs::File::create(&path).map_err(io(format!("creating {}", path.display())))?;
        file.write_all(text.as_bytes())
            .map_err(io(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// A program in the client namespace.
    pub fn client(&self, program: &str) -> Command {
        in_namespace(&self.link.client, program)
    }

    /// Starts our bootserver with a fresh lease file (`keep_leases` keeps the one there: the
    /// crash test's restart) and the given machines; ready when DHCP, TFTP and HTTP listen.
    pub fn start_ours(
        &self,
        machines: &[BenchMachine],
        keep_leases: bool,
    ) -> Result<Daemon, BedError> {
        self.start_ours_with(
            machines,
            &self.dir.join("ours-leases.log"),
            keep_leases,
            false,
        )
    }

    /// Starts ours with a fresh lease log on tmpfs (`/dev/shm`), where `fdatasync` costs
    /// next to nothing: against [`Bed::start_ours`], the price of durable leases.
    pub fn start_ours_leases_in_memory(&self) -> Result<Daemon, BedError> {
        self.start_ours_with(&[], &Self::memory_leases(), false, false)
    }

    /// Starts ours as [`Bed::start_ours`] (no machines, a fresh lease log) with DHCPv6 on
    /// as well ([`peers::ours_dhcp6_section`]), the log on tmpfs when `leases_in_memory`;
    /// ready when DHCPv6 listens too. Needs [`Bed::ipv6`] first.
    pub fn start_ours6(&self, leases_in_memory: bool) -> Result<Daemon, BedError> {
        let leases = if leases_in_memory {
            Self::memory_leases()
        } else {
            self.dir.join("ours-leases.log")
        };
        self.start_ours_with(&[], &leases, false, true)
    }

    /// Where [`Bed::start_ours_leases_in_memory`] keeps its lease log (delete it after).
    pub fn memory_leases() -> PathBuf {
        Path::new("/dev/shm").join(format!("unbounded-bench-leases-{}.log", std::process::id()))
    }

    fn start_ours_with(
        &self,
        machines: &[BenchMachine],
        leases: &Path,
        keep_leases: bool,
        dhcp6: bool,
    ) -> Result<Daemon, BedError> {
        let leases = leases.to_owned();
        if !keep_leases {
            let _ = std::fs::remove_file(&leases);
        }
        let mut text =
            peers::ours_config(&NET, &leases, &self.tftp_root, &self.images_dir, machines);
        if dhcp6 {
            text.push_str(&peers::ours_dhcp6_section(&NET6));
        }
        let name = if dhcp6 { "ours6" } else { "ours" };
        let config = self.write(&format!("{name}.yaml"), &text)?;
        let mut command = in_namespace(&self.link.server, &self.ours.display().to_string());
        command.arg("--config").arg(&config).env("RUST_LOG", "warn");
        let mut daemon = Daemon::start("ours", command, &self.dir.join(format!("{name}.log")))?;
        let wait = Duration::from_secs(60);
        daemon.wait_listening(67, true, wait)?;
        daemon.wait_listening(69, true, wait)?;
        daemon.wait_listening(NET.http_port, false, wait)?;
        if dhcp6 {
            daemon.wait_listening_udp6(DHCP6_SERVER_PORT, wait)?;
        }
        Ok(daemon)
    }

    /// IPv6 on the link, for the DHCPv6 rows: the server's address ([`NET6`]) on its
    /// interface without duplicate address detection (nobody else is on the link; the
    /// servers bind it at start), and both sides' link-local addresses past detection
    /// (perfdhcp -6 sends from the client's, Kea listens on the server's). Idempotent.
    pub fn ipv6(&self) -> Result<(), BedError> {
        self.link.server.ip(&[
            "-6",
            "addr",
            "replace",
            &format!("{}/64", NET6.server),
            "dev",
            SERVER_IF,
            "nodad",
        ])?;
        for (ns, interface) in [
            (&self.link.server, SERVER_IF),
            (&self.link.client, CLIENT_IF),
        ] {
            let timeout = Duration::from_secs(20);
            let deadline = std::time::Instant::now() + timeout;
            loop {
                let out = ns.ip(&["-6", "addr", "show", "dev", interface, "scope", "link"])?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                match link_local(&text) {
                    LinkLocal::Usable => break,
                    LinkLocal::Tentative | LinkLocal::Missing
                        if std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    _ => {
                        return Err(BedError::NoLinkLocal {
                            interface: interface.to_owned(),
                            seconds: timeout.as_secs(),
                            output: text,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts Kea with a fresh lease file.
    pub fn start_kea(&self, threads: KeaThreads) -> Result<Daemon, BedError> {
        let run = self.dir.join("kea");
        std::fs::create_dir_all(&run).map_err(io("creating the Kea directory"))?;
        let leases = run.join("leases.csv");
        for stale in ["leases.csv", "leases.csv.2", "leases.csv.completed"] {
            let _ = std::fs::remove_file(run.join(stale));
        }
        let config = self.write("kea.json", &peers::kea_config(&NET, &leases, threads))?;
        let mut command = in_namespace(&self.link.server, "kea-dhcp4");
        command
            .arg("-c")
            .arg(&config)
            .env("KEA_PIDFILE_DIR", &run)
            .env("KEA_LOCKFILE_DIR", &run);
        let mut daemon = Daemon::start("kea-dhcp4", command, &self.dir.join("kea.log"))?;
        daemon.wait_listening(67, true, Duration::from_secs(30))?;
        Ok(daemon)
    }

    /// Starts Kea's DHCPv6 server with a fresh lease file ([`peers::kea6_config`]); ready
    /// when it listens on port 547. Needs [`Bed::ipv6`] first.
    pub fn start_kea6(&self, threads: KeaThreads) -> Result<Daemon, BedError> {
        let run = self.dir.join("kea6");
        std::fs::create_dir_all(&run).map_err(io("creating the Kea DHCPv6 directory"))?;
        let leases = run.join("leases6.csv");
        for stale in ["leases6.csv", "leases6.csv.2", "leases6.csv.completed"] {
            let _ = std::fs::remove_file(run.join(stale));
        }
        let config = self.write(
            "kea6.json",
            &peers::kea6_config(&NET6, &leases, &run, threads),
        )?;
        let mut command = in_namespace(&self.link.server, "kea-dhcp6");
        command
            .arg("-c")
            .arg(&config)
            .env("KEA_PIDFILE_DIR", &run)
            .env("KEA_LOCKFILE_DIR", &run);
        let mut daemon = Daemon::start("kea-dhcp6", command, &self.dir.join("kea6.log"))?;
        daemon.wait_listening_udp6(DHCP6_SERVER_PORT, Duration::from_secs(30))?;
        Ok(daemon)
    }

    /// Starts dnsmasq as a DHCP server with a fresh lease file.
    pub fn start_dnsmasq_dhcp(&self) -> Result<Daemon, BedError> {
        let leases = self.dir.join("dnsmasq.leases");
        let _ = std::fs::remove_file(&leases);
        let mut command = in_namespace(&self.link.server, "dnsmasq");
        command.args(peers::dnsmasq_dhcp_args(
            &NET,
            &leases,
            &self.dir.join("dnsmasq.pid"),
        ));
        let mut daemon = Daemon::start("dnsmasq", command, &self.dir.join("dnsmasq-dhcp.log"))?;
        daemon.wait_listening(67, true, Duration::from_secs(30))?;
        Ok(daemon)
    }

    /// Starts dnsmasq as a TFTP server.
    pub fn start_dnsmasq_tftp(&self) -> Result<Daemon, BedError> {
        let mut command = in_namespace(&self.link.server, "dnsmasq");
        command.args(peers::dnsmasq_tftp_args(
            &NET,
            &self.tftp_root,
            &self.dir.join("dnsmasq.pid"),
        ));
        let mut daemon = Daemon::start("dnsmasq", command, &self.dir.join("dnsmasq-tftp.log"))?;
        daemon.wait_listening(69, true, Duration::from_secs(30))?;
        Ok(daemon)
    }

    /// Starts tftpd-hpa.
    pub fn start_tftpd(&self) -> Result<Daemon, BedError> {
        let mut command = in_namespace(&self.link.server, "in.tftpd");
        command.args(peers::tftpd_args(&NET, &self.tftp_root));
        let mut daemon = Daemon::start("tftpd-hpa", command, &self.dir.join("tftpd.log"))?;
        daemon.wait_listening(69, true, Duration::from_secs(30))?;
        Ok(daemon)
    }

    /// Starts nginx.
    pub fn start_nginx(&self) -> Result<Daemon, BedError> {
        let run = self.dir.join("nginx");
        std::fs::create_dir_all(&run).map_err(io("creating the nginx directory"))?;
        let config = self.write(
            "nginx.conf",
            &peers::nginx_config(&NET, &self.images_dir, &run),
        )?;
        let mut command = in_namespace(&self.link.server, "nginx");
        command
            .arg("-c")
            .arg(&config)
            .arg("-e")
            .arg(run.join("nginx-error.log"));
        let mut daemon = Daemon::start("nginx", command, &self.dir.join("nginx.log"))?;
        daemon.wait_listening(NET.http_port, false, Duration::from_secs(30))?;
        Ok(daemon)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_local_address_is_usable_once_detection_is_over() {
        let settled = "1590: pxe0@if1589: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n    \
                       inet6 fe80::68db:1ff:fee0:abfe/64 scope link \n       \
                       valid_lft forever preferred_lft forever\n";
        assert_eq!(link_local(settled), LinkLocal::Usable);
        let tentative = settled.replace("scope link ", "scope link tentative ");
        assert_eq!(link_local(&tentative), LinkLocal::Tentative);
        let failed = settled.replace("scope link ", "scope link tentative dadfailed ");
        assert_eq!(link_local(&failed), LinkLocal::Failed);
        assert_eq!(link_local(""), LinkLocal::Missing);
        // A global address alone is no link-local one.
        assert_eq!(
            link_local("    inet6 fd00:99::1/64 scope global nodad \n"),
            LinkLocal::Missing
        );
    }
}
