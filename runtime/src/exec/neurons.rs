//! The `FfnNeurons` phase (decode, and every step of a neuron store): each cluster of FFN
//! neurons writes its partial down projection `[token][n_embd]`. A cluster no token needs
//! (an expert nobody chose, no predicted neuron) writes zeros; the others compute densely
//! ([`FfnCluster::compute`]) or, in sparse decode, through `sparse_ffn_cluster`.

use super::blocks::{grow, split_blocks, units};
use super::compute::{Activations, Compute, Land, Work, WorkerScratch};
use super::executor::StepState;
use super::experts::ExpertScale;
use super::selection::any_predicted;
use super::sparse_ffn::sparse_ffn_cluster;
use super::weights::{BundleBytes, DownPart, FfnCluster};
use crate::model::ops::gated_activation;
use crate::neuron::Phase;
use crate::quant::activation_type;
use crate::schedule::StepShape;
use std::sync::atomic::Ordering;

impl FfnCluster<'_> {
    /// `out[t][..n_embd]` = (or `+=`, as `land` says) the cluster's partial down projection
    /// for each of `n` tokens. `batched_down`: many tokens' down products of a block-column in
    /// one dense call (a store's bundles); otherwise one matvec per token.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compute(
        &self,
        cx: Compute<'_>,
        acts: &Activations,
        activation: crate::model::FfnActivation,
        n: usize,
        s: &mut WorkerScratch,
        out: &mut [f32],
        batched_down: bool,
        expert: Option<ExpertScale<'_>>,
        land: Land,
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
                    land.axpy_rows(
                        cx.kernels,
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
            let mut partial = std::mem::take(&mut s.partial);
            land.with(&mut partial, &mut out[..n * embd], |o| {
                cx.project(down, &s.h_act, n, o, embd)
            });
            s.partial = partial;
            return;
        }
        s.h_act.resize(h_bytes, 0);
        let mut partial = std::mem::take(&mut s.partial);
        for t in 0..n {
            cx.kernels
                .quantize_activations(down.ty, &s.gate[t * m..(t + 1) * m], &mut s.h_act);
            land.with(&mut partial, &mut out[t * embd..(t + 1) * embd], |o| {
                cx.kernels.matvec(down, cols.clone(), &s.h_act, o)
            });
        }
        s.partial = partial;
    }
}

impl StepState {
    /// `FfnNeurons`: the partial down projection of each of the command's clusters.
    pub(super) fn compute_ffn_neurons(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            program,
            work,
            clusters,
            runner,
            cx,
            scratch,
            n,
        } = w;
        let c = model.config();
        let embd = c.n_embd as usize;
        let acts = &self.acts;
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
            .sparse()
            .filter(|_| program.shape == StepShape::Decode);
        if let Some(sparse) = sparse {
            let neurons: usize = clusters.iter().map(|r| r.len()).sum();
            sparse
                .stats
                .neurons
                .fetch_add((n * neurons) as u64, Ordering::Relaxed);
        }
        let predicted = sparse
            .filter(|_| self.ffn.predicts())
            .and_then(|_| self.predictions(program.shape));
        let gated = program.is_gate_first().then_some(self.gated.as_slice());
        let rows_only = self.ffn.predicted_rows_only() && predicted.is_some();
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
            let l = layer_index as usize;
            let Some(store) = model.store() else {
                let ffn = FfnCluster::of_model(model, l, &neurons);
                if let Some(sparse) = sparse {
                    return sparse_ffn_cluster(
                        cx,
                        sparse,
                        l,
                        neurons,
                        &ffn,
                        acts,
                        predicted,
                        gated,
                        rows_only,
                        n,
                        s,
                        out,
                        Land::Write,
                    );
                }
                let (a, cols) = (c.activation, false);
                return ffn.compute(cx, acts, a, n, s, out, cols, expert, Land::Write);
            };
            // A store's cluster is a run of bundles, each from its cache slot (or from the
            // file in memory when the plan has no cache), summed into the block in order.
            let mut land = Land::Write;
            for bundle in program.units_of_cluster(Phase::FfnNeurons, (first + i) as u32) {
                let neurons = units(&program.ffn_units[bundle as usize]);
                // No prediction names a neuron of it: it was never loaded.
                if let Some(bits) = predicted {
                    let words = (c.n_ff as usize).div_ceil(64);
                    if !any_predicted(bits, words, n, &neurons) {
                        continue;
                    }
                }
                // Left out of a resident-only step: never read.
                if self.left_out(layer_index, bundle) {
                    continue;
                }
                let bytes = BundleBytes::of(model, cache, layer_index, bundle, || {
                    format!("layer {layer_index} bundle {bundle} computed before it was loaded")
                });
                let layout = store.layout_of(layer_index);
                let ffn = FfnCluster::of_bundle(&layout, bundle, bytes.bytes());
                match sparse {
                    Some(sparse) => sparse_ffn_cluster(
                        cx, sparse, l, neurons, &ffn, acts, predicted, gated, rows_only, n, s, out,
                        land,
                    ),
                    None => ffn.compute(cx, acts, c.activation, n, s, out, true, expert, land),
                }
                land = Land::Add;
            }
            if land == Land::Write {
                out[..n * embd].fill(0.0);
            }
        });
    }
}
