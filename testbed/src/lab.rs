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
//! Everything is owned by [`Lab`] and stopped when it is dropped (processes die with the
//! thread that started them, too).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::appliance::{Appliance, ApplianceOptions, BootArtifacts, PodsInfo};
use crate::bmc::{self, Domain, DomainOptions, IpmiSim, Libvirtd, SushyEmulator};
use crate::cluster::{KUBERNETES_VERSION, Lifetime, LocalControlPlane, PlaneOptions};
use crate::images::Images;
use crate::netns::{LoopbackForward, Netns};
use crate::process::{Process, tail_text};
use crate::progress::{self, Stage, Timeline};

/// The bootserver's (and the API server's, for the VMs) address on the provisioning bridge.
pub const LAB_ADDRESS: &str = "10.99.0.1";
/// The API server's port as the VMs reach it.
pub const LAB_API_PORT: u16 = 6443;
/// The label every lab Machine carries (the configuration selects by it).
pub const LAB_LABEL: &str = "unbounded-cloud.io/testbed";
/// The BMC user and password of the emulators (test credentials, in a Secret).
const BMC_USER: &str = "admin";
// At most 16 characters: IPMI 1.5 and some BMCs (ipmi_sim among them) stop there.
const BMC_PASSWORD: &str = "tb-bmc-s3cret";

/// Errors of the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A step failed.
    #[error("{0}")]
    Step(String),
    /// A machine did not reach a stage in time.
    #[error(
        "{machine} did not reach {stage} within {seconds} s (last: {last}); console tail:\n{console}\n{logs}"
    )]
    Timeout {
        /// The machine.
        machine: String,
        /// The stage waited for.
        stage: &'static str,
        /// How long.
        seconds: u64,
        /// The last stage it reached.
        last: &'static str,
        /// The tail of its serial console.
        console: String,
        /// Tails of the components' logs.
        logs: String,
    },
}

fn step(message: impl Into<String>) -> LabError {
    LabError::Step(message.into())
}

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
    /// Its reserved address.
    pub ip: String,
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
}

