//! The execution plan: the contract between the planner, the scheduler and the drivers.
//!
//! A plan fixes how each phase is cut into clusters and which processor groups compute them.
//! Cluster boundaries decide the order of floating-point reductions, so they are part of the
//! plan and never derived from the number of threads: the same plan gives bit-identical results
//! on 1 or N threads, on the inline driver or on the actors.

mod cache;
mod hardware;
mod model;
mod topology;

pub use cache::{
    CachePlan, CachePolicy, ReadPolicy, DEFAULT_COALESCE, DEFAULT_GATE_FIRST_GAP, DEFAULT_MAX_LOADS,
};
pub use hardware::{
    CoreClassProfile, HardwareProfile, KernelRates, MemoryProfile, MessagingProfile, NpuProfile,
    NpuShapeRate, ProfileError, StorageProfile, StorageRate, PROFILE_FORMAT_VERSION,
};
pub use model::{
    gelu_tanh, FfnActivation, ModelDescription, ModelIdentity, ModelShape, WeightTypes, MAX_DIM,
    MAX_EXPERTS, MAX_LAYERS,
};
pub use topology::{hosts_of, PlacedGroup, PlacementError, Topology};

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

/// What kind of processor a group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XpuKind {
    /// CPU cores computing clusters with the quantized kernels (decode's sparse work).
    Cpu,
    /// A dense backend with fixed graph shapes (prefill). Here: an int8 GEMM on CPU cores.
    Npu,
}

/// Which cores a group runs on. In JSON and TOML a class name or a list of ids; in bincode
/// (which cannot guess which one follows) a tagged enum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoreSet {
    /// A core class of the machine: `"all"`, `"big"`, `"little"` (and, on three-class phones,
    /// `"mid"`), as detected from `cpu_capacity` / `cpuinfo_max_freq`.
    Class(String),
    /// Explicit core ids.
    Ids(Vec<u32>),
}

/// [`CoreSet`] as people write it: a name or a list.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum CoreSetText {
    Class(String),
    Ids(Vec<u32>),
}

/// The field holding a group's cores: untagged for people, tagged for bincode.
mod core_set_serde {
    use super::{CoreSet, CoreSetText};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(cores: &CoreSet, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            match cores {
                CoreSet::Class(c) => CoreSetText::Class(c.clone()),
                CoreSet::Ids(ids) => CoreSetText::Ids(ids.clone()),
            }
            .serialize(s)
        } else {
            cores.serialize(s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CoreSet, D::Error> {
        if d.is_human_readable() {
            Ok(match CoreSetText::deserialize(d)? {
                CoreSetText::Class(c) => CoreSet::Class(c),
                CoreSetText::Ids(ids) => CoreSet::Ids(ids),
            })
        } else {
            CoreSet::deserialize(d)
        }
    }
}

/// One processor group: the unit the scheduler sends cluster messages to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlan {
    pub name: String,
    pub kind: XpuKind,
    #[serde(with = "core_set_serde")]
    pub cores: CoreSet,
    /// Worker threads; 0 means one per core of the group (or the `-t` given on the command line).
    #[serde(default)]
    pub threads: u32,
}

/// A group's share of each phase's clusters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub group: String,
    /// Relative weight: a group with weight 3 gets three times the clusters of one with 1.
    pub weight: u32,
}

/// Fixed shapes of the dense backend (an NPU runs precompiled graphs of fixed size).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseShapes {
    /// Tokens per launch: a prefill step is computed in chunks of this many tokens.
    pub token_chunk: u32,
}

/// How the storage actor reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoragePlan {
    /// Threads issuing reads (1: one issuer, as on a phone's single UFS command queue).
    pub io_threads: u32,
    /// Reads in flight per issuer.
    pub queue_depth: u32,
    /// Bypass the page cache (`O_DIRECT`) where the file system allows it.
    pub direct_io: bool,
    /// How reads reach the kernel.
    #[serde(default)]
    pub engine: IoEngine,
    /// When what is read from a neuron store is checked against its checksums.
    #[serde(default)]
    pub verify: Verify,
}

