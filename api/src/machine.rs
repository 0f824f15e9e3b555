//! `Machine`: one server or VM that becomes one Kubernetes Node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a Machine is and which configuration it should run.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "Machine",
    shortname = "ma",
    category = "unbounded",
    status = "MachineStatus",
    derive = "PartialEq",
    doc = "A Machine is one bare-metal server or cloud VM that Unbounded turns into exactly one Kubernetes Node.",
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".spec.provider",
        description = "The provider that owns the machine's infrastructure"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Configuration",
        type_ = "string",
        json_path = ".status.configuration.name",
        description = "The MachineConfiguration the machine runs"
    ),
    printcolumn(
        name = "Version",
        type_ = "integer",
        json_path = ".status.configuration.version",
        description = "The configuration version the machine runs"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.nodeRef.name",
        description = "The Node this machine became"
    ),
    printcolumn(
        name = "Kubelet",
        type_ = "string",
        json_path = ".status.kubeletVersion",
        description = "The kubelet version the Node reports"
    ),
    printcolumn(
        name = "Power",
        type_ = "string",
        json_path = ".status.power",
        description = "Power state reported by the provider"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        description = "The infrastructure's provider ID (pxe://<mac>, azure:///subscriptions/…), shown with -o wide",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.failureReason",
        description = "Why the machine failed terminally (phase Failed), shown with -o wide",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.provider != 'pxe' || has(self.pxe)").message("spec.pxe is required when spec.provider is 'pxe'"))]
#[x_kube(validation = Rule::new("self.provider != 'azure' || has(self.azure)").message("spec.azure is required when spec.provider is 'azure'"))]
#[x_kube(validation = Rule::new("!has(self.pxe) || self.provider == 'pxe'").message("spec.pxe may only be set when spec.provider is 'pxe'"))]
#[x_kube(validation = Rule::new("!has(self.azure) || self.provider == 'azure'").message("spec.azure may only be set when spec.provider is 'azure'"))]
#[x_kube(validation = Rule::new("!has(oldSelf.azure) || !has(self.azure) || self.azure.resourceGroup == oldSelf.azure.resourceGroup").message("spec.azure.resourceGroup is immutable: the VM is found by it; delete and recreate the Machine to move it"))]
#[x_kube(validation = Rule::new("!has(oldSelf.azure) || !has(self.azure) || self.azure.subscriptionID == oldSelf.azure.subscriptionID").message("spec.azure.subscriptionID is immutable: the VM is found by it; delete and recreate the Machine to move it"))]
pub struct MachineSpec {
    /// The provider that owns this machine's infrastructure: `pxe` (bare metal booted by the
    /// bootserver), `azure` (a VM created through Azure Resource Manager) or `manual` (someone
    /// else provisions it; Unbounded only manages its configuration and Node). Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.provider is immutable: delete and recreate the Machine to change its provider"))]
    pub provider: MachineProvider,

    /// Bare-metal settings, required when the provider is `pxe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxe: Option<PxeSpec>,

    /// Azure VM settings, required when the provider is `azure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<AzureSpec>,

    /// Which MachineConfiguration (and optionally which version of it) this machine runs. When
    /// absent, the matching MachineConfiguration with the highest priority is chosen by its
    /// machineSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_ref: Option<ConfigurationRef>,

    /// Cluster API compatible provider ID, such as `pxe://aa:bb:cc:dd:ee:ff` or
    /// `azure:///subscriptions/.../virtualMachines/name`. Matched against a Node's
    /// `spec.providerID`. Immutable once set.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.providerID is immutable once set"))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]+://')").message("spec.providerID must look like '<provider>://<id>'"))]
    pub provider_id: Option<String>,

    /// Name of the Node this machine becomes. Defaults to the Machine's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("spec.nodeName must be a lower-case DNS subdomain (a valid Node name)"))]
    pub node_name: Option<String>,
}

/// The provider that owns a Machine's infrastructure.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MachineProvider {
    /// Bare metal booted over the network by the Unbounded bootserver.
    Pxe,
    /// A virtual machine in Azure.
    Azure,
    /// Provisioned by someone else.
    Manual,
}

impl MachineProvider {
    /// The name as written in `spec.provider`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pxe => "pxe",
            Self::Azure => "azure",
            Self::Manual => "manual",
        }
    }
}

