//! `bench controller`: the controller at scale ([`super::controller`], issue 17's
//! benchmark) and the PXE provider with many Machines whose BMC is an emulator
//! ([`super::provider`]), each on a fresh local control plane.

use std::path::Path;
use std::time::Duration;

use super::controller::layout::Layout;
use super::controller::{self, render};
use super::provider;
use super::report::{Better, Cell, Report, Row};
use super::suite::SuiteError;
use crate::cluster::{Lifetime, LocalControlPlane, PlaneOptions};

/// Sizes of the controller benchmarks.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// Release builds (debug for the smoke).
    pub release: bool,
    /// The controller's set-up.
    pub layout: Layout,
    /// How long convergence may take.
    pub converge_timeout: Duration,
    /// The provider's part.
    pub provider: provider::Plan,
    /// Also converge the same set-up on an API server that sets the controller's finalizer
    /// at creation (`deploy/components/finalizer-at-creation`): one write per Machine less.
    pub finalizer_at_creation: bool,
}

impl ScaleOptions {
    /// The issue's sizes.
    pub fn full() -> Self {
        Self {
            release: true,
            layout: Layout::ISSUE,
            converge_timeout: Duration::from_secs(900),
            provider: provider::Plan::full(),
            finalizer_at_creation: true,
        }
    }

    /// A few seconds' worth.
    pub fn smoke() -> Self {
        Self {
            release: false,
            layout: Layout {
                machines: 40,
                configurations: 4,
                racks: 4,
                change_racks: 1,
            },
            converge_timeout: Duration::from_secs(300),
            provider: provider::Plan::smoke(),
            finalizer_at_creation: true,
        }
    }
}

fn failed(e: impl std::error::Error + Send + Sync + 'static) -> SuiteError {
    SuiteError::ControllerFailed(Box::new(e))
}

/// Reads `figure <key> <value>` lines into the report's figures.
fn take_figures(report: &mut Report, lines: &[String]) {
    for line in lines {
        let mut parts = line.split_whitespace();
        if let (Some("figure"), Some(key), Some(value)) = (parts.next(), parts.next(), parts.next())
        {
            report.figure(key, value.parse().unwrap_or(f64::NAN));
        }
    }
}

/// Runs both parts.
pub fn run(
    options: &ScaleOptions,
    log_dir: &Path,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), SuiteError> {
    say(format!(
        "building the controller ({})",
        if options.release { "release" } else { "debug" }
    ));
    let built = crate::images::host_build(
        &["unbounded-controller", "unbounded-bootserver"],
        options.release,
    )
    .map_err(failed)?;
    let (Some(controller_bin), Some(bootserver_bin)) = (built.first(), built.get(1)) else {
        return Err(SuiteError::Controller(
            "cargo built no controller or bootserver".into(),
        ));
    };
    let runtime = tokio::runtime::Runtime::new().map_err(failed)?;

    say("starting a fresh local control plane for the controller".into());
    let plane = LocalControlPlane::start(Lifetime::TiedToThread).map_err(failed)?;
    let settings = controller::Settings {
        layout: options.layout,
        controller: controller_bin.clone(),
        controller_args: Vec::new(),
        create_concurrency: 32,
        converge_timeout: options.converge_timeout,
        change_timeout: Duration::from_secs(300),
        quiet: Duration::from_secs(if options.release { 10 } else { 2 }),
        change: true,
        log_dir: log_dir.join("controller"),
    };
    // The controller benchmark reports from several tasks.
    let say_sync = |line: String| eprintln!("bench: {line}");
    let scale = runtime
        .block_on(controller::run(&plane, &settings, &say_sync))
        .map_err(failed)?;
    drop(plane);
    take_figures(report, &render::figure_lines(&scale));
    let with_policy = if options.finalizer_at_creation {
        say("starting a fresh local control plane that sets the finalizer at creation".into());
        let plane = LocalControlPlane::start_with(
            Lifetime::TiedToThread,
            PlaneOptions {
                finalizer_at_creation: true,
                ..PlaneOptions::default()
            },
        )
        .map_err(failed)?;
        let settings = controller::Settings {
            change: false,
            log_dir: log_dir.join("controller-finalizer-at-creation"),
            ..settings.clone()
        };
        let scale = runtime
            .block_on(controller::run(&plane, &settings, &say_sync))
            .map_err(failed)?;
        drop(plane);
        Some(scale.converge)
    } else {
        None
    };
    let machines = super::report::human(options.layout.machines as f64);
    for (case, what, phase) in [
        (
            "converge",
            format!(
                "{machines} Machines, {} MachineConfigurations: every version resolved and counted",
                options.layout.configurations
            ),
            Some(&scale.converge),
        ),
        (
            "change",
            format!(
                "one configuration change touching {} Machines",
                super::report::human(
                    (options.layout.machines * options.layout.change_racks
                        / options.layout.racks.max(1)) as f64
                )
            ),
            scale.change.as_ref(),
        ),
        (
            "converge_finalizer_at_creation",
            "the same, the controller's finalizer set at creation by an admission policy (deploy/components/finalizer-at-creation)".to_owned(),
            with_policy.as_ref(),
        ),
    ] {
        let Some(phase) = phase else { continue };
        let seconds = phase.seconds.unwrap_or(f64::NAN);
        if phase.seconds.is_none() {
            report.problem(format!("controller {case}: not done in time"));
        }
        report.rows.push(Row {
            mode: "controller",
            case: case.to_owned(),
            what,
            metric: "seconds",
            unit: "s",
            ours: Some(Cell::with_note(
                seconds,
                format!(
                    "peak RSS {:.0} MiB, controller CPU {:.1} s, {} API requests ({} refused as conflicts), kube-apiserver CPU {:.1} s, load {:.1} → {:.1}",
                    phase.peak_rss_kib as f64 / 1024.0,
                    phase.cpu_seconds,
                    phase.requests.values().sum::<u64>(),
                    super::controller::probe::conflicts(&phase.requests),
                    phase.apiserver_cpu_seconds,
                    phase.load_average.0,
                    phase.load_average.1
                ),
            )),
            peers: Vec::new(),
            better: Better::Lower,
            target: None,
        });
    }
    report.note(format!(
        "controller: the issue's target is 10,000 Machines converged in < 60 s in < 200 MiB of controller memory (this run: {machines}); etcd, kube-apiserver, kube-controller-manager, the controller and the benchmark share the cores"
    ));

    say("starting a fresh local control plane for the PXE provider".into());
    let plane = LocalControlPlane::start(Lifetime::TiedToThread).map_err(failed)?;
    let result = runtime.block_on(provider::run(
        &plane,
        bootserver_bin,
        &options.provider,
        &log_dir.join("provider"),
        report,
        say,
    ));
    drop(plane);
    // The provider benchmark reports its failures as text (it has no error type of its own).
    result.map_err(SuiteError::Controller)
}
