//! The MachinePool reconciler (Cluster API's MachinePool Machines, R1–R4): every replica is
//! an ordinary Machine owned by the pool and labelled `unbounded-cloud.io/pool=<pool>`, with
//! the same lifecycle, drain and operations as any other.
//!
//! Each pass reads the pool's Machines through the label index ([`gather`]), decides
//! everything at once ([`plan::plan_pool`]) and acts ([`act`]):
//!
//! - **scale**: azure and manual pools create `<pool>-<n>` Machines and delete them; pxe
//!   pools claim free PXE Machines from the inventory and release them (powered off, back in
//!   the inventory). Removal order: annotated `unbounded-cloud.io/delete-machine`, unhealthy,
//!   out of date, newest.
//! - **remediation** (`spec.remediation`): an unhealthy Machine is repaved with a `pxeBoot`
//!   (pxe) or deleted and so replaced (azure, manual), never more than `maxUnhealthy` at once.
//! - **rolling update** (`spec.strategy`): out-of-date Machines are repaved in batches
//!   ([`crate::rollout`]); with `maxSurge` a creating pool replaces them instead.
//!
//! A pass waits while the watch has not shown the pool's own recent writes
//! ([`crate::expectations::MemberExpectations`]). Deleting a pool deletes its created
//! Machines (through their normal deletion: drain, provider release) and releases its
//! claimed ones: a PXE Machine stands for hardware, which stays in the inventory.

pub mod act;
pub mod gather;
pub mod health;
pub mod plan;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use unbounded_api::well_known::{finalizers, operations, reasons};
use unbounded_api::{MachinePool, MachineProvider, PoolStrategyType};

use crate::context::Context;
use crate::error::Error;
use crate::rollout::{self, RolloutState, some_names};
use plan::{PoolFacts, Rolling, plan_pool};
use status::Counts;

/// How often a pool with a rollout or remediation under way looks again without a trigger.
const BUSY_RECHECK: Duration = Duration::from_secs(10);

