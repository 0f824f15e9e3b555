//! Unbounded's testbed: a real local Kubernetes control plane ([`cluster`]), network
//! namespaces for network tests, QEMU VMs that network-boot, and emulated BMCs.
//!
//! Everything here is used by the project's own tests and by `unbounded-testbed up`, the
//! main job a person runs.

pub mod appliance;
pub mod appliance_scenarios;
pub mod bench;
pub mod bmc;
pub mod boot_artifacts;
pub mod capi_scenario;
pub mod cluster;
pub mod containers;
pub mod discovery_scenario;
pub mod disk_scenario;
pub mod failure;
pub mod images;
pub mod in_place_scenario;
pub mod ipv6_scenario;
pub mod kubelet_scenario;
pub mod lab;
pub mod leaks;
pub mod lldp;
pub mod netns;
pub mod oci;
pub mod overlay;
pub mod plugin_scenario;
pub mod pool_scenario;
pub mod ports;
pub mod process;
pub mod progress;
pub mod qemu;
pub mod registry;
pub mod sbom;
pub mod scenario;
pub mod setup;
pub mod stall;
pub mod swtpm;
pub mod testkit;
