//! Fixtures shared by the simulator's integration tests.
#![allow(dead_code)]

use conductor_runtime::plan::{CoreSet, ExecutionPlan, GroupPlan, HardwareProfile, Share, XpuKind};
use conductor_simulator::{named_shape, simulate, SimOptions, SimReport, Workload};

pub fn pc() -> HardwareProfile {
    HardwareProfile::from_toml(include_str!("../data/pc.toml")).expect("pc.toml")
}

pub fn phone() -> HardwareProfile {
    HardwareProfile::from_toml(include_str!("../data/phone.toml")).expect("phone.toml")
}

fn group(name: &str, kind: XpuKind, class: &str) -> GroupPlan {
    GroupPlan {
        name: name.into(),
        kind,
        cores: CoreSet::Class(class.into()),
        threads: 0,
    }
}

/// PowerInfer-2's split: decode on the big and mid cores (two hosts, so messages between
/// them are remote), prefill on the NPU driven from a little core.
pub fn phone_plan() -> ExecutionPlan {
    ExecutionPlan {
        groups: vec![
            group("big", XpuKind::Cpu, "big"),
            group("mid", XpuKind::Cpu, "mid"),
            group("npu", XpuKind::Npu, "little"),
        ],
        decode_on: vec![
            Share {
                group: "big".into(),
                weight: 1,
            },
            Share {
                group: "mid".into(),
                weight: 3,
            },
        ],
        prefill_on: vec![Share {
            group: "npu".into(),
            weight: 1,
        }],
        ..ExecutionPlan::default()
    }
}

pub fn workload(shape: &str, p: u32, n: u32) -> Workload {
    Workload::new(named_shape(shape).expect("known shape"), p, n)
}

/// [`workload`] of a neuron store of `shape`: bundles of 256 neurons (SmolLM2-135M: 6 a
/// layer, 180 units), down as Q8_0 neuron columns.
pub fn store_workload(shape: &str, p: u32, n: u32) -> Workload {
    let mut w = workload(shape, p, n);
    w.model.shape.ffn_bundle = 256;
    let t = &w.model.types;
    w.model.shape.ffn_bundle_stride = conductor_runtime::store::BundleLayout::new(
        w.model.shape.n_embd,
        w.model.shape.n_ff,
        [
            t.ffn_gate,
            t.ffn_up,
            conductor_runtime::quant::GgmlType::Q8_0,
        ],
        conductor_runtime::store::DownLayout::NeuronColumns,
        256,
    )
    .unwrap()
    .stride;
    w
}

/// The default plan with a segmented neuron cache of `slots` units, `hot` of them hot.
pub fn cache_plan(slots: u32, hot: u32) -> ExecutionPlan {
    use conductor_runtime::plan::{CachePlan, CachePolicy, ReadPolicy};
    ExecutionPlan {
        cache: Some(CachePlan {
            slots,
            hot_slots: hot,
            policy: CachePolicy::Segmented,
            max_loads: 4,
            stream_output: false,
            stream_attention: false,
            coalesce: 1,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: 0,
        }),
        ..ExecutionPlan::default()
    }
}

pub fn run(profile: &HardwareProfile, plan: &ExecutionPlan, w: &Workload) -> SimReport {
    simulate(profile, plan, w, &SimOptions::default()).expect("simulation runs")
}
