//! `console <machine>`: the machine's serial console through its BMC, as IPMI Serial-over-LAN
//! with `ipmitool`. [`bmc_endpoint`] decides from the Machine alone which BMC to ask (pure);
//! for an `ipmi://` BMC that is the console; for a Redfish BMC,
//! [`crate::redfish_console`] reads what the BMC advertises and decides whether it offers
//! Serial-over-LAN (opened the same way, on the BMC's host), a console the operator opens
//! (SSH, Telnet: refused with what to run) or none (refused with what it advertises).
//! [`ipmitool_args`] builds the command line, which never holds the password: ipmitool reads
//! it from `IPMI_PASSWORD` (`-E`). Read-only by default (ipmitool's input is a pipe nothing is
//! written to); `--interactive` hands it the terminal.

use std::process::Stdio;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use unbounded_api::{Machine, MachineProvider, SecretReference};
use unbounded_pxe::power::{AddressError, BmcAddress};

use crate::error::{Error, NoConsole};
use crate::redfish_console::{self, OtherProtocol, RedfishEndpoint, Route};

/// Where the BMC's Serial-over-LAN listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolTarget {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// UDP port.
    pub port: u16,
    /// The Secret with `username` and `password`.
    pub credentials: SecretReference,
}

/// A Redfish BMC: where it is, and its Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishTarget {
    /// The service.
    pub endpoint: RedfishEndpoint,
    /// Its host (IPv6 without brackets): where a console it advertises listens.
    pub host: String,
    /// The Secret with `username` and `password`.
    pub credentials: SecretReference,
}

/// The BMC of a Machine, by protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcEndpoint {
    /// IPMI over LAN: Serial-over-LAN there.
    Ipmi(SolTarget),
    /// Redfish: what it advertises decides.
    Redfish(RedfishTarget),
}

/// The BMC of `machine`, or why it has none the plugin can ask for a console.
pub fn bmc_endpoint(machine: &Machine) -> Result<BmcEndpoint, NoConsole> {
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
    let bad = |reason: &'static str| NoConsole::BadAddress {
        machine: name.clone(),
        // Never echo user information (a password) back.
        address: match bmc.address.split_once("://") {
            Some((scheme, rest)) => match rest.split_once('@') {
                Some((_, after)) => format!("{scheme}://…@{after}"),
                None => bmc.address.clone(),
            },
            None => bmc.address.clone(),
        },
        reason,
    };
    // The PXE provider's own parser: what the plugin accepts is what powers the machine.
    let address = BmcAddress::parse_address(&bmc.address).map_err(|why| {
        bad(match why {
            AddressError::NoScheme => "has no scheme://",
            AddressError::UserInformation => {
                "holds user information: credentials belong in the Secret"
            }
            AddressError::BadAuthority => "has no host[:port]",
            AddressError::IpmiPath => "is not ipmi://host[:port]",
            AddressError::RedfishPath => "has a path other than /redfish/v1/Systems/<id>",
            AddressError::Scheme => {
                "is neither ipmi:// nor redfish://, redfish+https://, redfish+http://"
            }
        })
    })?;
    let host = address.host().to_owned();
    Ok(match address {
        BmcAddress::Ipmi { port, .. } => BmcEndpoint::Ipmi(SolTarget {
            host,
            port,
            credentials: bmc.credentials_secret_ref.clone(),
        }),
        BmcAddress::Redfish {
            https,
            authority,
            system,
        } => BmcEndpoint::Redfish(RedfishTarget {
            endpoint: RedfishEndpoint {
                https,
                authority,
                system,
                insecure_skip_verify: bmc.insecure_skip_verify.unwrap_or(false),
                ca_bundle: bmc.ca_bundle.clone(),
            },
            host,
            credentials: bmc.credentials_secret_ref.clone(),
        }),
    })
}

