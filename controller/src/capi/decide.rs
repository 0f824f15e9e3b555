//! The Cluster API decisions, pure over plain data: what an `UnboundedMachine` does next
//! ([`next_step`]), the status it reports ([`machine_status`]), the configuration an
//! `UnboundedConfig` resolves to ([`resolve_configuration`]) and the Secret that carries it
//! ([`bootstrap_data`], [`read_bootstrap_data`]), and an `UnboundedCluster`'s failure
//! domains ([`failure_domains`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use unbounded_api::capi::{
    CapiMachineAddress, FailureDomain, MachineInitialization, UnboundedMachineStatus,
};
use unbounded_api::condition::{self, new_condition};
use unbounded_api::inventory::labels::SWITCH;
use unbounded_api::well_known::annotations;
use unbounded_api::well_known::conditions::INFRASTRUCTURE_READY;
use unbounded_api::{ConfigurationRef, Machine, MachineConfigurationVersion, PowerState};

/// Condition types and reasons of the Cluster API kinds. `Ready` is what Cluster API
/// mirrors (an UnboundedMachine's into its Machine's `InfrastructureReady`, an
/// UnboundedConfig's into `BootstrapConfigReady`).
pub mod conditions {
    /// The object is ready for Cluster API.
    pub const READY: &str = "Ready";
    /// An UnboundedMachine has its Unbounded Machine.
    pub const MACHINE_CLAIMED: &str = "MachineClaimed";
    /// Reconciliation is paused (`cluster.x-k8s.io/paused`, or the Cluster's `spec.paused`).
    pub const PAUSED: &str = "Paused";
    /// An UnboundedControlPlane can be reached by Cluster API.
    pub const AVAILABLE: &str = "Available";
    /// An UnboundedConfig knows which configuration version its machine runs.
    pub const CONFIGURATION_RESOLVED: &str = "ConfigurationResolved";

    /// Reasons.
    pub mod reasons {
        /// Paused.
        pub const PAUSED: &str = "Paused";
        /// Not paused.
        pub const NOT_PAUSED: &str = "NotPaused";
        /// No Cluster API Machine owns the object yet.
        pub const WAITING_FOR_OWNER: &str = "WaitingForMachine";
        /// The Cluster API Machine has no bootstrap data Secret yet.
        pub const WAITING_FOR_BOOTSTRAP: &str = "WaitingForBootstrapData";
        /// The bootstrap data is not an Unbounded configuration reference.
        pub const BOOTSTRAP_DATA_INVALID: &str = "BootstrapDataInvalid";
        /// No free PXE Machine meets the selector and requirements (retried).
        pub const NO_FREE_MACHINE: &str = "NoFreeMachine";
        /// The Machine is claimed (pxe) or created (azure).
        pub const CLAIMED: &str = "Claimed";
        /// The Machine is released to the inventory (an Event).
        pub const RELEASED: &str = "Released";
        /// The Machine is being created (azure).
        pub const CREATING: &str = "Creating";
        /// The Machine has no provider ID yet.
        pub const WAITING_FOR_PROVIDER_ID: &str = "WaitingForProviderID";
        /// The Machine is powered on and its infrastructure is ready.
        pub const PROVISIONED: &str = "Provisioned";
        /// The Machine's infrastructure is not ready yet (its reason follows, as
        /// `Provisioning: <Machine's reason>`).
        pub const PROVISIONING: &str = "Provisioning";
        /// The claimed Machine is gone (deleted underneath).
        pub const MACHINE_GONE: &str = "MachineGone";
        /// The data Secret exists.
        pub const DATA_SECRET_CREATED: &str = "DataSecretCreated";
        /// No configuration version runs the Machine's Kubernetes version (retried).
        pub const NO_VERSION: &str = "NoVersionForKubernetes";
        /// The configuration or its pinned version does not exist (retried).
        pub const CONFIGURATION_NOT_FOUND: &str = "ConfigurationNotFound";
        /// A Secret of the data Secret's name exists and is not this object's.
        pub const SECRET_NAME_TAKEN: &str = "SecretNameTaken";
        /// The control plane endpoint is set.
        pub const ENDPOINT_SET: &str = "ControlPlaneEndpointSet";
        /// The Cluster's kubeconfig Secret exists.
        pub const KUBECONFIG_FOUND: &str = "KubeconfigFound";
        /// The Cluster's kubeconfig Secret does not exist (yet).
        pub const WAITING_FOR_KUBECONFIG: &str = "WaitingForKubeconfig";
        /// The control plane endpoint is not set yet.
        pub const WAITING_FOR_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
    }
}

