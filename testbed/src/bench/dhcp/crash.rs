//! Ours through a crash: perfdhcp runs DORA against our server, which gets `kill -9` in
//! the middle of the run and is started again on the same lease file. Then every client
//! acknowledged before the crash runs DORA again and must get the address it was
//! acknowledged, and fresh clients must get addresses nobody was acknowledged: every
//! acknowledged lease survived, and no address went to two clients.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use super::super::bed::{Bed, BedError};
use super::super::clients::CheckSummary;
use super::super::clients::dhcp::{format_mac, parse_mac};
use super::super::peers::NET;
use super::super::proc::{ProcError, run_client};
use super::super::report::Report;

/// New clients per second of the crash run at most. The bench's pool holds 65,279
/// addresses; unpaced, our server acknowledged all of them within the 10 s before the kill
/// and the fresh clients after the restart found none (each waiting out its retries). At
/// this rate a 2 × 10 s run uses at most 40,000.
const CRASH_RATE: u32 = 2_000;

/// What the check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Clients acknowledged before the crash.
    pub acked: usize,
    /// Addresses acknowledged to more than one client before the crash.
    pub duplicated: Vec<Ipv4Addr>,
    /// Clients that did not get their acknowledged address back: (MAC, before, after).
    pub lost: Vec<(String, Ipv4Addr, Option<Ipv4Addr>)>,
    /// Fresh clients given an address acknowledged to another client before the crash.
    pub collisions: Vec<(String, Ipv4Addr)>,
    /// Fresh clients that got an address.
    pub fresh_served: usize,
}

impl Verdict {
    /// No lease lost, no address given twice.
    pub fn clean(&self) -> bool {
        self.duplicated.is_empty() && self.lost.is_empty() && self.collisions.is_empty()
    }
}

/// Judges the check: `acked` are perfdhcp's acknowledged leases in the order received
/// (client identifier or MAC, address).
pub fn judge(acked: &[(String, String)], after: &CheckSummary) -> Verdict {
    // The last address each client was acknowledged.
    let mut last: HashMap<String, Ipv4Addr> = HashMap::new();
    for (id, ip) in acked {
        if let (Some(mac), Ok(ip)) = (parse_mac(id), ip.parse()) {
            last.insert(format_mac(&mac), ip);
        }
    }
    let mut holders: HashMap<Ipv4Addr, HashSet<&str>> = HashMap::new();
    for (mac, ip) in &last {
        holders.entry(*ip).or_default().insert(mac);
    }
    let mut duplicated: Vec<Ipv4Addr> = holders
        .iter()
        .filter(|(_, macs)| macs.len() > 1)
        .map(|(ip, _)| *ip)
        .collect();
    duplicated.sort();
    let again: HashMap<&str, Option<Ipv4Addr>> = after
        .known
        .iter()
        .map(|(m, ip)| (m.as_str(), *ip))
        .collect();
    let mut lost: Vec<(String, Ipv4Addr, Option<Ipv4Addr>)> = last
        .iter()
        .filter_map(|(mac, before)| {
            let now = again.get(mac.as_str()).copied().flatten();
            (now != Some(*before)).then(|| (mac.clone(), *before, now))
        })
        .collect();
    lost.sort();
    let mut collisions: Vec<(String, Ipv4Addr)> = after
        .fresh
        .iter()
        .filter_map(|(mac, ip)| {
            let ip = (*ip)?;
            holders.contains_key(&ip).then(|| (mac.clone(), ip))
        })
        .collect();
    collisions.sort();
    Verdict {
        acked: last.len(),
        duplicated,
        lost,
        collisions,
        fresh_served: after.fresh.iter().filter(|(_, ip)| ip.is_some()).count(),
    }
}

