//! Unbounded's bootserver: DHCP and ProxyDHCP, TFTP and HTTP/iPXE that network-boot machines,
//! with what it knows about machines behind [`backend::MachineBackend`].

pub mod backend;
