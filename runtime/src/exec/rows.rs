//! Row phases: whole matrices cut into row blocks, each cluster `[token][rows]` for every
//! token at once — the attention output and output projections (read from cache slots when
//! they stream), and prefill's dense FFN (gate and up rows with the activation, then the
//! down rows; in a mixture of experts each used expert's down block weighted).

use super::blocks::{row_blocks, units};
use super::compute::Work;
use super::executor::StepState;
use super::weights::read_slot;
use crate::model::ops::gated_activation;
use crate::model::TensorRef;
use crate::neuron::Phase;
use crate::quant::{Layout, MatRef};

impl StepState {
    /// `AttnOutRows`, `OutputRows` and (without experts) `FfnDownRows`: the rows of one
    /// matrix times the phase's input.
    pub(super) fn compute_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            ..
        } = w;
        let layer = model.layers.get(work.layer as usize);
        let w: &TensorRef = match work.phase {
            Phase::AttnOutRows => &layer.expect("layer").wo,
            Phase::FfnDownRows => &layer.expect("layer").down,
            _ => &model.output,
        };
        let n = self.rows_in(work.phase);
        let mut outs = row_blocks(buf, clusters, n, w.rows);
        let act = self.acts.get(w.ty);
        // A streamed output projection or attention output: cluster `first + i` reads
        // its unit's cache slot.
        let streamed = self.cache.as_deref().filter(|a| {
            matches!(work.phase, Phase::OutputRows | Phase::AttnOutRows) && a.streams(work.phase)
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
            let slot = read_slot(arena, layer_index, c, || {
                format!("{:?} cluster {c} computed before it was loaded", work.phase)
            });
            let mat = MatRef {
                ty: w.ty,
                data: slot.bytes(),
                rows: m,
                cols: w.cols,
                layout: Layout::Rows,
            };
            cx.project(mat, act, n, out, m);
        });
    }

    /// `FfnDownRows` of a mixture of experts: each output row block sums every used expert's
    /// down block times that expert's weighted h, experts in index order (a fixed order: the
    /// same bits whichever thread computes the block).
    pub(super) fn compute_expert_down_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            scratch,
            n,
            ..
        } = w;
        let embd = model.config.n_embd as usize;
        let l = model.layers.get(work.layer as usize).expect("layer");
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

    /// `FfnGateUpRows`: act(gate) · up for the cluster's neurons (prefill's dense FFN).
    pub(super) fn compute_gate_up_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            scratch,
            n,
            ..
        } = w;
        let c = &model.config;
        let acts = &self.acts;
        let l = model.layers.get(work.layer as usize).expect("layer");
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
}
