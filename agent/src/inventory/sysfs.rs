//! Disks, NICs, DMI, PCI, memory blocks and firmware mode from a sysfs tree. Every reader
//! takes the root the tree hangs from (`/` on a machine, a fixture directory in tests) and
//! skips what it cannot read: a fact the kernel does not offer is absent, not an error.

use std::fs;
use std::path::{Path, PathBuf};

use unbounded_api::Firmware;
use unbounded_api::inventory::{Disk, FactOrigin, Nic, PciDevice, SystemFacts, is_accelerator};

/// The EFI global variable GUID, under which `SecureBoot` lives.
const EFI_GLOBAL: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// Block device name prefixes that are not disks.
const NOT_DISKS: [&str; 9] = [
    "loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd", "mtdblock",
];

fn read_trimmed(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!text.is_empty()).then(|| text.to_owned())
}

fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut names: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    names.sort();
    names
}

/// The disks under `<root>/sys/block`: no partitions (they are not listed there), no loop,
/// RAM, optical, device-mapper or software RAID devices, nothing removable.
pub fn read_disks(root: &Path) -> Vec<Disk> {
    let by_path = entries(&root.join("dev/disk/by-path"));
    entries(&root.join("sys/block"))
        .into_iter()
        .filter(|(name, _)| !NOT_DISKS.iter().any(|p| name.starts_with(p)))
        .filter(|(_, dir)| read_trimmed(&dir.join("removable")).as_deref() != Some("1"))
        .filter_map(|(name, dir)| {
            let sectors: i64 = read_trimmed(&dir.join("size"))?.parse().ok()?;
            let device = dir.join("device");
            Some(Disk {
                by_path: by_path
                    .iter()
                    .find(|(link, path)| !link.contains("-part") && link_names(path, &name))
                    .map(|(link, _)| link.clone()),
                // sysfs counts 512-byte sectors whatever the device's block size.
                size_bytes: sectors.saturating_mul(512),
                rotational: read_trimmed(&dir.join("queue/rotational")).map(|r| r == "1"),
                model: read_trimmed(&device.join("model")),
                // NVMe and some SCSI drivers put the serial on the device; virtio-blk puts it
                // on the disk itself (`/sys/block/vda/serial`).
                serial: read_trimmed(&device.join("serial"))
                    .or_else(|| read_trimmed(&dir.join("serial"))),
                wwn: read_trimmed(&device.join("wwid")).or_else(|| read_trimmed(&dir.join("wwid"))),
                name,
            })
        })
        .collect()
}

/// Whether the symlink at `path` points at the device `name` (`../../sda`).
fn link_names(path: &Path, name: &str) -> bool {
    fs::read_link(path)
        .ok()
        .and_then(|target| target.file_name().map(|f| f == name))
        .unwrap_or(false)
}

/// The physical NICs under `<root>/sys/class/net` (those with a `device`: bridges, bonds,
/// VLANs and `lo` have none). `boot_mac` marks the one the machine network-booted from.
pub fn read_nics(root: &Path, boot_mac: Option<&str>) -> Vec<Nic> {
    entries(&root.join("sys/class/net"))
        .into_iter()
        .filter(|(_, dir)| dir.join("device").exists())
        .filter_map(|(name, dir)| {
            let mac = read_trimmed(&dir.join("address"))?.to_ascii_lowercase();
            let link = read_trimmed(&dir.join("operstate")).as_deref() == Some("up");
            Some(Nic {
                driver: fs::read_link(dir.join("device/driver"))
                    .ok()
                    .and_then(|t| t.file_name().and_then(|f| f.to_str()).map(str::to_owned)),
                // `speed` is -1 (or unreadable) while the link is down.
                speed_mbps: read_trimmed(&dir.join("speed"))
                    .and_then(|s| s.parse::<i32>().ok())
                    .filter(|s| *s > 0 && link),
                link,
                pxe_booted: boot_mac.is_some_and(|b| b.eq_ignore_ascii_case(&mac)),
                lldp: None,
                mac,
                name,
            })
        })
        .collect()
}

