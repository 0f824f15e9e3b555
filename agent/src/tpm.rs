//! The machine's TPM 2.0, through tpm2-tools (Debian's, over its libtss2): the endorsement
//! key (EK), an attestation key (AK) made under it, the activation of the bootserver's
//! challenge and a quote of the PCRs (`unbounded_api::identity` says what each proves).
//!
//! tpm2-tools rather than an in-process binding: the host image carries the tools (a few
//! MB with libtss2), the agent stays a plain Rust build, and every step is one command that
//! an operator can run by hand to see what the agent saw. Each step runs with the TCTI of
//! [`Tpm`] (`device:/dev/tpmrm0`, the kernel's resource manager, unless a test names an
//! swtpm); the keys' context files live in a directory of the agent's state (root only; a
//! context is the TPM's own wrapped blob, useless outside that TPM).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

/// The PCRs quoted: the firmware's (0–7) and those a boot loader or the kernel extends
/// (8, 9). docs/security.md says what each firmware path measures into which.
pub const QUOTED_PCRS: &str = "sha256:0,1,2,3,4,5,6,7,8,9";

/// How long one tpm2-tools command may take (an RSA key generation on a slow TPM takes
/// seconds; a TPM that hangs must not hang the agent).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the TPM could not do its part.
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    /// No TPM device and no TCTI given.
    #[error(
        "this Machine is in TPM identity mode, but the machine has no TPM (/dev/tpmrm0 is missing): enable the TPM in the firmware, or set the Machine's spec.pxe.identity.mode to network"
    )]
    NoTpm,
    /// A tpm2-tools command failed.
    #[error("{step}: {message}")]
    Step {
        /// The command.
        step: &'static str,
        /// Its error output.
        message: String,
    },
    /// A tpm2-tools command could not be run.
    #[error("{step}: cannot run it (is tpm2-tools installed?): {source}")]
    NotRun {
        /// The command.
        step: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The work directory could not be used.
    #[error("TPM work directory {path}: {source}")]
    Io {
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The TPM the agent talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tpm {
    /// The TCTI (`swtpm:host=127.0.0.1,port=2321`); `None` is tpm2-tools' default, the
    /// kernel's resource manager.
    pub tcti: Option<String>,
    /// Where the key contexts are kept.
    pub dir: PathBuf,
}

/// The two public keys, as TPM2B_PUBLIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The endorsement key.
    pub endorsement: Vec<u8>,
    /// The attestation key.
    pub attestation: Vec<u8>,
}

/// A quote and the PCR values it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    /// TPMS_ATTEST.
    pub message: Vec<u8>,
    /// TPMT_SIGNATURE.
    pub signature: Vec<u8>,
    /// SHA-256 PCR values by index, hex.
    pub pcrs: BTreeMap<String, String>,
}

impl Tpm {
    /// The machine's own TPM, its contexts under `dir`; [`TpmError::NoTpm`] without one.
    pub fn system(dir: &Path) -> Result<Self, TpmError> {
        if !Path::new("/dev/tpmrm0").exists() {
            return Err(TpmError::NoTpm);
        }
        Ok(Self {
            tcti: None,
            dir: dir.to_owned(),
        })
    }

