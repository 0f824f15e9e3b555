//! `unbounded-controller`: runs the controllers against the cluster of `KUBECONFIG` (or the
//! in-cluster configuration), as the leader of its Lease (`unbounded_runtime::leader`): it
//! reconciles only while it leads, and exits non-zero the moment it stops leading, so that
//! its restart rejoins as a follower.

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
use unbounded_controller::api_limits::RateLimitLayer;
use unbounded_controller::events::EventSettings;
use unbounded_controller::metrics::Metrics;
use unbounded_controller::recount::RecountTiming;
use unbounded_controller::{Settings, run};
use unbounded_runtime::leader::{ElectionFlags, Elector, name_user_agent};

/// The Lease the controller's replicas elect their leader with.
const LEASE_NAME: &str = "unbounded-controller";

#[derive(Parser, Debug)]
#[command(
    name = "unbounded-controller",
    version,
    about = "Unbounded's controller"
)]
struct Flags {
    /// Address of the metrics and health endpoint (/metrics, /healthz, /readyz).
    #[arg(long, env = "UNBOUNDED_METRICS_ADDR", default_value = "127.0.0.1:8080")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    election: ElectionFlags,
    /// How long draining a Node may take before it is deleted anyway, in seconds.
    #[arg(long, default_value_t = 300)]
    drain_timeout_seconds: u64,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Requests per second to the API server, on average (0: no limit). See docs/controller.md's
    /// "The controller at scale".
    #[arg(long, env = "UNBOUNDED_API_QPS", default_value_t = 500.0)]
    api_qps: f64,
    /// Requests that may go to the API server at once after a quiet spell.
    #[arg(long, env = "UNBOUNDED_API_BURST", default_value_t = 1000)]
    api_burst: u32,
    /// Machines reconciled at once.
    #[arg(long, default_value_t = Settings::default().machine_concurrency)]
    machine_concurrency: u16,
    /// MachineConfigurations reconciled at once.
    #[arg(long, default_value_t = Settings::default().configuration_concurrency)]
    configuration_concurrency: u16,
    /// A configuration whose Machines changed is recounted once they were quiet this long,
    /// in milliseconds...
    #[arg(long, default_value_t = 2000)]
    recount_quiet_ms: u64,
    /// ...or at the latest this long after the first change, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    recount_max_wait_ms: u64,
    /// Events published per second, on average (they queue; beyond the queue they are
    /// dropped and counted).
    #[arg(long, default_value_t = EventSettings::default().qps)]
    event_qps: f64,
    /// Events that may wait to be published.
    #[arg(long, default_value_t = EventSettings::default().queue)]
    event_queue: usize,
    /// Also act as a Cluster API infrastructure and bootstrap provider (UnboundedMachines,
    /// UnboundedConfigs, UnboundedClusters): needs Cluster API's CRDs and ours
    /// (deploy/cluster-api). See docs/cluster-api.md.
    #[arg(long, env = "UNBOUNDED_CLUSTER_API")]
    cluster_api: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    init_logs(flags.log_json);

    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let registry = Arc::new(registry);
    let election = flags.election.config(LEASE_NAME)?;
    let identity = flags.election.identity();
    let mut config = kube::Config::infer()
        .await
        .context("reading the Kubernetes API configuration (KUBECONFIG or in-cluster)")?;
    // The audit log then says which replica made each request.
    name_user_agent(&mut config, "unbounded-controller", &identity);
    let lease_config = flags.election.lease_api_config(&config).await?;
    let client = kube::client::ClientBuilder::try_from(config)
        .context("building the Kubernetes API client")?
        .with_layer(&RateLimitLayer::new(flags.api_qps, flags.api_burst))
        .build();
    let listener = tokio::net::TcpListener::bind(flags.metrics_addr)
        .await
        .with_context(|| format!("binding the metrics address {}", flags.metrics_addr))?;
    let bound = listener.local_addr().unwrap_or(flags.metrics_addr);
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    let probe_client = client.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // Ready while the API server answers this replica (leader or follower).
        .route(
            "/readyz",
            get(move || unbounded_runtime::probes::readyz(probe_client.clone())),
        )
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
    let settings = Settings {
        drain_timeout: Duration::from_secs(flags.drain_timeout_seconds),
        machine_concurrency: flags.machine_concurrency,
        configuration_concurrency: flags.configuration_concurrency,
        operation_concurrency: Settings::default().operation_concurrency,
        recount: RecountTiming {
            quiet: Duration::from_millis(flags.recount_quiet_ms),
            max_wait: Duration::from_millis(flags.recount_max_wait_ms),
        },
        events: EventSettings {
            qps: flags.event_qps,
            queue: flags.event_queue,
            ..EventSettings::default()
        },
        cluster_api: flags.cluster_api,
        ..Settings::default()
    };

    let shutdown = futures::FutureExt::shared(Box::pin(async {
        let signal = unbounded_runtime::shutdown::requested().await;
        tracing::info!(%signal, "shutting down");
    }));
    let Some(election) = election else {
        return run(client, settings, metrics, shutdown)
            .await
            .context("controller");
    };
    // The Lease gets a client of its own, so that renewing it never queues behind the
    // rate limit of the reconcilers' requests.
    let lease_client =
        kube::Client::try_from(lease_config).context("building the Lease's API client")?;
    let mut elector = Elector::new(lease_client, election);
    tracing::info!(lease = %elector.lease_name(), %identity, "waiting to become leader");
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.clone() => return Ok(()),
    }
    match elector.lead(run(client, settings, metrics, shutdown)).await {
        Ok(result) => {
            elector.release().await;
            result.context("controller")
        }
        Err(lost) => {
            // Every reconciler has been dropped already; exiting makes sure nothing else of
            // this process writes, and the restart rejoins as a follower.
            tracing::error!(%lost, "stopped leading");
            Err(anyhow::Error::new(lost).context("lost leadership"))
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
