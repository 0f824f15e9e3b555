//! The controller's writes of a MachineOperation's status: one writer for the reconciler
//! and the handlers it runs here (`applyConfiguration`), with the observed
//! `resourceVersion` as a precondition.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::MachineOperation;
use unbounded_api::well_known::field_managers;

use crate::context::Context;
use crate::error::Error;

/// Writes the controller's part of the status, with the observed `resourceVersion` as a
/// precondition so that a handler's claim in between is never overwritten (the conflict
/// makes the reconcile run again on fresh data). Returns the operation as written.
pub(crate) async fn write_status(
    operation: &MachineOperation,
    status: serde_json::Value,
    ctx: &Context,
) -> Result<MachineOperation, Error> {
    let name = operation.name_any();
    // A null in an apply patch would be taken as a value; leave unset fields out.
    let status = match status {
        serde_json::Value::Object(fields) => {
            serde_json::Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        other => other,
    };
    let patch = json!({
        "apiVersion": MachineOperation::api_version(&()),
        "kind": MachineOperation::kind(&()),
        "metadata": {"name": name, "resourceVersion": operation.resource_version()},
        "status": status,
    });
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    match api
        .patch_status(
            &name,
            &PatchParams::apply(field_managers::CONTROLLER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(written) => Ok(written),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Waiting(format!(
            "MachineOperation {name} changed meanwhile"
        ))),
        Err(source) => Err(Error::Kube {
            action: format!("writing the status of MachineOperation {name}"),
            source,
        }),
    }
}
