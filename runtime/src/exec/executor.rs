//! The executor: computes the clusters of a phase and finishes phases, on real data.
//!
//! Two kinds of state, so that several processor groups can compute parts of one phase at once:
//! - [`StepState`]: the step's inputs (residual stream, quantized activations, q/k/v, …). Read
//!   by every group while a phase computes; written only when a phase finishes.
//! - [`GroupOutput`]: one per processor group. A group writes the blocks of its clusters there.
//!
//! Every cluster's output is one contiguous block, at the same offset whichever group computes
//! it:
//! - `QkvHeads`: `[head][token][head_dim]` — query heads, then key heads, then value heads;
//! - `AttnHeads`: `[query head][token][head_dim]`;
//! - row phases: cluster `c` owning rows `a..b` writes `[token][b - a]` at offset
//!   `n_tokens * a`; FFN neuron clusters write partial down projections `[token][n_embd]` at
//!   offset `c * n_tokens * n_embd`.
//!
//! Finishing a phase first collects each group's part (a swap when one group did it all), then
//! gathers or reduces the blocks in cluster order and prepares the next phase's input once for
//! all clusters. Which group computed a cluster therefore never changes a bit of the result.

use super::{ClusterRunner, DenseBackend};
use crate::model::attention::{attend_tiled, attend_vec, AttnScratch, TILED_MIN_QUERIES};
use crate::model::ops::{gated_activation, rms_norm, RopeTable};
use crate::model::{moe, KvCache, Model, ModelError, TensorRef};
use crate::neuron::Phase;
use crate::quant::{activation_type, GgmlType, Kernels, MatRef};
use crate::schedule::{Activity, Awaited, ClusterWork, Program, StepRequest, StepShape, XpuId};
use crate::sparse::predictor::PredictorScratch;
use crate::sparse::{SparseFfn, SparsityMode};
use crate::store::DownLayout;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// One FFN cluster's weights: gate and up rows of its neurons, and its share of the down
/// projection.
struct FfnCluster<'a> {
    gate: MatRef<'a>,
    up: MatRef<'a>,
    down: DownPart<'a>,
}

/// A cluster's share of the down projection.
enum DownPart<'a> {
    /// `n_embd` rows whose columns `cols` are the cluster's neurons: a block-column of its own
    /// (`cols` = all), or the file's whole matrix.
    Columns { mat: MatRef<'a>, cols: Range<usize> },
    /// `m` rows of `n_embd`: row `j` is neuron `j`'s down column (a store's neuron columns).
    NeuronRows(MatRef<'a>),
}

impl FfnCluster<'_> {
    /// `out[t][..n_embd]` = the cluster's partial down projection for each of `n` tokens.
    /// `batched_down`: many tokens' down products of a block-column in one dense call (a
    /// store's bundles); otherwise one matvec per token.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        cx: Compute<'_>,
        acts: &Activations,
        activation: crate::model::FfnActivation,
        n: usize,
        s: &mut WorkerScratch,
        out: &mut [f32],
        batched_down: bool,
        expert: Option<ExpertScale<'_>>,
    ) {
        let m = self.gate.rows;
        s.gate.resize(n * m, 0.0);
        s.up.resize(n * m, 0.0);
        cx.project(self.gate, acts.get(self.gate.ty), n, &mut s.gate, m);
        cx.project(self.up, acts.get(self.up.ty), n, &mut s.up, m);
        gated_activation(activation, &mut s.gate, &s.up);
        // An expert's neurons carry its router weight: scaling h before the (linear) down
        // projection is llama.cpp's scaling of the expert's output.
        if let Some(expert) = expert {
            for (t, h) in s.gate.chunks_exact_mut(m).enumerate() {
                let w = expert.weight(t);
                h.iter_mut().for_each(|v| *v *= w);
            }
        }
        let (down, cols) = match &self.down {
            DownPart::Columns { mat, cols } => (*mat, cols.clone()),
            DownPart::NeuronRows(rows) => {
                // Each token's output is the sum of its neurons' columns weighted by their
                // activations, in neuron order.
                let embd = rows.cols;
                s.picks.clear();
                s.picks.extend(0..m as u32);
                for t in 0..n {
                    cx.kernels.axpy_rows(
                        *rows,
                        &s.picks,
                        &s.gate[t * m..(t + 1) * m],
                        &mut out[t * embd..(t + 1) * embd],
                    );
                }
                return;
            }
        };
        let embd = down.rows;
        let h_bytes = activation_type(down.ty)
            .bytes_for(m as u64)
            .expect("cluster of whole blocks") as usize;
        if batched_down {
            s.h_act.resize(n * h_bytes, 0);
            for t in 0..n {
                cx.kernels.quantize_activations(
                    down.ty,
                    &s.gate[t * m..(t + 1) * m],
                    &mut s.h_act[t * h_bytes..(t + 1) * h_bytes],
                );
            }
            cx.project(down, &s.h_act, n, out, embd);
            return;
        }
        s.h_act.resize(h_bytes, 0);
        for t in 0..n {
            cx.kernels
                .quantize_activations(down.ty, &s.gate[t * m..(t + 1) * m], &mut s.h_act);
            cx.kernels.matvec(
                down,
                cols.clone(),
                &s.h_act,
                &mut out[t * embd..(t + 1) * embd],
            );
        }
    }
}

/// The router weights of one expert for a step's tokens.
#[derive(Clone, Copy)]
struct ExpertScale<'a> {
    /// `[token][n_expert]`.
    weights: &'a [f32],
    n_expert: usize,
    expert: usize,
}

impl ExpertScale<'_> {
    fn weight(&self, token: usize) -> f32 {
        self.weights[token * self.n_expert + self.expert]
    }
}

/// A step's mixture-of-experts routing for the current layer, and prefill's weighted FFN
/// activations quantized expert by expert.
#[derive(Default)]
struct MoeState {
    /// `[token][n_expert]`: each token's weight per expert, 0 where the router did not choose it.
    weights: Vec<f32>,
    /// Whether any token of the step chose each expert: the others' clusters are skipped.
    used: Vec<bool>,
    probs: Vec<f32>,
    chosen: Vec<u32>,
    /// Prefill: `[expert][token][bytes]`, h of each expert's neurons quantized for the down
    /// projection (only for used experts); `act_row` bytes per token.
    acts: Vec<u8>,
    act_row: usize,
}

impl MoeState {
    /// The expert owning FFN neurons `neurons` (a cluster, which never mixes experts) and its
    /// weights, when the model is a mixture; `Err(())` when no token chose that expert.
    fn expert_of(
        &self,
        model: &Model,
        neurons: &Range<usize>,
    ) -> Result<Option<ExpertScale<'_>>, ()> {
        let c = &model.config;
        if !c.is_moe() {
            return Ok(None);
        }
        let expert = neurons.start / c.ffn_per_expert() as usize;
        if !self.used.get(expert).copied().unwrap_or(false) {
            return Err(());
        }
        Ok(Some(ExpertScale {
            weights: &self.weights,
            n_expert: c.n_expert as usize,
            expert,
        }))
    }
}

/// Where sparse decode finds a cluster's down columns.
enum SparseDown<'a> {
    /// Neuron rows only (a store's neuron columns).
    Rows(MatRef<'a>),
    /// A block-column (`cols` of `mat`), and neuron rows too when the layer's down projection
    /// was transposed.
    Columns {
        mat: MatRef<'a>,
        cols: Range<usize>,
        rows: Option<MatRef<'a>>,
    },
}

