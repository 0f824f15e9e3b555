//! DHCPv6: bytes → relay envelopes → message → the server's decision → the encoded reply.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unbounded_bootserver::fuzzing::dhcp6(data));