/// Reconciles one MachinePool.
#[tracing::instrument(skip_all, fields(pool = %pool.name_any()))]
pub async fn reconcile(pool: Arc<MachinePool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("pool");
    let api: Api<MachinePool> = Api::all(ctx.client.clone());
    finalizer(&api, finalizers::POOL, pool, |event| async {
        match event {
            FinalizerEvent::Apply(pool) => apply(&pool, &ctx).await,
            FinalizerEvent::Cleanup(pool) => cleanup(&pool, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// The pool creates its Machines (azure, manual) rather than claiming them (pxe).
pub fn creates(pool: &MachinePool) -> bool {
    pool.spec.template.spec.provider != MachineProvider::Pxe
}

fn rolling_settings(pool: &MachinePool, replicas: usize) -> Option<Rolling> {
    if pool.spec.strategy_type() != PoolStrategyType::RollingUpdate {
        return None;
    }
    let settings = pool.spec.rolling_update();
    let (max_unavailable, max_surge) = rollout::unavailable_and_surge(
        settings.max_unavailable.as_ref(),
        settings.max_surge.as_ref().filter(|_| creates(pool)),
        replicas,
    );
    Some(Rolling {
        max_unavailable,
        max_surge,
        progress_deadline: Duration::from_secs(
            u64::try_from(progress_deadline_seconds(pool)).unwrap_or(1),
        ),
    })
}

fn progress_deadline_seconds(pool: &MachinePool) -> i64 {
    pool.spec
        .rolling_update()
        .progress_deadline_seconds
        .unwrap_or(unbounded_api::pool::DEFAULT_PROGRESS_DEADLINE_SECONDS)
}

async fn apply(pool: &MachinePool, ctx: &Context) -> Result<Action, Error> {
    let name = pool.name_any();
    let owner = act::owner_key(&name);
    if ctx
        .expectations
        .read()
        .members
        .pending_for(&owner, Instant::now())
        > 0
    {
        tracing::debug!(pool = %name, "waiting for the watch to show the pool's own writes");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let now = Timestamp::now();
    let gathered = gather::gather(pool, ctx, now);
    let mut synced = false;
    for (machine, facts) in &gathered.members {
        if !facts.member.deleting {
            synced |= act::sync(pool, machine, ctx).await?;
        }
    }
    let replicas = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let members: Vec<rollout::Member> = gathered
        .members
        .iter()
        .map(|(_, f)| f.member.clone())
        .collect();
    let rolling = rolling_settings(pool, replicas);
    let max_unhealthy = pool
        .spec
        .remediation
        .as_ref()
        .map(|r| rollout::scaled(r.max_unhealthy.as_ref(), replicas, false, replicas));
    let plan = plan_pool(&PoolFacts {
        replicas,
        creates: creates(pool),
        members: &members,
        claimable: gathered.claimable.len(),
        rolling,
        paused: pool.spec.paused,
        max_unhealthy,
        now,
    });
    tracing::debug!(pool = %name, ?plan, "planned");

    scale_up(pool, &plan, &gathered, ctx).await?;
    for machine_name in &plan.remove {
        remove(pool, machine_name, &gathered, ctx).await?;
    }
    for machine_name in &plan.remediate {
        let why = members
            .iter()
            .find(|m| &m.name == machine_name)
            .and_then(|m| m.unhealthy.clone())
            .unwrap_or_default();
        let action = if creates(pool) {
            act::delete(pool, machine_name, ctx).await?;
            "deleting it; a new Machine replaces it"
        } else {
            act::request_repave(pool, machine_name, Some(operations::PXE_BOOT), ctx).await?;
            "repaving it with a pxeBoot"
        };
        ctx.event(
            pool,
            EventType::Warning,
            reasons::REMEDIATING,
            format!("Machine {machine_name}: {why}; {action}"),
        )
        .await;
    }
    if !plan.repave.is_empty() {
        for machine_name in &plan.repave {
            act::request_repave(pool, machine_name, None, ctx).await?;
        }
        ctx.event(
            pool,
            EventType::Normal,
            reasons::ROLLING_OUT,
            format!(
                "rollout batch: repaving {} ({})",
                some_names(&plan.repave),
                progress_of(&plan.rollout)
            ),
        )
        .await;
    }

    let counts = count(&gathered);
    let planned = status::pool_conditions(
        &plan,
        &counts,
        pool.spec.replicas,
        creates(pool),
        pool.spec.remediation.is_some(),
        progress_deadline_seconds(pool),
    );
    if let RolloutState::Failed { machines } = &plan.rollout {
        let was_failed = pool.status.as_ref().is_some_and(|s| {
            unbounded_api::condition::find(
                &s.conditions,
                unbounded_api::well_known::conditions::UP_TO_DATE,
            )
            .is_some_and(|c| c.reason == reasons::BATCH_FAILED)
        });
        if !was_failed {
            ctx.event(
                pool,
                EventType::Warning,
                reasons::BATCH_FAILED,
                format!(
                    "{} not available {} s after their repave: the rollout is paused",
                    some_names(machines),
                    progress_deadline_seconds(pool)
                ),
            )
            .await;
        }
    }
    status::write(pool, &counts, &planned, &ctx.client).await?;
    ctx.metrics.set_pool(&name, pool.spec.replicas, &counts);
    ctx.pool_index.write().set_short(&name, plan.short > 0);

    let busy = synced
        || plan.add > 0
        || !plan.remove.is_empty()
        || matches!(plan.rollout, RolloutState::RollingOut { .. })
        || !matches!(plan.health, plan::HealthState::Healthy);
    let deadline = rolling.and_then(|r| rollout::next_deadline(&members, r.progress_deadline, now));
    let mut wait = ctx.settings.resync;
    for candidate in [gathered.recheck, deadline, busy.then_some(BUSY_RECHECK)]
        .into_iter()
        .flatten()
    {
        wait = wait.min(candidate + Duration::from_secs(1));
    }
    Ok(Action::requeue(wait))
}

fn progress_of(state: &RolloutState) -> String {
    match state {
        RolloutState::RollingOut { updated, total, .. } => {
            format!("{updated} of {total} up to date")
        }
        _ => String::new(),
    }
}

fn count(gathered: &gather::Gathered) -> Counts {
    let mut counts = Counts::default();
    for (_, facts) in &gathered.members {
        if facts.member.deleting {
            counts.removing += 1;
            continue;
        }
        counts.replicas += 1;
        counts.ready += i32::from(facts.member.ready);
        counts.available += i32::from(facts.member.available);
        counts.updated += i32::from(facts.updated);
        counts.unhealthy += i32::from(facts.member.unhealthy.is_some());
    }
    counts
}

async fn scale_up(
    pool: &MachinePool,
    plan: &plan::PoolPlan,
    gathered: &gather::Gathered,
    ctx: &Context,
) -> Result<(), Error> {
    if plan.add == 0 {
        return Ok(());
    }
    let name = pool.name_any();
    if creates(pool) {
        let mut created = Vec::new();
        let mut index = 0;
        while created.len() < plan.add {
            let candidate = act::machine_name(&name, index);
            index += 1;
            if ctx.machines.get(&ObjectRef::new(&candidate)).is_some() {
                continue;
            }
            if act::create(pool, &candidate, ctx).await? {
                created.push(candidate);
            } else {
                // Taken (our own create the cache does not show yet, or someone else's):
                // the next pass decides again.
                break;
            }
        }
        if !created.is_empty() {
            ctx.event(
                pool,
                EventType::Normal,
                reasons::SCALING_UP,
                format!("created {}", some_names(&created)),
            )
            .await;
        }
        return Ok(());
    }
    let mut claimed = 0;
    for machine in &gathered.claimable {
        if claimed == plan.add {
            break;
        }
        if act::claim(pool, machine, ctx).await? {
            claimed += 1;
            ctx.event(
                pool,
                EventType::Normal,
                reasons::CLAIMED,
                format!("claimed Machine {} from the inventory", machine.name_any()),
            )
            .await;
        }
    }
    Ok(())
}

async fn remove(
    pool: &MachinePool,
    machine_name: &str,
    gathered: &gather::Gathered,
    ctx: &Context,
) -> Result<(), Error> {
    if creates(pool) {
        act::delete(pool, machine_name, ctx).await?;
        ctx.event(
            pool,
            EventType::Normal,
            reasons::SCALING_DOWN,
            format!("deleting Machine {machine_name}"),
        )
        .await;
        return Ok(());
    }
    let Some((machine, _)) = gathered
        .members
        .iter()
        .find(|(m, _)| m.name_any() == machine_name)
    else {
        return Ok(());
    };
    act::release(pool, machine, ctx).await?;
    ctx.event(
        pool,
        EventType::Normal,
        reasons::RELEASED,
        format!("released Machine {machine_name} to the inventory (drained, then powered off)"),
    )
    .await;
    Ok(())
}

/// Deletion: created Machines are deleted (and waited for), claimed ones released.
async fn cleanup(pool: &MachinePool, ctx: &Context) -> Result<Action, Error> {
    let gathered = gather::gather(pool, ctx, Timestamp::now());
    let mut left = Vec::new();
    for (machine, facts) in &gathered.members {
        let machine_name = machine.name_any();
        if creates(pool) {
            if !facts.member.deleting {
                act::delete(pool, &machine_name, ctx).await?;
            }
            left.push(machine_name);
        } else {
            act::release(pool, machine, ctx).await?;
            ctx.event(
                pool,
                EventType::Normal,
                reasons::RELEASED,
                format!("pool deleted: released Machine {machine_name} to the inventory"),
            )
            .await;
        }
    }
    ctx.metrics.forget_pool(&pool.name_any());
    ctx.pool_index.write().remove(&pool.name_any());
    if !left.is_empty() {
        return Err(Error::Waiting(format!(
            "waiting for the pool's Machines to be deleted: {}",
            some_names(&left)
        )));
    }
    Ok(Action::await_change())
}
