//! The start-up check: before the bootserver answers anything, its validated settings are
//! compared with what the host shows. A wrong interface, an address that is not on it, a
//! TFTP root without the iPXE builds that firmware will ask for, or installed boot images
//! that no longer match their manifest would each make it serve half a configuration:
//! machines that get an offer and then a missing file, or a node image whose digest no
//! MachineConfiguration can match. Instead it serves nothing (no DHCP, TFTP or HTTP
//! boot routes, no PXE provider), logs each problem at error level, answers `/readyz`
//! with 503 and the problems in the body, and checks again every
//! [`RECHECK_INTERVAL`] (an interface that comes up late, images that are still being
//! installed): once the check passes it starts.
//!
//! [`check`] decides from plain data ([`HostFacts`]); [`HostFacts::gather`] reads the host
//! (rtnetlink for interfaces, the file system for the rest).
//!
//! Which iPXE builds are required ([`boot_files`]): with the file backend and unknown
//! machines ignored, exactly those the listed machines' firmware asks for; otherwise (the
//! Kubernetes backend, discovery) the BIOS and the x86-64 UEFI builds, while a missing
//! arm64 build is a warning only: the container image carries all three, but a TFTP root of
//! the operator's own (bookworm's `ipxe` package has no arm64 build) may serve a site without
//! arm64 machines, whose x86 machines boot either way.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use unbounded_api::{Architecture, Firmware};

use crate::boot::{BIOS_FILE, UEFI_ARM64_FILE};
use crate::boot_images::{self, DigestCache, FileFault, InstalledVersion};
use crate::config::{BackendKind, Settings};
use crate::dhcp::settings::UnknownMachines;
use crate::interfaces::{self, Interfaces, Ipv4Net};

/// How often a failed check runs again.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// What a path is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathState {
    /// A directory.
    Directory,
    /// A regular file of this many bytes.
    File(u64),
    /// Something else (a device, a socket; a link to nothing).
    Other,
    /// Nothing there.
    Missing,
    /// It could not be read.
    Unreadable(String),
}

impl PathState {
    /// What `path` is.
    pub fn of(path: &Path) -> Self {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Self::Directory,
            Ok(m) if m.is_file() => Self::File(m.len()),
            Ok(_) => Self::Other,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::Missing,
            Err(e) => Self::Unreadable(e.to_string()),
        }
    }
}

impl fmt::Display for PathState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Directory => f.write_str("a directory"),
            Self::File(0) => f.write_str("an empty file"),
            Self::File(n) => write!(f, "a file of {n} bytes"),
            Self::Other => f.write_str("not a regular file"),
            Self::Missing => f.write_str("missing"),
            Self::Unreadable(e) => write!(f, "unreadable: {e}"),
        }
    }
}

/// What the host shows, as far as the settings care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// Interfaces and their IPv4 addresses, or why they could not be read.
    pub interfaces: Result<Interfaces, String>,
    /// `tftp.root`.
    pub tftp_root: PathState,
    /// Each iPXE build [`boot_files`] names, by its path under the root.
    pub boot_files: BTreeMap<String, PathState>,
    /// `http.imagesDir`.
    pub images_dir: PathState,
    /// The installed boot image sets, or why the images directory could not be read.
    pub boot_images: Result<Vec<InstalledVersion>, String>,
}

/// Who asks for an iPXE build, and whether its absence stops the bootserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootFileNeed {
    /// Which firmware asks for it (for the message).
    pub asked_by: &'static str,
    /// Required (a problem when missing) or only wanted (a warning).
    pub required: bool,
}

