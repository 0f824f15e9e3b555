//! The discovery routes: the inspection boot script for a MAC no Machine has, the
//! inspection agent's report, and its poll for a claim.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use unbounded_api::inventory::{DISCOVERY_CLAIM_PATH, DISCOVERY_REPORT_PATH, DiscoveryReport};

use super::{AppState, ipxe};
use crate::backend::MacAddr;
use crate::boot;
use crate::dhcp::settings::{DhcpMode, UnknownMachines};
use crate::discovery_writes::{DiscoveryWriter, Outcome};
use crate::identity;

/// The inspection boot ([`crate::discovery::inspection_script`]) for a MAC no Machine has,
/// or whose Machine was discovered and waits to be claimed; anything else is refused (a
/// declared Machine boots its own script, never an inspection that could report for it).
pub(super) async fn discover_script(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let route = "/discover.ipxe";
    let base = state.settings.http_base();
    let discovery = match &state.settings.discovery {
        Some(discovery) if state.settings.dhcp.unknown_machines == UnknownMachines::Discover => {
            discovery
        }
        _ => {
            return ipxe(
                &state,
                route,
                boot::refusal("unknown machine: create a Machine with this MAC to boot it"),
            );
        }
    };
    let Some(mac) = query.get("mac") else {
        return ipxe(
            &state,
            route,
            format!("#!ipxe\nchain {base}/discover.ipxe?mac=${{net0/mac}}\n"),
        );
    };
    let Ok(mac) = mac.parse::<MacAddr>() else {
        return ipxe(
            &state,
            route,
            boot::refusal("the mac parameter is not a MAC address"),
        );
    };
    if let Some(machine) = state.backend.machine_by_mac(&mac)
        && !machine.discovery_waiting
    {
        return ipxe(
            &state,
            route,
            boot::refusal(&format!(
                "{mac} belongs to Machine {}: it boots its own script, not an inspection",
                machine.name
            )),
        );
    }
    let script = crate::discovery::inspection_script(
        &boot::image_url(&discovery.kernel, &base),
        &boot::image_url(&discovery.initrd, &base),
        &discovery.kernel_args,
        &base,
        &mac.to_string(),
    );
    ipxe(&state, route, script)
}

/// How long a report's body may take to arrive.
const REPORT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// An inspection agent's report ([`crate::discovery_writes`]). The body is read up to the
/// limit and no further: a larger one is refused (413) before it is buffered. 201 with the
/// Machine's name when it was created, 200 when its inventory was updated, the refusal's
/// 4xx with the reason otherwise, 503 only when the API server failed (the agent retries).
pub(super) async fn discovery_report(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let route = DISCOVERY_REPORT_PATH;
    let reply = |code: StatusCode, text: String| {
        state.metrics.http_request(route, code.as_u16());
        (code, format!("{text}\n")).into_response()
    };
    let Some(writer) = &state.discovery else {
        return reply(
            StatusCode::NOT_FOUND,
            "discovery is off here (it needs backend kubernetes and dhcp.unknownMachines: discover)".into(),
        );
    };
    let max = writer.limits().max_body_bytes;
    let too_large = |writer: &DiscoveryWriter| {
        let refusal = crate::discovery::Refusal::TooLarge { max };
        writer.count_outcome(refusal.label());
        reply(StatusCode::PAYLOAD_TOO_LARGE, refusal.to_string())
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(writer);
    }
    // Reads at most `max` bytes: a longer (chunked) body fails here, unread past the limit;
    // and for at most REPORT_READ_TIMEOUT: a body that trickles in does not hold its buffer
    // longer (the connection's idle limit alone would let one byte a minute keep it).
    let read = tokio::time::timeout(REPORT_READ_TIMEOUT, axum::body::to_bytes(body, max)).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return too_large(writer),
        Err(_) => {
            writer.count_outcome("slow_body");
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the report did not arrive within {} s",
                    REPORT_READ_TIMEOUT.as_secs()
                ),
            );
        }
    };
    let report: DiscoveryReport = match serde_json::from_slice(&bytes) {
        Ok(report) => report,
        Err(error) => {
            writer.count_outcome("not_a_report");
            return reply(
                StatusCode::BAD_REQUEST,
                format!("the body is not a discovery report: {error}"),
            );
        }
    };
    // Nothing is decided on a Machine index that has not listed every Machine yet: the caps
    // and the MACs already taken are read from it.
    if !state.backend.is_ready() {
        writer.count_outcome("not_synced");
        let mut response = reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "the bootserver has not read every Machine yet; retry".into(),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(5u64));
        return response;
    }
    if let Err((code, text)) = sender_holds(&state, peer, report.boot_mac.parse().ok()) {
        if code == StatusCode::FORBIDDEN {
            writer.count_outcome("wrong_address");
        }
        return reply(code, text);
    }
    let sender = crate::discovery::sender_of(peer.ip());
    match writer.report(report, bytes.len(), sender).await {
        Ok(Outcome::Created(name)) => {
            state.metrics.http_request(route, 201);
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::json!({"machine": name, "outcome": "created"}).to_string(),
            )
                .into_response()
        }
        Ok(Outcome::Updated(name)) => {
            state.metrics.http_request(route, 200);
            (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::json!({"machine": name, "outcome": "updated"}).to_string(),
            )
                .into_response()
        }
        Err(error) => {
            tracing::info!(%peer, reason = error.label(), %error, "discovery report refused");
            let code =
                StatusCode::from_u16(error.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let mut response = reply(code, error.to_string());
            // The reason, machine-readable: the inspection agent reboots on `known` (its
            // MACs are a claimed or declared Machine's, which boots its own script now).
            response.headers_mut().insert(
                unbounded_api::inventory::REFUSAL_HEADER,
                header::HeaderValue::from_static(error.label()),
            );
            if code == StatusCode::TOO_MANY_REQUESTS || code == StatusCode::SERVICE_UNAVAILABLE {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(60u64));
            }
            response
        }
    }
}

