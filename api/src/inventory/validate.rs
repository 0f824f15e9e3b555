//! The limits of an inventory, checked before anything is written: an inventory that reaches
//! the bootserver over discovery comes from an unauthenticated machine, so every string is
//! bounded and printable, every list counted and every number in a plausible range. The CRD
//! schema carries the same lengths and counts (`maxLength`, `maxItems`).

use super::MachineInventorySpec;

/// At most this many disks.
pub const MAX_DISKS: usize = 128;
/// At most this many NICs.
pub const MAX_NICS: usize = 64;
/// At most this many PCI functions.
pub const MAX_PCI_DEVICES: usize = 512;
/// At most this many DIMMs.
pub const MAX_DIMMS: usize = 256;
/// At most this many CPU flags.
pub const MAX_CPU_FLAGS: usize = 64;
/// At most this many logical CPUs.
pub const MAX_THREADS: i32 = 16_384;
/// At most this many sockets.
pub const MAX_SOCKETS: i32 = 64;
/// At most 64 TiB of memory.
pub const MAX_MEMORY_BYTES: i64 = 64 << 40;
/// At most 1 PiB per disk.
pub const MAX_DISK_BYTES: i64 = 1 << 50;
/// At most 1.6 Tbit/s per NIC.
pub const MAX_SPEED_MBPS: i32 = 1_600_000;