/// When reads of a neuron store are checked against its checksums (`conductor.bundle_crc`
/// and `conductor.page_crc`, see [`crate::store`]). A read that fails its check is read again
/// once, then fails the step (an error naming the unit, never wrong output).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Every read: whole bundles against their CRC, parts of bundles, attention matrices,
    /// output and embedding rows page by page. Costs a CRC-32 of every byte read
    /// (docs/reliability.md has the figures).
    #[default]
    Always,
    /// A unit's first whole read only (what earlier versions did for bundles): later reads of
    /// the same unit, and reads of parts of it, are trusted. A disk that changes bytes
    /// after that first read goes unseen.
    First,
}

impl Verify {
    pub fn name(self) -> &'static str {
        match self {
            Verify::Always => "always",
            Verify::First => "first",
        }
    }
}

/// How the storage actor's reads reach the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    /// Positional reads (`pread`/`preadv`), one at a time per issuer: what an Android app
    /// can use.
    #[default]
    Pread,
    /// io_uring (cargo feature `io-uring`): the reads the scheduler groups (up to
    /// `cache.coalesce` of them, adjacent or not) are in flight together.
    Uring,
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
}

/// A step's deadline when the plan names none: 30 minutes. Legitimate steps can be long: a
/// 512-token prefill step of a 7B store under a 50% budget ran at 3.7 tokens/s here (138 s),
/// and the default model's 345-token prefill under qemu took over a minute.
pub const DEFAULT_STEP_DEADLINE_MS: u64 = 30 * 60 * 1000;

fn default_step_deadline_ms() -> u64 {
    DEFAULT_STEP_DEADLINE_MS
}

/// How decode chooses the FFN neurons it computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparsityMode {
    /// Every neuron (llama.cpp's arithmetic).
    #[default]
    Dense,
    /// Every gate row; up rows and down columns only where |act(gate)| passes the layer's
    /// threshold (CATS).
    Threshold,
    /// Gate rows only of the neurons the layer's predictor names, then the threshold.
    Predictor,
}

impl SparsityMode {
    pub fn name(self) -> &'static str {
        match self {
            SparsityMode::Dense => "dense",
            SparsityMode::Threshold => "threshold",
            SparsityMode::Predictor => "predictor",
        }
    }
}

/// Sparse decode as a plan sets it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SparsityPlan {
    pub mode: SparsityMode,
    /// Target share of FFN neurons skipped (`None`: the model's default target).
    #[serde(default)]
    pub target: Option<f32>,
    /// Predictor mode: the recall its cut is calibrated for (one the activation profile
    /// tabulates); `None`: the cut set when the predictors were trained.
    #[serde(default)]
    pub predictor_recall: Option<f32>,
    /// The per-layer thresholds on |act(gate)| that target gives with the model's activation
    /// profile (for people reading the plan; the engine calibrates them again from the
    /// profile and the target, so both always agree with the profile in use).
    #[serde(default)]
    pub thresholds: Vec<f32>,
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

/// Largest plan file read in bincode (plans are a few KiB; hot-neuron sets of big models
/// stay far below this).
const MAX_PLAN_BYTES: usize = 64 << 20;

fn plan_bincode() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PLAN_BYTES>()
}

/// How a plan file is written, by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlanFormat {
    Json,
    Toml,
    Bincode,
}

impl PlanFormat {
    fn of(path: &std::path::Path) -> PlanFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => PlanFormat::Toml,
            Some("bin") => PlanFormat::Bincode,
            _ => PlanFormat::Json,
        }
    }
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

/// A plan that cannot be used. Each error names the field.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("plan format version {found} is not supported (this build reads versions {min} to {expected})")]
    Version { found: u32, min: u32, expected: u32 },
    #[error("plan field `{field}` must be at least 1")]
    Zero { field: String },
    #[error("plan field `{field}` is {value}: at most {max}")]
    TooLarge { field: String, value: u64, max: u64 },
    #[error("plan field `{field}`: no group named `{name}` (groups: {known})")]
    UnknownGroup {
        field: String,
        name: String,
        known: String,
    },
    #[error("plan field `{field}`: group `{name}` is named twice")]
    DuplicateGroup { field: String, name: String },
    #[error("plan field `{field}` is empty: at least one group must compute these steps")]
    NoGroups { field: String },
    #[error("plan: {0}")]
    Parse(String),
    #[error("this plan was made for another model ({planned}); the model loaded is {actual}")]
    OtherModel { planned: String, actual: String },
}

