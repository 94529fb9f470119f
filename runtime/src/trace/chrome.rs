//! Chrome-trace / Perfetto JSON: complete events (`"ph":"X"`), one thread per track.

use super::Span;
use std::collections::BTreeMap;
use std::io::Write;

/// Writes `spans` as a Chrome trace (`chrome://tracing`, ui.perfetto.dev). Tracks become
/// threads of one process, numbered in order of first appearance and named by metadata events.
pub fn write_chrome_trace(
    spans: &[Span],
    process: &str,
    w: &mut impl Write,
) -> std::io::Result<()> {
    let mut tids: BTreeMap<&str, usize> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for s in spans {
        if !tids.contains_key(s.track.as_str()) {
            tids.insert(&s.track, order.len() + 1);
            order.push(&s.track);
        }
    }
    let mut events = Vec::with_capacity(spans.len() + order.len() + 1);
    events.push(serde_json::json!({
        "name": "process_name", "ph": "M", "pid": 1, "tid": 0,
        "args": { "name": process },
    }));
    for (i, track) in order.iter().enumerate() {
        events.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": i + 1,
            "args": { "name": track },
        }));
    }
    for s in spans {
        events.push(serde_json::json!({
            "name": s.name,
            "ph": "X",
            "pid": 1,
            "tid": tids[s.track.as_str()],
            // Microseconds, with nanosecond precision kept in the fraction.
            "ts": s.start_ns as f64 / 1000.0,
            "dur": s.dur_ns as f64 / 1000.0,
        }));
    }
    serde_json::to_writer(
        &mut *w,
        &serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" }),
    )?;
    w.write_all(b"\n")
}
