//! Leader election with a `coordination.k8s.io/v1` Lease: at most one replica acts at a time,
//! and a leader that cannot renew stops acting *before* anyone else can take the lease.
//!
//! The semantics are client-go's leader election:
//! - **lease duration** (15 s by default): a replica that sees the Lease's record unchanged
//!   for this long, by its own clock, may take it;
//! - **renew deadline** (10 s): a leader whose renewals all failed for this long, counted
//!   from the start of its last successful renewal, stops acting: its work is dropped (every
//!   reconciler with it) and [`Elector::lead`] returns [`LostLeadership`];
//! - **retry period** (2 s): how often replicas read and write the Lease;
//! - every request is bounded ([`Timing::request_timeout`], a quarter of the renew deadline),
//!   and the step-down does not wait for a request at all: it is a timer raced against the
//!   renewal, so a connection that stalls (no bytes, no reset) cannot keep a leader leading.
//!
//! `retry period < renew deadline < lease duration` is checked ([`Timing::new`]).
//!
//! # The guarantee and its clock assumption
//!
//! Say leader L's last successful renewal R was an attempt that L started at instant `a` of
//! its own monotonic clock (before reading the Lease). L stops acting at `a + renew
//! deadline` unless another renewal succeeds. A follower F can take the lease only with a
//! write whose precondition is the `resourceVersion` it last read, so the record it replaces
//! is exactly R (a later renewal by L would have changed the version; a write by someone
//! else would have made F's write fail). F writes only after seeing R *unchanged for the
//! lease duration by its own clock*, counted from the first read that returned R; that read
//! was answered after R was written, and R was written after L started at `a`. In real time,
//! then, F's takeover happens after `a + lease duration / (1 + ρ)` and L has stopped by
//! `a + renew deadline / (1 − ρ)`, where ρ bounds how much faster or slower than real time
//! any replica's monotonic clock runs. With 10 s and 15 s this holds while the clock *rates*
//! differ by less than 20 %; monotonic clocks under NTP differ by less than 0.05 %. Absolute
//! clock values never enter: the holder's `renewTime` (another machine's wall clock) is
//! written for people and never compared with ours ([`decide`]), so a wrong time zone, a
//! clock step or a skewed node changes nothing.
//!
//! What else the guarantee relies on:
//! - the leader's process runs: its timer fires and its work is dropped at the next poll.
//!   A process frozen for longer than `lease duration − renew deadline` (SIGSTOP, a paused
//!   VM) wakes up believing it leads until its timer runs;
//! - a write already on the wire when the leader stops can still land afterwards (the
//!   leader sends no new write, but the network may hold an old one). The gap `lease
//!   duration − renew deadline` absorbs delays shorter than it; beyond that the objects' own
//!   preconditions (`resourceVersion`, server-side apply ownership) are the fence;
//! - tasks the work spawns must end with it (`JoinSet`, abort on drop): the work future
//!   *is* the leadership, and dropping it is how a leader stops;
//! - what the work sends to something with no precondition of its own (a BMC command) asks
//!   the [`Term`] first, from whatever thread it runs on: nothing is sent once the term is
//!   over, and every command is answered or given up on by [`Candidate::acts_end_by`], half
//!   the gap past the step-down instant. A blocking call that outlives the dropped work
//!   (tokio cannot cancel `spawn_blocking`) therefore sends nothing more.
//!
//! The property test `tests/one_leader.rs` drives random interleavings of renewals that
//! succeed, fail, stall or arrive late, crashes and restarts, for several replicas whose
//! clocks run at different rates, through [`decide`], and checks that no two replicas ever
//! believe they lead at the same instant; the controller's `tests/leader.rs` stalls a
//! leader's connection to a real API server and reads the API server's audit log.
//!
//! # What each component elects
//!
//! | component | Lease (namespace `unbounded-system`) | what only the leader runs | on losing it |
//! |---|---|---|---|
//! | controller | `unbounded-controller` | every reconciler and the Event publisher | exits 1; restarts as a follower |
//! | bootserver | `unbounded-pxe-provider` | the PXE provider: Machine status, finalizers, BMC power, power operations | stops the provider, campaigns again; DHCP, TFTP and HTTP serve on every replica |
//! | azure | `unbounded-azure-provider` | the provider loop and its operations | exits 1; restarts as a follower |
//!
//! Flags ([`ElectionFlags`]): `--no-leader-election`, `--leader-election-namespace`,
//! `--lease-name`, `--leader-election-identity` (default `$POD_NAME`),
//! `--leader-election-lease-duration`, `--leader-election-renew-deadline`,
//! `--leader-election-retry-period`, `--leader-election-kubeconfig` (a separate route to the
//! API server for the Lease only).

