//! Where a reboot's time goes: the stages a machine passes through between a `reboot`
//! operation and its Node Ready again, seen on the serial console (host time, polled) and
//! through the API; and the agent's own part of a boot in the guest kernel's timestamps.

use std::time::Duration;

/// A stage boundary of a reboot, in the order a machine passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RebootMark {
    /// The agent starts the reboot the operation asked for (its old boot).
    Asked,
    /// The old boot's kernel restarts the machine: everything stopped and unmounted.
    Restarting,
    /// iPXE (the machine's firmware) prints its banner on the new boot.
    Firmware,
    /// systemd starts the new boot's host OS (the kernel is quiet on the console).
    HostOs,
    /// The agent starts in the new boot's host OS.
    Agent,
    /// The agent has started the node container.
    Container,
    /// The Node is Ready on the new boot (from the API, not the console).
    Ready,
}

impl RebootMark {
    fn label(self) -> &'static str {
        match self {
            Self::Asked => "agent reboots",
            Self::Restarting => "old boot ended",
            Self::Firmware => "iPXE",
            Self::HostOs => "host OS",
            Self::Agent => "agent",
            Self::Container => "container",
            Self::Ready => "Ready",
        }
    }

    /// The mark a console line of the reboot of `node` for `operation` is, if any.
    fn of_line(line: &str, node: &str, operation: &str) -> Option<Self> {
        if line.contains("rebooting for ") && line.split_whitespace().any(|w| w == operation) {
            Some(Self::Asked)
        } else if line.contains("reboot: Restarting system") {
            Some(Self::Restarting)
        } else if line.contains("Open Source Network Boot Firmware") {
            Some(Self::Firmware)
        } else if line.contains("Welcome to") {
            Some(Self::HostOs)
        } else if line.contains("unbounded-agent starting") {
            Some(Self::Agent)
        } else if line.contains(&format!("node container {node} started")) {
            Some(Self::Container)
        } else {
            None
        }
    }
}

/// When each [`RebootMark`] of one reboot was first seen, as time since the operation was
/// created.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebootTimeline {
    /// In the order of the marks (a mark never seen is absent).
    pub seen: Vec<(RebootMark, Duration)>,
}

impl RebootTimeline {
    /// Notes the marks among the console lines written since the operation was created
    /// (`lines`) that are new, at `at`. A mark earlier than one already seen is ignored, and
    /// so is a new boot's mark before the old boot was seen ending (the old boot's own agent
    /// and container lines are not the new boot's).
    pub fn observe<'a>(
        &mut self,
        lines: impl Iterator<Item = &'a str>,
        at: Duration,
        node: &str,
        operation: &str,
    ) {
        for line in lines {
            if let Some(mark) = RebootMark::of_line(line, node, operation) {
                self.note(mark, at);
            }
        }
    }

    /// Notes `mark` at `at` unless it or a later mark was already seen.
    pub fn note(&mut self, mark: RebootMark, at: Duration) {
        let old_boot_ended = self
            .seen
            .iter()
            .any(|(seen, _)| *seen <= RebootMark::Restarting);
        let in_order = self.seen.iter().all(|(seen, _)| *seen < mark);
        if in_order && (mark <= RebootMark::Restarting || old_boot_ended) {
            self.seen.push((mark, at));
        }
    }
}

impl std::fmt::Display for RebootTimeline {
    /// `agent reboots 2.0 s, old boot ended +31.0 s, … Ready +20.0 s`: each stage's length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut previous = Duration::ZERO;
        for (index, (mark, at)) in self.seen.iter().enumerate() {
            let sign = if index == 0 { "" } else { "+" };
            let separator = if index == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}{} {sign}{:.1} s",
                mark.label(),
                at.saturating_sub(previous).as_secs_f64()
            )?;
            previous = *at;
        }
        Ok(())
    }
}

/// The agent's part of a machine's last boot, read from its serial console: from the agent's
/// start to its node container running, in the guest kernel's own timestamps (the firmware,
/// iPXE, the kernel and the host OS before the agent are what a reboot costs with or without
/// a disk, and under TCG they vary with the host's load by tens of seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentPhase {
    /// Seconds from the agent's start to the container running.
    pub to_container: f64,
    /// Whether the node image was fetched and unpacked on that boot.
    pub fetched: bool,
}

impl std::fmt::Display for AgentPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.fetched {
            "node image fetched and unpacked"
        } else {
            "no download"
        };
        write!(
            f,
            "agent start → container running {:.1} s ({how})",
            self.to_container
        )
    }
}

