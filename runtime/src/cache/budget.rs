//! Splitting a memory budget: the fixed segment first, the neuron cache gets the rest.

use super::{hot_segment, UnitMap, SLOT_ALIGN};
use crate::model::Model;
use crate::plan::{CachePlan, CachePolicy};

/// A memory budget as the user writes it: bytes (`48MiB`, `100MB`, `52428800`) or a share of the
/// model file (`50%`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryBudget {
    Bytes(u64),
    PercentOfModel(f64),
}

impl std::str::FromStr for MemoryBudget {
    type Err = String;

    fn from_str(s: &str) -> Result<MemoryBudget, String> {
        let t = s.trim();
        let bad = || format!("`{s}` is not a memory size (examples: 48MiB, 100MB, 52428800, 50%)");
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(v > 0.0 && v <= 1000.0) {
                return Err(format!("`{s}`: a percentage must be above 0"));
            }
            return Ok(MemoryBudget::PercentOfModel(v));
        }
        let digits = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        let v: f64 = num.parse().map_err(|_| bad())?;
        let scale = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "kib" => 1024.0,
            "m" | "mb" => 1e6,
            "mib" => 1024.0 * 1024.0,
            "g" | "gb" => 1e9,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad()),
        };
        let bytes = v * scale;
        if !(1.0..1e18).contains(&bytes) {
            return Err(bad());
        }
        Ok(MemoryBudget::Bytes(bytes as u64))
    }
}

impl MemoryBudget {
    /// The budget in bytes for a model file of `file_bytes`.
    pub fn bytes(self, file_bytes: u64) -> u64 {
        match self {
            MemoryBudget::Bytes(b) => b,
            MemoryBudget::PercentOfModel(p) => (file_bytes as f64 * p / 100.0) as u64,
        }
    }
}

/// What [`runtime_overhead`] counts whatever the model: code, thread stacks, the allocator's
/// slack, the decode buffers of a step that do not grow with the model.
pub const RUNTIME_BASE: u64 = 17 << 19;
/// What [`runtime_overhead`] counts per vocabulary entry: the tokenizer's text buffer, offset
/// table and index (`tokenizer/vocab.rs`), its merge ranks, and the token's type and score.
pub const RUNTIME_PER_TOKEN: u64 = 96;
/// What [`runtime_overhead`] counts per cache unit (a bundle, an output row cluster, a streamed
/// attention matrix): its directory entry, its read's extent and checksum flag, its place in
/// the unit map and the scheduler's per-unit state, its slot's lock.
pub const RUNTIME_PER_UNIT: u64 = 192;

/// Memory the process needs besides weights, KV cache and prefill scratch, for a store of
/// `sizes` whose cache holds `units` units:
/// `RUNTIME_BASE + n_vocab · RUNTIME_PER_TOKEN + units · RUNTIME_PER_UNIT`.
/// Calibrated on SmolLM2-135M (49k-token vocabulary, a few hundred units): peak RSS of runs
/// under the smallest budgets (attention streamed; `run -c 128`, `bench -p 16` and
/// `bench -p 64`: 18.3–20.6 MiB) minus the weights, KV cache, scratch and slots they hold
/// (8.6–11.6 MiB), plus 1.4 MiB of margin, gave 13 MiB, which the formula gives there; the
/// terms that grow are the vocabulary's tables and the cache's per-unit bookkeeping, so a 7B
/// model's 32k vocabulary and a 47B store's tens of thousands of units are counted as such.
pub fn runtime_overhead(sizes: &StoreSizes, units: u32) -> u64 {
    RUNTIME_BASE
        + u64::from(sizes.n_vocab) * RUNTIME_PER_TOKEN
        + u64::from(units) * RUNTIME_PER_UNIT
}

