//! Limits on the pool addresses one source may take: a relay (`giaddr`), or one port behind
//! it (the relay agent's circuit ID, option 82 sub-option 1, RFC 3046). Complete DORAs from
//! made-up MACs could otherwise take a whole pool (a DISCOVER flood alone cannot: unanswered
//! offers are reclaimed); with a limit, a flood behind one relay or port leaves the pool to
//! the others.
//!
//! What is limited: an address for a client that is no Machine of ours (a known MAC always
//! gets its reservation, lease or a pool address) and holds none — no offer that has not
//! lapsed, no lease that has not expired. What is counted: the clients this process gave an
//! address to from that source and that still hold one, asked of the address book at the
//! moment of the decision, so an address given back, lapsed or expired frees its place at
//! once (the property test `no_relay_holds_more_than_its_limit` in `dhcp::decide_tests`
//! drives the real decision). Kept in memory: after a restart a source may take its limit
//! again, beside what it held before (its leases expire as usual).
//!
//! Requests that come straight from the link (no relay) are not limited: the bootserver's
//! own network is the one it is configured on, and has no ports to tell apart.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

pub use super::settings::{LimitsError, LimitsFile, SourceLimits};
use super::wire::Request;
use crate::leases::ClientKey;

/// Where a request came from, as far as limits go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A relay.
    Relay(Ipv4Addr),
    /// One port of a relay.
    Circuit(Ipv4Addr, Vec<u8>),
}

impl Source {
    /// The sources of a request with their limits: the relay's and, when option 82 names
    /// one, its port's. None for a request from the link itself.
    pub fn of(request: &Request, limits: SourceLimits) -> Vec<(Source, u32)> {
        if !request.relayed() {
            return Vec::new();
        }
        let relay = request.giaddr;
        let circuit = request
            .relay_agent_info
            .as_ref()
            .and_then(|r| r.circuit_id.clone());
        let mut sources = Vec::new();
        if let Some(limit) = limits.per_relay {
            sources.push((Source::Relay(relay), limit));
        }
        if let (Some(id), Some(limit)) = (circuit, limits.per_circuit) {
            sources.push((Source::Circuit(relay, id), limit));
        }
        sources
    }

    /// The metric label of a refusal.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Relay(_) => "relay",
            Self::Circuit(..) => "circuit",
        }
    }
}

/// The clients each source was given a pool address, newest last.
#[derive(Debug, Default)]
pub struct Sources {
    clients: HashMap<Source, VecDeque<ClientKey>>,
}

impl Sources {
    /// The first of `sources` that may not give `key` one more pool address: it already has
    /// `limit` clients that still hold one (`holds`, asked of the address book). Clients
    /// that hold none any more are forgotten on the way.
    pub fn refusing<'s>(
        &mut self,
        sources: &'s [(Source, u32)],
        key: &ClientKey,
        holds: impl Fn(&ClientKey) -> bool,
    ) -> Option<&'s Source> {
        sources.iter().find_map(|(source, limit)| {
            let clients = self.clients.get_mut(source)?;
            clients.retain(|k| k != key && holds(k));
            (clients.len() >= *limit as usize).then_some(source)
        })
    }

    /// Records that `key` was given a pool address from each of `sources`.
    pub fn given(&mut self, sources: &[(Source, u32)], key: &ClientKey) {
        for (source, _) in sources {
            let clients = self.clients.entry(source.clone()).or_default();
            if !clients.contains(key) {
                clients.push_back(key.clone());
            }
        }
        // Sources whose clients all let go are dropped, so the map does not grow with
        // every relay and port ever seen.
        if self.clients.len() > 4096 {
            self.clients.retain(|_, clients| !clients.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> ClientKey {
        ClientKey::of(None, crate::backend::MacAddr([2, 0, 0, 0, 0, n]))
    }

    #[test]
    fn a_source_at_its_limit_is_refused_until_a_client_lets_go() {
        let relay = Source::Relay(Ipv4Addr::new(10, 1, 0, 1));
        let sources = [(relay.clone(), 2)];
        let mut seen = Sources::default();
        let holding = std::cell::RefCell::new(vec![key(1), key(2)]);
        let holds = |k: &ClientKey| holding.borrow().contains(k);
        assert_eq!(seen.refusing(&sources, &key(1), holds), None);
        seen.given(&sources, &key(1));
        seen.given(&sources, &key(2));
        assert_eq!(seen.refusing(&sources, &key(3), holds), Some(&relay));
        // A client already counted asks again (a second DISCOVER): not a new one.
        assert_eq!(seen.refusing(&sources, &key(2), holds), None);
        holding.borrow_mut().retain(|k| *k != key(1));
        assert_eq!(seen.refusing(&sources, &key(3), holds), None);
    }
}