/// How the bootserver reaches, powers and boots a bare-metal server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.architecture) || self.architecture != 'arm64' || !has(self.firmware) || self.firmware != 'bios'").message("an arm64 server boots with UEFI: firmware bios exists only on x86_64"))]
pub struct PxeSpec {
    /// MAC addresses of the NICs that may network-boot, as six colon-separated hex pairs
    /// (`aa:bb:cc:dd:ee:ff`). At least one.
    #[x_kube(validation = Rule::new("self.size() >= 1").message("spec.pxe.macAddresses needs at least one MAC address"))]
    #[x_kube(validation = Rule::new("self.all(m, m.matches('^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$'))").message("each MAC address must be six colon-separated hex pairs, such as 52:54:00:12:34:56"))]
    #[x_kube(validation = Rule::new("self.all(m, self.exists_one(n, n.lowerAscii() == m.lowerAscii()))").message("spec.pxe.macAddresses lists the same MAC address twice"))]
    #[schemars(length(max = 16), inner(length(max = 17)))]
    pub mac_addresses: Vec<String>,

    /// CPU architecture, which decides the boot file: `x86_64` (default) or `arm64`.
    #[serde(default)]
    pub architecture: Architecture,

    /// Firmware type: `uefi` (default) or `bios` (legacy).
    #[serde(default)]
    pub firmware: Firmware,

    /// Static IPv4 address reserved for this machine when the bootserver is the DHCP server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self) && ip(self).family() == 4").message("spec.pxe.ipv4 must be an IPv4 address such as 10.0.0.20 (no prefix length)"))]
    pub ipv4: Option<String>,

    /// Static IPv6 address reserved for this machine when the bootserver is the DHCPv6
    /// server (`dhcp6.mode: full`), given to the machine's identity associations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self) && ip(self).family() == 6").message("spec.pxe.ipv6 must be an IPv6 address such as fd00:99::20 (no prefix length)"))]
    pub ipv6: Option<String>,

    /// The server's baseboard management controller. Without one, power operations fail and
    /// someone has to power the server on by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcSpec>,

    /// How the machine proves who it is before it gets credentials: by its TPM's
    /// endorsement key, or (no TPM) by what the bootserver saw of it on the network. Fields
    /// left out come from the configuration's `template.identity`, then the bootserver's
    /// `identity.defaultMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::identity::IdentitySpec>,
}

/// CPU architecture of a bare-metal server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Architecture {
    /// 64-bit x86.
    #[default]
    #[serde(rename = "x86_64")]
    X86_64,
    /// 64-bit ARM.
    #[serde(rename = "arm64")]
    Arm64,
}

/// Firmware a bare-metal server boots with.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// UEFI firmware.
    #[default]
    Uefi,
    /// Legacy BIOS.
    Bios,
}

/// A baseboard management controller (Redfish or IPMI over LAN).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.insecureSkipVerify) || !self.insecureSkipVerify || self.address.startsWith('redfish')").message("insecureSkipVerify applies only to Redfish BMCs"))]
#[x_kube(validation = Rule::new("!has(self.caBundle) || self.address.startsWith('redfish')").message("caBundle applies only to Redfish BMCs"))]
pub struct BmcSpec {
    /// BMC endpoint: `redfish+https://host[:port]/redfish/v1/Systems/<id>` (`redfish://` means
    /// https too), `redfish+http://...`, or `ipmi://host[:port]` (IPMI v2.0 over LAN, default port 623).
    #[x_kube(validation = Rule::new("self.matches('^(redfish|redfish\\\\+https|redfish\\\\+http|ipmi)://[^/\\\\s]+')").message("spec.pxe.bmc.address must start with redfish://, redfish+https://, redfish+http:// or ipmi:// followed by a host"))]
    #[x_kube(validation = Rule::new("self.size() <= 2048").message("spec.pxe.bmc.address is too long"))]
    pub address: String,

    /// The Secret holding the BMC credentials under the keys `username` and `password`.
    pub credentials_secret_ref: SecretReference,

    /// Skip TLS certificate verification for a Redfish BMC (its certificate is usually
    /// self-signed). Prefer `caBundle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,

    /// PEM-encoded CA certificates that sign the Redfish BMC's TLS certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')").message("spec.pxe.bmc.caBundle must hold PEM-encoded certificates"))]
    pub ca_bundle: Option<String>,
}

/// A reference to a Secret in a namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Namespace of the Secret.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 63 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("namespace must be a valid namespace name"))]
    pub namespace: String,
    /// Name of the Secret.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 253").message("name must be a non-empty Secret name"))]
    pub name: String,
}

