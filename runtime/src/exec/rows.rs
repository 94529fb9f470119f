//! Row phases: whole matrices cut into row blocks, each cluster `[token][rows]` for every
//! token at once — the attention output and output projections (read from cache slots when
//! they stream), and prefill's dense FFN (gate and up rows with the activation, then the
//! down rows summed over decode's neuron clusters; in a mixture of experts each used
//! expert's down block weighted).

use super::blocks::{row_blocks, units};
use super::compute::Work;
use super::executor::StepState;
use super::weights::read_slot;
use crate::model::ops::gated_activation;
use crate::model::ModelConfig;
use crate::model::TensorRef;
use crate::neuron::Phase;
use crate::quant::{activation_type, Layout, MatRef};
use crate::schedule::Program;
use std::ops::Range;

impl StepState {
    /// `AttnOutRows` and `OutputRows`: the rows of one matrix times the phase's input.
    pub(super) fn compute_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            ..
        } = w;
        let layer = model.layers().get(work.layer as usize);
        let w: &TensorRef = match work.phase {
            Phase::AttnOutRows => &layer.expect("layer").wo,
            _ => model.output(),
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
            // Left out of a resident-only step: never read (the finish masks its rows).
            if self.left_out(layer_index, c) {
                return out[..n * m].fill(0.0);
            }
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

    /// `FfnDownRows`: each output row block is the sum, from zero and in order, of the partial
    /// down projections over [`down_sums`] (decode's neuron clusters), as decode's `FfnNeurons`
    /// finish sums its clusters' blocks: the same bits for a position whichever step shape
    /// computed it. The quantized h is laid out range by range at the gate-up finish
    /// (`Activations::prepare_ranges`), so each partial product reads its activations in place.
    /// In a mixture of experts only the used experts' ranges add, each expert's down block
    /// times its weighted h.
    pub(super) fn compute_down_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
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
        let l = model.layers().get(work.layer as usize).expect("layer");
        let at = activation_type(l.down.ty);
        let per_expert = c.ffn_per_expert() as usize;
        let moe = &self.moe;
        // A mixture's quantized h of one expert per token: `moe.act_row` bytes.
        let bytes = |k: usize| at.bytes_for(k as u64).expect("whole blocks") as usize;
        let sums = down_sums(program, c);
        let mut outs = row_blocks(buf, clusters, n, embd);
        runner.run(&mut outs, &|worker, i, out| {
            let mut guard = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
            let s = &mut *guard;
            let rows = units(&clusters[i]);
            let m = rows.len();
            out[..n * m].fill(0.0);
            s.partial.resize(n * m, 0.0);
            for (k, neurons) in sums.iter().enumerate() {
                let e = neurons.start / per_expert;
                if c.is_moe() && !moe.used[e] {
                    continue;
                }
                let first = e * embd;
                let down = model.rows(&l.down, first + rows.start..first + rows.end);
                let cols = neurons.start - e * per_expert..neurons.end - e * per_expert;
                let h = match c.is_moe() {
                    false => self.acts.range(k),
                    true => {
                        let (from, len) = (bytes(cols.start), bytes(cols.len()));
                        s.h_act.clear();
                        for t in 0..n {
                            let start = (e * n + t) * moe.act_row + from;
                            s.h_act.extend_from_slice(&moe.acts[start..start + len]);
                        }
                        &s.h_act[..]
                    }
                };
                cx.project_cols(down, cols, h, n, &mut s.partial, m);
                for (o, v) in out[..n * m].iter_mut().zip(&s.partial[..n * m]) {
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
        let c = model.config();
        let acts = &self.acts;
        let l = model.layers().get(work.layer as usize).expect("layer");
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

/// The neuron ranges whose partial down projections prefill's `FfnDownRows` sums, in order:
/// the program's `ffn_sums` (decode's FFN clusters), or, for a program made by hand without
/// them, one range per expert (the whole FFN without experts).
pub(super) fn down_sums(program: &Program, c: &ModelConfig) -> Vec<Range<usize>> {
    match program.ffn_sums.is_empty() {
        false => program.ffn_sums.iter().map(units).collect(),
        true => {
            let f = c.ffn_per_expert() as usize;
            (0..c.n_expert.max(1) as usize)
                .map(|e| e * f..(e + 1) * f)
                .collect()
        }
    }
}
