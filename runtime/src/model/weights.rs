//! The model's tensors, located in the (memory-mapped) GGUF file and checked against the config.

use super::config::{Architecture, ModelConfig};
use super::ModelError;
use crate::gguf::GgufFile;
use crate::plan::{ModelDescription, ModelShape, WeightTypes};
use crate::quant::{dequantize_row, GgmlType, Layout, MatRef};
use crate::store::{bundle_tensor_name, StoreInfo};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;

mod layout;
mod load;

pub use layout::{DecodeLayout, DownBlocks};
pub use load::{LoadOptions, WeightSource};

/// A 2-D weight matrix inside the model file: `rows` rows of `cols` elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Byte range in the file.
    pub bytes: Range<usize>,
    /// How the rows lie in those bytes: the file's layout, or interleaved at load
    /// ([`Model::laid_out`]).
    pub layout: Layout,
}

impl TensorRef {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.ty.bytes_for(self.cols as u64).unwrap_or(0) as usize
    }

    /// The matrix cut into consecutive runs of `rows` rows (which add up to its own): the
    /// parts of a fused matrix, each named `NAME[i]`.
    fn split_rows<const N: usize>(&self, rows: [usize; N]) -> [TensorRef; N] {
        debug_assert_eq!(rows.iter().sum::<usize>(), self.rows);
        let rb = self.row_bytes();
        let mut first = 0;
        rows.each_ref().map(|&n| {
            let start = self.bytes.start + first * rb;
            let part = TensorRef {
                name: format!("{}[{}..{}]", self.name, first, first + n),
                ty: self.ty,
                rows: n,
                cols: self.cols,
                bytes: start..start + n * rb,
                layout: self.layout,
            };
            first += n;
            part
        })
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: TensorRef,
    pub wk: TensorRef,
    pub wv: TensorRef,
    pub wo: TensorRef,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// RMSNorm weights applied to each query and each key head before RoPE (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// RMSNorm weights applied to the attention's output before it joins the residual stream
    /// (Gemma 3's `post_attention_norm`).
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// RMSNorm weights applied to the FFN's output before it joins the residual stream
    /// (Gemma 3's `post_ffw_norm`).
    pub ffn_post_norm: Option<Vec<f32>>,
    /// The FFN's gate and up projections: `n_ff` rows of `n_embd`. In a mixture of experts
    /// (`ffn_gate_exps`, `ffn_up_exps`) the experts' rows follow each other, so row `j` is
    /// neuron `j` of the shared neuron space either way.
    pub gate: TensorRef,
    pub up: TensorRef,
    /// The down projection: `n_embd` rows of `n_ff`; in a mixture of experts
    /// (`ffn_down_exps`) expert-major, `n_expert × n_embd` rows of the `n_ff / n_expert`
    /// columns of one expert ([`Model::down_columns`] finds a neuron's).
    pub down: TensorRef,
    /// A mixture of experts' router (`ffn_gate_inp`): `n_expert` rows of `n_embd`, in f32
    /// (it is small, and routing in f32 keeps the choice of experts free of quantization).
    pub router: Option<Vec<f32>>,
    /// In a neuron store: the file bytes of this layer's bundles (`gate`, `up` and `down` then
    /// describe types and shapes only; their bytes are in the bundles).
    pub bundles: Option<Range<usize>>,
}

/// A loaded model: the file, its configuration, and where each weight lives.
pub struct Model {
    file: GgufFile,
    config: ModelConfig,
    tok_embd: TensorRef,
    output_norm: Vec<f32>,
    /// The output projection; the embedding matrix itself when the model ties them.
    output: TensorRef,
    layers: Vec<LayerWeights>,
    /// Per-frequency divisors of RoPE, if the model has them: Llama 3.1's `rope_freqs`, or
    /// Phi-3's LongRoPE factors for contexts up to `n_ctx_orig` (`rope_factors_short`).
    rope_freq_factors: Option<Vec<f32>>,
    /// Phi-3's LongRoPE factors for longer contexts (`rope_factors_long`).
    rope_factors_long: Option<Vec<f32>>,
    /// What a neuron store's metadata says; `None` for an ordinary model.
    store: Option<StoreInfo>,
    /// Only the resident tensors are in memory ([`WeightSource::Resident`]).
    resident_only: bool,
    /// The file it was loaded from, if any.
    path: Option<std::path::PathBuf>,
    /// Token embeddings read from the file per token (they are not in memory).
    embd_rows: Option<RowReader>,
    /// Faults injected into every read of the file after the load ([`LoadOptions::read_faults`]).
    read_faults: Option<Arc<dyn crate::read_faults::ReadFaults>>,
    /// Sparse FFN decode (thresholds, predictors, transposed down projections), if enabled:
    /// given at construction ([`LoadOptions::sparse`]), fixed afterwards.
    sparse: Option<crate::sparse::SparseFfn>,
    /// The FFN down projections re-laid per neuron cluster ([`Model::laid_out`]).
    down_blocks: Option<DownBlocks>,
}

