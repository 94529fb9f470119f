//! The layout of a phase's output: one contiguous block per cluster.
//!
//! Every cluster writes only its own block, handed to it as `&mut` (no `unsafe`), at the same
//! offset whichever group computes it (the layouts are in `executor.rs`'s module comment).
//! Here: splitting a buffer into those blocks, kept inline so the decode hot path allocates
//! nothing ([`Blocks`]), the span a group's part occupies, and gathering row blocks back into
//! token rows.

use crate::model::Model;
use crate::neuron::Phase;
use crate::schedule::Program;
use std::ops::Range;

/// A cluster's units as indices.
pub(super) fn units(r: &Range<u32>) -> Range<usize> {
    r.start as usize..r.end as usize
}

/// The output blocks of a row phase: cluster `c` owning rows `a..b` writes `[token][b - a]` at
/// offset `n * a` of `blocks`, which holds `[cluster][token][rows]` for all `total_rows`.
pub(super) fn row_blocks<'a>(
    blocks: &'a mut Vec<f32>,
    clusters: &[Range<u32>],
    n: usize,
    total_rows: usize,
) -> Blocks<'a> {
    grow(blocks, n * total_rows);
    let first = clusters.first().map_or(0, |r| r.start as usize);
    let len: usize = clusters.iter().map(|r| r.len()).sum();
    split_blocks(
        &mut blocks[n * first..n * (first + len)],
        clusters.iter().map(|r| n * r.len()),
    )
}

/// Makes `buf` hold at least `len` values. Buffers never shrink: phases of different sizes
/// follow each other, and re-zeroing on every regrowth would cost more than the memory.
pub(super) fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// Splits `buf` into consecutive blocks of the given lengths.
pub(super) fn split_blocks(mut buf: &mut [f32], lens: impl Iterator<Item = usize>) -> Blocks<'_> {
    let mut out = Blocks::new();
    for len in lens {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(len);
        out.push(head);
        buf = tail;
    }
    out
}

/// Blocks a computation writes, one per cluster it was sent, kept inline so the decode hot
/// path allocates nothing for them. In memory one message can carry a whole output projection:
/// 2048-row clusters of a 262k vocabulary (Gemma-3) are 128 of them. A larger message spills
/// to the heap, which is correct, only slower.
pub(super) type Blocks<'a> = smallvec::SmallVec<[&'a mut [f32]; INLINE_BLOCKS]>;

pub(super) const INLINE_BLOCKS: usize = 128;

/// The span of a phase's output that clusters `part` (indices) occupy for `n` token rows, laid
/// out as in `executor.rs`'s module comment.
pub(super) fn part_span(
    model: &Model,
    program: &Program,
    phase: Phase,
    n: usize,
    part: &Range<u32>,
) -> Range<usize> {
    let clusters = program.clusters(phase);
    let c = model.config();
    let (first, last) = (
        &clusters[part.start as usize],
        &clusters[part.end as usize - 1],
    );
    match phase {
        Phase::QkvHeads | Phase::AttnHeads => {
            let per_head = n * c.head_dim as usize;
            first.start as usize * per_head..last.end as usize * per_head
        }
        Phase::FfnNeurons => {
            let per_cluster = n * c.n_embd as usize;
            part.start as usize * per_cluster..part.end as usize * per_cluster
        }
        _ => n * first.start as usize..n * last.end as usize,
    }
}

/// Gathers row blocks `[cluster][token][rows]` into `[token][width]`.
pub(super) fn gather_row_blocks(
    blocks: &[f32],
    clusters: &[Range<u32>],
    n: usize,
    width: usize,
    out: &mut [f32],
) {
    for r in clusters {
        let rows = units(r);
        let m = rows.len();
        let block = &blocks[n * rows.start..n * rows.end];
        for t in 0..n {
            out[t * width + rows.start..t * width + rows.end]
                .copy_from_slice(&block[t * m..(t + 1) * m]);
        }
    }
}
