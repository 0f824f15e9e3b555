//! What a verb creates or changes, decided before anything is written: [`plan`] turns a
//! [`Verb`] and the machines it targets into [`Action`]s, or refuses the whole verb when any
//! machine cannot carry it out (so that nothing is half done). Pure; the shell in
//! [`crate::act`] applies the plan.
//!
//! | verb | what it becomes |
//! |---|---|
//! | `reboot`, `shutdown`, `restart-service` | one MachineOperation per machine (the agent runs it) |
//! | `power on/off/cycle`, `pxe-boot` | one MachineOperation per machine (the provider runs it) |
//! | `repave` | the annotation `unbounded-cloud.io/repave: <now, RFC 3339>` |
//! | `rollback --to N` | `spec.configurationRef.version: N`, then the repave annotation |
//! | `apply` | one `applyConfiguration` MachineOperation per machine (the controller runs it), planned by [`crate::in_place`] |
//!
//! One operation per machine rather than one selector operation: the machines confirmed are
//! exactly the machines acted on (a selector operation would match the labels again later).

use std::collections::BTreeMap;

use kube::ResourceExt;
use unbounded_api::well_known::operations;
use unbounded_api::{Machine, MachineConfiguration, MachineProvider};

use crate::facts::{pool_of, recorded};

/// A day-2 verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    /// `reboot`.
    Reboot,
    /// `shutdown`.
    Shutdown,
    /// `power on`.
    PowerOn,
    /// `power off`, deallocating an Azure VM when asked.
    PowerOff {
        /// `--deallocate`.
        deallocate: bool,
    },
    /// `power cycle`.
    PowerCycle,
    /// `pxe-boot`.
    PxeBoot,
    /// `restart-service --service S`.
    RestartService {
        /// The systemd unit.
        service: String,
    },
    /// `repave`, optionally followed by an operation once the Node is deleted
    /// (`unbounded-cloud.io/repave-then`: `powerOff` or `pxeBoot`).
    Repave {
        /// The follow-up operation's name.
        then: Option<&'static str>,
    },
    /// `rollback --to N`.
    Rollback {
        /// The version to pin.
        to: i64,
    },
    /// `apply [--version N] [--disruptive]`: planned by [`crate::in_place::plan`], which reads
    /// the configuration versions; [`plan`] refuses it.
    Apply {
        /// `--version N`.
        version: Option<i64>,
        /// `--disruptive`.
        disruptive: bool,
    },
}

impl Verb {
    /// The command as typed, for messages.
    pub fn command(&self) -> &'static str {
        match self {
            Self::Reboot => "reboot",
            Self::Shutdown => "shutdown",
            Self::PowerOn => "power on",
            Self::PowerOff { .. } => "power off",
            Self::PowerCycle => "power cycle",
            Self::PxeBoot => "pxe-boot",
            Self::RestartService { .. } => "restart-service",
            Self::Repave { .. } => "repave",
            Self::Rollback { .. } => "rollback",
            Self::Apply { .. } => "apply",
        }
    }

    /// The MachineOperation name this verb creates, if it creates operations.
    pub fn operation_name(&self) -> Option<&'static str> {
        match self {
            Self::Reboot => Some(operations::REBOOT),
            Self::Shutdown => Some(operations::SHUTDOWN),
            Self::PowerOn => Some(operations::POWER_ON),
            Self::PowerOff { .. } => Some(operations::POWER_OFF),
            Self::PowerCycle => Some(operations::POWER_CYCLE),
            Self::PxeBoot => Some(operations::PXE_BOOT),
            Self::RestartService { .. } => Some(operations::RESTART_SERVICE),
            Self::Apply { .. } => Some(operations::APPLY_CONFIGURATION),
            Self::Repave { .. } | Self::Rollback { .. } => None,
        }
    }

    fn parameters(&self) -> BTreeMap<String, String> {
        match self {
            Self::RestartService { service } => {
                BTreeMap::from([(operations::SERVICE_PARAMETER.to_owned(), service.clone())])
            }
            Self::PowerOff { deallocate: true } => BTreeMap::from([(
                operations::DEALLOCATE_PARAMETER.to_owned(),
                "true".to_owned(),
            )]),
            _ => BTreeMap::new(),
        }
    }
}

