//! Every CEL rule of the CRDs, and the ValidatingAdmissionPolicy, against a real
//! kube-apiserver: a bad object is rejected with the rule's message, a good one accepted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use unbounded_api::{Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation};
use unbounded_testbed::cluster::LocalControlPlane;

async fn client() -> kube::Client {
    LocalControlPlane::shared()
        .expect("control plane")
        .client()
        .await
        .expect("client")
}

fn api_for(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let (plural, kind) = match kind {
        "Machine" => ("machines", "Machine"),
        "MachineConfiguration" => ("machineconfigurations", "MachineConfiguration"),
        "MachineConfigurationVersion" => (
            "machineconfigurationversions",
            "MachineConfigurationVersion",
        ),
        "MachinePool" => ("machinepools", "MachinePool"),
        _ => ("machineoperations", "MachineOperation"),
    };
    let resource = ApiResource {
        group: "unbounded-cloud.io".into(),
        version: "v1alpha1".into(),
        api_version: "unbounded-cloud.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// Creates `object` with a server-side dry run; returns the API server's error message.
async fn dry_run_create(client: &kube::Client, object: Value) -> Result<(), String> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let object: DynamicObject = serde_json::from_value(object).expect("object");
    let params = PostParams {
        dry_run: true,
        field_manager: None,
    };
    api_for(client, &kind)
        .create(&params, &object)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn machine(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine", "metadata": {"name": name}, "spec": spec})
}

fn pxe_spec(pxe: Value) -> Value {
    json!({"provider": "pxe", "pxe": pxe})
}

/// A valid Azure spec with `overrides` merged in (a null removes a field).
fn azure_spec(overrides: Value) -> Value {
    let mut azure = json!({
        "subscriptionID": "00000000-0000-0000-0000-000000000000",
        "resourceGroup": "rg-nodes",
        "location": "westeurope",
        "vmSize": "Standard_D2s_v5",
        "image": {"publisher": "Debian", "offer": "debian-12", "sku": "12-gen2"},
        "subnetID": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes",
        "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq7bqZ9sS0Wm7mFsJkZq0QJtqgS3D6p2mW1+Zl3f7cu ops@example",
    });
    for (key, value) in overrides.as_object().unwrap() {
        if value.is_null() {
            azure.as_object_mut().unwrap().remove(key);
        } else {
            azure[key] = value.clone();
        }
    }
    json!({"provider": "azure", "azure": azure})
}

fn bmc(address: &str) -> Value {
    json!({"address": address, "credentialsSecretRef": {"namespace": "unbounded-system", "name": "bmc"}})
}

/// (case, object, expected message fragment or None when it must be accepted)
fn machine_cases() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let mac = json!(["52:54:00:12:34:56"]);
    vec![
        (
            "good pxe machine",
            machine(
                "v-good",
                pxe_spec(
                    json!({"macAddresses": mac, "bmc": bmc("redfish+https://10.0.0.5/redfish/v1/Systems/1")}),
                ),
            ),
            None,
        ),
        (
            "good ipmi bmc",
            machine(
                "v-ipmi",
                pxe_spec(json!({"macAddresses": mac, "bmc": bmc("ipmi://10.0.0.6:623")})),
            ),
            None,
        ),
        (
            "good manual machine",
            machine("v-manual", json!({"provider": "manual"})),
            None,
        ),
        (
            "arm64 with BIOS firmware cannot boot",
            machine(
                "v-arm-bios",
                pxe_spec(json!({"macAddresses": mac, "architecture": "arm64", "firmware": "bios"})),
            ),
            Some("an arm64 server boots with UEFI"),
        ),
        (
            "arm64 with UEFI (the default firmware)",
            machine(
                "v-arm-uefi",
                pxe_spec(json!({"macAddresses": mac, "architecture": "arm64"})),
            ),
            None,
        ),
        (
            "pxe without pxe block",
            machine("v-nopxe", json!({"provider": "pxe"})),
            Some("spec.pxe is required when spec.provider is 'pxe'"),
        ),
        (
            "azure without azure block",
            machine("v-noaz", json!({"provider": "azure"})),
            Some("spec.azure is required when spec.provider is 'azure'"),
        ),
        (
            "pxe block on manual machine",
            machine(
                "v-mixed",
                json!({"provider": "manual", "pxe": {"macAddresses": mac}}),
            ),
            Some("spec.pxe may only be set when spec.provider is 'pxe'"),
        ),
        (
            "no MAC address",
            machine("v-nomac", pxe_spec(json!({"macAddresses": []}))),
            Some("needs at least one MAC address"),
        ),
        (
            "malformed MAC",
            machine(
                "v-badmac",
                pxe_spec(json!({"macAddresses": ["52:54:00:12:34"]})),
            ),
            Some("six colon-separated hex pairs"),
        ),
        (
            "duplicate MAC",
            machine(
                "v-dupmac",
                pxe_spec(json!({"macAddresses": ["52:54:00:12:34:56", "52:54:00:12:34:56"]})),
            ),
            Some("lists the same MAC address twice"),
        ),
        (
            "bad BMC scheme",
            machine(
                "v-badbmc",
                pxe_spec(json!({"macAddresses": mac, "bmc": bmc("http://10.0.0.5/")})),
            ),
            Some("must start with redfish://, redfish+https://, redfish+http:// or ipmi://"),
        ),
        (
            "insecureSkipVerify on ipmi",
            machine(
                "v-ipmitls",
                pxe_spec(
                    json!({"macAddresses": mac, "bmc": {"address": "ipmi://10.0.0.6", "credentialsSecretRef": {"namespace": "ns", "name": "s"}, "insecureSkipVerify": true}}),
                ),
            ),
            Some("insecureSkipVerify applies only to Redfish BMCs"),
        ),
        (
            "bad ipv4",
            machine(
                "v-badip",
                pxe_spec(json!({"macAddresses": mac, "ipv4": "10.0.0.300"})),
            ),
            Some("spec.pxe.ipv4 must be an IPv4 address"),
        ),
        (
            "ipv6 as ipv4",
            machine(
                "v-ip6",
                pxe_spec(json!({"macAddresses": mac, "ipv4": "fd00::1"})),
            ),
            Some("spec.pxe.ipv4 must be an IPv4 address"),
        ),
        (
            "version zero",
            machine(
                "v-ver0",
                json!({"provider": "manual", "configurationRef": {"name": "c", "version": 0}}),
            ),
            Some("configurationRef.version must be 1 or more"),
        ),
        (
            "empty configuration name",
            machine(
                "v-noname",
                json!({"provider": "manual", "configurationRef": {"name": ""}}),
            ),
            Some("configurationRef.name must be 1 to 240 characters"),
        ),
        (
            "bad providerID",
            machine(
                "v-pid",
                json!({"provider": "manual", "providerID": "just-text"}),
            ),
            Some("spec.providerID must look like"),
        ),
        (
            "bad nodeName",
            machine(
                "v-node",
                json!({"provider": "manual", "nodeName": "Not_A_Node"}),
            ),
            Some("spec.nodeName must be a lower-case DNS subdomain"),
        ),
        (
            "bad subscription",
            machine(
                "v-az",
                json!({"provider": "azure", "azure": {"subscriptionID": "nope", "resourceGroup": "rg", "location": "westeurope", "vmSize": "Standard_D2s_v5", "image": {"id": "/subscriptions/x"}, "subnetID": "/subscriptions/x"}}),
            ),
            Some("spec.azure.subscriptionID must be a UUID"),
        ),
        (
            "good azure machine",
            machine("v-azgood", azure_spec(json!({}))),
            None,
        ),
        (
            "azure machine with a key Secret and tags",
            machine(
                "v-azsecret",
                azure_spec(
                    json!({"sshPublicKey": null, "sshKeySecretRef": {"namespace": "unbounded-system", "name": "ssh"}, "tags": {"team": "infra", "cost-center": "42"}, "credentialsSecretRef": {"namespace": "unbounded-system", "name": "azure"}}),
                ),
            ),
            None,
        ),
        (
            "azure machine with two SSH keys",
            machine(
                "v-az2key",
                azure_spec(
                    json!({"sshKeySecretRef": {"namespace": "unbounded-system", "name": "ssh"}}),
                ),
            ),
            Some("set exactly one of spec.azure.sshPublicKey and spec.azure.sshKeySecretRef"),
        ),
        (
            "azure machine without an SSH key",
            machine("v-az0key", azure_spec(json!({"sshPublicKey": null}))),
            Some("set exactly one of spec.azure.sshPublicKey and spec.azure.sshKeySecretRef"),
        ),
        (
            "azure SSH key that is not one",
            machine(
                "v-azbadkey",
                azure_spec(json!({"sshPublicKey": "-----BEGIN OPENSSH PRIVATE KEY-----"})),
            ),
            Some("spec.azure.sshPublicKey must be one OpenSSH public key line"),
        ),
        (
            "azure tag name with a slash",
            machine(
                "v-aztag",
                azure_spec(json!({"tags": {"unbounded-cloud.io/machine": "x"}})),
            ),
            Some("spec.azure.tags names must be 1 to 512 characters without"),
        ),
        (
            "azure tag the provider sets",
            machine(
                "v-aztag2",
                azure_spec(json!({"tags": {"Unbounded-Machine": "x"}})),
            ),
            Some("spec.azure.tags may not set unbounded-machine or unbounded-cluster"),
        ),
        (
            "azure subnet that is a VNet",
            machine(
                "v-azsubnet",
                azure_spec(
                    json!({"subnetID": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/vnet"}),
                ),
            ),
            Some("spec.azure.subnetID must be a subnet's resource ID"),
        ),
        (
            "azure location as a display name",
            machine("v-azloc", azure_spec(json!({"location": "West Europe"}))),
            Some("spec.azure.location must be a region name"),
        ),
        (
            "azure image half set",
            machine(
                "v-azimg",
                json!({"provider": "azure", "azure": {"subscriptionID": "00000000-0000-0000-0000-000000000000", "resourceGroup": "rg", "location": "westeurope", "vmSize": "Standard_D2s_v5", "image": {"publisher": "Canonical"}, "subnetID": "/subscriptions/x"}}),
            ),
            Some("set either image.id, or all of image.publisher"),
        ),
    ]
}

fn configuration(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfiguration", "metadata": {"name": name}, "spec": spec})
}

fn configuration_cases() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let boot = json!({"kernelURL": "http://example.invalid/vmlinuz", "initrdURL": "images/initrd"});
    vec![
        (
            "good configuration",
            configuration(
                "c-good",
                json!({"priority": 10, "machineSelector": {"matchLabels": {"pool": "a"}}, "template": {"boot": boot, "kubernetes": {"version": "v1.35.4"}}}),
            ),
            None,
        ),
        (
            "priority too high",
            configuration("c-prio", json!({"priority": 5000, "template": {}})),
            Some("priority must be between -1000 and 1000"),
        ),
        (
            "history limit zero",
            configuration("c-hist", json!({"revisionHistoryLimit": 0, "template": {}})),
            Some("revisionHistoryLimit must be between 1 and 100"),
        ),
        (
            "rollingUpdate with OnDelete",
            configuration(
                "c-ru",
                json!({"updateStrategy": {"type": "OnDelete", "rollingUpdate": {"maxUnavailable": 1}}, "template": {}}),
            ),
            Some(
                "updateStrategy.rollingUpdate may only be set when updateStrategy.type is RollingUpdate",
            ),
        ),
        (
            "good rolling update",
            configuration(
                "c-rolling",
                json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%", "progressDeadlineSeconds": 900}}, "template": {}}),
            ),
            None,
        ),
        (
            "negative maxUnavailable",
            configuration(
                "c-neg",
                json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": -1}}, "template": {}}),
            ),
            Some("maxUnavailable must be a number of Machines"),
        ),
        (
            "ftp kernel URL",
            configuration(
                "c-ftp",
                json!({"template": {"boot": {"kernelURL": "ftp://x/vmlinuz", "initrdURL": "i"}}}),
            ),
            Some("kernelURL must be an http:// or https:// URL"),
        ),
        (
            "bad sha256",
            configuration(
                "c-sha",
                json!({"template": {"image": {"url": "images/node.tar", "sha256": "ABC"}}}),
            ),
            Some("image.sha256 must be 64 lower-case hex digits"),
        ),
        (
            "image size limit",
            configuration(
                "c-maxsize",
                json!({"template": {"image": {"url": "images/node.tar.zst", "sha256": "0".repeat(64), "maxSizeBytes": 2_147_483_648_i64}}}),
            ),
            None,
        ),
        (
            "image size limit zero",
            configuration(
                "c-maxsize0",
                json!({"template": {"image": {"url": "images/node.tar.zst", "sha256": "0".repeat(64), "maxSizeBytes": 0}}}),
            ),
            Some("image.maxSizeBytes must be 1 or more"),
        ),
        (
            "bad kubernetes version",
            configuration(
                "c-kver",
                json!({"template": {"kubernetes": {"version": "1.35"}}}),
            ),
            Some("kubernetes.version must look like v1.35.4"),
        ),
        (
            "relative file path",
            configuration(
                "c-file",
                json!({"template": {"files": [{"path": "etc/x", "content": ""}]}}),
            ),
            Some("file path must be an absolute path"),
        ),
        (
            "bad file mode",
            configuration(
                "c-mode",
                json!({"template": {"files": [{"path": "/etc/x", "content": "", "mode": "rwx"}]}}),
            ),
            Some("file mode must be octal permission bits"),
        ),
        (
            "restartUnits without a unit suffix",
            configuration(
                "c-units",
                json!({"template": {"files": [{"path": "/etc/x", "content": "", "restartUnits": ["containerd"]}]}}),
            ),
            Some("restartUnits must be systemd unit names"),
        ),
        (
            "restartUnits named",
            configuration(
                "c-units2",
                json!({"template": {"files": [{"path": "/etc/x", "content": "", "restartUnits": ["containerd.service", "systemd-networkd@eth0.service"]}]}}),
            ),
            None,
        ),
        (
            "duplicate file path",
            configuration(
                "c-dupfile",
                json!({"template": {"files": [{"path": "/etc/x", "content": "a"}, {"path": "/etc/x", "content": "b"}]}}),
            ),
            Some("Duplicate value"),
        ),
        (
            "bind mount escaping",
            configuration(
                "c-bind",
                json!({"template": {"nspawn": {"bindMounts": [{"source": "/data/../etc"}]}}}),
            ),
            Some("bind mount source must be an absolute path without '..'"),
        ),
        (
            "storage with every rule",
            configuration(
                "c-storage",
                json!({"template": {"storage": {"disk": {"minSizeGiB": 100, "maxSizeGiB": 2000, "rotational": false, "model": "SAMSUNG MZ7L3960", "serial": "S5GXNF0R123456", "wwn": "0x5002538e4098a1b2", "byPath": "pci-0000:00:1f.2-ata-1"}, "layout": "wholeDisk", "filesystem": "ext4", "wipe": "always", "wipeMethod": "overwrite", "allowForeign": true}}}),
            ),
            None,
        ),
        (
            "storage defaults",
            configuration("c-storage-empty", json!({"template": {"storage": {}}})),
            None,
        ),
        (
            "storage min above max",
            configuration(
                "c-storage-range",
                json!({"template": {"storage": {"disk": {"minSizeGiB": 500, "maxSizeGiB": 100}}}}),
            ),
            Some("storage.disk.minSizeGiB must not be above maxSizeGiB"),
        ),
        (
            "storage size zero",
            configuration(
                "c-storage-zero",
                json!({"template": {"storage": {"disk": {"minSizeGiB": 0}}}}),
            ),
            Some("storage.disk.minSizeGiB must be 1 or more"),
        ),
        (
            "storage byPath as a path",
            configuration(
                "c-storage-path",
                json!({"template": {"storage": {"disk": {"byPath": "/dev/disk/by-path/pci-0000:00:1f.2-ata-1"}}}}),
            ),
            Some("without a '/'"),
        ),
        (
            "storage unknown wipe policy",
            configuration(
                "c-storage-wipe",
                json!({"template": {"storage": {"wipe": "sometimes"}}}),
            ),
            Some("Unsupported value: \"sometimes\""),
        ),
        (
            "storage filesystem not offered",
            configuration(
                "c-storage-xfs",
                json!({"template": {"storage": {"filesystem": "xfs"}}}),
            ),
            Some("Unsupported value: \"xfs\""),
        ),
    ]
}

fn operation(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation", "metadata": {"name": name}, "spec": spec})
}

fn operation_cases() -> Vec<(&'static str, Value, Option<&'static str>)> {
    vec![
        (
            "good by name",
            operation(
                "o-good",
                json!({"machineRef": {"name": "m"}, "operationName": "reboot"}),
            ),
            None,
        ),
        (
            "good by selector",
            operation(
                "o-sel",
                json!({"machineSelector": {"matchLabels": {"pool": "a"}}, "operationName": "powerCycle", "ttlSecondsAfterFinished": 0}),
            ),
            None,
        ),
        (
            "both targets",
            operation(
                "o-both",
                json!({"machineRef": {"name": "m"}, "machineSelector": {}, "operationName": "reboot"}),
            ),
            Some("set exactly one of spec.machineRef and spec.machineSelector"),
        ),
        (
            "no target",
            operation("o-none", json!({"operationName": "reboot"})),
            Some("set exactly one of spec.machineRef and spec.machineSelector"),
        ),
        (
            "empty operation name",
            operation(
                "o-empty",
                json!({"machineRef": {"name": "m"}, "operationName": ""}),
            ),
            Some("spec.operationName must not be empty"),
        ),
        (
            "operation name with spaces",
            operation(
                "o-space",
                json!({"machineRef": {"name": "m"}, "operationName": "power off"}),
            ),
            Some("must start with a letter"),
        ),
        (
            "negative ttl",
            operation(
                "o-ttl",
                json!({"machineRef": {"name": "m"}, "operationName": "reboot", "ttlSecondsAfterFinished": -1}),
            ),
            Some("spec.ttlSecondsAfterFinished must be 0 or more"),
        ),
        (
            "zero deadline",
            operation(
                "o-deadline",
                json!({"machineRef": {"name": "m"}, "operationName": "reboot", "activeDeadlineSeconds": 0}),
            ),
            Some("spec.activeDeadlineSeconds must be between 1 and 604800"),
        ),
        (
            "restartService without service",
            operation(
                "o-svc",
                json!({"machineRef": {"name": "m"}, "operationName": "restartService"}),
            ),
            Some("restartService needs the parameter 'service'"),
        ),
        (
            "applyConfiguration without version",
            operation(
                "o-apply1",
                json!({"machineRef": {"name": "m"}, "operationName": "applyConfiguration"}),
            ),
            Some("applyConfiguration needs the parameter 'version'"),
        ),
        (
            "applyConfiguration with a version that is not a number",
            operation(
                "o-apply2",
                json!({"machineRef": {"name": "m"}, "operationName": "applyConfiguration", "parameters": {"version": "v2"}}),
            ),
            Some("applyConfiguration needs the parameter 'version'"),
        ),
        (
            "applyConfiguration with disruptive yes",
            operation(
                "o-apply3",
                json!({"machineRef": {"name": "m"}, "operationName": "applyConfiguration", "parameters": {"version": "2", "disruptive": "yes"}}),
            ),
            Some("must be \"true\" or \"false\""),
        ),
        (
            "applyConfiguration with an unknown parameter",
            operation(
                "o-apply4",
                json!({"machineRef": {"name": "m"}, "operationName": "applyConfiguration", "parameters": {"version": "2", "force": "true"}}),
            ),
            Some("takes only the parameters 'version' and 'disruptive'"),
        ),
        (
            "applyConfiguration, disruptive",
            operation(
                "o-apply5",
                json!({"machineSelector": {"matchLabels": {"rack": "r1"}}, "operationName": "applyConfiguration", "parameters": {"version": "12", "disruptive": "true"}}),
            ),
            None,
        ),
        (
            "restartService with service",
            operation(
                "o-svc2",
                json!({"machineRef": {"name": "m"}, "operationName": "restartService", "parameters": {"service": "kubelet.service"}}),
            ),
            None,
        ),
    ]
}

fn pool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachinePool", "metadata": {"name": name}, "spec": spec})
}

fn pool_cases() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let pxe = json!({"provider": "pxe", "pxe": {"inventorySelector": {"matchLabels": {"rack": "r1"}}}, "configurationRef": {"name": "general"}});
    let manual = json!({"provider": "manual"});
    vec![
        (
            "good pxe pool",
            pool(
                "p-good",
                json!({"replicas": 3, "template": {"metadata": {"labels": {"tier": "a"}}, "spec": pxe},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "progressDeadlineSeconds": 600}},
                    "remediation": {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}], "maxUnhealthy": "40%"}}),
            ),
            None,
        ),
        (
            "good azure pool with surge",
            pool(
                "p-azure",
                json!({"replicas": 2, "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                    "template": {"spec": {"provider": "azure", "azure": azure_spec(json!({}))["azure"]}}}),
            ),
            None,
        ),
        (
            "negative replicas",
            pool(
                "p-neg",
                json!({"replicas": -1, "template": {"spec": manual}}),
            ),
            Some("spec.replicas must be 0 or more"),
        ),
        (
            "pxe without inventory",
            pool(
                "p-noinv",
                json!({"template": {"spec": {"provider": "pxe"}}}),
            ),
            Some("spec.template.spec.pxe (with inventorySelector) is required"),
        ),
        (
            "azure without azure",
            pool(
                "p-noaz",
                json!({"template": {"spec": {"provider": "azure"}}}),
            ),
            Some("spec.template.spec.azure is required"),
        ),
        (
            "surge on a pxe pool",
            pool(
                "p-surge",
                json!({"strategy": {"rollingUpdate": {"maxSurge": 1}}, "template": {"spec": pxe}}),
            ),
            Some("maxSurge applies only to pools that create Machines"),
        ),
        (
            "a percentage that is not one",
            pool(
                "p-pct",
                json!({"strategy": {"rollingUpdate": {"maxUnavailable": "half"}}, "template": {"spec": manual}}),
            ),
            Some("maxUnavailable must be a number of Machines"),
        ),
        (
            "rollingUpdate with OnDelete",
            pool(
                "p-ondel",
                json!({"strategy": {"type": "OnDelete", "rollingUpdate": {"maxUnavailable": 1}}, "template": {"spec": manual}}),
            ),
            Some("strategy.rollingUpdate may only be set when strategy.type is RollingUpdate"),
        ),
        (
            "the pool label in the template",
            pool(
                "p-label",
                json!({"template": {"metadata": {"labels": {"unbounded-cloud.io/pool": "other"}}, "spec": manual}}),
            ),
            Some("template labels may not set unbounded-cloud.io/pool"),
        ),
        (
            "a Node condition other than Ready",
            pool(
                "p-cond",
                json!({"remediation": {"unhealthyConditions": [{"type": "DiskPressure", "status": "True", "timeoutSeconds": 1}]}, "template": {"spec": manual}}),
            ),
            Some("only the Node condition Ready is watched"),
        ),
        (
            "a name too long for a label value",
            pool(&"p".repeat(64), json!({"template": {"spec": manual}})),
            Some("a MachinePool name may be at most 63 characters"),
        ),
        (
            "hardware requirements",
            pool(
                "p-hw",
                json!({"template": {"spec": {"provider": "pxe", "pxe": {"inventorySelector": {}, "hardwareRequirements": {"minCPUs": 8, "minMemoryGiB": 64, "minDisks": 2, "minNICSpeedMbps": 25000}}, "configurationRef": {"name": "general"}}}}),
            ),
            None,
        ),
        (
            "empty hardware requirements",
            pool(
                "p-hw-empty",
                json!({"template": {"spec": {"provider": "pxe", "pxe": {"inventorySelector": {}, "hardwareRequirements": {}}, "configurationRef": {"name": "general"}}}}),
            ),
            Some("hardwareRequirements needs at least one of minCPUs"),
        ),
        (
            "zero CPUs required",
            pool(
                "p-hw-zero",
                json!({"template": {"spec": {"provider": "pxe", "pxe": {"inventorySelector": {}, "hardwareRequirements": {"minCPUs": 0}}, "configurationRef": {"name": "general"}}}}),
            ),
            Some("minCPUs must be 1 to 16384"),
        ),
        (
            "absurd memory required",
            pool(
                "p-hw-mem",
                json!({"template": {"spec": {"provider": "pxe", "pxe": {"inventorySelector": {}, "hardwareRequirements": {"minMemoryGiB": 1_000_000}}, "configurationRef": {"name": "general"}}}}),
            ),
            Some("minMemoryGiB must be 1 to 65536"),
        ),
    ]
}