impl DownBlocks {
    /// The block-column of layer `l` holding exactly the down columns `neurons`, when they are
    /// one cluster of this layout (a decode cluster cut with the same size); `None` otherwise,
    /// and the caller reads slices of the file's rows instead.
    pub fn columns(&self, model: &Model, l: usize, neurons: &Range<usize>) -> Option<MatRef<'_>> {
        let down = &model.layers[l].down;
        let embd = model.config.n_embd as usize;
        let per_expert = model.config.ffn_per_expert() as usize;
        let (expert, first) = (neurons.start / per_expert, neurons.start % per_expert);
        let aligned = first.is_multiple_of(self.neurons)
            && neurons.end == expert * per_expert + (first + self.neurons).min(per_expert);
        if !aligned {
            return None;
        }
        let bytes_of = |cols: usize| embd * cols / down.ty.block_size() * down.ty.type_size();
        let at = bytes_of(expert * per_expert + first);
        Some(MatRef {
            ty: down.ty,
            data: self.layers[l].get(at..at + bytes_of(neurons.len()))?,
            rows: embd,
            cols: neurons.len(),
            layout: self.layouts[l],
        })
    }
}

/// Reads rows of a tensor from the model file (one small read each, through the page cache).
struct RowReader {
    file: std::fs::File,
    /// The row's bytes as read.
    scratch: Mutex<Vec<u8>>,
}

impl Model {
    /// The RoPE frequency factors for a session of `n_ctx` tokens: the long-context ones past
    /// the context RoPE was trained for, as llama.cpp picks them.
    pub fn rope_factors(&self, n_ctx: usize) -> Option<&[f32]> {
        match &self.rope_factors_long {
            Some(long) if n_ctx > self.config.n_ctx_orig as usize => Some(long),
            _ => self.rope_freq_factors.as_deref(),
        }
    }

    /// What the file's metadata says the model is.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The token embeddings (`n_vocab` rows of `n_embd`).
    pub fn tok_embd(&self) -> &TensorRef {
        &self.tok_embd
    }

    /// The final RMSNorm's weights.
    pub fn output_norm(&self) -> &[f32] {
        &self.output_norm
    }

    /// The output projection; the embedding matrix itself when the model ties them.
    pub fn output(&self) -> &TensorRef {
        &self.output
    }

    pub fn layers(&self) -> &[LayerWeights] {
        &self.layers
    }

    /// What a neuron store's metadata says; `None` for an ordinary model.
    pub fn store(&self) -> Option<&StoreInfo> {
        self.store.as_ref()
    }

    /// Only the resident tensors are in memory ([`WeightSource::Resident`]).
    pub fn resident_only(&self) -> bool {
        self.resident_only
    }

    /// The file it was loaded from ([`Model::open`]); `None` for a model built from bytes.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The FFN down projections re-laid per neuron cluster ([`Model::laid_out`]), if they were.
    pub fn down_blocks(&self) -> Option<&DownBlocks> {
        self.down_blocks.as_ref()
    }

    /// Sparse FFN decode, if enabled.
    pub fn sparse(&self) -> Option<&crate::sparse::SparseFfn> {
        self.sparse.as_ref()
    }

    /// This model with `sparse` decode (or none), before it is shared: for models built from
    /// bytes in tests ([`Model::open`] takes it in its [`LoadOptions`]).
    #[cfg(test)]
    pub(crate) fn with_sparse(mut self, sparse: Option<crate::sparse::SparseFfn>) -> Model {
        self.sparse = sparse;
        self
    }

