//! `/metrics`: Prometheus text exposition of requests, tokens, time to first token and time
//! in the queue (the `prometheus` crate's registry and encoder).

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Buckets for latencies, in seconds: 5 ms to 2 minutes.
const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// By endpoint (the route) and status code.
    pub requests: IntCounterVec,
    pub prompt_tokens: IntCounter,
    /// Prompt tokens whose keys and values the cached session already held (prefix reuse).
    pub prompt_tokens_cached: IntCounter,
    pub completion_tokens: IntCounter,
    /// Requests that ended because their client went away or the server shut down.
    pub cancelled: IntCounter,
    /// Requests answered 429 because the queue was full.
    pub rejected: IntCounter,
    pub time_to_first_token: Histogram,
    pub queue_time: Histogram,
    pub queued: IntGauge,
    pub running: IntGauge,
    /// Decode steps, and the sequences they computed (their ratio is the mean batch).
    pub decode_steps: IntCounter,
    pub decode_sequences: IntCounter,
    /// Speculative decoding (`--draft`): steps that verified drafted tokens, the tokens
    /// drafted, and those the target kept.
    pub draft_steps: IntCounter,
    pub drafted_tokens: IntCounter,
    pub draft_accepted_tokens: IntCounter,
    /// The neuron cache under `--memory`: units found in the cache, units read, bytes read.
    cache_hits: IntCounter,
    cache_misses: IntCounter,
    cache_bytes_read: IntCounter,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some("conductor".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "HTTP requests by endpoint and status"),
            &["endpoint", "status"],
        )?;
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        let histogram = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(SECONDS.to_vec()))
        };
        let m = Metrics {
            requests,
            prompt_tokens: counter("prompt_tokens_total", "Prompt tokens of served requests")?,
            prompt_tokens_cached: counter(
                "prompt_tokens_cached_total",
                "Prompt tokens not recomputed: their prefix was in the cached session",
            )?,
            completion_tokens: counter("completion_tokens_total", "Tokens generated")?,
            cancelled: counter(
                "requests_cancelled_total",
                "Generations stopped because the client disconnected or the server shut down",
            )?,
            rejected: counter(
                "requests_rejected_total",
                "Requests refused with 429 because the queue was full",
            )?,
            time_to_first_token: histogram(
                "time_to_first_token_seconds",
                "From a request's arrival to its first generated token",
            )?,
            queue_time: histogram(
                "queue_time_seconds",
                "From a request's arrival to the engine taking it",
            )?,
            queued: IntGauge::new("requests_queued", "Requests waiting for the engine")?,
            running: IntGauge::new("requests_running", "Requests the engine is generating")?,
            decode_steps: counter(
                "decode_steps_total",
                "Decode steps (one multi-sequence step counts once)",
            )?,
            decode_sequences: counter(
                "decode_sequences_total",
                "Sequences computed by decode steps (over decode_steps_total: the mean batch)",
            )?,
            draft_steps: counter(
                "draft_steps_total",
                "Decode steps that verified drafted tokens (--draft)",
            )?,
            drafted_tokens: counter(
                "draft_tokens_total",
                "Tokens drafted for verification (--draft)",
            )?,
            draft_accepted_tokens: counter(
                "draft_accepted_tokens_total",
                "Drafted tokens the target's own draws kept (over draft_tokens_total: the acceptance rate)",
            )?,
            cache_hits: counter(
                "neuron_cache_hits_total",
                "Neuron-cache units found in memory (under --memory)",
            )?,
            cache_misses: counter(
                "neuron_cache_misses_total",
                "Neuron-cache units read from storage (under --memory)",
            )?,
            cache_bytes_read: counter(
                "neuron_cache_read_bytes_total",
                "Bytes the neuron cache read from storage (under --memory)",
            )?,
            registry,
        };
        m.registry.register(Box::new(m.requests.clone()))?;
        for c in [
            &m.prompt_tokens,
            &m.prompt_tokens_cached,
            &m.completion_tokens,
            &m.cancelled,
            &m.rejected,
            &m.decode_steps,
            &m.decode_sequences,
            &m.draft_steps,
            &m.drafted_tokens,
            &m.draft_accepted_tokens,
            &m.cache_hits,
            &m.cache_misses,
            &m.cache_bytes_read,
        ] {
            m.registry.register(Box::new(c.clone()))?;
        }
        for h in [&m.time_to_first_token, &m.queue_time] {
            m.registry.register(Box::new(h.clone()))?;
        }
        for g in [&m.queued, &m.running] {
            m.registry.register(Box::new(g.clone()))?;
        }
        Ok(m)
    }

    /// Brings the neuron-cache counters up to the engine's (which count from its start).
    pub fn record_cache(&self, report: &conductor_runtime::cache::CacheReport) {
        for (counter, now) in [
            (&self.cache_hits, report.hits()),
            (&self.cache_misses, report.misses()),
            (&self.cache_bytes_read, report.bytes_read),
        ] {
            counter.inc_by(now.saturating_sub(counter.get()));
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a metric family that fails to encode is left
        // out rather than failing the scrape.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric() {
        let m = Metrics::new().unwrap();
        m.requests.with_label_values(&["/health", "200"]).inc();
        m.time_to_first_token.observe(0.02);
        let text = m.render();
        for name in [
            "conductor_requests_total{endpoint=\"/health\",status=\"200\"} 1",
            "conductor_time_to_first_token_seconds_bucket",
            "conductor_queue_time_seconds_count 0",
            "conductor_completion_tokens_total 0",
            "conductor_requests_queued 0",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