/// [`AgentPhase`] of the last boot in `console`, if the agent started and then started the
/// container of `node`.
pub fn last_agent_phase(console: &str, node: &str) -> Option<AgentPhase> {
    let stamped = |line: &str| -> Option<f64> {
        let open = line.find('[')?;
        let rest = &line[open + 1..];
        let close = rest.find(']')?;
        rest[..close].trim().parse().ok()
    };
    let lines: Vec<&str> = console.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.contains("unbounded-agent starting"))?;
    let started_at = stamped(lines[start])?;
    let container = format!("node container {node} started");
    let mut fetched = false;
    for line in &lines[start..] {
        fetched |= line.contains("node image") && line.contains("fetched");
        if line.contains(&container) {
            return Some(AgentPhase {
                to_container: stamped(line)? - started_at,
                fetched,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn a_reboots_stages_in_order_from_its_console() {
        let (node, operation) = ("machine-1", "tb-disks-reboot-disk");
        let lines: Vec<&str> = TWO_BOOTS.lines().collect();
        // What the console printed after the operation was created, as successive polls
        // read it: the agent's reboot, the kernel's restart, iPXE and the new boot.
        let since = [
            lines[3],
            "[  270.1] reboot: Restarting system\r",
            lines[4],
            "Welcome to \x1b[1mDebian GNU/Linux 12 (bookworm)\x1b[0m!\r",
            lines[5],
            lines[6],
            lines[7],
        ];
        let mut timeline = RebootTimeline::default();
        for (polled, seconds) in [(1, 2), (2, 30), (3, 33), (4, 36), (5, 40), (7, 60)] {
            timeline.observe(
                since[..polled].iter().copied(),
                at(seconds),
                node,
                operation,
            );
        }
        timeline.note(RebootMark::Ready, at(75));
        assert_eq!(
            timeline.seen,
            vec![
                (RebootMark::Asked, at(2)),
                (RebootMark::Restarting, at(30)),
                (RebootMark::Firmware, at(33)),
                (RebootMark::HostOs, at(36)),
                (RebootMark::Agent, at(40)),
                (RebootMark::Container, at(60)),
                (RebootMark::Ready, at(75)),
            ]
        );
        assert_eq!(
            timeline.to_string(),
            "agent reboots 2.0 s, old boot ended +28.0 s, iPXE +3.0 s, host OS +3.0 s, agent +4.0 s, container +20.0 s, Ready +15.0 s"
        );
    }

    #[test]
    fn the_old_boots_own_lines_are_not_the_new_boots() {
        let lines: Vec<&str> = TWO_BOOTS.lines().collect();
        let mut timeline = RebootTimeline::default();
        // The old boot's agent and container, seen before its end.
        timeline.observe(
            lines[..3].iter().copied(),
            at(1),
            "machine-1",
            "tb-disks-reboot-disk",
        );
        assert_eq!(timeline.seen, vec![]);
    }

    #[test]
    fn another_operations_reboot_is_not_this_one() {
        let mut timeline = RebootTimeline::default();
        timeline.observe(
            ["unbounded-agent: rebooting for tb-disks-reboot-ram\r"].into_iter(),
            at(1),
            "machine-1",
            "tb-disks-reboot-disk",
        );
        assert_eq!(timeline.seen, vec![]);
    }

    /// Lines as the lab's consoles show them (colour codes, carriage returns), from the run
    /// of 2026-11-26.
    const TWO_BOOTS: &str = "[   29.867668] unbounded-agent[156]: \x1b[2m2026-11-26T11:28:56Z\x1b[0m \x1b[32m INFO\x1b[0m unbounded-agent starting \x1b[3mmachine\x1b[0m=machine-1\r
[   42.550593] unbounded-agent[156]: unbounded-agent: node image 97 MB fetched, verified and unpacked in 11.0 s\r
[   45.259008] unbounded-agent[156]: unbounded-agent: node container machine-1 started\r
[  239.625010] unbounded-agent[156]: unbounded-agent: rebooting for tb-disks-reboot-disk\r
iPXE 1.0.0+git-20190125.36a4c85-5.1 -- Open Source Network Boot Firmware\r
[   85.475135] unbounded-agent[155]: INFO unbounded-agent starting machine=machine-1\r
[   92.546996] unbounded-agent[155]: unbounded-agent: storage on disk vdb (21 GB, reused): the node container on it is started as it is\r
unbounded login: [   99.567274] unbounded-agent[155]: unbounded-agent: node container machine-1 started\r
";

    #[test]
    fn the_agents_part_of_the_last_boot() {
        let phase = last_agent_phase(TWO_BOOTS, "machine-1").unwrap();
        assert!((phase.to_container - 14.092139).abs() < 1e-6, "{phase:?}");
        assert!(!phase.fetched);

        let first_boot: String = TWO_BOOTS.lines().take(3).collect::<Vec<_>>().join("\n");
        let phase = last_agent_phase(&first_boot, "machine-1").unwrap();
        assert!((phase.to_container - 15.39134).abs() < 1e-6, "{phase:?}");
        assert!(phase.fetched);
    }

    #[test]
    fn no_phase_without_the_containers_start_or_for_another_node() {
        let started_only: String = TWO_BOOTS.lines().take(6).collect::<Vec<_>>().join("\n");
        assert_eq!(last_agent_phase(&started_only, "machine-1"), None);
        assert_eq!(last_agent_phase(TWO_BOOTS, "machine-10"), None);
        assert_eq!(last_agent_phase("", "machine-1"), None);
    }
}
