//! The fake's Azure Resource Manager: NICs, VMs and disks in resource groups, with Azure's
//! documented answers (shapes from `tests/fixtures/`): PUT answers `201` with an
//! `Azure-AsyncOperation` status URL; actions and deletes answer `202` with a `Location` to poll
//! (deletes also with `Azure-AsyncOperation`, as Network's do); polls carry `Retry-After`;
//! errors are `{"error": {"code", "message"}}`; every answer carries
//! `x-ms-ratelimit-remaining-subscription-*` headers.

use std::time::Instant;

use serde_json::{Value, json};

use super::{State, arm_error};

type Answer = (u16, Vec<(String, String)>, Value);

/// A misbehaviour to play, on requests with `method` whose lower-case path contains
/// `fragment`, the next `times` times.
#[derive(Debug, Clone)]
pub enum Fault {
    /// `429 Too Many Requests` with `Retry-After` and no requests left.
    Throttle {
        method: &'static str,
        fragment: String,
        times: u32,
        retry_after: u64,
    },
    /// An error status with an ARM error body.
    Error {
        method: &'static str,
        fragment: String,
        times: u32,
        status: u16,
        code: String,
        message: String,
    },
    /// The write is accepted but its asynchronous operation ends `Failed`.
    FailOperation {
        method: &'static str,
        fragment: String,
        times: u32,
        code: String,
        message: String,
    },
    /// The write is accepted but its asynchronous operation never ends.
    StallOperation {
        method: &'static str,
        fragment: String,
        times: u32,
    },
    /// The answer says this many requests are left (`x-ms-ratelimit-remaining-…`).
    Remaining {
        method: &'static str,
        fragment: String,
        times: u32,
        header: String,
        value: String,
    },
}

impl Fault {
    fn matches(&self, method: &str, path: &str) -> bool {
        let (m, fragment, times) = match self {
            Fault::Throttle {
                method,
                fragment,
                times,
                ..
            }
            | Fault::Error {
                method,
                fragment,
                times,
                ..
            }
            | Fault::FailOperation {
                method,
                fragment,
                times,
                ..
            }
            | Fault::StallOperation {
                method,
                fragment,
                times,
            }
            | Fault::Remaining {
                method,
                fragment,
                times,
                ..
            } => (method, fragment, times),
        };
        *times > 0 && *m == method && path.contains(&fragment.to_ascii_lowercase())
    }

    fn used(&mut self) {
        match self {
            Fault::Throttle { times, .. }
            | Fault::Error { times, .. }
            | Fault::FailOperation { times, .. }
            | Fault::StallOperation { times, .. }
            | Fault::Remaining { times, .. } => *times = times.saturating_sub(1),
        }
    }
}

#[derive(Debug, Clone)]
enum End {
    Succeed,
    Fail { code: String, message: String },
    Never,
}

