//! Unbounded's bootserver: DHCP and ProxyDHCP, TFTP and HTTP/iPXE that network-boot
//! machines, with what it knows about machines behind [`backend::MachineBackend`].
//!
//! Each service is a listener, a decision and a backend: [`dhcp::Responder::decide`] and
//! [`boot`] decide from memory (the machine cache, the lease index), the socket loops act.
//! [`server::run`] starts them all from validated [`config::Settings`].
//!
//! No request stops a service: DHCP datagrams are validated by [`dhcp::wire`] before
//! anything reads them, TFTP requests by [`tftp::packet`], and a panic while handling one
//! DHCP, TFTP or HTTP request is caught, logged, counted (`panics{service}`) and only that
//! request dropped. A service task that ends anyway stops the process with a non-zero exit
//! and a message naming it ([`server`]). The request paths are fuzzed ([`fuzzing`],
//! `scripts/fuzz`).
//!
//! Nothing is served half-configured: [`preflight`] compares the settings with the host
//! (the interface and its addresses, the iPXE builds, the installed boot images) before any
//! service starts, and holds the start, with the reasons in the log and in `/readyz`, until
//! they agree. [`boot_images`] installs versioned sets of boot images
//! (`unbounded-bootserver install-images`).
//!
//! # Rooms
//!
//! The crate is the provisioning network; the PXE provider (BMC power, inspection) is the
//! `unbounded-pxe` crate, which the binary starts beside these servers.
//!
//! | room | what it does |
//! |---|---|
//! | [`config`] | assembles the validated [`config::Settings`] from each room's own settings (each room's `settings` module converts its section by `TryFrom`; [`setting`] is their error) |
//! | [`backend`], [`kube_backend`] | what the bootserver knows about machines: the file's machines ([`backend::standalone`]) or the cluster's Machines, in memory |
//! | [`dhcp`] | DHCP and ProxyDHCP: wire → decision (a chain of steps) → durable commit → reply |
//! | [`dhcp6`] | DHCPv6 (issue 42, begun): which Machine a v6 client is |
//! | [`leases`] | the address book (one owner per address) and its durable log |
//! | [`boot`] | which boot file and which iPXE script a client gets |
//! | [`tftp`], [`http`], [`files`] | TFTP and HTTP: iPXE builds, scripts, images, the agent's routes |
//! | [`identity`], [`credentials`], [`nonce_file`] | who a request comes from (link layer, PXE exchanges, TPM) and the agent's credentials |
//! | [`discovery`], [`discovery_writes`] | unknown machines: the inspection boot, the report's decision, its writes |
//! | [`preflight`], [`interfaces`], [`boot_images`] | the host checked before serving, installed boot image sets |
//! | [`ra`], [`metrics`], [`server`] | router advertisements, Prometheus, starting and watching every service |

pub mod backend;
pub mod boot;
pub mod boot_images;
pub mod config;
pub mod credentials;
pub mod dhcp;
pub mod dhcp6;
pub mod discovery;
pub mod discovery_writes;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod ha;
pub mod http;
pub mod identity;
pub mod interfaces;
pub mod kube_backend;
pub mod leases;
pub mod metrics;
pub mod nonce_file;
pub mod preflight;
pub mod ra;
pub mod server;
pub mod setting;
pub mod tftp;
