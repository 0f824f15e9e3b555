//! Whether a request comes from the machine it names, judged only by what the bootserver
//! itself saw of that machine on the provisioning network: never by what the request says.
//!
//! A boot script's nonce (and so the agent's credentials) and a discovery report are
//! accepted only from a peer that [`vouch`] vouches for. The evidence, per DHCP mode:
//! - **full DHCP**: the peer holds the machine's reservation or a lease of one of its MACs
//!   (the bootserver's own address book);
//! - **ProxyDHCP**: the peer's address is the one the bootserver saw in one of the machine's
//!   MACs' PXE boot-server exchange (port 4011, [`exchanges`]): iPXE sends it from the
//!   address the other DHCP server gave it, with its MAC in `chaddr`, because the port-67
//!   offer leaves the boot file out ([`crate::dhcp`]);
//! - **no DHCP** (`dhcp.mode: off`; for a v6 peer also `dhcp6.mode: proxy`, where iPXE
//!   takes its address from the network's server and never talks to us from it): nothing but
//!   the link layer below.
//!
//! And in every mode, the link layer: when the kernel's neighbour table has the peer's
//! link-layer address (an on-link peer: it had to, to answer the TCP handshake), it must be
//! one of the machine's MACs ([`neighbours`]). So a host on the provisioning network that
//! asks for another machine's script from its own address, or claims another machine's
//! MAC in a forged DHCP packet, is refused; what is left is a host that takes over both the
//! machine's address and its MAC on the wire (ARP and MAC spoofing), which only the TPM
//! mode stops (docs/security.md).

use std::net::IpAddr;

use crate::backend::MacAddr;
use crate::dhcp::settings::DhcpMode;

pub mod exchanges;
pub mod neighbours;
pub mod tpm;

pub use exchanges::PxeExchanges;
pub use neighbours::LinkLayer;

/// What the bootserver saw of one peer, for one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The peer's address.
    pub peer: IpAddr,
    /// How the bootserver takes part in DHCP.
    pub mode: DhcpMode,
    /// Full DHCP: the peer holds the machine's reservation or a lease of one of its MACs.
    pub holds_address: bool,
    /// ProxyDHCP: the addresses seen in the PXE exchanges of the machine's MACs, recently.
    pub exchanged_from: Vec<IpAddr>,
    /// The peer's link-layer address, where the kernel knows it.
    pub link_layer: LinkLayer,
}

/// Why the bootserver does not vouch for a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unvouched {
    /// The peer's link-layer address is not one of the machine's MACs.
    #[error("the peer's link-layer address {0} is not one of this machine's MACs")]
    OtherHardware(MacAddr),
    /// Full DHCP: the peer holds neither the reservation nor a lease of the machine.
    #[error("the peer holds neither this machine's reservation nor a lease of its MACs")]
    NotItsAddress,
    /// ProxyDHCP: no PXE exchange of the machine came from the peer's address.
    #[error(
        "no PXE boot-server exchange (port 4011) of this machine's MACs came from the peer's address"
    )]
    NoPxeExchange,
    /// ProxyDHCP: the machine's MACs were seen at more than one address, and the link layer
    /// cannot tell which is the machine.
    #[error(
        "this machine's MACs were seen at more than one address in PXE exchanges, and the link layer cannot tell which is the machine"
    )]
    Contested,
    /// No DHCP and no link-layer address: nothing ties the peer to the machine.
    #[error("without DHCP only the peer's link-layer address can vouch for it, and it is unknown")]
    NoEvidence,
}

impl Unvouched {
    /// A fixed label (metrics, Event reasons' suffix).
    pub fn label(self) -> &'static str {
        match self {
            Self::OtherHardware(_) => "other_hardware",
            Self::NotItsAddress => "not_its_address",
            Self::NoPxeExchange => "no_pxe_exchange",
            Self::Contested => "contested",
            Self::NoEvidence => "no_evidence",
        }
    }
}

