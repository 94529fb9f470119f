//! The cluster layout of a step: which phases each layer runs and how each phase is cut.

use super::XpuId;
use crate::neuron::{cut_into_clusters, Phase};
use crate::plan::{ClusterSizes, ModelShape};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Whether a step runs as a single-token decode (FFN as neuron clusters with partial sums, the
/// shape sparsity and out-of-memory loading build on) or as a dense prefill (whole matrices cut
/// into row blocks, the shape an NPU wants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StepShape {
    Decode,
    Prefill,
}

/// One phase, its clusters (ranges of units) and which processor group computes which of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseClusters {
    pub phase: Phase,
    pub clusters: Vec<Range<u32>>,
    /// Contiguous shares of `clusters` (indices), one per group, in cluster order: one
    /// `Compute` message each.
    pub parts: Vec<(XpuId, Range<u32>)>,
}

impl PhaseClusters {
    fn new(phase: Phase, clusters: Vec<Range<u32>>, shares: &[(XpuId, u32)]) -> PhaseClusters {
        let parts = split_by_weight(clusters.len() as u32, shares);
        PhaseClusters {
            phase,
            clusters,
            parts,
        }
    }
}

/// Splits `n` clusters into contiguous ranges proportional to the groups' weights (boundaries
/// rounded to the nearest cluster); groups whose share rounds to nothing get no range.
pub fn split_by_weight(n: u32, shares: &[(XpuId, u32)]) -> Vec<(XpuId, Range<u32>)> {
    let total: u64 = shares.iter().map(|&(_, w)| u64::from(w)).sum();
    let mut parts = Vec::with_capacity(shares.len());
    let mut cumulative = 0u64;
    let mut start = 0u32;
    for &(xpu, weight) in shares {
        cumulative += u64::from(weight);
        let total = total.max(1);
        let end = ((u64::from(n) * cumulative + total / 2) / total) as u32;
        if end > start {
            parts.push((xpu, start..end));
        }
        start = end;
    }
    parts
}

/// A layer's FFN neurons cut into clusters of `size` (rounded up to whole `granule`s). In a
/// mixture of experts each expert's neurons are cut on their own, so a cluster never mixes
/// experts: an expert the router did not choose is then whole clusters to skip (and, under a
/// memory budget, bundles never read).
pub fn ffn_clusters(model: &ModelShape, size: u32, granule: u32) -> Vec<Range<u32>> {
    if !model.is_moe() {
        return cut_into_clusters(model.n_ff, size, granule);
    }
    let f = model.ffn_per_expert();
    let per_expert = cut_into_clusters(f, size, granule);
    (0..model.n_expert)
        .flat_map(|e| {
            per_expert
                .iter()
                .map(move |r| e * f + r.start..e * f + r.end)
        })
        .collect()
}

/// Every layer runs `layer_phases` in order; the output projection follows the last layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    pub shape: StepShape,
    pub n_layer: u32,
    pub layer_phases: Vec<PhaseClusters>,
    pub output: PhaseClusters,
    /// A neuron store's FFN I/O units (its bundles) as neuron ranges, ascending; empty without
    /// a store. The FFN's compute clusters are runs of whole units, sized by the plan
    /// independently of them (PowerInfer-2's compute clusters over neuron-sized I/O): one
    /// partial sum and one message per cluster however small the units are.
    pub ffn_units: Vec<Range<u32>>,
    /// Prefill's dense FFN (`FfnDownRows`): the neuron ranges whose partial down projections
    /// are summed in order, decode's FFN clusters, so that a position's down projection has
    /// the bits of its decode step (one reduction order for both shapes). Empty in decode.
    pub ffn_sums: Vec<Range<u32>>,
}

impl Program {
    /// The layout of steps of `shape`, every phase shared among `shares` (group, weight).
    pub fn new(
        model: &ModelShape,
        sizes: &ClusterSizes,
        shape: StepShape,
        shares: &[(XpuId, u32)],
    ) -> Program {
        let heads_qkv = model.n_head + 2 * model.n_head_kv;
        let phase = |phase, clusters| PhaseClusters::new(phase, clusters, shares);
        let mut layer_phases = vec![
            phase(
                Phase::QkvHeads,
                cut_into_clusters(heads_qkv, sizes.qkv_heads, 1),
            ),
            phase(
                Phase::AttnHeads,
                cut_into_clusters(model.n_head, sizes.attn_heads, 1),
            ),
            phase(
                Phase::AttnOutRows,
                cut_into_clusters(model.n_embd, sizes.attn_out_rows, 1),
            ),
        ];
        let store = model.ffn_bundle > 0;
        match shape {
            // A neuron store's FFN exists only as bundles, in both step shapes: its clusters
            // are runs of whole bundles, the plan's cluster size rounded up to whole bundles.
            _ if store => layer_phases.push(phase(
                Phase::FfnNeurons,
                ffn_clusters(model, sizes.ffn_neurons, model.ffn_bundle),
            )),
            StepShape::Decode => layer_phases.push(phase(
                Phase::FfnNeurons,
                ffn_clusters(model, sizes.ffn_neurons, model.ffn_granule),
            )),
            StepShape::Prefill => {
                layer_phases.push(phase(
                    Phase::FfnGateUpRows,
                    ffn_clusters(model, sizes.ffn_rows, 1),
                ));
                layer_phases.push(phase(
                    Phase::FfnDownRows,
                    cut_into_clusters(model.n_embd, sizes.ffn_rows, 1),
                ));
            }
        }
        Program {
            shape,
            n_layer: model.n_layer,
            layer_phases,
            output: phase(
                Phase::OutputRows,
                cut_into_clusters(model.n_vocab, sizes.output_rows, 1),
            ),
            ffn_units: match store {
                true => ffn_clusters(model, model.ffn_bundle, 1),
                false => Vec::new(),
            },
            ffn_sums: match shape {
                StepShape::Prefill if !store => {
                    ffn_clusters(model, sizes.ffn_neurons, model.ffn_granule)
                }
                _ => Vec::new(),
            },
        }
    }