/// The iPXE builds firmware will ask for, by path under the TFTP root.
pub fn boot_files(settings: &Settings) -> BTreeMap<String, BootFileNeed> {
    const BIOS: &str = "BIOS machines";
    const UEFI_X64: &str = "x86-64 UEFI machines";
    const UEFI_ARM64: &str = "arm64 UEFI machines";
    let mut out = BTreeMap::new();
    let machines_known = settings.backend == BackendKind::File
        && settings.dhcp.unknown_machines == UnknownMachines::Ignore;
    let mut need = |file: &str, asked_by, required| {
        let entry = out.entry(file.to_owned()).or_insert(BootFileNeed {
            asked_by,
            required: false,
        });
        entry.required |= required;
    };
    if machines_known {
        for machine in &settings.machines {
            match (machine.architecture, machine.firmware) {
                (Architecture::Arm64, _) => need(UEFI_ARM64_FILE, UEFI_ARM64, true),
                (Architecture::X86_64, Firmware::Bios) => need(BIOS_FILE, BIOS, true),
                (Architecture::X86_64, Firmware::Uefi) => {
                    need(&settings.dhcp.uefi_boot_file, UEFI_X64, true);
                }
            }
        }
    } else {
        need(BIOS_FILE, BIOS, true);
        need(&settings.dhcp.uefi_boot_file, UEFI_X64, true);
        need(UEFI_ARM64_FILE, UEFI_ARM64, false);
    }
    out
}

/// A reason the bootserver does not start serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// `interface` is not an interface of this host.
    InterfaceMissing {
        /// The configured interface.
        interface: String,
        /// The host's interfaces.
        present: Vec<String>,
    },
    /// `serverAddress` is not on `interface`.
    AddressNotOnInterface {
        /// The configured address.
        address: Ipv4Addr,
        /// The configured interface.
        interface: String,
        /// Its IPv4 addresses.
        has: Vec<Ipv4Net>,
    },
    /// `serverAddress` is on no interface (no `interface` configured).
    AddressNotOnHost {
        /// The configured address.
        address: Ipv4Addr,
    },
    /// `tftp.root` is not a directory.
    TftpRoot {
        /// The root.
        root: PathBuf,
        /// What it is.
        state: PathState,
    },
    /// A required iPXE build is missing or empty.
    BootFile {
        /// The root.
        root: PathBuf,
        /// The build's path under it.
        file: String,
        /// What it is.
        state: PathState,
        /// Who asks for it.
        asked_by: &'static str,
    },
    /// `http.imagesDir` is not a directory.
    ImagesDir {
        /// The directory.
        dir: PathBuf,
        /// What it is.
        state: PathState,
    },
    /// An installed boot image set whose manifest is unreadable or names another version.
    BootImagesManifest {
        /// The set's directory name.
        version: String,
        /// What is wrong.
        message: String,
    },
    /// A file of an installed set differs from its manifest.
    BootImage {
        /// The set's version.
        version: String,
        /// How.
        fault: FileFault,
    },
}

impl Problem {
    /// A fixed label for the kind of problem (metrics, JSON logs).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InterfaceMissing { .. } => "interface_missing",
            Self::AddressNotOnInterface { .. } => "address_not_on_interface",
            Self::AddressNotOnHost { .. } => "address_not_on_host",
            Self::TftpRoot { .. } => "tftp_root",
            Self::BootFile { .. } => "boot_file_missing",
            Self::ImagesDir { .. } => "images_dir",
            Self::BootImagesManifest { .. } => "boot_images_manifest",
            Self::BootImage { .. } => "boot_image_mismatch",
        }
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InterfaceMissing { interface, present } => write!(
                f,
                "interface {interface} does not exist on this host (its interfaces: {}): set `interface` to the provisioning network's interface",
                list(present)
            ),
            Self::AddressNotOnInterface {
                address,
                interface,
                has,
            } => write!(
                f,
                "serverAddress {address} is not an address of interface {interface} (its IPv4 addresses: {}): set `serverAddress` to this host's address on the provisioning network",
                list(has)
            ),
            Self::AddressNotOnHost { address } => write!(
                f,
                "serverAddress {address} is not an address of this host: set `serverAddress` to this host's address on the provisioning network"
            ),
            Self::TftpRoot { root, state } => write!(
                f,
                "tftp.root {} is {state}, not a directory: no iPXE build can be served",
                root.display()
            ),
            Self::BootFile {
                root,
                file,
                state,
                asked_by,
            } => write!(
                f,
                "tftp.root {} has no usable {file} ({state}), which {asked_by} ask for",
                root.display()
            ),
            Self::ImagesDir { dir, state } => write!(
                f,
                "http.imagesDir {} is {state}, not a directory: no kernel, initrd or node image can be served",
                dir.display()
            ),
            Self::BootImagesManifest { version, message } => {
                write!(f, "boot images {version}: {message}")
            }
            Self::BootImage { version, fault } => write!(
                f,
                "boot images {version}: {fault}; a MachineConfiguration that names this version would boot other images than it says"
            ),
        }
    }
}

