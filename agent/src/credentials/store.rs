//! The credential files in the agent's state directory: the token (what the Kubernetes
//! client reads, 0600), the CA, what is known about them (expiry, lifetime, whether this
//! boot's nonce is spent, whether the token renews itself), and the take-over of a
//! credentials file.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use unbounded_api::agent::Credentials;

use super::CredentialError;

/// What is stored beside the token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredMeta {
    /// The API server URL.
    pub server: String,
    /// Expiry, seconds since the epoch.
    pub expires_unix: u64,
    /// Lifetime when issued, in seconds.
    pub lifetime_seconds: u64,
    /// The nonce of this boot has been spent.
    pub nonce_used: bool,
    /// The token came from a credentials file and is renewed through the API server.
    #[serde(default)]
    pub self_refresh: bool,
    /// The bootserver certificates (SHA-256, hex) its last TLS answer said to accept, beside
    /// the boot's pin: how an agent follows a certificate rotation without a reboot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_pins: Vec<String>,
}

/// The credential files in the agent's state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// When a token of `lifetime` that expires at `expires` should be refreshed: at 70 % of its
/// lifetime, and never later than 2 minutes before it expires.
pub fn refresh_at(expires_unix: u64, lifetime_seconds: u64) -> u64 {
    let early = lifetime_seconds.saturating_mul(3) / 10;
    expires_unix.saturating_sub(early.max(120))
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parses an RFC 3339 timestamp into seconds since the epoch.
pub fn parse_time(text: &str) -> Option<u64> {
    let ts: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

impl Store {
    /// The store in `dir` (created 0700 when missing).
    pub fn new(dir: &Path) -> Result<Self, CredentialError> {
        fs::create_dir_all(dir).map_err(|source| CredentialError::Store {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Where the TPM's key contexts are kept (TPM identity mode).
    pub fn tpm_dir(&self) -> PathBuf {
        self.dir.join("tpm")
    }

    /// The token file (what the Kubernetes client reads).
    pub fn token_path(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// The CA file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn meta_path(&self) -> PathBuf {
        self.dir.join("credentials.json")
    }

    pub(super) fn bootstrap_path(&self) -> PathBuf {
        self.dir.join("bootstrap-token")
    }

    /// The kubelet bootstrap token a credentials file brought, if any.
    pub fn bootstrap_token(&self) -> Option<String> {
        fs::read_to_string(self.bootstrap_path())
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    }

    /// What is stored, if anything.
    pub fn meta(&self) -> Option<StoredMeta> {
        let bytes = fs::read(self.meta_path()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The stored token, if any.
    pub fn token(&self) -> Option<String> {
        fs::read_to_string(self.token_path())
            .ok()
            .map(|t| t.trim().to_owned())
    }

    /// Whether a stored token is valid for at least another minute.
    pub fn valid_token(&self, now: u64) -> Option<(String, StoredMeta)> {
        let meta = self.meta()?;
        let token = self.token()?;
        (meta.expires_unix > now + 60 && !token.is_empty()).then_some((token, meta))
    }

    pub(super) fn write_private(&self, path: &Path, content: &[u8]) -> Result<(), CredentialError> {
        let err = |source| CredentialError::Store {
            path: path.display().to_string(),
            source,
        };
        let temporary = path.with_extension("tmp");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(err)?;
        file.write_all(content).map_err(err)?;
        fs::rename(&temporary, path).map_err(err)
    }

    /// Stores credentials (token 0600, CA, metadata).
    pub fn save(
        &self,
        credentials: &Credentials,
        nonce_used: bool,
        self_refresh: bool,
    ) -> Result<StoredMeta, CredentialError> {
        let expires_unix = parse_time(&credentials.expiration_timestamp).ok_or_else(|| {
            CredentialError::Malformed(format!(
                "expirationTimestamp {:?}",
                credentials.expiration_timestamp
            ))
        })?;
        self.write_private(
            &self.ca_path(),
            credentials.certificate_authority.as_bytes(),
        )?;
        self.write_private(&self.token_path(), credentials.token.as_bytes())?;
        let meta = StoredMeta {
            server: credentials.server.clone(),
            expires_unix,
            lifetime_seconds: credentials.lifetime_seconds,
            nonce_used,
            self_refresh,
            tls_pins: credentials.tls_sha256.clone(),
        };
        let bytes = serde_json::to_vec(&meta).map_err(CredentialError::MetaEncoding)?;
        self.write_private(&self.meta_path(), &bytes)?;
        Ok(meta)
    }

    /// Records that the nonce was spent even though no credentials were stored (the
    /// bootserver refused them for good): never send it twice.
    pub fn mark_nonce_used(&self) -> Result<(), CredentialError> {
        let meta = self.meta().unwrap_or(StoredMeta {
            server: String::new(),
            expires_unix: 0,
            lifetime_seconds: 0,
            nonce_used: true,
            self_refresh: false,
            tls_pins: Vec::new(),
        });
        let meta = StoredMeta {
            nonce_used: true,
            ..meta
        };
        let bytes = serde_json::to_vec(&meta).map_err(CredentialError::MetaEncoding)?;
        self.write_private(&self.meta_path(), &bytes)
    }
}

/// Takes over the credentials file at `path`, if there is one: stores its token, CA and
/// bootstrap token privately, marks the store as self-renewing and removes the file (it
/// holds a credential). Returns whether a file was imported.
pub fn import(store: &Store, path: &Path) -> Result<bool, CredentialError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(CredentialError::Store {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let credentials: Credentials = serde_json::from_slice(&bytes).map_err(|e| {
        // Only the position and the kind of error: serde's own message may quote a value,
        // and this file holds tokens.
        CredentialError::Malformed(format!(
            "credentials file {}: not the expected JSON ({:?} error at line {}, column {})",
            path.display(),
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    store.save(&credentials, true, true)?;
    if let Some(token) = &credentials.bootstrap_token {
        store.write_private(&store.bootstrap_path(), token.as_bytes())?;
    }
    fs::remove_file(path).map_err(|source| CredentialError::Store {
        path: path.display().to_string(),
        source,
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_happens_at_seventy_percent_or_two_minutes_before() {
        assert_eq!(refresh_at(10_000, 3600), 10_000 - 1080);
        assert_eq!(refresh_at(10_000, 300), 10_000 - 120);
        assert_eq!(refresh_at(100, 3600), 0);
    }

    #[test]
    fn store_round_trip_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path()).unwrap();
        let credentials = Credentials {
            token: "tok".into(),
            expiration_timestamp: "2099-01-01T00:00:00Z".into(),
            lifetime_seconds: 3600,
            server: "https://10.99.0.1:6443".into(),
            certificate_authority: "-----BEGIN CERTIFICATE-----\n".into(),
            bootstrap_token: None,
            tls_sha256: Vec::new(),
        };
        store.save(&credentials, true, false).unwrap();
        let (token, meta) = store.valid_token(now_unix()).unwrap();
        assert_eq!(token, "tok");
        assert!(meta.nonce_used);
        let mode = fs::metadata(store.token_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(store.valid_token(meta.expires_unix).is_none(), "expired");
    }

    #[test]
    fn a_credentials_file_is_taken_over_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("state")).unwrap();
        let file = dir.path().join("credentials.json");
        assert!(!import(&store, &file).unwrap(), "no file, nothing imported");
        let credentials = Credentials {
            token: "tok".into(),
            expiration_timestamp: "2099-01-01T00:00:00Z".into(),
            lifetime_seconds: 86_400,
            server: "https://api.example:6443".into(),
            certificate_authority: "-----BEGIN CERTIFICATE-----\n".into(),
            bootstrap_token: Some("abcdef.0123456789abcdef".into()),
            tls_sha256: Vec::new(),
        };
        fs::write(&file, serde_json::to_vec(&credentials).unwrap()).unwrap();
        assert!(import(&store, &file).unwrap());
        assert!(!file.exists(), "the file with the credential is removed");
        let meta = store.meta().unwrap();
        assert!(meta.self_refresh && meta.nonce_used);
        assert_eq!(meta.lifetime_seconds, 86_400);
        assert_eq!(store.token().as_deref(), Some("tok"));
        assert_eq!(
            store.bootstrap_token().as_deref(),
            Some("abcdef.0123456789abcdef")
        );
        let mode = fs::metadata(store.bootstrap_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        fs::write(
            &file,
            b"{\"token\": \"tok\", \"lifetimeSeconds\": \"s3cret-value\"}",
        )
        .unwrap();
        let error = import(&store, &file).unwrap_err().to_string();
        assert!(error.contains("credentials file"), "{error}");
        assert!(
            !error.contains("s3cret-value"),
            "no value in the error: {error}"
        );
        assert!(
            file.exists(),
            "a file that was not understood is left for the operator"
        );
    }
}
