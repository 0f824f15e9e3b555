//! `scenario ipv6`, on a lab started with `up --host-binaries --ipv6-only` (the machines
//! provisioned over IPv6 alone) or `--dual-stack` (over IPv4, with their IPv6 addresses
//! from DHCPv6 too):
//!
//! 1. Every lab Machine reserves an IPv6 address (and, dual stack, an IPv4 one).
//! 2. Every Node is Ready and registered with exactly those addresses as its `InternalIP`s,
//!    the API server's family first (kubelet took the agent's `--node-ip`: its address
//!    toward the API server, and the other family's on the same interface).
//! 3. The provisioning bridge's capture holds DHCPv6 from the bootserver, and, IPv6-only,
//!    no DHCPv4 answer from anyone.
//! 4. A `reboot` of the first machine: the whole boot again over IPv6 (OVMF's PXEv6, iPXE's
//!    DHCPv6, the script, the TPM attestation and the credentials), back to Ready on a new
//!    boot with the same address: the reservation passed from the OS's DUID to the
//!    firmware's and back.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::lab::BRIDGE_CAPTURE;
use crate::lab::base::LabError;
use crate::scenario::{Lab, get, operation, ready_on_new_boot, step, wait_complete, wait_until};

/// How much of the scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Depth {
    /// The Nodes, the wire, and the first machine's reboot.
    Full,
    /// CI's reduced form (the end-to-end test binary): the Nodes and the wire.
    Reduced,
}

/// What the scenario saw.
#[derive(Debug)]
pub struct Ipv6Findings {
    /// Each Node and its `InternalIP`s.
    pub nodes: Vec<(String, Vec<IpAddr>)>,
    /// DHCPv6 packets the bootserver sent, as captured.
    pub dhcp6_replies: usize,
    /// The first machine's reboot to a Ready Node ([`Ipv6Depth::Full`]).
    pub reboot: Option<Duration>,
}

