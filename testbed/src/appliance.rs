//! The lab's appliance: `deploy/` running as pods on a node of the provisioning network, as
//! an operator installs it (docs/install.md), the default of `unbounded-testbed up`.
//!
//! The testbed's host cannot be a Kubernetes node (cgroup v1; kubelet 1.35 needs v2), so the
//! appliance node is a VM on the bridge, and an Unbounded node itself: a `provider: manual`
//! Machine whose host OS image is booted directly (QEMU `-kernel`/`-initrd`, no PXE: the
//! bootserver that would answer runs on it), its agent joining with a credentials file. A
//! second cpio archive appended to the host OS's initramfs hands it that file and a static
//! network configuration (its NIC renamed `prov0`, 10.99.0.2/24): nothing of its start
//! depends on the DHCP server it will run.
//!
//! The order is the one of a cluster's first appliance node (docs/install.md, "The first
//! appliance node"): the controller that resolves a Machine's configuration and grants its
//! agent access will run on that node, so its first join cannot depend on it. The lab runs
//! the controller binary outside the cluster for that first join (as an operator would from
//! a workstation, with the controller's ServiceAccount), mints the appliance's first
//! credentials with admin rights (`scripts/machine-credentials`, the script an operator
//! runs), and stops the outside controller once the controller's pods run: one of them takes
//! the Lease.
//!
//! Everything the appliance and the pods pull comes from the lab's registry
//! ([`crate::registry`]): the project's images by digest, and the appliance's own boot
//! artifacts (kernel, initramfs, node image) as blobs named by their SHA-256. The machines
//! the appliance boots use the boot image set its bootserver pod installs (the boot-images
//! init container), served by the pod. Pods reach the API server at its
//! address on the bridge (`testbed/overlay`: no kube-proxy runs here), and the host
//! reaches the bridge through a routed veth ([`crate::netns::HostRoute`]) so that the API
//! server reaches the kubelets (`kubectl logs`, `exec`).

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::LocalControlPlane;
use crate::images::Images;
use crate::lab::{LAB_ADDRESS, LAB_API_PORT, LabError};
use crate::netns::{HostRoute, Netns};
use crate::overlay::{self, PushedImage};
use crate::process::Process;
use crate::progress::{self, Stage, Timeline};
use crate::registry::{LabRegistry, RegistryAddress};

/// The appliance's Machine (and Node) name.
pub const NAME: &str = "appliance";
/// Its address on the provisioning bridge (static: it runs the DHCP server).
pub const ADDRESS: &str = "10.99.0.2";
/// Its NIC's MAC.
pub const MAC: &str = "52:54:00:99:01:01";
/// Its provisioning interface, named by a `.link` file (the bootserver's `interface`).
pub const INTERFACE: &str = "prov0";
/// The label its MachineConfiguration selects it by.
pub const APPLIANCE_LABEL: &str = "unbounded-cloud.io/appliance";
/// The Node label the bootserver's Deployment selects (`deploy/bootserver.yaml`).
pub const BOOTSERVER_LABEL: &str = "unbounded-cloud.io/bootserver";
/// The namespace of the project's pods.
pub const SYSTEM_NAMESPACE: &str = "unbounded-system";
/// The controller's Lease.
pub const CONTROLLER_LEASE: &str = "unbounded-controller";
/// The host's and the namespace's ends of the routed link, and the subnet routed.
const HOST_ROUTE: (&str, &str, &str) = ("10.99.1.1/30", "10.99.1.2/30", "10.99.0.0/24");
/// How long the first credentials live (the agent renews its token itself well before).
const CREDENTIAL_SECONDS: u64 = 3600;
/// The script an operator runs to mint a `manual` Machine's credentials file.
const CREDENTIALS_SCRIPT: &str = include_str!("../../scripts/machine-credentials");

fn step(message: impl Into<String>) -> LabError {
    LabError::Step(message.into())
}

/// An image the lab pushed, recorded for scenarios that push a new build of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushedLayout {
    /// The last component of its repository (`bootserver`).
    pub short_name: String,
    /// The OCI layout it was pushed from.
    pub layout: PathBuf,
    /// The tag of the image in that layout.
    pub layout_tag: String,
    /// Its repository in the registry (`unbounded/bootserver`).
    pub repository: String,
    /// The manifest digest pushed.
    pub digest: String,
}