/// SMBIOS identity from `<root>/sys/class/dmi/id` (serials and UUID are readable by root
/// only). `None` when the directory has nothing (no DMI, as on many arm64 boards).
pub fn read_dmi(root: &Path, origin: FactOrigin) -> Option<SystemFacts> {
    let dir = root.join("sys/class/dmi/id");
    let field = |name: &str| read_trimmed(&dir.join(name));
    let facts = SystemFacts {
        vendor: field("sys_vendor"),
        product: field("product_name"),
        serial: field("product_serial"),
        uuid: field("product_uuid").map(|u| u.to_ascii_lowercase()),
        bios_vendor: field("bios_vendor"),
        bios_version: field("bios_version"),
        bios_date: field("bios_date"),
        board_vendor: field("board_vendor"),
        board_product: field("board_name"),
        board_serial: field("board_serial"),
        ..SystemFacts::empty(origin)
    };
    (facts.vendor.is_some() || facts.product.is_some() || facts.uuid.is_some()).then_some(facts)
}

/// `0x10de` → `10de`: a sysfs hex ID with its prefix dropped, lower case, `len` digits.
pub fn sysfs_hex(text: &str, len: usize) -> Option<String> {
    let hex = text.trim().trim_start_matches("0x").to_ascii_lowercase();
    (hex.len() == len && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// PCI functions under `<root>/sys/bus/pci/devices`, bridges (class 06) left out.
pub fn read_pci(root: &Path) -> Vec<PciDevice> {
    entries(&root.join("sys/bus/pci/devices"))
        .into_iter()
        .filter_map(|(address, dir)| {
            let hex = |f: &str, len| sysfs_hex(&read_trimmed(&dir.join(f))?, len);
            let class_code = hex("class", 6)?;
            if class_code.starts_with("06") {
                return None;
            }
            let vendor_id = hex("vendor", 4)?;
            Some(PciDevice {
                accelerator: is_accelerator(&class_code, &vendor_id),
                device_id: hex("device", 4)?,
                address,
                vendor_id,
                class_code,
            })
        })
        .collect()
}

/// Installed memory from the memory blocks: `block_size_bytes` (hex) times the blocks that
/// are online. Closer to the DIMMs than `MemTotal`, which lacks what firmware and the kernel
/// reserve.
pub fn read_memory_blocks(root: &Path) -> Option<i64> {
    let dir = root.join("sys/devices/system/memory");
    let block = i64::from_str_radix(
        read_trimmed(&dir.join("block_size_bytes"))?.trim_start_matches("0x"),
        16,
    )
    .ok()?;
    let online = entries(&dir)
        .into_iter()
        .filter(|(name, _)| name.starts_with("memory"))
        .filter(|(_, d)| read_trimmed(&d.join("online")).as_deref() == Some("1"))
        .count();
    let online = i64::try_from(online).ok()?;
    (online > 0).then(|| block.saturating_mul(online))
}

/// The value of the `SecureBoot` EFI variable as efivarfs shows it: four bytes of
/// attributes, then one byte, 1 for on.
pub fn secure_boot_from_efivar(bytes: &[u8]) -> Option<bool> {
    match bytes {
        [_, _, _, _, value, ..] => Some(*value == 1),
        _ => None,
    }
}

/// Firmware mode (`/sys/firmware/efi` exists only when the kernel booted through UEFI) and
/// Secure Boot (unknown when the variable cannot be read).
pub fn read_firmware(root: &Path) -> (Firmware, Option<bool>) {
    let efi = root.join("sys/firmware/efi");
    if !efi.is_dir() {
        return (Firmware::Bios, None);
    }
    let var = efi.join(format!("efivars/SecureBoot-{EFI_GLOBAL}"));
    (
        Firmware::Uefi,
        fs::read(var)
            .ok()
            .as_deref()
            .and_then(secure_boot_from_efivar),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_hex_ids() {
        let cases = [
            ("0x10de\n", 4, Some("10de")),
            ("0x030200", 6, Some("030200")),
            ("0xABCD", 4, Some("abcd")),
            ("0x10d", 4, None),
            ("0xzzzz", 4, None),
            ("", 4, None),
        ];
        for (text, len, want) in cases {
            assert_eq!(sysfs_hex(text, len).as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn secure_boot_variable() {
        let cases: [(&[u8], Option<bool>); 4] = [
            (&[6, 0, 0, 0, 1], Some(true)),
            (&[6, 0, 0, 0, 0], Some(false)),
            (&[6, 0, 0], None),
            (&[], None),
        ];
        for (bytes, want) in cases {
            assert_eq!(secure_boot_from_efivar(bytes), want, "{bytes:?}");
        }
    }
}
