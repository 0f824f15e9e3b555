//! `unbounded-testbed cluster up` leaves a working control plane and prints its kubeconfig
//! last; `cluster down` stops exactly what `up` started.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::path::{Path, PathBuf};
use std::process::Command;

use unbounded_testbed::cluster::{BIN_DIR_ENV, Binaries};

fn testbed(cache: &Path, bin_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_unbounded-testbed"))
        .args(args)
        // Its own state directory, so that a cluster a person runs is left alone.
        .env("UNBOUNDED_CACHE_DIR", cache)
        .env(BIN_DIR_ENV, bin_dir)
        .output()
        .expect("run unbounded-testbed")
}

fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty()
        && !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

#[test]
fn cluster_up_then_down_leaves_nothing_running() {
    let binaries = Binaries::ensure().expect("kubernetes binaries");
    let bin_dir: PathBuf = binaries.kubectl.parent().unwrap().to_path_buf();
    let cache = std::env::temp_dir().join(format!("unbounded-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&cache).unwrap();

    let up = testbed(&cache, &bin_dir, &["cluster", "up"]);
    assert!(
        up.status.success(),
        "cluster up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let stdout = String::from_utf8_lossy(&up.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let kubeconfig = last
        .strip_prefix("KUBECONFIG=")
        .expect("last line is KUBECONFIG=<path>");

    let get = Command::new(&binaries.kubectl)
        .args([
            "--kubeconfig",
            kubeconfig,
            "get",
            "crd",
            "machines.unbounded-cloud.io",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );

    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("cluster/state.json")).unwrap())
            .unwrap();
    let pids: Vec<u32> = state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        pids.len(),
        4,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
    );
    assert!(pids.iter().all(|pid| alive(*pid)));

    let down = testbed(&cache, &bin_dir, &["cluster", "down"]);
    assert!(
        down.status.success(),
        "cluster down failed: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        pids.iter().all(|pid| !alive(*pid)),
        "processes left running: {pids:?}"
    );
    assert!(!cache.join("cluster/state.json").exists());

    let again = testbed(&cache, &bin_dir, &["cluster", "down"]);
    assert!(!again.status.success(), "a second down has nothing to stop");
    assert!(String::from_utf8_lossy(&again.stderr).contains("no running local control plane"));
    let _ = std::fs::remove_dir_all(&cache);
}
