//! The filesystem side of a pave after the image is unpacked: kubelet's and the
//! configuration's files written into the staging root, kubelet's identity carried over
//! from the old root, the old root replaced by the new one, the `.nspawn` settings and the
//! container's bus directory.
//!
//! All of it is blocking work on trees of hundreds of MB (removing a root alone takes
//! seconds), and the agent's runtime has two async worker threads that also keep its
//! watches, its credentials and its operations going: each step runs on tokio's blocking
//! pool ([`tokio::task::spawn_blocking`]), never on a worker.

use std::path::{Path, PathBuf};

use crate::rootfs::{self, RootfsError};

/// Errors of the filesystem steps.
#[derive(Debug, thiserror::Error)]
pub enum ContainerRootError {
    /// A file or directory operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file from the configuration could not be written.
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// The blocking task did not finish (it panicked).
    #[error("{what}: the blocking task failed: {source}")]
    Task {
        /// What was being done.
        what: &'static str,
        /// Why (it panicked or was cancelled).
        #[source]
        source: tokio::task::JoinError,
    },
}

impl ContainerRootError {
    /// A short reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Rootfs(e) => e.reason(),
            Self::Io { .. } | Self::Task { .. } => "FilesystemError",
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ContainerRootError {
    let what = what.into();
    move |source| ContainerRootError::Io { what, source }
}

/// Runs `work` on the blocking pool.
async fn off_workers<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T, ContainerRootError> + Send + 'static,
) -> Result<T, ContainerRootError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|source| ContainerRootError::Task { what, source })?
}

/// A file to write into a root: its absolute path inside, its content and its mode.
pub type RootFile = (String, Vec<u8>, u32);

/// Writes `files` into `root` ([`rootfs::write_file`]: no symlink followed out of it).
pub async fn write_files(root: &Path, files: Vec<RootFile>) -> Result<(), ContainerRootError> {
    let root = root.to_path_buf();
    off_workers("writing files into the new root", move || {
        for (path, content, mode) in &files {
            rootfs::write_file(&root, path, content, *mode)?;
        }
        Ok(())
    })
    .await
}

/// What of kubelet's state identifies the Node (relative to a container root).
const KUBELET_IDENTITY: [&str; 2] = ["var/lib/kubelet/pki", "var/lib/kubelet/kubeconfig"];

/// Copies kubelet's client certificate (it rotates itself) and kubeconfig from the old root
/// into the new one, so that a repaved Node joins again as the same Node user without a
/// new bootstrap token. Nothing to copy is fine.
pub async fn carry_kubelet_identity(
    old_root: &Path,
    new_root: &Path,
) -> Result<(), ContainerRootError> {
    let (old_root, new_root) = (old_root.to_path_buf(), new_root.to_path_buf());
    off_workers("carrying kubelet's identity over", move || {
        preserve_kubelet_identity(&old_root, &new_root)
    })
    .await
}

fn preserve_kubelet_identity(old_root: &Path, new_root: &Path) -> Result<(), ContainerRootError> {
    for relative in KUBELET_IDENTITY {
        let from = old_root.join(relative);
        if !from.exists() {
            continue;
        }
        let to = new_root.join(relative);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        copy_tree(&from, &to)?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), ContainerRootError> {
    let meta =
        std::fs::symlink_metadata(from).map_err(io(format!("reading {}", from.display())))?;
    if meta.file_type().is_symlink() {
        // kubelet-client-current.pem is a symlink to the dated certificate beside it.
        let target = std::fs::read_link(from).map_err(io(format!("reading {}", from.display())))?;
        let _ = std::fs::remove_file(to);
        std::os::unix::fs::symlink(&target, to).map_err(io(format!("linking {}", to.display())))
    } else if meta.is_dir() {
        std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
        let entries = std::fs::read_dir(from).map_err(io(format!("reading {}", from.display())))?;
        for entry in entries {
            let entry = entry.map_err(io(format!("reading {}", from.display())))?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to)
            .map(|_| ())
            .map_err(io(format!("copying {}", from.display())))
    }
}

/// Puts the new root in place of the old one (removed first, if any).
pub async fn replace(staging: &Path, root: &Path) -> Result<(), ContainerRootError> {
    let (staging, root) = (staging.to_path_buf(), root.to_path_buf());
    off_workers("replacing the container root", move || {
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(io(format!("removing {}", root.display())))?;
        }
        std::fs::rename(&staging, &root)
            .map_err(io(format!("moving the new root to {}", root.display())))
    })
    .await
}

/// Writes the container's `.nspawn` settings as `<dir>/<node>.nspawn` and empties its bus
/// directory.
pub async fn write_settings(
    nspawn_dir: &Path,
    node: &str,
    settings: String,
    bus_dir: &Path,
    log_dir: &Path,
) -> Result<(), ContainerRootError> {
    let (nspawn_dir, bus_dir, log_dir): (PathBuf, PathBuf, PathBuf) = (
        nspawn_dir.to_path_buf(),
        bus_dir.to_path_buf(),
        log_dir.to_path_buf(),
    );
    let file = nspawn_dir.join(format!("{node}.nspawn"));
    off_workers("writing the container's settings", move || {
        std::fs::create_dir_all(&nspawn_dir).map_err(io("creating the nspawn directory"))?;
        // The settings bind it: systemd-nspawn refuses to start without the source.
        std::fs::create_dir_all(&log_dir).map_err(io("creating the agent's log directory"))?;
        std::fs::write(&file, settings).map_err(io("writing the nspawn settings"))?;
        reset_dir(&bus_dir)
    })
    .await
}

