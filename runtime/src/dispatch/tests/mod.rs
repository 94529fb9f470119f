//! The scheduler's tests (and the dispatch core's), all on one harness: the dispatch core over
//! a backend that computes and reads nothing, completes work in the order a test picks, and reports the active neurons a
//! test names. Checkers see every command in the order the core carries it out and every
//! completion before it is fed.
//!
//! - `phases.rs`: steps, phases and groups without a cache;
//! - `cache.rs`: the neuron cache (loads, slots, evictions, counters);
//! - `selected.rs`: decode steps that wait for each layer's selection;
//! - `pages.rs`: page-granular reads (gate-first loading, predicted pages).

mod cache;
mod pages;
mod phases;
mod selected;

use super::{Backend, Dispatcher, Done, Finish, UnitLoad};
use crate::neuron::Phase;
use crate::plan::{ClusterSizes, ExecutionPlan, ModelShape};
use crate::schedule::*;
use proptest::prelude::*;

fn shape() -> ModelShape {
    ModelShape {
        n_layer: 3,
        n_embd: 64,
        n_ff: 160,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_vocab: 100,
        ffn_granule: 32,
        ffn_bundle: 0,
        ffn_bundle_stride: 0,
        ffn_bundle_gate_bytes: 0,
        n_expert: 0,
        n_expert_used: 0,
    }
}

fn request(step: StepId, n_tokens: u32, logits_from: u32) -> StepRequest {
    StepRequest {
        step,
        n_tokens,
        n_past: 0,
        logits_from,
        sequences: 1,
        resident_only: false,
    }
}

/// Sees what the harness carries out.
trait Checker {
    /// A command, in the order the dispatch core carries them out.
    fn command(&mut self, _cmd: &Command) {}
    /// A completion, before it is fed.
    fn completing(&mut self, _event: &Event) {}
}

/// Checks nothing.
struct NoChecks;
impl Checker for NoChecks {}

/// Which neurons are active after a phase that owes an event: `active(layer, cluster, j)` for
/// neuron `j` of a cluster. In the tests' page map neuron `j` of a bundle lies on page `j`
/// alone, so for page events it names the pages each cluster reads.
type Active<'a> = &'a dyn Fn(u32, u32, u32) -> bool;

/// Every neuron active.
fn all_active(_: u32, _: u32, _: u32) -> bool {
    true
}

/// Neuron `j` of a bundle on page `j` alone (the first `pages` neurons).
struct OnePagePerNeuron {
    pages: u32,
}

impl PageMap for OnePagePerNeuron {
    fn bundle_pages(&self) -> u32 {
        self.pages
    }

    fn mark_active_pages(&self, b: u32, active: &[u32], _: bool, bits: &mut [u64], first: usize) {
        self.mark_neuron_pages(b, active, bits, first);
    }

    fn mark_neuron_pages(&self, _: u32, neurons: &[u32], bits: &mut [u64], first: usize) {
        for &j in neurons.iter().filter(|&&j| j < self.pages) {
            let i = first + j as usize;
            bits[i / 64] |= 1 << (i % 64);
        }
    }
}

/// The backend: what the core asks is noted as pending completions.
struct TestBackend<'a> {
    pending: &'a mut Vec<Event>,
    active: Active<'a>,
    pages: &'a OnePagePerNeuron,
    /// Neurons per FFN cluster and clusters per layer.
    ffn_bundle: u32,
    ffn_clusters: u32,
}

impl Backend for TestBackend<'_> {
    type Error = ScheduleError;

    fn now_ns(&self) -> u64 {
        0
    }

    fn compute(&mut self, _: XpuId, work: &ClusterWork) -> Result<Done, ScheduleError> {
        self.pending.push(Event::ClusterDone(work.clone()));
        Ok(Done::Later)
    }

    fn finish_phase(
        &mut self,
        f: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), ScheduleError> {
        if awaited.is_some() {
            let n = self.pages.pages.max(1).min(self.ffn_bundle);
            let (b, active) = (self.ffn_bundle, self.active);
            activity.push_token((0..self.ffn_clusters).flat_map(|c| {
                (0..n)
                    .filter(move |&j| active(f.layer, c, j))
                    .map(move |j| c * b + j)
            }));
        }
        Ok(())
    }

    fn page_map(&self) -> Option<&dyn PageMap> {
        Some(self.pages)
    }

    fn read(&mut self, step: StepId, run: &[UnitLoad]) -> Result<Done, ScheduleError> {
        for u in run {
            self.pending.push(Event::Loaded {
                step,
                layer: u.layer,
                cluster: u.cluster,
            });
        }
        Ok(Done::Later)
    }

    fn step_done(&mut self, _: StepId) -> Result<(), ScheduleError> {
        Ok(())
    }
}

