//! The boot scripts' nonces on disk (`credentials.nonceFile`), so that a bootserver that
//! restarts — a pod replaced, an upgrade — still accepts the nonce it put in a script just
//! before: a machine whose firmware fetched its script from the old process and whose agent
//! asks the new one must not be refused for ever (its agent can only wait for a reboot).
//!
//! The file is a snapshot (JSON, replaced atomically: a temporary file, synced, renamed,
//! the directory synced) written before the script that carries a new nonce is served, and
//! again when a nonce is spent. It holds each nonce's SHA-256, never the nonce: whoever
//! reads the file cannot present one. Expired entries are dropped when it is read.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The largest file read back (a few hundred bytes per machine).
const MAX_BYTES: u64 = 64 << 20;

/// One machine's current nonce as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredNonce {
    /// SHA-256 of the nonce, lower-case hex.
    pub sha256: String,
    /// The address its script was served to.
    pub ip: IpAddr,
    /// When it expires (seconds since the Unix epoch).
    pub expires_unix: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    nonces: BTreeMap<String, StoredNonce>,
}

const VERSION: u32 = 1;

/// Why the nonce file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NonceFileError {
    /// Reading, writing, syncing or renaming failed.
    #[error("nonce file {path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not JSON of a snapshot (or, writing, the snapshot would not encode).
    #[error("nonce file {path}: not a nonce snapshot: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What the JSON decoder or encoder said.
        source: serde_json::Error,
    },
    /// The file is not a snapshot this version wrote.
    #[error("nonce file {path}: not a nonce snapshot: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The nonce file at a path.
#[derive(Debug, Clone)]
pub struct NonceFile {
    path: PathBuf,
}

impl NonceFile {
    /// The file at `path` (not read yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, action: &'static str) -> impl FnOnce(std::io::Error) -> NonceFileError + '_ {
        move |source| NonceFileError::Io {
            path: self.path.clone(),
            action,
            source,
        }
    }

    /// The unexpired nonces it holds at `now`; none when the file does not exist yet.
    pub fn load(&self, now: u64) -> Result<BTreeMap<String, StoredNonce>, NonceFileError> {
        let bytes = match std::fs::File::open(&self.path) {
            Ok(file) => {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(file, MAX_BYTES + 1),
                    &mut bytes,
                )
                .map_err(self.io("reading"))?;
                bytes
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(self.io("opening")(e)),
        };
        let malformed = |reason: String| NonceFileError::Malformed {
            path: self.path.clone(),
            reason,
        };
        if bytes.len() as u64 > MAX_BYTES {
            return Err(malformed(format!("larger than {MAX_BYTES} bytes")));
        }
        let snapshot: Snapshot =
            serde_json::from_slice(&bytes).map_err(|source| NonceFileError::Json {
                path: self.path.clone(),
                source,
            })?;
        if snapshot.version != VERSION {
            return Err(malformed(format!(
                "version {} (this bootserver writes {VERSION})",
                snapshot.version
            )));
        }
        if let Some((machine, _)) = snapshot
            .nonces
            .iter()
            .find(|(_, n)| n.sha256.len() != 64 || !n.sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(malformed(format!("{machine}: sha256 is not 64 hex digits")));
        }
        Ok(snapshot
            .nonces
            .into_iter()
            .filter(|(_, n)| n.expires_unix > now)
            .collect())
    }

    /// Replaces the file by `nonces`, durably.
    pub fn store(&self, nonces: &BTreeMap<String, StoredNonce>) -> Result<(), NonceFileError> {
        let snapshot = Snapshot {
            version: VERSION,
            nonces: nonces.clone(),
        };
        let bytes = serde_json::to_vec(&snapshot).map_err(|source| NonceFileError::Json {
            path: self.path.clone(),
            source,
        })?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::File::create(&tmp)
            .and_then(|mut file| file.write_all(&bytes).and_then(|()| file.sync_all()))
            .map_err(self.io("writing"))?;
        std::fs::rename(&tmp, &self.path).map_err(self.io("replacing"))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(self.io("syncing its directory"))?;
        }
        Ok(())
    }
}

/// SHA-256 of a nonce, lower-case hex.
pub fn digest_hex(nonce: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, nonce.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(nonce: &str, expires_unix: u64) -> StoredNonce {
        StoredNonce {
            sha256: digest_hex(nonce),
            ip: IpAddr::from([10, 99, 0, 21]),
            expires_unix,
        }
    }

    #[test]
    fn a_snapshot_reads_back_without_the_expired_and_without_any_nonce() {
        let dir = tempfile::tempdir().unwrap();
        let file = NonceFile::new(dir.path().join("nonces.json"));
        assert!(file.load(0).unwrap().is_empty(), "no file yet: no nonces");
        let nonces = BTreeMap::from([
            ("m1".to_owned(), stored("0123abcd", 200)),
            ("m2".to_owned(), stored("4567cdef", 100)),
        ]);
        file.store(&nonces).unwrap();
        let text = std::fs::read_to_string(file.path()).unwrap();
        assert!(
            !text.contains("0123abcd") && !text.contains("4567cdef"),
            "{text}"
        );
        let read = file.load(150).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read.get("m1"), nonces.get("m1"));
    }

    #[test]
    fn a_damaged_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nonces.json");
        let file = NonceFile::new(&path);
        for (content, says) in [
            ("{not json", "not a nonce snapshot"),
            (r#"{"version":9,"nonces":{}}"#, "version 9"),
            (
                r#"{"version":1,"nonces":{"m":{"sha256":"zz","ip":"10.0.0.1","expiresUnix":5}}}"#,
                "m: sha256 is not 64 hex digits",
            ),
        ] {
            std::fs::write(&path, content).unwrap();
            let error = file.load(0).unwrap_err().to_string();
            assert!(error.contains(says), "{content}: {error}");
            assert!(error.contains("nonces.json"), "{error}");
        }
    }

    #[test]
    fn digests_are_sha256_hex() {
        assert_eq!(
            digest_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
