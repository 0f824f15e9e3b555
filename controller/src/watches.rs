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
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use unbounded_api::well_known::annotations;
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
    MachineProvider,
};

use crate::expectations::{Expectations, ObservedMachine};
use crate::index::Shared;
use crate::index::catalog::{Catalog, ConfigurationKeys, VersionKeys};
use crate::index::machines::{MachineIndex, MachineKeys};
use crate::index::operations::{NodeIndex, OperationIndex, OperationKeys};
use crate::index::pools::{PoolIndex, PoolKeys};
use crate::recount::PendingRecounts;
use crate::triggers;

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
/// annotations, its provider ID and its Ready condition (a Node's images, addresses, and
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

impl Triggers {
    fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    fn send_machines(&self, names: impl IntoIterator<Item = impl AsRef<str>>) {
        if self.machines_live.load(Ordering::Acquire) {
            send(&self.machines, names);
        }
    }

    /// The Machine handler: expectations met and index, then the Machine itself, the
    /// configurations whose counts changed, the unfinished operations on it, its pool (and
    /// the short PXE pools a free Machine could serve), and the rolling configurations it
    /// records or names.
    pub fn on_machine(
        &self,
        index: Shared<MachineIndex>,
        operations: Store<MachineOperation>,
        operation_index: Shared<OperationIndex>,
        groups: Groups,
    ) -> impl FnMut(Seen<'_, Machine>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            observe_members(&groups.expectations, &seen);
            let changes: Vec<(String, Option<MachineKeys>, Option<MachineKeys>)> = {
                let mut index = index.write();
                match seen {
                    Seen::Applied(m) => {
                        let keys = MachineKeys::of(m);
                        let old = index.apply(&m.name_any(), keys.clone());
                        vec![(m.name_any(), old, Some(keys))]
                    }
                    Seen::Deleted(m) => {
                        let old = index.remove(&m.name_any());
                        vec![(m.name_any(), old, None)]
                    }
                    Seen::Listed(present) => index
                        .retain(present)
                        .into_iter()
                        .map(|(name, old)| (name, Some(old), None))
                        .collect(),
                }
            };
            if !this.live() {
                return;
            }
            for (name, old, new) in changes {
                this.send_machines([&name]);
                if new.is_some() {
                    send(&this.access, [&name]);
                }
                let recount = triggers::recounted_configurations(old.as_ref(), new.as_ref());
                if !recount.is_empty() {
                    this.recount.write().mark_all(recount, Instant::now());
                }
                send(
                    &this.operations,
                    unfinished_operations_on(&operations, &operation_index, &name),
                );
                this.send_groups(&groups, old.as_ref(), new.as_ref());
            }
        }
    }

    /// The pools and rolling configurations a Machine's change concerns.
    fn send_groups(&self, groups: &Groups, old: Option<&MachineKeys>, new: Option<&MachineKeys>) {
        let mut pools: BTreeSet<String> = [old, new]
            .into_iter()
            .flatten()
            .filter_map(|k| k.pool().map(str::to_owned))
            .collect();
        if let Some(keys) = new
            && keys.pool().is_none()
            && keys.provider == MachineProvider::Pxe
            && !keys.deleting
        {
            pools.extend(groups.pools.read().short_pools_matching(&keys.labels));
        }
        send(&self.pools, &pools);
        if old == new {
            return;
        }
        let catalog = groups.catalog.read();
        let rolling: BTreeSet<&str> = [old, new]
            .into_iter()
            .flatten()
            .filter(|k| k.pool().is_none())
            .flat_map(MachineKeys::configurations)
            .filter(|c| catalog.configuration(c).is_some_and(|k| k.rolling))
            .collect();
        send(&self.configurations, rolling);
    }

    /// The MachinePool handler: index, then the pool.
    pub fn on_pool(
        &self,
        index: Shared<PoolIndex>,
    ) -> impl FnMut(Seen<'_, MachinePool>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            let touched: Vec<String> = {
                let mut index = index.write();
                match seen {
                    Seen::Applied(p) => {
                        index.apply(&p.name_any(), PoolKeys::of(p));
                        vec![p.name_any()]
                    }
                    Seen::Deleted(p) => {
                        index.remove(&p.name_any());
                        vec![]
                    }
                    Seen::Listed(present) => {
                        index.retain(present);
                        vec![]
                    }
                }
            };
            if this.live() {
                send(&this.pools, touched);
            }
        }
    }

    /// The MachineConfiguration handler: index, then the configuration, and when its
    /// selection inputs changed, the Machines it selected, selects, or that name it.
    pub fn on_configuration(
        &self,
        catalog: Shared<Catalog>,
        machines: Shared<MachineIndex>,
        pools: Shared<PoolIndex>,
    ) -> impl FnMut(Seen<'_, MachineConfiguration>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            type Change = (String, Option<ConfigurationKeys>, Option<ConfigurationKeys>);
            let changes: Vec<Change> = {
                let mut catalog = catalog.write();
                match seen {
                    Seen::Applied(c) => {
                        let keys = ConfigurationKeys::of(c);
                        let old = catalog.apply_configuration(&c.name_any(), keys.clone());
                        vec![(c.name_any(), old, Some(keys))]
                    }
                    Seen::Deleted(c) => {
                        let old = catalog.remove_configuration(&c.name_any());
                        vec![(c.name_any(), old, None)]
                    }
                    Seen::Listed(present) => catalog
                        .retain_configurations(present)
                        .into_iter()
                        .map(|(name, old)| (name, Some(old), None))
                        .collect(),
                }
            };
            if !this.live() {
                return;
            }
            for (name, old, new) in changes {
                send(&this.configurations, [&name]);
                if triggers::configuration_changes_selection(old.as_ref(), new.as_ref()) {
                    send(&this.pools, pools.read().pools_for_configuration(&name));
                    let selectors = [old, new]
                        .into_iter()
                        .flatten()
                        .filter_map(|k| k.selector)
                        .collect::<Vec<_>>();
                    this.send_machines(affected_machines(&machines, &name, &selectors));
                }
            }
        }
    }

    /// The MachineConfigurationVersion handler: expectations met and index, then its
    /// configuration (at once when selection changes, else in the next recount batch) and,
    /// when selection changes, the Machines the configuration selects or that name it.
    pub fn on_version(
        &self,
        catalog: Shared<Catalog>,
        machines: Shared<MachineIndex>,
        expectations: Shared<Expectations>,
        pools: Shared<PoolIndex>,
    ) -> impl FnMut(Seen<'_, MachineConfigurationVersion>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            if let Seen::Applied(v) = &seen {
                let mut expectations = expectations.write();
                expectations.expire(Instant::now());
                expectations
                    .created_versions
                    .observed(&(v.spec.configuration_name.clone(), v.spec.version));
                if v.status.as_ref().is_some_and(|s| s.deployed) {
                    expectations.locked_versions.observed(&v.name_any());
                }
            }
            let changes: Vec<(Option<VersionKeys>, Option<VersionKeys>)> = {
                let mut catalog = catalog.write();
                match seen {
                    Seen::Applied(v) => {
                        let keys = VersionKeys::of(v);
                        let old = catalog.apply_version(&v.name_any(), keys.clone());
                        vec![(old, Some(keys))]
                    }
                    Seen::Deleted(v) => vec![(catalog.remove_version(&v.name_any()), None)],
                    Seen::Listed(present) => catalog
                        .retain_versions(present)
                        .into_iter()
                        .map(|(_, old)| (Some(old), None))
                        .collect(),
                }
            };
            if !this.live() {
                return;
            }
            for (old, new) in changes {
                let Some(configuration) = new
                    .as_ref()
                    .or(old.as_ref())
                    .map(|k| k.configuration.clone())
                else {
                    continue;
                };
                if triggers::version_changes_selection(old.as_ref(), new.as_ref()) {
                    send(&this.configurations, [&configuration]);
                    send(
                        &this.pools,
                        pools.read().pools_for_configuration(&configuration),
                    );
                    let selector = catalog
                        .read()
                        .configuration(&configuration)
                        .and_then(|c| c.selector.clone());
                    this.send_machines(affected_machines(
                        &machines,
                        &configuration,
                        selector.as_slice(),
                    ));
                } else {
                    this.recount.write().mark(configuration, Instant::now());
                }
            }
        }
    }

    /// The Node handler: index, then the Machines whose Node it is.
    pub fn on_node(
        &self,
        nodes: Shared<NodeIndex>,
        machines: Shared<MachineIndex>,
        groups: Groups,
    ) -> impl FnMut(Seen<'_, Node>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            if let Seen::Deleted(n) = &seen
                && let Some(uid) = &n.metadata.uid
            {
                groups.expectations.write().deleted_nodes.observed(uid);
            }
            let touched: Vec<(String, Option<String>)> = {
                let mut nodes = nodes.write();
                match seen {
                    Seen::Applied(n) => {
                        let id = NodeIndex::provider_id(n);
                        nodes.apply(&n.name_any(), id.clone());
                        vec![(n.name_any(), id)]
                    }
                    Seen::Deleted(n) => {
                        nodes.remove(&n.name_any());
                        vec![(n.name_any(), NodeIndex::provider_id(n))]
                    }
                    Seen::Listed(present) => nodes.retain(present),
                }
            };
            if !this.live() {
                return;
            }
            let machines = machines.read();
            for (node, provider_id) in touched {
                let of_node = machines.of_node(&node, provider_id.as_deref());
                for name in &of_node {
                    let keys = machines.get(name);
                    this.send_groups(&groups, keys, None);
                }
                this.send_machines(of_node);
            }
        }
    }

    /// The MachineOperation handler: index, then the operation, its parent, and the
    /// unfinished operations on its Machine (the next may run once this one finishes).
    pub fn on_operation(
        &self,
        index: Shared<OperationIndex>,
        operations: Store<MachineOperation>,
    ) -> impl FnMut(Seen<'_, MachineOperation>) + Send + 'static {
        let this = self.clone();
        move |seen| {
            let touched: Vec<(String, Option<OperationKeys>)> = {
                let mut index = index.write();
                match seen {
                    Seen::Applied(o) => {
                        let keys = OperationKeys::of(o);
                        index.apply(&o.name_any(), keys.clone());
                        vec![(o.name_any(), Some(keys))]
                    }
                    Seen::Deleted(o) => vec![(o.name_any(), index.remove(&o.name_any()))],
                    Seen::Listed(present) => index
                        .retain(present)
                        .into_iter()
                        .map(|(name, keys)| (name, Some(keys)))
                        .collect(),
                }
            };
            if !this.live() {
                return;
            }
            for (name, keys) in touched {
                send(&this.operations, [&name]);
                let Some(keys) = keys else { continue };
                send(&this.operations, keys.parents.iter().map(|(name, _)| name));
                if let Some(machine) = &keys.machine {
                    // Its agent's role lists the operations routed to it.
                    send(&this.access, [machine]);
                    send(
                        &this.operations,
                        unfinished_operations_on(&operations, &index, machine),
                    );
                }
            }
        }
    }
}

