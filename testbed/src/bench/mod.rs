//! Benchmarks that run against the local control plane and report figures (never timed
//! tests). [`controller`]: the controller with 10,000 Machines.

pub mod controller;
