//! Sparse decode of FFN neuron clusters ([`sparse_ffn_cluster`]): gate rows, the threshold on
//! each neuron's score, then only the active neurons' up rows and down columns. Also
//! gate-first loading's `FfnGateRows` phase, which computes a bundle's gate rows from its
//! first pages with the same kernel call (so the same bits) before the rest is read.

use super::blocks::row_blocks;
use super::compute::{Activations, Compute, Land, Work, WorkerScratch};
use super::executor::StepState;
use super::weights::{BundleBytes, DownPart, FfnCluster};
use crate::quant::{activation_type, Kernels, Layout, MatRef};
use crate::schedule::reads_whole_up_rows;
use crate::sparse::SparseFfn;
use std::ops::Range;
use std::sync::atomic::Ordering;

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

/// Tokens from which a step's sparse FFN computes each matrix of a cluster for all of them at
/// once (one matrix product, each value the bits of the per-token kernel call it replaces)
/// rather than token by token: steps this long are prompts evaluated sparsely (`perplexity`),
/// where the whole cluster's rows are read anyway.
const BATCH_TOKENS: usize = 16;

/// Sparse decode of FFN neurons `neurons` (one cluster, weights `ffn`) of layer `l` for `n`
/// tokens: gate rows (all of the cluster, or only those the predictor named), the threshold on
/// the score, then up rows of the active neurons, and their down columns: an axpy over the
/// neurons' down columns (a store's neuron columns, or rows of the layer's transposed down
/// projection) when few fire or no block-column exists, the cluster's down block-column times
/// the sparse activations otherwise. `out[t][..n_embd]` is (or gets added, as `land` says) the
/// partial down projection. Which path runs depends on the data only, never on threads or
/// timing.
#[allow(clippy::too_many_arguments)]
pub(super) fn sparse_ffn_cluster(
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
    land: Land,
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
                    layout: Layout::Rows,
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
    // Many tokens, every row at hand: the gate and up values of all of them in two products.
    let batched = n >= BATCH_TOKENS && gated.is_none() && !rows_only;
    s.tokens_many.clear();
    if batched {
        s.tokens_gate.resize(n * m, 0.0);
        s.tokens_up.resize(n * m, 0.0);
        cx.kernels.matmul(gate, gate_all, n, &mut s.tokens_gate, m);
        cx.kernels.matmul(up, up_all, n, &mut s.tokens_up, m);
    }
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
                if batched {
                    s.gate.copy_from_slice(&s.tokens_gate[t * m..(t + 1) * m]);
                } else {
                    gate_row_values(cx.kernels, gate, act_gate, &mut s.gate);
                }
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
                if batched {
                    let values = &s.tokens_gate[t * m..(t + 1) * m];
                    for (v, &j) in s.picked.iter_mut().zip(&s.picks) {
                        *v = values[j as usize];
                    }
                } else {
                    cx.kernels
                        .matvec_rows(gate, &s.picks, act_gate, &mut s.picked);
                }
                for k in 0..s.picks.len() {
                    let (j, g) = (s.picks[k] as usize, s.picked[k]);
                    consider(s, j, g);
                }
            }
        }
        if batched {
            let values = &s.tokens_up[t * m..(t + 1) * m];
            for (k, &j) in s.neurons.iter().enumerate() {
                s.coefs[k] *= values[j as usize];
            }
        } else if reads_whole_up_rows(s.neurons.len(), m) && !rows_only {
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
            SparseDown::Rows(rows) => land.axpy_rows(cx.kernels, *rows, &s.neurons, &s.coefs, out),
            SparseDown::Columns {
                rows: Some(rows), ..
            } if few => land.axpy_rows(cx.kernels, *rows, &s.neurons, &s.coefs, out),
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
                if batched {
                    // Quantized now, multiplied with the other such tokens after the loop.
                    let at = s.tokens_many.len() * h_bytes;
                    s.tokens_h.resize(at + h_bytes, 0);
                    cx.kernels
                        .quantize_activations(mat.ty, &s.gate, &mut s.tokens_h[at..]);
                    s.tokens_many.push(t);
                    continue;
                }
                s.h_act.resize(h_bytes, 0);
                cx.kernels
                    .quantize_activations(mat.ty, &s.gate, &mut s.h_act);
                let mut partial = std::mem::take(&mut s.partial);
                land.with(&mut partial, out, |o| {
                    cx.kernels.matvec(*mat, cols.clone(), &s.h_act, o)
                });
                s.partial = partial;
            }
        }
    }
    if let (false, SparseDown::Columns { mat, cols, .. }) = (s.tokens_many.is_empty(), &down) {
        let k = s.tokens_many.len();
        s.tokens_out.resize(k * embd, 0.0);
        let h_bytes = s.tokens_h.len() / k;
        cx.kernels.matmul_cols(
            *mat,
            cols.clone(),
            &s.tokens_h[..k * h_bytes],
            k,
            &mut s.tokens_out,
            embd,
        );
        let mut partial = std::mem::take(&mut s.partial);
        for (i, &t) in s.tokens_many.iter().enumerate() {
            let value = &s.tokens_out[i * embd..(i + 1) * embd];
            land.with(&mut partial, &mut out[t * embd..(t + 1) * embd], |o| {
                o.copy_from_slice(value)
            });
        }
        s.partial = partial;
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

impl StepState {
    /// `FfnGateRows` (gate-first loading): each bundle's gate rows, from the first pages of
    /// its slot, into row blocks `[token][neurons]`.
    pub(super) fn compute_gate_rows(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            n,
            ..
        } = w;
        let kernels = cx.kernels;
        let Some(store) = model.store() else {
            panic!("gate-first loading needs a neuron store");
        };
        let mut outs = row_blocks(buf, clusters, n, model.config().n_ff as usize);
        let act = self.acts.get(store.layout.gate_ty);
        let row = act.len() / n.max(1);
        let (cache, first, layer_index) = (self.cache.as_deref(), work.clusters.start, work.layer);
        let sparse = model.sparse();
        runner.run(&mut outs, &|_, i, out| {
            let bundle = first + i as u32;
            let bytes = BundleBytes::of(model, cache, layer_index, bundle, || {
                format!("layer {layer_index} gate rows of cluster {bundle} computed before they were loaded")
            });
            let gate = store.layout_of(layer_index).split(bundle, bytes.bytes()).gate;
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
}
