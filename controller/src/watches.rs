//! One watch per kind: each event is trimmed (what the stores hold, see
//! [`crate::context::Context`]), written to its reflector store, then to its index, and the
//! difference between the object's old and new keys becomes triggers ([`crate::triggers`]).
//!
//! Triggers go through deduplicating work queues ([`crate::work_queue`]: one entry per
//! object however many changes concern it) into `Controller::reconcile_on` rather than
//! kube-runtime's shared streams, because shared streams do not pass deletions on, and a deleted Node
//! (repave) or a deleted Machine (version counts) must trigger a reconcile at once. Objects
//! that disappear while a watch relists count as deleted.
//!
//! Before the stores are first complete nothing is triggered: the runner then reconciles
//! everything once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::work_queue::WorkSender;
use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use unbounded_api::capi::UnboundedMachine;
use unbounded_api::well_known::annotations;
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

use crate::expectations::{Expectations, ObservedMachine};
use crate::index::operations::NodeIndex;
use crate::index::pools::PoolIndex;
use crate::index::{Change, KeyedIndex, Shared};
use crate::recount::PendingRecounts;
use crate::triggers::{Lookups, Reconciles};

/// What a watch saw, after the store has it.
#[derive(Debug)]
pub enum Seen<'a, K> {
    /// Created or changed (or listed again).
    Applied(&'a K),
    /// Deleted.
    Deleted(&'a K),
    /// A (re)list finished; these names exist, every other one is gone.
    Listed(&'a BTreeSet<String>),
}

/// Watches one kind into its store, trimming each object with `trim`, and hands every event
/// to `on_seen`.
pub fn drive<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    trim: fn(&mut K),
    mut on_seen: impl FnMut(Seen<'_, K>) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(trim)
        .reflect(writer);
    let mut listed = BTreeSet::new();
    tokio::spawn(stream.for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(o)) => on_seen(Seen::Applied(&o)),
            Ok(watcher::Event::Delete(o)) => on_seen(Seen::Deleted(&o)),
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(o)) => {
                listed.insert(o.name_any());
                on_seen(Seen::Applied(&o));
            }
            Ok(watcher::Event::InitDone) => {
                on_seen(Seen::Listed(&listed));
                listed.clear();
            }
            Err(error) => tracing::warn!(%error, kind = %K::kind(&()), "watch error; retrying"),
        }
        future::ready(())
    }))
}

/// Drops what no decision reads and only costs memory: managed fields and the last
/// applied configuration.
pub fn trim_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Trims a Machine.
pub fn trim_machine(m: &mut Machine) {
    trim_metadata(&mut m.metadata);
}

/// Trims a MachineConfiguration.
pub fn trim_configuration(c: &mut MachineConfiguration) {
    trim_metadata(&mut c.metadata);
}

/// Trims a MachineConfigurationVersion.
pub fn trim_version(v: &mut MachineConfigurationVersion) {
    trim_metadata(&mut v.metadata);
}

/// Trims a MachinePool.
pub fn trim_pool(p: &mut MachinePool) {
    trim_metadata(&mut p.metadata);
}

/// Trims a MachineOperation.
pub fn trim_operation(o: &mut MachineOperation) {
    trim_metadata(&mut o.metadata);
}

/// Keeps of a Node only what the controller decides on: its name, UID, Unbounded's own
/// annotations, its provider ID, its Ready condition and its kubelet version (a Node's images, addresses, and
/// capacity run to kilobytes).
pub fn trim_node(node: &mut Node) {
    trim_metadata(&mut node.metadata);
    node.metadata.labels = None;
    if let Some(annotations) = &mut node.metadata.annotations {
        annotations.retain(|k, _| k.starts_with("unbounded-cloud.io/"));
    }
    node.spec = node.spec.take().map(|spec| NodeSpec {
        provider_id: spec.provider_id,
        unschedulable: spec.unschedulable,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|status| NodeStatus {
        conditions: status.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| NodeCondition {
                    last_heartbeat_time: None,
                    ..c
                })
                .collect()
        }),
        // The kubelet version, which the Machine reports.
        node_info: status.node_info.map(|i| NodeSystemInfo {
            kubelet_version: i.kubelet_version,
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    });
}

