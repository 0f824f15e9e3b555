//! `scenario`: one of the long VM scenarios against a running lab.

use std::time::Duration;

use unbounded_testbed::lab::{LabError, RunningLab};
use unbounded_testbed::{appliance_scenarios, scenario};

use crate::{CliError, ScenarioName};

pub(crate) fn run_scenario(name: ScenarioName, onto_disks: bool) -> Result<(), CliError> {
    let lab = RunningLab::load().ok_or_else(|| {
        CliError::Other(
            "no testbed is running: start one with `cargo run -p unbounded-testbed -- up`".into(),
        )
    })?;
    let say = |m: &str| eprintln!("testbed: {m}");
    let timeout = Duration::from_secs(420);
    let first = lab
        .machines
        .first()
        .map(|(n, _)| n.clone())
        .ok_or_else(|| CliError::Other("the testbed has no machines".into()))?;
    let run = |which: ScenarioName| -> Result<(), LabError> {
        match which {
            ScenarioName::Repave => scenario::repave(&lab, &first, timeout, &say).map(|_| ()),
            ScenarioName::Rollback => scenario::rollback(&lab, &first, timeout, &say),
            ScenarioName::Operations => scenario::operations(&lab, timeout, &say),
            ScenarioName::Pool => unbounded_testbed::pool_scenario::pool(&lab, timeout, &say),
            ScenarioName::LeaderFailover => {
                appliance_scenarios::leader_failover(&lab, 1, onto_disks, timeout, &say).map(|f| {
                    say(&format!(
                        "leader-failover: {} took over from {} in {:.1} s (bound {} s); rollout to version {} {:.0} s",
                        f.new_leader,
                        f.old_leader,
                        f.takeover.as_secs_f64(),
                        f.bound.as_secs(),
                        f.version,
                        f.rollout.as_secs_f64()
                    ));
                })
            }
            ScenarioName::BootserverRestart => {
                appliance_scenarios::bootserver_restart(&lab, &first, timeout, &say).map(|r| {
                    say(&format!(
                        "bootserver-restart: new pod Ready in {:.1} s, leases {} → {}, {first} Ready {:.0} s after its reboot",
                        r.restart.as_secs_f64(),
                        r.leases.0,
                        r.leases.1,
                        r.boot.as_secs_f64()
                    ));
                })
            }
            ScenarioName::Plugin => unbounded_testbed::plugin_scenario::plugin(
                &lab,
                &lab.kubeconfig,
                timeout,
                &say,
            ),
            ScenarioName::Disks => unbounded_testbed::disk_scenario::disks(&lab, timeout, &say).map(|_| ()),
            ScenarioName::Discovery => {
                use unbounded_testbed::discovery_scenario::{Depth, discovery};
                discovery(&lab, Depth::Full, timeout, &say).map(|f| {
                    for (machine, took) in &f.discovered {
                        say(&format!(
                            "discovery: {machine} discovered {:.0} s after power-on",
                            took.as_secs_f64()
                        ));
                    }
                    if let Some(took) = f.claimed_to_running {
                        say(&format!(
                            "discovery: pool created → claimed Machine Running with a Ready Node in {:.0} s",
                            took.as_secs_f64()
                        ));
                    }
                })
            }
            ScenarioName::InPlace => {
                unbounded_testbed::in_place_scenario::in_place(&lab, timeout, &say)
            }
            ScenarioName::Kubelet => unbounded_testbed::kubelet_scenario::kubelet(
                &lab,
                &lab.dir.join("images"),
                timeout,
                &say,
            )
            .map(|f| {
                for (what, steps) in [("upgrade", &f.upgrade), ("rollback", &f.rollback)] {
                    let line: Vec<String> = steps
                        .iter()
                        .map(|(m, at)| format!("{m} {:.0} s", at.as_secs_f64()))
                        .collect();
                    say(&format!("kubelet: {what}: {}", line.join(", ")));
                }
            }),
            ScenarioName::Capi => {
                use unbounded_testbed::capi_scenario::{CapiPaths, capi};
                let paths = CapiPaths {
                    kubeconfig: &lab.kubeconfig,
                    kubectl: &lab.kubectl,
                    dir: &lab.dir,
                };
                capi(&lab, paths, timeout, &say).map(|f| {
                    say("capi: step durations:");
                    for (name, took) in &f.steps {
                        say(&format!("capi:   {:>6.0} s  {name}", took.as_secs_f64()));
                    }
                })
            }
            ScenarioName::Ipv6 => {
                use unbounded_testbed::ipv6_scenario::{Ipv6Depth, ipv6};
                ipv6(&lab, &lab.dir, Ipv6Depth::Full, timeout, &say).map(|f| {
                    for (node, ips) in &f.nodes {
                        say(&format!("ipv6: {node} InternalIPs {ips:?}"));
                    }
                    say(&format!(
                        "ipv6: {} DHCPv6 answers captured; reboot to Ready {:.0} s",
                        f.dhcp6_replies,
                        f.reboot.unwrap_or_default().as_secs_f64()
                    ));
                })
            }
            ScenarioName::All => Ok(()),
        }
    };
    match name {
        ScenarioName::All => {
            for which in [
                ScenarioName::Repave,
                ScenarioName::Rollback,
                ScenarioName::Operations,
            ] {
                run(which)?;
            }
        }
        one => run(one)?,
    }
    say("scenario passed");
    Ok(())
}
