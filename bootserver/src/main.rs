//! `unbounded-bootserver --config <file>`: DHCP/ProxyDHCP, TFTP and HTTP/iPXE.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use unbounded_bootserver::backend::{MachineBackend, StaticBackend};
use unbounded_bootserver::config::{BackendKind, Settings};
use unbounded_bootserver::kube_backend::KubeBackend;
use unbounded_bootserver::server::Background;

/// Network-boots machines: DHCP or ProxyDHCP, TFTP and HTTP (iPXE).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The configuration file (YAML; see the crate documentation).
    #[arg(long, env = "UNBOUNDED_BOOTSERVER_CONFIG")]
    config: PathBuf,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // ipmi-rs logs its RAKP messages at debug level; they carry HMACs of the BMC password.
    // Keep that crate at warn whatever RUST_LOG says.
    let filter = match "ipmi_rs=warn".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let settings = match Settings::load(&args.config) {
        Ok(s) => s,
        Err(error) => {
            eprintln!("unbounded-bootserver: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            eprintln!("unbounded-bootserver: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Tasks the server depends on: if one ever ends, the process exits non-zero.
    let _guard = runtime.enter();
    let mut background = Background::new();
    let mut issuer = None;
    let backend: Arc<dyn MachineBackend> = match settings.backend {
        BackendKind::File => Arc::new(StaticBackend::new(settings.machines.clone())),
        BackendKind::Kubernetes => match runtime.block_on(kube::Client::try_default()) {
            Ok(client) => {
                if settings.power_enabled {
                    let (client, power) = (client.clone(), settings.power);
                    background.spawn(async move {
                        unbounded_bootserver::pxe_provider::run(client, power).await;
                        "PXE provider"
                    });
                }
                issuer = settings.credentials.clone().map(|c| {
                    Arc::new(unbounded_bootserver::credentials::Issuer::new(
                        c,
                        client.clone(),
                    ))
                });
                KubeBackend::start(client, &mut background)
            }
            Err(error) => {
                eprintln!("unbounded-bootserver: connecting to the cluster: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match runtime.block_on(unbounded_bootserver::server::run(
        settings, backend, issuer, background, shutdown,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "stopped");
            eprintln!("unbounded-bootserver: {error}");
            ExitCode::FAILURE
        }
    }
}