/// Why an inventory was refused. Each names the field (a JSON path) and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    /// A string is longer than its limit.
    #[error("{field} is {len} characters long; at most {max}")]
    TooLong {
        /// The field.
        field: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A string holds a character outside printable ASCII (or the field's stricter set).
    #[error("{field} holds a character that is not allowed there (printable ASCII only)")]
    BadCharacter {
        /// The field.
        field: String,
    },
    /// A list has more entries than its limit.
    #[error("{field} has {count} entries; at most {max}")]
    TooMany {
        /// The field.
        field: String,
        /// Its count.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A number is outside its range.
    #[error("{field} is {value}; it must be between {min} and {max}")]
    OutOfRange {
        /// The field.
        field: String,
        /// Its value.
        value: i64,
        /// Lowest allowed.
        min: i64,
        /// Highest allowed.
        max: i64,
    },
    /// A field does not have its format (a MAC, a UUID, a PCI address, hex digits).
    #[error("{field} is not {expected}")]
    BadFormat {
        /// The field.
        field: String,
        /// What it should look like.
        expected: &'static str,
    },
    /// Two NICs have the same MAC address.
    #[error("nics.interfaces lists MAC {mac} twice")]
    DuplicateMac {
        /// The MAC.
        mac: String,
    },
}

/// Checks an inventory against the limits; the first problem found is the error.
pub fn validate(spec: &MachineInventorySpec) -> Result<(), InventoryError> {
    count("reads", spec.reads.len(), 3)?;
    for (i, read) in spec.reads.iter().enumerate() {
        opt_text(
            &format!("reads[{i}].reinspection"),
            read.reinspection.as_deref(),
            63,
        )?;
    }
    if let Some(cpu) = &spec.cpu {
        text("cpu.architecture", &cpu.architecture, 32)?;
        if !cpu
            .architecture
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(bad_format(
                "cpu.architecture",
                "a name such as x86_64 or aarch64",
            ));
        }
        opt_text("cpu.model", cpu.model.as_deref(), 256)?;
        range("cpu.sockets", cpu.sockets.into(), 1, MAX_SOCKETS.into())?;
        range("cpu.cores", cpu.cores.into(), 1, MAX_THREADS.into())?;
        range("cpu.threads", cpu.threads.into(), 1, MAX_THREADS.into())?;
        count("cpu.flags", cpu.flags.len(), MAX_CPU_FLAGS)?;
        for (i, flag) in cpu.flags.iter().enumerate() {
            text(&format!("cpu.flags[{i}]"), flag, 32)?;
        }
    }
    if let Some(memory) = &spec.memory {
        range("memory.totalBytes", memory.total_bytes, 1, MAX_MEMORY_BYTES)?;
        if let Some(usable) = memory.usable_bytes {
            range("memory.usableBytes", usable, 1, MAX_MEMORY_BYTES)?;
        }
        count("memory.dimms", memory.dimms.len(), MAX_DIMMS)?;
        for (i, dimm) in memory.dimms.iter().enumerate() {
            let at = |f: &str| format!("memory.dimms[{i}].{f}");
            text(&at("locator"), &dimm.locator, 64)?;
            range(&at("sizeBytes"), dimm.size_bytes, 0, MAX_MEMORY_BYTES)?;
            opt_text(&at("memoryType"), dimm.memory_type.as_deref(), 32)?;
            if let Some(speed) = dimm.speed_mts {
                range(&at("speedMts"), speed.into(), 0, 100_000)?;
            }
            opt_text(&at("manufacturer"), dimm.manufacturer.as_deref(), 64)?;
            opt_text(&at("partNumber"), dimm.part_number.as_deref(), 64)?;
        }
    }
    if let Some(disks) = &spec.disks {
        count("disks.devices", disks.devices.len(), MAX_DISKS)?;
        for (i, disk) in disks.devices.iter().enumerate() {
            let at = |f: &str| format!("disks.devices[{i}].{f}");
            text(&at("name"), &disk.name, 64)?;
            opt_text(&at("byPath"), disk.by_path.as_deref(), 256)?;
            range(&at("sizeBytes"), disk.size_bytes, 0, MAX_DISK_BYTES)?;
            opt_text(&at("model"), disk.model.as_deref(), 128)?;
            opt_text(&at("serial"), disk.serial.as_deref(), 128)?;
            opt_text(&at("wwn"), disk.wwn.as_deref(), 128)?;
        }
    }
    if let Some(nics) = &spec.nics {
        count("nics.interfaces", nics.interfaces.len(), MAX_NICS)?;
        let mut seen: Vec<String> = Vec::with_capacity(nics.interfaces.len());
        for (i, nic) in nics.interfaces.iter().enumerate() {
            let at = |f: &str| format!("nics.interfaces[{i}].{f}");
            text(&at("name"), &nic.name, 64)?;
            if !is_mac(&nic.mac) {
                return Err(bad_format(
                    &at("mac"),
                    "a MAC address such as 52:54:00:12:34:56",
                ));
            }
            let mac = nic.mac.to_ascii_lowercase();
            if seen.contains(&mac) {
                return Err(InventoryError::DuplicateMac { mac });
            }
            seen.push(mac);
            opt_text(&at("driver"), nic.driver.as_deref(), 64)?;
            if let Some(speed) = nic.speed_mbps {
                range(&at("speedMbps"), speed.into(), 0, MAX_SPEED_MBPS.into())?;
            }
            if let Some(lldp) = &nic.lldp {
                text(&at("lldp.chassisId"), &lldp.chassis_id, 256)?;
                text(&at("lldp.portId"), &lldp.port_id, 256)?;
                opt_text(&at("lldp.systemName"), lldp.system_name.as_deref(), 256)?;
                opt_text(
                    &at("lldp.portDescription"),
                    lldp.port_description.as_deref(),
                    256,
                )?;
            }
        }
    }
    if let Some(system) = &spec.system {
        for (field, value, max) in [
            ("system.vendor", &system.vendor, 128),
            ("system.product", &system.product, 128),
            ("system.serial", &system.serial, 128),
            ("system.biosVendor", &system.bios_vendor, 128),
            ("system.biosVersion", &system.bios_version, 128),
            ("system.biosDate", &system.bios_date, 32),
            ("system.boardVendor", &system.board_vendor, 128),
            ("system.boardProduct", &system.board_product, 128),
            ("system.boardSerial", &system.board_serial, 128),
        ] {
            opt_text(field, value.as_deref(), max)?;
        }
        opt_uuid("system.uuid", system.uuid.as_deref())?;
    }
    if let Some(pci) = &spec.pci {
        count("pci.devices", pci.devices.len(), MAX_PCI_DEVICES)?;
        for (i, device) in pci.devices.iter().enumerate() {
            let at = |f: &str| format!("pci.devices[{i}].{f}");
            if !is_pci_address(&device.address) {
                return Err(bad_format(
                    &at("address"),
                    "a PCI address such as 0000:3b:00.0",
                ));
            }
            if !is_hex(&device.vendor_id, 4) {
                return Err(bad_format(&at("vendorId"), "four hex digits"));
            }
            if !is_hex(&device.device_id, 4) {
                return Err(bad_format(&at("deviceId"), "four hex digits"));
            }
            if !is_hex(&device.class_code, 6) {
                return Err(bad_format(&at("classCode"), "six hex digits"));
            }
        }
    }
    if let Some(bmc) = &spec.bmc {
        validate_bmc(bmc)?;
    }
    Ok(())
}

/// The BMC section: addresses that parse as what they say, a suggestion that is exactly what
/// [`super::bmc::suggested_address`] makes of the rest (so a report cannot suggest anything
/// else), bounded names.
fn validate_bmc(bmc: &super::BmcFacts) -> Result<(), InventoryError> {
    if let Some(lan) = &bmc.ipmi_lan {
        range("bmc.ipmiLan.channel", lan.channel.into(), 0, 15)?;
        if lan.ip_address.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(bad_format("bmc.ipmiLan.ipAddress", "an IPv4 address"));
        }
        if let Some(source) = &lan.ip_source
            && !super::bmc::IP_SOURCES.contains(&source.as_str())
        {
            return Err(bad_format(
                "bmc.ipmiLan.ipSource",
                "one of static, dhcp, bios, other",
            ));
        }
        if let Some(mac) = &lan.mac
            && !is_mac(mac)
        {
            return Err(bad_format(
                "bmc.ipmiLan.mac",
                "a MAC address such as 52:54:00:12:34:56",
            ));
        }
        if let Some(vlan) = lan.vlan {
            range("bmc.ipmiLan.vlan", vlan.into(), 1, 4094)?;
        }
    }
    if let Some(redfish) = &bmc.redfish_host_interface {
        if redfish.service_address.parse::<std::net::IpAddr>().is_err() {
            return Err(bad_format(
                "bmc.redfishHostInterface.serviceAddress",
                "an IPv4 or IPv6 address",
            ));
        }
        range(
            "bmc.redfishHostInterface.port",
            redfish.port.into(),
            1,
            65_535,
        )?;
        opt_uuid(
            "bmc.redfishHostInterface.serviceUuid",
            redfish.service_uuid.as_deref(),
        )?;
        if let Some(hostname) = &redfish.hostname {
            text("bmc.redfishHostInterface.hostname", hostname, 253)?;
            if !super::bmc::is_hostname(hostname) {
                return Err(bad_format(
                    "bmc.redfishHostInterface.hostname",
                    "a host name (letters, digits, '-' and '.')",
                ));
            }
        }
    }
    let derived =
        super::bmc::suggested_address(bmc.ipmi_lan.as_ref(), bmc.redfish_host_interface.as_ref());
    if bmc.suggested_address != derived {
        return Err(bad_format(
            "bmc.suggestedAddress",
            "the address its ipmiLan and redfishHostInterface make",
        ));
    }
    Ok(())
}

