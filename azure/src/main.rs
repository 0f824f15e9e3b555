//! `unbounded-azure`: the Azure provider (see the crate documentation and docs/azure.md). It
//! acts only while it leads the Lease `unbounded-azure-provider` (`unbounded_runtime::leader`),
//! and exits non-zero the moment it stops leading, so that its restart rejoins as a follower.

use std::process::ExitCode;

use clap::Parser;
use unbounded_azure::config::{Flags, Settings};
use unbounded_runtime::leader::{Elector, name_user_agent};

/// The Lease the Azure provider's replicas elect their leader with.
const LEASE_NAME: &str = "unbounded-azure-provider";

fn main() -> ExitCode {
    let flags = Flags::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if flags.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let workload_identity = std::env::var_os("AZURE_FEDERATED_TOKEN_FILE").is_some();
    let settings = match Settings::from_flags(&flags, workload_identity) {
        Ok(s) => s,
        Err(error) => {
            eprintln!("unbounded-azure: {error}");
            return ExitCode::from(2);
        }
    };
    let election = match flags.election.config(LEASE_NAME) {
        Ok(e) => e,
        Err(error) => {
            eprintln!("unbounded-azure: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            eprintln!("unbounded-azure: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let identity = flags.election.identity();
        let clients = async {
            let mut config = kube::Config::infer().await.map_err(|e| e.to_string())?;
            name_user_agent(&mut config, "unbounded-azure", &identity);
            let lease_config = flags
                .election
                .lease_api_config(&config)
                .await
                .map_err(|e| e.to_string())?;
            let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
            let lease_client = kube::Client::try_from(lease_config).map_err(|e| e.to_string())?;
            Ok::<_, String>((client, lease_client))
        };
        let (client, lease_client) = match clients.await {
            Ok(c) => c,
            Err(error) => {
                eprintln!("unbounded-azure: connecting to the cluster: {error}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            arm = %settings.arm_endpoint,
            cluster = %settings.cluster_name,
            "Azure provider starting"
        );
        if let Err(error) = serve_probes(flags.probe_addr, client.clone()).await {
            eprintln!("unbounded-azure: {error}");
            return ExitCode::FAILURE;
        }
        let mut elector = match election {
            Some(election) => {
                let mut elector = Elector::new(lease_client, election);
                tracing::info!(lease = %elector.lease_name(), %identity, "waiting to become leader");
                tokio::select! {
                    () = elector.acquire() => {}
                    _ = unbounded_runtime::shutdown::requested() => return ExitCode::SUCCESS,
                }
                Some(elector)
            }
            None => None,
        };
        let provider = async {
            tokio::select! {
                result = unbounded_azure::run(client, settings) => match result {
                    Ok(()) => ExitCode::FAILURE, // the loops never end on their own
                    Err(error) => {
                        eprintln!("unbounded-azure: {error}");
                        ExitCode::FAILURE
                    }
                },
                _ = unbounded_runtime::shutdown::requested() => ExitCode::SUCCESS,
            }
        };
        let Some(elector) = elector.as_mut() else {
            return provider.await;
        };
        match elector.lead(provider).await {
            Ok(code) => {
                elector.release().await;
                code
            }
            Err(lost) => {
                // The provider loop and its operations have been dropped; exiting makes sure
                // nothing else of this process acts, and the restart rejoins as a follower.
                tracing::error!(%lost, "stopped leading");
                eprintln!("unbounded-azure: lost leadership: {lost}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Serves /healthz (the process runs) and /readyz (the API server answers this replica,
/// leader or follower) on `addr`, in the background.
async fn serve_probes(addr: std::net::SocketAddr, client: kube::Client) -> Result<(), String> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("binding the probe address {addr}: {e}"))?;
    tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving /healthz and /readyz");
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || unbounded_runtime::probes::readyz(client.clone())),
        );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "probe server stopped");
        }
    });
    Ok(())
}