    /// An error when the file a memory-mapped model was loaded from was truncated or modified
    /// since ([`GgufFile::check_unchanged`]); `Ok` for a model that holds its own bytes (read
    /// into memory, or a store's resident tensors, whose other reads are checked reads).
    pub fn check_file(&self) -> Result<(), ModelError> {
        let path = self.path.as_deref().unwrap_or(Path::new("the model file"));
        Ok(self.file.check_unchanged(path)?)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let c = &config;
        let (embd, q, kv, vocab) = (
            c.n_embd as usize,
            c.q_dim() as usize,
            c.kv_dim() as usize,
            c.n_vocab as usize,
        );
        let loader = Loader { file: &file };
        let tok_embd = loader.matrix("token_embd.weight", vocab, embd)?;
        let output = match loader.file.tensor("output.weight") {
            Some(_) => loader.matrix("output.weight", vocab, embd)?,
            None => tok_embd.clone(),
        };
        let output_norm = loader.vector("output_norm.weight", embd)?;
        let factors = |name: &str| match loader.file.tensor(name) {
            Some(_) => loader.vector(name, c.rope.n_dims as usize / 2).map(Some),
            None => Ok(None),
        };
        let rope_freq_factors = match factors("rope_freqs.weight")? {
            Some(f) => Some(f),
            None => factors("rope_factors_short.weight")?,
        };
        let rope_factors_long = factors("rope_factors_long.weight")?;
        let store = StoreInfo::from_gguf(&file, c.n_embd, c.n_ff, c.n_layer)
            .map_err(|e| ModelError::Store(Box::new(e)))?;
        let per_expert = c.ffn_per_expert();
        if let Some(s) = store.as_ref().filter(|_| c.is_moe()) {
            // A bundle is one cluster, and a cluster never mixes experts.
            if !per_expert.is_multiple_of(s.layout.neurons) {
                return Err(ModelError::Store(Box::new(
                    crate::store::StoreError::Layout(format!(
                        "bundles of {} neurons straddle experts of {per_expert} neurons",
                        s.layout.neurons
                    )),
                )));
            }
        }
        if !c.is_moe() && file.tensor("blk.0.ffn_gate_exps.weight").is_some() {
            return Err(ModelError::BadValue {
                key: format!("{}.expert_count", c.arch_name),
                why: "missing, but the model has mixture-of-experts tensors (ffn_gate_exps)".into(),
            });
        }
        let n_expert = c.n_expert as usize;
        let f = per_expert as usize;
        let has_bias = c.arch == Architecture::Qwen2;
        let has_qk_norm = matches!(c.arch, Architecture::Qwen3 | Architecture::Gemma3);
        let has_post_norms = c.arch == Architecture::Gemma3;
        let hd = c.head_dim as usize;
        let mut layers = Vec::with_capacity(c.n_layer as usize);
        for i in 0..c.n_layer {
            let name = |t: &str| format!("blk.{i}.{t}");
            // In a store the FFN matrices exist only as bundles: their refs carry type and
            // shape, and a byte range no slice can use. A mixture of experts' matrices are 3-D
            // (`experts` of `rows × cols`), seen as `experts · rows` rows.
            let ffn = |t: &str, rows: usize, cols: usize, k: usize| match &store {
                Some(s) => Ok(TensorRef {
                    name: name(t),
                    ty: [s.layout.gate_ty, s.layout.up_ty, s.down_types[i as usize]][k],
                    rows: rows * n_expert.max(1),
                    cols,
                    bytes: usize::MAX..usize::MAX,
                    layout: Layout::Rows,
                }),
                None if n_expert > 0 => loader.experts(&name(t), rows, cols, n_expert),
                None => loader.matrix(&name(t), rows, cols),
            };
            let (gate_name, up_name, down_name) = if n_expert > 0 {
                (
                    "ffn_gate_exps.weight",
                    "ffn_up_exps.weight",
                    "ffn_down_exps.weight",
                )
            } else {
                ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
            };
            let bias = |t: &str, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
                let n_ = name(t);
                match (has_bias, loader.file.tensor(&n_)) {
                    (_, Some(_)) => Ok(Some(loader.vector(&n_, n)?)),
                    (true, None) => Err(ModelError::MissingTensor(n_)),
                    (false, None) => Ok(None),
                }
            };
            let norm_if = |wanted: bool, t: &str, n: usize| match wanted {
                true => loader.vector(&name(t), n).map(Some),
                false => Ok(None),
            };
            // Q, K and V fused in one matrix (`attn_qkv`, Phi-3) are its consecutive rows; so
            // are gate and up in Phi-3's `ffn_up` (gate first).
            let [wq, wk, wv] = match loader.file.tensor(&name("attn_q.weight")) {
                None if loader.file.tensor(&name("attn_qkv.weight")).is_some() => {
                    let fused = loader.matrix(&name("attn_qkv.weight"), q + 2 * kv, embd)?;
                    fused.split_rows([q, kv, kv])
                }
                _ => [
                    loader.matrix(&name("attn_q.weight"), q, embd)?,
                    loader.matrix(&name("attn_k.weight"), kv, embd)?,
                    loader.matrix(&name("attn_v.weight"), kv, embd)?,
                ],
            };
            let (gate, up) = if c.arch == Architecture::Phi3 && store.is_none() && n_expert == 0 {
                let [g, u] = loader
                    .matrix(&name("ffn_up.weight"), 2 * f, embd)?
                    .split_rows([f, f]);
                (g, u)
            } else {
                (ffn(gate_name, f, embd, 0)?, ffn(up_name, f, embd, 1)?)
            };
            layers.push(LayerWeights {
                attn_norm: loader.vector(&name("attn_norm.weight"), embd)?,
                q_norm: norm_if(has_qk_norm, "attn_q_norm.weight", hd)?,
                k_norm: norm_if(has_qk_norm, "attn_k_norm.weight", hd)?,
                attn_post_norm: norm_if(has_post_norms, "post_attention_norm.weight", embd)?,
                ffn_post_norm: norm_if(has_post_norms, "post_ffw_norm.weight", embd)?,
                wq,
                wk,
                wv,
                wo: loader.matrix(&name("attn_output.weight"), embd, q)?,
                bq: bias("attn_q.bias", q)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                ffn_norm: loader.vector(&name("ffn_norm.weight"), embd)?,
                gate,
                up,
                down: ffn(down_name, embd, f, 2)?,
                router: match n_expert {
                    0 => None,
                    _ => Some(loader.dense_f32(&name("ffn_gate_inp.weight"), n_expert, embd)?),
                },
                bundles: match &store {
                    Some(s) => {
                        let t = loader.file.tensor(&bundle_tensor_name(i)).expect("checked");
                        let start = (loader.file.data_offset() + t.offset) as usize;
                        Some(start..start + s.layout.layer_bytes() as usize)
                    }
                    None => None,
                },
            });
        }
        Ok(Model {
            file,
            config,
            tok_embd,
            output_norm,
            output,
            layers,
            rope_freq_factors,
            rope_factors_long,
            store,
            resident_only: false,
            path: None,
            embd_rows: None,
            read_faults: None,
            sparse: None,
            down_blocks: None,
        })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The whole matrix.
    pub fn mat(&self, t: &TensorRef) -> MatRef<'_> {
        self.rows(t, 0..t.rows)
    }

    /// Rows `rows` of a matrix (`rows` must lie within it).
    pub fn rows(&self, t: &TensorRef, rows: Range<usize>) -> MatRef<'_> {
        assert!(
            t.bytes.start != usize::MAX,
            "`{}` lives in the store's bundles",
            t.name
        );
        MatRef {
            ty: t.ty,
            data: self
                .file
                .bytes(t.bytes.clone())
                .unwrap_or_else(|e| panic!("`{}`: {e}", t.name)),
            rows: t.rows,
            cols: t.cols,
            layout: t.layout,
        }
        .sub_rows(rows)
    }

    /// The bytes of bundle `b` of layer `l` of a store loaded whole ([`WeightSource::Mapped`] or [`WeightSource::Read`]).
    pub fn bundle_bytes(&self, l: usize, b: u32) -> &[u8] {
        assert!(
            !self.resident_only,
            "the store's bundles are on storage, not in memory"
        );
        let store = self.store.as_ref().expect("a neuron store");
        let range = self.layers[l].bundles.as_ref().expect("a neuron store");
        let layout = store.layout_of(l as u32);
        let at = range.start + b as usize * layout.stride as usize;
        let len = layout.payload_bytes(layout.neurons_of(b).len() as u32);
        self.file
            .bytes(at..at + len)
            .expect("a store loaded whole holds its bundles")
    }

    /// The faults injected into the reads of the file after the load (the fault harness and
    /// tests: [`LoadOptions::read_faults`]); `None`, the default: none. The store's reader and
    /// the embedding-row reads take them from here.
    pub fn read_faults(&self) -> Option<&Arc<dyn crate::read_faults::ReadFaults>> {
        self.read_faults.as_ref()
    }

    /// Writes the embedding of `token` into `out` (`n_embd` values).
    pub fn embed(&self, token: u32, out: &mut [f32]) -> Result<(), ModelError> {
        if token >= self.config.n_vocab {
            return Err(ModelError::TokenOutOfRange {
                token,
                n_vocab: self.config.n_vocab,
            });
        }
        if let Some(reader) = &self.embd_rows {
            let t = &self.tok_embd;
            let rb = t.row_bytes();
            let mut buf = reader.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let buf = &mut *buf;
            let start = (t.bytes.start + token as usize * rb) as u64;
            // With page checksums the row's whole pages are read and checked (every time: a
            // row is read per token, a page or two).
            let pages = self.store.as_ref().and_then(|s| s.pages.as_ref());
            let (offset, len) = match pages {
                Some(_) => {
                    let page = crate::store::PAGE_BYTES;
                    let first = start / page * page;
                    let end = (start + rb as u64).div_ceil(page) * page;
                    let end = end.min(t.bytes.end as u64).max(start + rb as u64);
                    (first, (end - first) as usize)
                }
                None => (start, rb),
            };
            // The most any row takes, so that the scratch is allocated once, not per token.
            let most = rb + 2 * crate::store::PAGE_BYTES as usize;
            if buf.capacity() < most {
                let have = buf.len();
                buf.reserve_exact(most - have);
            }
            buf.resize(len, 0);
            let path = || {
                self.path
                    .as_deref()
                    .map_or(String::new(), |p| p.display().to_string())
            };
            let fault = crate::read_faults::ReadFault::of(self.read_faults.as_deref(), offset, len);
            let read = reader.file.read_exact_at(buf, offset).map(|()| len);
            match fault.apply(&mut [&mut buf[..]], read) {
                Ok(got) if got == len => Ok(()),
                Ok(got) => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("short read: {got} of {len} bytes"),
                )),
                Err(e) => Err(e),
            }
            .map_err(|source| crate::gguf::GgufError::Io {
                op: "read an embedding row of",
                path: path(),
                source,
            })?;
            if let Some(pages) = pages {
                pages.check_pages(offset, buf).map_err(|at| {
                    ModelError::Store(Box::new(crate::store::StoreError::PageChecksum {
                        what: format!("{}: embedding row {token}", path()),
                        offset: at,
                    }))
                })?;
            }
            let at = (start - offset) as usize;
            dequantize_row(t.ty, &buf[at..at + rb], out)?;
            return Ok(());
        }
        let row = self.rows(&self.tok_embd, token as usize..token as usize + 1);
        dequantize_row(row.ty, row.data, out)?;
        Ok(())
    }

    /// The model as the scheduler, simulator and planner see it: shape and weight types (of the
    /// first layer; llama-family files quantize every layer alike, or nearly).
    pub fn description(&self) -> ModelDescription {
        let c = &self.config;
        let out = self.output.ty;
        let ty = |f: fn(&LayerWeights) -> GgmlType| self.layers.first().map_or(out, f);
        ModelDescription {
            name: c.name.clone().unwrap_or_else(|| c.arch_name.clone()),
            shape: self.shape(),
            types: WeightTypes {
                attn_q: ty(|l| l.wq.ty),
                attn_k: ty(|l| l.wk.ty),
                attn_v: ty(|l| l.wv.ty),
                attn_out: ty(|l| l.wo.ty),
                ffn_gate: ty(|l| l.gate.ty),
                ffn_up: ty(|l| l.up.ty),
                ffn_down: ty(|l| l.down.ty),
                output: out,
            },
        }
    }

    /// The down projection's columns of FFN neurons `neurons` (which lie within one expert):
    /// the matrix of `n_embd` rows holding them (a dense model's whole down projection, or the
    /// expert's block of a mixture's) and their columns in it.
    pub fn down_columns(&self, l: usize, neurons: Range<usize>) -> (MatRef<'_>, Range<usize>) {
        let down = &self.layers[l].down;
        if !self.config.is_moe() {
            return (self.mat(down), neurons);
        }
        let embd = self.config.n_embd as usize;
        let f = self.config.ffn_per_expert() as usize;
        let e = neurons.start / f;
        debug_assert!(
            neurons.end <= (e + 1) * f,
            "clusters never straddle experts"
        );
        let cols = neurons.start - e * f..neurons.end - e * f;
        (self.rows(down, e * embd..(e + 1) * embd), cols)
    }

    /// Layer `l`'s down projection for the decode cluster `neurons` as its own contiguous
    /// block-column, when [`DownBlocks`] holds one for exactly those neurons.
    pub fn cluster_down(&self, l: usize, neurons: &Range<usize>) -> Option<MatRef<'_>> {
        self.down_blocks.as_ref()?.columns(self, l, neurons)
    }

    /// The model's shape as the scheduler sees it (a store's FFN runs as its bundles).
    pub fn shape(&self) -> ModelShape {
        let (bundle, stride) = self
            .store
            .as_ref()
            .map_or((0, 0), |s| (s.layout.neurons, s.layout.stride));
        let mut shape = self.config.shape(self.ffn_granule(), bundle, stride);
        if let Some(store) = &self.store {
            shape.ffn_bundle_gate_bytes = store.layout.gate_bytes(store.layout.neurons) as u64;
        }
        shape
    }

    /// The block size of the FFN down projection's type: FFN neuron clusters own whole blocks
    /// of its columns.
    pub fn ffn_granule(&self) -> u32 {
        self.layers
            .iter()
            .map(|l| l.down.ty.block_size() as u32)
            .max()
            .unwrap_or(1)
    }
}