/// Sparse decode of FFN neurons `neurons` (one cluster, weights `ffn`) of layer `l` for `n`
/// tokens: gate rows (all of the cluster, or only those the predictor named), the threshold on
/// the score, then up rows of the active neurons, and their down columns: an axpy over the
/// neurons' down columns (a store's neuron columns, or rows of the layer's transposed down
/// projection) when few fire or no block-column exists, the cluster's down block-column times
/// the sparse activations otherwise. `out[t][..n_embd]` is the partial down projection. Which
/// path runs depends on the data only, never on threads or timing.
#[allow(clippy::too_many_arguments)]
fn sparse_ffn_cluster(
    cx: Compute<'_>,
    sparse: &SparseFfn,
    l: usize,
    neurons: Range<usize>,
    ffn: &FfnCluster<'_>,
    acts: &Activations,
    predicted: Option<&[u64]>,
    gated: Option<&[f32]>,
    rows_only: bool,
    n: usize,
    s: &mut WorkerScratch,
    out: &mut [f32],
) {
    let layer = &sparse.layers[l];
    let m = neurons.len();
    let (gate, up) = (ffn.gate, ffn.up);
    let gate_all = acts.get(gate.ty);
    let up_all = acts.get(up.ty);
    let (gate_row, up_row) = (gate_all.len() / n, up_all.len() / n);
    // Where the active neurons' down columns come from: row `j` is neuron `neurons.start + j`.
    let down = match &ffn.down {
        DownPart::NeuronRows(rows) => SparseDown::Rows(*rows),
        DownPart::Columns { mat, cols } => SparseDown::Columns {
            mat: *mat,
            cols: cols.clone(),
            rows: layer.down_t.as_deref().map(|data| {
                let row = data.len() / layer.importance.len().max(1);
                MatRef {
                    ty: sparse.down_type,
                    data: &data[neurons.start * row..neurons.end * row],
                    rows: m,
                    cols: mat.rows,
                }
            }),
        },
    };
    let embd = match &down {
        SparseDown::Rows(rows) => rows.cols,
        SparseDown::Columns { mat, .. } => mat.rows,
    };
    let words = layer.importance.len().div_ceil(64);
    let mut gate_rows = 0u64;
    s.gate.resize(m, 0.0);
    for t in 0..n {
        let act_gate = &gate_all[t * gate_row..(t + 1) * gate_row];
        let act_up = &up_all[t * up_row..(t + 1) * up_row];
        s.neurons.clear();
        s.coefs.clear();
        let consider = |s: &mut WorkerScratch, j: usize, g: f32| {
            let a = sparse.activate(g);
            if a.abs() * layer.importance[neurons.start + j] > layer.threshold {
                s.neurons.push(j as u32);
                s.coefs.push(a);
            }
        };
        match (predicted, gated) {
            // Gate-first loading: the `FfnGateRows` phase computed these rows with the same
            // kernel call (the same bits).
            (None, Some(gated)) => {
                let ff = gated.len() / n;
                s.gate
                    .copy_from_slice(&gated[t * ff + neurons.start..t * ff + neurons.end]);
                for j in 0..m {
                    let g = s.gate[j];
                    consider(s, j, g);
                }
            }
            (None, None) => {
                gate_row_values(cx.kernels, gate, act_gate, &mut s.gate);
                gate_rows += m as u64;
                for j in 0..m {
                    let g = s.gate[j];
                    consider(s, j, g);
                }
            }
            (Some(bits), _) => {
                let bits = &bits[t * words..(t + 1) * words];
                s.picks.clear();
                s.picks.extend((0..m as u32).filter(|&j| {
                    let i = neurons.start + j as usize;
                    bits[i / 64] >> (i % 64) & 1 == 1
                }));
                gate_rows += s.picks.len() as u64;
                s.picked.resize(s.picks.len(), 0.0);
                cx.kernels
                    .matvec_rows(gate, &s.picks, act_gate, &mut s.picked);
                for k in 0..s.picks.len() {
                    let (j, g) = (s.picks[k] as usize, s.picked[k]);
                    consider(s, j, g);
                }
            }
        }
        if s.neurons.len() * 2 > m && !rows_only {
            // Most fire: the multi-row kernel over the whole cluster costs less than a dot
            // product per active row (each the same bits as the row's own dot product). Not
            // where only the predicted neurons' rows were read (`rows_only`).
            s.up.resize(m, 0.0);
            cx.kernels.matvec(up, 0..up.cols, act_up, &mut s.up);
            for (k, &j) in s.neurons.iter().enumerate() {
                s.coefs[k] *= s.up[j as usize];
            }
        } else {
            s.picked.resize(s.neurons.len(), 0.0);
            cx.kernels
                .matvec_rows(up, &s.neurons, act_up, &mut s.picked);
            for (c, &u) in s.coefs.iter_mut().zip(&s.picked) {
                *c *= u;
            }
        }
        sparse
            .stats
            .active
            .fetch_add(s.neurons.len() as u64, Ordering::Relaxed);
        let out = &mut out[t * embd..(t + 1) * embd];
        let few = s.neurons.len() * 5 < m * 2;
        match &down {
            // No block-column, or few active: axpy over their down columns.
            SparseDown::Rows(rows) => cx.kernels.axpy_rows(*rows, &s.neurons, &s.coefs, out),
            SparseDown::Columns {
                rows: Some(rows), ..
            } if few => cx.kernels.axpy_rows(*rows, &s.neurons, &s.coefs, out),
            // Many: the cluster's down block-column times the activations with zeros where
            // neurons did not fire (the dense kernel beats an axpy per neuron here).
            SparseDown::Columns { mat, cols, .. } => {
                s.gate.iter_mut().for_each(|h| *h = 0.0);
                for (&j, &c) in s.neurons.iter().zip(&s.coefs) {
                    s.gate[j as usize] = c;
                }
                let h_bytes = activation_type(mat.ty)
                    .bytes_for(m as u64)
                    .expect("cluster of whole blocks") as usize;
                s.h_act.resize(h_bytes, 0);
                cx.kernels
                    .quantize_activations(mat.ty, &s.gate, &mut s.h_act);
                cx.kernels.matvec(*mat, cols.clone(), &s.h_act, out);
            }
        }
    }
    sparse
        .stats
        .gate_rows
        .fetch_add(gate_rows, Ordering::Relaxed);
}

/// One token's gate values of a cluster's rows: the one kernel call that both sparse decode and
/// gate-first loading's `FfnGateRows` make, so both give the same bits.
fn gate_row_values(kernels: &Kernels, gate: MatRef<'_>, act: &[u8], out: &mut [f32]) {
    kernels.matvec(gate, 0..gate.cols, act, out);
}

/// Temporary vectors of one worker, reused across clusters so the hot path does not allocate.
#[derive(Default)]
struct WorkerScratch {
    attn: AttnScratch,
    gate: Vec<f32>,
    up: Vec<f32>,
    h_act: Vec<u8>,
    /// Sparse decode: the cluster's active neurons and their coefficients act(gate) · up.
    neurons: Vec<u32>,
    coefs: Vec<f32>,
    /// Sparse decode: rows of the cluster picked for a product, and their dot products.
    picks: Vec<u32>,
    picked: Vec<f32>,
}

