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

pub mod backend;
pub mod bmc_secrets;
pub mod boot;
pub mod config;
pub mod credentials;
pub mod dhcp;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod kube_backend;
pub mod leases;
pub mod metrics;
pub mod power;
pub mod pxe_provider;
pub mod ra;
pub mod server;
pub mod tftp;
pub mod tls;