/// Something worth saying that does not stop the bootserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// The interfaces could not be read, so neither `interface` nor `serverAddress` was
    /// checked.
    InterfacesUnreadable(String),
    /// A wanted (not required) iPXE build is missing.
    BootFile {
        /// The root.
        root: PathBuf,
        /// The build.
        file: String,
        /// What it is.
        state: PathState,
        /// Who asks for it.
        asked_by: &'static str,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InterfacesUnreadable(e) => write!(
                f,
                "the host's interfaces could not be read ({e}): interface and serverAddress are not checked"
            ),
            Self::BootFile {
                root,
                file,
                state,
                asked_by,
            } => write!(
                f,
                "tftp.root {} has no usable {file} ({state}): {asked_by} will not boot",
                root.display()
            ),
        }
    }
}

/// The check's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// What stops the bootserver from serving.
    pub problems: Vec<Problem>,
    /// What it says and serves anyway.
    pub warnings: Vec<Warning>,
}

fn usable_file(state: &PathState) -> bool {
    matches!(state, PathState::File(n) if *n > 0)
}

/// Compares the settings with the host.
pub fn check(settings: &Settings, host: &HostFacts) -> Report {
    let mut report = Report::default();
    match &host.interfaces {
        Err(e) => report
            .warnings
            .push(Warning::InterfacesUnreadable(e.clone())),
        Ok(interfaces) => match &settings.interface {
            Some(interface) => match interfaces.get(interface) {
                None => report.problems.push(Problem::InterfaceMissing {
                    interface: interface.clone(),
                    present: interfaces.keys().cloned().collect(),
                }),
                Some(has) if !has.iter().any(|n| n.address == settings.server_address) => {
                    report.problems.push(Problem::AddressNotOnInterface {
                        address: settings.server_address,
                        interface: interface.clone(),
                        has: has.clone(),
                    });
                }
                Some(_) => {}
            },
            None => {
                let on_host = interfaces
                    .values()
                    .flatten()
                    .any(|n| n.address == settings.server_address);
                if !on_host {
                    report.problems.push(Problem::AddressNotOnHost {
                        address: settings.server_address,
                    });
                }
            }
        },
    }

    if host.tftp_root == PathState::Directory {
        for (file, need) in boot_files(settings) {
            let state = host
                .boot_files
                .get(&file)
                .cloned()
                .unwrap_or(PathState::Missing);
            if usable_file(&state) {
                continue;
            }
            let root = settings.tftp.root.clone();
            if need.required {
                report.problems.push(Problem::BootFile {
                    root,
                    file,
                    state,
                    asked_by: need.asked_by,
                });
            } else {
                report.warnings.push(Warning::BootFile {
                    root,
                    file,
                    state,
                    asked_by: need.asked_by,
                });
            }
        }
    } else {
        report.problems.push(Problem::TftpRoot {
            root: settings.tftp.root.clone(),
            state: host.tftp_root.clone(),
        });
    }

    if host.images_dir != PathState::Directory {
        report.problems.push(Problem::ImagesDir {
            dir: settings.http.images_dir.clone(),
            state: host.images_dir.clone(),
        });
    }
    match &host.boot_images {
        Err(e) => report.problems.push(Problem::ImagesDir {
            dir: settings.http.images_dir.clone(),
            state: PathState::Unreadable(e.clone()),
        }),
        Ok(versions) => {
            for installed in versions {
                let version = installed.version.clone();
                match &installed.installed.manifest {
                    Err(message) => report.problems.push(Problem::BootImagesManifest {
                        version,
                        message: message.clone(),
                    }),
                    Ok(_) => report
                        .problems
                        .extend(installed.installed.faults.iter().map(|fault| {
                            Problem::BootImage {
                                version: version.clone(),
                                fault: fault.clone(),
                            }
                        })),
                }
            }
        }
    }
    report
}