/// A phase's input rows, quantized once into each activation format its weights need.
#[derive(Default)]
struct Activations {
    n_cols: usize,
    used: usize,
    sets: Vec<(GgmlType, Vec<u8>)>,
}

impl Activations {
    fn prepare(&mut self, kernels: &Kernels, src: &[f32], n_cols: usize, weights: &[GgmlType]) {
        let n_rows = src.len() / n_cols;
        self.n_cols = n_cols;
        self.used = 0;
        for &w in weights {
            let at = activation_type(w);
            if self.sets[..self.used].iter().any(|(t, _)| *t == at) {
                continue;
            }
            if self.used == self.sets.len() {
                self.sets.push((at, Vec::new()));
            }
            let (t, buf) = &mut self.sets[self.used];
            *t = at;
            let row_bytes = at.bytes_for(n_cols as u64).expect("row of whole blocks") as usize;
            buf.resize(n_rows * row_bytes, 0);
            for (src_row, dst_row) in src
                .chunks_exact(n_cols)
                .zip(buf.chunks_exact_mut(row_bytes))
            {
                kernels.quantize_activations(w, src_row, dst_row);
            }
            self.used += 1;
        }
    }

    /// The input quantized for weights of type `w`.
    fn get(&self, w: GgmlType) -> &[u8] {
        let at = activation_type(w);
        let (_, buf) = self.sets[..self.used]
            .iter()
            .find(|(t, _)| *t == at)
            .expect("activations prepared for every weight type of the phase");
        buf
    }
}

/// The kernels and the dense backend a group computes with.
#[derive(Clone, Copy)]
struct Compute<'a> {
    kernels: &'a Kernels,
    dense: &'a dyn DenseBackend,
}

impl Compute<'_> {
    /// `out[t * stride + r] = w_r · act_t` for the rows of `w` and `n` activation rows: a
    /// matvec for one token, the dense backend for many.
    fn project(self, w: MatRef<'_>, act: &[u8], n: usize, out: &mut [f32], stride: usize) {
        if n == 1 {
            let rows = w.rows;
            self.kernels.matvec(w, 0..w.cols, act, &mut out[..rows]);
        } else {
            self.dense.matmul(self.kernels, w, act, n, out, stride);
        }
    }
}

/// The output blocks of a row phase: cluster `c` owning rows `a..b` writes `[token][b - a]` at
/// offset `n * a` of `blocks`, which holds `[cluster][token][rows]` for all `total_rows`.
fn row_blocks<'a>(
    blocks: &'a mut Vec<f32>,
    clusters: &[Range<u32>],
    n: usize,
    total_rows: usize,
) -> Blocks<'a> {
    grow(blocks, n * total_rows);
    let first = clusters.first().map_or(0, |r| r.start as usize);
    let len: usize = clusters.iter().map(|r| r.len()).sum();
    split_blocks(
        &mut blocks[n * first..n * (first + len)],
        clusters.iter().map(|r| n * r.len()),
    )
}

/// Makes `buf` hold at least `len` values. Buffers never shrink: phases of different sizes
/// follow each other, and re-zeroing on every regrowth would cost more than the memory.
fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// Splits `buf` into consecutive blocks of the given lengths.
fn split_blocks(mut buf: &mut [f32], lens: impl Iterator<Item = usize>) -> Blocks<'_> {
    let mut out = Blocks::Inline(0, Default::default());
    for len in lens {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(len);
        out.push(head);
        buf = tail;
    }
    out
}

/// Blocks a computation writes, one per cluster it was sent. A message under a memory budget
/// carries one cluster (the one whose bytes just landed), so a few blocks are kept inline: the
/// decode hot path allocates nothing for them.
enum Blocks<'a> {
    Inline(usize, [&'a mut [f32]; INLINE_BLOCKS]),
    Heap(Vec<&'a mut [f32]>),
}

const INLINE_BLOCKS: usize = 8;

impl<'a> Blocks<'a> {
    fn push(&mut self, block: &'a mut [f32]) {
        match self {
            Blocks::Inline(n, blocks) if *n < INLINE_BLOCKS => {
                blocks[*n] = block;
                *n += 1;
            }
            Blocks::Inline(n, blocks) => {
                let mut heap: Vec<&'a mut [f32]> = Vec::with_capacity(2 * INLINE_BLOCKS);
                heap.extend(blocks[..*n].iter_mut().map(std::mem::take));
                heap.push(block);
                *self = Blocks::Heap(heap);
            }
            Blocks::Heap(heap) => heap.push(block),
        }
    }
}

impl<'a> std::ops::Deref for Blocks<'a> {
    type Target = [&'a mut [f32]];
    fn deref(&self) -> &Self::Target {
        match self {
            Blocks::Inline(n, blocks) => &blocks[..*n],
            Blocks::Heap(heap) => heap,
        }
    }
}

impl std::ops::DerefMut for Blocks<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Blocks::Inline(n, blocks) => &mut blocks[..*n],
            Blocks::Heap(heap) => heap,
        }
    }
}

/// Whether any of `n` tokens' predictions (`[token][words]` bits) names a neuron of `neurons`.
fn any_predicted(bits: &[u64], words: usize, n: usize, neurons: &Range<usize>) -> bool {
    (0..n).any(|t| {
        let bits = &bits[t * words..(t + 1) * words];
        neurons.clone().any(|i| bits[i / 64] >> (i % 64) & 1 == 1)
    })
}

fn units(r: &Range<u32>) -> Range<usize> {
    r.start as usize..r.end as usize
}

#[derive(Clone, Copy)]
enum Tensor {
    X,
    Normed,
    Gathered,
    Delta,
}

/// The blocks one processor group computed for the current phase, and its workers' scratch.
#[derive(Default)]
pub struct GroupOutput {
    buf: Vec<f32>,
    scratch: Vec<Mutex<WorkerScratch>>,
}

/// The inputs of a step's phases. One per driver; the model, KV cache and cluster layout are
/// passed in, so it serves any session.
pub struct StepState {
    kernels: Kernels,
    request: StepRequest,
    /// Residual stream `[token][n_embd]`.
    x: Vec<f32>,
    normed: Vec<f32>,
    acts: Activations,
    rope: RopeTable,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    gathered: Vec<f32>,
    blocks: Vec<f32>,
    delta: Vec<f32>,
    logits: Vec<f32>,
    probe: Option<Probe>,
    /// The neuron cache's slots, when a store's FFN is read through it.
    cache: Option<std::sync::Arc<crate::cache::SlotArena>>,
    /// Sparse decode with predictors: the predicted neurons of the current layer,
    /// `[token][n_ff bits]`, and the predictor's scratch.
    predicted: Vec<u64>,
    predictor_scratch: PredictorScratch,
    moe: MoeState,
    /// The current layer's FFN clusters the step needs (bit per cluster, [`Self::ffn_needed`]),
    /// set after its attention: the FFN finish sums only their partial outputs, as the
    /// scheduler may leave the others unsent.
    needed: Vec<u64>,
    /// Gate-first loading: the current layer's gate values `[token][n_ff]` (from
    /// `FfnGateRows`) and the neurons whose gate fires, token by token.
    gated: Vec<f32>,
    gated_activity: Activity,
    /// Decode with predictors reads only the predicted neurons' pages (gate-first loading with
    /// predictors): [`Self::ffn_pages`] names them after each layer's attention.
    page_reads: bool,
}