/// What the Machine and Node handlers need to trigger pools and rolling configurations.
#[derive(Clone, Debug)]
pub struct Groups {
    /// Pools by configuration, and the short PXE pools.
    pub pools: Shared<PoolIndex>,
    /// Configurations (which ones roll).
    pub catalog: Shared<Catalog>,
    /// Owners' writes to Machines not seen yet.
    pub expectations: Shared<Expectations>,
}

/// Marks the owners' expected changes of a Machine as seen.
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
                    deleting: m.metadata.deletion_timestamp.is_some(),
                    repave: a.get(annotations::REPAVE).map(String::as_str),
                    repaving: a.get(annotations::REPAVING).map(String::as_str),
                }),
            );
        }
        Seen::Deleted(m) => expectations.members.observe(&m.name_any(), None),
        Seen::Listed(_) => {}
    }
}

/// Machines whose resolution may change with `configuration`: those its selectors (before
/// and after a change) match, and those that record or name it.
fn affected_machines(
    machines: &Shared<MachineIndex>,
    configuration: &str,
    selectors: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector],
) -> BTreeSet<String> {
    let machines = machines.read();
    let mut affected: BTreeSet<String> = machines
        .of_configuration(configuration)
        .map(str::to_owned)
        .collect();
    for selector in selectors {
        affected.extend(
            machines
                .matching(Some(selector))
                .into_iter()
                .map(str::to_owned),
        );
    }
    affected
}

/// The unfinished single-machine operations on a Machine.
pub fn unfinished_operations_on(
    operations: &Store<MachineOperation>,
    index: &Shared<OperationIndex>,
    machine: &str,
) -> Vec<String> {
    let names = index.read().on_machine(machine);
    names
        .into_iter()
        .filter(|name| {
            operations.get(&ObjectRef::new(name)).is_some_and(|o| {
                !o.status
                    .as_ref()
                    .and_then(|s| s.state)
                    .is_some_and(|s| s.is_finished())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
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
            Shared::new(Catalog::default()),
            index,
            Shared::new(PoolIndex::default()),
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