    async fn run(&self, step: &'static str, args: &[&str]) -> Result<Vec<u8>, TpmError> {
        let mut command = Command::new(step);
        command.args(args).current_dir(&self.dir).kill_on_drop(true);
        if let Some(tcti) = &self.tcti {
            command.env("TPM2TOOLS_TCTI", tcti);
        }
        let output = tokio::time::timeout(STEP_TIMEOUT, command.output())
            .await
            .map_err(|_| TpmError::Step {
                step,
                message: format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
            })?
            .map_err(|source| TpmError::NotRun { step, source })?;
        // Without the kernel's resource manager (an swtpm on a socket), loaded objects stay
        // in the TPM's few slots: flush them after each step. With it, there are none.
        if self.tcti.is_some() {
            let mut flush = Command::new("tpm2_flushcontext");
            flush.arg("-t").current_dir(&self.dir);
            if let Some(tcti) = &self.tcti {
                flush.env("TPM2TOOLS_TCTI", tcti);
            }
            let _ = flush.output().await;
        }
        if output.status.success() {
            return Ok(output.stdout);
        }
        let message = String::from_utf8_lossy(&output.stderr);
        Err(TpmError::Step {
            step,
            message: message
                .lines()
                .rfind(|l| l.contains("ERROR"))
                .unwrap_or(message.trim())
                .chars()
                .take(300)
                .collect(),
        })
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, TpmError> {
        let path = self.dir.join(file);
        std::fs::read(&path).map_err(|source| TpmError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn write(&self, file: &str, bytes: &[u8]) -> Result<(), TpmError> {
        let path = self.dir.join(file);
        std::fs::write(&path, bytes).map_err(|source| TpmError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// The EK (from the TCG's RSA template: the same key every time on one TPM) and a new AK
    /// under it.
    pub async fn keys(&self) -> Result<Keys, TpmError> {
        create_private_dir(&self.dir)?;
        self.run(
            "tpm2_createek",
            &["-c", "ek.ctx", "-G", "rsa", "-u", "ek.pub"],
        )
        .await?;
        self.run(
            "tpm2_createak",
            &[
                "-C", "ek.ctx", "-c", "ak.ctx", "-G", "rsa", "-g", "sha256", "-s", "rsassa", "-u",
                "ak.pub", "-n", "ak.name",
            ],
        )
        .await?;
        Ok(Keys {
            endorsement: self.read("ek.pub")?,
            attestation: self.read("ak.pub")?,
        })
    }

    /// The TPM name of the endorsement key (`000b` and the SHA-256 of its public area, hex):
    /// what a Machine records as `spec.pxe.identity.endorsementKey`.
    pub async fn endorsement_key_name(&self) -> Result<String, TpmError> {
        create_private_dir(&self.dir)?;
        self.run(
            "tpm2_createek",
            &["-c", "ek.ctx", "-G", "rsa", "-u", "ek.pub"],
        )
        .await?;
        let public = self.read("ek.pub")?;
        tpm_name(&public).ok_or_else(|| TpmError::Step {
            step: "tpm2_createek",
            message: "its public key file is not a TPM2B_PUBLIC".into(),
        })
    }

    /// Activates the bootserver's credential with the EK, for the AK: the secret inside.
    /// The EK's policy asks for the endorsement hierarchy's authorisation (PolicySecret).
    pub async fn activate(&self, credential: &[u8]) -> Result<Vec<u8>, TpmError> {
        self.write("challenge.bin", credential)?;
        self.run(
            "tpm2_startauthsession",
            &["--policy-session", "-S", "session.ctx"],
        )
        .await?;
        let activated = async {
            self.run("tpm2_policysecret", &["-S", "session.ctx", "-c", "e"])
                .await?;
            self.run(
                "tpm2_activatecredential",
                &[
                    "-c",
                    "ak.ctx",
                    "-C",
                    "ek.ctx",
                    "-i",
                    "challenge.bin",
                    "-o",
                    "secret.bin",
                    "-P",
                    "session:session.ctx",
                ],
            )
            .await
        }
        .await;
        let _ = self.run("tpm2_flushcontext", &["session.ctx"]).await;
        activated?;
        let secret = self.read("secret.bin")?;
        let _ = std::fs::remove_file(self.dir.join("secret.bin"));
        Ok(secret)
    }

    /// A quote of [`QUOTED_PCRS`] by the AK over `qualifying`.
    pub async fn quote(&self, qualifying: &[u8]) -> Result<Quote, TpmError> {
        let qualifying = unbounded_api::identity::hex(qualifying);
        let stdout = self
            .run(
                "tpm2_quote",
                &[
                    "-c",
                    "ak.ctx",
                    "-l",
                    QUOTED_PCRS,
                    "-q",
                    &qualifying,
                    "-m",
                    "quote.msg",
                    "-s",
                    "quote.sig",
                    // The values quoted are printed only when they are also written out.
                    "-o",
                    "quote.pcrs",
                    "-g",
                    "sha256",
                ],
            )
            .await?;
        Ok(Quote {
            message: self.read("quote.msg")?,
            signature: self.read("quote.sig")?,
            pcrs: quoted_pcrs(&String::from_utf8_lossy(&stdout)),
        })
    }
}

/// The TPM name (SHA-256 name algorithm) of a key from its TPM2B_PUBLIC, hex.
pub fn tpm_name(tpm2b_public: &[u8]) -> Option<String> {
    let size = usize::from(u16::from_be_bytes([
        *tpm2b_public.first()?,
        *tpm2b_public.get(1)?,
    ]));
    let area = tpm2b_public.get(2..2 + size)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, area);
    Some(format!(
        "000b{}",
        unbounded_api::identity::hex(digest.as_ref())
    ))
}

fn create_private_dir(dir: &Path) -> Result<(), TpmError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io = |source| TpmError::Io {
        path: dir.display().to_string(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

/// The SHA-256 PCR values in `tpm2_quote`'s report (`pcrs:` / `sha256:` / `  4 : 0x…`).
pub fn quoted_pcrs(report: &str) -> BTreeMap<String, String> {
    let mut pcrs = BTreeMap::new();
    let mut in_sha256 = false;
    for line in report.lines() {
        let trimmed = line.trim();
        if trimmed.ends_with(':') && !trimmed.contains(' ') {
            in_sha256 = trimmed == "sha256:";
            continue;
        }
        if !in_sha256 {
            continue;
        }
        if let Some((index, value)) = trimmed.split_once(':') {
            let (index, value) = (index.trim(), value.trim().trim_start_matches("0x"));
            if index.parse::<u8>().is_ok() && value.len() == 64 {
                pcrs.insert(index.to_owned(), value.to_ascii_lowercase());
            }
        }
    }
    pcrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_s_name_is_its_name_algorithm_and_the_digest_of_its_public_area() {
        let area = b"a public area";
        let mut tpm2b = vec![0, u8::try_from(area.len()).unwrap()];
        tpm2b.extend_from_slice(area);
        let name = tpm_name(&tpm2b).unwrap();
        let digest = ring::digest::digest(&ring::digest::SHA256, area);
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(name, format!("000b{hex}"));
        assert_eq!(tpm_name(&tpm2b[..5]), None, "shorter than its size says");
    }

    #[test]
    fn reads_the_pcrs_of_tpm2_quote_s_report() {
        let zero = "0".repeat(64);
        let four = "AB".repeat(32);
        let report = format!(
            "quoted: ff54\nsignature:\n  alg: rsassa\n  sig: a43c\npcrs:\n  sha256:\n    0 : 0x{zero}\n    4 : 0x{four}\ncalcDigest: 5341\n"
        );
        let pcrs = quoted_pcrs(&report);
        assert_eq!(pcrs.len(), 2, "{pcrs:?}");
        assert_eq!(pcrs["0"], zero);
        assert_eq!(pcrs["4"], four.to_ascii_lowercase());
        let sha1 = format!("pcrs:\n  sha1:\n    0 : 0x{}\n", "1".repeat(40));
        assert!(quoted_pcrs(&sha1).is_empty(), "another bank");
    }
}
