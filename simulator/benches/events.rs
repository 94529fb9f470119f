//! Scheduler events per second through the simulator, on one core.
//!
//! `cargo bench -p conductor-simulator --bench events` simulates llama-2-7b (prefill 512 +
//! decode 128) on the test desktop profile, dense and with a sparse activity, lean (timings
//! only) and recording spans and records. The target is at least 1,000,000 events/s.

use conductor_runtime::plan::{ExecutionPlan, HardwareProfile};
use conductor_runtime::trace::{ActiveSet, StepActivity};
use conductor_simulator::{named_shape, simulate, SimOptions, Workload};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn measure(name: &str, profile: &HardwareProfile, workload: &Workload, options: SimOptions) {
    let plan = ExecutionPlan::default();
    // Warm-up, and the event count of one run.
    let events = simulate(profile, &plan, workload, &options)
        .expect("simulation runs")
        .events;
    let mut runs = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) || runs < 3 {
        let report = simulate(profile, &plan, workload, &options).expect("simulation runs");
        black_box(&report);
        runs += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    let per_s = (events * runs) as f64 / secs;
    println!(
        "{name:<40} {events:>7} events/run  {:>8.3} ms/run  {:>12.0} events/s",
        secs * 1e3 / runs as f64,
        per_s
    );
}

fn main() {
    let profile = HardwareProfile::from_toml(include_str!("../tests/data/pc.toml"))
        .expect("test profile parses");
    let model = named_shape("llama-2-7b").expect("known shape");
    let dense = Workload::new(model.clone(), 512, 128);
    // Every 8th neuron active, one activity per decode step.
    let n_layer = model.shape.n_layer as usize;
    let layer = ActiveSet::Neurons((0..model.shape.n_ff).step_by(8).collect());
    let sparse = Workload {
        activity: Some(
            (0..128)
                .map(|step| StepActivity {
                    step,
                    layers: vec![layer.clone(); n_layer],
                })
                .collect(),
        ),
        ..dense.clone()
    };
    let spans_and_records = SimOptions::default();
    measure(
        "llama-2-7b pp512+tg128, lean",
        &profile,
        &dense,
        SimOptions::lean(),
    );
    measure(
        "llama-2-7b pp512+tg128, spans+records",
        &profile,
        &dense,
        spans_and_records,
    );
    measure(
        "llama-2-7b sparse, lean",
        &profile,
        &sparse,
        SimOptions::lean(),
    );
    measure(
        "llama-2-7b sparse, spans+records",
        &profile,
        &sparse,
        spans_and_records,
    );
}
