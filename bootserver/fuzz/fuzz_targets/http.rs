//! HTTP: a request's path and query → the bootserver's router and handlers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| unbounded_bootserver::fuzzing::http(data));
