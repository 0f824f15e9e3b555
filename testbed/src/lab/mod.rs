//! The testbed lab: everything between power-off and Ready Nodes, on one machine.
//!
//! - a network namespace with a bridge (`br0`, [`LAB_ADDRESS`]/24): the provisioning network;
//! - the local control plane, reachable from the VMs at `https://10.99.0.1:6443` through a
//!   forwarder;
//! - the project's components, one of two ways ([`LabMode`]):
//!   - **as shipped** (the default): `deploy/` applied through its testbed overlay and run as
//!     pods on the appliance node, a VM on the bridge that is an Unbounded node itself, with
//!     the images pulled from the lab's registry ([`crate::appliance`]);
//!   - **host binaries** (fast development): the bootserver binary in the namespace and the
//!     controller binary on the host, each with its own ServiceAccount's token and `deploy/`'s
//!     RBAC, not as cluster-admin;
//! - libvirtd in the namespace and one domain per machine (TCG where KVM cannot run guests),
//!   each behind an emulated BMC on the bridge's address: sushy-tools (Redfish) for odd
//!   machines, `ipmi_sim` (IPMI) for even ones; BIOS and UEFI alternate;
//! - a MachineConfiguration with the host and node images, and one Machine per VM.
//!
//! [`Provisioning`] picks the machines' family: IPv4 (the default), IPv6 only (`fd00:99::1` on
//! the bridge, DHCPv4 off, UEFI machines booting by OVMF's PXEv6, the API server forwarded on
//! `[fd00:99::1]:6443` too) or dual stack (the IPv4 lab plus DHCPv6 reservations).
//!
//! Everything is owned by [`Lab`] and stopped when it is dropped (processes die with the
//! thread that started them, too).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::appliance::{Appliance, ApplianceOptions, BootArtifacts};
use crate::bmc::{self, Domain, DomainOptions, IpmiSim, Libvirtd, SushyEmulator};
use crate::cluster::{KUBERNETES_VERSION, Lifetime, LocalControlPlane, PlaneOptions};
use crate::failure::Failure;
use crate::images::Images;
use crate::netns::{HostRoute, LoopbackForward, Netns};
use crate::process::Process;

/// Every lab machine's blank data disk (`vdb`), for configurations with
/// `template.storage` (the `disks` scenario); unused otherwise.
pub const LAB_DATA_DISK_GIB: u32 = 20;
/// The second data disk (`vdc`) of every even-numbered lab machine (the UEFI ones): the lab
/// has machines with one disk and with two, and a rule such as `minSizeGiB: 22` picks it.
pub const LAB_SECOND_DATA_DISK_GIB: u32 = 24;

/// The data disks of lab machine `index` (from 1): one, or two on even-numbered machines.
pub fn lab_data_disks(index: usize) -> Vec<u32> {
    if index.is_multiple_of(2) {
        vec![LAB_DATA_DISK_GIB, LAB_SECOND_DATA_DISK_GIB]
    } else {
        vec![LAB_DATA_DISK_GIB]
    }
}
/// The BMC user and password of the emulators (test credentials, in a Secret).
const BMC_USER: &str = "admin";
// At most 16 characters: IPMI 1.5 and some BMCs (ipmi_sim among them) stop there.
const BMC_PASSWORD: &str = "tb-bmc-s3cret";

/// How the lab runs the project's components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabMode {
    /// As shipped: `deploy/` as pods on the appliance node (a VM), images from the lab's
    /// registry.
    Pods,
    /// The controller and bootserver binaries as processes of the host (fast development).
    HostBinaries,
}

/// How a lab machine's BMC speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BmcKind {
    /// sushy-tools.
    Redfish,
    /// ipmi_sim.
    Ipmi,
}

/// One machine of the lab.
#[derive(Debug)]
pub struct LabMachine {
    /// The Machine's (and Node's) name.
    pub name: String,
    /// Its NIC's MAC.
    pub mac: String,
    /// Its reserved address (IPv6 in an IPv6-only lab).
    pub ip: String,
    /// Its reserved IPv6 address beside `ip`, in a dual-stack lab.
    pub ip6: Option<String>,
    /// UEFI (else BIOS).
    pub uefi: bool,
    /// Its BMC.
    pub bmc: BmcKind,
    /// Its libvirt domain.
    pub domain: Domain,
    /// Its IPMI simulator, when it has one.
    ipmi: Option<IpmiSim>,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// How many machines (BIOS/Redfish and UEFI/IPMI alternate).
    pub machines: usize,
    /// Memory per VM.
    pub memory_mib: u32,
    /// Where logs and generated files go.
    pub dir: PathBuf,
    /// The controller binary (run on the host in [`LabMode::HostBinaries`]; for the
    /// appliance's first join in [`LabMode::Pods`]).
    pub controller: PathBuf,
    /// The bootserver binary ([`LabMode::HostBinaries`]).
    pub bootserver: PathBuf,
    /// How the components run.
    pub mode: LabMode,
    /// Memory of the appliance VM ([`LabMode::Pods`]).
    pub appliance_memory_mib: u32,
    /// How long one stage may take.
    pub stage_timeout: Duration,
    /// Which family the machines provision over ([`LabMode::HostBinaries`] only for IPv6).
    pub provisioning: Provisioning,
}

