//! `console <machine>`: the machine's serial console through its BMC, as IPMI Serial-over-LAN
//! with `ipmitool`. [`sol_target`] decides from the Machine alone whether there is a console
//! to open (pure); [`ipmitool_args`] builds the command line, which never holds the password:
//! ipmitool reads it from `IPMI_PASSWORD` (`-E`). Read-only by default (ipmitool's input is a
//! pipe nothing is written to); `--interactive` hands it the terminal.

use std::process::Stdio;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use unbounded_api::{Machine, MachineProvider, SecretReference};

use crate::error::{Error, NoConsole};

/// The default port of IPMI over LAN.
pub const IPMI_PORT: u16 = 623;

/// Where the BMC listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolTarget {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// UDP port.
    pub port: u16,
    /// The Secret with `username` and `password`.
    pub credentials: SecretReference,
}

/// The IPMI endpoint of `machine`'s BMC, or why there is none.
pub fn sol_target(machine: &Machine) -> Result<SolTarget, NoConsole> {
    let name = machine.name_any();
    if machine.spec.provider != MachineProvider::Pxe {
        return Err(NoConsole::NotPxe {
            machine: name,
            provider: machine.spec.provider.as_str(),
        });
    }
    let Some(bmc) = machine.spec.pxe.as_ref().and_then(|p| p.bmc.as_ref()) else {
        return Err(NoConsole::NoBmc(name));
    };
    let Some(rest) = bmc.address.strip_prefix("ipmi://") else {
        return Err(NoConsole::Redfish(name));
    };
    let bad = || NoConsole::BadAddress {
        machine: name.clone(),
        address: bmc.address.clone(),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(bad()),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
        None => IPMI_PORT,
    };
    Ok(SolTarget {
        host: host.to_owned(),
        port,
        credentials: bmc.credentials_secret_ref.clone(),
    })
}

/// ipmitool's arguments for `action` (`activate`, `deactivate`): IPMI v2.0 (lanplus) with
/// cipher suite 3 (named, so that ipmitool does not ask for the list, which some BMCs and
/// `ipmi_sim` do not answer), the password from the environment (`-E`).
pub fn ipmitool_args(target: &SolTarget, username: &str, action: &str) -> Vec<String> {
    [
        "-I",
        "lanplus",
        "-C",
        "3",
        "-H",
        &target.host,
        "-p",
        &target.port.to_string(),
        "-U",
        username,
        "-E",
        "sol",
        action,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The username and password of a BMC Secret.
async fn credentials(client: &Client, secret: &SecretReference) -> Result<(String, String), Error> {
    let what = format!("the BMC Secret {}/{}", secret.namespace, secret.name);
    let found = Api::<Secret>::namespaced(client.clone(), &secret.namespace)
        .get_opt(&secret.name)
        .await
        .map_err(Error::api(format!("reading {what}")))?
        .ok_or_else(|| Error::Console(format!("{what} does not exist")))?;
    let data = found.data.unwrap_or_default();
    let key = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::Console(format!("{what} has no key {k:?}")))
    };
    Ok((key("username")?, key("password")?))
}

/// Opens the console of `machine` until ipmitool ends or Ctrl-C.
pub async fn run(client: &Client, name: &str, interactive: bool) -> Result<(), Error> {
    let machine = Api::<Machine>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::api(format!("reading Machine {name}")))?
        .ok_or_else(|| Error::UnknownMachines(vec![name.to_owned()]))?;
    let target = sol_target(&machine).map_err(Error::NoConsole)?;
    let (username, password) = credentials(client, &target.credentials).await?;
    let ipmitool = |action: &str| {
        let mut command = tokio::process::Command::new("ipmitool");
        command
            .args(ipmitool_args(&target, &username, action))
            .env("IPMI_PASSWORD", &password)
            .kill_on_drop(true);
        command
    };
    eprintln!(
        "console of {name} through ipmi://{}:{} ({}; Ctrl-C ends)",
        target.host,
        target.port,
        if interactive {
            "interactive: ~. ends the session"
        } else {
            "read-only"
        }
    );
    let mut session = ipmitool("activate");
    session
        .stdin(if interactive {
            Stdio::inherit()
        } else {
            // A pipe nothing is written to: keystrokes never reach the machine.
            Stdio::piped()
        })
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let mut child = session
        .spawn()
        .map_err(|e| Error::Console(format!("running ipmitool (Debian package ipmitool): {e}")))?;
    // Held until the end: tokio's `wait` would close it, and ipmitool ends at end of input.
    let _input = child.stdin.take();
    let status = tokio::select! {
        status = child.wait() => Some(status.map_err(Error::Output)?),
        _ = tokio::signal::ctrl_c() => None,
    };
    let Some(status) = status else {
        // Ended by the user: stop the session, and free the BMC's SOL payload for the next one.
        let _ = child.kill().await;
        let _ = ipmitool("deactivate")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        return Ok(());
    };
    if status.success() {
        Ok(())
    } else {
        Err(Error::Console(format!(
            "ipmitool ended with {status} (its message is above)"
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::machine;

    fn with_bmc(address: &str) -> Machine {
        machine(
            "m",
            json!({}),
            json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:00:01"], "bmc": {
                "address": address, "credentialsSecretRef": {"namespace": "ns", "name": "bmc"}}}}),
            json!({}),
        )
    }

    #[test]
    fn the_console_target_of_each_kind_of_machine() {
        let ok = |host: &str, port: u16| {
            Ok(SolTarget {
                host: host.to_owned(),
                port,
                credentials: SecretReference {
                    namespace: "ns".into(),
                    name: "bmc".into(),
                },
            })
        };
        let cases = [
            (with_bmc("ipmi://10.0.0.6"), ok("10.0.0.6", 623)),
            (with_bmc("ipmi://10.0.0.6:6230"), ok("10.0.0.6", 6230)),
            (with_bmc("ipmi://bmc-7.lab:624/"), ok("bmc-7.lab", 624)),
            (with_bmc("ipmi://[fd00::6]:700"), ok("fd00::6", 700)),
            (with_bmc("ipmi://[fd00::6]"), ok("fd00::6", 623)),
            (
                with_bmc("ipmi://10.0.0.6:notaport"),
                Err(NoConsole::BadAddress {
                    machine: "m".into(),
                    address: "ipmi://10.0.0.6:notaport".into(),
                }),
            ),
            (
                with_bmc("redfish://10.0.0.5/redfish/v1/Systems/1"),
                Err(NoConsole::Redfish("m".into())),
            ),
            (
                machine(
                    "m",
                    json!({}),
                    json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:00:01"]}}),
                    json!({}),
                ),
                Err(NoConsole::NoBmc("m".into())),
            ),
            (
                machine("m", json!({}), json!({}), json!({})),
                Err(NoConsole::NotPxe {
                    machine: "m".into(),
                    provider: "manual",
                }),
            ),
        ];
        for (m, expected) in cases {
            assert_eq!(sol_target(&m), expected, "{:?}", m.spec.pxe);
        }
    }

    #[test]
    fn the_password_is_never_an_argument() {
        let target = sol_target(&with_bmc("ipmi://10.0.0.6:6230")).unwrap();
        let args = ipmitool_args(&target, "admin", "activate");
        assert_eq!(
            args.join(" "),
            "-I lanplus -C 3 -H 10.0.0.6 -p 6230 -U admin -E sol activate"
        );
        assert!(
            !args.iter().any(|a| a == "-P"),
            "-P would put a password on the command line"
        );
    }
}