impl ExecutionPlan {
    /// Reads a plan by the file's extension: bincode (`.bin`, for speed), TOML (`.toml`), or
    /// JSON (anything else; what `conductor plan` writes for people).
    pub fn from_file(path: &std::path::Path) -> Result<ExecutionPlan, PlanError> {
        let parse = |why: String| PlanError::Parse(format!("{}: {why}", path.display()));
        let bytes = std::fs::read(path)
            .map_err(|e| PlanError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let plan: ExecutionPlan = match PlanFormat::of(path) {
            PlanFormat::Bincode => Self::from_bincode(&bytes).map_err(parse)?,
            PlanFormat::Toml | PlanFormat::Json => {
                let text = std::str::from_utf8(&bytes).map_err(|_| {
                    parse("not UTF-8 text (a bincode plan must end in .bin)".into())
                })?;
                if PlanFormat::of(path) == PlanFormat::Toml {
                    toml::from_str(text).map_err(|e| parse(e.to_string()))?
                } else {
                    serde_json::from_str(text).map_err(|e| parse(e.to_string()))?
                }
            }
        };
        plan.validate()?;
        Ok(plan)
    }

    /// Writes the plan in the format its extension names (as [`ExecutionPlan::from_file`]
    /// reads it).
    pub fn to_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        let bytes = match PlanFormat::of(path) {
            PlanFormat::Bincode => bincode::serde::encode_to_vec(self, plan_bincode())
                .map_err(std::io::Error::other)?,
            PlanFormat::Toml => toml::to_string(self)
                .map_err(std::io::Error::other)?
                .into_bytes(),
            PlanFormat::Json => serde_json::to_string_pretty(self)?.into_bytes(),
        };
        std::fs::write(path, bytes)
    }

    /// A plan from bincode bytes (any bytes: an error, never a panic or a huge allocation).
    pub fn from_bincode(bytes: &[u8]) -> Result<ExecutionPlan, String> {
        let (plan, used): (ExecutionPlan, usize) =
            bincode::serde::decode_from_slice(bytes, plan_bincode()).map_err(|e| e.to_string())?;
        if used != bytes.len() {
            return Err(format!("{} bytes after the plan", bytes.len() - used));
        }
        Ok(plan)
    }

    /// Refuses the plan when it was made for a model other than `model`.
    /// `actual`: the model's identity (`ModelIdentity::of`).
    pub fn check_model(&self, actual: &ModelIdentity) -> Result<(), PlanError> {
        let Some(planned) = &self.model else {
            return Ok(());
        };
        if planned == actual {
            Ok(())
        } else {
            Err(PlanError::OtherModel {
                planned: planned.describe(),
                actual: actual.describe(),
            })
        }
    }

