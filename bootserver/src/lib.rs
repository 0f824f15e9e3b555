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

pub mod backend;
pub mod boot;
pub mod boot_images;
pub mod config;
pub mod credentials;
pub mod dhcp;
pub mod discovery;
pub mod discovery_writes;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
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