/// How a budget was spent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetSplit {
    pub budget: u64,
    /// Header, embeddings, attention, norms: read into memory at load.
    pub resident_weights: u64,
    /// The KV caches of `sessions` sessions of `n_ctx` tokens each.
    pub kv_cache: u64,
    /// Sessions whose KV cache the budget holds (a server's `--parallel` slots; 1 otherwise).
    pub sessions: u32,
    /// Tokens of context each session holds.
    pub n_ctx: u32,
    /// Activations, logits and per-worker buffers of a step.
    pub scratch: u64,
    pub runtime_overhead: u64,
    /// What is left for the neuron cache's slots.
    pub cache: u64,
    pub plan: CachePlan,
    /// Bytes of all FFN bundles: what would fit to hold the whole FFN.
    pub ffn_bytes: u64,
    /// Rows per cluster of the streamed output projection (the plan's `output_rows`).
    pub output_rows: u32,
}

/// Why a budget cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error(
        "--memory needs a neuron store (make one with `conductor convert -m MODEL -o STORE.gguf`)"
    )]
    NotAStore,
    #[error("a memory budget of {budget} MiB is below what this model needs besides what streams from storage: {fixed} MiB (resident weights {weights} MiB, KV cache {kv} MiB for {sessions_text}{n_ctx} tokens, scratch {scratch} MiB, runtime {runtime} MiB) plus two cache slots ({slots} MiB); give at least {need} MiB", budget = mib(*budget), fixed = mib(*fixed), weights = mib(*weights), kv = mib(*kv), scratch = mib(*scratch), runtime = mib(*runtime), slots = mib(*slots), need = (*fixed + *slots).div_ceil(1 << 20), sessions_text = if *sessions > 1 { format!("{sessions} sessions of ") } else { String::new() })]
    TooSmall {
        budget: u64,
        fixed: u64,
        weights: u64,
        kv: u64,
        scratch: u64,
        runtime: u64,
        slots: u64,
        /// Tokens of context of each session.
        n_ctx: u32,
        /// Sessions whose KV cache the budget holds.
        sessions: u32,
    },
}

fn mib(b: u64) -> f64 {
    (b as f64 / (1 << 20) as f64 * 10.0).round() / 10.0
}

/// The sizes a budget split needs, and nothing else: what [`split_budget`] reads from a
/// neuron store, or what the planner derives from a model shape it has no file for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSizes {
    /// Bytes read into memory at load: the header, attention, norms, and sparse decode's
    /// predictors and thresholds (bundles, token embeddings and the output projection stream).
    pub resident_weights: u64,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub q_dim: u32,
    pub kv_dim: u32,
    pub n_vocab: u32,
    /// Bundles (FFN clusters) per layer and the bytes from one to the next.
    pub bundles_per_layer: u32,
    pub bundle_stride: u64,
    /// Bytes of one row of the output projection.
    pub output_row_bytes: u64,
    /// Bytes of every layer's attention matrices (part of `resident_weights`: what leaves the
    /// fixed segment when attention streams).
    pub attention_bytes: u64,
    /// The longest read of one attention matrix (a unit when attention streams).
    pub attention_unit_bytes: u64,
    /// The read of one bundle of each layer (whole pages, at most `bundle_stride`): shorter
    /// than the stride in the layers of a store whose down types differ (a Q4_K_M file's
    /// Q4_K layers beside its Q6_K ones). A hot slot is as long as its own unit's read.
    /// Empty: every layer's is the stride.
    pub layer_bundle_bytes: Vec<u64>,
}

