#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! Every command the README and `docs/` tell a person to run is one the code still accepts:
//! each `cargo run -p <package> -- <args>` (and each call of a built binary) is run as
//! `<binary> <args> --help`, which exits 0 only when every subcommand and flag exists and
//! every value parses (clap checks them before it prints the help); each `kubectl` command
//! the same way with the matching kubectl; each `scripts/...` must exist. A renamed flag or
//! subcommand fails this test instead of leaving the docs wrong.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

mod common;
use common::workspace_binary;

/// Whether `<program> <args> --help` exits 0; else the first lines of what it said.
fn accepts_with_help(program: &Path, args: &[String]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    out.status.success().then_some(()).ok_or_else(|| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    })
}

/// The Markdown files people read.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![workspace().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(workspace().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The command lines of a Markdown text: lines of `sh` code blocks, and inline code spans
/// that start with a command this test knows.
fn command_lines(markdown: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut in_sh = false;
    let mut in_other = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_sh || in_other {
                in_sh = false;
                in_other = false;
            } else if matches!(info.trim(), "sh" | "bash" | "shell" | "console") {
                in_sh = true;
            } else {
                in_other = true;
            }
            continue;
        }
        if in_sh {
            // A line ending in `\` goes on on the next one.
            match out.last_mut() {
                Some(previous) if previous.ends_with('\\') => {
                    previous.pop();
                    previous.push(' ');
                    previous.push_str(line.trim());
                }
                _ => out.push(line.to_owned()),
            }
        } else if !in_other {
            out.extend(
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|span| {
                        span.starts_with("cargo run ") || span.starts_with("unbounded-testbed ")
                    })
                    .map(str::to_owned),
            );
        }
    }
    out
}

/// One command to check: the program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Check {
    /// A binary of the workspace with these arguments.
    Binary(String, Vec<String>),
    /// kubectl with these arguments.
    Kubectl(Vec<String>),
    /// A script of the repository.
    Script(String),
}

