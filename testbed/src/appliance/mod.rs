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
use crate::failure::Failure;
use crate::images::Images;
use crate::lab::base::{LAB_ADDRESS, LAB_API_PORT, LabError};
use crate::netns::{HostRoute, Netns};
use crate::process::Process;
use crate::progress::{self, Stage, Timeline};
use crate::registry::{LabRegistry, RegistryAddress};

mod publish;
mod seed;
mod vm;
mod watch;

use publish::{apply_overlay, installed_set_artifacts, push_artifacts, push_images};
use seed::{mint_credentials, newc_archive, seed_entries, seeded_initrd};
use vm::ApplianceVm;
pub use watch::deployments_available;
pub(crate) use watch::pod_summary;
use watch::{
    bootstrap_controller, controller_pods, lease_holder, node_ready, wait_for, wait_for_pods,
};

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
pub(crate) const HOST_ROUTE: (&str, &str, &str) = ("10.99.1.1/30", "10.99.1.2/30", "10.99.0.0/24");

pub(super) fn step(message: impl Into<String>) -> LabError {
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

// What the machines boot: a type of its own room, which the lab's discovery also reads.
pub use crate::boot_artifacts::BootArtifacts;

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

pub(super) fn kubectl(
    plane: &LocalControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    crate::cluster::run_kubectl(plane.kubectl(), args, stdin).map_err(|e| Failure::of(e).into())
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
                    .map_err(|e| Failure::of(e).into())
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
            apply_overlay(plane, &options.dir, &pushed, &machines_artifacts)
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
                    .map_err(|e| Failure::new(initrd.display(), e))?;
                let host = fs::read(&images.host.initrd)
                    .map_err(|e| Failure::new(images.host.initrd.display(), e))?;
                file.write_all(&seeded_initrd(&host, &seed))
                    .map_err(|e| Failure::new(initrd.display(), e))?;
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
}
