//! Deduplicating work queues between the watches and the reconcilers.
//!
//! One change can fan out to thousands of triggers (a configuration's selector touches
//! every Machine it matches; every Machine event triggers its pool and configurations), and
//! the watch handlers must never wait for the reconcilers. An unbounded channel would hold
//! every trigger until a reconciler took it, the same Machine many times over. Here a key
//! already waiting is not queued again (as in client-go's workqueue and kube-runtime's
//! scheduler): the queue holds at most one entry per distinct object, so its memory is
//! bounded by the number of objects, not by the rate of changes, and sending never blocks.
//!
//! Keys leave in the order they were first queued; a key sent again while it waits keeps
//! its place. Once taken, a key may be queued again: the reconcile it triggers reads the
//! latest state, so one pending entry stands for every change made before it is taken.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::Stream;

/// The keys waiting, in order, each at most once (the queue's decisions, without I/O).
#[derive(Debug)]
pub struct Pending<T> {
    order: VecDeque<T>,
    queued: HashSet<T>,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self {
            order: VecDeque::new(),
            queued: HashSet::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Pending<T> {
    /// Queues `key` unless it is already waiting; returns whether it was queued.
    pub fn push(&mut self, key: T) -> bool {
        if self.queued.contains(&key) {
            return false;
        }
        self.queued.insert(key.clone());
        self.order.push_back(key);
        true
    }

    /// Takes the key that has waited longest.
    pub fn pop(&mut self) -> Option<T> {
        let key = self.order.pop_front()?;
        self.queued.remove(&key);
        Some(key)
    }

    /// How many keys wait.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[derive(Debug)]
struct State<T> {
    pending: Pending<T>,
    waker: Option<Waker>,
    senders: usize,
    receiving: bool,
}

type Locked<T> = Arc<Mutex<State<T>>>;

fn lock<T>(state: &Locked<T>) -> std::sync::MutexGuard<'_, State<T>> {
    // Every update is one call on plain data: a panic elsewhere leaves it whole.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new queue: the sending half (cloned for every producer) and the receiving stream.
pub fn work_queue<T>() -> (WorkSender<T>, WorkReceiver<T>) {
    let state = Arc::new(Mutex::new(State {
        pending: Pending::default(),
        waker: None,
        senders: 1,
        receiving: true,
    }));
    (
        WorkSender {
            state: state.clone(),
        },
        WorkReceiver { state },
    )
}

/// Queues keys; never blocks.
#[derive(Debug)]
pub struct WorkSender<T> {
    state: Locked<T>,
}

impl<T> Clone for WorkSender<T> {
    fn clone(&self) -> Self {
        lock(&self.state).senders += 1;
        Self {
            state: self.state.clone(),
        }
    }
}

impl<T> Drop for WorkSender<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.senders = state.senders.saturating_sub(1);
        if state.senders == 0
            && let Some(waker) = state.waker.take()
        {
            waker.wake();
        }
    }
}

impl<T: Hash + Eq + Clone> WorkSender<T> {
    /// Queues `key` unless it already waits (or nobody receives any more: the controller is
    /// shutting down).
    pub fn send(&self, key: T) {
        let mut state = lock(&self.state);
        if state.receiving
            && state.pending.push(key)
            && let Some(waker) = state.waker.take()
        {
            waker.wake();
        }
    }

    /// How many keys wait.
    pub fn len(&self) -> usize {
        lock(&self.state).pending.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        lock(&self.state).pending.is_empty()
    }
}

/// The keys, oldest first; ends once every sender is gone and nothing waits.
#[derive(Debug)]
pub struct WorkReceiver<T> {
    state: Locked<T>,
}

impl<T> Drop for WorkReceiver<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.receiving = false;
        state.pending = Pending::default();
    }
}

