//! The machine's own BMC as the machine sees it, read in band: the IPMI LAN channel's
//! configuration (through the host's IPMI system interface) and the Redfish host interface
//! (SMBIOS type 42). From them, a suggested `spec.pxe.bmc.address`.
//!
//! A suggestion only. Nothing in Unbounded acts on it: the operator (or a tool of theirs)
//! confirms it by writing the Machine's `spec.pxe.bmc` with a Secret. A discovered machine is
//! unauthenticated, so a forged report could name any address; taking it on trust would let
//! one machine point the bootserver's power calls, with a real credential, at a host of its
//! choosing.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::FactOrigin;

/// What the machine says of its BMC.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcFacts {
    /// Source and time.
    pub origin: FactOrigin,
    /// The address to confirm into `spec.pxe.bmc.address`: the LAN channel's address as
    /// `redfish://` when the firmware announces a Redfish service, `ipmi://` otherwise; absent
    /// without a LAN address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub suggested_address: Option<String>,
    /// The BMC's LAN channel, as its IPMI system interface reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipmi_lan: Option<IpmiLan>,
    /// The Redfish service the firmware announces to the host (SMBIOS type 42).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish_host_interface: Option<RedfishHostInterface>,
}

/// An IPMI LAN channel's configuration (Get LAN Configuration Parameters).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpmiLan {
    /// The channel number (1 on most servers, 2 or 8 on some).
    pub channel: i32,
    /// The BMC's IPv4 address on its management network.
    #[schemars(length(max = 15))]
    pub ip_address: String,
    /// How the BMC got it: `static`, `dhcp`, `bios` or `other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub ip_source: Option<String>,
    /// The BMC's MAC on that network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub mac: Option<String>,
    /// The 802.1q VLAN the channel tags with, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<i32>,
}

/// The Redfish-over-IP protocol record of an SMBIOS Management Controller Host Interface
/// (type 42): where the host itself reaches the BMC's Redfish service, usually a link-local
/// address on a USB or PCI network device between the host and its BMC. Not reachable from
/// the provisioning network; it says that the BMC speaks Redfish.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedfishHostInterface {
    /// The Redfish service's address on the host interface.
    #[schemars(length(max = 45))]
    pub service_address: String,
    /// Its TCP port.
    pub port: i32,
    /// The service's UUID (as Redfish's service root reports it), lower case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 36))]
    pub service_uuid: Option<String>,
    /// The service's host name, when the record names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub hostname: Option<String>,
}

/// The address an operator would put into `spec.pxe.bmc.address`, from what the machine
/// said: the LAN channel's address, as `redfish://` when the firmware announces a Redfish
/// service (the BMC serves Redfish on its management address as on the host interface) and
/// `ipmi://` otherwise. `None` without a LAN address: the host interface's own address is
/// link-local between host and BMC, of no use to the bootserver.
pub fn suggested_address(
    ipmi_lan: Option<&IpmiLan>,
    redfish: Option<&RedfishHostInterface>,
) -> Option<String> {
    let ip: IpAddr = ipmi_lan?.ip_address.parse().ok()?;
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return None;
    }
    let scheme = if redfish.is_some() { "redfish" } else { "ipmi" };
    Some(format!("{scheme}://{ip}"))
}

/// Whether `name` is a host name as [`RedfishHostInterface::hostname`] takes it: letters,
/// digits, `-` and `.`, 1 to 253 characters.
pub fn is_hostname(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// `dhcp` and the others, as [`IpmiLan::ip_source`] writes them.
pub const IP_SOURCES: [&str; 4] = ["static", "dhcp", "bios", "other"];

#[cfg(test)]
mod tests {
    use super::*;

    fn lan(ip: &str) -> IpmiLan {
        IpmiLan {
            channel: 1,
            ip_address: ip.into(),
            ip_source: Some("dhcp".into()),
            mac: None,
            vlan: None,
        }
    }

    fn host_interface() -> RedfishHostInterface {
        RedfishHostInterface {
            service_address: "169.254.95.118".into(),
            port: 443,
            service_uuid: None,
            hostname: None,
        }
    }

    #[test]
    fn the_suggestion_is_the_lan_address_in_the_scheme_the_bmc_speaks() {
        let cases = [
            (Some(lan("10.40.0.17")), None, Some("ipmi://10.40.0.17")),
            (
                Some(lan("10.40.0.17")),
                Some(host_interface()),
                Some("redfish://10.40.0.17"),
            ),
            (None, Some(host_interface()), None),
            (Some(lan("0.0.0.0")), None, None),
            (Some(lan("127.0.0.1")), None, None),
            (Some(lan("not an address")), None, None),
            (None, None, None),
        ];
        for (lan, redfish, want) in cases {
            assert_eq!(
                suggested_address(lan.as_ref(), redfish.as_ref()).as_deref(),
                want,
                "{lan:?} {redfish:?}"
            );
        }
    }
}
