#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use super::*;

const CREATE_VM: &str =
    include_str!("../tests/fixtures/VirtualMachine_Create_WithSshAuthentication.json");
const INSTANCE_VIEW: &str = include_str!("../tests/fixtures/VirtualMachine_Get_InstanceView.json");
const CREATE_NIC: &str = include_str!("../tests/fixtures/NetworkInterfaceCreate.json");

fn azure() -> AzureSpec {
    serde_json::from_value(json!({
        "subscriptionID": "00000000-0000-0000-0000-00000000000a",
        "resourceGroup": "rg-nodes",
        "location": "westeurope",
        "vmSize": "Standard_D2s_v5",
        "image": {"publisher": "Debian", "offer": "debian-12", "sku": "12-gen2"},
        "subnetID": "/subscriptions/00000000-0000-0000-0000-00000000000a/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes",
        "sshPublicKey": "ssh-ed25519 AAAAC3Nza ops@example",
        "tags": {"team": "infra"},
    }))
    .unwrap()
}

/// Every leaf path of a JSON value, array elements as `[]`.
fn paths(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                paths(v, &format!("{prefix}.{key}"), out);
            }
        }
        Value::Array(items) => {
            for v in items {
                paths(v, &format!("{prefix}[]"), out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

fn all_paths(value: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    paths(value, "", &mut out);
    out
}

#[test]
fn names_ids_and_provider_id() {
    let r = VmResources::named("web-1", &azure()).unwrap();
    let group = "/subscriptions/00000000-0000-0000-0000-00000000000a/resourceGroups/rg-nodes";
    assert_eq!(
        r.vm_id(),
        format!("{group}/providers/Microsoft.Compute/virtualMachines/web-1")
    );
    assert_eq!(
        r.nic_id(),
        format!("{group}/providers/Microsoft.Network/networkInterfaces/web-1-nic")
    );
    assert_eq!(
        r.os_disk_id(),
        format!("{group}/providers/Microsoft.Compute/disks/web-1-osdisk")
    );
    assert_eq!(
        r.provider_id(),
        format!("azure://{group}/providers/Microsoft.Compute/virtualMachines/web-1")
    );
    assert!(r.provider_id().starts_with("azure:///subscriptions/"));
    assert_eq!(
        r.vm_view_path(),
        format!(
            "{}?api-version={}&$expand=instanceView",
            r.vm_id(),
            api_version::COMPUTE
        )
    );
    assert_eq!(
        r.vm_action_path("deallocate"),
        format!(
            "{}/deallocate?api-version={}",
            r.vm_id(),
            api_version::COMPUTE
        )
    );
    assert!(
        r.nic_path()
            .ends_with(&format!("?api-version={}", api_version::NETWORK))
    );
}

#[test]
fn vm_names_longer_than_azure_allows_are_refused() {
    let long = "a".repeat(65);
    assert_eq!(
        VmResources::named(&long, &azure()),
        Err(SpecError::NameTooLong {
            name: long.clone(),
            length: 65
        })
    );
    assert!(VmResources::named(&"a".repeat(64), &azure()).is_ok());
}

#[test]
fn computer_names() {
    let cases = [
        ("web-1", "web-1"),
        ("node.rack1.example", "node-rack1-example"),
        (&*"a".repeat(64), &*"a".repeat(64)),
    ];
    for (machine, expected) in cases {
        assert_eq!(computer_name(machine), expected, "{machine}");
    }
    // Cut at 64 and never ending in a dash.
    let long = format!("{}.b", "a".repeat(63));
    assert_eq!(computer_name(&long), "a".repeat(63));
}

#[test]
fn the_providers_tags_win() {
    let mut extra = BTreeMap::new();
    extra.insert("team".to_owned(), "infra".to_owned());
    extra.insert(TAG_MACHINE.to_owned(), "spoofed".to_owned());
    let tags = tags("web-1", "prod", &extra);
    assert_eq!(tags["team"], "infra");
    assert_eq!(tags[TAG_MACHINE], "web-1");
    assert_eq!(tags[TAG_CLUSTER], "prod");
}

#[test]
fn vm_body_uses_the_documented_property_paths() {
    let azure = azure();
    let resources = VmResources::named("web-1", &azure).unwrap();
    let tags = tags("web-1", "prod", &azure.tags);
    let body = vm_body(&VmRequest {
        azure: &azure,
        resources: &resources,
        tags: &tags,
        ssh_public_key: azure.ssh_public_key.as_deref().unwrap(),
        custom_data_base64: Some("I2Nsb3VkLWNvbmZpZw=="),
    });
    let example: Value = serde_json::from_str(CREATE_VM).unwrap();
    let documented = all_paths(&example["parameters"]["parameters"]);
    // What the SSH example does not show, each documented elsewhere in the same api-version.
    let beyond_the_example: BTreeSet<String> = [
        ".tags.team",
        ".tags.unbounded-cluster",
        ".tags.unbounded-machine",
        ".properties.osProfile.customData",
        ".properties.storageProfile.osDisk.deleteOption",
        ".properties.networkProfile.networkInterfaces[].properties.deleteOption",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    for path in all_paths(&body) {
        assert!(
            documented.contains(&path) || beyond_the_example.contains(&path),
            "{path} is not a documented VM property path"
        );
    }
    let p = &body["properties"];
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_D2s_v5");
    assert_eq!(p["storageProfile"]["imageReference"]["version"], "latest");
    assert_eq!(p["storageProfile"]["osDisk"]["name"], "web-1-osdisk");
    assert_eq!(p["osProfile"]["customData"], "I2Nsb3VkLWNvbmZpZw==");
    assert_eq!(
        p["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"],
        "/home/unbounded/.ssh/authorized_keys"
    );
    assert_eq!(
        p["networkProfile"]["networkInterfaces"][0]["id"],
        resources.nic_id()
    );
}

#[test]
fn an_image_id_replaces_the_marketplace_reference() {
    let mut azure = azure();
    azure.image = serde_json::from_value(json!({"id": "/subscriptions/x/resourceGroups/g/providers/Microsoft.Compute/galleries/g/images/node/versions/1.0.0"})).unwrap();
    let resources = VmResources::named("web-1", &azure).unwrap();
    let body = vm_body(&VmRequest {
        azure: &azure,
        resources: &resources,
        tags: &BTreeMap::new(),
        ssh_public_key: "ssh-ed25519 AAAA",
        custom_data_base64: None,
    });
    assert_eq!(
        body["properties"]["storageProfile"]["imageReference"],
        json!({"id": azure.image.id.clone().unwrap()})
    );
    assert!(
        body["properties"]["osProfile"].get("customData").is_none(),
        "a re-sent PUT leaves the custom data out"
    );
}

#[test]
fn nic_body_uses_the_documented_property_paths() {
    let azure = azure();
    let body = nic_body(&azure, &tags("web-1", "prod", &azure.tags));
    let example: Value = serde_json::from_str(CREATE_NIC).unwrap();
    let mut documented = all_paths(&example["parameters"]["parameters"]);
    // primary and privateIPAllocationMethod are shown in the example's response.
    documented.extend(
        all_paths(&example["responses"]["201"]["body"])
            .into_iter()
            .filter(|p| p.starts_with(".properties.ipConfigurations")),
    );
    for path in all_paths(&body) {
        assert!(
            documented.contains(&path) || path.starts_with(".tags."),
            "{path} is not a documented NIC property path"
        );
    }
    assert_eq!(
        body["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"],
        azure.subnet_id
    );
}

#[test]
fn power_and_provisioning_state_from_a_documented_vm_and_instance_view() {
    let example: Value = serde_json::from_str(CREATE_VM).unwrap();
    let mut vm = example["responses"]["201"]["body"].clone();
    let view: Value = serde_json::from_str(INSTANCE_VIEW).unwrap();
    vm["properties"]["instanceView"] = view["responses"]["200"]["body"].clone();
    let seen = VmView::of(&vm);
    assert_eq!(seen.provisioning_state.as_deref(), Some("Creating"));
    assert_eq!(seen.power, PowerState::On);
    assert_eq!(seen.power_code.as_deref(), Some("running"));
    assert_eq!(
        seen.describe("myVM"),
        "VM myVM: provisioning Creating, power running"
    );
    // Without an instance view, the power is unknown.
    let bare = VmView::of(&example["responses"]["201"]["body"]);
    assert_eq!(bare.power, PowerState::Unknown);
}

#[test]
fn power_codes() {
    let cases = [
        ("running", PowerState::On),
        ("starting", PowerState::On),
        ("stopped", PowerState::Off),
        ("stopping", PowerState::Off),
        ("deallocated", PowerState::Off),
        ("deallocating", PowerState::Off),
        ("unknown", PowerState::Unknown),
        ("", PowerState::Unknown),
    ];
    for (code, expected) in cases {
        assert_eq!(power_of(code), expected, "{code}");
    }
}

#[test]
fn addresses_from_a_documented_nic() {
    let example: Value = serde_json::from_str(CREATE_NIC).unwrap();
    let addresses = nic_addresses(&example["responses"]["201"]["body"]);
    let got: Vec<(&str, &str)> = addresses
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    assert_eq!(
        got,
        [("InternalIP", "172.20.2.4"), ("InternalIP", "172.20.2.16")]
    );
    assert!(nic_addresses(&json!({})).is_empty());
}
