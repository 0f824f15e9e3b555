//! `unbounded-bootserver --config <file>`: DHCP/ProxyDHCP, TFTP and HTTP/iPXE, and with the
//! Kubernetes backend the PXE provider. DHCP, TFTP and HTTP serve on every replica; the PXE
//! provider runs only on the replica that leads the Lease `unbounded-pxe-provider`
//! (`unbounded_runtime::leader`), so that two bootservers never drive one BMC.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use unbounded_bootserver::backend::{MachineBackend, StaticBackend};
use unbounded_bootserver::config::{BackendKind, Settings};
use unbounded_bootserver::kube_backend::KubeBackend;
use unbounded_bootserver::server::Background;
use unbounded_runtime::leader::{ElectionFlags, Elector, lead_repeatedly, name_user_agent};

/// The Lease the PXE providers of every bootserver elect their leader with.
const LEASE_NAME: &str = "unbounded-pxe-provider";

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
    /// Leader election of the PXE provider (with the Kubernetes backend and `power.enabled`).
    #[command(flatten)]
    election: ElectionFlags,
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
    let election = match args.election.config(LEASE_NAME) {
        Ok(e) => e,
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
        BackendKind::Kubernetes => match runtime.block_on(api_clients(&args.election)) {
            Ok((client, lease_client)) => {
                if settings.power_enabled {
                    let power = settings.power;
                    let provider_client = client.clone();
                    let provider = move || {
                        unbounded_bootserver::pxe_provider::run(provider_client.clone(), power)
                    };
                    match election {
                        Some(election) => {
                            let mut elector = Elector::new(lease_client, election);
                            background.spawn(async move {
                                lead_repeatedly(&mut elector, provider).await;
                                "PXE provider"
                            });
                        }
                        None => {
                            background.spawn(async move {
                                provider().await;
                                "PXE provider"
                            });
                        }
                    }
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

/// The bootserver's API client and the Lease's (a connection pool of its own), both naming
/// this replica in their `User-Agent`.
async fn api_clients(election: &ElectionFlags) -> Result<(kube::Client, kube::Client), String> {
    let mut config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    name_user_agent(&mut config, "unbounded-bootserver", &election.identity());
    let lease_config = election
        .lease_api_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let lease_client = kube::Client::try_from(lease_config).map_err(|e| e.to_string())?;
    Ok((client, lease_client))
}