fn opt_uuid(field: &str, value: Option<&str>) -> Result<(), InventoryError> {
    match value {
        Some(uuid) if !is_uuid(uuid) => Err(bad_format(
            field,
            "a UUID such as 4c4c4544-0042-3510-8052-b4c04f4e3732",
        )),
        _ => Ok(()),
    }
}

fn bad_format(field: &str, expected: &'static str) -> InventoryError {
    InventoryError::BadFormat {
        field: field.to_owned(),
        expected,
    }
}

/// A bounded string of printable ASCII (space through `~`): what DMI, sysfs and Redfish give
/// for these fields, and nothing a terminal or a log line could misread.
fn text(field: &str, value: &str, max: usize) -> Result<(), InventoryError> {
    if value.len() > max {
        return Err(InventoryError::TooLong {
            field: field.to_owned(),
            len: value.len(),
            max,
        });
    }
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(InventoryError::BadCharacter {
            field: field.to_owned(),
        });
    }
    Ok(())
}

fn opt_text(field: &str, value: Option<&str>, max: usize) -> Result<(), InventoryError> {
    value.map_or(Ok(()), |v| text(field, v, max))
}

fn count(field: &str, count: usize, max: usize) -> Result<(), InventoryError> {
    if count > max {
        return Err(InventoryError::TooMany {
            field: field.to_owned(),
            count,
            max,
        });
    }
    Ok(())
}

fn range(field: &str, value: i64, min: i64, max: i64) -> Result<(), InventoryError> {
    if value < min || value > max {
        return Err(InventoryError::OutOfRange {
            field: field.to_owned(),
            value,
            min,
            max,
        });
    }
    Ok(())
}

fn is_hex(value: &str, len: usize) -> bool {
    value.len() == len && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Six colon-separated hex pairs.
pub fn is_mac(value: &str) -> bool {
    value.len() == 17
        && value
            .split(':')
            .map(|pair| is_hex(pair, 2))
            .fold((0, true), |(n, ok), good| (n + 1, ok && good))
            == (6, true)
}

fn is_uuid(value: &str) -> bool {
    let groups: Vec<&str> = value.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| is_hex(group, len))
}