/// One change to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create a MachineOperation on one machine.
    CreateOperation {
        /// The Machine.
        machine: String,
        /// `spec.operationName`.
        operation_name: &'static str,
        /// `spec.parameters`.
        parameters: BTreeMap<String, String>,
    },
    /// Annotate the Machine with a repave request.
    Repave {
        /// The Machine.
        machine: String,
        /// The operation to follow it with.
        then: Option<&'static str>,
    },
    /// Pin the Machine to a version, then request a repave.
    Rollback {
        /// The Machine.
        machine: String,
        /// The configuration (kept).
        configuration: String,
        /// The version to pin.
        version: i64,
        /// The version it records now, if any.
        from: Option<i64>,
    },
    /// Create an `applyConfiguration` MachineOperation on one machine.
    ApplyConfiguration {
        /// The Machine.
        machine: String,
        /// The configuration it runs.
        configuration: String,
        /// The version it records now.
        from: Option<i64>,
        /// The version it resolves to, applied.
        version: i64,
        /// Whether a repave is allowed.
        disruptive: bool,
        /// What the controller will do, for a person.
        what: String,
    },
}

impl Action {
    /// The Machine the action is about.
    pub fn machine(&self) -> &str {
        match self {
            Self::CreateOperation { machine, .. }
            | Self::Repave { machine, .. }
            | Self::Rollback { machine, .. }
            | Self::ApplyConfiguration { machine, .. } => machine,
        }
    }

    /// The `spec.parameters` of the operation an `ApplyConfiguration` creates (empty for
    /// the other actions, whose parameters they carry).
    pub fn operation_parameters(&self) -> BTreeMap<String, String> {
        match self {
            Self::ApplyConfiguration {
                version,
                disruptive,
                ..
            } => {
                let mut p = BTreeMap::from([(
                    operations::VERSION_PARAMETER.to_owned(),
                    version.to_string(),
                )]);
                if *disruptive {
                    p.insert(
                        operations::DISRUPTIVE_PARAMETER.to_owned(),
                        "true".to_owned(),
                    );
                }
                p
            }
            Self::CreateOperation { parameters, .. } => parameters.clone(),
            Self::Repave { .. } | Self::Rollback { .. } => BTreeMap::new(),
        }
    }

    /// What it does, in one line (what `--dry-run` prints).
    pub fn describe(&self) -> String {
        match self {
            Self::CreateOperation {
                machine,
                operation_name,
                parameters,
            } => {
                let mut text = format!("create MachineOperation {operation_name} on {machine}");
                if !parameters.is_empty() {
                    let p: Vec<String> =
                        parameters.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    text.push_str(&format!(" ({})", p.join(", ")));
                }
                text
            }
            Self::Repave { machine, then } => {
                let mut text = format!(
                    "annotate Machine {machine} with {}=<now>: drain and delete its Node, repave",
                    unbounded_api::well_known::annotations::REPAVE
                );
                if let Some(then) = then {
                    text.push_str(&format!(
                        ", then {then} ({}={then})",
                        unbounded_api::well_known::annotations::REPAVE_THEN
                    ));
                }
                text
            }
            Self::Rollback {
                machine,
                configuration,
                version,
                from,
            } => {
                let from = from.map_or("no recorded version".to_owned(), |v| format!("v{v}"));
                format!(
                    "set Machine {machine} spec.configurationRef to {configuration} v{version} (from {from}), then annotate it with {}=<now>: drain, delete its Node, repave",
                    unbounded_api::well_known::annotations::REPAVE
                )
            }
            Self::ApplyConfiguration {
                machine,
                configuration,
                from,
                version,
                what,
                ..
            } => {
                let p: Vec<String> = self
                    .operation_parameters()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let from = from.map_or("no recorded version".to_owned(), |v| format!("v{v}"));
                format!(
                    "create MachineOperation {} on {machine} ({}): {configuration} {from} → v{version}, {what}",
                    operations::APPLY_CONFIGURATION,
                    p.join(", ")
                )
            }
        }
    }
}

