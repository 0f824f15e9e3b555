//! The process-wide rustls crypto provider (ring: no C build, like kube's).

/// Installs ring as rustls's default provider; a second call (or one kube made) is a no-op.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
