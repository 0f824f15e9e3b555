//! The machine's own BMC, read in band: the IPMI LAN channel's configuration through the
//! host's IPMI system interface (`ipmitool lan print`, when the kernel has an IPMI device),
//! and the Redfish host interface the firmware announces in SMBIOS type 42
//! (`/sys/firmware/dmi/entries/42-*/raw`). The parsers are pure; [`read`] runs them on a
//! machine. What comes out is a suggestion for the Machine's BMC address and nothing more
//! (`unbounded_api::inventory::bmc` says why).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use unbounded_api::inventory::bmc::{IP_SOURCES, suggested_address};
use unbounded_api::inventory::{BmcFacts, FactOrigin, IpmiLan, RedfishHostInterface};

/// The LAN channels asked, in order: 1 on most servers, 2 on some (HPE), 8 on others. The
/// first with an address wins; a channel that is not a LAN channel fails at once.
pub const LAN_CHANNELS: [i32; 3] = [1, 2, 8];

/// How long one `ipmitool lan print` may take: a BMC answers in well under a second, a hung
/// one must not hold the inventory up.
pub const IPMITOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the kernel puts its IPMI device (`ipmi_devintf`), by distribution.
const IPMI_DEVICES: [&str; 3] = ["dev/ipmi0", "dev/ipmi/0", "dev/ipmidev/0"];

/// One channel from `ipmitool lan print <channel>`'s output: its IP address (required: the
/// output of a channel that is not a LAN channel has none), address source, MAC and VLAN.
pub fn parse_lan_print(channel: i32, output: &str) -> Option<IpmiLan> {
    let field = |name: &str| {
        output.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    let ip_address = field("IP Address")?.parse::<Ipv4Addr>().ok()?.to_string();
    // "Static Address", "DHCP Address", "BIOS Assigned Address", "Other"; "Unspecified" is none.
    let ip_source = field("IP Address Source").and_then(|s| {
        let s = s.to_ascii_lowercase();
        IP_SOURCES
            .into_iter()
            .find(|word| s.starts_with(word))
            .map(str::to_owned)
    });
    // `MAC Address : 52:54:00:aa:bb:cc` keeps its colons after the first split.
    let mac = output.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix("MAC Address")?;
        let mac = rest
            .trim_start()
            .strip_prefix(':')?
            .trim()
            .to_ascii_lowercase();
        (unbounded_api::inventory::validate::is_mac(&mac) && mac != "00:00:00:00:00:00")
            .then_some(mac)
    });
    let vlan = field("802.1q VLAN ID")
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|v| (1..=4094).contains(v));
    Some(IpmiLan {
        channel,
        ip_address,
        ip_source,
        mac,
        vlan,
    })
}

/// SMBIOS type 42 (Management Controller Host Interface, DSP0134 with DSP0270): the first
/// Redfish-over-IP protocol record of a network host interface. `raw` is the structure as
/// `/sys/firmware/dmi/entries/42-N/raw` holds it (formatted area, then its strings). `None`
/// for another interface type, no such record, or a structure whose lengths do not add up.
pub fn parse_host_interface(raw: &[u8]) -> Option<RedfishHostInterface> {
    const NETWORK_HOST_INTERFACE: u8 = 0x40;
    const REDFISH_OVER_IP: u8 = 0x04;
    let (&kind, _) = raw.split_first()?;
    let formatted_len = usize::from(*raw.get(1)?);
    let formatted = raw.get(..formatted_len)?;
    if kind != 42 || *formatted.get(4)? != NETWORK_HOST_INTERFACE {
        return None;
    }
    let specific_len = usize::from(*formatted.get(5)?);
    let mut at = 6 + specific_len;
    let records = *formatted.get(at)?;
    at += 1;
    for _ in 0..records {
        let protocol = *formatted.get(at)?;
        let len = usize::from(*formatted.get(at + 1)?);
        let data = formatted.get(at + 2..at + 2 + len)?;
        if protocol == REDFISH_OVER_IP {
            return parse_redfish_over_ip(data);
        }
        at += 2 + len;
    }
    None
}

