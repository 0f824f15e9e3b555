//! `unbounded-agent`: reads its identity from the kernel command line (or flags) and runs
//! until it fails for good; systemd restarts it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use unbounded_agent::context::Paths;
use unbounded_agent::{identity, inspect, log_file, run};

/// Paves and runs this machine's node container.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The Machine's name (default: `unbounded.machine=` on the kernel command line).
    #[arg(long, env = "UNBOUNDED_MACHINE")]
    machine: Option<String>,
    /// The bootserver's URL (default: `unbounded.bootserver=` on the kernel command line).
    /// A machine that is not network-booted may have none: it starts from a credentials file.
    #[arg(long, env = "UNBOUNDED_BOOTSERVER_URL")]
    bootserver: Option<String>,
    /// Where credentials and local state are kept.
    #[arg(long, default_value = "/var/lib/unbounded")]
    state_dir: PathBuf,
    /// A credentials file to take over, for a machine that is not network-booted (an Azure
    /// VM's custom data writes it); removed once imported.
    #[arg(long, default_value = unbounded_api::agent::CREDENTIALS_FILE)]
    credentials_file: PathBuf,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Also to the capped file the node container shows (`kubectl unbounded logs`); without
    // it (a read-only /var/log) the journal still has everything.
    let file =
        log_file::CappedFile::open(std::path::Path::new(log_file::LOG_DIR), log_file::CAP_BYTES);
    let file_layer = file.as_ref().ok().map(|file| {
        let file = file.clone();
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || file.clone())
    });
    let registry = tracing_subscriber::registry().with(filter).with(file_layer);
    if args.log_json {
        registry
            .with(tracing_subscriber::fmt::layer().json())
            .init();
    } else {
        registry.with(tracing_subscriber::fmt::layer()).init();
    }
    if let Err(error) = &file {
        tracing::warn!(%error, dir = log_file::LOG_DIR, "the agent's log file cannot be written: `kubectl unbounded logs` will not show the agent's lines");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if inspect::requested(&cmdline) {
        return inspection(&cmdline, args.bootserver.as_deref());
    }
    let identity = identity::identity(
        args.machine
            .as_deref()
            .or_else(|| identity::cmdline_value(&cmdline, identity::CMDLINE_MACHINE)),
        args.bootserver
            .as_deref()
            .or_else(|| identity::cmdline_value(&cmdline, identity::CMDLINE_BOOTSERVER)),
        identity::cmdline_value(&cmdline, identity::CMDLINE_NONCE),
    )
    .and_then(|id| identity::with_secure_channel(id, &cmdline));
    let identity = match identity {
        Ok(id) => id,
        Err(error) => {
            println!("unbounded-agent: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            println!("unbounded-agent: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let paths = Paths {
        state: args.state_dir,
        credentials_file: args.credentials_file,
        ..Paths::default()
    };
    match runtime.block_on(run::run(identity, paths)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            println!("unbounded-agent: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Inspection mode ([`inspect`]): no Machine name, no credentials; reports the inventory to
/// the bootserver until the machine is claimed, then reboots into its own network boot.
fn inspection(cmdline: &str, bootserver: Option<&str>) -> ExitCode {
    let Some(bootserver) =
        bootserver.or_else(|| identity::cmdline_value(cmdline, identity::CMDLINE_BOOTSERVER))
    else {
        println!(
            "unbounded-agent: inspection mode needs unbounded.bootserver= on the kernel command line"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            println!("unbounded-agent: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        inspect::run(
            bootserver,
            inspect::boot_mac(cmdline),
            std::path::Path::new("/"),
        )
        .await;
        match unbounded_agent::systemd::Systemd::host().await {
            Ok(systemd) => {
                if let Err(error) = systemd.reboot().await {
                    println!("unbounded-agent: rebooting: {error}");
                }
            }
            Err(error) => println!("unbounded-agent: rebooting: {error}"),
        }
    });
    // Whatever happened, exit non-zero: systemd restarts the agent, which reports again.
    ExitCode::FAILURE
}
