//! `unbounded-bootserver --config <file>`: DHCP/ProxyDHCP, TFTP and HTTP/iPXE, and with the
//! Kubernetes backend the PXE provider. DHCP, TFTP and HTTP serve on every replica; the PXE
//! provider runs only on the replica that leads the Lease `unbounded-pxe-provider`
//! (`unbounded_runtime::leader`), so that two bootservers never drive one BMC.
//!
//! Nothing starts until the start-up check passes (`unbounded_bootserver::preflight`); the
//! health routes answer from the first moment on `--probe-addr`.
//!
//! `unbounded-bootserver install-images --from <set> --to <imagesDir>` installs a set of
//! boot images (`unbounded_bootserver::boot_images`): the init container of the
//! Deployment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use unbounded_bootserver::backend::{MachineBackend, StaticBackend};
use unbounded_bootserver::config::{BackendKind, Defaults, Settings};
use unbounded_bootserver::dhcp::settings::UnknownMachines;
use unbounded_bootserver::http::Probe;
use unbounded_bootserver::kube_backend::KubeBackend;
use unbounded_bootserver::preflight::Readiness;
use unbounded_bootserver::server::Background;
use unbounded_runtime::leader::{ElectionFlags, Elector, Term, lead_repeatedly, name_user_agent};

/// The Lease the PXE providers of every bootserver elect their leader with.
const LEASE_NAME: &str = "unbounded-pxe-provider";

/// Network-boots machines: DHCP or ProxyDHCP, TFTP and HTTP (iPXE).
#[derive(Debug, Parser)]
#[command(version, subcommand_negates_reqs = true)]
struct Args {
    /// The configuration file (YAML; see the crate documentation).
    #[arg(long, env = "UNBOUNDED_BOOTSERVER_CONFIG", required = true)]
    config: Option<PathBuf>,
    /// The TFTP root when the configuration names none (`tftp.root`). The container image
    /// sets it to the iPXE builds it carries.
    #[arg(
        long,
        env = "UNBOUNDED_BOOTSERVER_TFTP_ROOT",
        default_value = "/usr/lib/ipxe"
    )]
    default_tftp_root: PathBuf,
    /// Where `/healthz`, `/readyz` and `/metrics` also answer, from the moment the process
    /// starts (the kubelet's probes: with `hostNetwork` they reach the node's address, not
    /// necessarily `serverAddress`).
    #[arg(long, env = "UNBOUNDED_BOOTSERVER_PROBE_ADDR")]
    probe_addr: Option<SocketAddr>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Leader election of the PXE provider (with the Kubernetes backend and `power.enabled`).
    #[command(flatten)]
    election: ElectionFlags,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Installs a set of boot images (a directory with `manifest.json`, a kernel, an initrd
    /// and a node image) into `<to>/<version>/`, verifying every file against the manifest;
    /// refuses on any mismatch, and when the version is installed with other contents.
    InstallImages {
        /// The set.
        #[arg(long)]
        from: PathBuf,
        /// The images directory the bootserver serves (`http.imagesDir`).
        #[arg(long)]
        to: PathBuf,
    },
}

fn install_images(from: &std::path::Path, to: &std::path::Path) -> ExitCode {
    use unbounded_bootserver::boot_images::{InstallOutcome, install};
    match install(from, to) {
        Ok(InstallOutcome::Installed { version, bytes }) => {
            println!(
                "installed boot images {version} ({bytes} bytes, every file verified) into {}",
                to.join(&version).display()
            );
            ExitCode::SUCCESS
        }
        Ok(InstallOutcome::AlreadyInstalled { version }) => {
            println!(
                "boot images {version} are already installed in {}, intact",
                to.join(&version).display()
            );
            ExitCode::SUCCESS
        }
        Ok(InstallOutcome::Repaired { version, faults }) => {
            for fault in &faults {
                println!("boot images {version}: the installed copy was damaged: {fault}");
            }
            println!(
                "boot images {version}: replaced with a verified copy in {}",
                to.join(&version).display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("unbounded-bootserver install-images: {error}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::InstallImages { from, to }) = &args.command {
        return install_images(from, to);
    }
    let Some(config) = &args.config else {
        eprintln!("unbounded-bootserver: --config is required");
        return ExitCode::from(2);
    };
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
    let defaults = Defaults {
        tftp_root: args.default_tftp_root.clone(),
    };
    let settings = match Settings::load_with(config, &defaults) {
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
    let probe = Arc::new(Probe::new(Arc::new(Readiness::default())));
    if let Some(addr) = args.probe_addr {
        match runtime.block_on(tokio::net::TcpListener::bind(addr)) {
            Ok(listener) => {
                tracing::info!(%addr, "probe HTTP listening (/healthz, /readyz, /metrics)");
                let probe = probe.clone();
                background.spawn(async move {
                    unbounded_bootserver::server::serve_probe(listener, probe).await;
                    "probe HTTP"
                });
            }
            Err(error) => {
                eprintln!("unbounded-bootserver: --probe-addr {addr}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    // Nothing serves, and the PXE provider powers nothing on, before the configuration
    // agrees with the host.
    runtime.block_on(unbounded_bootserver::server::preflight(
        &settings,
        &probe,
        args.probe_addr.is_none(),
    ));
    let mut issuer = None;
    let mut discovery = None;
    let mut fences = None;
    let backend: Arc<dyn MachineBackend> = match settings.backend {
        BackendKind::File => Arc::new(StaticBackend::new(settings.machines.clone())),
        BackendKind::Kubernetes => match runtime.block_on(api_clients(&args.election)) {
            Ok((client, lease_client)) => {
                if settings.ha.is_some() {
                    fences = Some(unbounded_bootserver::ha::fence::FenceApi {
                        client: lease_client.clone(),
                        namespace: args.election.leader_election_namespace.clone(),
                        timing: election.as_ref().map(|e| e.timing).unwrap_or_default(),
                    });
                }
                if settings.power_enabled {
                    let power = settings.power;
                    let provider_client = client.clone();
                    let provider =
                        move |term| unbounded_pxe::run(provider_client.clone(), power, term);
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
                                provider(Term::unbounded()).await;
                                "PXE provider"
                            });
                        }
                    }
                }
                issuer = match settings
                    .credentials
                    .clone()
                    .map(|c| unbounded_bootserver::credentials::Issuer::new(c, client.clone()))
                {
                    Some(Ok(issuer)) => Some(Arc::new(issuer)),
                    Some(Err(error)) => {
                        eprintln!("unbounded-bootserver: {error}");
                        return ExitCode::FAILURE;
                    }
                    None => None,
                };
                let backend = KubeBackend::start(client.clone(), &mut background);
                if settings.dhcp.unknown_machines == UnknownMachines::Discover
                    && let Some(d) = &settings.discovery
                {
                    discovery = Some(Arc::new(
                        unbounded_bootserver::discovery_writes::DiscoveryWriter::new(
                            client,
                            backend.clone(),
                            d.limits,
                        ),
                    ));
                }
                backend
            }
            Err(error) => {
                eprintln!("unbounded-bootserver: connecting to the cluster: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let shutdown = async {
        let signal = unbounded_runtime::shutdown::requested().await;
        tracing::info!(%signal, "shutting down");
    };
    match runtime.block_on(unbounded_bootserver::server::run(
        settings,
        backend,
        unbounded_bootserver::server::FromCluster {
            issuer,
            discovery,
            fences,
        },
        background,
        shutdown,
        Some(probe),
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
