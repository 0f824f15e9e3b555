#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The out-of-band inventory on a real control plane, with sushy-tools' Redfish emulator as
//! the BMC: its libvirt driver over libvirt's in-process test driver (`test:///<file>`), so
//! the System, Processors, EthernetInterfaces and Storage documents are the ones sushy
//! renders from a libvirt domain (4 vCPUs, 6 GiB, two NICs) and its static drives; no
//! libvirtd, no VM. And OpenIPMI's `ipmi_sim` as an IPMI BMC holding a FRU image (chassis,
//! board and product areas). The bootserver's BMC reads run in this process.
//!
//! - a Machine with a Redfish BMC gets its MachineInventory from the BMC, every section
//!   tagged `Redfish`, the read recorded, and hardware labels a pool can select on;
//! - Redfish replaces an in-band section (the BMC outranks what the OS of whoever answers
//!   reports), the sections Redfish lacks stay in band; a later in-band report that
//!   contradicts the BMC changes nothing of its reading, is recorded as a disagreement,
//!   and the Machine's labels say disputed (no pool or hardware requirement takes it);
//! - a Machine with an IPMI BMC gets the identity its FRU holds (vendor, product, serials),
//!   tagged `IpmiFru`, and the vendor and product labels;
//! - `unbounded-cloud.io/reinspect` with a new value reads again, once: the answered value
//!   is recorded and the read is not repeated.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use unbounded_api::Machine;
use unbounded_api::inventory::{
    FactOrigin, FactSource, FirmwareFacts, InventoryRead, MachineInventory, MachineInventorySpec,
    SystemFacts,
};
use unbounded_pxe::provider::{PowerSettings, PxeProvider};
use unbounded_testbed::bmc::fru::FruIdentity;
use unbounded_testbed::bmc::{IpmiSim, SushyEmulator};
use unbounded_testbed::cluster::LocalControlPlane;
use unbounded_testbed::testkit::wait_for_slow;

const SYSTEM_A: &str = "5b000000-0000-4000-8000-00000000b001";
const SYSTEM_B: &str = "5b000000-0000-4000-8000-00000000b002";

fn domain(name: &str, uuid: &str, vcpus: u32, gib: u32, macs: &[&str]) -> String {
    let nics: String = macs
        .iter()
        .map(|m| format!("<interface type='network'><mac address='{m}'/><source network='default'/></interface>"))
        .collect();
    format!(
        "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='GiB'>{gib}</memory>\
         <vcpu>{vcpus}</vcpu><os><type arch='x86_64'>hvm</type><boot dev='network'/></os>\
         <devices>{nics}</devices></domain>"
    )
}

fn sushy() -> SushyEmulator {
    let node = format!(
        "<node>{}{}</node>",
        domain(
            "ri-a",
            SYSTEM_A,
            4,
            6,
            &["52:54:00:0b:00:01", "52:54:00:0b:00:02"]
        ),
        domain("ri-b", SYSTEM_B, 2, 3, &["52:54:00:0b:00:03"]),
    );
    let storage = format!(
        "SUSHY_EMULATOR_STORAGE = {{'{SYSTEM_A}': [{{'Id': '1', 'Name': 'Local Storage Controller', \
         'StorageControllers': [{{'MemberId': '0', 'Name': 'RAID', 'SpeedGbps': 12}}], 'Drives': ['d1', 'd2']}}], \
         '{SYSTEM_B}': [{{'Id': '1', 'Name': 'Local Storage Controller', 'StorageControllers': [], 'Drives': ['d1']}}]}}\n\
         SUSHY_EMULATOR_DRIVES = {{('{SYSTEM_A}', '1'): [{{'Id': 'd1', 'Name': 'Drive 1', 'CapacityBytes': 480103981056, 'Protocol': 'SATA'}}, \
         {{'Id': 'd2', 'Name': 'Drive 2', 'CapacityBytes': 1920383410176, 'Protocol': 'SAS'}}], \
         ('{SYSTEM_B}', '1'): [{{'Id': 'd1', 'Name': 'Drive 1', 'CapacityBytes': 240057409536, 'Protocol': 'SATA'}}]}}"
    );
    SushyEmulator::start_libvirt_test(&node, &storage).unwrap()
}

