//! The Kubernetes backend: `provider: pxe` Machines and their resolved configuration
//! versions, watched into reflector caches and indexed by MAC, so that a DHCP packet or an
//! HTTP request never waits on the API server. If the API server goes away, the last known
//! index keeps answering and the watches retry.
//!
//! Two Machines that claim one MAC (or reserve one address) cannot be refused by the API
//! server (they are separate objects). The Machine created first keeps it (then the first by
//! name): an order that does not depend on the cache's iteration order, so every replica and
//! every restart boots the server the same way. The conflict is reported once per
//! bootserver process as a Warning Event (`DuplicateMACAddress`,
//! `DuplicateIPv4Reservation`) on both Machines.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use unbounded_api::{Machine, MachineConfigurationVersion, MachineProvider};

use crate::backend::{BootTarget, MacAddr, MachineBackend, MachineRecord};

/// The index the lookups read.
#[derive(Debug, Default)]
struct Index {
    by_mac: HashMap<MacAddr, Arc<MachineRecord>>,
    by_name: HashMap<String, Arc<MachineRecord>>,
    by_ip: HashMap<Ipv4Addr, Arc<MachineRecord>>,
}

/// What the bootserver knows from the cluster.
#[derive(Default)]
pub struct KubeBackend {
    index: RwLock<Arc<Index>>,
    ready: AtomicBool,
    recorder: Option<Recorder>,
    /// Conflicts already reported as Events.
    reported: Mutex<HashSet<Conflict>>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// The bootserver's view of one Machine, from plain data: `None` for a Machine that is not
/// network-booted by us. `version` is the resolved version's object, when it exists.
pub fn record_of(
    machine: &Machine,
    version: Option<&MachineConfigurationVersion>,
) -> Option<MachineRecord> {
    if machine.spec.provider != MachineProvider::Pxe
        || machine.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let pxe = machine.spec.pxe.as_ref()?;
    let macs: Vec<MacAddr> = pxe
        .mac_addresses
        .iter()
        .filter_map(|m| m.parse().ok())
        .collect();
    let resolved = machine
        .status
        .as_ref()
        .and_then(|s| s.configuration.as_ref());
    let boot = match (resolved, version) {
        (Some(r), Some(v)) if v.spec.version == r.version => {
            v.spec.template.boot.as_ref().map(|b| BootTarget {
                kernel_url: b.kernel_url.clone(),
                initrd_url: b.initrd_url.clone(),
                kernel_args: b.kernel_args.clone(),
                configuration: Some((r.name.clone(), r.version)),
            })
        }
        _ => None,
    };
    Some(MachineRecord {
        name: machine.name_any(),
        macs,
        ipv4: pxe.ipv4.as_deref().and_then(|ip| ip.parse().ok()),
        hostname: Some(machine.node_name()),
        architecture: pxe.architecture,
        firmware: pxe.firmware,
        boot,
    })
}

/// Two Machines claim one MAC or one reserved address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conflict {
    /// What they both claim: `MAC 52:54:…` or `address 10.…`.
    pub what: String,
    /// The Machine that keeps it: the one created first (then the first by name).
    pub winner: String,
    /// The Machine that does not get it.
    pub loser: String,
}

impl Conflict {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        if self.what.starts_with("MAC") {
            "DuplicateMACAddress"
        } else {
            "DuplicateIPv4Reservation"
        }
    }
}

