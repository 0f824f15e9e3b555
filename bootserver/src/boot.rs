//! Which boot file a network-booting client gets, decided from what its DHCP request says
//! about it (options 60, 77, 93 and 175), and the iPXE scripts served over HTTP.

use std::fmt::Write as _;

use unbounded_api::Architecture;

use crate::backend::{BootTarget, MacAddr, MachineRecord};

/// What a DHCP client told us about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientHints {
    /// Option 93, the first architecture type (RFC 4578).
    pub architecture: Option<u16>,
    /// Option 60, the vendor class (`PXEClient:…`, `HTTPClient:…`).
    pub vendor_class: Option<Vec<u8>>,
    /// Option 77, the user class (`iPXE` when iPXE asks).
    pub user_class: Option<Vec<u8>>,
    /// Option 175 present: iPXE's encapsulated options.
    pub ipxe_options: bool,
}

/// What kind of network boot client this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// Not a network-boot client (an OS's DHCP client).
    Plain,
    /// PXE firmware on legacy BIOS.
    BiosPxe,
    /// PXE firmware on x86-64 UEFI.
    UefiX64Pxe,
    /// PXE firmware on arm64 UEFI.
    UefiArm64Pxe,
    /// UEFI HTTP boot on x86-64.
    UefiX64Http,
    /// UEFI HTTP boot on arm64.
    UefiArm64Http,
    /// iPXE itself (already loaded): give it the script URL, so the chain never loops.
    Ipxe,
}

impl ClientKind {
    /// Whether the client booting over the network at all.
    pub fn is_network_boot(self) -> bool {
        self != Self::Plain
    }

    /// Whether option 60 must be echoed as `HTTPClient` (UEFI HTTP boot ignores offers
    /// without it).
    pub fn is_http_boot(self) -> bool {
        matches!(self, Self::UefiX64Http | Self::UefiArm64Http)
    }
}