/// What a lab running the pods offers scenarios (also across processes, in `state.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodsInfo {
    /// The registry, `host:port` (plain HTTP; reachable from the host).
    pub registry: String,
    /// The bootserver's HTTP base URL (reachable from the host).
    pub bootserver_url: String,
    /// The images pushed.
    pub images: Vec<PushedLayout>,
}

impl PodsInfo {
    /// The registry's address.
    pub fn registry(&self) -> RegistryAddress {
        RegistryAddress(self.registry.clone())
    }

    /// The pushed image whose repository ends in `short_name`.
    pub fn image(&self, short_name: &str) -> Option<&PushedLayout> {
        self.images.iter().find(|i| i.short_name == short_name)
    }
}

/// Where machines get their kernel, initramfs and node image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootArtifacts {
    /// `boot.kernelURL`.
    pub kernel_url: String,
    /// `boot.initrdURL`.
    pub initrd_url: String,
    /// `image.url`.
    pub node_url: String,
    /// `image.sha256`.
    pub node_sha256: String,
}

impl BootArtifacts {
    /// Paths on the bootserver (the host-binary lab serves them from its image directory).
    pub fn on_bootserver(node_sha256: &str) -> Self {
        Self {
            kernel_url: "vmlinuz".into(),
            initrd_url: "initrd.img".into(),
            node_url: "node.tar.zst".into(),
            node_sha256: node_sha256.into(),
        }
    }
}

/// The appliance's MachineConfiguration and Machine: a `manual` Machine; its node image by
/// URL (no bootserver to resolve a path against), the bootserver's Node label, and
/// containerd's configuration for the lab's registry written into the node container.
pub fn machine_yaml(
    artifacts: &BootArtifacts,
    registry: &RegistryAddress,
    version: &str,
) -> String {
    let (hosts_path, hosts) = registry.containerd_hosts();
    let hosts: String = hosts.lines().map(|l| format!("          {l}\n")).collect();
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: {NAME}}}
spec:
  machineSelector: {{matchLabels: {{{APPLIANCE_LABEL}: "true"}}}}
  template:
    image: {{url: "{url}", sha256: {sha}}}
    kubernetes:
      version: {version}
      nodeLabels: {{{BOOTSERVER_LABEL}: "true", {APPLIANCE_LABEL}: "true"}}
    files:
      - path: "{hosts_path}"
        mode: "0644"
        content: |
{hosts}---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata:
  name: {NAME}
  labels: {{{APPLIANCE_LABEL}: "true"}}
spec:
  provider: manual
