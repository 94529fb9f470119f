//! The neuron store: a GGUF file laid out for reading FFN neurons from storage in bundles.
//!
//! `conductor convert` (the `convert` module) writes it from an ordinary model. Everything but
//! the FFN matrices is copied as it was; each layer's FFN becomes one tensor `blk.N.ffn_bundles` of *bundles*, one
//! per cluster of `bundle_neurons` neurons (a multiple of the down projection's block size):
//!
//! ```text
//! bundle b, neurons i = b*m .. b*m + m:
//!   [gate rows i (m rows)] [up rows i (m rows)] [down part] [zero padding to a multiple of 4096]
//!
//! down part, by `conductor.store.down_layout`:
//!   neuron_columns: m rows of n_embd: neuron i's down column, transposed and re-quantized
//!   block_columns:  n_embd rows of m columns: the down matrix's columns i cut out row by row
//! ```
//!
//! Neuron columns (the default, as PowerInfer bundles neurons) let a bundle hold any number of
//! neurons and let sparse decode touch only the active neurons' down columns, at the cost of one
//! re-quantization of the down projection (measured in `docs/benchmarks.md`). Block-columns move
//! whole quant blocks, never re-quantized, so such a store computes exactly what its source does,
//! but a bundle is then a multiple of the down type's block size. Bundles start
//! at multiples of 4096 bytes from a 4096-aligned data section, so one `O_DIRECT` read fetches
//! a cluster straight into a cache slot.
//!
//! Two checksum tables guard what is read from storage (see [`crate::plan::Verify`] for when
//! they are checked):
//! - `conductor.bundle_crc`: the CRC-32 of each bundle's payload, `[layer][bundle]`, checked
//!   when a whole bundle is read (and for every bundle when a store is loaded whole);
//! - `conductor.page_crc` (format 3): the CRC-32 of every 4096-byte page of every other tensor
//!   (bundles included, in file order; a tensor's last page covers its own bytes only), so
//!   that reads of part of a bundle and reads of attention matrices, output rows and embedding
//!   rows can be checked page by page ([`PageCrcs`]). A format-2 store has no page table: its
//!   partial reads are not made (a bundle is read whole, and checked), and its attention and
//!   output reads cannot be checked.

#[cfg(test)]
mod tests;

use crate::gguf::{GgufError, GgufFile};
use crate::quant::interleave::{interleavable, GROUP_ROWS};
use crate::quant::{row_bytes, GgmlType, Layout, MatRef};

/// Bundles of this many neurons by default: reads of a few hundred KiB, which this machine's
/// disk serves near its sequential rate (docs/benchmarks-journal.md).
pub const DEFAULT_BUNDLE_NEURONS: u32 = 256;
/// The down columns' type by default: Q8_0 costs SmolLM2 +0.1% perplexity where Q4_1 costs more
/// (docs/benchmarks-journal.md, "neuron columns").
pub const DEFAULT_DOWN_TYPE: GgmlType = GgmlType::Q8_0;

/// Format version of the bundle layout this build writes for bundles in the source's row layout.
/// Version 1 (block-columns only, no `down_layout` key), version 2 (no page checksums) and
/// version 3 (one down type for every layer, no `down_types` key) are still read.
pub const STORE_VERSION: u32 = 4;
/// Format version of a store whose Q4_K and Q6_K parts are interleaved 8 rows by 8
/// ([`KEY_INTERLEAVED`]): a build that reads only version 4 refuses it rather than compute with
/// rows it would misread.
pub const STORE_VERSION_INTERLEAVED: u32 = 5;
/// The oldest format version this build reads.
pub const STORE_VERSION_MIN: u32 = 1;
/// The newest format version this build reads.
pub const STORE_VERSION_MAX: u32 = STORE_VERSION_INTERLEAVED;
/// Alignment of the data section and of every bundle.
pub const STORE_ALIGN: u64 = 4096;