/// The order in which Machines claim MACs and addresses: oldest `creationTimestamp` first,
/// then name. Stable across restarts and replicas (the reflector's own order is a hash
/// map's).
fn claim_order(a: &Machine, b: &Machine) -> std::cmp::Ordering {
    let created = |m: &Machine| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    // A Machine without a timestamp (never from the API server) sorts last.
    match (created(a), created(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
    .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// The index from plain data: Machines in [`claim_order`], the first claim of each MAC and
/// address wins; the conflicts found.
fn build_index(
    machines: &[Arc<Machine>],
    versions: &HashMap<String, Arc<MachineConfigurationVersion>>,
) -> (Index, Vec<Conflict>) {
    let mut machines: Vec<&Arc<Machine>> = machines.iter().collect();
    machines.sort_by(|a, b| claim_order(a, b));
    let mut index = Index::default();
    let mut conflicts = Vec::new();
    for machine in machines {
        let version = machine
            .status
            .as_ref()
            .and_then(|s| s.configuration.as_ref())
            .and_then(|c| versions.get(&c.version_name()));
        let Some(record) = record_of(machine, version.map(AsRef::as_ref)) else {
            continue;
        };
        let record = Arc::new(record);
        for mac in &record.macs {
            // The API cannot forbid one MAC in two objects: the first claim wins.
            if let Some(other) = index.by_mac.get(mac) {
                conflicts.push(Conflict {
                    what: format!("MAC {mac}"),
                    winner: other.name.clone(),
                    loser: record.name.clone(),
                });
                continue;
            }
            index.by_mac.insert(*mac, record.clone());
        }
        if let Some(ip) = record.ipv4 {
            if let Some(other) = index.by_ip.get(&ip) {
                conflicts.push(Conflict {
                    what: format!("address {ip}"),
                    winner: other.name.clone(),
                    loser: record.name.clone(),
                });
            } else {
                index.by_ip.insert(ip, record.clone());
            }
        }
        index.by_name.insert(record.name.clone(), record);
    }
    (index, conflicts)
}

impl KubeBackend {
    /// Starts the watches (into `background`, which the server watches: if one ends, the
    /// process exits) and returns the backend; it reports ready once both caches have
    /// synced.
    pub fn start(client: Client, background: &mut crate::server::Background) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "unbounded-bootserver".into(),
                instance: None,
            },
        );
        let backend = Arc::new(Self {
            recorder: Some(recorder),
            ..Self::default()
        });
        let (machines, machine_writer) = reflector::store::<Machine>();
        let (versions, version_writer) = reflector::store::<MachineConfigurationVersion>();
        let rebuild = {
            let (backend, machines, versions) =
                (backend.clone(), machines.clone(), versions.clone());
            move || backend.rebuild(&machines, &versions)
        };
        let on_change = Arc::new(rebuild);
        {
            let on_change = on_change.clone();
            let stream = watcher(
                Api::<Machine>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(machine_writer)
            .touched_objects();
            background.spawn(async move {
                stream
                    .for_each(move |event| {
                        if let Err(error) = event {
                            tracing::warn!(%error, "Machine watch error; retrying");
                        }
                        on_change();
                        futures::future::ready(())
                    })
                    .await;
                "Machine watch"
            });
        }
        {
            let on_change = on_change.clone();
            let stream = watcher(
                Api::<MachineConfigurationVersion>::all(client),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(version_writer)
            .touched_objects();
            background.spawn(async move {
                stream
                    .for_each(move |event| {
                        if let Err(error) = event {
                            tracing::warn!(%error, "MachineConfigurationVersion watch error; retrying");
                        }
                        on_change();
                        futures::future::ready(())
                    })
                    .await;
                "MachineConfigurationVersion watch"
            });
        }
        {
            let backend = backend.clone();
            tokio::spawn(async move {
                if machines.wait_until_ready().await.is_ok()
                    && versions.wait_until_ready().await.is_ok()
                {
                    on_change();
                    backend.ready.store(true, Ordering::Release);
                    tracing::info!("machine caches synced");
                }
            });
        }
        backend
    }

    fn rebuild(&self, machines: &Store<Machine>, versions: &Store<MachineConfigurationVersion>) {
        let versions: HashMap<String, Arc<MachineConfigurationVersion>> = versions
            .state()
            .into_iter()
            .map(|v| (v.name_any(), v))
            .collect();
        let machines = machines.state();
        let (index, conflicts) = build_index(&machines, &versions);
        if let Ok(mut current) = self.index.write() {
            *current = Arc::new(index);
        }
        self.report(&machines, conflicts);
    }

    /// Reports each new conflict once, as a Warning Event on both Machines.
    fn report(&self, machines: &[Arc<Machine>], conflicts: Vec<Conflict>) {
        let Ok(mut reported) = self.reported.lock() else {
            return;
        };
        let fresh: Vec<Conflict> = conflicts
            .into_iter()
            .filter(|c| !reported.contains(c))
            .collect();
        for conflict in fresh {
            tracing::warn!(what = %conflict.what, winner = %conflict.winner, loser = %conflict.loser, "two Machines claim the same thing; the one created first keeps it");
            reported.insert(conflict.clone());
            let Some(recorder) = self.recorder.clone() else {
                continue;
            };
            let refs: Vec<_> = [&conflict.winner, &conflict.loser]
                .into_iter()
                .filter_map(|name| machines.iter().find(|m| m.name_any() == *name))
                .map(|m| m.object_ref(&()))
                .collect();
            let note = format!(
                "{} is claimed by Machines {} and {}: {} (created first) keeps it, {} does not get it until the conflict is resolved",
                conflict.what, conflict.winner, conflict.loser, conflict.winner, conflict.loser
            );
            let event = Event {
                type_: EventType::Warning,
                reason: conflict.reason().into(),
                note: Some(note),
                action: "IndexMachines".into(),
                secondary: None,
            };
            tokio::spawn(async move {
                for reference in refs {
                    if let Err(error) = recorder.publish(&event, &reference).await {
                        tracing::warn!(%error, "publishing a conflict Event failed");
                    }
                }
            });
        }
    }

    fn snapshot(&self) -> Arc<Index> {
        self.index.read().map(|i| i.clone()).unwrap_or_default()
    }
}

impl MachineBackend for KubeBackend {
    fn machine_by_mac(&self, mac: &MacAddr) -> Option<Arc<MachineRecord>> {
        self.snapshot().by_mac.get(mac).cloned()
    }

    fn machine_by_name(&self, name: &str) -> Option<Arc<MachineRecord>> {
        self.snapshot().by_name.get(name).cloned()
    }

    fn reserved_by(&self, ip: Ipv4Addr) -> Option<Arc<MachineRecord>> {
        self.snapshot().by_ip.get(&ip).cloned()
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn machine(name: &str, created: Option<i64>, mac: &str, ip: Option<&str>) -> Arc<Machine> {
        let mut m: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": name},
            "spec": {"provider": "pxe", "pxe": {"macAddresses": [mac], "ipv4": ip}},
        }))
        .unwrap();
        m.metadata.creation_timestamp =
            created.map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
        Arc::new(m)
    }

    #[test]
    fn the_oldest_machine_keeps_a_duplicated_mac_whatever_the_cache_order() {
        let mac = "52:54:00:00:00:01";
        let cases = [
            (
                "older wins over first by name",
                vec![
                    machine("b", Some(100), mac, None),
                    machine("a", Some(200), mac, None),
                ],
                "b",
                "a",
            ),
            (
                "same age: first by name",
                vec![
                    machine("b", Some(100), mac, None),
                    machine("a", Some(100), mac, None),
                ],
                "a",
                "b",
            ),
            (
                "no timestamp sorts last",
                vec![
                    machine("a", None, mac, None),
                    machine("z", Some(1), mac, None),
                ],
                "z",
                "a",
            ),
        ];
        for (case, machines, winner, loser) in cases {
            for order in [machines.clone(), machines.iter().rev().cloned().collect()] {
                let (index, conflicts) = build_index(&order, &HashMap::new());
                let mac_addr: MacAddr = mac.parse().unwrap();
                assert_eq!(index.by_mac[&mac_addr].name, winner, "{case}");
                assert_eq!(
                    conflicts,
                    vec![Conflict {
                        what: format!("MAC {mac}"),
                        winner: winner.into(),
                        loser: loser.into()
                    }],
                    "{case}"
                );
                assert_eq!(conflicts[0].reason(), "DuplicateMACAddress");
            }
        }
    }

    #[test]
    fn the_oldest_machine_keeps_a_duplicated_reservation() {
        let machines = vec![
            machine("new", Some(2), "52:54:00:00:00:02", Some("10.0.0.5")),
            machine("old", Some(1), "52:54:00:00:00:03", Some("10.0.0.5")),
        ];
        let (index, conflicts) = build_index(&machines, &HashMap::new());
        assert_eq!(index.by_ip[&"10.0.0.5".parse().unwrap()].name, "old");
        assert_eq!(conflicts[0].reason(), "DuplicateIPv4Reservation");
        assert_eq!(
            (conflicts[0].winner.as_str(), conflicts[0].loser.as_str()),
            ("old", "new")
        );
        // The loser still boots from its own MAC.
        assert!(
            index
                .by_mac
                .contains_key(&"52:54:00:00:00:02".parse().unwrap())
        );
    }
}
