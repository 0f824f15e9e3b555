//! The subcommands of `unbounded-testbed`, one module each; `main.rs` parses the command
//! line and dispatches.

pub(crate) mod bench;
pub(crate) mod cluster;
pub(crate) mod images;
pub(crate) mod lab;
pub(crate) mod scenario;
