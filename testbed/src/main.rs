//! `unbounded-testbed`: the main job (`up`: servers from power-off to Ready Nodes), its
//! day-2 scenarios, the images, and the local control plane alone (`cluster up|down`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use cli::bench::{bench_client, run_bench};
use cli::cluster::{cluster_api_binaries, cluster_down, cluster_up, kubernetes_binaries};
use cli::images::build_images;
use cli::lab::{UpOptions, down, serve, up};
use cli::scenario::run_scenario;
use unbounded_testbed::bench::{self};
use unbounded_testbed::cluster::ClusterError;
use unbounded_testbed::failure::Failure;
use unbounded_testbed::lab::{LabError, LabMode, LabOptions, Provisioning};
use unbounded_testbed::{images, setup};

mod cli;

#[derive(Parser, Debug)]
#[command(name = "unbounded-testbed", version, about = "Unbounded's testbed")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Build what is missing, start the control plane, the project as shipped (`deploy/`'s
    /// pods on an appliance VM, images from a local registry), emulated BMCs and QEMU VMs,
    /// and follow the VMs from power-off to Ready Nodes. Prints per-step and per-stage
    /// timing tables and `KUBECONFIG=<path>` as its last line; everything keeps running
    /// until `down`.
    Up {
        /// How many machines (BIOS through Redfish and UEFI through IPMI alternate).
        #[arg(long, default_value_t = 2)]
        machines: usize,
        /// Memory per VM, in MiB.
        #[arg(long, default_value_t = 1536)]
        memory: u32,
        /// How long one stage may take before `up` gives up and prints the logs.
        #[arg(long, default_value_t = 420)]
        stage_timeout: u64,
        /// Run the controller and the bootserver as binaries of the host instead of pods
        /// (fast development: no container images, no appliance VM).
        #[arg(long)]
        host_binaries: bool,
        /// Memory of the appliance VM, in MiB.
        #[arg(long, default_value_t = 2560)]
        appliance_memory: u32,
        /// Provision the machines over IPv6 only (DHCPv6, PXE over IPv6, the Node on its
        /// IPv6 address): every machine UEFI; needs --host-binaries (`scenario ipv6`).
        #[arg(long, requires = "host_binaries")]
        ipv6_only: bool,
        /// Provision over IPv4 as usual and give every machine its reserved IPv6 address
        /// by DHCPv6 too: Nodes on both families; needs --host-binaries.
        #[arg(long, requires = "host_binaries", conflicts_with = "ipv6_only")]
        dual_stack: bool,
    },
    /// Stop everything `up` started.
    Down,
    /// Run a day-2 scenario on the running testbed.
    Scenario {
        /// Which one.
        #[arg(value_enum)]
        name: ScenarioName,
        /// leader-failover only: the rolling update also adds `storage: {}`, so every
        /// machine paves onto its data disk (what CI's end to end runs).
        #[arg(long)]
        onto_disks: bool,
    },
    /// Build (once, cached) or locate the Kubernetes binaries and print their paths.
    KubernetesBinaries,
    /// Build (once, cached) or locate Cluster API's core manager and clusterctl and print
    /// their paths, then those of the module's manifests (`config/`) and `metadata.yaml`.
    ClusterApiBinaries,
    /// Build (or find cached) the host OS boot image, the node image and, with
    /// `--containers`, the container images (controller, bootserver, Azure provider, boot
    /// images; OCI layouts with SBOMs); prints what was built.
    Images {
        /// Also build the container images (a static release build of three binaries).
        #[arg(long)]
        containers: bool,
        /// Only the node image of this Kubernetes release (such as v1.34.4): its kubelet
        /// built from that release's Go modules, for a MachineConfiguration whose
        /// `kubernetes.version` is that release.
        #[arg(long, value_name = "VERSION", conflicts_with = "containers")]
        kubelet: Option<String>,
    },
    /// The local Kubernetes control plane alone.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Our bootserver against the servers people would otherwise use, in the same run
    /// (Kea, dnsmasq, tftpd-hpa, nginx, measured with perfdhcp, atftp and wrk in network
    /// namespaces this command creates), and the controller at scale. Prints a table and
    /// one `figure` line per number; writes a Markdown report, SVG charts and the figures
    /// into a folder it names.
    Bench {
        /// Which benchmark.
        #[arg(value_enum, default_value_t = BenchMode::All)]
        mode: BenchMode,
        /// A seconds-long run of every case (CI): small sizes, debug builds.
        #[arg(long)]
        smoke: bool,
        /// The report folder (default `~/.cache/unbounded/bench/<time>`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the results into the blocks of docs/benchmarks.md and its charts into
        /// docs/bench/ (not with --smoke).
        #[arg(long)]
        publish: bool,
        /// With `dhcp`: only the DHCPv6 cost rows (ours and Kea's kea-dhcp6), minutes
        /// instead of the whole DHCP benchmark (not with --publish).
        #[arg(long)]
        v6: bool,
    },
    /// (internal) Simulated clients of `bench`, run inside its client namespace.
    #[command(hide = true, subcommand)]
    BenchClient(BenchClientCommand),
    /// (internal) Run the lab in the foreground; `up` starts it in the background.
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        machines: usize,
        #[arg(long)]
        memory: u32,
        #[arg(long)]
        stage_timeout: u64,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        controller: PathBuf,
        #[arg(long)]
        bootserver: PathBuf,
        #[arg(long)]
        host_binaries: bool,
        #[arg(long)]
        appliance_memory: u32,
        #[arg(long)]
        ipv6_only: bool,
        #[arg(long)]
        dual_stack: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback, building
    /// them the first time, and apply `deploy/` and its examples. Prints `KUBECONFIG=<path>` last.
    Up,
    /// Stop exactly what `cluster up` started.
    Down,
}

