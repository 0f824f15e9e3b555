//! Who this machine is and where its bootserver is: read from the kernel command line that
//! the bootserver's iPXE script wrote (`unbounded.machine=…`, `unbounded.bootserver=…`,
//! `unbounded.nonce=…`), or given on the agent's own command line (an Azure VM's custom data,
//! a test). A machine that was not network-booted may have no bootserver: it starts from a
//! credentials file instead ([`crate::credentials::import`]).

/// Kernel command-line key that carries the Machine's name.
pub const CMDLINE_MACHINE: &str = "unbounded.machine";
/// Kernel command-line key that carries the bootserver's base URL.
pub const CMDLINE_BOOTSERVER: &str = "unbounded.bootserver";
/// Kernel command-line key that carries the one-time credential nonce of this boot.
pub const CMDLINE_NONCE: &str = "unbounded.nonce";
/// Kernel command-line key that carries the bootserver's HTTPS base URL, where a bootserver
/// that speaks TLS issues credentials.
pub const CMDLINE_CREDENTIALS: &str = "unbounded.credentials";
/// Kernel command-line key that carries the SHA-256 (hex) of that server's certificate: the
/// only certificate the agent accepts there.
pub const CMDLINE_TLS_SHA256: &str = "unbounded.tls-sha256";
/// Kernel command-line key (`=1`) that says this boot has a ticket to redeem over TLS in
/// place of a nonce.
pub const CMDLINE_TICKET: &str = "unbounded.ticket";
/// Kernel command-line key (`=tpm`) that says this Machine proves itself with its TPM before
/// it gets credentials (`unbounded_api::identity`).
pub const CMDLINE_ATTEST: &str = "unbounded.attest";

/// Why no identity could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A required key is missing.
    #[error(
        "the kernel command line has no {0}= (was this machine booted by an Unbounded bootserver?)"
    )]
    Missing(&'static str),
    /// A value is not acceptable.
    #[error("{key}: {message}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The machine's identity.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// The Machine's name.
    pub machine: String,
    /// The bootserver's base URL (`http://10.99.0.1:8080`), without a trailing slash; `None`
    /// for a machine that was not network-booted.
    pub bootserver: Option<String>,
    /// The one-time nonce of this boot's iPXE script, when there is one.
    pub nonce: Option<String>,
    /// Where credentials are asked for over TLS, and the certificate pinned there.
    pub secure: Option<SecureChannel>,
    /// This boot has a ticket to redeem over [`Identity::secure`] (in place of a nonce).
    pub ticket: bool,
    /// The Machine is in TPM identity mode: its first credentials need an attestation.
    pub attest: Option<Attestor>,
}

/// Which TPM attests this machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attestor {
    /// A TCTI for tpm2-tools (a test's swtpm); `None` is the machine's own TPM.
    pub tcti: Option<String>,
}

/// The bootserver's TLS endpoint for credentials: its URL and the SHA-256 of the only
/// certificate accepted there (no CA is involved: the digest came with the boot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecureChannel {
    /// `https://…`, without a trailing slash.
    pub url: String,
    /// The certificate's SHA-256, 32 bytes.
    pub sha256: [u8; 32],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The nonce is a credential until it is used.
        f.debug_struct("Identity")
            .field("machine", &self.machine)
            .field("bootserver", &self.bootserver)
            .field("nonce", &self.nonce.as_ref().map(|_| "<redacted>"))
            .field("secure", &self.secure)
            .field("ticket", &self.ticket)
            .field("attest", &self.attest)
            .finish()
    }
}

/// The value of `key=` on a kernel command line (the last one wins, as for the kernel).
pub fn cmdline_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_whitespace()
        .filter_map(|word| word.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .next_back()
}

/// Whether a Machine name is a valid object name (a DNS subdomain).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Validates the three parts into an identity (the bootserver is optional here; whether a
/// machine can do without one is decided when its credentials are looked for).
pub fn identity(
    machine: Option<&str>,
    bootserver: Option<&str>,
    nonce: Option<&str>,
) -> Result<Identity, IdentityError> {
    let machine = machine.ok_or(IdentityError::Missing(CMDLINE_MACHINE))?;
    if !valid_name(machine) {
        return Err(IdentityError::Invalid {
            key: CMDLINE_MACHINE,
            message: format!("{:?} is not a valid Machine name", truncate(machine)),
        });
    }
    let bootserver = bootserver.map(|b| b.trim_end_matches('/'));
    if let Some(bootserver) = bootserver
        && (!(bootserver.starts_with("http://") || bootserver.starts_with("https://"))
            || bootserver.len() > 2048)
    {
        return Err(IdentityError::Invalid {
            key: CMDLINE_BOOTSERVER,
            message: format!("{:?} is not an http(s) URL", truncate(bootserver)),
        });
    }
    let nonce = match nonce {
        Some(n) if n.len() >= 16 && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(n.to_owned())
        }
        Some(_) => {
            return Err(IdentityError::Invalid {
                key: CMDLINE_NONCE,
                message: "not a hex nonce of 16 to 128 digits".into(),
            });
        }
        None => None,
    };
    Ok(Identity {
        machine: machine.to_owned(),
        bootserver: bootserver.map(str::to_owned),
        nonce,
        secure: None,
        ticket: false,
        attest: None,
    })
}

