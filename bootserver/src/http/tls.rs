//! HTTPS for what must not cross the provisioning network in clear: the agent's credentials
//! and configuration (`http.tls`). The certificate and key come from files (a
//! `kubernetes.io/tls` Secret mounted, as cert-manager writes one); the SHA-256 of the
//! certificate goes to each machine with its boot (`unbounded.tls-sha256=` on the kernel
//! command line), and the agent accepts no other certificate ([`TlsEndpoint`]). iPXE's
//! script, kernels and images stay on plain HTTP: they carry no secret (a boot script
//! carries no nonce once TLS is on: [`crate::credentials`]'s ticket replaces it), and images
//! are checked by their digests.
//!
//! Handshakes run off the accept loop, each bounded by [`HANDSHAKE_TIMEOUT`], so a client
//! that connects and says nothing holds up no one; connections count against the same
//! `http.maxConnections` cap and idle limit as plain HTTP's.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::sendfile::{ConnectionLimits, HttpConnection, IdleClock};
use super::settings::TlsSettings;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the TLS endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM object of the kind needed.
    #[error("http.tls: reading {what} from {path}: {source}")]
    Read {
        /// `the certificate` or `the private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("http.tls: {0} holds no certificate")]
    NoCertificate(PathBuf),
    /// rustls refused the pair (the key is not the certificate's, an unsupported key).
    #[error("http.tls: the certificate and key cannot serve TLS: {0}")]
    Config(#[source] rustls::Error),
}

/// What a boot script tells the agent about the TLS endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsEndpoint {
    /// `https://<serverAddress>:<port>`.
    pub url: String,
    /// `https://[<dhcp6.serverAddress>]:<port>`, when DHCPv6 is on: where v6 peers go.
    pub url6: Option<String>,
    /// The SHA-256 of the server's certificate (DER), lower-case hex.
    pub sha256_hex: String,
    /// What agents are told to accept from now on, with each credential answer: this
    /// certificate's digest and, during a rotation, the next one's.
    pub pins: Vec<String>,
}

/// Loads the certificate chain and key into a server configuration, and says what the
/// agent must pin.
pub fn load(
    settings: &TlsSettings,
    server_address: std::net::Ipv4Addr,
    server6: Option<std::net::Ipv6Addr>,
) -> Result<(Arc<rustls::ServerConfig>, TlsEndpoint), TlsError> {
    let read_error = |what: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Read { what, path, source }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&settings.cert_file)
        .map_err(read_error("the certificate", &settings.cert_file))?
        .collect::<Result<_, _>>()
        .map_err(read_error("the certificate", &settings.cert_file))?;
    let leaf = chain
        .first()
        .ok_or_else(|| TlsError::NoCertificate(settings.cert_file.clone()))?;
    let digest = |der: &[u8]| {
        crate::boot_images::hex(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
    };
    let sha256_hex = digest(leaf.as_ref());
    let mut pins = vec![sha256_hex.clone()];
    if let Some(next) = &settings.next_cert_file {
        let next_leaf = CertificateDer::pem_file_iter(next)
            .map_err(read_error("the next certificate", next))?
            .next()
            .ok_or_else(|| TlsError::NoCertificate(next.clone()))?
            .map_err(read_error("the next certificate", next))?;
        pins.push(digest(next_leaf.as_ref()));
    }
    let key = PrivateKeyDer::from_pem_file(&settings.key_file)
        .map_err(read_error("the private key", &settings.key_file))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(TlsError::Config)?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(TlsError::Config)?;
    Ok((
        Arc::new(config),
        TlsEndpoint {
            url: format!("https://{server_address}:{}", settings.port),
            url6: server6.map(|ip| format!("https://[{ip}]:{}", settings.port)),
            sha256_hex,
            pins,
        },
    ))
}

impl TlsEndpoint {
    /// The URL a peer of this family reaches: the v6 one for a v6 peer when there is one.
    pub fn url_for(&self, peer: std::net::IpAddr) -> &str {
        match (peer, &self.url6) {
            (std::net::IpAddr::V6(_), Some(url6)) => url6,
            _ => &self.url,
        }
    }
}

/// A TLS connection with its place among the open connections and its idle clock.
#[derive(Debug)]
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    idle: IdleClock,
    _place: Option<OwnedSemaphorePermit>,
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.idle.poll_read(&mut this.stream, cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.idle.wrote(&written);
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Accepts TLS connections: a task accepts and hands each connection's handshake to a task
/// of its own; finished handshakes come out of [`Listener::accept`].
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsConnection, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener` with `config`, within `limits`.
    pub fn start(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        limits: ConnectionLimits,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let places = Arc::new(Semaphore::new(limits.max_connections));
        tokio::spawn(async move {
            loop {
                let place = places.clone().acquire_owned().await.ok();
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "HTTPS: accepting a connection");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, handed) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let connection = TlsConnection {
                                stream,
                                idle: IdleClock::new(limits.idle),
                                _place: place,
                            };
                            let _ = handed.send((connection, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "HTTPS: handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "HTTPS: handshake timed out"),
                    }
                });
                if done.is_closed() {
                    return;
                }
            }
        });
        Ok(Self { ready, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (the runtime shuts down): nothing comes any more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for HttpConnection {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Self {
            peer: *stream.remote_addr(),
            sends: None,
            secure: true,
        }
    }
}