/// What to do with the console a Redfish BMC advertises, as a target or a refusal.
pub fn redfish_console(
    machine: &str,
    target: &RedfishTarget,
    advertised: &redfish_console::Advertised,
) -> Result<SolTarget, NoConsole> {
    match redfish_console::decide(advertised) {
        Route::Sol { port } => Ok(SolTarget {
            host: target.host.clone(),
            port,
            credentials: target.credentials.clone(),
        }),
        Route::Elsewhere {
            protocol,
            port,
            entry_command,
        } => {
            let secret = format!(
                "{}/{}",
                target.credentials.namespace, target.credentials.name
            );
            // Both take an IPv6 address bare.
            let run = match protocol {
                OtherProtocol::Ssh => format!("ssh -p {port} <username>@{}", target.host),
                OtherProtocol::Telnet => format!("telnet {} {port}", target.host),
            };
            let enter = entry_command
                .map(|c| format!(", then enter {c:?} at its prompt"))
                .unwrap_or_default();
            Err(NoConsole::NotOpened {
                machine: machine.to_owned(),
                protocol: protocol.as_str(),
                how: format!(
                    "run `{run}`{enter}; the user name and password are the keys username and password of the Secret {secret}"
                ),
            })
        }
        Route::Nothing => Err(NoConsole::NothingOffered {
            machine: machine.to_owned(),
            bmc: target.endpoint.display_name(),
            advertised: redfish_console::describe(advertised),
        }),
    }
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
    match bmc_endpoint(&machine)? {
        BmcEndpoint::Ipmi(target) => {
            let (username, password) = credentials(client, &target.credentials).await?;
            open_sol(name, &target, &username, &password, interactive, "").await
        }
        BmcEndpoint::Redfish(redfish) => {
            let (username, password) = credentials(client, &redfish.credentials).await?;
            let secret = format!(
                "{}/{}",
                redfish.credentials.namespace, redfish.credentials.name
            );
            let advertised =
                redfish_console::read_advertised(&redfish.endpoint, &username, &password, &secret)
                    .await?;
            let target = redfish_console(name, &redfish, &advertised)?;
            let via = format!(
                ", the serial console {} advertises",
                redfish.endpoint.display_name()
            );
            open_sol(name, &target, &username, &password, interactive, &via).await
        }
    }
}