impl<T: Hash + Eq + Clone> Stream for WorkReceiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = lock(&self.state);
        if let Some(key) = state.pending.pop() {
            return Poll::Ready(Some(key));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    #[derive(Debug, Clone)]
    enum Step {
        Push(u8),
        Pop,
    }

    /// What the queue should do, written the slow and obvious way.
    fn model(steps: &[Step]) -> Vec<Option<u8>> {
        let mut queue: Vec<u8> = Vec::new();
        let mut popped = Vec::new();
        for step in steps {
            match step {
                Step::Push(k) => {
                    if !queue.contains(k) {
                        queue.push(*k);
                    }
                }
                Step::Pop => popped.push((!queue.is_empty()).then(|| queue.remove(0))),
            }
        }
        popped
    }

    #[test]
    fn pending_table() {
        use Step::*;
        type Case = (&'static str, Vec<Step>, Vec<Option<u8>>);
        let cases: [Case; 5] = [
            ("empty", vec![Pop], vec![None]),
            (
                "first queued, first out",
                vec![Push(3), Push(1), Push(2), Pop, Pop, Pop],
                vec![Some(3), Some(1), Some(2)],
            ),
            (
                "a key sent again while waiting is queued once and keeps its place",
                vec![Push(1), Push(2), Push(1), Push(1), Pop, Pop, Pop],
                vec![Some(1), Some(2), None],
            ),
            (
                "a key taken may be queued again, at the back",
                vec![Push(1), Push(2), Pop, Push(1), Pop, Pop],
                vec![Some(1), Some(2), Some(1)],
            ),
            (
                "a fan-out of one key a thousand times is one entry",
                std::iter::repeat_n(Push(7), 1000)
                    .chain([Pop, Pop])
                    .collect(),
                vec![Some(7), None],
            ),
        ];
        for (case, steps, expected) in cases {
            let mut pending = Pending::default();
            let mut popped = Vec::new();
            for step in &steps {
                match step {
                    Step::Push(k) => {
                        pending.push(*k);
                    }
                    Step::Pop => popped.push(pending.pop()),
                }
            }
            assert_eq!(popped, expected, "{case}");
            assert_eq!(model(&steps), expected, "{case}: the model agrees");
        }
    }

    fn config() -> Config {
        // A fixed seed unless one is given (PROPTEST_RNG_SEED); PROPTEST_CASES for more.
        let mut config = Config {
            failure_persistence: None,
            ..Config::default()
        };
        if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
            config.rng_seed = RngSeed::Fixed(0x5eed_0023);
        }
        config
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![3 => (0u8..16).prop_map(Step::Push), 1 => Just(Step::Pop)],
            0..200,
        )
    }

    proptest! {
        #![proptest_config(config())]

        /// Over any sequence of sends and takes: the same keys in the same order as the
        /// model, never more entries than distinct keys, and nothing lost (draining at the
        /// end yields every key sent and not yet taken).
        #[test]
        fn the_queue_dedups_keeps_order_and_stays_bounded(steps in steps()) {
            let mut pending = Pending::default();
            let mut popped = Vec::new();
            for step in &steps {
                match step {
                    Step::Push(k) => {
                        pending.push(*k);
                    }
                    Step::Pop => popped.push(pending.pop()),
                }
                prop_assert!(pending.len() <= 16, "bounded by the distinct keys");
                prop_assert_eq!(pending.order.len(), pending.queued.len());
            }
            prop_assert_eq!(&popped, &model(&steps));
            let mut rest = Vec::new();
            while let Some(k) = pending.pop() {
                rest.push(k);
            }
            let mut expected = steps.clone();
            expected.extend(std::iter::repeat_n(Step::Pop, 16));
            let tail: Vec<u8> = model(&expected)[popped.len()..].iter().flatten().copied().collect();
            prop_assert_eq!(rest, tail);
        }
    }

    #[tokio::test]
    async fn the_stream_delivers_each_waiting_key_once_and_ends_with_its_senders() {
        let (tx, mut rx) = work_queue::<&'static str>();
        let other = tx.clone();
        for key in ["m1", "m2", "m1", "m3", "m2"] {
            tx.send(key);
        }
        other.send("m1");
        assert_eq!(tx.len(), 3);
        assert_eq!(rx.next().await, Some("m1"));
        other.send("m1");
        drop(tx);
        drop(other);
        let rest: Vec<_> = rx.collect().await;
        assert_eq!(rest, ["m2", "m3", "m1"]);
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_on_send() {
        let (tx, mut rx) = work_queue::<u32>();
        let taken = tokio::spawn(async move { rx.next().await });
        tokio::task::yield_now().await;
        tx.send(5);
        assert_eq!(taken.await.ok().flatten(), Some(5));
        // Nobody receives: sending is a no-op, nothing accumulates.
        tx.send(6);
        assert!(tx.is_empty());
    }
}
