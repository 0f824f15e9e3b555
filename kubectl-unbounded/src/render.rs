//! Drawing a [`StatusTree`] as text: aligned columns after the tree's branches, the
//! blocking condition in the last column, cut to the terminal's width; colour only when
//! asked for ([`Style`]). Pure: the same tree and style give the same text.

use crate::facts::{Blocker, NodeReadiness};
use crate::status::{Group, GroupKind, MachineRow, StatusTree, VersionRef};

/// How to draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    /// The terminal's width in columns (`None`: not a terminal, nothing is cut).
    pub width: Option<usize>,
    /// ANSI colours.
    pub colour: bool,
}

/// Below this width the POWER and AGENT columns are left out.
pub const NARROW: usize = 110;

/// The least room the last column keeps before lines are cut.
const MIN_LAST_COLUMN: usize = 12;

#[derive(Clone, Copy)]
enum Paint {
    Plain,
    Bold,
    Green,
    Yellow,
    Red,
    Dim,
}

impl Paint {
    fn code(self) -> &'static str {
        match self {
            Self::Plain => "",
            Self::Bold => "\x1b[1m",
            Self::Green => "\x1b[32m",
            Self::Yellow => "\x1b[33m",
            Self::Red => "\x1b[31m",
            Self::Dim => "\x1b[2m",
        }
    }
}

fn paint(text: &str, paint: Paint, style: Style) -> String {
    match paint {
        Paint::Plain => text.to_owned(),
        _ if !style.colour || text.is_empty() => text.to_owned(),
        p => format!("{}{text}\x1b[0m", p.code()),
    }
}