/// Where triggers go, and whether to send them yet.
#[derive(Clone, Debug)]
pub struct Triggers {
    /// Machines to reconcile.
    pub machines: WorkSender<ObjectRef<Machine>>,
    /// Configurations to reconcile now.
    pub configurations: WorkSender<ObjectRef<MachineConfiguration>>,
    /// Operations to reconcile.
    pub operations: WorkSender<ObjectRef<MachineOperation>>,
    /// Machines whose agent access to reconcile ([`crate::agent_access`]).
    pub access: WorkSender<ObjectRef<Machine>>,
    /// MachinePools to reconcile.
    pub pools: WorkSender<ObjectRef<MachinePool>>,
    /// Cluster API UnboundedMachines whose Machine changed (with `--cluster-api`).
    pub capi_machines: Option<WorkSender<ObjectRef<UnboundedMachine>>>,
    /// Configurations to recount, sent on in batches ([`crate::recount`]).
    pub recount: Shared<PendingRecounts>,
    /// Set once every store is complete.
    pub live: Arc<AtomicBool>,
    /// Set once the first pass sent every Machine ([`crate::runner`]): until then a
    /// trigger for a Machine would only reconcile it early, before its configuration's
    /// first version exists.
    pub machines_live: Arc<AtomicBool>,
}

fn send<K: kube::Resource<DynamicType = ()>>(
    tx: &WorkSender<ObjectRef<K>>,
    names: impl IntoIterator<Item = impl AsRef<str>>,
) {
    for name in names {
        tx.send(ObjectRef::new(name.as_ref()));
    }
}

