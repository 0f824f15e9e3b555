//! Where a machine is on its way from power-off to a Ready Node, read from what its serial
//! console printed and what the API says, and the per-stage timing table.
//!
//! Console markers, in boot order: the firmware or iPXE got an address (DHCP), iPXE fetched
//! the machine's script (`Unbounded: booting …`), the kernel started (`Linux version`), the
//! agent got its credentials, the node container started; then the Node registered and became
//! Ready (from the API).

use std::fmt::Write as _;
use std::time::Duration;

/// The stages, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The BMC powered the machine on.
    PoweredOn,
    /// The firmware (or iPXE) got an address by DHCP.
    Dhcp,
    /// iPXE fetched the machine's boot script.
    Ipxe,
    /// The host OS kernel started.
    Kernel,
    /// The agent obtained its credentials.
    Agent,
    /// The node container started.
    Container,
    /// The Node object exists.
    NodeRegistered,
    /// The Node is Ready.
    Ready,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 8] = [
        Self::PoweredOn,
        Self::Dhcp,
        Self::Ipxe,
        Self::Kernel,
        Self::Agent,
        Self::Container,
        Self::NodeRegistered,
        Self::Ready,
    ];

    /// A short name for tables and progress lines.
    pub fn label(self) -> &'static str {
        match self {
            Self::PoweredOn => "powered on",
            Self::Dhcp => "DHCP",
            Self::Ipxe => "iPXE script",
            Self::Kernel => "kernel",
            Self::Agent => "agent",
            Self::Container => "container",
            Self::NodeRegistered => "Node registered",
            Self::Ready => "Ready",
        }
    }
}

/// A console line without ANSI escape sequences (systemd colours its status lines).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The console stages a line shows, if any.
pub fn console_stage(line: &str) -> Option<Stage> {
    let line = strip_ansi(line);
    let line = line.as_str();
    if line.contains("Station IP address is")
        || (line.contains("net0: ") && line.contains("/255."))
        || ipxe_global_ipv6(line)
    {
        Some(Stage::Dhcp)
    } else if line.contains("Unbounded: booting") {
        Some(Stage::Ipxe)
    } else if line.contains("Linux version") || line.contains("Welcome to Debian") {
        Some(Stage::Kernel)
    } else if line.contains("unbounded-agent: credentials obtained") {
        Some(Stage::Agent)
    } else if line.contains("unbounded-agent: node container") && line.contains("started") {
        Some(Stage::Container)
    } else {
        None
    }
}

/// iPXE's line for a global IPv6 address it configured (`net0: fd00:99::21/64`; its
/// link-local address is not the DHCPv6 lease).
fn ipxe_global_ipv6(line: &str) -> bool {
    let Some((_, after)) = line.split_once("net0: ") else {
        return false;
    };
    let address = after.split('/').next().unwrap_or_default().trim();
    address
        .parse::<std::net::Ipv6Addr>()
        .is_ok_and(|ip| !ip.is_unicast_link_local() && after.contains('/'))
}

/// The console stages seen in a console's text (complete lines only).
pub fn console_stages(console: &str) -> Vec<Stage> {
    let mut seen: Vec<Stage> = crate::qemu::complete_lines(console)
        .filter_map(console_stage)
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// When each stage was first seen, as time since power-on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// `(stage, since power-on)`, in the order seen.
    pub seen: Vec<(Stage, Duration)>,
}

impl Timeline {
    /// Records a stage the first time it is seen; returns whether it was new.
    pub fn record(&mut self, stage: Stage, at: Duration) -> bool {
        if self.seen.iter().any(|(s, _)| *s == stage) {
            return false;
        }
        self.seen.push((stage, at));
        true
    }

    /// When a stage was seen.
    pub fn at(&self, stage: Stage) -> Option<Duration> {
        self.seen.iter().find(|(s, _)| *s == stage).map(|(_, d)| *d)
    }

    /// The last stage reached.
    pub fn last(&self) -> Option<Stage> {
        self.seen.iter().map(|(s, _)| *s).max()
    }
}

