//! The execution plan: the contract between the planner, the scheduler and the drivers.
//!
//! A plan fixes how each phase is cut into clusters and which processor groups compute them.
//! Cluster boundaries decide the order of floating-point reductions, so they are part of the
//! plan and never derived from the number of threads: the same plan gives bit-identical results
//! on 1 or N threads, on the inline driver or on the actors.

mod cache;
mod ffn;
mod file;
mod groups;
mod hardware;
mod model;
mod overrides;
mod sparsity;
mod storage;
mod topology;
mod validate;

pub use cache::{
    CachePlan, CachePolicy, DEFAULT_COALESCE, DEFAULT_GATE_FIRST_GAP, DEFAULT_MAX_LOADS,
};
pub use ffn::{FfnPlan, FfnPlanError, FfnSelect, ReadPolicy};
pub use groups::{CoreSet, DenseShapes, GroupPlan, Share, XpuKind};
pub use hardware::{
    CoreClassProfile, HardwareProfile, KernelRates, MemoryProfile, MessagingProfile, NpuProfile,
    NpuShapeRate, ProfileError, StorageProfile, StorageRate, FEW_TOKENS, PROFILE_FORMAT_VERSION,
};
pub use model::{
    gelu_tanh, FfnActivation, ModelDescription, ModelIdentity, ModelShape, WeightTypes, MAX_DIM,
    MAX_EXPERTS, MAX_LAYERS,
};
pub use overrides::{OverrideError, PlanOverrides};
pub use sparsity::{SparsityMode, SparsityPlan};
pub use storage::{IoEngine, StoragePlan, Verify};
pub use topology::{hosts_of, PlacedGroup, PlacementError, Topology};
pub use validate::PlanError;

use serde::{Deserialize, Serialize};

/// Version of the plan format; bumped when a field changes meaning or is added. Version 4
/// replaced the cache's `gate_first` flag by its read policy, `reads`; version 5 added
/// `sparsity.predictor_recall` (absent from older plans: the predictors' trained cut).
pub const PLAN_FORMAT_VERSION: u32 = 5;

/// The oldest plan format this build reads: version 2 lacks `memory` and `sparsity`, which
/// then take their defaults (no budget of its own, the sparsity the command line asks for);
/// version 3 says `cache.gate_first: true` for `cache.reads: "gate-first"`.
pub const PLAN_FORMAT_VERSION_MIN: u32 = 2;

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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionPlan {
    pub version: u32,
    /// Steps of at most this many tokens run in decode shape (FFN as neuron clusters).
    pub decode_max_tokens: u32,
    /// The most tokens one prefill step computes (llama.cpp's micro-batch); longer prompts are
    /// split into several steps.
    pub prefill_max_tokens: u32,
    pub decode: ClusterSizes,
    pub prefill: ClusterSizes,
    /// The processor groups; group `i` is `XpuId(i)`.
    pub groups: Vec<GroupPlan>,
    /// Groups computing decode steps, each with its share of every phase.
    pub decode_on: Vec<Share>,
    /// Groups computing prefill steps.
    pub prefill_on: Vec<Share>,
    pub dense: DenseShapes,
    pub storage: StoragePlan,
    /// The neuron cache, for a neuron store under a memory budget; `None`: every FFN cluster
    /// is read from the model in memory.
    #[serde(default)]
    pub cache: Option<CachePlan>,
    /// The model the plan was made for; a plan naming another model is refused at load
    /// ([`ExecutionPlan::check_model`]). `None`: a generic plan, for any model.
    #[serde(default)]
    pub model: Option<ModelIdentity>,
    /// The memory budget the plan was made for, in bytes: the engine runs under it when the
    /// command line gives no `--memory` (needs a neuron store). `None`: in memory.
    #[serde(default)]
    pub memory: Option<u64>,
    /// How decode chooses its FFN neurons, when the command line does not say
    /// (`--sparsity default`). `None`: the model's default.
    #[serde(default)]
    pub sparsity: Option<SparsityPlan>,
    /// What the planner predicted for this plan (kept to compare with measurements).
    #[serde(default)]
    pub predicted: Option<PlanPrediction>,
    /// The longest a step may take, in milliseconds, before the actor driver gives it up as
    /// failed (a stuck read, an actor gone without a word) and replaces the actors. Generous:
    /// a deadline is a last resort against hangs, not a latency target. Absent from older
    /// plans: [`DEFAULT_STEP_DEADLINE_MS`].
    #[serde(default = "default_step_deadline_ms")]
    pub step_deadline_ms: u64,
    /// The output projection computes the logits of tokens `0..n` only; the others are
    /// minus infinity. A draft model's head over the vocabulary's most frequent tokens (a
    /// byte-pair vocabulary numbers its tokens in the order its merges were learned, the
    /// most frequent first): its proposals are only proposals, and the head is a large
    /// share of a small model's bytes. In memory only. `None`: the whole vocabulary.
    #[serde(default)]
    pub output_vocab: Option<u32>,
}