async fn check_cases(cases: Vec<(&'static str, Value, Option<&'static str>)>) {
    let client = client().await;
    let mut failures = Vec::new();
    for (case, object, expected) in cases {
        let result = dry_run_create(&client, object).await;
        match (expected, result) {
            (None, Ok(())) => {}
            (None, Err(e)) => failures.push(format!("{case}: rejected: {e}")),
            (Some(msg), Ok(())) => failures.push(format!("{case}: accepted, expected {msg:?}")),
            (Some(msg), Err(e)) if e.contains(msg) => {}
            (Some(msg), Err(e)) => failures.push(format!("{case}: expected {msg:?}, got {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn machine_rules_reject_bad_and_accept_good() {
    check_cases(machine_cases()).await;
}

#[tokio::test]
async fn configuration_rules_reject_bad_and_accept_good() {
    check_cases(configuration_cases()).await;
}

#[tokio::test]
async fn operation_rules_reject_bad_and_accept_good() {
    check_cases(operation_cases()).await;
}

#[tokio::test]
async fn pool_rules_reject_bad_and_accept_good() {
    check_cases(pool_cases()).await;
}

#[tokio::test]
async fn pool_provider_is_immutable() {
    let client = client().await;
    let api = api_for(&client, "MachinePool");
    let object: DynamicObject = serde_json::from_value(pool(
        "immutable-pool",
        json!({"template": {"spec": {"provider": "manual"}}}),
    ))
    .expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
    let patch = json!({"spec": {"template": {"spec": {"provider": "pxe", "pxe": {"inventorySelector": {}}}}}});
    let err = api
        .patch(
            "immutable-pool",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect_err("provider change refused");
    assert!(
        err.to_string()
            .contains("spec.template.spec.provider is immutable"),
        "{err}"
    );
}

/// The typed structs and the schema agree: what Rust serializes, the API server accepts.
#[tokio::test]
async fn typed_objects_round_trip_through_the_api_server() {
    let client = client().await;
    let machines: Api<Machine> = Api::all(client.clone());
    let machine: Machine = serde_json::from_value(machine(
        "typed-roundtrip",
        pxe_spec(
            json!({"macAddresses": ["52:54:00:aa:bb:cc"], "firmware": "bios", "ipv4": "192.0.2.9"}),
        ),
    ))
    .expect("typed machine");
    let created = machines
        .create(&PostParams::default(), &machine)
        .await
        .expect("create");
    assert_eq!(created.spec, machine.spec);
    machines
        .delete("typed-roundtrip", &DeleteParams::default())
        .await
        .expect("delete");
    let _: Api<MachineConfiguration> = Api::all(client.clone());
    let _: Api<MachineOperation> = Api::all(client);
}

#[tokio::test]
async fn provider_is_immutable() {
    let client = client().await;
    let api = api_for(&client, "Machine");
    let object: DynamicObject =
        serde_json::from_value(machine("immutable-provider", json!({"provider": "manual"})))
            .expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
    let patch =
        json!({"spec": {"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:12:34:57"]}}});
    let err = api
        .patch(
            "immutable-provider",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect_err("changing the provider must be rejected");
    assert!(
        err.to_string().contains("spec.provider is immutable"),
        "{err}"
    );
    api.delete("immutable-provider", &DeleteParams::default())
        .await
        .expect("delete");
}

/// Where an Azure VM is (its subscription and resource group) cannot change: a changed group
/// made the provider create a second VM there while the first ran on. Other fields (the VM
/// size, tags) may change (they apply to the next VM).
#[tokio::test]
async fn an_azure_machines_subscription_and_resource_group_are_immutable() {
    let client = client().await;
    let api = api_for(&client, "Machine");
    let object: DynamicObject =
        serde_json::from_value(machine("immutable-group", azure_spec(json!({})))).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
    for (patch, words) in [
        (
            json!({"spec": {"azure": {"resourceGroup": "rg-elsewhere"}}}),
            "spec.azure.resourceGroup is immutable",
        ),
        (
            json!({"spec": {"azure": {"subscriptionID": "11111111-2222-3333-4444-555555555555"}}}),
            "spec.azure.subscriptionID is immutable",
        ),
    ] {
        let err = api
            .patch(
                "immutable-group",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect_err("moving the VM must be rejected");
        assert!(err.to_string().contains(words), "{err}");
    }
    api.patch(
        "immutable-group",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"azure": {"vmSize": "Standard_D8s_v5"}}})),
    )
    .await
    .expect("the size may change");
    api.delete("immutable-group", &DeleteParams::default())
        .await
        .expect("delete");
}

fn version_object(name: &str, configuration: &str, version: i64, kernel: &str) -> Value {
    json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "MachineConfigurationVersion",
        "metadata": {"name": name},
        "spec": {"configurationName": configuration, "version": version,
                 "template": {"boot": {"kernelURL": kernel, "initrdURL": "initrd"}}}
    })
}