/// A table: one row per stage, one column per machine, seconds since power-on (and the
/// duration of the step in parentheses).
pub fn table(machines: &[(String, Timeline)]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<16}", "stage");
    for (name, _) in machines {
        let _ = write!(out, "{name:>22}");
    }
    out.push('\n');
    for stage in Stage::ALL {
        let _ = write!(out, "{:<16}", stage.label());
        for (_, timeline) in machines {
            let cell = match timeline.at(stage) {
                None => "-".to_owned(),
                Some(at) => {
                    let previous = Stage::ALL
                        .iter()
                        .filter(|s| **s < stage)
                        .filter_map(|s| timeline.at(*s))
                        .max();
                    match previous {
                        Some(p) => format!(
                            "{:.1} s (+{:.1})",
                            at.as_secs_f64(),
                            at.saturating_sub(p).as_secs_f64()
                        ),
                        None => format!("{:.1} s", at.as_secs_f64()),
                    }
                }
            };
            let _ = write!(out, "{cell:>22}");
        }
        out.push('\n');
    }
    out
}

/// A table of the lab's own steps (registry, overlay, the appliance's first join, …) and
/// how long each took, with their total.
pub fn steps_table(steps: &[(String, Duration)]) -> String {
    let width = steps
        .iter()
        .map(|(s, _)| s.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::new();
    for (what, took) in steps {
        let pad = width - what.chars().count();
        let _ = writeln!(
            out,
            "{what}{} {:>7.1} s",
            " ".repeat(pad),
            took.as_secs_f64()
        );
    }
    let total: Duration = steps.iter().map(|(_, d)| *d).sum();
    let _ = writeln!(out, "{:<width$} {:>7.1} s", "total", total.as_secs_f64());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_table_lists_each_step_and_the_total() {
        let text = steps_table(&[
            ("registry".into(), Duration::from_millis(1500)),
            ("appliance → Ready".into(), Duration::from_secs(90)),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "registry              1.5 s",
                "appliance → Ready    90.0 s",
                "total                91.5 s",
            ],
            "one line per step, aligned, and the total"
        );
    }

    #[test]
    fn stages_from_a_bios_console() {
        let console = "SeaBIOS (version 1.16.2)\n\
            iPXE (http://ipxe.org) 00:03.0 CA00 PCI2.10 PnP PMM+\n\
            net0: 10.99.0.21/255.255.255.0 gw 10.99.0.1\n\
            Unbounded: booting machine-1\n\
            [    0.000000] Linux version 6.1.0-56-amd64\n\
            unbounded-agent: credentials obtained for machine-1\n\
            unbounded-agent: node container machine-1 started\n\
            unbounded-agent: half a li";
        assert_eq!(
            console_stages(console),
            [
                Stage::Dhcp,
                Stage::Ipxe,
                Stage::Kernel,
                Stage::Agent,
                Stage::Container
            ]
        );
    }

    #[test]
    fn systemd_colours_do_not_hide_the_welcome() {
        let line = "\u{1b}[0;1;39mWelcome to \u{1b}[1mDebian GNU/Linux 12 (bookworm)\u{1b}[0m!";
        assert_eq!(
            strip_ansi(line),
            "Welcome to Debian GNU/Linux 12 (bookworm)!"
        );
        assert_eq!(console_stage(line), Some(Stage::Kernel));
    }

    #[test]
    fn dhcp_shows_by_the_firmwares_station_address_or_ipxes_global_address() {
        assert_eq!(
            console_stage("  Station IP address is 10.99.0.22"),
            Some(Stage::Dhcp)
        );
        assert_eq!(console_stage("net0: fd00:99::21/64"), Some(Stage::Dhcp));
        assert_eq!(console_stage("net0: fe80::5054:ff:fe99:1/64"), None);
        assert_eq!(
            console_stage("net0: 52:54:00:99:00:01 using virtio-net on 0000:01:00.0 (open)"),
            None
        );
        assert_eq!(console_stage("unrelated"), None);
    }

    #[test]
    fn timeline_and_table() {
        let mut t = Timeline::default();
        assert!(t.record(Stage::PoweredOn, Duration::ZERO));
        assert!(t.record(Stage::Dhcp, Duration::from_millis(2500)));
        assert!(
            !t.record(Stage::Dhcp, Duration::from_secs(9)),
            "first sighting wins"
        );
        assert_eq!(t.last(), Some(Stage::Dhcp));
        let text = table(&[("m1".into(), t)]);
        assert!(text.contains("DHCP"), "{text}");
        assert!(text.contains("2.5 s (+2.5)"), "{text}");
    }
}
