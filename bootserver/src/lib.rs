//! Unbounded's bootserver: DHCP and ProxyDHCP, TFTP and HTTP/iPXE that network-boot
//! machines, with what it knows about machines behind [`backend::MachineBackend`].
//!
//! Each service is a listener, a decision and a backend: [`dhcp::Responder::decide`] and
//! [`boot`] decide from memory (the machine cache, the lease index), the socket loops act.
//! [`server::run`] starts them all from validated [`config::Settings`].

pub mod backend;
pub mod boot;
pub mod config;
pub mod dhcp;
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
