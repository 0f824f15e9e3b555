//! TFTP: a request datagram → parsing, option negotiation and path resolution.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unbounded_bootserver::fuzzing::tftp(data));