/// Why a verb is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Nothing to act on.
    #[error("no machines to {verb}")]
    NoMachines {
        /// The verb.
        verb: &'static str,
    },
    /// Some machines cannot carry the verb out; nothing is created.
    #[error("{verb} refused, nothing was changed:\n{}", refusals.iter().map(|(m, why)| format!("  {m}: {why}")).collect::<Vec<_>>().join("\n"))]
    Refused {
        /// The verb.
        verb: &'static str,
        /// Each machine that cannot, and why.
        refusals: Vec<(String, String)>,
    },
}

/// Why `machine` cannot carry out `verb`, or `None` when it can.
pub fn refusal(
    verb: &Verb,
    machine: &Machine,
    configurations: &[MachineConfiguration],
) -> Option<String> {
    if machine.metadata.deletion_timestamp.is_some() {
        return Some("the Machine is being deleted".to_owned());
    }
    if matches!(verb, Verb::Apply { .. }) {
        // Its decision needs the versions' templates: crate::in_place plans it.
        return Some(
            "apply is planned from the configuration versions (in_place::plan)".to_owned(),
        );
    }
    let deallocate = matches!(verb, Verb::PowerOff { deallocate: true });
    if let Some(name) = verb.operation_name() {
        return operation_refusal(machine, name, deallocate);
    }
    if let Verb::Repave { then: Some(then) } = verb {
        return operation_refusal(machine, then, false)
            .map(|why| format!("the repave's follow-up {then}: {why}"));
    }
    if let Verb::Rollback { to } = verb {
        if let Some(pool) = pool_of(machine) {
            return Some(format!(
                "belongs to MachinePool {pool}: roll the pool back instead (its spec.template.spec.configurationRef.version)"
            ));
        }
        let Some(configuration) = configuration_name(machine) else {
            return Some("has no configuration to roll back".to_owned());
        };
        let Some(found) = configurations
            .iter()
            .find(|c| c.name_any() == configuration)
        else {
            return Some(format!("its configuration {configuration} does not exist"));
        };
        let versions: Vec<i64> = found
            .status
            .as_ref()
            .map(|s| s.versions.iter().map(|v| v.version).collect())
            .unwrap_or_default();
        if !versions.contains(to) {
            let list: Vec<String> = versions.iter().map(|v| format!("v{v}")).collect();
            return Some(format!(
                "{configuration} has no version {to} (it has: {})",
                if list.is_empty() {
                    "none".to_owned()
                } else {
                    list.join(", ")
                }
            ));
        }
        let pinned = machine
            .spec
            .configuration_ref
            .as_ref()
            .and_then(|r| r.version);
        if recorded(machine).map(|(_, v)| v) == Some(*to) && pinned == Some(*to) {
            return Some(format!("already runs and pins {configuration} v{to}"));
        }
    }
    None
}

/// Why `machine` cannot run the operation `name`, or `None` when some handler can.
fn operation_refusal(machine: &Machine, name: &str, deallocate: bool) -> Option<String> {
    let provider = machine.spec.provider;
    if operations::route(provider, name).is_none() {
        return Some(format!(
            "a {} Machine has no handler for {name} (it runs: {})",
            provider.as_str(),
            operations::known(provider).join(", ")
        ));
    }
    let needs_bmc = operations::POWER.contains(&name) || name == operations::PXE_BOOT;
    let has_bmc = machine.spec.pxe.as_ref().is_some_and(|p| p.bmc.is_some());
    if provider == MachineProvider::Pxe && needs_bmc && !has_bmc {
        return Some(format!(
            "has no BMC (spec.pxe.bmc), so its power cannot be switched: {name} needs one"
        ));
    }
    if deallocate && provider != MachineProvider::Azure {
        return Some("--deallocate applies only to azure Machines".to_owned());
    }
    None
}

/// The configuration a rollback keeps: the one the Machine names, else the one it records.
fn configuration_name(machine: &Machine) -> Option<String> {
    machine
        .spec
        .configuration_ref
        .as_ref()
        .map(|r| r.name.clone())
        .or_else(|| recorded(machine).map(|(c, _)| c.to_owned()))
}

