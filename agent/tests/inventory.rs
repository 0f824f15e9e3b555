//! The in-band collector over fixture trees written from real servers' facts (a Dell R650
//! layout: two Xeon sockets, NVMe and SATA disks, an Intel X710, an NVIDIA A100, the BMC's
//! ASPEED VGA, UEFI with Secure Boot) and a minimal QEMU guest; then the labels derived from
//! what was collected.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use unbounded_agent::inventory::collect;
use unbounded_api::Firmware;
use unbounded_api::inventory::{FactSource, hardware_labels, validate};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/inventory")
        .join(name)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

#[test]
fn a_server_tree_gives_its_inventory() {
    let inv = collect(
        &fixture("server"),
        "x86_64",
        Some("B4:96:91:A0:3E:10"),
        now(),
    );
    assert_eq!(validate(&inv), Ok(()));

    let cpu = inv.cpu.as_ref().unwrap();
    assert_eq!((cpu.sockets, cpu.cores, cpu.threads), (2, 4, 4));
    assert_eq!(cpu.flags, ["vmx", "avx2", "avx512f", "aes"]);
    assert_eq!(cpu.origin.source, FactSource::InBand);

    let memory = inv.memory.as_ref().unwrap();
    assert_eq!(
        memory.total_bytes,
        64 << 30,
        "32 online blocks of 2 GiB, the offline one not counted"
    );
    assert_eq!(memory.usable_bytes, Some(65_747_160 * 1024));

    let disks = &inv.disks.as_ref().unwrap().devices;
    let names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["nvme0n1", "sda"],
        "loop and removable devices are left out"
    );
    assert_eq!(disks[0].size_bytes, 3_750_748_848 * 512);
    assert_eq!(disks[0].rotational, Some(false));
    assert_eq!(
        disks[0].by_path.as_deref(),
        Some("pci-0000:c3:00.0-nvme-1"),
        "the disk's link, not its partition's"
    );
    assert_eq!(disks[0].serial.as_deref(), Some("S6CRNA0T812345"));
    assert_eq!(
        disks[0].wwn.as_deref(),
        Some("eui.36434e3054812345002538a300000001")
    );
    assert_eq!(disks[1].rotational, Some(true));
    assert_eq!(disks[1].wwn.as_deref(), Some("naa.5000c500a1b2c3d4"));
    assert_eq!(disks[1].by_path.as_deref(), Some("pci-0000:00:17.0-ata-1"));

    let nics = &inv.nics.as_ref().unwrap().interfaces;
    let names: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["eno1", "eno2"], "lo and the bridge have no device");
    assert_eq!(nics[0].driver.as_deref(), Some("i40e"));
    assert_eq!(
        (nics[0].link, nics[0].speed_mbps, nics[0].pxe_booted),
        (true, Some(10_000), true)
    );
    assert_eq!(
        (nics[1].link, nics[1].speed_mbps, nics[1].pxe_booted),
        (false, None, false)
    );
    assert_eq!(nics[1].mac, "b4:96:91:a0:3e:11", "MACs are lower case");

    let system = inv.system.as_ref().unwrap();
    assert_eq!(system.vendor.as_deref(), Some("Dell Inc."));
    assert_eq!(system.serial.as_deref(), Some("FX7Q2K3"));
    assert_eq!(
        system.uuid.as_deref(),
        Some("4c4c4544-0058-3710-8051-c6c04f4b3233")
    );
    assert_eq!(system.board_product.as_deref(), Some("0Y2K8N"));

    let pci = &inv.pci.as_ref().unwrap().devices;
    let flagged: Vec<(&str, bool)> = pci
        .iter()
        .map(|d| (d.address.as_str(), d.accelerator))
        .collect();
    assert_eq!(
        flagged,
        [
            ("0000:03:00.0", false),
            ("0000:17:00.0", true),
            ("0000:31:00.0", false)
        ],
        "the host bridge left out; the A100 flagged, the BMC's VGA not"
    );

    let firmware = inv.firmware.as_ref().unwrap();
    assert_eq!(
        (firmware.mode, firmware.secure_boot),
        (Firmware::Uefi, Some(true))
    );

    let labels = hardware_labels(&inv);
    let get = |k: &str| {
        labels
            .get(&format!("hardware.unbounded-cloud.io/{k}"))
            .map(String::as_str)
    };
    assert_eq!(get("arch"), Some("amd64"));
    assert_eq!(get("cpus"), Some("4"));
    assert_eq!(get("memory-gib"), Some("64"));
    assert_eq!(get("disks"), Some("2"));
    assert_eq!(get("accelerator"), Some("nvidia"));
    assert_eq!(get("nic-speed"), Some("10000"));
    assert_eq!(get("vendor"), Some("Dell-Inc"));
    assert_eq!(get("product"), Some("PowerEdge-R650"));
}

#[test]
fn a_bare_vm_tree_gives_what_it_has() {
    let inv = collect(&fixture("vm"), "aarch64", None, now());
    assert_eq!(validate(&inv), Ok(()));
    assert_eq!(inv.cpu.as_ref().unwrap().threads, 1);
    assert_eq!(
        inv.memory.as_ref().unwrap().total_bytes,
        2_030_000 * 1024,
        "no memory blocks: MemTotal"
    );
    assert!(inv.system.is_none(), "no DMI");
    assert!(inv.pci.is_none());
    let disks = &inv.disks.as_ref().unwrap().devices;
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0].name, "vda");
    assert_eq!(disks[0].size_bytes, 20 << 30);
    assert_eq!(
        disks[0].serial.as_deref(),
        Some("data-ub-vm"),
        "virtio-blk keeps the serial on the disk, not on its device"
    );
    assert_eq!(
        inv.firmware.as_ref().unwrap().mode,
        Firmware::Bios,
        "no /sys/firmware/efi"
    );
    let labels = hardware_labels(&inv);
    assert_eq!(
        labels
            .get("hardware.unbounded-cloud.io/arch")
            .map(String::as_str),
        Some("arm64")
    );
    assert_eq!(
        labels
            .get("hardware.unbounded-cloud.io/disks")
            .map(String::as_str),
        Some("1")
    );
}

#[test]
fn a_missing_root_gives_an_empty_inventory_not_an_error() {
    let inv = collect(&fixture("does-not-exist"), "x86_64", None, now());
    assert!(inv.cpu.is_none() && inv.memory.is_none() && inv.nics.is_none());
}
