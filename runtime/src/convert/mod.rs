//! `conductor convert`: an ordinary GGUF model in, a neuron store (`crate::store`'s format)
//! out. Apart from the store's format so that the store does not depend on the model.

use crate::gguf::GgufError;
use crate::gguf::{Array, GgufWriter, Value};
use crate::model::ModelError;
use crate::model::{Model, WeightSource};
use crate::plan::FfnActivation;
use crate::quant::interleave::{interleavable, interleave_in_place};
use crate::quant::{transpose_requantize_cols, GgmlType};
use crate::store::{
    bundle_tensor_name, BundleLayout, DownLayout, PageCrcs, StoreError, CRC_TENSOR,
    DEFAULT_BUNDLE_NEURONS, DEFAULT_DOWN_TYPE, KEY_BUNDLE_NEURONS, KEY_BUNDLE_STRIDE,
    KEY_DOWN_LAYOUT, KEY_DOWN_TYPES, KEY_FFN_TYPES, KEY_INTERLEAVED, KEY_SOURCE_CHECKSUM,
    KEY_SOURCE_NAME, KEY_VERSION, PAGE_CRC_TENSOR, STORE_ALIGN, STORE_VERSION,
    STORE_VERSION_INTERLEAVED,
};
use std::path::Path;

/// Why a conversion failed: the source model, or the store it would make.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl From<GgufError> for ConvertError {
    fn from(e: GgufError) -> ConvertError {
        ConvertError::Store(e.into())
    }
}

/// How to lay out a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Neurons per bundle: one FFN cluster, one read.
    pub bundle_neurons: u32,
    /// `None`: chosen for the model ([`chosen_down_layout`]).
    pub down_layout: Option<DownLayout>,
    /// Type of the re-quantized down columns (neuron columns only; block-columns keep the
    /// source's type).
    pub down_type: GgmlType,
    /// Interleave the Q4_K and Q6_K parts of block-columns bundles 8 rows by 8
    /// ([`BundleLayout::interleaved`]; neuron-column stores, read row by row, never are).
    pub interleave: bool,
    /// Replace an existing output file.
    pub overwrite: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            bundle_neurons: DEFAULT_BUNDLE_NEURONS,
            down_layout: Some(DownLayout::NeuronColumns),
            down_type: DEFAULT_DOWN_TYPE,
            interleave: true,
            overwrite: false,
        }
    }
}

impl ConvertOptions {
    /// Block-columns (exact) with `bundle_neurons` per bundle.
    pub fn block_columns(bundle_neurons: u32) -> ConvertOptions {
        ConvertOptions {
            bundle_neurons,
            down_layout: Some(DownLayout::BlockColumns),
            ..ConvertOptions::default()
        }
    }

    /// Neuron columns of the default type with `bundle_neurons` per bundle.
    pub fn neuron_columns(bundle_neurons: u32) -> ConvertOptions {
        ConvertOptions {
            bundle_neurons,
            ..ConvertOptions::default()
        }
    }

    pub fn overwriting(mut self) -> ConvertOptions {
        self.overwrite = true;
        self
    }

    /// Bundles in the source's row layout, not interleaved.
    pub fn rows_as_in_the_source(mut self) -> ConvertOptions {
        self.interleave = false;
        self
    }
}

/// The down layout a conversion without one asked for gives `model` with bundles of
/// `bundle_neurons`: block-columns (the source's quant blocks bit for bit) for every FFN whose
/// decode is dense by default (all but ReLU's), where each layer's down blocks fit the bundle;
/// neuron columns (re-quantized to [`DEFAULT_DOWN_TYPE`]) for ReLU models, whose sparse decode
/// reads and computes neuron by neuron. Dense decode of block-columns reads the source's bytes
/// (a Q4_K_M file's Q4_K and Q6_K: 4.5-6.6 bits a weight against Q8_0's 8.5) and computes
/// them with the row kernels: Qwen2.5-Coder-1.5B decoded 1.72x faster from it with a budget of
/// 100% of its file, 1.15x at 25% and as fast at 50% (medians of 3, `docs/benchmarks.md`).
pub fn chosen_down_layout(model: &Model, bundle_neurons: u32) -> DownLayout {
    let dense_by_default = model.config().activation != FfnActivation::Relu;
    let fits = model
        .layers()
        .iter()
        .all(|l| (bundle_neurons as usize).is_multiple_of(l.down.ty.block_size()));
    if dense_by_default && fits {
        DownLayout::BlockColumns
    } else {
        DownLayout::NeuronColumns
    }
}

