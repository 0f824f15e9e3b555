//! The OS-level MachineOperations the agent runs: `reboot` and `shutdown` through logind,
//! `restartService` through systemd (in the node container by default, on the host with
//! `scope: host`). Parameters are checked before anything happens; an unknown one fails the
//! operation with a message that names it.
//!
//! A `reboot` is Complete only once the machine is back: before rebooting, the agent records
//! the operation and the boot ID in `status.agent.reboot`; the agent of the next boot finds
//! the operation still InProgress under its field manager, sees another boot ID and
//! completes it.

use std::collections::BTreeMap;

use unbounded_api::AgentReboot;
use unbounded_api::well_known::operations as names;

use crate::status::{Reported, SkipReason};

/// A checked operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Reboot the machine.
    Reboot,
    /// Power the machine's OS off.
    Shutdown,
    /// Restart a unit.
    RestartService {
        /// The unit (`.service` added when it has no suffix).
        unit: String,
        /// Where.
        scope: Scope,
    },
}

/// Where `restartService` acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Inside the node container (kubelet, containerd): the default.
    Node,
    /// On the host OS.
    Host,
}

/// The parameter of `restartService` that says where.
pub const SCOPE_PARAMETER: &str = "scope";

/// Checks an operation's name and parameters.
pub fn parse(name: &str, parameters: &BTreeMap<String, String>) -> Result<Request, String> {
    let allowed: &[&str] = match name {
        names::REBOOT | names::SHUTDOWN => &[],
        names::RESTART_SERVICE => &[names::SERVICE_PARAMETER, SCOPE_PARAMETER],
        other => return Err(format!("the agent does not run {other:?}")),
    };
    if let Some(unknown) = parameters.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(if allowed.is_empty() {
            format!("{name} takes no parameters; got {unknown:?}")
        } else {
            format!(
                "{name} does not know the parameter {unknown:?} (known: {})",
                allowed.join(", ")
            )
        });
    }
    match name {
        names::REBOOT => Ok(Request::Reboot),
        names::SHUTDOWN => Ok(Request::Shutdown),
        _ => {
            let service = parameters
                .get(names::SERVICE_PARAMETER)
                .ok_or_else(|| "restartService needs the parameter \"service\"".to_owned())?;
            if !crate::systemd::valid_unit_name(service) {
                return Err(format!("{service:?} is not a systemd unit name"));
            }
            let unit = if service.contains('.') {
                service.clone()
            } else {
                format!("{service}.service")
            };
            let scope = match parameters.get(SCOPE_PARAMETER).map(String::as_str) {
                None | Some("node") => Scope::Node,
                Some("host") => Scope::Host,
                Some(other) => {
                    return Err(format!("scope must be \"node\" or \"host\", not {other:?}"));
                }
            };
            Ok(Request::RestartService { unit, scope })
        }
    }
}

/// What to do about a reboot operation, from what was recorded and the current boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebootStep {
    /// Record this boot ID for the operation, then reboot.
    RecordAndReboot,
    /// The machine came back: complete the operation.
    Done {
        /// The boot the reboot started from.
        from: String,
    },
}

/// Decides the reboot step: complete when the record names this operation and another boot.
pub fn reboot_step(operation: &str, recorded: Option<&AgentReboot>, boot_id: &str) -> RebootStep {
    match recorded {
        Some(r) if r.operation == operation && r.from_boot_id != boot_id => RebootStep::Done {
            from: r.from_boot_id.clone(),
        },
        _ => RebootStep::RecordAndReboot,
    }
}

/// What to do once the reboot record was reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRecord {
    /// The Machine shows the record: reboot.
    Reboot,
    /// The record is not on the Machine: do not reboot yet (the agent of the next boot
    /// would not know the reboot happened, and would reboot again); the operation stays
    /// InProgress and is resumed on the agent's next pass.
    Postpone(SkipReason),
}

/// Reboots only when the record is on the Machine (written now or earlier).
pub fn after_record(reported: Reported) -> AfterRecord {
    match reported {
        Reported::Written | Reported::Unchanged => AfterRecord::Reboot,
        Reported::Skipped(reason) => AfterRecord::Postpone(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    type Case = (
        &'static str,
        BTreeMap<String, String>,
        Result<Request, &'static str>,
    );

    #[test]
    fn parse_table() {
        let cases: Vec<Case> = vec![
            ("reboot", params(&[]), Ok(Request::Reboot)),
            ("shutdown", params(&[]), Ok(Request::Shutdown)),
            (
                "restartService",
                params(&[("service", "kubelet")]),
                Ok(Request::RestartService {
                    unit: "kubelet.service".into(),
                    scope: Scope::Node,
                }),
            ),
            (
                "restartService",
                params(&[("service", "systemd-networkd.service"), ("scope", "host")]),
                Ok(Request::RestartService {
                    unit: "systemd-networkd.service".into(),
                    scope: Scope::Host,
                }),
            ),
            (
                "reboot",
                params(&[("force", "true")]),
                Err("reboot takes no parameters"),
            ),
            ("restartService", params(&[]), Err("needs the parameter")),
            (
                "restartService",
                params(&[("service", "kubelet"), ("signal", "9")]),
                Err("does not know the parameter \"signal\""),
            ),
            (
                "restartService",
                params(&[("service", "a b")]),
                Err("not a systemd unit name"),
            ),
            (
                "restartService",
                params(&[("service", "kubelet"), ("scope", "cluster")]),
                Err("scope must be"),
            ),
            ("powerCycle", params(&[]), Err("does not run")),
        ];
        for (name, parameters, expected) in cases {
            let got = parse(name, &parameters);
            match (got, expected) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{name}"),
                (Err(message), Err(part)) => assert!(message.contains(part), "{name}: {message}"),
                (got, expected) => panic!("{name}: {got:?} vs {expected:?}"),
            }
        }
    }

    #[test]
    fn a_reboot_waits_for_its_record() {
        assert_eq!(after_record(Reported::Written), AfterRecord::Reboot);
        assert_eq!(after_record(Reported::Unchanged), AfterRecord::Reboot);
        assert_eq!(
            after_record(Reported::Skipped(SkipReason::ReadinessUnknown)),
            AfterRecord::Postpone(SkipReason::ReadinessUnknown)
        );
    }

    #[test]
    fn reboot_completes_only_after_a_new_boot() {
        let record = AgentReboot {
            operation: "op".into(),
            from_boot_id: "a".into(),
        };
        assert_eq!(reboot_step("op", None, "a"), RebootStep::RecordAndReboot);
        assert_eq!(
            reboot_step("op", Some(&record), "a"),
            RebootStep::RecordAndReboot
        );
        assert_eq!(
            reboot_step("op", Some(&record), "b"),
            RebootStep::Done { from: "a".into() }
        );
        assert_eq!(
            reboot_step("other", Some(&record), "b"),
            RebootStep::RecordAndReboot
        );
    }
}
