//! Mixture-of-experts routing for the current layer ([`MoeState`]): each token's weight per
//! expert, which experts any token chose (the others' clusters are skipped, and under a cache
//! never read), and prefill's weighted FFN activations quantized expert by expert.

use crate::model::{moe, Model};
use crate::quant::{activation_type, GgmlType, Kernels};
use std::ops::Range;

/// The router weights of one expert for a step's tokens.
#[derive(Clone, Copy)]
pub(super) struct ExpertScale<'a> {
    /// `[token][n_expert]`.
    weights: &'a [f32],
    n_expert: usize,
    expert: usize,
}

impl ExpertScale<'_> {
    pub(super) fn weight(&self, token: usize) -> f32 {
        self.weights[token * self.n_expert + self.expert]
    }
}

/// A step's mixture-of-experts routing for the current layer, and prefill's weighted FFN
/// activations quantized expert by expert.
#[derive(Default)]
pub(super) struct MoeState {
    /// `[token][n_expert]`: each token's weight per expert, 0 where the router did not choose it.
    weights: Vec<f32>,
    /// Whether any token of the step chose each expert: the others' clusters are skipped.
    pub(super) used: Vec<bool>,
    probs: Vec<f32>,
    chosen: Vec<u32>,
    /// Prefill: `[expert][token][bytes]`, h of each expert's neurons quantized for the down
    /// projection (only for used experts); `act_row` bytes per token.
    pub(super) acts: Vec<u8>,
    pub(super) act_row: usize,
}

impl MoeState {
    /// The expert owning FFN neurons `neurons` (a cluster, which never mixes experts) and its
    /// weights, when the model is a mixture; `Err(())` when no token chose that expert.
    pub(super) fn expert_of(
        &self,
        model: &Model,
        neurons: &Range<usize>,
    ) -> Result<Option<ExpertScale<'_>>, ()> {
        let c = model.config();
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

    /// Each of `n` tokens' expert weights from the FFN input just normed (`normed`,
    /// `[token][n_embd]`).
    pub(super) fn route(&mut self, model: &Model, router: &[f32], normed: &[f32], n: usize) {
        let c = model.config();
        let (embd, n_expert) = (c.n_embd as usize, c.n_expert as usize);
        self.weights.resize(n * n_expert, 0.0);
        self.used.clear();
        self.used.resize(n_expert, false);
        for t in 0..n {
            moe::route(
                router,
                &normed[t * embd..(t + 1) * embd],
                c.n_expert_used as usize,
                &mut self.probs,
                &mut self.chosen,
                &mut self.weights[t * n_expert..(t + 1) * n_expert],
            );
            for &e in &self.chosen {
                self.used[e as usize] = true;
            }
        }
    }

    /// Prefill: weighs each of `n` tokens' h (`gathered`, `[token][n_ff]`) by its experts'
    /// router weights (0 for the others) and quantizes it expert by expert for the experts'
    /// down projections (blocks never cross experts, so these are the bytes a whole-row
    /// quantization would give).
    pub(super) fn weigh(
        &mut self,
        kernels: &Kernels,
        model: &Model,
        down: GgmlType,
        gathered: &mut [f32],
        n: usize,
    ) {
        let c = model.config();
        let (ff, f, n_expert) = (
            c.n_ff as usize,
            c.ffn_per_expert() as usize,
            c.n_expert as usize,
        );
        for (t, h) in gathered.chunks_exact_mut(ff).take(n).enumerate() {
            for (e, h) in h.chunks_exact_mut(f).enumerate() {
                let w = self.weights[t * n_expert + e];
                h.iter_mut().for_each(|v| *v *= w);
            }
        }
        let row = activation_type(down)
            .bytes_for(f as u64)
            .expect("an expert's down rows are whole blocks") as usize;
        self.act_row = row;
        self.acts.resize(n_expert * n * row, 0);
        for e in (0..n_expert).filter(|&e| self.used[e]) {
            for t in 0..n {
                let at = (e * n + t) * row;
                kernels.quantize_activations(
                    down,
                    &gathered[t * ff + e * f..t * ff + (e + 1) * f],
                    &mut self.acts[at..at + row],
                );
            }
        }
    }
}
