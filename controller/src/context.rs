//! What every reconciliation shares: the client, the reflector stores, the event recorder,
//! the metrics and the settings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use unbounded_api::{Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation};

use crate::metrics::Metrics;
use crate::selection::{Candidate, VersionInfo};

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long draining a Node may take before it is deleted anyway.
    pub drain_timeout: Duration,
    /// How often everything is reconciled again without a change.
    pub resync: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            drain_timeout: Duration::from_secs(300),
            resync: Duration::from_secs(300),
        }
    }
}

/// Shared by every reconciliation.
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
    /// Nodes.
    pub nodes: Store<Node>,
    /// MachineOperations.
    pub operations: Store<MachineOperation>,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
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
        self.versions
            .state()
            .into_iter()
            .filter(|v| {
                v.spec.configuration_name == configuration
                    && v.metadata.deletion_timestamp.is_none()
            })
            .collect()
    }

    /// Every configuration with its versions, as selection needs them. The stores hold
    /// `Arc`s; the candidates borrow from the returned owners.
    pub fn candidates(&self) -> Vec<(Arc<MachineConfiguration>, Vec<VersionInfo>)> {
        let mut by_configuration: BTreeMap<String, Vec<VersionInfo>> = BTreeMap::new();
        for version in self.versions.state() {
            if version.metadata.deletion_timestamp.is_some() {
                continue;
            }
            by_configuration
                .entry(version.spec.configuration_name.clone())
                .or_default()
                .push(VersionInfo {
                    version: version.spec.version,
                    deployed: version.status.as_ref().is_some_and(|s| s.deployed),
                });
        }
        self.configurations
            .state()
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| {
                let versions = by_configuration.remove(&c.name_any()).unwrap_or_default();
                (c, versions)
            })
            .collect()
    }

    /// Publishes an Event about `object`; failures are logged, never fatal.
    pub async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, reason, "publishing an event failed");
        }
    }
}

/// Borrows candidates from their owners.
pub fn borrow_candidates(
    owned: &[(Arc<MachineConfiguration>, Vec<VersionInfo>)],
) -> Vec<Candidate<'_>> {
    owned
        .iter()
        .map(|(configuration, versions)| Candidate {
            name: configuration.metadata.name.as_deref().unwrap_or_default(),
            priority: configuration.spec.priority,
            selector: configuration.spec.machine_selector.as_ref(),
            versions: versions.clone(),
        })
        .collect()
}
