//! The file system as the HTTP image routes read it: a [`tower_http`] `ServeDir` backend that
//! opens, stats and reads on the calling task instead of tokio's blocking pool.
//!
//! Why: profiling the image route (`perf record` of a 50 MiB download, issue 14) showed a
//! third of the server's time in context switches: `tokio::fs` sends every open, stat and
//! 64 KiB read to a blocking-pool thread and back. Images are local files, mostly in the page
//! cache, where an open or a read takes microseconds, less than the hop itself; nginx reads
//! them from its event loop the same way. The cost is that a read from a slow disk holds a
//! runtime worker for that read. `ServeDir` keeps everything else: path confinement, ranges,
//! conditional requests, `HEAD`, content types.
//!
//! A file is opened non-blocking (a FIFO would otherwise wait for a writer and hold the
//! worker) and kept only if it is a regular file or a directory; the metadata read then on
//! the open file is the one `ServeDir` gets, so the headers and the body describe the same
//! file, and the body ends at the length it had when opened (its `Content-Length`).
//!
//! A request served inside [`record_opened`] leaves the file it opened there, so that
//! [`crate::http::sendfile`] can send its bytes with `sendfile` instead of this reader.

use std::cell::RefCell;
use std::fs::{File, Metadata, OpenOptions};
use std::future::{Ready, ready};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, ReadBuf};
use tower_http::services::fs::{Backend, File as BackendFile};

/// How much of a file one body chunk carries: large enough that a 50 MiB image is a few
/// hundred chunks (each a poll, an allocation and a `writev`), small enough per connection.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// Reads files on the calling task (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct InlineFs;

/// An open file, read and sought without leaving the task.
#[derive(Debug)]
pub struct InlineFile {
    file: Arc<File>,
    metadata: Metadata,
    /// Bytes from the current position to the length at opening: a read zero-fills only
    /// what it can fill, not the whole chunk buffer (a 1 KiB file, 1 KiB), and stops there.
    remaining: u64,
    /// The outcome of the last `start_seek`, for `poll_complete`.
    seek: Option<io::Result<u64>>,
}

/// An error of opening or reading the metadata of a path the client chose: `NotFound` (a
/// 404 from `ServeDir`) when the name itself is the cause (too long, through a file, a loop
/// of links, not allowed), so that no request path can make the server answer 500;
/// failures of the server (`EIO`, `EMFILE`, ...) stay what they are.
fn client_path_error(error: io::Error) -> io::Error {
    let named_badly = matches!(
        error.kind(),
        io::ErrorKind::InvalidInput
            | io::ErrorKind::InvalidFilename
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::IsADirectory
            | io::ErrorKind::PermissionDenied
    ) || matches!(
        error.raw_os_error(),
        Some(code) if code == rustix::io::Errno::NAMETOOLONG.raw_os_error()
            || code == rustix::io::Errno::LOOP.raw_os_error()
    );
    if named_badly {
        io::Error::new(io::ErrorKind::NotFound, error)
    } else {
        error
    }
}

/// The metadata of `path` if it is a regular file or a directory; `NotFound` otherwise.
fn servable(path: &PathBuf) -> io::Result<Metadata> {
    let metadata = std::fs::metadata(path).map_err(client_path_error)?;
    if metadata.is_file() || metadata.is_dir() {
        Ok(metadata)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "neither a regular file nor a directory",
        ))
    }
}

tokio::task_local! {
    /// The file the request being served opened last, when it is served inside
    /// [`record_opened`].
    static OPENED: RefCell<Option<Arc<File>>>;
}

/// Runs `serve` (one request) and returns what it answered with the file it opened through
/// [`InlineFs`], if any.
pub async fn record_opened<F: Future>(serve: F) -> (F::Output, Option<Arc<File>>) {
    OPENED
        .scope(RefCell::new(None), async move {
            let output = serve.await;
            let opened = OPENED.with(|opened| opened.borrow_mut().take());
            (output, opened)
        })
        .await
}