async fn set_version_status(
    api: &Api<MachineConfigurationVersion>,
    name: &str,
    deployed: bool,
    count: i64,
) {
    let status = json!({"status": {"deployed": deployed, "machineCount": count}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch status");
}

#[tokio::test]
async fn deployed_version_spec_is_immutable() {
    let client = client().await;
    let dynamic = api_for(&client, "MachineConfigurationVersion");
    let typed: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let object: DynamicObject =
        serde_json::from_value(version_object("immut-v1", "immut", 1, "k1")).expect("object");
    dynamic
        .create(&PostParams::default(), &object)
        .await
        .expect("create");

    // Not deployed yet: the controller may still change it.
    let change = |kernel: &str| json!({"spec": {"template": {"boot": {"kernelURL": kernel, "initrdURL": "initrd"}}}});
    typed
        .patch(
            "immut-v1",
            &PatchParams::default(),
            &Patch::Merge(&change("k2")),
        )
        .await
        .expect("an undeployed version is editable");

    set_version_status(&typed, "immut-v1", true, 0).await;
    let err = typed
        .patch(
            "immut-v1",
            &PatchParams::default(),
            &Patch::Merge(&change("k3")),
        )
        .await
        .expect_err("a deployed version must be immutable");
    assert!(
        err.to_string()
            .contains("the spec of a deployed MachineConfigurationVersion is immutable"),
        "{err}"
    );

    // And it stays deployed.
    let undeploy = json!({"status": {"deployed": false}});
    let err = typed
        .patch_status(
            "immut-v1",
            &PatchParams::default(),
            &Patch::Merge(&undeploy),
        )
        .await
        .expect_err("deployed must not go back to false");
    assert!(
        err.to_string()
            .contains("a deployed version stays deployed"),
        "{err}"
    );
    typed
        .delete("immut-v1", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn operation_spec_is_immutable() {
    let client = client().await;
    let api = api_for(&client, "MachineOperation");
    let object: DynamicObject = serde_json::from_value(operation(
        "immutable-op",
        json!({"machineRef": {"name": "m"}, "operationName": "reboot"}),
    ))
    .expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
    let patch = json!({"spec": {"operationName": "shutdown"}});
    let err = api
        .patch(
            "immutable-op",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect_err("changing an operation must be rejected");
    assert!(
        err.to_string()
            .contains("the spec of a MachineOperation is immutable"),
        "{err}"
    );
    api.delete("immutable-op", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn policy_denies_deleting_a_referenced_version_and_allows_it_at_zero() {
    let client = client().await;
    let dynamic = api_for(&client, "MachineConfigurationVersion");
    let typed: Api<MachineConfigurationVersion> = Api::all(client.clone());
    let object: DynamicObject =
        serde_json::from_value(version_object("vap-v1", "vap", 1, "k")).expect("object");
    dynamic
        .create(&PostParams::default(), &object)
        .await
        .expect("create");
    set_version_status(&typed, "vap-v1", true, 3).await;

    // The policy is installed with the control plane; admission picks it up within seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    let message = loop {
        match typed.delete("vap-v1", &DeleteParams::default()).await {
            Err(e) => break e.to_string(),
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "the policy never denied the delete"
                );
                let object: DynamicObject =
                    serde_json::from_value(version_object("vap-v1", "vap", 1, "k"))
                        .expect("object");
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = dynamic.create(&PostParams::default(), &object).await;
                set_version_status(&typed, "vap-v1", true, 3).await;
            }
        }
    };
    assert!(message.contains("is used by 3 Machine(s)"), "{message}");
    assert!(
        typed.get("vap-v1").await.is_ok(),
        "the version must still exist"
    );

    set_version_status(&typed, "vap-v1", true, 0).await;
    typed
        .delete("vap-v1", &DeleteParams::default())
        .await
        .expect("deleting an unreferenced version is allowed");
}
