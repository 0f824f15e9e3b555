//! Prometheus metrics of the controller.

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
        metrics
    }

    /// Labels for a controller.
    pub fn controller(name: &str) -> ControllerLabels {
        ControllerLabels {
            controller: name.to_owned(),
        }
    }
}
