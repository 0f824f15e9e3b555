//! The Rust binaries that go into the images: cargo builds (the host's agent and the static
//! release build of every container binary), their crates and toolchain for the SBOMs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ImagesError, step_err, step_failed};
use crate::containers::{self, PROJECT_IMAGES, RustBinary};
use crate::failure::Failure;
use crate::sbom;

/// The variables among `names` that `cargo run` set for this program and a nested
/// `cargo build` must not inherit: a build script that tracks one (ring's tracks
/// `CARGO_MANIFEST_DIR`) reruns when its value differs from the last build's, and everything
/// above it rebuilds, each time `cargo run -p unbounded-testbed` and the builds it starts
/// alternate (minutes per `bench` run).
pub fn set_by_cargo_run(names: impl Iterator<Item = String>) -> Vec<String> {
    names
        .filter(|name| {
            name.starts_with("CARGO_PKG_")
                || matches!(
                    name.as_str(),
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_MANIFEST_LINKS"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                )
        })
        .collect()
}

/// What a cargo build selects and how.
#[derive(Debug, Clone, Copy)]
enum Selection<'a> {
    /// For this host (the lab's and the benchmarks' binaries): the workspace but the testbed,
    /// debug or release. Every such build resolves features as `cargo test --workspace` does
    /// (the manifests keep no feature that only a dev-dependency turns on), so one compiled
    /// dependency graph serves them all and `scripts/test`'s tests; selecting only the
    /// binaries' packages would resolve another and compile it again. The testbed is left
    /// out so that `cargo run -p unbounded-testbed`, which may be running, keeps its build.
    Host { release: bool },
    /// For the images: these packages, release, static.
    StaticRelease { packages: &'a [&'a str] },
}

/// Builds binaries of this workspace for this host (debug or release) and returns each one's
/// path, in the order of `binaries`.
pub fn host_build(binaries: &[&str], release: bool) -> Result<Vec<PathBuf>, ImagesError> {
    cargo_build(Selection::Host { release }, binaries)
}

/// Builds Rust binaries with cargo and returns each one's path.
fn cargo_build(selection: Selection<'_>, binaries: &[&str]) -> Result<Vec<PathBuf>, ImagesError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args(["build", "--message-format=json-render-diagnostics"]);
    for name in set_by_cargo_run(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok())) {
        command.env_remove(name);
    }
    match selection {
        Selection::Host { release } => {
            command.args(["--workspace", "--exclude", "unbounded-testbed"]);
            if release {
                command.arg("--release");
            }
        }
        Selection::StaticRelease { packages } => {
            // glibc, linked statically: no musl toolchain needed, nothing to install in the
            // image. Source paths (in panic messages) are remapped, so that the same commit
            // gives the same binary in any checkout and under any home directory.
            command.args(["--release", "--target", containers::TARGET]);
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(Path::new("."))
                .to_path_buf();
            let cargo_home = std::env::var_os("CARGO_HOME").map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cargo")
                },
                PathBuf::from,
            );
            command.env(
                "RUSTFLAGS",
                format!(
                    "-C target-feature=+crt-static --remap-path-prefix={}=/unbounded --remap-path-prefix={}=/cargo",
                    workspace.display(),
                    cargo_home.display()
                ),
            );
            for package in packages {
                command.args(["-p", package]);
            }
            for binary in binaries {
                command.args(["--bin", binary]);
            }
        }
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| step_failed("cargo build", Failure::of(e)))?;
    if !output.status.success() {
        return Err(step_err("cargo build", format!("{}", output.status)));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && let Some(executable) = message["executable"].as_str()
        {
            found.push(PathBuf::from(executable));
        }
    }
    binaries
        .iter()
        .map(|name| {
            found
                .iter()
                .find(|p| p.file_name().and_then(|n| n.to_str()) == Some(name))
                .cloned()
                .ok_or_else(|| step_err("cargo build", format!("no binary {name} was built")))
        })
        .collect()
}

/// One line of a command's standard output, or an error naming the command.
pub(super) fn command_line(
    step: &'static str,
    command: &mut Command,
) -> Result<String, ImagesError> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| step_failed(step, Failure::new(format!("{command:?}"), e)))?;
    if !output.status.success() {
        return Err(step_err(step, format!("{command:?}: {}", output.status)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The crates linked into `package`'s binary for the image target, from `cargo tree`.
pub(super) fn crates_of(package: &str) -> Result<Vec<sbom::Crate>, ImagesError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let text = command_line(
        "SBOM",
        Command::new(cargo)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .args([
                "tree",
                "--locked",
                "-p",
                package,
                "--target",
                containers::TARGET,
            ])
            .args(["--edges", "normal,no-proc-macro", "--prefix", "none"])
            .args(["--format", "{p}|{l}"]),
    )?;
    sbom::parse_cargo_tree(&text).map_err(|e| step_err("SBOM", e))
}

/// `rustc`'s version and the Debian version of the static C library.
pub(super) fn toolchain_versions() -> Result<(String, String), ImagesError> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = command_line("SBOM", Command::new(rustc).arg("--version"))?;
    let rustc = rustc
        .split_whitespace()
        .nth(1)
        .unwrap_or("unknown")
        .to_owned();
    let libc = command_line(
        "SBOM",
        Command::new("dpkg-query").args(["-W", "-f=${Version}", "libc6-dev"]),
    )?;
    Ok((rustc, libc.trim().to_owned()))
}

/// The agent's static release build and, for the container images, the three binaries'
/// in the same cargo run: one set of dependencies compiled once for both (a release build
/// of the dependencies is the longest step of a cold `images --containers`).
pub(super) fn release_builds(containers: bool) -> Result<(PathBuf, Vec<PathBuf>), ImagesError> {
    let mut packages = vec!["unbounded-agent"];
    if containers {
        packages.extend(PROJECT_IMAGES.iter().map(|i| i.package));
    }
    let mut built = cargo_build(
        Selection::StaticRelease {
            packages: &packages,
        },
        &packages,
    )?
    .into_iter();
    let agent = built
        .next()
        .ok_or_else(|| step_err("agent", "cargo built no agent"))?;
    Ok((agent, built.collect()))
}

/// The three images' binaries (as `release_builds` made them), each with its SBOM packages.
pub(super) fn rust_binaries(built: Vec<PathBuf>) -> Result<Vec<RustBinary>, ImagesError> {
    let packages: Vec<&str> = PROJECT_IMAGES.iter().map(|i| i.package).collect();
    let lock = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
        .map_err(|e| step_failed("SBOM", Failure::new("Cargo.lock", e)))?;
    let checksums = sbom::lock_checksums(&lock);
    let (rustc, libc) = toolchain_versions()?;
    packages
        .iter()
        .zip(built)
        .map(|(package, path)| {
            let crates = crates_of(package)?;
            Ok(RustBinary {
                package: (*package).to_owned(),
                path,
                packages: sbom::rust_packages(package, &crates, &checksums, &rustc, &libc),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_build_does_not_inherit_what_cargo_run_set() {
        let names = [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_PRIMARY_PACKAGE",
            // What the nested build needs stays.
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "PATH",
        ];
        assert_eq!(
            set_by_cargo_run(names.iter().map(|n| (*n).to_owned())),
            vec![
                "CARGO_MANIFEST_DIR",
                "CARGO_PKG_NAME",
                "CARGO_PKG_VERSION_MAJOR",
                "CARGO_PRIMARY_PACKAGE"
            ]
        );
    }
}
