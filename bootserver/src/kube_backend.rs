//! The Kubernetes backend: `provider: pxe` Machines and their resolved configuration
//! versions, watched into reflector caches and indexed by MAC, so that a DHCP packet or an
//! HTTP request never waits on the API server. If the API server goes away, the last known
//! index keeps answering and the watches retry.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
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
#[derive(Debug, Default)]
pub struct KubeBackend {
    index: RwLock<Arc<Index>>,
    ready: AtomicBool,
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

impl KubeBackend {
    /// Starts the watches and returns the backend; it reports ready once both caches have
    /// synced.
    pub fn start(client: Client) -> Arc<Self> {
        let backend = Arc::new(Self::default());
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
            tokio::spawn(stream.for_each(move |event| {
                if let Err(error) = event {
                    tracing::warn!(%error, "Machine watch error; retrying");
                }
                on_change();
                futures::future::ready(())
            }));
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
            tokio::spawn(stream.for_each(move |event| {
                if let Err(error) = event {
                    tracing::warn!(%error, "MachineConfigurationVersion watch error; retrying");
                }
                on_change();
                futures::future::ready(())
            }));
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
        let mut index = Index::default();
        for machine in machines.state() {
            let version = machine
                .status
                .as_ref()
                .and_then(|s| s.configuration.as_ref())
                .and_then(|c| versions.get(&c.version_name()));
            let Some(record) = record_of(&machine, version.map(AsRef::as_ref)) else {
                continue;
            };
            let record = Arc::new(record);
            for mac in &record.macs {
                // Two Machines claiming one MAC: the API cannot forbid it across objects;
                // keep the first by name and say so.
                if let Some(other) = index.by_mac.get(mac) {
                    tracing::warn!(%mac, first = %other.name, second = %record.name, "two Machines claim one MAC; ignoring the second");
                    continue;
                }
                index.by_mac.insert(*mac, record.clone());
            }
            if let Some(ip) = record.ipv4 {
                if let Some(other) = index.by_ip.get(&ip) {
                    tracing::warn!(%ip, first = %other.name, second = %record.name, "two Machines reserve one address; ignoring the second's reservation");
                } else {
                    index.by_ip.insert(ip, record.clone());
                }
            }
            index.by_name.insert(record.name.clone(), record);
        }
        if let Ok(mut current) = self.index.write() {
            *current = Arc::new(index);
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
