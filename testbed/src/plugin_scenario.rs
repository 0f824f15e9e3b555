//! `scenario plugin`: `kubectl unbounded` (the built binary) against the running lab:
//! - `status -o json` lists every lab machine Running with a Ready Node;
//! - `reboot <machine>` exits 0 once the operation is Complete, and the machine comes back
//!   on a new boot (the agent's boot ID and the Node's, which is nspawn's, both new);
//! - `rollback <machine> --to N` onto a new version, then back to the version it ran: each
//!   exits 0 with the Node annotated with the version;
//! - `logs <machine>` shows at least one bootserver line (pods mode: the bootserver is a pod)
//!   and one agent line about it;
//! - `console <ipmi machine>` (run in the lab's network namespace, where the BMCs are)
//!   shows the machine's boot through ipmi_sim's Serial-over-LAN while it reboots.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::failure::Failure;
use crate::lab::base::{LAB_ADDRESS, LAB_API_PORT, LabError};
use crate::scenario::{Lab, get, ready_on_new_boot, set_configuration_label, step, wait_until};

/// What one run of the plugin did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Where the plugin binary is: `$UNBOUNDED_KUBECTL_PLUGIN`, else next to this program
/// (`cargo build -p kubectl-unbounded` puts both in one target directory), else `PATH`.
pub fn plugin_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("UNBOUNDED_KUBECTL_PLUGIN") {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kubectl-unbounded")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("kubectl-unbounded"))
}

fn run(plugin: &Path, kubeconfig: &Path, args: &[&str]) -> Result<Run, LabError> {
    let out = Command::new(plugin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::new(format!("running {}", plugin.display()), e))?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn succeed(plugin: &Path, kubeconfig: &Path, args: &[&str]) -> Result<Run, LabError> {
    let r = run(plugin, kubeconfig, args)?;
    if r.code != 0 {
        return Err(step(format!(
            "kubectl unbounded {} exited {}:\n{}\n{}",
            args.join(" "),
            r.code,
            r.stdout,
            r.stderr
        )));
    }
    Ok(r)
}

/// The machine rows of `status -o json`: `(name, phase, node readiness)`.
fn status_rows(json: &serde_json::Value, out: &mut Vec<(String, String, String)>) {
    match json {
        serde_json::Value::Object(map) => {
            if let (Some(name), Some(node)) = (map.get("name"), map.get("node")) {
                out.push((
                    name.as_str().unwrap_or_default().to_owned(),
                    map.get("phase")
                        .and_then(|p| p.as_str())
                        .unwrap_or_default()
                        .to_owned(),
                    node.get("readiness")
                        .and_then(|r| r.as_str())
                        .unwrap_or_default()
                        .to_owned(),
                ));
            }
            for v in map.values() {
                status_rows(v, out);
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| status_rows(v, out)),
        _ => {}
    }
}

/// The scenario; `kubeconfig` is the lab's admin kubeconfig.
pub fn plugin(
    lab: &Lab,
    kubeconfig: &Path,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<(), LabError> {
    let plugin = plugin_binary();
    say(&format!("plugin: using {}", plugin.display()));
    let machines = lab.machine_names();
    let first = machines
        .first()
        .cloned()
        .ok_or_else(|| step("the lab has no machines"))?;

    // status
    let r = succeed(&plugin, kubeconfig, &["status", "-o", "json"])?;
    let json: serde_json::Value = serde_json::from_str(&r.stdout).map_err(|e| {
        Failure::around(
            "status -o json is not JSON (",
            e,
            format!("):\n{}", r.stdout),
        )
    })?;
    let mut rows = Vec::new();
    status_rows(&json, &mut rows);
    for m in &machines {
        let row = rows.iter().find(|(n, _, _)| n == m);
        if !row.is_some_and(|(_, phase, ready)| phase == "Running" && ready == "Ready") {
            return Err(step(format!(
                "status: {m} is not Running with a Ready Node: {row:?}"
            )));
        }
    }
    let text = succeed(&plugin, kubeconfig, &["status", "--color", "never"])?;
    say(&format!("plugin: status\n{}", text.stdout));

    // reboot
    let boot_before = get(lab, "machine", &first, "{.status.agent.bootID}");
    let node_boot_before = get(lab, "node", &first, "{.status.nodeInfo.bootID}");
    let started = Instant::now();
    let t = timeout.as_secs().to_string();
    let r = succeed(&plugin, kubeconfig, &["reboot", &first, "--timeout", &t])?;
    let last = r.stdout.lines().last().unwrap_or_default().to_owned();
    if !last.starts_with("reboot: 1/1 done") {
        return Err(step(format!("reboot's last line: {last:?}\n{}", r.stdout)));
    }
    wait_until(&format!("{first} Ready on its new boot"), timeout, || {
        ready_on_new_boot(lab, &first, &boot_before, &node_boot_before)
    })?;
    say(&format!(
        "plugin: reboot of {first} followed to the end ({last}); Ready on a new boot after {:.0} s",
        started.elapsed().as_secs_f64()
    ));

    // rollback: a new version, then back to the one it ran.
    let ran = get(lab, "machine", &first, "{.status.configuration.version}");
    let latest: i64 = get(
        lab,
        "machineconfiguration",
        "testbed",
        "{.status.latestVersion}",
    )
    .parse()
    .map_err(|_| step("the testbed configuration has no latestVersion"))?;
    let marker = format!("plugin-{}", std::process::id());
    set_configuration_label(lab, "unbounded-cloud.io/plugin-scenario", &marker)?;
    let new = latest + 1;
    wait_until(
        &format!("version {new} to exist"),
        Duration::from_secs(60),
        || {
            let l = get(
                lab,
                "machineconfiguration",
                "testbed",
                "{.status.latestVersion}",
            );
            (l == new.to_string(), l)
        },
    )?;
    for version in [new.to_string(), ran.clone()] {
        let r = succeed(
            &plugin,
            kubeconfig,
            &["rollback", &first, "--to", &version, "--timeout", &t],
        )?;
        let node_version = get(
            lab,
            "node",
            &first,
            "{.metadata.annotations.unbounded-cloud\\.io/machine-configuration-version}",
        );
        if node_version != version {
            return Err(step(format!(
                "rollback --to {version}: the Node is annotated with version {node_version:?}\n{}",
                r.stdout
            )));
        }
        say(&format!(
            "plugin: rollback of {first} to version {version} carried out"
        ));
    }

    // logs
    let r = succeed(&plugin, kubeconfig, &["logs", &first])?;
    let agent_lines = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("agent | "))
        .count();
    let bootserver_lines = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("bootserver/"))
        .count();
    if agent_lines == 0 {
        return Err(step(format!(
            "logs {first}: no agent line\n{}\n{}",
            r.stdout, r.stderr
        )));
    }
    if lab.pods().is_some() && bootserver_lines == 0 {
        return Err(step(format!(
            "logs {first}: no bootserver line\n{}\n{}",
            r.stdout, r.stderr
        )));
    }
    say(&format!(
        "plugin: logs of {first}: {agent_lines} agent lines, {bootserver_lines} bootserver lines"
    ));

    console(lab, &plugin, kubeconfig, &machines, timeout, say)
}

/// The lab's network namespace (`ubtb-…`), where the BMCs listen.
fn lab_namespace() -> Result<String, LabError> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map_err(|e| Failure::new("ip netns list", e))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .find(|n| n.starts_with("ubtb"))
        .map(str::to_owned)
        .ok_or_else(|| step("no ubtb network namespace: is the lab running?"))
}

