//! A TCP proxy that a test can **stall**: stop forwarding bytes, in both directions and on
//! every connection (those open and those that open later), without closing anything, as a
//! network path that silently drops packets does. Neither end sees a reset or an end of
//! stream; only their own timeouts can tell them. It can also **cut** every connection (both
//! ends closed, new ones closed at once).
//!
//! Plain threads, so that it works under any (or no) async runtime.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Forwarding,
    Stalled,
    Cut,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    streams: Mutex<Vec<TcpStream>>,
    accepted: Mutex<usize>,
    stopping: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, state: State) {
        *self.state() = state;
        self.changed.notify_all();
    }

    /// Waits while stalled; whether forwarding may go on (false once cut).
    fn may_forward(&self) -> bool {
        let mut state = self.state();
        while *state == State::Stalled {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *state == State::Forwarding
    }

    fn track(&self, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            self.streams
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(clone);
        }
    }
}

/// A proxy from a loopback port to `target`; cut when dropped.
#[derive(Debug)]
pub struct StallingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl StallingProxy {
    /// Listens on `127.0.0.1:<free port>` and forwards to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Forwarding),
            changed: Condvar::new(),
            streams: Mutex::new(Vec::new()),
            accepted: Mutex::new(0),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let accepting = shared.clone();
        thread::Builder::new()
            .name("stalling-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    if accepting
                        .stopping
                        .load(std::sync::atomic::Ordering::Acquire)
                    {
                        return;
                    }
                    if *accepting.state() == State::Cut {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    *accepting
                        .accepted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) += 1;
                    let Ok(upstream) = TcpStream::connect(target) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    accepting.track(&client);
                    accepting.track(&upstream);
                    let (Ok(client_reader), Ok(upstream_reader)) =
                        (client.try_clone(), upstream.try_clone())
                    else {
                        continue;
                    };
                    for (from, to) in [(client_reader, upstream), (upstream_reader, client)] {
                        let shared = accepting.clone();
                        let _ = thread::Builder::new()
                            .name("stalling-proxy-copy".into())
                            .spawn(move || copy(from, to, &shared));
                    }
                }
            })?;
        Ok(Self { addr, shared })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding: bytes already read are held, nothing more is written, nothing is
    /// closed. New connections are accepted and stall too.
    pub fn stall(&self) {
        self.shared.set(State::Stalled);
    }

    /// Forwards again, the held bytes first.
    pub fn resume(&self) {
        self.shared.set(State::Forwarding);
    }

    /// Closes every connection, both ends, and every new one at once.
    pub fn cut(&self) {
        self.shared.set(State::Cut);
        for stream in self
            .shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// How many connections were accepted while not cut.
    pub fn connections(&self) -> usize {
        *self
            .shared
            .accepted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.cut();
        // Wakes the accepting thread so that it sees it must end.
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let _ = TcpStream::connect(self.addr);
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => {
                if shared.may_forward() {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(n) => n,
        };
        // Read while stalled: held until forwarding resumes (or dropped if cut).
        if !shared.may_forward() || to.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                thread::spawn(move || {
                    let mut reader = stream.try_clone().unwrap();
                    let mut writer = stream;
                    let _ = std::io::copy(&mut reader, &mut writer);
                });
            }
        });
        addr
    }

    fn round_trip(stream: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(text)?;
        let mut answer = vec![0u8; text.len()];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    }

    #[test]
    fn stalls_without_closing_then_resumes_and_cuts() {
        let proxy = StallingProxy::start(echo_server()).unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert_eq!(round_trip(&mut stream, b"one").unwrap(), b"one");

        proxy.stall();
        // Nothing comes back, and nothing is closed: the read times out.
        let error = round_trip(&mut stream, b"two").unwrap_err();
        assert!(
            matches!(
                error.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{error}"
        );
        // A new connection stalls too.
        let mut late = TcpStream::connect(proxy.addr()).unwrap();
        late.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(round_trip(&mut late, b"x").is_err());

        proxy.resume();
        let mut held = [0u8; 3];
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.read_exact(&mut held).unwrap();
        assert_eq!(&held, b"two");

        proxy.cut();
        let mut rest = Vec::new();
        assert_eq!(stream.read_to_end(&mut rest).unwrap_or(0), 0);
        assert_eq!(proxy.connections(), 2);
    }
}
