//! The benchmark's set-up (`bench-controller`, issue 17) at a small scale, as a test of
//! behaviour rather than speed: with selectors that overlap and priorities that decide, every
//! Machine records the version selection gives it and every count is right; then one change
//! of one configuration (new template, higher priority, a selector over more racks) reaches
//! every Machine it selects — through the label index — while each keeps the version it
//! recorded (`OnDelete`), and the new version is counted. No timing is asserted: the bounds
//! below only keep a broken controller from hanging the test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::time::Duration;

use unbounded_testbed::bench::controller::layout::Layout;
use unbounded_testbed::bench::controller::{Settings, run};

#[tokio::test]
async fn a_fleet_converges_and_a_change_reaches_every_selected_machine() {
    let plane = common::control_plane();
    let log_dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        layout: Layout {
            machines: 400,
            configurations: 20,
            racks: 10,
            change_racks: 3,
        },
        controller: env!("CARGO_BIN_EXE_unbounded-controller").into(),
        controller_args: Vec::new(),
        create_concurrency: 16,
        converge_timeout: Duration::from_secs(240),
        change_timeout: Duration::from_secs(180),
        quiet: Duration::from_secs(2),
        change: true,
        log_dir: log_dir.path().to_path_buf(),
    };
    let report = run(plane, &settings, &|line| eprintln!("scale: {line}"))
        .await
        .expect("benchmark run");
    let log = || {
        let text = std::fs::read_to_string(&report.controller_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        report.converge.seconds.is_some(),
        "not converged: {:?}\ncontroller log:\n{}",
        report.converge.progress.first_problem,
        log()
    );
    let change = report.change.as_ref().expect("the change ran");
    assert!(
        change.seconds.is_some(),
        "the change did not settle: {:?}\ncontroller log:\n{}",
        change.progress.first_problem,
        log()
    );
    // 3 of 10 racks: 120 Machines were re-evaluated; all 400 still as expected.
    assert_eq!(change.progress.as_expected, 400);
    assert_eq!(
        change.progress.versions, 21,
        "20 configurations' v1 and the target's v2"
    );
}
