//! What the provider asks Azure for and what it reads back, as pure functions over plain
//! data: the names and IDs of a Machine's resources, its provider ID, the NIC and VM request
//! bodies, and the power state, provisioning state and addresses in Azure's answers.
//!
//! A Machine `m` gets, in `spec.azure.resourceGroup`: the NIC `m-nic` in `spec.azure.subnetID`,
//! the VM `m` and its managed OS disk `m-osdisk`. The VM is created with `deleteOption: Delete`
//! on both, and the provider still deletes them itself (idempotently), so that a VM deleted by
//! hand does not leave them behind.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use unbounded_api::{AzureImage, AzureSpec, Machine, MachineAddress, PowerState};

use crate::api_version;

/// The VM's admin user, who gets the SSH key.
pub const ADMIN_USERNAME: &str = "unbounded";
/// Tag naming the Machine, on the VM and its NIC.
pub const TAG_MACHINE: &str = "unbounded-machine";
/// Tag naming the cluster (the provider's `--cluster-name`), on the VM and its NIC.
pub const TAG_CLUSTER: &str = "unbounded-cluster";
/// Azure's limit for a Linux VM's name.
const VM_NAME_MAX: usize = 64;
/// Azure's limit for a Linux computer (host) name.
const COMPUTER_NAME_MAX: usize = 64;

/// A Machine that cannot be turned into Azure resources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `spec.azure` is absent (the CRD's rules prevent it; kept for hand-built objects).
    #[error("a Machine with provider azure needs spec.azure")]
    MissingAzure,
    /// The Machine's name is longer than an Azure VM name may be.
    #[error(
        "the Machine name {name:?} has {length} characters; an Azure VM name may have at most 64"
    )]
    NameTooLong {
        /// The name.
        name: String,
        /// Its length.
        length: usize,
    },
}

/// The Azure resources of one Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmResources {
    /// Subscription ID.
    pub subscription: String,
    /// Resource group.
    pub resource_group: String,
    /// VM name (the Machine's name).
    pub vm: String,
    /// NIC name.
    pub nic: String,
    /// OS disk name.
    pub os_disk: String,
}

impl VmResources {
    /// The resources of `machine`.
    pub fn of(machine: &Machine) -> Result<Self, SpecError> {
        let azure = machine.spec.azure.as_ref().ok_or(SpecError::MissingAzure)?;
        let name = machine.metadata.name.clone().unwrap_or_default();
        Self::named(&name, azure)
    }

    /// The resources of a Machine named `name` with `azure`.
    pub fn named(name: &str, azure: &AzureSpec) -> Result<Self, SpecError> {
        let length = name.chars().count();
        if length > VM_NAME_MAX {
            return Err(SpecError::NameTooLong {
                name: name.to_owned(),
                length,
            });
        }
        Ok(Self {
            subscription: azure.subscription_id.clone(),
            resource_group: azure.resource_group.clone(),
            vm: name.to_owned(),
            nic: format!("{name}-nic"),
            os_disk: format!("{name}-osdisk"),
        })
    }

    fn group_id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.subscription, self.resource_group
        )
    }

    /// The VM's resource ID.
    pub fn vm_id(&self) -> String {
        format!(
            "{}/providers/Microsoft.Compute/virtualMachines/{}",
            self.group_id(),
            self.vm
        )
    }

    /// The NIC's resource ID.
    pub fn nic_id(&self) -> String {
        format!(
            "{}/providers/Microsoft.Network/networkInterfaces/{}",
            self.group_id(),
            self.nic
        )
    }

    /// The OS disk's resource ID.
    pub fn os_disk_id(&self) -> String {
        format!(
            "{}/providers/Microsoft.Compute/disks/{}",
            self.group_id(),
            self.os_disk
        )
    }

    /// The Cluster API provider ID: `azure://` followed by the VM's resource ID, as Azure's
    /// cloud provider writes it into a Node's `spec.providerID`.
    pub fn provider_id(&self) -> String {
        format!("azure://{}", self.vm_id())
    }

    /// Path and query of the VM (PUT, DELETE).
    pub fn vm_path(&self) -> String {
        format!("{}?api-version={}", self.vm_id(), api_version::COMPUTE)
    }

    /// Path and query of the VM with its instance view (power state) in one GET.
    pub fn vm_view_path(&self) -> String {
        format!(
            "{}?api-version={}&$expand=instanceView",
            self.vm_id(),
            api_version::COMPUTE
        )
    }

    /// Path and query of a VM action (`start`, `powerOff`, `deallocate`, `restart`,
    /// `redeploy`), a POST.
    pub fn vm_action_path(&self, action: &str) -> String {
        format!(
            "{}/{action}?api-version={}",
            self.vm_id(),
            api_version::COMPUTE
        )
    }

    /// Path and query of the NIC.
    pub fn nic_path(&self) -> String {
        format!("{}?api-version={}", self.nic_id(), api_version::NETWORK)
    }

    /// Path and query of the OS disk.
    pub fn os_disk_path(&self) -> String {
        format!("{}?api-version={}", self.os_disk_id(), api_version::COMPUTE)
    }
}

/// The VM's host name: the Machine's name with dots turned into dashes (a Linux computer name
/// on Azure may not hold dots), at most 64 characters. The Node's name does not depend on it:
/// the agent is told the Machine's name.
pub fn computer_name(machine: &str) -> String {
    let name: String = machine
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .take(COMPUTER_NAME_MAX)
        .collect();
    name.trim_end_matches('-').to_owned()
}