/// Validates the TLS endpoint for credentials: an `https://` URL and a 64-digit hex
/// SHA-256, both or neither (a URL without its pin would have to trust whoever answers).
pub fn secure_channel(
    url: Option<&str>,
    sha256: Option<&str>,
) -> Result<Option<SecureChannel>, IdentityError> {
    let (url, sha256) = match (url, sha256) {
        (None, None) => return Ok(None),
        (Some(url), Some(sha256)) => (url.trim_end_matches('/'), sha256),
        (Some(_), None) => return Err(IdentityError::Missing(CMDLINE_TLS_SHA256)),
        (None, Some(_)) => return Err(IdentityError::Missing(CMDLINE_CREDENTIALS)),
    };
    if !url.starts_with("https://") || url.len() > 2048 {
        return Err(IdentityError::Invalid {
            key: CMDLINE_CREDENTIALS,
            message: format!("{:?} is not an https URL", truncate(url)),
        });
    }
    let digest = (sha256.len() == 64)
        .then(|| {
            (0..32)
                .map(|i| u8::from_str_radix(sha256.get(2 * i..2 * i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()
        })
        .flatten()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| IdentityError::Invalid {
            key: CMDLINE_TLS_SHA256,
            message: "not a SHA-256 of 64 hex digits".into(),
        })?;
    Ok(Some(SecureChannel {
        url: url.to_owned(),
        sha256: digest,
    }))
}

/// Reads the identity from a kernel command line.
pub fn from_cmdline(cmdline: &str) -> Result<Identity, IdentityError> {
    let identity = identity(
        cmdline_value(cmdline, CMDLINE_MACHINE),
        cmdline_value(cmdline, CMDLINE_BOOTSERVER),
        cmdline_value(cmdline, CMDLINE_NONCE),
    )?;
    with_secure_channel(identity, cmdline)
}

/// `identity` with the TLS endpoint, its pin and the ticket flag the kernel command line
/// carries (a boot from a bootserver with `http.tls`).
pub fn with_secure_channel(
    mut identity: Identity,
    cmdline: &str,
) -> Result<Identity, IdentityError> {
    identity.secure = secure_channel(
        cmdline_value(cmdline, CMDLINE_CREDENTIALS),
        cmdline_value(cmdline, CMDLINE_TLS_SHA256),
    )?;
    identity.ticket = cmdline_value(cmdline, CMDLINE_TICKET) == Some("1");
    identity.attest = match cmdline_value(cmdline, CMDLINE_ATTEST) {
        None => None,
        Some("tpm") => Some(Attestor::default()),
        Some(other) => {
            return Err(IdentityError::Invalid {
                key: CMDLINE_ATTEST,
                message: format!("{:?} is not an attestation mode (tpm)", truncate(other)),
            });
        }
    };
    if identity.ticket && identity.secure.is_none() {
        return Err(IdentityError::Missing(CMDLINE_CREDENTIALS));
    }
    Ok(identity)
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_ipxe_script_wrote() {
        let cmdline = "initrd=initrd unbounded.machine=node-1 unbounded.bootserver=http://10.99.0.1:8080/ \
                       unbounded.nonce=00112233445566778899aabbccddeeff console=ttyS0";
        let id = from_cmdline(cmdline).unwrap();
        assert_eq!(id.machine, "node-1");
        assert_eq!(id.bootserver.as_deref(), Some("http://10.99.0.1:8080"));
        assert_eq!(
            id.nonce.as_deref(),
            Some("00112233445566778899aabbccddeeff")
        );
        assert!(
            !format!("{id:?}").contains("0011"),
            "the nonce is not logged"
        );
    }

    #[test]
    fn refuses_what_is_missing_or_malformed() {
        assert_eq!(
            from_cmdline("unbounded.bootserver=http://b"),
            Err(IdentityError::Missing(CMDLINE_MACHINE))
        );
        // Without a bootserver (an Azure VM): valid here; the credentials decide later.
        assert_eq!(
            from_cmdline("unbounded.machine=n").unwrap().bootserver,
            None
        );
        for bad in [
            "unbounded.machine=Node_1 unbounded.bootserver=http://b",
            "unbounded.machine=n unbounded.bootserver=ftp://b",
            "unbounded.machine=n unbounded.bootserver=http://b unbounded.nonce=xyz",
            "unbounded.machine=-n unbounded.bootserver=http://b",
        ] {
            assert!(
                matches!(from_cmdline(bad), Err(IdentityError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_last_value_wins_and_no_nonce_is_fine() {
        let id =
            from_cmdline("unbounded.machine=a unbounded.machine=b unbounded.bootserver=https://x")
                .unwrap();
        assert_eq!(id.machine, "b");
        assert_eq!(id.nonce, None);
    }

    #[test]
    fn a_tls_boot_names_its_endpoint_and_pin_together() {
        let pin = "ab".repeat(32);
        let cmdline = format!(
            "unbounded.machine=n unbounded.bootserver=http://10.99.0.1:8080 unbounded.credentials=https://10.99.0.1:8443/ unbounded.tls-sha256={pin} unbounded.ticket=1"
        );
        let id = from_cmdline(&cmdline).unwrap();
        assert!(id.ticket);
        assert_eq!(
            id.secure,
            Some(SecureChannel {
                url: "https://10.99.0.1:8443".into(),
                sha256: [0xab; 32]
            })
        );
        assert!(id.nonce.is_none());
        for bad in [
            "unbounded.machine=n unbounded.credentials=https://b".to_owned(),
            format!("unbounded.machine=n unbounded.tls-sha256={pin}"),
            format!(
                "unbounded.machine=n unbounded.credentials=http://b unbounded.tls-sha256={pin}"
            ),
            "unbounded.machine=n unbounded.credentials=https://b unbounded.tls-sha256=abcd"
                .to_owned(),
            "unbounded.machine=n unbounded.ticket=1".to_owned(),
        ] {
            assert!(from_cmdline(&bad).is_err(), "{bad}");
        }
    }
}
