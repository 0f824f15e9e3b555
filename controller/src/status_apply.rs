//! The controller's one writer of status: server-side apply of the fields it owns, under
//! its field manager (`unbounded-controller`, forced), on the status subresource, over the
//! copy of the object the status was decided from. Machines, MachineConfigurations,
//! MachineOperations and MachinePools are written through it; for Machines and
//! MachineConfigurations `apply_over_copy` also keeps the record of copies a write
//! replaced ([`crate::status_writes`]).
//!
//! A typed status is what the controller owns of the object's status, every field of it:
//! with server-side apply a field the manager leaves out is given up (and removed when no
//! one else owns it), so a status type here lists exactly the fields the controller writes.

use std::fmt::Debug;
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use unbounded_api::well_known::field_managers;
use unbounded_api::{Machine, MachineConfiguration};

use crate::error::Error;
use crate::expectations::Expectations;
use crate::index::Shared;
use crate::status_writes::SupersededCopies;

/// The apply body: the object's identity, the copy it is written over, the status.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Body<'a, S> {
    api_version: &'a str,
    kind: &'a str,
    metadata: Metadata<'a>,
    status: &'a S,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    name: &'a str,
    /// A precondition: the write fails (409) when the object changed since this copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

/// Applies `status` to the cluster-scoped `K` named `name`, over its copy at
/// `resource_version` when given. Returns the object as written. A copy that changed
/// meanwhile is a wait, not a failure: the watch brings the newer copy to decide again.
pub(crate) async fn apply<K, S>(
    client: &Client,
    name: &str,
    resource_version: Option<&str>,
    status: &S,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize + Debug,
{
    let kind = K::kind(&());
    let body = Body {
        api_version: &K::api_version(&()),
        kind: &kind,
        metadata: Metadata {
            name,
            resource_version,
        },
        status,
    };
    let api: Api<K> = Api::all(client.clone());
    match api
        .patch_status(
            name,
            &PatchParams::apply(field_managers::CONTROLLER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(written) => Ok(written),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(Error::Waiting(format!("{kind} {name} changed meanwhile")))
        }
        Err(source) => Err(Error::Kube {
            action: format!("writing the status of {kind} {name}"),
            source,
        }),
    }
}

/// A kind whose status writes keep a record of the copies they replaced
/// ([`crate::status_writes`]).
pub(crate) trait RecordsCopies:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug
{
    /// The record of this kind.
    fn copies(expectations: &Expectations) -> &SupersededCopies;
    /// The same, to write.
    fn copies_mut(expectations: &mut Expectations) -> &mut SupersededCopies;
}

impl RecordsCopies for Machine {
    fn copies(expectations: &Expectations) -> &SupersededCopies {
        &expectations.machine_statuses
    }
    fn copies_mut(expectations: &mut Expectations) -> &mut SupersededCopies {
        &mut expectations.machine_statuses
    }
}

impl RecordsCopies for MachineConfiguration {
    fn copies(expectations: &Expectations) -> &SupersededCopies {
        &expectations.configuration_statuses
    }
    fn copies_mut(expectations: &mut Expectations) -> &mut SupersededCopies {
        &mut expectations.configuration_statuses
    }
}

/// A status decided from one copy of an object, to write over that copy.
#[derive(Debug)]
pub(crate) struct OverCopy<'a, K, S> {
    /// The copy the status was decided from (the cache's).
    pub read: &'a K,
    /// The `resourceVersion` of a copy this reconcile wrote itself since (a configuration's
    /// `latestVersion`): the status is written over that one instead.
    pub rewritten: Option<&'a str>,
    /// The fields the controller owns.
    pub status: &'a S,
}

/// [`apply`]s `write.status` over its copy, unless an earlier write already replaced the
/// copy it was decided from: that is a wait, as the API server's 409 would have been,
/// without the request. Once written, records the copies it replaced (the one read and
/// the one written over) for the reconciles that may still read them from the cache.
pub(crate) async fn apply_over_copy<K, S>(
    write: OverCopy<'_, K, S>,
    client: &Client,
    expectations: &Shared<Expectations>,
) -> Result<(), Error>
where
    K: RecordsCopies,
    S: Serialize + Debug,
{
    let name = write.read.name_any();
    let read_at = write.read.resource_version();
    let read_at = read_at.as_deref().unwrap_or_default();
    if K::copies(&expectations.read()).is_superseded(&name, read_at, Instant::now()) {
        return Err(Error::Waiting(format!(
            "{} {name}: status already written over this copy",
            K::kind(&())
        )));
    }
    let over = write.rewritten.unwrap_or(read_at);
    let mut written_over = vec![read_at];
    written_over.extend(Some(over).filter(|v| *v != read_at));
    tracing::debug!(kind = %K::kind(&()), %name, ?written_over, "writing status");
    apply::<K, S>(client, &name, Some(over), write.status).await?;
    K::copies_mut(&mut expectations.write()).wrote_over(&name, &written_over, Instant::now());
    Ok(())
}
