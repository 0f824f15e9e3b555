//! The controller's writes of a MachineOperation's status: one writer for the reconciler
//! and the handlers it runs here (`applyConfiguration`), with the observed
//! `resourceVersion` as a precondition.

use kube::ResourceExt;
use unbounded_api::MachineOperation;

use crate::context::Context;
use crate::error::Error;
use crate::status_apply;

/// Writes the controller's part of the status, with the observed `resourceVersion` as a
/// precondition so that a handler's claim in between is never overwritten (the conflict
/// makes the reconcile run again on fresh data). Returns the operation as written.
pub(crate) async fn write_status(
    operation: &MachineOperation,
    status: serde_json::Value,
    ctx: &Context,
) -> Result<MachineOperation, Error> {
    // A null in an apply patch would be taken as a value; leave unset fields out.
    let status = match status {
        serde_json::Value::Object(fields) => {
            serde_json::Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        other => other,
    };
    status_apply::apply(
        &ctx.client,
        &operation.name_any(),
        operation.resource_version().as_deref(),
        &status,
    )
    .await
}