/// The actions `verb` takes on `machines`, or why it is refused (then nothing is done).
pub fn plan(
    verb: &Verb,
    machines: &[Machine],
    configurations: &[MachineConfiguration],
) -> Result<Vec<Action>, PlanError> {
    if machines.is_empty() {
        return Err(PlanError::NoMachines {
            verb: verb.command(),
        });
    }
    let refusals: Vec<(String, String)> = machines
        .iter()
        .filter_map(|m| refusal(verb, m, configurations).map(|why| (m.name_any(), why)))
        .collect();
    if !refusals.is_empty() {
        return Err(PlanError::Refused {
            verb: verb.command(),
            refusals,
        });
    }
    Ok(machines
        .iter()
        .map(|m| {
            let machine = m.name_any();
            match (verb.operation_name(), verb) {
                (Some(operation_name), _) => Action::CreateOperation {
                    machine,
                    operation_name,
                    parameters: verb.parameters(),
                },
                (None, Verb::Rollback { to }) => Action::Rollback {
                    machine,
                    configuration: configuration_name(m).unwrap_or_default(),
                    version: *to,
                    from: recorded(m).map(|(_, v)| v),
                },
                (None, Verb::Repave { then }) => Action::Repave {
                    machine,
                    then: *then,
                },
                (None, _) => Action::Repave {
                    machine,
                    then: None,
                },
            }
        })
        .collect())
}

