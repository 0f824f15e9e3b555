//! Kubernetes Events (`events.k8s.io/v1`) about the controller's objects.
//!
//! Events are best effort, as with client-go's event broadcaster: a reconcile hands its
//! event to a bounded queue and goes on; one worker publishes the queue at its own rate
//! (`--event-qps`), and when thousands of Machines resolve at once the events that do not
//! fit in the queue are dropped and counted (`unbounded_controller_events_dropped`). So
//! events never hold up reconciliation nor crowd the status writes out of the API server;
//! what happened is in each object's status and conditions either way.
//!
//! kube-runtime's `Recorder` scanned its whole cache of recent events on every publish and
//! kept each event in full (with 10,000 Machines a fifth of the controller's CPU and tens of
//! MiB). The worker keeps, per recent event, only what a repeat needs (name and count), in a
//! cache with time-ordered expiry and a size bound: O(1) per event. A repeat of the same
//! event (same object, type, reason, action and note) within [`REPEAT_WINDOW`] becomes a
//! series (its count grows) instead of a new Event object; an event with another note is a
//! new Event, so no note is lost.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

/// How long a published event may be continued as a series (kube-runtime's choice too).
pub const REPEAT_WINDOW: Duration = Duration::from_secs(6 * 60);

/// How many recent events are remembered; beyond it the oldest are forgotten (a repeat of
/// one of those becomes a new Event object, nothing worse).
pub const REMEMBERED_EVENTS: usize = 4096;

/// What makes two events the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    /// `apiVersion/kind/namespace/name/uid` of the object.
    pub regarding: String,
    /// Normal or Warning.
    pub warning: bool,
    /// Reason (also the action).
    pub reason: String,
    /// Note.
    pub note: String,
}

/// A published event, as far as a repeat needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The Event object's namespace.
    pub namespace: String,
    /// The Event object's name.
    pub name: String,
    /// How often it happened.
    pub count: i32,
    /// When it last happened.
    pub last: Instant,
}

/// Recent events, expiring in the order they last happened.
#[derive(Debug, Default)]
pub struct EventCache {
    entries: HashMap<EventKey, Published>,
    by_time: VecDeque<(Instant, EventKey)>,
}

impl EventCache {
    /// Forgets events last seen more than [`REPEAT_WINDOW`] before `now`, and the oldest
    /// beyond `capacity`.
    pub fn expire(&mut self, now: Instant, capacity: usize) {
        while let Some((at, key)) = self.by_time.front() {
            let stale = now.saturating_duration_since(*at) >= REPEAT_WINDOW;
            if !stale && self.entries.len() <= capacity {
                break;
            }
            // Entries repeated since are queued again later; only the newest slot counts.
            if self.entries.get(key).is_some_and(|p| p.last == *at) {
                self.entries.remove(key);
            }
            self.by_time.pop_front();
        }
    }

    /// The event to continue as a series, if it happened recently.
    pub fn repeat_of(&self, key: &EventKey) -> Option<&Published> {
        self.entries.get(key)
    }

    /// Records that the event was published (or repeated) at `published.last`.
    pub fn record(&mut self, key: EventKey, published: Published) {
        self.by_time.push_back((published.last, key.clone()));
        self.entries.insert(key, published);
    }

    /// Events remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none are remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How events are queued and published.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventSettings {
    /// Events waiting to be published, at most.
    pub queue: usize,
    /// Events published per second, on average.
    pub qps: f64,
    /// Events published at once after a quiet spell.
    pub burst: u32,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            queue: 1024,
            qps: 25.0,
            burst: 100,
        }
    }
}

/// An event waiting to be published.
#[derive(Debug)]
struct Pending {
    regarding: ObjectReference,
    key: EventKey,
}

/// Queues events for [`publish_events`].
#[derive(Clone, Debug)]
pub struct EventPublisher {
    queue: tokio::sync::mpsc::Sender<Pending>,
    dropped: prometheus_client::metrics::counter::Counter,
}

/// Publishes queued events as `controller` / `instance` until every [`EventPublisher`] is
/// gone.
pub struct EventWorker {
    client: kube::Client,
    controller: String,
    instance: String,
    settings: EventSettings,
    queue: tokio::sync::mpsc::Receiver<Pending>,
}