/// Classifies a client from its DHCP hints.
pub fn classify(hints: &ClientHints) -> ClientKind {
    let user_class_ipxe = hints
        .user_class
        .as_deref()
        .is_some_and(|u| contains(u, b"iPXE"));
    if user_class_ipxe || hints.ipxe_options {
        return ClientKind::Ipxe;
    }
    let vendor = hints.vendor_class.as_deref().unwrap_or_default();
    let http = vendor.starts_with(b"HTTPClient");
    let pxe = vendor.starts_with(b"PXEClient");
    if !http && !pxe {
        return ClientKind::Plain;
    }
    // RFC 4578 / IANA processor architecture types.
    match (hints.architecture.unwrap_or(0), http) {
        (16, _) => ClientKind::UefiX64Http,
        (19, _) => ClientKind::UefiArm64Http,
        (7 | 9, false) => ClientKind::UefiX64Pxe,
        (11, false) => ClientKind::UefiArm64Pxe,
        (7 | 9, true) => ClientKind::UefiX64Http,
        (11, true) => ClientKind::UefiArm64Http,
        (_, true) => ClientKind::UefiX64Http,
        (_, false) => ClientKind::BiosPxe,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The boot file of a reply: a TFTP file name or a full HTTP URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFile {
    /// The file name (TFTP) or URL (HTTP).
    pub name: String,
    /// Whether option 60 `HTTPClient` must be echoed.
    pub echo_http_client: bool,
}

/// Names of the iPXE builds the bootserver serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFiles<'a> {
    /// x86-64 UEFI build: `ipxe.efi` or `snponly.efi`.
    pub uefi_x64: &'a str,
    /// Base URL of our HTTP server, such as `http://10.99.0.1:8080`.
    pub http_base: &'a str,
}

/// The arm64 UEFI iPXE build's file name: the full build, as Debian ships it (no arm64
/// `snponly.efi` there; the full build uses the firmware's SNP where it has no driver).
pub const UEFI_ARM64_FILE: &str = "arm64/ipxe.efi";
/// The BIOS iPXE build's file name.
pub const BIOS_FILE: &str = "undionly.kpxe";

/// The boot file for a client kind, or `None` for a client that is not network-booting.
/// iPXE gets its own machine's script URL (by the MAC that asked), so it never loads
/// another iPXE.
pub fn boot_file(kind: ClientKind, files: &BootFiles<'_>, mac: &MacAddr) -> Option<BootFile> {
    let tftp = |name: &str| BootFile {
        name: name.to_owned(),
        echo_http_client: false,
    };
    let http = |path: &str| BootFile {
        name: format!("{}/{path}", files.http_base),
        echo_http_client: true,
    };
    match kind {
        ClientKind::Plain => None,
        ClientKind::BiosPxe => Some(tftp(BIOS_FILE)),
        ClientKind::UefiX64Pxe => Some(tftp(files.uefi_x64)),
        ClientKind::UefiArm64Pxe => Some(tftp(UEFI_ARM64_FILE)),
        ClientKind::UefiX64Http => Some(http(&format!("ipxe/{}", files.uefi_x64))),
        ClientKind::UefiArm64Http => Some(http(&format!("ipxe/{UEFI_ARM64_FILE}"))),
        ClientKind::Ipxe => Some(BootFile {
            name: format!("{}/boot.ipxe?mac={mac}", files.http_base),
            echo_http_client: false,
        }),
    }
}

/// Whether a machine's declared architecture agrees with the client's.
pub fn architecture_matches(machine: Architecture, kind: ClientKind) -> bool {
    match kind {
        ClientKind::UefiArm64Pxe | ClientKind::UefiArm64Http => machine == Architecture::Arm64,
        ClientKind::BiosPxe | ClientKind::UefiX64Pxe | ClientKind::UefiX64Http => {
            machine == Architecture::X86_64
        }
        ClientKind::Plain | ClientKind::Ipxe => true,
    }
}

/// A URL as the machine fetches it: absolute URLs as they are, paths relative to our
/// `/images/` directory.
pub fn image_url(url: &str, http_base: &str) -> String {
    if url.starts_with("http://") || url.starts_with("https://") {
        url.to_owned()
    } else {
        format!("{http_base}/images/{}", url.trim_start_matches('/'))
    }
}

/// Characters iPXE would interpret in a script line (`${…}` expansion, comments, line
/// breaks) are not allowed in values we put into one.
fn safe_for_ipxe(value: &str) -> bool {
    !value
        .chars()
        .any(|c| c.is_control() || matches!(c, '$' | '#'))
}

/// What a machine's script hands its agent to obtain its first credentials with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentProof<'a> {
    /// Nothing (no issuer, or nothing to issue).
    None,
    /// A one-time nonce on the kernel command line (plain HTTP).
    Nonce(&'a str),
    /// No secret at all: where the bootserver speaks TLS, the certificate's digest to pin
    /// and a ticket that the bootserver holds for this boot's address.
    Ticket {
        /// The HTTPS base URL.
        url: &'a str,
        /// The certificate's SHA-256, hex.
        sha256: &'a str,
    },
}

/// The iPXE script for a machine: kernel, initrd and arguments with its identity and the
/// bootserver URL; a script that says why and exits when it should not boot. `proof` is how
/// this boot's agent obtains its credentials (see [`crate::credentials`]); `attest` tells it
/// to prove itself with its TPM first (`unbounded.attest=tpm`).
pub fn machine_script(
    machine: &MachineRecord,
    http_base: &str,
    proof: AgentProof<'_>,
    attest: bool,
) -> String {
    let Some(boot) = &machine.boot else {
        return refusal(&format!(
            "machine {} has no boot target yet (no configuration resolved); retrying later",
            machine.name
        ));
    };
    render(machine, boot, http_base, proof, attest)
}

fn render(
    machine: &MachineRecord,
    boot: &BootTarget,
    http_base: &str,
    proof: AgentProof<'_>,
    attest: bool,
) -> String {
    let kernel = image_url(&boot.kernel_url, http_base);
    let initrd = image_url(&boot.initrd_url, http_base);
    let mut args = vec![
        "initrd=initrd".to_owned(),
        format!("unbounded.machine={}", machine.name),
        format!("unbounded.bootserver={http_base}"),
    ];
    if let Some((name, version)) = &boot.configuration {
        args.push(format!("unbounded.configuration={name}"));
        args.push(format!("unbounded.version={version}"));
    }
    args.extend(boot.kernel_args.iter().cloned());
    // Last, so that no configured argument can shadow them (the kernel's last value wins).
    if attest {
        args.push("unbounded.attest=tpm".to_owned());
    }
    match proof {
        AgentProof::None => {}
        AgentProof::Nonce(nonce) => args.push(format!("unbounded.nonce={nonce}")),
        AgentProof::Ticket { url, sha256 } => args.extend([
            format!("unbounded.credentials={url}"),
            format!("unbounded.tls-sha256={sha256}"),
            "unbounded.ticket=1".to_owned(),
        ]),
    }
    let all = [kernel.as_str(), initrd.as_str()]
        .into_iter()
        .chain(args.iter().map(String::as_str));
    if let Some(bad) = all.into_iter().find(|v| !safe_for_ipxe(v)) {
        return refusal(&format!(
            "machine {}: refusing a boot value with a control character, '$' or '#': {}",
            machine.name,
            bad.escape_default()
        ));
    }
    let mut script = String::from("#!ipxe\n");
    let _ = writeln!(script, "echo Unbounded: booting {}", machine.name);
    let _ = writeln!(script, "kernel {kernel} {} || goto retry", args.join(" "));
    let _ = writeln!(script, "initrd --name initrd {initrd} || goto retry");
    script.push_str("boot || goto retry\n");
    script.push_str(&retry_section(http_base));
    script
}

/// Where a machine script goes when a download or the boot fails (a bootserver restarting
/// mid-transfer, a network blip): it frees what it loaded and asks for a fresh script after
/// a pause — again and again while the bootserver does not answer — instead of falling
/// through to the next boot device and stopping there.
fn retry_section(http_base: &str) -> String {
    format!(
        ":retry\necho Unbounded: fetching or booting failed; asking the bootserver again in 10 s\nimgfree\nsleep 10\nchain --autofree {http_base}/boot.ipxe?mac=${{net0/mac}} || goto retry\n"
    )
}

/// A script that prints why and gives the machine back to its firmware (which moves on to
/// the next boot device) instead of looping.
pub fn refusal(reason: &str) -> String {
    let reason: String = reason
        .chars()
        .map(|c| {
            if c.is_control() || matches!(c, '$' | '#') {
                ' '
            } else {
                c
            }
        })
        .collect();
    format!("#!ipxe\necho Unbounded: {reason}\nsleep 5\nexit 1\n")
}

/// A script that asks for `url` again after a pause: the answer cannot be given right now
/// (the bootserver could not record what the script would carry), and the machine should
/// neither boot without it nor give up.
pub fn retry_later(url: &str) -> String {
    format!(
        "#!ipxe\necho Unbounded: the bootserver cannot answer yet; asking again in 10 s\nsleep 10\nchain --autofree {url}\n"
    )
}

/// The script every iPXE client fetches first: it asks again with its MAC address, so that
/// one URL in DHCP serves every machine.
pub fn chain_script(http_base: &str) -> String {
    format!("#!ipxe\nchain {http_base}/boot.ipxe?mac=${{net0/mac}}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::Firmware;

    fn hints(arch: Option<u16>, vendor: &str, user: &str, o175: bool) -> ClientHints {
        ClientHints {
            architecture: arch,
            vendor_class: (!vendor.is_empty()).then(|| vendor.as_bytes().to_vec()),
            user_class: (!user.is_empty()).then(|| user.as_bytes().to_vec()),
            ipxe_options: o175,
        }
    }

    /// Every iPXE build DHCP can name, for either `uefiBootFile`, is one the container image
    /// carries in its TFTP root: `images/containers/contents.lock` pins each as
    /// `ipxe/<its path under the root>`.
    #[test]
    fn every_build_dhcp_names_is_in_the_image() {
        let lock = include_str!("../../images/containers/contents.lock");
        let in_image: Vec<&str> = lock
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some("file"))
                    .then(|| words.next())
                    .flatten()
                    .and_then(|name| name.strip_prefix("ipxe/"))
            })
            .collect();
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
        for uefi_x64 in ["snponly.efi", "ipxe.efi"] {
            let files = BootFiles {
                uefi_x64,
                http_base: "http://10.99.0.1:8080",
            };
            for kind in [
                ClientKind::BiosPxe,
                ClientKind::UefiX64Pxe,
                ClientKind::UefiArm64Pxe,
                ClientKind::UefiX64Http,
                ClientKind::UefiArm64Http,
            ] {
                let name = boot_file(kind, &files, &mac).unwrap().name;
                let path = name
                    .strip_prefix("http://10.99.0.1:8080/ipxe/")
                    .unwrap_or(&name);
                assert!(
                    in_image.contains(&path),
                    "{kind:?} with {uefi_x64}: {path} is not in {in_image:?}"
                );
            }
        }
    }

    #[test]
    fn classification_and_boot_file_table() {
        let files = BootFiles {
            uefi_x64: "snponly.efi",
            http_base: "http://10.99.0.1:8080",
        };
        let cases = [
            (
                "BIOS PXE",
                hints(Some(0), "PXEClient:Arch:00000:UNDI:002001", "", false),
                ClientKind::BiosPxe,
                Some(("undionly.kpxe", false)),
            ),
            (
                "no option 93 is BIOS",
                hints(None, "PXEClient", "", false),
                ClientKind::BiosPxe,
                Some(("undionly.kpxe", false)),
            ),
            (
                "x86-64 UEFI (7)",
                hints(Some(7), "PXEClient:Arch:00007:UNDI:003016", "", false),
                ClientKind::UefiX64Pxe,
                Some(("snponly.efi", false)),
            ),
            (
                "x86-64 UEFI (9)",
                hints(Some(9), "PXEClient:Arch:00009", "", false),
                ClientKind::UefiX64Pxe,
                Some(("snponly.efi", false)),
            ),
            (
                "arm64 UEFI",
                hints(Some(11), "PXEClient:Arch:00011", "", false),
                ClientKind::UefiArm64Pxe,
                Some(("arm64/ipxe.efi", false)),
            ),
            (
                "x86-64 HTTP boot",
                hints(Some(16), "HTTPClient:Arch:00016:UNDI:003000", "", false),
                ClientKind::UefiX64Http,
                Some(("http://10.99.0.1:8080/ipxe/snponly.efi", true)),
            ),
            (
                "arm64 HTTP boot",
                hints(Some(19), "HTTPClient:Arch:00019", "", false),
                ClientKind::UefiArm64Http,
                Some(("http://10.99.0.1:8080/ipxe/arm64/ipxe.efi", true)),
            ),
            (
                "iPXE by user class",
                hints(Some(0), "PXEClient:Arch:00000", "iPXE", false),
                ClientKind::Ipxe,
                Some((
                    "http://10.99.0.1:8080/boot.ipxe?mac=52:54:00:00:00:01",
                    false,
                )),
            ),
            (
                "iPXE by option 175",
                hints(Some(7), "PXEClient:Arch:00007", "", true),
                ClientKind::Ipxe,
                Some((
                    "http://10.99.0.1:8080/boot.ipxe?mac=52:54:00:00:00:01",
                    false,
                )),
            ),
            (
                "an OS DHCP client",
                hints(None, "udhcp 1.35.0", "", false),
                ClientKind::Plain,
                None,
            ),
            (
                "no vendor class",
                hints(None, "", "", false),
                ClientKind::Plain,
                None,
            ),
        ];
        for (case, h, kind, file) in cases {
            assert_eq!(classify(&h), kind, "{case}");
            let got = boot_file(kind, &files, &MacAddr([0x52, 0x54, 0, 0, 0, 1]));
            let got = got.as_ref().map(|f| (f.name.as_str(), f.echo_http_client));
            assert_eq!(got, file, "{case}");
        }
    }

    fn machine(boot: Option<BootTarget>) -> MachineRecord {
        MachineRecord {
            name: "node-1".into(),
            macs: vec![MacAddr([0x52, 0x54, 0, 0, 0, 1])],
            ipv4: None,
            ipv6: None,
            hostname: None,
            architecture: Architecture::X86_64,
            firmware: Firmware::Bios,
            boot,
            discovery_waiting: false,
            identity: Default::default(),
        }
    }

    #[test]
    fn script_for_a_machine_with_a_boot_target() {
        let m = machine(Some(BootTarget {
            kernel_url: "vmlinuz".into(),
            initrd_url: "https://mirror.example/initrd.img".into(),
            kernel_args: vec!["console=ttyS0".into()],
            configuration: Some(("general".into(), 3)),
        }));
        let script = machine_script(&m, "http://10.99.0.1:8080", AgentProof::None, false);
        assert_eq!(
            script,
            "#!ipxe\necho Unbounded: booting node-1\n\
             kernel http://10.99.0.1:8080/images/vmlinuz initrd=initrd unbounded.machine=node-1 unbounded.bootserver=http://10.99.0.1:8080 unbounded.configuration=general unbounded.version=3 console=ttyS0 || goto retry\n\
             initrd --name initrd https://mirror.example/initrd.img || goto retry\n\
             boot || goto retry\n\
             :retry\n\
             echo Unbounded: fetching or booting failed; asking the bootserver again in 10 s\n\
             imgfree\nsleep 10\n\
             chain --autofree http://10.99.0.1:8080/boot.ipxe?mac=${net0/mac} || goto retry\n"
        );
    }

    #[test]
    fn machines_that_should_not_boot_get_a_script_that_exits() {
        let script = machine_script(&machine(None), "http://b", AgentProof::None, false);
        assert!(script.starts_with("#!ipxe\necho Unbounded: machine node-1 has no boot target"));
        assert!(script.ends_with("exit 1\n"));
        let hostile = machine(Some(BootTarget {
            kernel_url: "vmlinuz".into(),
            initrd_url: "initrd".into(),
            kernel_args: vec!["x=${net0/ip}\nshell".into()],
            configuration: None,
        }));
        let script = machine_script(&hostile, "http://b", AgentProof::None, false);
        assert!(script.contains("refusing a boot value"), "{script}");
        assert!(!script.contains("\nshell"), "no injected line: {script}");
        assert!(script.ends_with("exit 1\n"));
    }

    #[test]
    fn architecture_must_agree() {
        assert!(architecture_matches(
            Architecture::X86_64,
            ClientKind::BiosPxe
        ));
        assert!(!architecture_matches(
            Architecture::X86_64,
            ClientKind::UefiArm64Pxe
        ));
        assert!(architecture_matches(
            Architecture::Arm64,
            ClientKind::UefiArm64Http
        ));
    }
}