impl Unvouched {
    /// The reason of the Warning Event on the Machine when a boot script is refused for it
    /// (one per kind: Events of one reason on one object are counted as one series).
    pub fn script_event_reason(self) -> &'static str {
        match self {
            Self::OtherHardware(_) => "ScriptRefusedOtherHardware",
            Self::NotItsAddress => "ScriptRefusedNotItsAddress",
            Self::NoPxeExchange => "ScriptRefusedNoPxeExchange",
            Self::Contested => "ScriptRefusedContested",
            Self::NoEvidence => "ScriptRefusedNoEvidence",
        }
    }
}

/// Whether the evidence shows that the peer is the machine (see the module's rules).
pub fn vouch(evidence: &Evidence) -> Result<(), Unvouched> {
    if let LinkLayer::Other(mac) = evidence.link_layer {
        return Err(Unvouched::OtherHardware(mac));
    }
    let link_matches = evidence.link_layer == LinkLayer::Matches;
    match evidence.mode {
        DhcpMode::Full if evidence.holds_address => Ok(()),
        DhcpMode::Full => Err(Unvouched::NotItsAddress),
        DhcpMode::Proxy => {
            if !evidence.exchanged_from.contains(&evidence.peer) {
                Err(Unvouched::NoPxeExchange)
            } else if evidence
                .exchanged_from
                .iter()
                .any(|ip| *ip != evidence.peer)
                && !link_matches
            {
                Err(Unvouched::Contested)
            } else {
                Ok(())
            }
        }
        DhcpMode::Off if link_matches => Ok(()),
        DhcpMode::Off => Err(Unvouched::NoEvidence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 21));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 50));
    const STRANGER: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);

    fn evidence(
        mode: DhcpMode,
        holds_address: bool,
        exchanged_from: &[IpAddr],
        link_layer: LinkLayer,
    ) -> Evidence {
        Evidence {
            peer: PEER,
            mode,
            holds_address,
            exchanged_from: exchanged_from.to_vec(),
            link_layer,
        }
    }

    #[test]
    fn each_mode_vouches_by_its_own_evidence_and_the_link_layer_vetoes() {
        use DhcpMode::{Full, Off, Proxy};
        use LinkLayer::{Matches, Other, Unknown};
        let cases = [
            ("full, holds", evidence(Full, true, &[], Unknown), Ok(())),
            (
                "full, holds, on-link",
                evidence(Full, true, &[], Matches),
                Ok(()),
            ),
            (
                "full, holds, other hardware",
                evidence(Full, true, &[], Other(STRANGER)),
                Err(Unvouched::OtherHardware(STRANGER)),
            ),
            (
                "full, does not hold",
                evidence(Full, false, &[PEER], Matches),
                Err(Unvouched::NotItsAddress),
            ),
            (
                "proxy, exchanged from the peer",
                evidence(Proxy, false, &[PEER], Unknown),
                Ok(()),
            ),
            (
                "proxy, no exchange",
                evidence(Proxy, true, &[], Matches),
                Err(Unvouched::NoPxeExchange),
            ),
            (
                "proxy, exchanged from another address",
                evidence(Proxy, false, &[OTHER], Matches),
                Err(Unvouched::NoPxeExchange),
            ),
            (
                "proxy, two addresses, off-link",
                evidence(Proxy, false, &[OTHER, PEER], Unknown),
                Err(Unvouched::Contested),
            ),
            (
                "proxy, two addresses, the link layer says this one",
                evidence(Proxy, false, &[OTHER, PEER], Matches),
                Ok(()),
            ),
            (
                "proxy, exchanged, other hardware",
                evidence(Proxy, false, &[PEER], Other(STRANGER)),
                Err(Unvouched::OtherHardware(STRANGER)),
            ),
            ("off, on-link", evidence(Off, false, &[], Matches), Ok(())),
            (
                "off, unknown link layer",
                evidence(Off, true, &[PEER], Unknown),
                Err(Unvouched::NoEvidence),
            ),
        ];
        for (case, evidence, expected) in cases {
            assert_eq!(vouch(&evidence), expected, "{case}");
        }
    }
}
