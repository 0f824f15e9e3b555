//! `logs <machine>`: the log lines about one machine from the two components that see it.
//!
//! - The bootserver: its pods' logs through the API server (`pods/log`; the pods of
//!   `deploy/bootserver.yaml`, label `app.kubernetes.io/name=unbounded-bootserver`), kept
//!   when a line names the Machine, one of its MACs or one of its addresses as a whole word
//!   ([`Needles::matches`]): the DHCP ACKs (`mac=`, `ip=`), the credentials issued
//!   (`machine=`), the BMC's power calls (`bmc=`), refusals.
//! - The agent: every line of its log is about its machine. The agent also writes it to a
//!   capped file of the host that the node container sees read-only
//!   (`/var/log/unbounded/agent.log`), and the Node's kubelet serves the container's
//!   `/var/log`: the plugin reads it through the API server
//!   (`/api/v1/nodes/<node>/proxy/logs/unbounded/agent.log`), with no way into the host
//!   needed. Before the machine has a Node there is no such path: the plugin says so and
//!   shows what `why` shows (the blocking condition, the Machine's Events, the agent's last
//!   report) instead.
//!
//! Both need what `kubectl logs` and `kubectl get --raw /api/v1/nodes/<n>/proxy/...` need
//! (`pods/log` in the bootserver's namespace, `nodes/proxy`). Pure parts: [`parse_since`],
//! [`Needles`], [`timestamp_of`], [`strip_ansi`], [`merge`], [`tail_step`]; [`run`] reads.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use unbounded_api::Machine;

use crate::error::Error;
use crate::facts::{NodeReadiness, node_of, nodes_by_name};

/// The namespace `deploy/` installs the bootserver into.
pub const BOOTSERVER_NAMESPACE: &str = "unbounded-system";
/// The bootserver pods' label (`deploy/bootserver.yaml`).
pub const BOOTSERVER_SELECTOR: &str = "app.kubernetes.io/name=unbounded-bootserver";
/// The agent's log under the Node's `/logs/` (kubelet's view of the container's `/var/log`).
pub const AGENT_LOG_PATH: &str = "unbounded/agent.log";

/// How often `--follow` reads the agent's file again.
const AGENT_POLL: Duration = Duration::from_secs(2);

/// `--since`: `90`, `90s`, `15m`, `2h`, `1d` → seconds.
pub fn parse_since(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("--since {text:?}: the unit must be s, m, h or d")),
    };
    number
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("--since {text:?} is not a duration such as 90s, 15m, 2h or 1d"))
}

/// Removes terminal colour sequences (`ESC [ ... letter`): tracing colours its fields even
/// when the output is not a terminal.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What names a machine in a log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needles {
    /// The Machine's name, its MACs (lower case) and addresses.
    pub words: BTreeSet<String>,
}

/// A character that continues a name, MAC or address: a match must not have one on either
/// side (`machine-1` is not in `machine-10`, `10.0.0.5` not in `10.0.0.50`).
fn continues(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

impl Needles {
    /// The words of `machine`: its name, its PXE MACs, the addresses its provider reports.
    pub fn of(machine: &Machine) -> Self {
        let mut words = BTreeSet::from([machine.name_any()]);
        if let Some(pxe) = &machine.spec.pxe {
            words.extend(pxe.mac_addresses.iter().map(|m| m.to_ascii_lowercase()));
        }
        if let Some(status) = &machine.status {
            words.extend(status.addresses.iter().map(|a| a.address.clone()));
        }
        words.retain(|w| !w.is_empty());
        Self { words }
    }

    /// Whether `line` names the machine (as a whole word; MACs in any case).
    pub fn matches(&self, line: &str) -> bool {
        let lower = line.to_ascii_lowercase();
        self.words.iter().any(|word| {
            let word = word.to_ascii_lowercase();
            lower.match_indices(&word).any(|(at, _)| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + word.len()..].chars().next();
                // A trailing dot ends a sentence, not a name.
                let after_continues = match after {
                    Some('.') => lower[at + word.len() + 1..]
                        .chars()
                        .next()
                        .is_some_and(continues),
                    Some(c) => continues(c),
                    None => false,
                };
                !before.is_some_and(continues) && !after_continues
            })
        })
    }
}

/// The time a tracing line starts with (text: the first word; JSON: `"timestamp"`).
pub fn timestamp_of(line: &str) -> Option<Timestamp> {
    let line = line.trim_start();
    if line.starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        return value.get("timestamp")?.as_str()?.parse().ok();
    }
    line.split_whitespace().next()?.parse().ok()
}

/// One line, from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// `agent` or `bootserver/<pod>`.
    pub source: String,
    /// Its time, when it has one (a continuation line takes its predecessor's).
    pub at: Option<Timestamp>,
    /// The text, colour removed.
    pub text: String,
}

