//! Device models: how long a `Compute` takes on a processor group ([`cpu`], [`npu`]), what
//! the scheduler's host spends finishing phases and passing messages ([`host`]), and how the
//! storage device serves reads ([`storage`]).
//!
//! Work counts come from what `exec/executor.rs` computes for each phase; [`Load`] is that
//! work for a range of units, independent of the processor.

pub(crate) mod cpu;
pub(crate) mod host;
pub(crate) mod npu;
pub mod storage;

use crate::SimError;
use conductor_runtime::neuron::Phase;
use conductor_runtime::plan::{
    ExecutionPlan, FfnPlan, HardwareProfile, ModelDescription, PlacedGroup, Topology, XpuKind,
};
use conductor_runtime::quant::GgmlType;
use conductor_runtime::schedule::StepShape;
use conductor_runtime::trace::{ActiveSet, StepActivity};
use std::ops::Range;

/// The weight matrices a phase multiplies with; indexes per-role tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    Output,
}

pub(crate) const ROLES: usize = 8;

pub(crate) fn role_types(d: &ModelDescription) -> [GgmlType; ROLES] {
    let t = &d.types;
    [
        t.attn_q, t.attn_k, t.attn_v, t.attn_out, t.ffn_gate, t.ffn_up, t.ffn_down, t.output,
    ]
}

/// The facts of the step in flight that costs depend on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCtx<'a> {
    pub shape: StepShape,
    pub n_tokens: u32,
    pub n_past: u32,
    /// Tokens that get logits (`n_tokens - logits_from`).
    pub n_out: u32,
    pub activity: Option<&'a StepActivity>,
}

impl StepCtx<'_> {
    /// Tokens a phase multiplies: the output projection runs only for tokens with logits.
    pub fn tokens_of(&self, phase: Phase) -> u32 {
        if phase == Phase::OutputRows {
            self.n_out
        } else {
            self.n_tokens
        }
    }

    /// Σ over the step's tokens of the positions each attends to: Σ_t (n_past + t + 1).
    pub fn attended_positions(&self) -> f64 {
        let (n, p) = (f64::from(self.n_tokens), f64::from(self.n_past));
        n * p + n * (n + 1.0) / 2.0
    }
}

/// The work of a range of units of one phase for one token, whatever computes it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Load {
    /// Multiply-accumulates per token, by the role of the weights.
    pub macs: [f64; ROLES],
    /// Query heads of attention (their cost depends on positions, see [`StepCtx`]).
    pub heads: f64,
    /// Weight bytes read (once per phase, whatever the token count).
    pub bytes: f64,
    /// Elements of the gated activation (SiLU(gate)·up) per token.
    pub activations: f64,
    /// Elements rotated by RoPE per token (query and key heads).
    pub rotated: f64,
}

impl Load {
    pub fn add(&mut self, other: &Load) {
        for (a, b) in self.macs.iter_mut().zip(other.macs) {
            *a += b;
        }
        self.heads += other.heads;
        self.bytes += other.bytes;
        self.activations += other.activations;
        self.rotated += other.rotated;
    }

    pub fn total_macs(&self) -> f64 {
        self.macs.iter().sum()
    }
}

/// The model's dimensions and weight sizes, in the form the cost formulas use.
#[derive(Clone, Debug)]
pub(crate) struct ModelCosts {
    pub n_embd: f64,
    pub n_ff: f64,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: f64,
    /// Bytes per weight element of each role (block bytes / block size).
    pub bytes_per_element: [f64; ROLES],
    /// How decode computes and reads the FFN (the scheduler's): with gate-first reads,
    /// `FfnGateRows` computes every gate row, `FfnNeurons` then only the active neurons' up
    /// rows and down columns.
    pub ffn: FfnPlan,
}

impl ModelCosts {
    pub fn new(d: &ModelDescription) -> ModelCosts {
        let s = &d.shape;
        let types = role_types(d);
        ModelCosts {
            n_embd: f64::from(s.n_embd),
            n_ff: f64::from(s.n_ff),
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim: f64::from(s.head_dim),
            bytes_per_element: types.map(|t| t.type_size() as f64 / t.block_size() as f64),
            ffn: FfnPlan::default(),
        }
    }

    pub fn q_dim(&self) -> f64 {
        f64::from(self.n_head) * self.head_dim
    }

    fn weights(&self, load: &mut Load, role: Role, rows: f64, cols: f64) {
        load.macs[role as usize] += rows * cols;
        load.bytes += rows * cols * self.bytes_per_element[role as usize];
    }

