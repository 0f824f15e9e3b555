//! Group commit of leases off the async runtime: one thread per socket makes every lease
//! queued while it was writing durable with one write and one sync, then answers each
//! waiting ACK.
//!
//! Before this, each ACK blocked a thread of tokio's blocking pool until the shared sync
//! finished. At 10,000 ACKs per second the pool held hundreds of threads, replaced as they
//! idled out, and the server's CPU went to creating them and to futex wake-ups (`perf`:
//! a third of the server's samples in the DHCP benchmark).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::leases::{Lease, LeaseError, LeaseStore};

/// Leases taken into one durable write at most.
const MAX_BATCH: usize = 4096;

/// The answer for one lease: durable, or why not (the store's error, as text: the same
/// error goes to every lease of the batch).
pub type Durable = Result<(), String>;

/// Queues leases for the commit thread.
#[derive(Debug)]
pub struct Committer {
    queue: mpsc::Sender<(Lease, oneshot::Sender<Durable>)>,
}

/// The queue is full: the lease was not taken.
#[derive(Debug)]
pub struct QueueFull;

impl Committer {
    /// Starts the commit thread over `leases`, with room for `capacity` waiting leases. The
    /// thread ends once the committer is dropped and the queue is empty.
    pub fn start(leases: Arc<dyn LeaseStore>, capacity: usize) -> std::io::Result<Self> {
        let (queue, mut waiting) = mpsc::channel::<(Lease, oneshot::Sender<Durable>)>(capacity);
        std::thread::Builder::new()
            .name("dhcp-commit".into())
            .spawn(move || {
                let mut batch = Vec::new();
                while let Some(first) = waiting.blocking_recv() {
                    batch.push(first);
                    while batch.len() < MAX_BATCH {
                        match waiting.try_recv() {
                            Ok(next) => batch.push(next),
                            Err(_) => break,
                        }
                    }
                    let (ready, answers): (Vec<Lease>, Vec<oneshot::Sender<Durable>>) =
                        batch.drain(..).unzip();
                    // A panic fails this batch only: a dead thread would leave the server
                    // answering DISCOVERs but never ACKing.
                    let result =
                        std::panic::catch_unwind(AssertUnwindSafe(|| leases.commit_all(ready)))
                            .unwrap_or(Err(LeaseError::Panicked))
                            .map_err(|e| e.to_string());
                    for answer in answers {
                        // The ACK's task may have given up (timeout): nothing to tell.
                        let _ = answer.send(result.clone());
                    }
                }
            })?;
        Ok(Self { queue })
    }

    /// Queues `lease`; the receiver answers once it is durable.
    pub fn submit(&self, lease: Lease) -> Result<oneshot::Receiver<Durable>, QueueFull> {
        let (answer, durable) = oneshot::channel();
        self.queue
            .try_send((lease, answer))
            .map_err(|_| QueueFull)?;
        Ok(durable)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::backend::MacAddr;
    use crate::leases::{ClientKey, FileStore};

    fn lease(n: u8) -> Lease {
        let mac = MacAddr([2, 0, 0, 0, 0, n]);
        Lease {
            key: ClientKey::Hardware(mac),
            mac,
            ip: Ipv4Addr::new(10, 0, 0, n),
            expires_unix: 1_000,
        }
    }

    #[tokio::test]
    async fn leases_queued_together_share_one_sync_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = Arc::new(FileStore::open(&path).unwrap());
        let committer = Committer::start(store.clone(), 1024).unwrap();
        let before = store.syncs();
        let tickets: Vec<_> = (1..=200)
            .map(|n| committer.submit(lease(n)).unwrap())
            .collect();
        for ticket in tickets {
            assert_eq!(ticket.await.unwrap(), Ok(()));
        }
        let syncs = store.syncs() - before;
        assert!(
            (1..200).contains(&syncs),
            "200 leases took {syncs} syncs: not grouped"
        );
        drop(committer);
        drop(store);
        let reopened = FileStore::open(&path).unwrap();
        for n in 1..=200 {
            assert_eq!(
                reopened.by_client(&lease(n).key).unwrap(),
                Some(lease(n)),
                "lease {n}"
            );
        }
    }

    /// A store whose disk hangs until the test lets it go (a real disk cannot be made to
    /// hang on demand).
    struct Stalled {
        inner: crate::leases::MemoryStore,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl LeaseStore for Stalled {
        fn by_client(&self, key: &ClientKey) -> Result<Option<Lease>, crate::leases::LeaseError> {
            self.inner.by_client(key)
        }
        fn by_ip(
            &self,
            ip: Ipv4Addr,
        ) -> Result<Option<crate::leases::Binding>, crate::leases::LeaseError> {
            self.inner.by_ip(ip)
        }
        fn active(&self, now_unix: u64) -> Result<usize, crate::leases::LeaseError> {
            self.inner.active(now_unix)
        }
        fn commit(&self, lease: Lease) -> Result<(), crate::leases::LeaseError> {
            // The test dropped its sender: the disk "fails" by panicking.
            self.go.lock().unwrap().recv().expect("released");
            self.inner.commit(lease)
        }
        fn release(&self, key: &ClientKey) -> Result<(), crate::leases::LeaseError> {
            self.inner.release(key)
        }
        fn decline(&self, ip: Ipv4Addr, until_unix: u64) -> Result<(), crate::leases::LeaseError> {
            self.inner.decline(ip, until_unix)
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_instead_of_growing() {
        let (go, wait) = std::sync::mpsc::channel();
        let store = Arc::new(Stalled {
            inner: crate::leases::MemoryStore::default(),
            go: std::sync::Mutex::new(wait),
        });
        let committer = Committer::start(store.clone(), 1).unwrap();
        // The thread holds at most one batch at the hanging disk and the queue one more.
        let submitted: Vec<_> = (1..=3).map(|n| (n, committer.submit(lease(n)))).collect();
        let refused = submitted.iter().filter(|(_, t)| t.is_err()).count();
        assert!(
            refused >= 1,
            "a queue of one took three leases while the disk hung"
        );
        for _ in 0..3 {
            go.send(()).unwrap();
        }
        for (n, ticket) in submitted {
            if let Ok(ticket) = ticket {
                assert_eq!(ticket.await.unwrap(), Ok(()));
                assert_eq!(store.by_client(&lease(n).key).unwrap(), Some(lease(n)));
            }
        }
    }

    #[tokio::test]
    async fn a_panic_while_storing_fails_that_batch_and_the_thread_goes_on() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        drop(go);
        let store = Arc::new(Stalled {
            inner: crate::leases::MemoryStore::default(),
            go: std::sync::Mutex::new(wait),
        });
        let committer = Committer::start(store, 16).unwrap();
        for n in 1..=2 {
            let answer = committer.submit(lease(n)).unwrap().await;
            assert_eq!(
                answer,
                Ok(Err(LeaseError::Panicked.to_string())),
                "lease {n}: an error, from a thread still running"
            );
        }
    }
}
