//! Neuron identities and neuron clusters: the unit of compute and I/O.
//!
//! A layer's work is a sequence of [`Phase`]s. Each phase is cut into clusters of *units*: an
//! FFN neuron (gate row, up row and down column together), an attention head, or a matrix row.
//! A cluster is always a contiguous range of units; the plan fixes the cluster boundaries, never
//! the thread count, so results do not depend on how clusters are spread over threads.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// What one phase of a layer computes, and therefore what its units are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// Rows of the q, k and v projections; a unit is one head (query heads first, then key heads,
    /// then value heads). Applies RoPE and appends keys and values to the KV cache.
    QkvHeads,
    /// Attention of query heads over the KV cache; a unit is one query head.
    AttnHeads,
    /// Rows of the attention output projection; a unit is one row (one embedding dimension).
    AttnOutRows,
    /// FFN neurons; a unit is neuron `i`: gate row `i`, up row `i`, down column `i`. Each cluster
    /// yields a partial down projection; partials are summed in cluster order.
    FfnNeurons,
    /// Gate-first loading (decode under a neuron cache, `cache.gate_first`): the gate rows of
    /// each FFN cluster, computed from the first pages of its bundle before the rest is read;
    /// a unit is one neuron. `FfnNeurons` follows with the same clusters, reading only the
    /// pages that hold the neurons the gate let through.
    FfnGateRows,
    /// Rows of the FFN gate and up projections (dense prefill); a unit is one neuron's two rows.
    FfnGateUpRows,
    /// Rows of the FFN down projection (dense prefill); a unit is one row.
    FfnDownRows,
    /// Vocabulary rows of the output projection; a unit is one token of the vocabulary.
    OutputRows,
}

impl Phase {
    /// Short name for traces and logs.
    pub fn name(self) -> &'static str {
        match self {
            Phase::QkvHeads => "qkv",
            Phase::AttnHeads => "attn",
            Phase::AttnOutRows => "attn_out",
            Phase::FfnNeurons => "ffn",
            Phase::FfnGateRows => "ffn_gate",
            Phase::FfnGateUpRows => "ffn_gate_up",
            Phase::FfnDownRows => "ffn_down",
            Phase::OutputRows => "output",
        }
    }
}

/// Identifies one FFN neuron of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NeuronId {
    pub layer: u32,
    pub index: u32,
}

/// A contiguous range of units of one phase of one layer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NeuronCluster {
    pub layer: u32,
    pub phase: Phase,
    pub units: Range<u32>,
}

/// Cuts `n_units` into clusters of `cluster_size` units (the last one may be shorter).
///
/// `cluster_size` is rounded up to a multiple of `granule` (a quant block or a head's worth of
/// units) so that clusters never split a quantization block.
pub fn cut_into_clusters(n_units: u32, cluster_size: u32, granule: u32) -> Vec<Range<u32>> {
    let granule = granule.max(1);
    let size = cluster_size.max(1).div_ceil(granule) * granule;
    (0..n_units.div_ceil(size))
        .map(|i| i * size..((i + 1) * size).min(n_units))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_cover_units_once_and_respect_granule() {
        let c = cut_into_clusters(1536, 100, 32);
        assert_eq!(c[0], 0..128);
        assert_eq!(c.len(), 12);
        assert_eq!(c.last().unwrap().end, 1536);
        for w in c.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert_eq!(cut_into_clusters(10, 4, 1), vec![0..4, 4..8, 8..10]);
        assert!(cut_into_clusters(0, 4, 1).is_empty());
    }
}
