//! The agent's LLDP capture against a real LLDP sender: Debian's `lldpd` on one end of a veth
//! pair in a namespace the test creates (the "switch"), the agent's packet sockets on the
//! other (the "server"). What the capture hears is what lldpd announced: its chassis MAC,
//! the port's name, the system name and the port description set in its configuration.
//!
//! They need root (namespaces, packet sockets) and `lldpd` (scripts/install-deps.sh). Without
//! them each test fails and says what is missing, never passes without checking anything.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use unbounded_agent::inventory::lldp_capture::{Listener, attach, capture};
use unbounded_api::inventory::{FactOrigin, FactSource, LldpNeighbour, Nic, NicFacts};
use unbounded_testbed::lldp::Lldpd;
use unbounded_testbed::netns::{Link, Netns};

const SWITCH_MAC: &str = "02:11:22:33:44:55";
const SERVER_MAC: &str = "52:54:00:12:34:56";

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if uid != "0" {
        return Some("not root".into());
    }
    let found = Command::new("sh")
        .args(["-c", "command -v lldpd"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!found).then(|| "lldpd is not installed (scripts/install-deps.sh)".into())
}

fn require(test: &str) {
    if let Some(why) = unavailable() {
        panic!("{test}: needs root and lldpd: {why}");
    }
}

/// The switch's namespace (`pxe0`, MAC [`SWITCH_MAC`]) and the server's (`eth0`).
fn link() -> Link {
    let link = Link::new("10.98.0.1/24", SERVER_MAC).unwrap();
    let sw = &link.server;
    sw.ip(&["link", "set", &link.server_if, "down"]).unwrap();
    sw.ip(&["link", "set", &link.server_if, "address", SWITCH_MAC])
        .unwrap();
    sw.ip(&["link", "set", &link.server_if, "up"]).unwrap();
    link
}

/// Runs the capture on a thread inside `ns`.
fn capture_in(
    ns: &Netns,
    listeners: Vec<Listener>,
    wait: Duration,
) -> BTreeMap<String, LldpNeighbour> {
    ns.spawn_inside(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(capture(&listeners, wait))
    })
    .unwrap()
    .join()
    .unwrap()
    .unwrap()
}

fn nic(name: &str, mac: &str) -> Nic {
    Nic {
        name: name.into(),
        mac: mac.into(),
        driver: None,
        speed_mbps: None,
        link: true,
        pxe_booted: true,
        lldp: None,
    }
}

/// The capture hears lldpd's frame and the NIC of the inventory names the switch port.
#[test]
fn the_switch_port_lldpd_announces_is_heard() {
    require("the_switch_port_lldpd_announces_is_heard");
    let link = link();
    let lldpd = Lldpd::start(
        link.server.name(),
        &link.server_if,
        "leaf-test-1",
        Some("server r1u7"),
    )
    .unwrap();
    let listeners = vec![Listener {
        interface: link.client_if.clone(),
        mac: SERVER_MAC.into(),
    }];
    let heard = capture_in(&link.client, listeners, Duration::from_secs(35));
    let want = LldpNeighbour {
        chassis_id: SWITCH_MAC.into(),
        port_id: link.server_if.clone(),
        system_name: Some("leaf-test-1".into()),
        port_description: Some("server r1u7".into()),
    };
    assert_eq!(
        heard.get(&link.client_if),
        Some(&want),
        "heard {heard:?}\nlldpd's log:\n{}",
        lldpd.log()
    );

    let mut nics = NicFacts {
        origin: FactOrigin {
            source: FactSource::InBand,
            observed_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        },
        interfaces: vec![nic(&link.client_if, SERVER_MAC)],
    };
    attach(&mut nics, &heard);
    assert_eq!(nics.interfaces[0].lldp, Some(want));
}

/// A NIC with link but no sender on its wire is left without a neighbour once the wait is
/// over, while the NIC beside it still hears its switch; an interface that does not exist
/// is left out. The capture returns (it is bounded) with what it heard.
#[test]
fn a_silent_link_gets_no_neighbour_and_does_not_hold_the_others() {
    require("a_silent_link_gets_no_neighbour_and_does_not_hold_the_others");
    let link = link();
    let _lldpd = Lldpd::start(
        link.server.name(),
        &link.server_if,
        "leaf-test-2",
        Some("server r1u8"),
    )
    .unwrap();
    // A second veth pair inside the server's namespace: link up, nobody sending.
    let server = &link.client;
    server
        .ip(&[
            "link", "add", "eth1", "type", "veth", "peer", "name", "quiet1",
        ])
        .unwrap();
    server
        .ip(&["link", "set", "eth1", "address", "52:54:00:12:34:57"])
        .unwrap();
    server.ip(&["link", "set", "eth1", "up"]).unwrap();
    server.ip(&["link", "set", "quiet1", "up"]).unwrap();
    let listeners = vec![
        Listener {
            interface: link.client_if.clone(),
            mac: SERVER_MAC.into(),
        },
        Listener {
            interface: "eth1".into(),
            mac: "52:54:00:12:34:57".into(),
        },
        Listener {
            interface: "nosuch9".into(),
            mac: "52:54:00:12:34:58".into(),
        },
    ];
    let heard = capture_in(server, listeners, Duration::from_secs(8));
    assert_eq!(
        heard.keys().collect::<Vec<_>>(),
        vec![&link.client_if],
        "{heard:?}"
    );
    assert_eq!(
        heard[&link.client_if].system_name.as_deref(),
        Some("leaf-test-2")
    );
}
