//! The boot storm: simulated BIOS PXE clients in waves against our bootserver (each a
//! Machine it knows), each doing DHCP through the relay, TFTP of `undionly.kpxe`, its iPXE
//! script and the kernel the script names over HTTP ([`super::clients::storm`]). Figures:
//! failures (must be 0), seconds to the last client, the server's CPU time and peak memory.

use super::bed::{Bed, BedError, files};
use super::clients::{StormSummary, dhcp::format_mac, storm_mac};
use super::peers::{BenchMachine, NET};
use super::proc::{ProcError, run_client};
use super::report::{Better, Cell, Report, Row};

/// The storm's size.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Clients in all.
    pub clients: u32,
    /// Clients that start together.
    pub wave: u32,
    /// Milliseconds between waves.
    pub interval_ms: u64,
}

/// Runs the storm.
pub fn run(
    bed: &Bed,
    plan: &Plan,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let machines: Vec<BenchMachine> = (0..plan.clients)
        .map(|i| BenchMachine {
            name: format!("storm-{i:04}"),
            mac: format_mac(&storm_mac(i)),
        })
        .collect();
    let daemon = bed.start_ours(&machines, false)?;
    let size = |path: std::path::PathBuf| {
        std::fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|source| BedError::Io {
                what: format!("reading {}", path.display()),
                source,
            })
    };
    let boot_file_size = size(bed.tftp_root.join(files::UNDIONLY))?;
    let kernel_size = size(bed.images_dir.join(files::KERNEL))?;
    let exe = std::env::current_exe().map_err(|source| BedError::Io {
        what: "finding this program".into(),
        source,
    })?;
    say(format!(
        "storm: {} clients in waves of {} every {} ms",
        plan.clients, plan.wave, plan.interval_ms
    ));
    let cpu_before = daemon.cpu_seconds();
    let mut command = bed.client(&exe.display().to_string());
    command
        .args([
            "bench-client",
            "storm",
            "--server",
            NET.server,
            "--relay",
            NET.client,
        ])
        .args(["--clients", &plan.clients.to_string()])
        .args(["--wave", &plan.wave.to_string()])
        .args(["--interval-ms", &plan.interval_ms.to_string()])
        .args(["--boot-file-size", &boot_file_size.to_string()])
        .args(["--kernel-size", &kernel_size.to_string()])
        .args(["--http-port", &NET.http_port.to_string()]);
    let stdout = run_client(command)?;
    let cpu = daemon.cpu_seconds() - cpu_before;
    let peak_mib = daemon.peak_rss_kib() as f64 / 1024.0;
    let summary: StormSummary =
        serde_json::from_str(stdout.trim()).map_err(|e| ProcError::Failed {
            command: "bench-client storm".into(),
            status: format!("unreadable output: {e}"),
            output: stdout.clone(),
        })?;
    drop(daemon);
    let failures: u32 = summary.failures.values().sum();
    for (name, value) in [
        ("clients", f64::from(summary.clients)),
        ("booted", f64::from(summary.booted)),
        ("failures", f64::from(failures)),
        ("seconds_to_last", summary.seconds),
        ("server_cpu_seconds", cpu),
        ("server_peak_rss_mib", peak_mib),
    ] {
        report.figure(format!("storm.pxe.ours.{name}"), value);
    }
    for (stage, ms) in &summary.stage_ms {
        report.figure(format!("storm.pxe.ours.{stage}_mean_ms"), *ms);
    }
    let stages: Vec<String> = summary
        .stage_ms
        .iter()
        .map(|(stage, ms)| format!("{stage} {ms:.0} ms"))
        .collect();
    let note = format!(
        "{failures} failures, last client done after {:.1} s, server CPU {cpu:.1} s, peak RSS {peak_mib:.0} MiB; mean per client: {}",
        summary.seconds,
        stages.join(", ")
    );
    say(format!(
        "storm: {} of {} booted; {note}",
        summary.booted, summary.clients
    ));
    if failures > 0 {
        report.problem(format!(
            "storm: {failures} failures: {:?}",
            summary.failures
        ));
    }
    report.rows.push(Row {
        mode: "storm",
        case: "pxe".into(),
        what: format!(
            "{} PXE clients (DHCP, TFTP undionly.kpxe, iPXE script, {} kernel), waves of {} every {} ms",
            plan.clients,
            super::tftp::size_label(kernel_size),
            plan.wave,
            plan.interval_ms
        ),
        metric: "booted",
        unit: "booted",
        ours: Some(Cell::with_note(f64::from(summary.booted), note)),
        peers: Vec::new(),
        better: Better::Higher,
        target: None,
    });
    Ok(())
}