#[derive(Debug, Clone)]
enum Effect {
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

fn api_version_of(namespace: &str) -> Option<&'static str> {
    match namespace {
        "microsoft.compute" => Some("2024-07-01"),
        "microsoft.network" => Some("2024-05-01"),
        _ => None,
    }
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn ratelimit_headers() -> Vec<(String, String)> {
    vec![
        (
            "x-ms-ratelimit-remaining-subscription-reads".into(),
            "11999".into(),
        ),
        (
            "x-ms-ratelimit-remaining-subscription-writes".into(),
            "1199".into(),
        ),
    ]
}

/// Answers one ARM request.
pub(crate) fn handle(
    state: &mut State,
    method: &str,
    path: &str,
    query: &str,
    body: &Value,
) -> Answer {
    advance(state);
    let lower = path.to_ascii_lowercase();
    let mut extra = ratelimit_headers();
    let mut operation_fault = None;
    if let Some(fault) = state.faults.iter_mut().find(|f| f.matches(method, &lower)) {
        fault.used();
        match fault.clone() {
            Fault::Throttle { retry_after, .. } => {
                let (status, _, body) = arm_error(
                    429,
                    "TooManyRequests",
                    "The request is being throttled as the limit has been reached for operation type - Write_ObservationWindow_00:03:00.",
                );
                return (
                    status,
                    vec![
                        ("retry-after".into(), retry_after.to_string()),
                        (
                            "x-ms-ratelimit-remaining-subscription-writes".into(),
                            "0".into(),
                        ),
                    ],
                    body,
                );
            }
            Fault::Error {
                status,
                code,
                message,
                ..
            } => return arm_error(status, &code, &message),
            Fault::Remaining { header, value, .. } => extra.push((header, value)),
            other => operation_fault = Some(other),
        }
    }
    let segments: Vec<&str> = lower.trim_start_matches('/').split('/').collect();
    let (status, headers, answer) = match segments.as_slice() {
        [
            "subscriptions",
            _,
            "providers",
            ns,
            "locations",
            _,
            kind,
            id,
        ] if *kind == "operations" || *kind == "operationresults" => {
            let _ = ns;
            poll(state, kind, id)
        }
        [
            "subscriptions",
            sub,
            "resourcegroups",
            group,
            "providers",
            ns,
            kind,
            name,
            rest @ ..,
        ] => {
            let Some(version) = api_version_of(ns) else {
                return arm_error(
                    404,
                    "NoRegisteredProviderFound",
                    "No registered resource provider found.",
                );
            };
            if query_value(query, "api-version") != Some(version) {
                return arm_error(
                    400,
                    "InvalidApiVersionParameter",
                    &format!("The api-version is invalid. The supported version is '{version}'."),
                );
            }
            let scope = format!("{sub}/{group}");
            if !state.groups.contains(&scope) {
                return arm_error(
                    404,
                    "ResourceGroupNotFound",
                    &format!("Resource group '{group}' could not be found."),
                );
            }
            if state.denied_groups.contains(&scope) {
                return arm_error(
                    403,
                    "AuthorizationFailed",
                    &format!(
                        "The client '{}' with object id '0c6f0b1e-0000-4000-8000-000000000001' does not have authorization to perform action '{ns}/{kind}/{}' over scope '{path}' or the scope is invalid. If access was recently granted, please refresh your credentials.",
                        super::CLIENT_ID,
                        if method == "GET" { "read" } else { "write" }
                    ),
                );
            }
            let id =
                format!("/subscriptions/{sub}/resourcegroups/{group}/providers/{ns}/{kind}/{name}");
            match (method, *kind, rest) {
                ("PUT", "networkinterfaces", []) => {
                    put_nic(state, path, &id, body, operation_fault)
                }
                ("PUT", "virtualmachines", []) => put_vm(state, path, &id, body, operation_fault),
                ("GET", _, []) => get(state, &id, query),
                ("POST", "virtualmachines", [action]) => {
                    vm_action(state, &id, action, operation_fault)
                }
                ("DELETE", _, []) => delete(state, &id, operation_fault),
                _ => arm_error(405, "MethodNotAllowed", "The method is not allowed here."),
            }
        }
        _ => arm_error(
            404,
            "NotFound",
            "No such route in the fake Azure Resource Manager.",
        ),
    };
    extra.extend(headers);
    (status, extra, answer)
}

fn not_found(id: &str) -> Answer {
    let kind = id.split("/providers/").nth(1).unwrap_or(id);
    arm_error(
        404,
        "ResourceNotFound",
        &format!(
            "The Resource '{kind}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
        ),
    )
}

/// Starts an asynchronous operation; returns its URLs' headers.
fn start_operation(
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
fn start_location_operation(
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

fn poll(state: &mut State, kind: &str, op: &str) -> Answer {
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

fn apply(state: &mut State, effect: &Effect) {
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

fn public(resource: &Value) -> Value {
    let mut copy = resource.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("__power");
    }
    copy
}

fn get(state: &State, id: &str, query: &str) -> Answer {
    let Some(resource) = state.resources.get(id) else {
        return not_found(id);
    };
    let mut answer = public(resource);
    if query.contains("$expand=instanceView") || query.contains("%24expand=instanceView") {
        let provisioning = resource["properties"]["provisioningState"]
            .as_str()
            .unwrap_or("Creating")
            .to_ascii_lowercase();
        let mut statuses = vec![
            json!({"code": format!("ProvisioningState/{provisioning}"), "level": "Info", "displayStatus": "Provisioning state"}),
        ];
        if let Some(power) = resource["__power"].as_str() {
            statuses.push(json!({"code": format!("PowerState/{power}"), "level": "Info", "displayStatus": format!("VM {power}")}));
        }
        answer["properties"]["instanceView"] = json!({
            "computerName": resource["properties"]["osProfile"]["computerName"],
            "statuses": statuses,
        });
    }
    (200, vec![], answer)
}

fn put_nic(state: &mut State, path: &str, id: &str, body: &Value, fault: Option<Fault>) -> Answer {
    let subnet = body["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if body["location"].as_str().is_none() {
        return arm_error(
            400,
            "LocationRequired",
            "The location property is required for this definition.",
        );
    }
    if !state.subnets.contains(&subnet) {
        return arm_error(
            400,
            "InvalidResourceReference",
            &format!(
                "Resource {subnet} referenced by resource {path} was not found. Please make sure that the referenced resource exists, and that both resources are in the same region."
            ),
        );
    }
    let existing = state.resources.get(id).cloned();
    let address = existing
        .as_ref()
        .and_then(|n| {
            n["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| format!("10.1.0.{}", 4 + state.next() % 200));
    let name = path.rsplit('/').next().unwrap_or_default();
    // The documented response shape (NetworkInterfaceCreate.json).
    let nic = json!({
        "name": name,
        "id": path,
        "location": body["location"],
        "tags": body["tags"],
        "type": "Microsoft.Network/networkInterfaces",
        "properties": {
            "provisioningState": "Succeeded",
            "ipConfigurations": [{
                "name": "ipconfig1",
                "id": format!("{path}/ipConfigurations/ipconfig1"),
                "properties": {
                    "provisioningState": "Succeeded",
                    "privateIPAddress": address,
                    "privateIPAllocationMethod": "Dynamic",
                    "subnet": {"id": body["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]},
                    "primary": true,
                    "privateIPAddressVersion": "IPv4",
                },
            }],
            "dnsSettings": {"dnsServers": [], "appliedDnsServers": []},
            "enableAcceleratedNetworking": false,
            "enableIPForwarding": false,
        },
    });
    state.resources.insert(id.to_owned(), nic.clone());
    let headers = start_operation(state, id, Effect::Nothing, fault, false);
    (if existing.is_some() { 200 } else { 201 }, headers, nic)
}

fn missing(what: &str) -> Answer {
    arm_error(
        400,
        "InvalidParameter",
        &format!("Required parameter '{what}' is missing (null)."),
    )
}

fn put_vm(state: &mut State, path: &str, id: &str, body: &Value, fault: Option<Fault>) -> Answer {
    let p = &body["properties"];
    let image = &p["storageProfile"]["imageReference"];
    let required = [
        ("location", body["location"].is_string()),
        (
            "hardwareProfile.vmSize",
            p["hardwareProfile"]["vmSize"].is_string(),
        ),
        (
            "storageProfile.imageReference",
            image["id"].is_string()
                || (image["publisher"].is_string()
                    && image["offer"].is_string()
                    && image["sku"].is_string()),
        ),
        (
            "storageProfile.osDisk.createOption",
            p["storageProfile"]["osDisk"]["createOption"].is_string(),
        ),
        (
            "osProfile.computerName",
            p["osProfile"]["computerName"].is_string(),
        ),
        (
            "osProfile.adminUsername",
            p["osProfile"]["adminUsername"].is_string(),
        ),
        (
            "osProfile.linuxConfiguration.ssh.publicKeys",
            p["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"].is_string(),
        ),
        (
            "networkProfile.networkInterfaces",
            p["networkProfile"]["networkInterfaces"][0]["id"].is_string(),
        ),
    ];
    if let Some((what, _)) = required.iter().find(|(_, ok)| !ok) {
        return missing(what);
    }
    let size = p["hardwareProfile"]["vmSize"].as_str().unwrap_or_default();
    if state.quota_exhausted_sizes.contains(size) {
        return arm_error(
            409,
            "OperationNotAllowed",
            &format!(
                "Operation could not be completed as it results in exceeding approved {size} Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: westeurope, Current Limit: 10, Current Usage: 8, Additional Required: 4, (Minimum) New Limit Required: 12."
            ),
        );
    }
    if image["sku"]
        .as_str()
        .is_some_and(|s| state.unknown_skus.contains(s))
    {
        return arm_error(
            400,
            "InvalidParameter",
            "The value of parameter imageReference.sku is invalid.",
        );
    }
    let nic = p["networkProfile"]["networkInterfaces"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !state.resources.contains_key(&nic) {
        return arm_error(
            400,
            "InvalidResourceReference",
            &format!("Resource {nic} referenced by resource {path} was not found."),
        );
    }
    let custom_data = p["osProfile"]["customData"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(existing) = state.resources.get(id).cloned() {
        if state.custom_data.get(id).is_some_and(|c| *c != custom_data) {
            return arm_error(
                409,
                "PropertyChangeNotAllowed",
                "Changing property 'customData' is not allowed.",
            );
        }
        if existing["properties"]["provisioningState"] == "Succeeded" {
            return (200, vec![], public(&existing));
        }
    }
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut properties = p.clone();
    // customData is write-only: Azure never returns it.
    if let Some(os) = properties["osProfile"].as_object_mut() {
        os.remove("customData");
        os.insert("secrets".into(), json!([]));
    }
    properties["storageProfile"]["osDisk"]["osType"] = json!("Linux");
    properties["storageProfile"]["dataDisks"] = json!([]);
    properties["vmId"] = json!(format!("e0de9b84-a506-4b95-9623-{:012}", state.next()));
    properties["provisioningState"] = json!("Creating");
    // The documented response shape (VirtualMachine_Create_WithSshAuthentication.json).
    let vm = json!({
        "id": path,
        "name": name,
        "type": "Microsoft.Compute/virtualMachines",
        "location": body["location"],
        "tags": body["tags"],
        "properties": properties,
    });
    state.resources.insert(id.to_owned(), vm.clone());
    state.custom_data.insert(id.to_owned(), custom_data);
    let headers = start_operation(state, id, Effect::Provisioned(id.to_owned()), fault, false);
    (201, headers, vm)
}

fn vm_action(state: &mut State, id: &str, action: &str, fault: Option<Fault>) -> Answer {
    let Some(vm) = state.resources.get(id) else {
        return not_found(id);
    };
    let power = vm["__power"].as_str().unwrap_or_default().to_owned();
    let after = match action {
        "start" | "redeploy" => "running",
        "poweroff" => "stopped",
        "deallocate" => "deallocated",
        "restart" if power == "running" => "running",
        "restart" => {
            return arm_error(
                409,
                "OperationNotAllowed",
                &format!("Operation 'restart' is not allowed on VM since the VM is {power}."),
            );
        }
        _ => return arm_error(404, "NotFound", "No such action."),
    };
    let headers = start_location_operation(state, id, Effect::Power(id.to_owned(), after), fault);
    (202, headers, Value::Null)
}

fn delete(state: &mut State, id: &str, fault: Option<Fault>) -> Answer {
    let Some(resource) = state.resources.get(id).cloned() else {
        return (204, vec![], Value::Null);
    };
    let mut ids = vec![id.to_owned()];
    if id.contains("/microsoft.network/networkinterfaces/") {
        let user = state.resources.iter().find(|(_, r)| {
            r["properties"]["networkProfile"]["networkInterfaces"][0]["id"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(id))
        });
        if let Some((vm, _)) = user {
            return arm_error(
                400,
                "NicInUse",
                &format!(
                    "Network Interface {id} is used by existing resource {vm}. In order to delete the network interface, it must be dissociated from the resource."
                ),
            );
        }
    } else if id.contains("/microsoft.compute/disks/") {
        if let Some(vm) = resource["managedBy"]
            .as_str()
            .filter(|vm| state.resources.contains_key(*vm))
        {
            return arm_error(
                409,
                "OperationNotAllowed",
                &format!("Disk {id} is attached to VM {vm}."),
            );
        }
    } else {
        // deleteOption: Delete takes the NIC and the OS disk along, as Azure does.
        let p = &resource["properties"];
        let nic = &p["networkProfile"]["networkInterfaces"][0];
        if nic["properties"]["deleteOption"] == "Delete"
            && let Some(nic) = nic["id"].as_str()
        {
            ids.push(nic.to_ascii_lowercase());
        }
        let disk = &p["storageProfile"]["osDisk"];
        if disk["deleteOption"] == "Delete"
            && let Some(disk) = disk["managedDisk"]["id"].as_str()
        {
            ids.push(disk.to_ascii_lowercase());
        }
    }
    let headers = start_operation(state, id, Effect::Delete(ids), fault, true);
    (202, headers, Value::Null)
}