impl HostFacts {
    /// Reads what [`check`] needs. Digests of installed images are computed once per
    /// version of each file (`cache`).
    pub fn gather(settings: &Settings, cache: &mut DigestCache) -> Self {
        let tftp_root = PathState::of(&settings.tftp.root);
        let boot_files = boot_files(settings)
            .into_keys()
            .map(|file| {
                let state = PathState::of(&settings.tftp.root.join(&file));
                (file, state)
            })
            .collect();
        let images_dir = PathState::of(&settings.http.images_dir);
        let boot_images = if images_dir == PathState::Directory {
            boot_images::check_installed(&settings.http.images_dir, cache)
                .map_err(|e| e.to_string())
        } else {
            Ok(Vec::new())
        };
        Self {
            interfaces: interfaces::read().map_err(|e| e.to_string()),
            tftp_root,
            boot_files,
            images_dir,
            boot_images,
        }
    }
}

/// What `/readyz` reports besides the backend's sync and the lease log: the start-up
/// check's problems, until it passes.
#[derive(Debug, Default)]
pub struct Readiness {
    problems: RwLock<Vec<String>>,
}

impl Readiness {
    /// Records the current problems (empty once the check passed).
    pub fn set(&self, problems: &[Problem]) {
        let text = problems.iter().map(ToString::to_string).collect();
        if let Ok(mut guard) = self.problems.write() {
            *guard = text;
        }
    }

    /// The problems, one sentence each.
    pub fn problems(&self) -> Vec<String> {
        self.problems.read().map(|g| g.clone()).unwrap_or_default()
    }
}

/// Runs the check and says what it found: each problem (and warning) is logged when the
/// set of them changes, so a check repeated every few seconds does not repeat its log.
#[derive(Debug, Default)]
pub struct Checker {
    cache: DigestCache,
    last: Option<Report>,
}