use conditions::reasons;

/// What an `UnboundedMachine`'s reconcile sees.
#[derive(Debug, Clone, Copy)]
pub struct MachineFacts<'a> {
    /// Paused by annotation or by its Cluster.
    pub paused: bool,
    /// A Cluster API Machine owns it.
    pub has_owner: bool,
    /// What the owner's bootstrap data says the machine runs.
    pub bootstrap: Bootstrap<'a>,
    /// The Unbounded Machine it claimed or created, as the cache shows it.
    pub claimed: Option<&'a Machine>,
    /// Its own `spec.providerID`.
    pub provider_id: Option<&'a str>,
    /// It creates its Machine (azure) rather than claiming one (pxe).
    pub creates: bool,
}

/// What the owner's bootstrap data says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bootstrap<'a> {
    /// No data Secret named yet.
    NotYet,
    /// The configuration the machine runs.
    Ready(&'a ConfigurationRef),
    /// The Secret is missing or not ours: why.
    Invalid(&'a str),
}

/// What an `UnboundedMachine` does next. Every step ends in a status write; none is
/// terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing but the `Paused` condition.
    Paused,
    /// Wait: for an owner, for bootstrap data, for valid bootstrap data.
    Wait,
    /// Claim a free PXE Machine for this configuration.
    Claim(ConfigurationRef),
    /// Create the Azure Machine for this configuration.
    Create(ConfigurationRef),
    /// Copy the Machine's provider ID into `spec.providerID`.
    SetProviderId(String),
    /// Report the Machine's state.
    Report,
}

/// The next step of an `UnboundedMachine` that is not being deleted. A Machine is claimed
/// only once the bootstrap data says what it runs (the contract: infrastructure waits for
/// bootstrap data), so that a claimed machine never boots into a configuration its Cluster
/// API Machine did not ask for.
pub fn next_step(facts: &MachineFacts<'_>) -> Step {
    if facts.paused {
        return Step::Paused;
    }
    match (facts.claimed, facts.bootstrap) {
        (Some(machine), _) => match (&machine.spec.provider_id, facts.provider_id) {
            (Some(id), None) => Step::SetProviderId(id.clone()),
            _ => Step::Report,
        },
        // Claimed before and gone underneath: it stays gone, never replaced behind
        // Cluster API's back (a MachineHealthCheck replaces the Cluster API Machine).
        (None, _) if facts.provider_id.is_some() => Step::Report,
        (None, _) if !facts.has_owner => Step::Wait,
        (None, Bootstrap::Ready(reference)) if facts.creates => Step::Create(reference.clone()),
        (None, Bootstrap::Ready(reference)) => Step::Claim(reference.clone()),
        (None, Bootstrap::NotYet | Bootstrap::Invalid(_)) => Step::Wait,
    }
}

/// Where a Machine is, for Cluster API to spread Machines over: its
/// `topology.kubernetes.io/zone` label, else the switch its boot interface is cabled to
/// (from its inventory's LLDP, [`SWITCH`]).
pub fn failure_domain(labels: &BTreeMap<String, String>) -> Option<String> {
    labels
        .get("topology.kubernetes.io/zone")
        .or_else(|| labels.get(SWITCH))
        .cloned()
}

/// The `Paused` condition every kind reports (`cluster.x-k8s.io/paused`, or the Cluster's
/// `spec.paused`).
pub fn paused_condition(paused: bool, generation: Option<i64>) -> Condition {
    if paused {
        new_condition(
            conditions::PAUSED,
            true,
            reasons::PAUSED,
            "reconciliation is paused",
            generation,
        )
    } else {
        new_condition(
            conditions::PAUSED,
            false,
            reasons::NOT_PAUSED,
            "",
            generation,
        )
    }
}

/// Whether a claimed Machine is provisioned in the contract's sense: it has its provider
/// ID, is powered on, its infrastructure is ready (the bootstrap, our agent, can run), and
/// it runs what its claim names ([`runs_its_claim`]). A warm machine claimed while it runs
/// another version keeps that version's Node until its repave replaces it: reported
/// provisioned before, Cluster API would take that Node (found by provider ID) as this
/// Machine's, Running and Ready with the wrong version.
fn is_provisioned(machine: &Machine) -> bool {
    let status = machine.status.as_ref();
    machine.spec.provider_id.is_some()
        && status.is_some_and(|s| {
            s.power == Some(PowerState::On)
                && condition::is_true(&s.conditions, INFRASTRUCTURE_READY)
        })
        && runs_its_claim(machine)
}

