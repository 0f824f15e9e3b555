//! Unbounded's controller: resolves which configuration version each Machine gets, versions
//! MachineConfigurations, moves Machines through their phases, annotates their Nodes, and
//! releases them cleanly on deletion, and runs the MachineOperation lifecycle (routing,
//! ordering, fan-out, aggregation, deadlines and TTL).
//!
//! Decisions are pure functions over plain data ([`selection`], [`versioning`],
//! [`lifecycle`], [`dispatch`], [`triggers`], [`rollout`], [`pool::plan`],
//! [`pool::health`]); the reconcilers ([`machine`], [`configuration`], [`operation`],
//! [`pool`]) read reflector stores and the [`index`]es kept beside them ([`watches`]) and act
//! on those decisions. A MachinePool keeps a number of Machines; a rolling update (a pool's,
//! or a configuration's with `RollingUpdate`, [`rolling`]) repaves out-of-date Machines in
//! batches through repave requests ([`repave`]).
//!
//! Every status the controller writes goes through one server-side apply writer
//! ([`status_apply`]); a Machine's and a configuration's are decided in
//! [`machine::status`] and [`configuration::status`], a MachineOperation's written by
//! [`operation_status`], and writes over a copy the cache may still show are recorded in
//! [`status_writes`].

pub mod agent_access;
pub mod api_limits;
pub mod apply;
pub mod capi;
pub mod configuration;
pub mod context;
pub mod dispatch;
pub mod drain;
pub mod error;
pub mod events;
pub mod expectations;
pub mod index;
pub mod lifecycle;
pub mod machine;
pub mod members;
pub mod metrics;
pub mod operation;
pub mod operation_status;
pub mod pool;
pub mod recount;
pub mod repave;
pub mod rolling;
pub mod rollout;
pub mod runner;
pub mod selection;
pub mod skew;
pub mod status_apply;
pub mod status_writes;
pub mod triggers;
pub mod versioning;
pub mod watches;
pub mod work_queue;

pub use context::Settings;
pub use error::Error;
pub use runner::run;