/// The node image's files that its start reads first and most of, relative to its root:
/// systemd's, containerd's and kubelet's executables (kubelet's alone is tens of MB).
const START_FILES: [&str; 7] = [
    "usr/lib/systemd/systemd",
    "usr/lib/systemd/systemd-journald",
    "usr/local/bin/containerd",
    "usr/local/bin/containerd-shim-runc-v2",
    "usr/sbin/runc",
    "usr/local/bin/kubelet",
    "usr/sbin/xtables-nft-multi",
];

/// Asks the kernel to read the container's start files ahead (`POSIX_FADV_WILLNEED`) from
/// a root on a disk, just before the container starts: the reads go to the disk in large
/// sequential requests while the container's systemd comes up, instead of one page fault at
/// a time when each program runs (a container from RAM has its files in memory already).
/// Returns how many bytes were asked for. Best effort: a file that is missing, a symlink or
/// not a regular file is skipped, and nothing fails.
pub async fn read_ahead(root: &Path) -> u64 {
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || {
        START_FILES
            .iter()
            .map(|relative| read_ahead_file(&root.join(relative)).unwrap_or(0))
            .sum()
    })
    .await
    .unwrap_or(0)
}

#[allow(unsafe_code)] // one libc call, on a descriptor this function owns
fn read_ahead_file(path: &Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() {
        return None;
    }
    // SAFETY: posix_fadvise on a descriptor this function owns; it only advises the kernel.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    (advised == 0).then_some(metadata.len())
}

fn reset_dir(dir: &Path) -> Result<(), ContainerRootError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(format!("clearing {}", dir.display())))?;
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_start_files_are_read_ahead_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        std::fs::write(root.join("usr/local/bin/kubelet"), vec![7u8; 3000]).unwrap();
        std::fs::write(root.join("usr/local/bin/containerd"), vec![7u8; 500]).unwrap();
        // A symlink out of the root and a directory are not followed or read.
        std::fs::create_dir_all(root.join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("usr/sbin/runc")).unwrap();
        std::fs::create_dir_all(root.join("usr/lib/systemd/systemd")).unwrap();
        assert_eq!(read_ahead(root).await, 3500);
        assert_eq!(read_ahead(&root.join("nowhere")).await, 0);
    }

    #[test]
    fn kubelet_identity_moves_into_the_new_root() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        let pki = old.join("var/lib/kubelet/pki");
        std::fs::create_dir_all(&pki).unwrap();
        std::fs::write(pki.join("kubelet-client-2026.pem"), "cert").unwrap();
        std::os::unix::fs::symlink(
            "kubelet-client-2026.pem",
            pki.join("kubelet-client-current.pem"),
        )
        .unwrap();
        std::fs::write(old.join("var/lib/kubelet/kubeconfig"), "kc").unwrap();
        std::fs::write(old.join("var/lib/kubelet/other"), "not identity").unwrap();
        std::fs::create_dir_all(&new).unwrap();
        preserve_kubelet_identity(&old, &new).unwrap();
        let moved = new.join("var/lib/kubelet/pki/kubelet-client-current.pem");
        assert_eq!(std::fs::read_to_string(&moved).unwrap(), "cert");
        assert!(
            std::fs::symlink_metadata(&moved)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(new.join("var/lib/kubelet/kubeconfig")).unwrap(),
            "kc"
        );
        assert!(!new.join("var/lib/kubelet/other").exists());
        preserve_kubelet_identity(&dir.path().join("absent"), &new).unwrap();
    }

    /// The steps run on the blocking pool: on a current-thread runtime, the thread that
    /// polls is the only async worker, so a step that ran inline would run on it.
    #[test]
    fn steps_run_off_the_async_workers() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let worker = std::thread::current().id();
        let dir = tempfile::tempdir().unwrap();
        let (staging, root) = (dir.path().join("staging"), dir.path().join("root"));
        std::fs::create_dir_all(root.join("old")).unwrap();
        std::fs::create_dir_all(&staging).unwrap();
        runtime.block_on(async {
            let seen = off_workers("naming the thread", || Ok(std::thread::current().id()))
                .await
                .unwrap();
            assert_ne!(seen, worker);
            write_files(
                &staging,
                vec![("/etc/hostname".into(), b"n\n".to_vec(), 0o644)],
            )
            .await
            .unwrap();
            replace(&staging, &root).await.unwrap();
        });
        assert!(!staging.exists() && !root.join("old").exists());
        assert_eq!(std::fs::read(root.join("etc/hostname")).unwrap(), b"n\n");
    }
}