/// Whether a Machine records the configuration its `configurationRef` names (that version,
/// when it names one) with no repave requested or under way (`unbounded-cloud.io/repave`,
/// `unbounded-cloud.io/repaving`: its Node is not yet the one of that version).
pub fn runs_its_claim(machine: &Machine) -> bool {
    let recorded = machine
        .status
        .as_ref()
        .and_then(|s| s.configuration.as_ref());
    let names_it = match (recorded, machine.spec.configuration_ref.as_ref()) {
        (Some(recorded), Some(wanted)) => {
            recorded.name == wanted.name && wanted.version.is_none_or(|v| v == recorded.version)
        }
        _ => false,
    };
    let marks = machine.metadata.annotations.as_ref();
    names_it
        && !marks.is_some_and(|a| {
            a.contains_key(annotations::REPAVE) || a.contains_key(annotations::REPAVING)
        })
}

/// Whether a Machine just claimed for `reference` must be repaved onto it: it is not
/// powered off and records another configuration or version. (A powered-off one is booted
/// onto it by the claim, [`crate::pool::act::after_claim`]; one that records none gets its
/// first from the claim.) Under an `OnDelete` configuration nothing else would move it, and
/// under any strategy it must not serve its Cluster API Machine with the other version.
pub fn repave_on_claim(machine: &Machine, reference: &ConfigurationRef) -> bool {
    let status = machine.status.as_ref();
    let off = status.and_then(|s| s.power) == Some(PowerState::Off);
    let recorded = status.and_then(|s| s.configuration.as_ref());
    !off && recorded.is_some_and(|r| {
        r.name != reference.name || reference.version.is_some_and(|v| v != r.version)
    })
}

