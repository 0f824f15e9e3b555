//! Watching one object by name into a [`watch`] channel: the loop wakes on every change and
//! reads the latest copy, or `None` while the object does not exist.

use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

/// Watches one object by name; the receiver holds it (or `None` while it does not exist).
pub(crate) fn watch_named<K>(api: Api<K>, name: String) -> watch::Receiver<Option<Arc<K>>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut initial: Option<Arc<K>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(obj)) => {
                    let _ = tx.send(Some(Arc::new(obj)));
                }
                Ok(watcher::Event::Delete(_)) => {
                    let _ = tx.send(None);
                }
                Ok(watcher::Event::Init) => initial = None,
                Ok(watcher::Event::InitApply(obj)) => initial = Some(Arc::new(obj)),
                Ok(watcher::Event::InitDone) => {
                    let _ = tx.send(initial.take());
                }
                Err(error) => tracing::debug!(%error, object = %name, "watch error; retrying"),
            }
        }
    });
    rx
}
