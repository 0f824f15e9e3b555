//! What the terminal can show: whether standard output and input are terminals, its width,
//! and whether to colour ([`colour_enabled`] decides, from plain data).

use std::io::IsTerminal;

use crate::cli::ColorChoice;
use crate::render::Style;

/// The terminal the plugin runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Terminal {
    /// Standard output is a terminal.
    pub stdout_tty: bool,
    /// Standard input is a terminal (a confirmation can be asked).
    pub stdin_tty: bool,
    /// Columns of standard output, when it is a terminal.
    pub width: Option<usize>,
    /// `NO_COLOR` is set to something (<https://no-color.org>).
    pub no_color: bool,
}

impl Terminal {
    /// Looks at the process's standard streams and environment.
    pub fn detect() -> Self {
        let stdout_tty = std::io::stdout().is_terminal();
        let width = stdout_tty
            .then(|| {
                rustix::termios::tcgetwinsize(std::io::stdout())
                    .ok()
                    .map(|w| usize::from(w.ws_col))
                    .filter(|w| *w > 0)
                    .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok())
            })
            .flatten();
        Self {
            stdout_tty,
            stdin_tty: std::io::stdin().is_terminal(),
            width,
            no_color: std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        }
    }

    /// How to draw for `choice`.
    pub fn style(&self, choice: ColorChoice) -> Style {
        Style {
            width: self.width,
            colour: colour_enabled(choice, self.stdout_tty, self.no_color),
        }
    }
}

/// Colour when asked to always, or by default when standard output is a terminal and
/// `NO_COLOR` is not set.
pub fn colour_enabled(choice: ColorChoice, stdout_tty: bool, no_color: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => stdout_tty && !no_color,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_table() {
        let cases = [
            (ColorChoice::Auto, true, false, true),
            (ColorChoice::Auto, false, false, false),
            (ColorChoice::Auto, true, true, false),
            (ColorChoice::Always, false, true, true),
            (ColorChoice::Never, true, false, false),
        ];
        for (choice, tty, no_color, expected) in cases {
            assert_eq!(
                colour_enabled(choice, tty, no_color),
                expected,
                "{choice:?} tty={tty} NO_COLOR={no_color}"
            );
        }
    }
}