impl StoreSizes {
    /// The sizes of a neuron store loaded with `WeightSource::Resident`.
    pub fn of_store(model: &Model) -> Result<StoreSizes, BudgetError> {
        let store = model.store().ok_or(BudgetError::NotAStore)?;
        let c = model.config();
        let file = model.file();
        let resident_weights = file.data_offset()
            + file
                .tensors()
                .iter()
                .filter(|t| !crate::store::stays_on_storage(&t.name, true))
                .map(|t| t.n_bytes)
                .sum::<u64>()
            + model.sparse().map_or(0, |s| s.bytes() as u64);
        let matrices = model
            .layers()
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo])
            .map(|t| (t.bytes.len() as u64, super::reader::read_len(&t.bytes)));
        let attention_bytes = matrices.clone().map(|(bytes, _)| bytes).sum();
        let attention_unit_bytes = matrices.map(|(_, read)| read).max().unwrap_or(0);
        let layer_bundle_bytes = (0..c.n_layer)
            .map(|l| {
                let layout = store.layout_of(l);
                let payload = layout.payload_bytes(layout.neurons_of(0).len() as u32) as u64;
                (payload.div_ceil(crate::store::STORE_ALIGN) * crate::store::STORE_ALIGN)
                    .min(layout.stride)
            })
            .collect();
        Ok(StoreSizes {
            resident_weights,
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            q_dim: c.q_dim(),
            kv_dim: c.kv_dim(),
            n_vocab: c.n_vocab,
            bundles_per_layer: store.layout.n_bundles,
            bundle_stride: store.layout.stride,
            output_row_bytes: model.output().row_bytes() as u64,
            attention_bytes,
            attention_unit_bytes,
            layer_bundle_bytes,
        })
    }

    /// Bytes of a slot that holds unit `unit` of `map` and no other (a hot slot): the unit's
    /// aligned read, for an output cluster of `output_rows` rows with a page of slack (its
    /// rows need not start on a page). At least what the arena gives it
    /// ([`super::SlotArena::new`]).
    fn hot_slot_bytes(&self, map: &UnitMap, unit: u32, output_rows: u32) -> u64 {
        let page = SLOT_ALIGN as u64;
        let (layer, cluster) = map.layer_cluster(unit);
        if layer >= map.n_layer {
            let rows = output_rows.min(self.n_vocab.saturating_sub(cluster * output_rows));
            (u64::from(rows) * self.output_row_bytes).div_ceil(page) * page + page
        } else if cluster >= map.ffn_clusters {
            self.attention_unit_bytes.div_ceil(page) * page
        } else {
            self.layer_bundle_bytes
                .get(layer as usize)
                .map_or(self.bundle_stride, |&b| b.min(self.bundle_stride))
        }
    }
}

/// Splits `budget` bytes for a store `model` run with `n_ctx` tokens of context and prefill
/// steps of `prefill_tokens`: the fixed segment, then slots for the cache (hot segment as large
/// as possible, a cold segment of a few slots for the clusters that stream).
pub fn split_budget(
    model: &Model,
    budget: u64,
    n_ctx: u32,
    prefill_tokens: u32,
    policy: CachePolicy,
) -> Result<BudgetSplit, BudgetError> {
    split_sizes(
        &StoreSizes::of_store(model)?,
        budget,
        n_ctx,
        prefill_tokens,
        &CachePlan {
            policy,
            ..CachePlan::default()
        },
    )
}

/// [`split_budget`] from sizes alone. `shape` gives the cache's policy, pipeline depth, read
/// grouping and whether attention streams (its `slots` and `hot_slots` are ignored: they are
/// what the budget decides); the cold segment keeps `max_loads + 2` slots for the loads in
/// flight and the clusters being computed.
pub fn split_sizes(
    sizes: &StoreSizes,
    budget: u64,
    n_ctx: u32,
    prefill_tokens: u32,
    shape: &CachePlan,
) -> Result<BudgetSplit, BudgetError> {
    split_sizes_for(sizes, budget, n_ctx, 1, prefill_tokens, shape)
}