/// The dispatch core over a [`TestBackend`], with every command and event it saw.
struct Harness {
    d: Dispatcher,
    pending: Vec<Event>,
    pages: OnePagePerNeuron,
    ffn_bundle: u32,
    ffn_clusters: u32,
    n_layer: u32,
    /// Every command carried out and every event fed (owed ones too), in order.
    commands: Vec<Command>,
    events: Vec<Event>,
}

impl Harness {
    fn new(s: Scheduler, shape: &ModelShape) -> Harness {
        let ffn_bundle = if shape.ffn_bundle > 0 {
            shape.ffn_bundle
        } else {
            shape.n_ff
        };
        let mut d = Dispatcher::new(s);
        d.start_recording(shape.n_layer);
        Harness {
            d,
            pending: Vec::new(),
            pages: OnePagePerNeuron {
                pages: (shape.ffn_bundle_stride / crate::store::STORE_ALIGN) as u32,
            },
            ffn_bundle,
            ffn_clusters: shape.n_ff.div_ceil(ffn_bundle),
            n_layer: shape.n_layer,
            commands: Vec::new(),
            events: Vec::new(),
        }
    }

    fn s(&self) -> &Scheduler {
        self.d.scheduler()
    }

    /// Feeds `event` (and what it owes); the checker sees the commands carried out.
    fn feed(
        &mut self,
        event: Event,
        active: Active<'_>,
        checker: &mut dyn Checker,
    ) -> Result<(), ScheduleError> {
        let mut backend = TestBackend {
            pending: &mut self.pending,
            active,
            pages: &self.pages,
            ffn_bundle: self.ffn_bundle,
            ffn_clusters: self.ffn_clusters,
        };
        let result = self.d.feed(&mut backend, event);
        let recording = self.d.take_recording();
        self.d.start_recording(self.n_layer);
        for record in recording.records {
            for cmd in &record.commands {
                checker.command(cmd);
            }
            self.events.push(record.event);
            self.commands.extend(record.commands);
        }
        result
    }

    /// Runs one step to its end, completing what is in flight in the order `pick` chooses
    /// (each pick selects one of the pending completions).
    fn run_step(
        &mut self,
        req: StepRequest,
        active: Active<'_>,
        pick: &mut dyn Iterator<Item = usize>,
        checker: &mut dyn Checker,
    ) {
        self.feed(Event::StepRequested(req.clone()), active, checker)
            .unwrap();
        while self.s().is_busy() {
            assert!(
                !self.pending.is_empty(),
                "deadlock: step {} waits with nothing in flight",
                req.step
            );
            let i = pick.next().unwrap_or(0) % self.pending.len();
            let event = self.pending.swap_remove(i);
            checker.completing(&event);
            self.feed(event, active, checker).unwrap();
        }
        assert!(self.pending.is_empty(), "completions left after the step");
    }

    /// The commands and events so far, taken.
    fn take(&mut self) -> (Vec<Command>, Vec<Event>) {
        (
            std::mem::take(&mut self.commands),
            std::mem::take(&mut self.events),
        )
    }
}

/// Feeds `events` to a fresh scheduler and returns its commands: a replay.
fn replayed(mut fresh: Scheduler, events: Vec<Event>) -> Vec<Command> {
    let mut out = Vec::new();
    for e in events {
        fresh.on_event(e, &mut out).unwrap();
    }
    out
}

/// Runs one step completing in the core's order; every command.
fn run_step(s: Scheduler, shape: &ModelShape, req: StepRequest) -> (Vec<Command>, Scheduler) {
    let mut h = Harness::new(s, shape);
    h.run_step(req, &all_active, &mut std::iter::empty(), &mut NoChecks);
    let (cmds, _) = h.take();
    (cmds, h.d.into_scheduler())
}

