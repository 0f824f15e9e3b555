//! Small SVG charts written by our own code (no plotting dependency): a line chart of
//! series of points (DHCP: DORA/s against the offered rate, per server) and a grouped bar
//! chart (TFTP: MB/s per windowsize, per server).

use std::fmt::Write as _;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One named series of `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its points, in the order drawn.
    pub points: Vec<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round upper bound for an axis (1, 2 or 5 times a power of ten).
pub fn nice_max(value: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&candidate| candidate >= value)
        .unwrap_or(10.0 * power)
}

fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str, y_max: f64) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        escape(title)
    );
    let plot_h = HEIGHT - TOP - BOTTOM;
    for i in 0..=5 {
        let value = y_max * f64::from(i) / 5.0;
        let y = TOP + plot_h - plot_h * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            super::report::human(value)
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        TOP + plot_h,
        TOP + plot_h,
        WIDTH - RIGHT,
        TOP + plot_h
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 10.0,
        escape(x_label),
        TOP + plot_h / 2.0,
        escape(y_label)
    );
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            WIDTH - RIGHT + 12.0,
            y - 10.0,
            COLOURS[i % COLOURS.len()],
            WIDTH - RIGHT + 30.0,
            y,
            escape(name)
        );
    }
}

/// A line chart with markers; both axes start at 0.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (x_top, y_top) = all.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let (x_max, y_max) = (nice_max(x_top), nice_max(y_top));
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label, y_max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    for i in 0..=5 {
        let value = x_max * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w * f64::from(i) / 5.0,
            TOP + plot_h + 16.0,
            super::report::human(value)
        );
    }
    let at = |(x, y): (f64, f64)| (LEFT + plot_w * x / x_max, TOP + plot_h - plot_h * y / y_max);
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut sorted = s.points.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = sorted
            .iter()
            .map(|&p| {
                let (x, y) = at(p);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &p in &sorted {
            let (x, y) = at(p);
            let _ = writeln!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

/// A grouped bar chart: one group per category, one bar per series (a missing value leaves
/// a gap).
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let y_top = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v));
    let y_max = nice_max(y_top);
    let mut out = String::new();
    frame(&mut out, title, "", y_label, y_max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let group_w = plot_w / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, category) in categories.iter().enumerate() {
        let x0 = LEFT + group_w * c as f64 + group_w * 0.1;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x0 + group_w * 0.4,
            TOP + plot_h + 16.0,
            escape(category)
        );
        for (s, (_, values)) in series.iter().enumerate() {
            let Some(Some(value)) = values.get(c) else {
                continue;
            };
            let h = plot_h * value / y_max;
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"/>"#,
                x0 + bar_w * s as f64,
                TOP + plot_h - h,
                bar_w * 0.95,
                COLOURS[s % COLOURS.len()]
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice_max(5975.0), 10_000.0);
        assert_eq!(nice_max(44.4), 50.0);
        assert_eq!(nice_max(1.0), 1.0);
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(1.9), 2.0);
    }

    #[test]
    fn a_line_chart_has_one_line_and_a_marker_per_point() {
        let svg = line_chart(
            "DHCP",
            "offered",
            "DORA/s",
            &[
                Series {
                    name: "ours".into(),
                    points: vec![(2000.0, 1990.0), (1000.0, 1000.0)],
                },
                Series {
                    name: "Kea <1 thread>".into(),
                    points: vec![(1000.0, 990.0)],
                },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("Kea &lt;1 thread&gt;"));
    }

    #[test]
    fn a_bar_chart_leaves_gaps_for_missing_values() {
        let svg = bar_chart(
            "TFTP",
            "MB/s",
            &["w1".into(), "w16".into()],
            &[
                ("ours".into(), vec![Some(20.0), Some(40.0)]),
                ("tftpd-hpa".into(), vec![Some(45.0), None]),
            ],
        );
        // Three bars plus the background and three legend swatches.
        assert_eq!(svg.matches("<rect").count(), 3 + 1 + 2);
    }
}