#[derive(Subcommand, Debug)]
pub(crate) enum BenchClientCommand {
    /// PXE clients in waves.
    Storm(bench::clients::StormArgs),
    /// DORA for new clients for some seconds; prints the acknowledged leases.
    DhcpAcks(bench::clients::AcksArgs),
    /// DORA again for the clients acknowledged before a crash, and for fresh ones.
    DhcpCheck(bench::clients::CheckArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BenchMode {
    /// DHCP knee and cost (perfdhcp) against Kea and dnsmasq, DHCPv6 cost against Kea;
    /// ours through kill -9.
    Dhcp,
    /// TFTP (atftp) against tftpd-hpa and dnsmasq.
    Tftp,
    /// HTTP (wrk) against nginx.
    Http,
    /// 1,000 simulated PXE clients against ours.
    Storm,
    /// Our pair of bootservers against Kea's HA hot-standby pair (CPU per DORA of both
    /// servers), and ours through a kill -9 of one mid-storm.
    Pair,
    /// The controller with 10,000 Machines; the PXE provider with 1,000.
    Controller,
    /// Everything.
    All,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ScenarioName {
    /// Delete a Node: the machine repaves with the same version and joins again.
    Repave,
    /// A new version on one machine (pinned, Node deleted), then back to the old one.
    Rollback,
    /// reboot, restartService kubelet, powerCycle by selector.
    Operations,
    /// All three, in that order.
    All,
    /// A MachinePool over the lab's machines (best with `up --machines 3`): claim, roll to a
    /// new version one machine at a time, scale down releasing the annotated machine,
    /// remediate a machine that died, then release everything and boot it again.
    Pool,
    /// A rolling update of the lab's configuration; the leading controller pod is deleted in
    /// its middle: the other replica takes over, the rollout completes, one version made.
    LeaderFailover,
    /// A machine reboots into a network boot; right after its boot script the bootserver
    /// moves to a new image: leases kept, the boot completes.
    BootserverRestart,
    /// The node's state on the machines' data disks: a reboot from RAM (baseline), storage
    /// added and paved onto a blank disk, a reboot that starts the container from the disk.
    Disks,
    /// `kubectl unbounded` against the lab (build it first: `cargo build -p
    /// kubectl-unbounded`; or name it with UNBOUNDED_KUBECTL_PLUGIN): status, reboot,
    /// rollback, logs, and console through ipmi_sim's SOL during a reboot.
    Plugin,
    /// Two VMs nobody declared (different shapes, SMBIOS serials) become discovered Machines
    /// with their inventory and hardware labels; given their BMCs, a MachinePool requiring 2
    /// CPUs claims only the larger, which becomes a Ready Node.
    Discovery,
    /// `applyConfiguration` on the first machine: a label and a file (containerd restarted)
    /// in place with the Node, its UID and both boot IDs unchanged; then a removed file,
    /// which needs a repave: refused without `disruptive`, carried out with it.
    InPlace,
    /// The lab's machines rolled (RollingUpdate, maxUnavailable 1) to the node image and
    /// `kubernetes.version` of another release (v1.34.4; its kubelet built from its Go
    /// modules the first time), each Node's kubelet checked, then back by pinning (a lab
    /// started with `up --host-binaries`).
    Kubelet,
    /// Unbounded as a Cluster API provider on the lab's VMs (`up --machines 3`): the provider
    /// turned on, Cluster API's core manager on the host, a MachineDeployment of 2 claims
    /// machines to Running (`clusterctl describe`), scales to 1 (a release), rolls one
    /// machine at a time onto another Kubernetes release (v1.34.4), a MachineHealthCheck
    /// replaces a machine shut down; then everything released and booted again.
    Capi,
    /// On a lab started with `up --host-binaries --ipv6-only` (or `--dual-stack`): every
    /// Node Ready on exactly its Machine's reserved addresses, DHCPv6 on the bridge (and no
    /// DHCPv4 when IPv6-only), then a reboot of the first machine back to Ready on them.
    Ipv6,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::Up {
            machines,
            memory,
            stage_timeout,
            host_binaries,
            appliance_memory,
            ipv6_only,
            dual_stack,
        } => up(UpOptions {
            machines,
            memory,
            stage_timeout,
            host_binaries,
            appliance_memory,
            ipv6_only,
            dual_stack,
        }),
        Commands::Serve {
            machines,
            memory,
            stage_timeout,
            dir,
            controller,
            bootserver,
            host_binaries,
            appliance_memory,
            ipv6_only,
            dual_stack,
        } => serve(LabOptions {
            machines,
            memory_mib: memory,
            dir,
            controller,
            bootserver,
            mode: if host_binaries {
                LabMode::HostBinaries
            } else {
                LabMode::Pods
            },
            appliance_memory_mib: appliance_memory,
            stage_timeout: Duration::from_secs(stage_timeout),
            provisioning: match (ipv6_only, dual_stack) {
                (true, _) => Provisioning::Ipv6Only,
                (false, true) => Provisioning::DualStack,
                (false, false) => Provisioning::Ipv4,
            },
        }),
        Commands::Down => down(),
        Commands::Scenario { name, onto_disks } => run_scenario(name, onto_disks),
        Commands::Cluster {
            command: ClusterCommand::Up,
        } => cluster_up(),
        Commands::Cluster {
            command: ClusterCommand::Down,
        } => cluster_down(),
        Commands::KubernetesBinaries => kubernetes_binaries(),
        Commands::ClusterApiBinaries => cluster_api_binaries(),
        Commands::Images {
            containers,
            kubelet,
        } => build_images(containers, kubelet.as_deref()),
        Commands::Bench {
            mode,
            smoke,
            out,
            publish,
            v6,
        } => run_bench(mode, smoke, out, publish, v6),
        Commands::BenchClient(command) => bench_client(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("unbounded-testbed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error(transparent)]
    Setup(#[from] setup::SetupError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Images(#[from] images::ImagesError),
    #[error(transparent)]
    Lab(#[from] LabError),
    #[error("{0}")]
    Other(String),
    #[error(transparent)]
    Failed(#[from] Failure),
}