/// The IPMI machine's FRU.
fn fru() -> FruIdentity {
    FruIdentity {
        chassis_serial: "CH-0042".into(),
        board_vendor: "Acme Boards".into(),
        board_product: "AB-X11".into(),
        board_serial: "BRD-0042".into(),
        vendor: "Acme Systems".into(),
        product: "RS-2U".into(),
        serial: "SYS-0042".into(),
    }
}

fn manifests(port: u16, ipmi_port: u16) -> String {
    let machine = |name: &str, system: &str, mac: &str| {
        format!(
            r#"---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: {name}}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["{mac}"]
    bmc: {{address: "redfish+http://127.0.0.1:{port}/redfish/v1/Systems/{system}", credentialsSecretRef: {{namespace: default, name: ri-bmc}}}}
"#
        )
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: ri-bmc, namespace: default}}\nstringData: {{username: admin, password: ri-not-checked}}\n{}{}",
        machine("ri-a", SYSTEM_A, "52:54:00:0b:00:01"),
        machine("ri-b", SYSTEM_B, "52:54:00:0b:00:03"),
    ) + &format!(
        r#"---
apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {{name: ri-c}}
spec:
  provider: pxe
  pxe:
    macAddresses: ["52:54:00:0b:00:04"]
    bmc: {{address: "ipmi://127.0.0.1:{ipmi_port}", credentialsSecretRef: {{namespace: default, name: ri-bmc}}}}
"#
    )
}

fn redfish_read(spec: &MachineInventorySpec) -> Option<InventoryRead> {
    spec.read_of(FactSource::Redfish).cloned()
}