    /// The work of `units` of `phase` for one token (see `Executor::compute`). FFN neuron
    /// clusters count only the neurons `active` says are (all without an activity).
    pub fn load(&self, phase: Phase, units: Range<u32>, active: &mut ActiveCursor<'_>) -> Load {
        let mut load = Load::default();
        let count = units.len() as f64;
        let embd = self.n_embd;
        match phase {
            Phase::QkvHeads => {
                // Units are query heads, then key heads, then value heads; each is head_dim rows.
                let overlap =
                    |a: u32, b: u32| f64::from(units.end.min(b).saturating_sub(units.start.max(a)));
                let (nq, nk) = (self.n_head, self.n_head + self.n_head_kv);
                let nv = nk + self.n_head_kv;
                self.weights(&mut load, Role::Q, overlap(0, nq) * self.head_dim, embd);
                self.weights(&mut load, Role::K, overlap(nq, nk) * self.head_dim, embd);
                self.weights(&mut load, Role::V, overlap(nk, nv) * self.head_dim, embd);
                load.rotated = overlap(0, nk) * self.head_dim;
            }
            Phase::AttnHeads => load.heads = count,
            Phase::AttnOutRows => self.weights(&mut load, Role::O, count, self.q_dim()),
            Phase::FfnGateRows => self.weights(&mut load, Role::Gate, count, embd),
            Phase::FfnNeurons => {
                let active = active.count_in(units.clone()).map_or(count, f64::from);
                // Neuron i: gate row i, up row i (n_embd each) and down column i (n_embd).
                if !self.ffn.gate_first() {
                    self.weights(&mut load, Role::Gate, active, embd);
                }
                self.weights(&mut load, Role::Up, active, embd);
                self.weights(&mut load, Role::Down, active, embd);
                load.activations = active;
            }
            Phase::FfnGateUpRows => {
                self.weights(&mut load, Role::Gate, count, embd);
                self.weights(&mut load, Role::Up, count, embd);
                load.activations = count;
            }
            Phase::FfnDownRows => self.weights(&mut load, Role::Down, count, self.n_ff),
            Phase::OutputRows => self.weights(&mut load, Role::Output, count, embd),
        }
        load
    }
}

/// Counts the active neurons of consecutive clusters of one layer. Neurons are strictly
/// ascending (checked by `Workload::validate`), so a cluster of `m` units holds at most `m`
/// of them: each count searches only the next `m` entries, near the previous cluster's, not
/// the whole layer (which showed in profiles of sparse runs).
pub(crate) struct ActiveCursor<'a> {
    neurons: Option<&'a [u32]>,
    /// Index of the first neuron at or after `next_unit`.
    pos: usize,
    next_unit: u32,
}

impl<'a> ActiveCursor<'a> {
    /// Every unit active (dense, or a phase other than FFN neurons).
    pub fn dense() -> ActiveCursor<'static> {
        ActiveCursor {
            neurons: None,
            pos: 0,
            next_unit: 0,
        }
    }

    /// The active set of `layer` in `activity`, when `phase` is FFN neurons.
    pub fn new(activity: Option<&'a StepActivity>, phase: Phase, layer: u32) -> ActiveCursor<'a> {
        let set = activity
            .filter(|_| phase == Phase::FfnNeurons)
            .and_then(|a| a.layers.get(layer as usize));
        match set {
            Some(ActiveSet::Neurons(v)) => ActiveCursor {
                neurons: Some(v),
                pos: 0,
                next_unit: 0,
            },
            _ => ActiveCursor::dense(),
        }
    }

    /// Active neurons in `units`, or `None` when all are.
    pub fn count_in(&mut self, units: Range<u32>) -> Option<u32> {
        let v = self.neurons?;
        if units.start != self.next_unit {
            self.pos = v.partition_point(|&n| n < units.start);
        }
        let window = &v[self.pos..v.len().min(self.pos + units.len())];
        let count = window.partition_point(|&n| n < units.end);
        self.pos += count;
        self.next_unit = units.end;
        Some(count as u32)
    }
}

/// How one processor group is modelled.
pub(crate) enum GroupModel {
    Cpu(cpu::CpuGroup),
    Npu(npu::NpuGroup),
    /// A group no share of the plan uses: never sent work.
    Unused,
}

impl GroupModel {
    /// Nanoseconds the group takes for `clusters` (the ranges of one `Compute`).
    pub fn phase_ns(
        &mut self,
        costs: &ModelCosts,
        phase: Phase,
        layer: u32,
        clusters: &[Range<u32>],
        ctx: &StepCtx<'_>,
    ) -> f64 {
        match self {
            GroupModel::Cpu(g) => g.phase_ns(costs, phase, layer, clusters, ctx),
            GroupModel::Npu(g) => g.phase_ns(costs, phase, layer, clusters, ctx),
            GroupModel::Unused => 0.0,
        }
    }
}

