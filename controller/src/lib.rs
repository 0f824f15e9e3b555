//! Unbounded's controller: resolves which configuration version each Machine gets, versions
//! MachineConfigurations, moves Machines through their phases, annotates their Nodes, and
//! releases them cleanly on deletion.
//!
//! Decisions are pure functions over plain data ([`selection`], [`versioning`],
//! [`lifecycle`]); the reconcilers ([`machine`], [`configuration`]) read reflector stores and
//! act on those decisions.

pub mod selection;
pub mod versioning;
pub mod lifecycle;
pub mod configuration;
pub mod context;
pub mod drain;
pub mod error;
pub mod leader;
pub mod machine;
pub mod metrics;
pub mod runner;

pub use context::Settings;
pub use error::Error;
pub use runner::run;
