//! An HTTPS client that accepts only the bootserver's certificate: the one whose SHA-256
//! came with the boot (`unbounded.tls-sha256`), or one the bootserver named over this same
//! pinned channel since (a rotation's next certificate, `Credentials::tls_sha256`). No CA is consulted and no name is checked:
//! the pin says which server this is, and the handshake's signature proves that the server
//! holds that certificate's key.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Accepts the one certificate whose SHA-256 is `sha256`.
#[derive(Debug)]
struct PinnedCertificate {
    pins: Vec<[u8; 32]>,
    provider: Arc<CryptoProvider>,
}

/// Whether `certificate` (DER) is the pinned one.
pub fn matches_pin(certificate: &[u8], sha256: &[u8; 32]) -> bool {
    ring::digest::digest(&ring::digest::SHA256, certificate).as_ref() == sha256
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .pins
            .iter()
            .any(|pin| matches_pin(end_entity.as_ref(), pin))
        {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the bootserver's certificate is not the one this boot pinned (unbounded.tls-sha256)"
                    .into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Why the pinned client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PinnedClientError {
    /// rustls has no protocol version to offer with this provider.
    #[error(transparent)]
    Tls(rustls::Error),
    /// The HTTP client refused the TLS configuration.
    #[error(transparent)]
    Build(reqwest::Error),
}

/// A client for the bootserver's TLS endpoint that trusts only the certificates `pins` (SHA-256).
pub fn client(pins: Vec<[u8; 32]>) -> Result<reqwest::Client, PinnedClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(PinnedClientError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCertificate { pins, provider }))
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| PinnedClientError::Build(e.without_url()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pinned_certificate_matches() {
        let certificate = b"not really DER, but bytes all the same";
        let mut pin = [0u8; 32];
        pin.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, certificate).as_ref());
        assert!(matches_pin(certificate, &pin));
        assert!(!matches_pin(b"another certificate", &pin));
    }
}
