//! The bootserver's configuration file, validated once into runtime [`Settings`].
//!
//! ```yaml
//! interface: pxe0                 # DHCP binds to this interface only
//! routerAdvertisements: true      # IPv6 "no router here" adverts on it (iPXE stops waiting)
//! serverAddress: 10.99.0.1        # our IPv4 on it: next-server, TFTP and HTTP address
//! backend: file                   # file (the machines below) | kubernetes (Machines)
//! dhcp:
//!   mode: full                    # full | proxy | off
//!   leaseFile: /var/lib/unbounded/leases.log
//!   unknownMachines: ignore       # ignore | discover
//!   uefiBootFile: snponly.efi     # or ipxe.efi
//!   subnets:
//!     - subnet: 10.99.0.0/24
//!       pool: [10.99.0.100, 10.99.0.199]
//!       gateway: 10.99.0.1
//!       dns: [10.99.0.1]
//!       domain: lab.example
//!       leaseSeconds: 3600
//! dhcp6:                          # DHCPv6 (docs/bootserver.md, IPv6 network boot); off by default
//!   mode: full                    # full | proxy | off
//!   serverAddress: fd00:99::1     # our IPv6 on the interface: boot URLs, TFTP and HTTP over v6
//!   # serverDuid: 00030001525400990001   # default: DUID-LL of the interface's MAC
//!   rapidCommit: true             # two-message exchange when the client asks for it
//!   subnets:
//!     - prefix: fd00:99::/64
//!       pool: [fd00:99::100, fd00:99::1ff]
//!       dns: [fd00:99::1]
//!       preferredSeconds: 3600    # T1, T2: half and four fifths of it
//!       validSeconds: 7200        # the lease in the book
//! tftp: {root: /usr/lib/ipxe, port: 69}   # root: default --default-tftp-root (the image's)
//! power:                          # the PXE provider (backend kubernetes only)
//!   enabled: true
//!   pollSeconds: 30               # how often power state is read
//!   timeoutSeconds: 10            # one BMC request
//!   gracefulShutdownSeconds: 60   # then power is forced off
//! http: {port: 8080, imagesDir: /var/lib/unbounded/images}
//!   # maxConnections: 1024        # open connections at most (more wait in the kernel's backlog)
//!   # idleSeconds: 60             # a connection that neither sends nor receives a byte for this long is closed
//!   # tls: {port: 8443, certFile: /etc/unbounded/tls/tls.crt, keyFile: /etc/unbounded/tls/tls.key}
//!   #                             # credentials and configuration over HTTPS only, the certificate pinned by the boot
//!   #   nextCertFile: /etc/unbounded/tls-next/tls.crt   # during a rotation: agents learn to accept it too
//! credentials:                    # agent credentials (backend kubernetes only)
//!   apiServer: https://10.99.0.1:6443   # the API server as machines reach it
//!   caFile: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt   # the default
//!   tokenSeconds: 3600            # ServiceAccount token lifetime (600–86400)
//!   bootstrapTokenSeconds: 3600   # kubelet bootstrap token lifetime
//!   nonceSeconds: 1800            # how long a boot script's nonce stays valid
//!   nonceFile: /var/lib/unbounded/nonces.json   # nonces kept across restarts (memory only if unset)
//!   mintTimeoutSeconds: 20        # API server wait per request, then 503 + Retry-After (1–25)
//!   replaySeconds: 120            # a spent nonce presented again from the same address gets the same credentials (1–600)
//!   defaultIdentity: network      # how a Machine that sets no identity mode proves itself: tpm | network
//! discovery:                      # needed by dhcp.unknownMachines: discover
//!   boot: {kernel: v1/vmlinuz, initrd: v1/initrd.img, args: [console=ttyS0]}   # the host OS the inspection boots
//!   creationsPerMinute: 30        # Machines discovery may create in any minute
//!   maxUnclaimed: 500             # discovered Machines waiting to be claimed, at most
//!   maxUnclaimedPerSender: 128    # of those, sent from one /24 (default: the lesser of 128 and maxUnclaimed)
//!   maxBodyBytes: 262144          # one inventory report, at most
//! machines:                       # standalone mode (no cluster): the machines we boot
//!   - name: node-1
//!     macs: ["52:54:00:00:00:01"]
//!     ipv4: 10.99.0.21
//!     firmware: bios
//!     boot: {kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::backend::MachineRecord;
use crate::backend::standalone::{self, MachineFile};
use crate::credentials::IssuerSettings;
use crate::credentials::settings::CredentialsFile;
use crate::dhcp::settings::{DhcpFile, DhcpSettings, UnknownMachines};
use crate::dhcp6::settings::{Dhcp6File, Dhcp6Settings};
use crate::discovery::{DiscoveryFile, DiscoverySettings};
use crate::http::settings::{HttpFile, HttpSettings};
use crate::setting::InvalidSetting;
use crate::tftp::settings::{TftpFile, TftpSettings};

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not match the schema.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// `power:` is out of range.
    #[error(transparent)]
    Power(#[from] unbounded_pxe::settings::SettingsError),
    /// A value is wrong (the message names its field).
    #[error("{0}")]
    Invalid(String),
}