impl Checker {
    /// Checks once, publishes the problems to `readiness`, and returns whether it passed.
    pub async fn run_once(&mut self, settings: &Settings, readiness: &Readiness) -> bool {
        // Reading installed images hashes them: off the async workers.
        let owned = settings.clone();
        let mut cache = std::mem::take(&mut self.cache);
        let checked = tokio::task::spawn_blocking(move || {
            let facts = HostFacts::gather(&owned, &mut cache);
            (check(&owned, &facts), cache)
        })
        .await;
        let report = match checked {
            Ok((report, cache)) => {
                self.cache = cache;
                report
            }
            Err(join) => {
                tracing::error!(error = %join, "preflight: the check did not run");
                return false;
            }
        };
        if self.last.as_ref() != Some(&report) {
            for warning in &report.warnings {
                tracing::warn!("preflight: {warning}");
            }
            for problem in &report.problems {
                tracing::error!(reason = problem.reason(), "preflight: {problem}");
            }
            if report.problems.is_empty() {
                tracing::info!(
                    interface = ?settings.interface,
                    server_address = %settings.server_address,
                    tftp_root = %settings.tftp.root.display(),
                    images_dir = %settings.http.images_dir.display(),
                    "preflight passed"
                );
            } else {
                tracing::error!(
                    problems = report.problems.len(),
                    "preflight: not serving (no DHCP, TFTP, boot files or PXE provider) until this is fixed; checking again every {} s",
                    RECHECK_INTERVAL.as_secs()
                );
            }
        }
        readiness.set(&report.problems);
        let passed = report.problems.is_empty();
        self.last = Some(report);
        passed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot_images::Installed;

    fn settings(extra: &str) -> Settings {
        Settings::parse(&format!(
            "interface: pxe0\nserverAddress: 10.99.0.1\ntftp: {{root: /srv/ipxe}}\nhttp: {{imagesDir: /srv/images}}\n{extra}"
        ))
        .unwrap()
    }

    const PROXY: &str = "dhcp: {mode: proxy}\n";

    fn net(a: [u8; 4], prefix: u8) -> Ipv4Net {
        Ipv4Net {
            address: Ipv4Addr::from(a),
            prefix,
        }
    }

    /// A host where everything the settings name is in place.
    fn good_host(settings: &Settings) -> HostFacts {
        HostFacts {
            interfaces: Ok(BTreeMap::from([
                ("lo".into(), vec![net([127, 0, 0, 1], 8)]),
                ("pxe0".into(), vec![net([10, 99, 0, 1], 24)]),
            ])),
            tftp_root: PathState::Directory,
            boot_files: boot_files(settings)
                .into_keys()
                .map(|f| (f, PathState::File(70_000)))
                .collect(),
            images_dir: PathState::Directory,
            boot_images: Ok(vec![]),
        }
    }

    #[test]
    fn required_builds_follow_the_machines_that_can_ask() {
        let cases = [
            (
                "kubernetes backend: both x86 builds, arm64 wanted",
                "backend: kubernetes\ndhcp: {mode: proxy}\n",
                vec![
                    ("arm64/ipxe.efi", false),
                    ("snponly.efi", true),
                    ("undionly.kpxe", true),
                ],
            ),
            (
                "ipxe.efi chosen for x86-64 UEFI",
                "backend: kubernetes\ndhcp: {mode: proxy, uefiBootFile: ipxe.efi}\n",
                vec![
                    ("arm64/ipxe.efi", false),
                    ("ipxe.efi", true),
                    ("undionly.kpxe", true),
                ],
            ),
            (
                "file backend: only what its machines' firmware asks for",
                "dhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00:00:00:01'], firmware: bios}]\n",
                vec![("undionly.kpxe", true)],
            ),
            (
                "file backend with an arm64 machine: arm64 required",
                "dhcp: {mode: proxy}\nmachines: [{name: a, macs: ['52:54:00:00:00:01'], architecture: arm64, firmware: uefi}, {name: b, macs: ['52:54:00:00:00:02'], firmware: uefi}]\n",
                vec![("arm64/ipxe.efi", true), ("snponly.efi", true)],
            ),
            (
                "file backend with discovery: any machine may come",
                "dhcp: {mode: proxy, unknownMachines: discover}\ndiscovery: {boot: {kernel: vmlinuz, initrd: initrd.img}}\n",
                vec![
                    ("arm64/ipxe.efi", false),
                    ("snponly.efi", true),
                    ("undionly.kpxe", true),
                ],
            ),
            ("file backend, no machines: none", PROXY, vec![]),
        ];
        for (case, extra, expected) in cases {
            let got: Vec<(String, bool)> = boot_files(&settings(extra))
                .into_iter()
                .map(|(f, n)| (f, n.required))
                .collect();
            let expected: Vec<(String, bool)> = expected
                .into_iter()
                .map(|(f, r)| (f.to_owned(), r))
                .collect();
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn a_good_host_passes() {
        let s = settings("backend: kubernetes\ndhcp: {mode: proxy}\n");
        assert_eq!(check(&s, &good_host(&s)), Report::default());
    }

    #[test]
    fn each_bad_input_is_named() {
        let fault = FileFault::Digest {
            name: "node.tar.zst".into(),
            expected: "a".repeat(64),
            actual: "b".repeat(64),
        };
        let damaged = move |h: &mut HostFacts| {
            h.boot_images = Ok(vec![InstalledVersion {
                version: "v1".into(),
                installed: Installed {
                    manifest: Ok(unbounded_api::boot_images::BootImagesManifest {
                        version: "v1".into(),
                        files: vec![],
                        kubernetes_version: None,
                    }),
                    faults: vec![fault.clone()],
                },
            }]);
        };
        type Edit = Box<dyn Fn(&mut HostFacts)>;
        let cases: Vec<(&str, &str, Edit, &str, &str)> = vec![
            (
                "no such interface",
                "interface: eth9\n",
                Box::new(|_| {}),
                "interface_missing",
                "interface eth9 does not exist on this host (its interfaces: lo, pxe0)",
            ),
            (
                "address on another interface",
                "",
                Box::new(|h| {
                    h.interfaces = Ok(BTreeMap::from([
                        ("eth0".into(), vec![net([10, 99, 0, 1], 24)]),
                        ("pxe0".into(), vec![net([192, 0, 2, 1], 24)]),
                    ]))
                }),
                "address_not_on_interface",
                "serverAddress 10.99.0.1 is not an address of interface pxe0 (its IPv4 addresses: 192.0.2.1/24)",
            ),
            (
                "interface without IPv4",
                "",
                Box::new(|h| h.interfaces = Ok(BTreeMap::from([("pxe0".into(), vec![])]))),
                "address_not_on_interface",
                "(its IPv4 addresses: none)",
            ),
            (
                "TFTP root missing",
                "",
                Box::new(|h| h.tftp_root = PathState::Missing),
                "tftp_root",
                "tftp.root /srv/ipxe is missing, not a directory",
            ),
            (
                "BIOS build missing",
                "",
                Box::new(|h| {
                    h.boot_files
                        .insert("undionly.kpxe".into(), PathState::Missing);
                }),
                "boot_file_missing",
                "tftp.root /srv/ipxe has no usable undionly.kpxe (missing), which BIOS machines ask for",
            ),
            (
                "UEFI build empty",
                "",
                Box::new(|h| {
                    h.boot_files
                        .insert("snponly.efi".into(), PathState::File(0));
                }),
                "boot_file_missing",
                "no usable snponly.efi (an empty file), which x86-64 UEFI machines ask for",
            ),
            (
                "images directory missing",
                "",
                Box::new(|h| h.images_dir = PathState::Missing),
                "images_dir",
                "http.imagesDir /srv/images is missing, not a directory",
            ),
            (
                "boot image digest",
                "",
                Box::new(damaged),
                "boot_image_mismatch",
                "boot images v1: node.tar.zst has sha256 bbbb",
            ),
            (
                "unreadable manifest",
                "",
                Box::new(|h| {
                    h.boot_images = Ok(vec![InstalledVersion {
                        version: "v2".into(),
                        installed: Installed {
                            manifest: Err("manifest.json: expected value".into()),
                            faults: vec![],
                        },
                    }])
                }),
                "boot_images_manifest",
                "boot images v2: manifest.json: expected value",
            ),
        ];
        for (case, extra, edit, reason, text) in cases {
            let base = "backend: kubernetes\ndhcp: {mode: proxy}\n";
            let s = if extra.is_empty() {
                settings(base)
            } else {
                Settings::parse(&format!(
                    "{extra}serverAddress: 10.99.0.1\ntftp: {{root: /srv/ipxe}}\nhttp: {{imagesDir: /srv/images}}\n{base}"
                ))
                .unwrap()
            };
            let mut host = good_host(&s);
            edit(&mut host);
            let report = check(&s, &host);
            assert_eq!(report.problems.len(), 1, "{case}: {report:?}");
            assert_eq!(report.problems[0].reason(), reason, "{case}");
            let message = report.problems[0].to_string();
            assert!(message.contains(text), "{case}: {message}");
        }
    }

    #[test]
    fn without_an_interface_the_address_must_be_on_the_host() {
        let s = Settings::parse(
            "serverAddress: 10.99.0.9\ntftp: {root: /srv/ipxe}\nhttp: {imagesDir: /srv/images}\ndhcp: {mode: proxy}\n",
        )
        .unwrap();
        let report = check(&s, &good_host(&s));
        assert_eq!(
            report.problems,
            [Problem::AddressNotOnHost {
                address: Ipv4Addr::new(10, 99, 0, 9)
            }]
        );
        let s = Settings::parse(
            "serverAddress: 10.99.0.1\ntftp: {root: /srv/ipxe}\nhttp: {imagesDir: /srv/images}\ndhcp: {mode: proxy}\n",
        )
        .unwrap();
        assert_eq!(check(&s, &good_host(&s)), Report::default());
    }

    #[test]
    fn warnings_do_not_stop_it() {
        let s = settings("backend: kubernetes\ndhcp: {mode: proxy}\n");
        let mut host = good_host(&s);
        host.interfaces = Err("permission denied".into());
        host.boot_files
            .insert("arm64/ipxe.efi".into(), PathState::Missing);
        let report = check(&s, &host);
        assert!(report.problems.is_empty(), "{report:?}");
        let text: Vec<String> = report.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "the host's interfaces could not be read (permission denied): interface and serverAddress are not checked",
                "tftp.root /srv/ipxe has no usable arm64/ipxe.efi (missing): arm64 UEFI machines will not boot",
            ]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let s = settings("backend: kubernetes\ndhcp: {mode: proxy}\n");
        let mut host = good_host(&s);
        host.tftp_root = PathState::File(10);
        host.images_dir = PathState::Missing;
        let reasons: Vec<&str> = check(&s, &host)
            .problems
            .iter()
            .map(Problem::reason)
            .collect();
        assert_eq!(reasons, ["tftp_root", "images_dir"]);
    }
}
