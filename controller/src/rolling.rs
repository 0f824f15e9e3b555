//! A MachineConfiguration's `updateStrategy: RollingUpdate`: the Machines that resolve to
//! the configuration and belong to no MachinePool (a pool's Machines follow the pool's own
//! strategy) are its group; the out-of-date ones are repaved in batches that keep at most
//! `rollingUpdate.maxUnavailable` of the group unavailable ([`crate::rollout`]). With
//! `OnDelete` nothing here runs: a recorded version changes only when a Node is deleted, by
//! a person or by a rollout.
//!
//! The group is found through the indexes: the Machines the configuration's selector matches
//! and those that record or name it, each resolved again (a Machine matched by a
//! higher-priority configuration belongs to that one's rollout).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use unbounded_api::well_known::{labels, reasons};
use unbounded_api::{MachineConfiguration, RolloutStatus, UpdateStrategyType};

use crate::context::Context;
use crate::error::Error;
use crate::members::{facts_of, machines_named, resolve_target, resolved};
use crate::repave;
use crate::rollout::{self, Member, RolloutState, some_names};

/// Where a configuration's rollout stands after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// Counts for the status.
    pub status: RolloutStatus,
    /// The state, for the UpToDate condition.
    pub state: RolloutState,
    /// Look again after this long (a deadline, or a rollout under way).
    pub recheck: Option<Duration>,
}

/// How often a rollout under way looks again without a trigger.
const BUSY_RECHECK: Duration = Duration::from_secs(10);

fn owner_key(configuration: &str) -> String {
    format!("configuration/{configuration}")
}

/// The configuration's group, as rollout members.
fn members_of(configuration: &MachineConfiguration, ctx: &Context) -> Vec<Member> {
    let name = configuration.name_any();
    let names: BTreeSet<String> = {
        let index = ctx.machine_index.read();
        let mut names: BTreeSet<String> =
            index.of_configuration(&name).map(str::to_owned).collect();
        names.extend(
            index
                .matching(configuration.spec.machine_selector.as_ref())
                .into_iter()
                .map(str::to_owned),
        );
        names
    };
    machines_named(ctx, names.iter().map(String::as_str))
        .into_iter()
        .filter(|m| !m.labels().contains_key(labels::POOL))
        .filter_map(|m| {
            let target = resolved(&resolve_target(
                ctx,
                m.labels(),
                m.spec.configuration_ref.as_ref(),
            ))?;
            (target.name == name).then(|| facts_of(ctx, &m, Some(target)).member)
        })
        .collect()
}

/// Runs one pass of a configuration's rolling update; `None` for OnDelete.
pub async fn roll(
    configuration: &MachineConfiguration,
    ctx: &Context,
) -> Result<Option<Rollout>, Error> {
    if configuration.spec.update_strategy_type() != UpdateStrategyType::RollingUpdate {
        return Ok(None);
    }
    let name = configuration.name_any();
    let settings = configuration.spec.rolling_update();
    let deadline = Duration::from_secs(
        u64::try_from(
            settings
                .progress_deadline_seconds
                .unwrap_or(unbounded_api::pool::DEFAULT_PROGRESS_DEADLINE_SECONDS),
        )
        .unwrap_or(1),
    );
    let now = Timestamp::now();
    let members = members_of(configuration, ctx);
    let active = members.iter().filter(|m| !m.deleting).count();
    let (max_unavailable, _) =
        rollout::unavailable_and_surge(settings.max_unavailable.as_ref(), None, active);
    let failed = rollout::failed_repaves(&members, deadline, now);
    let state = rollout::rollout_state(&members, true, false, failed);
    let waiting = ctx
        .expectations
        .read()
        .members
        .pending_for(&owner_key(&name), Instant::now())
        > 0;
    if state.may_start_batches() && !waiting {
        let batch = rollout::next_batch(&members, max_unavailable);
        if !batch.is_empty() {
            for machine in &batch {
                repave::request(ctx, owner_key(&name), machine, None, now).await?;
            }
            let progress = match &state {
                RolloutState::RollingOut { updated, total, .. } => {
                    format!("{updated} of {total} up to date")
                }
                _ => String::new(),
            };
            ctx.event(
                configuration,
                EventType::Normal,
                reasons::ROLLING_OUT,
                format!(
                    "rollout batch: repaving {} ({progress})",
                    some_names(&batch)
                ),
            )
            .await;
        }
    }
    let status = RolloutStatus {
        machines: count(active),
        updated: count(
            members
                .iter()
                .filter(|m| !m.deleting && m.up_to_date && m.version.is_some())
                .count(),
        ),
        available: count(members.iter().filter(|m| m.available).count()),
    };
    let busy = matches!(state, RolloutState::RollingOut { .. }) || waiting;
    let recheck = [
        rollout::next_deadline(&members, deadline, now),
        busy.then_some(BUSY_RECHECK),
    ]
    .into_iter()
    .flatten()
    .min();
    Ok(Some(Rollout {
        status,
        state,
        recheck,
    }))
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
