//! The link-layer address the kernel resolved for a peer (`/proc/net/arp`, the neighbour
//! table of the bootserver's network namespace). An on-link peer that completed a TCP
//! handshake has a complete entry: the kernel had to resolve it to answer. A peer behind a
//! router (a relayed network) has none: its address says nothing about its hardware, and
//! the check is left to the mode's other evidence.

use std::net::{IpAddr, Ipv4Addr};

use crate::backend::MacAddr;

/// The peer's link-layer address, compared with a machine's MACs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// One of the machine's MACs.
    Matches,
    /// Another MAC.
    Other(MacAddr),
    /// Not known: off-link, or not resolved.
    Unknown,
}

/// The complete neighbour entry for `ip` in a `/proc/net/arp` table, if any.
pub fn resolved(table: &str, ip: Ipv4Addr) -> Option<MacAddr> {
    const ATF_COM: u32 = 0x2;
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let address: Ipv4Addr = fields.next()?.parse().ok()?;
        let _hw_type = fields.next()?;
        let flags = u32::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
        let mac: MacAddr = fields.next()?.parse().ok()?;
        (address == ip && flags & ATF_COM != 0 && mac != MacAddr([0; 6])).then_some(mac)
    })
}

/// Compares what the table says of `ip` with `macs`.
pub fn compare(table: &str, ip: Ipv4Addr, macs: &[MacAddr]) -> LinkLayer {
    match resolved(table, ip) {
        Some(mac) if macs.contains(&mac) => LinkLayer::Matches,
        Some(mac) => LinkLayer::Other(mac),
        None => LinkLayer::Unknown,
    }
}

/// [`compare`] over this namespace's table. A table that cannot be read says nothing
/// ([`LinkLayer::Unknown`]): the mode's own evidence still has to vouch.
pub fn link_layer_of(ip: IpAddr, macs: &[MacAddr]) -> LinkLayer {
    let ip = match ip {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(ip) => return link_layer_of_v6(ip, macs),
    };
    match std::fs::read_to_string("/proc/net/arp") {
        Ok(table) => compare(&table, ip, macs),
        Err(error) => {
            tracing::warn!(%error, "the neighbour table cannot be read; the link layer vouches for nobody");
            LinkLayer::Unknown
        }
    }
}

/// [`link_layer_of`] for an IPv6 peer: the kernel's neighbour discovery table, read over
/// rtnetlink. The same rule: an on-link peer that completed a TCP handshake is resolved.
fn link_layer_of_v6(ip: std::net::Ipv6Addr, macs: &[MacAddr]) -> LinkLayer {
    match crate::interfaces::ipv6_neighbours() {
        Ok(table) => match table.into_iter().find(|(address, _)| *address == ip) {
            Some((_, mac)) if macs.contains(&MacAddr(mac)) => LinkLayer::Matches,
            Some((_, mac)) => LinkLayer::Other(MacAddr(mac)),
            None => LinkLayer::Unknown,
        },
        Err(error) => {
            tracing::warn!(%error, "the IPv6 neighbour table cannot be read; the link layer vouches for nobody");
            LinkLayer::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str =
        "IP address       HW type     Flags       HW address            Mask     Device
10.99.0.21       0x1         0x2         52:54:00:00:0a:01     *        pxe0
10.99.0.50       0x1         0x2         02:00:00:00:00:09     *        pxe0
10.99.0.60       0x1         0x0         00:00:00:00:00:00     *        pxe0
10.99.0.70       0x1         0x0         52:54:00:00:0a:01     *        pxe0
";

    #[test]
    fn only_a_complete_entry_says_which_hardware_holds_an_address() {
        let machine = ["52:54:00:00:0a:01".parse().unwrap()];
        let at = |last| Ipv4Addr::new(10, 99, 0, last);
        assert_eq!(compare(TABLE, at(21), &machine), LinkLayer::Matches);
        assert_eq!(
            compare(TABLE, at(50), &machine),
            LinkLayer::Other("02:00:00:00:00:09".parse().unwrap())
        );
        assert_eq!(
            compare(TABLE, at(60), &machine),
            LinkLayer::Unknown,
            "incomplete"
        );
        assert_eq!(
            compare(TABLE, at(70), &machine),
            LinkLayer::Unknown,
            "not complete"
        );
        assert_eq!(
            compare(TABLE, at(99), &machine),
            LinkLayer::Unknown,
            "absent"
        );
        assert_eq!(compare("", at(21), &machine), LinkLayer::Unknown);
        assert_eq!(
            compare("header\ngarbage line\n", at(21), &machine),
            LinkLayer::Unknown
        );
    }
}