/// A step's deadline when the plan names none: 30 minutes. Legitimate steps can be long: a
/// 512-token prefill step of a 7B store under a 50% budget ran at 3.7 tokens/s here (138 s),
/// and the default model's 345-token prefill under qemu took over a minute.
pub const DEFAULT_STEP_DEADLINE_MS: u64 = 30 * 60 * 1000;

fn default_step_deadline_ms() -> u64 {
    DEFAULT_STEP_DEADLINE_MS
}

/// The figures a planner predicted for its plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanPrediction {
    /// Decode tokens per second.
    pub decode_tok_s: f64,
    /// Prefill tokens per second, if the planner scored a prompt.
    #[serde(default)]
    pub prefill_tok_s: Option<f64>,
    /// What limited the plan: `compute`, `io` or `memory`.
    pub limited_by: String,
    /// The hardware profile the prediction used (its `name`).
    pub profile: String,
    /// Why this plan, in a sentence or two (the planner's explanation).
    #[serde(default)]
    pub reason: String,
    /// Bytes read from storage per decode token, as predicted.
    #[serde(default)]
    pub bytes_per_token: Option<f64>,
    /// Share of decode time the compute groups were busy, as predicted.
    #[serde(default)]
    pub compute_busy: Option<f64>,
    /// Share of decode time the storage device was busy, as predicted.
    #[serde(default)]
    pub storage_busy: Option<f64>,
}

impl Default for ExecutionPlan {
    /// Decode on one CPU group over every core, prefill on the dense backend over the same
    /// cores. Cluster sizes keep two to sixteen cores busy on llama-family shapes while each
    /// cluster still holds enough work to amortise its dispatch (measured on SmolLM2-135M).
    fn default() -> Self {
        let sizes = ClusterSizes {
            qkv_heads: 1,
            attn_heads: 1,
            attn_out_rows: 64,
            ffn_neurons: 128,
            ffn_rows: 128,
            output_rows: 2048,
        };
        ExecutionPlan {
            version: PLAN_FORMAT_VERSION,
            decode_max_tokens: 1,
            prefill_max_tokens: 512,
            decode: sizes.clone(),
            prefill: sizes,
            groups: vec![
                GroupPlan {
                    name: "cpu".into(),
                    kind: XpuKind::Cpu,
                    cores: CoreSet::Class("all".into()),
                    threads: 0,
                },
                GroupPlan {
                    name: "npu".into(),
                    kind: XpuKind::Npu,
                    cores: CoreSet::Class("all".into()),
                    threads: 0,
                },
            ],
            decode_on: vec![Share {
                group: "cpu".into(),
                weight: 1,
            }],
            prefill_on: vec![Share {
                group: "npu".into(),
                weight: 1,
            }],
            // 128-token launches cost prefill 3–7% here against 256 (the GEMM repacks each
            // weight block per launch); 256 is as fast as one launch for the whole step.
            dense: DenseShapes { token_chunk: 256 },
            storage: StoragePlan {
                io_threads: 1,
                queue_depth: 1,
                engine: IoEngine::Pread,
                direct_io: true,
                verify: Verify::Always,
            },
            cache: None,
            model: None,
            memory: None,
            sparsity: None,
            predicted: None,
            step_deadline_ms: DEFAULT_STEP_DEADLINE_MS,
            output_vocab: None,
        }
    }
}

/// Ceilings of a plan's counts: what a hostile or mistaken plan could otherwise ask for in
/// threads or memory. Each is far above what any machine Conductor runs on uses.
pub mod limits {
    /// Worker threads of one group.
    pub const THREADS: u32 = 1024;
    /// Threads issuing reads.
    pub const IO_THREADS: u32 = 64;
    /// Reads in flight per issuer (io_uring's queue).
    pub const QUEUE_DEPTH: u32 = 4096;
    /// Tokens of one step (scratch buffers scale with it).
    pub const STEP_TOKENS: u32 = 1 << 16;
    /// Cache slots (each holds a bundle of at least a page), loads in flight and reads
    /// grouped: 4M slots of 4 KiB are 16 GiB.
    pub const SLOTS: u32 = 1 << 22;
    /// Processor groups (a group is a host thread and its pool).
    pub const GROUPS: usize = 255;
    /// A step's deadline: one day.
    pub const DEADLINE_MS: u64 = 24 * 3600 * 1000;
}

#[cfg(test)]
mod tests;
