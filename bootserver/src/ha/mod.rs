//! Two bootservers on one provisioning network (docs/bootserver.md, "Two bootservers on one
//! network"): what each server of a pair may do, decided from plain data, and the shells
//! that feed those decisions.
//!
//! - [`settings`]: the `ha:` section, validated once;
//! - [`parts`]: which server's part of a pool an address is in (each server makes new
//!   bindings only in its own part, so uniqueness never depends on the two talking);
//! - [`pair`]: the pair's state as this server sees it (up, interrupted, partner down,
//!   recovering), moved by events, and what each state allows;
//! - [`wire`]: the link's handshake and frames, authenticated with the pair's key;
//! - [`link`]: the shells of the link to the partner, its heartbeats, the pair's clock;
//! - [`fence`]: the part fences' shells, a Kubernetes Lease per part.
//!
//! The two-server property test in `dhcp/pair_invariants.rs` drives these decisions and the
//! real DHCP decision code through loss, delay, partition, restarts and lost fences.

pub mod fence;
pub mod link;
pub mod pair;
pub mod parts;
pub mod settings;
pub mod wire;