#[tokio::test(flavor = "multi_thread")]
async fn redfish_describes_machines_without_clobbering_in_band_facts_and_reads_again_on_request() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let sushy = sushy();
    let ipmi = IpmiSim::start_with_fru(
        None,
        "127.0.0.1",
        "unbounded-ri-c-no-domain",
        "admin",
        "ri-not-checked",
        &fru().image(),
    )
    .unwrap();
    let inventories = Api::<MachineInventory>::all(client.clone());
    let machines = Api::<Machine>::all(client.clone());

    cp.kubectl_with_input(
        &["apply", "-f", "-"],
        Some(&manifests(sushy.port, ipmi.port)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // ri-b's agent reported before any Redfish read (its firmware and identity in band).
    let ri_b = machines.get("ri-b").await.unwrap();
    let in_band_at = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let in_band = MachineInventorySpec {
        system: Some(SystemFacts {
            vendor: Some("QEMU".into()),
            serial: Some("IN-BAND-SERIAL".into()),
            ..SystemFacts::empty(FactOrigin {
                source: FactSource::InBand,
                observed_at: in_band_at.clone(),
            })
        }),
        firmware: Some(FirmwareFacts {
            origin: FactOrigin {
                source: FactSource::InBand,
                observed_at: in_band_at.clone(),
            },
            mode: unbounded_api::Firmware::Bios,
            secure_boot: None,
        }),
        ..Default::default()
    };
    unbounded_runtime::inventory::fold_into(
        &client,
        &ri_b,
        in_band,
        InventoryRead {
            source: FactSource::InBand,
            observed_at: in_band_at,
            reinspection: None,
        },
        "test-agent",
    )
    .await
    .unwrap();

    let provider = Arc::new(PxeProvider::new(
        client.clone(),
        PowerSettings::default(),
        unbounded_runtime::leader::Term::unbounded(),
    ));
    tokio::spawn(unbounded_pxe::inspection::run(client.clone(), provider));

    // ri-a: everything from Redfish, as sushy renders the libvirt domain and its drives.
    let a = wait_for_slow("ri-a's Redfish read", || async {
        let i = inventories.get_opt("ri-a").await.unwrap()?;
        redfish_read(&i.spec).is_some().then_some(i)
    })
    .await;
    let cpu = a.spec.cpu.as_ref().expect("cpu");
    assert_eq!(
        (cpu.origin.source, cpu.architecture.as_str(), cpu.threads),
        (FactSource::Redfish, "x86_64", 4)
    );
    let memory = a.spec.memory.as_ref().expect("memory");
    assert_eq!(
        memory.total_bytes,
        6 << 30,
        "sushy has no Memory collection: the summary"
    );
    let disks = a.spec.disks.as_ref().expect("disks");
    let sizes: Vec<i64> = disks.devices.iter().map(|d| d.size_bytes).collect();
    assert_eq!(sizes, vec![480_103_981_056, 1_920_383_410_176]);
    let macs = a.spec.mac_set();
    assert_eq!(macs, vec!["52:54:00:0b:00:01", "52:54:00:0b:00:02"]);
    let system = a.spec.system.as_ref().expect("system");
    assert_eq!(
        (system.vendor.as_deref(), system.uuid.as_deref()),
        (Some("Sushy Emulator"), Some(SYSTEM_A))
    );
    assert_eq!(
        a.metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("ri-a"),
        "owned by its Machine"
    );
    // The hardware labels follow, so a pool can claim a machine that never booted.
    let labels = wait_for_slow("ri-a's hardware labels", || async {
        let m = machines.get("ri-a").await.unwrap();
        let labels = m.metadata.labels.clone().unwrap_or_default();
        labels
            .keys()
            .any(|k| k.starts_with("hardware.unbounded-cloud.io/"))
            .then_some(labels)
    })
    .await;
    assert_eq!(
        labels
            .get("hardware.unbounded-cloud.io/cpus")
            .map(String::as_str),
        Some("4"),
        "{labels:?}"
    );

    // ri-b: Redfish replaces the in-band system section; the firmware section it does not
    // read stays in band.
    let b = wait_for_slow("ri-b's Redfish read", || async {
        let i = inventories.get_opt("ri-b").await.unwrap()?;
        redfish_read(&i.spec).is_some().then_some(i)
    })
    .await;
    let system = b.spec.system.as_ref().unwrap();
    assert_eq!(system.origin.source, FactSource::Redfish);
    let bmc_vendor = system.vendor.clone();
    assert_eq!(bmc_vendor.as_deref(), Some("Sushy Emulator"));
    assert_eq!(
        b.spec.firmware.as_ref().map(|f| f.origin.source),
        Some(FactSource::InBand)
    );
    assert_eq!(
        b.spec.cpu.as_ref().map(|c| (c.origin.source, c.threads)),
        Some((FactSource::Redfish, 2))
    );
    assert_eq!(
        b.spec.reads.iter().map(|r| r.source).collect::<Vec<_>>(),
        vec![FactSource::Redfish, FactSource::InBand]
    );
    assert!(
        b.spec.disagreements.is_empty(),
        "{:?}",
        b.spec.disagreements
    );
    // A later in-band report that says it is other hardware (a forged one, or another host
    // on the machine's address): the BMC's reading stays, the contradiction is recorded.
    let forged_at = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
    let forged = MachineInventorySpec {
        system: Some(SystemFacts {
            vendor: Some("Forged Inc".into()),
            serial: Some("FORGED".into()),
            ..SystemFacts::empty(FactOrigin {
                source: FactSource::InBand,
                observed_at: forged_at.clone(),
            })
        }),
        ..Default::default()
    };
    let folded = unbounded_runtime::inventory::fold_into(
        &client,
        &ri_b,
        forged,
        InventoryRead {
            source: FactSource::InBand,
            observed_at: forged_at,
            reinspection: None,
        },
        "test-agent",
    )
    .await
    .unwrap();
    assert_eq!(
        folded
            .system
            .as_ref()
            .map(|s| (s.origin.source, s.vendor.clone())),
        Some((FactSource::Redfish, bmc_vendor)),
        "the report did not replace the BMC's reading"
    );
    assert_eq!(
        folded
            .disagreements
            .iter()
            .map(|d| d.section.as_str())
            .collect::<Vec<_>>(),
        ["system"]
    );

    // Re-inspection: a new value reads again, once, and the value is recorded.
    let first = redfish_read(&a.spec).unwrap();
    assert_eq!(first.reinspection, None);
    machines
        .patch(
            "ri-a",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {"unbounded-cloud.io/reinspect": "r1"}}})),
        )
        .await
        .unwrap();
    let again = wait_for_slow("ri-a's second read", || async {
        let i = inventories.get("ri-a").await.unwrap();
        let read = redfish_read(&i.spec)?;
        (read.reinspection.as_deref() == Some("r1")).then_some(i)
    })
    .await;
    let version = again.metadata.resource_version.clone();
    assert!(
        again.spec.cpu.as_ref().unwrap().origin.observed_at.0 >= first.observed_at.0,
        "the sections are the new read's"
    );
    // Answered: a change of the Machine (a label, as the provider's status writes do)
    // reconciles it again, and nothing is read. The sign the reconcile looked: ri-b's
    // request, made after this label, is answered, and ri-a's inventory is unchanged.
    machines
        .patch(
            "ri-a",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    machines
        .patch(
            "ri-b",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {"unbounded-cloud.io/reinspect": "b1"}}})),
        )
        .await
        .unwrap();
    wait_for_slow("ri-b's requested read", || async {
        let i = inventories.get("ri-b").await.unwrap();
        (redfish_read(&i.spec)?.reinspection.as_deref() == Some("b1")).then_some(())
    })
    .await;
    // The BMC's read keeps the dispute (only an in-band read that agrees, or an operator,
    // settles it), and the Machine's labels now say so.
    let disputed = wait_for_slow("ri-b labelled disputed", || async {
        let m = machines.get("ri-b").await.unwrap();
        unbounded_api::inventory::labels::is_disputed(m.labels()).then_some(m)
    })
    .await;
    let requirements = unbounded_api::inventory::HardwareRequirements {
        min_cpus: Some(1),
        ..Default::default()
    };
    assert!(
        !requirements.admits(disputed.labels()),
        "no hardware requirement admits a disputed Machine"
    );
    let after = inventories.get("ri-a").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, version,
        "an answered request is not read again"
    );

    // ri-c: its IPMI BMC's FRU, identity only.
    let c = wait_for_slow("ri-c's FRU read", || async {
        let i = inventories.get_opt("ri-c").await.unwrap()?;
        i.spec.read_of(FactSource::IpmiFru).is_some().then_some(i)
    })
    .await;
    let system = c.spec.system.as_ref().expect("system");
    let want = fru();
    assert_eq!(system.origin.source, FactSource::IpmiFru);
    assert_eq!(
        (
            system.vendor.as_deref(),
            system.product.as_deref(),
            system.serial.as_deref()
        ),
        (
            Some(want.vendor.as_str()),
            Some(want.product.as_str()),
            Some(want.serial.as_str())
        )
    );
    assert_eq!(
        (
            system.board_vendor.as_deref(),
            system.board_product.as_deref(),
            system.board_serial.as_deref()
        ),
        (Some("Acme Boards"), Some("AB-X11"), Some("BRD-0042"))
    );
    assert!(
        c.spec.cpu.is_none() && c.spec.disks.is_none(),
        "FRU tells identity only"
    );
    let labels = wait_for_slow("ri-c's vendor label", || async {
        let m = machines.get("ri-c").await.unwrap();
        let labels = m.metadata.labels.clone().unwrap_or_default();
        labels
            .contains_key("hardware.unbounded-cloud.io/vendor")
            .then_some(labels)
    })
    .await;
    assert_eq!(
        (
            labels
                .get("hardware.unbounded-cloud.io/vendor")
                .map(String::as_str),
            labels
                .get("hardware.unbounded-cloud.io/product")
                .map(String::as_str)
        ),
        (Some("Acme-Systems"), Some("RS-2U")),
        "{labels:?}"
    );
    drop(sushy);
    drop(ipmi);
}