struct Loader<'a> {
    file: &'a GgufFile,
}

impl Loader<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<TensorRef, ModelError> {
        self.tensor(name, vec![cols as u64, rows as u64], rows, cols)
    }

    /// A mixture of experts' 3-D matrix: `n_expert` matrices of `rows × cols` (ggml shape
    /// `[cols, rows, n_expert]`), seen as `n_expert · rows` rows of `cols`.
    fn experts(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        n_expert: usize,
    ) -> Result<TensorRef, ModelError> {
        let dims = vec![cols as u64, rows as u64, n_expert as u64];
        self.tensor(name, dims, rows * n_expert, cols)
    }

    /// Tensor `name`, checked to have ggml shape `expected` and a supported type, seen as
    /// `rows` rows of `cols`.
    fn tensor(
        &self,
        name: &str,
        expected: Vec<u64>,
        rows: usize,
        cols: usize,
    ) -> Result<TensorRef, ModelError> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if t.dims != expected {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected,
                found: t.dims.clone(),
            });
        }
        if !t.ty.is_supported() {
            return Err(ModelError::UnsupportedType {
                name: name.to_string(),
                ty: t.ty,
            });
        }
        let start = (self.file.data_offset() + t.offset) as usize;
        Ok(TensorRef {
            name: name.to_string(),
            ty: t.ty,
            rows,
            cols,
            bytes: start..start + t.n_bytes as usize,
            layout: Layout::Rows,
        })
    }

    /// A 2-D matrix of any supported type dequantized to f32, `[row][col]`.
    fn dense_f32(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.matrix(name, rows, cols)?;
        let data = self.file.bytes(t.bytes.clone())?;
        let rb = t.row_bytes();
        let mut out = vec![0.0; rows * cols];
        for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
            dequantize_row(t.ty, &data[r * rb..(r + 1) * rb], row)?;
        }
        Ok(out)
    }

    /// A 1-D tensor (norm weights, biases), converted to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if t.dims != [len as u64] {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: vec![len as u64],
                found: t.dims.clone(),
            });
        }
        if !matches!(t.ty, GgmlType::F32 | GgmlType::F16) {
            return Err(ModelError::UnsupportedType {
                name: name.to_string(),
                ty: t.ty,
            });
        }
        let mut out = vec![0.0; len];
        dequantize_row(t.ty, self.file.try_tensor_data(t)?, &mut out)?;
        Ok(out)
    }
}
