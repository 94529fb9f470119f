//! What a cluster computes with: the phase's input quantized once per weight format
//! ([`Activations`]), the kernels and the dense backend ([`Compute`]), one worker's reusable
//! scratch ([`WorkerScratch`]), and one `Compute` command's clusters ([`Work`]), which every
//! phase's compute in the sibling files takes.

use super::{ClusterRunner, DenseBackend};
use crate::model::attention::AttnScratch;
use crate::model::Model;
use crate::quant::{activation_type, GgmlType, Kernels, MatRef};
use crate::schedule::{ClusterWork, Program};
use std::ops::Range;
use std::sync::Mutex;

/// Temporary vectors of one worker, reused across clusters so the hot path does not allocate.
#[derive(Default)]
pub(super) struct WorkerScratch {
    pub(super) attn: AttnScratch,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) h_act: Vec<u8>,
    /// Sparse decode: the cluster's active neurons and their coefficients act(gate) · up.
    pub(super) neurons: Vec<u32>,
    pub(super) coefs: Vec<f32>,
    /// Sparse decode: rows of the cluster picked for a product, and their dot products.
    pub(super) picks: Vec<u32>,
    pub(super) picked: Vec<f32>,
    /// A bundle's partial down projection before [`Land::Add`] adds it to its cluster's.
    pub(super) partial: Vec<f32>,
    /// Sparse decode of many tokens at once: the cluster's gate and up values of every token,
    /// the quantized activations of the tokens whose down projection takes the block-column,
    /// those tokens, and their outputs.
    pub(super) tokens_gate: Vec<f32>,
    pub(super) tokens_up: Vec<f32>,
    pub(super) tokens_h: Vec<u8>,
    pub(super) tokens_many: Vec<usize>,
    pub(super) tokens_out: Vec<f32>,
}

/// How a bundle's partial down projection lands in its cluster's output block: a store's FFN
/// cluster is a run of bundles, the first it computes writes the block and the others add to
/// it, in bundle order (so the sum never depends on threads or timing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Land {
    Write,
    Add,
}

impl Land {
    /// `out (+)= Σ coefs[k] · row(neurons[k])`: the accumulating kernel adds in place (the
    /// same fmas in the same order as one call over the whole cluster).
    pub(super) fn axpy_rows(
        self,
        kernels: &Kernels,
        rows: MatRef<'_>,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        match self {
            Land::Write => kernels.axpy_rows(rows, neurons, coefs, out),
            Land::Add => kernels.axpy_rows_add(rows, neurons, coefs, out),
        }
    }

    /// Runs `write`, which overwrites the slice it is given, into `out`, or (`Add`) into
    /// `partial` and adds that to `out`.
    pub(super) fn with(
        self,
        partial: &mut Vec<f32>,
        out: &mut [f32],
        write: impl FnOnce(&mut [f32]),
    ) {
        if self == Land::Write {
            return write(out);
        }
        partial.clear();
        partial.resize(out.len(), 0.0);
        write(partial);
        for (o, p) in out.iter_mut().zip(partial.iter()) {
            *o += *p;
        }
    }
}

/// A phase's input rows, quantized once into each activation format its weights need.
#[derive(Default)]
pub(super) struct Activations {
    n_cols: usize,
    used: usize,
    sets: Vec<(GgmlType, Vec<u8>)>,
    /// Byte ranges of [`Activations::prepare_ranges`]' ranges in `sets[0]`.
    ranges: Vec<std::ops::Range<usize>>,
}

impl Activations {
    pub(super) fn prepare(
        &mut self,
        kernels: &Kernels,
        src: &[f32],
        n_cols: usize,
        weights: &[GgmlType],
    ) {
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

    /// [`Activations::prepare`] for one weight type `w`, laid out range by range: for each of
    /// `ranges` (block-aligned columns, in order) the quantized columns of every token together,
    /// `[range][token][range bytes]`. Blocks are quantized on their own, so these are the same
    /// bytes as `prepare`'s, rearranged: a product over one range reads its activations as one
    /// piece ([`Activations::range`]; prefill's down projection over decode's clusters).
    pub(super) fn prepare_ranges(
        &mut self,
        kernels: &Kernels,
        src: &[f32],
        n_cols: usize,
        w: GgmlType,
        ranges: &[std::ops::Range<usize>],
    ) {
        let at = activation_type(w);
        let n_rows = src.len() / n_cols;
        let bytes = |k: usize| at.bytes_for(k as u64).expect("whole blocks") as usize;
        self.n_cols = n_cols;
        self.used = 1;
        if self.sets.is_empty() {
            self.sets.push((at, Vec::new()));
        }
        let (t, buf) = &mut self.sets[0];
        *t = at;
        buf.resize(n_rows * bytes(n_cols), 0);
        self.ranges.clear();
        let mut at_byte = 0;
        for r in ranges {
            let len = bytes(r.len());
            for (tok, dst) in buf[at_byte..at_byte + n_rows * len]
                .chunks_exact_mut(len)
                .enumerate()
            {
                kernels.quantize_activations(w, &src[tok * n_cols..][r.clone()], dst);
            }
            self.ranges.push(at_byte..at_byte + n_rows * len);
            at_byte += n_rows * len;
        }
    }

    /// Range `i` of [`Activations::prepare_ranges`]: `[token][range bytes]`.
    pub(super) fn range(&self, i: usize) -> &[u8] {
        &self.sets[0].1[self.ranges[i].clone()]
    }

    /// The input quantized for weights of type `w`.
    pub(super) fn get(&self, w: GgmlType) -> &[u8] {
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
pub(super) struct Compute<'a> {
    pub(super) kernels: &'a Kernels,
    pub(super) dense: &'a dyn DenseBackend,
}

impl Compute<'_> {
    /// `out[t * stride + r] = w_r · act_t` for the rows of `w` and `n` activation rows: a
    /// matvec for one token, the dense backend for many.
    pub(super) fn project(
        self,
        w: MatRef<'_>,
        act: &[u8],
        n: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        self.project_cols(w, 0..w.cols, act, n, out, stride)
    }

    /// [`Compute::project`] over the columns `cols` of `w`; `act` holds `n` rows of
    /// `cols.len()` elements. The same bits for every `n` (the kernels' rule).
    pub(super) fn project_cols(
        self,
        w: MatRef<'_>,
        cols: Range<usize>,
        act: &[u8],
        n: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        if n == 1 {
            let rows = w.rows;
            self.kernels.matvec(w, cols, act, &mut out[..rows]);
        } else {
            self.dense
                .matmul(self.kernels, w, cols, act, n, out, stride);
        }
    }
}

/// One `Compute` command: its clusters, the runner that spreads them over the group's
/// workers, and what they compute with.
#[derive(Clone, Copy)]
pub(super) struct Work<'a> {
    pub(super) model: &'a Model,
    pub(super) program: &'a Program,
    pub(super) work: &'a ClusterWork,
    /// The command's clusters (ranges of the phase's units).
    pub(super) clusters: &'a [Range<u32>],
    pub(super) runner: &'a dyn ClusterRunner,
    pub(super) cx: Compute<'a>,
    /// One per worker of the group.
    pub(super) scratch: &'a [Mutex<WorkerScratch>],
    /// The step's tokens.
    pub(super) n: usize,
}