/// What a conversion produced.
#[derive(Clone, Debug)]
pub struct ConvertSummary {
    /// The widest layer's layout.
    pub layout: BundleLayout,
    /// Each layer's down type (block-columns keep the source's, which may differ by layer).
    pub down_types: Vec<GgmlType>,
    /// Bytes of tensors kept as they were (embeddings, attention, norms, output).
    pub resident_bytes: u64,
    /// Bytes of all layers' bundles, padding included.
    pub bundle_bytes: u64,
    pub source_crc32: u32,
}

/// Converts the model at `src` into a neuron store at `dst` laid out as `options` say. `dst` is
/// written atomically and never over an existing file unless `options.overwrite`;
/// `progress(done, total)` follows the bytes written.
pub fn convert(
    src: &Path,
    dst: &Path,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertSummary, ConvertError> {
    let bundle_neurons = options.bundle_neurons;
    let refuse = |why: String| StoreError::Output {
        path: dst.display().to_string(),
        why,
    };
    if let (Ok(a), Ok(b)) = (src.canonicalize(), dst.canonicalize()) {
        if a == b {
            return Err(refuse("it is the model being converted".into()).into());
        }
    }
    if dst.exists() && !options.overwrite {
        return Err(refuse("the file exists (pass --force to replace it)".into()).into());
    }
    let model = Model::open(src, WeightSource::Mapped)?;
    if let Some(store) = model.store() {
        return Err(StoreError::AlreadyStore {
            path: src.display().to_string(),
            source_name: store.source_name.clone(),
        }
        .into());
    }
    let file = model.file();
    let source_crc32 = source_checksum(file);
    let c = model.config();
    let first = &model.layers()[0];
    // Neuron columns re-quantize every layer's down projection to one type; block-columns keep
    // the down projection's blocks, whose type may differ from layer to layer (a Q4_K_M file's
    // mix Q4_K and Q6_K): each layer gets its own, and the widest sets the stride. Gate and up
    // must share a type across layers either way.
    let down_layout = options
        .down_layout
        .unwrap_or_else(|| chosen_down_layout(&model, bundle_neurons));
    let keeps_down = down_layout == DownLayout::BlockColumns;
    for l in model.layers() {
        let pairs = [(&l.gate, &first.gate), (&l.up, &first.up)];
        if let Some((t, f)) = pairs.into_iter().find(|(t, f)| t.ty != f.ty) {
            return Err(StoreError::Layout(format!(
                "layers quantize their FFN differently ({} is {}, {} is {}); the store needs one type for every layer's gate and for every layer's up",
                t.name, t.ty, f.name, f.ty
            ))
            .into());
        }
    }
    let down_types: Vec<_> = match keeps_down {
        true => model.layers().iter().map(|l| l.down.ty).collect(),
        false => vec![options.down_type; model.layers().len()],
    };
    let layout_with = |down| {
        BundleLayout::new(
            c.n_embd,
            c.n_ff,
            [first.gate.ty, first.up.ty, down],
            down_layout,
            bundle_neurons,
        )
    };
    // Format 5 only where some part has an interleaved form.
    let interleaved = options.interleave
        && keeps_down
        && [first.gate.ty, first.up.ty]
            .iter()
            .chain(&down_types)
            .any(|&ty| interleavable(ty));
    let mut layout = layout_with(down_types[0])?.with_interleaved(interleaved);
    for &ty in &down_types {
        let other = layout_with(ty)?;
        if other.stride > layout.stride {
            layout = other.with_interleaved(interleaved);
        }
    }
    let types = [layout.gate_ty, layout.up_ty, layout.down_ty];
    let layers: Vec<BundleLayout> = down_types
        .iter()
        .map(|&ty| layout.with_down_type(ty))
        .collect::<Result<_, _>>()?;
    let mixed = down_types.iter().any(|&t| t != layout.down_ty);
    // A bundle is one cluster, and clusters never mix experts.
    if c.is_moe() && !c.ffn_per_expert().is_multiple_of(bundle_neurons) {
        return Err(StoreError::Layout(format!(
            "bundles of {bundle_neurons} neurons would straddle experts of {} neurons: pick a bundle size that divides {}",
            c.ffn_per_expert(),
            c.ffn_per_expert()
        )).into());
    }

    let ffn = match c.is_moe() {
        true => ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"],
        false => ["ffn_gate", "ffn_up", "ffn_down"],
    };
    let ffn_names: Vec<String> = (0..c.n_layer)
        .flat_map(|l| ffn.map(|t| format!("blk.{l}.{t}.weight")))
        .collect();
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(STORE_ALIGN as u32))?;
    for (k, v) in file.metadata() {
        if k != "general.alignment" {
            w.add_metadata(k.clone(), v.clone())?;
        }
    }
    let version = match interleaved {
        true => STORE_VERSION_INTERLEAVED,
        false => STORE_VERSION,
    };
    w.add_metadata(KEY_VERSION, Value::U32(version))?;
    if interleaved {
        w.add_metadata(KEY_INTERLEAVED, Value::Bool(true))?;
    }
    w.add_metadata(KEY_BUNDLE_NEURONS, Value::U32(bundle_neurons))?;
    w.add_metadata(KEY_BUNDLE_STRIDE, Value::U64(layout.stride))?;
    w.add_metadata(KEY_SOURCE_CHECKSUM, Value::U32(source_crc32))?;
    let source_name = src.file_name().map_or_else(
        || src.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    w.add_metadata(KEY_SOURCE_NAME, Value::String(source_name))?;
    w.add_metadata(KEY_DOWN_LAYOUT, Value::String(down_layout.name().into()))?;
    w.add_metadata(
        KEY_FFN_TYPES,
        Value::Array(Array::U32(types.iter().map(|t| t.id()).collect())),
    )?;
    if mixed {
        w.add_metadata(
            KEY_DOWN_TYPES,
            Value::Array(Array::U32(down_types.iter().map(|t| t.id()).collect())),
        )?;
    }
    let resident: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| !ffn_names.contains(&t.name))
        .collect();
    let mut resident_bytes = 0;
    for t in &resident {
        w.add_tensor_info(t.name.clone(), t.dims.clone(), t.ty)?;
        resident_bytes += t.n_bytes;
    }
    for l in 0..c.n_layer {
        w.add_tensor_info(
            bundle_tensor_name(l),
            vec![layout.stride, u64::from(layout.n_bundles)],
            crate::quant::GgmlType::I8,
        )?;
    }
    let n_crc = c.n_layer as u64 * u64::from(layout.n_bundles);
    w.add_tensor_info(CRC_TENSOR, vec![n_crc], crate::quant::GgmlType::I32)?;
    // Every page of every tensor above, in file order (`PageCrcs::covered`).
    let n_pages = PageCrcs::n_pages(
        resident
            .iter()
            .map(|t| t.n_bytes)
            .chain((0..c.n_layer).map(|_| layout.layer_bytes())),
    );
    w.add_tensor_info(PAGE_CRC_TENSOR, vec![n_pages], crate::quant::GgmlType::I32)?;

    let bundle_bytes = layout.layer_bytes() * u64::from(c.n_layer);
    let total = resident_bytes + bundle_bytes;
    let mut done = 0;
    progress(0, total);
    // Everything streams: the source is read through its map piece by piece, and each piece's
    // pages are released once written (a source larger than memory must not fill it, nor a
    // memory cgroup's page cache); the output is synced and dropped from the page cache as it
    // goes (`StreamedFile`). What is held at once is a chunk, one bundle, one strip of down
    // columns and the checksums.
    w.write_file_atomic_with(dst, |stream| -> Result<(), StoreError> {
        let mut pages = Vec::with_capacity(n_pages as usize * 4);
        for t in &resident {
            let start = file.data_offset() + t.offset;
            let data = file.tensor_data(t);
            for (i, chunk) in data.chunks(CHUNK_BYTES).enumerate() {
                // Chunks are whole pages but for a tensor's last.
                PageCrcs::push_pages(chunk, &mut pages);
                stream.write_chunk(chunk)?;
                let at = start + (i * CHUNK_BYTES) as u64;
                file.release_pages(at..at + chunk.len() as u64);
            }
            done += t.n_bytes;
            progress(done, total);
        }
        let mut crcs = Vec::with_capacity(n_crc as usize * 4);
        let mut bundle = vec![0u8; layout.stride as usize];
        let mut strip = DownStrip::default();
        for (li, l) in model.layers().iter().enumerate() {
            for b in 0..layout.n_bundles {
                let len = fill_bundle(&model, li, &layers[li], b, &mut strip, &mut bundle)?;
                crcs.extend_from_slice(&crc32fast::hash(&bundle[..len]).to_le_bytes());
                PageCrcs::push_pages(&bundle, &mut pages);
                stream.write_chunk(&bundle)?;
            }
            for t in [&l.gate, &l.up, &l.down] {
                file.release_pages(t.bytes.start as u64..t.bytes.end as u64);
            }
            done += layout.layer_bytes();
            progress(done, total);
        }
        stream.write_chunk(&crcs)?;
        stream.write_chunk(&pages)?;
        Ok(())
    })?;
    Ok(ConvertSummary {
        layout,
        down_types,
        resident_bytes,
        bundle_bytes,
        source_crc32,
    })
}

