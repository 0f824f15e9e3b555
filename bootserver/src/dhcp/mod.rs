//! DHCP: a full server (pools, reservations, durable leases) or a ProxyDHCP beside another
//! server (boot information only, never an address).
//!
//! A datagram goes through three rooms, each its own module:
//!
//! 1. [`wire::parse`] validates the bytes and decodes them into one [`wire::Request`]
//!    (malformed datagrams are dropped and counted by [`wire::Malformed`] reason);
//! 2. [`decide::Responder::decide`] turns the request, the machine backend and the address
//!    book ([`crate::leases::AddressBook`], the one owner of who holds what) into a
//!    [`Decision`], by a chain of steps over one [`decide::Context`] (classify, route,
//!    admit, subnet, limits, pool, boot options, reply: the table in [`decide`]), changing
//!    the book as it decides through [`allocate::Pool`], in memory only; replies are built
//!    and encoded by [`reply`], settings come from [`settings`];
//! 3. [`mod@serve`] is the socket loop: it does the I/O and makes a lease durable before it
//!    sends the ACK that promises it ([`commit`]: one thread writes and syncs every record
//!    queued meanwhile at once, then tells the book).
//!
//! The fuzz target (`bootserver/fuzz`, `dhcp`) runs 1 and 2 and the encoding exactly as the
//! server does.
//!
//! # RFC behaviour
//!
//! - **INIT-REBOOT** (RFC 2131 §4.3.2): a REQUEST without server identifier, with a
//!   requested address and no `ciaddr`, whose address is not on the client's network gets a
//!   DHCPNAK at once; on the right network, a client we have no record of gets no answer
//!   (another server may know it), one whose record differs gets a DHCPNAK.
//! - **Client identifier** (option 61, RFC 2131 §4.2): leases are keyed by it when present
//!   (see [`crate::leases::ClientKey`]), so a client that comes back from another NIC with
//!   the same identifier gets its lease back; every reply echoes it (RFC 6842). A
//!   Machine's MAC list still decides the boot and the reservation: a request whose `chaddr`
//!   is one of a Machine's MACs gets that Machine's reserved address and boot file whatever
//!   identifier it sends (firmware, iPXE and the booted OS send different ones).
//! - **Relay agent information** (option 82, RFC 3046): echoed unchanged, byte for byte, as
//!   the last option of every reply to a request that carried it. The client's subnet is
//!   chosen from, in order: the link-selection sub-option (RFC 3527; only when relayed), the
//!   subnet-selection option 118 (RFC 3011, echoed back), `giaddr`, then the subnet of the
//!   server's own address. A relayed request for a subnet we do not serve is dropped.
//!
//! # Why requests are not decoded with `dhcproto`
//!
//! `dhcproto` 0.15.0's `Message::chaddr()` returns `&self.chaddr[..hlen]` over the 16-byte
//! `chaddr` field, and `Message::decode` accepts any `hlen`: a request with `hlen` above 16
//! (one datagram, from any host on the provisioning network) makes `chaddr()` panic with
//! "range end index … out of range for slice of length 16", which used to stop the whole
//! bootserver. Its `Display` calls `chaddr()` too. Its option decoder also stops silently at
//! the first malformed option and re-encodes option 82 through a map (reordering and
//! dropping sub-options). So requests are validated and decoded by [`wire`], and
//! `dhcproto` only encodes our own replies, built from validated values (`set_chaddr` with a
//! six-byte MAC), with the echoed options appended by [`reply`].

pub mod allocate;
pub mod commit;
pub mod decide;
#[doc(hidden)]
pub mod invariants;
pub mod limits;
#[cfg(test)]
mod pair_invariants;
pub mod reply;
pub mod serve;
pub mod settings;
pub mod wire;

use std::net::{Ipv4Addr, SocketAddrV4};

use reply::Reply;

use crate::leases::{ClientKey, Lease, Ticket};

pub use decide::Responder;
pub use serve::{open_socket, serve};

