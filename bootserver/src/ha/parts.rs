//! Which server's part of a pool an address is in. Every pool is cut in two halves by
//! address; the server whose name sorts first owns the lower half (the first ⌈n/2⌉
//! addresses). Addresses are compared as `u128`, so one rule serves both families.

use std::net::{IpAddr, Ipv4Addr};

/// Where an address lies for one server of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// In this server's half of the pool: it may make new bindings there.
    Own,
    /// In the partner's half: bindings there are the partner's.
    Partners,
    /// Outside the pool (a reservation, another network): nobody's part.
    Outside,
}

/// Which half of each pool a server owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// The first ⌈n/2⌉ addresses.
    Lower,
    /// The rest.
    Upper,
}

impl Half {
    /// The half of the server named `name` in a pair with `partner` (names differ).
    pub fn of(name: &str, partner: &str) -> Self {
        if name < partner {
            Self::Lower
        } else {
            Self::Upper
        }
    }
}

fn as_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inclusive range `[first, last]` of `half` of the pool `[first, last]`; `None` when
/// that half is empty (a pool of one address has no upper half).
pub fn half_of(first: u128, last: u128, half: Half) -> Option<(u128, u128)> {
    if first > last {
        return None;
    }
    // At most 2^128 - 1 apart: `last - first` does not overflow, the half size is at most
    // 2^127.
    let lower_last = first + (last - first) / 2;
    match half {
        Half::Lower => Some((first, lower_last)),
        Half::Upper => (lower_last < last).then(|| (lower_last + 1, last)),
    }
}

/// [`half_of`] for an IPv4 pool.
pub fn half_of_v4(pool: (Ipv4Addr, Ipv4Addr), half: Half) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let (first, last) = half_of(
        u128::from(u32::from(pool.0)),
        u128::from(u32::from(pool.1)),
        half,
    )?;
    // Both within the v4 pool's own bounds.
    Some((
        Ipv4Addr::from(u32::try_from(first).ok()?),
        Ipv4Addr::from(u32::try_from(last).ok()?),
    ))
}

/// Where `ip` lies for the server owning `half` of `pool` (both ends of one family; an
/// address of the other family is outside).
pub fn part_of(ip: IpAddr, pool: (IpAddr, IpAddr), half: Half) -> Part {
    if ip.is_ipv4() != pool.0.is_ipv4() || pool.0.is_ipv4() != pool.1.is_ipv4() {
        return Part::Outside;
    }
    let (first, last, at) = (as_u128(pool.0), as_u128(pool.1), as_u128(ip));
    if at < first || at > last {
        return Part::Outside;
    }
    match half_of(first, last, half) {
        Some((a, b)) if (a..=b).contains(&at) => Part::Own,
        _ => Part::Partners,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_lower_name_owns_the_lower_half() {
        assert_eq!(Half::of("bootserver-a", "bootserver-b"), Half::Lower);
        assert_eq!(Half::of("bootserver-b", "bootserver-a"), Half::Upper);
        let pool = (v4("10.99.0.100"), v4("10.99.0.199"));
        assert_eq!(part_of(v4("10.99.0.100"), pool, Half::Lower), Part::Own);
        assert_eq!(part_of(v4("10.99.0.149"), pool, Half::Lower), Part::Own);
        assert_eq!(
            part_of(v4("10.99.0.150"), pool, Half::Lower),
            Part::Partners
        );
        assert_eq!(part_of(v4("10.99.0.150"), pool, Half::Upper), Part::Own);
        assert_eq!(part_of(v4("10.99.0.21"), pool, Half::Upper), Part::Outside);
        assert_eq!(
            part_of(v4("fd00:99::100"), pool, Half::Upper),
            Part::Outside
        );
        assert_eq!(
            half_of_v4(
                (
                    "10.99.0.100".parse().unwrap(),
                    "10.99.0.199".parse().unwrap()
                ),
                Half::Upper
            ),
            Some((
                "10.99.0.150".parse().unwrap(),
                "10.99.0.199".parse().unwrap()
            ))
        );
        // A pool of one address: the lower half has it, the upper half is empty.
        assert_eq!(half_of(5, 5, Half::Lower), Some((5, 5)));
        assert_eq!(half_of(5, 5, Half::Upper), None);
        let v6 = (v4("fd00:99::100"), v4("fd00:99::1ff"));
        assert_eq!(part_of(v4("fd00:99::17f"), v6, Half::Lower), Part::Own);
        assert_eq!(part_of(v4("fd00:99::180"), v6, Half::Upper), Part::Own);
        assert_eq!(
            half_of(0, u128::MAX, Half::Upper),
            Some((1 << 127, u128::MAX))
        );
    }

    proptest! {
        /// Every pool address is in exactly one server's part: the two halves never
        /// overlap and leave nothing out.
        #[test]
        fn each_pool_address_has_exactly_one_owner(
            first in any::<u32>(),
            span in 0u32..10_000,
            offset in 0u32..10_000,
        ) {
            let last = first.saturating_add(span);
            let pool = (IpAddr::from(Ipv4Addr::from(first)), IpAddr::from(Ipv4Addr::from(last)));
            let ip = IpAddr::from(Ipv4Addr::from(first.saturating_add(offset)));
            let lower = part_of(ip, pool, Half::Lower);
            let upper = part_of(ip, pool, Half::Upper);
            if offset <= last - first {
                prop_assert!(matches!((lower, upper), (Part::Own, Part::Partners) | (Part::Partners, Part::Own)));
            } else {
                prop_assert_eq!((lower, upper), (Part::Outside, Part::Outside));
            }
        }
    }
}