/// `console` of the lab's IPMI machine, inside the lab's namespace (its kubeconfig pointed
/// at the API server's address there), while the machine reboots: the boot comes out.
fn console(
    lab: &Lab,
    plugin: &Path,
    kubeconfig: &Path,
    machines: &[String],
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<(), LabError> {
    let Some(machine) = machines
        .iter()
        .find(|m| get(lab, "machine", m, "{.spec.pxe.bmc.address}").starts_with("ipmi://"))
    else {
        say(
            "plugin: no IPMI machine in the lab (start it with --machines 2 or more): console not checked",
        );
        return Ok(());
    };
    let ns = lab_namespace()?;
    let dir = tempfile::tempdir().map_err(Failure::of)?;
    let original = std::fs::read_to_string(kubeconfig).map_err(Failure::of)?;
    let inside: String = original
        .lines()
        .map(|l| match l.trim_start().strip_prefix("server:") {
            Some(_) => {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}server: https://{LAB_ADDRESS}:{LAB_API_PORT}")
            }
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let inside_path = dir.path().join("kubeconfig");
    std::fs::write(&inside_path, inside).map_err(Failure::of)?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(plugin)
        .arg("--kubeconfig")
        .arg(&inside_path)
        .args(["console", machine])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::new("running the console", e))?;
    let mut stdout = child.stdout.take().ok_or_else(|| step("no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    // The session is up when ipmitool says so; then the machine reboots.
    let mut seen = Vec::new();
    let session_deadline = Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&seen).contains("SOL Session operational") {
        if Instant::now() > session_deadline {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(step(format!(
                "console {machine}: no SOL session in 60 s\n{}\n{err}",
                String::from_utf8_lossy(&seen)
            )));
        }
        if let Ok(bytes) = rx.recv_timeout(Duration::from_secs(1)) {
            seen.extend(bytes);
        }
    }
    let r = succeed(plugin, kubeconfig, &["reboot", machine, "--no-wait"])?;
    say(&format!(
        "plugin: console of {machine} open; {}",
        r.stdout.trim()
    ));
    let markers = ["Reached target", "[  OK  ]", "iPXE", "Welcome to"];
    let deadline = Instant::now() + timeout;
    let found = loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(m) = markers.iter().find(|m| text.contains(**m)) {
            break Some(*m);
        }
        if Instant::now() > deadline {
            break None;
        }
        if let Ok(bytes) = rx.recv_timeout(Duration::from_secs(1)) {
            seen.extend(bytes);
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = String::from_utf8_lossy(&seen).into_owned();
    let Some(marker) = found else {
        return Err(step(format!(
            "console {machine}: none of {markers:?} came through SOL in {} s; it showed:\n{}",
            timeout.as_secs(),
            crate::qemu::console_tail(&text, 2000)
        )));
    };
    say(&format!(
        "plugin: console of {machine} showed its boot through SOL ({marker:?}, {} bytes)",
        text.len()
    ));
    wait_until(
        &format!("{machine} Ready after the console's reboot"),
        timeout,
        || {
            let ready = get(
                lab,
                "node",
                machine,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            let phase = get(lab, "machine", machine, "{.status.phase}");
            (
                ready == "True" && phase == "Running",
                format!("{phase}, Ready {ready}"),
            )
        },
    )
}
