//! Who may ask and how often: the address check, the per-machine rate limit and the
//! issuer's metrics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// Whether a request from `peer` may get credentials for a machine: from the machine's
/// address when we know it (full DHCP: reservation or lease), else from the address its
/// boot script (or its last credentials) went to.
pub fn address_allowed(
    holds_address: bool,
    addresses_known: bool,
    bound: Option<IpAddr>,
    peer: IpAddr,
) -> bool {
    if addresses_known {
        holds_address
    } else {
        bound == Some(peer)
    }
}

/// Allows `limit` requests per machine per minute.
#[derive(Debug, Default)]
pub(super) struct RateLimit {
    pub(super) windows: Mutex<HashMap<String, (u64, u32)>>,
}

impl RateLimit {
    pub(super) fn allow(&self, machine: &str, now: u64, limit: u32) -> bool {
        let Ok(mut windows) = self.windows.lock() else {
            return false;
        };
        let minute = now / 60;
        let entry = windows.entry(machine.to_owned()).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 += 1;
        entry.1 <= limit
    }
}

/// Credential requests per machine per minute.
pub(super) const REQUESTS_PER_MINUTE: u32 = 20;

/// The issuer's metrics (registered beside the server's, same prefix).
#[derive(Debug, Default)]
pub(super) struct IssuerMetrics {
    /// Requests waiting for the API server (token review, mint) right now.
    pub(super) in_flight: Gauge,
    /// Requests answered with an error, by reason ([`IssueError::reason`]).
    pub(super) refused: Family<RefusalLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(super) struct RefusalLabel {
    pub(super) reason: &'static str,
}

/// Counts a request waiting for the API server while it lives.
pub(super) struct InFlight<'a>(&'a Gauge);

impl<'a> InFlight<'a> {
    pub(super) fn new(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