fn open(path: &PathBuf) -> io::Result<InlineFile> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(client_path_error)?;
    let metadata = file.metadata()?;
    if !(metadata.is_file() || metadata.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "neither a regular file nor a directory",
        ));
    }
    let file = Arc::new(file);
    // Outside `record_opened` there is nothing to record (and nothing is).
    let _ = OPENED.try_with(|opened| *opened.borrow_mut() = Some(file.clone()));
    Ok(InlineFile {
        file,
        remaining: metadata.len(),
        metadata,
        seek: None,
    })
}

impl Backend for InlineFs {
    type File = InlineFile;
    type Metadata = Metadata;
    type OpenFuture = Ready<io::Result<InlineFile>>;
    type MetadataFuture = Ready<io::Result<Metadata>>;

    fn open(&self, path: PathBuf) -> Self::OpenFuture {
        ready(open(&path))
    }

    fn metadata(&self, path: PathBuf) -> Self::MetadataFuture {
        ready(servable(&path))
    }
}

impl AsyncRead for InlineFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.remaining == 0 {
            return Poll::Ready(Ok(())); // the end, as the headers said
        }
        let want = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(buf.remaining());
        let target = buf.initialize_unfilled_to(want);
        let read = loop {
            match (&*self.file).read(target) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        buf.advance(read);
        self.remaining = self.remaining.saturating_sub(read as u64);
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for InlineFile {
    fn start_seek(mut self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let sought = (&*self.file).seek(position);
        if let Ok(at) = sought {
            self.remaining = self.metadata.len().saturating_sub(at);
        }
        self.seek = Some(sought);
        Ok(())
    }

    fn poll_complete(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(match self.seek.take() {
            Some(outcome) => outcome,
            None => (&*self.file).stream_position(),
        })
    }
}

impl BackendFile for InlineFile {
    type Metadata = Metadata;
    type MetadataFuture<'a> = Ready<io::Result<Metadata>>;

    fn metadata(&self) -> Self::MetadataFuture<'_> {
        ready(Ok(self.metadata.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    #[tokio::test]
    async fn reads_whole_files_ranges_and_refuses_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let content: Vec<u8> = (0..CHUNK_BYTES * 2 + 17).map(|i| i as u8).collect();
        std::fs::write(&path, &content).unwrap();

        let mut file = InlineFs.open(path.clone()).await.unwrap();
        let mut all = Vec::new();
        file.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, content);

        let mut file = InlineFs.open(path.clone()).await.unwrap();
        assert_eq!(file.seek(SeekFrom::Start(1000)).await.unwrap(), 1000);
        let mut part = vec![0; 10];
        file.read_exact(&mut part).await.unwrap();
        assert_eq!(part, content[1000..1010]);
        let metadata = BackendFile::metadata(&file).await.unwrap();
        assert_eq!(metadata.len(), content.len() as u64);

        // A file that grew after it was opened ends where it ended then (the response's
        // Content-Length came from the same metadata).
        let mut file = InlineFs.open(path.clone()).await.unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| io::Write::write_all(&mut f, b"tail"))
            .unwrap();
        let mut grown = Vec::new();
        file.read_to_end(&mut grown).await.unwrap();
        assert_eq!(grown, content);

        assert!(
            InlineFs
                .metadata(dir.path().to_owned())
                .await
                .unwrap()
                .is_dir()
        );
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let refused = InlineFs.open(fifo).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_request_served_inside_record_opened_leaves_the_file_it_opened() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, b"content").unwrap();

        // Opened while the request is polled (as `ServeDir` does), not when it is built.
        let (served, opened) = record_opened(async { InlineFs.open(path.clone()).await }).await;
        let served = served.unwrap();
        let opened = opened.expect("the file opened is recorded");
        assert!(Arc::ptr_eq(&served.file, &opened));
        assert_eq!(
            opened.metadata().unwrap().ino(),
            std::fs::metadata(&path).unwrap().ino()
        );
        // A request that opens nothing records nothing; outside a scope, opening works.
        let ((), opened) = record_opened(async {}).await;
        assert!(opened.is_none());
        assert!(InlineFs.open(path).await.is_ok());
    }
}