impl From<InvalidSetting> for ConfigError {
    fn from(invalid: InvalidSetting) -> Self {
        Self::Invalid(invalid.0)
    }
}

/// Where the bootserver learns about machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The `machines` list of this file (standalone mode, no cluster).
    #[default]
    File,
    /// `provider: pxe` Machines of the cluster (in-cluster config or `KUBECONFIG`).
    Kubernetes,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    interface: Option<String>,
    router_advertisements: Option<bool>,
    server_address: Ipv4Addr,
    #[serde(default)]
    backend: BackendKind,
    #[serde(default)]
    dhcp: DhcpFile,
    #[serde(default)]
    dhcp6: Dhcp6File,
    #[serde(default)]
    tftp: TftpFile,
    #[serde(default)]
    http: HttpFile,
    #[serde(default)]
    machines: Vec<MachineFile>,
    #[serde(default)]
    power: unbounded_pxe::settings::PowerFile,
    credentials: Option<CredentialsFile>,
    discovery: Option<DiscoveryFile>,
    ha: Option<crate::ha::settings::HaFile>,
}

/// Validated settings: each part's own, and what ties them together.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The interface DHCP binds to (`SO_BINDTODEVICE`); `None` binds to all (tests only).
    pub interface: Option<String>,
    /// Whether to send IPv6 router advertisements with lifetime 0 on `interface`
    /// ([`crate::ra`]); on by default, off on a link with a real IPv6 router.
    pub router_advertisements: bool,
    /// Our IPv4 address on the provisioning network.
    pub server_address: Ipv4Addr,
    /// Where machines come from.
    pub backend: BackendKind,
    /// The DHCP server (`dhcp`).
    pub dhcp: DhcpSettings,
    /// The DHCPv6 server (`dhcp6`; off unless configured). Its server DUID is empty until
    /// the server reads the interface's MAC ([`Dhcp6Settings::with_interface_mac`]).
    pub dhcp6: Dhcp6Settings,
    /// The TFTP server (`tftp`).
    pub tftp: TftpSettings,
    /// The HTTP server (`http`).
    pub http: HttpSettings,
    /// The machines of the file (standalone mode).
    pub machines: Vec<Arc<MachineRecord>>,
    /// Whether the PXE provider runs (power through BMCs; backend kubernetes only).
    pub power_enabled: bool,
    /// The PXE provider's settings.
    pub power: unbounded_pxe::settings::PowerSettings,
    /// Agent credentials ([`crate::credentials`]); `None` when not configured.
    pub credentials: Option<IssuerSettings>,
    /// What the inspection boot of an unknown machine boots, and the bounds of the door
    /// ([`crate::discovery`]); always set when `dhcp.unknown_machines` is `Discover`.
    pub discovery: Option<DiscoverySettings>,
    /// The pair this server belongs to (`ha:`; docs/bootserver.md, "Two bootservers on one
    /// network"); its DHCP pools are then its half of each.
    pub ha: Option<crate::ha::settings::HaSettings>,
}