/// The project's components as the lab runs them.
#[derive(Debug)]
enum Components {
    /// The controller and the bootserver as processes of the host.
    HostBinaries {
        controller: Process,
        bootserver: Process,
        /// The host's route to the machines: the API server reaches their kubelets
        /// (`kubectl logs`, the agent's log through `nodes/proxy`).
        _route: HostRoute,
    },
    /// `deploy/` as pods on the appliance node.
    Pods(Box<Appliance>),
}

/// The lab. Fields drop in order: the components that talk to others go first.
#[derive(Debug)]
pub struct Lab {
    components: Components,
    /// The machines.
    pub machines: Vec<LabMachine>,
    sushy: Option<SushyEmulator>,
    libvirtd: Libvirtd,
    _forward: LoopbackForward,
    _forward6: Option<LoopbackForward>,
    /// The control plane.
    pub plane: LocalControlPlane,
    ns: Netns,
    /// Where logs and generated files are.
    pub dir: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// When each machine was powered on (the provider's first power-on seen).
    powered_on: BTreeMap<String, Instant>,
    /// Where the machines get their boot artifacts.
    artifacts: BootArtifacts,
    /// A packet capture of the provisioning bridge's boot and credential traffic
    /// (`bridge.pcap`), scanned for secrets in clear ([`Lab::secret_leaks`]).
    _capture: crate::process::Process,
}

/// The capture's file in the lab's directory.
pub const BRIDGE_CAPTURE: &str = "bridge.pcap";

fn write(path: &Path, content: &str) -> Result<(), LabError> {
    fs::write(path, content)
        .map_err(|e| Failure::new(format!("writing {}", path.display()), e).into())
}

