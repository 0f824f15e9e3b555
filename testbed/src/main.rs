//! `unbounded-testbed`: the main job (`up`: servers from power-off to Ready Nodes), its
//! day-2 scenarios, the images, and the local control plane alone (`cluster up|down`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use unbounded_testbed::bench::suite::{self, Mode};
use unbounded_testbed::bench::{self, report::Report, scale};
use unbounded_testbed::cluster::{self, ClusterError, KUBERNETES_VERSION};
use unbounded_testbed::lab::{Lab, LabError, LabMode, LabOptions, RunningLab};
use unbounded_testbed::{appliance_scenarios, images, progress, scenario, setup};

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
    },
    /// Stop everything `up` started.
    Down,
    /// Run a day-2 scenario on the running testbed.
    Scenario {
        /// Which one.
        #[arg(value_enum)]
        name: ScenarioName,
    },
    /// Build (once, cached) or locate the Kubernetes binaries and print their paths.
    KubernetesBinaries,
    /// Build (or find cached) the host OS boot image, the node image and, with
    /// `--containers`, the container images (controller, bootserver, Azure provider, boot
    /// images; OCI layouts with SBOMs); prints what was built.
    Images {
        /// Also build the container images (a static release build of three binaries).
        #[arg(long)]
        containers: bool,
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
enum BenchClientCommand {
    /// PXE clients in waves.
    Storm(bench::clients::StormArgs),
    /// DORA for new clients for some seconds; prints the acknowledged leases.
    DhcpAcks(bench::clients::AcksArgs),
    /// DORA again for the clients acknowledged before a crash, and for fresh ones.
    DhcpCheck(bench::clients::CheckArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchMode {
    /// DHCP knee (perfdhcp) against Kea and dnsmasq; ours through kill -9.
    Dhcp,
    /// TFTP (atftp) against tftpd-hpa and dnsmasq.
    Tftp,
    /// HTTP (wrk) against nginx.
    Http,
    /// 1,000 simulated PXE clients against ours.
    Storm,
    /// The controller with 10,000 Machines; the PXE provider with 1,000.
    Controller,
    /// Everything.
    All,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScenarioName {
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
        } => up(UpOptions {
            machines,
            memory,
            stage_timeout,
            host_binaries,
            appliance_memory,
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
        }),
        Commands::Down => down(),
        Commands::Scenario { name } => run_scenario(name),
        Commands::Cluster {
            command: ClusterCommand::Up,
        } => cluster_up(),
        Commands::Cluster {
            command: ClusterCommand::Down,
        } => cluster_down(),
        Commands::KubernetesBinaries => kubernetes_binaries(),
        Commands::Images { containers } => build_images(containers),
        Commands::Bench {
            mode,
            smoke,
            out,
            publish,
        } => run_bench(mode, smoke, out, publish),
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
enum CliError {
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
}

fn run_bench(
    mode: BenchMode,
    smoke: bool,
    out: Option<PathBuf>,
    publish: bool,
) -> Result<(), CliError> {
    if publish && smoke {
        return Err(CliError::Other(
            bench::publish::PublishError::Smoke.to_string(),
        ));
    }
    let modes: Vec<Mode> = match mode {
        BenchMode::Dhcp => vec![Mode::Dhcp],
        BenchMode::Tftp => vec![Mode::Tftp],
        BenchMode::Http => vec![Mode::Http],
        BenchMode::Storm => vec![Mode::Storm],
        BenchMode::Controller => vec![Mode::Controller],
        BenchMode::All => Mode::ALL.to_vec(),
    };
    let started = suite::timestamp();
    let out = out.unwrap_or_else(suite::default_out);
    let work = out.join("run");
    std::fs::create_dir_all(&work)
        .map_err(|e| CliError::Other(format!("{}: {e}", work.display())))?;
    let command = format!(
        "unbounded-testbed bench {}{}",
        modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(" "),
        if smoke { " --smoke" } else { "" }
    );
    let say = |line: String| eprintln!("bench: {line}");
    say(format!("report folder: {}", out.display()));
    // Stopped by a signal, no destructor runs: the namespaces would outlive the run. (The
    // servers and clients inside them die with this process: PR_SET_PDEATHSIG.)
    std::thread::spawn(|| {
        if wait_for_termination() {
            eprintln!("bench: stopped by a signal; deleting its network namespaces");
            unbounded_testbed::netns::delete_all_live();
            std::process::exit(130);
        }
    });
    let mut report = Report::default();
    let mut charts = Vec::new();
    let network = if smoke {
        suite::NetworkOptions::smoke()
    } else {
        suite::NetworkOptions::full()
    };
    let result = suite::run_network(&modes, &network, &work, &mut report, &mut charts, &say)
        .and_then(|()| {
            if !modes.contains(&Mode::Controller) {
                return Ok(());
            }
            let options = if smoke {
                scale::ScaleOptions::smoke()
            } else {
                scale::ScaleOptions::full()
            };
            say("== controller".into());
            suite::with_load(Mode::Controller, &mut report, |report| {
                scale::run(&options, &work, report, &say)
            })
        });
    if let Err(error) = &result {
        report.problem(format!("the run stopped: {error}"));
    }
    let mut chart_names = Vec::new();
    for (name, svg) in &charts {
        std::fs::write(out.join(name), svg)
            .map_err(|e| CliError::Other(format!("writing {name}: {e}")))?;
        chart_names.push(name.clone());
    }
    let markdown = report.markdown(&suite::header(&command, &started), &chart_names);
    std::fs::write(out.join("report.md"), &markdown)
        .map_err(|e| CliError::Other(format!("writing report.md: {e}")))?;
    std::fs::write(
        out.join("figures.txt"),
        report.figure_lines().join("\n") + "\n",
    )
    .map_err(|e| CliError::Other(format!("writing figures.txt: {e}")))?;
    println!("{}", suite::header(&command, &started));
    print!("{}", report.table());
    for note in &report.notes {
        println!("- {note}");
    }
    for line in report.figure_lines() {
        println!("{line}");
    }
    println!("report: {}", out.join("report.md").display());
    result.map_err(|e| CliError::Other(e.to_string()))?;
    if publish {
        let provenance = bench::publish::Provenance::here(&command, &started);
        let written = bench::publish::publish(
            &bench::publish::default_page(),
            &modes,
            &report,
            &charts,
            &provenance,
        )
        .map_err(|e| CliError::Other(e.to_string()))?;
        for path in written {
            println!("published: {}", path.display());
        }
    }
    if let Some(first) = report.problems.first() {
        return Err(CliError::Other(format!(
            "{} problem(s), the first: {first}",
            report.problems.len()
        )));
    }
    Ok(())
}

fn bench_client(command: BenchClientCommand) -> Result<(), CliError> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| CliError::Other(e.to_string()))?;
    let json = match command {
        BenchClientCommand::Storm(args) => runtime
            .block_on(bench::clients::storm(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
        BenchClientCommand::DhcpAcks(args) => runtime
            .block_on(bench::clients::acks(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
        BenchClientCommand::DhcpCheck(args) => runtime
            .block_on(bench::clients::check(args))
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
    }
    .map_err(CliError::Other)?;
    println!("{json}");
    Ok(())
}

fn testbed_dir() -> PathBuf {
    cluster::cache_dir().join("testbed")
}

/// What `up` was asked for.
struct UpOptions {
    machines: usize,
    memory: u32,
    stage_timeout: u64,
    host_binaries: bool,
    appliance_memory: u32,
}

fn up(options: UpOptions) -> Result<(), CliError> {
    let UpOptions {
        machines,
        memory,
        stage_timeout,
        host_binaries,
        appliance_memory,
    } = options;
    if machines == 0 {
        return Err(CliError::Other("--machines must be at least 1".into()));
    }
    eprintln!("testbed: checking packages");
    setup::install_dependencies()?;
    if RunningLab::load().is_some() {
        eprintln!("testbed: a testbed is running; stopping it first");
        down()?;
    }
    if host_binaries {
        eprintln!("testbed: images (host OS, node)");
    } else {
        eprintln!("testbed: images (host OS, node, and the project's container images)");
    }
    images::build(&images::Options {
        containers: !host_binaries,
    })?;
    eprintln!("testbed: building the controller and the bootserver");
    let binaries = images::cargo_build(
        &["unbounded-controller", "unbounded-bootserver"],
        &["unbounded-controller", "unbounded-bootserver"],
        false,
        false,
    )?;
    let (Some(controller), Some(bootserver)) = (binaries.first(), binaries.get(1)) else {
        return Err(CliError::Other(
            "cargo built no controller or bootserver".into(),
        ));
    };
    let dir = testbed_dir().join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::Other(format!("{}: {e}", dir.display())))?;
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).map_err(|e| CliError::Other(e.to_string()))?;
    let err = log
        .try_clone()
        .map_err(|e| CliError::Other(e.to_string()))?;
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    // The lab lives in a process of its own (a new session), so that it outlives `up`.
    let mut child = Command::new("setsid")
        .arg(&exe)
        .args(["serve", "--machines", &machines.to_string()])
        .args(["--memory", &memory.to_string()])
        .args(["--stage-timeout", &stage_timeout.to_string()])
        .args(["--appliance-memory", &appliance_memory.to_string()])
        .args(host_binaries.then_some("--host-binaries"))
        .arg("--dir")
        .arg(&dir)
        .arg("--controller")
        .arg(controller)
        .arg("--bootserver")
        .arg(bootserver)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| CliError::Other(format!("starting the lab: {e}")))?;
    // Follow its log until it says it is ready or failed.
    let mut reader =
        BufReader::new(std::fs::File::open(&log_path).map_err(|e| CliError::Other(e.to_string()))?);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| CliError::Other(e.to_string()))?;
        if n == 0 || !line.ends_with('\n') {
            if !line.is_empty() {
                // A half-written line: read it again from its start.
                let _ = reader.seek_relative(-(line.len() as i64));
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(CliError::Other(format!(
                    "the lab stopped ({status}); its log is {}",
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let text = line.trim_end();
        if let Some(kubeconfig) = text.strip_prefix("testbed: READY ") {
            eprintln!("testbed: stop it with `cargo run -p unbounded-testbed -- down`");
            eprintln!(
                "testbed: kubectl {KUBERNETES_VERSION} is {}",
                kubectl_path()?.display()
            );
            println!("KUBECONFIG={kubeconfig}");
            return Ok(());
        }
        if text.starts_with("testbed: FAILED") {
            let _ = child.wait();
            return Err(CliError::Other(format!(
                "the lab failed; its log is {}",
                log_path.display()
            )));
        }
        eprintln!("{text}");
    }
}

fn kubectl_path() -> Result<PathBuf, CliError> {
    Ok(cluster::Binaries::ensure()?.kubectl)
}

/// Runs the lab in this process until SIGTERM or SIGINT.
fn serve(options: LabOptions) -> Result<(), CliError> {
    let say = |m: &str| eprintln!("testbed: {m}");
    let started = Instant::now();
    let result = (|| -> Result<Lab, CliError> {
        let mut images = images::cached()?;
        if options.mode == LabMode::Pods {
            images.containers = Some(images::cached_containers()?);
        }
        let mut lab = Lab::start(&options, &images, &say)?;
        let lab_started = started.elapsed();
        lab.apply_machines()?;
        say("MachineConfiguration and Machines applied; following the machines");
        let mut timelines = lab.wait_ready(options.stage_timeout, &say)?;
        let mut report = String::new();
        if let Some(appliance) = lab.appliance() {
            report.push_str("the lab's steps (seconds):\n");
            report.push_str(&progress::steps_table(&appliance.steps));
            timelines.insert(
                0,
                (
                    unbounded_testbed::appliance::NAME.to_owned(),
                    appliance.timeline.clone(),
                ),
            );
        }
        report.push_str(&format!(
            "lab started in {:.0} s; every Node Ready {:.0} s after `up` started the lab; seconds since power-on (step):\n",
            lab_started.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ));
        report.push_str(&progress::table(&timelines));
        for line in report.lines() {
            say(line);
        }
        std::fs::write(options.dir.join("timings.txt"), &report)
            .map_err(|e| CliError::Other(e.to_string()))?;
        Ok(lab)
    })();
    let lab = match result {
        Ok(lab) => lab,
        Err(error) => {
            eprintln!("{error}");
            eprintln!("testbed: FAILED");
            return Err(error);
        }
    };
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    RunningLab {
        pid: std::process::id(),
        exe: std::fs::canonicalize(&exe).unwrap_or(exe),
        dir: options.dir.clone(),
        kubeconfig: lab.kubeconfig.clone(),
        kubectl: lab.plane.binaries().kubectl.clone(),
        machines: lab
            .machines
            .iter()
            .map(|m| (m.name.clone(), m.domain.console_path()))
            .collect(),
        pods: lab.appliance().map(|a| a.info.clone()),
    }
    .save()?;
    say(&format!("READY {}", lab.kubeconfig.display()));
    wait_for_termination();
    say("stopping");
    drop(lab);
    let _ = std::fs::remove_file(RunningLab::state_path());
    Ok(())
}

/// Blocks until SIGTERM or SIGINT; false if the signals could not be watched.
fn wait_for_termination() -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let Ok(runtime) = runtime else {
        return false;
    };
    runtime.block_on(async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return false,
            };
        tokio::select! {
            _ = term.recv() => true,
            r = tokio::signal::ctrl_c() => r.is_ok(),
        }
    })
}

fn down() -> Result<(), CliError> {
    let Some(lab) = RunningLab::load() else {
        let _ = std::fs::remove_file(RunningLab::state_path());
        eprintln!("testbed: no testbed is running");
        return Ok(());
    };
    let _ = Command::new("kill").arg(lab.pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Path::new(&format!("/proc/{}", lab.pid)).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    if Path::new(&format!("/proc/{}", lab.pid)).exists() {
        let _ = Command::new("kill")
            .args(["-9", &lab.pid.to_string()])
            .status();
    }
    let _ = std::fs::remove_file(RunningLab::state_path());
    eprintln!("testbed: stopped (logs kept in {})", lab.dir.display());
    Ok(())
}

fn run_scenario(name: ScenarioName) -> Result<(), CliError> {
    let lab = RunningLab::load().ok_or_else(|| {
        CliError::Other(
            "no testbed is running: start one with `cargo run -p unbounded-testbed -- up`".into(),
        )
    })?;
    let say = |m: &str| eprintln!("testbed: {m}");
    let timeout = Duration::from_secs(420);
    let first = lab
        .machines
        .first()
        .map(|(n, _)| n.clone())
        .ok_or_else(|| CliError::Other("the testbed has no machines".into()))?;
    let run = |which: ScenarioName| -> Result<(), LabError> {
        match which {
            ScenarioName::Repave => scenario::repave(&lab, &first, timeout, &say).map(|_| ()),
            ScenarioName::Rollback => scenario::rollback(&lab, &first, timeout, &say),
            ScenarioName::Operations => scenario::operations(&lab, timeout, &say),
            ScenarioName::Pool => unbounded_testbed::pool_scenario::pool(&lab, timeout, &say),
            ScenarioName::LeaderFailover => {
                appliance_scenarios::leader_failover(&lab, 1, timeout, &say).map(|f| {
                    say(&format!(
                        "leader-failover: {} took over from {} in {:.1} s (bound {} s); rollout to version {} {:.0} s",
                        f.new_leader,
                        f.old_leader,
                        f.takeover.as_secs_f64(),
                        f.bound.as_secs(),
                        f.version,
                        f.rollout.as_secs_f64()
                    ));
                })
            }
            ScenarioName::BootserverRestart => {
                appliance_scenarios::bootserver_restart(&lab, &first, timeout, &say).map(|r| {
                    say(&format!(
                        "bootserver-restart: new pod Ready in {:.1} s, leases {} → {}, {first} Ready {:.0} s after its reboot",
                        r.restart.as_secs_f64(),
                        r.leases.0,
                        r.leases.1,
                        r.boot.as_secs_f64()
                    ));
                })
            }
            ScenarioName::All => Ok(()),
        }
    };
    match name {
        ScenarioName::All => {
            for which in [
                ScenarioName::Repave,
                ScenarioName::Rollback,
                ScenarioName::Operations,
            ] {
                run(which)?;
            }
        }
        one => run(one)?,
    }
    say("scenario passed");
    Ok(())
}

fn build_images(containers: bool) -> Result<(), CliError> {
    setup::install_dependencies()?;
    let built = images::build(&images::Options { containers })?;
    println!("host kernel   {}", built.host.kernel.display());
    println!("host initrd   {}", built.host.initrd.display());
    println!("node image    {}", built.node.archive.display());
    println!("node sha256   {}", built.node.sha256);
    if let Some(containers) = &built.containers {
        for image in containers
            .images
            .iter()
            .chain(std::iter::once(&containers.boot_images))
        {
            for reference in &image.references {
                println!(
                    "{reference}  oci:{}:{}  {}",
                    image.layout.display(),
                    unbounded_testbed::oci::tag_of(reference),
                    image.manifest_digest
                );
            }
            println!("    archive {}", image.archive.display());
            println!("    sbom    {}", image.sbom.display());
        }
        println!(
            "boot images {}: MachineConfiguration values in {}",
            containers.boot_images_manifest.version,
            containers.machine_configuration.display()
        );
        println!("recorded in {}", images::containers_path().display());
    }
    Ok(())
}

fn cluster_up() -> Result<(), CliError> {
    eprintln!("testbed: checking packages");
    setup::install_dependencies()?;
    eprintln!(
        "testbed: starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler {KUBERNETES_VERSION}"
    );
    let state = cluster::start_detached()?;
    let kubeconfig = state.kubeconfig.display().to_string();
    let binaries = cluster::Binaries::ensure()?;
    let deploy = cluster::deploy_dir();
    eprintln!(
        "testbed: applying {} (CRDs, policies, RBAC, Deployments)",
        deploy.display()
    );
    kubectl(
        &binaries,
        &kubeconfig,
        &[
            "apply",
            "--server-side",
            "-k",
            &deploy.display().to_string(),
        ],
    )?;
    let examples = deploy.join("examples");
    eprintln!("testbed: applying {}", examples.display());
    kubectl(
        &binaries,
        &kubeconfig,
        &[
            "apply",
            "--server-side",
            "-f",
            &examples.display().to_string(),
        ],
    )?;
    eprintln!(
        "testbed: control plane running; logs and data in {}",
        state.dir.display()
    );
    eprintln!(
        "testbed: kubectl {KUBERNETES_VERSION} is {}",
        binaries.kubectl.display()
    );
    eprintln!("testbed: stop it with `cargo run -p unbounded-testbed -- cluster down`");
    println!("KUBECONFIG={kubeconfig}");
    Ok(())
}

fn kubernetes_binaries() -> Result<(), CliError> {
    let binaries = cluster::Binaries::ensure()?;
    for path in [
        &binaries.kube_apiserver,
        &binaries.kube_controller_manager,
        &binaries.kube_scheduler,
        &binaries.kubectl,
        &binaries.kubelet,
        &binaries.etcd,
    ] {
        println!("{}", path.display());
    }
    Ok(())
}

fn cluster_down() -> Result<(), CliError> {
    let state = cluster::stop_detached()?;
    for (name, pid, _) in &state.processes {
        eprintln!("testbed: stopped {name} (pid {pid})");
    }
    Ok(())
}

fn kubectl(
    binaries: &cluster::Binaries,
    kubeconfig: &str,
    args: &[&str],
) -> Result<(), ClusterError> {
    let output = std::process::Command::new(&binaries.kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .map_err(|source| ClusterError::Io {
            what: "running kubectl".to_owned(),
            source,
        })?;
    eprint!("{}", String::from_utf8_lossy(&output.stdout));
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterError::Command {
            what: format!("kubectl {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
