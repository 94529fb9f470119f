use super::*;
use crate::neuron::Phase;
use crate::plan::{ModelShape, WeightTypes};
use crate::quant::GgmlType;
use crate::schedule::{ClusterWork, StepRequest, StepShape, XpuId};
use proptest::prelude::*;

fn sample() -> Trace {
    let work = ClusterWork {
        step: 0,
        shape: StepShape::Decode,
        layer: 0,
        phase: Phase::QkvHeads,
        clusters: 0..3,
    };
    Trace {
        header: TraceHeader {
            version: TRACE_FORMAT_VERSION,
            model: ModelDescription {
                name: "tiny".into(),
                shape: ModelShape {
                    n_layer: 1,
                    n_embd: 64,
                    n_ff: 128,
                    n_head: 2,
                    n_head_kv: 1,
                    head_dim: 32,
                    n_vocab: 10,
                    ffn_granule: 32,
                    ffn_bundle: 0,
                    ffn_bundle_stride: 0,
                    ffn_bundle_gate_bytes: 0,
                    n_expert: 0,
                    n_expert_used: 0,
                },
                types: WeightTypes {
                    attn_q: GgmlType::Q4_1,
                    attn_k: GgmlType::Q4_1,
                    attn_v: GgmlType::Q4_1,
                    attn_out: GgmlType::Q4_1,
                    ffn_gate: GgmlType::Q4_1,
                    ffn_up: GgmlType::Q4_1,
                    ffn_down: GgmlType::Q4_1,
                    output: GgmlType::Q8_0,
                },
            },
            plan: ExecutionPlan::default(),
            ffn: crate::plan::FfnPlan::default(),
            driver: "actors".into(),
            threads: 2,
            writer: "test".into(),
        },
        records: vec![
            TraceRecord {
                t_ns: 0,
                event: Event::StepRequested(StepRequest {
                    step: 0,
                    n_tokens: 1,
                    n_past: 0,
                    logits_from: 0,
                    sequences: 1,
                    resident_only: false,
                }),
                commands: vec![Command::Compute {
                    xpu: XpuId(0),
                    work: work.clone(),
                }],
            },
            TraceRecord {
                t_ns: 1500,
                event: Event::ClusterDone(work),
                commands: vec![],
            },
        ],
        activity: vec![StepActivity {
            step: 0,
            layers: vec![ActiveSet::Neurons(vec![1, 5, 64, 100])],
        }],
        spans: vec![Span {
            track: "cpu".into(),
            name: "L0 qkv".into(),
            start_ns: 10,
            dur_ns: 1490,
        }],
    }
}

fn encoded(t: &Trace) -> Vec<u8> {
    let mut bytes = Vec::new();
    t.write_to(&mut bytes).unwrap();
    bytes
}

#[test]
fn a_trace_round_trips_and_its_hash_follows_its_content() {
    let t = sample();
    let back = Trace::from_bytes(&encoded(&t), "t").unwrap();
    assert_eq!(back, t);
    assert_eq!(back.hash(), t.hash());
    let mut later = t.clone();
    later.records[1].t_ns += 1;
    assert_ne!(later.hash(), t.hash());
}

#[test]
fn foreign_or_damaged_bytes_are_refused() {
    assert!(matches!(
        Trace::from_bytes(b"GGUF\x03\0\0\0\0\0\0\0", "x"),
        Err(TraceError::NotATrace(_))
    ));
    let mut bytes = encoded(&sample());
    bytes[8] = 9;
    assert!(matches!(
        Trace::from_bytes(&bytes, "x"),
        Err(TraceError::Version { found: 9, .. })
    ));
    let bytes = encoded(&sample());
    assert!(matches!(
        Trace::from_bytes(&bytes[..bytes.len() - 3], "x"),
        Err(TraceError::Corrupt { .. })
    ));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        Trace::from_bytes(&longer, "x"),
        Err(TraceError::Corrupt { .. })
    ));
}

/// A header that would have a replay or a simulation cut billions of clusters (a shape of
/// 2^32 - 1 neurons in clusters of one) or run an invalid plan is refused at load.
#[test]
fn headers_beyond_the_limits_are_refused() {
    let mut t = sample();
    t.header.model.shape.n_ff = u32::MAX;
    t.header.plan.decode.ffn_neurons = 1;
    let e = Trace::from_bytes(&encoded(&t), "big")
        .unwrap_err()
        .to_string();
    assert!(e.contains("n_ff") && e.contains("big"), "{e}");
    let mut t = sample();
    t.header.plan.groups[0].threads = u32::MAX;
    let e = Trace::from_bytes(&encoded(&t), "threads")
        .unwrap_err()
        .to_string();
    assert!(e.contains("threads"), "{e}");
    assert!(Trace::from_bytes(&encoded(&sample()), "ok").is_ok());
}

#[test]
fn active_sets_count_neurons_in_ranges() {
    let s = ActiveSet::Neurons(vec![1, 5, 64, 100]);
    assert_eq!(s.count(128), 4);
    assert_eq!(s.count_in(0..64), 2);
    assert_eq!(s.count_in(64..128), 2);
    assert_eq!(s.count_in(6..64), 0);
    assert_eq!(ActiveSet::All.count_in(32..64), 32);
}

#[test]
fn chrome_trace_is_json_with_one_thread_per_track() {
    let mut t = sample();
    t.spans.push(Span {
        track: "npu".into(),
        name: "L0 ffn".into(),
        start_ns: 2000,
        dur_ns: 500,
    });
    let mut out = Vec::new();
    write_chrome_trace(&t.spans, "conductor", &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), 2);
    assert_eq!(complete[0]["tid"], 1);
    assert_eq!(complete[1]["tid"], 2);
    assert_eq!(complete[1]["ts"], 2.0);
    assert_eq!(complete[1]["dur"], 0.5);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any single-byte change or truncation gives a trace or an error, never a panic.
    #[test]
    fn mutated_traces_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<bool>()) {
        let mut bytes = encoded(&sample());
        let i = pos.index(bytes.len());
        if cut {
            bytes.truncate(i);
        } else {
            bytes[i] = byte;
        }
        let _ = Trace::from_bytes(&bytes, "mutated");
    }
}
