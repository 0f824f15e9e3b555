//! `ha:` in the configuration file, validated into [`HaSettings`]:
//!
//! ```yaml
//! ha:
//!   name: bootserver-a                   # this server (a DNS label)
//!   partner:
//!     name: bootserver-b
//!     address: 10.99.0.3:8647            # where the partner takes replication and heartbeats
//!   interruptedAfterSeconds: 10          # no answer for this long: communication interrupted
//!   keyFile: /etc/unbounded/ha/key       # the pair's shared key (both servers hold it)
//!   # listen: 10.99.0.2:8647             # where this server takes its partner's link
//!                                        # (default: serverAddress, port 8647)
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::parts::Half;
use crate::setting::InvalidSetting;

/// `ha:` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HaFile {
    name: String,
    partner: PartnerFile,
    interrupted_after_seconds: Option<u64>,
    key_file: std::path::PathBuf,
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PartnerFile {
    name: String,
    address: String,
}

/// The pair this server belongs to, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    /// This server's name.
    pub name: String,
    /// The partner's name.
    pub partner: String,
    /// Where the partner listens for replication and heartbeats.
    pub partner_address: SocketAddr,
    /// Which half of every pool is this server's.
    pub half: Half,
    /// How long without an answer before the partner counts as out of reach.
    pub interrupted_after: Duration,
    /// The file that holds the pair's shared key (read when the server starts).
    pub key_file: std::path::PathBuf,
    /// Where this server takes its partner's link; `None`: the server address, port
    /// [`DEFAULT_PORT`].
    pub listen: Option<SocketAddr>,
}

/// The link's port when `ha.listen` does not name one.
pub const DEFAULT_PORT: u16 = 8647;

impl HaSettings {
    /// Where this server listens for its partner's link.
    pub fn listen_on(&self, server_address: std::net::Ipv4Addr) -> SocketAddr {
        self.listen
            .unwrap_or(SocketAddr::from((server_address, DEFAULT_PORT)))
    }
}

/// A DNS label (RFC 1123): what names a server in metrics, logs and the fences' Leases.
fn is_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl TryFrom<&HaFile> for HaSettings {
    type Error = InvalidSetting;

    fn try_from(file: &HaFile) -> Result<Self, InvalidSetting> {
        for (field, name) in [
            ("ha.name", &file.name),
            ("ha.partner.name", &file.partner.name),
        ] {
            if !is_label(name) {
                return Err(InvalidSetting(format!(
                    "{field} {name:?} must be a DNS label (lower-case letters, digits and '-', at most 63)"
                )));
            }
        }
        if file.name == file.partner.name {
            return Err(InvalidSetting(format!(
                "ha.name and ha.partner.name are both {:?}: each server of a pair needs its own name (it decides which half of every pool is whose)",
                file.name
            )));
        }
        let partner_address: SocketAddr = file.partner.address.parse().map_err(|_| {
            InvalidSetting(format!(
                "ha.partner.address {:?} must be an address and port such as 10.99.0.3:8647",
                file.partner.address
            ))
        })?;
        let interrupted_after = file.interrupted_after_seconds.unwrap_or(10);
        if !(1..=300).contains(&interrupted_after) {
            return Err(InvalidSetting(format!(
                "ha.interruptedAfterSeconds must be between 1 and 300, not {interrupted_after}"
            )));
        }
        let listen = file
            .listen
            .as_deref()
            .map(|listen| {
                listen.parse().map_err(|_| {
                    InvalidSetting(format!(
                        "ha.listen {listen:?} must be an address and port such as 10.99.0.2:8647"
                    ))
                })
            })
            .transpose()?;
        Ok(Self {
            key_file: file.key_file.clone(),
            listen,
            half: Half::of(&file.name, &file.partner.name),
            name: file.name.clone(),
            partner: file.partner.name.clone(),
            partner_address,
            interrupted_after: Duration::from_secs(interrupted_after),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<HaSettings, String> {
        let file: HaFile = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        HaSettings::try_from(&file).map_err(|e| e.0)
    }

    #[test]
    fn a_pair_is_named_and_each_name_picks_its_half() {
        let a = parse(
            "name: bootserver-a\npartner: {name: bootserver-b, address: \"10.99.0.3:8647\"}\nkeyFile: /k\n",
        )
        .unwrap();
        assert_eq!(a.half, Half::Lower);
        assert_eq!(a.partner_address, "10.99.0.3:8647".parse().unwrap());
        assert_eq!(a.interrupted_after, Duration::from_secs(10));
        let b = parse("name: bootserver-b\npartner: {name: bootserver-a, address: \"[fd00:99::2]:8647\"}\ninterruptedAfterSeconds: 5\nkeyFile: /k\nlisten: \"[fd00:99::3]:9000\"\n")
            .unwrap();
        assert_eq!(b.half, Half::Upper);
        assert_eq!(b.interrupted_after, Duration::from_secs(5));
        assert_eq!(
            b.listen_on([10, 0, 0, 1].into()),
            "[fd00:99::3]:9000".parse().unwrap()
        );
        assert_eq!(
            a.listen_on([10, 99, 0, 2].into()),
            "10.99.0.2:8647".parse().unwrap()
        );
    }

    #[test]
    fn each_mistake_names_its_field() {
        let table = [
            (
                "name: a\npartner: {name: a, address: \"10.0.0.1:1\"}\nkeyFile: /k\n",
                "both \"a\"",
            ),
            (
                "name: A\npartner: {name: b, address: \"10.0.0.1:1\"}\nkeyFile: /k\n",
                "ha.name \"A\"",
            ),
            (
                "name: a\npartner: {name: \"-b\", address: \"10.0.0.1:1\"}\nkeyFile: /k\n",
                "ha.partner.name",
            ),
            (
                "name: a\npartner: {name: b, address: \"10.0.0.1\"}\nkeyFile: /k\n",
                "ha.partner.address",
            ),
            (
                "name: a\npartner: {name: b, address: \"10.0.0.1:1\"}\nkeyFile: /k\ninterruptedAfterSeconds: 0\n",
                "ha.interruptedAfterSeconds",
            ),
            (
                "name: a\npartner: {name: b, address: \"10.0.0.1:1\"}\nkeyFile: /k\nextra: 1\n",
                "extra",
            ),
            (
                "name: a\npartner: {name: b, address: \"10.0.0.1:1\"}\n",
                "keyFile",
            ),
            (
                "name: a\npartner: {name: b, address: \"10.0.0.1:1\"}\nkeyFile: /k\nlisten: here\n",
                "ha.listen",
            ),
        ];
        for (yaml, want) in table {
            let error = parse(yaml).expect_err(yaml);
            assert!(error.contains(want), "{yaml}: {error}");
        }
    }
}
