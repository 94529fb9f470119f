//! Which parts of a layer's FFN a decode step needs, decided after its attention (or, with
//! gate-first loading, after its gate rows): the neurons the predictors name, the clusters
//! holding any of them ([`StepState::ffn_needed`], what the scheduler is told so that it loads
//! only those), and the bundle pages their compute reads ([`StepState::ffn_pages`]).

use super::blocks::units;
use super::executor::StepState;
use crate::model::Model;
use crate::neuron::Phase;
use crate::schedule::{Program, StepShape};
use crate::sparse::SparsityMode;
use std::ops::Range;

/// Whether any of `n` tokens' predictions (`[token][words]` bits) names a neuron of `neurons`.
pub(super) fn any_predicted(bits: &[u64], words: usize, n: usize, neurons: &Range<usize>) -> bool {
    (0..n).any(|t| {
        let bits = &bits[t * words..(t + 1) * words];
        neurons.clone().any(|i| bits[i / 64] >> (i % 64) & 1 == 1)
    })
}

impl StepState {
    /// After a layer's attention: which of the layer's FFN clusters the step needs, as bits
    /// of `needed` (what drivers feed the scheduler as [`crate::schedule::Event::FfnPredicted`]).
    pub fn ffn_needed(&self, needed: &mut Vec<u64>) {
        needed.clear();
        needed.extend_from_slice(&self.needed);
    }

    /// The FFN clusters (`program`'s) a step needs: those whose neurons a token's prediction
    /// names, or all of them where nothing was predicted (dense, threshold, prefill, a layer
    /// without a predictor); in a mixture of experts only clusters of experts some token chose.
    pub(super) fn find_ffn_needed(&self, model: &Model, program: &Program, needed: &mut Vec<u64>) {
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

    /// Gate-first loading, after a layer's `FfnGateRows`: the pages of each FFN cluster's
    /// bundle that its `FfnNeurons` compute reads (what drivers feed the scheduler as
    /// [`crate::schedule::Event::FfnPages`]).
    pub fn ffn_pages(&self, pages: &mut Vec<u64>) {
        pages.clear();
        pages.extend_from_slice(&self.pages);
    }

    /// Gate-first loading, after a layer's `FfnGateRows`: its neurons that fire for some
    /// token of the step, ascending.
    pub fn ffn_active(&self) -> &[u32] {
        &self.layer_active
    }

    /// From the layer's gate values: which neurons of each cluster fire for some token (the
    /// threshold of sparse decode, decided exactly as `sparse_ffn_cluster` decides it), the
    /// clusters with any (`needed`) and the bundle pages their up rows and down columns lie in
    /// (`pages`). Without threshold sparsity every neuron fires: every page.
    pub(super) fn find_ffn_pages(&mut self, model: &Model, program: &Program, l: usize) {
        let Some(store) = &model.store else {
            return;
        };
        let layout = &store.layout;
        let per = layout.bundle_pages() as usize;
        let clusters = program.clusters(Phase::FfnNeurons);
        let n = self.request.n_tokens as usize;
        let ff = model.config.n_ff as usize;
        let threshold = model
            .sparse
            .as_ref()
            .filter(|s| s.mode == SparsityMode::Threshold && program.shape == StepShape::Decode);
        let mut pages = std::mem::take(&mut self.pages);
        let mut active = std::mem::take(&mut self.active);
        self.layer_active.clear();
        pages.clear();
        pages.resize((clusters.len() * per).div_ceil(64), 0);
        self.needed.clear();
        self.needed.resize(clusters.len().div_ceil(64), 0);
        for (c, r) in clusters.iter().enumerate() {
            let neurons = units(r);
            if self.moe.expert_of(model, &neurons).is_err() {
                continue;
            }
            let mut any = false;
            for t in 0..n {
                active.clear();
                match threshold {
                    Some(sparse) => {
                        let layer = &sparse.layers[l];
                        for (j, &g) in self.gated[t * ff + neurons.start..t * ff + neurons.end]
                            .iter()
                            .enumerate()
                        {
                            let a = sparse.activate(g);
                            if a.abs() * layer.importance[neurons.start + j] > layer.threshold {
                                active.push(j as u32);
                            }
                        }
                    }
                    None => active.extend(0..neurons.len() as u32),
                }
                if active.is_empty() {
                    continue;
                }
                // Clusters ascend, so the layer's list stays ascending; tokens of one cluster
                // merge into its part of it.
                let from = self
                    .layer_active
                    .partition_point(|&i| (i as usize) < neurons.start);
                for &j in &active {
                    let i = (neurons.start + j as usize) as u32;
                    if let Err(at) = self.layer_active[from..].binary_search(&i) {
                        self.layer_active.insert(from + at, i);
                    }
                }
                any = true;
                let up_whole = active.len() * 2 > neurons.len();
                layout.mark_active_pages(c as u32, &active, up_whole, &mut pages, c * per);
            }
            if any {
                self.needed[c / 64] |= 1 << (c % 64);
            }
        }
        self.pages = pages;
        self.active = active;
    }

    /// Decode with predictors, reading pages: the pages of each FFN cluster's bundle holding
    /// the rows of neurons some token's prediction names (none for a layer without predictions:
    /// then every page of every needed cluster).
    pub(super) fn find_predicted_pages(&mut self, model: &Model, program: &Program) {
        let Some(store) = &model.store else {
            return;
        };
        let layout = &store.layout;
        let per = layout.bundle_pages() as usize;
        let clusters = program.clusters(Phase::FfnNeurons);
        let n = self.request.n_tokens as usize;
        let words = (model.config.n_ff as usize).div_ceil(64);
        let mut pages = std::mem::take(&mut self.pages);
        let mut picked = std::mem::take(&mut self.active);
        pages.clear();
        pages.resize((clusters.len() * per).div_ceil(64), 0);
        let predicted = self.predictions(program.shape);
        for (c, r) in clusters.iter().enumerate() {
            if self
                .needed
                .get(c / 64)
                .is_none_or(|w| w >> (c % 64) & 1 == 0)
            {
                continue;
            }
            let neurons = units(r);
            picked.clear();
            picked.extend((0..neurons.len() as u32).filter(|&j| {
                let i = neurons.start + j as usize;
                predicted.is_none_or(|bits| {
                    (0..n).any(|t| bits[t * words + i / 64] >> (i % 64) & 1 == 1)
                })
            }));
            layout.mark_neuron_pages(c as u32, &picked, &mut pages, c * per);
        }
        self.pages = pages;
        self.active = picked;
    }

    /// The current layer's predicted neurons `[token][n_ff bits]`, in decode steps with
    /// predictors.
    pub(super) fn predictions(&self, shape: StepShape) -> Option<&[u64]> {
        (shape == StepShape::Decode && !self.predicted.is_empty())
            .then_some(self.predicted.as_slice())
    }

    /// Sparse decode with predictors: which neurons of layer `l` each token needs, from the
    /// FFN input just normed.
    pub(super) fn predict_active(&mut self, model: &Model, l: usize) {
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
}
