#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! `console` against a real BMC emulator: OpenIPMI's `ipmi_sim` with Serial-over-LAN on a TCP
//! "serial port" this test writes a boot log into, the credentials in a real Secret on a real
//! kube-apiserver, and the real `ipmitool` started by the plugin. The lines written to the
//! serial port come out of the plugin; the password never does, and never reaches ipmitool's
//! command line.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const LINE: &str = "Unbounded host OS: reached the serial console";
const PASSWORD: &str = "s3cret-sol-password";

/// ipmi_sim with one administrator and SOL on `serial_port` (it connects there itself).
struct Sim {
    port: u16,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

async fn start_sim(serial_port: u16) -> Sim {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let conf = dir.path().join("lan.conf");
    std::fs::write(
        &conf,
        format!(
            "name \"ubsol\"\nset_working_mc 0x20\n  startlan 1\n    addr 127.0.0.1 {port}\n    priv_limit admin\n    allowed_auths_callback none md5\n    allowed_auths_user none md5\n    allowed_auths_operator none md5\n    allowed_auths_admin none md5\n    guid a123456789abcdefa123456789abcdef\n  endlan\n  sol \"tcp:127.0.0.1:{serial_port}\" 115200\nuser 2 true \"admin\" \"{PASSWORD}\" admin 10 none md5\n"
        ),
    )
    .unwrap();
    let emu = dir.path().join("sim.emu");
    std::fs::write(
        &emu,
        "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let child = tokio::process::Command::new("ipmi_sim")
        .arg("-c")
        .arg(&conf)
        .arg("-f")
        .arg(&emu)
        .arg("-n")
        .arg("-s")
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("ipmi_sim (Debian package openipmi; scripts/install-deps.sh installs it)");
    // Ready when it answers a session.
    wait_for("ipmi_sim to answer", || async {
        tokio::process::Command::new("ipmitool")
            .args([
                "-I",
                "lanplus",
                "-C",
                "3",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["-U", "admin", "-E", "mc", "info"])
            .env("IPMI_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success())
            .then_some(())
    })
    .await;
    Sim {
        port,
        _child: child,
        _dir: dir,
    }
}

/// The machine's serial port: accepts ipmi_sim's connection and writes the boot log line
/// again and again.
async fn serial_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                while stream
                    .write_all(format!("{LINE}\r\n").as_bytes())
                    .await
                    .is_ok()
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
    });
    port
}

/// A serial port that accepts ipmi_sim's connection and stays silent: a machine that is up
/// and writes nothing to its console.
async fn quiet_serial_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    port
}

async fn create_secret(client: &kube::Client, name: &str, password: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"},
        "stringData": {"username": "admin", "password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn create_bmc_machine(client: &kube::Client, name: &str, port: u16, secret: &str) {
    create_machine(
        client,
        name,
        json!({}),
        json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:29:01:01"], "bmc": {
            "address": format!("ipmi://127.0.0.1:{port}"),
            "credentialsSecretRef": {"namespace": "default", "name": secret}}}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn console_reads_the_serial_port_through_ipmi_sol_and_never_shows_the_password() {
    let client = client().await;
    let sim = start_sim(serial_port().await).await;
    create_secret(&client, "sol-bmc", PASSWORD).await;
    create_bmc_machine(&client, "sol-m", sim.port, "sol-bmc").await;

    let mut child = spawn_plugin(&["console", "sol-m"]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if line.contains(LINE) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "the serial port's line through SOL: {seen:?}"
    );
    // Ctrl-C ends the session (and deactivates SOL), with success.
    let out = interrupt(child).await;
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("console of sol-m through ipmi://127.0.0.1:"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD) && !seen.iter().any(|l| l.contains(PASSWORD)));

    // A wrong password: ipmitool's error, exit 1, and still no password printed.
    create_secret(&client, "sol-wrong", "not-the-password").await;
    create_bmc_machine(&client, "sol-wrong-m", sim.port, "sol-wrong").await;
    let run = plugin(&["console", "sol-wrong-m"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("console: ipmitool ended with"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("not-the-password") && !run.stdout.contains("not-the-password"));
}

/// Through a pipe (a script, `| tee`), the session's banner comes out when the session opens,
/// not when the machine first writes: ipmitool's stdout is a buffered pipe there, and a quiet
/// console would keep the banner in its buffer.
#[tokio::test]
async fn console_through_a_pipe_says_the_session_is_open_before_the_machine_writes() {
    let client = client().await;
    let sim = start_sim(quiet_serial_port().await).await;
    create_secret(&client, "sol-quiet-bmc", PASSWORD).await;
    create_bmc_machine(&client, "sol-quiet", sim.port, "sol-quiet-bmc").await;

    let mut child = spawn_plugin(&["console", "sol-quiet"]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Activation takes a second or two; the banner is not waited for longer than this.
    let banner = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("SOL Session operational") {
                return true;
            }
        }
        false
    })
    .await;
    let out = interrupt(child).await;
    assert_eq!(
        banner,
        Ok(true),
        "ipmitool's banner through the pipe; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn console_refuses_machines_without_an_ipmi_bmc_and_missing_secrets() {
    let client = client().await;
    create_pxe_machine(&client, "sol-bare", json!({}), 0x20, false).await;
    create_machine(&client, "sol-manual", json!({}), json!({})).await;
    create_bmc_machine(&client, "sol-nosecret", 6230, "sol-absent").await;
    let cases: [(&str, i32, &str); 4] = [
        ("sol-bare", 2, "sol-bare has no BMC (spec.pxe.bmc)"),
        ("sol-manual", 2, "sol-manual is a manual Machine"),
        (
            "sol-nosecret",
            1,
            "the BMC Secret default/sol-absent does not exist",
        ),
        ("sol-nosuch", 2, "no Machine named sol-nosuch"),
    ];
    for (machine, code, message) in cases {
        let run = plugin(&["console", machine]).await;
        assert_eq!(run.code, code, "{machine}: {run:?}");
        assert!(run.stderr.contains(message), "{machine}: {}", run.stderr);
    }
}

const REDFISH_SYSTEM: &str = "6f9d0c1e-2b1a-4a61-9d35-0c29a1e0f001";
const REDFISH_PASSWORD: &str = "s3cret-redfish-password";

async fn create_redfish_machine(client: &kube::Client, name: &str, address: &str, secret: &str) {
    create_machine(
        client,
        name,
        json!({}),
        json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:29:02:01"], "bmc": {
            "address": address,
            "credentialsSecretRef": {"namespace": "default", "name": secret}}}}),
    )
    .await;
}