/// Builds the model of every plan group (`XpuId(i)` = `groups[i]`).
pub(crate) fn build_groups(
    profile: &HardwareProfile,
    plan: &ExecutionPlan,
    topology: &Topology,
    placed: &[PlacedGroup],
    model: &ModelDescription,
) -> Result<Vec<GroupModel>, SimError> {
    let used = |name: &str| {
        plan.decode_on
            .iter()
            .chain(&plan.prefill_on)
            .any(|s| s.group == name)
    };
    placed
        .iter()
        .map(|g| {
            if !used(&g.name) {
                return Ok(GroupModel::Unused);
            }
            match (&g.kind, &profile.npu) {
                (XpuKind::Npu, Some(npu)) => Ok(GroupModel::Npu(npu::NpuGroup::new(
                    npu,
                    plan.dense.token_chunk,
                    profile.memory.bandwidth_gbs,
                ))),
                // Without an NPU in the profile, the dense backend runs on the group's cores,
                // as it does on machines without one.
                _ => cpu::CpuGroup::new(profile, topology, g, model, plan.cache.is_some())
                    .map(GroupModel::Cpu),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named_shape;
    use conductor_runtime::trace::ActiveSet;

    #[test]
    fn loads_count_the_executors_work() {
        let d = named_shape("smollm2-135m").unwrap();
        let c = ModelCosts::new(&d);
        // Heads 8..13: query head 8, key heads 9..12, value head 12.
        let dense = || ActiveCursor::dense();
        let l = c.load(Phase::QkvHeads, 8..13, &mut dense());
        assert_eq!(l.macs[Role::Q as usize], 64.0 * 576.0);
        assert_eq!(l.macs[Role::K as usize], 3.0 * 64.0 * 576.0);
        assert_eq!(l.macs[Role::V as usize], 64.0 * 576.0);
        // Q4_1: 20 bytes per 32 weights.
        assert_eq!(l.bytes, 5.0 * 64.0 * 576.0 * 20.0 / 32.0);
        let l = c.load(Phase::FfnNeurons, 0..128, &mut dense());
        assert_eq!(l.total_macs(), 3.0 * 128.0 * 576.0);
        let mut layers = vec![ActiveSet::All; 30];
        layers[2] = ActiveSet::Neurons(vec![0, 5, 127, 128, 600]);
        let a = StepActivity { step: 0, layers };
        let mut cursor = ActiveCursor::new(Some(&a), Phase::FfnNeurons, 2);
        let l = c.load(Phase::FfnNeurons, 0..128, &mut cursor);
        assert_eq!(l.total_macs(), 3.0 * 3.0 * 576.0);
        let l = c.load(Phase::FfnNeurons, 128..256, &mut cursor);
        assert_eq!(l.total_macs(), 3.0 * 1.0 * 576.0);
        let mut other_layer = ActiveCursor::new(Some(&a), Phase::FfnNeurons, 1);
        let l = c.load(Phase::FfnNeurons, 0..128, &mut other_layer);
        assert_eq!(l.total_macs(), 3.0 * 128.0 * 576.0);
        let l = c.load(Phase::OutputRows, 0..2048, &mut dense());
        assert_eq!(l.macs[Role::Output as usize], 2048.0 * 576.0);
        let l = c.load(Phase::FfnDownRows, 0..64, &mut dense());
        assert_eq!(l.macs[Role::Down as usize], 64.0 * 1536.0);
        assert_eq!(c.load(Phase::AttnHeads, 0..3, &mut dense()).heads, 3.0);
    }

    #[test]
    fn the_cursor_counts_like_count_in() {
        let set = ActiveSet::Neurons(vec![0, 3, 31, 32, 33, 70, 95, 96, 200, 255]);
        let a = StepActivity {
            step: 0,
            layers: vec![set.clone()],
        };
        let ranges = [0..32, 32..64, 64..96, 96..128, 128..256];
        let mut cursor = ActiveCursor::new(Some(&a), Phase::FfnNeurons, 0);
        for r in ranges.iter().cloned() {
            assert_eq!(cursor.count_in(r.clone()), Some(set.count_in(r)));
        }
        // Out of order, then resuming in order.
        for r in [64..96, 0..32, 32..64, 200..256] {
            assert_eq!(cursor.count_in(r.clone()), Some(set.count_in(r)));
        }
        let mut other_phase = ActiveCursor::new(Some(&a), Phase::OutputRows, 0);
        assert_eq!(other_phase.count_in(0..32), None);
    }

    #[test]
    fn attended_positions_sum_over_tokens() {
        let ctx = StepCtx {
            shape: StepShape::Prefill,
            n_tokens: 3,
            n_past: 10,
            n_out: 1,
            activity: None,
        };
        assert_eq!(ctx.attended_positions(), 11.0 + 12.0 + 13.0);
        assert_eq!(ctx.tokens_of(Phase::OutputRows), 1);
        assert_eq!(ctx.tokens_of(Phase::QkvHeads), 3);
    }
}