"#,
        url = artifacts.node_url,
        sha = artifacts.node_sha256,
    )
}

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
fn mint_credentials(plane: &LocalControlPlane, server: &str) -> Result<String, LabError> {
    let mut child = std::process::Command::new("bash")
        .args(["-s", "--", NAME, server, &CREDENTIAL_SECONDS.to_string()])
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env("KUBECTL", &plane.binaries().kubectl)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| step(format!("scripts/machine-credentials: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(CREDENTIALS_SCRIPT.as_bytes())
            .map_err(|e| step(format!("scripts/machine-credentials: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| step(format!("scripts/machine-credentials: {e}")))?;
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

/// The appliance VM: QEMU with the host OS's kernel and initramfs (plus the seed archive),
/// a NIC on the bridge through a tap, the serial console in a file.
#[derive(Debug)]
struct ApplianceVm {
    process: Process,
    console: PathBuf,
    started: Instant,
}

impl ApplianceVm {
    fn start(
        ns: &Netns,
        dir: &Path,
        kernel: &Path,
        initrd: &Path,
        memory_mib: u32,
        vcpus: u32,
    ) -> Result<Self, LabError> {
        let tap = "tapappliance";
        for args in [
            &["tuntap", "add", "dev", tap, "mode", "tap"][..],
            &["link", "set", tap, "master", "br0"],
            &["link", "set", tap, "up"],
        ] {
            ns.ip(args).map_err(|e| step(e.to_string()))?;
        }
        let console = dir.join("appliance-console.log");
        let args: Vec<String> = vec![
            "-accel".into(),
            crate::qemu::accelerator().into(),
            "-machine".into(),
            "pc".into(),
            "-m".into(),
            memory_mib.to_string(),
            "-smp".into(),
            vcpus.to_string(),
            "-display".into(),
            "none".into(),
            "-monitor".into(),
            "none".into(),
            "-serial".into(),
            format!("file:{}", console.display()),
            "-kernel".into(),
            kernel.display().to_string(),
            "-initrd".into(),
            initrd.display().to_string(),
            "-append".into(),
            // quiet: the kernel's own log over an emulated UART costs seconds.
            format!("console=ttyS0 quiet systemd.show_status=true unbounded.machine={NAME}"),
            "-netdev".into(),
            format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac={MAC},romfile="),
            "-device".into(),
            "virtio-rng-pci".into(),
        ];
        let process = Process::spawn(
            "appliance VM",
            Some(ns),
            Path::new("qemu-system-x86_64"),
            &args,
            &[],
            dir.join("appliance-qemu.log"),
        )?;
        Ok(Self {
            process,
            console,
            started: Instant::now(),
        })
    }

    fn console(&self) -> String {
        fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

/// The appliance and what it depends on, owned by the lab. Fields drop in order: the VM
/// before the registry it pulls from, the route last.
#[derive(Debug)]
pub struct Appliance {
    vm: ApplianceVm,
    registry: LabRegistry,
    _route: HostRoute,
    /// What scenarios need of it.
    pub info: PodsInfo,
    /// Where the lab's machines get their boot artifacts.
    pub artifacts: BootArtifacts,
    /// The appliance's stages, from power-on to a Ready Node.
    pub timeline: Timeline,
    /// The lab's steps of the appliance and how long each took.
    pub steps: Vec<(String, Duration)>,
    dir: PathBuf,
}

/// What the appliance is started with.
#[derive(Debug, Clone)]
pub struct ApplianceOptions {
    /// Logs and generated files.
    pub dir: PathBuf,
    /// The VM's memory.
    pub memory_mib: u32,
    /// The VM's virtual CPUs.
    pub vcpus: u32,
    /// The controller binary run outside the cluster for the first join.
    pub controller: PathBuf,
    /// How long the appliance may take to become a Ready Node, and its pods to run.
    pub timeout: Duration,
}

/// Times each step and says how long it took.
struct Steps<'a> {
    done: Vec<(String, Duration)>,
    say: &'a dyn Fn(&str),
}

impl Steps<'_> {
    fn run<T>(
        &mut self,
        what: &str,
        f: impl FnOnce() -> Result<T, LabError>,
    ) -> Result<T, LabError> {
        (self.say)(what);
        let started = Instant::now();
        let value = f()?;
        let took = started.elapsed();
        (self.say)(&format!("  {what}: {:.1} s", took.as_secs_f64()));
        self.done.push((what.to_owned(), took));
        Ok(value)
    }
}

fn kubectl(
    plane: &LocalControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    crate::cluster::run_kubectl(plane.kubectl(), args, stdin).map_err(|e| step(e.to_string()))
}

impl Appliance {
    /// Brings the appliance up in `ns` (whose bridge `br0` has [`LAB_ADDRESS`]): routed link,
    /// registry with the images pushed, `deploy/` applied through the testbed overlay, the
    /// appliance's first join, its pods running and leading.
    pub fn start(
        ns: &Netns,
        plane: &LocalControlPlane,
        options: &ApplianceOptions,
        images: &Images,
        say: &dyn Fn(&str),
    ) -> Result<Self, LabError> {
        let mut steps = Steps {
            done: Vec::new(),
            say,
        };
        let route = steps.run(
            "routed link host ↔ provisioning network (10.99.0.0/24)",
            || {
                HostRoute::new(ns, HOST_ROUTE.0, HOST_ROUTE.1, HOST_ROUTE.2)
                    .map_err(|e| step(e.to_string()))
            },
        )?;
        let registry = steps.run("registry (docker-registry) at 10.99.0.1:5000", || {
            LabRegistry::start(ns, LAB_ADDRESS, &options.dir)
        })?;
        let address = registry.address.clone();
        let pushed = steps.run("pushing the container images (skopeo)", || {
            push_images(&address, images)
        })?;
        // The appliance boots before any bootserver serves: its configuration names the
        // registry's blobs. The machines it boots use the set its bootserver pod installs
        // (the boot-images init container), as an operator's would.
        let artifacts = steps.run(
            "pushing the kernel, initramfs and node image as blobs",
            || push_artifacts(&address, images),
        )?;
        let machines_artifacts = installed_set_artifacts(images)?;
        steps.run("applying deploy/ through testbed/overlay", || {
            apply_overlay(plane, &options.dir, &pushed)
        })?;
        let mut bootstrap = steps
            .run("controller outside the cluster, for the first join", || {
                bootstrap_controller(plane, options)
            })?;
        steps.run(
            "appliance Machine and MachineConfiguration; first credentials",
            || {
                kubectl(
                    plane,
                    &["apply", "-f", "-"],
                    Some(&machine_yaml(
                        &artifacts,
                        &address,
                        crate::cluster::KUBERNETES_VERSION,
                    )),
                )?;
                wait_for(
                    "the controller to create the appliance's ServiceAccount",
                    Duration::from_secs(120),
                    || {
                        let found = kubectl(
                            plane,
                            &[
                                "get",
                                "serviceaccount",
                                "-n",
                                "unbounded-machines",
                                NAME,
                                "-o",
                                "name",
                            ],
                            None,
                        )
                        .is_ok();
                        (found, String::new())
                    },
                    || bootstrap.tail(20),
                )
            },
        )?;
        let server = format!("https://{LAB_ADDRESS}:{LAB_API_PORT}");
        let initrd = steps.run(
            "seed archive (credentials, static network) after the initramfs",
            || {
                let credentials = mint_credentials(plane, &server)?;
                let seed = newc_archive(&seed_entries(&credentials));
                let initrd = options.dir.join("appliance-initrd.img");
                let mut file = fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .mode(0o600)
                    .open(&initrd)
                    .map_err(|e| step(format!("{}: {e}", initrd.display())))?;
                let host = fs::read(&images.host.initrd)
                    .map_err(|e| step(format!("{}: {e}", images.host.initrd.display())))?;
                file.write_all(&seeded_initrd(&host, &seed))
                    .map_err(|e| step(format!("{}: {e}", initrd.display())))?;
                Ok(initrd)
            },
        )?;
        let vm = ApplianceVm::start(
            ns,
            &options.dir,
            &images.host.kernel,
            &initrd,
            options.memory_mib,
            options.vcpus,
        )?;
        let mut appliance = Self {
            vm,
            registry,
            _route: route,
            info: PodsInfo {
                registry: address.0.clone(),
                bootserver_url: format!("http://{ADDRESS}:8080"),
                images: pushed,
            },
            artifacts: machines_artifacts,
            timeline: Timeline::default(),
            steps: Vec::new(),
            dir: options.dir.clone(),
        };
        let timeline = steps.run("appliance VM: power-on to a Ready Node", || {
            appliance.follow_to_ready(plane, &initrd, &mut bootstrap, options.timeout, say)
        })?;
        appliance.timeline = timeline;
        steps.run("the project's pods Running and Ready", || {
            wait_for_pods(plane, options.timeout, || appliance.console_tail(30))
        })?;
        steps.run(
            "outside controller stopped; a controller pod takes the Lease",
            || {
                drop(bootstrap);
                wait_for(
                    "a controller pod to hold the Lease unbounded-controller",
                    Duration::from_secs(90),
                    || {
                        let holder = lease_holder(plane);
                        let pods = controller_pods(plane);
                        (
                            pods.contains(&holder),
                            format!("holder {holder:?}, pods {pods:?}"),
                        )
                    },
                    String::new,
                )
            },
        )?;
        appliance.steps = steps.done;
        Ok(appliance)
    }

    /// Follows the appliance from power-on to a Ready Node, saying each stage; removes the
    /// initramfs with its credentials once the kernel runs (QEMU read it at start).
    fn follow_to_ready(
        &self,
        plane: &LocalControlPlane,
        initrd: &Path,
        bootstrap: &mut Process,
        timeout: Duration,
        say: &dyn Fn(&str),
    ) -> Result<Timeline, LabError> {
        let mut timeline = Timeline::default();
        timeline.record(Stage::PoweredOn, Duration::ZERO);
        let mut last_progress = Instant::now();
        loop {
            let elapsed = self.vm.started.elapsed();
            let mut stages = progress::console_stages(&self.vm.console());
            match node_ready(plane, NAME) {
                Some(true) => stages.extend([Stage::NodeRegistered, Stage::Ready]),
                Some(false) => stages.push(Stage::NodeRegistered),
                None => {}
            }
            for stage in stages {
                if timeline.record(stage, elapsed) {
                    last_progress = Instant::now();
                    say(&format!(
                        "{NAME:<12} {:<16} {:>6.1} s",
                        stage.label(),
                        elapsed.as_secs_f64()
                    ));
                    if stage == Stage::Kernel {
                        let _ = fs::remove_file(initrd);
                    }
                }
            }
            if timeline.at(Stage::Ready).is_some() {
                let _ = fs::remove_file(initrd);
                return Ok(timeline);
            }
            let exited = bootstrap.exited();
            if last_progress.elapsed() > timeout || exited.is_some() {
                let _ = fs::remove_file(initrd);
                return Err(step(format!(
                    "the appliance did not become a Ready Node (last stage {}{}); console tail:\n{}\n{}",
                    timeline.last().map_or("none", Stage::label),
                    exited.map(|e| format!("; {e}")).unwrap_or_default(),
                    self.console_tail(60),
                    bootstrap.tail(30),
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The tail of the appliance's serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        format!(
            "--- appliance console ({}):\n{}",
            self.vm.console.display(),
            crate::process::tail_text(&self.vm.console(), lines)
        )
    }

    /// The appliance's console file.
    pub fn console_path(&self) -> &Path {
        &self.vm.console
    }

    /// Files whose text the lab's secret scan reads: the console, QEMU's and the registry's
    /// logs.
    pub fn logs(&self) -> Vec<PathBuf> {
        vec![
            self.vm.console.clone(),
            self.vm.process.log_path().to_path_buf(),
            self.dir.join("registry.log"),
            self.dir.join("bootstrap-controller.log"),
        ]
    }

    /// `Some(why)` once the VM has stopped.
    pub fn exited(&mut self) -> Option<String> {
        self.vm.process.exited()
    }

    /// The registry's address.
    pub fn registry(&self) -> &RegistryAddress {
        &self.registry.address
    }
}

/// Pushes every container image `images --containers` built (the project's images and the
/// boot images image), as `unbounded/<name>`.
fn push_images(registry: &RegistryAddress, images: &Images) -> Result<Vec<PushedLayout>, LabError> {
    let Some(built) = &images.containers else {
        return Err(step(
            "no container images were built: run `cargo run -p unbounded-testbed -- images --containers`",
        ));
    };
    built
        .images
        .iter()
        .chain(std::iter::once(&built.boot_images))
        .map(|image| {
            let reference = image
                .references
                .first()
                .ok_or_else(|| step(format!("the image {} has no reference", image.name)))?;
            let short = overlay::short_name(reference).to_owned();
            let tag = crate::oci::tag_of(reference).to_owned();
            let repository = format!("unbounded/{short}");
            let digest = registry.push_layout(&image.layout, &tag, &repository, &tag)?;
            Ok(PushedLayout {
                short_name: short,
                layout: image.layout.clone(),
                layout_tag: tag,
                repository,
                digest,
            })
        })
        .collect()
}

/// What a MachineConfiguration names to boot the set the boot-images image installs: paths
/// relative to the bootserver's image directory.
fn installed_set_artifacts(images: &Images) -> Result<BootArtifacts, LabError> {
    let values = images
        .containers
        .as_ref()
        .and_then(|built| built.boot_images_manifest.configuration_values())
        .ok_or_else(|| {
            step("no boot image set was built: run `cargo run -p unbounded-testbed -- images --containers`")
        })?;
    Ok(BootArtifacts {
        kernel_url: values.kernel_url,
        initrd_url: values.initrd_url,
        node_url: values.image_url,
        node_sha256: values.image_sha256,
    })
}

/// Pushes the kernel, the initramfs and the node image as blobs; their URLs name them by
/// SHA-256.
fn push_artifacts(registry: &RegistryAddress, images: &Images) -> Result<BootArtifacts, LabError> {
    let sha = |path: &Path| crate::images::file_sha256(path).map_err(step);
    let kernel = registry.push_blob(
        "unbounded/boot",
        &images.host.kernel,
        &sha(&images.host.kernel)?,
    )?;
    let initrd = registry.push_blob(
        "unbounded/boot",
        &images.host.initrd,
        &sha(&images.host.initrd)?,
    )?;
    let node = registry.push_blob("unbounded/boot", &images.node.archive, &images.node.sha256)?;
    Ok(BootArtifacts {
        kernel_url: kernel,
        initrd_url: initrd,
        node_url: node,
        node_sha256: images.node.sha256.clone(),
    })
}

/// Writes the lab's kustomization over `testbed/overlay` and applies it.
fn apply_overlay(
    plane: &LocalControlPlane,
    dir: &Path,
    pushed: &[PushedLayout],
) -> Result<(), LabError> {
    let base = overlay::testbed_overlay();
    let base = fs::canonicalize(&base).map_err(|e| step(format!("{}: {e}", base.display())))?;
    let rendered = kubectl(plane, &["kustomize", &base.display().to_string()], None)?;
    let pushed: Vec<PushedImage> = pushed
        .iter()
        .map(|p| PushedImage {
            short_name: p.short_name.clone(),
            repository: format!(
                "{LAB_ADDRESS}:{}/{}",
                crate::registry::REGISTRY_PORT,
                p.repository
            ),
            digest: p.digest.clone(),
        })
        .collect();
    let overrides = overlay::image_overrides(&overlay::manifest_images(&rendered), &pushed);
    let out = dir.join("overlay");
    fs::create_dir_all(&out).map_err(|e| step(format!("{}: {e}", out.display())))?;
    let out = fs::canonicalize(&out).map_err(|e| step(format!("{}: {e}", out.display())))?;
    fs::write(
        out.join("kustomization.yaml"),
        overlay::lab_kustomization(&overlay::relative_path(&out, &base), &overrides),
    )
    .map_err(|e| step(format!("{}: {e}", out.display())))?;
    kubectl(
        plane,
        &["apply", "--server-side", "-k", &out.display().to_string()],
        None,
    )?;
    Ok(())
}

/// The controller binary with the controller's ServiceAccount (deploy/'s RBAC), outside the
/// cluster, competing for the same Lease as its pods will.
fn bootstrap_controller(
    plane: &LocalControlPlane,
    options: &ApplianceOptions,
) -> Result<Process, LabError> {
    let ca = plane.data_dir().join("pki/ca.crt");
    let kubeconfig = options.dir.join("bootstrap-controller.kubeconfig");
    let text = crate::lab::service_account_kubeconfig(
        plane,
        "unbounded-controller",
        plane.server_url(),
        &ca,
    )?;
    fs::write(&kubeconfig, text).map_err(|e| step(format!("{}: {e}", kubeconfig.display())))?;
    let metrics_port = crate::bmc::free_port(false).map_err(|e| step(e.to_string()))?;
    Process::spawn(
        "controller (outside the cluster)",
        None,
        &options.controller,
        &[
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--leader-election-identity".into(),
            "testbed-first-join".into(),
        ],
        &[
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("bootstrap-controller.log"),
    )
}

/// Waits until `check` holds; on timeout the error names `what`, the last value seen and
/// `context()`.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> (bool, String),
    context: impl Fn() -> String,
) -> Result<(), LabError> {
    let deadline = Instant::now() + timeout;
    loop {
        let (done, seen) = check();
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(step(format!(
                "timed out after {} s waiting for {what}; last seen: {seen}\n{}",
                timeout.as_secs(),
                context()
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether a Node exists (`Some`) and is Ready.
fn node_ready(plane: &LocalControlPlane, name: &str) -> Option<bool> {
    let status = kubectl(
        plane,
        &[
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        None,
    )
    .ok()?;
    Some(status == "True")
}

/// Every Deployment of the project's namespace has all its replicas available.
fn wait_for_pods(
    plane: &LocalControlPlane,
    timeout: Duration,
    context: impl Fn() -> String,
) -> Result<(), LabError> {
    wait_for(
        "every Deployment of unbounded-system available",
        timeout,
        || {
            let listing = kubectl(
                plane,
                &[
                    "get",
                    "deployments",
                    "-n",
                    SYSTEM_NAMESPACE,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}|{.spec.replicas}|{.status.availableReplicas}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
            (deployments_available(&listing), pod_summary(plane))
        },
        context,
    )
}

/// Whether every `name|replicas|available` line has all its replicas available (and there is
/// at least one line).
pub fn deployments_available(listing: &str) -> bool {
    let mut any = false;
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        any = true;
        let mut fields = line.split('|').skip(1);
        let wanted: u32 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(1);
        let available: u32 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        if available < wanted {
            return false;
        }
    }
    any
}

/// One line per pod of the project's namespace: name, phase, node and why a container waits.
pub(crate) fn pod_summary(plane: &LocalControlPlane) -> String {
    kubectl(
        plane,
        &[
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} on {.spec.nodeName}: {.status.containerStatuses[*].state.waiting.reason} {.status.containerStatuses[*].state.waiting.message}{\"\\n\"}{end}",
        ],
        None,
    )
    .unwrap_or_default()
}

/// The controller Lease's holder, or empty.
fn lease_holder(plane: &LocalControlPlane) -> String {
    kubectl(
        plane,
        &[
            "get",
            "lease",
            "-n",
            SYSTEM_NAMESPACE,
            CONTROLLER_LEASE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    )
    .unwrap_or_default()
}

/// The names of the controller's pods.
fn controller_pods(plane: &LocalControlPlane) -> Vec<String> {
    kubectl(
        plane,
        &[
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=unbounded-controller",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )
    .unwrap_or_default()
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_are_available_only_when_every_replica_is() {
        assert!(deployments_available(
            "unbounded-controller|2|2\nunbounded-bootserver|1|1\nunbounded-azure|0|\n"
        ));
        assert!(!deployments_available("unbounded-controller|2|1\n"));
        assert!(!deployments_available("unbounded-bootserver|1|\n"));
        assert!(!deployments_available(""), "nothing applied yet");
    }

    #[test]
    fn the_appliance_is_a_manual_machine_labelled_for_the_bootserver() {
        let artifacts = BootArtifacts {
            kernel_url: "http://10.99.0.1:5000/v2/unbounded/boot/blobs/sha256:k".into(),
            initrd_url: "http://10.99.0.1:5000/v2/unbounded/boot/blobs/sha256:i".into(),
            node_url: "http://10.99.0.1:5000/v2/unbounded/boot/blobs/sha256:n".into(),
            node_sha256: "n".repeat(64),
        };
        let yaml = machine_yaml(
            &artifacts,
            &RegistryAddress("10.99.0.1:5000".into()),
            "v1.35.4",
        );
        assert!(yaml.contains("provider: manual"), "{yaml}");
        assert!(
            yaml.contains("unbounded-cloud.io/bootserver: \"true\""),
            "{yaml}"
        );
        assert!(
            yaml.contains("url: \"http://10.99.0.1:5000/v2/unbounded/boot/blobs/sha256:n\""),
            "{yaml}"
        );
        assert!(
            yaml.contains("path: \"/etc/containerd/certs.d/10.99.0.1:5000/hosts.toml\""),
            "{yaml}"
        );
        assert!(
            !yaml.contains("boot:"),
            "a manual machine is not network-booted: {yaml}"
        );
        // The hosts.toml is a block of the files entry, indented under `content: |`.
        assert!(
            yaml.contains("        content: |\n          # The testbed's registry"),
            "{yaml}"
        );
    }

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
