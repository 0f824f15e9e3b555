//! Unbounded's API: the custom resources of group `unbounded-cloud.io/v1alpha1`, the
//! well-known names every component agrees on, condition helpers, and the CRD generator.
//! Types and their validation only, no I/O: what runs against the API server (the provider
//! loop, operation handling, minting tokens) is in `unbounded-runtime`.
//!
//! | kind | short name | what it is |
//! |---|---|---|
//! | [`Machine`] | `ma` | one server or VM that becomes one Node |
//! | [`MachineConfiguration`] | `mc` | what a class of machines runs |
//! | [`MachineConfigurationVersion`] | `mcv` | one numbered, lockable snapshot of a configuration |
//! | [`MachineOperation`] | `mo` | a Job-like operation on one machine or many |
//! | [`MachinePool`] | `mp` | a scalable group of Machines, with rolling updates and remediation |
//! | [`inventory::MachineInventory`] | `mi` | the hardware facts of the Machine of the same name |
//!
//! [`capi`] holds the Cluster API kinds (groups `infrastructure.cluster.x-k8s.io` and
//! `bootstrap.cluster.x-k8s.io`): `UnboundedCluster`, `UnboundedMachine`, `UnboundedConfig`
//! and their templates.
//!
//! Validation lives in the CRD schema as CEL rules (see each field's `x_kube` attribute), so
//! `kubectl apply` rejects a bad object with a message that says what is wrong.

// kube's derive takes one `printcolumn(type_ = ..)` per column, which this lint misreads.
#![allow(clippy::duplicated_attributes)]

pub mod agent;
pub mod boot_images;
pub mod capi;
pub mod condition;
pub mod configuration;
pub mod crds;
pub mod identity;
pub mod in_place;
pub mod inventory;
pub mod mac;
pub mod machine;
pub mod operation;
pub mod pool;
pub mod reference;
pub mod storage;
pub mod well_known;

pub use configuration::{
    BindMount, BootSpec, FileSpec, ImageSpec, KubernetesSpec, MachineConfiguration,
    MachineConfigurationSpec, MachineConfigurationStatus, MachineConfigurationVersion,
    MachineConfigurationVersionSpec, MachineConfigurationVersionStatus, MachineTemplate,
    NspawnNetwork, NspawnSpec, RollingUpdate, RolloutStatus, UpdateStrategy, UpdateStrategyType,
    VersionSummary, version_name,
};
pub use machine::{
    AgentReboot, AgentStatus, Architecture, AzureImage, AzureSpec, BmcSpec, ConfigurationRef,
    Firmware, Machine, MachineAddress, MachinePhase, MachineProvider, MachineSpec, MachineStatus,
    NodeRef, PowerState, PxeSpec, ResolvedConfiguration, SecretReference,
};
pub use operation::{
    ChildCounts, HandlerKind, MachineOperation, MachineOperationSpec, MachineOperationStatus,
    MachineRef, OperationState,
};
pub use pool::{
    MachinePool, MachinePoolSpec, MachinePoolStatus, MachinePoolTemplate, PoolMachineSpec,
    PoolPxeSpec, PoolRollingUpdate, PoolStrategy, PoolStrategyType, Remediation, TemplateMetadata,
    UnhealthyCondition,
};