    /// Recuts the attention phases for attention that streams through the cache, one unit
    /// per matrix: `QkvHeads` into one cluster per matrix (query heads, key heads, value
    /// heads) and `AttnOutRows` into one cluster, so each cluster reads exactly one unit.
    pub fn stream_attention(&mut self, model: &ModelShape, shares: &[(XpuId, u32)]) {
        let (q, kv) = (model.n_head, model.n_head_kv);
        for p in &mut self.layer_phases {
            let clusters = match p.phase {
                Phase::QkvHeads => vec![0..q, q..q + kv, q + kv..q + 2 * kv],
                Phase::AttnOutRows => std::iter::once(0..model.n_embd).collect(),
                _ => continue,
            };
            *p = PhaseClusters::new(p.phase, clusters, shares);
        }
    }

    /// Cuts the output projection to the rows of tokens `0..n_vocab` (clusters of the same
    /// size as before): the plan's [`crate::plan::ExecutionPlan::output_vocab`].
    pub fn limit_output(&mut self, n_vocab: u32, shares: &[(XpuId, u32)]) {
        let size = self.output.clusters.first().map_or(1, |r| r.len() as u32);
        let clusters = cut_into_clusters(n_vocab, size, 1);
        self.output = PhaseClusters::new(Phase::OutputRows, clusters, shares);
    }

    /// Inserts `FfnGateRows` before `FfnNeurons`, both with one cluster per bundle (gate-first
    /// loading: each bundle's gate rows are computed before the rest of it is read, and its
    /// pages are decided bundle by bundle).
    pub fn gate_first(&mut self, shares: &[(XpuId, u32)]) {
        let Some(at) = self
            .layer_phases
            .iter()
            .position(|p| p.phase == Phase::FfnNeurons)
        else {
            return;
        };
        let units = self.ffn_units.clone();
        self.layer_phases[at] = PhaseClusters::new(Phase::FfnNeurons, units.clone(), shares);
        self.layer_phases
            .insert(at, PhaseClusters::new(Phase::FfnGateRows, units, shares));
    }

    /// The FFN ranges a step's selection events name, one bit each ([`super::Event::
    /// FfnPredicted`], [`super::Event::FfnPages`]): the store's bundles (what the cache reads),
    /// or the FFN clusters of a model without a store.
    pub fn ffn_selection_units(&self) -> &[Range<u32>] {
        match self.ffn_units.is_empty() {
            true => self.clusters(Phase::FfnNeurons),
            false => &self.ffn_units,
        }
    }

    /// The FFN units (indices into [`Program::ffn_units`]) that FFN cluster `cluster` reads:
    /// its neurons' bundles.
    pub fn units_of_cluster(&self, phase: Phase, cluster: u32) -> Range<u32> {
        let r = &self.clusters(phase)[cluster as usize];
        let size = self.ffn_units.first().map_or(1, |u| u.len() as u32);
        r.start / size..r.end.div_ceil(size)
    }

    /// The FFN cluster of `phase` that reads FFN unit `unit`.
    pub fn cluster_of_unit(&self, phase: Phase, unit: u32) -> u32 {
        let first = self.ffn_units[unit as usize].start;
        self.clusters(phase).partition_point(|r| r.end <= first) as u32
    }

    /// Whether this program computes FFN gates before reading the rest of the bundles.
    pub fn is_gate_first(&self) -> bool {
        self.phase(Phase::FfnGateRows).is_some()
    }

    /// The phase at `index` of a layer; `layer_phases.len()` is the output projection.
    pub fn phase_at(&self, index: usize) -> Phase {
        self.layer_phases
            .get(index)
            .map_or(Phase::OutputRows, |p| p.phase)
    }

    /// The clusters of `phase` (empty if this program has no such phase).
    pub fn clusters(&self, phase: Phase) -> &[Range<u32>] {
        self.phase(phase).map_or(&[], |p| &p.clusters)
    }

    /// The layout of `phase`, if this program has it.
    pub fn phase(&self, phase: Phase) -> Option<&PhaseClusters> {
        if phase == Phase::OutputRows {
            return Some(&self.output);
        }
        self.layer_phases.iter().find(|p| p.phase == phase)
    }

    /// The layout of the phase at `index` of a layer; `layer_phases.len()` is the output.
    pub fn phase_layout_at(&self, index: usize) -> &PhaseClusters {
        self.layer_phases.get(index).unwrap_or(&self.output)
    }
}
