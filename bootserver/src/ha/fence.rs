//! The part fences' shells: a Kubernetes Lease per part of the pools, held by the part's
//! owner, taken by its partner only when the owner neither renews it nor answers, and
//! handed back when the owner returns. The decisions are [`super::pair`]'s; the Lease's
//! reads, writes and timing are [`unbounded_runtime::leader`]'s (the same guarantee as the
//! PXE provider's election: a holder that cannot renew stops before anyone else may take
//! the Lease).
//!
//! | Lease (`unbounded-bootserver-part-<owner>`) | held by | while |
//! |---|---|---|
//! | the owner's | the owner | it reaches the API server |
//! | | the partner | the owner's holding expired while the partner could not hear it, until the partner hands it back |

use std::sync::{Arc, Mutex};
use std::time::Duration;

use unbounded_runtime::leader::{ElectionConfig, Elector, Timing};

use super::link::PairLink;
use super::pair::{Event, Pair};
use super::settings::HaSettings;
use crate::dhcp::now_unix;

/// How often the shells look at the pair's state.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Where the fences live.
#[derive(Clone)]
pub struct FenceApi {
    /// A client of its own for the Leases (renewals never queue behind other requests).
    pub client: kube::Client,
    /// The namespace of the Leases.
    pub namespace: String,
    /// The Leases' timing (the leader-election flags').
    pub timing: Timing,
}

impl std::fmt::Debug for FenceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceApi")
            .field("namespace", &self.namespace)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

/// The Lease that fences `owner`'s part.
pub fn lease_name(owner: &str) -> String {
    format!("unbounded-bootserver-part-{owner}")
}

fn lock(pair: &Mutex<Pair>) -> std::sync::MutexGuard<'_, Pair> {
    pair.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts both fences' shells as tasks: this server's own part, and its partner's.
pub fn start(api: FenceApi, ha: &HaSettings, pair: Arc<Mutex<Pair>>, link: Arc<PairLink>) {
    let elector = |owner: &str| {
        Elector::new(
            api.client.clone(),
            ElectionConfig {
                namespace: api.namespace.clone(),
                lease_name: lease_name(owner),
                identity: ha.name.clone(),
                timing: api.timing,
            },
        )
    };
    tokio::spawn(hold_own(
        elector(&ha.name),
        ha.partner.clone(),
        pair.clone(),
    ));
    tokio::spawn(watch_partners(elector(&ha.partner), pair, link));
}

/// This server's own part: campaign, hold, and when the holding is lost, say so and
/// campaign again.
async fn hold_own(mut elector: Elector, partner: String, pair: Arc<Mutex<Pair>>) {
    loop {
        elector.acquire().await;
        if elector.taken_from() == Some(partner.as_str()) {
            // The partner held this part and let it lapse without handing it back: what it
            // did here is known only from its records.
            tracing::warn!(%partner, "pair: took this server's part back from the partner, which let it lapse; recovering from its records first");
            lock(&pair).on(Event::OwnFenceReturned, now_unix());
        }
        lock(&pair).set_own_fence(true);
        tracing::info!(lease = %elector.lease_name(), "pair: holding this server's part");
        let lost = elector.lead(std::future::pending::<()>()).await;
        lock(&pair).set_own_fence(false);
        if let Err(lost) = lost {
            tracing::warn!(%lost, "pair: lost this server's part fence: no new binding in its part unless the partner answers");
        }
    }
}

/// The partner's part: taken only while the partner does not answer (its Lease must also
/// have gone unrenewed for the lease duration, which the election decides), held while it
/// stays away, handed back when it returns.
async fn watch_partners(mut elector: Elector, pair: Arc<Mutex<Pair>>, link: Arc<PairLink>) {
    loop {
        while !lock(&pair).may_take_fence() {
            tokio::time::sleep(LOOK_EVERY).await;
        }
        let taken = tokio::select! {
            () = elector.acquire() => true,
            () = until(&pair, |pair| !pair.may_take_fence()) => false,
        };
        if !taken {
            continue;
        }
        let now = now_unix();
        lock(&pair).on(Event::FenceTaken, now);
        tracing::warn!(lease = %elector.lease_name(), "pair: the partner neither answers nor renews its part: took its part (new bindings there once the longest lease has passed)");
        match elector.lead(hand_back_when_ready(&pair, &link)).await {
            Ok(()) => {
                elector.release().await;
                lock(&pair).on(Event::PartnerRecovered, now_unix());
                tracing::info!(lease = %elector.lease_name(), "pair: handed the partner's part back");
            }
            Err(lost) => {
                lock(&pair).on(Event::FenceLost, now_unix());
                tracing::warn!(%lost, "pair: lost the partner's part fence");
            }
        }
    }
}

/// Waits until `done` says so of the pair.
async fn until(pair: &Mutex<Pair>, done: impl Fn(&Pair) -> bool) {
    while !done(&lock(pair)) {
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Returns once the partner's part may go back: the partner answers, this server stopped
/// binding there long enough ago for its offers there to lapse, and the partner
/// acknowledged every record sent before (the barrier).
async fn hand_back_when_ready(pair: &Mutex<Pair>, link: &Arc<PairLink>) {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let now = now_unix();
        let ready = {
            let mut pair = lock(pair);
            if pair.partner_answers(now) {
                pair.on(Event::HandingBack, now);
            }
            pair.may_hand_back(now)
        };
        if !ready {
            continue;
        }
        let link = link.clone();
        if let Ok(true) = tokio::task::spawn_blocking(move || link.barrier()).await {
            return;
        }
    }
}