/// `45s`, `12m`, `3h`, `2d`.
pub fn short_duration(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `BootstrapReady=False Paving 5m: pulling the image`.
pub fn blocker_text(blocker: &Blocker) -> String {
    let mut text = if blocker.status.is_empty() {
        blocker.condition.clone()
    } else {
        format!("{}={}", blocker.condition, blocker.status)
    };
    if !blocker.reason.is_empty() {
        text.push(' ');
        text.push_str(&blocker.reason);
    }
    if let Some(seconds) = blocker.for_seconds {
        text.push(' ');
        text.push_str(&short_duration(seconds));
    }
    if !blocker.message.is_empty() {
        text.push_str(": ");
        // One line: a multi-line message would break the table.
        text.push_str(
            &blocker
                .message
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    text
}

/// The VERSION cell: the recorded version, then `→N` when the machine resolves to another
/// (`→conf/N` for another configuration, `→?` when it resolves to nothing).
pub fn version_text(row: &MachineRow) -> String {
    let recorded = row
        .recorded
        .as_ref()
        .map_or("-".to_owned(), |r| r.version.to_string());
    match (&row.recorded, &row.resolved) {
        (Some(r), Some(s)) if r == s => recorded,
        (
            Some(r),
            Some(VersionRef {
                configuration,
                version,
            }),
        ) if &r.configuration != configuration => format!("{recorded}→{configuration}/{version}"),
        (_, Some(s)) => format!("{recorded}→{}", s.version),
        (_, None) => format!("{recorded}→?"),
    }
}

fn node_text(row: &MachineRow) -> String {
    let mut text = row.node.readiness.as_str().to_owned();
    if row.node.cordoned {
        text.push_str(",Cordoned");
    }
    text
}

fn cut(text: &str, room: usize) -> String {
    if text.chars().count() <= room {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(room.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn pad(text: &str, width: usize) -> String {
    let len = text.chars().count();
    format!("{text}{}", " ".repeat(width.saturating_sub(len)))
}

/// One line of the table before it is padded: the tree prefix and name, then the cells.
struct Line {
    name: String,
    cells: Option<Vec<(String, Paint)>>,
    last: (String, Paint),
    name_paint: Paint,
}

fn phase_paint(phase: &str) -> Paint {
    match phase {
        "Running" => Paint::Green,
        "Failed" => Paint::Red,
        "Deleting" | "-" => Paint::Dim,
        _ => Paint::Yellow,
    }
}

fn machine_line(prefix: &str, row: &MachineRow, wide: bool) -> Line {
    let phase = row.phase.unwrap_or("-");
    let node_paint = match row.node.readiness {
        NodeReadiness::Ready if !row.node.cordoned => Paint::Green,
        NodeReadiness::Ready | NodeReadiness::Missing => Paint::Dim,
        NodeReadiness::NotReady | NodeReadiness::Unknown => Paint::Red,
    };
    let mut cells = vec![
        (phase.to_owned(), phase_paint(phase)),
        (version_text(row), Paint::Plain),
        (node_text(row), node_paint),
    ];
    if wide {
        cells.push((row.power.unwrap_or("-").to_owned(), Paint::Plain));
        cells.push((
            row.agent.clone().unwrap_or_else(|| "-".to_owned()),
            Paint::Plain,
        ));
    }
    let last = match (&row.blocker, &row.unresolved) {
        (Some(b), _) => (
            blocker_text(b),
            if b.condition == "Failed" {
                Paint::Red
            } else {
                Paint::Yellow
            },
        ),
        (None, Some(why)) => (why.clone(), Paint::Yellow),
        (None, None) => (String::new(), Paint::Plain),
    };
    Line {
        name: format!("{prefix}{}", row.name),
        cells: Some(cells),
        last,
        name_paint: Paint::Plain,
    }
}

fn heading_line(text: String, summary: String, blocker: Option<&Blocker>) -> Line {
    let mut last = summary;
    if let Some(b) = blocker {
        last.push_str("; ");
        last.push_str(&blocker_text(b));
    }
    Line {
        name: text,
        cells: None,
        last: (last, Paint::Dim),
        name_paint: Paint::Bold,
    }
}

fn branch(last: bool) -> (&'static str, &'static str) {
    if last {
        ("└─ ", "   ")
    } else {
        ("├─ ", "│  ")
    }
}

fn group_lines(group: &Group, wide: bool, out: &mut Vec<Line>) {
    let title = match group.kind {
        GroupKind::Configuration => format!("configuration {}", group.name),
        GroupKind::Pool => format!("pool {}", group.name),
        GroupKind::Unassigned => format!("({})", group.summary),
    };
    let summary = match group.kind {
        GroupKind::Unassigned => String::new(),
        _ => group.summary.clone(),
    };
    out.push(heading_line(title, summary, group.blocker.as_ref()));
    let children = group.versions.len() + group.machines.len();
    let mut index = 0;
    for version in &group.versions {
        index += 1;
        let (here, below) = branch(index == children);
        let title = match version.version {
            Some(v) => format!("{here}v{v}"),
            None => format!("{here}(no version)"),
        };
        out.push(heading_line(title, version.summary.clone(), None));
        let count = version.machines.len();
        for (i, row) in version.machines.iter().enumerate() {
            let (leaf, _) = branch(i + 1 == count);
            out.push(machine_line(&format!("{below}{leaf}"), row, wide));
        }
    }
    for row in &group.machines {
        index += 1;
        let (leaf, _) = branch(index == children);
        out.push(machine_line(leaf, row, wide));
    }
}

/// Draws the tree. Every line ends with a newline; an empty tree says so.
pub fn render(tree: &StatusTree, style: Style) -> String {
    let wide = style.width.is_none_or(|w| w >= NARROW);
    let mut headers = vec!["NAME", "PHASE", "VERSION", "NODE"];
    if wide {
        headers.extend(["POWER", "AGENT"]);
    }
    headers.push("WAITING ON");
    let mut lines = Vec::new();
    for group in &tree.groups {
        group_lines(group, wide, &mut lines);
    }
    if lines.is_empty() {
        return "No machines.\n".to_owned();
    }
    // Column widths: the name column holds headings only when they fit beside the cells.
    let columns = headers.len() - 2;
    let mut widths = vec![headers[0].len()];
    widths.extend(headers[1..=columns].iter().map(|h| h.len()));
    for line in &lines {
        if let Some(cells) = &line.cells {
            widths[0] = widths[0].max(line.name.chars().count());
            for (i, (cell, _)) in cells.iter().enumerate() {
                widths[i + 1] = widths[i + 1].max(cell.chars().count());
            }
        }
    }
    let fixed: usize = widths.iter().map(|w| w + 2).sum();
    let room = style
        .width
        .map(|w| w.saturating_sub(fixed).max(MIN_LAST_COLUMN));
    let mut out = String::new();
    let header: Vec<String> = headers[..=columns]
        .iter()
        .zip(&widths)
        .map(|(h, w)| pad(h, *w + 2))
        .collect();
    out.push_str(&paint(
        &format!("{}{}", header.concat(), headers[columns + 1]),
        Paint::Bold,
        style,
    ));
    out.push('\n');
    for line in lines {
        let mut text = String::new();
        match &line.cells {
            Some(cells) => {
                text.push_str(&paint(
                    &pad(&line.name, widths[0] + 2),
                    line.name_paint,
                    style,
                ));
                for (i, (cell, p)) in cells.iter().enumerate() {
                    // Pad first, then colour: escape codes take no columns.
                    let padded = pad(cell, widths[i + 1] + 2);
                    let (word, spaces) = padded.split_at(cell.len());
                    text.push_str(&paint(word, *p, style));
                    text.push_str(spaces);
                }
                let last = room.map_or(line.last.0.clone(), |r| cut(&line.last.0, r));
                text.push_str(&paint(&last, line.last.1, style));
            }
            None => {
                let name_room = style.width.unwrap_or(usize::MAX);
                let name = cut(&line.name, name_room);
                let used = name.chars().count() + 2;
                text.push_str(&paint(&name, line.name_paint, style));
                if !line.last.0.is_empty() {
                    text.push_str("  ");
                    let last = match style.width {
                        Some(w) => cut(&line.last.0, w.saturating_sub(used)),
                        None => line.last.0.clone(),
                    };
                    text.push_str(&paint(&last, line.last.1, style));
                }
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::facts::Inventory;
    use crate::fixtures::{condition, configuration, machine, node, now, running};
    use crate::status::GroupBy;
    use crate::status::{Filter, build};

    fn lab(message: &str) -> StatusTree {
        let gpu = configuration("gpu", 0, Some(json!({})), &[(1, true), (2, true)]);
        let a = running("a", "gpu", 2);
        let old = running("old", "gpu", 1);
        let stuck = machine(
            "stuck",
            json!({}),
            json!({}),
            json!({"phase": "Provisioning", "power": "On",
                   "configuration": {"name": "gpu", "version": 2},
                   "conditions": [condition("BootstrapReady", "False", "Paving", message, "2026-11-26T11:55:00Z")]}),
        );
        let inventory = Inventory {
            machines: vec![a, old, stuck],
            configurations: vec![gpu],
            pools: Vec::new(),
            nodes: vec![node("a", true), node("old", true)],
        };
        build(
            &inventory,
            &Filter::default(),
            GroupBy::Configuration,
            now(),
        )
    }

    #[test]
    fn the_tree_as_text() {
        let text = render(&lab("pulling the image"), Style::default());
        let expected = "\
NAME         PHASE         VERSION  NODE   POWER  AGENT    WAITING ON
configuration gpu  latest v2 (deployed), OnDelete, priority 0, 3 machines
├─ v2  deployed, 2 machines
│  ├─ a      Running       2        Ready  On     running
│  └─ stuck  Provisioning  2        -      On     -        BootstrapReady=False Paving 5m: pulling the image
└─ v1  deployed, 1 machine
   └─ old    Running       1→2      Ready  On     running
";
        assert_eq!(text, expected);
    }

    #[test]
    fn pools_as_text() {
        let mut web = crate::fixtures::pool("web", "pxe", 2, 1);
        web.status.get_or_insert_default().conditions = vec![
            serde_json::from_value(condition(
                "Scaled",
                "False",
                "InventoryShort",
                "1 free PXE Machine matches, 2 needed",
                "2026-11-26T11:00:00Z",
            ))
            .unwrap(),
        ];
        let mut a = running("a", "gpu", 1);
        a.metadata.labels = Some(crate::facts::label_map(&[(
            unbounded_api::well_known::labels::POOL,
            "web",
        )]));
        let loose = machine("loose", json!({}), json!({}), serde_json::Value::Null);
        let inventory = Inventory {
            machines: vec![a, loose],
            configurations: vec![configuration(
                "gpu",
                0,
                Some(json!({"matchLabels": {"x": "y"}})),
                &[(1, true)],
            )],
            pools: vec![web],
            nodes: vec![node("a", false)],
        };
        let tree = build(&inventory, &Filter::default(), GroupBy::Pool, now());
        let text = render(&tree, Style::default());
        let expected = "\
NAME      PHASE    VERSION  NODE      POWER  AGENT    WAITING ON
pool web  pxe pool, 1/2 ready, 2 updated; Scaled=False InventoryShort 60m: 1 free PXE Machine matches, 2 needed
└─ a      Running  1→?      NotReady  On     running  no configuration matches
(in no pool)
└─ loose  -        -→?      -         -      -        Status NoStatus: the controller has not reported on this Machine yet
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_narrow_terminal_drops_power_and_agent_and_cuts_the_last_column() {
        let text = render(
            &lab(&"x".repeat(200)),
            Style {
                width: Some(80),
                colour: false,
            },
        );
        assert!(
            text.starts_with("NAME         PHASE         VERSION  NODE   WAITING ON\n"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        assert!(text.contains("…"), "{text}");
    }

    #[test]
    fn nothing_to_show_says_so() {
        let tree = StatusTree {
            grouping: "configuration",
            groups: Vec::new(),
        };
        assert_eq!(render(&tree, Style::default()), "No machines.\n");
    }

    #[test]
    fn durations_are_short() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (7199, "119m"),
            (7200, "2h"),
            (172_800, "2d"),
        ];
        for (seconds, text) in cases {
            assert_eq!(short_duration(seconds), text);
        }
    }

    fn strip_escapes(text: &str) -> String {
        let mut out = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(29), ..ProptestConfig::default() })]

        /// Whatever the message and the width (from the room the fixed columns need), no
        /// line is wider than the terminal, and colour changes only escape codes.
        #[test]
        fn lines_fit_the_width_and_colour_adds_only_escapes(
            message in "[ -~é…\n]{0,300}",
            width in 90usize..220,
        ) {
            let tree = lab(&message);
            let plain = render(&tree, Style { width: Some(width), colour: false });
            for line in plain.lines() {
                prop_assert!(line.chars().count() <= width, "{} > {width}: {line}", line.chars().count());
            }
            let coloured = render(&tree, Style { width: Some(width), colour: true });
            prop_assert!(coloured.contains('\x1b'));
            prop_assert_eq!(strip_escapes(&coloured), plain);
        }
    }
}
