//! DHCP: bytes → wire validation → the server's decision → the encoded reply.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unbounded_bootserver::fuzzing::dhcp(data));