/// The protocol-specific data of a Redfish-over-IP record: service UUID (16 bytes), the
/// host's address (assignment type, format, address, mask), then the service's (discovery
/// type, format at 0x33, address at 0x34, mask), port (0x54, little endian), VLAN (0x56) and
/// host name (length at 0x5a).
fn parse_redfish_over_ip(data: &[u8]) -> Option<RedfishHostInterface> {
    let uuid = data.get(..16)?;
    let format = *data.get(0x33)?;
    let address: &[u8; 16] = data.get(0x34..0x44)?.try_into().ok()?;
    let service_address = match format {
        1 => IpAddr::V4(Ipv4Addr::new(
            address[0], address[1], address[2], address[3],
        )),
        2 => IpAddr::V6(Ipv6Addr::from(*address)),
        _ => return None,
    };
    let port = u16::from_le_bytes(data.get(0x54..0x56)?.try_into().ok()?);
    let hostname_len = usize::from(*data.get(0x5a).unwrap_or(&0));
    let hostname = data
        .get(0x5b..0x5b + hostname_len)
        .map(|name| {
            name.iter()
                .take_while(|b| **b != 0)
                .map(|b| char::from(*b))
                .collect::<String>()
        })
        .filter(|name| unbounded_api::inventory::bmc::is_hostname(name));
    Some(RedfishHostInterface {
        service_address: service_address.to_string(),
        port: i32::from(port),
        service_uuid: smbios_uuid(uuid),
        hostname,
    })
}

/// An SMBIOS UUID (its first three fields little endian, as SMBIOS 2.6 and later store them)
/// in the usual text form; `None` when all zeros or all ones (not set).
fn smbios_uuid(bytes: &[u8]) -> Option<String> {
    let b: &[u8; 16] = bytes.try_into().ok()?;
    if b.iter().all(|x| *x == 0) || b.iter().all(|x| *x == 0xff) {
        return None;
    }
    let hex = |range: &[u8]| range.iter().map(|x| format!("{x:02x}")).collect::<String>();
    Some(format!(
        "{}-{}-{}-{}-{}",
        hex(&[b[3], b[2], b[1], b[0]]),
        hex(&[b[5], b[4]]),
        hex(&[b[7], b[6]]),
        hex(&b[8..10]),
        hex(&b[10..16])
    ))
}

/// The first Redfish host interface among `<root>/sys/firmware/dmi/entries/42-*/raw`.
pub fn read_host_interface(root: &Path) -> Option<RedfishHostInterface> {
    let dir = root.join("sys/firmware/dmi/entries");
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("42-"))
        .map(|e| e.path().join("raw"))
        .collect();
    entries.sort();
    entries
        .iter()
        .filter_map(|raw| std::fs::read(raw).ok())
        .find_map(|raw| parse_host_interface(&raw))
}

/// Whether `<root>` has an IPMI device (a BMC behind a system interface, with the kernel's
/// `ipmi_devintf` loaded).
pub fn has_ipmi_device(root: &Path) -> bool {
    IPMI_DEVICES.iter().any(|d| root.join(d).exists())
}

/// Whether the firmware announces an IPMI system interface (SMBIOS type 38, IPMI Device
/// Information): a server with a BMC on KCS, BT or SSIF.
pub fn ipmi_interface_announced(root: &Path) -> bool {
    std::fs::read_dir(root.join("sys/firmware/dmi/entries")).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("38-"))
    })
}

