//! The fake's asynchronous operations: each runs for `State::operation_time` (progressing
//! with time, whether polled or not, as Azure's do), is polled through its
//! `Azure-AsyncOperation` or `Location` URL, and ends by changing the resources.

use std::time::Instant;

use serde_json::{Value, json};

use super::faults::Fault;
use super::{State, arm_error};

type Answer = (u16, Vec<(String, String)>, Value);

#[derive(Debug, Clone)]
pub(crate) enum End {
    Succeed,
    Fail { code: String, message: String },
    Never,
}

#[derive(Debug, Clone)]
pub(crate) enum Effect {
    Provisioned(String),
    Power(String, &'static str),
    Delete(Vec<String>),
    Nothing,
}

#[derive(Debug, Clone)]
pub(crate) struct Operation {
    /// When Azure is done with it (operations progress with time, as Azure's do, whether
    /// anyone polls or not).
    due: Instant,
    finished: bool,
    end: End,
    effect: Effect,
    /// The resource whose provisioning fails with the operation.
    fails: Option<String>,
}

const RETRY_AFTER: &str = "1";

pub(crate) fn api_version_of(namespace: &str) -> Option<&'static str> {
    match namespace {
        "microsoft.compute" => Some("2024-07-01"),
        "microsoft.network" => Some("2024-05-01"),
        _ => None,
    }
}

pub(crate) fn start_operation(
    state: &mut State,
    id: &str,
    effect: Effect,
    fault: Option<Fault>,
    location_too: bool,
) -> Vec<(String, String)> {
    let (end, fails) = match fault {
        Some(Fault::FailOperation { code, message, .. }) => {
            (End::Fail { code, message }, Some(id.to_owned()))
        }
        Some(Fault::StallOperation { .. }) => (End::Never, None),
        _ => (End::Succeed, None),
    };
    let n = state.next();
    let op = format!("op-{n}");
    state.operations.insert(
        op.clone(),
        Operation {
            due: Instant::now() + state.operation_time,
            finished: false,
            end,
            effect,
            fails,
        },
    );
    let sub = id.split('/').nth(2).unwrap_or_default();
    let ns = if id.contains("microsoft.network") {
        "Microsoft.Network"
    } else {
        "Microsoft.Compute"
    };
    let version = api_version_of(&ns.to_ascii_lowercase()).unwrap_or_default();
    let base = format!(
        "{}/subscriptions/{sub}/providers/{ns}/locations/westeurope",
        state.origin
    );
    let mut headers = vec![
        (
            "azure-asyncoperation".into(),
            format!("{base}/operations/{op}?api-version={version}"),
        ),
        ("retry-after".into(), RETRY_AFTER.into()),
    ];
    if location_too {
        headers.push((
            "location".into(),
            format!("{base}/operationResults/{op}?api-version={version}"),
        ));
    }
    headers
}

/// Starts an operation followed through `Location` only (Compute's actions).
pub(crate) fn start_location_operation(
    state: &mut State,
    id: &str,
    effect: Effect,
    fault: Option<Fault>,
) -> Vec<(String, String)> {
    start_operation(state, id, effect, fault, true)
        .into_iter()
        .filter(|(name, _)| name != "azure-asyncoperation")
        .collect()
}

/// Finishes the operations whose time has come: their effects show in the resources.
pub(crate) fn advance(state: &mut State) {
    let now = Instant::now();
    let due: Vec<Operation> = state
        .operations
        .values_mut()
        .filter(|o| !o.finished && o.due <= now && !matches!(o.end, End::Never))
        .map(|o| {
            o.finished = true;
            o.clone()
        })
        .collect();
    for operation in due {
        match &operation.end {
            End::Fail { .. } => {
                if let Some(id) = &operation.fails
                    && let Some(resource) = state.resources.get_mut(id)
                {
                    resource["properties"]["provisioningState"] = json!("Failed");
                }
            }
            _ => apply(state, &operation.effect),
        }
    }
}

pub(crate) fn poll(state: &mut State, kind: &str, op: &str) -> Answer {
    let Some(operation) = state.operations.get(op) else {
        return arm_error(404, "NotFound", "No such operation.");
    };
    if !operation.finished {
        let headers = vec![("retry-after".into(), RETRY_AFTER.into())];
        return if kind == "operations" {
            (
                200,
                headers,
                json!({"name": op, "status": "InProgress", "startTime": "2024-07-01T00:00:00Z"}),
            )
        } else {
            (202, headers, Value::Null)
        };
    }
    match &operation.end {
        End::Fail { code, message } => {
            if kind == "operations" {
                (
                    200,
                    vec![],
                    json!({"name": op, "status": "Failed", "error": {"code": code, "message": message}}),
                )
            } else {
                arm_error(409, code, message)
            }
        }
        _ => {
            if kind == "operations" {
                (
                    200,
                    vec![],
                    json!({"name": op, "status": "Succeeded", "startTime": "2024-07-01T00:00:00Z", "endTime": "2024-07-01T00:00:05Z"}),
                )
            } else {
                (200, vec![], Value::Null)
            }
        }
    }
}

pub(crate) fn apply(state: &mut State, effect: &Effect) {
    match effect {
        Effect::Provisioned(id) => {
            let Some(vm) = state.resources.get_mut(id) else {
                return;
            };
            vm["properties"]["provisioningState"] = json!("Succeeded");
            vm["__power"] = json!("running");
            let disk_name = vm["properties"]["storageProfile"]["osDisk"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let disk_id = format!(
                "{}/providers/microsoft.compute/disks/{}",
                id.split("/providers/").next().unwrap_or_default(),
                disk_name.to_ascii_lowercase()
            );
            vm["properties"]["storageProfile"]["osDisk"]["managedDisk"] =
                json!({"storageAccountType": "Standard_LRS", "id": disk_id});
            let location = vm["location"].clone();
            state.resources.insert(
                disk_id.clone(),
                json!({"id": disk_id, "name": disk_name, "type": "Microsoft.Compute/disks", "location": location, "managedBy": id, "properties": {"provisioningState": "Succeeded", "diskState": "Attached", "osType": "Linux"}}),
            );
        }
        Effect::Power(id, code) => {
            if let Some(vm) = state.resources.get_mut(id) {
                vm["__power"] = json!(code);
            }
        }
        Effect::Delete(ids) => {
            for id in ids {
                state.resources.remove(id);
                state.custom_data.remove(id);
            }
        }
        Effect::Nothing => {}
    }
}
