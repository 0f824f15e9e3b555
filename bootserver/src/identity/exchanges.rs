//! The PXE boot-server exchanges (port 4011) the bootserver answered: which address each MAC
//! asked from. In proxy mode this is the only place the bootserver sees a MAC and an address
//! together: the request comes unicast from the address the other DHCP server gave, with
//! the MAC in `chaddr` and the same address in `ciaddr`.
//!
//! Kept in memory, for [`PxeExchanges::WINDOW_SECONDS`] (a boot script's nonce lives as long
//! by default): a restarted bootserver has seen no exchange, so a machine that fetched its
//! script just before the restart fetches it again after its next PXE exchange.
//! Bounded: at most [`PxeExchanges::MAX_MACS`] MACs (the oldest forgotten first) and
//! [`PxeExchanges::ADDRESSES_PER_MAC`] addresses per MAC (the newest kept).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use crate::backend::MacAddr;

/// The addresses each MAC's PXE exchanges came from, with when.
#[derive(Debug, Default)]
pub struct PxeExchanges {
    seen: Mutex<HashMap<MacAddr, Vec<(IpAddr, u64)>>>,
}

impl PxeExchanges {
    /// How long an exchange counts (seconds).
    pub const WINDOW_SECONDS: u64 = 1800;
    /// The most MACs remembered.
    pub const MAX_MACS: usize = 16_384;
    /// The most addresses remembered per MAC.
    pub const ADDRESSES_PER_MAC: usize = 4;

    /// Records that `mac` exchanged from `ip` at `now` (seconds).
    pub fn record(&self, mac: MacAddr, ip: IpAddr, now: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.contains_key(&mac) && seen.len() >= Self::MAX_MACS {
            seen.retain(|_, at| at.iter().any(|(_, t)| fresh(*t, now)));
            if seen.len() >= Self::MAX_MACS
                && let Some(oldest) = seen
                    .iter()
                    .min_by_key(|(_, at)| at.iter().map(|(_, t)| *t).max())
                    .map(|(mac, _)| *mac)
            {
                seen.remove(&oldest);
            }
        }
        let addresses = seen.entry(mac).or_default();
        addresses.retain(|(seen_ip, t)| *seen_ip != ip && fresh(*t, now));
        addresses.push((ip, now));
        if addresses.len() > Self::ADDRESSES_PER_MAC {
            addresses.remove(0);
        }
    }

    /// The distinct addresses any of `macs` exchanged from within the window before `now`.
    pub fn addresses(&self, macs: &[MacAddr], now: u64) -> Vec<IpAddr> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<IpAddr> = macs
            .iter()
            .filter_map(|mac| seen.get(mac))
            .flatten()
            .filter(|(_, t)| fresh(*t, now))
            .map(|(ip, _)| *ip)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// How many MACs it remembers.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn fresh(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < PxeExchanges::WINDOW_SECONDS
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    #[test]
    fn an_exchange_counts_for_its_mac_for_the_window() {
        let exchanges = PxeExchanges::default();
        let ip = IpAddr::from([10, 0, 0, 21]);
        exchanges.record(A, ip, 1000);
        assert_eq!(exchanges.addresses(&[A], 1000), vec![ip]);
        assert_eq!(exchanges.addresses(&[B, A], 1000 + 1799), vec![ip]);
        assert!(exchanges.addresses(&[B], 1000).is_empty(), "another MAC");
        assert!(
            exchanges.addresses(&[A], 1000 + 1800).is_empty(),
            "past the window"
        );
    }

    #[test]
    fn a_second_address_for_one_mac_is_kept_beside_the_first() {
        let exchanges = PxeExchanges::default();
        let (one, two) = (IpAddr::from([10, 0, 0, 21]), IpAddr::from([10, 0, 0, 50]));
        exchanges.record(A, one, 10);
        exchanges.record(A, two, 20);
        exchanges.record(A, one, 30);
        assert_eq!(exchanges.addresses(&[A], 30), vec![one, two]);
    }

    proptest! {
        /// Whatever is recorded, memory stays bounded, an address is reported for a MAC only
        /// if that MAC exchanged from it within the window, and a MAC's latest exchange is
        /// always reported while it is fresh.
        #[test]
        fn bounded_never_invents_and_keeps_the_latest(
            records in proptest::collection::vec((0u8..8, 0u8..6, 0u64..4000), 0..200),
            now in 0u64..6000,
        ) {
            let exchanges = PxeExchanges::default();
            let ip_of = |i: u8| IpAddr::from([10, 0, 0, i]);
            for (mac, ip, at) in &records {
                exchanges.record(MacAddr([2, 0, 0, 0, 0, *mac]), ip_of(*ip), *at);
            }
            prop_assert!(exchanges.len() <= 8);
            for mac in 0u8..8 {
                let addresses = exchanges.addresses(&[MacAddr([2, 0, 0, 0, 0, mac])], now);
                prop_assert!(addresses.len() <= PxeExchanges::ADDRESSES_PER_MAC);
                for ip in &addresses {
                    prop_assert!(records.iter().any(|(m, i, at)| *m == mac
                        && ip_of(*i) == *ip
                        && now.saturating_sub(*at) < PxeExchanges::WINDOW_SECONDS));
                }
                if let Some((_, ip, at)) = records.iter().rev().find(|(m, _, _)| *m == mac)
                    && now.saturating_sub(*at) < PxeExchanges::WINDOW_SECONDS
                {
                    prop_assert!(addresses.contains(&ip_of(*ip)), "latest {ip} at {at} missing at {now}");
                }
            }
        }
    }
}