/// The first executable file called `name` in a directory of `PATH`.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Serial-over-LAN with ipmitool until it ends or Ctrl-C; `via` adds to the first line.
async fn open_sol(
    name: &str,
    target: &SolTarget,
    username: &str,
    password: &str,
    interactive: bool,
    via: &str,
) -> Result<(), Error> {
    let ipmitool_path = on_path("ipmitool").ok_or_else(|| {
        Error::Console("ipmitool not found on PATH (Debian package ipmitool)".into())
    })?;
    // ipmitool prints its banner through stdio, which buffers a pipe: through a pipe (a
    // script, `| tee`) a quiet console would hold "SOL Session operational" back until the
    // machine has written 4 KiB. `stdbuf -o0` (GNU coreutils) unbuffers ipmitool's output;
    // where there is no stdbuf, ipmitool runs as it is.
    let stdbuf = on_path("stdbuf");
    let ipmitool = |action: &str| {
        let mut command = match (&stdbuf, action) {
            (Some(stdbuf), "activate") => {
                let mut command = tokio::process::Command::new(stdbuf);
                command.arg("-o0").arg(&ipmitool_path);
                command
            }
            _ => tokio::process::Command::new(&ipmitool_path),
        };
        command
            .args(ipmitool_args(target, username, action))
            .env("IPMI_PASSWORD", password)
            .kill_on_drop(true);
        command
    };
    eprintln!(
        "console of {name} through ipmi://{}:{}{via} ({}; Ctrl-C ends)",
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
    let mut interrupt = crate::interrupts().map_err(Error::Output)?;
    let mut child = session.spawn().map_err(Error::Ipmitool)?;
    // Held until the end: tokio's `wait` would close it, and ipmitool ends at end of input.
    let _input = child.stdin.take();
    let status = tokio::select! {
        status = child.wait() => Some(status.map_err(Error::Output)?),
        _ = interrupt.recv() => None,
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
    use crate::redfish_console::{Advertised, ManagerConsoles, SerialConsole};

    fn with_bmc_spec(bmc: serde_json::Value) -> Machine {
        machine(
            "m",
            json!({}),
            json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:00:01"], "bmc": bmc}}),
            json!({}),
        )
    }

    fn with_bmc(address: &str) -> Machine {
        with_bmc_spec(json!({"address": address,
            "credentialsSecretRef": {"namespace": "ns", "name": "bmc"}}))
    }

    fn secret() -> SecretReference {
        SecretReference {
            namespace: "ns".into(),
            name: "bmc".into(),
        }
    }

    fn redfish(
        https: bool,
        authority: &str,
        host: &str,
        system: Option<&str>,
    ) -> Result<BmcEndpoint, NoConsole> {
        Ok(BmcEndpoint::Redfish(RedfishTarget {
            endpoint: RedfishEndpoint {
                https,
                authority: authority.into(),
                system: system.map(str::to_owned),
                insecure_skip_verify: false,
                ca_bundle: None,
            },
            host: host.into(),
            credentials: secret(),
        }))
    }

    #[test]
    fn the_bmc_of_each_kind_of_machine() {
        let ipmi = |host: &str, port: u16| {
            Ok(BmcEndpoint::Ipmi(SolTarget {
                host: host.to_owned(),
                port,
                credentials: secret(),
            }))
        };
        let bad = |address: &str, reason: &'static str| {
            Err(NoConsole::BadAddress {
                machine: "m".into(),
                address: address.into(),
                reason,
            })
        };
        let cases = [
            (with_bmc("ipmi://10.0.0.6"), ipmi("10.0.0.6", 623)),
            (with_bmc("ipmi://10.0.0.6:6230"), ipmi("10.0.0.6", 6230)),
            (with_bmc("ipmi://bmc-7.lab:624/"), ipmi("bmc-7.lab", 624)),
            (with_bmc("ipmi://[fd00::6]:700"), ipmi("fd00::6", 700)),
            (with_bmc("ipmi://[fd00::6]"), ipmi("fd00::6", 623)),
            (
                with_bmc("ipmi://10.0.0.6:notaport"),
                bad("ipmi://10.0.0.6:notaport", "has no host[:port]"),
            ),
            (
                with_bmc("ipmi://10.0.0.6/redfish/v1"),
                bad("ipmi://10.0.0.6/redfish/v1", "is not ipmi://host[:port]"),
            ),
            (
                with_bmc("redfish://10.0.0.5/redfish/v1/Systems/1"),
                redfish(true, "10.0.0.5", "10.0.0.5", Some("/redfish/v1/Systems/1")),
            ),
            (
                with_bmc("redfish+https://bmc.lab:8443"),
                redfish(true, "bmc.lab:8443", "bmc.lab", None),
            ),
            (
                with_bmc("redfish+http://127.0.0.1:8000/redfish/v1/Systems/abc-1/"),
                redfish(
                    false,
                    "127.0.0.1:8000",
                    "127.0.0.1",
                    Some("/redfish/v1/Systems/abc-1"),
                ),
            ),
            (
                with_bmc("redfish+http://[fd00::5]:8000/redfish/v1"),
                redfish(false, "[fd00::5]:8000", "fd00::5", None),
            ),
            (
                with_bmc("redfish://10.0.0.5/redfish/v1/Managers/1"),
                bad(
                    "redfish://10.0.0.5/redfish/v1/Managers/1",
                    "has a path other than /redfish/v1/Systems/<id>",
                ),
            ),
            (
                with_bmc("redfish://admin:hunter2@10.0.0.5/redfish/v1/Systems/1"),
                bad(
                    "redfish://…@10.0.0.5/redfish/v1/Systems/1",
                    "holds user information: credentials belong in the Secret",
                ),
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
            assert_eq!(bmc_endpoint(&m), expected, "{:?}", m.spec.pxe);
        }
        // The Machine's TLS settings go with the endpoint.
        let tls = with_bmc_spec(json!({"address": "redfish://10.0.0.5",
            "credentialsSecretRef": {"namespace": "ns", "name": "bmc"},
            "insecureSkipVerify": true}));
        let Ok(BmcEndpoint::Redfish(target)) = bmc_endpoint(&tls) else {
            panic!("a Redfish endpoint");
        };
        assert!(target.endpoint.insecure_skip_verify);
    }

    #[test]
    fn a_password_in_the_address_is_never_echoed() {
        let error = bmc_endpoint(&with_bmc("redfish+http://root:hunter2@10.0.0.5:8000"))
            .unwrap_err()
            .to_string();
        assert!(
            !error.contains("hunter2") && !error.contains("root"),
            "{error}"
        );
        assert!(
            error.contains("credentials belong in the Secret"),
            "{error}"
        );
    }

    fn advertising(serial: serde_json::Value) -> Advertised {
        Advertised {
            system: None,
            managers: vec![ManagerConsoles {
                id: "/redfish/v1/Managers/1".into(),
                serial_console: Some(serde_json::from_value::<SerialConsole>(serial).unwrap()),
                command_shell: None,
                network_protocol: None,
            }],
        }
    }

    #[test]
    fn what_a_redfish_bmc_advertises_becomes_sol_or_a_refusal() {
        let Ok(BmcEndpoint::Redfish(target)) =
            bmc_endpoint(&with_bmc("redfish://[fd00::5]:8443/redfish/v1/Systems/1"))
        else {
            panic!("a Redfish endpoint");
        };
        assert_eq!(
            redfish_console(
                "m",
                &target,
                &advertising(json!({"ServiceEnabled": true, "ConnectTypesSupported": ["IPMI"]}))
            ),
            Ok(SolTarget {
                host: "fd00::5".into(),
                port: 623,
                credentials: secret(),
            })
        );
        let ssh = redfish_console(
            "m",
            &target,
            &advertising(json!({"SSH": {"ServiceEnabled": true, "Port": 2200,
                                        "ConsoleEntryCommand": "console com2"}})),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            ssh,
            "m: its Redfish BMC offers a serial console over SSH only, which the plugin does not open (ssh takes a password only from a terminal or an askpass program; telnet sends it in clear): run `ssh -p 2200 <username>@fd00::5`, then enter \"console com2\" at its prompt; the user name and password are the keys username and password of the Secret ns/bmc"
        );
        let telnet = redfish_console(
            "m",
            &target,
            &advertising(json!({"ServiceEnabled": true, "ConnectTypesSupported": ["Telnet"]})),
        )
        .unwrap_err()
        .to_string();
        assert!(telnet.contains("run `telnet fd00::5 23`"), "{telnet}");
        let nothing = redfish_console(
            "m",
            &target,
            &advertising(json!({"ServiceEnabled": false, "ConnectTypesSupported": ["IPMI"]})),
        );
        assert_eq!(
            nothing,
            Err(NoConsole::NothingOffered {
                machine: "m".into(),
                bmc: "redfish+https://[fd00::5]:8443".into(),
                advertised: "no SerialConsole on the system; manager /redfish/v1/Managers/1: SerialConsole ConnectTypesSupported [IPMI] (disabled)".into(),
            })
        );
    }

    #[test]
    fn the_password_is_never_an_argument() {
        let Ok(BmcEndpoint::Ipmi(target)) = bmc_endpoint(&with_bmc("ipmi://10.0.0.6:6230")) else {
            panic!("an IPMI endpoint");
        };
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
