//! Reading the cluster: the client from the kubeconfig, the inventory `status` draws, the
//! machines a verb targets, a machine's Events and operations.

use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use unbounded_api::well_known::labels;
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

use crate::error::Error;
use crate::facts::{Inventory, by_name};

/// A client for `--kubeconfig` (else `KUBECONFIG`, `~/.kube/config`, in-cluster) and
/// `--context`.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| kubeconfig_error(&format!(" {}", path.display()), e))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| kubeconfig_error("", e))?
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| kubeconfig_error("", e))?,
        None => Config::infer().await.map_err(|e| kubeconfig_error("", e))?,
    };
    Client::try_from(config).map_err(Error::api("building the API client"))
}

fn kubeconfig_error(what: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Kubeconfig {
        what: what.to_owned(),
        source: Box::new(source),
    }
}

fn list_params(selector: Option<&str>) -> ListParams {
    match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    }
}

/// Machines (narrowed by `selector`), configurations, pools and Nodes, sorted by name.
pub async fn inventory(client: &Client, selector: Option<&str>) -> Result<Inventory, Error> {
    let machines: Api<Machine> = Api::all(client.clone());
    let configurations: Api<MachineConfiguration> = Api::all(client.clone());
    let pools: Api<MachinePool> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let default = ListParams::default();
    let (m, c, p, n) = futures::try_join!(
        async {
            machines
                .list(&list_params(selector))
                .await
                .map_err(Error::api(match selector {
                    Some(s) => format!("listing Machines with the selector {s:?}"),
                    None => "listing Machines".to_owned(),
                }))
        },
        async {
            configurations
                .list(&default)
                .await
                .map_err(Error::api("listing MachineConfigurations"))
        },
        async {
            pools
                .list(&default)
                .await
                .map_err(Error::api("listing MachinePools"))
        },
        async {
            nodes
                .list(&default)
                .await
                .map_err(Error::api("listing Nodes"))
        },
    )?;
    let mut inventory = Inventory {
        machines: m.items,
        configurations: c.items,
        pools: p.items,
        nodes: n.items,
    };
    by_name(&mut inventory.machines);
    by_name(&mut inventory.configurations);
    by_name(&mut inventory.pools);
    Ok(inventory)
}

/// The machines a verb acts on: each one named (all must exist), or every one `selector`
/// matches (at least one must).
pub async fn targets(
    client: &Client,
    names: &[String],
    selector: Option<&str>,
) -> Result<Vec<Machine>, Error> {
    let api: Api<Machine> = Api::all(client.clone());
    if let Some(selector) = selector {
        let mut found = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(Error::api(format!(
                "listing Machines with the selector {selector:?}"
            )))?
            .items;
        if found.is_empty() {
            return Err(Error::EmptySelector(selector.to_owned()));
        }
        by_name(&mut found);
        return Ok(found);
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for name in names {
        match api
            .get_opt(name)
            .await
            .map_err(Error::api(format!("reading Machine {name}")))?
        {
            Some(machine) => {
                if !found.iter().any(|m: &Machine| m.name_any() == *name) {
                    found.push(machine);
                }
            }
            None => missing.push(name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(Error::UnknownMachines(missing));
    }
    Ok(found)
}

/// All MachineConfigurations.
pub async fn configurations(client: &Client) -> Result<Vec<MachineConfiguration>, Error> {
    Ok(Api::<MachineConfiguration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::api("listing MachineConfigurations"))?
        .items)
}

/// All MachineConfigurationVersions (their templates decide what `apply` does).
pub async fn configuration_versions(
    client: &Client,
) -> Result<Vec<MachineConfigurationVersion>, Error> {
    Ok(Api::<MachineConfigurationVersion>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::api("listing MachineConfigurationVersions"))?
        .items)
}

/// The `events.k8s.io/v1` Events about a Machine, in every namespace.
pub async fn machine_events(client: &Client, machine: &Machine) -> Result<Vec<Event>, Error> {
    let name = machine.name_any();
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .map_err(Error::api(format!("listing the Events of Machine {name}")))?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Machine"))
        })
        .collect())
}

/// The single-machine MachineOperations on a Machine (labelled with it by the controller).
pub async fn machine_operations(
    client: &Client,
    machine: &str,
) -> Result<Vec<MachineOperation>, Error> {
    Ok(Api::<MachineOperation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={machine}", labels::MACHINE)))
        .await
        .map_err(Error::api(format!("listing the operations of {machine}")))?
        .items)
}