pub const KEY_VERSION: &str = "conductor.store.version";
pub const KEY_BUNDLE_NEURONS: &str = "conductor.store.bundle_neurons";
pub const KEY_BUNDLE_STRIDE: &str = "conductor.store.bundle_stride";
pub const KEY_SOURCE_CHECKSUM: &str = "conductor.store.source_crc32";
pub const KEY_SOURCE_NAME: &str = "conductor.store.source_name";
pub const KEY_FFN_TYPES: &str = "conductor.store.ffn_types";
pub const KEY_DOWN_LAYOUT: &str = "conductor.store.down_layout";
/// Format 4, block-columns whose layers' down projections differ in type (a Q4_K_M file's mix
/// Q4_K and Q6_K): each layer's down type. The down type of `ffn_types` is then the widest,
/// which sets the stride; a narrower layer's bundles end in more padding.
pub const KEY_DOWN_TYPES: &str = "conductor.store.down_types";
/// Format 5: every bundle part of a type with an interleaved layout (Q4_K, Q6_K) whose rows
/// come in whole groups of 8 is stored as [`Layout::X8`] groups ([`BundleLayout::interleaved`]).
pub const KEY_INTERLEAVED: &str = "conductor.store.interleaved";
pub const CRC_TENSOR: &str = "conductor.bundle_crc";
pub const PAGE_CRC_TENSOR: &str = "conductor.page_crc";
/// Bytes one entry of the page table covers.
pub const PAGE_BYTES: u64 = STORE_ALIGN;

/// Whether a store's tensor `name` stays on storage under a memory budget: the bundles always,
/// the token embeddings and output projection when the output streams too.
pub fn stays_on_storage(name: &str, stream_output: bool) -> bool {
    name.ends_with(".ffn_bundles")
        || stream_output && (name == "token_embd.weight" || name == "output.weight")
}

