//! Who a request comes from, as the handlers that hand out secrets need to know: the
//! listener it came through ([`Channel`]), the address book's and the link layer's view of
//! the peer ([`crate::identity`]), and what a peer that is not vouched for gets.

use std::net::IpAddr;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::backend::{MacAddr, MachineRecord};
use crate::boot;
use crate::credentials::Origin;
use crate::dhcp::settings::DhcpMode;
use crate::dhcp6::settings::Dhcp6Mode;
use crate::identity::{self, Evidence, Unvouched};

/// Which listener a request came through (set by [`super::around_each_request`]; a request that
/// came through neither, as in the fuzz target, is taken as plain).
#[derive(Debug, Clone, Copy, Default)]
pub struct Channel {
    /// TLS.
    pub secure: bool,
}

/// Whether a request came over TLS.
pub(super) fn is_secure(request: Option<axum::Extension<Channel>>) -> bool {
    request.is_some_and(|axum::Extension(channel)| channel.secure)
}

/// With `http.tls` set, a route that carries secrets answers only over TLS: over plain HTTP
/// it says where to go (403), before reading anything of the request.
pub(super) fn https_only(
    state: &AppState,
    route: &str,
    channel: Option<axum::Extension<Channel>>,
) -> Option<Response> {
    let tls = state.tls.as_ref()?;
    if is_secure(channel) {
        return None;
    }
    state.metrics.http_request(route, 403);
    Some(
        (
            StatusCode::FORBIDDEN,
            format!(
                "this bootserver answers this over HTTPS only: {}\n",
                tls.url
            ),
        )
            .into_response(),
    )
}

/// Whether `peer` is the machine's reserved address, or leased to one of its MACs. A lease
/// store that cannot answer makes this false (refuse, never guess).
pub(super) fn holds_address(state: &AppState, machine: &MachineRecord, peer: IpAddr) -> bool {
    if machine.reservations().any(|ip| ip == peer) {
        return true;
    }
    match state.leases.lease_at(peer) {
        Ok(Some(lease)) => machine.macs.contains(&lease.mac),
        Ok(None) => false,
        Err(error) => {
            tracing::error!(%error, "the address book cannot answer; refusing");
            false
        }
    }
}

pub(super) fn origin(state: &AppState, machine: &MachineRecord, peer: IpAddr) -> Origin {
    Origin {
        peer,
        holds_address: holds_address(state, machine, peer),
        // Only a full DHCP server knows which address each machine has.
        addresses_known: mode_for(state, peer) == DhcpMode::Full,
        link_layer: identity::neighbours::link_layer_of(peer, &machine.macs),
        secure: false,
    }
}

/// How the bootserver takes part in address assignment for `peer`'s family
/// ([`family_mode`]).
pub(super) fn mode_for(state: &AppState, peer: IpAddr) -> DhcpMode {
    family_mode(state.settings.dhcp.mode, state.settings.dhcp6.mode, peer)
}

/// The DHCPv4 mode for a v4 peer, the DHCPv6 mode for a v6 one: a full DHCPv6 server's
/// book knows which address each machine has. A v6 proxy counts as no DHCP: nothing it sees
/// ties a machine to the address it boots from (UEFI's boot-service Request comes from the
/// firmware's address, which it releases; iPXE takes its address and script from the
/// network's server, under a DUID of its own), so only the link layer vouches, as with
/// `dhcp.mode: off` (measured in `bootserver/tests/pxe6.rs`).
pub(super) fn family_mode(dhcp: DhcpMode, dhcp6: Dhcp6Mode, peer: IpAddr) -> DhcpMode {
    match peer {
        IpAddr::V4(_) => dhcp,
        IpAddr::V6(_) => match dhcp6 {
            Dhcp6Mode::Full => DhcpMode::Full,
            Dhcp6Mode::Proxy | Dhcp6Mode::Off => DhcpMode::Off,
        },
    }
}

/// What the bootserver saw of `peer` for a machine with `macs` ([`crate::identity`]):
/// `holds_address` is the caller's reading of the address book (full DHCP only).
pub(super) fn evidence(
    state: &AppState,
    macs: &[MacAddr],
    holds_address: bool,
    peer: IpAddr,
) -> Evidence {
    let mode = mode_for(state, peer);
    Evidence {
        peer,
        mode,
        holds_address: mode == DhcpMode::Full && holds_address,
        exchanged_from: state
            .exchanges
            .addresses(macs, crate::credentials::now_unix()),
        link_layer: identity::neighbours::link_layer_of(peer, macs),
    }
}

/// The script a peer gets for a machine it was not vouched for as: it says why, and boots
/// nothing. The refusal is logged, counted and reported on the Machine.
pub(super) fn unvouched_script(
    state: &AppState,
    machine: &MachineRecord,
    peer: IpAddr,
    why: Unvouched,
) -> String {
    tracing::warn!(machine = %machine.name, %peer, reason = why.label(), %why, "boot script refused: the bootserver does not vouch for the peer as this machine");
    state.metrics.script_refused(why.label());
    state.backend.report_refusal(
        &machine.name,
        why.script_event_reason(),
        format!("a boot script for this Machine was refused to {peer}: {why}"),
    );
    boot::refusal(&format!(
        "{peer} was not vouched for as machine {}: {why}",
        machine.name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{LinkLayer, vouch};

    #[test]
    fn a_v6_peer_in_dhcpv6_proxy_mode_is_vouched_for_by_the_link_layer_alone() {
        let v6: IpAddr = "fd00:99::1e1".parse().unwrap_or(IpAddr::from([0u8; 16]));
        let v4 = IpAddr::from([10, 99, 0, 21]);
        assert_eq!(
            family_mode(DhcpMode::Proxy, Dhcp6Mode::Proxy, v6),
            DhcpMode::Off
        );
        assert_eq!(
            family_mode(DhcpMode::Proxy, Dhcp6Mode::Proxy, v4),
            DhcpMode::Proxy
        );
        assert_eq!(
            family_mode(DhcpMode::Off, Dhcp6Mode::Full, v6),
            DhcpMode::Full
        );
        let evidence = |link_layer| Evidence {
            peer: v6,
            mode: family_mode(DhcpMode::Off, Dhcp6Mode::Proxy, v6),
            holds_address: false,
            exchanged_from: Vec::new(),
            link_layer,
        };
        // Before: mode Proxy, no v6 exchange recorded, so every v6 peer was refused
        // (NoPxeExchange) even on-link with the machine's MAC.
        assert_eq!(vouch(&evidence(LinkLayer::Matches)), Ok(()));
        assert_eq!(
            vouch(&evidence(LinkLayer::Unknown)),
            Err(Unvouched::NoEvidence)
        );
        let other = MacAddr([2, 0, 0, 0, 0, 9]);
        assert_eq!(
            vouch(&evidence(LinkLayer::Other(other))),
            Err(Unvouched::OtherHardware(other))
        );
    }
}
