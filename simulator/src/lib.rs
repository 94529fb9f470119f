//! Conductor's discrete-event simulator: the real `Scheduler` driven on virtual nanoseconds,
//! with device models from a hardware profile, for deterministic tests, predictions and plan
//! exploration.
//!
//! [`simulate`] places the plan's groups on the profile's cores, feeds the scheduler the
//! workload's steps, and answers every `Compute` after the time the cost model (`devices/`)
//! gives; no threads, no clocks, no hash-map order, so the same inputs give the same trace,
//! bit for bit. [`replay`] feeds a recorded trace's events to a fresh scheduler and checks the
//! commands. `docs/simulator.md` lists the formulas and what is not modelled.

mod backend;
mod devices;
mod engine;
mod error;
mod faults;
mod replay;
mod report;
mod shapes;
mod workload;

pub use devices::host::SPIN_WINDOW_NS;
pub use devices::storage::{Access, ReadTiming, StorageModel};
pub use error::SimError;
pub use faults::{
    simulate_with_faults, Attempt, FaultRun, SimActorFaults, SimFaults, SimReadFault, MAX_ATTEMPTS,
};
pub use replay::{check_trace_model, replay, Mismatch, ReplayError, ReplayReport};
pub use report::{SimReport, StepTiming, TokenTimes, TrackUse};
pub use shapes::{
    activation_stats, chained, measured_stats, named_shape, neuron_frequencies,
    synthesize_activity, ActivationStats, NAMED_SHAPES,
};
pub use workload::{describe_model_file, DecodeStart, DraftWorkload, PlannedStep, Workload};

use backend::{Machine, SCHEDULER_TRACK};
use conductor_runtime::plan::{hosts_of, ExecutionPlan, FfnPlan, HardwareProfile, Topology};
use conductor_runtime::schedule::{ReadGeometry, ScheduleError, Scheduler};
use conductor_runtime::trace::{Trace, TraceHeader, TRACE_FORMAT_VERSION};
use devices::host::{spin_window_ns, FinishModel, MessageModel};
use engine::Engine;

/// What a simulation records besides the timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimOptions {
    /// Timeline spans: one per `Compute` on its group's track, the scheduler's work on the
    /// `scheduler` track.
    pub record_spans: bool,
    /// The `(t, event, commands)` records a replay checks.
    pub record_records: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            record_spans: true,
            record_records: true,
        }
    }
}

impl SimOptions {
    /// Timings only: for sweeps and the speed benchmark.
    pub fn lean() -> SimOptions {
        SimOptions {
            record_spans: false,
            record_records: false,
        }
    }
}

/// The bundle layout of a store of `model` whose geometry matches its shape (neuron columns, of
/// the model's down type or the converter's default), for gate-first loading's pages.
fn gate_first_layout(
    model: &conductor_runtime::plan::ModelDescription,
) -> Option<conductor_runtime::store::BundleLayout> {
    use conductor_runtime::store::{BundleLayout, DownLayout, DEFAULT_DOWN_TYPE};
    let (s, t) = (&model.shape, &model.types);
    [DEFAULT_DOWN_TYPE, t.ffn_down]
        .into_iter()
        .find_map(|down| {
            BundleLayout::new(
                s.n_embd,
                s.n_ff,
                [t.ffn_gate, t.ffn_up, down],
                DownLayout::NeuronColumns,
                s.ffn_bundle,
            )
            .ok()
            .filter(|l| l.stride == s.ffn_bundle_stride)
        })
}