/// Bytes the source is read in (and its pages released after) while converting.
const CHUNK_BYTES: usize = 8 << 20;

/// The CRC-32 of the whole source file, read chunk by chunk, each chunk's pages released after.
fn source_checksum(file: &crate::gguf::GgufFile) -> u32 {
    let bytes = file.file_bytes().expect("a model loaded whole is mapped");
    let mut crc = crc32fast::Hasher::new();
    for (i, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        crc.update(chunk);
        let at = (i * CHUNK_BYTES) as u64;
        file.release_pages(at..at + chunk.len() as u64);
    }
    crc.finalize()
}

/// Neurons whose down columns are transposed together: a one-neuron bundle alone would
/// dequantize a 64-column strip of every row for its one column (a 7B shape's convert took
/// 295 s that way, 31 s in strips).
const STRIP_NEURONS: usize = 256;

/// Down columns of a run of neurons of one layer, transposed and re-quantized (one output row
/// per neuron): what consecutive bundles copy their columns from.
#[derive(Default)]
struct DownStrip {
    layer: usize,
    neurons: std::ops::Range<usize>,
    row_bytes: usize,
    rows: Vec<u8>,
}

impl DownStrip {
    /// The re-quantized down columns of `neurons` (within one expert) of layer `li`,
    /// transposing the next strip when they are not held.
    fn columns(
        &mut self,
        model: &Model,
        li: usize,
        layout: &BundleLayout,
        neurons: std::ops::Range<usize>,
    ) -> Result<&[u8], StoreError> {
        let held = self.layer == li
            && self.neurons.start <= neurons.start
            && neurons.end <= self.neurons.end;
        if !held {
            let per_expert = model.config().ffn_per_expert() as usize;
            let expert_end = (neurons.start / per_expert + 1) * per_expert;
            let end = expert_end.min((neurons.start + STRIP_NEURONS).max(neurons.end));
            let l = &model.layers()[li];
            let (down, cols) = model.down_columns(li, neurons.start..end);
            self.row_bytes = crate::quant::row_bytes(layout.down_ty, down.rows)
                .map_err(|e| quant_error(l, layout, e))?;
            self.rows.resize(self.row_bytes * cols.len(), 0);
            transpose_requantize_cols(down, cols, layout.down_ty, &mut self.rows)
                .map_err(|e| quant_error(l, layout, e))?;
            (self.layer, self.neurons) = (li, neurons.start..end);
        }
        let from = (neurons.start - self.neurons.start) * self.row_bytes;
        Ok(&self.rows[from..from + neurons.len() * self.row_bytes])
    }
}