/// sushy-tools (fake driver, basic authentication) advertises no console: not on the
/// ComputerSystem, not on its Manager. The plugin reads both with the Secret's credentials
/// and refuses with exit 2, naming what the BMC advertises; a wrong password and an
/// unreachable BMC are exit 1. No output ever holds the password.
#[tokio::test]
async fn console_on_a_redfish_bmc_names_what_it_advertises_and_never_the_password() {
    let client = client().await;
    let sushy = tokio::task::spawn_blocking(|| {
        unbounded_testbed::bmc::SushyEmulator::start_fake_with_user(
            &[(REDFISH_SYSTEM, "52:54:00:29:02:01")],
            "admin",
            REDFISH_PASSWORD,
        )
    })
    .await
    .unwrap()
    .expect("sushy-emulator (testbed/scripts/install-bmc-emulators.sh installs it)");
    let base = format!("redfish+http://127.0.0.1:{}", sushy.port);
    create_secret(&client, "rf-bmc", REDFISH_PASSWORD).await;
    create_secret(&client, "rf-wrong", "not-the-redfish-password").await;
    create_redfish_machine(
        &client,
        "rf-none",
        &format!("{base}/redfish/v1/Systems/{REDFISH_SYSTEM}"),
        "rf-bmc",
    )
    .await;
    // No system in the address: the single member of Systems.
    create_redfish_machine(&client, "rf-found", &base, "rf-bmc").await;
    create_redfish_machine(
        &client,
        "rf-wrong-m",
        &format!("{base}/redfish/v1/Systems/{REDFISH_SYSTEM}"),
        "rf-wrong",
    )
    .await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    create_redfish_machine(
        &client,
        "rf-down",
        &format!("redfish+http://127.0.0.1:{closed}"),
        "rf-bmc",
    )
    .await;

    let advertises = format!(
        "this BMC offers no console we can open ({base} advertises: no SerialConsole on the system; manager /redfish/v1/Managers/{REDFISH_SYSTEM}: no SerialConsole, no CommandShell)"
    );
    let cases: [(&str, i32, String); 4] = [
        ("rf-none", 2, format!("rf-none: {advertises}")),
        ("rf-found", 2, format!("rf-found: {advertises}")),
        (
            "rf-wrong-m",
            1,
            format!(
                "console: the Redfish BMC {base} refused the credentials of the Secret default/rf-wrong"
            ),
        ),
        (
            "rf-down",
            1,
            format!("console: the Redfish BMC redfish+http://127.0.0.1:{closed} is unreachable"),
        ),
    ];
    for (machine, code, message) in cases {
        let run = plugin(&["console", machine]).await;
        assert_eq!(run.code, code, "{machine}: {run:?}\n{}", sushy.log());
        assert!(run.stderr.contains(&message), "{machine}: {}", run.stderr);
        for secret in [REDFISH_PASSWORD, "not-the-redfish-password"] {
            assert!(
                !run.stderr.contains(secret) && !run.stdout.contains(secret),
                "{machine}: {run:?}"
            );
        }
    }
    // The wrong password was refused by the BMC, not by the plugin: sushy logged the 401.
    assert!(sushy.log().contains(" 401 "), "{}", sushy.log());
}
