//! `http:` in the configuration file, validated into [`HttpSettings`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::sendfile::ConnectionLimits;
use crate::setting::InvalidSetting;

/// `http:` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpFile {
    port: Option<u16>,
    images_dir: Option<PathBuf>,
    max_connections: Option<usize>,
    idle_seconds: Option<u64>,
    tls: Option<TlsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TlsFile {
    port: Option<u16>,
    cert_file: PathBuf,
    key_file: PathBuf,
    next_cert_file: Option<PathBuf>,
}

/// Where the bootserver answers HTTPS, and with which certificate (`http.tls`): the agent's
/// credentials and configuration go only there once it is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The HTTPS port (8443).
    pub port: u16,
    /// The certificate chain (PEM), the server's own first.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The certificate that will replace it (`nextCertFile`, during a rotation): agents are
    /// told to accept it too, with every credential answer.
    pub next_cert_file: Option<PathBuf>,
}

/// The HTTP server's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// The port (8080).
    pub port: u16,
    /// Directory of kernels, initrds and images served under `/images/`.
    pub images_dir: PathBuf,
    /// How many connections may be open, and how long one may sit idle.
    pub limits: ConnectionLimits,
    /// HTTPS for the agent's credentials and configuration (`http.tls`).
    pub tls: Option<TlsSettings>,
}

impl TryFrom<&HttpFile> for HttpSettings {
    type Error = InvalidSetting;

    fn try_from(http: &HttpFile) -> Result<Self, InvalidSetting> {
        let defaults = ConnectionLimits::default();
        let max_connections = http.max_connections.unwrap_or(defaults.max_connections);
        if !(16..=65_536).contains(&max_connections) {
            return Err(InvalidSetting(format!(
                "http.maxConnections must be between 16 and 65536, not {max_connections}"
            )));
        }
        let idle_seconds = http.idle_seconds.unwrap_or(defaults.idle.as_secs());
        if !(5..=3600).contains(&idle_seconds) {
            return Err(InvalidSetting(format!(
                "http.idleSeconds must be between 5 and 3600, not {idle_seconds}"
            )));
        }
        Ok(Self {
            port: http.port.unwrap_or(8080),
            images_dir: http
                .images_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/var/lib/unbounded/images")),
            limits: ConnectionLimits {
                max_connections,
                idle: Duration::from_secs(idle_seconds),
            },
            tls: http.tls.as_ref().map(|tls| TlsSettings {
                port: tls.port.unwrap_or(8443),
                cert_file: tls.cert_file.clone(),
                key_file: tls.key_file.clone(),
                next_cert_file: tls.next_cert_file.clone(),
            }),
        })
    }
}