/// [`split_sizes`] for `sessions` sessions of `n_ctx` tokens each (continuous batching: a
/// server's slots): their KV caches, and the logits of a decode step of one token per
/// session, come out of the budget before the neuron cache gets the rest.
pub fn split_sizes_for(
    sizes: &StoreSizes,
    budget: u64,
    n_ctx: u32,
    sessions: u32,
    prefill_tokens: u32,
    shape: &CachePlan,
) -> Result<BudgetSplit, BudgetError> {
    let s = sizes;
    let sessions = sessions.max(1);
    let stream_attention = shape.stream_attention && s.attention_bytes > 0;
    let resident_weights = if stream_attention {
        s.resident_weights.saturating_sub(s.attention_bytes)
    } else {
        s.resident_weights
    };
    let ffn_bytes = s.bundle_stride * u64::from(s.bundles_per_layer) * u64::from(s.n_layer);
    let kv_cache =
        u64::from(s.n_layer) * 2 * u64::from(s.kv_dim) * u64::from(n_ctx) * 2 * u64::from(sessions);
    let (embd, ff) = (u64::from(s.n_embd), u64::from(s.n_ff));
    let per_token = 8 * embd + 2 * u64::from(s.q_dim) + 2 * u64::from(s.kv_dim) + 2 * ff;
    // f32 buffers, their copies per processor group and the GEMM's packed activations: about
    // 6 bytes per element per prefill token (measured: +3.3 MiB for 64-token steps on SmolLM2);
    // logits twice for one session, and a row more for each further session (a multi-sequence
    // step's logits).
    let scratch = u64::from(prefill_tokens) * per_token * 6
        + u64::from(s.n_vocab) * 4 * (u64::from(sessions) + 1);
    // Output clusters as large as a bundle's slot allows, alignment slack included.
    let output_rows = ((s.bundle_stride.saturating_sub(2 * SLOT_ALIGN as u64))
        / s.output_row_bytes.max(1))
    .clamp(1, u64::from(s.n_vocab)) as u32;
    // A slot holds the longest unit: a bundle, or an attention matrix when attention streams.
    let unit_bytes = if stream_attention {
        s.bundle_stride.max(s.attention_unit_bytes)
    } else {
        s.bundle_stride
    };
    let slot = unit_bytes + SLOT_ALIGN as u64;
    let attn_units = if stream_attention {
        super::ATTN_UNITS
    } else {
        0
    };
    let n_units = s.n_layer * (s.bundles_per_layer + attn_units) + s.n_vocab.div_ceil(output_rows);
    let runtime = runtime_overhead(s, n_units);
    let fixed = resident_weights + kv_cache + scratch + runtime;
    // Gate-first loading keeps a layer's bundles in their slots from its gate rows to its
    // neurons: the cold segment must hold a whole layer's.
    let min_slots = if shape.reads.gate_first() {
        u64::from(s.bundles_per_layer.max(1)) + 1
    } else {
        2
    };
    if budget < fixed + min_slots * slot {
        return Err(BudgetError::TooSmall {
            budget,
            fixed,
            weights: resident_weights,
            kv: kv_cache,
            scratch,
            runtime,
            slots: min_slots * slot,
            n_ctx,
            sessions,
        });
    }
    let cache = budget - fixed;
    let slots = ((cache / slot) as u32).min(n_units);
    let max_loads = shape.max_loads.max(1);
    // Enough cold slots for the loads in flight and the clusters being computed (under
    // gate-first loading, a whole layer's bundles besides).
    let cold = if shape.reads.gate_first() {
        s.bundles_per_layer + max_loads + 1
    } else {
        max_loads + 2
    };
    let cold = cold.min(slots.saturating_sub(1)).max(1);
    let (slots, hot_slots) = match shape.policy {
        CachePolicy::Segmented => {
            let map = UnitMap {
                n_layer: s.n_layer,
                ffn_clusters: s.bundles_per_layer,
                output_clusters: s.n_vocab.div_ceil(output_rows),
                attn_units,
            };
            pack_hot_slots(cache, slot, cold, shape, &map, |u| {
                s.hot_slot_bytes(&map, u, output_rows)
            })
        }
        CachePolicy::Lru if slots >= n_units => (slots, n_units),
        CachePolicy::Lru => (slots, slots - cold),
    };
    Ok(BudgetSplit {
        budget,
        resident_weights,
        kv_cache,
        sessions,
        n_ctx,
        scratch,
        runtime_overhead: runtime,
        cache,
        plan: CachePlan {
            slots,
            hot_slots,
            max_loads,
            coalesce: shape.coalesce.max(1),
            stream_attention,
            ..shape.clone()
        },
        ffn_bytes,
        output_rows,
    })
}

