//! `unbounded-controller`: runs the controllers against the cluster of `KUBECONFIG` (or the
//! in-cluster configuration), as the leader of its Lease.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Parser;
use prometheus_client::registry::Registry;
use unbounded_controller::leader::{LeaderElector, LeaseSettings};
use unbounded_controller::metrics::Metrics;
use unbounded_controller::{Settings, run};

#[derive(Parser, Debug)]
#[command(
    name = "unbounded-controller",
    version,
    about = "Unbounded's controller"
)]
struct Flags {
    /// Address of the metrics and health endpoint (/metrics, /healthz).
    #[arg(long, env = "UNBOUNDED_METRICS_ADDR", default_value = "127.0.0.1:8080")]
    metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "UNBOUNDED_LEADER_ELECTION_NAMESPACE",
        default_value = "unbounded-system"
    )]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "unbounded-controller")]
    lease_name: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Run without leader election (one replica only; tests).
    #[arg(long)]
    no_leader_election: bool,
    /// How long draining a Node may take before it is deleted anyway, in seconds.
    #[arg(long, default_value_t = 300)]
    drain_timeout_seconds: u64,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    init_logs(flags.log_json);

    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let registry = Arc::new(registry);
    let listener = tokio::net::TcpListener::bind(flags.metrics_addr)
        .await
        .with_context(|| format!("binding the metrics address {}", flags.metrics_addr))?;
    tracing::info!(addr = %flags.metrics_addr, "serving /metrics and /healthz");
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { render_metrics(&registry) }
            }),
        );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics server stopped");
        }
    });

    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG or in-cluster configuration)")?;
    let settings = Settings {
        drain_timeout: Duration::from_secs(flags.drain_timeout_seconds),
        ..Settings::default()
    };

    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    };
    if flags.no_leader_election {
        return run(client, settings, metrics, shutdown)
            .await
            .context("controller");
    }
    let identity = flags.identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let elector = LeaderElector::new(
        client.clone(),
        LeaseSettings {
            namespace: flags.leader_election_namespace,
            name: flags.lease_name,
            identity,
            duration: Duration::from_secs(15),
        },
    );
    tracing::info!("waiting to become leader");
    elector.acquire().await.context("leader election")?;
    tokio::select! {
        result = run(client, settings, metrics, shutdown) => result.context("controller"),
        () = elector.keep_renewing() => {
            // Another replica may lead now: stop at once rather than act twice.
            anyhow::bail!("lost leadership")
        }
    }
}

fn render_metrics(registry: &Registry) -> impl IntoResponse + use<> {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding metrics failed".to_owned(),
        ),
    }
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