/// Where and how to create an Azure VM (a NIC in an existing subnet, the VM, its managed OS
/// disk). Read when the VM is created: changes after it exists are not applied to it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.sshPublicKey) != has(self.sshKeySecretRef)").message("set exactly one of spec.azure.sshPublicKey and spec.azure.sshKeySecretRef"))]
pub struct AzureSpec {
    /// Azure subscription ID (a UUID). Immutable on a Machine: the VM is found by it.
    #[serde(rename = "subscriptionID")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$')").message("spec.azure.subscriptionID must be a UUID"))]
    #[schemars(length(max = 36))]
    pub subscription_id: String,
    /// Resource group the VM, its NIC and its OS disk are created in (it must exist).
    /// Immutable on a Machine (a rule of `MachineSpec`; a pool's template may change it): a
    /// changed group would make the provider create a second VM there while the first runs
    /// on, and delete nothing of the first.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 90").message("spec.azure.resourceGroup must be 1 to 90 characters"))]
    #[x_kube(validation = Rule::new(r"self.matches('^[-\\w.()]+$') && !self.endsWith('.')").message("spec.azure.resourceGroup may hold letters, digits, '-', '_', '.', '(' and ')', and may not end with '.'"))]
    #[schemars(length(max = 90))]
    pub resource_group: String,
    /// Azure region (its programmatic name), such as `westeurope`.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]+$')").message("spec.azure.location must be a region name such as westeurope (lower-case letters and digits)"))]
    #[schemars(length(max = 64))]
    pub location: String,
    /// VM size, such as `Standard_D4s_v5`.
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9_]+$')").message("spec.azure.vmSize must be a VM size such as Standard_D4s_v5"))]
    #[schemars(length(max = 64))]
    pub vm_size: String,
    /// The OS image the VM boots.
    pub image: AzureImage,
    /// Resource ID of the subnet the VM's NIC joins.
    #[serde(rename = "subnetID")]
    #[x_kube(validation = Rule::new("self.matches('(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Network/virtualNetworks/[^/]+/subnets/[^/]+$')").message("spec.azure.subnetID must be a subnet's resource ID: /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet>"))]
    #[schemars(length(max = 1024))]
    pub subnet_id: String,
    /// The SSH public key installed for the VM's admin user `unbounded` (OpenSSH format:
    /// `ssh-rsa AAAA…` or `ssh-ed25519 AAAA…`). Exactly one of this and `sshKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521) [A-Za-z0-9+/]+={0,3}( [^\\n]*)?$')").message("spec.azure.sshPublicKey must be one OpenSSH public key line, such as 'ssh-ed25519 AAAA… comment'"))]
    #[schemars(length(max = 16384))]
    pub ssh_public_key: Option<String>,
    /// Secret (key `ssh-publickey`) with the SSH public key installed for the VM's admin user.
    /// Exactly one of this and `sshPublicKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_secret_ref: Option<SecretReference>,
    /// Tags set on the VM and its NIC, beside the two the provider sets itself
    /// (`unbounded-machine`: the Machine's name; `unbounded-cluster`: the provider's cluster
    /// name), which may not be given here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 48, "additionalProperties" = {"type": "string", "maxLength": 256}))]
    #[x_kube(validation = Rule::new(r"self.all(k, k.size() >= 1 && k.size() <= 512 && !k.matches('[<>%&\\\\?/]'))").message("spec.azure.tags names must be 1 to 512 characters without < > % & \\ ? /"))]
    #[x_kube(validation = Rule::new("self.all(k, !(k.lowerAscii() in ['unbounded-machine', 'unbounded-cluster']))").message("spec.azure.tags may not set unbounded-machine or unbounded-cluster: the provider sets them"))]
    pub tags: BTreeMap<String, String>,
    /// Secret with a service principal's credentials under the keys `tenantID`, `clientID` and
    /// `clientSecret`. Without it the provider uses its own identity (workload identity or
    /// managed identity; see the provider's documentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,
}

/// An Azure Marketplace image or an image resource ID.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.id) != (has(self.publisher) && has(self.offer) && has(self.sku))").message("set either image.id, or all of image.publisher, image.offer and image.sku"))]
pub struct AzureImage {
    /// Full resource ID of an image or gallery image version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('/subscriptions/')").message("spec.azure.image.id must be a full resource ID starting with /subscriptions/"))]
    #[schemars(length(max = 1024))]
    pub id: Option<String>,
    /// Marketplace publisher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub publisher: Option<String>,
    /// Marketplace offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub offer: Option<String>,
    /// Marketplace SKU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub sku: Option<String>,
    /// Marketplace image version (default `latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub version: Option<String>,
}

