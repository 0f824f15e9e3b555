//! Which console to open, from what the BMC advertises (pure, table-tested), and what it
//! advertises in one line for the operator.

use unbounded_pxe::power::IPMI_PORT;

use super::{Advertised, NetworkProtocol, SerialConsole};

/// The default ports of the console protocols (IPMI's is the PXE provider's).
const SSH_PORT: u16 = 22;
const TELNET_PORT: u16 = 23;

/// A console protocol the plugin does not open itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherProtocol {
    /// SSH.
    Ssh,
    /// Telnet.
    Telnet,
}

impl OtherProtocol {
    /// Its name as Redfish writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ssh => "SSH",
            Self::Telnet => "Telnet",
        }
    }
}

/// The console to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// IPMI Serial-over-LAN on the BMC's host, at this UDP port.
    Sol {
        /// The port.
        port: u16,
    },
    /// A console the operator opens: SSH or Telnet on the BMC's host.
    Elsewhere {
        /// The protocol.
        protocol: OtherProtocol,
        /// Its port.
        port: u16,
        /// What to type at the BMC's prompt to reach the console, when the BMC says.
        entry_command: Option<String>,
    },
    /// No console service is offered, or every one is disabled.
    Nothing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ipmi,
    Ssh,
    Telnet,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Ipmi => "IPMI",
            Self::Ssh => "SSH",
            Self::Telnet => "Telnet",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Ipmi => IPMI_PORT,
            Self::Ssh => SSH_PORT,
            Self::Telnet => TELNET_PORT,
        }
    }
}

/// A port as the BMC wrote it, or the protocol's default when it wrote none that fits.
fn port_or_default(port: Option<i64>, kind: Kind) -> u16 {
    port.and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(kind.default_port())
}

/// An enabled `kind` service in `console`, with the port and entry command it names;
/// `network` is the owning Manager's `NetworkProtocol` (ports and switches of the legacy
/// shape).
fn offered(
    console: &SerialConsole,
    network: Option<&NetworkProtocol>,
    kind: Kind,
) -> Option<(u16, Option<String>)> {
    let per_protocol = match kind {
        Kind::Ipmi => console.ipmi.as_ref(),
        Kind::Ssh => console.ssh.as_ref(),
        Kind::Telnet => console.telnet.as_ref(),
    };
    // The per-protocol object, when there is one, is the BMC's most specific word.
    if let Some(protocol) = per_protocol {
        return (protocol.service_enabled != Some(false)).then(|| {
            (
                port_or_default(protocol.port, kind),
                protocol.console_entry_command.clone(),
            )
        });
    }
    let listed = console
        .connect_types_supported
        .as_ref()
        .is_some_and(|types| types.iter().any(|t| t == kind.name()));
    if !listed || console.service_enabled == Some(false) {
        return None;
    }
    let setting = network.and_then(|n| match kind {
        Kind::Ipmi => n.ipmi.as_ref(),
        Kind::Ssh => n.ssh.as_ref(),
        Kind::Telnet => n.telnet.as_ref(),
    });
    if setting.is_some_and(|s| s.protocol_enabled == Some(false)) {
        return None;
    }
    Some((port_or_default(setting.and_then(|s| s.port), kind), None))
}

/// The first enabled `kind` console: the system's, then each Manager's in order.
fn first_offered(advertised: &Advertised, kind: Kind) -> Option<(u16, Option<String>)> {
    advertised
        .system
        .as_ref()
        .and_then(|console| offered(console, None, kind))
        .or_else(|| {
            advertised.managers.iter().find_map(|manager| {
                let console = manager.serial_console.as_ref()?;
                offered(console, manager.network_protocol.as_ref(), kind)
            })
        })
}