/// Writes bundle `b` of layer `l` into `out` (zero-padded to the stride); returns the payload
/// length. Neuron columns come from `strip`, which transposes and re-quantizes a few hundred
/// of the down projection's columns at a time (a mixture's: of one expert), so no
/// layer-sized buffer is ever made.
fn fill_bundle(
    model: &Model,
    li: usize,
    layout: &BundleLayout,
    b: u32,
    strip: &mut DownStrip,
    out: &mut [u8],
) -> Result<usize, StoreError> {
    out.fill(0);
    let l = &model.layers()[li];
    let neurons = layout.neurons_of(b);
    let rows = neurons.start as usize..neurons.end as usize;
    let mut at = 0;
    for t in [&l.gate, &l.up] {
        let src = model.rows(t, rows.clone()).data;
        out[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    if layout.down_layout == DownLayout::NeuronColumns {
        let columns = strip.columns(model, li, layout, rows)?;
        out[at..at + columns.len()].copy_from_slice(columns);
        at += columns.len();
        debug_assert_eq!(at, layout.payload_bytes(neurons.len() as u32));
        return Ok(at);
    }
    // The down projection's columns `rows` (of the bundle's expert in a mixture): whole
    // blocks of each of its rows.
    let (down, cols) = model.down_columns(li, rows);
    let row = down.stride();
    let per_block = l.down.ty.type_size();
    let block = l.down.ty.block_size();
    let (from, to) = (cols.start / block * per_block, cols.end / block * per_block);
    for r in 0..down.rows {
        let src = &down.data[r * row + from..r * row + to];
        out[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    debug_assert_eq!(at, layout.payload_bytes(neurons.len() as u32));
    interleave_parts(layout, b, &mut out[..at])
        .map_err(|e| StoreError::Layout(format!("cannot interleave layer {li} bundle {b}: {e}")))?;
    Ok(at)
}

/// Rearranges each part of bundle `b` (its bytes `payload`, in the row layout) that `layout`
/// stores interleaved into groups of 8 rows.
fn interleave_parts(
    layout: &BundleLayout,
    b: u32,
    payload: &mut [u8],
) -> Result<(), crate::quant::QuantError> {
    let parts = layout.split(b, payload);
    let spans: Vec<_> = [parts.gate, parts.up, parts.down]
        .iter()
        .map(|p| (p.ty, p.rows, p.cols, p.layout, p.data.len()))
        .collect();
    let mut at = 0;
    for (ty, rows, cols, part_layout, len) in spans {
        if let crate::quant::Layout::X8 { .. } = part_layout {
            interleave_in_place(ty, &mut payload[at..at + len], rows, cols)?;
        }
        at += len;
    }
    Ok(())
}

fn quant_error(
    l: &crate::model::LayerWeights,
    layout: &BundleLayout,
    e: crate::quant::QuantError,
) -> StoreError {
    StoreError::Layout(format!(
        "cannot re-quantize `{}` into {} columns: {e}",
        l.down.name, layout.down_ty
    ))
}

#[cfg(test)]
mod tests;
