//! Loopback ports for the daemons the testbed starts (etcd, kube-apiserver, the BMC
//! emulators), which take a port number on their command line rather than a socket.
//!
//! A port is found free and then bound by the daemon a moment later; in between, anything
//! else may take it. The kernel hands out ephemeral ports (every outgoing connection, every
//! bind to port 0) from `ip_local_port_range`, so a port found by binding port 0 competes
//! with every connection the tests open. These ports are drawn at random from below that
//! range instead, where only another explicit bind can collide.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{TcpListener, UdpSocket};
use std::ops::Range;

/// Which socket type the port must be free for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

/// The lowest port of the range these ports come from (above the registered services
/// most often found on a development machine).
const LOWEST: u16 = 10_000;

/// Random candidates tried before falling back to the kernel's choice.
const CANDIDATES: u32 = 64;

/// Where to draw from, given the first ephemeral port: below it, or (if the range was moved
/// down so far that nothing is left) nowhere.
fn candidate_range(ephemeral_low: u16) -> Range<u16> {
    LOWEST..ephemeral_low.max(LOWEST)
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn bindable(port: u16, protocol: Protocol) -> std::io::Result<u16> {
    let address = ("127.0.0.1", port);
    let bound = match protocol {
        Protocol::Tcp => TcpListener::bind(address).and_then(|s| s.local_addr()),
        Protocol::Udp => UdpSocket::bind(address).and_then(|s| s.local_addr()),
    };
    bound.map(|a| a.port())
}

/// A loopback port free for `protocol` right now, outside the ephemeral range when one is
/// free there; otherwise whatever the kernel gives for port 0.
pub fn free_loopback_port(protocol: Protocol) -> std::io::Result<u16> {
    let range = candidate_range(ephemeral_low());
    let width = u64::from(range.end - range.start);
    if width > 0 {
        // RandomState is seeded per instance from the OS: a cheap random source.
        let random = RandomState::new();
        for attempt in 0..CANDIDATES {
            let mut hasher = random.build_hasher();
            hasher.write_u32(attempt);
            let offset = u16::try_from(hasher.finish() % width).unwrap_or(0);
            if let Ok(port) = bindable(range.start + offset, protocol) {
                return Ok(port);
            }
        }
    }
    bindable(0, protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range() {
        assert_eq!(candidate_range(32_768), 10_000..32_768);
        assert_eq!(candidate_range(1_024), 10_000..10_000);
        let low = ephemeral_low();
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let port = free_loopback_port(protocol).unwrap();
            assert!(
                candidate_range(low).contains(&port),
                "{port} not below {low}"
            );
            // Free means a daemon can bind it now.
            bindable(port, protocol).unwrap();
        }
    }
}