pub mod decide;
mod flags;
mod term;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};

pub use decide::{Candidate, Claim, Decision, Read, Record, Tick, Timing, TimingError};
pub use flags::{ElectionFlags, SetupError, default_identity, name_user_agent, parse_duration};
pub use term::{SHORTEST_GRANT, Term, TermEnded};

/// Where the Lease is and who this replica is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// The timing.
    pub timing: Timing,
}

/// Why one attempt to read or write the Lease failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The API server did not answer in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The API server refused, or the connection failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Why a replica stopped leading. Its work was dropped before this was returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LostLeadership {
    /// No renewal succeeded within the renew deadline.
    #[error(
        "no renewal of the Lease succeeded within the renew deadline ({deadline:?}); stopped before the lease ({duration:?}) could expire for the other replicas"
    )]
    RenewDeadline {
        /// The renew deadline.
        deadline: Duration,
        /// The lease duration.
        duration: Duration,
    },
    /// The Lease names another holder (or none).
    #[error("the Lease now names {}", holder.as_deref().unwrap_or("no holder"))]
    TakenOver {
        /// The holder named.
        holder: Option<String>,
    },
    /// [`Elector::lead`] was called without leading.
    #[error("this replica does not lead")]
    NotLeading,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the lease (took or renewed it).
    Leading,
    /// Someone else does.
    Following {
        holder: String,
        expires_in: Duration,
    },
    /// This replica led, and the Lease names someone else.
    Lost { holder: Option<String> },
    /// Another write came first.
    Conflict,
}

/// This process's monotonic clock, as [`Tick`]s since the elector started.
#[derive(Debug, Clone, Copy)]
struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    fn now(&self) -> Tick {
        tokio::time::Instant::now().duration_since(self.origin)
    }

    fn instant(&self, tick: Tick) -> tokio::time::Instant {
        self.origin + tick
    }
}

/// A replica's participation in the election: [`Elector::acquire`], then [`Elector::lead`]
/// with the work only a leader does.
#[allow(missing_debug_implementations)] // holds a kube Client
pub struct Elector {
    api: Api<Lease>,
    lease_name: String,
    candidate: Candidate,
    clock: Clock,
    /// The current term as the work sees it; ended whenever this replica does not lead.
    term: Term,
    /// Who held the Lease it last took from someone else.
    taken_from: Option<String>,
}

