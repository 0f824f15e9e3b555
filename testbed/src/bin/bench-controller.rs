//! `bench-controller`: the controller with 10,000 Machines and 100 MachineConfigurations on a
//! fresh local control plane (issue 17). See `unbounded_testbed::bench::controller`.
//!
//! `cargo run --release -p unbounded-testbed --bin bench-controller`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use unbounded_testbed::bench::controller::layout::Layout;
use unbounded_testbed::bench::controller::{Settings, render, run};
use unbounded_testbed::cluster::LocalControlPlane;

#[derive(Parser, Debug)]
#[command(
    name = "bench-controller",
    about = "The controller at scale, on a fresh local control plane"
)]
struct Flags {
    /// Machines to create.
    #[arg(long, default_value_t = Layout::ISSUE.machines)]
    machines: usize,
    /// MachineConfigurations to create.
    #[arg(long, default_value_t = Layout::ISSUE.configurations)]
    configurations: usize,
    /// Distinct rack labels (each configuration selects one rack).
    #[arg(long, default_value_t = Layout::ISSUE.racks)]
    racks: usize,
    /// Racks the configuration change selects (10 of 50 racks: 2,000 of 10,000 Machines).
    #[arg(long, default_value_t = Layout::ISSUE.change_racks)]
    change_racks: usize,
    /// The controller binary (default: build the release controller with cargo).
    #[arg(long)]
    controller: Option<PathBuf>,
    /// An extra argument for the controller (repeat for several).
    #[arg(long = "controller-arg", allow_hyphen_values = true)]
    controller_args: Vec<String>,
    /// Creates in flight while building the set-up.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Seconds convergence may take.
    #[arg(long, default_value_t = 900)]
    converge_timeout_seconds: u64,
    /// Seconds the change may take to settle.
    #[arg(long, default_value_t = 300)]
    change_timeout_seconds: u64,
    /// Seconds to count requests after convergence.
    #[arg(long, default_value_t = 10)]
    quiet_seconds: u64,
    /// Where the controller's log goes.
    #[arg(long, default_value = "/tmp/unbounded-bench-controller")]
    log_dir: PathBuf,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    match bench(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("bench-controller: {message}");
            ExitCode::FAILURE
        }
    }
}

fn bench(flags: Flags) -> Result<(), String> {
    let controller = match flags.controller {
        Some(path) => path,
        None => render::build_release_controller().map_err(|e| e.to_string())?,
    };
    let settings = Settings {
        layout: Layout {
            machines: flags.machines,
            configurations: flags.configurations,
            racks: flags.racks,
            change_racks: flags.change_racks,
        },
        controller,
        controller_args: flags.controller_args,
        create_concurrency: flags.create_concurrency,
        converge_timeout: Duration::from_secs(flags.converge_timeout_seconds),
        change_timeout: Duration::from_secs(flags.change_timeout_seconds),
        quiet: Duration::from_secs(flags.quiet_seconds),
        change: true,
        log_dir: flags.log_dir,
    };
    eprintln!("bench-controller: starting a fresh local control plane");
    let plane = LocalControlPlane::shared().map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let say = |line: String| eprintln!("bench-controller: {line}");
    let report = runtime
        .block_on(run(plane, &settings, &say))
        .map_err(|e| e.to_string())?;
    println!(
        "\ncontroller at scale: {} Machines, {} MachineConfigurations; etcd, kube-apiserver, kube-controller-manager, the controller and this benchmark share {} cores\n",
        settings.layout.machines,
        settings.layout.configurations,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print!("{}", render::table(&report));
    for line in render::figure_lines(&report) {
        println!("{line}");
    }
    if report.converge.seconds.is_none()
        || report.change.as_ref().is_some_and(|c| c.seconds.is_none())
    {
        return Err("the controller did not converge in time (figures above)".into());
    }
    Ok(())
}
