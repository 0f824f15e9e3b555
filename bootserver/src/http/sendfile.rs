//! File bodies sent by the kernel (`sendfile(2)`) instead of copied through the server.
//!
//! Why: `bench http` measured 0.36–0.53 ms of our CPU per MB of a 50 MiB image against
//! nginx's 0.10 (issue 30). Every byte was read from the page cache into a buffer, handed
//! to hyper and copied again into the socket; nginx asks the kernel to send the file's
//! pages. hyper has no way to hand a file to the socket, so the two ends meet here:
//!
//! 1. [`FileSendListener`] accepts connections as [`FileSendStream`]s, each with an empty
//!    [`FileSends`] slot that the connection's requests see as an extension
//!    ([`HttpConnection`], turned into `ConnectInfo<SocketAddr>` and the slot by
//!    [`crate::http`]'s per-connection middleware).
//! 2. `ServeDir` answers as before (path confinement, ranges, conditional requests, `HEAD`,
//!    types); [`crate::files`] records the file it opened. For a `GET` answered 200 or 206
//!    with a length, the middleware arms the slot with that file, offset and length
//!    ([`FileSends::arm`]) and replaces the body with [`FileBody`]: the same number of bytes,
//!    all taken from one static buffer of zeros ([`PLACEHOLDER`]), which costs nothing to
//!    make.
//! 3. hyper writes the head and then the body's buffers with `writev` (it queues body
//!    buffers as they are when the stream says it writes vectored, which this one does).
//!    The stream recognises the placeholder by its address, sends the head with `MSG_MORE`
//!    and, for the placeholder's bytes, the file's bytes with `sendfile` from the armed
//!    offset, and tells hyper it wrote as many bytes as the file gave.
//!
//! What cannot go wrong silently: a placeholder byte is never written to the socket. A
//! placeholder with no armed file, ordinary bytes in the middle of an armed body, or a
//! head buffer with bytes after its end (hyper copying the body into its own buffer, which
//! it does only for a stream that does not write vectored) fail the connection; a file
//! that shrank below the length the headers promised ends it (`sendfile` gives 0 bytes)
//! as a short read of the old body did. Requests served without this listener (tests that
//! call the router directly, the fuzz target) have no slot and keep the ordinary body.

use std::fs::File;
use std::future::Future as _;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use axum::body::Bytes;
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The placeholder body's bytes: every [`FileBody`] chunk is a slice of this buffer, and a
/// slice of it in a write is how [`FileSendStream`] knows the file's bytes belong there.
pub static PLACEHOLDER: [u8; PLACEHOLDER_BYTES] = [0; PLACEHOLDER_BYTES];

/// The largest placeholder chunk: hyper queues a few of them; each becomes one `sendfile`.
const PLACEHOLDER_BYTES: usize = 1 << 20;

/// Whether a write's buffer is (part of) the placeholder.
fn is_placeholder(slice: &[u8]) -> bool {
    let start = PLACEHOLDER.as_ptr() as usize;
    let at = slice.as_ptr() as usize;
    !slice.is_empty() && at >= start && at + slice.len() <= start + PLACEHOLDER_BYTES
}

/// One armed file body: the file, where its next byte is, and how many bytes are still due.
#[derive(Debug)]
struct Armed {
    file: Arc<File>,
    offset: u64,
    remaining: u64,
    /// Some of the file's bytes have left: ordinary bytes now would land inside the body.
    started: bool,
    /// Counts the bytes sent.
    sent: Counter,
}

/// The file body a connection owes, if any; shared by the connection's stream and its
/// requests.
#[derive(Debug, Clone, Default)]
pub struct FileSends(Arc<Mutex<Option<Armed>>>);

