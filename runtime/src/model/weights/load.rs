//! The one way a model is built from a file: [`Model::open`] with [`LoadOptions`] (where the
//! weights are held, the sparse decode, the decode layout). What comes out is never changed
//! afterwards; a different choice is a new load.

use super::{DecodeLayout, Model, ModelError, RowReader};
use crate::gguf::{GgufError, GgufFile};
use crate::read_faults::ReadFaults;
use crate::sparse::SparseFfn;
use crate::store::{is_attention_matrix, stays_on_storage};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Where a loaded model's weights are held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightSource {
    /// The file memory-mapped: its pages are read as they are used. The file must not change
    /// while the model is in use: [`Model::check_file`] finds a change between uses, but a file
    /// truncated while a step reads it faults (`SIGBUS`).
    #[default]
    Mapped,
    /// The whole file read into this process's memory (`--no-mmap`): a change to the file after
    /// the load cannot reach the model.
    Read,
    /// Only a neuron store's resident tensors, each read into its own buffer: the bundles stay
    /// on storage for the neuron cache, and nothing the size of the file is held or reserved,
    /// so a store larger than memory loads. With `stream_output` the token embeddings and the
    /// output projection stay on storage too (embedding rows are read per token, the output
    /// projection streams through the cache); with `stream_attention` each layer's attention
    /// matrices do (a budget too small to hold them). An ordinary model loads as
    /// [`WeightSource::Mapped`].
    Resident {
        stream_output: bool,
        stream_attention: bool,
    },
}

impl WeightSource {
    /// A neuron store's resident tensors, attention included: what a budget that holds
    /// attention loads (the bundles, the token embeddings and the output projection stay on
    /// storage).
    pub const RESIDENT: WeightSource = WeightSource::Resident {
        stream_output: true,
        stream_attention: false,
    };
    /// Only a neuron store's header and vectors (norms, biases): every matrix stays on
    /// storage, the cache streams attention too (and an ordinary model is mapped, which reads
    /// only the pages used).
    pub const STREAMED: WeightSource = WeightSource::Resident {
        stream_output: true,
        stream_attention: true,
    };
}

/// How [`Model::open`] builds a model.
#[derive(Default)]
pub struct LoadOptions {
    pub source: WeightSource,
    /// Sparse FFN decode (thresholds, predictors, transposed down projections); `None`: dense.
    pub sparse: Option<SparseFfn>,
    /// How the weights held in memory are laid out for decode ([`Model::laid_out`]).
    pub layout: DecodeLayout,
    /// Frees the tokenizer's arrays in the parsed metadata (the bulk of a GGUF header), for a
    /// caller that has already built its tokenizer from them.
    pub drop_tokenizer_metadata: bool,
    /// Faults injected into every read of the file after the load: the embedding rows read
    /// per token, and the neuron store's reads by the drivers' caches. For the fault harness
    /// and tests; `None`, the default, in normal use.
    pub read_faults: Option<Arc<dyn ReadFaults>>,
}

/// Weights from `source`, decoded dense in the file's layout, the metadata kept whole.
impl From<WeightSource> for LoadOptions {
    fn from(source: WeightSource) -> LoadOptions {
        LoadOptions {
            source,
            ..LoadOptions::default()
        }
    }
}

impl Model {
    /// Opens and checks a GGUF model file (a neuron store's bundles against their checksums when
    /// they are held in memory) and builds the model `options` describe.
    pub fn open(path: &Path, options: impl Into<LoadOptions>) -> Result<Model, ModelError> {
        let LoadOptions {
            source,
            sparse,
            layout,
            drop_tokenizer_metadata,
            read_faults,
        } = options.into();
        let mut model = match source {
            WeightSource::Mapped => Model::whole(path, GgufFile::open(path)?)?,
            WeightSource::Read => Model::whole(path, GgufFile::read(path)?)?,
            WeightSource::Resident {
                stream_output,
                stream_attention,
            } => Model::resident(path, stream_output, stream_attention)?,
        };
        model.sparse = sparse;
        model.read_faults = read_faults;
        if drop_tokenizer_metadata {
            model.file.release_arrays(&[
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges",
                "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type",
            ]);
        }
        model.laid_out(layout)
    }

    /// The whole file, as `file` holds it.
    fn whole(path: &Path, file: GgufFile) -> Result<Model, ModelError> {
        let mut model = Model::from_gguf(file)?;
        model.check_all_bundles()?;
        model.path = Some(path.to_path_buf());
        Ok(model)
    }

    fn resident(
        path: &Path,
        stream_output: bool,
        stream_attention: bool,
    ) -> Result<Model, ModelError> {
        let probe = GgufFile::open(path)?;
        if !probe
            .tensors()
            .iter()
            .any(|t| t.name.ends_with(".ffn_bundles"))
        {
            drop(probe);
            return Model::whole(path, GgufFile::open(path)?);
        }
        drop(probe);
        let parts = GgufFile::open_parts(path, |t| {
            !(stays_on_storage(&t.name, stream_output)
                || stream_attention && is_attention_matrix(&t.name))
        })?;
        let mut model = Model::from_gguf(parts)?;
        model.resident_only = true;
        model.path = Some(path.to_path_buf());
        if stream_output {
            model.embd_rows = Some(RowReader {
                file: std::fs::File::open(path).map_err(|source| GgufError::Io {
                    op: "open",
                    path: path.display().to_string(),
                    source,
                })?,
                scratch: Mutex::new(Vec::new()),
            });
        }
        Ok(model)
    }

    /// Checks every bundle of a store held in memory against its checksum, and with page
    /// checksums (format 3) every page of its other tensors.
    fn check_all_bundles(&self) -> Result<(), ModelError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        if let Some(pages) = &store.pages {
            for t in crate::store::PageCrcs::covered(&self.file) {
                if t.name.ends_with(".ffn_bundles") {
                    continue;
                }
                let start = self.file.data_offset() + t.offset;
                let bytes = self
                    .file
                    .bytes(start as usize..(start + t.n_bytes) as usize)?;
                pages
                    .check(&t.name, start, bytes)
                    .map_err(|e| ModelError::Store(Box::new(e)))?;
            }
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let Some(range) = &layer.bundles else {
                continue;
            };
            let layout = store.layout_of(l as u32);
            let bytes = self.file.bytes(range.clone())?;
            for b in 0..layout.n_bundles {
                let at = b as usize * layout.stride as usize;
                let len = layout.payload_bytes(layout.neurons_of(b).len() as u32);
                store
                    .check_bundle(l as u32, b, &bytes[at..at + len])
                    .map_err(|e| ModelError::Store(Box::new(e)))?;
            }
        }
        Ok(())
    }
}