/// The index step every handler takes, once for all kinds: an applied object's keys
/// replace its old ones, a deleted one's are removed, and a finished (re)list removes every
/// name it did not list. Returns each object's keys before and after.
pub fn index_change<K, I>(index: &mut I, seen: &Seen<'_, K>) -> Vec<Change<I::Keys>>
where
    K: ResourceExt,
    I: KeyedIndex<K>,
{
    match seen {
        Seen::Applied(object) => {
            let name = object.name_any();
            let new = I::keys_of(object);
            let old = index.apply_keys(&name, new.clone());
            vec![Change {
                name,
                old,
                new: Some(new),
            }]
        }
        Seen::Deleted(object) => {
            let name = object.name_any();
            let old = index.remove_keys(&name);
            vec![Change {
                name,
                old,
                new: None,
            }]
        }
        Seen::Listed(present) => index
            .retain_keys(present)
            .into_iter()
            .map(|(name, old)| Change {
                name,
                old: Some(old),
                new: None,
            })
            .collect(),
    }
}

impl Triggers {
    fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Sends what a change reaches. Machines wait for the first pass ([`Self::machines_live`]).
    fn send(&self, reconciles: Reconciles) {
        if self.machines_live.load(Ordering::Acquire) {
            send(&self.machines, &reconciles.machines);
        }
        send(&self.access, &reconciles.access);
        if !reconciles.recount.is_empty() {
            self.recount
                .write()
                .mark_all(reconciles.recount, Instant::now());
        }
        send(&self.operations, &reconciles.operations);
        send(&self.pools, &reconciles.pools);
        send(&self.configurations, &reconciles.configurations);
    }

    /// A handler for kind `K`: `observe` first (the expectations a change meets), then the
    /// index step, then, once the stores are complete, what `decide` says each change
    /// reaches.
    fn handler<K, I>(
        &self,
        index: Shared<I>,
        mut observe: impl FnMut(&Seen<'_, K>) + Send + 'static,
        decide: impl Fn(&Change<I::Keys>) -> Reconciles + Send + 'static,
    ) -> impl FnMut(Seen<'_, K>) + Send + 'static
    where
        K: ResourceExt,
        I: KeyedIndex<K> + Send + Sync + 'static,
    {
        let this = self.clone();
        move |seen| {
            observe(&seen);
            let changes = index_change(&mut *index.write(), &seen);
            if !this.live() {
                return;
            }
            for change in &changes {
                this.send(decide(change));
            }
        }
    }

    /// The Machine handler: the owners' expected changes met, then
    /// [`Lookups::after_machine`].
    pub fn on_machine(
        &self,
        lookups: Lookups,
        expectations: Shared<Expectations>,
    ) -> impl FnMut(Seen<'_, Machine>) + Send + 'static {
        let capi = self.capi_machines.clone();
        self.handler(
            lookups.machines.clone(),
            move |seen| {
                observe_members(&expectations, seen);
                if let Some(tx) = &capi {
                    wake_capi_machine(tx, seen);
                }
            },
            move |change| lookups.after_machine(change),
        )
    }

    /// The MachinePool handler: [`Lookups::after_pool`].
    pub fn on_pool(
        &self,
        index: Shared<PoolIndex>,
    ) -> impl FnMut(Seen<'_, MachinePool>) + Send + 'static {
        self.handler(index, |_| {}, Lookups::after_pool)
    }

    /// The MachineConfiguration handler: a deleted one's status writes forgotten, then
    /// [`Lookups::after_configuration`].
    pub fn on_configuration(
        &self,
        lookups: Lookups,
        expectations: Shared<Expectations>,
    ) -> impl FnMut(Seen<'_, MachineConfiguration>) + Send + 'static {
        let observe = move |seen: &Seen<'_, MachineConfiguration>| {
            if let Seen::Deleted(c) = seen {
                expectations
                    .write()
                    .configuration_statuses
                    .forget(&c.name_any());
            }
        };
        self.handler(lookups.catalog.clone(), observe, move |change| {
            lookups.after_configuration(change)
        })
    }

    /// The MachineConfigurationVersion handler: the versions expected to be created or
    /// locked met, then [`Lookups::after_version`].
    pub fn on_version(
        &self,
        lookups: Lookups,
        expectations: Shared<Expectations>,
    ) -> impl FnMut(Seen<'_, MachineConfigurationVersion>) + Send + 'static {
        let observe = move |seen: &Seen<'_, MachineConfigurationVersion>| {
            if let Seen::Applied(v) = seen {
                let mut expectations = expectations.write();
                expectations.expire(Instant::now());
                expectations
                    .created_versions
                    .observed(&(v.spec.configuration_name.clone(), v.spec.version));
                if v.status.as_ref().is_some_and(|s| s.deployed) {
                    expectations.locked_versions.observed(&v.name_any());
                }
            }
        };
        self.handler(lookups.catalog.clone(), observe, move |change| {
            lookups.after_version(change)
        })
    }

    /// The Node handler: a deleted Node expected met, then [`Lookups::after_node`].
    pub fn on_node(
        &self,
        nodes: Shared<NodeIndex>,
        lookups: Lookups,
        expectations: Shared<Expectations>,
    ) -> impl FnMut(Seen<'_, Node>) + Send + 'static {
        let observe = move |seen: &Seen<'_, Node>| {
            if let Seen::Deleted(n) = seen
                && let Some(uid) = &n.metadata.uid
            {
                expectations.write().deleted_nodes.observed(uid);
            }
        };
        self.handler(nodes, observe, move |change| lookups.after_node(change))
    }

    /// The MachineOperation handler: [`Lookups::after_operation`].
    pub fn on_operation(
        &self,
        lookups: Lookups,
    ) -> impl FnMut(Seen<'_, MachineOperation>) + Send + 'static {
        self.handler(
            lookups.operation_index.clone(),
            |_| {},
            move |change| lookups.after_operation(change),
        )
    }
}

/// Sends the UnboundedMachine a changed Machine stands for (its
/// `unbounded-cloud.io/capi-machine` annotation, `<namespace>/<name>`).
fn wake_capi_machine(tx: &WorkSender<ObjectRef<UnboundedMachine>>, seen: &Seen<'_, Machine>) {
    let machine = match seen {
        Seen::Applied(m) | Seen::Deleted(m) => m,
        Seen::Listed(_) => return,
    };
    if let Some((namespace, name)) = machine
        .annotations()
        .get(annotations::CAPI_MACHINE)
        .and_then(|v| v.split_once('/'))
    {
        tx.send(ObjectRef::new(name).within(namespace));
    }
}

/// Marks the owners' expected changes of a Machine as seen; a deleted one's status writes
/// are forgotten.
fn observe_members(expectations: &Shared<Expectations>, seen: &Seen<'_, Machine>) {
    let mut expectations = expectations.write();
    match seen {
        Seen::Applied(m) => {
            let a = m.annotations();
            expectations.members.observe(
                &m.name_any(),
                Some(ObservedMachine {
                    pool: m
                        .labels()
                        .get(unbounded_api::well_known::labels::POOL)
                        .map(String::as_str),
                    capi: m
                        .labels()
                        .get(unbounded_api::well_known::labels::CAPI_MACHINE)
                        .map(String::as_str),
                    deleting: m.metadata.deletion_timestamp.is_some(),
                    repave: a.get(annotations::REPAVE).map(String::as_str),
                    repaving: a.get(annotations::REPAVING).map(String::as_str),
                }),
            );
        }
        Seen::Deleted(m) => {
            expectations.members.observe(&m.name_any(), None);
            expectations.machine_statuses.forget(&m.name_any());
        }
        Seen::Listed(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::catalog::Catalog;
    use crate::index::machines::{MachineIndex, MachineKeys};
    use crate::index::operations::OperationIndex;
    use crate::work_queue::{WorkReceiver, work_queue};
    use futures::FutureExt;
    use serde_json::json;

    fn triggers() -> (Triggers, WorkReceiver<ObjectRef<Machine>>) {
        let (machines, machine_rx) = work_queue();
        let triggers = Triggers {
            machines,
            configurations: work_queue().0,
            operations: work_queue().0,
            access: work_queue().0,
            pools: work_queue().0,
            capi_machines: None,
            recount: Shared::new(PendingRecounts::default()),
            live: Arc::new(AtomicBool::new(true)),
            machines_live: Arc::new(AtomicBool::new(true)),
        };
        (triggers, machine_rx)
    }

    /// A configuration whose selector changes twice triggers each Machine it selects once
    /// while the first trigger still waits: the queue holds one entry per Machine, not one
    /// per change (an unbounded channel held both).
    #[test]
    fn a_fan_out_queues_each_machine_once() {
        let (triggers, mut rx) = triggers();
        let index = Shared::new(MachineIndex::default());
        for i in 0..500 {
            let machine: Machine = serde_json::from_value(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": format!("m{i}"), "labels": {"rack": "r1"}},
                "spec": {"provider": "manual"},
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            index
                .write()
                .apply(&format!("m{i}"), MachineKeys::of(&machine));
        }
        let mut on_configuration = triggers.on_configuration(
            Lookups {
                machines: index,
                pools: Shared::new(PoolIndex::default()),
                catalog: Shared::new(Catalog::default()),
                operation_index: Shared::new(OperationIndex::default()),
                operations: kube::runtime::reflector::store().0,
            },
            Shared::new(Expectations::default()),
        );
        let mut change = |priority: i32| {
            let configuration: MachineConfiguration = serde_json::from_value(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfiguration",
                "metadata": {"name": "mc"},
                "spec": {"machineSelector": {"matchLabels": {"rack": "r1"}}, "priority": priority,
                         "template": {}},
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            on_configuration(Seen::Applied(&configuration));
        };
        change(1);
        change(2);
        change(3);
        assert_eq!(
            triggers.machines.len(),
            500,
            "three changes, one entry each"
        );
        let taken: BTreeSet<String> = std::iter::from_fn(|| rx.next().now_or_never().flatten())
            .take(500)
            .map(|r| r.name)
            .collect();
        assert_eq!(taken.len(), 500);
        change(4);
        assert_eq!(triggers.machines.len(), 500, "taken, then queued again");
    }
}
