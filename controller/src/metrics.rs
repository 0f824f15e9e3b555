//! Prometheus metrics of the controller, and [`ReconcileTimer`]: the one place that counts
//! and times a reconcile (every reconciler holds one for its run).

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `machine` or `configuration`.
    pub controller: String,
}

/// Labels of an error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// The error kind ([`crate::Error::metric_label`]).
    pub error: String,
}

/// Labels of a phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase.
    pub phase: String,
}

/// Labels of a pool's replica count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The MachinePool.
    pub pool: String,
    /// `desired`, `current`, `ready`, `available`, `updated`, `unhealthy` or `removing`.
    pub state: String,
}

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciliations started.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciliations that failed.
    pub errors: Family<ErrorLabels, Counter>,
    /// Duration of reconciliations, seconds.
    pub duration: Family<ControllerLabels, Histogram>,
    /// Machines per phase.
    pub machines: Family<PhaseLabels, Gauge>,
    /// Events dropped because the event queue was full.
    pub events_dropped: Counter,
    /// MachinePool replicas by state.
    pub pool_replicas: Family<PoolLabels, Gauge>,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
            }),
            machines: Family::default(),
            events_dropped: Counter::default(),
            pool_replicas: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix("unbounded_controller");
        registry.register(
            "reconciles",
            "Reconciliations started",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed",
            metrics.errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciliations",
            metrics.duration.clone(),
        );
        registry.register("machines", "Machines per phase", metrics.machines.clone());
        registry.register(
            "events_dropped",
            "Events dropped because the event queue was full",
            metrics.events_dropped.clone(),
        );
        registry.register(
            "pool_replicas",
            "MachinePool replicas by state",
            metrics.pool_replicas.clone(),
        );
        metrics
    }

    /// Records a pool's replicas by state.
    pub fn set_pool(&self, pool: &str, desired: i32, counts: &crate::pool::status::Counts) {
        for (state, value) in Self::pool_states(desired, counts) {
            self.pool_replicas
                .get_or_create(&PoolLabels {
                    pool: pool.to_owned(),
                    state: state.to_owned(),
                })
                .set(i64::from(value));
        }
    }

    /// Forgets a deleted pool's series.
    pub fn forget_pool(&self, pool: &str) {
        for (state, _) in Self::pool_states(0, &crate::pool::status::Counts::default()) {
            self.pool_replicas.remove(&PoolLabels {
                pool: pool.to_owned(),
                state: state.to_owned(),
            });
        }
    }

    fn pool_states(desired: i32, c: &crate::pool::status::Counts) -> [(&'static str, i32); 7] {
        [
            ("desired", desired),
            ("current", c.replicas),
            ("ready", c.ready),
            ("available", c.available),
            ("updated", c.updated),
            ("unhealthy", c.unhealthy),
            ("removing", c.removing),
        ]
    }

    /// Labels for a controller.
    pub fn controller(name: &str) -> ControllerLabels {
        ControllerLabels {
            controller: name.to_owned(),
        }
    }

    /// Counts a reconcile of `controller` and times it until the returned guard drops
    /// (also when the reconcile fails or is cancelled).
    pub fn reconcile_timer(&self, controller: &str) -> ReconcileTimer<'_> {
        let labels = Self::controller(controller);
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            metrics: self,
            labels,
            started: Instant::now(),
        }
    }
}

/// One reconcile under way: its duration is recorded when this drops.
#[derive(Debug)]
#[must_use = "the reconcile is timed until the guard drops"]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    labels: ControllerLabels,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry)
            .unwrap_or_else(|e| panic!("{e}"));
        text
    }

    /// The timer counts the reconcile when it starts and records one duration sample
    /// when it drops, under the controller's label.
    #[test]
    fn a_timer_counts_and_times_one_reconcile() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let timer = metrics.reconcile_timer("machine");
        let text = encoded(&registry);
        assert!(
            text.contains("unbounded_controller_reconciles_total{controller=\"machine\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("reconcile_duration_seconds_count{controller=\"machine\"}"),
            "no sample before the reconcile ends: {text}"
        );
        drop(timer);
        let text = encoded(&registry);
        assert!(
            text.contains(
                "unbounded_controller_reconcile_duration_seconds_count{controller=\"machine\"} 1"
            ),
            "{text}"
        );
    }
}