impl Lab {
    /// Starts everything except the Machines (see [`Lab::apply_machines`]).
    pub fn start(
        options: &LabOptions,
        images: &Images,
        say: &dyn Fn(&str),
    ) -> Result<Self, LabError> {
        fs::create_dir_all(&options.dir).map_err(|e| Failure::new(options.dir.display(), e))?;
        say("provisioning network: namespace with bridge br0 (10.99.0.1/24)");
        let ns = Netns::new("ubtb").map_err(Failure::of)?;
        let ipv6 = options.provisioning == Provisioning::Ipv6Only;
        let has_ipv6 = options.provisioning != Provisioning::Ipv4;
        if has_ipv6 && options.mode != LabMode::HostBinaries {
            // The appliance VM's pods would need the v6 network inside the VM as well.
            return Err(step(
                "an IPv6 or dual-stack lab runs the bootserver and the controller as host binaries: add --host-binaries",
            ));
        }
        let address6 = format!("{LAB_ADDRESS6}/64");
        for args in [
            &["link", "add", "br0", "type", "bridge"][..],
            &["addr", "add", "10.99.0.1/24", "dev", "br0"],
            &["link", "set", "br0", "up"],
        ] {
            ns.ip(args).map_err(Failure::of)?;
        }
        if has_ipv6 {
            say(&format!(
                "provisioning over {}: {address6} on br0",
                if ipv6 { "IPv6 only" } else { "IPv4 and IPv6" }
            ));
            // No duplicate address detection: the bootserver binds it as it starts.
            ns.ip(&["-6", "addr", "add", &address6, "dev", "br0", "nodad"])
                .map_err(Failure::of)?;
        }
        // Every boot's DHCP, scripts and credential exchange, from the first packet: the
        // first 2 KiB of each (images pass by, their heads only). `--immediate-mode`: each
        // packet is written as it comes, so a scan during the run sees it.
        let capture = crate::process::Process::spawn(
            "tcpdump",
            Some(&ns),
            Path::new("tcpdump"),
            &[
                "-i",
                "br0",
                "-Z",
                "root",
                "--immediate-mode",
                "-U",
                "-s",
                "2048",
                "-w",
            ]
            .map(str::to_owned)
            .into_iter()
            .chain([
                options.dir.join(BRIDGE_CAPTURE).display().to_string(),
                "tcp port 8080 or tcp port 8443 or udp port 67 or udp port 4011 or udp port 547"
                    .to_owned(),
            ])
            .collect::<Vec<_>>(),
            &[],
            options.dir.join("tcpdump.log"),
        )?;

        let pods = options.mode == LabMode::Pods;
        say(&format!(
            "control plane: etcd, kube-apiserver, kube-controller-manager{} {KUBERNETES_VERSION}",
            if pods { ", kube-scheduler" } else { "" }
        ));
        let plane = LocalControlPlane::start_with(
            Lifetime::TiedToThread,
            PlaneOptions {
                // Pods need a scheduler; the host-binary lab has nothing to schedule (its
                // Deployments' pods would only land on the machines and fail to pull).
                scheduler: pods,
                ..PlaneOptions::default()
            },
        )
        .map_err(Failure::of)?;
        let api_port = plane
            .server_url()
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let forward = LoopbackForward::bound(
            &ns,
            LAB_ADDRESS,
            LAB_API_PORT,
            &format!("127.0.0.1:{api_port}"),
        )
        .map_err(Failure::of)?;
        // The machines of an IPv6 lab reach the API server at [fd00:99::1]:6443 (the
        // bootserver, in the namespace, keeps the v4 forward).
        let forward6 = if ipv6 {
            Some(
                LoopbackForward::bound(
                    &ns,
                    LAB_ADDRESS6,
                    LAB_API_PORT,
                    &format!("127.0.0.1:{api_port}"),
                )
                .map_err(Failure::of)?,
            )
        } else {
            None
        };
        let kubeconfig = plane.kubeconfig_path().to_path_buf();

        let (components, artifacts) = match options.mode {
            LabMode::Pods => {
                let appliance = Appliance::start(
                    &ns,
                    &plane,
                    &ApplianceOptions {
                        dir: options.dir.clone(),
                        memory_mib: options.appliance_memory_mib,
                        vcpus: 2,
                        controller: options.controller.clone(),
                        timeout: options.stage_timeout,
                    },
                    images,
                    say,
                )?;
                let artifacts = appliance.artifacts.clone();
                (Components::Pods(Box::new(appliance)), artifacts)
            }
            LabMode::HostBinaries => (
                start_host_binaries(options, &ns, &plane, images, say)?,
                BootArtifacts::on_bootserver(&images.node.sha256),
            ),
        };

        say(
            "libvirtd and the BMC emulators on 10.99.0.1 (sushy-tools for Redfish, ipmi_sim for IPMI)",
        );
        let libvirtd = Libvirtd::start(&ns).map_err(Failure::of)?;
        let sushy = SushyEmulator::start_bound(Some(&ns), LAB_ADDRESS, BMC_USER, BMC_PASSWORD)
            .map_err(Failure::of)?;

        say(&format!("{} VMs with their BMCs", options.machines));
        let pid = std::process::id();
        let mut machines = Vec::new();
        for i in 1..=options.machines {
            // iPXE's BIOS build has no IPv6: an IPv6 lab's machines are all UEFI.
            let uefi = ipv6 || i % 2 == 0;
            let bmc = if i % 2 == 1 {
                BmcKind::Redfish
            } else {
                BmcKind::Ipmi
            };
            let name = format!("machine-{i}");
            let mac = format!("52:54:00:99:00:{i:02x}");
            let domain = Domain::define_with(
                &format!("{}{pid}-{i}", bmc::TEST_DOMAIN_PREFIX),
                &mac,
                "br0",
                &DomainOptions {
                    uefi,
                    memory_mib: options.memory_mib,
                    vcpus: 1,
                    network_fallback: true,
                    data_disks_gib: lab_data_disks(i),
                    smbios_serial: None,
                    // OVMF's own PXEv6, as a server's firmware (the v4 lab's UEFI
                    // machines boot the NIC's iPXE ROM).
                    qemu_args: if ipv6 {
                        crate::qemu::ovmf_pxe6_args()
                    } else {
                        Vec::new()
                    },
                    tpm: true,
                },
            )
            .map_err(Failure::of)?;
            let ipmi = match bmc {
                BmcKind::Ipmi => Some(
                    // SOL shows the domain's serial console (`kubectl unbounded console`).
                    IpmiSim::start_with_console(
                        Some(&ns),
                        LAB_ADDRESS,
                        &domain.name,
                        BMC_USER,
                        BMC_PASSWORD,
                        &domain.console_path(),
                    )
                    .map_err(Failure::of)?,
                ),
                BmcKind::Redfish => None,
            };
            let ip6 = format!("fd00:99::{}", 20 + i);
            machines.push(LabMachine {
                ip: if ipv6 {
                    ip6.clone()
                } else {
                    format!("10.99.0.{}", 20 + i)
                },
                ip6: (options.provisioning == Provisioning::DualStack).then_some(ip6),
                name,
                mac,
                uefi,
                bmc,
                domain,
                ipmi,
            });
        }
        let mut lab = Self {
            components,
            machines,
            sushy: Some(sushy),
            libvirtd,
            _forward: forward,
            _forward6: forward6,
            plane,
            ns,
            dir: options.dir.clone(),
            kubeconfig,
            powered_on: BTreeMap::new(),
            artifacts,
            _capture: capture,
        };
        if let Some(message) = lab.component_exited() {
            return Err(step(format!("{message}\n{}", lab.logs())));
        }
        Ok(lab)
    }