impl LogLine {
    /// How it is printed.
    pub fn display(&self) -> String {
        format!("{} | {}", self.source, self.text)
    }
}

/// Reads one source's text into lines (colour removed, times read), keeping those at or
/// after `since` (a line without a time goes with the line before it).
pub fn lines_of(source: &str, text: &str, since: Option<Timestamp>) -> Vec<LogLine> {
    let mut at = None;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|raw| {
            let text = strip_ansi(raw);
            at = timestamp_of(&text).or(at);
            LogLine {
                source: source.to_owned(),
                at,
                text,
            }
        })
        .filter(|l| since.is_none_or(|s| l.at.is_none_or(|at| at >= s)))
        .collect()
}

/// Every source's lines in one list, by time (stable: a source's order is kept; lines
/// without any time come first, as they are the oldest a source had).
pub fn merge(sources: Vec<Vec<LogLine>>) -> Vec<LogLine> {
    let mut all: Vec<LogLine> = sources.into_iter().flatten().collect();
    all.sort_by_key(|l| l.at);
    all
}

/// What one read of the agent's file from `offset` (asked as `Range: bytes=<offset-1>-`, so
/// that a file shorter than `offset` answers 416) means for `--follow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailStep {
    /// The new text to print.
    pub new: String,
    /// The offset to read from next.
    pub offset: u64,
}

/// Decides from the answer's status and body: 206 holds the byte before `offset` and what
/// follows; 200 (the range ignored) holds the whole file; 416 means the file is shorter than
/// `offset`: it was rotated, and is read again from its start.
pub fn tail_step(offset: u64, status: u16, body: &str) -> Option<TailStep> {
    match status {
        206 if offset > 0 => {
            let new = body.get(1..).unwrap_or_default();
            Some(TailStep {
                new: new.to_owned(),
                offset: offset + new.len() as u64,
            })
        }
        206 | 200 => {
            let len = body.len() as u64;
            if len < offset {
                return Some(TailStep {
                    new: body.to_owned(),
                    offset: len,
                });
            }
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            Some(TailStep {
                new: body.get(start..).unwrap_or_default().to_owned(),
                offset: len,
            })
        }
        416 => Some(TailStep {
            new: String::new(),
            offset: 0,
        }),
        _ => None,
    }
}

/// `logs` options.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--follow`.
    pub follow: bool,
    /// `--since`, in seconds.
    pub since_seconds: Option<i64>,
    /// `--namespace` of the bootserver.
    pub namespace: String,
}

/// Reads the agent's file through the Node's kubelet: status and body.
async fn read_agent(client: &Client, node: &str, from: u64) -> Result<(u16, String), String> {
    let mut request =
        http::Request::get(format!("/api/v1/nodes/{node}/proxy/logs/{AGENT_LOG_PATH}"));
    if from > 0 {
        request = request.header("Range", format!("bytes={}-", from - 1));
    }
    let request = request
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Why a status of the agent's file means no file, for a person.
fn agent_unreadable(node: &str, status: u16, body: &str) -> String {
    let first = body.lines().next().unwrap_or_default();
    let hint = if status == 404 {
        " (an agent that predates `kubectl unbounded logs`, or a container paved before it, has no such file: the next repave adds it)"
    } else {
        ""
    };
    format!("the agent's log is not served by Node {node}: HTTP {status} {first}{hint}")
}

/// The bootserver pods.
async fn bootserver_pods(client: &Client, namespace: &str) -> Result<Vec<String>, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(BOOTSERVER_SELECTOR))
        .await
        .map_err(Error::api(format!(
            "listing the bootserver pods in {namespace} ({BOOTSERVER_SELECTOR})"
        )))?;
    let mut names: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    Ok(names)
}