/// A report is accepted only from the machine whose boot MAC it names, as far as the
/// bootserver itself saw ([`crate::identity`]): with a full DHCP server, from the address
/// leased to that MAC; with ProxyDHCP, from the address that MAC's PXE exchange came from;
/// and in every mode, never from a peer whose link-layer address is another MAC.
fn sender_holds(
    state: &AppState,
    peer: SocketAddr,
    boot_mac: Option<MacAddr>,
) -> Result<(), (StatusCode, String)> {
    let IpAddr::V4(peer) = peer.ip() else {
        return Err((StatusCode::FORBIDDEN, "IPv4 only".into()));
    };
    let Some(boot_mac) = boot_mac else {
        // The report's own validation names what is wrong with it.
        return Ok(());
    };
    let mode = state.settings.dhcp.mode;
    let holds_address = match mode {
        DhcpMode::Full => match state.leases.lease_at(peer) {
            Ok(lease) => lease.is_some_and(|l| l.mac == boot_mac),
            Err(error) => {
                tracing::error!(%error, "the address book cannot answer; refusing a discovery request");
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the bootserver cannot check the sender's address now; retry".into(),
                ));
            }
        },
        DhcpMode::Proxy | DhcpMode::Off => false,
    };
    identity::vouch(&super::evidence(state, &[boot_mac], holds_address, peer.into())).map_err(|why| {
        tracing::info!(%peer, %boot_mac, reason = why.label(), %why, "discovery request refused: the sender is not vouched for as its boot MAC");
        (
            StatusCode::FORBIDDEN,
            format!("{peer} is not vouched for as {boot_mac}: {why}"),
        )
    })
}

/// A claim poll tells only whether a MAC's Machine waits: it is answered to the address
/// leased to that MAC with a full DHCP server, and to anyone otherwise. It is not held to
/// the PXE exchange's window as a report is: an inspection agent that polls for an hour
/// must still hear that it was claimed, or it would inspect forever.
fn poller_leases(
    state: &AppState,
    peer: SocketAddr,
    boot_mac: MacAddr,
) -> Result<(), (StatusCode, String)> {
    let (IpAddr::V4(peer), DhcpMode::Full) = (peer.ip(), state.settings.dhcp.mode) else {
        return Ok(());
    };
    match state.leases.lease_at(peer) {
        Ok(Some(lease)) if lease.mac == boot_mac => Ok(()),
        Ok(_) => Err((
            StatusCode::FORBIDDEN,
            format!("{peer} is not leased to the boot MAC"),
        )),
        Err(error) => {
            tracing::error!(%error, "the address book cannot answer; refusing a claim poll");
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the bootserver cannot check the sender's address now; retry".into(),
            ))
        }
    }
}

/// An inspection agent's poll between reports ([`DISCOVERY_CLAIM_PATH`]): 200 while its
/// Machine waits, 409 `known` once claimed (it reboots into its own boot), 404 when no
/// Machine has the MAC (it reports again). Answered from the Machine index, no API call.
pub(super) async fn discovery_claim(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    axum::extract::Path(mac): axum::extract::Path<String>,
) -> Response {
    let route = DISCOVERY_CLAIM_PATH;
    let reply = |code: StatusCode, text: String| {
        state.metrics.http_request(route, code.as_u16());
        (code, format!("{text}\n")).into_response()
    };
    let Some(writer) = &state.discovery else {
        return reply(StatusCode::NOT_FOUND, "discovery is off here".into());
    };
    let Ok(boot_mac) = mac.parse::<MacAddr>() else {
        let shown: String = mac.chars().take(64).filter(|c| !c.is_control()).collect();
        return reply(
            StatusCode::BAD_REQUEST,
            format!("{shown:?} is not a MAC address"),
        );
    };
    if let Err((code, text)) = poller_leases(&state, peer, boot_mac) {
        return reply(code, text);
    }
    match writer.claim_state(boot_mac) {
        crate::discovery::ClaimState::Waiting(name) => {
            reply(StatusCode::OK, format!("{name} waits to be claimed"))
        }
        crate::discovery::ClaimState::Claimed(name) => {
            let mut response = reply(
                StatusCode::CONFLICT,
                format!("{boot_mac} belongs to Machine {name}, which is not waiting: boot it"),
            );
            response.headers_mut().insert(
                unbounded_api::inventory::REFUSAL_HEADER,
                header::HeaderValue::from_static("known"),
            );
            response
        }
        crate::discovery::ClaimState::Unknown => reply(
            StatusCode::NOT_FOUND,
            format!("no Machine has {boot_mac}: report"),
        ),
    }
}
