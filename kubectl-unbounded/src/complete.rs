//! Shell completion. `completion <shell>` prints clap's static script for the binary run on
//! its own (`kubectl-unbounded ...`); under kubectl, completion goes through kubectl's plugin
//! protocol: kubectl runs `kubectl_complete-unbounded <words>`, which calls
//! `kubectl-unbounded __complete <words>`, which prints one candidate per line and then
//! Cobra's directive line (`:4`: no file completion). [`want`] decides what the last word
//! is (pure); the shell looks the names up.

use clap::CommandFactory;

use crate::cli::Cli;

/// What the word being completed is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// These fixed words (subcommands, power actions, shells, formats).
    Words(Vec<String>),
    /// Machine names.
    Machines,
    /// MachinePool names.
    Pools,
    /// MachineConfiguration names.
    Configurations,
    /// Nothing to offer (a free value such as a selector).
    Nothing,
}

/// Subcommands that take machine names as positional arguments.
const TAKES_MACHINES: [&str; 12] = [
    "status",
    "why",
    "console",
    "reboot",
    "shutdown",
    "pxe-boot",
    "restart-service",
    "repave",
    "rollback",
    "power",
    "apply",
    "logs",
];

/// Flags whose value is free text.
const FREE_VALUES: [&str; 13] = [
    "-l",
    "--selector",
    "--kubeconfig",
    "--context",
    "--to",
    "--service",
    "--timeout",
    "--confirm-above",
    "--active-deadline",
    "--events",
    "--version",
    "--since",
    "--bootserver-namespace",
];

fn subcommands() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect()
}

fn words(list: &[&str]) -> Want {
    Want::Words(list.iter().map(|w| (*w).to_owned()).collect())
}

/// What to offer for the last of `words` (the words after `kubectl unbounded`).
pub fn want(words_typed: &[String]) -> Want {
    let Some((_current, before)) = words_typed.split_last() else {
        return Want::Words(subcommands());
    };
    // Skip global flags and their values to find the subcommand.
    let mut rest = before.iter().map(String::as_str).peekable();
    let mut subcommand = None;
    while let Some(word) = rest.next() {
        if word == "--kubeconfig" || word == "--context" {
            rest.next();
        } else if !word.starts_with('-') {
            subcommand = Some(word);
            break;
        }
    }
    let Some(subcommand) = subcommand else {
        return Want::Words(subcommands());
    };
    let previous = before.last().map(String::as_str).unwrap_or_default();
    match previous {
        "--pool" => return Want::Pools,
        "--configuration" => return Want::Configurations,
        "-o" | "--output" => return words(&["text", "json", "yaml"]),
        "--by" => return words(&["configuration", "pool"]),
        "--color" => return words(&["auto", "always", "never"]),
        p if FREE_VALUES.contains(&p) => return Want::Nothing,
        _ => {}
    }
    let positionals: Vec<&str> = rest.filter(|w| !w.starts_with('-')).collect();
    match subcommand {
        "completion" => words(&["bash", "zsh", "fish", "elvish", "powershell"]),
        "power" if positionals.is_empty() => words(&["on", "off", "cycle"]),
        "why" | "rollback" | "console" | "logs" if !positionals.is_empty() => Want::Nothing,
        s if TAKES_MACHINES.contains(&s) => Want::Machines,
        _ => Want::Nothing,
    }
}

/// The lines kubectl's completion protocol expects: candidates starting with `prefix`, then
/// the directive.
pub fn protocol_lines(candidates: &[String], prefix: &str) -> String {
    let mut out: String = candidates
        .iter()
        .filter(|c| c.starts_with(prefix))
        .map(|c| format!("{c}\n"))
        .collect();
    // ShellCompDirectiveNoFileComp.
    out.push_str(":4\n");
    out
}

/// clap's static completion script for `shell`.
pub fn script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "kubectl-unbounded", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn what_each_position_completes() {
        let cases: &[(&[&str], Want)] = &[
            (&[""], Want::Words(subcommands())),
            (&["st"], Want::Words(subcommands())),
            (&["--context", "lab", ""], Want::Words(subcommands())),
            (&["status", ""], Want::Machines),
            (&["--context", "lab", "reboot", "m"], Want::Machines),
            (&["reboot", "m1", ""], Want::Machines),
            (&["status", "--pool", ""], Want::Pools),
            (&["status", "--configuration", "g"], Want::Configurations),
            (&["status", "-o", ""], words(&["text", "json", "yaml"])),
            (&["reboot", "-l", ""], Want::Nothing),
            (&["power", ""], words(&["on", "off", "cycle"])),
            (&["power", "on", ""], Want::Machines),
            (&["why", ""], Want::Machines),
            (&["why", "m1", ""], Want::Nothing),
            (&["rollback", "m1", "--to", ""], Want::Nothing),
            (
                &["completion", ""],
                words(&["bash", "zsh", "fish", "elvish", "powershell"]),
            ),
        ];
        for (typed, expected) in cases {
            assert_eq!(&want(&w(typed)), expected, "{typed:?}");
        }
    }

    #[test]
    fn subcommands_are_the_visible_ones() {
        let list = subcommands();
        assert!(list.contains(&"status".to_owned()));
        assert!(list.contains(&"rollback".to_owned()));
        assert!(!list.contains(&"__complete".to_owned()));
    }

    #[test]
    fn protocol_filters_by_prefix_and_ends_with_the_directive() {
        let out = protocol_lines(&w(&["m1", "m2", "other"]), "m");
        assert_eq!(out, "m1\nm2\n:4\n");
        assert_eq!(protocol_lines(&[], ""), ":4\n");
    }

    #[test]
    fn every_shell_gets_a_script() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let text = String::from_utf8(script(shell)).unwrap_or_default();
            assert!(text.contains("rollback"), "{shell:?}");
        }
    }
}