impl Elector {
    /// A replica of the election in `config`, reading and writing the Lease with `client`
    /// (best a client of its own, so that renewals never queue behind other requests).
    pub fn new(client: Client, config: ElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            lease_name: config.lease_name,
            candidate: Candidate::new(config.identity, config.timing),
            clock: Clock {
                origin: tokio::time::Instant::now(),
            },
            term: Term::ended(),
            taken_from: None,
        }
    }

    /// Who held the Lease this replica last took, when it took it from someone else (an
    /// expired holding; never a released or absent Lease, and never its own). A component
    /// that keeps a Lease per part (the bootserver's pair) learns from it that its partner
    /// held its part and let it lapse.
    pub fn taken_from(&self) -> Option<&str> {
        self.taken_from.as_deref()
    }

    /// The term the current (or next) [`Elector::lead`] runs in: hand it to whatever sends
    /// commands the lease protects, so that nothing is sent once the term is over.
    pub fn term(&self) -> Term {
        self.term.clone()
    }

    /// The step-down and acts-end instants of the candidate's current term, if it leads.
    fn term_instants(&self) -> Option<(std::time::Instant, std::time::Instant)> {
        let step_down = self.candidate.step_down_at()?;
        let acts_end_by = self.candidate.acts_end_by()?;
        Some((
            self.clock.instant(step_down).into_std(),
            self.clock.instant(acts_end_by).into_std(),
        ))
    }

    /// Stops leading: the candidate and the term its work was handed.
    fn step_down(&mut self) {
        self.candidate.step_down();
        self.term.end();
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        self.candidate.identity()
    }

    /// The Lease's name.
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    /// Campaigns until this replica holds the lease. Failures are logged and retried.
    pub async fn acquire(&mut self) {
        let timing = self.candidate.timing();
        let mut following: Option<String> = None;
        loop {
            match self.attempt().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(lease = %self.lease_name, identity = %self.identity(), "became leader");
                    self.term.end();
                    self.term = match self.term_instants() {
                        Some((step_down, acts_end_by)) => Term::leading(step_down, acts_end_by),
                        None => Term::ended(),
                    };
                    return;
                }
                Ok(Attempt::Following { holder, expires_in }) => {
                    if following.as_deref() != Some(holder.as_str()) {
                        tracing::info!(
                            lease = %self.lease_name,
                            %holder,
                            "following: the lease is held by {holder}; it is ours to take if it stays unchanged for {expires_in:?}"
                        );
                        following = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {
                    tracing::debug!(lease = %self.lease_name, "another replica wrote the Lease first")
                }
                Ok(Attempt::Lost { .. }) => self.step_down(),
                Err(error) => {
                    tracing::warn!(lease = %self.lease_name, %error, "reading or writing the Lease failed; retrying")
                }
            }
            tokio::time::sleep(timing.retry_period()).await;
        }
    }

    /// Runs `work` while this replica leads, renewing the lease every retry period.
    ///
    /// Returns `Ok` with the work's output if it ends first (the lease is still held: call
    /// [`Elector::release`]). Returns [`LostLeadership`] when the renew deadline passes
    /// without a successful renewal, or the Lease names another holder; by then `work` has
    /// been dropped, so nothing it started runs on (provided what it spawned ends with it).
    pub async fn lead<F: Future>(&mut self, work: F) -> Result<F::Output, LostLeadership> {
        enum Step<O> {
            Deadline,
            Done(O),
            Pause,
            Renewal(Result<Attempt, AttemptError>),
        }
        let timing = self.candidate.timing();
        let mut work = std::pin::pin!(work);
        loop {
            let Some(step_down_at) = self.candidate.step_down_at() else {
                return Err(LostLeadership::NotLeading);
            };
            let deadline = self.clock.instant(step_down_at);
            // Wait a retry period, then renew; the deadline is raced against both, and the
            // work runs throughout.
            let step = tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => Step::Deadline,
                output = &mut work => Step::Done(output),
                () = tokio::time::sleep(timing.retry_period()) => Step::Pause,
            };
            let step = match step {
                Step::Pause => tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(deadline) => Step::Deadline,
                    output = &mut work => Step::Done(output),
                    outcome = self.attempt() => Step::Renewal(outcome),
                },
                other => other,
            };
            match step {
                Step::Done(output) => return Ok(output),
                Step::Pause => {}
                Step::Deadline => {
                    self.step_down();
                    return Err(LostLeadership::RenewDeadline {
                        deadline: timing.renew_deadline(),
                        duration: timing.lease_duration(),
                    });
                }
                Step::Renewal(Ok(Attempt::Lost { holder })) => {
                    self.step_down();
                    return Err(LostLeadership::TakenOver { holder });
                }
                Step::Renewal(Ok(Attempt::Leading)) => {
                    tracing::trace!(lease = %self.lease_name, "renewed");
                    if let Some((step_down, acts_end_by)) = self.term_instants() {
                        self.term.extend(step_down, acts_end_by);
                    }
                }
                Step::Renewal(Ok(other)) => {
                    tracing::debug!(lease = %self.lease_name, outcome = ?other, "renewal did not go through; retrying")
                }
                Step::Renewal(Err(error)) => {
                    let left = step_down_at.saturating_sub(self.clock.now());
                    tracing::warn!(lease = %self.lease_name, %error, "renewing the lease failed; stopping in {left:?} unless a renewal succeeds");
                }
            }
        }
    }

    /// Gives the lease up so that another replica can take it at once. Call it only after
    /// the work has stopped. A failure is logged: the lease then expires as usual.
    pub async fn release(&mut self) {
        let was_leading = self.candidate.leading(self.clock.now());
        self.step_down();
        if !was_leading {
            return;
        }
        let timeout = self.candidate.timing().request_timeout();
        let current = match bounded(
            timeout,
            "reading the Lease",
            self.api.get_opt(&self.lease_name),
        )
        .await
        {
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(%error, "releasing the lease failed; it expires on its own");
                return;
            }
        };
        let Some(mut lease) = current else { return };
        if !self.candidate.may_release(read_of(&lease)) {
            return;
        }
        let mut spec = lease.spec.take().unwrap_or_default();
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        lease.spec = Some(spec);
        // The resourceVersion read is the precondition: a release never undoes a takeover.
        match bounded(
            timeout,
            "releasing the Lease",
            self.api
                .replace(&self.lease_name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(_) => tracing::info!(lease = %self.lease_name, "released the lease"),
            Err(error) => {
                tracing::warn!(%error, "releasing the lease failed; it expires on its own")
            }
        }
    }

    /// One read of the Lease and, if the decision says so, one write; each request bounded by
    /// the request timeout.
    async fn attempt(&mut self) -> Result<Attempt, AttemptError> {
        let timing = self.candidate.timing();
        let timeout = timing.request_timeout();
        let started = self.clock.now();
        let current = bounded(
            timeout,
            "reading the Lease",
            self.api.get_opt(&self.lease_name),
        )
        .await?;
        let read = current.as_ref().map_or(Read::Absent, read_of);
        let decision = self.candidate.observe(read, self.clock.now());
        let written = match (decision, current) {
            (Decision::Follow { holder, expires_in }, _) => {
                return Ok(Attempt::Following { holder, expires_in });
            }
            (Decision::Lost { holder }, _) => return Ok(Attempt::Lost { holder }),
            (Decision::Create, _) | (Decision::Claim(_), None) => {
                self.taken_from = None;
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.lease_name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(claimed_spec(
                        LeaseSpec::default(),
                        Claim::Take,
                        self.identity(),
                        timing,
                    )),
                };
                bounded(
                    timeout,
                    "creating the Lease",
                    self.api.create(&PostParams::default(), &lease),
                )
                .await
            }
            (Decision::Claim(claim), Some(mut lease)) => {
                let spec = lease.spec.take().unwrap_or_default();
                let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
                self.taken_from = holder.filter(|h| claim == Claim::Take && h != self.identity());
                lease.spec = Some(claimed_spec(spec, claim, self.identity(), timing));
                // replace carries the resourceVersion read: a concurrent write makes it a 409.
                bounded(
                    timeout,
                    "writing the Lease",
                    self.api
                        .replace(&self.lease_name, &PostParams::default(), &lease),
                )
                .await
            }
        };
        match written {
            Ok(lease) => {
                let version = lease.metadata.resource_version.unwrap_or_default();
                self.candidate.claimed(started, &version, self.clock.now());
                Ok(Attempt::Leading)
            }
            Err(AttemptError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => Ok(Attempt::Conflict),
            Err(error) => Err(error),
        }
    }
}