    fn component_exited(&mut self) -> Option<String> {
        match &mut self.components {
            Components::HostBinaries {
                controller,
                bootserver,
                ..
            } => controller.exited().or_else(|| bootserver.exited()),
            Components::Pods(appliance) => appliance.exited(),
        }
    }

    /// The appliance, when the lab runs the pods.
    pub fn appliance(&self) -> Option<&Appliance> {
        match &self.components {
            Components::Pods(appliance) => Some(appliance),
            Components::HostBinaries { .. } => None,
        }
    }

    /// Where the machines get their kernel, initramfs and node image.
    pub fn artifacts(&self) -> &BootArtifacts {
        &self.artifacts
    }

    /// The BMC address of a machine.
    fn bmc_address(&self, machine: &LabMachine) -> String {
        match (machine.bmc, &machine.ipmi, &self.sushy) {
            (BmcKind::Ipmi, Some(sim), _) => format!("ipmi://{LAB_ADDRESS}:{}", sim.port),
            (_, _, Some(sushy)) => format!(
                "redfish+http://{LAB_ADDRESS}:{}/redfish/v1/Systems/{}",
                sushy.port, machine.domain.uuid
            ),
            _ => String::new(),
        }
    }

    /// Applies the BMC Secret, the MachineConfiguration and one Machine per VM: the BMCs
    /// power the machines on.
    pub fn apply_machines(&mut self) -> Result<(), LabError> {
        use crate::scenario::LabAccess as _;
        let mut yaml = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: testbed-bmc, namespace: unbounded-bmc}}\n\
             stringData: {{username: {BMC_USER}, password: {BMC_PASSWORD}}}\n---\n{}",
            configuration_yaml("testbed", &self.artifacts)
        );
        for m in &self.machines {
            yaml.push_str(&format!(
                r#"---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata:
  name: {name}
  labels: {{{LAB_LABEL}: "true"}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["{mac}"]
    firmware: {firmware}
    {family}: {ip}{ip6}
    bmc:
      address: "{bmc}"
      credentialsSecretRef: {{namespace: unbounded-bmc, name: testbed-bmc}}
"#,
                name = m.name,
                mac = m.mac,
                firmware = if m.uefi { "uefi" } else { "bios" },
                ip = m.ip,
                family = if m.ip.contains(':') { "ipv6" } else { "ipv4" },
                ip6 = m
                    .ip6
                    .as_ref()
                    .map(|ip6| format!("\n    ipv6: {ip6}"))
                    .unwrap_or_default(),
                bmc = self.bmc_address(m),
            ));
        }
        self.kubectl(&["apply", "-f", "-"], Some(&yaml))?;
        Ok(())
    }
}

/// The kernel arguments of the lab's machines. `quiet`: the kernel's own log over an
/// emulated UART costs seconds; systemd still shows its progress.
pub const LAB_KERNEL_ARGS: [&str; 3] = ["console=ttyS0", "quiet", "systemd.show_status=true"];

/// The MachineConfiguration of the lab's machines.
pub fn configuration_yaml(name: &str, artifacts: &BootArtifacts) -> String {
    format!(
        r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: {name}}}
spec:
  machineSelector: {{matchLabels: {{{LAB_LABEL}: "true"}}}}
  template:
    boot:
      kernelURL: "{kernel}"
      initrdURL: "{initrd}"
      kernelArgs: [{kernel_args}]
    image: {{url: "{node}", sha256: {sha}}}
    kubernetes:
      version: {KUBERNETES_VERSION}
      nodeLabels: {{{LAB_LABEL}: "true"}}
    # Each lab VM has a TPM of its own (libvirt's swtpm); its endorsement key is taken on
    # its first attestation (a site would declare each Machine's instead).
    identity: {{mode: tpm, trustOnFirstUse: true}}
"#,
        kernel_args = LAB_KERNEL_ARGS.join(", "),
        kernel = artifacts.kernel_url,
        initrd = artifacts.initrd_url,
        node = artifacts.node_url,
        sha = artifacts.node_sha256,
    )
}

pub mod base;
pub mod discovery;
mod host_binaries;
mod logs;
pub mod running;
mod wait;

use base::step;
pub use base::{
    LAB_ADDRESS, LAB_ADDRESS6, LAB_API_PORT, LAB_LABEL, LAB_PREFIX6, LabError, Provisioning,
};
use host_binaries::start_host_binaries;
pub use running::RunningLab;
