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

pub fn run(profile: &HardwareProfile, plan: &ExecutionPlan, w: &Workload) -> SimReport {
    simulate(profile, plan, w, &SimOptions::default()).expect("simulation runs")
}
