//! A layer's FFN weights as the profiler reads them, whatever layout the engine loaded them in:
//! a model file in its own row layout or with its K-quant rows interleaved 8 by 8 at load, or a
//! neuron store's bundles (in memory, or on storage under a budget, where the profiler maps the
//! store itself). Every path gives the same gate and up projections, bit for bit, as the
//! kernels do; the down projection's column norms come from its rows in the file's layout.

use conductor_runtime::model::{Model, ModelError, WeightSource};
use conductor_runtime::quant::interleave::row_bytes_of;
use conductor_runtime::quant::{activation_type, dequantize_row, Kernels, Layout, MatRef};
use conductor_runtime::store::DownLayout;
use std::path::Path;

/// The FFN weights of a model, for the profiler.
pub struct FfnWeights<'a> {
    model: &'a Model,
}

impl<'a> FfnWeights<'a> {
    pub fn new(model: &'a Model) -> FfnWeights<'a> {
        FfnWeights { model }
    }

    /// A store that `model` (loaded from `path`) holds on storage (under a budget), mapped
    /// whole for the profile to read its bundles; `None` when `model` holds its FFN itself.
    pub fn map_if_on_storage(model: &Model, path: &Path) -> Result<Option<Model>, ModelError> {
        if model.store().is_some() && model.resident_only() {
            return Model::open(path, WeightSource::Mapped).map(Some);
        }
        Ok(None)
    }

    fn model(&self) -> &Model {
        self.model
    }

    /// `out[t][j]` = gate (`up = false`) or up (`up = true`) projection of neuron `j` for
    /// token `t` of `x` (`[token][n_embd]`), with the kernels decode uses.
    pub fn project(&self, kernels: &Kernels, l: usize, up: bool, x: &[f32]) -> Vec<f32> {
        let model = self.model();
        let c = model.config();
        let (embd, ff) = (c.n_embd as usize, c.n_ff as usize);
        let n = x.len() / embd;
        let mut out = vec![0f32; n * ff];
        let mut mats: Vec<(usize, MatRef<'_>)> = Vec::new();
        match model.store() {
            None => {
                let layer = &model.layers()[l];
                mats.push((0, model.mat(if up { &layer.up } else { &layer.gate })));
            }
            Some(store) => {
                let layout = store.layout_of(l as u32);
                for b in 0..layout.n_bundles {
                    let bundle = layout.split(b, model.bundle_bytes(l, b));
                    let first = layout.neurons_of(b).start as usize;
                    mats.push((first, if up { bundle.up } else { bundle.gate }));
                }
            }
        }
        let mut acts = Vec::new();
        for (first, mat) in mats {
            let at = activation_type(mat.ty);
            let row = at.bytes_for(embd as u64).expect("whole blocks") as usize;
            if acts.len() != n * row {
                acts = vec![0u8; n * row];
                for (src, dst) in x.chunks_exact(embd).zip(acts.chunks_exact_mut(row)) {
                    kernels.quantize_activations(mat.ty, src, dst);
                }
            }
            if n > 0 {
                kernels.matmul(mat, &acts, n, &mut out[first..], ff);
            }
        }
        out
    }

    /// The Euclidean norm of every column of layer `l`'s down projection (one per neuron).
    pub fn down_norms(&self, l: usize) -> Vec<f32> {
        let model = self.model();
        let ff = model.config().n_ff as usize;
        let mut sq = vec![0f64; ff];
        match model.store() {
            None => {
                let down = &model.layers()[l].down;
                add_column_squares(&model.mat(down), 0, &mut sq);
            }
            Some(store) => {
                let layout = store.layout_of(l as u32);
                for b in 0..layout.n_bundles {
                    let bundle = layout.split(b, model.bundle_bytes(l, b));
                    let first = layout.neurons_of(b).start as usize;
                    match bundle.down_layout {
                        // One row per neuron: its column's squares sum to one value.
                        DownLayout::NeuronColumns => {
                            let mut row = vec![0f32; bundle.down.cols];
                            for r in 0..bundle.down.rows {
                                row_of(&bundle.down, r, &mut row);
                                sq[first + r] = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
                            }
                        }
                        DownLayout::BlockColumns => {
                            add_column_squares(&bundle.down, first, &mut sq)
                        }
                    }
                }
            }
        }
        sq.iter().map(|s| s.sqrt() as f32).collect()
    }
}

/// `sq[first + c] += Σ_r w[r][c]²` over the rows of `w`.
fn add_column_squares(w: &MatRef<'_>, first: usize, sq: &mut [f64]) {
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        row_of(w, r, &mut row);
        for (s, v) in sq[first..first + w.cols].iter_mut().zip(&row) {
            *s += (*v as f64) * (*v as f64);
        }
    }
}

/// Row `r` of `w` dequantized, from the file layout's bytes in either layout.
fn row_of(w: &MatRef<'_>, r: usize, out: &mut [f32]) {
    let stride = w.stride();
    let interleaved;
    let bytes = match w.layout {
        Layout::Rows => &w.data[r * stride..(r + 1) * stride],
        Layout::X8 { .. } => {
            interleaved = row_bytes_of(*w, r).expect("a valid interleaved matrix");
            &interleaved[..]
        }
    };
    dequantize_row(w.ty, bytes, out).expect("a model's matrices dequantize");
}
