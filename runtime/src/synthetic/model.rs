//! A model ready to be written: how each tensor's data is made, cut into chunks of rows made
//! from the spec alone, and written to a stream or built in memory.

use std::ops::Range;

use super::noise::{Jumps, Noise, STEPS_PER_NORMAL};
use super::sparsity::{Role, Shift};
use super::SyntheticSpec;
use crate::gguf::{GgufError, GgufWriter, TensorDataWriter};
use crate::quant::{quantize_row, GgmlType};

/// How one tensor's values are made.
#[derive(Clone, Debug)]
pub(super) enum Values {
    /// Given (norm weights, biases), written as F32.
    Given(Vec<f32>),
    /// Noise of deviation `std`, row after row from value `at` of the noise stream, then
    /// shaped by the shift's rules for `role`.
    Random { at: u64, std: f32, role: Role },
}

#[derive(Clone, Debug)]
pub(super) struct Planned {
    /// Rows of all experts together; a vector is one row.
    pub(super) rows: u64,
    pub(super) cols: usize,
    /// Rows of one expert's matrix.
    pub(super) per_matrix: u64,
    pub(super) ty: GgmlType,
    pub(super) values: Values,
}

/// A piece of one tensor's data: rows `rows` of tensor `tensor` (in file order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub tensor: usize,
    pub rows: Range<u64>,
}

/// A model ready to be written: its header and how to make each tensor's data.
pub struct SyntheticModel {
    pub(super) header: GgufWriter,
    pub(super) planned: Vec<Planned>,
    pub(super) start: u64,
    pub(super) jumps: Jumps,
    pub(super) shift: Shift,
}

impl SyntheticModel {
    /// The header: metadata and tensor descriptors, no data.
    pub fn header(&self) -> &GgufWriter {
        &self.header
    }

    /// Bytes of all tensor data (without alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.header.tensors().iter().map(|t| t.n_bytes).sum()
    }

    /// The data in file order, cut into chunks of whole rows of at most `max_bytes` each (a
    /// row larger than that is a chunk alone).
    pub fn chunks(&self, max_bytes: u64) -> Vec<Chunk> {
        let mut out = Vec::new();
        for (tensor, (p, t)) in self.planned.iter().zip(self.header.tensors()).enumerate() {
            let row_bytes = t.n_bytes / p.rows;
            let per = (max_bytes / row_bytes.max(1)).max(1);
            let mut r = 0;
            while r < p.rows {
                let end = (r + per).min(p.rows);
                out.push(Chunk {
                    tensor,
                    rows: r..end,
                });
                r = end;
            }
        }
        out
    }

    /// The bytes of `chunk`, as they are in the file.
    pub fn chunk_data(&self, chunk: &Chunk) -> Vec<u8> {
        let p = &self.planned[chunk.tensor];
        let row_bytes =
            p.ty.bytes_for(p.cols as u64)
                .expect("checked by the header") as usize;
        let n_rows = (chunk.rows.end - chunk.rows.start) as usize;
        let mut out = vec![0u8; n_rows * row_bytes];
        let (at, std, role) = match &p.values {
            Values::Given(v) => {
                for (d, s) in out.chunks_exact_mut(4).zip(v) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
                return out;
            }
            Values::Random { at, std, role } => (*at, *std, *role),
        };
        let first = at + chunk.rows.start * p.cols as u64;
        let mut noise = Noise(self.jumps.jump(self.start, first * STEPS_PER_NORMAL));
        let mut row = vec![0f32; p.cols];
        for (r, dst) in chunk.rows.clone().zip(out.chunks_exact_mut(row_bytes)) {
            for v in row.iter_mut() {
                *v = noise.normal(std);
            }
            self.shape_row(role, r, p, std, &mut row);
            quantize_row(p.ty, &row, dst).expect("quantizable type");
        }
        out
    }

    /// Writes every tensor's data in order, `progress(done, total)` in bytes after each chunk.
    pub fn write_data<W: std::io::Write>(
        &self,
        stream: &mut TensorDataWriter<'_, W>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), GgufError> {
        let total = self.data_bytes();
        let mut done = 0;
        for c in self.chunks(CHUNK_BYTES) {
            let data = self.chunk_data(&c);
            stream.write_chunk(&data)?;
            done += data.len() as u64;
            progress(done, total);
        }
        Ok(())
    }
}

/// Default chunk size: a few MiB of values in flight per chunk.
pub const CHUNK_BYTES: u64 = 2 << 20;

/// Builds the model in memory; write it with [`GgufWriter::write_file_atomic`] or `to_bytes`.
/// For large models use [`SyntheticModel`], which streams.
pub fn synthetic_model(spec: &SyntheticSpec) -> Result<GgufWriter, GgufError> {
    let model = SyntheticModel::new(spec)?;
    let header = model.header();
    let mut w = GgufWriter::new();
    for (k, v) in header.metadata() {
        w.add_metadata(k.clone(), v.clone())?;
    }
    let mut chunks = model.chunks(u64::MAX).into_iter();
    for t in header.tensors() {
        let c = chunks.next().expect("one chunk per tensor");
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, model.chunk_data(&c))?;
    }
    Ok(w)
}
