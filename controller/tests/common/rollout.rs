//! For rollout tests: kubectl with stdin, a watch that counts a group's unready Machines at
//! every event, and a stand-in for the agent and kubelet that registers a Ready Node once
//! the controller has recorded a Machine's repave.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use unbounded_api::Machine;
use unbounded_api::well_known::annotations;
use unbounded_testbed::testkit::{create_node_unless_exists, set_node_ready};

use super::*;

/// Runs kubectl with `stdin`; panics with its stderr on failure.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    unbounded_testbed::testkit::kubectl_ok(control_plane(), args, stdin)
}

#[derive(Default, Debug)]
struct Seen {
    marked: BTreeMap<String, bool>,
    nodes: BTreeMap<String, (bool, bool)>,
    machines_listed: bool,
    nodes_listed: bool,
}

impl Seen {
    fn unready(&self, group: &BTreeSet<String>) -> BTreeSet<String> {
        group
            .iter()
            .filter(|m| {
                self.marked.get(*m).copied().unwrap_or(false)
                    || !matches!(self.nodes.get(*m), Some((true, false)))
            })
            .cloned()
            .collect()
    }
}

/// The most Machines of a group seen unready at once: a repave requested or under way,
/// Node absent, not Ready or cordoned (a Machine's Node has its name).
#[derive(Clone)]
pub struct UnreadyWatch {
    most: Arc<Mutex<BTreeSet<String>>>,
    history: Arc<Mutex<Vec<usize>>>,
    listed: Arc<std::sync::atomic::AtomicBool>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl UnreadyWatch {
    /// Starts watching Machines and Nodes; counting starts once both are listed.
    pub fn start(client: &Client, group: &[String]) -> Self {
        let group: BTreeSet<String> = group.iter().cloned().collect();
        let most = Arc::new(Mutex::new(BTreeSet::new()));
        let history = Arc::new(Mutex::new(Vec::new()));
        let listed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        enum Ev {
            M(watcher::Result<watcher::Event<Machine>>),
            N(watcher::Result<watcher::Event<Node>>),
        }
        let machines = watcher(
            Api::<Machine>::all(client.clone()),
            watcher::Config::default(),
        )
        .map(Ev::M)
        .boxed();
        let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .map(Ev::N)
            .boxed();
        let (m2, h2, l2) = (most.clone(), history.clone(), listed.clone());
        let task = tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut events = stream::select(machines, nodes);
            while let Some(event) = events.next().await {
                match event {
                    Ev::M(Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m))) => {
                        let a = m.annotations();
                        let marked = a.contains_key(annotations::REPAVE)
                            || a.contains_key(annotations::REPAVING);
                        seen.marked.insert(m.name_any(), marked);
                    }
                    Ev::M(Ok(watcher::Event::Delete(m))) => {
                        seen.marked.remove(&m.name_any());
                    }
                    Ev::M(Ok(watcher::Event::InitDone)) => seen.machines_listed = true,
                    Ev::N(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                        let ready = n
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            });
                        let cordoned = n
                            .spec
                            .as_ref()
                            .and_then(|s| s.unschedulable)
                            .unwrap_or(false);
                        seen.nodes.insert(n.name_any(), (ready, cordoned));
                    }
                    Ev::N(Ok(watcher::Event::Delete(n))) => {
                        seen.nodes.remove(&n.name_any());
                    }
                    Ev::N(Ok(watcher::Event::InitDone)) => seen.nodes_listed = true,
                    _ => {}
                }
                if seen.machines_listed && seen.nodes_listed {
                    l2.store(true, std::sync::atomic::Ordering::Release);
                    let now = seen.unready(&group);
                    let mut most = m2.lock().unwrap();
                    if now.len() > most.len() {
                        *most = now.clone();
                    }
                    let mut history = h2.lock().unwrap();
                    if history.last() != Some(&now.len()) {
                        history.push(now.len());
                    }
                }
            }
        });
        Self {
            most,
            history,
            listed,
            task: Arc::new(task),
        }
    }

    /// Waits until both watches have listed everything: from then on, every change is
    /// counted.
    pub async fn wait_listed(&self) {
        wait_for("the unready watch to list Machines and Nodes", || async {
            self.listed
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(())
        })
        .await;
    }

    /// The most Machines seen unready at once, and which.
    pub fn most(&self) -> BTreeSet<String> {
        self.most.lock().unwrap().clone()
    }

    /// The unready counts, each change once.
    pub fn history(&self) -> Vec<usize> {
        self.history.lock().unwrap().clone()
    }
}

impl Drop for UnreadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Plays the agent and kubelet of a group: whenever a Machine records `configuration`
/// version `version` and has no Node, its Node registers Ready after `boot` (unless the
/// Machine is in `withheld`); every few seconds each Node of the group reports Ready again
/// (kube-controller-manager marks a Node whose kubelet stops reporting Unknown), except
/// those set down. Stops when dropped.
pub struct StandInKubelet {
    task: tokio::task::JoinHandle<()>,
    client: Client,
    /// Machines whose Node never comes back.
    pub withheld: Arc<Mutex<BTreeSet<String>>>,
    down: Arc<Mutex<BTreeSet<String>>>,
}

/// How often the stand-in kubelets report.
const HEARTBEAT: Duration = Duration::from_secs(10);

