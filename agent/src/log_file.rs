//! The agent's log, also kept in a file of the host that the node container sees read-only
//! (`/var/log/unbounded/agent.log`, bound by the `.nspawn` settings): the Node's kubelet
//! serves its `/var/log` (`enableSystemLogHandler`), so `kubectl unbounded logs` reads the
//! agent's lines through the API server (`/api/v1/nodes/<node>/proxy/logs/unbounded/agent.log`)
//! without a way into the host. The host's root is RAM on a network-booted machine: the file
//! is capped ([`CAP_BYTES`]); past the cap it becomes `agent.log.1` (the one before is
//! dropped), so both together hold at most twice the cap. Plain text, no colour.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The host directory of the file (bound into the container at [`CONTAINER_LOG_DIR`]).
pub const LOG_DIR: &str = "/var/log/unbounded";
/// Where the container sees it (kubelet's `/logs/` serves the container's `/var/log`).
pub const CONTAINER_LOG_DIR: &str = "/var/log/unbounded";
/// The file's name.
pub const LOG_FILE: &str = "agent.log";
/// Its size before it is rotated.
pub const CAP_BYTES: u64 = 4 * 1024 * 1024;

/// Whether a file of `size` bytes is rotated before `incoming` more bytes are written: when
/// they would pass `cap` (an empty file takes any line, however long).
pub fn rotates(size: u64, incoming: usize, cap: u64) -> bool {
    size > 0 && size.saturating_add(incoming as u64) > cap
}

#[derive(Debug)]
struct Open {
    file: File,
    size: u64,
}

/// The capped file, shared by the log's writers.
#[derive(Debug, Clone)]
pub struct CappedFile {
    path: PathBuf,
    cap: u64,
    open: Arc<Mutex<Open>>,
}

impl CappedFile {
    /// Opens (appends to) `dir/agent.log`, creating `dir`.
    pub fn open(dir: &Path, cap: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let file = append(&path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path,
            cap,
            open: Arc::new(Mutex::new(Open { file, size })),
        })
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Write for CappedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| io::Error::other("the log file's lock is poisoned"))?;
        if rotates(open.size, buf.len(), self.cap) {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(&self.path, &old)?;
            *open = Open {
                file: append(&self.path)?,
                size: 0,
            };
        }
        open.file.write_all(buf)?;
        open.size += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

    use super::*;

    #[test]
    fn rotation_rule() {
        let cases = [
            (0, 10, 5, false),
            (0, 0, 5, false),
            (3, 2, 5, false),
            (3, 3, 5, true),
            (5, 1, 5, true),
            (u64::MAX, 1, 5, true),
        ];
        for (size, incoming, cap, expected) in cases {
            assert_eq!(
                rotates(size, incoming, cap),
                expected,
                "{size}+{incoming}>{cap}"
            );
        }
    }

    #[test]
    fn the_file_is_capped_and_the_previous_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("unbounded");
        let mut file = CappedFile::open(&logs, 21).unwrap();
        for line in ["line one\n", "line two\n", "line three\n", "line four\n"] {
            file.write_all(line.as_bytes()).unwrap();
        }
        let read = |name: &str| std::fs::read_to_string(logs.join(name)).unwrap();
        assert_eq!(read("agent.log"), "line three\nline four\n");
        assert_eq!(read("agent.log.1"), "line one\nline two\n");
        // Reopened (the agent restarted): it appends, counting what is there.
        let mut again = CappedFile::open(&logs, 21).unwrap();
        again.write_all(b"five\n").unwrap();
        assert_eq!(read("agent.log"), "five\n");
        assert_eq!(read("agent.log.1"), "line three\nline four\n");
    }
}
