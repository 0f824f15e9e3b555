//! The appliance's seed: its first credentials (minted as an operator would) and static
//! network, appended to the host OS's initramfs as a second cpio archive.

use std::io::Write as _;

use super::{ADDRESS, INTERFACE, MAC, NAME, step};
use crate::cluster::LocalControlPlane;
use crate::failure::Failure;
use crate::lab::base::{LAB_ADDRESS, LabError};

/// How long the first credentials live (the agent renews its token itself well before).
const CREDENTIAL_SECONDS: u64 = 3600;
/// The script an operator runs to mint a `manual` Machine's credentials file.
const CREDENTIALS_SCRIPT: &str = include_str!("../../../scripts/machine-credentials");

/// One entry of the seed archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedEntry {
    /// Path relative to `/`.
    pub path: String,
    /// Mode bits with the file type (`0o040_700` for a directory, `0o100_600` for a file).
    pub mode: u32,
    /// Content (empty for a directory).
    pub content: Vec<u8>,
}

/// What the appliance's host OS gets beside its image: its credentials file (only root may
/// read it; the agent takes it over and deletes it) and its static network: the NIC renamed
/// `prov0` by its MAC, 10.99.0.2/24 with the bridge as gateway, an IPv6 link-local address
/// (the bootserver's router advertisements are sent from one) and no IPv6 autoconfiguration.
/// `/etc/systemd/network` exists in the host OS image; `/etc/unbounded` may not.
pub fn seed_entries(credentials_json: &str) -> Vec<SeedEntry> {
    let file = |path: &str, mode: u32, content: String| SeedEntry {
        path: path.into(),
        mode: 0o100_000 | mode,
        content: content.into_bytes(),
    };
    vec![
        SeedEntry {
            path: "etc/unbounded".into(),
            mode: 0o040_700,
            content: Vec::new(),
        },
        file(
            "etc/unbounded/credentials.json",
            0o600,
            credentials_json.to_owned(),
        ),
        file(
            &format!("etc/systemd/network/05-{INTERFACE}.link"),
            0o644,
            format!("[Match]\nMACAddress={MAC}\n\n[Link]\nName={INTERFACE}\n"),
        ),
        file(
            &format!("etc/systemd/network/05-{INTERFACE}.network"),
            0o644,
            format!(
                "# The appliance: a static address (it runs the provisioning network's DHCP).\n\
                 [Match]\nMACAddress={MAC}\n\n[Network]\nAddress={ADDRESS}/24\nGateway={LAB_ADDRESS}\n\
                 LinkLocalAddressing=ipv6\nIPv6AcceptRA=no\n"
            ),
        ),
    ]
}

/// A `newc` cpio archive of `entries` (owned by root, mtime 0), as the kernel unpacks
/// appended initramfs archives.
pub fn newc_archive(entries: &[SeedEntry]) -> Vec<u8> {
    fn pad(out: &mut Vec<u8>) {
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }
    let mut out = Vec::new();
    let trailer = SeedEntry {
        path: "TRAILER!!!".into(),
        mode: 0,
        content: Vec::new(),
    };
    for (ino, entry) in entries.iter().chain(std::iter::once(&trailer)).enumerate() {
        let name_size = entry.path.len() + 1;
        let nlink = if entry.mode & 0o040_000 != 0 { 2 } else { 1 };
        let fields = [
            u32::try_from(ino + 1).unwrap_or(u32::MAX),
            entry.mode,
            0,
            0,
            nlink,
            0,
            u32::try_from(entry.content.len()).unwrap_or(u32::MAX),
            0,
            0,
            0,
            0,
            u32::try_from(name_size).unwrap_or(u32::MAX),
            0,
        ];
        out.extend_from_slice(b"070701");
        for field in fields {
            out.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        out.extend_from_slice(entry.path.as_bytes());
        out.push(0);
        pad(&mut out);
        out.extend_from_slice(&entry.content);
        pad(&mut out);
    }
    out
}

/// The host OS's initramfs with the seed archive appended. The kernel looks for a further
/// archive only at a 4-byte-aligned offset and skips zero bytes before it (an unaligned
/// `070701` is taken for an unknown compression: "invalid magic at start of compressed
/// archive", and the seed is lost), so the host's archive is zero-padded to a multiple of 4.
pub fn seeded_initrd(host: &[u8], seed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(host.len() + 3 + seed.len());
    out.extend_from_slice(host);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
    out.extend_from_slice(seed);
    out
}

/// Mints the appliance's first credentials file as an operator would (admin rights):
/// `scripts/machine-credentials` with the admin kubeconfig. The answer holds a token: it is
/// returned, never logged.
pub(super) fn mint_credentials(
    plane: &LocalControlPlane,
    server: &str,
) -> Result<String, LabError> {
    let mut child = std::process::Command::new("bash")
        .args(["-s", "--", NAME, server, &CREDENTIAL_SECONDS.to_string()])
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env("KUBECTL", &plane.binaries().kubectl)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Failure::new("scripts/machine-credentials", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(CREDENTIALS_SCRIPT.as_bytes())
            .map_err(|e| Failure::new("scripts/machine-credentials", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Failure::new("scripts/machine-credentials", e))?;
    if !out.status.success() {
        // Its stderr says what failed; the token only ever goes to stdout.
        return Err(step(format!(
            "scripts/machine-credentials {NAME} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8(out.stdout).map_err(|_| step("scripts/machine-credentials: not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The seed starts at a 4-byte boundary after any host archive, with only zeros between.
    #[test]
    fn the_seed_follows_the_host_archive_aligned() {
        let seed = newc_archive(&seed_entries("{}"));
        for host_len in 0..9 {
            let host = vec![0x28u8; host_len];
            let initrd = seeded_initrd(&host, &seed);
            let at = initrd.len() - seed.len();
            assert_eq!(at % 4, 0, "host of {host_len} bytes");
            assert!(at >= host_len && at < host_len + 4);
            assert_eq!(&initrd[..host_len], &host[..]);
            assert!(initrd[host_len..at].iter().all(|b| *b == 0));
            assert_eq!(&initrd[at..at + 6], b"070701");
        }
    }

    /// The seed archive as the `cpio` tool reads it: names, modes, contents.
    #[test]
    fn the_seed_archive_unpacks_with_cpio() {
        let entries = seed_entries("{\"token\":\"t\"}");
        let archive = newc_archive(&entries);
        assert_eq!(archive.len() % 4, 0);
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("cpio")
            .args(["-i", "-d", "--quiet", "--no-absolute-filenames"])
            .current_dir(dir.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("cpio (scripts/install-deps.sh installs it)");
        child.stdin.take().unwrap().write_all(&archive).unwrap();
        assert!(child.wait().unwrap().success());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &str| {
            fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("etc/unbounded") & 0o7777, 0o700);
        assert_eq!(mode("etc/unbounded/credentials.json") & 0o7777, 0o600);
        assert_eq!(
            fs::read_to_string(dir.path().join("etc/unbounded/credentials.json")).unwrap(),
            "{\"token\":\"t\"}"
        );
        let network =
            fs::read_to_string(dir.path().join("etc/systemd/network/05-prov0.network")).unwrap();
        assert!(network.contains("Address=10.99.0.2/24"), "{network}");
        assert!(network.contains(&format!("MACAddress={MAC}")), "{network}");
        let link =
            fs::read_to_string(dir.path().join("etc/systemd/network/05-prov0.link")).unwrap();
        assert!(link.contains("Name=prov0"), "{link}");
    }
}
