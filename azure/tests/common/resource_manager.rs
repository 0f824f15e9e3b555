//! The fake's Azure Resource Manager: NICs, VMs and disks in resource groups, with Azure's
//! documented answers (shapes from `tests/fixtures/`): PUT answers `201` with an
//! `Azure-AsyncOperation` status URL; actions and deletes answer `202` with a `Location` to poll
//! (deletes also with `Azure-AsyncOperation`, as Network's do); polls carry `Retry-After`;
//! errors are `{"error": {"code", "message"}}`; every answer carries
//! `x-ms-ratelimit-remaining-subscription-*` headers.

use serde_json::{Value, json};

use super::faults::Fault;
use super::operations::{
    Effect, advance, api_version_of, poll, start_location_operation, start_operation,
};
use super::{State, arm_error};

type Answer = (u16, Vec<(String, String)>, Value);

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
    // Absent custom data on an existing VM means unchanged: Azure's GET never returns it,
    // so a GET-then-PUT must be able to leave it out.
    let sent_custom_data = p["osProfile"]["customData"].as_str().map(str::to_owned);
    let custom_data = sent_custom_data.clone().unwrap_or_default();
    if let Some(existing) = state.resources.get(id).cloned() {
        if let Some(sent) = &sent_custom_data
            && state.custom_data.get(id).is_some_and(|c| c != sent)
        {
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
    if sent_custom_data.is_some() || !state.custom_data.contains_key(id) {
        state.custom_data.insert(id.to_owned(), custom_data);
    }
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