fn is_pci_address(value: &str) -> bool {
    // dddd:bb:dd.f
    let Some((domain_bus_device, function)) = value.rsplit_once('.') else {
        return false;
    };
    let parts: Vec<&str> = domain_bus_device.split(':').collect();
    parts.len() == 3
        && is_hex(parts[0], 4)
        && is_hex(parts[1], 2)
        && is_hex(parts[2], 2)
        && function.len() == 1
        && function.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::inventory::*;

    fn origin() -> FactOrigin {
        FactOrigin {
            source: FactSource::InBand,
            observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn nic(name: &str, mac: &str) -> Nic {
        Nic {
            name: name.into(),
            mac: mac.into(),
            driver: Some("ixgbe".into()),
            speed_mbps: Some(10_000),
            link: true,
            pxe_booted: false,
            lldp: None,
        }
    }

    /// A plausible two-socket server.
    pub(crate) fn good() -> MachineInventorySpec {
        MachineInventorySpec {
            cpu: Some(CpuFacts {
                origin: origin(),
                architecture: "x86_64".into(),
                model: Some("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz".into()),
                sockets: 2,
                cores: 64,
                threads: 128,
                flags: vec!["vmx".into(), "avx512f".into()],
            }),
            memory: Some(MemoryFacts {
                origin: origin(),
                total_bytes: 256 << 30,
                usable_bytes: Some(251 << 30),
                dimms: vec![],
            }),
            disks: Some(DiskFacts {
                origin: origin(),
                devices: vec![Disk {
                    name: "nvme0n1".into(),
                    by_path: Some("pci-0000:5e:00.0-nvme-1".into()),
                    size_bytes: 1_920_383_410_176,
                    rotational: Some(false),
                    model: Some("SAMSUNG MZQL21T9HCJR-00A07".into()),
                    serial: Some("S64GNE0R812345".into()),
                    wwn: Some("eui.36344730528123450025384500000001".into()),
                }],
            }),
            nics: Some(NicFacts {
                origin: origin(),
                interfaces: vec![
                    nic("eno1", "b4:96:91:0a:1b:2c"),
                    nic("eno2", "b4:96:91:0a:1b:2d"),
                ],
            }),
            system: Some(SystemFacts {
                vendor: Some("Dell Inc.".into()),
                product: Some("PowerEdge R650".into()),
                serial: Some("7XK2QH3".into()),
                uuid: Some("4c4c4544-0058-4b10-8032-b7c04f514833".into()),
                ..SystemFacts::empty(origin())
            }),
            pci: Some(PciFacts {
                origin: origin(),
                devices: vec![PciDevice {
                    address: "0000:17:00.0".into(),
                    vendor_id: "10de".into(),
                    device_id: "20b5".into(),
                    class_code: "030200".into(),
                    accelerator: true,
                }],
            }),
            firmware: Some(FirmwareFacts {
                origin: origin(),
                mode: crate::Firmware::Uefi,
                secure_boot: Some(true),
            }),
            bmc: Some(BmcFacts {
                origin: origin(),
                suggested_address: Some("redfish://10.40.0.17".into()),
                ipmi_lan: Some(IpmiLan {
                    channel: 1,
                    ip_address: "10.40.0.17".into(),
                    ip_source: Some("dhcp".into()),
                    mac: Some("b4:96:91:0a:1b:30".into()),
                    vlan: Some(40),
                }),
                redfish_host_interface: Some(RedfishHostInterface {
                    service_address: "169.254.95.118".into(),
                    port: 443,
                    service_uuid: Some("c7d1ac7b-8d5f-4a6e-9c2b-1f0a7e3c5d11".into()),
                    hostname: Some("idrac-7xk2qh3".into()),
                }),
            }),
            reads: Vec::new(),
            disagreements: Vec::new(),
        }
    }

    #[test]
    fn a_plausible_server_passes() {
        assert_eq!(validate(&good()), Ok(()));
        assert_eq!(validate(&MachineInventorySpec::default()), Ok(()));
    }

    #[test]
    fn each_limit_names_its_field() {
        type Edit = fn(&mut MachineInventorySpec);
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "long model",
                |s| s.cpu.as_mut().unwrap().model = Some("x".repeat(257)),
                "cpu.model",
            ),
            (
                "escape in model",
                |s| s.cpu.as_mut().unwrap().model = Some("Xeon\x1b[2J".into()),
                "cpu.model",
            ),
            (
                "non-ASCII vendor",
                |s| s.system.as_mut().unwrap().vendor = Some("Dell\u{202e}".into()),
                "system.vendor",
            ),
            (
                "architecture with a slash",
                |s| s.cpu.as_mut().unwrap().architecture = "x86/64".into(),
                "cpu.architecture",
            ),
            (
                "zero threads",
                |s| s.cpu.as_mut().unwrap().threads = 0,
                "cpu.threads",
            ),
            (
                "absurd threads",
                |s| s.cpu.as_mut().unwrap().threads = 1 << 20,
                "cpu.threads",
            ),
            (
                "negative memory",
                |s| s.memory.as_mut().unwrap().total_bytes = -1,
                "memory.totalBytes",
            ),
            (
                "too many flags",
                |s| s.cpu.as_mut().unwrap().flags = vec!["a".into(); 65],
                "cpu.flags",
            ),
            (
                "too many disks",
                |s| {
                    let d = s.disks.as_mut().unwrap();
                    d.devices = vec![d.devices[0].clone(); MAX_DISKS + 1];
                },
                "disks.devices",
            ),
            (
                "negative disk",
                |s| s.disks.as_mut().unwrap().devices[0].size_bytes = -5,
                "disks.devices[0].sizeBytes",
            ),
            (
                "bad MAC",
                |s| s.nics.as_mut().unwrap().interfaces[1].mac = "b4:96:91:0a:1b".into(),
                "nics.interfaces[1].mac",
            ),
            (
                "MAC with a 7th pair",
                |s| s.nics.as_mut().unwrap().interfaces[1].mac = "b4:96:91:0a:1b:2d:00".into(),
                "nics.interfaces[1].mac",
            ),
            (
                "bad uuid",
                |s| s.system.as_mut().unwrap().uuid = Some("not-a-uuid".into()),
                "system.uuid",
            ),
            (
                "bad PCI address",
                |s| s.pci.as_mut().unwrap().devices[0].address = "17:00.0".into(),
                "pci.devices[0].address",
            ),
            (
                "bad class code",
                |s| s.pci.as_mut().unwrap().devices[0].class_code = "03020".into(),
                "pci.devices[0].classCode",
            ),
            (
                "fast NIC",
                |s| s.nics.as_mut().unwrap().interfaces[0].speed_mbps = Some(i32::MAX),
                "nics.interfaces[0].speedMbps",
            ),
            (
                "long LLDP name",
                |s| {
                    s.nics.as_mut().unwrap().interfaces[0].lldp = Some(LldpNeighbour {
                        chassis_id: "aa".into(),
                        port_id: "Ethernet1".into(),
                        system_name: Some("s".repeat(300)),
                        port_description: None,
                    })
                },
                "nics.interfaces[0].lldp.systemName",
            ),
            (
                "a suggestion the facts do not make",
                |s| s.bmc.as_mut().unwrap().suggested_address = Some("redfish://10.9.9.9".into()),
                "bmc.suggestedAddress",
            ),
            (
                "a suggestion with no facts",
                |s| {
                    let bmc = s.bmc.as_mut().unwrap();
                    bmc.ipmi_lan = None;
                    bmc.redfish_host_interface = None;
                },
                "bmc.suggestedAddress",
            ),
            (
                "a LAN address that is a URL",
                |s| {
                    s.bmc
                        .as_mut()
                        .unwrap()
                        .ipmi_lan
                        .as_mut()
                        .unwrap()
                        .ip_address = "https://evil".into()
                },
                "bmc.ipmiLan.ipAddress",
            ),
            (
                "an unknown address source",
                |s| {
                    s.bmc.as_mut().unwrap().ipmi_lan.as_mut().unwrap().ip_source =
                        Some("magic".into())
                },
                "bmc.ipmiLan.ipSource",
            ),
            (
                "a VLAN out of range",
                |s| s.bmc.as_mut().unwrap().ipmi_lan.as_mut().unwrap().vlan = Some(4095),
                "bmc.ipmiLan.vlan",
            ),
            (
                "a host name with a slash",
                |s| {
                    s.bmc
                        .as_mut()
                        .unwrap()
                        .redfish_host_interface
                        .as_mut()
                        .unwrap()
                        .hostname = Some("evil/redfish".into())
                },
                "bmc.redfishHostInterface.hostname",
            ),
            (
                "port zero",
                |s| {
                    s.bmc
                        .as_mut()
                        .unwrap()
                        .redfish_host_interface
                        .as_mut()
                        .unwrap()
                        .port = 0
                },
                "bmc.redfishHostInterface.port",
            ),
        ];
        for (what, edit, field) in cases {
            let mut spec = good();
            edit(&mut spec);
            let err = validate(&spec).expect_err(what);
            assert!(err.to_string().starts_with(field), "{what}: {err}");
        }
    }

    #[test]
    fn two_nics_with_one_mac_are_refused() {
        let mut spec = good();
        spec.nics.as_mut().unwrap().interfaces[1].mac = "B4:96:91:0A:1B:2C".into();
        assert_eq!(
            validate(&spec),
            Err(InventoryError::DuplicateMac {
                mac: "b4:96:91:0a:1b:2c".into()
            })
        );
    }
}