impl std::fmt::Debug for EventWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWorker")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// A publisher and the worker that drains its queue (run it: [`EventWorker::run`]);
    /// the instance defaults to the controller's name. `dropped` counts what did not fit.
    pub fn new(
        client: kube::Client,
        controller: &str,
        instance: Option<String>,
        settings: EventSettings,
        dropped: prometheus_client::metrics::counter::Counter,
    ) -> (Self, EventWorker) {
        let (tx, rx) = tokio::sync::mpsc::channel(settings.queue.max(1));
        (
            Self { queue: tx, dropped },
            EventWorker {
                client,
                controller: controller.to_owned(),
                instance: instance.unwrap_or_else(|| controller.to_owned()),
                settings,
                queue: rx,
            },
        )
    }

    /// Queues an event about `regarding`; drops it (and counts it) when the queue is full.
    pub fn publish(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let key = EventKey {
            regarding: format!(
                "{}/{}/{}/{}/{}",
                regarding.api_version.as_deref().unwrap_or_default(),
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default(),
                regarding.uid.as_deref().unwrap_or_default()
            ),
            warning: matches!(type_, EventType::Warning),
            reason: reason.to_owned(),
            note,
        };
        if self.queue.try_send(Pending { regarding, key }).is_err() {
            self.dropped.inc();
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}

impl EventWorker {
    /// Publishes events until every publisher is gone.
    pub async fn run(mut self) {
        let mut cache = EventCache::default();
        let mut bucket = crate::api_limits::TokenBucket::new(
            self.settings.qps,
            self.settings.burst,
            tokio::time::Instant::now(),
        );
        while let Some(pending) = self.queue.recv().await {
            while let Err(wait) = bucket.try_take(tokio::time::Instant::now()) {
                tokio::time::sleep(wait).await;
            }
            let now = Instant::now();
            cache.expire(now, REMEMBERED_EVENTS);
            let repeat = cache.repeat_of(&pending.key).cloned();
            match self.send(&pending, repeat, now).await {
                Ok(published) => cache.record(pending.key, published),
                Err(error) => {
                    tracing::warn!(%error, reason = %pending.key.reason, "publishing an event failed");
                }
            }
        }
    }

    /// A new Event object, or the next count of a recent identical one.
    async fn send(
        &self,
        pending: &Pending,
        repeat: Option<Published>,
        now: Instant,
    ) -> Result<Published, kube::Error> {
        let time = Timestamp::now();
        if let Some(previous) = repeat {
            let count = previous.count + 1;
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(time),
            };
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &previous.namespace);
            api.patch(
                &previous.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "series": series })),
            )
            .await?;
            return Ok(Published {
                count,
                last: now,
                ..previous
            });
        }
        let regarding = &pending.regarding;
        let key = &pending.key;
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            time.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(key.reason.clone()),
            reason: Some(key.reason.clone()),
            event_time: Some(MicroTime(time)),
            regarding: Some(regarding.clone()),
            note: Some(key.note.clone()),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.to_owned()),
            ..K8sEvent::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        Ok(Published {
            namespace,
            name,
            count: 1,
            last: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(object: &str, note: &str) -> EventKey {
        EventKey {
            regarding: format!("v1/Machine//{object}/uid-{object}"),
            warning: false,
            reason: "Repave".into(),
            note: note.into(),
        }
    }

    fn published(name: &str, last: Instant) -> Published {
        Published {
            namespace: "default".into(),
            name: name.into(),
            count: 1,
            last,
        }
    }

    #[test]
    fn repeats_within_the_window_continue_a_series() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut cache = EventCache::default();
        cache.record(key("m1", "a"), published("m1.1", at(0)));

        cache.expire(at(60), 10);
        assert_eq!(
            cache.repeat_of(&key("m1", "a")).map(|p| p.name.as_str()),
            Some("m1.1")
        );
        assert!(
            cache.repeat_of(&key("m1", "b")).is_none(),
            "another note is another event"
        );
        assert!(cache.repeat_of(&key("m2", "a")).is_none(), "another object");

        // Repeated at 300 s: it lives until 300 + 360 s, not 0 + 360 s.
        cache.record(
            key("m1", "a"),
            Published {
                count: 2,
                ..published("m1.1", at(300))
            },
        );
        cache.expire(at(400), 10);
        assert_eq!(cache.repeat_of(&key("m1", "a")).map(|p| p.count), Some(2));
        cache.expire(at(660), 10);
        assert!(
            cache.repeat_of(&key("m1", "a")).is_none(),
            "expired after the window"
        );
        assert!(cache.is_empty());
    }

    #[test]
    fn the_oldest_go_beyond_the_capacity() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut cache = EventCache::default();
        for i in 0..5 {
            cache.record(
                key(&format!("m{i}"), "n"),
                published(&format!("e{i}"), at(i)),
            );
        }
        cache.expire(at(10), 3);
        assert_eq!(cache.len(), 3);
        assert!(cache.repeat_of(&key("m0", "n")).is_none());
        assert!(cache.repeat_of(&key("m1", "n")).is_none());
        assert!(cache.repeat_of(&key("m4", "n")).is_some());
    }
}
