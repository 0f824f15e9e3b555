//! Benchmarks that report figures (never timed tests).
//!
//! - [`controller`]: the controller with 10,000 Machines on the local control plane;
//! - `unbounded-testbed bench [dhcp|tftp|http|storm|pair|controller|all]` ([`suite`]): our
//!   bootserver against the servers people would otherwise use (Kea, dnsmasq, tftpd-hpa,
//!   nginx; our pair of bootservers against Kea's HA pair: [`pair`]), measured with
//!   neutral clients (perfdhcp, atftp, wrk, dhcp-load) in network namespaces the command
//!   creates ([`bed`]), and the controller at scale with the PXE provider
//!   ([`scale`]); a Markdown report, SVG charts ([`chart`]) and one `figure` line per
//!   number ([`report`]); with `--publish`, the blocks of `docs/benchmarks.md` ([`publish`]).

pub mod bed;
pub mod chart;
pub mod clients;
pub mod controller;
pub mod dhcp;
pub mod http;
pub mod pair;
pub mod peers;
pub mod proc;
pub mod provider;
pub mod publish;
pub mod report;
pub mod scale;
pub mod storm;
pub mod suite;
pub mod tftp;
