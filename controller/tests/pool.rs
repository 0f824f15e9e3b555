//! MachinePools on the real control plane with the controller binary, driven with kubectl:
//! scaling (`kubectl scale`), PXE claims and releases, two pools racing for one inventory, a
//! rolling update of six Machines two at a time, a paused rollout, a failed batch and its
//! rollback, and remediation. Nodes registered by the tests stand in for booted machines;
//! what the controller does is real.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::rollout::*;
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use unbounded_api::well_known::{annotations, conditions, labels, reasons};
use unbounded_api::{Machine, MachineOperation, MachinePool};

fn configuration(name: &str, kernel: &str) -> String {
    format!(
        "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachineConfiguration\nmetadata: {{name: {name}}}\nspec:\n  template: {{boot: {{kernelURL: {kernel}, initrdURL: initrd}}}}\n---\n"
    )
}

fn inventory(prefix: &str, count: usize, label: &str, mac_base: u8) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {{name: {prefix}-{i}, labels: {{inv: {label}}}}}\nspec:\n  provider: pxe\n  pxe: {{macAddresses: [\"52:54:00:{mac_base:02x}:00:{i:02x}\"]}}\n---\n"
            )
        })
        .collect()
}

async fn pool(client: &kube::Client, name: &str) -> MachinePool {
    Api::<MachinePool>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

/// The pool's Machines (by its label), sorted by name.
async fn members(client: &kube::Client, pool: &str) -> Vec<Machine> {
    let mut list = Api::<Machine>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={pool}", labels::POOL)))
        .await
        .unwrap()
        .items;
    list.sort_by_key(|m| m.name_any());
    list
}

fn names(machines: &[Machine]) -> Vec<String> {
    machines.iter().map(|m| m.name_any()).collect()
}

fn pool_condition(
    p: &MachinePool,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

fn owned_by(m: &Machine, pool: &str) -> bool {
    let controllers: Vec<_> = m
        .owner_references()
        .iter()
        .filter(|o| o.controller == Some(true))
        .collect();
    controllers.len() == 1 && controllers[0].kind == "MachinePool" && controllers[0].name == pool
}

#[tokio::test]
async fn manual_pool_scales_with_kubectl_and_removes_the_annotated_machine_first() {
    start_controller();
    let client = client().await;
    kubectl(
        &["apply", "-f", "-"],
        Some(
            &(configuration("pool-scale-mc", "k1")
                + r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: pool-scale}
spec:
  replicas: 3
  template:
    metadata: {labels: {tier: scale}}
    spec: {provider: manual, configurationRef: {name: pool-scale-mc}}
"#),
        ),
    );
    let three = wait_for("three Machines", || async {
        let m = members(&client, "pool-scale").await;
        (m.len() == 3).then_some(m)
    })
    .await;
    assert_eq!(
        names(&three),
        ["pool-scale-0", "pool-scale-1", "pool-scale-2"]
    );
    for m in &three {
        assert!(owned_by(m, "pool-scale"), "{}", m.name_any());
        assert_eq!(m.labels().get("tier").map(String::as_str), Some("scale"));
        assert_eq!(
            m.spec.configuration_ref.as_ref().map(|r| r.name.as_str()),
            Some("pool-scale-mc")
        );
    }
    let all: Vec<String> = (0..4).map(|i| format!("pool-scale-{i}")).collect();
    let _kubelet = StandInKubelet::start(
        &client,
        all.clone(),
        "pool-scale-mc",
        Arc::new(Mutex::new(1)),
        Duration::ZERO,
    );
    wait_all_running_on(&client, &names(&three), "pool-scale-mc", 1, TIMEOUT).await;
    let status = wait_for("status: 3 ready, 3 updated", || async {
        let s = pool(&client, "pool-scale").await.status?;
        (s.ready_replicas == 3 && s.updated_replicas == 3 && s.available_replicas == 3).then_some(s)
    })
    .await;
    assert_eq!(status.replicas, 3);
    assert_eq!(status.selector, "unbounded-cloud.io/pool=pool-scale");
    let table = kubectl(&["get", "mp", "pool-scale"], None);
    for column in [
        "REPLICAS",
        "CURRENT",
        "READY",
        "UPDATED",
        "CONFIGURATION",
        "AGE",
    ] {
        assert!(table.contains(column), "{table}");
    }
    assert!(table.contains("pool-scale-mc"), "{table}");

    // Scale down with kubectl: the annotated Machine goes first (the newest would be -2).
    kubectl(
        &[
            "annotate",
            "machine",
            "pool-scale-1",
            &format!("{}=yes", annotations::DELETE_MACHINE),
        ],
        None,
    );
    kubectl(&["scale", "mp/pool-scale", "--replicas=2"], None);
    wait_for("pool-scale-1 and its Node gone", || async {
        let machine = Api::<Machine>::all(client.clone())
            .get_opt("pool-scale-1")
            .await
            .unwrap();
        let node = Api::<Node>::all(client.clone())
            .get_opt("pool-scale-1")
            .await
            .unwrap();
        (machine.is_none() && node.is_none()).then_some(())
    })
    .await;
    assert_eq!(
        names(&members(&client, "pool-scale").await),
        ["pool-scale-0", "pool-scale-2"]
    );
    let scale = kubectl(
        &[
            "get",
            "mp",
            "pool-scale",
            "--subresource=scale",
            "-o",
            "jsonpath={.spec.replicas} {.status.selector}",
        ],
        None,
    );
    assert_eq!(scale, "2 unbounded-cloud.io/pool=pool-scale");

    // Up again: the lowest free names.
    kubectl(&["scale", "mp/pool-scale", "--replicas=4"], None);
    let four = wait_for("four Machines", || async {
        let m = members(&client, "pool-scale").await;
        (m.len() == 4).then_some(m)
    })
    .await;
    assert_eq!(names(&four), all);
    wait_for("Scaled=True at 4", || async {
        let p = pool(&client, "pool-scale").await;
        let c = pool_condition(&p, conditions::SCALED)?;
        (c.status == "True" && p.status?.ready_replicas == 4).then_some(())
    })
    .await;
    for reason in [reasons::SCALING_UP, reasons::SCALING_DOWN] {
        wait_event(&client, "pool-scale", reason).await;
    }

    // Deleting the pool deletes its Machines through their own deletion (Node drained and
    // deleted).
    kubectl(&["delete", "mp", "pool-scale", "--wait=false"], None);
    wait_for("the pool, its Machines and Nodes gone", || async {
        let pool = Api::<MachinePool>::all(client.clone())
            .get_opt("pool-scale")
            .await
            .unwrap();
        let machines = members(&client, "pool-scale").await;
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|n| n.name_any().starts_with("pool-scale-"))
            .count();
        (pool.is_none() && machines.is_empty() && nodes == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn pxe_pool_claims_releases_and_reports_a_short_inventory() {
    start_controller();
    let client = client().await;
    kubectl(
        &["apply", "-f", "-"],
        Some(&(inventory("inv-a", 3, "a", 0xa0) + &configuration("pool-pxe-mc", "k1"))),
    );
    kubectl(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: pool-pxe}
spec:
  replicas: 2
  template:
    metadata: {labels: {tier: pxe}, annotations: {team: metal}}
    spec:
      provider: pxe
      pxe: {inventorySelector: {matchLabels: {inv: a}}}
      configurationRef: {name: pool-pxe-mc}
"#,
        ),
    );
    let claimed = wait_for("two claimed", || async {
        let m = members(&client, "pool-pxe").await;
        (m.len() == 2).then_some(m)
    })
    .await;
    for m in &claimed {
        assert!(owned_by(m, "pool-pxe"), "{}", m.name_any());
        assert_eq!(m.labels().get("tier").map(String::as_str), Some("pxe"));
        assert_eq!(m.labels().get("inv").map(String::as_str), Some("a"));
        assert_eq!(
            m.annotations().get("team").map(String::as_str),
            Some("metal")
        );
        assert!(m.annotations().contains_key(annotations::CLAIMED_AT));
        let managers: Vec<_> = m
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.manager.as_deref())
            .collect();
        assert!(
            managers.contains(&"unbounded-pool-pool-pxe"),
            "claimed by server-side apply under the pool's own manager: {managers:?}"
        );
    }
    let all: Vec<String> = (0..4).map(|i| format!("inv-a-{i}")).collect();
    let _kubelet = StandInKubelet::start(
        &client,
        all.clone(),
        "pool-pxe-mc",
        Arc::new(Mutex::new(1)),
        Duration::ZERO,
    );
    let _power = StandInPower::start(&client, _kubelet.withheld.clone());
    wait_all_running_on(&client, &names(&claimed), "pool-pxe-mc", 1, TIMEOUT).await;

    // Scale down: one goes back to the inventory, drained and powered off.
    kubectl(&["scale", "mp/pool-pxe", "--replicas=1"], None);
    let kept = wait_for("one member", || async {
        let m = members(&client, "pool-pxe").await;
        (m.len() == 1).then_some(m)
    })
    .await;
    let released = names(&claimed)
        .into_iter()
        .find(|n| *n != kept[0].name_any())
        .unwrap();
    let m = wait_for("released Machine back in the inventory", || async {
        let m = machine(&client, &released).await;
        let node = Api::<Node>::all(client.clone())
            .get_opt(&released)
            .await
            .unwrap();
        let done = node.is_none()
            && m.status.as_ref().is_some_and(|s| s.configuration.is_none())
            && !m.annotations().contains_key(annotations::REPAVE);
        done.then_some(m)
    })
    .await;
    assert!(
        m.owner_references().is_empty(),
        "{:?}",
        m.owner_references()
    );
    assert!(!m.labels().contains_key(labels::POOL));
    assert!(!m.labels().contains_key("tier"));
    assert_eq!(m.labels().get("inv").map(String::as_str), Some("a"));
    assert!(!m.annotations().contains_key("team"));
    assert!(!m.annotations().contains_key(annotations::CLAIMED_AT));
    assert!(m.spec.configuration_ref.is_none());
    let power_off = Api::<MachineOperation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={released}", labels::MACHINE)))
        .await
        .unwrap()
        .items;
    assert!(
        power_off.iter().any(|o| o.spec.operation_name == "powerOff"
            && o.spec.machine_ref.as_ref().map(|r| r.name.as_str()) == Some(released.as_str())),
        "a powerOff operation for {released}: {:?}",
        names_of(&power_off)
    );

    // Scale beyond the inventory: everything free is claimed, and the shortage reported.
    kubectl(&["scale", "mp/pool-pxe", "--replicas=5"], None);
    let short = wait_for("InventoryShort", || async {
        let p = pool(&client, "pool-pxe").await;
        let c = pool_condition(&p, conditions::SCALED)?;
        (c.reason == reasons::INVENTORY_SHORT && p.status?.replicas == 3).then_some(c)
    })
    .await;
    assert!(
        short
            .message
            .contains("holds 3 of 5 Machines: 2 more wanted"),
        "{}",
        short.message
    );
    assert!(names(&members(&client, "pool-pxe").await).contains(&released));

    // A new server in the inventory is claimed at once.
    kubectl(
        &["apply", "-f", "-"],
        Some(&inventory("inv-a", 4, "a", 0xa0)),
    );
    wait_for("inv-a-3 claimed", || async {
        let m = members(&client, "pool-pxe").await;
        names(&m).contains(&"inv-a-3".to_owned()).then_some(())
    })
    .await;

    // Deleting the pool releases its Machines; it does not delete them.
    kubectl(&["delete", "mp", "pool-pxe", "--wait=false"], None);
    wait_for("pool gone, Machines released", || async {
        let gone = Api::<MachinePool>::all(client.clone())
            .get_opt("pool-pxe")
            .await
            .unwrap()
            .is_none();
        (gone && members(&client, "pool-pxe").await.is_empty()).then_some(())
    })
    .await;
    for name in &all {
        let m = machine(&client, name).await;
        assert!(m.owner_references().is_empty(), "{name} released");
    }
}

fn names_of(ops: &[MachineOperation]) -> Vec<String> {
    ops.iter().map(|o| o.name_any()).collect()
}

/// A pool with hardware requirements claims only the Machines whose hardware labels meet
/// them: of four free Machines (4 CPUs and 32 GiB; 16 and 128; 32 and 64; 64 and 256 but
/// disputed), a pool of three wanting at least 8 CPUs and 64 GiB gets the second and third,
/// and the first and the disputed one stay free.
#[tokio::test]
async fn a_pool_with_hardware_requirements_claims_only_the_machines_that_meet_them() {
    start_controller();
    let client = client().await;
    let machines: String = [(4, 32), (16, 128), (32, 64), (64, 256)]
        .iter()
        .enumerate()
        .map(|(i, (cpus, gib))| {
            // hw-2 was discovered and waits to be claimed; hw-3's in-band report
            // contradicts its BMC (disputed): the biggest, and claimed by nobody.
            let discovered = match i {
                2 => ", unbounded-cloud.io/discovery: waiting",
                3 => ", hardware.unbounded-cloud.io/disputed: \"true\"",
                _ => "",
            };
            format!(
                "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {{name: hw-{i}, labels: {{inv: hw, hardware.unbounded-cloud.io/cpus: \"{cpus}\", hardware.unbounded-cloud.io/memory-gib: \"{gib}\"{discovered}}}}}\nspec:\n  provider: pxe\n  pxe: {{macAddresses: [\"52:54:00:e0:00:{i:02x}\"]}}\n---\n"
            )
        })
        .collect();
    kubectl(
        &["apply", "-f", "-"],
        Some(&(machines + &configuration("pool-hw-mc", "k1"))),
    );
    kubectl(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: pool-hw}
spec:
  replicas: 3
  template:
    spec:
      provider: pxe
      pxe:
        inventorySelector: {matchLabels: {inv: hw}}
        hardwareRequirements: {minCPUs: 8, minMemoryGiB: 64}
      configurationRef: {name: pool-hw-mc}
"#,
        ),
    );
    // The pool's status counts its members once the controller has claimed what it could.
    wait_for("the pool's status counts two", || async {
        let p = pool(&client, "pool-hw").await;
        p.status.filter(|s| s.replicas >= 2).map(|_| ())
    })
    .await;
    assert_eq!(names(&members(&client, "pool-hw").await), ["hw-1", "hw-2"]);
    let first = Api::<Machine>::all(client.clone())
        .get("hw-0")
        .await
        .unwrap();
    assert!(
        !first.labels().contains_key(labels::POOL),
        "4 CPUs and 32 GiB are not enough"
    );
    let disputed = Api::<Machine>::all(client.clone())
        .get("hw-3")
        .await
        .unwrap();
    assert!(
        !disputed.labels().contains_key(labels::POOL),
        "a disputed inventory is claimed by no pool, however big"
    );
    // The discovered Machine, claimed, is marked claimed and gets the pool's configuration.
    wait_for("the discovered member claimed and resolved", || async {
        let m = Api::<Machine>::all(client.clone()).get("hw-2").await.ok()?;
        let claimed = m.labels().get(labels::DISCOVERY).map(String::as_str) == Some("claimed");
        let status = m.status.as_ref()?;
        let resolved = status.configuration.as_ref()?.name == "pool-hw-mc";
        let condition = unbounded_api::condition::find(&status.conditions, conditions::DISCOVERED)?;
        (claimed && resolved && condition.reason == reasons::CLAIMED).then_some(())
    })
    .await;
}

