//! Starts every service of the bootserver and runs them until one ends or shutdown.
//!
//! A service never ends on its own: a panic while handling one request is caught where the
//! request is handled (DHCP, TFTP, HTTP) and only that request is dropped. If a service task
//! ends anyway (an error, a panic that escaped, a watch that stopped), [`run`] returns an
//! error naming it, and the binary exits non-zero with that message: the process is never
//! left half alive, and its supervisor (Kubernetes, systemd) restarts it.
//!
//! Before any of it, [`preflight`] holds the start until the configuration agrees with the
//! host ([`crate::preflight`]).

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::backend::MachineBackend;
use crate::config::Settings;
use crate::dhcp::settings::DhcpMode;
use crate::dhcp::{self, DhcpError, Responder};
use crate::dhcp6;
use crate::dhcp6::decide::{BootSettings6, Responder6};
use crate::dhcp6::settings::Dhcp6Mode;
use crate::http::{self, AppState, Probe};
use crate::leases::{FileStore, LeaseError, Leases};
use crate::metrics::Metrics;
use crate::tftp::{self, TftpError};

/// Why the bootserver stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// DHCP failed.
    #[error(transparent)]
    Dhcp(#[from] DhcpError),
    /// DHCPv6 could not start.
    #[error(transparent)]
    Dhcp6(#[from] crate::dhcp6::serve::Dhcp6Error),
    /// The lease store failed.
    #[error(transparent)]
    Leases(#[from] LeaseError),
    /// TFTP failed.
    #[error(transparent)]
    Tftp(#[from] TftpError),
    /// The pair's link could not start.
    #[error(transparent)]
    Pair(#[from] crate::ha::link::LinkError),
    /// A service task panicked or was cancelled.
    #[error("a bootserver service stopped: {0}")]
    Task(String),
    /// A service task returned, which it never should.
    #[error("the {0} service ended")]
    Ended(&'static str),
    /// The TLS endpoint could not be set up.
    #[error(transparent)]
    Tls(#[from] crate::http::tls::TlsError),
    /// HTTP failed.
    #[error("HTTP on {addr}: {source}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Tasks the bootserver depends on that started before it (the Kubernetes watches, the PXE
/// provider): each returns its name if it ever ends.
pub type Background = JoinSet<&'static str>;

/// Serves the health routes of `probe` on `listener` (the `--probe-addr` listener, for the
/// process's whole life); returns only if serving fails.
pub async fn serve_probe(listener: tokio::net::TcpListener, probe: Arc<Probe>) {
    let addr = listener.local_addr().ok();
    if let Err(error) = axum::serve(listener, http::probe_router(probe)).await {
        tracing::error!(%error, ?addr, "probe HTTP stopped");
    }
}

/// Returns once the start-up check passes ([`crate::preflight`]); until then the check runs
/// every [`crate::preflight::RECHECK_INTERVAL`]. When `fallback_probe` is set (no
/// `--probe-addr`), the health routes answer meanwhile on the HTTP address, if it can be
/// bound, so that `curl http://<serverAddress>:<port>/readyz` shows what is wrong.
pub async fn preflight(settings: &Settings, probe: &Arc<Probe>, fallback_probe: bool) {
    let mut checker = crate::preflight::Checker::default();
    if checker.run_once(settings, &probe.readiness).await {
        return;
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let fallback = if fallback_probe {
        let addr = settings.http_listen();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let router = http::probe_router(probe.clone());
                Some(tokio::spawn(async move {
                    let _ = axum::serve(listener, router)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                }))
            }
            Err(error) => {
                tracing::warn!(%addr, %error, "preflight: /readyz cannot answer here either (pass --probe-addr for an address that always works)");
                None
            }
        }
    } else {
        None
    };
    loop {
        tokio::time::sleep(crate::preflight::RECHECK_INTERVAL).await;
        if checker.run_once(settings, &probe.readiness).await {
            break;
        }
    }
    let _ = stop.send(());
    if let Some(task) = fallback {
        let _ = task.await;
    }
}

/// What the server does with the cluster, when it has one (the Kubernetes backend).
#[derive(Debug, Default)]
pub struct FromCluster {
    /// Agent credentials.
    pub issuer: Option<Arc<crate::credentials::Issuer>>,
    /// Discovery's writes of unknown machines.
    pub discovery: Option<Arc<crate::discovery_writes::DiscoveryWriter>>,
    /// The pair's part fences (with `ha:`).
    pub fences: Option<crate::ha::fence::FenceApi>,
}

/// Runs DHCP (full or proxy), TFTP and HTTP until one of them (or of `background`) ends, or
/// `shutdown` resolves. With a `probe`, its `/readyz` and `/metrics` then answer for this
/// server.
pub async fn run(
    settings: Settings,
    backend: Arc<dyn MachineBackend>,
    cluster: FromCluster,
    mut background: Background,
    shutdown: impl std::future::Future<Output = ()> + Send,
    probe: Option<Arc<Probe>>,
) -> Result<(), ServerError> {
    let FromCluster {
        issuer,
        discovery,
        fences,
    } = cluster;
    let settings = Arc::new(settings);
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    if let Some(issuer) = &issuer {
        issuer.register_metrics(&mut registry);
    }
    if let Some(discovery) = &discovery {
        discovery.register_metrics(&mut registry);
    }
    // A log that did not exist before this start: in a pair, the partner's catch-up makes
    // the book whole before this server answers anyone.
    let new_log = !settings.dhcp.lease_file.exists();
    // One log for both families: v6 leases live in the same book (one owner per address).
    let lease_log = match (settings.dhcp.mode, settings.dhcp6.mode) {
        (DhcpMode::Full, _) | (_, Dhcp6Mode::Full) => {
            Some(Arc::new(FileStore::open(&settings.dhcp.lease_file)?))
        }
        _ => None,
    };
    let leases = Arc::new(match &lease_log {
        Some(log) => Leases::open(log.clone())?,
        None => Leases::in_memory(),
    });
    let mut responder = Responder::new(settings.clone(), backend.clone(), leases.clone());
    let mut pair_link = None;
    if let Some(ha) = &settings.ha {
        let starting = crate::ha::pair::Pair::starting(
            if new_log {
                crate::ha::pair::StartBook::Stale
            } else {
                crate::ha::pair::StartBook::Trusted
            },
            dhcp::now_unix(),
            ha.interrupted_after.as_secs(),
            settings
                .dhcp
                .subnets
                .iter()
                .map(|subnet| u64::from(subnet.lease_seconds))
                .max()
                .unwrap_or(0),
        );
        // With an API server each part is fenced; without one nobody takes a part over.
        let pair = Arc::new(std::sync::Mutex::new(match &fences {
            Some(_) => starting.with_fences(),
            None => starting,
        }));
        let link_metrics = Arc::new(crate::ha::link::LinkMetrics::register(&mut registry));
        let link = crate::ha::link::start(
            ha,
            ha.listen_on(settings.server_address),
            pair.clone(),
            leases.clone(),
            Box::new(settings.clone()),
            link_metrics,
        )
        .await?;
        tracing::info!(name = %ha.name, partner = %ha.partner, half = ?ha.half, new_log, fenced = fences.is_some(), "one of a pair: allocating in this server's half of each pool");
        if let Some(fences) = fences {
            crate::ha::fence::start(fences, ha, pair.clone(), link.clone());
        }
        responder = responder.with_pair(pair);
        pair_link = Some(link);
    }
    let responder = Arc::new(responder);

    if let Some(interface) = settings
        .interface
        .as_deref()
        .filter(|_| settings.router_advertisements)
    {
        // Not fatal: without advertisements iPXE only boots ~13 s slower.
        match crate::ra::start(interface, &settings.dhcp6) {
            Ok(()) => tracing::info!(
                interface,
                dhcp6 = ?settings.dhcp6.mode,
                "sending IPv6 router advertisements (lifetime 0)"
            ),
            Err(error) => tracing::warn!(%error, "router advertisements are off"),
        }
    }

    let mut tasks: JoinSet<Result<&'static str, ServerError>> = JoinSet::new();
    let mut ports = Vec::new();
    match settings.dhcp.mode {
        // Both modes answer the PXE boot-server requests on 4011: UEFI PXE firmware sends
        // one after an offer that carries "PXEClient" without boot-menu vendor options.
        DhcpMode::Full | DhcpMode::Proxy => {
            ports.extend([settings.dhcp.port, settings.dhcp.proxy_port]);
        }
        DhcpMode::Off => {}
    }
    // One commit thread for every socket: records reach the log in the order decided.
    let committer = dhcp::commit::Committer::start_paired(
        leases.clone(),
        dhcp::serve::MAX_IN_FLIGHT,
        pair_link,
    )
    .map_err(dhcp::DhcpError::CommitThread)?;
    for port in ports {
        let socket = dhcp::open_socket(&settings, port)?;
        tracing::info!(port, interface = ?settings.interface, mode = ?settings.dhcp.mode, "DHCP listening");
        let (responder, leases, metrics) = (responder.clone(), leases.clone(), metrics.clone());
        let committer = committer.clone();
        tasks.spawn(async move {
            dhcp::serve(socket, port, responder, leases, committer, metrics).await?;
            Ok("DHCP")
        });
    }

    if let (Some(interface), true) = (
        settings.interface.as_deref(),
        settings.dhcp6.mode != Dhcp6Mode::Off,
    ) {
        let server6 = settings.dhcp6.server_address;
        let dhcp6 = settings
            .dhcp6
            .clone()
            .with_interface_mac(dhcp6::serve::interface_mac(interface)?);
        let responder6 = Arc::new(Responder6::new(
            Arc::new(dhcp6),
            BootSettings6 {
                uefi_x64: settings.dhcp.uefi_boot_file.clone(),
                http_base: format!("http://[{server6}]:{}", settings.http.port),
            },
            backend.clone(),
            leases.clone(),
        ));
        let sockets = dhcp6::serve::open_sockets(interface, server6, dhcp6::serve::SERVER_PORT)?;
        let unicast = Arc::new(sockets.unicast);
        tracing::info!(interface, address = %server6, mode = ?settings.dhcp6.mode, "DHCPv6 listening (ff02::1:2 and the server address, port 547)");
        let shared = dhcp6::serve::Shared6 {
            sender: unicast.clone(),
            link: server6,
            responder: responder6.clone(),
            leases: leases.clone(),
            committer: committer.clone(),
            metrics: metrics.clone(),
        };
        for (socket, is_unicast) in [
            (Arc::new(sockets.multicast), false),
            (unicast.clone(), true),
        ] {
            let shared = shared.clone();
            tasks.spawn(async move {
                dhcp6::serve::serve(socket, is_unicast, shared).await?;
                Ok("DHCPv6")
            });
        }
        if settings.dhcp6.mode == Dhcp6Mode::Proxy {
            // UEFI PXEv6 that took our proxy offer asks for its boot file on port 4011.
            let socket = dhcp6::serve::open_boot_service(interface, server6)?;
            tracing::info!(address = %server6, "DHCPv6 proxy: PXE boot service listening (port 4011)");
            let (responder6, metrics) = (responder6.clone(), metrics.clone());
            tasks.spawn(async move {
                dhcp6::serve::serve_boot_service(socket, server6, responder6, metrics).await?;
                Ok("DHCPv6 boot service")
            });
        }
        // TFTP over IPv6 beside v4: OVMF's PXEv6 fetches tftp://[server]/file.
        let tftp6 = SocketAddr::from((server6, settings.tftp.port));
        let (root, metrics) = (settings.tftp.root.clone(), metrics.clone());
        tracing::info!(addr = %tftp6, "TFTP listening (IPv6)");
        tasks.spawn(async move {
            tftp::serve(tftp6, &root, metrics).await?;
            Ok("TFTPv6")
        });
    }

    let tftp_addr = SocketAddr::from((settings.server_address, settings.tftp.port));
    let tftp_root = settings.tftp.root.clone();
    let tftp_metrics = metrics.clone();
    tracing::info!(addr = %tftp_addr, root = %tftp_root.display(), "TFTP listening");
    tasks.spawn(async move {
        tftp::serve(tftp_addr, &tftp_root, tftp_metrics).await?;
        Ok("TFTP")
    });

    let http_addr = settings.http_listen();
    let listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .map_err(|source| ServerError::Http {
            addr: http_addr,
            source,
        })?;
    tracing::info!(addr = %http_addr, images = %settings.http.images_dir.display(), "HTTP listening");
    let server6 = (settings.dhcp6.mode != Dhcp6Mode::Off).then_some(settings.dhcp6.server_address);
    // HTTPS on the v4 address and, with DHCPv6 on, on the v6 one: the agent of a machine
    // provisioned over IPv6 redeems its ticket there.
    let mut tls_listeners = Vec::new();
    let mut tls_endpoint = None;
    if let Some(tls_settings) = &settings.http.tls {
        let (config, endpoint) = http::tls::load(tls_settings, settings.server_address, server6)?;
        let addresses = std::iter::once(std::net::IpAddr::from(settings.server_address))
            .chain(server6.map(std::net::IpAddr::from));
        for ip in addresses {
            let addr = SocketAddr::new(ip, tls_settings.port);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Http { addr, source })?;
            let listener =
                http::tls::TlsListener::start(listener, config.clone(), settings.http.limits)
                    .map_err(|source| ServerError::Http { addr, source })?;
            tracing::info!(%addr, sha256 = %endpoint.sha256_hex, "HTTPS listening (credentials and configuration)");
            tls_listeners.push((listener, addr));
        }
        tls_endpoint = Some(endpoint);
    }
    let state = AppState {
        settings: settings.clone(),
        backend,
        leases,
        metrics,
        registry: Arc::new(registry),
        issuer,
        discovery,
        exchanges: responder.exchanges(),
        tls: tls_endpoint,
    };
    if let Some(probe) = &probe {
        probe.serving(state.clone());
    }
    let app = http::router(state);
    if settings.dhcp6.mode != Dhcp6Mode::Off {
        // Boot files and images over IPv6 too (option 59 names http://[server]/…).
        let addr = SocketAddr::from((settings.dhcp6.server_address, settings.http.port));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Http { addr, source })?;
        tracing::info!(%addr, "HTTP listening (IPv6)");
        let (app, limits) = (app.clone(), settings.http.limits);
        tasks.spawn(async move {
            axum::serve(
                http::sendfile::FileSendListener::new(listener, limits),
                app.into_make_service_with_connect_info::<http::sendfile::HttpConnection>(),
            )
            .await
            .map_err(|source| ServerError::Http { addr, source })?;
            Ok("HTTPv6")
        });
    }
    for (listener, addr) in tls_listeners {
        let app = app.clone();
        tasks.spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<http::sendfile::HttpConnection>(),
            )
            .await
            .map_err(|source| ServerError::Http { addr, source })?;
            Ok("HTTPS")
        });
    }
    tasks.spawn(async move {
        axum::serve(
            http::sendfile::FileSendListener::new(listener, settings.http.limits),
            app.into_make_service_with_connect_info::<http::sendfile::HttpConnection>(),
        )
        .await
        .map_err(|source| ServerError::Http {
            addr: http_addr,
            source,
        })?;
        Ok("HTTP")
    });

    tokio::select! {
        () = shutdown => {
            tracing::info!("shutting down");
            Ok(())
        }
        Some(result) = tasks.join_next() => match result {
            Ok(Ok(name)) => Err(ServerError::Ended(name)),
            Ok(Err(error)) => Err(error),
            Err(join) => Err(ServerError::Task(join.to_string())),
        },
        Some(result) = background.join_next() => match result {
            Ok(name) => Err(ServerError::Ended(name)),
            Err(join) => Err(ServerError::Task(join.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StaticBackend;

    /// A task the server depends on that ends makes `run` fail with its name (and the binary
    /// exit non-zero): never half alive.
    #[tokio::test]
    async fn a_background_task_that_ends_stops_the_server_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::parse(&format!(
            "serverAddress: 127.0.0.1\nrouterAdvertisements: false\ndhcp: {{mode: off}}\ntftp: {{root: \"{}\", port: 0}}\nhttp: {{port: 0, imagesDir: \"{}\"}}\n",
            dir.path().display(),
            dir.path().display()
        ))
        .unwrap();
        let mut background = Background::new();
        background.spawn(async { "Machine watch" });
        let result = run(
            settings,
            Arc::new(StaticBackend::default()),
            FromCluster::default(),
            background,
            std::future::pending(),
            None,
        )
        .await;
        match result {
            Err(error @ ServerError::Ended("Machine watch")) => {
                assert_eq!(error.to_string(), "the Machine watch service ended");
            }
            other => panic!("{other:?}"),
        }
    }
}
