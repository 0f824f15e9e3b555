//! Simulated clients that run inside the client namespace as
//! `unbounded-testbed bench-client <storm|dhcp-check>` (a process of their own: a socket
//! belongs to the namespace of the process that opens it), printing one JSON object.
//!
//! - `storm`: PXE clients in waves, each doing DHCP (as a BIOS PXE ROM, through the
//!   relay), TFTP of the boot file it was given, the iPXE script over HTTP and the kernel
//!   that script names;
//! - `dhcp-check`: after the crash test's restart, DORA again for every client acknowledged
//!   before the crash, and for fresh clients.

pub mod dhcp;
pub mod http;
pub mod tftp;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use dhcp::{Relay, format_mac, parse_mac};

/// The MAC of the `i`-th storm client (the bench gives our server a Machine for each).
pub fn storm_mac(i: u32) -> [u8; 6] {
    let b = i.to_be_bytes();
    [0x02, 0x5b, b[0], b[1], b[2], b[3]]
}

/// The MAC of the `i`-th fresh client of the crash check.
pub fn fresh_mac(i: u32) -> [u8; 6] {
    let b = i.to_be_bytes();
    [0x02, 0xcc, b[0], b[1], b[2], b[3]]
}

/// `bench-client storm`.
#[derive(Debug, Clone, clap::Args)]
pub struct StormArgs {
    /// The server.
    #[arg(long)]
    pub server: Ipv4Addr,
    /// Our address (the relay).
    #[arg(long)]
    pub relay: Ipv4Addr,
    /// Clients in all.
    #[arg(long)]
    pub clients: u32,
    /// Clients that start together.
    #[arg(long)]
    pub wave: u32,
    /// Milliseconds between waves.
    #[arg(long)]
    pub interval_ms: u64,
    /// The size the boot file must have.
    #[arg(long)]
    pub boot_file_size: u64,
    /// The size the kernel must have.
    #[arg(long)]
    pub kernel_size: u64,
    /// The HTTP port.
    #[arg(long)]
    pub http_port: u16,
}

/// What the storm did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StormSummary {
    /// Clients started.
    pub clients: u32,
    /// Clients that loaded their kernel.
    pub booted: u32,
    /// Failures by stage and reason.
    pub failures: BTreeMap<String, u32>,
    /// Seconds from the first client's start to the last client's end.
    pub seconds: f64,
    /// Mean milliseconds per stage over the clients that booted.
    pub stage_ms: BTreeMap<String, f64>,
}