/// The project's components as the lab runs them.
#[derive(Debug)]
enum Components {
    /// The controller and the bootserver as processes of the host.
    HostBinaries {
        controller: Process,
        bootserver: Process,
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
    /// The control plane.
    pub plane: LocalControlPlane,
    _ns: Netns,
    /// Where logs and generated files are.
    pub dir: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// When each machine was powered on (the provider's first power-on seen).
    powered_on: BTreeMap<String, Instant>,
    /// Where the machines get their boot artifacts.
    artifacts: BootArtifacts,
}

fn write(path: &Path, content: &str) -> Result<(), LabError> {
    fs::write(path, content).map_err(|e| step(format!("writing {}: {e}", path.display())))
}

impl Lab {
    /// Starts everything except the Machines (see [`Lab::apply_machines`]).
    pub fn start(
        options: &LabOptions,
        images: &Images,
        say: &dyn Fn(&str),
    ) -> Result<Self, LabError> {
        fs::create_dir_all(&options.dir)
            .map_err(|e| step(format!("{}: {e}", options.dir.display())))?;
        say("provisioning network: namespace with bridge br0 (10.99.0.1/24)");
        let ns = Netns::new("ubtb").map_err(|e| step(e.to_string()))?;
        for args in [
            &["link", "add", "br0", "type", "bridge"][..],
            &["addr", "add", "10.99.0.1/24", "dev", "br0"],
            &["link", "set", "br0", "up"],
        ] {
            ns.ip(args).map_err(|e| step(e.to_string()))?;
        }

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
        .map_err(|e| step(e.to_string()))?;
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
        .map_err(|e| step(e.to_string()))?;
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
        let libvirtd = Libvirtd::start(&ns).map_err(|e| step(e.to_string()))?;
        let sushy = SushyEmulator::start_bound(Some(&ns), LAB_ADDRESS, BMC_USER, BMC_PASSWORD)
            .map_err(|e| step(e.to_string()))?;

        say(&format!("{} VMs with their BMCs", options.machines));
        let pid = std::process::id();
        let mut machines = Vec::new();
        for i in 1..=options.machines {
            let uefi = i % 2 == 0;
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
                },
            )
            .map_err(|e| step(e.to_string()))?;
            let ipmi = match bmc {
                BmcKind::Ipmi => Some(
                    IpmiSim::start_bound(
                        Some(&ns),
                        LAB_ADDRESS,
                        &domain.name,
                        BMC_USER,
                        BMC_PASSWORD,
                    )
                    .map_err(|e| step(e.to_string()))?,
                ),
                BmcKind::Redfish => None,
            };
            machines.push(LabMachine {
                ip: format!("10.99.0.{}", 20 + i),
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
            plane,
            _ns: ns,
            dir: options.dir.clone(),
            kubeconfig,
            powered_on: BTreeMap::new(),
            artifacts,
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

    /// The tails of the components' logs.
    pub fn logs(&self) -> String {
        let mut out = match &self.components {
            Components::HostBinaries {
                controller,
                bootserver,
            } => vec![bootserver.tail(40), controller.tail(30)],
            Components::Pods(appliance) => {
                let mut out = vec![
                    format!(
                        "--- pods of unbounded-system:\n{}",
                        crate::appliance::pod_summary(&self.plane)
                    ),
                    appliance.console_tail(20),
                ];
                for (pod, lines) in self.pod_logs(40) {
                    out.push(format!("--- pod {pod}:\n{}", tail_text(&lines, 40)));
                }
                out
            }
        };
        out.push(format!(
            "--- libvirtd:\n{}",
            tail_text(&self.libvirtd.log(), 10)
        ));
        if let Some(s) = &self.sushy {
            out.push(format!("--- sushy-emulator:\n{}", tail_text(&s.log(), 10)));
        }
        out.join("\n")
    }

    /// `(pod, log)` of every pod of the project's namespace (all containers; the last
    /// `lines` lines, or all with 0), through the API server and the kubelets.
    fn pod_logs(&self, lines: usize) -> Vec<(String, String)> {
        use crate::scenario::LabAccess as _;
        let pods = self
            .kubectl(
                &[
                    "get",
                    "pods",
                    "-n",
                    crate::appliance::SYSTEM_NAMESPACE,
                    "-o",
                    "jsonpath={.items[*].metadata.name}",
                ],
                None,
            )
            .unwrap_or_default();
        let tail = if lines == 0 {
            "-1".to_owned()
        } else {
            lines.to_string()
        };
        pods.split_whitespace()
            .map(|pod| {
                let log = self
                    .kubectl(
                        &[
                            "logs",
                            "-n",
                            crate::appliance::SYSTEM_NAMESPACE,
                            pod,
                            "--all-containers",
                            "--tail",
                            &tail,
                        ],
                        None,
                    )
                    .unwrap_or_else(|e| format!("(no log: {e})"));
                (pod.to_owned(), log)
            })
            .collect()
    }

    /// Every secret or credential that a component's log or a machine's console shows: the
    /// BMC password, a token, a bootstrap token (`leaks::find`), as `file:line: what`.
    pub fn secret_leaks(&self) -> Vec<String> {
        let mut files: Vec<PathBuf> = match &self.components {
            Components::HostBinaries {
                controller,
                bootserver,
            } => vec![
                bootserver.log_path().to_path_buf(),
                controller.log_path().to_path_buf(),
            ],
            Components::Pods(appliance) => appliance.logs(),
        };
        files.extend(self.machines.iter().map(|m| m.domain.console_path()));
        let mut texts: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|f| (f.display().to_string(), fs::read(f).unwrap_or_default()))
            .collect();
        if matches!(self.components, Components::Pods(_)) {
            texts.extend(
                self.pod_logs(0)
                    .into_iter()
                    .map(|(pod, log)| (format!("pod {pod}"), log.into_bytes())),
            );
        }
        texts.push(("libvirtd".into(), self.libvirtd.log().into_bytes()));
        if let Some(s) = &self.sushy {
            texts.push(("sushy-emulator".into(), s.log().into_bytes()));
        }
        texts.extend(self.machines.iter().filter_map(|m| {
            m.ipmi
                .as_ref()
                .map(|sim| (format!("ipmi_sim {}", m.name), sim.log().into_bytes()))
        }));
        texts
            .iter()
            .flat_map(|(name, text)| {
                crate::leaks::find(text, &[BMC_PASSWORD])
                    .into_iter()
                    .map(move |leak| format!("{name}:{}: {}", leak.line, leak.what))
            })
            .collect()
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
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: testbed-bmc, namespace: unbounded-system}}\n\
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
    ipv4: {ip}
    bmc:
      address: "{bmc}"
      credentialsSecretRef: {{namespace: unbounded-system, name: testbed-bmc}}
"#,
                name = m.name,
                mac = m.mac,
                firmware = if m.uefi { "uefi" } else { "bios" },
                ip = m.ip,
                bmc = self.bmc_address(m),
            ));
        }
        self.kubectl(&["apply", "-f", "-"], Some(&yaml))?;
        Ok(())
    }

    /// Follows every machine until its Node is Ready, printing each stage as it is reached;
    /// a stage that takes longer than `stage_timeout` fails with the console and log tails.
    pub fn wait_ready(
        &mut self,
        stage_timeout: Duration,
        say: &dyn Fn(&str),
    ) -> Result<Vec<(String, Timeline)>, LabError> {
        let mut timelines: Vec<(String, Timeline)> = self
            .machines
            .iter()
            .map(|m| (m.name.clone(), Timeline::default()))
            .collect();
        let mut last_progress: Vec<Instant> = vec![Instant::now(); self.machines.len()];
        let mut reasons: BTreeMap<String, String> = BTreeMap::new();
        loop {
            if let Some(message) = self.component_exited() {
                return Err(step(format!("{message}\n{}", self.logs())));
            }
            let nodes = self.nodes();
            let mut all_ready = true;
            for (i, m) in self.machines.iter().enumerate() {
                let timeline = &mut timelines[i].1;
                let on = self
                    .powered_on
                    .get(&m.name)
                    .copied()
                    .or_else(|| (m.domain.state() == "running").then(Instant::now));
                let Some(on) = on else {
                    all_ready = false;
                    if last_progress[i].elapsed() > stage_timeout {
                        return Err(self.timeout(m, Stage::PoweredOn, timeline, stage_timeout));
                    }
                    continue;
                };
                self.powered_on.entry(m.name.clone()).or_insert(on);
                let mut stages = vec![Stage::PoweredOn];
                stages.extend(progress::console_stages(&m.domain.console()));
                match nodes.get(&m.name) {
                    Some((true, _)) => stages.extend([Stage::NodeRegistered, Stage::Ready]),
                    Some((false, message)) => {
                        stages.push(Stage::NodeRegistered);
                        // Why it is not Ready yet, each time kubelet says something new.
                        if reasons.get(&m.name) != Some(message) && !message.is_empty() {
                            say(&format!("{:<12} not Ready yet: {message}", m.name));
                            reasons.insert(m.name.clone(), message.clone());
                        }
                    }
                    None => {}
                }
                for stage in stages {
                    if timeline.record(stage, on.elapsed()) {
                        last_progress[i] = Instant::now();
                        say(&format!(
                            "{:<12} {:<16} {:>6.1} s",
                            m.name,
                            stage.label(),
                            on.elapsed().as_secs_f64()
                        ));
                    }
                }
                if timeline.at(Stage::Ready).is_none() {
                    all_ready = false;
                    if last_progress[i].elapsed() > stage_timeout {
                        let next = Stage::ALL
                            .iter()
                            .copied()
                            .find(|s| timeline.at(*s).is_none())
                            .unwrap_or(Stage::Ready);
                        return Err(self.timeout(m, next, timeline, stage_timeout));
                    }
                }
            }
            if all_ready {
                return Ok(timelines);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn timeout(
        &self,
        m: &LabMachine,
        stage: Stage,
        timeline: &Timeline,
        limit: Duration,
    ) -> LabError {
        LabError::Timeout {
            machine: m.name.clone(),
            stage: stage.label(),
            seconds: limit.as_secs(),
            last: timeline.last().map_or("none", Stage::label),
            console: tail_text(&m.domain.console(), 60),
            logs: self.logs(),
        }
    }

    /// Node name → (Ready, the Ready condition's message), for every Node.
    pub fn nodes(&self) -> BTreeMap<String, (bool, String)> {
        use crate::scenario::LabAccess as _;
        let out = self
            .kubectl(
                &[
                    "get",
                    "nodes",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}\t{.status.conditions[?(@.type==\"Ready\")].status}\t{.status.conditions[?(@.type==\"Ready\")].message}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, '\t');
                let name = parts.next()?;
                let ready = parts.next()? == "True";
                let message = parts.next().unwrap_or_default();
                Some((name.to_owned(), (ready, message.to_owned())))
            })
            .collect()
    }
}

impl crate::scenario::LabAccess for Lab {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
        kubectl(&self.plane, args, stdin)
    }

    fn machine_names(&self) -> Vec<String> {
        self.machines.iter().map(|m| m.name.clone()).collect()
    }

    fn console(&self, machine: &str) -> String {
        self.machines
            .iter()
            .find(|m| m.name == machine)
            .map(|m| m.domain.console())
            .unwrap_or_default()
    }

    fn pods(&self) -> Option<PodsInfo> {
        self.appliance().map(|a| a.info.clone())
    }
}

/// What `testbed up` records about the lab it left running (`<cache>/testbed/state.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunningLab {
    /// The supervising process (`unbounded-testbed serve`).
    pub pid: u32,
    /// Its executable, to check the pid still is it.
    pub exe: PathBuf,
    /// Logs and generated files.
    pub dir: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
    /// `(machine, serial console file)`.
    pub machines: Vec<(String, PathBuf)>,
    /// What a lab running the pods offers scenarios (absent for host binaries).
    #[serde(default)]
    pub pods: Option<PodsInfo>,
}

impl RunningLab {
    /// Where it is recorded.
    pub fn state_path() -> PathBuf {
        crate::cluster::cache_dir().join("testbed/state.json")
    }

    /// The recorded lab, if its supervisor still runs.
    pub fn load() -> Option<Self> {
        let text = fs::read_to_string(Self::state_path()).ok()?;
        let lab: Self = serde_json::from_str(&text).ok()?;
        let running = fs::read_link(format!("/proc/{}/exe", lab.pid)).ok()?;
        // A rebuilt binary shows as "<path> (deleted)" for the process still running it.
        let running = running.to_string_lossy();
        let running = running.strip_suffix(" (deleted)").unwrap_or(&running);
        (Path::new(running) == lab.exe.as_path()).then_some(lab)
    }

    /// Records it.
    pub fn save(&self) -> Result<(), LabError> {
        let path = Self::state_path();
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| step(e.to_string()))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| step(e.to_string()))?;
        write(&path, &text)
    }
}