/// Receives intermediate tensors by llama.cpp's names (`attn_norm-3`, `ffn_out-3`, `l_out-3`,
/// `result_norm` …) as `[token][width]` rows: for comparing a forward pass with llama.cpp's
/// eval callback. Costs nothing when unset.
pub type Probe = Box<dyn FnMut(&str, &[f32], usize) + Send + Sync>;

impl StepState {
    pub fn new(kernels: Kernels) -> StepState {
        StepState {
            kernels,
            request: StepRequest {
                step: 0,
                n_tokens: 0,
                n_past: 0,
                logits_from: 0,
            },
            x: Vec::new(),
            normed: Vec::new(),
            acts: Activations::default(),
            rope: RopeTable::default(),
            qkv: Vec::new(),
            attn: Vec::new(),
            gathered: Vec::new(),
            blocks: Vec::new(),
            delta: Vec::new(),
            logits: Vec::new(),
            probe: None,
            cache: None,
            predicted: Vec::new(),
            predictor_scratch: PredictorScratch::default(),
            moe: MoeState::default(),
            needed: Vec::new(),
            gated: Vec::new(),
            gated_activity: Activity::default(),
            page_reads: false,
        }
    }

    /// Reads a store's FFN clusters from these cache slots (instead of the file in memory).
    pub fn set_cache(&mut self, cache: Option<std::sync::Arc<crate::cache::SlotArena>>) {
        self.cache = cache;
    }

    /// Decode with predictors reads only the predicted neurons' pages
    /// ([`crate::schedule::ReadPolicy::PredictedPages`]).
    pub fn set_page_reads(&mut self, on: bool) {
        self.page_reads = on;
    }

    /// Installs (or removes) a [`Probe`].
    pub fn set_probe(&mut self, probe: Option<Probe>) {
        self.probe = probe;
    }