/// Whether `name` is one of a layer's four attention matrices: what stays on storage, read
/// through the cache, when attention streams (`CachePlan::stream_attention`).
pub fn is_attention_matrix(name: &str) -> bool {
    name.starts_with("blk.")
        && [
            ".attn_q.weight",
            ".attn_k.weight",
            ".attn_v.weight",
            ".attn_output.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// The name of layer `layer`'s bundle tensor.
pub fn bundle_tensor_name(layer: u32) -> String {
    format!("blk.{layer}.ffn_bundles")
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path} is already a neuron store (converted from {source_name})")]
    AlreadyStore { path: String, source_name: String },
    #[error("neuron store format version {found}; this build reads versions {STORE_VERSION_MIN} to {STORE_VERSION_MAX}: convert the model again with this build")]
    Version { found: u32 },
    #[error("neuron store metadata `{key}`: {why}")]
    BadMetadata { key: &'static str, why: String },
    #[error("bundle size {neurons} neurons is not a positive multiple of {granule} (the down projection's block size, which block-column bundles need)")]
    BundleSize { neurons: u32, granule: u32 },
    #[error("neuron store: {0}")]
    Layout(String),
    #[error("bundle {bundle} of layer {layer} (neurons {first}..{end}) fails its checksum: the store is corrupt or was modified; convert the model again")]
    Checksum {
        layer: u32,
        bundle: u32,
        first: u32,
        end: u32,
    },
    #[error("{what}: page at byte {offset} of the store fails its checksum: the store is corrupt or was modified; convert the model again")]
    PageChecksum { what: String, offset: u64 },
    #[error("refusing to write {path}: {why}")]
    Output { path: String, why: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// How a bundle holds its neurons' share of the down projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownLayout {
    /// `m` rows of `n_embd`: each neuron's down column, transposed and re-quantized to the
    /// store's down type once, at conversion.
    NeuronColumns,
    /// `n_embd` rows of `m` columns: whole quant blocks of the source, bit for bit.
    BlockColumns,
}

impl DownLayout {
    pub fn name(self) -> &'static str {
        match self {
            DownLayout::NeuronColumns => "neuron_columns",
            DownLayout::BlockColumns => "block_columns",
        }
    }

    pub fn from_name(name: &str) -> Option<DownLayout> {
        [DownLayout::NeuronColumns, DownLayout::BlockColumns]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// Where each part of a bundle lies, for one model (for one layer of a store whose layers'
/// down projections differ in type: [`StoreInfo::layout_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BundleLayout {
    /// Neurons per bundle (the last bundle of a layer may have fewer).
    pub neurons: u32,
    /// Bundles per layer.
    pub n_bundles: u32,
    /// Bytes from one bundle to the next (a multiple of [`STORE_ALIGN`]).
    pub stride: u64,
    pub n_embd: u32,
    pub n_ff: u32,
    pub gate_ty: GgmlType,
    pub up_ty: GgmlType,
    /// The type of the down part (the source's for block-columns, the re-quantized columns'
    /// for neuron columns).
    pub down_ty: GgmlType,
    pub down_layout: DownLayout,
    /// Parts of an interleavable type (Q4_K, Q6_K) whose rows fill whole groups of 8 are
    /// stored interleaved ([`Layout::X8`]): decode's K-quant kernels read that layout fastest,
    /// and a few tokens (a draft's verification) share each unpacked group. Same bytes, other
    /// order: sizes and strides do not change, and every product gives the bits of the row
    /// layout.
    pub interleaved: bool,
}

impl BundleLayout {
    /// The layout for a model's FFN, with `neurons` per bundle.
    pub fn new(
        n_embd: u32,
        n_ff: u32,
        [gate_ty, up_ty, down_ty]: [GgmlType; 3],
        down_layout: DownLayout,
        neurons: u32,
    ) -> Result<BundleLayout, StoreError> {
        let granule = match down_layout {
            DownLayout::BlockColumns => down_ty.block_size() as u32,
            DownLayout::NeuronColumns => 1,
        };
        if neurons == 0 || !neurons.is_multiple_of(granule) || !n_ff.is_multiple_of(granule) {
            return Err(StoreError::BundleSize { neurons, granule });
        }
        let down_row = match down_layout {
            DownLayout::NeuronColumns => ("down column", down_ty, n_embd),
            DownLayout::BlockColumns => ("down block-column row", down_ty, neurons),
        };
        for (what, ty, cols) in [("gate", gate_ty, n_embd), ("up", up_ty, n_embd), down_row] {
            if row_bytes(ty, cols as usize).is_err() {
                return Err(StoreError::Layout(format!(
                    "{what} rows of {cols} values do not fit whole {ty} blocks"
                )));
            }
        }
        let mut layout = BundleLayout {
            neurons,
            n_bundles: n_ff.div_ceil(neurons),
            stride: 0,
            n_embd,
            n_ff,
            gate_ty,
            up_ty,
            down_ty,
            down_layout,
            interleaved: false,
        };
        layout.stride = (layout.payload_bytes(neurons) as u64).div_ceil(STORE_ALIGN) * STORE_ALIGN;
        Ok(layout)
    }

    /// This layout with the down part of type `ty` and the same stride: a layer of a store
    /// whose layers' down types differ. Fails when `ty`'s bundles do not fit the stride or its
    /// blocks the bundle's neurons.
    pub fn with_down_type(self, ty: GgmlType) -> Result<BundleLayout, StoreError> {
        let own = BundleLayout::new(
            self.n_embd,
            self.n_ff,
            [self.gate_ty, self.up_ty, ty],
            self.down_layout,
            self.neurons,
        )?;
        if own.stride > self.stride {
            return Err(StoreError::Layout(format!(
                "bundles with a {ty} down part take {} bytes, more than the stride of {}",
                own.stride, self.stride
            )));
        }
        Ok(BundleLayout {
            stride: self.stride,
            interleaved: self.interleaved,
            ..own
        })
    }

    /// This layout with its interleavable parts interleaved (or not).
    pub fn with_interleaved(self, interleaved: bool) -> BundleLayout {
        BundleLayout {
            interleaved,
            ..self
        }
    }

    /// How a part of type `ty` with `rows` rows is stored: interleaved where the layout says
    /// so, the type has an interleaved form and the rows fill whole groups.
    pub fn part_layout(&self, ty: GgmlType, rows: usize) -> Layout {
        if self.interleaved && interleavable(ty) && rows.is_multiple_of(GROUP_ROWS) {
            Layout::X8 { skip: 0 }
        } else {
            Layout::Rows
        }
    }

    /// The bytes (from the part's start) that hold row `r` of a part of type `ty`, `rows` rows
    /// of `row` bytes: the row itself, or its whole group of 8 when interleaved.
    fn row_span(&self, ty: GgmlType, rows: usize, row: usize, r: usize) -> std::ops::Range<usize> {
        match self.part_layout(ty, rows) {
            Layout::Rows => r * row..(r + 1) * row,
            Layout::X8 { .. } => {
                let g = r / GROUP_ROWS * GROUP_ROWS;
                g * row..(g + GROUP_ROWS) * row
            }
        }
    }

    fn gate_row(&self) -> usize {
        row_bytes(self.gate_ty, self.n_embd as usize).unwrap_or(0)
    }

    fn up_row(&self) -> usize {
        row_bytes(self.up_ty, self.n_embd as usize).unwrap_or(0)
    }

    /// Bytes of the down part of a bundle of `m` neurons.
    fn down_bytes(&self, m: u32) -> usize {
        let embd = self.n_embd as usize;
        match self.down_layout {
            DownLayout::NeuronColumns => m as usize * row_bytes(self.down_ty, embd).unwrap_or(0),
            DownLayout::BlockColumns => embd * row_bytes(self.down_ty, m as usize).unwrap_or(0),
        }
    }

    /// Bytes of the gate rows of a bundle of `m` neurons (the bundle's first bytes).
    pub fn gate_bytes(&self, m: u32) -> usize {
        m as usize * self.gate_row()
    }

    /// Pages of [`STORE_ALIGN`] bytes in one bundle (padding included).
    pub fn bundle_pages(&self) -> u32 {
        (self.stride / STORE_ALIGN) as u32
    }

    /// Pages that hold bundle `b`'s gate rows (pages `0..n`): what gate-first loading reads
    /// first.
    pub fn gate_pages(&self, b: u32) -> u32 {
        (self.gate_bytes(self.neurons_of(b).len() as u32) as u64).div_ceil(STORE_ALIGN) as u32
    }

    /// Sets in `bits` (bit `first + p` for page `p` of bundle `b`) the pages the sparse FFN
    /// of bundle `b` reads for one token beyond its gate rows: the up rows and down columns of
    /// `active` (bundle-local neuron indices), every up row when `up_whole`, and the whole
    /// down part for block-columns (they are read as one matrix).
    pub fn mark_active_pages(
        &self,
        b: u32,
        active: &[u32],
        up_whole: bool,
        bits: &mut [u64],
        first: usize,
    ) {
        let m = self.neurons_of(b).len();
        let (g, u) = (m * self.gate_row(), m * self.up_row());
        let mut mark = |bytes: std::ops::Range<usize>| {
            if bytes.is_empty() {
                return;
            }
            let (p0, p1) = (
                bytes.start / STORE_ALIGN as usize,
                (bytes.end - 1) / STORE_ALIGN as usize,
            );
            for p in p0..=p1 {
                let i = first + p;
                bits[i / 64] |= 1 << (i % 64);
            }
        };
        let ur = self.up_row();
        if up_whole {
            mark(g..g + u);
        } else {
            for &j in active {
                let span = self.row_span(self.up_ty, m, ur, j as usize);
                mark(g + span.start..g + span.end);
            }
        }
        match self.down_layout {
            DownLayout::NeuronColumns => {
                let dr = row_bytes(self.down_ty, self.n_embd as usize).unwrap_or(0);
                for &j in active {
                    let span = self.row_span(self.down_ty, m, dr, j as usize);
                    mark(g + u + span.start..g + u + span.end);
                }
            }
            DownLayout::BlockColumns if !active.is_empty() => {
                mark(g + u..g + u + self.down_bytes(m as u32));
            }
            DownLayout::BlockColumns => {}
        }
    }

    /// Sets in `bits` (bit `first + p` for page `p` of bundle `b`) the pages holding the gate
    /// rows, up rows and down columns of `neurons` (bundle-local indices): what sparse decode
    /// with predictors reads of the predicted neurons when it reads rows one by one (the whole
    /// down part for block-columns).
    pub fn mark_neuron_pages(&self, b: u32, neurons: &[u32], bits: &mut [u64], first: usize) {
        let (gr, m) = (self.gate_row(), self.neurons_of(b).len());
        for &j in neurons {
            let span = self.row_span(self.gate_ty, m, gr, j as usize);
            let (a, z) = (span.start, span.end);
            for p in a / STORE_ALIGN as usize..=(z - 1) / STORE_ALIGN as usize {
                let i = first + p;
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        self.mark_active_pages(b, neurons, false, bits, first);
    }

    /// Bytes of a bundle of `m` neurons without padding.
    pub fn payload_bytes(&self, m: u32) -> usize {
        let m_ = m as usize;
        m_ * (self.gate_row() + self.up_row()) + self.down_bytes(m)
    }

    /// The neurons of bundle `b`.
    pub fn neurons_of(&self, b: u32) -> std::ops::Range<u32> {
        let start = b * self.neurons;
        start..(start + self.neurons).min(self.n_ff)
    }

    /// Bytes of one layer's bundle tensor.
    pub fn layer_bytes(&self) -> u64 {
        self.stride * u64::from(self.n_bundles)
    }

    /// The gate rows, up rows and down part of bundle `b`, from its bytes (at least
    /// [`BundleLayout::payload_bytes`] long).
    pub fn split<'a>(&self, b: u32, bytes: &'a [u8]) -> BundleRef<'a> {
        let m = self.neurons_of(b).len();
        let (g, u) = (m * self.gate_row(), m * self.up_row());
        let d = self.down_bytes(m as u32);
        let embd = self.n_embd as usize;
        let (down_rows, down_cols) = match self.down_layout {
            DownLayout::NeuronColumns => (m, embd),
            DownLayout::BlockColumns => (embd, m),
        };
        BundleRef {
            gate: MatRef {
                ty: self.gate_ty,
                data: &bytes[..g],
                rows: m,
                cols: self.n_embd as usize,
                layout: self.part_layout(self.gate_ty, m),
            },
            up: MatRef {
                ty: self.up_ty,
                data: &bytes[g..g + u],
                rows: m,
                cols: self.n_embd as usize,
                layout: self.part_layout(self.up_ty, m),
            },
            down: MatRef {
                ty: self.down_ty,
                data: &bytes[g + u..g + u + d],
                rows: down_rows,
                cols: down_cols,
                layout: self.part_layout(self.down_ty, down_rows),
            },
            down_layout: self.down_layout,
        }
    }
}

/// One bundle's three matrices.
pub struct BundleRef<'a> {
    /// `m` rows of `n_embd`.
    pub gate: MatRef<'a>,
    /// `m` rows of `n_embd`.
    pub up: MatRef<'a>,
    /// The down projection restricted to the bundle's neurons: `m` rows of `n_embd` (neuron
    /// columns) or `n_embd` rows of `m` (block-columns), as `down_layout` says.
    pub down: MatRef<'a>,
    pub down_layout: DownLayout,
}

/// What a store's metadata says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    /// The layout of the widest layer (every layer's, unless `down_types` differ).
    pub layout: BundleLayout,
    /// Each layer's down type (the same for every layer but in format-4 block-columns stores
    /// of mixed files): what [`StoreInfo::layout_of`] puts in its layer's layout.
    pub down_types: Vec<GgmlType>,
    /// CRC-32 of the file it was converted from.
    pub source_crc32: u32,
    pub source_name: String,
    /// CRC-32 of every bundle, `[layer][bundle]`.
    pub bundle_crc: Vec<u32>,
    /// CRC-32 of every page of the other tensors (format 3; `None` for older stores).
    pub pages: Option<PageCrcs>,
}

/// The page checksums of a store (`conductor.page_crc`): where each covered tensor lies in the
/// file and the CRC-32 of each of its 4096-byte pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageCrcs {
    /// `(file start, file end, index of the first page's CRC)` of each covered tensor, in file
    /// order.
    tensors: Vec<(u64, u64, usize)>,
    crc: std::sync::Arc<[u32]>,
}