/// Campaigns, leads with a fresh `work(term)`, and when leadership is lost campaigns again:
/// for components that keep serving as followers (the bootserver keeps DHCP, TFTP and HTTP
/// up and elects only its provider). Returns only if the work ends on its own (after
/// releasing the lease).
pub async fn lead_repeatedly<Fut: Future>(
    elector: &mut Elector,
    mut work: impl FnMut(Term) -> Fut,
) -> Fut::Output {
    loop {
        elector.acquire().await;
        let term = elector.term();
        match elector.lead(work(term)).await {
            Ok(output) => {
                elector.release().await;
                return output;
            }
            Err(lost) => {
                tracing::error!(lease = %elector.lease_name(), %lost, "stopped leading; campaigning again");
            }
        }
    }
}

/// The record of a Lease as [`decide`] reads it.
fn read_of(lease: &Lease) -> Read<'_> {
    let spec = lease.spec.as_ref();
    Read::Present(Record {
        version: lease
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        holder: spec.and_then(|s| s.holder_identity.as_deref()),
        lease_duration: spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs),
    })
}

/// The spec a claim writes. `renewTime` and `acquireTime` are this machine's wall clock, for
/// people reading the Lease; no replica decides on them.
fn claimed_spec(current: LeaseSpec, claim: Claim, identity: &str, timing: Timing) -> LeaseSpec {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let previous = current.holder_identity.clone().filter(|h| !h.is_empty());
    let changes_hands = claim == Claim::Take && previous.as_deref() != Some(identity);
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(timing.lease_duration_seconds()),
        acquire_time: match claim {
            Claim::Renew if current.acquire_time.is_some() => current.acquire_time.clone(),
            _ => Some(now.clone()),
        },
        renew_time: Some(now),
        lease_transitions: Some(
            current
                .lease_transitions
                .unwrap_or(0)
                .saturating_add(i32::from(changes_hands && previous.is_some())),
        ),
        ..current
    }
}

/// `request` bounded by `timeout`.
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, AttemptError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(AttemptError::Api { what, source }),
        Err(_) => Err(AttemptError::Timeout {
            what,
            after: timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_over_counts_a_transition_and_a_renewal_keeps_the_acquire_time() {
        let acquired = MicroTime("2026-01-01T00:00:00Z".parse().unwrap());
        let held_by = |holder: Option<&str>| LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            acquire_time: Some(acquired.clone()),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        };
        let t = Timing::DEFAULT;
        let renewed = claimed_spec(held_by(Some("me")), Claim::Renew, "me", t);
        assert_eq!(renewed.acquire_time, Some(acquired.clone()));
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.lease_duration_seconds, Some(15));
        let taken = claimed_spec(held_by(Some("other")), Claim::Take, "me", t);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_ne!(taken.acquire_time, Some(acquired.clone()));
        assert_eq!(taken.lease_transitions, Some(4));
        // A released lease (no holder) taken: a new term, no transition between holders.
        let free = claimed_spec(held_by(None), Claim::Take, "me", t);
        assert_eq!(free.lease_transitions, Some(3));
    }
}
