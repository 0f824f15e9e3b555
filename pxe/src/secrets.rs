//! BMC credential Secrets for the PXE provider, read from a watch, not fetched per call.
//!
//! Every poll of every Machine needs its BMC's credentials. A GET per call cost the API
//! server one Secret read per Machine per poll (939 per 10 s poll with 1,000 Machines in
//! `bench controller`). Instead, the first Machine that names a namespace starts a watch of
//! that namespace's Secrets (a reflector); once it has listed, Secrets are read from it, and
//! a changed or rotated password arrives through the watch as soon as the API server sends
//! it. Until the list completes, or where the watch cannot run (the bootserver may `get`
//! Secrets in a namespace without `list` and `watch`: `deploy/rbac/bootserver.yaml`), a
//! Secret is read with a GET, as before.
//!
//! The watch holds every Secret of the namespaces Machines name in memory, as the RBAC that
//! allows the watch already allows reading them; keep BMC Secrets in a namespace of their
//! own (`unbounded-system` by default). Nothing here logs a Secret's data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

/// Secrets by namespace, each namespace watched from its first use on.
#[allow(missing_debug_implementations)] // holds a kube Client
pub struct BmcSecrets {
    client: Client,
    watched: Mutex<HashMap<String, Watched>>,
}

struct Watched {
    store: Store<Secret>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BmcSecrets {
    fn drop(&mut self) {
        let watched = self
            .watched
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, w) in watched.drain() {
            w.task.abort();
        }
    }
}

/// Where a Secret was read from (the tests check that the watch answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The namespace's watch.
    Watch,
    /// A GET: the watch has not listed yet, or cannot run.
    Get,
}

impl BmcSecrets {
    /// Secrets read with `client`; no watch starts before the first read.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            watched: Mutex::new(HashMap::new()),
        }
    }

    /// The namespace's store, its watch started on first use.
    fn store(&self, namespace: &str) -> Store<Secret> {
        let mut watched = self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(w) = watched.get(namespace) {
            return w.store.clone();
        }
        let (store, writer) = reflector::store::<Secret>();
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let name = namespace.to_owned();
        let task = tokio::spawn(async move {
            let mut warned = false;
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
            );
            while let Some(event) = events.next().await {
                // The error names the namespace and the refusal, never a Secret's data.
                if let Err(error) = event
                    && !warned
                {
                    warned = true;
                    tracing::warn!(
                        namespace = %name,
                        %error,
                        "cannot watch Secrets here (list and watch are needed); reading BMC credentials with a GET per call until it can"
                    );
                }
            }
        });
        watched.insert(
            namespace.to_owned(),
            Watched {
                store: store.clone(),
                task,
            },
        );
        store
    }

    /// The Secret `namespace/name`, or `None` if it does not exist.
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(Option<Arc<Secret>>, Source), kube::Error> {
        let store = self.store(namespace);
        // Listed at least once: the store is the truth (the watch keeps it current).
        if store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
        {
            let object = ObjectRef::<Secret>::new(name).within(namespace);
            return Ok((store.get(&object), Source::Watch));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        Ok((api.get_opt(name).await?.map(Arc::new), Source::Get))
    }
}
