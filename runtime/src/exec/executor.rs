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
//!
//! This file holds the step's state and the dispatch of commands; the phases' work lives in
//! the sibling files: `attention.rs` (`QkvHeads`, `AttnHeads`), `rows.rs` (row phases:
//! attention output, prefill's dense FFN, output projection), `neurons.rs` (`FfnNeurons`),
//! `sparse_ffn.rs` (sparse decode, gate-first `FfnGateRows`), `selection.rs` (which FFN
//! clusters and pages a step needs), `experts.rs` (mixture-of-experts routing), `weights.rs`
//! (where a cluster's weights come from), `blocks.rs` (output blocks) and `compute.rs`
//! (quantized inputs, kernels, worker scratch).

use super::blocks::{gather_row_blocks, grow, part_span, units};
use super::compute::{Activations, Compute, Work, WorkerScratch};
use super::experts::MoeState;
use super::{ClusterRunner, DenseBackend};
use crate::model::ops::{rms_norm, RopeTable};
use crate::model::{KvCache, Model, ModelError};
use crate::neuron::Phase;
use crate::plan::FfnPlan;
use crate::quant::Kernels;
use crate::schedule::{Activity, ClusterWork, Program, StepId, StepRequest, StepShape, XpuId};
use crate::sparse::predictor::PredictorScratch;
use std::ops::Range;
use std::sync::Mutex;

#[derive(Clone, Copy)]
pub(super) enum Tensor {
    X,
    Normed,
    Gathered,
    Delta,
}

/// The blocks one processor group computed for the current phase, and its workers' scratch.
#[derive(Default)]
pub struct GroupOutput {
    pub(super) buf: Vec<f32>,
    pub(super) scratch: Vec<Mutex<WorkerScratch>>,
}

/// The inputs of a step's phases. One per driver; the model, KV cache and cluster layout are
/// passed in, so it serves any session.
pub struct StepState {
    pub(super) kernels: Kernels,
    pub(super) request: StepRequest,
    /// Position of each token of the step: `n_past + t` for one sequence, each sequence's own
    /// in a multi-sequence step.
    pub(super) positions: Vec<u32>,
    /// Residual stream `[token][n_embd]`.
    pub(super) x: Vec<f32>,
    pub(super) normed: Vec<f32>,
    pub(super) acts: Activations,
    pub(super) rope: RopeTable,
    /// RoPE of the sliding-window layers, when the model has some (their base differs).
    pub(super) rope_swa: RopeTable,
    pub(super) qkv: Vec<f32>,
    pub(super) attn: Vec<f32>,
    pub(super) gathered: Vec<f32>,
    pub(super) blocks: Vec<f32>,
    pub(super) delta: Vec<f32>,
    pub(super) logits: Vec<f32>,
    /// The observer of one evaluation ([`super::InlineDriver::eval_probed`]), there only
    /// while it runs: not a mode, the bits computed are the same with or without one.
    pub(super) probe: Option<Probe>,
    /// The neuron cache's slots, when a store's FFN is read through it.
    pub(super) cache: Option<std::sync::Arc<crate::cache::SlotArena>>,
    /// Sparse decode with predictors: the predicted neurons of the current layer,
    /// `[token][n_ff bits]`, and the predictor's scratch.
    pub(super) predicted: Vec<u64>,
    pub(super) predictor_scratch: PredictorScratch,
    pub(super) moe: MoeState,
    /// The current layer's FFN clusters the step needs (bit per cluster, [`Self::ffn_needed`]),
    /// set after its attention: the FFN finish sums only their partial outputs, as the
    /// scheduler may leave the others unsent.
    pub(super) needed: Vec<u64>,
    /// Gate-first loading: the current layer's gate values `[token][n_ff]` (from
    /// `FfnGateRows`) and the neurons whose gate fires, token by token.
    pub(super) gated: Vec<f32>,
    pub(super) gated_activity: Activity,
    /// How decode computes and reads the FFN (the scheduler's): which neurons, and whether a
    /// cluster's slot holds only the predicted neurons' pages (then up rows are computed one
    /// by one).
    pub(super) ffn: FfnPlan,
}

