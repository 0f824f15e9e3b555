//! The image cache: keys over every input, a build run only when its key is new, progress
//! per step and pruning of the entries a newer key replaced.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::{ImagesError, images_cache, step_err, step_failed};
use crate::failure::Failure;
use crate::oci;

/// Progress lines, with the step number and how long each took.
#[derive(Debug)]
pub(super) struct Progress {
    pub(super) total: usize,
    pub(super) done: usize,
}

impl Progress {
    pub(super) fn run<T>(
        &mut self,
        what: &str,
        f: impl FnOnce() -> Result<(T, bool), ImagesError>,
    ) -> Result<T, ImagesError> {
        self.done += 1;
        eprintln!("images: [{}/{}] {what}", self.done, self.total);
        let started = Instant::now();
        let (value, cached) = f()?;
        let how = if cached { "cached" } else { "built" };
        eprintln!(
            "images: [{}/{}] {what}: {how} in {:.1} s",
            self.done,
            self.total,
            started.elapsed().as_secs_f64()
        );
        Ok(value)
    }
}

/// A cache key: SHA-256 over labelled parts, shortened.
#[derive(Debug, Default)]
pub struct Key(String);

impl Key {
    /// Adds a labelled string.
    pub fn text(mut self, label: &str, value: &str) -> Self {
        let _ = writeln!(self.0, "{label}={}", oci::sha256_hex(value.as_bytes()));
        self
    }

    /// Adds a file's content (and, for a tree, every file's relative path, mode and content).
    pub fn path(mut self, label: &str, path: &Path) -> Result<Self, ImagesError> {
        let mut entries = Vec::new();
        collect(path, path, &mut entries)?;
        entries.sort();
        for (relative, mode, digest) in entries {
            let _ = writeln!(self.0, "{label}:{relative}:{mode:o}={digest}");
        }
        Ok(self)
    }

    /// The key.
    pub fn finish(&self) -> String {
        oci::sha256_hex(self.0.as_bytes())
            .chars()
            .take(16)
            .collect()
    }
}

pub(super) fn collect(
    base: &Path,
    path: &Path,
    out: &mut Vec<(String, u32, String)>,
) -> Result<(), ImagesError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::symlink_metadata(path)
        .map_err(|e| step_failed("cache key", Failure::new(path.display(), e)))?;
    let relative = path
        .strip_prefix(base)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if meta.is_dir() {
        let entries = fs::read_dir(path)
            .map_err(|e| step_failed("cache key", Failure::new(path.display(), e)))?;
        for entry in entries {
            let entry = entry.map_err(|e| step_failed("cache key", Failure::of(e)))?;
            collect(base, &entry.path(), out)?;
        }
    } else if meta.file_type().is_symlink() {
        let target = fs::read_link(path).map_err(|e| step_failed("cache key", Failure::of(e)))?;
        out.push((relative, 0, format!("-> {}", target.display())));
    } else {
        let digest = file_sha256(path).map_err(|e| step_failed("cache key", e))?;
        out.push((relative, meta.permissions().mode() & 0o7777, digest));
    }
    Ok(())
}

/// Hex SHA-256 of a file, streamed.
pub fn file_sha256(path: &Path) -> Result<String, Failure> {
    use std::io::Read;
    let mut file = fs::File::open(path).map_err(|e| Failure::new(path.display(), e))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Failure::new(path.display(), e))?;
        if n == 0 {
            break;
        }
        context.update(buf.get(..n).unwrap_or_default());
    }
    Ok(oci::hex(context.finish().as_ref()))
}

/// Runs a command with its output captured; on failure the error carries its tail.
pub(super) fn run_logged(
    step: &'static str,
    command: &mut Command,
    log: &Path,
) -> Result<(), ImagesError> {
    let file = fs::File::create(log).map_err(|e| step_failed(step, Failure::of(e)))?;
    let err = file
        .try_clone()
        .map_err(|e| step_failed(step, Failure::of(e)))?;
    let status = command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| step_failed(step, Failure::new(format!("{command:?}"), e)))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(25).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(step_err(
        step,
        format!("{status} (log {}):\n{}", log.display(), tail.join("\n")),
    ))
}

/// Builds into `cache/<name>-<key>/` unless a completed build is there; returns the dir
/// and whether it was cached.
pub(super) fn cached_build(
    name: &str,
    key: &str,
    build: impl FnOnce(&Path) -> Result<(), ImagesError>,
) -> Result<(PathBuf, bool), ImagesError> {
    let dir = images_cache().join(format!("{name}-{key}"));
    let stamp = dir.join(".complete");
    if stamp.exists() {
        return Ok((dir, true));
    }
    if dir.exists() {
        let _ = fs::remove_dir_all(&dir);
    }
    fs::create_dir_all(&dir).map_err(|e| step_failed("cache", Failure::new(dir.display(), e)))?;
    build(&dir)?;
    fs::write(&stamp, b"").map_err(|e| step_failed("cache", Failure::of(e)))?;
    prune(&images_cache(), name, &dir);
    Ok((dir, false))
}

/// Keeps only the newest build of each artifact (they are hundreds of MB each): the
/// entries of `cache` named `<name>-<key>`, but `keep`. Another name that starts with
/// `name` (`node-v1.34.4`, the node image of another Kubernetes release) is another artifact.
pub(super) fn prune(cache: &Path, name: &str, keep: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_sibling = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with('-') && rest.len() == 17);
        if is_sibling && path != keep {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_other_artifacts_and_other_releases() {
        let cache = tempfile::tempdir().unwrap();
        let entry = |name: &str| {
            let path = cache.path().join(name);
            fs::create_dir_all(&path).unwrap();
            path
        };
        let old_default = entry("node-0123456789abcdef");
        let new_default = entry("node-fedcba9876543210");
        let other_release = entry("node-v1.34.4-0123456789abcdef");
        let tools = entry("node-tools-0123456789abcdef");
        prune(cache.path(), "node", &new_default);
        assert!(
            !old_default.exists(),
            "the default image's older build goes"
        );
        assert!(new_default.exists() && other_release.exists() && tools.exists());
        let newer_other = entry("node-v1.34.4-fedcba9876543210");
        prune(cache.path(), "node-v1.34.4", &newer_other);
        assert!(!other_release.exists(), "that release's older build goes");
        assert!(newer_other.exists() && new_default.exists() && tools.exists());
    }

    #[test]
    fn keys_change_with_any_input() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), b"one").unwrap();
        let key = || {
            Key::default()
                .text("v", "1")
                .path("tree", dir.path())
                .unwrap()
                .finish()
        };
        let first = key();
        assert_eq!(first, key(), "stable");
        fs::write(dir.path().join("a"), b"two").unwrap();
        let second = key();
        assert_ne!(first, second, "content");
        fs::write(dir.path().join("b"), b"").unwrap();
        assert_ne!(second, key(), "a new file");
        assert_ne!(
            Key::default().text("v", "1").finish(),
            Key::default().text("v", "2").finish()
        );
    }
}
