//! The cluster layout of a step: which phases each layer runs and how each phase is cut.

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

/// One phase and its clusters (ranges of units).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseClusters {
    pub phase: Phase,
    pub clusters: Vec<Range<u32>>,
}

/// Every layer runs `layer_phases` in order; the output projection follows the last layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    pub shape: StepShape,
    pub n_layer: u32,
    pub layer_phases: Vec<PhaseClusters>,
    pub output: PhaseClusters,
}

impl Program {
    pub fn new(model: &ModelShape, sizes: &ClusterSizes, shape: StepShape) -> Program {
        let heads_qkv = model.n_head + 2 * model.n_head_kv;
        let mut layer_phases = vec![
            PhaseClusters {
                phase: Phase::QkvHeads,
                clusters: cut_into_clusters(heads_qkv, sizes.qkv_heads, 1),
            },
            PhaseClusters {
                phase: Phase::AttnHeads,
                clusters: cut_into_clusters(model.n_head, sizes.attn_heads, 1),
            },
            PhaseClusters {
                phase: Phase::AttnOutRows,
                clusters: cut_into_clusters(model.n_embd, sizes.attn_out_rows, 1),
            },
        ];
        match shape {
            StepShape::Decode => layer_phases.push(PhaseClusters {
                phase: Phase::FfnNeurons,
                clusters: cut_into_clusters(model.n_ff, sizes.ffn_neurons, model.ffn_granule),
            }),
            StepShape::Prefill => {
                layer_phases.push(PhaseClusters {
                    phase: Phase::FfnGateUpRows,
                    clusters: cut_into_clusters(model.n_ff, sizes.ffn_rows, 1),
                });
                layer_phases.push(PhaseClusters {
                    phase: Phase::FfnDownRows,
                    clusters: cut_into_clusters(model.n_embd, sizes.ffn_rows, 1),
                });
            }
        }
        Program {
            shape,
            n_layer: model.n_layer,
            layer_phases,
            output: PhaseClusters {
                phase: Phase::OutputRows,
                clusters: cut_into_clusters(model.n_vocab, sizes.output_rows, 1),
            },
        }
    }

    /// The phase at `index` of a layer; `layer_phases.len()` is the output projection.
    pub fn phase_at(&self, index: usize) -> Phase {
        self.layer_phases
            .get(index)
            .map_or(Phase::OutputRows, |p| p.phase)
    }

    /// The clusters of `phase` (empty if this program has no such phase).
    pub fn clusters(&self, phase: Phase) -> &[Range<u32>] {
        if phase == Phase::OutputRows {
            return &self.output.clusters;
        }
        self.layer_phases
            .iter()
            .find(|p| p.phase == phase)
            .map_or(&[], |p| &p.clusters)
    }
}