impl PageCrcs {
    /// The tensors the page table covers, in file order: all but the two checksum tensors.
    pub fn covered(file: &GgufFile) -> Vec<&crate::gguf::TensorInfo> {
        let mut out: Vec<_> = file
            .tensors()
            .iter()
            .filter(|t| t.name != CRC_TENSOR && t.name != PAGE_CRC_TENSOR)
            .collect();
        out.sort_by_key(|t| t.offset);
        out
    }

    /// Entries of the page table for tensors of `n_bytes` each.
    pub fn n_pages(n_bytes: impl IntoIterator<Item = u64>) -> u64 {
        n_bytes.into_iter().map(|n| n.div_ceil(PAGE_BYTES)).sum()
    }

    /// CRC-32 of each page of `data` (one tensor's bytes), appended to `out` as the table
    /// stores them (little-endian).
    pub fn push_pages(data: &[u8], out: &mut Vec<u8>) {
        for page in data.chunks(PAGE_BYTES as usize) {
            out.extend_from_slice(&crc32fast::hash(page).to_le_bytes());
        }
    }

    /// Reads the page table of `file`; `None` when it has none.
    fn from_gguf(file: &GgufFile) -> Result<Option<PageCrcs>, StoreError> {
        let Some(t) = file.tensor(PAGE_CRC_TENSOR) else {
            return Ok(None);
        };
        let covered = PageCrcs::covered(file);
        let n = PageCrcs::n_pages(covered.iter().map(|t| t.n_bytes));
        if t.ty != GgmlType::I32 || t.dims != [n] {
            return Err(StoreError::Layout(format!(
                "tensor `{PAGE_CRC_TENSOR}` is {} {:?}, expected I32 [{n}]",
                t.ty, t.dims
            )));
        }
        let mut tensors = Vec::with_capacity(covered.len());
        let mut first = 0usize;
        for c in covered {
            let start = file.data_offset() + c.offset;
            if !start.is_multiple_of(PAGE_BYTES) {
                return Err(StoreError::Layout(format!(
                    "tensor `{}` does not start on a {PAGE_BYTES}-byte boundary",
                    c.name
                )));
            }
            tensors.push((start, start + c.n_bytes, first));
            first += c.n_bytes.div_ceil(PAGE_BYTES) as usize;
        }
        let crc = file
            .try_tensor_data(t)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Some(PageCrcs { tensors, crc }))
    }

    /// Checks `bytes`, read from the store at file offset `offset` (a multiple of
    /// [`PAGE_BYTES`]): every page it touches of a covered tensor must be there whole (the
    /// tensor's bytes in it) and match its CRC-32. Bytes outside every tensor (alignment
    /// padding) are not covered. `what` names the read in the error.
    pub fn check(&self, what: &str, offset: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.check_pages(offset, bytes)
            .map_err(|at| StoreError::PageChecksum {
                what: what.to_string(),
                offset: at,
            })
    }

    /// [`PageCrcs::check`] without a name: the file offset of the first page that fails (no
    /// allocation either way, for per-token reads).
    pub fn check_pages(&self, offset: u64, bytes: &[u8]) -> Result<(), u64> {
        if !offset.is_multiple_of(PAGE_BYTES) {
            return Err(offset);
        }
        let end = offset + bytes.len() as u64;
        let mut page = offset;
        while page < end {
            // The tensor holding this page (tensors are sorted and do not overlap).
            let i = self.tensors.partition_point(|&(_, e, _)| e <= page);
            let Some(&(start, stop, first)) = self.tensors.get(i) else {
                break;
            };
            if start >= end {
                break;
            }
            if start > page {
                page = start;
                continue;
            }
            let upto = (page + PAGE_BYTES).min(stop);
            if upto > end {
                // The read ended inside the page: it cannot be checked, so it is not trusted.
                return Err(page);
            }
            let index = first + ((page - start) / PAGE_BYTES) as usize;
            let have = &bytes[(page - offset) as usize..(upto - offset) as usize];
            if self.crc.get(index) != Some(&crc32fast::hash(have)) {
                return Err(page);
            }
            page += PAGE_BYTES;
        }
        Ok(())
    }
}