impl crate::scenario::LabAccess for RunningLab {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
        let mut command = Command::new(&self.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        run_kubectl(command, args, stdin)
    }

    fn machine_names(&self) -> Vec<String> {
        self.machines.iter().map(|(n, _)| n.clone()).collect()
    }

    fn console(&self, machine: &str) -> String {
        self.machines
            .iter()
            .find(|(n, _)| n == machine)
            .and_then(|(_, path)| fs::read(path).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn pods(&self) -> Option<PodsInfo> {
        self.pods.clone()
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
"#,
        kernel_args = LAB_KERNEL_ARGS.join(", "),
        kernel = artifacts.kernel_url,
        initrd = artifacts.initrd_url,
        node = artifacts.node_url,
        sha = artifacts.node_sha256,
    )
}

/// The controller and the bootserver binaries as `deploy/` runs them, each with its own
/// ServiceAccount's token and `deploy/`'s RBAC: the bootserver in the namespace, on the
/// bridge; the controller on the host. The boot artifacts are served from the bootserver's
/// image directory (links to the image cache).
fn start_host_binaries(
    options: &LabOptions,
    ns: &Netns,
    plane: &LocalControlPlane,
    images: &Images,
    say: &dyn Fn(&str),
) -> Result<Components, LabError> {
    say("applying deploy/ (CRDs, policies, RBAC, Deployments)");
    kubectl(
        plane,
        &[
            "apply",
            "--server-side",
            "-k",
            &crate::cluster::deploy_dir().display().to_string(),
        ],
        None,
    )?;
    let ca = plane.data_dir().join("pki/ca.crt");
    let controller_kubeconfig = options.dir.join("controller.kubeconfig");
    let bootserver_kubeconfig = options.dir.join("bootserver.kubeconfig");
    write(
        &controller_kubeconfig,
        &service_account_kubeconfig(plane, "unbounded-controller", plane.server_url(), &ca)?,
    )?;
    write(
        &bootserver_kubeconfig,
        &service_account_kubeconfig(
            plane,
            "unbounded-bootserver",
            &format!("https://{LAB_ADDRESS}:{LAB_API_PORT}"),
            &ca,
        )?,
    )?;
    let images_dir = options.dir.join("images");
    fs::create_dir_all(&images_dir).map_err(|e| step(e.to_string()))?;
    for (name, source) in [
        ("vmlinuz", &images.host.kernel),
        ("initrd.img", &images.host.initrd),
        ("node.tar.zst", &images.node.archive),
    ] {
        let link = images_dir.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(source, &link)
            .map_err(|e| step(format!("linking {name}: {e}")))?;
    }

    say("bootserver (Kubernetes backend, full DHCP, router advertisements, agent credentials)");
    let config = options.dir.join("bootserver.yaml");
    write(&config, &bootserver_config(&options.dir, &images_dir, &ca))?;
    let bootserver = Process::spawn(
        "bootserver",
        Some(ns),
        &options.bootserver,
        &[
            "--config".into(),
            config.display().to_string(),
            // Elects the PXE provider as in a cluster (deploy/'s RBAC allows its Lease).
            "--leader-election-identity".into(),
            "testbed-bootserver".into(),
        ],
        &[
            ("KUBECONFIG", bootserver_kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("bootserver.log"),
    )?;
    say("controller");
    let metrics_port = bmc::free_port(false).map_err(|e| step(e.to_string()))?;
    let controller = Process::spawn(
        "controller",
        None,
        &options.controller,
        &[
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--leader-election-identity".into(),
            "testbed".into(),
        ],
        &[
            ("KUBECONFIG", controller_kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("controller.log"),
    )?;
    Ok(Components::HostBinaries {
        controller,
        bootserver,
    })
}

fn bootserver_config(dir: &Path, images: &Path, ca: &Path) -> String {
    format!(
        r#"interface: br0
serverAddress: {LAB_ADDRESS}
routerAdvertisements: true
backend: kubernetes
dhcp:
  mode: full
  leaseFile: "{dir}/leases.log"
  subnets:
    - subnet: 10.99.0.0/24
      pool: [10.99.0.100, 10.99.0.199]
      gateway: {LAB_ADDRESS}
      leaseSeconds: 3600
tftp: {{root: /usr/lib/ipxe}}
http: {{port: 8080, imagesDir: "{images}"}}
power: {{enabled: true, pollSeconds: 10}}
credentials:
  apiServer: https://{LAB_ADDRESS}:{LAB_API_PORT}
  caFile: "{ca}"
  nonceFile: "{dir}/nonces.json"
"#,
        dir = dir.display(),
        images = images.display(),
        ca = ca.display(),
    )
}

fn kubectl(
    plane: &LocalControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    run_kubectl(plane.kubectl(), args, stdin)
}

fn run_kubectl(command: Command, args: &[&str], stdin: Option<&str>) -> Result<String, LabError> {
    crate::cluster::run_kubectl(command, args, stdin).map_err(|e| step(e.to_string()))
}

/// A kubeconfig for a ServiceAccount of `unbounded-system`, with a token that does not
/// expire while the lab runs (a ServiceAccount token Secret, filled by the token controller).
pub(crate) fn service_account_kubeconfig(
    plane: &LocalControlPlane,
    account: &str,
    server: &str,
    ca: &Path,
) -> Result<String, LabError> {
    let secret = format!("{account}-testbed-token");
    kubectl(
        plane,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {secret}\n  namespace: unbounded-system\n  \
             annotations: {{kubernetes.io/service-account.name: {account}}}\ntype: kubernetes.io/service-account-token\n"
        )),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let token = loop {
        let encoded = kubectl(
            plane,
            &[
                "get",
                "secret",
                "-n",
                "unbounded-system",
                &secret,
                "-o",
                "jsonpath={.data.token}",
            ],
            None,
        )
        .unwrap_or_default();
        if !encoded.is_empty() {
            let out = Command::new("base64")
                .arg("-d")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    if let Some(mut i) = c.stdin.take() {
                        i.write_all(encoded.as_bytes())?;
                    }
                    c.wait_with_output()
                })
                .map_err(|e| step(format!("base64: {e}")))?;
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        if Instant::now() > deadline {
            return Err(step(format!("the token controller did not fill {secret}")));
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {account}\n\
         current-context: lab\n",
        ca = ca.display()
    ))
}