/// Defaults that depend on where the bootserver runs rather than on the file: the
/// container image carries its own iPXE builds (`--default-tftp-root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// `tftp.root` when the file names none.
    pub tftp_root: PathBuf,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            // Debian's `ipxe` package.
            tftp_root: PathBuf::from("/usr/lib/ipxe"),
        }
    }
}

impl Settings {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, &Defaults::default())
    }

    /// Reads and validates a configuration file, with `defaults` for what it leaves out.
    pub fn load_with(path: &Path, defaults: &Defaults) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_with(&text, defaults).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with(text, &Defaults::default())
    }

    /// Parses and validates configuration text, with `defaults` for what it leaves out: each
    /// part converts its own section, then what ties the parts together is checked here.
    pub fn parse_with(text: &str, defaults: &Defaults) -> Result<Self, ConfigError> {
        let file: File = serde_saphyr::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::new(),
            source: Box::new(source),
        })?;
        let dhcp = DhcpSettings::try_from(&file.dhcp)?;
        let ha = file
            .ha
            .as_ref()
            .map(crate::ha::settings::HaSettings::try_from)
            .transpose()?;
        let dhcp = match &ha {
            Some(_) if dhcp.mode != crate::dhcp::settings::DhcpMode::Full => {
                return Err(ConfigError::Invalid(
                    "ha: a pair of servers shares the DHCP pools: dhcp.mode must be full".into(),
                ));
            }
            Some(pair) => dhcp.for_pair(pair.half)?,
            None => dhcp,
        };
        if file.backend == BackendKind::Kubernetes && !file.machines.is_empty() {
            return Err(ConfigError::Invalid(
                "backend kubernetes takes machines from the cluster: remove the machines list"
                    .into(),
            ));
        }
        let machines = standalone::machines(file.machines, &dhcp.subnets)?;
        let discovery = file
            .discovery
            .as_ref()
            .map(DiscoverySettings::try_from)
            .transpose()?;
        if dhcp.unknown_machines == UnknownMachines::Discover && discovery.is_none() {
            return Err(ConfigError::Invalid(
                "dhcp.unknownMachines: discover needs discovery.boot: the host OS kernel and initrd the inspection boot runs (such as {kernel: <version>/vmlinuz, initrd: <version>/initrd.img})".into(),
            ));
        }
        let dhcp6 = file
            .dhcp6
            .validate(dhcp.unknown_machines, file.interface.as_deref())?;
        if ha.is_some() && dhcp6.mode != crate::dhcp6::settings::Dhcp6Mode::Off {
            return Err(ConfigError::Invalid(
                "ha: a pair serves DHCPv4 only so far (its DHCPv6 pools are not split yet): turn dhcp6 off, or run one server".into(),
            ));
        }
        let power = unbounded_pxe::settings::PowerSettings::try_from(&file.power)?;
        let credentials = match &file.credentials {
            Some(_) if file.backend != BackendKind::Kubernetes => {
                return Err(ConfigError::Invalid(
                    "credentials.apiServer: agent credentials need backend kubernetes (they are cluster tokens)".into(),
                ));
            }
            Some(credentials) => Some(IssuerSettings::try_from(credentials)?),
            None => None,
        };
        Ok(Self {
            interface: file.interface,
            router_advertisements: file.router_advertisements.unwrap_or(true),
            server_address: file.server_address,
            backend: file.backend,
            dhcp,
            dhcp6,
            tftp: TftpSettings::from_file(&file.tftp, &defaults.tftp_root),
            http: HttpSettings::try_from(&file.http)?,
            machines,
            power_enabled: file.backend == BackendKind::Kubernetes
                && file.power.enabled.unwrap_or(true),
            power,
            credentials,
            discovery,
            ha,
        })
    }

    /// The base URL of our HTTP server, as machines reach it.
    pub fn http_base(&self) -> String {
        format!("http://{}:{}", self.server_address, self.http.port)
    }

    /// The base URL of our HTTP server as a peer of this family reaches it: over IPv6 for
    /// a v6 peer when DHCPv6 is on (HTTP listens there too), else over IPv4.
    pub fn http_base_for(&self, peer: std::net::IpAddr) -> String {
        match peer {
            std::net::IpAddr::V6(_)
                if self.dhcp6.mode != crate::dhcp6::settings::Dhcp6Mode::Off =>
            {
                format!("http://[{}]:{}", self.dhcp6.server_address, self.http.port)
            }
            _ => self.http_base(),
        }
    }

    /// Where HTTP listens.
    pub fn http_listen(&self) -> SocketAddr {
        SocketAddr::from((self.server_address, self.http.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dhcp::settings::DhcpMode;
    use std::time::Duration;

    const GOOD: &str = r#"
interface: pxe0
serverAddress: 10.99.0.1
dhcp:
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.199]
      gateway: 10.99.0.1
machines:
  - name: node-1
    macs: ["52:54:00:00:00:01"]
    ipv4: 10.99.0.21
    firmware: bios
    boot: {kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0]}
"#;

    #[test]
    fn a_good_file_gets_its_defaults() {
        let s = Settings::parse(GOOD).unwrap();
        assert_eq!(s.dhcp.mode, DhcpMode::Full);
        assert_eq!(s.dhcp.uefi_boot_file, "snponly.efi");
        assert_eq!(
            (s.dhcp.port, s.dhcp.proxy_port, s.tftp.port),
            (67, 4011, 69)
        );
        assert_eq!(s.dhcp.subnets[0].mask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(s.dhcp.subnets[0].lease_seconds, 3600);
        assert_eq!(s.machines[0].hostname.as_deref(), Some("node-1"));
        assert_eq!(s.http_base(), "http://10.99.0.1:8080");
    }

    /// The configuration `deploy/bootserver.yaml` ships in its ConfigMap is valid, and serves
    /// the iPXE builds the image carries.
    #[test]
    fn the_deployment_s_configuration_is_valid() {
        let manifest = include_str!("../../deploy/bootserver.yaml");
        let mut lines = manifest
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("bootserver.yaml: |"));
        let header = lines.next().unwrap();
        let indent = header.len() - header.trim_start().len() + 2;
        let text: String = lines
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
            .map(|l| format!("{}\n", l.get(indent..).unwrap_or_default()))
            .collect();
        let settings = Settings::parse(&text).unwrap();
        assert_eq!(settings.tftp.root, Path::new("/usr/share/unbounded/ipxe"));
        assert_eq!(
            settings.http.images_dir,
            Path::new("/var/lib/unbounded/images")
        );
        assert_eq!(settings.backend, BackendKind::Kubernetes);
    }

    #[test]
    fn a_pair_takes_half_of_every_pool_and_refuses_what_it_cannot_share() {
        let pair = |name: &str, partner: &str, extra: &str| {
            Settings::parse(&format!(
                "{GOOD}ha: {{name: {name}, partner: {{name: {partner}, address: \"10.99.0.3:8647\"}}, keyFile: /k}}\n{extra}"
            ))
        };
        let a = pair("bootserver-a", "bootserver-b", "").unwrap();
        let b = pair("bootserver-b", "bootserver-a", "").unwrap();
        let whole = (Ipv4Addr::new(10, 99, 0, 100), Ipv4Addr::new(10, 99, 0, 199));
        assert_eq!(
            a.dhcp.subnets[0].pool,
            (Ipv4Addr::new(10, 99, 0, 100), Ipv4Addr::new(10, 99, 0, 149))
        );
        assert_eq!(
            b.dhcp.subnets[0].pool,
            (Ipv4Addr::new(10, 99, 0, 150), Ipv4Addr::new(10, 99, 0, 199))
        );
        assert_eq!(a.dhcp.subnets[0].pair_pool, Some(whole));
        assert!(a.dhcp.subnets[0].in_partners_part(Ipv4Addr::new(10, 99, 0, 150)));
        assert!(!a.dhcp.subnets[0].in_partners_part(Ipv4Addr::new(10, 99, 0, 21)));
        assert!(b.dhcp.subnets[0].in_partners_part(Ipv4Addr::new(10, 99, 0, 100)));
        // Without ha: the whole pool, nobody's partner.
        let alone = Settings::parse(GOOD).unwrap();
        assert_eq!(alone.dhcp.subnets[0].pool, whole);
        assert_eq!(alone.dhcp.subnets[0].pair_pool, None);
        assert!(alone.ha.is_none());

        let error =
            |s: Result<Settings, ConfigError>| s.err().map(|e| e.to_string()).unwrap_or_default();
        let proxy = Settings::parse(&format!(
            "{}ha: {{name: a, partner: {{name: b, address: \"10.99.0.3:8647\"}}, keyFile: /k}}\n",
            GOOD.replace("dhcp:\n", "dhcp:\n  mode: proxy\n")
        ));
        assert!(error(proxy).contains("dhcp.mode must be full"));
        let one = Settings::parse(&format!(
            "{}ha: {{name: a, partner: {{name: b, address: \"10.99.0.3:8647\"}}, keyFile: /k}}\n",
            GOOD.replace(
                "pool: [10.99.0.100, 10.99.0.199]",
                "pool: [10.99.0.100, 10.99.0.100]"
            )
        ));
        assert!(error(one).contains("has one address"));
        let v6 = pair(
            "a",
            "b",
            "dhcp6: {mode: full, serverAddress: \"fd00:99::1\", subnets: [{prefix: \"fd00:99::/64\", pool: [\"fd00:99::100\", \"fd00:99::1ff\"]}]}\n",
        );
        assert!(error(v6).contains("DHCPv4 only so far"));
    }

    #[test]
    fn the_tftp_root_defaults_to_where_the_bootserver_runs() {
        let text = "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\n";
        assert_eq!(
            Settings::parse(text).unwrap().tftp.root,
            Path::new("/usr/lib/ipxe")
        );
        let image = Defaults {
            tftp_root: PathBuf::from("/usr/share/unbounded/ipxe"),
        };
        assert_eq!(
            Settings::parse_with(text, &image).unwrap().tftp.root,
            image.tftp_root
        );
        let explicit = format!("{text}tftp: {{root: /srv/tftp}}\n");
        assert_eq!(
            Settings::parse_with(&explicit, &image).unwrap().tftp.root,
            Path::new("/srv/tftp")
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            (
                "full mode without subnets",
                "serverAddress: 10.0.0.1\n",
                "needs at least one entry",
            ),
            (
                "pool outside the subnet",
                "serverAddress: 10.0.0.1\ndhcp: {subnets: [{subnet: 10.0.0.0/24, pool: [10.0.1.1, 10.0.1.9]}]}\n",
                "must lie inside the subnet",
            ),
            (
                "host bits",
                "serverAddress: 10.0.0.1\ndhcp: {subnets: [{subnet: 10.0.0.1/24, pool: [10.0.0.5, 10.0.0.9]}]}\n",
                "host bits",
            ),
            (
                "unknown field",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\nbogus: 1\n",
                "bogus",
            ),
            (
                "bad uefi boot file",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, uefiBootFile: grub.efi}\n",
                "ipxe.efi or snponly.efi",
            ),
            (
                "duplicate address",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00:00:00:01'], ipv4: 10.0.0.5}, {name: b, macs: ['52:54:00:00:00:02'], ipv4: 10.0.0.5}]\n",
                "never hand one address to two machines",
            ),
            (
                "duplicate MAC",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00:00:00:01']}, {name: b, macs: ['52:54:00:00:00:01']}]\n",
                "also machine a's",
            ),
            (
                "machines with the kubernetes backend",
                "serverAddress: 10.0.0.1\nbackend: kubernetes\ndhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00:00:00:01']}]\n",
                "remove the machines list",
            ),
            (
                "bad MAC",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00']}]\n",
                "not a MAC address",
            ),
            (
                "discovery without its boot",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\n",
                "needs discovery.boot",
            ),
            (
                "a discovery kernel argument iPXE would expand",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\ndiscovery: {boot: {kernel: vmlinuz, initrd: initrd.img, args: ['x=${net0/ip}']}}\n",
                "discovery.boot.args",
            ),
            (
                "a discovery kernel path with a space",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\ndiscovery: {boot: {kernel: 'vm linuz', initrd: initrd.img}}\n",
                "discovery.boot.kernel",
            ),
            (
                "no creations at all",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\ndiscovery: {boot: {kernel: vmlinuz, initrd: initrd.img}, creationsPerMinute: 0}\n",
                "creationsPerMinute must be between 1 and 600",
            ),
            (
                "a report limit too small for an inventory",
                "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\ndiscovery: {boot: {kernel: vmlinuz, initrd: initrd.img}, maxBodyBytes: 100}\n",
                "maxBodyBytes must be between 4096",
            ),
        ];
        for (case, text, expected) in cases {
            let err = Settings::parse(text).expect_err(case).to_string();
            assert!(err.contains(expected), "{case}: {err}");
        }
    }

    #[test]
    fn the_mint_deadline_stays_below_the_agent_s_request_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let config = |extra: &str| {
            format!(
                "serverAddress: 10.0.0.1\nbackend: kubernetes\ndhcp: {{mode: proxy}}\ncredentials:\n  apiServer: https://10.0.0.1:6443\n  caFile: {}\n{extra}",
                ca.display()
            )
        };
        let mint_timeout = |extra: &str| {
            Settings::parse(&config(extra))
                .map(|s| s.credentials.map(|c| c.mint_timeout))
                .map_err(|e| e.to_string())
        };
        assert_eq!(mint_timeout(""), Ok(Some(Duration::from_secs(20))));
        assert_eq!(
            mint_timeout("  mintTimeoutSeconds: 8\n"),
            Ok(Some(Duration::from_secs(8)))
        );
        for bad in ["0", "26", "30"] {
            let error = mint_timeout(&format!("  mintTimeoutSeconds: {bad}\n")).unwrap_err();
            assert!(
                error.contains("mintTimeoutSeconds must be between 1 and 25"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn discovery_settings_keep_the_boot_and_default_the_bounds() {
        let text = "serverAddress: 10.0.0.1\ndhcp: {mode: proxy, unknownMachines: discover}\ndiscovery:\n  boot: {kernel: v1/vmlinuz, initrd: v1/initrd.img, args: [console=ttyS0]}\n  maxUnclaimed: 20\n";
        let discovery = Settings::parse(text).unwrap().discovery.unwrap();
        assert_eq!(
            (
                discovery.kernel.as_str(),
                discovery.initrd.as_str(),
                discovery.kernel_args
            ),
            (
                "v1/vmlinuz",
                "v1/initrd.img",
                vec!["console=ttyS0".to_owned()]
            )
        );
        let defaults = crate::discovery::DiscoveryLimits::default();
        assert_eq!(
            discovery.limits,
            crate::discovery::DiscoveryLimits {
                max_unclaimed: 20,
                max_unclaimed_per_sender: 20,
                ..defaults
            }
        );
    }
}