impl StandInKubelet {
    pub fn start(
        client: &Client,
        group: Vec<String>,
        configuration: &str,
        version: Arc<Mutex<i64>>,
        boot: Duration,
    ) -> Self {
        let handle = client.clone();
        let client = client.clone();
        let configuration = configuration.to_owned();
        let withheld = Arc::new(Mutex::new(BTreeSet::new()));
        let down = Arc::new(Mutex::new(BTreeSet::new()));
        let (w2, d2) = (withheld.clone(), down.clone());
        let task = tokio::spawn(async move {
            let machines: Api<Machine> = Api::all(client.clone());
            let nodes: Api<Node> = Api::all(client.clone());
            let mut last_beat = std::time::Instant::now();
            loop {
                if last_beat.elapsed() >= HEARTBEAT {
                    last_beat = std::time::Instant::now();
                    for name in &group {
                        let is_down = d2.lock().unwrap().contains(name);
                        if !is_down && matches!(nodes.get_opt(name).await, Ok(Some(_))) {
                            let _ = set_node_ready(&client, name, true).await;
                        }
                    }
                }
                for name in &group {
                    if w2.lock().unwrap().contains(name) {
                        continue;
                    }
                    let Ok(Some(m)) = machines.get_opt(name).await else {
                        continue;
                    };
                    // A Machine being deleted is going away with its Node (drained, then
                    // deleted): its server does not register it again.
                    if m.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let wanted = *version.lock().unwrap();
                    let recorded = m.status.as_ref().and_then(|s| s.configuration.as_ref());
                    let repaved =
                        recorded.is_some_and(|c| c.name == configuration && c.version == wanted);
                    if repaved && matches!(nodes.get_opt(name).await, Ok(None)) {
                        tokio::time::sleep(boot).await;
                        let deleting = machines.get_opt(name).await.map_or(true, |m| {
                            m.is_none_or(|m| m.metadata.deletion_timestamp.is_some())
                        });
                        if deleting {
                            continue;
                        }
                        // A Node registered anew has a healthy kubelet.
                        d2.lock().unwrap().remove(name);
                        let _ = create_node_unless_exists(&client, name).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self {
            task,
            client: handle,
            withheld,
            down,
        }
    }

    /// Sets a Node's Ready condition, and keeps it so.
    pub async fn set_ready(&self, name: &str, ready: bool) {
        if ready {
            self.down.lock().unwrap().remove(name);
        } else {
            self.down.lock().unwrap().insert(name.to_owned());
        }
        set_node_ready(&self.client, name, ready).await.unwrap();
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until every Machine of `names` records `configuration` version `version` and is
/// Running.
pub async fn wait_all_running_on(
    client: &Client,
    names: &[String],
    configuration: &str,
    version: i64,
    bound: Duration,
) {
    let api: Api<Machine> = Api::all(client.clone());
    let deadline = std::time::Instant::now() + bound;
    loop {
        let mut behind = Vec::new();
        for name in names {
            let m = api.get_opt(name).await.unwrap();
            let ok = m.as_ref().and_then(|m| m.status.as_ref()).is_some_and(|s| {
                s.phase == Some(unbounded_api::MachinePhase::Running)
                    && s.configuration
                        .as_ref()
                        .is_some_and(|c| c.name == configuration && c.version == version)
            });
            if !ok {
                behind.push(format!(
                    "{name}: {:?}",
                    m.and_then(|m| m.status).map(|s| (s.phase, s.configuration))
                ));
            }
        }
        if behind.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for every Machine to run {configuration} v{version}; behind: {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A stand-in for the PXE provider's power handler: completes every `powerOff` operation
/// (the controller powers a released machine off before it deletes its Node) and adds the
/// machine to `switched_off`, the stand-in kubelets' withheld set: a machine switched off
/// registers no Node. Stops when dropped.
pub struct StandInPower(tokio::task::JoinHandle<()>);

impl StandInPower {
    pub fn start(client: &Client, switched_off: Arc<Mutex<BTreeSet<String>>>) -> Self {
        let client = client.clone();
        Self(tokio::spawn(async move {
            let api: Api<unbounded_api::MachineOperation> = Api::all(client);
            loop {
                if let Ok(list) = api.list(&kube::api::ListParams::default()).await {
                    for o in list.items {
                        let done = o
                            .status
                            .as_ref()
                            .and_then(|s| s.state.as_ref())
                            .is_some_and(|s| {
                                matches!(
                                    s,
                                    unbounded_api::OperationState::Complete
                                        | unbounded_api::OperationState::Failed
                                )
                            });
                        if o.spec.operation_name != "powerOff" || done {
                            continue;
                        }
                        if let Some(target) = &o.spec.machine_ref {
                            switched_off.lock().unwrap().insert(target.name.clone());
                        }
                        let patch = serde_json::json!({"status": {
                            "state": "Complete",
                            "message": "powered off (stand-in)",
                            "completionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                        }});
                        let _ = api
                            .patch_status(
                                &o.name_any(),
                                &kube::api::PatchParams::default(),
                                &kube::api::Patch::Merge(&patch),
                            )
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }))
    }
}

impl Drop for StandInPower {
    fn drop(&mut self) {
        self.0.abort();
    }
}
