//! `up`, `serve` and `down`: the lab, started in the background or in the foreground.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use unbounded_testbed::cluster::{self, KUBERNETES_VERSION};
use unbounded_testbed::failure::Failure;
use unbounded_testbed::lab::{Lab, LabMode, LabOptions, RunningLab};
use unbounded_testbed::{images, progress, setup};

use crate::CliError;

pub(crate) fn testbed_dir() -> PathBuf {
    cluster::cache_dir().join("testbed")
}

/// What `up` was asked for.
pub(crate) struct UpOptions {
    pub(crate) machines: usize,
    pub(crate) memory: u32,
    pub(crate) stage_timeout: u64,
    pub(crate) host_binaries: bool,
    pub(crate) appliance_memory: u32,
    pub(crate) ipv6_only: bool,
    pub(crate) dual_stack: bool,
}

pub(crate) fn up(options: UpOptions) -> Result<(), CliError> {
    let UpOptions {
        machines,
        memory,
        stage_timeout,
        host_binaries,
        appliance_memory,
        ipv6_only,
        dual_stack,
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
    // `scenario capi` runs Cluster API's core manager against the lab: built once, cached
    // (docs/cluster-api.md).
    eprintln!(
        "testbed: Cluster API {} (core manager, clusterctl)",
        cluster::CLUSTER_API_VERSION
    );
    cluster::ClusterApiBinaries::ensure()?;
    eprintln!("testbed: building the controller and the bootserver");
    let binaries = images::host_build(&["unbounded-controller", "unbounded-bootserver"], false)?;
    let (Some(controller), Some(bootserver)) = (binaries.first(), binaries.get(1)) else {
        return Err(CliError::Other(
            "cargo built no controller or bootserver".into(),
        ));
    };
    let dir = testbed_dir().join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Failure::new(dir.display(), e))?;
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).map_err(Failure::of)?;
    let err = log.try_clone().map_err(Failure::of)?;
    // This very program, also when a build replaced its file while the images were built
    // (its path then names a deleted file, or another build); the link stays valid while
    // `up` runs, which waits for the lab to be ready.
    let exe = PathBuf::from(format!("/proc/{}/exe", std::process::id()));
    // The lab lives in a process of its own (a new session), so that it outlives `up`.
    let mut child = Command::new("setsid")
        .arg(&exe)
        .args(["serve", "--machines", &machines.to_string()])
        .args(["--memory", &memory.to_string()])
        .args(["--stage-timeout", &stage_timeout.to_string()])
        .args(["--appliance-memory", &appliance_memory.to_string()])
        .args(host_binaries.then_some("--host-binaries"))
        .args(ipv6_only.then_some("--ipv6-only"))
        .args(dual_stack.then_some("--dual-stack"))
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
        .map_err(|e| Failure::new("starting the lab", e))?;
    // Follow its log until it says it is ready or failed.
    let mut reader = BufReader::new(std::fs::File::open(&log_path).map_err(Failure::of)?);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).map_err(Failure::of)?;
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

pub(crate) fn kubectl_path() -> Result<PathBuf, CliError> {
    Ok(cluster::Binaries::ensure()?.kubectl)
}

/// Runs the lab in this process until SIGTERM or SIGINT.
pub(crate) fn serve(options: LabOptions) -> Result<(), CliError> {
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
        std::fs::write(options.dir.join("timings.txt"), &report).map_err(Failure::of)?;
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
    let exe = std::env::current_exe().map_err(Failure::of)?;
    RunningLab {
        pid: std::process::id(),
        exe: unbounded_testbed::lab::running::program_path(
            &std::fs::canonicalize(&exe).unwrap_or(exe),
        ),
        dir: options.dir.clone(),
        kubeconfig: lab.kubeconfig.clone(),
        kubectl: lab.plane.binaries().kubectl.clone(),
        machines: lab
            .machines
            .iter()
            .map(|m| (m.name.clone(), m.domain.console_path()))
            .collect(),
        pods: lab.appliance().map(|a| a.info.clone()),
        netns: Some(lab.netns_name().to_owned()),
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
pub(crate) fn wait_for_termination() -> bool {
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

pub(crate) fn down() -> Result<(), CliError> {
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