    fn emit(&mut self, name: impl FnOnce() -> String, which: Tensor, width: usize) {
        if let Some(probe) = self.probe.as_mut() {
            let data = match which {
                Tensor::X => &self.x,
                Tensor::Normed => &self.normed,
                Tensor::Gathered => &self.gathered,
                Tensor::Delta => &self.delta,
            };
            probe(&name(), data, width);
        }
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// The step being computed.
    pub fn request(&self) -> &StepRequest {
        &self.request
    }

    /// Logits of the step's tokens from `logits_from` on, `[token][n_vocab]`.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Moves the logits out (leaving `buf`'s old contents in their place): lets a driver hand
    /// them over without copying.
    pub fn swap_logits(&mut self, buf: &mut Vec<f32>) {
        std::mem::swap(&mut self.logits, buf);
    }

    /// Embeds the step's tokens and prepares the first phase's input.
    pub fn begin_step(
        &mut self,
        model: &Model,
        request: &StepRequest,
        tokens: &[u32],
    ) -> Result<(), ModelError> {
        let c = &model.config;
        let embd = c.n_embd as usize;
        debug_assert_eq!(tokens.len(), request.n_tokens as usize);
        self.request = request.clone();
        self.x.resize(tokens.len() * embd, 0.0);
        for (t, &token) in tokens.iter().enumerate() {
            model.embed(token, &mut self.x[t * embd..(t + 1) * embd])?;
        }
        self.rope.fill(
            &c.rope,
            model.rope_freq_factors.as_deref(),
            request.n_past,
            tokens.len(),
        );
        self.logits.clear();
        self.emit(|| "embd".into(), Tensor::X, embd);
        self.prepare_attention(model, 0);
        Ok(())
    }

    /// Computes the clusters of one `Compute` command into `out`: `runner` spreads them over
    /// the group's workers, `dense` multiplies many tokens at once (prefill).
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        model: &Model,
        kv: &KvCache,
        program: &Program,
        work: &ClusterWork,
        runner: &dyn ClusterRunner,
        dense: &dyn DenseBackend,
        out: &mut GroupOutput,
    ) {
        while out.scratch.len() < runner.workers() {
            out.scratch.push(Mutex::default());
        }
        let clusters = &program.clusters(work.phase)[units(&work.clusters)];
        let c = &model.config;
        let n = self.request.n_tokens as usize;
        let hd = c.head_dim as usize;
        let embd = c.n_embd as usize;
        let n_past = self.request.n_past as usize;
        let layer = model.layers.get(work.layer as usize);
        let GroupOutput { buf, scratch } = out;
        let scratch = &*scratch;
        let StepState {
            kernels,
            acts,
            rope,
            qkv,
            ..
        } = self;
        let cx = Compute { kernels, dense };
        match work.phase {
            Phase::QkvHeads => {
                let l = layer.expect("attention phases belong to a layer");
                let (n_head, n_kv) = (c.n_head as usize, c.n_head_kv as usize);
                grow(buf, (n_head + 2 * n_kv) * n * hd);
                let first = clusters.first().map_or(0, |r| r.start as usize);
                let len: usize = clusters.iter().map(|r| r.len()).sum();
                let mut outs = split_blocks(
                    &mut buf[first * n * hd..(first + len) * n * hd],
                    clusters.iter().map(|r| r.len() * n * hd),
                );
                // Streamed attention: cluster `c` is matrix `c` (q, k, v), in its cache slot.
                let streamed = self.cache.as_deref().filter(|a| a.streams(Phase::QkvHeads));
                let (first_cluster, layer_index) = (work.clusters.start, work.layer);
                runner.run(&mut outs, &|_, i, out| {
                    let slot = streamed.map(|a| {
                        let c = a
                            .map()
                            .unit_cluster(Phase::QkvHeads, first_cluster + i as u32);
                        let slot = a.slot_of(layer_index, c).unwrap_or_else(|| {
                            panic!("attention unit {c} computed before it was loaded")
                        });
                        (a.read(slot), a.data_range(layer_index, c))
                    });
                    for (k, head) in units(&clusters[i]).enumerate() {
                        let dst = &mut out[k * n * hd..(k + 1) * n * hd];
                        let (w, bias, row0, rotate) = if head < n_head {
                            (&l.wq, &l.bq, head * hd, true)
                        } else if head < n_head + n_kv {
                            (&l.wk, &l.bk, (head - n_head) * hd, true)
                        } else {
                            (&l.wv, &l.bv, (head - n_head - n_kv) * hd, false)
                        };
                        let mat = match &slot {
                            Some((guard, data)) => {
                                let rb = w.row_bytes();
                                let at = data.start + row0 * rb;
                                MatRef {
                                    ty: w.ty,
                                    data: &guard.bytes()[at..at + hd * rb],
                                    rows: hd,
                                    cols: w.cols,
                                }
                            }
                            None => model.rows(w, row0..row0 + hd),
                        };
                        cx.project(mat, acts.get(w.ty), n, dst, hd);
                        for t in 0..n {
                            let v = &mut dst[t * hd..(t + 1) * hd];
                            if let Some(b) = bias {
                                v.iter_mut()
                                    .zip(&b[row0..row0 + hd])
                                    .for_each(|(x, b)| *x += b);
                            }
                            if rotate {
                                rope.apply(c.rope.style, t, v);
                            }
                        }
                    }
                });
            }
            Phase::AttnHeads => {
                let group = (c.n_head / c.n_head_kv) as usize;
                let scale = 1.0 / (hd as f32).sqrt();
                let layer_index = work.layer as usize;
                grow(buf, c.n_head as usize * n * hd);
                let first = clusters.first().map_or(0, |r| r.start as usize);
                let len: usize = clusters.iter().map(|r| r.len()).sum();
                let mut outs = split_blocks(
                    &mut buf[first * n * hd..(first + len) * n * hd],
                    clusters.iter().map(|r| r.len() * n * hd),
                );
                runner.run(&mut outs, &|worker, i, out| {
                    let mut s = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
                    for (k, head) in units(&clusters[i]).enumerate() {
                        let keys = kv.keys(layer_index, head / group);
                        let values = kv.values(layer_index, head / group);
                        for t in 0..n {
                            let q = &qkv[(head * n + t) * hd..(head * n + t + 1) * hd];
                            let o = &mut out[(k * n + t) * hd..(k * n + t + 1) * hd];
                            let n_kv = n_past + t + 1;
                            let attend = if n >= TILED_MIN_QUERIES {
                                attend_tiled
                            } else {
                                attend_vec
                            };
                            attend(kernels, q, keys, values, n_kv, scale, &mut s.attn, o);
                        }
                    }
                });
            }
            Phase::FfnDownRows if c.is_moe() => {
                // Each output row block sums every used expert's down block times that
                // expert's weighted h, experts in index order (a fixed order: the same bits
                // whichever thread computes the block).
                let l = layer.expect("layer");
                let moe = &self.moe;
                let row = moe.act_row;
                let mut outs = row_blocks(buf, clusters, n, embd);
                runner.run(&mut outs, &|worker, i, out| {
                    let mut s = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
                    let rows = units(&clusters[i]);
                    let m = rows.len();
                    out[..n * m].fill(0.0);
                    s.up.resize(n * m, 0.0);
                    for (e, _) in moe.used.iter().enumerate().filter(|(_, &u)| u) {
                        let first = e * embd;
                        let w = model.rows(&l.down, first + rows.start..first + rows.end);
                        let act = &moe.acts[e * n * row..(e + 1) * n * row];
                        cx.project(w, act, n, &mut s.up, m);
                        for (o, v) in out[..n * m].iter_mut().zip(&s.up[..n * m]) {
                            *o += v;
                        }
                    }
                });
            }
            Phase::AttnOutRows | Phase::FfnDownRows | Phase::OutputRows => {
                let w: &TensorRef = match work.phase {
                    Phase::AttnOutRows => &layer.expect("layer").wo,
                    Phase::FfnDownRows => &layer.expect("layer").down,
                    _ => &model.output,
                };
                let n = self.rows_in(work.phase);
                let mut outs = row_blocks(buf, clusters, n, w.rows);
                let act = acts.get(w.ty);
                // A streamed output projection or attention output: cluster `first + i` reads
                // its unit's cache slot.
                let streamed = self.cache.as_deref().filter(|a| {
                    matches!(work.phase, Phase::OutputRows | Phase::AttnOutRows)
                        && a.streams(work.phase)
                });
                let first = work.clusters.start;
                let layer_index = work.layer;
                runner.run(&mut outs, &|_, i, out| {
                    let rows = units(&clusters[i]);
                    let m = rows.len();
                    let Some(arena) = streamed else {
                        return cx.project(model.rows(w, rows), act, n, out, m);
                    };
                    let c = arena.map().unit_cluster(work.phase, first + i as u32);
                    let slot = arena.slot_of(layer_index, c).unwrap_or_else(|| {
                        panic!("{:?} cluster {c} computed before it was loaded", work.phase)
                    });
                    let guard = arena.read(slot);
                    let mat = MatRef {
                        ty: w.ty,
                        data: &guard.bytes()[arena.data_range(layer_index, c)],
                        rows: m,
                        cols: w.cols,
                    };
                    cx.project(mat, act, n, out, m);
                });
            }
            Phase::FfnGateUpRows => {
                let l = layer.expect("layer");
                let mut outs = row_blocks(buf, clusters, n, c.n_ff as usize);
                let moe = &self.moe;
                runner.run(&mut outs, &|worker, i, out| {
                    let mut s = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
                    let rows = units(&clusters[i]);
                    let m = rows.len();
                    // An expert no token chose: its h is weighted by 0 anyway.
                    if moe.expert_of(model, &rows).is_err() {
                        out[..n * m].fill(0.0);
                        return;
                    }
                    s.up.resize(n * m, 0.0);
                    cx.project(
                        model.rows(&l.gate, rows.clone()),
                        acts.get(l.gate.ty),
                        n,
                        out,
                        m,
                    );
                    cx.project(model.rows(&l.up, rows), acts.get(l.up.ty), n, &mut s.up, m);
                    gated_activation(c.activation, out, &s.up);
                });
            }
            Phase::FfnGateRows => {
                // Gate-first loading: each bundle's gate rows, from the first pages of its slot.
                let Some(store) = &model.store else {
                    panic!("gate-first loading needs a neuron store");
                };
                let mut outs = row_blocks(buf, clusters, n, c.n_ff as usize);
                let act = acts.get(store.layout.gate_ty);
                let row = act.len() / n.max(1);
                let (cache, first, layer_index) =
                    (self.cache.as_deref(), work.clusters.start, work.layer);
                let sparse = model.sparse.as_ref();
                runner.run(&mut outs, &|_, i, out| {
                    let bundle = first + i as u32;
                    let slot_guard;
                    let bytes: &[u8] = match cache {
                        Some(arena) => {
                            let slot = arena.slot_of(layer_index, bundle).unwrap_or_else(|| {
                                panic!("layer {layer_index} gate rows of cluster {bundle} computed before they were loaded")
                            });
                            slot_guard = arena.read(slot);
                            &slot_guard.bytes()[arena.data_range(layer_index, bundle)]
                        }
                        None => model.bundle_bytes(layer_index as usize, bundle),
                    };
                    let gate = store.layout.split(bundle, bytes).gate;
                    let m = gate.rows;
                    for t in 0..n {
                        let o = &mut out[t * m..(t + 1) * m];
                        gate_row_values(kernels, gate, &act[t * row..(t + 1) * row], o);
                    }
                    if let Some(sparse) = sparse {
                        sparse
                            .stats
                            .gate_rows
                            .fetch_add((n * m) as u64, Ordering::Relaxed);
                    }
                });
            }
            Phase::FfnNeurons => {
                let l = layer.expect("layer");
                let n_clusters = program.clusters(Phase::FfnNeurons).len();
                grow(buf, n_clusters * n * embd);
                let first = work.clusters.start as usize;
                let mut outs = split_blocks(
                    &mut buf[first * n * embd..(first + clusters.len()) * n * embd],
                    clusters.iter().map(|_| n * embd),
                );
                let layer_index = work.layer;
                let cache = self.cache.as_deref();
                let sparse = model
                    .sparse
                    .as_ref()
                    .filter(|_| program.shape == StepShape::Decode);
                if let Some(sparse) = sparse {
                    let neurons: usize = clusters.iter().map(|r| r.len()).sum();
                    sparse
                        .stats
                        .neurons
                        .fetch_add((n * neurons) as u64, Ordering::Relaxed);
                }
                let predicted = sparse
                    .filter(|sp| sp.mode == SparsityMode::Predictor)
                    .and_then(|_| self.predictions(program.shape));
                let gated = program.is_gate_first().then_some(self.gated.as_slice());
                let rows_only = self.page_reads && predicted.is_some();
                let moe = &self.moe;
                runner.run(&mut outs, &|worker, i, out| {
                    let mut guard = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
                    let s = &mut *guard;
                    let neurons = units(&clusters[i]);
                    // An expert no token chose adds nothing (and under a cache its bundles
                    // were never loaded: `ffn_needed` left them out).
                    let Ok(expert) = moe.expert_of(model, &neurons) else {
                        out[..n * embd].fill(0.0);
                        return;
                    };
                    // No token's prediction names a neuron of the cluster: it adds nothing
                    // (and under a cache it was never loaded).
                    if let Some(bits) = predicted {
                        let words = (c.n_ff as usize).div_ceil(64);
                        if !any_predicted(bits, words, n, &neurons) {
                            out[..n * embd].fill(0.0);
                            return;
                        }
                    }
                    // A store's cluster is bundle `first + i`: from its cache slot, or from
                    // the file in memory when the plan has no cache.
                    let slot_guard;
                    let ffn = match &model.store {
                        None => {
                            let (gate, up) = (
                                model.rows(&l.gate, neurons.clone()),
                                model.rows(&l.up, neurons.clone()),
                            );
                            // The cluster's own block-column when the down projection was
                            // re-laid per decode cluster; otherwise slices of the file's rows.
                            let down = match model.cluster_down(layer_index as usize, &neurons) {
                                Some(mat) => DownPart::Columns {
                                    mat,
                                    cols: 0..neurons.len(),
                                },
                                None => {
                                    let (mat, cols) =
                                        model.down_columns(layer_index as usize, neurons.clone());
                                    DownPart::Columns { mat, cols }
                                }
                            };
                            FfnCluster { gate, up, down }
                        }
                        Some(store) => {
                            let bundle = (first + i) as u32;
                            let bytes: &[u8] = match cache {
                                Some(arena) => {
                                    let slot =
                                        arena.slot_of(layer_index, bundle).unwrap_or_else(|| {
                                            panic!("layer {layer_index} cluster {bundle} computed before it was loaded")
                                        });
                                    slot_guard = arena.read(slot);
                                    &slot_guard.bytes()[arena.data_range(layer_index, bundle)]
                                }
                                None => model.bundle_bytes(layer_index as usize, bundle),
                            };
                            let b = store.layout.split(bundle, bytes);
                            let down = match b.down_layout {
                                DownLayout::NeuronColumns => DownPart::NeuronRows(b.down),
                                DownLayout::BlockColumns => DownPart::Columns {
                                    mat: b.down,
                                    cols: 0..b.down.cols,
                                },
                            };
                            FfnCluster {
                                gate: b.gate,
                                up: b.up,
                                down,
                            }
                        }
                    };
                    if let Some(sparse) = sparse {
                        let l = layer_index as usize;
                        return sparse_ffn_cluster(
                            cx, sparse, l, neurons, &ffn, acts, predicted, gated, rows_only, n,
                            s, out,
                        );
                    }
                    ffn.compute(
                        cx,
                        acts,
                        c.activation,
                        n,
                        s,
                        out,
                        model.store.is_some(),
                        expert,
                    );
                });
            }
        }
    }