impl StoreInfo {
    /// Reads the store metadata of `file`; `None` when it is an ordinary model.
    pub fn from_gguf(
        file: &GgufFile,
        n_embd: u32,
        n_ff: u32,
        n_layer: u32,
    ) -> Result<Option<StoreInfo>, StoreError> {
        let Some(version) = file.get_u32(KEY_VERSION)? else {
            return Ok(None);
        };
        if !(STORE_VERSION_MIN..=STORE_VERSION_MAX).contains(&version) {
            return Err(StoreError::Version { found: version });
        }
        let need_u32 = |key: &'static str| -> Result<u32, StoreError> {
            file.get_u32(key)?.ok_or(StoreError::BadMetadata {
                key,
                why: "missing".into(),
            })
        };
        let neurons = need_u32(KEY_BUNDLE_NEURONS)?;
        let stride = file
            .get_u64(KEY_BUNDLE_STRIDE)?
            .ok_or(StoreError::BadMetadata {
                key: KEY_BUNDLE_STRIDE,
                why: "missing".into(),
            })?;
        let source_crc32 = need_u32(KEY_SOURCE_CHECKSUM)?;
        let source_name = file.get_str(KEY_SOURCE_NAME)?.unwrap_or("?").to_string();
        let types = match file.get_array(KEY_FFN_TYPES)? {
            Some(crate::gguf::Array::U32(v)) if v.len() == 3 => v.clone(),
            _ => {
                return Err(StoreError::BadMetadata {
                    key: KEY_FFN_TYPES,
                    why: "expected 3 ggml type ids (gate, up, down)".into(),
                })
            }
        };
        let mut tys = [GgmlType::F32; 3];
        for (t, id) in tys.iter_mut().zip(&types) {
            *t = GgmlType::from_id(*id).ok_or(StoreError::BadMetadata {
                key: KEY_FFN_TYPES,
                why: format!("unknown ggml type id {id}"),
            })?;
            if !t.is_supported() {
                return Err(StoreError::BadMetadata {
                    key: KEY_FFN_TYPES,
                    why: format!("type {t} cannot be computed with"),
                });
            }
        }
        // Version 1 knew block-columns only.
        let down_layout = match (version, file.get_str(KEY_DOWN_LAYOUT)?) {
            (1, _) => DownLayout::BlockColumns,
            (_, Some(name)) => {
                DownLayout::from_name(name).ok_or_else(|| StoreError::BadMetadata {
                    key: KEY_DOWN_LAYOUT,
                    why: format!("unknown layout `{name}` (neuron_columns or block_columns)"),
                })?
            }
            (_, None) => {
                return Err(StoreError::BadMetadata {
                    key: KEY_DOWN_LAYOUT,
                    why: "missing".into(),
                })
            }
        };
        // Version 5 says whether its parts are interleaved; older versions never are.
        let interleaved = match (
            version >= STORE_VERSION_INTERLEAVED,
            file.get_bool(KEY_INTERLEAVED)?,
        ) {
            (true, Some(on)) => on,
            (true, None) => {
                return Err(StoreError::BadMetadata {
                    key: KEY_INTERLEAVED,
                    why: "missing (a format-5 store says whether its parts are interleaved)".into(),
                })
            }
            (false, Some(_)) => {
                return Err(StoreError::BadMetadata {
                    key: KEY_INTERLEAVED,
                    why: format!("a format-{version} store has no interleaved parts"),
                })
            }
            (false, None) => false,
        };
        let layout = BundleLayout::new(n_embd, n_ff, tys, down_layout, neurons)?
            .with_interleaved(interleaved);
        let down_types = match file.get_array(KEY_DOWN_TYPES)? {
            None => vec![layout.down_ty; n_layer as usize],
            Some(crate::gguf::Array::U32(v)) if version >= 4 && v.len() == n_layer as usize => {
                let bad = |why: String| StoreError::BadMetadata {
                    key: KEY_DOWN_TYPES,
                    why,
                };
                let mut out = Vec::with_capacity(v.len());
                for &id in v {
                    let ty = GgmlType::from_id(id)
                        .filter(|t| t.is_supported())
                        .ok_or_else(|| bad(format!("ggml type id {id} cannot be computed with")))?;
                    layout.with_down_type(ty).map_err(|e| bad(e.to_string()))?;
                    out.push(ty);
                }
                out
            }
            Some(_) => {
                return Err(StoreError::BadMetadata {
                    key: KEY_DOWN_TYPES,
                    why: format!(
                        "expected {n_layer} ggml type ids (one per layer) in a format-4 store"
                    ),
                })
            }
        };
        if layout.stride != stride {
            return Err(StoreError::BadMetadata {
                key: KEY_BUNDLE_STRIDE,
                why: format!(
                    "{stride} bytes, but bundles of {neurons} neurons of this model take {}: the store was made for another model",
                    layout.stride
                ),
            });
        }
        if !file.alignment().is_multiple_of(STORE_ALIGN) {
            return Err(StoreError::Layout(format!(
                "general.alignment is {}, not a multiple of {STORE_ALIGN}",
                file.alignment()
            )));
        }
        let n = n_layer as usize * layout.n_bundles as usize;
        let crc = file
            .tensor(CRC_TENSOR)
            .ok_or_else(|| StoreError::Layout(format!("tensor `{CRC_TENSOR}` is missing")))?;
        if crc.ty != GgmlType::I32 || crc.dims != [n as u64] {
            return Err(StoreError::Layout(format!(
                "tensor `{CRC_TENSOR}` is {} {:?}, expected I32 [{n}]",
                crc.ty, crc.dims
            )));
        }
        let bundle_crc = file
            .try_tensor_data(crc)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        for l in 0..n_layer {
            let name = bundle_tensor_name(l);
            let t = file
                .tensor(&name)
                .ok_or_else(|| StoreError::Layout(format!("tensor `{name}` is missing")))?;
            let expected = [layout.stride, u64::from(layout.n_bundles)];
            if t.ty != GgmlType::I8 || t.dims != expected {
                return Err(StoreError::Layout(format!(
                    "tensor `{name}` is {} {:?}, expected I8 {expected:?}: the store was made for another model",
                    t.ty, t.dims
                )));
            }
            if !(file.data_offset() + t.offset).is_multiple_of(STORE_ALIGN) {
                return Err(StoreError::Layout(format!(
                    "tensor `{name}` does not start on a {STORE_ALIGN}-byte boundary"
                )));
            }
        }
        let pages = PageCrcs::from_gguf(file)?;
        if version >= 3 && pages.is_none() {
            return Err(StoreError::Layout(format!(
                "tensor `{PAGE_CRC_TENSOR}` is missing"
            )));
        }
        Ok(Some(StoreInfo {
            layout,
            down_types,
            source_crc32,
            source_name,
            bundle_crc,
            pages,
        }))
    }

    /// The layout of layer `layer`'s bundles: [`StoreInfo::layout`] with the layer's own down
    /// type.
    pub fn layout_of(&self, layer: u32) -> BundleLayout {
        match self.down_types.get(layer as usize) {
            Some(&ty) if ty != self.layout.down_ty => self
                .layout
                .with_down_type(ty)
                .expect("down types are checked at load"),
            _ => self.layout,
        }
    }

    /// Checks bundle `b` of `layer` against its recorded CRC-32.
    pub fn check_bundle(&self, layer: u32, b: u32, payload: &[u8]) -> Result<(), StoreError> {
        let i = layer as usize * self.layout.n_bundles as usize + b as usize;
        let expected = self.bundle_crc.get(i).copied();
        if expected != Some(crc32fast::hash(payload)) {
            let n = self.layout.neurons_of(b);
            return Err(StoreError::Checksum {
                layer,
                bundle: b,
                first: n.start,
                end: n.end,
            });
        }
        Ok(())
    }
}
