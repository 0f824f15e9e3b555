//! What every reconciliation shares: the client, the reflector stores and their indexes,
//! the event recorder, the metrics and the settings.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

use crate::events::{EventPublisher, EventSettings};
use crate::expectations::Expectations;
use crate::index::Shared;
use crate::index::catalog::Catalog;
use crate::index::machines::MachineIndex;
use crate::index::operations::{NodeIndex, OperationIndex};
use crate::index::pools::PoolIndex;
use crate::metrics::Metrics;
use crate::recount::RecountTiming;

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long draining a Node may take before it is deleted anyway.
    pub drain_timeout: Duration,
    /// How often everything is reconciled again without a change.
    pub resync: Duration,
    /// Machines reconciled at once.
    pub machine_concurrency: u16,
    /// MachineConfigurations reconciled at once.
    pub configuration_concurrency: u16,
    /// MachineOperations reconciled at once.
    pub operation_concurrency: u16,
    /// MachinePools reconciled at once.
    pub pool_concurrency: u16,
    /// When configurations whose Machines changed are recounted.
    pub recount: RecountTiming,
    /// How events are queued and published.
    pub events: EventSettings,
    /// Run the Cluster API provider's controllers ([`crate::capi`]).
    pub cluster_api: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            machine_concurrency: 32,
            configuration_concurrency: 8,
            operation_concurrency: 16,
            pool_concurrency: 4,
            recount: RecountTiming {
                quiet: Duration::from_secs(2),
                max_wait: Duration::from_secs(10),
            },
            events: EventSettings::default(),
            cluster_api: false,
        }
    }
}

/// Shared by every reconciliation.
///
/// The stores hold the objects as watched, trimmed of what no decision reads: every kind
/// without `managedFields` and without kubectl's last-applied annotation; Nodes reduced to
/// name, UID, Unbounded's own annotations, `spec.providerID`, `spec.unschedulable` and the
/// Ready condition (see [`crate::watches::trim_node`]). The indexes beside them are kept
/// by the same watches ([`crate::index`]).
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Machines.
    pub machines: Store<Machine>,
    /// MachineConfigurations.
    pub configurations: Store<MachineConfiguration>,
    /// MachineConfigurationVersions.
    pub versions: Store<MachineConfigurationVersion>,
    /// Nodes (trimmed).
    pub nodes: Store<Node>,
    /// MachineOperations.
    pub operations: Store<MachineOperation>,
    /// MachinePools.
    pub pools: Store<MachinePool>,
    /// Pools by configuration, and the short PXE pools.
    pub pool_index: Shared<PoolIndex>,
    /// Machines by label, configuration and Node; version and phase counts.
    pub machine_index: Shared<MachineIndex>,
    /// Configurations by selector, and their versions.
    pub catalog: Shared<Catalog>,
    /// Nodes by provider ID.
    pub node_index: Shared<NodeIndex>,
    /// Operations by Machine and parent.
    pub operation_index: Shared<OperationIndex>,
    /// Writes not yet shown by the watches.
    pub expectations: Shared<Expectations>,
    /// Publishes Kubernetes Events.
    pub recorder: EventPublisher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub settings: Settings,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The versions of a configuration that exist and are not being deleted.
    pub fn versions_of(&self, configuration: &str) -> Vec<Arc<MachineConfigurationVersion>> {
        let names = self.catalog.read().version_names_of(configuration);
        names
            .iter()
            .filter_map(|name| self.versions.get(&ObjectRef::new(name)))
            .filter(|v| v.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Publishes an Event about `object`, best effort ([`crate::events`]).
    pub async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.recorder
            .publish(object.object_ref(&()), type_, reason, note);
    }
}