fn sizes() -> impl Strategy<Value = ClusterSizes> {
    (1u32..6, 1u32..5, 1u32..80, 1u32..200, 1u32..200, 1u32..120).prop_map(
        |(qkv_heads, attn_heads, attn_out_rows, ffn_neurons, ffn_rows, output_rows)| ClusterSizes {
            qkv_heads,
            attn_heads,
            attn_out_rows,
            ffn_neurons,
            ffn_rows,
            output_rows,
        },
    )
}

/// A plan with `n_groups` CPU groups; decode and prefill each on a non-empty subset of them
/// (bit masks), with the given weights.
fn multi_group_plan(
    n_groups: usize,
    decode_mask: u32,
    prefill_mask: u32,
    weights: &[u32],
) -> ExecutionPlan {
    use crate::plan::{CoreSet, GroupPlan, Share, XpuKind};
    let mut plan = ExecutionPlan {
        groups: (0..n_groups)
            .map(|g| GroupPlan {
                name: format!("g{g}"),
                kind: if g % 2 == 0 {
                    XpuKind::Cpu
                } else {
                    XpuKind::Npu
                },
                cores: CoreSet::Class("all".into()),
                threads: 0,
            })
            .collect(),
        ..ExecutionPlan::default()
    };
    let shares = |mask: u32| -> Vec<Share> {
        let mask = if mask.is_multiple_of(1 << n_groups) {
            1
        } else {
            mask % (1 << n_groups)
        };
        (0..n_groups)
            .filter(|g| mask & (1 << g) != 0)
            .map(|g| Share {
                group: format!("g{g}"),
                weight: weights[g],
            })
            .collect()
    };
    plan.decode_on = shares(decode_mask);
    plan.prefill_on = shares(prefill_mask);
    plan
}

/// Checks the invariants of one step's command stream (loads aside): every cluster of every
/// phase of every layer is computed exactly once, except FFN clusters whose every unit is
/// `skipped(layer, unit)` (a store's bundles; a model without one: its clusters), which never
/// are; phases run in program order, a phase is finished only after all its clusters, and the
/// step ends exactly once.
fn check_stream_skipping(
    s: &Scheduler,
    req: &StepRequest,
    cmds: &[Command],
    skipped: &dyn Fn(u32, u32) -> bool,
) {
    let cmds: Vec<&Command> = cmds
        .iter()
        .filter(|c| !matches!(c, Command::Load { .. }))
        .collect();
    let shape = s.shape_of(req);
    let program = s.program(shape);
    let mut expected = Vec::new();
    for layer in 0..program.n_layer {
        for p in &program.layer_phases {
            expected.push((layer, p.phase, p.clusters.len() as u32));
        }
    }
    if req.wants_logits() {
        expected.push((
            program.n_layer,
            Phase::OutputRows,
            program.output.clusters.len() as u32,
        ));
    }
    let mut i = 0;
    for (layer, phase, n_clusters) in expected {
        let mut seen = vec![false; n_clusters as usize];
        while let Some(Command::Compute { work, .. }) = cmds.get(i) {
            assert_eq!((work.layer, work.phase, work.shape), (layer, phase, shape));
            for c in work.clusters.clone() {
                assert!(!seen[c as usize], "cluster {c} of {phase:?} computed twice");
                seen[c as usize] = true;
            }
            i += 1;
        }
        for (c, &computed) in seen.iter().enumerate() {
            let c = c as u32;
            let skip = phase == Phase::FfnNeurons
                && match program.ffn_units.is_empty() {
                    true => skipped(layer, c),
                    false => program
                        .units_of_cluster(phase, c)
                        .all(|u| skipped(layer, u)),
                };
            assert_eq!(
                computed, !skip,
                "cluster {c} of {phase:?} of layer {layer}: computed {computed}, skipped {skip}"
            );
        }
        match cmds.get(i) {
            Some(Command::FinishPhase {
                step,
                shape: s,
                layer: l,
                phase: p,
                ..
            }) => assert_eq!((*step, *s, *l, *p), (req.step, shape, layer, phase)),
            other => panic!("expected the finish of {phase:?} of layer {layer}, got {other:?}"),
        }
        i += 1;
    }
    assert_eq!(cmds.get(i), Some(&&Command::StepDone { step: req.step }));
    assert_eq!(cmds.len(), i + 1);
}

fn check_stream(s: &Scheduler, req: &StepRequest, cmds: &[Command]) {
    check_stream_skipping(s, req, cmds, &|_, _| false);
}
