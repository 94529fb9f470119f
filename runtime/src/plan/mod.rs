//! The execution plan: the contract between the planner, the scheduler and the drivers.
//!
//! A plan fixes how each phase is cut into clusters. Cluster boundaries decide the order of
//! floating-point reductions, so they are part of the plan and never derived from the number of
//! threads: the same plan gives bit-identical results on 1 or N threads.

use serde::{Deserialize, Serialize};

/// Version of the plan format; bumped when a field changes meaning.
pub const PLAN_FORMAT_VERSION: u32 = 1;

/// The dimensions of a model that the scheduler and the simulator need (no weights).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_vocab: u32,
    /// FFN neuron clusters must be a multiple of this many neurons: the block size of the down
    /// projection's quant type, whose columns a cluster owns.
    pub ffn_granule: u32,
}

/// How many units each phase's clusters hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSizes {
    /// Heads per cluster of the q|k|v projection phase.
    pub qkv_heads: u32,
    /// Query heads per attention cluster.
    pub attn_heads: u32,
    /// Rows per cluster of the attention output projection.
    pub attn_out_rows: u32,
    /// Neurons per FFN cluster (decode shape: partial down projections).
    pub ffn_neurons: u32,
    /// Rows per cluster of the dense FFN projections (prefill shape).
    pub ffn_rows: u32,
    /// Vocabulary rows per cluster of the output projection.
    pub output_rows: u32,
}

/// What the scheduler follows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionPlan {
    pub version: u32,
    /// Steps of at most this many tokens run in decode shape (FFN as neuron clusters).
    pub decode_max_tokens: u32,
    /// The most tokens one prefill step computes (llama.cpp's micro-batch); longer prompts are
    /// split into several steps.
    pub prefill_max_tokens: u32,
    pub decode: ClusterSizes,
    pub prefill: ClusterSizes,
}

impl Default for ExecutionPlan {
    /// Cluster sizes that keep two to sixteen cores busy on llama-family shapes while each
    /// cluster still holds enough work to amortise its dispatch (measured on SmolLM2-135M).
    fn default() -> Self {
        ExecutionPlan {
            version: PLAN_FORMAT_VERSION,
            decode_max_tokens: 1,
            prefill_max_tokens: 512,
            decode: ClusterSizes {
                qkv_heads: 1,
                attn_heads: 1,
                attn_out_rows: 64,
                ffn_neurons: 128,
                ffn_rows: 128,
                output_rows: 2048,
            },
            prefill: ClusterSizes {
                qkv_heads: 1,
                attn_heads: 1,
                attn_out_rows: 64,
                ffn_neurons: 128,
                ffn_rows: 128,
                output_rows: 2048,
            },
        }
    }
}

/// A plan that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("plan format version {found} is not supported (this build reads version {expected})")]
    Version { found: u32, expected: u32 },
    #[error("plan field `{field}` must be at least 1")]
    Zero { field: &'static str },
}

impl ExecutionPlan {
    /// Checks the fields a scheduler relies on.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.version != PLAN_FORMAT_VERSION {
            return Err(PlanError::Version {
                found: self.version,
                expected: PLAN_FORMAT_VERSION,
            });
        }
        let nonzero = [
            ("decode_max_tokens", self.decode_max_tokens),
            ("prefill_max_tokens", self.prefill_max_tokens),
            ("decode.qkv_heads", self.decode.qkv_heads),
            ("decode.attn_heads", self.decode.attn_heads),
            ("decode.attn_out_rows", self.decode.attn_out_rows),
            ("decode.ffn_neurons", self.decode.ffn_neurons),
            ("decode.ffn_rows", self.decode.ffn_rows),
            ("decode.output_rows", self.decode.output_rows),
            ("prefill.qkv_heads", self.prefill.qkv_heads),
            ("prefill.attn_heads", self.prefill.attn_heads),
            ("prefill.attn_out_rows", self.prefill.attn_out_rows),
            ("prefill.ffn_neurons", self.prefill.ffn_neurons),
            ("prefill.ffn_rows", self.prefill.ffn_rows),
            ("prefill.output_rows", self.prefill.output_rows),
        ];
        for (field, value) in nonzero {
            if value == 0 {
                return Err(PlanError::Zero { field });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_is_valid_and_round_trips_through_json() {
        let plan = ExecutionPlan::default();
        plan.validate().unwrap();
        let json = serde_json::to_string(&plan).unwrap();
        let back: ExecutionPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(plan, back);
    }

    #[test]
    fn zero_sizes_and_other_versions_are_rejected() {
        let mut plan = ExecutionPlan::default();
        plan.decode.ffn_neurons = 0;
        assert_eq!(
            plan.validate(),
            Err(PlanError::Zero {
                field: "decode.ffn_neurons"
            })
        );
        let plan = ExecutionPlan {
            version: 99,
            ..ExecutionPlan::default()
        };
        assert!(matches!(plan.validate(), Err(PlanError::Version { .. })));
    }
}