impl FileSends {
    /// Arms the slot: the next `length` placeholder bytes written on the connection are
    /// `file`'s bytes from `offset`, counted in `sent` as they leave. Refused (false) while
    /// another body is still owed or for an empty body.
    pub fn arm(&self, file: Arc<File>, offset: u64, length: u64, sent: Counter) -> bool {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() || length == 0 {
            return false;
        }
        *slot = Some(Armed {
            file,
            offset,
            remaining: length,
            started: false,
            sent,
        });
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Armed>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A body of `length` placeholder bytes (see the module documentation).
#[derive(Debug)]
pub struct FileBody {
    remaining: u64,
}

impl FileBody {
    /// A body as long as the file part it stands for.
    pub fn new(length: u64) -> Self {
        Self { remaining: length }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let chunk = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(PLACEHOLDER_BYTES);
        self.remaining -= chunk as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            &PLACEHOLDER[..chunk],
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

fn broken(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// How many connections the HTTP server keeps open, and how long one may sit idle
/// (`http.maxConnections`, `http.idleSeconds`): a slow or silent client holds one place and
/// its buffers for at most the idle time, and never more than its share of the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// A connection that neither sends nor receives a byte for this long is closed.
    pub idle: std::time::Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            idle: std::time::Duration::from_secs(60),
        }
    }
}

/// The idle clock of one connection: reset by every byte read or written; a read that
/// waits past it fails with `TimedOut`, which ends the connection.
#[derive(Debug)]
pub(super) struct IdleClock {
    limit: std::time::Duration,
    last: tokio::time::Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl IdleClock {
    pub(super) fn new(limit: std::time::Duration) -> Self {
        let last = tokio::time::Instant::now();
        Self {
            limit,
            last,
            timer: Box::pin(tokio::time::sleep_until(last + limit)),
        }
    }

    fn touch(&mut self) {
        self.last = tokio::time::Instant::now();
    }

    /// Reads from `inner`, resetting the clock on every byte and failing with `TimedOut`
    /// once the connection has been idle past its limit.
    pub(super) fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        inner: &mut R,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                self.touch();
                Poll::Ready(result)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was idle too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Resets the clock when a write moved bytes.
    pub(super) fn wrote(&mut self, written: &Poll<io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0) {
            self.touch();
        }
    }

    /// Whether the connection has been idle past its limit; otherwise the timer is armed
    /// to wake `cx` when it would be.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let deadline = self.last + self.limit;
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if tokio::time::Instant::now() >= self.last + self.limit {
                return true;
            }
        }
    }
}

/// A TCP connection that sends armed file bodies with `sendfile`.
#[derive(Debug)]
pub struct FileSendStream {
    tcp: TcpStream,
    sends: FileSends,
    idle: IdleClock,
    /// Its place among the open connections, given back when it closes.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl FileSendStream {
    /// Wraps an accepted connection (idle limit: [`ConnectionLimits::default`]).
    pub fn new(tcp: TcpStream) -> Self {
        Self::with_limits(tcp, ConnectionLimits::default().idle, None)
    }

    fn with_limits(
        tcp: TcpStream,
        idle: std::time::Duration,
        place: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            tcp,
            sends: FileSends::default(),
            idle: IdleClock::new(idle),
            _place: place,
        }
    }

    /// The connection's slot, for its requests.
    pub fn sends(&self) -> &FileSends {
        &self.sends
    }

    /// Refuses ordinary bytes where they cannot be: inside an armed body that has started,
    /// or after the end of the head of an armed response (the body copied into the head's
    /// buffer: its placeholder bytes would go out).
    fn check_ordinary(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let slot = self.sends.lock();
        let Some(armed) = slot.as_ref() else {
            return Ok(());
        };
        if armed.started {
            return Err(broken("ordinary bytes inside a file body"));
        }
        let body_after_head = bufs.iter().any(|buf| {
            buf.windows(4)
                .position(|w| w == b"\r\n\r\n")
                .is_some_and(|end| end + 4 < buf.len())
        });
        if body_after_head {
            return Err(broken("a file body copied into the response head"));
        }
        Ok(())
    }

    /// Waits for the socket to be writable and runs one non-blocking send.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        mut send: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tcp.try_io(Interest::WRITABLE, || send(&self.tcp)) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                outcome => return Poll::Ready(outcome),
            }
        }
    }

    /// Sends up to `count` of the armed file's bytes in place of as many placeholder bytes.
    fn poll_send_file(&self, cx: &mut Context<'_>, count: usize) -> Poll<io::Result<usize>> {
        let mut slot = self.sends.lock();
        let Some(armed) = slot.as_mut() else {
            return Poll::Ready(Err(broken("a placeholder body with no file to send")));
        };
        let count = usize::try_from(armed.remaining)
            .unwrap_or(usize::MAX)
            .min(count);
        if count == 0 {
            return Poll::Ready(Err(broken("a placeholder body longer than its file")));
        }
        let mut offset = armed.offset;
        let sent = ready!(self.poll_send(cx, |tcp| {
            rustix::fs::sendfile(tcp, &*armed.file, Some(&mut offset), count)
                .map_err(io::Error::from)
        }))?;
        if sent == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than its response's Content-Length",
            )));
        }
        armed.offset += sent as u64;
        armed.remaining -= sent as u64;
        armed.started = true;
        armed.sent.inc_by(sent as u64);
        if armed.remaining == 0 {
            *slot = None;
        }
        Poll::Ready(Ok(sent))
    }

    /// Sends ordinary bytes that a file body follows at once, held back (`MSG_MORE`) so that
    /// they leave in the same segment as its first bytes.
    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, |tcp| {
            rustix::net::sendmsg(
                tcp,
                bufs,
                &mut rustix::net::SendAncillaryBuffer::default(),
                rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        })
    }
}

