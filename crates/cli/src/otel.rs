//! `--features otel`: the process's tracing spans (an agent's sessions, a send) go to an
//! OpenTelemetry collector over OTLP/HTTP, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names one. The exporter's own settings are the
//! standard `OTEL_*` variables (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_SERVICE_NAME`, ...).
//!
//! Spans are batched and exported from the SDK's own thread; [`shutdown`] flushes them
//! before the process exits.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The layer that exports spans, if a collector is configured. Call outside any async
/// runtime (the HTTP client keeps its own).
pub fn layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|e| !e.is_empty()));
    if !configured {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("warning: OpenTelemetry export off: {e}");
            return None;
        }
    };
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "bulkcast".into());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .build(),
        )
        .build();
    let tracer = provider.tracer("bulkcast");
    let _ = PROVIDER.set(provider);
    Some(tracing_opentelemetry::layer().with_tracer(tracer))
}

/// Exports the spans not yet sent (at most 5 s) and stops the exporter.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown_with_timeout(std::time::Duration::from_secs(5));
    }
}