/// Receives intermediate tensors by llama.cpp's names (`attn_norm-3`, `ffn_out-3`, `l_out-3`,
/// `result_norm` …) as `[token][width]` rows: for comparing a forward pass with llama.cpp's
/// eval callback. Costs nothing when unset.
pub type Probe = Box<dyn FnMut(&str, &[f32], usize) + Send + Sync>;

impl StepState {
    /// A step state whose FFN clusters come from `cache`'s slots (a neuron store read through
    /// the neuron cache; `None`: from the model in memory), computed and read as `ffn` says.
    /// Fixed for the state's life: a driver builds it once, with its scheduler's FFN plan.
    pub fn reading(
        kernels: Kernels,
        cache: Option<std::sync::Arc<crate::cache::SlotArena>>,
        ffn: FfnPlan,
    ) -> StepState {
        StepState {
            kernels,
            request: StepRequest {
                step: 0,
                n_tokens: 0,
                n_past: 0,
                logits_from: 0,
                sequences: 1,
                resident_only: false,
            },
            positions: Vec::new(),
            x: Vec::new(),
            normed: Vec::new(),
            acts: Activations::default(),
            rope: RopeTable::default(),
            rope_swa: RopeTable::default(),
            qkv: Vec::new(),
            attn: Vec::new(),
            gathered: Vec::new(),
            blocks: Vec::new(),
            delta: Vec::new(),
            logits: Vec::new(),
            probe: None,
            cache,
            predicted: Vec::new(),
            predictor_scratch: PredictorScratch::default(),
            moe: MoeState::default(),
            needed: Vec::new(),
            gated: Vec::new(),
            gated_activity: Activity::default(),
            ffn,
        }
    }

