//! Which parts of a layer's FFN a decode step needs, decided after its attention (or, with
//! gate-first loading, after its gate rows): the neurons the predictors name or whose gates
//! fire ([`StepState::fill_activity`], from which the scheduler's owed event is derived) and
//! the clusters holding any of them (which the FFN finish sums).

use super::blocks::units;
use super::executor::StepState;
use crate::model::Model;
use crate::neuron::Phase;
use crate::schedule::{Activity, Awaited, Program, StepShape};
use std::ops::Range;

/// Whether any of `n` tokens' predictions (`[token][words]` bits) names a neuron of `neurons`.
pub(super) fn any_predicted(bits: &[u64], words: usize, n: usize, neurons: &Range<usize>) -> bool {
    (0..n).any(|t| {
        let bits = &bits[t * words..(t + 1) * words];
        neurons.clone().any(|i| bits[i / 64] >> (i % 64) & 1 == 1)
    })
}

impl StepState {
    /// The FFN clusters (`program`'s) a step needs: those whose neurons a token's prediction
    /// names, or all of them where nothing was predicted (dense, threshold, prefill, a layer
    /// without a predictor); in a mixture of experts only clusters of experts some token chose.
    /// The FFN finish sums only their partial outputs.
    pub(super) fn find_ffn_needed(&self, model: &Model, program: &Program, needed: &mut Vec<u64>) {
        let clusters = program.clusters(Phase::FfnNeurons);
        needed.clear();
        needed.resize(clusters.len().div_ceil(64), 0);
        let predicted = self.predictions(program.shape);
        let words = (model.config().n_ff as usize).div_ceil(64);
        let n = self.request.n_tokens as usize;
        for (c, r) in clusters.iter().enumerate() {
            let chosen = self.moe.expert_of(model, &units(r)).is_ok();
            if chosen && predicted.is_none_or(|bits| any_predicted(bits, words, n, &units(r))) {
                needed[c / 64] |= 1 << (c % 64);
            }
        }
    }

    /// In a resident-only step, the FFN clusters of `layer` none of whose bundles it computes
    /// are not needed ([`crate::schedule::StepRequest::resident_only`]).
    pub(super) fn leave_out_unresident(&self, program: &Program, layer: u32, needed: &mut [u64]) {
        if !self.request.resident_only || self.cache.is_none() {
            return;
        }
        for c in 0..program.clusters(Phase::FfnNeurons).len() {
            let mut bundles = program.units_of_cluster(Phase::FfnNeurons, c as u32);
            if bundles.all(|b| self.left_out(layer, b)) {
                needed[c / 64] &= !(1 << (c % 64));
            }
        }
    }

    /// Whether unit `(layer, cluster)` of the neuron cache is left out of this step: a
    /// resident-only step computes only the units it keeps for good.
    pub(super) fn left_out(&self, layer: u32, cluster: u32) -> bool {
        self.request.resident_only
            && self
                .cache
                .as_deref()
                .is_some_and(|a| !a.in_resident_step(layer, cluster))
    }

    /// The current layer's active FFN neurons, token by token, for the event the scheduler
    /// awaits after a finished phase ([`crate::schedule::owed_event`] turns them into needed
    /// clusters or pages): after a gate phase, the neurons whose gate fires; after attention,
    /// the neurons some prediction names in the experts some token chose (every neuron of a
    /// layer nothing selects).
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
        if predicted.is_none() && !model.config().is_moe() {
            activity.set_all();
            return;
        }
        activity.clear();
        let clusters = program.clusters(Phase::FfnNeurons);
        let words = (model.config().n_ff as usize).div_ceil(64);
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
    pub(super) fn find_gated_activity(&mut self, model: &Model, program: &Program, l: usize) {
        let clusters = program.clusters(Phase::FfnNeurons);
        let n = self.request.n_tokens as usize;
        let ff = model.config().n_ff as usize;
        let threshold = model
            .sparse()
            .filter(|_| self.ffn.thresholds() && program.shape == StepShape::Decode);
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
    pub(super) fn predictions(&self, shape: StepShape) -> Option<&[u64]> {
        (shape == StepShape::Decode && !self.predicted.is_empty())
            .then_some(self.predicted.as_slice())
    }

    /// Sparse decode with predictors: which neurons of layer `l` each token needs, from the
    /// FFN input just normed.
    pub(super) fn predict_active(&mut self, model: &Model, l: usize) {
        self.predicted.clear();
        let Some(sparse) = model.sparse() else {
            return;
        };
        if !self.ffn.predicts() {
            return;
        }
        let Some(predictor) = sparse.layers[l].predictor.as_ref() else {
            return;
        };
        let embd = model.config().n_embd as usize;
        let words = (model.config().n_ff as usize).div_ceil(64);
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