#[derive(Debug)]
struct Booted {
    stages: [(&'static str, f64); 4],
}

async fn boot_one(
    relay: &Relay,
    args: &StormArgs,
    i: u32,
) -> Result<Booted, (&'static str, String)> {
    let mac = storm_mac(i);
    let mut mark = Instant::now();
    let mut lap = || {
        let ms = mark.elapsed().as_secs_f64() * 1000.0;
        mark = Instant::now();
        ms
    };
    let lease = relay
        .dora(&mac, 0x5b00_0000 | i, true, Duration::from_secs(2), 4)
        .await
        .map_err(|e| ("dhcp", e.to_string()))?;
    let dhcp_ms = lap();
    let boot_file = lease
        .boot_file
        .ok_or(("dhcp", "no boot file offered".to_owned()))?;
    let tftp_server = if lease.next_server.is_unspecified() {
        args.server
    } else {
        lease.next_server
    };
    let size = tftp::fetch(
        SocketAddrV4::new(tftp_server, 69),
        args.relay,
        &boot_file,
        1468,
        Duration::from_secs(1),
        5,
    )
    .await
    .map_err(|e| ("tftp", e.to_string()))?;
    if size != args.boot_file_size {
        return Err((
            "tftp",
            format!(
                "{boot_file}: {size} bytes, expected {}",
                args.boot_file_size
            ),
        ));
    }
    let tftp_ms = lap();
    let http = SocketAddr::from((args.server, args.http_port));
    let script = http::get(http, &format!("/boot.ipxe?mac={}", format_mac(&mac)), true)
        .await
        .map_err(|e| ("script", e.to_string()))?;
    if script.status != 200 {
        return Err(("script", format!("status {}", script.status)));
    }
    let text = String::from_utf8_lossy(&script.body);
    let kernel_url = text
        .lines()
        .find_map(|l| l.strip_prefix("kernel "))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or(("script", "no kernel line".to_owned()))?;
    let path = kernel_url
        .strip_prefix("http://")
        .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
        .ok_or(("script", format!("kernel URL {kernel_url} is not http://")))?;
    let script_ms = lap();
    let kernel = http::get(http, path, false)
        .await
        .map_err(|e| ("kernel", e.to_string()))?;
    if kernel.status != 200 || kernel.length != args.kernel_size {
        return Err((
            "kernel",
            format!(
                "status {}, {} bytes (expected {})",
                kernel.status, kernel.length, args.kernel_size
            ),
        ));
    }
    Ok(Booted {
        stages: [
            ("dhcp", dhcp_ms),
            ("tftp", tftp_ms),
            ("script", script_ms),
            ("kernel", lap()),
        ],
    })
}

/// Runs the storm and summarises it.
pub async fn storm(args: StormArgs) -> Result<StormSummary, String> {
    let relay = Arc::new(
        Relay::bind(args.relay, args.server)
            .await
            .map_err(|e| e.to_string())?,
    );
    let started = Instant::now();
    let wave = args.wave.max(1);
    let tasks: Vec<_> = (0..args.clients)
        .map(|i| {
            let relay = relay.clone();
            let args = args.clone();
            tokio::spawn(async move {
                let delay = Duration::from_millis(u64::from(i / wave) * args.interval_ms);
                tokio::time::sleep_until(tokio::time::Instant::from_std(started + delay)).await;
                boot_one(&relay, &args, i).await
            })
        })
        .collect();
    let mut summary = StormSummary {
        clients: args.clients,
        ..StormSummary::default()
    };
    let mut totals: BTreeMap<String, f64> = BTreeMap::new();
    for task in tasks {
        match task.await {
            Ok(Ok(booted)) => {
                summary.booted += 1;
                for (stage, ms) in booted.stages {
                    *totals.entry(stage.to_owned()).or_default() += ms;
                }
            }
            Ok(Err((stage, reason))) => {
                *summary
                    .failures
                    .entry(format!("{stage}: {reason}"))
                    .or_default() += 1;
            }
            Err(e) => *summary.failures.entry(format!("task: {e}")).or_default() += 1,
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.stage_ms = totals
        .into_iter()
        .map(|(k, v)| (k, v / f64::from(summary.booted.max(1))))
        .collect();
    Ok(summary)
}

/// `bench-client dhcp-acks`.
#[derive(Debug, Clone, clap::Args)]
pub struct AcksArgs {
    /// The server.
    #[arg(long)]
    pub server: Ipv4Addr,
    /// Our address (the relay).
    #[arg(long)]
    pub relay: Ipv4Addr,
    /// Seconds during which new clients start.
    #[arg(long)]
    pub seconds: u64,
    /// Clients in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// New clients started per second at most (the pool must outlast the run).
    #[arg(long, default_value_t = u32::MAX)]
    pub rate: u32,
}

/// The MAC of the `i`-th client of the crash run.
pub fn crash_mac(i: u32) -> [u8; 6] {
    let b = i.to_be_bytes();
    [0x02, 0xcd, b[0], b[1], b[2], b[3]]
}

/// Runs DORA for new clients, `concurrency` at a time, for `seconds` (the server may die
/// meanwhile: its clients then time out); returns every acknowledged lease.
pub async fn acks(args: AcksArgs) -> Result<Vec<(String, Ipv4Addr)>, String> {
    let relay = Relay::bind(args.relay, args.server)
        .await
        .map_err(|e| e.to_string())?;
    let relay = &relay;
    let start = Instant::now();
    let until = start + Duration::from_secs(args.seconds);
    let rate = f64::from(args.rate.max(1));
    let acked = futures::stream::iter(0u32..)
        .take_while(|_| futures::future::ready(Instant::now() < until))
        .map(|i| async move {
            let due = start + Duration::from_secs_f64(f64::from(i) / rate);
            tokio::time::sleep_until(due.into()).await;
            let mac = crash_mac(i);
            relay
                .dora(&mac, 0x3000_0000 | i, false, Duration::from_millis(500), 2)
                .await
                .ok()
                .map(|l| (format_mac(&mac), l.ip))
        })
        .buffer_unordered(args.concurrency.max(1))
        .filter_map(futures::future::ready)
        .collect()
        .await;
    Ok(acked)
}

/// `bench-client dhcp-check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The server.
    #[arg(long)]
    pub server: Ipv4Addr,
    /// Our address (the relay).
    #[arg(long)]
    pub relay: Ipv4Addr,
    /// `<client id or MAC> <address>` lines: the leases acknowledged before the crash.
    #[arg(long)]
    pub known: PathBuf,
    /// Fresh clients to run DORA for afterwards.
    #[arg(long)]
    pub fresh: u32,
}

/// What the check saw: each client and the address it got (`None`: no lease).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckSummary {
    /// The clients acknowledged before the crash, again.
    pub known: Vec<(String, Option<Ipv4Addr>)>,
    /// Fresh clients.
    pub fresh: Vec<(String, Option<Ipv4Addr>)>,
}

/// Runs DORA for the known and then the fresh clients, 32 at a time.
pub async fn check(args: CheckArgs) -> Result<CheckSummary, String> {
    let text = std::fs::read_to_string(&args.known)
        .map_err(|e| format!("{}: {e}", args.known.display()))?;
    let known: Vec<[u8; 6]> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next().and_then(parse_mac))
        .collect();
    let relay = Relay::bind(args.relay, args.server)
        .await
        .map_err(|e| e.to_string())?;
    let relay = &relay;
    let run = |macs: Vec<[u8; 6]>, base: u32| async move {
        futures::stream::iter(macs.into_iter().enumerate())
            .map(|(n, mac)| async move {
                let xid = base + u32::try_from(n).unwrap_or(0);
                let ip = relay
                    .dora(&mac, xid, false, Duration::from_secs(1), 3)
                    .await
                    .ok()
                    .map(|l| l.ip);
                (format_mac(&mac), ip)
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await
    };
    let fresh: Vec<[u8; 6]> = (0..args.fresh).map(fresh_mac).collect();
    Ok(CheckSummary {
        known: run(known, 0x1000_0000).await,
        fresh: run(fresh, 0x2000_0000).await,
    })
}