/// The tags of the VM and its NIC: the Machine's own, then the provider's two (which win; the
/// CRD refuses them in `spec.azure.tags` anyway).
pub fn tags(
    machine: &str,
    cluster: &str,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut tags = extra.clone();
    tags.insert(TAG_MACHINE.to_owned(), machine.to_owned());
    tags.insert(TAG_CLUSTER.to_owned(), cluster.to_owned());
    tags
}

/// The NIC's PUT body: one dynamic IPv4 configuration in the subnet.
pub fn nic_body(azure: &AzureSpec, tags: &BTreeMap<String, String>) -> Value {
    json!({
        "location": azure.location,
        "tags": tags,
        "properties": {
            "ipConfigurations": [{
                "name": "ipconfig1",
                "properties": {
                    "primary": true,
                    "privateIPAllocationMethod": "Dynamic",
                    "subnet": {"id": azure.subnet_id},
                },
            }],
        },
    })
}

/// Everything the VM's PUT body is made of.
#[derive(Debug, Clone, Copy)]
pub struct VmRequest<'a> {
    /// The Machine's Azure settings.
    pub azure: &'a AzureSpec,
    /// Its resources.
    pub resources: &'a VmResources,
    /// Its tags.
    pub tags: &'a BTreeMap<String, String>,
    /// The admin user's SSH public key.
    pub ssh_public_key: &'a str,
    /// The custom data, base64-encoded (cloud-init reads it); `None` when re-sending the
    /// PUT of a VM that exists (Azure refuses a change of custom data, and treats an absent
    /// one as unchanged: its GET never returns it, so a GET-then-PUT must keep it).
    pub custom_data_base64: Option<&'a str>,
}

/// The VM's PUT body.
pub fn vm_body(request: &VmRequest<'_>) -> Value {
    let VmRequest {
        azure,
        resources,
        tags,
        ssh_public_key,
        custom_data_base64,
    } = *request;
    let mut body = json!({
        "location": azure.location,
        "tags": tags,
        "properties": {
            "hardwareProfile": {"vmSize": azure.vm_size},
            "storageProfile": {
                "imageReference": image_reference(&azure.image),
                "osDisk": {
                    "name": resources.os_disk,
                    "createOption": "FromImage",
                    "caching": "ReadWrite",
                    "deleteOption": "Delete",
                },
            },
            "osProfile": {
                "computerName": computer_name(&resources.vm),
                "adminUsername": ADMIN_USERNAME,
                "linuxConfiguration": {
                    "disablePasswordAuthentication": true,
                    "ssh": {"publicKeys": [{
                        "path": format!("/home/{ADMIN_USERNAME}/.ssh/authorized_keys"),
                        "keyData": ssh_public_key.trim(),
                    }]},
                },
            },
            "networkProfile": {"networkInterfaces": [{
                "id": resources.nic_id(),
                "properties": {"primary": true, "deleteOption": "Delete"},
            }]},
        },
    });
    if let (Some(custom), Some(os)) = (
        custom_data_base64,
        body["properties"]["osProfile"].as_object_mut(),
    ) {
        os.insert("customData".into(), json!(custom));
    }
    body
}

fn image_reference(image: &AzureImage) -> Value {
    match &image.id {
        Some(id) => json!({"id": id}),
        None => json!({
            "publisher": image.publisher,
            "offer": image.offer,
            "sku": image.sku,
            "version": image.version.as_deref().unwrap_or("latest"),
        }),
    }
}

/// What a VM looks like, from a GET with `$expand=instanceView`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmView {
    /// `properties.provisioningState` (`Creating`, `Succeeded`, `Failed`, …).
    pub provisioning_state: Option<String>,
    /// The power state.
    pub power: PowerState,
    /// The instance view's power code without its prefix (`running`, `deallocated`, …).
    pub power_code: Option<String>,
}

impl VmView {
    /// Reads a VM resource.
    pub fn of(vm: &Value) -> Self {
        let properties = &vm["properties"];
        let power_code = properties["instanceView"]["statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["code"].as_str())
            .find_map(|code| code.strip_prefix("PowerState/"))
            .map(str::to_owned);
        Self {
            provisioning_state: properties["provisioningState"].as_str().map(str::to_owned),
            power: power_code.as_deref().map_or(PowerState::Unknown, power_of),
            power_code,
        }
    }

    /// One line for the InfrastructureReady message.
    pub fn describe(&self, vm: &str) -> String {
        format!(
            "VM {vm}: provisioning {}, power {}",
            self.provisioning_state.as_deref().unwrap_or("unknown"),
            self.power_code.as_deref().unwrap_or("unknown"),
        )
    }
}

/// The power state of an instance-view code such as `running` (from `PowerState/running`).
/// Transitions count as where they are heading.
pub fn power_of(code: &str) -> PowerState {
    match code {
        "running" | "starting" => PowerState::On,
        "stopped" | "stopping" | "deallocated" | "deallocating" => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// The private addresses of a NIC resource, the primary configuration's first. Azure writes
/// a configuration with a prefix length as `address/length`; the address is kept.
pub fn nic_addresses(nic: &Value) -> Vec<MachineAddress> {
    let mut configs: Vec<&Value> = nic["properties"]["ipConfigurations"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    configs.sort_by_key(|c| !c["properties"]["primary"].as_bool().unwrap_or(false));
    configs
        .into_iter()
        .filter_map(|c| c["properties"]["privateIPAddress"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a))
        .filter(|a| !a.is_empty())
        .map(|a| MachineAddress {
            type_: "InternalIP".into(),
            address: a.to_owned(),
        })
        .collect()
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
