//! The agent's read of its BMC's LAN channel (`read_ipmi_lan`: `ipmitool lan print` on the
//! channels a server's BMC uses) against OpenIPMI's `ipmi_sim`, a real BMC emulator whose LAN
//! configuration is set first with `ipmitool lan set`, as an administrator (or the BMC's
//! DHCP client) would have set it. On a machine the same `ipmitool` talks to the BMC through
//! the kernel's IPMI device; here it reaches the emulator over IPMI-over-LAN (`-I lan`): the
//! commands and their answers are the same, the transport is not what is tested.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::process::Command;

use unbounded_agent::inventory::bmc::read_ipmi_lan;
use unbounded_testbed::bmc::IpmiSim;

const USER: &str = "admin";
const PASSWORD: &str = "lan-test-pw";

/// `ipmitool` over IPMI-over-LAN to a BMC on loopback `port`, with `extra` options.
fn ipmitool_at(port: &str, extra: &[&str]) -> Vec<String> {
    let base = ["ipmitool", "-I", "lan", "-H", "127.0.0.1", "-p", port];
    let login = ["-U", USER, "-P", PASSWORD];
    base.iter()
        .chain(&login)
        .chain(extra)
        .map(|s| (*s).to_owned())
        .collect()
}

fn ipmitool(bmc: &IpmiSim) -> Vec<String> {
    ipmitool_at(&bmc.port.to_string(), &[])
}

fn lan_set(bmc: &IpmiSim, args: &[&str]) {
    let command = ipmitool(bmc);
    let output = Command::new(&command[0])
        .args(&command[1..])
        .args(["lan", "set", "1"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "lan set {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_bmc_lan_channel_gives_its_address_and_mac() {
    let bmc = IpmiSim::start("ub-bmc-lan-test", USER, PASSWORD).unwrap();
    // Not configured yet: the channel answers with no address; its MAC unset too.
    let unset = read_ipmi_lan(&ipmitool(&bmc)).await.unwrap();
    assert_eq!((unset.channel, unset.ip_address.as_str()), (1, "0.0.0.0"));
    assert_eq!(unset.mac, None);

    lan_set(&bmc, &["ipsrc", "static"]);
    lan_set(&bmc, &["ipaddr", "10.40.0.17"]);
    lan_set(&bmc, &["macaddr", "52:54:00:B0:0C:17"]);
    let lan = read_ipmi_lan(&ipmitool(&bmc)).await.unwrap();
    assert_eq!(lan.channel, 1);
    assert_eq!(lan.ip_address, "10.40.0.17");
    assert_eq!(lan.ip_source.as_deref(), Some("static"));
    assert_eq!(lan.mac.as_deref(), Some("52:54:00:b0:0c:17"));
    assert_eq!(
        unbounded_api::inventory::bmc::suggested_address(Some(&lan), None).as_deref(),
        Some("ipmi://10.40.0.17")
    );
}

#[tokio::test]
async fn a_bmc_that_does_not_answer_gives_nothing() {
    // Nothing listens on this port (the BMC is gone); every channel times out or fails.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port().to_string();
    drop(socket);
    let command = ipmitool_at(&port, &["-R", "1", "-N", "1"]);
    assert_eq!(read_ipmi_lan(&command).await, None);
    // Nor does a program that is not there.
    assert_eq!(
        read_ipmi_lan(&["/nonexistent/ipmitool".to_owned()]).await,
        None
    );
}