/// The pieces of a shell line that are commands (split at `|`, `;`, `&&`, `$(`, `)` and
/// before a `#` comment).
fn commands_of(line: &str) -> Vec<Vec<String>> {
    let line = line.split(" #").next().unwrap_or("");
    let line = line.replace("$(", ";").replace(')', ";").replace("&&", ";");
    line.split([';', '|'])
        .map(|c| {
            c.split_whitespace()
                .map(|w| w.trim_matches('"').to_owned())
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty())
        .collect()
}

fn binary_of_package(package: &str) -> &str {
    match package {
        "unbounded-testbed" => "unbounded-testbed",
        "unbounded-controller" => "unbounded-controller",
        "unbounded-bootserver" => "unbounded-bootserver",
        "unbounded-azure" => "unbounded-azure",
        "unbounded-agent" => "unbounded-agent",
        other => panic!("the docs run `cargo run -p {other}`: which binary is that?"),
    }
}

/// What to check for one command, if it is one this test knows.
fn check_of(words: &[String]) -> Option<Check> {
    let mut words: Vec<&str> = words.iter().map(String::as_str).collect();
    while matches!(words.first(), Some(&("sudo" | "eval" | "nice" | "time"))) {
        words.remove(0);
        if words.first().is_some_and(|w| w.starts_with('-')) {
            words.drain(..2.min(words.len()));
        }
    }
    let (first, rest) = words.split_first()?;
    match *first {
        "cargo" if rest.first() == Some(&"run") => {
            let mut package = None;
            let mut binary = None;
            let mut i = 1;
            while i < rest.len() && rest[i] != "--" {
                match rest[i] {
                    "-p" | "--package" => {
                        package = rest.get(i + 1).copied();
                        i += 1;
                    }
                    "--bin" => {
                        binary = rest.get(i + 1).copied();
                        i += 1;
                    }
                    _ => {}
                }
                i += 1;
            }
            let args: Vec<String> = rest.iter().skip(i + 1).map(|s| (*s).to_owned()).collect();
            let binary = match (binary, package) {
                (Some(b), _) => b.to_owned(),
                (None, Some(p)) => binary_of_package(p).to_owned(),
                (None, None) => return None,
            };
            Some(Check::Binary(binary, args))
        }
        "kubectl" => Some(Check::Kubectl(
            rest.iter().map(|s| (*s).to_owned()).collect(),
        )),
        program if program.starts_with("scripts/") => Some(Check::Script(program.to_owned())),
        program if program.starts_with("target/") || program.starts_with("unbounded-") => {
            let name = Path::new(program).file_name()?.to_str()?.to_owned();
            Some(Check::Binary(
                name,
                rest.iter().map(|s| (*s).to_owned()).collect(),
            ))
        }
        _ => None,
    }
}

/// Arguments as `--help` will see them: placeholders (`<...>`), synopses (`[--flag N]`) and
/// shell variables cannot be parsed, so a command that holds one is checked up to it (and
/// without the flag whose value it is).
fn parseable(args: &[String]) -> Vec<String> {
    let placeholder = |a: &String| ['<', '$', '…', '[', ']'].iter().any(|c| a.contains(*c));
    let mut kept: Vec<String> = args
        .iter()
        .take_while(|a| !placeholder(a))
        .cloned()
        .collect();
    if kept.len() < args.len()
        && kept
            .last()
            .is_some_and(|a| a.starts_with("--") && !a.contains('='))
    {
        kept.pop();
    }
    kept
}

fn kubectl() -> PathBuf {
    unbounded_testbed::cluster::Binaries::ensure()
        .expect("the Kubernetes binaries (scripts/test builds them first)")
        .kubectl
}

#[test]
fn the_commands_line_parser_finds_commands() {
    let text = "run `cargo run -p unbounded-testbed -- up --machines 3` then\n\n```sh\n\
        eval \"$(cargo run -q -p unbounded-testbed -- up | tail -1)\"; export KUBECONFIG\n\
        kubectl get machines,nodes   # look\nscripts/test\n```\n```yaml\nkubectl: no\n```\n";
    let checks: Vec<Check> = command_lines(text)
        .iter()
        .flat_map(|l| commands_of(l))
        .filter_map(|c| check_of(&c))
        .collect();
    assert_eq!(
        checks,
        [
            Check::Binary(
                "unbounded-testbed".into(),
                vec!["up".into(), "--machines".into(), "3".into()]
            ),
            Check::Binary("unbounded-testbed".into(), vec!["up".into()]),
            Check::Kubectl(vec!["get".into(), "machines,nodes".into()]),
            Check::Script("scripts/test".into()),
        ]
    );
}

#[test]
fn every_command_in_the_docs_is_accepted() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        let name = document
            .strip_prefix(workspace())
            .unwrap_or(&document)
            .display()
            .to_string();
        for line in command_lines(&text) {
            for words in commands_of(&line) {
                let Some(check) = check_of(&words) else {
                    continue;
                };
                checked += 1;
                let outcome = match &check {
                    Check::Script(script) => {
                        let path = workspace().join(script);
                        path.is_file()
                            .then_some(())
                            .ok_or_else(|| format!("{script} does not exist"))
                    }
                    // crdgen takes paths, not flags: it must exist.
                    Check::Binary(binary, _) if binary == "crdgen" => {
                        workspace_binary(binary);
                        Ok(())
                    }
                    Check::Binary(binary, args) => {
                        accepts_with_help(&workspace_binary(binary), &parseable(args))
                    }
                    Check::Kubectl(args) => accepts_with_help(&kubectl(), &parseable(args)),
                };
                if let Err(why) = outcome {
                    failures.push(format!("{name}: `{}`: {why}", words.join(" ")));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} commands found in the docs");
    assert!(
        failures.is_empty(),
        "commands in the docs that the code refuses:\n{}",
        failures.join("\n")
    );
}
