//! A TCP forwarder on the host's loopback that a test can stall: while stalled, no byte
//! moves in either direction and no connection is reset (what a hung API server or a
//! black-holed route looks like to a client), then everything held flows on. A fault put
//! in front of a real server, for tests of what a client does while its server is slow.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

/// Whether bytes may move, and how many reads wait to be written.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    stalled: bool,
    holding: usize,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, stalled: bool) {
        self.lock().stalled = stalled;
        self.opened.notify_all();
    }

    fn wait_open(&self) {
        let mut state = self.lock();
        state.holding += 1;
        while state.stalled {
            state = self
                .opened
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.holding -= 1;
    }
}

/// Forwards `127.0.0.1:<port>` to a target; [`StallableForward::stall`] holds every byte
/// until [`StallableForward::resume`]. Connections are closed on drop.
#[derive(Debug)]
pub struct StallableForward {
    address: SocketAddr,
    gate: Arc<Gate>,
    closing: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
}

impl StallableForward {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub fn start(target: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let target: SocketAddr = target
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let forward = Self {
            address,
            gate: Arc::default(),
            closing: Arc::default(),
            connections: Arc::default(),
        };
        let (gate, closing, connections) = (
            forward.gate.clone(),
            forward.closing.clone(),
            forward.connections.clone(),
        );
        thread::Builder::new()
            .name("stallable-forward".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if closing.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    if let Ok(mut held) = connections.lock() {
                        for stream in [&client, &server] {
                            if let Ok(clone) = stream.try_clone() {
                                held.push(clone);
                            }
                        }
                    }
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                            continue;
                        };
                        let gate = gate.clone();
                        let _ = thread::Builder::new()
                            .name("stallable-pump".into())
                            .spawn(move || pump(from, to, &gate));
                    }
                }
            })?;
        Ok(forward)
    }

    /// Where clients connect (`127.0.0.1:<port>`).
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// From now on, no byte moves.
    pub fn stall(&self) {
        self.gate.set(true);
    }

    /// Bytes move again, the held ones first.
    pub fn resume(&self) {
        self.gate.set(false);
    }

    /// How many reads (of either direction) are held at the stall right now: a sign that a
    /// client's bytes reached the forwarder and went no further.
    pub fn holding(&self) -> usize {
        self.gate.lock().holding
    }
}

/// Copies `from` to `to`, waiting at the gate before each write.
fn pump(mut from: TcpStream, mut to: TcpStream, gate: &Gate) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        gate.wait_open();
        if to.write_all(buf.get(..n).unwrap_or_default()).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for StallableForward {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        self.resume();
        // Wakes the accepting thread, which then sees `closing`.
        let _ = TcpStream::connect(self.address);
        if let Ok(held) = self.connections.lock() {
            for stream in held.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bytes_wait_while_stalled_and_flow_after() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for stream in echo.incoming().flatten() {
                let mut reader = stream.try_clone().unwrap();
                let mut writer = stream;
                thread::spawn(move || std::io::copy(&mut reader, &mut writer));
            }
        });
        let forward = StallableForward::start(&target).unwrap();
        let mut client = TcpStream::connect(forward.address()).unwrap();
        let mut buf = [0u8; 5];
        client.write_all(b"hello").unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");

        forward.stall();
        client.write_all(b"world").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while forward.holding() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the bytes never arrived"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // Held at the forwarder: they cannot have reached the echo server.
        client.set_nonblocking(true).unwrap();
        let held = client.read(&mut buf);
        assert!(
            held.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "nothing while stalled, not even a reset: {held:?}"
        );
        forward.resume();
        client.set_nonblocking(false).unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"world");
    }
}
