//! DHCPv6 (RFC 8415) for network boot over IPv6 (issue 42, begun): what a v6 client is
//! and which Machine it is ([`identify`]), and which boot file URL it gets ([`boot`], the
//! v4 decision over v6 options), and the relay envelopes around a relayed
//! message ([`relay`]). The server itself (stateful addresses in the
//! address book, boot options, relays) is being built on top; docs/bootserver.md's IPv6
//! section says what firmware sends and what is decided.

pub mod boot;
pub mod decide;
pub mod identify;
pub mod relay;
pub mod serve;
pub mod settings;
pub mod wire;
