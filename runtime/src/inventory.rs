//! Writing one source's read into a Machine's `MachineInventory`, the same way for every
//! writer (the bootserver's discovery and Redfish reads, the agent's in-band refresh): read
//! the current object, fold the read in with `MachineInventorySpec::fold` (the one rule by
//! which sources combine), and write the whole object back bound to the `resourceVersion`
//! that was read; on a conflict (another source wrote meanwhile) read and fold again.
//!
//! A replace and not server-side apply: with several field managers, an apply leaves the
//! fields another manager owns in place, so a section replaced by one source could keep a
//! field (a DIMM list, say) of the source it replaced and describe two machines at once.
//! The object is created, owned by its Machine, when absent.

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use unbounded_api::Machine;
use unbounded_api::inventory::{InventoryRead, MachineInventory, MachineInventorySpec};

/// How often a write is tried again after a conflict.
const ATTEMPTS: usize = 5;

/// Why a read could not be written.
#[derive(Debug, thiserror::Error)]
pub enum InventoryWriteError {
    /// The API server refused or failed the write.
    #[error("writing MachineInventory {name}: {source}")]
    Kube {
        /// The inventory's name (its Machine's).
        name: String,
        /// What the API server said.
        source: kube::Error,
    },
    /// Every attempt met a newer write.
    #[error("MachineInventory {0} kept changing during {ATTEMPTS} attempts")]
    Contended(String),
    /// The folded inventory breaks a limit (a read larger than the schema allows).
    #[error("the inventory of {name} is invalid: {source}")]
    Invalid {
        /// The inventory's name.
        name: String,
        /// The limit it breaks.
        source: unbounded_api::inventory::InventoryError,
    },
}

impl InventoryWriteError {
    /// A fixed label for metrics and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "api_error",
            Self::Contended(_) => "contended",
            Self::Invalid { .. } => "invalid",
        }
    }
}

/// Folds `read` (from `record.source`) into the MachineInventory of `machine`, creating it
/// (owned by the Machine) when absent. Returns the inventory as written.
pub async fn fold_into(
    client: &Client,
    machine: &Machine,
    read: MachineInventorySpec,
    record: InventoryRead,
    field_manager: &str,
) -> Result<MachineInventorySpec, InventoryWriteError> {
    let name = machine.name_any();
    let api = Api::<MachineInventory>::all(client.clone());
    let params = PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..PostParams::default()
    };
    let failed = |source| InventoryWriteError::Kube {
        name: name.clone(),
        source,
    };
    for _ in 0..ATTEMPTS {
        let current = api.get_opt(&name).await.map_err(failed)?;
        let exists = current.is_some();
        let mut object = current.unwrap_or_else(|| new_inventory(machine));
        object.spec.fold(read.clone(), record.clone());
        unbounded_api::inventory::validate(&object.spec).map_err(|source| {
            InventoryWriteError::Invalid {
                name: name.clone(),
                source,
            }
        })?;
        let written = if exists {
            api.replace(&name, &params, &object).await
        } else {
            match api.create(&params, &object).await {
                // A writer whose role names the object (an agent) may not POST, which the
                // API server authorizes without a name; an apply that creates is authorized
                // with the name. Should another writer create the object between the two
                // calls, this apply lands on it (a window of one round trip).
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    api.patch(
                        &name,
                        &kube::api::PatchParams::apply(field_manager),
                        &kube::api::Patch::Apply(&object),
                    )
                    .await
                }
                other => other,
            }
        };
        match written {
            Ok(written) => return Ok(written.spec),
            // 409: a newer version (replace) or one created meanwhile (create): fold again.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(failed(error)),
        }
    }
    Err(InventoryWriteError::Contended(name))
}

/// An empty inventory named like `machine` and owned by it (deleted with it).
fn new_inventory(machine: &Machine) -> MachineInventory {
    let mut object = MachineInventory::new(&machine.name_any(), MachineInventorySpec::default());
    object.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "unbounded-cloud.io/v1alpha1".into(),
            kind: "Machine".into(),
            name: machine.name_any(),
            uid: machine.uid().unwrap_or_default(),
            ..Default::default()
        },
    ]);
    object
}
