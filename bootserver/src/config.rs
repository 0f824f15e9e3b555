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
use std::time::Duration;

use serde::Deserialize;
use unbounded_api::{Architecture, Firmware};

use crate::backend::{BootTarget, MacAddr, MachineRecord};

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
    #[error("parsing {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A value is wrong.
    #[error("{0}")]
    Invalid(String),
}

/// DHCP mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DhcpMode {
    /// Assign addresses and boot files.
    #[default]
    Full,
    /// Beside another DHCP server: answer PXE clients with boot information only.
    Proxy,
    /// No DHCP (firmware configured otherwise).
    Off,
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

/// What to do with a PXE client whose MAC no machine has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UnknownMachines {
    /// Do not answer it (the safe default: never boot what nobody declared).
    #[default]
    Ignore,
    /// Boot it into the discovery script (`/discover.ipxe`).
    Discover,
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
    tftp: TftpFile,
    #[serde(default)]
    http: HttpFile,
    #[serde(default)]
    machines: Vec<MachineFile>,
    #[serde(default)]
    power: unbounded_pxe::settings::PowerFile,
    credentials: Option<CredentialsFile>,
    discovery: Option<DiscoveryFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DiscoveryFile {
    boot: BootFile,
    creations_per_minute: Option<usize>,
    max_unclaimed: Option<usize>,
    max_unclaimed_per_sender: Option<usize>,
    max_body_bytes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CredentialsFile {
    api_server: String,
    ca_file: Option<PathBuf>,
    token_seconds: Option<i64>,
    bootstrap_token_seconds: Option<i64>,
    nonce_seconds: Option<u64>,
    nonce_file: Option<PathBuf>,
    mint_timeout_seconds: Option<u64>,
    replay_seconds: Option<u64>,
    default_identity: Option<unbounded_api::identity::IdentityMode>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DhcpFile {
    #[serde(default)]
    mode: DhcpMode,
    lease_file: Option<PathBuf>,
    #[serde(default)]
    unknown_machines: UnknownMachines,
    uefi_boot_file: Option<String>,
    #[serde(default)]
    subnets: Vec<SubnetFile>,
    /// Ports, for tests in unprivileged setups; 67 and 4011 by default.
    port: Option<u16>,
    proxy_port: Option<u16>,
    #[serde(default)]
    limits: crate::dhcp::limits::LimitsFile,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SubnetFile {
    subnet: String,
    pool: [Ipv4Addr; 2],
    gateway: Option<Ipv4Addr>,
    #[serde(default)]
    dns: Vec<Ipv4Addr>,
    domain: Option<String>,
    lease_seconds: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TftpFile {
    root: Option<PathBuf>,
    port: Option<u16>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpFile {
    port: Option<u16>,
    images_dir: Option<PathBuf>,
    max_connections: Option<usize>,
    idle_seconds: Option<u64>,
    tls: Option<TlsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TlsFile {
    port: Option<u16>,
    cert_file: PathBuf,
    key_file: PathBuf,
    next_cert_file: Option<PathBuf>,
}

/// Where the bootserver answers HTTPS, and with which certificate (`http.tls`): the agent's
/// credentials and configuration go only there once it is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The HTTPS port (8443).
    pub port: u16,
    /// The certificate chain (PEM), the server's own first.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The certificate that will replace it (`nextCertFile`, during a rotation): agents are
    /// told to accept it too, with every credential answer.
    pub next_cert_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MachineFile {
    name: String,
    macs: Vec<String>,
    ipv4: Option<Ipv4Addr>,
    hostname: Option<String>,
    #[serde(default)]
    architecture: Architecture,
    #[serde(default)]
    firmware: Firmware,
    boot: Option<BootFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BootFile {
    kernel: String,
    initrd: String,
    #[serde(default)]
    args: Vec<String>,
}

/// One IPv4 subnet the DHCP server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// Network address.
    pub network: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// First and last address of the dynamic pool (inclusive).
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// Default gateway (option 3).
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers (option 6).
    pub dns: Vec<Ipv4Addr>,
    /// Domain name (option 15).
    pub domain: Option<String>,
    /// Lease time in seconds (option 51).
    pub lease_seconds: u32,
}

impl Subnet {
    /// The subnet mask.
    pub fn mask(&self) -> Ipv4Addr {
        Ipv4Addr::from(mask_bits(self.prefix))
    }

    /// Whether `ip` lies in the subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask_bits(self.prefix) == u32::from(self.network)
    }

    /// Whether `ip` lies in the dynamic pool.
    pub fn in_pool(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.pool.0)..=u32::from(self.pool.1)).contains(&u32::from(ip))
    }
}

fn mask_bits(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

/// Validated settings.
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
    /// DHCP mode.
    pub dhcp_mode: DhcpMode,
    /// Subnets with pools (full mode).
    pub subnets: Vec<Subnet>,
    /// Pool addresses per relay and per relay port (`dhcp.limits`).
    pub dhcp_limits: crate::dhcp::limits::SourceLimits,
    /// Where leases are kept (full mode).
    pub lease_file: PathBuf,
    /// What to do with unknown PXE clients.
    pub unknown_machines: UnknownMachines,
    /// The x86-64 UEFI boot file: `ipxe.efi` or `snponly.efi`.
    pub uefi_boot_file: String,
    /// DHCP port (67).
    pub dhcp_port: u16,
    /// ProxyDHCP port (4011).
    pub proxy_port: u16,
    /// TFTP root (the iPXE binaries).
    pub tftp_root: PathBuf,
    /// TFTP port (69).
    pub tftp_port: u16,
    /// HTTP port.
    pub http_port: u16,
    /// Directory of kernels, initrds and images served under `/images/`.
    pub images_dir: PathBuf,
    /// How many HTTP connections may be open, and how long one may sit idle.
    pub http_limits: crate::http::sendfile::ConnectionLimits,
    /// HTTPS for the agent's credentials and configuration (`http.tls`).
    pub tls: Option<TlsSettings>,
    /// The machines of the file (standalone mode).
    pub machines: Vec<Arc<MachineRecord>>,
    /// Whether the PXE provider runs (power through BMCs; backend kubernetes only).
    pub power_enabled: bool,
    /// The PXE provider's settings.
    pub power: unbounded_pxe::settings::PowerSettings,
    /// Agent credentials ([`crate::credentials`]); `None` when not configured.
    pub credentials: Option<crate::credentials::IssuerSettings>,
    /// What the inspection boot of an unknown machine boots, and the bounds of the door
    /// ([`crate::discovery`]); always set when `unknown_machines` is `Discover`.
    pub discovery: Option<crate::discovery::DiscoverySettings>,
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
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with(text, &Defaults::default())
    }

    /// Parses and validates configuration text, with `defaults` for what it leaves out.
    pub fn parse_with(text: &str, defaults: &Defaults) -> Result<Self, ConfigError> {
        let file: File = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        let subnets = file
            .dhcp
            .subnets
            .iter()
            .map(validate_subnet)
            .collect::<Result<Vec<_>, _>>()?;
        if file.dhcp.mode == DhcpMode::Full && subnets.is_empty() {
            return Err(ConfigError::Invalid(
                "dhcp.mode full needs at least one entry in dhcp.subnets".into(),
            ));
        }
        let uefi_boot_file = file
            .dhcp
            .uefi_boot_file
            .unwrap_or_else(|| "snponly.efi".into());
        if !["ipxe.efi", "snponly.efi"].contains(&uefi_boot_file.as_str()) {
            return Err(ConfigError::Invalid(format!(
                "dhcp.uefiBootFile must be ipxe.efi or snponly.efi, not {uefi_boot_file:?}"
            )));
        }
        if file.backend == BackendKind::Kubernetes && !file.machines.is_empty() {
            return Err(ConfigError::Invalid(
                "backend kubernetes takes machines from the cluster: remove the machines list"
                    .into(),
            ));
        }
        let machines = validate_machines(file.machines, &subnets)?;
        let discovery = file
            .discovery
            .as_ref()
            .map(validate_discovery)
            .transpose()?;
        if file.dhcp.unknown_machines == UnknownMachines::Discover && discovery.is_none() {
            return Err(ConfigError::Invalid(
                "dhcp.unknownMachines: discover needs discovery.boot: the host OS kernel and initrd the inspection boot runs (such as {kernel: <version>/vmlinuz, initrd: <version>/initrd.img})".into(),
            ));
        }
        let power = unbounded_pxe::settings::PowerSettings::try_from(&file.power)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let credentials = file
            .credentials
            .as_ref()
            .map(|c| validate_credentials(c, file.backend))
            .transpose()?;
        Ok(Self {
            interface: file.interface,
            router_advertisements: file.router_advertisements.unwrap_or(true),
            server_address: file.server_address,
            backend: file.backend,
            dhcp_mode: file.dhcp.mode,
            dhcp_limits: crate::dhcp::limits::SourceLimits::try_from(&file.dhcp.limits)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?,
            subnets,
            lease_file: file
                .dhcp
                .lease_file
                .unwrap_or_else(|| PathBuf::from("/var/lib/unbounded/leases.log")),
            unknown_machines: file.dhcp.unknown_machines,
            uefi_boot_file,
            dhcp_port: file.dhcp.port.unwrap_or(67),
            proxy_port: file.dhcp.proxy_port.unwrap_or(4011),
            tftp_root: file.tftp.root.unwrap_or_else(|| defaults.tftp_root.clone()),
            tftp_port: file.tftp.port.unwrap_or(69),
            http_port: file.http.port.unwrap_or(8080),
            http_limits: http_limits(&file.http)?,
            tls: file.http.tls.as_ref().map(|tls| TlsSettings {
                port: tls.port.unwrap_or(8443),
                cert_file: tls.cert_file.clone(),
                key_file: tls.key_file.clone(),
                next_cert_file: tls.next_cert_file.clone(),
            }),
            images_dir: file
                .http
                .images_dir
                .unwrap_or_else(|| PathBuf::from("/var/lib/unbounded/images")),
            machines,
            power_enabled: file.backend == BackendKind::Kubernetes
                && file.power.enabled.unwrap_or(true),
            power,
            credentials,
            discovery,
        })
    }

    /// The base URL of our HTTP server, as machines reach it.
    pub fn http_base(&self) -> String {
        format!("http://{}:{}", self.server_address, self.http_port)
    }

    /// Where HTTP listens.
    pub fn http_listen(&self) -> SocketAddr {
        SocketAddr::from((self.server_address, self.http_port))
    }
}

fn http_limits(http: &HttpFile) -> Result<crate::http::sendfile::ConnectionLimits, ConfigError> {
    let defaults = crate::http::sendfile::ConnectionLimits::default();
    let max_connections = http.max_connections.unwrap_or(defaults.max_connections);
    if !(16..=65_536).contains(&max_connections) {
        return Err(ConfigError::Invalid(format!(
            "http.maxConnections must be between 16 and 65536, not {max_connections}"
        )));
    }
    let idle_seconds = http.idle_seconds.unwrap_or(defaults.idle.as_secs());
    if !(5..=3600).contains(&idle_seconds) {
        return Err(ConfigError::Invalid(format!(
            "http.idleSeconds must be between 5 and 3600, not {idle_seconds}"
        )));
    }
    Ok(crate::http::sendfile::ConnectionLimits {
        max_connections,
        idle: std::time::Duration::from_secs(idle_seconds),
    })
}

/// The in-cluster CA bundle, the default `credentials.caFile`.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

fn validate_credentials(
    c: &CredentialsFile,
    backend: BackendKind,
) -> Result<crate::credentials::IssuerSettings, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("credentials.{m}"));
    if backend != BackendKind::Kubernetes {
        return Err(invalid(
            "apiServer: agent credentials need backend kubernetes (they are cluster tokens)".into(),
        ));
    }
    if !c.api_server.starts_with("https://") {
        return Err(invalid(format!(
            "apiServer must be an https:// URL as machines reach it, not {:?}",
            c.api_server
        )));
    }
    let ca_file = c
        .ca_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(IN_CLUSTER_CA));
    let ca_pem = std::fs::read_to_string(&ca_file)
        .map_err(|e| invalid(format!("caFile {}: {e}", ca_file.display())))?;
    if !ca_pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(format!(
            "caFile {} holds no PEM certificate",
            ca_file.display()
        )));
    }
    let seconds = |name: &str, value: Option<i64>, default: i64| {
        let v = value.unwrap_or(default);
        // TokenRequest refuses less than 10 minutes; a day bounds what a stolen token is worth.
        if (600..=86_400).contains(&v) {
            Ok(v)
        } else {
            Err(invalid(format!(
                "{name} must be between 600 and 86400, not {v}"
            )))
        }
    };
    let nonce_seconds = c.nonce_seconds.unwrap_or(1800);
    if !(60..=86_400).contains(&nonce_seconds) {
        return Err(invalid(format!(
            "nonceSeconds must be between 60 and 86400, not {nonce_seconds}"
        )));
    }
    // The agent gives up on a request after 30 s: the answer (503 + Retry-After) must come
    // before that, or the agent retries while its nonce is still reserved.
    let mint_timeout_seconds = c.mint_timeout_seconds.unwrap_or(20);
    if !(1..=25).contains(&mint_timeout_seconds) {
        return Err(invalid(format!(
            "mintTimeoutSeconds must be between 1 and 25 (below the agent's 30 s request timeout), not {mint_timeout_seconds}"
        )));
    }
    // Long enough for an agent whose answer was lost to ask again (it waits up to 30 s for
    // one answer), short beside the token's lifetime.
    let replay_seconds = c.replay_seconds.unwrap_or(120);
    if !(1..=600).contains(&replay_seconds) {
        return Err(invalid(format!(
            "replaySeconds must be between 1 and 600, not {replay_seconds}"
        )));
    }
    Ok(crate::credentials::IssuerSettings {
        replay_seconds,
        api_server: c.api_server.trim_end_matches('/').to_owned(),
        ca_pem,
        token_seconds: seconds("tokenSeconds", c.token_seconds, 3600)?,
        bootstrap_token_seconds: seconds("bootstrapTokenSeconds", c.bootstrap_token_seconds, 3600)?,
        nonce_seconds,
        nonce_file: c.nonce_file.clone(),
        mint_timeout: Duration::from_secs(mint_timeout_seconds),
        default_identity: c
            .default_identity
            .unwrap_or(unbounded_api::identity::IdentityMode::Network),
    })
}