/// The status an `UnboundedMachine` reports, from what it sees and what it reported last.
/// `provisioned` never goes back to false once true (Cluster API reads it as a one-way
/// step). A Machine that is not ready says why in `Ready`'s message, its own
/// `InfrastructureReady` reason and message carried over: a BMC that fails is a reason,
/// retried, never a terminal failure. `waiting` says why a step waits (`NoFreeMachine`
/// and its count), when it does.
pub fn machine_status(
    facts: &MachineFacts<'_>,
    previous: Option<&UnboundedMachineStatus>,
    waiting: Option<(&str, String)>,
    generation: Option<i64>,
) -> UnboundedMachineStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let was_provisioned = status
        .initialization
        .as_ref()
        .and_then(|i| i.provisioned)
        .unwrap_or(false);
    let set = |list: &mut Vec<Condition>, type_: &str, ok: bool, reason: &str, message: String| {
        condition::set(list, new_condition(type_, ok, reason, message, generation));
    };
    condition::set(
        &mut status.conditions,
        paused_condition(facts.paused, generation),
    );
    if facts.paused {
        return status;
    }
    let (claimed, claim_reason, claim_message) = match (facts.claimed, waiting) {
        (Some(machine), _) => (
            true,
            reasons::CLAIMED,
            format!("Machine {}", machine.metadata.name.as_deref().unwrap_or("")),
        ),
        (None, _) if facts.provider_id.is_some() => (
            false,
            reasons::MACHINE_GONE,
            format!(
                "the Machine with provider ID {} is gone",
                facts.provider_id.unwrap_or("")
            ),
        ),
        (None, Some((reason, message))) => (false, reason, message),
        (None, None) if !facts.has_owner => (
            false,
            reasons::WAITING_FOR_OWNER,
            "no Cluster API Machine owns this UnboundedMachine yet".to_owned(),
        ),
        (None, None) => match facts.bootstrap {
            Bootstrap::NotYet => (
                false,
                reasons::WAITING_FOR_BOOTSTRAP,
                "the Cluster API Machine has no bootstrap data Secret yet".to_owned(),
            ),
            Bootstrap::Invalid(why) => (false, reasons::BOOTSTRAP_DATA_INVALID, why.to_owned()),
            Bootstrap::Ready(_) if facts.creates => {
                (false, reasons::CREATING, "creating the Machine".to_owned())
            }
            Bootstrap::Ready(_) => (
                false,
                reasons::NO_FREE_MACHINE,
                "looking for a free PXE Machine".to_owned(),
            ),
        },
    };
    set(
        &mut status.conditions,
        conditions::MACHINE_CLAIMED,
        claimed,
        claim_reason,
        claim_message.clone(),
    );
    let provisioned = was_provisioned || facts.claimed.is_some_and(is_provisioned);
    if let Some(machine) = facts.claimed {
        status.machine_ref = Some(unbounded_api::MachineRef {
            name: machine.metadata.name.clone().unwrap_or_default(),
        });
        let machine_status = machine.status.as_ref();
        status.addresses = machine_status
            .map(|s| {
                s.addresses
                    .iter()
                    .map(|a| CapiMachineAddress {
                        type_: a.type_.clone(),
                        address: a.address.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let node_name = machine
            .spec
            .node_name
            .clone()
            .or_else(|| machine.metadata.name.clone());
        if let Some(name) = node_name
            && !status.addresses.iter().any(|a| a.type_ == "Hostname")
        {
            status.addresses.push(CapiMachineAddress {
                type_: "Hostname".to_owned(),
                address: name,
            });
        }
        status.failure_domain = machine.metadata.labels.as_ref().and_then(failure_domain);
    }
    status.initialization = Some(MachineInitialization {
        provisioned: Some(provisioned),
    });
    let (ready_reason, ready_message) = match facts.claimed {
        _ if provisioned => (reasons::PROVISIONED.to_owned(), String::new()),
        None => (claim_reason.to_owned(), claim_message),
        Some(machine) if machine.spec.provider_id.is_none() => (
            reasons::WAITING_FOR_PROVIDER_ID.to_owned(),
            "the Machine has no provider ID yet".to_owned(),
        ),
        Some(machine) => {
            let infrastructure = machine
                .status
                .as_ref()
                .and_then(|s| condition::find(&s.conditions, INFRASTRUCTURE_READY));
            match infrastructure {
                Some(c) if c.status != "True" => (
                    reasons::PROVISIONING.to_owned(),
                    format!("{}: {}", c.reason, c.message),
                ),
                _ => (
                    reasons::PROVISIONING.to_owned(),
                    "powering on to boot its configuration".to_owned(),
                ),
            }
        }
    };
    set(
        &mut status.conditions,
        conditions::READY,
        provisioned,
        &ready_reason,
        ready_message,
    );
    status
}

/// Why an `UnboundedConfig` has no configuration version yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The condition reason.
    pub reason: &'static str,
    /// What an operator reads.
    pub message: String,
}

/// The configuration an `UnboundedConfig` resolves to: its pinned version when it names
/// one (which must exist), else the newest version that runs the Cluster API Machine's
/// Kubernetes `version` ([`unbounded_api::capi::version_for_kubernetes`]), else (a
/// Machine without a version) the newest version.
pub fn resolve_configuration(
    wanted: &ConfigurationRef,
    kubernetes: Option<&str>,
    versions: &[MachineConfigurationVersion],
) -> Result<ConfigurationRef, Unresolved> {
    let own: Vec<i64> = versions
        .iter()
        .filter(|v| v.spec.configuration_name == wanted.name)
        .map(|v| v.spec.version)
        .collect();
    let resolved = |version| ConfigurationRef {
        name: wanted.name.clone(),
        version: Some(version),
    };
    if let Some(pinned) = wanted.version {
        return if own.contains(&pinned) {
            Ok(resolved(pinned))
        } else {
            Err(Unresolved {
                reason: reasons::CONFIGURATION_NOT_FOUND,
                message: format!(
                    "MachineConfiguration {} has no version {pinned}",
                    wanted.name
                ),
            })
        };
    }
    match kubernetes {
        Some(kubernetes) => {
            unbounded_api::capi::version_for_kubernetes(versions, &wanted.name, kubernetes)
                .map(resolved)
                .map_err(|e| Unresolved {
                    reason: reasons::NO_VERSION,
                    message: e.to_string(),
                })
        }
        None => own.iter().max().copied().map(resolved).ok_or(Unresolved {
            reason: reasons::CONFIGURATION_NOT_FOUND,
            message: format!("MachineConfiguration {} has no versions", wanted.name),
        }),
    }
}

/// The bootstrap data Secret's `format`: what its `value` holds.
pub const DATA_FORMAT: &str = "unbounded";

/// The bootstrap data Secret's keys (the contract's `value`, and `format`): the
/// configuration reference as JSON, which the infrastructure side writes into the claimed
/// Machine's `spec.configurationRef`. Not a cloud-init script: our agent, not kubeadm,
/// joins the node, and it reads its configuration from the Machine.
pub fn bootstrap_data(reference: &ConfigurationRef) -> BTreeMap<String, String> {
    let value = serde_json::json!({"configurationRef": reference}).to_string();
    BTreeMap::from([
        ("value".to_owned(), value),
        ("format".to_owned(), DATA_FORMAT.to_owned()),
    ])
}

/// Reads [`bootstrap_data`] back from a Secret's decoded `value` and `format`: the
/// configuration with its version, or why it is not ours (a kubeadm bootstrap's
/// cloud-config, say).
pub fn read_bootstrap_data(
    format: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<ConfigurationRef, String> {
    if format != Some(DATA_FORMAT.as_bytes()) {
        return Err(format!(
            "the bootstrap data's format is {}, not {DATA_FORMAT}: an UnboundedMachine runs an UnboundedConfig's configuration (set the MachineDeployment's bootstrap configRef to an UnboundedConfigTemplate)",
            format.map_or_else(
                || "unset".to_owned(),
                |f| format!("'{}'", String::from_utf8_lossy(f))
            )
        ));
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Data {
        configuration_ref: ConfigurationRef,
    }
    let data: Data = serde_json::from_slice(value.unwrap_or_default())
        // Where, not what: serde's message can quote the data, and a Secret's content
        // never goes into a condition.
        .map_err(|e| {
            format!(
                "the bootstrap data is not a configuration reference ({:?} error at line {}, column {})",
                e.classify(),
                e.line(),
                e.column()
            )
        })?;
    match data.configuration_ref.version {
        Some(_) => Ok(data.configuration_ref),
        None => Err("the bootstrap data's configuration reference has no version".to_owned()),
    }
}

/// An `UnboundedCluster`'s failure domains: every distinct one of the PXE inventory's
/// Machines ([`failure_domain`]), by name, each fit for control plane Machines too.
pub fn failure_domains<'a>(
    labels: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
) -> Vec<FailureDomain> {
    let names: std::collections::BTreeSet<String> =
        labels.into_iter().filter_map(failure_domain).collect();
    names
        .into_iter()
        .map(|name| FailureDomain {
            name,
            control_plane: Some(true),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn machine(
        provider_id: Option<&str>,
        power: Option<&str>,
        infra: Option<(&str, &str)>,
    ) -> Machine {
        let mut status = json!({"addresses": [{"type": "InternalIP", "address": "10.99.0.21"}]});
        if let Some(power) = power {
            status["power"] = json!(power);
        }
        if let Some((ok, reason)) = infra {
            status["conditions"] = json!([{
                "type": "InfrastructureReady", "status": ok, "reason": reason,
                "message": "BMC 10.0.0.9: connection refused",
                "lastTransitionTime": "2026-11-29T10:00:00Z"
            }]);
        }
        // Claimed for version 3 of `workers`, which it records (see `runs_its_claim`).
        status["configuration"] = json!({"name": "workers", "version": 3});
        let mut spec = json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:00:00:01"]},
                              "configurationRef": {"name": "workers", "version": 3}});
        if let Some(id) = provider_id {
            spec["providerID"] = json!(id);
        }
        serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m1", "labels": {SWITCH: "leaf-1"}},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn reference(version: Option<i64>) -> ConfigurationRef {
        ConfigurationRef {
            name: "workers".into(),
            version,
        }
    }

    fn facts<'a>(
        claimed: Option<&'a Machine>,
        bootstrap: Bootstrap<'a>,
        provider_id: Option<&'a str>,
    ) -> MachineFacts<'a> {
        MachineFacts {
            paused: false,
            has_owner: true,
            bootstrap,
            claimed,
            provider_id,
            creates: false,
        }
    }

    #[test]
    fn next_step_table() {
        let r = reference(Some(3));
        let m_without_id = machine(None, None, None);
        let m = machine(Some("pxe://52:54:00:00:00:01"), Some("On"), None);
        let cases: Vec<(&str, MachineFacts<'_>, Step)> = vec![
            (
                "paused wins",
                MachineFacts {
                    paused: true,
                    ..facts(Some(&m), Bootstrap::Ready(&r), None)
                },
                Step::Paused,
            ),
            (
                "no owner",
                MachineFacts {
                    has_owner: false,
                    ..facts(None, Bootstrap::Ready(&r), None)
                },
                Step::Wait,
            ),
            (
                "no bootstrap data",
                facts(None, Bootstrap::NotYet, None),
                Step::Wait,
            ),
            (
                "invalid data",
                facts(None, Bootstrap::Invalid("kubeadm"), None),
                Step::Wait,
            ),
            (
                "claims",
                facts(None, Bootstrap::Ready(&r), None),
                Step::Claim(r.clone()),
            ),
            (
                "azure creates",
                MachineFacts {
                    creates: true,
                    ..facts(None, Bootstrap::Ready(&r), None)
                },
                Step::Create(r.clone()),
            ),
            (
                "copies the provider ID",
                facts(Some(&m), Bootstrap::Ready(&r), None),
                Step::SetProviderId("pxe://52:54:00:00:00:01".into()),
            ),
            (
                "waits for one",
                facts(Some(&m_without_id), Bootstrap::Ready(&r), None),
                Step::Report,
            ),
            (
                "reports",
                facts(
                    Some(&m),
                    Bootstrap::Ready(&r),
                    Some("pxe://52:54:00:00:00:01"),
                ),
                Step::Report,
            ),
            (
                "gone underneath: never a second claim",
                facts(None, Bootstrap::Ready(&r), Some("pxe://52:54:00:00:00:01")),
                Step::Report,
            ),
        ];
        for (name, facts, want) in cases {
            assert_eq!(next_step(&facts), want, "{name}");
        }
    }

    #[test]
    fn a_failing_bmc_is_a_reason_never_a_failure() {
        let r = reference(Some(3));
        let m = machine(
            Some("pxe://52:54:00:00:00:01"),
            Some("Off"),
            Some(("False", "BmcUnreachable")),
        );
        let status = machine_status(
            &facts(
                Some(&m),
                Bootstrap::Ready(&r),
                Some("pxe://52:54:00:00:00:01"),
            ),
            None,
            None,
            Some(1),
        );
        let ready = condition::find(&status.conditions, conditions::READY).unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, reasons::PROVISIONING);
        assert_eq!(
            ready.message,
            "BmcUnreachable: BMC 10.0.0.9: connection refused"
        );
        assert_eq!(status.initialization.unwrap().provisioned, Some(false));
        assert!(condition::is_true(
            &status.conditions,
            conditions::MACHINE_CLAIMED
        ));
        assert_eq!(status.failure_domain.as_deref(), Some("leaf-1"));
        assert_eq!(status.machine_ref.unwrap().name, "m1");
        let types: Vec<_> = status
            .addresses
            .iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(types, [("InternalIP", "10.99.0.21"), ("Hostname", "m1")]);
    }

    #[test]
    fn provisioned_is_one_way() {
        let r = reference(Some(3));
        let up = machine(
            Some("pxe://52:54:00:00:00:01"),
            Some("On"),
            Some(("True", "Ready")),
        );
        let id = Some("pxe://52:54:00:00:00:01");
        let first = machine_status(
            &facts(Some(&up), Bootstrap::Ready(&r), id),
            None,
            None,
            Some(1),
        );
        assert_eq!(
            first.initialization.as_ref().unwrap().provisioned,
            Some(true)
        );
        assert!(condition::is_true(&first.conditions, conditions::READY));
        // The BMC fails later (or the host is powered off): still provisioned; the
        // Machine's own conditions and the Node say the rest.
        let down = machine(
            Some("pxe://52:54:00:00:00:01"),
            Some("Off"),
            Some(("False", "BmcUnreachable")),
        );
        let later = machine_status(
            &facts(Some(&down), Bootstrap::Ready(&r), id),
            Some(&first),
            None,
            Some(1),
        );
        assert_eq!(later.initialization.unwrap().provisioned, Some(true));
        // Deleted underneath: MachineClaimed says so, nothing is claimed instead.
        let gone = machine_status(
            &facts(None, Bootstrap::Ready(&r), id),
            Some(&first),
            None,
            Some(1),
        );
        let claimed = condition::find(&gone.conditions, conditions::MACHINE_CLAIMED).unwrap();
        assert_eq!(
            (claimed.status.as_str(), claimed.reason.as_str()),
            ("False", reasons::MACHINE_GONE)
        );
    }

    #[test]
    fn provisioned_only_once_the_machine_runs_its_claim() {
        let r = reference(Some(3));
        let id = Some("pxe://52:54:00:00:00:01");
        let up = || {
            machine(
                Some("pxe://52:54:00:00:00:01"),
                Some("On"),
                Some(("True", "Ready")),
            )
        };
        let provisioned = |m: &Machine| {
            machine_status(
                &facts(Some(m), Bootstrap::Ready(&r), id),
                None,
                None,
                Some(1),
            )
            .initialization
            .and_then(|i| i.provisioned)
            .unwrap_or(false)
        };
        assert!(provisioned(&up()));
        // A warm machine claimed while it runs version 2: its Node is version 2's.
        let mut other = up();
        other.status.as_mut().unwrap().configuration = Some(unbounded_api::ResolvedConfiguration {
            name: "workers".into(),
            version: 2,
        });
        assert!(!provisioned(&other));
        assert!(repave_on_claim(&other, &r));
        // Its repave requested, then under way: not yet.
        for mark in [annotations::REPAVE, annotations::REPAVING] {
            let mut repaving = up();
            repaving.metadata.annotations =
                Some([(mark.to_owned(), "2026-11-29T10:00:00Z".to_owned())].into());
            assert!(!provisioned(&repaving), "{mark}");
        }
        // Nothing recorded yet (never booted): not yet, and no repave (its first boot is).
        let mut fresh = up();
        fresh.status.as_mut().unwrap().configuration = None;
        assert!(!provisioned(&fresh));
        assert!(!repave_on_claim(&fresh, &r));
        // Powered off on another version: the claim's boot repaves it, not a repave here.
        let mut off = other.clone();
        off.status.as_mut().unwrap().power = Some(PowerState::Off);
        assert!(!repave_on_claim(&off, &r));
        // The same version: nothing to repave.
        assert!(!repave_on_claim(&up(), &r));
        assert!(repave_on_claim(&up(), &reference(Some(4))));
        assert!(!repave_on_claim(&up(), &reference(None)));
    }

    #[test]
    fn waiting_says_why() {
        let r = reference(Some(3));
        let status = machine_status(
            &facts(None, Bootstrap::Ready(&r), None),
            None,
            Some((
                reasons::NO_FREE_MACHINE,
                "no free PXE Machine matches (3 match the selector, 0 are free)".into(),
            )),
            Some(2),
        );
        let ready = condition::find(&status.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.status.as_str()),
            (reasons::NO_FREE_MACHINE, "False")
        );
        assert!(ready.message.contains("0 are free"));
        let paused = machine_status(
            &MachineFacts {
                paused: true,
                ..facts(None, Bootstrap::NotYet, None)
            },
            Some(&status),
            None,
            Some(2),
        );
        assert!(condition::is_true(&paused.conditions, conditions::PAUSED));
        assert_eq!(
            condition::find(&paused.conditions, conditions::READY)
                .unwrap()
                .reason,
            reasons::NO_FREE_MACHINE,
            "paused: the rest stays as it was"
        );
    }

    fn version(number: i64, kubernetes: Option<&str>) -> MachineConfigurationVersion {
        serde_json::from_value(json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfigurationVersion",
            "metadata": {"name": format!("workers-v{number}")},
            "spec": {"configurationName": "workers", "version": number,
                     "template": kubernetes.map_or(json!({}), |k| json!({"kubernetes": {"version": k}}))}
        }))
        .unwrap()
    }

    #[test]
    fn configuration_resolution_table() {
        let versions = [
            version(1, Some("v1.34.2")),
            version(2, Some("v1.35.4")),
            version(3, None),
        ];
        assert_eq!(
            resolve_configuration(&reference(Some(1)), Some("v1.35.4"), &versions),
            Ok(reference(Some(1))),
            "a pin wins"
        );
        assert_eq!(
            resolve_configuration(&reference(None), Some("v1.35.4"), &versions),
            Ok(reference(Some(2)))
        );
        assert_eq!(
            resolve_configuration(&reference(None), None, &versions),
            Ok(reference(Some(3))),
            "no version: the newest"
        );
        let missing = resolve_configuration(&reference(Some(7)), None, &versions).unwrap_err();
        assert_eq!(missing.reason, reasons::CONFIGURATION_NOT_FOUND);
        let no_version =
            resolve_configuration(&reference(None), Some("v1.36.0"), &versions).unwrap_err();
        assert_eq!(no_version.reason, reasons::NO_VERSION);
        assert!(
            no_version.message.contains("v1.36.0"),
            "{}",
            no_version.message
        );
        assert_eq!(
            resolve_configuration(&reference(None), None, &[])
                .unwrap_err()
                .reason,
            reasons::CONFIGURATION_NOT_FOUND
        );
    }

    #[test]
    fn bootstrap_data_round_trips_and_refuses_what_is_not_ours() {
        let data = bootstrap_data(&reference(Some(4)));
        let read = |f: Option<&str>, v: Option<&str>| {
            read_bootstrap_data(f.map(str::as_bytes), v.map(str::as_bytes))
        };
        assert_eq!(
            read(
                data.get("format").map(String::as_str),
                data.get("value").map(String::as_str)
            ),
            Ok(reference(Some(4)))
        );
        let kubeadm = read(Some("cloud-config"), Some("#cloud-config\nruncmd: []")).unwrap_err();
        assert!(kubeadm.contains("'cloud-config'"), "{kubeadm}");
        assert!(
            read(Some("unbounded"), Some("{}"))
                .unwrap_err()
                .contains("not a configuration reference")
        );
        assert!(
            read(
                Some("unbounded"),
                Some(r#"{"configurationRef":{"name":"w"}}"#)
            )
            .unwrap_err()
            .contains("no version")
        );
        assert!(read(None, None).unwrap_err().contains("unset"));
        let quoted = read(
            Some("unbounded"),
            Some(r#""token-abcdef.0123456789abcdef""#),
        )
        .unwrap_err();
        assert!(
            !quoted.contains("abcdef"),
            "the data is never quoted: {quoted}"
        );
    }

    #[test]
    fn failure_domains_are_zones_else_switches() {
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        let all = [
            l(&[("topology.kubernetes.io/zone", "r1"), (SWITCH, "leaf-1")]),
            l(&[(SWITCH, "leaf-2")]),
            l(&[(SWITCH, "leaf-2")]),
            l(&[]),
        ];
        let names: Vec<_> = failure_domains(&all).into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["leaf-2", "r1"]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One pass's facts, drawn: which Machine the cache shows (none, one without a
        /// provider ID, one powered on and ready, one whose BMC fails), and the rest.
        #[derive(Debug, Clone)]
        struct Drawn {
            paused: bool,
            has_owner: bool,
            bootstrap: u8,
            claimed: u8,
            provider_id: bool,
            creates: bool,
        }

        fn drawn() -> impl Strategy<Value = Drawn> {
            (
                any::<bool>(),
                any::<bool>(),
                0u8..3,
                0u8..4,
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(
                    |(paused, has_owner, bootstrap, claimed, provider_id, creates)| Drawn {
                        paused,
                        has_owner,
                        bootstrap,
                        claimed,
                        provider_id,
                        creates,
                    },
                )
        }

        proptest! {
            /// Whatever a pass sees, an UnboundedMachine that holds a Machine, or held one
            /// (its provider ID is set), never claims or creates another; a paused one
            /// does nothing; and once provisioned it stays provisioned whatever follows.
            #[test]
            fn never_a_second_machine_and_provisioned_is_one_way(passes in proptest::collection::vec(drawn(), 1..12)) {
                let r = reference(Some(1));
                let machines = [
                    machine(None, None, None),
                    machine(Some("pxe://52:54:00:00:00:01"), Some("On"), Some(("True", "Ready"))),
                    machine(Some("pxe://52:54:00:00:00:01"), Some("Off"), Some(("False", "BmcUnreachable"))),
                ];
                let mut status: Option<UnboundedMachineStatus> = None;
                let mut was_provisioned = false;
                for d in passes {
                    let bootstrap = match d.bootstrap {
                        0 => Bootstrap::NotYet,
                        1 => Bootstrap::Invalid("cloud-config"),
                        _ => Bootstrap::Ready(&r),
                    };
                    let claimed = match d.claimed {
                        0 => None,
                        n => Some(&machines[usize::from(n) - 1]),
                    };
                    let facts = MachineFacts {
                        paused: d.paused,
                        has_owner: d.has_owner,
                        bootstrap,
                        claimed,
                        provider_id: d.provider_id.then_some("pxe://52:54:00:00:00:01"),
                        creates: d.creates,
                    };
                    let step = next_step(&facts);
                    if claimed.is_some() || facts.provider_id.is_some() {
                        prop_assert!(!matches!(step, Step::Claim(_) | Step::Create(_)), "{step:?} for {d:?}");
                    }
                    if d.paused {
                        prop_assert_eq!(&step, &Step::Paused);
                    }
                    if matches!(step, Step::Claim(_) | Step::Create(_)) {
                        prop_assert!(d.has_owner && matches!(bootstrap, Bootstrap::Ready(_)));
                    }
                    let next = machine_status(&facts, status.as_ref(), None, Some(1));
                    let provisioned = next.initialization.as_ref().and_then(|i| i.provisioned).unwrap_or(false);
                    if !d.paused {
                        prop_assert!(provisioned || !was_provisioned, "provisioned went back for {d:?}");
                        was_provisioned = provisioned;
                        // Ready says provisioned, and only that.
                        prop_assert_eq!(condition::is_true(&next.conditions, conditions::READY), provisioned);
                    }
                    status = Some(next);
                }
            }
        }
    }
}