/// The console to open for what the BMC advertises: IPMI Serial-over-LAN when any is
/// enabled, else SSH, else Telnet, else nothing.
pub fn decide(advertised: &Advertised) -> Route {
    if let Some((port, _)) = first_offered(advertised, Kind::Ipmi) {
        return Route::Sol { port };
    }
    for (kind, protocol) in [
        (Kind::Ssh, OtherProtocol::Ssh),
        (Kind::Telnet, OtherProtocol::Telnet),
    ] {
        if let Some((port, entry_command)) = first_offered(advertised, kind) {
            return Route::Elsewhere {
                protocol,
                port,
                entry_command,
            };
        }
    }
    Route::Nothing
}

fn switch(enabled: Option<bool>) -> &'static str {
    match enabled {
        Some(true) => "enabled",
        Some(false) => "disabled",
        None => "enabled not said",
    }
}

fn describe_serial(console: &SerialConsole) -> Vec<String> {
    let mut parts = Vec::new();
    for (name, protocol) in [
        ("IPMI", &console.ipmi),
        ("SSH", &console.ssh),
        ("Telnet", &console.telnet),
    ] {
        if let Some(p) = protocol {
            let port = p
                .port
                .map(|port| format!(", port {port}"))
                .unwrap_or_default();
            parts.push(format!("{name} ({}{port})", switch(p.service_enabled)));
        }
    }
    if let Some(types) = &console.connect_types_supported {
        parts.push(format!(
            "ConnectTypesSupported [{}] ({})",
            types.join(", "),
            switch(console.service_enabled)
        ));
    }
    if parts.is_empty() {
        parts.push("no protocol".into());
    }
    parts
}

