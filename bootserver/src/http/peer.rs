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

/// How the bootserver takes part in address assignment for `peer`'s family: the DHCPv4
/// mode for a v4 peer, the DHCPv6 mode for a v6 one (a full DHCPv6 server's book knows
/// which address each machine has; a v6 proxy records no exchange yet, so it vouches for
/// nobody but by the link layer).
pub(super) fn mode_for(state: &AppState, peer: IpAddr) -> DhcpMode {
    match peer {
        IpAddr::V4(_) => state.settings.dhcp.mode,
        IpAddr::V6(_) => match state.settings.dhcp6.mode {
            Dhcp6Mode::Full => DhcpMode::Full,
            Dhcp6Mode::Proxy => DhcpMode::Proxy,
            Dhcp6Mode::Off => DhcpMode::Off,
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