/// Prints the machine's lines (and follows them with `--follow`).
pub async fn run(client: &Client, name: &str, options: &Options) -> Result<(), Error> {
    let machine = Api::<Machine>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::api(format!("reading Machine {name}")))?
        .ok_or_else(|| Error::UnknownMachines(vec![name.to_owned()]))?;
    let needles = Needles::of(&machine);
    let inventory = crate::cluster::inventory(client, None).await?;
    let node = node_of(&machine, &nodes_by_name(&inventory.nodes));
    let pods = bootserver_pods(client, &options.namespace).await?;
    let mut notes = Vec::new();
    if pods.is_empty() {
        notes.push(format!(
            "no bootserver pod in {} ({BOOTSERVER_SELECTOR}): no bootserver lines",
            options.namespace
        ));
    }
    let has_node = node.readiness != NodeReadiness::Missing;
    let since = options
        .since_seconds
        .map(|s| Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(s));
    let params = LogParams {
        since_seconds: options.since_seconds,
        follow: options.follow,
        ..LogParams::default()
    };
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &options.namespace);
    let mut stderr = std::io::stderr().lock();
    if !has_node {
        writeln!(
            stderr,
            "Machine {name} has no Node ({}) yet: the agent's lines are read through its Node's kubelet, so only the bootserver's are shown. What is known about it:",
            node.name
        )?;
        let (events, operations) = futures::try_join!(
            crate::cluster::machine_events(client, &machine),
            crate::cluster::machine_operations(client, name),
        )?;
        let events: Vec<crate::why::EventFact> = events
            .iter()
            .filter_map(crate::why::EventFact::from_event)
            .collect();
        let text = crate::why::explain(
            &machine,
            &inventory,
            &events,
            &operations,
            10,
            Timestamp::now(),
        );
        writeln!(stderr, "{text}\n")?;
    }
    for note in &notes {
        writeln!(stderr, "note: {note}")?;
    }
    drop(stderr);

    if !options.follow {
        let mut sources = Vec::new();
        for pod in &pods {
            let text = pod_api
                .logs(pod, &params)
                .await
                .map_err(Error::api(format!("reading the log of pod {pod}")))?;
            let source = format!("bootserver/{pod}");
            let mut lines = lines_of(&source, &text, None);
            lines.retain(|l| needles.matches(&l.text));
            sources.push(lines);
        }
        if has_node {
            match read_agent(client, &node.name, 0).await {
                Ok((200, body)) => sources.push(lines_of("agent", &body, since)),
                Ok((status, body)) => {
                    eprintln!("note: {}", agent_unreadable(&node.name, status, &body));
                }
                Err(e) => eprintln!(
                    "note: reading the agent's log through Node {}: {e}",
                    node.name
                ),
            }
        }
        let mut out = std::io::stdout().lock();
        for line in merge(sources) {
            writeln!(out, "{}", line.display())?;
        }
        return Ok(());
    }

    // --follow: every source feeds one channel; lines are printed as they come.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for pod in pods {
        let stream = pod_api
            .log_stream(&pod, &params)
            .await
            .map_err(Error::api(format!("following the log of pod {pod}")))?;
        let (tx, needles) = (tx.clone(), needles.clone());
        tokio::spawn(async move {
            let source = format!("bootserver/{pod}");
            let mut lines = stream.lines();
            while let Ok(Some(line)) = lines.try_next().await {
                let text = strip_ansi(&line);
                if needles.matches(&text) && tx.send(format!("{source} | {text}")).is_err() {
                    return;
                }
            }
        });
    }
    if has_node {
        let (client, node, tx) = (client.clone(), node.name.clone(), tx.clone());
        tokio::spawn(async move {
            let mut offset = 0;
            let mut first = true;
            loop {
                match read_agent(&client, &node, offset).await {
                    Ok((status, body)) => match tail_step(offset, status, &body) {
                        Some(step) => {
                            let lines =
                                lines_of("agent", &step.new, if first { since } else { None });
                            for line in lines {
                                if tx.send(line.display()).is_err() {
                                    return;
                                }
                            }
                            offset = step.offset;
                            first = false;
                        }
                        None => {
                            let _ = tx
                                .send(format!("note | {}", agent_unreadable(&node, status, &body)));
                            return;
                        }
                    },
                    Err(e) => {
                        let _ = tx.send(format!("note | reading the agent's log: {e}"));
                    }
                }
                tokio::time::sleep(AGENT_POLL).await;
            }
        });
    }
    drop(tx);
    let mut interrupt = crate::interrupts()?;
    loop {
        tokio::select! {
            line = rx.recv() => match line {
                Some(line) => {
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{line}")?;
                    out.flush()?;
                }
                None => return Ok(()),
            },
            _ = interrupt.recv() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use serde_json::json;

    use super::*;
    use crate::fixtures::machine;

    #[test]
    fn since_durations() {
        let cases = [
            ("90", Ok(90)),
            ("90s", Ok(90)),
            ("15m", Ok(900)),
            ("2h", Ok(7200)),
            ("1d", Ok(86_400)),
            ("0s", Err("is not a duration")),
            ("-5m", Err("is not a duration")),
            ("5w", Err("the unit must be")),
            ("m", Err("is not a duration")),
            ("", Err("is not a duration")),
            ("99999999999999999d", Err("is not a duration")),
        ];
        for (text, expected) in cases {
            match (parse_since(text), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(got), Err(word)) => assert!(got.contains(word), "{text}: {got}"),
                (got, want) => panic!("{text}: {got:?}, expected {want:?}"),
            }
        }
    }

    fn pxe_machine() -> Machine {
        machine(
            "machine-1",
            json!({}),
            json!({"provider": "pxe", "pxe": {"macAddresses": ["52:54:00:AA:00:01"]}}),
            json!({"addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}),
        )
    }

    #[test]
    fn a_line_is_about_the_machine_when_it_names_it_as_a_word() {
        let needles = Needles::of(&pxe_machine());
        let cases = [
            (
                "2026-01-01T00:00:00Z  INFO issued agent credentials machine=machine-1 peer=10.0.0.9:4242",
                true,
            ),
            ("INFO issued agent credentials machine=machine-10", false),
            ("INFO issued agent credentials machine=amachine-1", false),
            (
                "INFO DHCP ACK: address leased mac=52:54:00:aa:00:01 ip=10.0.0.77",
                true,
            ),
            (
                "INFO DHCP ACK: address leased mac=52:54:00:aa:00:02 ip=10.0.0.5",
                true,
            ),
            (
                "INFO DHCP ACK: address leased mac=52:54:00:aa:00:02 ip=10.0.0.50",
                false,
            ),
            ("WARN credentials refused peer=10.0.0.5:1234", true),
            (
                r#"{"fields":{"message":"issued","machine":"machine-1"}}"#,
                true,
            ),
            ("the power of machine-1.", true),
            ("host machine-1.example.org", false),
            ("nothing here", false),
        ];
        for (line, expected) in cases {
            assert_eq!(needles.matches(line), expected, "{line}");
        }
        let colourful = "\u{1b}[2m2026-01-01T00:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[3mmachine\u{1b}[0m\u{1b}[2m=\u{1b}[0mmachine-1";
        // Colour codes glue to the words: without stripping them the name is not a word.
        assert!(!needles.matches(colourful));
        assert_eq!(
            strip_ansi(colourful),
            "2026-01-01T00:00:00Z  INFO machine=machine-1"
        );
        assert!(needles.matches(&strip_ansi(colourful)));
    }

    #[test]
    fn lines_take_their_time_and_since_keeps_the_recent_ones() {
        let text = "2026-01-01T00:00:00.5Z  INFO old\n  continued\n\n2026-01-01T00:10:00Z  INFO new\n  its detail\n";
        let since: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let all = lines_of("agent", text, None);
        assert_eq!(all.len(), 4);
        assert_eq!(
            all[1].at, all[0].at,
            "a continuation takes the time before it"
        );
        let recent: Vec<String> = lines_of("agent", text, Some(since))
            .iter()
            .map(LogLine::display)
            .collect();
        assert_eq!(
            recent,
            [
                "agent | 2026-01-01T00:10:00Z  INFO new",
                "agent |   its detail"
            ]
        );
        let json_line = r#"{"timestamp":"2026-01-01T00:01:00Z","level":"INFO"}"#;
        assert_eq!(
            timestamp_of(json_line),
            Some("2026-01-01T00:01:00Z".parse().unwrap())
        );
        assert_eq!(timestamp_of("no time here"), None);
    }

    #[test]
    fn sources_are_merged_by_time_keeping_each_ones_order() {
        let a = lines_of(
            "agent",
            "2026-01-01T00:00:02Z a1\n2026-01-01T00:00:04Z a2\n",
            None,
        );
        let b = lines_of(
            "bootserver/p",
            "2026-01-01T00:00:01Z b1\n2026-01-01T00:00:04Z b2\n2026-01-01T00:00:05Z b3\n",
            None,
        );
        let merged: Vec<String> = merge(vec![a, b]).iter().map(|l| l.text.clone()).collect();
        let words: Vec<&str> = merged
            .iter()
            .map(|t| t.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(words, ["b1", "a1", "a2", "b2", "b3"]);
    }

    #[test]
    fn following_the_agents_file() {
        let cases = [
            // First read: the whole file.
            (0, 200, "one\ntwo\n", Some(("one\ntwo\n", 8))),
            // The byte before the offset and what follows.
            (8, 206, "\nthree\n", Some(("three\n", 14))),
            // Nothing new: only the byte before.
            (14, 206, "\n", Some(("", 14))),
            // Shorter than the offset: rotated; read again from the start.
            (14, 416, "", Some(("", 0))),
            // The range ignored: the whole file, printed from the offset.
            (4, 200, "one\ntwo\n", Some(("two\n", 8))),
            // The range ignored and the file shorter: rotated, all of it is new.
            (20, 200, "new\n", Some(("new\n", 4))),
            (0, 404, "not found", None),
            (8, 503, "", None),
        ];
        for (offset, status, body, expected) in cases {
            let got = tail_step(offset, status, body);
            assert_eq!(
                got.as_ref().map(|s| (s.new.as_str(), s.offset)),
                expected,
                "{offset} {status}"
            );
        }
    }
}
