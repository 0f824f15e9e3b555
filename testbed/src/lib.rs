//! Unbounded testbed.