    /// Checks the fields a scheduler relies on.
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(PLAN_FORMAT_VERSION_MIN..=PLAN_FORMAT_VERSION).contains(&self.version) {
            return Err(PlanError::Version {
                found: self.version,
                min: PLAN_FORMAT_VERSION_MIN,
                expected: PLAN_FORMAT_VERSION,
            });
        }
        if self.memory == Some(0) {
            return Err(PlanError::Zero {
                field: "memory".into(),
            });
        }
        if let Some(t) = self.sparsity.as_ref().and_then(|s| s.target) {
            if !(0.0..=1.0).contains(&t) {
                return Err(PlanError::Parse(format!(
                    "plan field `sparsity.target` is {t}: a share within 0..=1"
                )));
            }
        }
        if let Some(r) = self.sparsity.as_ref().and_then(|s| s.predictor_recall) {
            if !(r > 0.0 && r <= 1.0) {
                return Err(PlanError::Parse(format!(
                    "plan field `sparsity.predictor_recall` is {r}: a share within (0, 1]"
                )));
            }
        }
        self.check_finite()?;
        let mut nonzero = vec![
            ("decode_max_tokens".to_string(), self.decode_max_tokens),
            ("prefill_max_tokens".to_string(), self.prefill_max_tokens),
            ("dense.token_chunk".to_string(), self.dense.token_chunk),
            ("storage.io_threads".to_string(), self.storage.io_threads),
            ("storage.queue_depth".to_string(), self.storage.queue_depth),
        ];
        for (name, s) in [("decode", &self.decode), ("prefill", &self.prefill)] {
            for (field, value) in [
                ("qkv_heads", s.qkv_heads),
                ("attn_heads", s.attn_heads),
                ("attn_out_rows", s.attn_out_rows),
                ("ffn_neurons", s.ffn_neurons),
                ("ffn_rows", s.ffn_rows),
                ("output_rows", s.output_rows),
            ] {
                nonzero.push((format!("{name}.{field}"), value));
            }
        }
        if let Some(c) = &self.cache {
            nonzero.push(("cache.slots".to_string(), c.slots));
            nonzero.push(("cache.max_loads".to_string(), c.max_loads));
        }
        for (field, value) in nonzero {
            if value == 0 {
                return Err(PlanError::Zero { field });
            }
        }
        if self.step_deadline_ms == 0 {
            return Err(PlanError::Zero {
                field: "step_deadline_ms".into(),
            });
        }
        self.check_ceilings()?;
        for (i, g) in self.groups.iter().enumerate() {
            if self.groups[..i].iter().any(|h| h.name == g.name) {
                return Err(PlanError::DuplicateGroup {
                    field: format!("groups[{i}].name"),
                    name: g.name.clone(),
                });
            }
        }
        for (field, shares) in [
            ("decode_on", &self.decode_on),
            ("prefill_on", &self.prefill_on),
        ] {
            if shares.is_empty() {
                return Err(PlanError::NoGroups {
                    field: field.into(),
                });
            }
            for (i, share) in shares.iter().enumerate() {
                if shares[..i].iter().any(|s| s.group == share.group) {
                    return Err(PlanError::DuplicateGroup {
                        field: format!("{field}[{i}].group"),
                        name: share.group.clone(),
                    });
                }
                self.group_index(&share.group)
                    .ok_or_else(|| PlanError::UnknownGroup {
                        field: format!("{field}[{i}].group"),
                        name: share.group.clone(),
                        known: self.group_names(),
                    })?;
                if share.weight == 0 {
                    return Err(PlanError::Zero {
                        field: format!("{field}[{i}].weight"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Refuses infinite and NaN numbers: no threshold or prediction means one, and JSON, a
    /// plan's usual form, cannot write them (they would come back as `null` and fail to read).
    fn check_finite(&self) -> Result<(), PlanError> {
        let thresholds = self.sparsity.iter().flat_map(|s| {
            s.thresholds
                .iter()
                .enumerate()
                .map(|(i, &t)| (format!("sparsity.thresholds[{i}]"), f64::from(t)))
        });
        let predicted = self.predicted.iter().flat_map(|p| {
            [
                ("decode_tok_s", Some(p.decode_tok_s)),
                ("prefill_tok_s", p.prefill_tok_s),
                ("bytes_per_token", p.bytes_per_token),
                ("compute_busy", p.compute_busy),
                ("storage_busy", p.storage_busy),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((format!("predicted.{k}"), v?)))
        });
        match thresholds.chain(predicted).find(|(_, v)| !v.is_finite()) {
            Some((field, v)) => Err(PlanError::Parse(format!(
                "plan field `{field}` is {v}: a finite number"
            ))),
            None => Ok(()),
        }
    }

    /// Refuses counts that would ask for unbounded threads or memory ([`limits`]).
    fn check_ceilings(&self) -> Result<(), PlanError> {
        let mut ceilings: Vec<(String, u64, u64)> = vec![
            (
                "decode_max_tokens".into(),
                self.decode_max_tokens.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "prefill_max_tokens".into(),
                self.prefill_max_tokens.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "dense.token_chunk".into(),
                self.dense.token_chunk.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "storage.io_threads".into(),
                self.storage.io_threads.into(),
                limits::IO_THREADS.into(),
            ),
            (
                "storage.queue_depth".into(),
                self.storage.queue_depth.into(),
                limits::QUEUE_DEPTH.into(),
            ),
            (
                "groups".into(),
                self.groups.len() as u64,
                limits::GROUPS as u64,
            ),
            (
                "step_deadline_ms".into(),
                self.step_deadline_ms,
                limits::DEADLINE_MS,
            ),
        ];
        for (i, g) in self.groups.iter().enumerate() {
            ceilings.push((
                format!("groups[{i}].threads"),
                g.threads.into(),
                limits::THREADS.into(),
            ));
        }
        if let Some(c) = &self.cache {
            for (field, value) in [
                ("slots", c.slots),
                ("hot_slots", c.hot_slots),
                ("max_loads", c.max_loads),
                ("coalesce", c.coalesce),
            ] {
                ceilings.push((format!("cache.{field}"), value.into(), limits::SLOTS.into()));
            }
        }
        for (field, value, max) in ceilings {
            if value > max {
                return Err(PlanError::TooLarge { field, value, max });
            }
        }
        Ok(())
    }

    /// The index (`XpuId`) of the group called `name`.
    pub fn group_index(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.name == name)
    }

    fn group_names(&self) -> String {
        let names: Vec<&str> = self.groups.iter().map(|g| g.name.as_str()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_is_valid_and_round_trips_through_json_and_toml() {
        let plan = ExecutionPlan::default();
        plan.validate().unwrap();
        let json = serde_json::to_string(&plan).unwrap();
        let back: ExecutionPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(plan, back);
        let toml = toml::to_string(&plan).unwrap();
        let back: ExecutionPlan = toml::from_str(&toml).unwrap();
        assert_eq!(plan, back);
    }

    /// A plan accepted is one JSON can write and read back: infinite or NaN thresholds and
    /// predictions (JSON writes them as `null`) are refused naming the field; extreme finite
    /// values (subnormals) come back exactly (both found by the fuzzer).
    #[test]
    fn plans_with_non_finite_numbers_are_refused_and_finite_ones_round_trip() {
        let refused = |f: &dyn Fn(&mut ExecutionPlan)| {
            let mut plan = ExecutionPlan::default();
            f(&mut plan);
            match plan.validate() {
                Err(PlanError::Parse(why)) => why,
                other => panic!("{other:?}"),
            }
        };
        let sparsity = |thresholds: Vec<f32>| SparsityPlan {
            mode: SparsityMode::Threshold,
            target: None,
            predictor_recall: None,
            thresholds,
        };
        let why = refused(&|p| p.sparsity = Some(sparsity(vec![0.5, f32::INFINITY])));
        assert!(why.contains("sparsity.thresholds[1]"), "{why}");
        let prediction = PlanPrediction {
            decode_tok_s: 2.7711982201388467e-302,
            prefill_tok_s: Some(f64::MIN_POSITIVE / 3.0),
            limited_by: "io".into(),
            profile: String::new(),
            reason: String::new(),
            bytes_per_token: None,
            compute_busy: None,
            storage_busy: Some(-2.436519963566265e289),
        };
        let why = refused(&|p| {
            p.predicted = Some(PlanPrediction {
                compute_busy: Some(f64::NAN),
                ..prediction.clone()
            })
        });
        assert!(why.contains("predicted.compute_busy"), "{why}");
        let mut plan = ExecutionPlan {
            sparsity: Some(sparsity(vec![f32::MIN_POSITIVE / 4.0, 2.3694278e-38])),
            predicted: Some(prediction),
            ..ExecutionPlan::default()
        };
        plan.validate().unwrap();
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<ExecutionPlan>(&json).unwrap(), plan);
        plan.sparsity = None;
        plan.validate().unwrap();
    }

    /// Counts that would ask for unbounded threads or memory are refused naming the field;
    /// the ceilings themselves are accepted.
    #[test]
    fn plans_asking_for_unbounded_threads_or_memory_are_refused() {
        let too_large = |f: &dyn Fn(&mut ExecutionPlan)| {
            let mut plan = ExecutionPlan::default();
            f(&mut plan);
            match plan.validate() {
                Err(PlanError::TooLarge { field, .. }) => field,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            too_large(&|p| p.groups[1].threads = u32::MAX),
            "groups[1].threads"
        );
        assert_eq!(
            too_large(&|p| p.storage.io_threads = 1_000_000),
            "storage.io_threads"
        );
        assert_eq!(
            too_large(&|p| p.storage.queue_depth = u32::MAX),
            "storage.queue_depth"
        );
        assert_eq!(
            too_large(&|p| p.prefill_max_tokens = u32::MAX),
            "prefill_max_tokens"
        );
        assert_eq!(
            too_large(&|p| p.step_deadline_ms = u64::MAX),
            "step_deadline_ms"
        );
        assert_eq!(
            too_large(&|p| {
                p.cache = Some(CachePlan {
                    slots: u32::MAX,
                    ..CachePlan::default()
                })
            }),
            "cache.slots"
        );
        let mut plan = ExecutionPlan::default();
        plan.groups[0].threads = limits::THREADS;
        plan.storage.io_threads = limits::IO_THREADS;
        plan.validate().unwrap();
        plan.step_deadline_ms = 0;
        assert_eq!(
            plan.validate(),
            Err(PlanError::Zero {
                field: "step_deadline_ms".into()
            })
        );
    }

    #[test]
    fn bad_plans_are_rejected_naming_the_field() {
        let mut plan = ExecutionPlan::default();
        plan.decode.ffn_neurons = 0;
        assert_eq!(
            plan.validate(),
            Err(PlanError::Zero {
                field: "decode.ffn_neurons".into()
            })
        );
        for version in [1, 99] {
            let plan = ExecutionPlan {
                version,
                ..ExecutionPlan::default()
            };
            assert!(matches!(plan.validate(), Err(PlanError::Version { .. })));
        }
        // Version 3 said gate-first loading with a flag; it reads as the read policy.
        let mut v3: serde_json::Value = serde_json::to_value(ExecutionPlan {
            cache: Some(CachePlan {
                slots: 8,
                ..CachePlan::default()
            }),
            ..ExecutionPlan::default()
        })
        .unwrap();
        v3["version"] = 3.into();
        let cache = v3["cache"].as_object_mut().unwrap();
        cache.remove("reads");
        cache.insert("gate_first".into(), true.into());
        let v3: ExecutionPlan = serde_json::from_value(v3).unwrap();
        v3.validate().unwrap();
        assert_eq!(v3.cache.unwrap().reads, ReadPolicy::GateFirst);
        // Version 4 names it, and it round-trips.
        let v4 = ExecutionPlan {
            cache: Some(CachePlan {
                reads: ReadPolicy::PredictedPages,
                ..CachePlan::default()
            }),
            ..ExecutionPlan::default()
        };
        let json = serde_json::to_string(&v4).unwrap();
        assert!(json.contains(r#""reads":"predicted-pages""#), "{json}");
        assert_eq!(serde_json::from_str::<ExecutionPlan>(&json).unwrap(), v4);
        // Version 2 (no budget, no sparsity of its own) still reads.
        let mut v2: serde_json::Value = serde_json::to_value(ExecutionPlan::default()).unwrap();
        v2["version"] = 2.into();
        let v2: ExecutionPlan = serde_json::from_value(v2).unwrap();
        v2.validate().unwrap();
        assert_eq!((v2.memory, v2.sparsity), (None, None));
        let plan = ExecutionPlan {
            memory: Some(0),
            ..ExecutionPlan::default()
        };
        assert_eq!(
            plan.validate(),
            Err(PlanError::Zero {
                field: "memory".into()
            })
        );
        let plan = ExecutionPlan {
            sparsity: Some(SparsityPlan {
                mode: SparsityMode::Threshold,
                target: Some(1.5),
                predictor_recall: None,
                thresholds: Vec::new(),
            }),
            ..ExecutionPlan::default()
        };
        assert!(plan
            .validate()
            .unwrap_err()
            .to_string()
            .contains("sparsity.target"));
        let plan = ExecutionPlan {
            sparsity: Some(SparsityPlan {
                mode: SparsityMode::Predictor,
                target: Some(0.3),
                predictor_recall: Some(0.0),
                thresholds: Vec::new(),
            }),
            ..ExecutionPlan::default()
        };
        assert!(plan
            .validate()
            .unwrap_err()
            .to_string()
            .contains("sparsity.predictor_recall"));

        let mut plan = ExecutionPlan::default();
        plan.prefill_on[0].group = "gpu".into();
        let err = plan.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "plan field `prefill_on[0].group`: no group named `gpu` (groups: cpu, npu)"
        );

        let mut plan = ExecutionPlan::default();
        plan.groups[1].name = "cpu".into();
        assert!(matches!(
            plan.validate(),
            Err(PlanError::DuplicateGroup { field, .. }) if field == "groups[1].name"
        ));

        let mut plan = ExecutionPlan::default();
        plan.decode_on.push(plan.decode_on[0].clone());
        assert_eq!(
            plan.validate().unwrap_err().to_string(),
            "plan field `decode_on[1].group`: group `cpu` is named twice"
        );

        let mut plan = ExecutionPlan::default();
        plan.decode_on.clear();
        assert!(matches!(plan.validate(), Err(PlanError::NoGroups { .. })));
    }

    #[test]
    fn plans_round_trip_through_json_toml_and_bincode_files() {
        let plan = ExecutionPlan {
            model: Some(ModelIdentity {
                arch: "llama".into(),
                n_layer: 30,
                n_embd: 576,
                n_ff: 1536,
                relu: false,
                norms_crc32: 0xdead_beef,
            }),
            predicted: Some(PlanPrediction {
                decode_tok_s: 12.5,
                prefill_tok_s: None,
                limited_by: "io".into(),
                profile: "this machine".into(),
                reason: "the disk".into(),
                bytes_per_token: Some(1e6),
                compute_busy: Some(0.5),
                storage_busy: Some(0.99),
            }),
            memory: Some(48 << 20),
            sparsity: Some(SparsityPlan {
                mode: SparsityMode::Threshold,
                target: Some(0.3),
                predictor_recall: Some(0.95),
                thresholds: vec![0.1, 0.2],
            }),
            ..ExecutionPlan::default()
        };
        let dir = std::env::temp_dir().join(format!("conductor-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["p.json", "p.toml", "p.bin"] {
            let path = dir.join(name);
            plan.to_file(&path).unwrap();
            assert_eq!(ExecutionPlan::from_file(&path).unwrap(), plan, "{name}");
        }
        // A bincode plan named .json is not JSON: an error saying how to name it.
        std::fs::copy(dir.join("p.bin"), dir.join("q.json")).unwrap();
        let err = ExecutionPlan::from_file(&dir.join("q.json")).unwrap_err();
        assert!(err.to_string().contains("q.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncated_or_padded_bincode_plans_are_errors() {
        let bytes =
            bincode::serde::encode_to_vec(ExecutionPlan::default(), plan_bincode()).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                ExecutionPlan::from_bincode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(ExecutionPlan::from_bincode(&padded)
            .unwrap_err()
            .contains("1 bytes after"));
    }

    proptest::proptest! {
        /// Any bytes, and any single-byte change to a valid plan: a plan or an error, never a
        /// panic or an allocation beyond the limit.
        #[test]
        fn hostile_bincode_plans_never_panic(
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            at in 0usize..4096,
            byte in proptest::num::u8::ANY,
        ) {
            let _ = ExecutionPlan::from_bincode(&noise);
            let mut bytes =
                bincode::serde::encode_to_vec(ExecutionPlan::default(), plan_bincode()).unwrap();
            let i = at % bytes.len();
            bytes[i] = byte;
            if let Ok(plan) = ExecutionPlan::from_bincode(&bytes) {
                let _ = plan.validate();
            }
        }
    }

    #[test]
    fn cores_are_a_class_name_or_a_list_of_ids() {
        let g: GroupPlan =
            serde_json::from_str(r#"{"name":"big","kind":"cpu","cores":[4,5,6,7]}"#).unwrap();
        assert_eq!(g.cores, CoreSet::Ids(vec![4, 5, 6, 7]));
        assert_eq!(g.threads, 0);
        let g: GroupPlan =
            serde_json::from_str(r#"{"name":"n","kind":"npu","cores":"little","threads":2}"#)
                .unwrap();
        assert_eq!(g.cores, CoreSet::Class("little".into()));
    }
}