/// Whether acting on `count` machines needs a confirmation.
pub fn needs_confirmation(count: usize, confirm_above: usize, yes: bool, dry_run: bool) -> bool {
    !yes && !dry_run && count > confirm_above
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::{configuration, machine, running};

    fn pxe(name: &str, bmc: bool) -> Machine {
        let mut pxe = json!({"macAddresses": ["52:54:00:00:00:01"]});
        if bmc {
            pxe["bmc"] = json!({"address": "ipmi://10.0.0.6", "credentialsSecretRef": {"namespace": "n", "name": "s"}});
        }
        machine(
            name,
            json!({}),
            json!({"provider": "pxe", "pxe": pxe}),
            json!({}),
        )
    }

    fn azure(name: &str) -> Machine {
        machine(
            name,
            json!({}),
            json!({"provider": "azure", "azure": {
                "subscriptionID": "00000000-0000-0000-0000-000000000000", "resourceGroup": "rg",
                "location": "westeurope", "vmSize": "Standard_D4s_v5",
                "image": {"publisher": "p", "offer": "o", "sku": "s"},
                "subnetID": "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/s",
                "sshPublicKey": "ssh-ed25519 AAAA"}}),
            json!({}),
        )
    }

    fn manual(name: &str) -> Machine {
        machine(name, json!({}), json!({}), json!({}))
    }

    fn op(machine: &str, name: &'static str, params: &[(&str, &str)]) -> Action {
        Action::CreateOperation {
            machine: machine.to_owned(),
            operation_name: name,
            parameters: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// Each verb on each kind of machine: the action, or a word of the refusal.
    #[test]
    fn what_each_verb_does_on_each_provider() {
        let configurations = vec![configuration("gpu", 0, None, &[(1, true), (2, true)])];
        let off = Verb::PowerOff { deallocate: false };
        let deallocate = Verb::PowerOff { deallocate: true };
        let restart = Verb::RestartService {
            service: "kubelet.service".into(),
        };
        let cases: Vec<(Verb, Machine, Result<Action, &str>)> = vec![
            (Verb::Reboot, manual("m"), Ok(op("m", "reboot", &[]))),
            (
                Verb::Shutdown,
                pxe("m", false),
                Ok(op("m", "shutdown", &[])),
            ),
            (
                restart.clone(),
                azure("m"),
                Ok(op("m", "restartService", &[("service", "kubelet.service")])),
            ),
            (
                Verb::PowerOn,
                manual("m"),
                Err("has no handler for powerOn"),
            ),
            (Verb::PowerOn, pxe("m", false), Err("has no BMC")),
            (Verb::PowerCycle, pxe("m", false), Err("has no BMC")),
            (Verb::PxeBoot, pxe("m", false), Err("has no BMC")),
            (Verb::PowerOn, pxe("m", true), Ok(op("m", "powerOn", &[]))),
            (off.clone(), pxe("m", true), Ok(op("m", "powerOff", &[]))),
            (Verb::PxeBoot, pxe("m", true), Ok(op("m", "pxeBoot", &[]))),
            (Verb::PxeBoot, azure("m"), Err("has no handler for pxeBoot")),
            (Verb::PowerOn, azure("m"), Ok(op("m", "powerOn", &[]))),
            (
                deallocate.clone(),
                azure("m"),
                Ok(op("m", "powerOff", &[("deallocate", "true")])),
            ),
            (
                deallocate,
                pxe("m", true),
                Err("--deallocate applies only to azure"),
            ),
            (
                Verb::Repave { then: None },
                manual("m"),
                Ok(Action::Repave {
                    machine: "m".into(),
                    then: None,
                }),
            ),
            (
                Verb::Repave {
                    then: Some("pxeBoot"),
                },
                pxe("m", true),
                Ok(Action::Repave {
                    machine: "m".into(),
                    then: Some("pxeBoot"),
                }),
            ),
            (
                Verb::Repave {
                    then: Some("pxeBoot"),
                },
                pxe("m", false),
                Err("the repave's follow-up pxeBoot: has no BMC"),
            ),
            (
                Verb::Repave {
                    then: Some("powerOff"),
                },
                manual("m"),
                Err("has no handler for powerOff"),
            ),
            (
                Verb::Rollback { to: 1 },
                running("m", "gpu", 2),
                Ok(Action::Rollback {
                    machine: "m".into(),
                    configuration: "gpu".into(),
                    version: 1,
                    from: Some(2),
                }),
            ),
            (
                Verb::Rollback { to: 7 },
                running("m", "gpu", 2),
                Err("gpu has no version 7 (it has: v1, v2)"),
            ),
            (
                Verb::Rollback { to: 1 },
                manual("m"),
                Err("has no configuration"),
            ),
            (
                Verb::Rollback { to: 1 },
                running("m", "cpu", 1),
                Err("its configuration cpu does not exist"),
            ),
        ];
        for (verb, target, expected) in cases {
            let got = plan(&verb, std::slice::from_ref(&target), &configurations);
            match (&got, &expected) {
                (Ok(actions), Ok(action)) => {
                    assert_eq!(actions, std::slice::from_ref(action), "{verb:?}")
                }
                (Err(PlanError::Refused { refusals, .. }), Err(word)) => {
                    assert_eq!(refusals.len(), 1);
                    assert!(
                        refusals[0].1.contains(word),
                        "{verb:?}: {:?} lacks {word:?}",
                        refusals[0].1
                    );
                }
                _ => panic!(
                    "{verb:?} on {:?}: got {got:?}, expected {expected:?}",
                    target.spec.provider
                ),
            }
        }
    }

    #[test]
    fn one_machine_that_cannot_refuses_the_whole_verb() {
        let machines = vec![pxe("a", true), pxe("b", false), manual("c"), pxe("d", true)];
        let err = plan(&Verb::PowerCycle, &machines, &[]).unwrap_err();
        let PlanError::Refused { refusals, .. } = &err else {
            panic!("{err:?}")
        };
        let who: Vec<&str> = refusals.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(who, ["b", "c"]);
        let text = err.to_string();
        assert!(
            text.starts_with("power cycle refused, nothing was changed:"),
            "{text}"
        );
        assert!(text.contains("  b: has no BMC"), "{text}");
    }

    #[test]
    fn nothing_to_act_on_and_machines_being_deleted_are_refused() {
        assert_eq!(
            plan(&Verb::Reboot, &[], &[]),
            Err(PlanError::NoMachines { verb: "reboot" })
        );
        let mut m = manual("m");
        m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            crate::fixtures::now(),
        ));
        assert!(
            refusal(&Verb::Repave { then: None }, &m, &[])
                .unwrap()
                .contains("being deleted")
        );
    }

    #[test]
    fn rollback_refuses_pool_members_and_a_version_already_pinned() {
        let configurations = vec![configuration("gpu", 0, None, &[(1, true), (2, true)])];
        let mut member = running("m", "gpu", 2);
        member.metadata.labels = Some(crate::facts::label_map(&[(
            unbounded_api::well_known::labels::POOL,
            "web",
        )]));
        assert!(
            refusal(&Verb::Rollback { to: 1 }, &member, &configurations)
                .unwrap()
                .contains("MachinePool web")
        );
        let mut pinned = running("p", "gpu", 1);
        pinned.spec.configuration_ref = Some(unbounded_api::ConfigurationRef {
            name: "gpu".into(),
            version: Some(1),
        });
        assert!(
            refusal(&Verb::Rollback { to: 1 }, &pinned, &configurations)
                .unwrap()
                .contains("already")
        );
        // Pinned but not yet repaved onto it: rolling back again repaves.
        assert_eq!(
            refusal(&Verb::Rollback { to: 2 }, &pinned, &configurations),
            None
        );
    }

    #[test]
    fn confirmation_is_asked_above_the_threshold_unless_yes_or_dry_run() {
        let cases = [
            (5, 5, false, false, false),
            (6, 5, false, false, true),
            (6, 5, true, false, false),
            (6, 5, false, true, false),
            (1, 0, false, false, true),
        ];
        for (count, above, yes, dry, expected) in cases {
            assert_eq!(
                needs_confirmation(count, above, yes, dry),
                expected,
                "{count} > {above}"
            );
        }
    }

    #[test]
    fn dry_run_descriptions_name_what_is_written() {
        assert_eq!(
            op("m", "restartService", &[("service", "kubelet.service")]).describe(),
            "create MachineOperation restartService on m (service=kubelet.service)"
        );
        assert!(
            Action::Repave {
                machine: "m".into(),
                then: None,
            }
            .describe()
            .contains("unbounded-cloud.io/repave=<now>")
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn any_machine() -> impl Strategy<Value = Machine> {
            (0usize..4, any::<bool>(), "[a-z]{1,6}").prop_map(|(kind, deleting, name)| {
                let mut m = match kind {
                    0 => pxe(&name, true),
                    1 => pxe(&name, false),
                    2 => azure(&name),
                    _ => manual(&name),
                };
                if deleting {
                    m.metadata.deletion_timestamp = Some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            crate::fixtures::now(),
                        ),
                    );
                }
                m
            })
        }

        fn any_verb() -> impl Strategy<Value = Verb> {
            prop_oneof![
                Just(Verb::Reboot),
                Just(Verb::Shutdown),
                Just(Verb::PowerOn),
                any::<bool>().prop_map(|deallocate| Verb::PowerOff { deallocate }),
                Just(Verb::PowerCycle),
                Just(Verb::PxeBoot),
                Just(Verb::RestartService {
                    service: "kubelet.service".into()
                }),
                prop_oneof![Just(None), Just(Some("powerOff")), Just(Some("pxeBoot"))]
                    .prop_map(|then| Verb::Repave { then }),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(29), ..ProptestConfig::default() })]

            /// A plan is all or nothing, and never writes an operation that no handler of
            /// the Machine's provider runs (by the API's routing table), nor a power
            /// operation for a PXE Machine without a BMC, nor anything for a Machine being
            /// deleted.
            #[test]
            fn plans_are_all_or_nothing_and_only_routable(
                verb in any_verb(),
                machines in proptest::collection::vec(any_machine(), 0..6),
            ) {
                match plan(&verb, &machines, &[]) {
                    Ok(actions) => {
                        prop_assert_eq!(actions.len(), machines.len());
                        for (action, m) in actions.iter().zip(&machines) {
                            prop_assert_eq!(action.machine(), m.name_any());
                            prop_assert!(m.metadata.deletion_timestamp.is_none());
                            let operation = match action {
                                Action::CreateOperation { operation_name, .. } => Some(*operation_name),
                                Action::Repave { then, .. } => *then,
                                Action::Rollback { .. } | Action::ApplyConfiguration { .. } => None,
                            };
                            if let Some(name) = operation {
                                prop_assert!(operations::route(m.spec.provider, name).is_some());
                                let bmc = m.spec.pxe.as_ref().is_some_and(|p| p.bmc.is_some());
                                let power = operations::POWER.contains(&name) || name == operations::PXE_BOOT;
                                prop_assert!(m.spec.provider != MachineProvider::Pxe || !power || bmc);
                            }
                        }
                    }
                    Err(PlanError::NoMachines { .. }) => prop_assert!(machines.is_empty()),
                    Err(PlanError::Refused { refusals, .. }) => {
                        prop_assert!(!refusals.is_empty());
                        for (name, _) in &refusals {
                            prop_assert!(machines.iter().any(|m| &m.name_any() == name));
                        }
                    }
                }
            }
        }
    }
}