fn validate_subnet(s: &SubnetFile) -> Result<Subnet, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("dhcp.subnets {}: {m}", s.subnet));
    let (network, prefix) = s
        .subnet
        .split_once('/')
        .ok_or_else(|| invalid("expected address/prefix such as 10.99.0.0/24".into()))?;
    let network: Ipv4Addr = network
        .parse()
        .map_err(|_| invalid("not an IPv4 network".into()))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| invalid("prefix length must be between 8 and 30".into()))?;
    let subnet = Subnet {
        network,
        prefix,
        pool: (s.pool[0], s.pool[1]),
        gateway: s.gateway,
        dns: s.dns.clone(),
        domain: s.domain.clone(),
        lease_seconds: s.lease_seconds.unwrap_or(3600).max(60),
    };
    if u32::from(network) & !mask_bits(prefix) != 0 {
        return Err(invalid("host bits are set in the network address".into()));
    }
    if !subnet.contains(s.pool[0]) || !subnet.contains(s.pool[1]) || s.pool[0] > s.pool[1] {
        return Err(invalid(format!(
            "pool {}–{} must lie inside the subnet, first address first",
            s.pool[0], s.pool[1]
        )));
    }
    Ok(subnet)
}

fn validate_machines(
    machines: Vec<MachineFile>,
    subnets: &[Subnet],
) -> Result<Vec<Arc<MachineRecord>>, ConfigError> {
    let mut seen_macs = std::collections::BTreeMap::new();
    let mut seen_ips = std::collections::BTreeMap::new();
    let mut out = Vec::with_capacity(machines.len());
    for m in machines {
        let invalid = |msg: String| ConfigError::Invalid(format!("machine {}: {msg}", m.name));
        if m.macs.is_empty() {
            return Err(invalid("needs at least one MAC address in macs".into()));
        }
        let macs = m
            .macs
            .iter()
            .map(|s| s.parse::<MacAddr>().map_err(|e| invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        for mac in &macs {
            if let Some(other) = seen_macs.insert(*mac, m.name.clone()) {
                return Err(invalid(format!("MAC {mac} is also machine {other}'s")));
            }
        }
        if let Some(ip) = m.ipv4 {
            if let Some(other) = seen_ips.insert(ip, m.name.clone()) {
                return Err(invalid(format!(
                    "address {ip} is also machine {other}'s: never hand one address to two machines"
                )));
            }
            if !subnets.is_empty() && !subnets.iter().any(|s| s.contains(ip)) {
                return Err(invalid(format!("address {ip} is in no dhcp.subnets entry")));
            }
        }
        out.push(Arc::new(MachineRecord {
            hostname: m.hostname.or_else(|| Some(m.name.clone())),
            name: m.name,
            macs,
            ipv4: m.ipv4,
            architecture: m.architecture,
            firmware: m.firmware,
            boot: m.boot.map(|b| BootTarget {
                kernel_url: b.kernel,
                initrd_url: b.initrd,
                kernel_args: b.args,
                configuration: None,
            }),
            discovery_waiting: false,
            identity: Default::default(),
        }));
    }
    Ok(out)
}

/// `discovery`: boot values iPXE takes as they are (no space, control character, `$` or
/// `#`), and bounds within reason (a rate of at least one, a report large enough for a real
/// server's inventory and small enough for one API object).
fn validate_discovery(
    file: &DiscoveryFile,
) -> Result<crate::discovery::DiscoverySettings, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("discovery.{m}"));
    let boot = &file.boot;
    for (field, value) in [("boot.kernel", &boot.kernel), ("boot.initrd", &boot.initrd)]
        .into_iter()
        .chain(boot.args.iter().map(|a| ("boot.args", a)))
    {
        if value.is_empty()
            || value
                .chars()
                .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '$' | '#'))
        {
            return Err(invalid(format!(
                "{field}: {:?} must be non-empty, without spaces, control characters, '$' or '#'",
                value.escape_default().to_string()
            )));
        }
    }
    let defaults = crate::discovery::DiscoveryLimits::default();
    let bounded = |name: &str,
                   value: Option<usize>,
                   default: usize,
                   range: std::ops::RangeInclusive<usize>| {
        let value = value.unwrap_or(default);
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(invalid(format!(
                "{name} must be between {} and {}, not {value}",
                range.start(),
                range.end()
            )))
        }
    };
    let max_unclaimed = bounded(
        "maxUnclaimed",
        file.max_unclaimed,
        defaults.max_unclaimed,
        1..=10_000,
    )?;
    Ok(crate::discovery::DiscoverySettings {
        kernel: boot.kernel.clone(),
        initrd: boot.initrd.clone(),
        kernel_args: boot.args.clone(),
        limits: crate::discovery::DiscoveryLimits {
            creations_per_minute: bounded(
                "creationsPerMinute",
                file.creations_per_minute,
                defaults.creations_per_minute,
                1..=600,
            )?,
            max_unclaimed,
            max_unclaimed_per_sender: bounded(
                "maxUnclaimedPerSender",
                file.max_unclaimed_per_sender,
                defaults.max_unclaimed_per_sender.min(max_unclaimed),
                1..=max_unclaimed,
            )?,
            max_body_bytes: bounded(
                "maxBodyBytes",
                file.max_body_bytes,
                defaults.max_body_bytes,
                4096..=1024 * 1024,
            )?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(s.dhcp_mode, DhcpMode::Full);
        assert_eq!(s.uefi_boot_file, "snponly.efi");
        assert_eq!((s.dhcp_port, s.proxy_port, s.tftp_port), (67, 4011, 69));
        assert_eq!(s.subnets[0].mask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(s.subnets[0].lease_seconds, 3600);
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
        assert_eq!(settings.tftp_root, Path::new("/usr/share/unbounded/ipxe"));
        assert_eq!(settings.images_dir, Path::new("/var/lib/unbounded/images"));
        assert_eq!(settings.backend, BackendKind::Kubernetes);
    }

    #[test]
    fn the_tftp_root_defaults_to_where_the_bootserver_runs() {
        let text = "serverAddress: 10.0.0.1\ndhcp: {mode: proxy}\n";
        assert_eq!(
            Settings::parse(text).unwrap().tftp_root,
            Path::new("/usr/lib/ipxe")
        );
        let image = Defaults {
            tftp_root: PathBuf::from("/usr/share/unbounded/ipxe"),
        };
        assert_eq!(
            Settings::parse_with(text, &image).unwrap().tftp_root,
            image.tftp_root
        );
        let explicit = format!("{text}tftp: {{root: /srv/tftp}}\n");
        assert_eq!(
            Settings::parse_with(&explicit, &image).unwrap().tftp_root,
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
