//! The Prometheus recorder set up the family's way: Micrometer's names (`_total` on
//! counters, `_seconds` on timers) and real histograms with buckets for every timer and
//! distribution of [`METRICS`](crate::observe::metrics::METRICS).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::ActuatorError;
use crate::observe::metrics::{METRICS, RUST_ONLY_METRICS, describe};

/// How often the installed recorder's upkeep runs (drains histogram buffers).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The handle of the recorder [`install_prometheus_recorder`] installed, if it did.
static INSTALLED: OnceLock<PrometheusHandle> = OnceLock::new();

/// A `metrics-exporter-prometheus` builder configured for the family's metrics: recommended
/// naming (Micrometer's Prometheus names: `acemq_publish_duration_seconds_bucket`,
/// `acemq_messages_set_aside_failed_total`) and buckets for every timer
/// ([`DURATION_BUCKETS`](crate::observe::metrics::DURATION_BUCKETS), seconds) and for
/// `acemq.consume.attempts` ([`ATTEMPT_BUCKETS`](crate::observe::metrics::ATTEMPT_BUCKETS)),
/// so they render as histograms, not summaries.
///
/// An application with its own Prometheus recorder starts from this builder, adds its own
/// settings, installs it, and calls [`describe`] (the `_seconds` suffix comes from the
/// described unit):
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let handle = acemq::actuator::prometheus_builder()?
///     .add_global_label("service", "billing")
///     .install_recorder()?;
/// acemq::observe::metrics::describe();
/// // serve handle.render() wherever the application serves metrics
/// # Ok(()) }
/// ```
///
/// Fails only if a bucket list were empty (they are constants, never empty).
pub fn prometheus_builder() -> Result<PrometheusBuilder, ActuatorError> {
    let mut builder = PrometheusBuilder::new().with_recommended_naming(true);
    for m in METRICS.iter().chain(RUST_ONLY_METRICS) {
        if let Some(buckets) = m.instrument.buckets() {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(m.name.to_owned()), buckets)
                .map_err(|e| ActuatorError::Recorder(e.to_string()))?;
        }
    }
    Ok(builder)
}

/// Installs [`prometheus_builder`]'s recorder as the process-wide global recorder, describes
/// the family's metrics, and (inside a tokio runtime) runs its upkeep every five seconds.
/// Its rendering is then what `/acemq-metrics` serves, on the standalone actuator and on
/// every [`router`](super::router). Install it before traffic starts: metric handles bind
/// to the recorder in force when first used.
///
/// Fails when a global recorder is installed already (including by an earlier call).
///
/// ```no_run
/// # async fn demo() -> Result<(), acemq::actuator::ActuatorError> {
/// let handle = acemq::actuator::install_prometheus_recorder()?;
/// println!("{}", handle.render());
/// # Ok(()) }
/// ```
pub fn install_prometheus_recorder() -> Result<PrometheusHandle, ActuatorError> {
    let handle = prometheus_builder()?
        .install_recorder()
        .map_err(|e| ActuatorError::Recorder(e.to_string()))?;
    describe();
    let _ = INSTALLED.set(handle.clone());
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let for_upkeep = handle.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP_EVERY);
            loop {
                tick.tick().await;
                for_upkeep.run_upkeep();
            }
        });
    }
    Ok(handle)
}

/// The recorder [`install_prometheus_recorder`] installed, if any.
pub(crate) fn installed() -> Option<&'static PrometheusHandle> {
    INSTALLED.get()
}

/// Renders a handle's exposition (after upkeep, so the latest samples are in).
pub(crate) fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    let mut buf = Vec::new();
    match handle.render_to_write(&mut buf) {
        Ok(()) => String::from_utf8_lossy(&buf).into_owned(),
        Err(e) => format!("# acemq: rendering failed: {e}\n"),
    }
}