/// The IPMI device on this machine (root `/`): there already, or made by loading the
/// system-interface driver and the device interface when the firmware announces a BMC (udev
/// does not load `ipmi_devintf`, and the inspection boot loads nothing it does not need).
/// Waits up to 5 s for the device to appear.
async fn ensure_ipmi_device(root: &Path) -> bool {
    if has_ipmi_device(root) {
        return true;
    }
    if !ipmi_interface_announced(root) {
        return false;
    }
    for module in ["ipmi_si", "ipmi_devintf"] {
        let load = tokio::process::Command::new("modprobe")
            .args(["-q", module])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .status();
        // A driver that cannot load leaves no device; the wait below says so.
        let _ = tokio::time::timeout(IPMITOOL_TIMEOUT, load).await;
    }
    for _ in 0..25 {
        if has_ipmi_device(root) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The first LAN channel of [`LAN_CHANNELS`] that `ipmitool` (the program and arguments of
/// `ipmitool`, in band on a machine: `["ipmitool"]`) reports with an address; a channel with
/// no address (`0.0.0.0`) only when no channel has one (it still tells the BMC's MAC).
pub async fn read_ipmi_lan(ipmitool: &[String]) -> Option<IpmiLan> {
    let (program, args) = ipmitool.split_first()?;
    let mut unaddressed = None;
    for channel in LAN_CHANNELS {
        let run = tokio::process::Command::new(program)
            .args(args)
            .args(["lan", "print", &channel.to_string()])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let Ok(Ok(output)) = tokio::time::timeout(IPMITOOL_TIMEOUT, run).await else {
            continue;
        };
        if !output.status.success() {
            continue;
        }
        let Some(lan) = parse_lan_print(channel, &String::from_utf8_lossy(&output.stdout)) else {
            continue;
        };
        if lan.ip_address != "0.0.0.0" {
            return Some(lan);
        }
        unaddressed.get_or_insert(lan);
    }
    unaddressed
}

/// The BMC section from what was read; `None` when nothing was.
pub fn facts(
    origin: FactOrigin,
    ipmi_lan: Option<IpmiLan>,
    redfish_host_interface: Option<RedfishHostInterface>,
) -> Option<BmcFacts> {
    if ipmi_lan.is_none() && redfish_host_interface.is_none() {
        return None;
    }
    Some(BmcFacts {
        origin,
        suggested_address: suggested_address(ipmi_lan.as_ref(), redfish_host_interface.as_ref()),
        ipmi_lan,
        redfish_host_interface,
    })
}

/// Reads both on the machine whose root is `root` (`/`): the host interface from sysfs, the
/// LAN channel through `ipmitool` when there is (or the firmware announces) an IPMI device.
pub async fn read(root: &Path, origin: FactOrigin) -> Option<BmcFacts> {
    let redfish = read_host_interface(root);
    let lan = if ensure_ipmi_device(root).await {
        read_ipmi_lan(&["ipmitool".to_owned()]).await
    } else {
        None
    };
    facts(origin, lan, redfish)
}

#[cfg(test)]
mod tests {
    use unbounded_testbed::bmc::smbios::host_interface_structure;

    use super::*;

    /// What `ipmitool lan print 1` printed for OpenIPMI's ipmi_sim after `lan set 1 ipsrc
    /// static`, `ipaddr` and `macaddr` (captured here).
    const IPMI_SIM: &str = "Set in Progress         : Set Complete
Auth Type Support       : NONE MD2 MD5 PASSWORD 
Auth Type Enable        : Callback : NONE MD5 
                        : User     : NONE MD5 
IP Address Source       : Static Address
IP Address              : 10.20.30.40
Subnet Mask             : 0.0.0.0
MAC Address             : 52:54:00:aa:bb:cc
SNMP Community String   : public
Default Gateway IP      : 0.0.0.0
Default Gateway MAC     : 00:00:00:00:00:00
802.1q VLAN ID          : Disabled
";

    /// The shape a server BMC prints (DHCP, a VLAN), written for this test.
    const SERVER: &str = "Set in Progress         : Set Complete
IP Address Source       : DHCP Address
IP Address              : 10.40.0.17
Subnet Mask             : 255.255.255.0
MAC Address             : B4:96:91:0A:1B:30
Default Gateway IP      : 10.40.0.1
802.1q VLAN ID          : 40
802.1q VLAN Priority    : 0
";

    /// A channel that is not configured: no address, no MAC.
    const UNCONFIGURED: &str = "IP Address Source       : Unspecified
IP Address              : 0.0.0.0
MAC Address             : 00:00:00:00:00:00
";

    #[test]
    fn lan_print_outputs() {
        let lan = |ip: &str, source: Option<&str>, mac: Option<&str>, vlan| IpmiLan {
            channel: 1,
            ip_address: ip.into(),
            ip_source: source.map(str::to_owned),
            mac: mac.map(str::to_owned),
            vlan,
        };
        let cases = [
            (
                IPMI_SIM,
                Some(lan(
                    "10.20.30.40",
                    Some("static"),
                    Some("52:54:00:aa:bb:cc"),
                    None,
                )),
            ),
            (
                SERVER,
                Some(lan(
                    "10.40.0.17",
                    Some("dhcp"),
                    Some("b4:96:91:0a:1b:30"),
                    Some(40),
                )),
            ),
            (UNCONFIGURED, Some(lan("0.0.0.0", None, None, None))),
            ("Channel 2 is not a LAN channel\n", None),
            ("IP Address : 10.1.2.3.4\n", None),
            ("IP Address : https://evil\n", None),
            ("", None),
        ];
        for (output, want) in cases {
            assert_eq!(parse_lan_print(1, output), want, "{output}");
        }
    }

    const UUID: [u8; 16] = [
        0x7b, 0xac, 0xd1, 0xc7, 0x5f, 0x8d, 0x6e, 0x4a, 0x9c, 0x2b, 0x1f, 0x0a, 0x7e, 0x3c, 0x5d,
        0x11,
    ];

    #[test]
    fn a_redfish_host_interface_is_read_from_its_structure() {
        let raw = host_interface_structure(Ipv4Addr::new(169, 254, 95, 118), 443, UUID, "bmc-1");
        assert_eq!(
            parse_host_interface(&raw),
            Some(RedfishHostInterface {
                service_address: "169.254.95.118".into(),
                port: 443,
                service_uuid: Some("c7d1ac7b-8d5f-4a6e-9c2b-1f0a7e3c5d11".into()),
                hostname: Some("bmc-1".into()),
            })
        );
    }

    #[test]
    fn a_broken_or_foreign_structure_is_nothing() {
        let good = host_interface_structure(Ipv4Addr::new(169, 254, 95, 118), 443, UUID, "bmc");
        type Edit = fn(&mut Vec<u8>);
        let cases: [(&str, Edit); 7] = [
            ("another SMBIOS type", |r| r[0] = 38),
            ("a KCS interface, not a network one", |r| r[4] = 0x02),
            ("no protocol records", |r| {
                let at = 6 + usize::from(r[5]);
                r[at] = 0;
            }),
            ("an IPMI protocol record, not Redfish", |r| {
                let at = 7 + usize::from(r[5]);
                r[at] = 0x02;
            }),
            ("a record longer than the structure", |r| {
                let at = 8 + usize::from(r[5]);
                r[at] = 0xff;
            }),
            ("a formatted length past the end", |r| r[1] = 0xff),
            ("cut short", |r| r.truncate(40)),
        ];
        for (what, edit) in cases {
            let mut raw = good.clone();
            edit(&mut raw);
            assert_eq!(parse_host_interface(&raw), None, "{what}");
        }
        assert_eq!(parse_host_interface(&[]), None);
    }

    #[test]
    fn a_hostname_with_odd_bytes_is_left_out() {
        let raw = host_interface_structure(Ipv4Addr::new(169, 254, 0, 1), 8443, UUID, "a/b");
        let hi = parse_host_interface(&raw).unwrap();
        assert_eq!((hi.port, hi.hostname), (8443, None));
    }

    #[test]
    fn facts_suggest_only_what_the_lan_channel_says() {
        let origin = FactOrigin {
            source: unbounded_api::inventory::FactSource::InBand,
            observed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        let lan = parse_lan_print(1, SERVER);
        let hi = parse_host_interface(&host_interface_structure(
            Ipv4Addr::new(169, 254, 95, 118),
            443,
            UUID,
            "",
        ));
        assert_eq!(facts(origin.clone(), None, None), None);
        let both = facts(origin.clone(), lan.clone(), hi.clone()).unwrap();
        assert_eq!(
            both.suggested_address.as_deref(),
            Some("redfish://10.40.0.17")
        );
        let only_lan = facts(origin.clone(), lan, None).unwrap();
        assert_eq!(
            only_lan.suggested_address.as_deref(),
            Some("ipmi://10.40.0.17")
        );
        let only_hi = facts(origin, None, hi).unwrap();
        assert_eq!(only_hi.suggested_address, None);
        for facts in [both, only_lan, only_hi] {
            let spec = unbounded_api::inventory::MachineInventorySpec {
                bmc: Some(facts),
                ..Default::default()
            };
            assert_eq!(unbounded_api::inventory::validate(&spec), Ok(()));
        }
    }

    #[test]
    fn the_sysfs_entries_are_searched_for_a_host_interface() {
        let root = tempfile::tempdir().unwrap();
        let entries = root.path().join("sys/firmware/dmi/entries");
        for (entry, raw) in [
            ("38-0", vec![38, 4, 0, 0, 0, 0]),
            (
                "42-0",
                host_interface_structure(Ipv4Addr::new(169, 254, 1, 2), 443, UUID, "x"),
            ),
        ] {
            std::fs::create_dir_all(entries.join(entry)).unwrap();
            std::fs::write(entries.join(entry).join("raw"), raw).unwrap();
        }
        let hi = read_host_interface(root.path()).unwrap();
        assert_eq!(hi.service_address, "169.254.1.2");
        assert!(!has_ipmi_device(root.path()));
        assert!(ipmi_interface_announced(root.path()), "type 38 is there");
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/ipmi0"), b"").unwrap();
        assert!(has_ipmi_device(root.path()));
    }
}
