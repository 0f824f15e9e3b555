//! Group commit of leases off the async runtime: one thread for the server makes every
//! record queued while it was writing durable with one write and one sync, tells the
//! address book, then answers each waiting ACK. Records (commits, releases, declines) reach
//! the log in the order they were queued, which is the order they were decided.
//!
//! Before this, each ACK blocked a thread of tokio's blocking pool until the shared sync
//! finished. At 10,000 ACKs per second the pool held hundreds of threads, replaced as they
//! idled out, and the server's CPU went to creating them and to futex wake-ups (`perf`:
//! a third of the server's samples in the DHCP benchmark).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::ha::link::PairLink;
use crate::leases::{Lease, Leases, Record, Ticket};

/// Records taken into one durable write at most.
const MAX_BATCH: usize = 4096;

/// The answer for one lease: durable and still the client's (send the ACK), or why not.
pub type Durable = Result<(), NoAck>;

/// Why a lease's ACK must not be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAck {
    /// The write failed (the log's error, as text: the same error goes to every record of
    /// the batch, which was one write).
    Failed(String),
    /// Written, but the client released or declined the address meanwhile.
    Withdrawn,
    /// Written, but a lease the pair's rules say only the partner's taking it makes
    /// acknowledgeable, and the partner did not ([`crate::ha::pair::Pair::may_acknowledge`]).
    NotTakenByPartner,
}

type Queued = ((Record, Option<Ticket>), Option<oneshot::Sender<Durable>>);

/// Queues records for the commit thread, in the order they were decided.
#[derive(Debug, Clone)]
pub struct Committer {
    queue: mpsc::Sender<Queued>,
}

/// The queue is full: the record was not taken.
#[derive(Debug)]
pub struct QueueFull;

impl Committer {
    /// Starts the commit thread over `leases`, with room for `capacity` waiting records.
    /// The thread ends once every committer is dropped and the queue is empty.
    pub fn start(leases: Arc<Leases>, capacity: usize) -> std::io::Result<Self> {
        Self::start_paired(leases, capacity, None)
    }

    /// [`Committer::start`] for one server of a pair: each batch made durable here goes to
    /// the partner over `link` before its ACKs ([`PairLink::replicate`]).
    pub fn start_paired(
        leases: Arc<Leases>,
        capacity: usize,
        link: Option<Arc<PairLink>>,
    ) -> std::io::Result<Self> {
        let (queue, mut waiting) = mpsc::channel::<Queued>(capacity);
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
                    let (records, answers): (Vec<(Record, Option<Ticket>)>, Vec<_>) =
                        batch.drain(..).unzip();
                    // One write for the batch, and the book told before any ACK goes out.
                    // `persist` catches a panic of the log: a dead thread would leave the
                    // server answering DISCOVERs but never ACKing.
                    let result = leases.persist(&records);
                    if let Err(error) = &result {
                        tracing::error!(%error, records = records.len(), "making leases durable failed; no ACK for them");
                    }
                    let partner_took = match (&result, &link) {
                        (Ok(taken), Some(link)) => replicate(link, &records, taken),
                        _ => Vec::new(),
                    };
                    for (i, answer) in answers.into_iter().enumerate() {
                        let Some(answer) = answer else { continue };
                        let outcome = match &result {
                            Ok(taken) if taken.get(i) == Some(&true) => match (&link, records.get(i)) {
                                (Some(link), Some((Record::Commit(lease), _)))
                                    if !link.acknowledges(lease, partner_took.get(i) == Some(&true)) =>
                                {
                                    Err(NoAck::NotTakenByPartner)
                                }
                                _ => Ok(()),
                            },
                            Ok(_) => Err(NoAck::Withdrawn),
                            Err(error) => Err(NoAck::Failed(error.to_string())),
                        };
                        // The ACK's task may have given up (timeout): nothing to tell.
                        let _ = answer.send(outcome);
                    }
                }
            })?;
        Ok(Self { queue })
    }

    /// Queues `lease`, accepted in the book with `ticket`; the receiver answers once it is
    /// durable (or is not).
    pub fn submit(
        &self,
        lease: Lease,
        ticket: Ticket,
    ) -> Result<oneshot::Receiver<Durable>, QueueFull> {
        let (answer, durable) = oneshot::channel();
        self.queue
            .try_send(((Record::Commit(lease), Some(ticket)), Some(answer)))
            .map_err(|_| QueueFull)?;
        Ok(durable)
    }

    /// Queues a release or a decline; nobody waits for it (the book changed already).
    pub fn record(&self, record: Record) -> Result<(), QueueFull> {
        self.queue
            .try_send(((record, None), None))
            .map_err(|_| QueueFull)
    }
}