/// Names a MachineConfiguration and optionally pins one of its versions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationRef {
    /// Name of the MachineConfiguration.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 240").message("configurationRef.name must be 1 to 240 characters"))]
    pub name: String,
    /// Pin this version (1 or more). Without it the machine gets the newest version, which is
    /// then locked. Pinning an older version and deleting the Node rolls the machine back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("configurationRef.version must be 1 or more"))]
    pub version: Option<i64>,
}

/// Observed state of a Machine. Several components write it, each only its own fields with
/// server-side apply: the controller (phase, configuration, nodeRef, ConfigurationResolved,
/// NodeReady), the provider (power, addresses, InfrastructureReady) and the agent (agent,
/// BootstrapReady).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Lifecycle phase (Cluster API's): Pending, Provisioning, Provisioned, Running, Deleting,
    /// Failed. Derived from the conditions and the Node; a summary, not the source of truth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,

    /// Conditions: ConfigurationResolved, InfrastructureReady, BootstrapReady, NodeReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The configuration version the machine was (or is being) provisioned with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ResolvedConfiguration>,

    /// The Node this machine became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NodeRef>,

    /// The kubelet version the Node reports (`status.nodeInfo.kubeletVersion`); the
    /// KubeletVersion condition says whether it is the one the configuration version asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,

    /// Addresses reported by the provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub addresses: Vec<MachineAddress>,

    /// Power state reported by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,

    /// What the agent in the booted OS reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,

    /// A short, machine-readable reason for a terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,

    /// A human-readable description of a terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,

    /// The spec generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Cluster API's Machine phases.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum MachinePhase {
    /// No configuration resolved yet, or waiting to be provisioned.
    Pending,
    /// Infrastructure is being prepared (powered on, booting, container paving).
    Provisioning,
    /// Infrastructure is ready; waiting for the Node.
    Provisioned,
    /// The Node exists and is Ready.
    Running,
    /// Being deleted: draining, deleting the Node, releasing infrastructure.
    Deleting,
    /// A terminal error; see failureReason and failureMessage.
    Failed,
}

impl MachinePhase {
    /// All phases, in lifecycle order.
    pub const ALL: [MachinePhase; 6] = [
        Self::Pending,
        Self::Provisioning,
        Self::Provisioned,
        Self::Running,
        Self::Deleting,
        Self::Failed,
    ];

    /// The name as written in `status.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Provisioning => "Provisioning",
            Self::Provisioned => "Provisioned",
            Self::Running => "Running",
            Self::Deleting => "Deleting",
            Self::Failed => "Failed",
        }
    }
}

/// A resolved configuration version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedConfiguration {
    /// Name of the MachineConfiguration.
    pub name: String,
    /// Version number within it.
    pub version: i64,
}

impl ResolvedConfiguration {
    /// Name of the MachineConfigurationVersion object that holds this version.
    pub fn version_name(&self) -> String {
        crate::version_name(&self.name, self.version)
    }
}

/// A reference to a Node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRef {
    /// Name of the Node.
    pub name: String,
    /// UID of the Node, which tells a recreated Node from the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// An address of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// Power state of a machine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// The provider could not tell.
    Unknown,
}

/// What the agent in the booted OS reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Agent version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kernel boot ID of the running OS; changes on every boot.
    #[serde(default, rename = "bootID", skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// State of the node container, such as `running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_state: Option<String>,
    /// The configuration version the running container was paved with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paved: Option<ResolvedConfiguration>,
    /// A reboot the agent started for a MachineOperation: the operation is Complete once the
    /// machine is back with another boot ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<AgentReboot>,
    /// The local disk that holds the node's state, when the configuration has `storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<crate::storage::StorageStatus>,
    /// The wipe of the disks on release (the Machine is being deleted and its configuration
    /// wipes on release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_wipe: Option<crate::storage::ReleaseWipeStatus>,
}

/// A reboot in progress, as the agent recorded it before rebooting.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentReboot {
    /// The MachineOperation that asked for it.
    pub operation: String,
    /// The boot ID the machine rebooted from.
    #[serde(rename = "fromBootID")]
    pub from_boot_id: String,
}

impl Machine {
    /// The Node name this machine becomes: `spec.nodeName`, or the Machine's name.
    pub fn node_name(&self) -> String {
        self.spec
            .node_name
            .clone()
            .or_else(|| self.metadata.name.clone())
            .unwrap_or_default()
    }
}