    /// Token rows a phase computes: every token of the step, or for the output projection
    /// only those that want logits.
    fn rows_in(&self, phase: Phase) -> usize {
        let n = self.request.n_tokens as usize;
        if phase == Phase::OutputRows {
            n - self.request.logits_from as usize
        } else {
            n
        }
    }

    /// Gathers the parts of a finished phase from the groups that computed them into the
    /// phase's buffer (`qkv`, `attn` or `blocks`). A phase computed by one group is a swap.
    fn collect(
        &mut self,
        model: &Model,
        program: &Program,
        phase: Phase,
        outputs: &[Mutex<GroupOutput>],
    ) {
        let Some(layout) = program.phase(phase) else {
            return;
        };
        let lock = |xpu: XpuId| {
            outputs[usize::from(xpu.0)]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        let n = self.rows_in(phase);
        let target = match phase {
            Phase::QkvHeads => &mut self.qkv,
            Phase::AttnHeads => &mut self.attn,
            _ => &mut self.blocks,
        };
        if let [(xpu, _)] = layout.parts.as_slice() {
            std::mem::swap(target, &mut lock(*xpu).buf);
            return;
        }
        for (xpu, part) in &layout.parts {
            let span = part_span(model, program, phase, n, part);
            grow(target, span.end);
            target[span.clone()].copy_from_slice(&lock(*xpu).buf[span]);
        }
    }

    /// Collects the outputs of a finished phase from the groups that computed them (`outputs`
    /// indexed by `XpuId`), combines them in cluster order and prepares the next phase's input.
    pub fn finish_phase(
        &mut self,
        model: &Model,
        kv: &mut KvCache,
        program: &Program,
        layer: u32,
        phase: Phase,
        outputs: &[Mutex<GroupOutput>],
    ) {
        self.collect(model, program, phase, outputs);
        let c = &model.config;
        let n = self.request.n_tokens as usize;
        let hd = c.head_dim as usize;
        let embd = c.n_embd as usize;
        let l = layer as usize;
        let clusters = program.clusters(phase);
        match phase {
            Phase::QkvHeads => {
                let (n_head, n_kv) = (c.n_head as usize, c.n_head_kv as usize);
                let n_past = self.request.n_past as usize;
                if self.probe.is_some() {
                    // Token-major copies of q, k, v (after RoPE) for the probe only.
                    for (name, first, heads) in [
                        ("Qcur", 0, n_head),
                        ("Kcur", n_head, n_kv),
                        ("Vcur", n_head + n_kv, n_kv),
                    ] {
                        let w = heads * hd;
                        self.gathered.resize(n * w, 0.0);
                        for h in 0..heads {
                            for t in 0..n {
                                let src = ((first + h) * n + t) * hd;
                                self.gathered[t * w + h * hd..t * w + (h + 1) * hd]
                                    .copy_from_slice(&self.qkv[src..src + hd]);
                            }
                        }
                        self.emit(|| format!("{name}-{l}"), Tensor::Gathered, w);
                    }
                }
                for j in 0..n_kv {
                    let k = n_head + j;
                    let v = n_head + n_kv + j;
                    let kernels = &self.kernels;
                    kv.store(
                        kernels,
                        l,
                        j,
                        false,
                        n_past,
                        &self.qkv[k * n * hd..(k + 1) * n * hd],
                    );
                    kv.store(
                        kernels,
                        l,
                        j,
                        true,
                        n_past,
                        &self.qkv[v * n * hd..(v + 1) * n * hd],
                    );
                }
            }
            Phase::AttnHeads => {
                let q_dim = c.q_dim() as usize;
                self.gathered.resize(n * q_dim, 0.0);
                for h in 0..c.n_head as usize {
                    for t in 0..n {
                        self.gathered[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]
                            .copy_from_slice(&self.attn[(h * n + t) * hd..(h * n + t + 1) * hd]);
                    }
                }
                let wo = model.layers[l].wo.ty;
                self.acts
                    .prepare(&self.kernels, &self.gathered, q_dim, &[wo]);
                self.emit(|| format!("kqv_out-{l}"), Tensor::Gathered, q_dim);
            }
            Phase::AttnOutRows => {
                self.add_row_blocks(clusters, embd);
                self.emit(|| format!("attn_out-{l}"), Tensor::Delta, embd);
                self.emit(|| format!("ffn_inp-{l}"), Tensor::X, embd);
                self.prepare_ffn(model, l);
                if program.shape == StepShape::Decode {
                    self.predict_active(model, l);
                }
                let mut needed = std::mem::take(&mut self.needed);
                self.find_ffn_needed(model, program, &mut needed);
                self.needed = needed;
            }
            Phase::FfnNeurons => {
                self.delta.clear();
                self.delta.resize(n * embd, 0.0);
                let blocks = self.blocks[..clusters.len() * n * embd].chunks_exact(n * embd);
                for (i, partial) in blocks.enumerate() {
                    // A cluster no token needs adds nothing and may never have been computed.
                    if self
                        .needed
                        .get(i / 64)
                        .is_some_and(|w| w & (1 << (i % 64)) == 0)
                    {
                        continue;
                    }
                    for (d, p) in self.delta.iter_mut().zip(partial) {
                        *d += p;
                    }
                }
                for (x, d) in self.x.iter_mut().zip(&self.delta) {
                    *x += d;
                }
                self.emit(|| format!("ffn_out-{l}"), Tensor::Delta, embd);
                self.emit(|| format!("l_out-{l}"), Tensor::X, embd);
                self.prepare_next_layer(model, l);
            }
            Phase::FfnGateRows => {
                let ff = c.n_ff as usize;
                self.gated.resize(n * ff, 0.0);
                gather_row_blocks(&self.blocks, clusters, n, ff, &mut self.gated);
                self.find_gated_activity(model, program, l);
            }
            Phase::FfnGateUpRows => {
                let ff = c.n_ff as usize;
                self.gathered.resize(n * ff, 0.0);
                gather_row_blocks(&self.blocks, clusters, n, ff, &mut self.gathered);
                self.emit(|| format!("ffn_swiglu-{l}"), Tensor::Gathered, ff);
                let down = model.layers[l].down.ty;
                if c.is_moe() {
                    self.weigh_experts(model, down);
                } else {
                    self.acts
                        .prepare(&self.kernels, &self.gathered, ff, &[down]);
                }
            }
            Phase::FfnDownRows => {
                self.add_row_blocks(clusters, embd);
                self.emit(|| format!("ffn_out-{l}"), Tensor::Delta, embd);
                self.emit(|| format!("l_out-{l}"), Tensor::X, embd);
                self.prepare_next_layer(model, l);
            }
            Phase::OutputRows => {
                let vocab = c.n_vocab as usize;
                let n_out = n - self.request.logits_from as usize;
                self.logits.resize(n_out * vocab, 0.0);
                gather_row_blocks(&self.blocks, clusters, n_out, vocab, &mut self.logits);
            }
        }
    }

    /// `x[t][r] += block value` for row blocks `[cluster][token][rows]`.
    fn add_row_blocks(&mut self, clusters: &[Range<u32>], width: usize) {
        let n = self.request.n_tokens as usize;
        self.delta.resize(n * width, 0.0);
        gather_row_blocks(&self.blocks, clusters, n, width, &mut self.delta);
        for (x, d) in self.x.iter_mut().zip(&self.delta) {
            *x += d;
        }
    }

    fn norm_rows(&mut self, weight: &[f32], eps: f32, rows: Range<usize>, width: usize) {
        self.normed.resize(rows.len() * width, 0.0);
        for (i, t) in rows.enumerate() {
            rms_norm(
                &self.x[t * width..(t + 1) * width],
                weight,
                eps,
                &mut self.normed[i * width..(i + 1) * width],
            );
        }
    }

    fn prepare_attention(&mut self, model: &Model, l: usize) {
        let c = &model.config;
        let layer = &model.layers[l];
        let n = self.request.n_tokens as usize;
        self.norm_rows(&layer.attn_norm, c.rms_eps, 0..n, c.n_embd as usize);
        self.emit(
            || format!("attn_norm-{l}"),
            Tensor::Normed,
            c.n_embd as usize,
        );
        let types = [layer.wq.ty, layer.wk.ty, layer.wv.ty];
        self.acts
            .prepare(&self.kernels, &self.normed, c.n_embd as usize, &types);
    }

    fn prepare_ffn(&mut self, model: &Model, l: usize) {
        let c = &model.config;
        let layer = &model.layers[l];
        let n = self.request.n_tokens as usize;
        self.norm_rows(&layer.ffn_norm, c.rms_eps, 0..n, c.n_embd as usize);
        self.emit(
            || format!("ffn_norm-{l}"),
            Tensor::Normed,
            c.n_embd as usize,
        );
        let types = [layer.gate.ty, layer.up.ty];
        self.acts
            .prepare(&self.kernels, &self.normed, c.n_embd as usize, &types);
        if let Some(router) = &layer.router {
            self.route(model, router);
        }
    }

    /// Mixture of experts: each token's expert weights from the FFN input just normed.
    fn route(&mut self, model: &Model, router: &[f32]) {
        let c = &model.config;
        let (embd, n_expert) = (c.n_embd as usize, c.n_expert as usize);
        let n = self.request.n_tokens as usize;
        let moe = &mut self.moe;
        moe.weights.resize(n * n_expert, 0.0);
        moe.used.clear();
        moe.used.resize(n_expert, false);
        for t in 0..n {
            moe::route(
                router,
                &self.normed[t * embd..(t + 1) * embd],
                c.n_expert_used as usize,
                &mut moe.probs,
                &mut moe.chosen,
                &mut moe.weights[t * n_expert..(t + 1) * n_expert],
            );
            for &e in &moe.chosen {
                moe.used[e as usize] = true;
            }
        }
    }

    /// Prefill of a mixture of experts: weighs each token's h (`gathered`, `[token][n_ff]`)
    /// by its experts' router weights (0 for the others) and quantizes it expert by expert for
    /// the experts' down projections (blocks never cross experts, so these are the bytes a
    /// whole-row quantization would give).
    fn weigh_experts(&mut self, model: &Model, down: GgmlType) {
        let c = &model.config;
        let (ff, f, n_expert) = (
            c.n_ff as usize,
            c.ffn_per_expert() as usize,
            c.n_expert as usize,
        );
        let n = self.request.n_tokens as usize;
        let moe = &mut self.moe;
        for (t, h) in self.gathered.chunks_exact_mut(ff).take(n).enumerate() {
            for (e, h) in h.chunks_exact_mut(f).enumerate() {
                let w = moe.weights[t * n_expert + e];
                h.iter_mut().for_each(|v| *v *= w);
            }
        }
        let row = activation_type(down)
            .bytes_for(f as u64)
            .expect("an expert's down rows are whole blocks") as usize;
        moe.act_row = row;
        moe.acts.resize(n_expert * n * row, 0);
        for e in (0..n_expert).filter(|&e| moe.used[e]) {
            for t in 0..n {
                let at = (e * n + t) * row;
                self.kernels.quantize_activations(
                    down,
                    &self.gathered[t * ff + e * f..t * ff + (e + 1) * f],
                    &mut moe.acts[at..at + row],
                );
            }
        }
    }

    /// The FFN clusters (`program`'s) a step needs: those whose neurons a token's prediction
    /// names, or all of them where nothing was predicted (dense, threshold, prefill, a layer
    /// without a predictor); in a mixture of experts only clusters of experts some token chose.
    fn find_ffn_needed(&self, model: &Model, program: &Program, needed: &mut Vec<u64>) {
        let clusters = program.clusters(Phase::FfnNeurons);
        needed.clear();
        needed.resize(clusters.len().div_ceil(64), 0);
        let predicted = self.predictions(program.shape);
        let words = (model.config.n_ff as usize).div_ceil(64);
        let n = self.request.n_tokens as usize;
        for (c, r) in clusters.iter().enumerate() {
            let chosen = self.moe.expert_of(model, &units(r)).is_ok();
            if chosen && predicted.is_none_or(|bits| any_predicted(bits, words, n, &units(r))) {
                needed[c / 64] |= 1 << (c % 64);
            }
        }
    }

    /// The current layer's active FFN neurons, token by token, for the event the scheduler
    /// awaits after a finished phase ([`crate::schedule::owed_event`]): after a gate phase,
    /// the neurons whose gate fires; after attention, the neurons some prediction names in the
    /// experts some token chose (every neuron of a layer nothing selects).
    pub fn fill_activity(
        &self,
        model: &Model,
        program: &Program,
        awaited: Awaited,
        activity: &mut Activity,
    ) {
        if awaited == Awaited::GatedPages {
            activity.clone_from(&self.gated_activity);
            return;
        }
        let predicted = self.predictions(program.shape);
        if predicted.is_none() && !model.config.is_moe() {
            activity.set_all();
            return;
        }
        activity.clear();
        let clusters = program.clusters(Phase::FfnNeurons);
        let words = (model.config.n_ff as usize).div_ceil(64);
        for t in 0..self.request.n_tokens as usize {
            let picked = clusters
                .iter()
                .filter(|r| self.moe.expert_of(model, &units(r)).is_ok())
                .flat_map(|r| r.clone())
                .filter(|&i| {
                    let i = i as usize;
                    predicted.is_none_or(|bits| bits[t * words + i / 64] >> (i % 64) & 1 == 1)
                });
            activity.push_token(picked);
        }
    }

    /// After a layer's gate phase: which neurons fire for each token (the threshold of sparse
    /// decode, decided exactly as `sparse_ffn_cluster` decides it) and the clusters with any
    /// (`needed`). Without threshold sparsity every neuron fires.
    fn find_gated_activity(&mut self, model: &Model, program: &Program, l: usize) {
        let clusters = program.clusters(Phase::FfnNeurons);
        let n = self.request.n_tokens as usize;
        let ff = model.config.n_ff as usize;
        let threshold = model
            .sparse
            .as_ref()
            .filter(|s| s.mode == SparsityMode::Threshold && program.shape == StepShape::Decode);
        self.needed.clear();
        self.needed.resize(clusters.len().div_ceil(64), 0);
        let chosen = |r: &Range<u32>| self.moe.expert_of(model, &units(r)).is_ok();
        let Some(sparse) = threshold else {
            for (c, r) in clusters.iter().enumerate() {
                if chosen(r) {
                    self.needed[c / 64] |= 1 << (c % 64);
                }
            }
            self.gated_activity.set_all();
            return;
        };
        let layer = &sparse.layers[l];
        let mut activity = std::mem::take(&mut self.gated_activity);
        activity.clear();
        for t in 0..n {
            let gates = &self.gated[t * ff..(t + 1) * ff];
            for (c, r) in clusters.iter().enumerate().filter(|(_, r)| chosen(r)) {
                let mut any = false;
                for i in r.clone() {
                    let j = i as usize;
                    if sparse.activate(gates[j]).abs() * layer.importance[j] > layer.threshold {
                        activity.push(i);
                        any = true;
                    }
                }
                if any {
                    self.needed[c / 64] |= 1 << (c % 64);
                }
            }
            activity.end_token();
        }
        self.gated_activity = activity;
    }

    /// The current layer's predicted neurons `[token][n_ff bits]`, in decode steps with
    /// predictors.
    fn predictions(&self, shape: StepShape) -> Option<&[u64]> {
        (shape == StepShape::Decode && !self.predicted.is_empty())
            .then_some(self.predicted.as_slice())
    }

    /// Sparse decode with predictors: which neurons of layer `l` each token needs, from the
    /// FFN input just normed.
    fn predict_active(&mut self, model: &Model, l: usize) {
        self.predicted.clear();
        let Some(sparse) = model.sparse.as_ref() else {
            return;
        };
        if sparse.mode != SparsityMode::Predictor {
            return;
        }
        let Some(predictor) = sparse.layers[l].predictor.as_ref() else {
            return;
        };
        let embd = model.config.n_embd as usize;
        let words = (model.config.n_ff as usize).div_ceil(64);
        let n = self.request.n_tokens as usize;
        self.predicted.clear();
        self.predicted.resize(n * words, 0);
        let input = if sparse.predictor_sees_residual {
            &self.x
        } else {
            &self.normed
        };
        for t in 0..n {
            predictor.predict(
                &self.kernels,
                &input[t * embd..(t + 1) * embd],
                &mut self.predictor_scratch,
                &mut self.predicted[t * words..(t + 1) * words],
            );
        }
    }

    fn prepare_next_layer(&mut self, model: &Model, l: usize) {
        if l + 1 < model.layers.len() {
            self.prepare_attention(model, l + 1);
        } else if self.request.wants_logits() {
            let c = &model.config;
            let n = self.request.n_tokens as usize;
            let from = self.request.logits_from as usize;
            self.norm_rows(&model.output_norm, c.rms_eps, from..n, c.n_embd as usize);
            self.emit(|| "result_norm".into(), Tensor::Normed, c.n_embd as usize);
            self.acts.prepare(
                &self.kernels,
                &self.normed,
                c.n_embd as usize,
                &[model.output.ty],
            );
        }
    }
}

/// The span of a phase's output that clusters `part` (indices) occupy for `n` token rows, laid
/// out as in the module comment.
fn part_span(
    model: &Model,
    program: &Program,
    phase: Phase,
    n: usize,
    part: &Range<u32>,
) -> Range<usize> {
    let clusters = program.clusters(phase);
    let c = &model.config;
    let (first, last) = (
        &clusters[part.start as usize],
        &clusters[part.end as usize - 1],
    );
    match phase {
        Phase::QkvHeads | Phase::AttnHeads => {
            let per_head = n * c.head_dim as usize;
            first.start as usize * per_head..last.end as usize * per_head
        }
        Phase::FfnNeurons => {
            let per_cluster = n * c.n_embd as usize;
            part.start as usize * per_cluster..part.end as usize * per_cluster
        }
        _ => n * first.start as usize..n * last.end as usize,
    }
}

/// Gathers row blocks `[cluster][token][rows]` into `[token][width]`.
fn gather_row_blocks(
    blocks: &[f32],
    clusters: &[Range<u32>],
    n: usize,
    width: usize,
    out: &mut [f32],
) {
    for r in clusters {
        let rows = units(r);
        let m = rows.len();
        let block = &blocks[n * rows.start..n * rows.end];
        for t in 0..n {
            out[t * width + rows.start..t * width + rows.end]
                .copy_from_slice(&block[t * m..(t + 1) * m]);
        }
    }
}