/// What the BMC advertises, in one line for the operator.
pub fn describe(advertised: &Advertised) -> String {
    let mut parts = Vec::new();
    if let Some(console) = &advertised.system {
        parts.push(format!(
            "the system's SerialConsole: {}",
            describe_serial(console).join(", ")
        ));
    }
    for manager in &advertised.managers {
        let mut offers = Vec::new();
        if let Some(console) = &manager.serial_console {
            offers.push(format!(
                "SerialConsole {}",
                describe_serial(console).join(", ")
            ));
        }
        if let Some(shell) = &manager.command_shell {
            let types = shell.connect_types_supported.clone().unwrap_or_default();
            offers.push(format!(
                "CommandShell [{}] ({}; the BMC's own command line, not the machine's console)",
                types.join(", "),
                switch(shell.service_enabled)
            ));
        }
        if offers.is_empty() {
            offers.push("no SerialConsole, no CommandShell".into());
        }
        parts.push(format!("manager {}: {}", manager.id, offers.join("; ")));
    }
    if advertised.system.is_none() {
        parts.insert(0, "no SerialConsole on the system".into());
    }
    if advertised.managers.is_empty() {
        parts.push("no manager".into());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::redfish_console::read::{Manager, System};
    use crate::redfish_console::{ConsoleProtocol, ManagerConsoles, ProtocolSetting};

    /// A Manager as a BMC serves it (the fields this module reads, beside others it ignores).
    fn manager(id: &str, body: Value, network: Option<Value>) -> ManagerConsoles {
        let parsed: Manager = serde_json::from_value(body).unwrap();
        ManagerConsoles {
            id: id.into(),
            serial_console: parsed.serial_console,
            command_shell: parsed.command_shell,
            network_protocol: network.map(|n| serde_json::from_value(n).unwrap()),
        }
    }

    fn system(body: Value) -> Option<SerialConsole> {
        serde_json::from_value::<System>(body)
            .unwrap()
            .serial_console
    }

    /// sushy-tools 2.2's Manager: no SerialConsole, no CommandShell.
    fn sushy_manager() -> ManagerConsoles {
        manager(
            "/redfish/v1/Managers/27946b59",
            json!({"@odata.type": "#Manager.v1_3_1.Manager", "Id": "27946b59",
                   "ManagerType": "BMC", "Model": "Joo Janta 200", "PowerState": "On",
                   "Links": {"ManagerForServers": [{"@odata.id": "/redfish/v1/Systems/27946b59"}]}}),
            None,
        )
    }

    /// A Manager in the legacy shape (Manager v1.0 to v1.9).
    fn legacy(types: &[&str], enabled: Option<bool>, network: Option<Value>) -> ManagerConsoles {
        let mut serial = json!({"ConnectTypesSupported": types, "MaxConcurrentSessions": 1});
        if let Some(enabled) = enabled {
            serial["ServiceEnabled"] = json!(enabled);
        }
        manager(
            "/redfish/v1/Managers/1",
            json!({"@odata.type": "#Manager.v1_5_0.Manager", "SerialConsole": serial,
                   "CommandShell": {"ServiceEnabled": true, "ConnectTypesSupported": ["SSH"]},
                   "NetworkProtocol": {"@odata.id": "/redfish/v1/Managers/1/NetworkProtocol"}}),
            network,
        )
    }

    fn with(system_console: Option<SerialConsole>, managers: Vec<ManagerConsoles>) -> Advertised {
        Advertised {
            system: system_console,
            managers,
        }
    }

    #[test]
    fn the_console_each_kind_of_bmc_offers() {
        let ssh = |port: u16, entry: Option<&str>| Route::Elsewhere {
            protocol: OtherProtocol::Ssh,
            port,
            entry_command: entry.map(str::to_owned),
        };
        // ComputerSystem v1.13+: per-protocol objects.
        let host_console = |ipmi: Value, ssh: Value| {
            system(
                json!({"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
                "SerialConsole": {"MaxConcurrentSessions": 2, "IPMI": ipmi, "SSH": ssh}}),
            )
        };
        let cases: Vec<(&str, Advertised, Route)> = vec![
            (
                "sushy-tools: nothing",
                with(None, vec![sushy_manager()]),
                Route::Nothing,
            ),
            ("no manager at all", with(None, vec![]), Route::Nothing),
            (
                "legacy IPMI and SSH, port from NetworkProtocol",
                with(
                    None,
                    vec![legacy(
                        &["IPMI", "SSH"],
                        Some(true),
                        Some(json!({"IPMI": {"ProtocolEnabled": true, "Port": 6230},
                                    "SSH": {"ProtocolEnabled": true, "Port": 22}})),
                    )],
                ),
                Route::Sol { port: 6230 },
            ),
            (
                "legacy IPMI, no NetworkProtocol: the default port",
                with(None, vec![legacy(&["IPMI"], Some(true), None)]),
                Route::Sol { port: 623 },
            ),
            (
                "legacy IPMI, ServiceEnabled not said: tried",
                with(None, vec![legacy(&["IPMI"], None, None)]),
                Route::Sol { port: 623 },
            ),
            (
                "legacy, serial console service disabled",
                with(None, vec![legacy(&["IPMI", "SSH"], Some(false), None)]),
                Route::Nothing,
            ),
            (
                "legacy IPMI with IPMI over LAN off, SSH on port 2222",
                with(
                    None,
                    vec![legacy(
                        &["IPMI", "SSH"],
                        Some(true),
                        Some(json!({"IPMI": {"ProtocolEnabled": false, "Port": 623},
                                    "SSH": {"ProtocolEnabled": true, "Port": 2222}})),
                    )],
                ),
                ssh(2222, None),
            ),
            (
                "legacy SSH only",
                with(None, vec![legacy(&["SSH"], Some(true), None)]),
                ssh(22, None),
            ),
            (
                "legacy Telnet only",
                with(None, vec![legacy(&["Telnet", "Oem"], Some(true), None)]),
                Route::Elsewhere {
                    protocol: OtherProtocol::Telnet,
                    port: 23,
                    entry_command: None,
                },
            ),
            (
                "legacy Oem only",
                with(None, vec![legacy(&["Oem"], Some(true), None)]),
                Route::Nothing,
            ),
            (
                "CommandShell only: the BMC's command line is not the console",
                with(
                    None,
                    vec![manager(
                        "/redfish/v1/Managers/1",
                        json!({"CommandShell": {"ServiceEnabled": true,
                                                "ConnectTypesSupported": ["SSH", "IPMI"]}}),
                        None,
                    )],
                ),
                Route::Nothing,
            ),
            (
                "system IPMI enabled on 623",
                with(
                    host_console(
                        json!({"ServiceEnabled": true, "Port": 623}),
                        json!({"ServiceEnabled": true, "Port": 22}),
                    ),
                    vec![sushy_manager()],
                ),
                Route::Sol { port: 623 },
            ),
            (
                "system IPMI disabled, SSH shared with the manager's CLI",
                with(
                    host_console(
                        json!({"ServiceEnabled": false, "Port": 623}),
                        json!({"ServiceEnabled": true, "Port": 2200,
                               "SharedWithManagerCLI": true, "ConsoleEntryCommand": "console com2",
                               "HotKeySequenceDisplay": "Press ^\\ to exit"}),
                    ),
                    vec![],
                ),
                ssh(2200, Some("console com2")),
            ),
            (
                "system SSH, but a manager's legacy IPMI: IPMI first",
                with(
                    host_console(json!(null), json!({"ServiceEnabled": true})),
                    vec![legacy(&["IPMI"], Some(true), None)],
                ),
                Route::Sol { port: 623 },
            ),
            (
                "a port of null or out of range: the default",
                with(
                    host_console(json!({"ServiceEnabled": true, "Port": 70000}), json!(null)),
                    vec![],
                ),
                Route::Sol { port: 623 },
            ),
            (
                "the system's IPMI object says disabled: its legacy list does not override it",
                with(
                    system(json!({"SerialConsole": {"ServiceEnabled": true,
                        "ConnectTypesSupported": ["IPMI"], "IPMI": {"ServiceEnabled": false}}})),
                    vec![],
                ),
                Route::Nothing,
            ),
            (
                "the second manager offers IPMI",
                with(
                    None,
                    vec![sushy_manager(), legacy(&["IPMI"], Some(true), None)],
                ),
                Route::Sol { port: 623 },
            ),
        ];
        for (what, advertised, expected) in cases {
            assert_eq!(decide(&advertised), expected, "{what}");
        }
    }

    #[test]
    fn what_the_bmc_advertises_in_one_line() {
        assert_eq!(
            describe(&with(None, vec![sushy_manager()])),
            "no SerialConsole on the system; manager /redfish/v1/Managers/27946b59: no SerialConsole, no CommandShell"
        );
        assert_eq!(
            describe(&with(
                None,
                vec![legacy(&["IPMI", "SSH"], Some(false), None)]
            )),
            "no SerialConsole on the system; manager /redfish/v1/Managers/1: SerialConsole ConnectTypesSupported [IPMI, SSH] (disabled); CommandShell [SSH] (enabled; the BMC's own command line, not the machine's console)"
        );
        let host = system(json!({"SerialConsole": {
            "IPMI": {"ServiceEnabled": false, "Port": 623}, "SSH": {"Port": 22}}}));
        assert_eq!(
            describe(&with(host, vec![])),
            "the system's SerialConsole: IPMI (disabled, port 623), SSH (enabled not said, port 22); no manager"
        );
    }

    fn any_protocol() -> impl Strategy<Value = Option<ConsoleProtocol>> {
        proptest::option::of(
            (
                proptest::option::of(any::<bool>()),
                proptest::option::of(-1i64..70_000),
            )
                .prop_map(|(service_enabled, port)| ConsoleProtocol {
                    service_enabled,
                    port,
                    console_entry_command: None,
                }),
        )
    }

    fn any_serial() -> impl Strategy<Value = SerialConsole> {
        let types = proptest::sample::subsequence(vec!["IPMI", "SSH", "Telnet", "Oem"], 0..=4)
            .prop_map(|t| t.into_iter().map(str::to_owned).collect::<Vec<_>>());
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(types),
            any_protocol(),
            any_protocol(),
            any_protocol(),
        )
            .prop_map(
                |(service_enabled, connect_types_supported, ipmi, ssh, telnet)| SerialConsole {
                    service_enabled,
                    connect_types_supported,
                    ipmi,
                    ssh,
                    telnet,
                },
            )
    }

    fn any_setting() -> impl Strategy<Value = Option<ProtocolSetting>> {
        proptest::option::of(
            (
                proptest::option::of(any::<bool>()),
                proptest::option::of(0i64..70_000),
            )
                .prop_map(|(protocol_enabled, port)| ProtocolSetting {
                    protocol_enabled,
                    port,
                }),
        )
    }

    fn any_advertised() -> impl Strategy<Value = Advertised> {
        let any_manager = (
            proptest::option::of(any_serial()),
            proptest::option::of(
                (any_setting(), any_setting(), any_setting())
                    .prop_map(|(ipmi, ssh, telnet)| NetworkProtocol { ipmi, ssh, telnet }),
            ),
        )
            .prop_map(|(serial_console, network_protocol)| ManagerConsoles {
                id: "/redfish/v1/Managers/1".into(),
                serial_console,
                command_shell: None,
                network_protocol,
            });
        (
            proptest::option::of(any_serial()),
            proptest::collection::vec(any_manager, 0..3),
        )
            .prop_map(|(system, managers)| Advertised { system, managers })
    }

    /// Whether any place the BMC advertises `name` leaves it on, read straight off the data:
    /// an oracle independent of `offered`'s structure.
    fn anywhere_on(a: &Advertised, name: &str) -> bool {
        let pick = |c: &SerialConsole| match name {
            "IPMI" => c.ipmi.clone(),
            "SSH" => c.ssh.clone(),
            _ => c.telnet.clone(),
        };
        let listed_on = |c: &SerialConsole, n: Option<&NetworkProtocol>| {
            let setting = n.and_then(|n| match name {
                "IPMI" => n.ipmi.clone(),
                "SSH" => n.ssh.clone(),
                _ => n.telnet.clone(),
            });
            c.service_enabled != Some(false)
                && c.connect_types_supported
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| t == name))
                && setting.is_none_or(|s| s.protocol_enabled != Some(false))
        };
        let on = |c: &SerialConsole, n: Option<&NetworkProtocol>| match pick(c) {
            Some(object) => object.service_enabled != Some(false),
            None => listed_on(c, n),
        };
        a.system.as_ref().is_some_and(|c| on(c, None))
            || a.managers.iter().any(|m| {
                m.serial_console
                    .as_ref()
                    .is_some_and(|c| on(c, m.network_protocol.as_ref()))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            rng_seed: proptest::test_runner::RngSeed::Fixed(29),
            ..ProptestConfig::default()
        })]

        /// SOL whenever IPMI is on anywhere; another protocol only when IPMI is on nowhere
        /// and that one is; nothing only when no protocol is on; never port 0.
        #[test]
        fn ipmi_first_and_nothing_only_when_nothing_is_on(a in any_advertised()) {
            let (ipmi, ssh, telnet) =
                (anywhere_on(&a, "IPMI"), anywhere_on(&a, "SSH"), anywhere_on(&a, "Telnet"));
            match decide(&a) {
                Route::Sol { port } => prop_assert!(ipmi && port != 0),
                Route::Elsewhere { protocol: OtherProtocol::Ssh, port, .. } => {
                    prop_assert!(!ipmi && ssh && port != 0);
                }
                Route::Elsewhere { protocol: OtherProtocol::Telnet, port, .. } => {
                    prop_assert!(!ipmi && !ssh && telnet && port != 0);
                }
                Route::Nothing => prop_assert!(!ipmi && !ssh && !telnet),
            }
        }
    }
}