/// Errors of the DHCP service.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    /// A socket could not be set up.
    #[error("DHCP socket on {what}: {source}")]
    Socket {
        /// Which socket.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The address book can no longer answer (a panic poisoned it): the service stops so
    /// that the process restarts and reads the log again, rather than guess.
    #[error("the address book cannot answer any more: {0}")]
    LeaseStore(#[source] crate::leases::LeaseError),
    /// The thread that makes leases durable could not be started.
    #[error("starting the DHCP lease commit thread: {0}")]
    CommitThread(#[source] std::io::Error),
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send nothing.
    Drop(DropReason),
    /// Send this reply to this address, after making `commit` durable when set.
    Reply {
        /// The reply.
        reply: Reply,
        /// Where to.
        to: SocketAddrV4,
        /// A lease to make durable before sending (ACK), and the ticket the book gave its
        /// REQUEST: the book holds the address for the client until the commit thread
        /// answers.
        commit: Option<(Lease, Ticket)>,
        /// The offered address was taken back from the oldest offer nobody requested.
        reclaimed: bool,
    },
    /// The client gave its lease back (RELEASE): the book has it free; persist it.
    Release {
        /// The client.
        key: ClientKey,
        /// The address.
        ip: Ipv4Addr,
    },
    /// An address is in use by someone unknown (DECLINE): the book keeps it out of the pool
    /// until `until`; persist it.
    Decline {
        /// The address.
        ip: Ipv4Addr,
        /// Seconds since the Unix epoch.
        until: u64,
    },
}

/// Why a datagram got no reply. Each variant is a metric label (`dhcp_dropped{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The datagram is not a request we can read.
    Malformed(wire::Malformed),
    /// A message type a server does not answer (OFFER, ACK, …, or unknown).
    MessageType,
    /// DHCP is off.
    DhcpOff,
    /// A network-boot client whose MAC no Machine has (and discovery is off).
    UnknownBootClient,
    /// ProxyDHCP or the boot server: not a network-boot client we boot.
    NotOurBootClient,
    /// No subnet of ours matches the request's link selection, option 118 or `giaddr`.
    UnknownSubnet,
    /// No free address left in the pool.
    PoolExhausted,
    /// A REQUEST for another server's offer.
    OtherServer,
    /// A REQUEST without requested address or `ciaddr`.
    NoAddress,
    /// INIT-REBOOT, RENEWING or REBINDING from a client we have no record of: another
    /// server may know it (RFC 2131 §4.3.2).
    UnknownClient,
    /// A DECLINE or RELEASE for an address the client does not hold.
    NotHeld,
    /// The address book could not answer.
    LeaseStore,
    /// Deciding panicked (caught; the request is dropped, the service goes on).
    Panic,
    /// Too many replies in flight: load shed.
    Overloaded,
    /// Making the lease durable failed: no ACK.
    CommitFailed,
    /// Making the lease durable took too long: no ACK (the client retransmits).
    CommitTimeout,
    /// The client's REQUEST for another address is still being made durable.
    CommitInFlight,
    /// The lease was made durable, but the client released or declined the address
    /// meanwhile: no ACK.
    Withdrawn,
    /// The reply could not be encoded.
    Encode,
    /// A new pool address for a client behind a relay, or a relay's port, that already
    /// holds its limit of them (`dhcp.limits`).
    SourceLimit,
    /// One of a pair of servers still recovering its book from its partner.
    PairRecovering,
    /// A DISCOVER the pair partner answers (the client's hash is its half).
    PartnersClient,
    /// A RELEASE in a pair: the address stays the client's until its lease ends.
    ReleaseKeptInPair,
    /// A REQUEST to extend a lease of the pair partner's part while the partner cannot
    /// hear of it first.
    PartnersLease,
    /// A REQUEST to extend a lease of this server's part of the pool while it holds
    /// neither the part's fence nor an answering partner (the partner may take the part).
    NoFence,
    /// Written, but neither the partner took it nor does this server hold the fence that
    /// would let it acknowledge alone ([`crate::ha::pair::Pair::may_acknowledge`]).
    Unreplicated,
}

impl DropReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed(m) => m.as_str(),
            Self::MessageType => "message_type",
            Self::DhcpOff => "dhcp_off",
            Self::UnknownBootClient => "unknown_boot_client",
            Self::NotOurBootClient => "not_our_boot_client",
            Self::UnknownSubnet => "unknown_subnet",
            Self::PoolExhausted => "pool_exhausted",
            Self::OtherServer => "other_server",
            Self::NoAddress => "no_address",
            Self::UnknownClient => "unknown_client",
            Self::NotHeld => "not_held",
            Self::LeaseStore => "lease_store",
            Self::Panic => "panic",
            Self::Overloaded => "overloaded",
            Self::CommitFailed => "commit_failed",
            Self::CommitTimeout => "commit_timeout",
            Self::CommitInFlight => "commit_in_flight",
            Self::Withdrawn => "withdrawn",
            Self::Encode => "encode",
            Self::SourceLimit => "source_limit",
            Self::PairRecovering => "pair_recovering",
            Self::PartnersClient => "partners_client",
            Self::ReleaseKeptInPair => "release_kept_in_pair",
            Self::PartnersLease => "partners_lease",
            Self::NoFence => "no_fence",
            Self::Unreplicated => "unreplicated",
        }
    }
}

impl From<wire::Malformed> for DropReason {
    fn from(m: wire::Malformed) -> Self {
        Self::Malformed(m)
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod decide_tests;