#[tokio::test]
async fn two_pools_racing_for_the_inventory_never_claim_one_machine() {
    start_controller();
    let client = client().await;
    let pools = |name: &str| {
        format!(
            "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachinePool\nmetadata: {{name: {name}}}\nspec:\n  replicas: 3\n  template:\n    spec:\n      provider: pxe\n      pxe: {{inventorySelector: {{matchLabels: {{inv: race}}}}}}\n---\n"
        )
    };
    // The inventory and both pools at once.
    kubectl(
        &["apply", "-f", "-"],
        Some(&(inventory("race", 5, "race", 0xb0) + &pools("race-a") + &pools("race-b"))),
    );
    let assignment = wait_for("all five claimed, and the shortage reported", || async {
        let a = members(&client, "race-a").await;
        let b = members(&client, "race-b").await;
        let pa = pool(&client, "race-a").await;
        let pb = pool(&client, "race-b").await;
        let short = [&pa, &pb].iter().any(|p| {
            pool_condition(p, conditions::SCALED)
                .is_some_and(|c| c.reason == reasons::INVENTORY_SHORT)
        });
        let counted = pa.status.as_ref()?.replicas + pb.status.as_ref()?.replicas;
        (a.len() + b.len() == 5 && counted == 5 && short).then_some((names(&a), names(&b)))
    })
    .await;
    let check = || async {
        let machines = Api::<Machine>::all(client.clone())
            .list(&ListParams::default().labels("inv=race"))
            .await
            .unwrap()
            .items;
        let mut by_pool: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in &machines {
            let pool = m.labels().get(labels::POOL).cloned().unwrap_or_default();
            assert!(
                owned_by(m, &pool),
                "{} is labelled for {pool:?} and owned by {:?}",
                m.name_any(),
                m.owner_references()
            );
            by_pool.entry(pool).or_default().push(m.name_any());
        }
        by_pool
    };
    let first = check().await;
    assert_eq!(
        first.get("race-a").cloned().unwrap_or_default(),
        assignment.0
    );
    assert_eq!(
        first.get("race-b").cloned().unwrap_or_default(),
        assignment.1
    );
    // Both pools look again at a generation the test sets (a template annotation, synced to
    // their members, claims untouched): once each has recorded it, claims are as they were.
    for name in ["race-a", "race-b"] {
        kubectl(
            &[
                "patch",
                "mp",
                name,
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"template":{"metadata":{"annotations":{"test/looked":"again"}}}}}"#,
            ],
            None,
        );
    }
    wait_for("both pools to act on their new generation", || async {
        for name in ["race-a", "race-b"] {
            let p = pool(&client, name).await;
            let generation = p.metadata.generation;
            if p.status?.observed_generation != generation {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(check().await, first, "claims stay put");
}

#[tokio::test]
async fn six_machines_roll_two_at_a_time() {
    start_controller();
    let client = client().await;
    kubectl(
        &["apply", "-f", "-"],
        Some(
            &(configuration("pool-roll-mc", "k1")
                + r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: pool-roll}
spec:
  replicas: 6
  strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 2}}
  template:
    spec: {provider: manual, configurationRef: {name: pool-roll-mc}}
"#),
        ),
    );
    let group: Vec<String> = (0..6).map(|i| format!("pool-roll-{i}")).collect();
    let wanted = Arc::new(Mutex::new(1));
    let _kubelet = StandInKubelet::start(
        &client,
        group.clone(),
        "pool-roll-mc",
        wanted.clone(),
        Duration::from_millis(700),
    );
    wait_all_running_on(&client, &group, "pool-roll-mc", 1, Duration::from_secs(90)).await;
    let watch = UnreadyWatch::start(&client, &group);
    watch.wait_listed().await;
    *wanted.lock().unwrap() = 2;
    set_template(&client, "pool-roll-mc", template("k2")).await;
    wait_all_running_on(&client, &group, "pool-roll-mc", 2, Duration::from_secs(240)).await;
    wait_for("UpToDate and 6 updated", || async {
        let p = pool(&client, "pool-roll").await;
        let c = pool_condition(&p, conditions::UP_TO_DATE)?;
        (c.status == "True" && p.status?.updated_replicas == 6).then_some(())
    })
    .await;
    let most = watch.most();
    assert_eq!(
        most.len(),
        2,
        "never more than 2 unready, and two at once: {most:?}; history {:?}",
        watch.history()
    );
    wait_for("at least three RollingOut Events (batches)", || async {
        let seen = event_reasons(&client, "pool-roll").await;
        let batches = seen.iter().filter(|r| *r == reasons::ROLLING_OUT).count();
        (batches >= 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_paused_rollout_waits_a_failed_batch_stops_it_and_a_rollback_recovers() {
    start_controller();
    let client = client().await;
    kubectl(
        &["apply", "-f", "-"],
        Some(
            &(configuration("pool-pause-mc", "k1")
                + r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: pool-pause}
spec:
  replicas: 3
  paused: true
  strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1, progressDeadlineSeconds: 6}}
  template:
    spec: {provider: manual, configurationRef: {name: pool-pause-mc}}
"#),
        ),
    );
    let group: Vec<String> = (0..3).map(|i| format!("pool-pause-{i}")).collect();
    let wanted = Arc::new(Mutex::new(1));
    let kubelet = StandInKubelet::start(
        &client,
        group.clone(),
        "pool-pause-mc",
        wanted.clone(),
        Duration::ZERO,
    );
    wait_all_running_on(&client, &group, "pool-pause-mc", 1, TIMEOUT).await;

    // Paused: a new version waits.
    set_template(&client, "pool-pause-mc", template("k2")).await;
    wait_for("UpToDate=False/Paused", || async {
        let c = pool_condition(&pool(&client, "pool-pause").await, conditions::UP_TO_DATE)?;
        (c.reason == reasons::PAUSED).then_some(())
    })
    .await;
    // The pass that wrote Paused saw v2 and requested no repave (a pass requests its
    // repaves before it writes the status).
    wait_all_running_on(&client, &group, "pool-pause-mc", 1, TIMEOUT).await;
    for name in &group {
        assert!(
            !machine(&client, name)
                .await
                .annotations()
                .contains_key(annotations::REPAVE)
        );
    }

    // Resumed, the first Machine's repave never comes back: its batch fails and the rollout
    // stops there.
    kubelet
        .withheld
        .lock()
        .unwrap()
        .insert("pool-pause-0".into());
    *wanted.lock().unwrap() = 2;
    kubectl(
        &[
            "patch",
            "mp",
            "pool-pause",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"paused":false}}"#,
        ],
        None,
    );
    let failed = wait_for("UpToDate=False/BatchFailed", || async {
        let c = pool_condition(&pool(&client, "pool-pause").await, conditions::UP_TO_DATE)?;
        (c.reason == reasons::BATCH_FAILED).then_some(c)
    })
    .await;
    assert!(
        failed.message.starts_with("pool-pause-0 not available 6 s"),
        "{}",
        failed.message
    );
    // The pass that wrote BatchFailed decided the rollout stops there: it requested no
    // further repave (a pass requests its repaves before it writes the status).
    for name in ["pool-pause-1", "pool-pause-2"] {
        let m = machine(&client, name).await;
        assert_eq!(
            m.status
                .as_ref()
                .unwrap()
                .configuration
                .as_ref()
                .unwrap()
                .version,
            1,
            "{name}"
        );
        assert!(!m.annotations().contains_key(annotations::REPAVE), "{name}");
    }
    wait_event(&client, "pool-pause", reasons::BATCH_FAILED).await;

    // Rollback: the template pins v1; the failed Machine is out of date again and repaved.
    *wanted.lock().unwrap() = 1;
    kubelet.withheld.lock().unwrap().clear();
    kubectl(
        &[
            "patch",
            "mp",
            "pool-pause",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"configurationRef":{"name":"pool-pause-mc","version":1}}}}}"#,
        ],
        None,
    );
    wait_all_running_on(&client, &group, "pool-pause-mc", 1, Duration::from_secs(90)).await;
    wait_for("UpToDate=True after the rollback", || async {
        let c = pool_condition(&pool(&client, "pool-pause").await, conditions::UP_TO_DATE)?;
        (c.status == "True").then_some(())
    })
    .await;
    for name in &group {
        let r = machine(&client, name).await.spec.configuration_ref.unwrap();
        assert_eq!(r.version, Some(1), "{name} follows the template");
    }
}

