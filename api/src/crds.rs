//! The CustomResourceDefinitions of every Unbounded resource, as YAML files.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

/// Errors while rendering CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD could not be rendered as YAML.
    #[error("rendering CRD {name} as YAML: {source}")]
    Render {
        /// The CRD's name.
        name: String,
        /// Why.
        source: serde_saphyr::ser::Error,
    },
}

/// Every CRD, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        Machine::crd(),
        MachineConfiguration::crd(),
        MachineConfigurationVersion::crd(),
        MachineOperation::crd(),
        MachinePool::crd(),
        crate::inventory::MachineInventory::crd(),
    ]
}

/// Every CRD as `(file name, YAML)`, the file name being `<crd name>.yaml`.
pub fn render_all() -> Result<Vec<(String, String)>, CrdError> {
    render(all())
}

/// The Cluster API kinds' CRDs ([`crate::capi::crds`]) as `(file name, YAML)`: they go to
/// `deploy/cluster-api/crds/`, installed with the Cluster API provider, not with Unbounded.
pub fn render_cluster_api() -> Result<Vec<(String, String)>, CrdError> {
    render(crate::capi::crds())
}

fn render(crds: Vec<CustomResourceDefinition>) -> Result<Vec<(String, String)>, CrdError> {
    crds.into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd).map_err(|source| CrdError::Render {
                name: name.clone(),
                source,
            })?;
            Ok((format!("{name}.yaml"), format!("---\n{yaml}")))
        })
        .collect()
}
