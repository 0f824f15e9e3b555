//! The controller's bookkeeping of its own writes, against the real API server with the
//! controller running in this process, its client wrapped so that the API server's answer
//! to a write reaches the controller only seconds after the watch has shown the write: what
//! happens when a watch is faster than the response, made certain instead of rare.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::client::{Body, ClientBuilder};
use kube::{Client, ResourceExt};
use serde_json::json;
use unbounded_api::well_known::labels;
use unbounded_api::{Machine, MachinePool};
use unbounded_controller::expectations::EXPECTATION_TTL;
use unbounded_controller::metrics::Metrics;

/// Holds back the API server's answer to every `DELETE` of a Machine for `delay`; every
/// other request passes untouched.
#[derive(Clone)]
struct SlowMachineDeletes<S> {
    inner: S,
    delay: Duration,
}

impl<S> tower::Service<http::Request<Body>> for SlowMachineDeletes<S>
where
    S: tower::Service<http::Request<Body>> + Send,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let slow = request.method() == http::Method::DELETE
            && request
                .uri()
                .path()
                .starts_with("/apis/unbounded-cloud.io/v1alpha1/machines/");
        let delay = self.delay;
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if slow {
                tokio::time::sleep(delay).await;
            }
            answer
        })
    }
}

/// How long the answer to a Machine's deletion is held back: far longer than the deletion of
/// a Machine without a Node takes (its finalizer goes within a second).
const HELD_BACK: Duration = Duration::from_secs(4);

async fn slow_deletes_client() -> Client {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(control_plane().kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let delay = HELD_BACK;
    ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::layer::layer_fn(move |inner| SlowMachineDeletes {
            inner,
            delay,
        }))
        .build()
}

/// Starts the controller in this process on `client`.
fn start_in_process(client: Client) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    tokio::spawn(unbounded_controller::run(
        client,
        unbounded_controller::Settings::default(),
        metrics,
        futures::future::pending(),
    ));
}

async fn members(client: &Client, pool: &str) -> Vec<Machine> {
    Api::<Machine>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={pool}", labels::POOL)))
        .await
        .unwrap()
        .items
}

async fn scale(client: &Client, pool: &str, replicas: i32) -> i64 {
    Api::<MachinePool>::all(client.clone())
        .patch(
            pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap()
}

/// Whether the pool has acted on `generation` and holds `replicas` Machines not being deleted.
async fn settled(client: &Client, pool: &str, generation: i64, replicas: usize) -> bool {
    let p: MachinePool = Api::all(client.clone()).get(pool).await.unwrap();
    let observed = p.status.and_then(|s| s.observed_generation) == Some(generation);
    let live = members(client, pool)
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .count();
    observed && live == replicas
}

/// A pool deletes a Machine on scale-down; the watch shows the Machine gone (finalizer and
/// all) before the API server's answer to the DELETE reaches the pool. The expectation of
/// that deletion must already be recorded then, or it waits for a watch event that has
/// passed and holds the pool still until it expires ([`EXPECTATION_TTL`]): the pool's next
/// change (a scale-up) must be acted on long before that.
#[tokio::test]
async fn a_write_the_watch_shows_before_its_answer_does_not_hold_the_pool_still() {
    let client = client().await;
    start_in_process(slow_deletes_client().await);
    let pool: MachinePool = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachinePool",
        "metadata": {"name": "book-pool"},
        "spec": {"replicas": 2, "template": {"spec": {"provider": "manual"}}},
    }))
    .unwrap();
    let created = Api::<MachinePool>::all(client.clone())
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let generation = created.metadata.generation.unwrap();
    wait_for("2 Machines", || async {
        settled(&client, "book-pool", generation, 2)
            .await
            .then_some(())
    })
    .await;

    let scaled_down = Instant::now();
    let generation = scale(&client, "book-pool", 1).await;
    let removed = wait_for("a Machine removed and gone", || async {
        let names: Vec<String> = members(&client, "book-pool")
            .await
            .iter()
            .map(|m| m.name_any())
            .collect();
        (names.len() == 1 && settled(&client, "book-pool", generation, 1).await).then_some(names)
    })
    .await;

    let generation = scale(&client, "book-pool", 3).await;
    let deadline = scaled_down + EXPECTATION_TTL - Duration::from_secs(5);
    loop {
        if settled(&client, "book-pool", generation, 3).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not act on its scale-up within {} s of its scale-down (kept {removed:?}): \
             it waited for the expectation of a deletion the watch had shown before it was recorded",
            (EXPECTATION_TTL - Duration::from_secs(5)).as_secs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