impl AsyncRead for FileSendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.idle.poll_read(&mut this.tcp, cx, buf)
    }
}

impl AsyncWrite for FileSendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.poll_write_parts(cx, bufs);
        this.idle.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

impl FileSendStream {
    fn poll_write_parts(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self;
        let Some(first) = bufs.iter().position(|buf| is_placeholder(buf)) else {
            this.check_ordinary(bufs)?;
            return Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        };
        let placeholder: usize = bufs[first..]
            .iter()
            .take_while(|buf| is_placeholder(buf))
            .map(|buf| buf.len())
            .sum();
        if first == 0 {
            return this.poll_send_file(cx, placeholder);
        }
        let head = &bufs[..first];
        this.check_ordinary(head)?;
        let head_bytes: usize = head.iter().map(|buf| buf.len()).sum();
        let sent = ready!(this.poll_send_more(cx, head))?;
        if sent < head_bytes {
            return Poll::Ready(Ok(sent));
        }
        // The head is out; whatever the file does now is reported on the next write.
        match this.poll_send_file(cx, placeholder) {
            Poll::Ready(Ok(file_bytes)) => Poll::Ready(Ok(sent + file_bytes)),
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Ready(Ok(sent)),
        }
    }
}

/// Accepts connections as [`FileSendStream`]s, with `TCP_NODELAY` (Nagle's algorithm would
/// hold a small response back until the client's delayed ACK: tens of milliseconds per
/// request on a keep-alive connection), at most [`ConnectionLimits::max_connections`] open at
/// once (the next is accepted when one closes) and each closed after
/// [`ConnectionLimits::idle`] without a byte either way.
#[derive(Debug)]
pub struct FileSendListener {
    listener: TcpListener,
    idle: std::time::Duration,
    places: Arc<tokio::sync::Semaphore>,
}

impl FileSendListener {
    /// A listener over `listener` with `limits`.
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Self {
        Self {
            listener,
            idle: limits.idle,
            places: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        }
    }
}

impl Listener for FileSendListener {
    type Io = FileSendStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // The semaphore is never closed; the error arm is unreachable but handled.
            let place = self.places.clone().acquire_owned().await.ok();
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    if let Err(error) = tcp.set_nodelay(true) {
                        tracing::debug!(%error, "HTTP: TCP_NODELAY");
                    }
                    return (FileSendStream::with_limits(tcp, self.idle, place), peer);
                }
                // Out of descriptors or a connection reset before it was accepted: the
                // listener itself is fine; wait a little rather than spin.
                Err(error) => {
                    tracing::warn!(%error, "HTTP: accepting a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// What a request knows of its connection when served by [`FileSendListener`] or the TLS
/// listener ([`super::tls`]).
#[derive(Debug, Clone)]
pub struct HttpConnection {
    /// The client's address.
    pub peer: SocketAddr,
    /// The connection's file body slot; `None` where the kernel cannot send files (TLS).
    pub sends: Option<FileSends>,
    /// Whether the connection is TLS.
    pub secure: bool,
}

impl Connected<IncomingStream<'_, FileSendListener>> for HttpConnection {
    fn connect_info(stream: IncomingStream<'_, FileSendListener>) -> Self {
        Self {
            peer: *stream.remote_addr(),
            sends: Some(stream.io().sends().clone()),
            secure: false,
        }
    }
}

/// Below this, a body is read and sent with its head in one `writev`: `sendfile` and a
/// separate send of the head cost more than copying a few KiB (`bench http`, 1 KiB file:
/// 21.6 µs per request read, 24.6–26.5 µs sent by the kernel).
pub const SENDFILE_MIN_BYTES: u64 = 64 * 1024;

/// Where a response's file part starts and how long it is, from its status and headers:
/// the whole file for 200, the `Content-Range` for 206; `None` for anything else and for a
/// part shorter than [`SENDFILE_MIN_BYTES`] (the ordinary body is kept).
pub fn file_part(status: u16, headers: &axum::http::HeaderMap) -> Option<(u64, u64)> {
    let length: u64 = headers
        .get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if length < SENDFILE_MIN_BYTES {
        return None;
    }
    match status {
        200 => Some((0, length)),
        206 => {
            let range = headers
                .get(axum::http::header::CONTENT_RANGE)?
                .to_str()
                .ok()?
                .strip_prefix("bytes ")?;
            let (span, _total) = range.split_once('/')?;
            let (first, last) = span.split_once('-')?;
            let first: u64 = first.parse().ok()?;
            let last: u64 = last.parse().ok()?;
            (last.checked_sub(first)?.checked_add(1)? == length).then_some((first, length))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "sendfile_tests.rs"]
mod tests;
