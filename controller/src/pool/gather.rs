//! A pool's Machines and its free inventory, read from the stores through the label index.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use unbounded_api::well_known::{annotations, conditions, labels};
use unbounded_api::{
    ConfigurationRef, Machine, MachinePool, MachineProvider, PowerState, Remediation,
};

use super::act::is_member;
use super::health::{self, Health, NodeRule, Rules};
use crate::context::Context;
use crate::members::{Facts, facts_of, machines_named, resolve_target, resolved};

/// A pool's Machines with their facts, and its free inventory.
#[derive(Debug)]
pub struct Gathered {
    /// The pool's Machines (being deleted included) and their facts.
    pub members: Vec<(Arc<Machine>, Facts)>,
    /// Free PXE Machines the pool may claim, best first.
    pub claimable: Vec<Arc<Machine>>,
    /// When a Machine's health verdict changes if nothing else does.
    pub recheck: Option<Duration>,
}

/// The selector of a pool's Machines.
pub fn member_selector(pool: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(labels::POOL.to_owned(), pool.to_owned())])),
        match_expressions: None,
    }
}

/// The remediation rules, validated (the CRD refuses what these defaults stand in for).
pub fn rules(remediation: &Remediation) -> Rules {
    Rules {
        node: remediation
            .unhealthy_conditions
            .iter()
            .filter(|c| c.type_ == "Ready")
            .map(|c| NodeRule {
                status: c.status.clone(),
                timeout: Duration::from_secs(u64::try_from(c.timeout_seconds).unwrap_or(1)),
            })
            .collect(),
        provisioning_timeout: Duration::from_secs(
            u64::try_from(
                remediation
                    .provisioning_timeout_seconds
                    .unwrap_or(unbounded_api::pool::DEFAULT_PROVISIONING_TIMEOUT_SECONDS),
            )
            .unwrap_or(1),
        ),
    }
}

/// What a member resolves to once it is in step with the template: its labels with the
/// template's, and the template's configurationRef (or, for a claimed Machine when the
/// template names none, its own).
fn target_reference<'a>(
    pool: &'a MachinePool,
    machine: &'a Machine,
) -> Option<&'a ConfigurationRef> {
    let template = &pool.spec.template.spec;
    template.configuration_ref.as_ref().or_else(|| {
        (template.provider == MachineProvider::Pxe)
            .then_some(machine.spec.configuration_ref.as_ref())
            .flatten()
    })
}

/// Reads the pool's Machines and, for a PXE pool, its free inventory.
pub fn gather(pool: &MachinePool, ctx: &Context, now: Timestamp) -> Gathered {
    let name = pool.name_any();
    let names: Vec<String> = ctx
        .machine_index
        .read()
        .matching(Some(&member_selector(&name)))
        .into_iter()
        .map(str::to_owned)
        .collect();
    let machines = machines_named(ctx, names.iter().map(String::as_str));
    let template_labels = super::act::member_labels(pool);
    let rules = pool.spec.remediation.as_ref().map(rules);
    let mut recheck: Option<Duration> = None;
    let members = machines
        .into_iter()
        .filter(|m| is_member(m, pool))
        .map(|machine| {
            let mut labels = machine.labels().clone();
            labels.extend(template_labels.clone());
            let target = resolved(&resolve_target(
                ctx,
                &labels,
                target_reference(pool, &machine),
            ));
            let mut facts = facts_of(ctx, &machine, target);
            if let Some(rules) = &rules
                && !facts.member.deleting
            {
                match health::assess(&facts.health, rules, now) {
                    Health::Healthy => {}
                    Health::UnhealthyIn(left) => {
                        recheck = Some(recheck.map_or(left, |r| r.min(left)));
                    }
                    Health::Unhealthy(why) => facts.member.unhealthy = Some(why),
                }
            }
            (machine, facts)
        })
        .collect();
    let claimable = match &pool.spec.template.spec.pxe {
        Some(pxe) if pool.spec.template.spec.provider == MachineProvider::Pxe => free_inventory(
            ctx,
            &pxe.inventory_selector,
            pxe.hardware_requirements.as_ref(),
        ),
        _ => Vec::new(),
    };
    Gathered {
        members,
        claimable,
        recheck,
    }
}

/// Whether a Machine is free for a pool or a Cluster API UnboundedMachine to claim: a PXE
/// Machine in no pool, claimed by no UnboundedMachine, with no controlling owner, not being deleted, released (a release's drain pending) or claimed
/// right now.
pub fn is_free(machine: &Machine) -> bool {
    let annotations = machine.annotations();
    machine.spec.provider == MachineProvider::Pxe
        && !machine.labels().contains_key(labels::POOL)
        && !machine.labels().contains_key(labels::CAPI_MACHINE)
        && !machine
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true))
        && machine.metadata.deletion_timestamp.is_none()
        && !annotations.contains_key(annotations::REPAVE)
}

/// The free PXE Machines a selector matches and whose hardware labels meet the pool's
/// requirements, best first: those whose infrastructure is up and powered on (booted,
/// waiting for a configuration), then by name.
pub fn free_inventory(
    ctx: &Context,
    selector: &LabelSelector,
    requirements: Option<&unbounded_api::inventory::HardwareRequirements>,
) -> Vec<Arc<Machine>> {
    let names: Vec<String> = ctx
        .machine_index
        .read()
        .matching(Some(selector))
        .into_iter()
        .map(str::to_owned)
        .collect();
    let now = Instant::now();
    let expectations = ctx.expectations.read();
    let mut free: Vec<Arc<Machine>> = machines_named(ctx, names.iter().map(String::as_str))
        .into_iter()
        .filter(|m| is_free(m) && !expectations.members.joining(&m.name_any(), now))
        // A Machine whose in-band report contradicts its BMC is claimed by no pool, with or
        // without hardware requirements, until an operator resolves it.
        .filter(|m| !unbounded_api::inventory::labels::is_disputed(m.labels()))
        .filter(|m| requirements.is_none_or(|r| r.admits(m.labels())))
        .collect();
    drop(expectations);
    free.sort_by_key(|m| {
        let status = m.status.as_ref();
        let warm = status.is_some_and(|s| {
            unbounded_api::condition::is_true(&s.conditions, conditions::INFRASTRUCTURE_READY)
                && s.power == Some(PowerState::On)
        });
        (!warm, m.name_any())
    });
    free
}