/// The segmented cache's `(slots, hot_slots)` in `cache` bytes: hot slots each as long as its
/// own unit (`unit_bytes`), taken in the [`hot_segment`]'s order while they fit beside `cold`
/// slots of `slot` bytes (any unit's). Every unit gets a hot slot when all of them fit; the
/// cold slots never outnumber the units left cold. Slots sized to their units hold more of
/// the model than slots of the longest unit's size where units differ (a Q4_K_M store's
/// bundles with Q4_K down columns are 13% shorter than those with Q6_K).
fn pack_hot_slots(
    cache: u64,
    slot: u64,
    cold: u32,
    shape: &CachePlan,
    map: &UnitMap,
    unit_bytes: impl Fn(u32) -> u64,
) -> (u32, u32) {
    let n_units = map.n_units();
    let every_unit = CachePlan {
        slots: n_units,
        hot_slots: n_units,
        policy: CachePolicy::Segmented,
        hot_units: shape.hot_units.clone(),
        ..CachePlan::default()
    };
    let order = hot_segment(&every_unit, map);
    if order.iter().map(|&u| unit_bytes(u)).sum::<u64>() <= cache {
        return (n_units, n_units);
    }
    let mut room = cache.saturating_sub(u64::from(cold) * slot);
    let mut hot = 0u32;
    for &u in &order {
        let Some(left) = room.checked_sub(unit_bytes(u)) else {
            break;
        };
        room = left;
        hot += 1;
    }
    let cold = cold.min(n_units - hot).max(1);
    (hot + cold, hot)
}

/// Fits `plan` to `budget` bytes for a store of `sizes` run with `n_ctx` tokens of context:
/// prefill steps of at most 64 tokens (their scratch counts against the budget; 16 when that
/// makes the budget fit), attention resident unless only streaming it fits,
/// the budget split by [`split_sizes`] with the plan's own cache section (if any) as the
/// cache's shape,
/// and the output projection streamed in clusters sized to a slot. What the engine does
/// under `--memory`, and what the simulator and the planner predict.
pub fn fit_plan_to_budget(
    sizes: &StoreSizes,
    plan: &mut crate::plan::ExecutionPlan,
    budget: u64,
    n_ctx: u32,
) -> Result<BudgetSplit, BudgetError> {
    fit_plan_to_budget_for(sizes, plan, budget, n_ctx, 1)
}

/// [`fit_plan_to_budget`] for `sessions` sessions of `n_ctx` tokens each, whose KV caches the
/// budget holds ([`split_sizes_for`]).
pub fn fit_plan_to_budget_for(
    sizes: &StoreSizes,
    plan: &mut crate::plan::ExecutionPlan,
    budget: u64,
    n_ctx: u32,
    sessions: u32,
) -> Result<BudgetSplit, BudgetError> {
    let shape = plan.cache.clone().unwrap_or_default();
    // The first that fits: attention resident (unless the plan streams it) before streamed,
    // since streaming it reads every layer's attention each token; within each, prefill steps
    // of up to 64 tokens, or else of 16 (less scratch, more slots for decode; shorter steps
    // cost prefill a little speed).
    let streamed = CachePlan {
        stream_attention: true,
        ..shape.clone()
    };
    let shapes = if shape.stream_attention || sizes.attention_bytes == 0 {
        vec![shape]
    } else {
        vec![shape, streamed]
    };
    let longest = plan.prefill_max_tokens.clamp(1, 64);
    let steps: &[u32] = if longest > 16 {
        &[longest, 16]
    } else {
        &[longest]
    };
    let mut last = None;
    'fit: for shape in &shapes {
        for &tokens in steps {
            let split = split_sizes_for(sizes, budget, n_ctx, sessions, tokens, shape);
            let fits = split.is_ok();
            last = Some((tokens, split));
            if fits {
                break 'fit;
            }
        }
    }
    let (tokens, split) = last.expect("at least one try");
    let split = split?;
    plan.prefill_max_tokens = tokens;
    plan.cache = Some(split.plan.clone());
    plan.decode.output_rows = split.output_rows;
    plan.prefill.output_rows = split.output_rows;
    Ok(split)
}