/// Sends what a batch made durable to the partner; says, per record of the batch, whether
/// the partner's book took it.
fn replicate(link: &PairLink, records: &[(Record, Option<Ticket>)], taken: &[bool]) -> Vec<bool> {
    let durable: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(i, (record, _))| {
            !matches!(record, Record::Commit(_)) || taken.get(*i) == Some(&true)
        })
        .map(|(i, _)| i)
        .collect();
    let sent: Vec<Record> = durable
        .iter()
        .filter_map(|i| records.get(*i).map(|(record, _)| record.clone()))
        .collect();
    let took = link.replicate(&sent);
    let mut partner_took = vec![false; records.len()];
    for (i, took) in durable.into_iter().zip(took) {
        if let Some(slot) = partner_took.get_mut(i) {
            *slot = took;
        }
    }
    partner_took
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::backend::MacAddr;
    use crate::leases::{ClientKey, FileStore, LeaseLog, MemoryLog};

    fn lease(n: u8) -> Lease {
        let mac = MacAddr([2, 0, 0, 0, 0, n]);
        Lease {
            key: ClientKey::Hardware(mac),
            mac,
            ip: Ipv4Addr::new(10, 0, 0, n).into(),
            expires_unix: 1_000,
        }
    }

    /// Accepts the REQUEST in the book, as the decision does before queueing it.
    fn begin(leases: &Leases, lease: &Lease) -> Ticket {
        leases
            .book()
            .unwrap()
            .begin_commit(&lease.key, lease.mac, lease.ip, 0)
            .unwrap()
    }

    #[tokio::test]
    async fn leases_queued_together_share_one_sync_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.log");
        let store = Arc::new(FileStore::open(&path).unwrap());
        let leases = Arc::new(Leases::open(store.clone()).unwrap());
        let committer = Committer::start(leases.clone(), 1024).unwrap();
        let before = store.syncs();
        let tickets: Vec<_> = (1..=200)
            .map(|n| {
                let ticket = begin(&leases, &lease(n));
                committer.submit(lease(n), ticket).unwrap()
            })
            .collect();
        for ticket in tickets {
            assert_eq!(ticket.await.unwrap(), Ok(()));
        }
        let syncs = store.syncs() - before;
        assert!(
            (1..200).contains(&syncs),
            "200 leases took {syncs} syncs: not grouped"
        );
        for n in 1..=200 {
            assert_eq!(
                leases.book().unwrap().lease_of(&lease(n).key),
                Some(lease(n))
            );
        }
        drop(committer);
        drop(leases);
        drop(store);
        let reopened = FileStore::open(&path).unwrap().durable().unwrap();
        for n in 1..=200 {
            assert_eq!(
                reopened.by_client(&lease(n).key),
                Some(lease(n)),
                "lease {n}"
            );
        }
    }

    /// A batch that fails is reported to its own waiters even when the next one succeeds,
    /// and the book never shows its leases.
    #[tokio::test]
    async fn each_waiter_gets_its_own_batchs_result() {
        let log = Arc::new(MemoryLog::default());
        let leases = Arc::new(Leases::open(log.clone()).unwrap());
        let committer = Committer::start(leases.clone(), 16).unwrap();
        log.set_failing(true);
        let ticket = begin(&leases, &lease(1));
        let failed = committer.submit(lease(1), ticket).unwrap().await.unwrap();
        assert!(matches!(failed, Err(NoAck::Failed(_))), "{failed:?}");
        log.set_failing(false);
        let ticket = begin(&leases, &lease(2));
        assert_eq!(
            committer.submit(lease(2), ticket).unwrap().await.unwrap(),
            Ok(())
        );
        let book = leases.book().unwrap();
        assert_eq!(book.lease_of(&lease(1).key), None);
        assert!(book.slot(lease(1).ip).is_none(), "the failed claim is gone");
        assert_eq!(book.lease_of(&lease(2).key), Some(lease(2)));
        assert_eq!(log.durable().unwrap().by_client(&lease(1).key), None);
    }

    /// A client that releases its address while its REQUEST is being written gets no ACK.
    #[tokio::test]
    async fn a_lease_released_while_being_written_gets_no_ack() {
        let leases = Arc::new(Leases::in_memory());
        let committer = Committer::start(leases.clone(), 16).unwrap();
        let ticket = begin(&leases, &lease(1));
        assert_eq!(
            committer.submit(lease(1), ticket).unwrap().await.unwrap(),
            Ok(())
        );
        let ticket = begin(&leases, &lease(1));
        assert!(leases.book().unwrap().release(&lease(1).key, lease(1).ip));
        assert_eq!(
            committer.submit(lease(1), ticket).unwrap().await.unwrap(),
            Err(NoAck::Withdrawn)
        );
        assert!(leases.book().unwrap().slot(lease(1).ip).is_none());
    }

    /// A log whose disk hangs until the test lets it go, or panics (a real disk cannot be
    /// made to hang or panic on demand).
    #[derive(Debug)]
    struct Stalled {
        inner: MemoryLog,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl LeaseLog for Stalled {
        fn durable(&self) -> Result<crate::leases::Index, crate::leases::LeaseError> {
            self.inner.durable()
        }
        fn append(&self, records: &[Record]) -> Result<(), crate::leases::LeaseError> {
            // The test dropped its sender: the disk "fails" by panicking.
            self.go.lock().unwrap().recv().expect("released");
            self.inner.append(records)
        }
    }

    fn stalled() -> (std::sync::mpsc::Sender<()>, Arc<Leases>) {
        let (go, wait) = std::sync::mpsc::channel();
        let log = Arc::new(Stalled {
            inner: MemoryLog::default(),
            go: std::sync::Mutex::new(wait),
        });
        (go, Arc::new(Leases::open(log).unwrap()))
    }

    #[tokio::test]
    async fn a_full_queue_refuses_instead_of_growing() {
        let (go, leases) = stalled();
        let committer = Committer::start(leases.clone(), 1).unwrap();
        // The thread holds at most one batch at the hanging disk and the queue one more.
        let submitted: Vec<_> = (1..=3)
            .map(|n| {
                let ticket = begin(&leases, &lease(n));
                (n, committer.submit(lease(n), ticket))
            })
            .collect();
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
                assert_eq!(
                    leases.book().unwrap().lease_of(&lease(n).key),
                    Some(lease(n))
                );
            }
        }
    }

    #[tokio::test]
    async fn a_panic_while_storing_fails_that_batch_and_the_thread_goes_on() {
        let (go, leases) = stalled();
        drop(go);
        let committer = Committer::start(leases.clone(), 16).unwrap();
        for n in 1..=2 {
            let ticket = begin(&leases, &lease(n));
            let answer = committer.submit(lease(n), ticket).unwrap().await;
            assert_eq!(
                answer,
                Ok(Err(NoAck::Failed(
                    crate::leases::LeaseError::Panicked.to_string()
                ))),
                "lease {n}: an error, from a thread still running"
            );
            assert!(leases.book().unwrap().slot(lease(n).ip).is_none());
        }
    }
}