    pub(super) fn emit(&mut self, name: impl FnOnce() -> String, which: Tensor, width: usize) {
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
    /// Forgets the step (its driver gave it up): work of it still on its way finds another
    /// step here and is skipped, until the next [`StepState::begin_step`].
    pub fn abandon_step(&mut self) {
        self.request.step = StepId::MAX;
    }

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

    /// Embeds the step's tokens and prepares the first phase's input. `n_ctx` is the session's
    /// context size (it picks a model's long-context RoPE factors).
    pub fn begin_step(
        &mut self,
        model: &Model,
        request: &StepRequest,
        tokens: &[u32],
        n_ctx: usize,
    ) -> Result<(), ModelError> {
        self.positions.clear();
        self.positions
            .extend((0..tokens.len() as u32).map(|t| request.n_past + t));
        self.begin(model, request, tokens, n_ctx)
    }

    /// [`StepState::begin_step`] for a multi-sequence step
    /// ([`StepRequest::sequences`]): token `t` is the next token of sequence `t`, at
    /// `positions[t]`; the step's KV caches are then one per sequence, in the same order.
    /// Every sequence's context is `n_ctx`.
    pub fn begin_multi_step(
        &mut self,
        model: &Model,
        request: &StepRequest,
        tokens: &[u32],
        positions: &[u32],
        n_ctx: usize,
    ) -> Result<(), ModelError> {
        debug_assert_eq!(tokens.len(), positions.len());
        debug_assert!(request.is_multi_sequence() || tokens.len() == 1);
        self.positions.clear();
        self.positions.extend_from_slice(positions);
        self.begin(model, request, tokens, n_ctx)
    }

    fn begin(
        &mut self,
        model: &Model,
        request: &StepRequest,
        tokens: &[u32],
        n_ctx: usize,
    ) -> Result<(), ModelError> {
        let c = model.config();
        let embd = c.n_embd as usize;
        debug_assert_eq!(tokens.len(), request.n_tokens as usize);
        self.request = request.clone();
        self.x.resize(tokens.len() * embd, 0.0);
        for (t, &token) in tokens.iter().enumerate() {
            let row = &mut self.x[t * embd..(t + 1) * embd];
            model.embed(token, row)?;
            if let Some(scale) = c.embd_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let factors = model.rope_factors(n_ctx);
        let positions = self.positions.iter().copied();
        self.rope
            .fill_positions(&c.rope, factors, positions.clone());
        if let Some(swa) = &c.sliding_window {
            self.rope_swa.fill_positions(&swa.rope, factors, positions);
        }
        self.logits.clear();
        self.emit(|| "embd".into(), Tensor::X, embd);
        self.prepare_attention(model, 0);
        Ok(())
    }

    /// Computes the clusters of one `Compute` command into `out`: `runner` spreads them over
    /// the group's workers, `dense` multiplies many tokens at once (prefill). `kv` holds the
    /// step's KV cache, or one per sequence of a multi-sequence step.
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        model: &Model,
        kv: &[KvCache],
        program: &Program,
        work: &ClusterWork,
        runner: &dyn ClusterRunner,
        dense: &dyn DenseBackend,
        out: &mut GroupOutput,
    ) {
        while out.scratch.len() < runner.workers() {
            out.scratch.push(Mutex::default());
        }
        let GroupOutput { buf, scratch } = out;
        let w = Work {
            model,
            program,
            work,
            clusters: &program.clusters(work.phase)[units(&work.clusters)],
            runner,
            cx: Compute {
                kernels: &self.kernels,
                dense,
            },
            scratch,
            n: self.request.n_tokens as usize,
        };
        match work.phase {
            Phase::QkvHeads => self.compute_qkv_heads(w, buf),
            Phase::AttnHeads => self.compute_attn_heads(w, kv, buf),
            Phase::FfnDownRows => self.compute_down_rows(w, buf),
            Phase::AttnOutRows | Phase::OutputRows => self.compute_rows(w, buf),
            Phase::FfnGateUpRows => self.compute_gate_up_rows(w, buf),
            Phase::FfnGateRows => self.compute_gate_rows(w, buf),
            Phase::FfnNeurons => self.compute_ffn_neurons(w, buf),
        }
    }

    /// Token rows a phase computes: every token of the step, or for the output projection
    /// only those that want logits.
    pub(super) fn rows_in(&self, phase: Phase) -> usize {
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
    /// `kv` as in [`StepState::compute`].
    pub fn finish_phase(
        &mut self,
        model: &Model,
        kv: &mut [KvCache],
        program: &Program,
        layer: u32,
        phase: Phase,
        outputs: &[Mutex<GroupOutput>],
    ) {
        self.collect(model, program, phase, outputs);
        let c = model.config();
        let n = self.request.n_tokens as usize;
        let embd = c.n_embd as usize;
        let l = layer as usize;
        let clusters = program.clusters(phase);
        match phase {
            Phase::QkvHeads => self.finish_qkv_heads(model, kv, l),
            Phase::AttnHeads => self.finish_attn_heads(model, l),
            Phase::AttnOutRows => {
                let post_norm = model.layers()[l].attn_post_norm.as_deref();
                self.add_row_blocks(clusters, embd, post_norm, c.rms_eps);
                self.emit(|| format!("attn_out-{l}"), Tensor::Delta, embd);
                self.emit(|| format!("ffn_inp-{l}"), Tensor::X, embd);
                self.prepare_ffn(model, l);
                if program.shape == StepShape::Decode {
                    self.predict_active(model, l);
                }
                let mut needed = std::mem::take(&mut self.needed);
                self.find_ffn_needed(model, program, &mut needed);
                self.leave_out_unresident(program, layer, &mut needed);
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
                let post_norm = model.layers()[l].ffn_post_norm.as_deref();
                self.add_delta(post_norm, c.rms_eps, embd);
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
                let down = model.layers()[l].down.ty;
                if c.is_moe() {
                    self.moe
                        .weigh(&self.kernels, model, down, &mut self.gathered, n);
                } else {
                    let sums = super::rows::down_sums(program, c);
                    let h = &self.gathered;
                    self.acts.prepare_ranges(&self.kernels, h, ff, down, &sums);
                }
            }
            Phase::FfnDownRows => {
                let post_norm = model.layers()[l].ffn_post_norm.as_deref();
                self.add_row_blocks(clusters, embd, post_norm, c.rms_eps);
                self.emit(|| format!("ffn_out-{l}"), Tensor::Delta, embd);
                self.emit(|| format!("l_out-{l}"), Tensor::X, embd);
                self.prepare_next_layer(model, l);
            }
            Phase::OutputRows => {
                let vocab = c.n_vocab as usize;
                let n_out = n - self.request.logits_from as usize;
                self.logits.resize(n_out * vocab, 0.0);
                gather_row_blocks(&self.blocks, clusters, n_out, vocab, &mut self.logits);
                if let Some(cap) = c.final_logit_softcap {
                    for v in &mut self.logits {
                        *v = (*v / cap).tanh() * cap;
                    }
                }
                // A head over part of the vocabulary (the plan's `output_vocab`): the tokens
                // it leaves out are never chosen (after the softcap, which would make minus
                // infinity -cap).
                let head = clusters.last().map_or(0, |r| r.end as usize);
                if head < vocab {
                    for row in self.logits.chunks_exact_mut(vocab) {
                        row[head..].fill(f32::NEG_INFINITY);
                    }
                }
                // A resident-only step's output rows left unread: their tokens cannot follow.
                let streamed = self.cache.as_deref().is_some_and(|a| a.streams(phase));
                if self.request.resident_only && streamed {
                    for (i, rows) in clusters.iter().enumerate() {
                        // (An output cluster is its unit.)
                        if self.left_out(c.n_layer, i as u32) {
                            for row in self.logits.chunks_exact_mut(vocab) {
                                row[units(rows)].fill(f32::NEG_INFINITY);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `x[t][r] += block value` for row blocks `[cluster][token][rows]` (through
    /// [`Self::add_delta`]).
    fn add_row_blocks(
        &mut self,
        clusters: &[Range<u32>],
        width: usize,
        post_norm: Option<&[f32]>,
        eps: f32,
    ) {
        let n = self.request.n_tokens as usize;
        self.delta.resize(n * width, 0.0);
        gather_row_blocks(&self.blocks, clusters, n, width, &mut self.delta);
        self.add_delta(post_norm, eps, width);
    }

    /// `x += delta`, each token's delta first RMS-normed with `post_norm` if the layer has one
    /// (Gemma's norms after attention and after the FFN).
    fn add_delta(&mut self, post_norm: Option<&[f32]>, eps: f32, width: usize) {
        if let Some(weight) = post_norm {
            let n = self.delta.len() / width;
            self.normed.resize(n * width, 0.0);
            for (d, o) in self
                .delta
                .chunks_exact(width)
                .zip(self.normed.chunks_exact_mut(width))
            {
                rms_norm(d, weight, eps, o);
            }
            std::mem::swap(&mut self.delta, &mut self.normed);
        }
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
        let c = model.config();
        let layer = &model.layers()[l];
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
        let c = model.config();
        let layer = &model.layers()[l];
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
            self.moe.route(model, router, &self.normed, n);
        }
    }

    fn prepare_next_layer(&mut self, model: &Model, l: usize) {
        if l + 1 < model.layers().len() {
            self.prepare_attention(model, l + 1);
        } else if self.request.wants_logits() {
            let c = model.config();
            let n = self.request.n_tokens as usize;
            let from = self.request.logits_from as usize;
            self.norm_rows(model.output_norm(), c.rms_eps, from..n, c.n_embd as usize);
            self.emit(|| "result_norm".into(), Tensor::Normed, c.n_embd as usize);
            self.acts.prepare(
                &self.kernels,
                &self.normed,
                c.n_embd as usize,
                &[model.output().ty],
            );
        }
    }
}