/// Runs the crash test on our server: new clients run DORA, 32 at a time, for twice
/// `seconds`; the server gets `kill -9` after `seconds`. (Our own relay client rather than
/// perfdhcp: perfdhcp names a lease's client only by the identifier the server echoes.)
pub fn run(
    bed: &Bed,
    seconds: u32,
    report: &mut Report,
    say: &dyn Fn(String),
) -> Result<(), BedError> {
    let mut daemon = bed.start_ours(&[], false)?;
    say(format!(
        "dhcp crash: DORA for new clients, 32 in flight, at most {CRASH_RATE}/s, for {} s; kill -9 after {seconds} s",
        2 * seconds
    ));
    let exe = std::env::current_exe().map_err(|source| BedError::Io {
        what: "finding this program".into(),
        source,
    })?;
    let client = |sub: &str| {
        let mut command = bed.client(&exe.display().to_string());
        command
            .args(["bench-client", sub, "--server", NET.server])
            .args(["--relay", NET.client]);
        command
    };
    let mut load = client("dhcp-acks");
    load.args(["--seconds", &(2 * seconds).to_string()])
        .args(["--rate", &CRASH_RATE.to_string()]);
    let acked_text = std::thread::scope(|scope| {
        let running = scope.spawn(|| run_client(load));
        std::thread::sleep(Duration::from_secs(u64::from(seconds)));
        daemon.kill_hard();
        running.join()
    })
    .map_err(|_| ProcError::Failed {
        command: "bench-client dhcp-acks".into(),
        status: "panicked".into(),
        output: String::new(),
    })??;
    drop(daemon);
    let unreadable = |what: &str, text: &str, e: serde_json::Error| ProcError::Failed {
        command: format!("bench-client {what}"),
        status: format!("unreadable output: {e}"),
        output: text.to_owned(),
    };
    let acked: Vec<(String, Ipv4Addr)> = serde_json::from_str(acked_text.trim())
        .map_err(|e| unreadable("dhcp-acks", &acked_text, e))?;
    let acked: Vec<(String, String)> = acked
        .into_iter()
        .map(|(mac, ip)| (mac, ip.to_string()))
        .collect();
    let restarted = bed.start_ours(&[], true)?;
    let known = bed.dir.join("crash-acked.txt");
    let lines: String = acked
        .iter()
        .map(|(id, ip)| format!("{id} {ip}\n"))
        .collect();
    std::fs::write(&known, lines).map_err(|source| BedError::Io {
        what: format!("writing {}", known.display()),
        source,
    })?;
    let fresh = u32::try_from(acked.len().clamp(10, 2000)).unwrap_or(2000);
    let mut check = client("dhcp-check");
    check
        .arg("--known")
        .arg(&known)
        .args(["--fresh", &fresh.to_string()]);
    let stdout = run_client(check)?;
    drop(restarted);
    let after: CheckSummary =
        serde_json::from_str(stdout.trim()).map_err(|e| unreadable("dhcp-check", &stdout, e))?;
    let verdict = judge(&acked, &after);
    for (name, value) in [
        ("acked_before_crash", verdict.acked),
        ("lost", verdict.lost.len()),
        ("duplicated", verdict.duplicated.len()),
        ("collisions", verdict.collisions.len()),
        ("fresh_served", verdict.fresh_served),
    ] {
        report.figure(format!("dhcp.crash.ours.{name}"), value as f64);
    }
    let line = format!(
        "dhcp crash (ours, kill -9 mid-run, restarted on the same lease file): {} clients acknowledged before the crash, {} did not get their address back, {} addresses acknowledged twice, {} of {} fresh clients given an acknowledged address",
        verdict.acked,
        verdict.lost.len(),
        verdict.duplicated.len(),
        verdict.collisions.len(),
        after.fresh.len()
    );
    say(line.clone());
    report.note(line);
    if !verdict.clean() {
        report.problem(format!(
            "dhcp crash: leases lost or given twice; first lost: {:?}; first duplicated: {:?}; first collision: {:?}",
            verdict.lost.first(),
            verdict.duplicated.first(),
            verdict.collisions.first()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    fn ip(s: &str) -> Option<Ipv4Addr> {
        s.parse().ok()
    }

    #[test]
    fn a_clean_restart() {
        let before = acked(&[
            ("01000c01020304", "10.97.1.0"),
            ("01000c01020305", "10.97.1.1"),
            ("01000c01020304", "10.97.1.0"),
        ]);
        let after = CheckSummary {
            known: vec![
                ("00:0c:01:02:03:04".into(), ip("10.97.1.0")),
                ("00:0c:01:02:03:05".into(), ip("10.97.1.1")),
            ],
            fresh: vec![("02:cc:00:00:00:00".into(), ip("10.97.1.2"))],
        };
        let v = judge(&before, &after);
        assert!(v.clean(), "{v:?}");
        assert_eq!((v.acked, v.fresh_served), (2, 1));
    }

    #[test]
    fn a_lost_lease_shows_twice() {
        // The server forgot 10.97.1.1: its client gets another address, and a fresh client
        // gets 10.97.1.1.
        let before = acked(&[
            ("01000c01020304", "10.97.1.0"),
            ("01000c01020305", "10.97.1.1"),
        ]);
        let after = CheckSummary {
            known: vec![
                ("00:0c:01:02:03:04".into(), ip("10.97.1.0")),
                ("00:0c:01:02:03:05".into(), ip("10.97.1.7")),
            ],
            fresh: vec![("02:cc:00:00:00:00".into(), ip("10.97.1.1"))],
        };
        let v = judge(&before, &after);
        assert!(!v.clean());
        assert_eq!(
            v.lost,
            vec![(
                "00:0c:01:02:03:05".into(),
                Ipv4Addr::new(10, 97, 1, 1),
                ip("10.97.1.7")
            )]
        );
        assert_eq!(
            v.collisions,
            vec![("02:cc:00:00:00:00".into(), Ipv4Addr::new(10, 97, 1, 1))]
        );
    }

    #[test]
    fn one_address_to_two_clients_before_the_crash() {
        let before = acked(&[
            ("01000c01020304", "10.97.1.0"),
            ("01000c01020305", "10.97.1.0"),
        ]);
        let after = CheckSummary {
            known: vec![
                ("00:0c:01:02:03:04".into(), ip("10.97.1.0")),
                ("00:0c:01:02:03:05".into(), ip("10.97.1.0")),
            ],
            fresh: vec![],
        };
        let v = judge(&before, &after);
        assert_eq!(v.duplicated, vec![Ipv4Addr::new(10, 97, 1, 0)]);
        assert!(!v.clean());
    }

    #[test]
    fn a_client_without_an_answer_after_the_restart_is_lost() {
        let before = acked(&[("01000c01020304", "10.97.1.0")]);
        let after = CheckSummary {
            known: vec![("00:0c:01:02:03:04".into(), None)],
            fresh: vec![],
        };
        assert_eq!(judge(&before, &after).lost.len(), 1);
    }
}