/// The scheduler and the machine of a simulation of `workload` on `profile` under `plan`.
fn build(
    profile: &HardwareProfile,
    plan: &ExecutionPlan,
    workload: &Workload,
) -> Result<(Scheduler, Machine), SimError> {
    profile.validate()?;
    let shape = &workload.model.shape;
    let ffn = match workload.ffn {
        Some(select) => FfnPlan::with_select(plan, shape, select).map_err(ScheduleError::from)?,
        None => FfnPlan::implied(plan, shape),
    };
    let mut scheduler = Scheduler::with_ffn(shape, plan, ffn)?;
    if let (true, Some(cache)) = (workload.warm_cache, &plan.cache) {
        scheduler.warm_cache(cache);
    }
    workload.validate()?;
    let topology = Topology::of_profile(profile);
    let placed = topology.place(plan, workload.threads)?;
    let group_host = hosts_of(&placed);
    let groups = devices::build_groups(profile, plan, &topology, &placed, &workload.model)?;

    // The scheduler runs on the host of the first decode group, on that group's first core.
    let sched_group = plan
        .group_index(&plan.decode_on[0].group)
        .expect("a validated plan names known groups");
    let sched_core = placed[sched_group].cores[0];
    let sched_class = topology
        .class_of(sched_core)
        .and_then(|c| profile.core_class(c))
        .expect("placed cores come from the profile");
    let machine = Machine {
        groups,
        group_names: placed.iter().map(|g| g.name.clone()).collect(),
        sched_host: group_host[sched_group],
        n_hosts: group_host.iter().max().map_or(1, |&h| h + 1),
        group_host,
        finish: FinishModel::new(&workload.model, sched_class.finish_ns_per_element),
        messages: MessageModel::new(&profile.messaging, spin_window_ns(plan)),
        storage: StorageModel::new(&profile.storage, &plan.storage).with_wakeups(
            spin_window_ns(plan),
            profile.messaging.wakeup_ns.round() as u64,
        ),
        bundle_bytes: workload.model.shape.ffn_bundle_stride,
        layer_bundle_bytes: workload.layer_bundle_bytes.clone(),
        gate_layout: ffn
            .reads
            .reads_pages()
            .then(|| gate_first_layout(&workload.model))
            .flatten(),
        in_flight_together: ReadGeometry::of(plan).in_flight_together,
        reads_per_bundle: if workload.bundled { 1 } else { 3 },
        // One aligned read per streamed attention matrix.
        attention_bytes: workload
            .model
            .attention_matrix_bytes()
            .map(|b| b.div_ceil(4096) * 4096),
    };
    Ok((scheduler, machine))
}

/// Simulates `workload` on the machine `profile` describes, following `plan`.
pub fn simulate(
    profile: &HardwareProfile,
    plan: &ExecutionPlan,
    workload: &Workload,
    options: &SimOptions,
) -> Result<SimReport, SimError> {
    let (scheduler, machine) = build(profile, plan, workload)?;
    let ffn = scheduler.ffn();
    let steps = workload.steps(scheduler.max_step_tokens());
    let decoding = steps.iter().filter(|s| s.decode_index.is_some());
    let drafting_steps = decoding.clone().filter(|s| s.request.resident_only).count() as u32;
    let decode_steps = decoding.count() as u32 - drafting_steps;
    let sched_group = plan
        .group_index(&plan.decode_on[0].group)
        .expect("a validated plan names known groups");
    let threads = Topology::of_profile(profile)
        .place(plan, workload.threads)?
        .get(sched_group)
        .map_or(1, |g| g.threads);
    let group_names = machine.group_names.clone();
    let outcome = Engine::new(scheduler, machine, workload, options).run()?;

    let total = outcome.end_ns;
    let mut utilisation: Vec<TrackUse> = group_names
        .iter()
        .zip(&outcome.group_busy_ns)
        .map(|(name, &busy)| TrackUse {
            track: name.clone(),
            busy_ns: busy,
            total_ns: total,
        })
        .collect();
    utilisation.push(TrackUse {
        track: SCHEDULER_TRACK.into(),
        busy_ns: outcome.scheduler_busy_ns,
        total_ns: total,
    });
    utilisation.push(TrackUse {
        track: "storage".into(),
        busy_ns: outcome.storage_busy_ns,
        total_ns: total,
    });
    let trace = Trace {
        header: TraceHeader {
            version: TRACE_FORMAT_VERSION,
            model: workload.model.clone(),
            plan: plan.clone(),
            ffn,
            driver: "simulator".into(),
            threads,
            writer: format!("conductor-simulator {}", env!("CARGO_PKG_VERSION")),
        },
        records: outcome.records,
        activity: if options.record_records {
            workload.activity.clone().unwrap_or_default()
        } else {
            Vec::new()
        },
        spans: outcome.spans,
    };
    let mut report = SimReport {
        profile: profile.name.clone(),
        model: workload.model.name.clone(),
        n_prompt: workload.n_prompt,
        n_gen: workload.n_gen,
        decode_steps,
        drafting_steps,
        threads,
        steps: outcome.timings,
        ttft_ns: 0,
        prefill_ns: 0,
        decode_ns_per_token: 0.0,
        time_between_tokens: TokenTimes::default(),
        utilisation,
        storage_active_ns: outcome.storage_active_ns,
        bytes_read: outcome.bytes_read,
        cache_hits: outcome.cache_hits,
        cache_misses: outcome.cache_misses,
        events: outcome.events,
        end_ns: total,
        trace,
    };
    report.summarise();
    Ok(report)
}