#[tokio::test]
async fn unhealthy_machines_are_remediated_within_max_unhealthy() {
    start_controller();
    let client = client().await;
    let remediation = "  remediation:\n    unhealthyConditions: [{type: Ready, status: \"False\", timeoutSeconds: 3}]\n    maxUnhealthy: 1\n";
    kubectl(
        &["apply", "-f", "-"],
        Some(
            &(configuration("pool-heal-mc", "k1")
                + &inventory("heal-inv", 2, "heal", 0xc0)
                + &format!(
                    "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachinePool\nmetadata: {{name: pool-heal}}\nspec:\n  replicas: 3\n{remediation}  template:\n    spec: {{provider: manual, configurationRef: {{name: pool-heal-mc}}}}\n---\n"
                )
                + &format!(
                    "apiVersion: unbounded-cloud.io/v1alpha1\nkind: MachinePool\nmetadata: {{name: pool-heal-pxe}}\nspec:\n  replicas: 2\n{remediation}  template:\n    spec:\n      provider: pxe\n      pxe: {{inventorySelector: {{matchLabels: {{inv: heal}}}}}}\n      configurationRef: {{name: pool-heal-mc}}\n"
                )),
        ),
    );
    let manual: Vec<String> = (0..4).map(|i| format!("pool-heal-{i}")).collect();
    let pxe: Vec<String> = (0..2).map(|i| format!("heal-inv-{i}")).collect();
    let kubelet = StandInKubelet::start(
        &client,
        manual.iter().chain(&pxe).cloned().collect(),
        "pool-heal-mc",
        Arc::new(Mutex::new(1)),
        Duration::ZERO,
    );
    wait_all_running_on(&client, &manual[..3], "pool-heal-mc", 1, TIMEOUT).await;
    wait_all_running_on(&client, &pxe, "pool-heal-mc", 1, TIMEOUT).await;

    // Two NotReady Nodes in the manual pool: more than maxUnhealthy, nothing is touched.
    kubelet.set_ready("pool-heal-0", false).await;
    kubelet.set_ready("pool-heal-1", false).await;
    let too_many = wait_for("TooManyUnhealthy", || async {
        let c = pool_condition(
            &pool(&client, "pool-heal").await,
            conditions::MACHINES_HEALTHY,
        )?;
        (c.reason == reasons::TOO_MANY_UNHEALTHY).then_some(c)
    })
    .await;
    assert!(
        too_many.message.contains("more than maxUnhealthy (1)"),
        "{}",
        too_many.message
    );
    // The pass that wrote TooManyUnhealthy remediated nothing (remediation comes before the
    // status in a pass).
    assert_eq!(
        members(&client, "pool-heal").await.len(),
        3,
        "nothing deleted"
    );

    // One recovers: the other is replaced (deleted; a new Machine takes its place).
    let sick = machine(&client, "pool-heal-1").await.metadata.uid;
    kubelet.set_ready("pool-heal-0", true).await;
    let replaced = wait_for("pool-heal-1 replaced", || async {
        let m = members(&client, "pool-heal").await;
        let fresh = m.len() == 3
            && m.iter()
                .all(|m| m.metadata.uid != sick && m.metadata.deletion_timestamp.is_none());
        fresh.then(|| names(&m))
    })
    .await;
    assert!(
        replaced.contains(&"pool-heal-0".to_owned())
            && replaced.contains(&"pool-heal-2".to_owned())
    );
    wait_all_running_on(&client, &replaced, "pool-heal-mc", 1, TIMEOUT).await;
    wait_event(&client, "pool-heal", reasons::REMEDIATING).await;

    // In a PXE pool the Machine is repaved: Node drained and deleted, then a pxeBoot.
    kubelet.set_ready("heal-inv-1", false).await;
    let ops = wait_for("a pxeBoot for heal-inv-1", || async {
        let ops = Api::<MachineOperation>::all(client.clone())
            .list(&ListParams::default().labels(&format!("{}=heal-inv-1", labels::MACHINE)))
            .await
            .unwrap()
            .items;
        ops.iter()
            .any(|o| o.spec.operation_name == "pxeBoot")
            .then_some(ops)
    })
    .await;
    assert!(!ops.is_empty());
    // The stand-in registers a Ready Node again: the Machine is healthy and stays in the pool.
    wait_all_running_on(&client, &pxe, "pool-heal-mc", 1, TIMEOUT).await;
    wait_for("MachinesHealthy=True", || async {
        let c = pool_condition(
            &pool(&client, "pool-heal-pxe").await,
            conditions::MACHINES_HEALTHY,
        )?;
        (c.status == "True").then_some(())
    })
    .await;
    assert_eq!(names(&members(&client, "pool-heal-pxe").await), pxe);
}
