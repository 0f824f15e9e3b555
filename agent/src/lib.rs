//! Unbounded's agent, which runs in the booted host OS of a machine.
//!
//! Not built yet: it arrives with its own issue (after the control plane and the
//! bootserver). What it will do, from DESIGN.md: read its identity from the kernel command
//! line and its configuration from the bootserver; pave the `systemd-nspawn` node container
//! from the MachineConfigurationVersion's image (sha256-verified) and start it over D-Bus;
//! repave when its Node is deleted; handle `reboot`, `shutdown` and `restartService`
//! MachineOperations through the handler API of `unbounded_api`.
//!
//! The crate exists now so that the workspace has its final shape and the kernel command-line
//! contract below is shared with the bootserver's iPXE scripts.

/// Kernel command-line key that carries the Machine's name.
pub const CMDLINE_MACHINE: &str = "unbounded.machine";
/// Kernel command-line key that carries the bootserver's base URL.
pub const CMDLINE_BOOTSERVER: &str = "unbounded.bootserver";