/// Runs the scenario; `lab_dir` holds the bridge's capture.
pub fn ipv6(
    lab: &Lab,
    lab_dir: &Path,
    depth: Ipv6Depth,
    timeout: Duration,
    say: &dyn Fn(&str),
) -> Result<Ipv6Findings, LabError> {
    let names = lab.machine_names();
    let first = names.first().cloned().ok_or_else(|| step("no machines"))?;
    let mut nodes = Vec::new();
    let mut ipv6_only = true;
    for name in &names {
        let reserved = reserved_addresses(lab, name)?;
        ipv6_only &= reserved.len() == 1;
        wait_until(&format!("Node {name} Ready"), timeout, || {
            let ready = get(
                lab,
                "node",
                name,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            (ready == "True", ready)
        })?;
        let addresses = get(
            lab,
            "node",
            name,
            "{range .status.addresses[?(@.type==\"InternalIP\")]}{.address}{\"\\n\"}{end}",
        );
        let internal = node_addresses(&addresses)?;
        if internal != reserved {
            return Err(step(format!(
                "Node {name} registered with {addresses:?}, not exactly its reserved {reserved:?}"
            )));
        }
        say(&format!("ipv6: Node {name} Ready at {reserved:?}"));
        nodes.push((name.clone(), reserved));
    }

    let capture = lab_dir.join(BRIDGE_CAPTURE);
    let dhcp4 = captured(&capture, "udp src port 67")?;
    if ipv6_only && dhcp4 != 0 {
        return Err(step(format!(
            "{dhcp4} DHCPv4 answers on an IPv6-only provisioning network ({})",
            capture.display()
        )));
    }
    let dhcp6_replies = captured(&capture, "ip6 and udp src port 547")?;
    if dhcp6_replies == 0 {
        return Err(step(format!(
            "no DHCPv6 answer in the bridge's capture ({})",
            capture.display()
        )));
    }
    say(&format!(
        "ipv6: the bridge carried {dhcp6_replies} DHCPv6 answers and {dhcp4} DHCPv4 ones"
    ));

    if depth == Ipv6Depth::Reduced {
        return Ok(Ipv6Findings {
            nodes,
            dhcp6_replies,
            reboot: None,
        });
    }
    say(&format!(
        "ipv6: reboot {first} (the whole network boot again)"
    ));
    let boot = get(lab, "machine", &first, "{.status.agent.bootID}");
    let node_boot = get(lab, "node", &first, "{.status.nodeInfo.bootID}");
    let started = Instant::now();
    // A name of its own: a second run of the scenario must not find the first's Complete.
    let name = format!(
        "tb-ipv6-reboot-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    operation(lab, &name, &first, "reboot", "")?;
    wait_complete(lab, &name, timeout)?;
    wait_until(&format!("{first} Ready on a new boot"), timeout, || {
        ready_on_new_boot(lab, &first, &boot, &node_boot)
    })?;
    let reboot = started.elapsed();
    let again = node_addresses(&get(
        lab,
        "node",
        &first,
        "{range .status.addresses[?(@.type==\"InternalIP\")]}{.address}{\"\\n\"}{end}",
    ))?;
    let before = nodes.first().map(|(_, ips)| ips.clone());
    if Some(&again) != before.as_ref() {
        return Err(step(format!(
            "{first} came back with {again:?}, not {before:?}"
        )));
    }
    say(&format!(
        "ipv6: {first} Ready again {:.0} s after the reboot was asked, at the same addresses",
        reboot.as_secs_f64()
    ));
    Ok(Ipv6Findings {
        nodes,
        dhcp6_replies,
        reboot: Some(reboot),
    })
}

/// The Machine's reservations as its Node should list them: `spec.pxe.ipv4` first when
/// it has one (the lab's API server is reached over IPv4 then), then `spec.pxe.ipv6`;
/// refused without an IPv6 one (a lab started without `--ipv6-only` or `--dual-stack`).
fn reserved_addresses(lab: &Lab, name: &str) -> Result<Vec<IpAddr>, LabError> {
    let v6 = get(lab, "machine", name, "{.spec.pxe.ipv6}");
    let v4 = get(lab, "machine", name, "{.spec.pxe.ipv4}");
    expected_addresses(&v4, &v6).ok_or_else(|| {
        step(format!(
            "Machine {name} reserves ipv6 {v6:?} and ipv4 {v4:?}: scenario ipv6 needs a lab started with `up --host-binaries --ipv6-only` or `--dual-stack`"
        ))
    })
}

/// `[v4, v6]` or `[v6]` from the Machine's fields; `None` without a valid IPv6 one.
fn expected_addresses(v4: &str, v6: &str) -> Option<Vec<IpAddr>> {
    let v6: std::net::Ipv6Addr = v6.parse().ok()?;
    let v4 = if v4.is_empty() {
        None
    } else {
        Some(v4.parse::<std::net::Ipv4Addr>().ok()?)
    };
    Some(
        v4.map(IpAddr::V4)
            .into_iter()
            .chain([IpAddr::V6(v6)])
            .collect(),
    )
}

/// The addresses of a `jsonpath` list, one per line.
fn node_addresses(lines: &str) -> Result<Vec<IpAddr>, LabError> {
    lines
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim()
                .parse()
                .map_err(|_| step(format!("a Node address that is none: {l:?}")))
        })
        .collect()
}

/// How many packets of the capture match `filter` (tcpdump reads it).
fn captured(capture: &Path, filter: &str) -> Result<usize, LabError> {
    let out = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(capture)
        .arg(filter)
        .output()
        .map_err(|e| step(format!("tcpdump -r {}: {e}", capture.display())))?;
    if !out.status.success() {
        return Err(step(format!(
            "tcpdump -r {} '{filter}': {}",
            capture.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_parsed_one_per_line_and_garbage_is_refused() {
        assert_eq!(
            node_addresses("fd00:99::21\n").unwrap(),
            vec!["fd00:99::21".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            node_addresses("10.99.0.21\nfd00:99::21\n").unwrap().len(),
            2
        );
        assert!(node_addresses("").unwrap().is_empty());
        assert!(node_addresses("not-an-address").is_err());
    }

    #[test]
    fn a_node_lists_the_api_servers_family_first() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            expected_addresses("", "fd00:99::21"),
            Some(vec![ip("fd00:99::21")])
        );
        assert_eq!(
            expected_addresses("10.99.0.21", "fd00:99::21"),
            Some(vec![ip("10.99.0.21"), ip("fd00:99::21")])
        );
        assert_eq!(expected_addresses("10.99.0.21", ""), None);
        assert_eq!(expected_addresses("bad", "fd00:99::21"), None);
    }
}
