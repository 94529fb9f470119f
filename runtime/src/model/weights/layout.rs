//! How a model held in memory is laid out for decode, once, before it is shared: each layer's
//! down projection copied as block-columns of decode's clusters, the K-quant matrices decode
//! reads interleaved 8 rows at a time. Every layout gives the file layout's bits.

use super::{Model, ModelError, TensorRef};
use crate::quant::interleave::{interleavable, interleave_in_place, GROUP_ROWS};
use crate::quant::Layout;

/// How a model held in memory is laid out for decode, once, before it is shared
/// ([`Model::laid_out`]). Results do not change: every layout gives the file layout's bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeLayout {
    /// Decode's FFN clusters, in neurons: each layer's down projection is copied as
    /// block-columns of that many, which a cluster then streams as one contiguous matrix
    /// (`None`: decode reads slices of the file's rows).
    pub down_blocks: Option<usize>,
    /// The Q4_K and Q6_K matrices decode reads are interleaved 8 rows at a time (for kernels
    /// that have the interleaved matvec).
    pub interleave: bool,
}

/// Every layer's down projection cut into block-columns of `neurons` columns (one FFN neuron
/// cluster each), each stored contiguously: `[cluster][n_embd rows][its blocks]` (a mixture
/// of experts: each expert's columns cut alike, as the scheduler cuts them). A cluster's
/// partial down projection then streams one contiguous matrix instead of short slices of every
/// row; the dot products are the same blocks in the same order, so the results are the same
/// bits.
pub struct DownBlocks {
    pub neurons: usize,
    pub layers: Vec<Vec<u8>>,
    /// Each layer's block-columns' layout (interleaved by [`Model::laid_out`]).
    pub layouts: Vec<Layout>,
}

impl Model {
    /// This model laid out for decode as `layout` says, before it is shared: the down
    /// projections as block-columns first (the copy reads the file's layout), then the K-quant
    /// matrices interleaved. A neuron store or a model held resident-only stays as it is (its
    /// FFN comes from storage a bundle at a time), and so do the FFN matrices of a model with
    /// sparse decode (which picks single rows).
    pub fn laid_out(mut self, layout: DecodeLayout) -> Result<Model, ModelError> {
        if let Some(neurons) = layout.down_blocks {
            self.cluster_down_projections(neurons);
        }
        if layout.interleave {
            self.interleave_kquants()?;
        }
        Ok(self)
    }

    /// Interleaves the Q4_K and Q6_K matrices decode reads 8 rows at a time ([`Layout::X8`],
    /// the layout of the fastest K-quant matvec), in place: a mapped file's matrices become this process's
    /// own copies and their mapped pages are released, so each is held once. The projections
    /// of attention and of the FFN, and the output projection unless it is the token
    /// embeddings (read a row at a time); matrices whose rows are not a multiple of 8 stay as
    /// they are. Not for neuron stores nor models held resident-only (their weights come from
    /// storage a neuron at a time). With sparse FFN decode, which picks single rows of the FFN
    /// matrices, only attention and the output projection are interleaved. Results do not
    /// change: every kernel gives the file layout's bits. Returns the bytes interleaved.
    pub(crate) fn interleave_kquants(&mut self) -> Result<usize, ModelError> {
        if self.store.is_some() || self.resident_only {
            return Ok(0);
        }
        let ffn_too = self.sparse().is_none();
        let tied = self.output.bytes == self.tok_embd.bytes;
        let mut done = 0;
        let mut mats: Vec<&mut TensorRef> = Vec::new();
        for l in &mut self.layers {
            mats.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]);
            if ffn_too {
                mats.extend([&mut l.gate, &mut l.up, &mut l.down]);
            }
        }
        if !tied {
            mats.push(&mut self.output);
        }
        for t in mats {
            let eligible = interleavable(t.ty)
                && t.layout == Layout::Rows
                && t.rows.is_multiple_of(GROUP_ROWS);
            if !eligible {
                continue;
            }
            let bytes = self.file.bytes_mut(t.bytes.clone())?;
            interleave_in_place(t.ty, bytes, t.rows, t.cols)?;
            t.layout = Layout::X8 { skip: 0 };
            done += t.bytes.len();
        }
        // Decode's down block-columns ([`DownBlocks`]), each a matrix of `n_embd` rows.
        let embd = self.config.n_embd as usize;
        let (experts, f) = (
            self.config.n_expert.max(1) as usize,
            self.config.ffn_per_expert() as usize,
        );
        if let Some(blocks) = self.down_blocks.as_mut().filter(|_| ffn_too) {
            let m = blocks.neurons;
            for (l, layer) in self.layers.iter().enumerate() {
                let down = &layer.down;
                if !interleavable(down.ty) || !embd.is_multiple_of(GROUP_ROWS) {
                    continue;
                }
                let data = &mut blocks.layers[l];
                let mut at = 0;
                for _ in 0..experts {
                    for start in (0..f).step_by(m) {
                        let cols = m.min(f - start);
                        let len = embd * crate::quant::row_bytes(down.ty, cols)?;
                        interleave_in_place(down.ty, &mut data[at..at + len], embd, cols)?;
                        at += len;
                    }
                }
                blocks.layouts[l] = Layout::X8 { skip: 0 };
                done += at;
            }
        }
        Ok(done)
    }

    /// Re-lays every layer's down projection as block-columns of `neurons` columns
    /// ([`DownBlocks`]), which decode clusters of that size then read instead of slices of the
    /// file's rows (prefill keeps the whole matrix for its GEMM). `neurons` is rounded up to
    /// whole blocks, as the scheduler cuts decode clusters (`cut_into_clusters`). Not for
    /// neuron stores (their bundles are laid out so already) nor models held resident-only.
    pub(crate) fn cluster_down_projections(&mut self, neurons: usize) {
        if self.store.is_some() || self.resident_only || self.layers.is_empty() {
            return;
        }
        let granule = self.ffn_granule() as usize;
        let m = neurons.max(1).div_ceil(granule) * granule;
        let embd = self.config.n_embd as usize;
        let mut layers = Vec::with_capacity(self.layers.len());
        for (li, l) in self.layers.iter().enumerate() {
            let (bs, ts) = (l.down.ty.block_size(), l.down.ty.type_size());
            let stride = l.down.row_bytes();
            let mut out = Vec::with_capacity(self.mat(&l.down).data.len());
            // Expert by expert (one expert: the whole matrix), each cut as the scheduler cuts.
            for e in 0..self.config.n_expert.max(1) as usize {
                let f = self.config.ffn_per_expert() as usize;
                let (down, _) = self.down_columns(li, e * f..(e + 1) * f);
                for start in (0..f).step_by(m) {
                    let cols = m.min(f - start);
                    let (from, len) = (start / bs * ts, cols / bs * ts);
                    for r in 0..embd {
                        let row = &down.data[r * stride..];
                        out.extend_from_slice(&row[from..from + len]);
                    }
                }
            }
            layers.push(out);
        }
        self.down_blocks = Some(DownBlocks {
            neurons: m,
            layouts: vec![Layout::Rows; layers.len()],
            layers,
        });
    }
}
