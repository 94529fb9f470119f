//! Reading bundles from a neuron store into cache slots: one positional read per cluster,
//! `O_DIRECT` when the file system allows, retried once, checked against its CRC-32.

use crate::model::Model;
use crate::store::{BundleLayout, StoreInfo};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A cluster that could not be loaded. Names the layer and neurons, and why.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("loading layer {layer} neurons {first}..{end} from {path}: {why}")]
pub struct LoadError {
    pub layer: u32,
    pub first: u32,
    pub end: u32,
    pub path: String,
    pub why: String,
}

/// A neuron store opened for bundle reads.
pub struct BundleFile {
    path: PathBuf,
    file: File,
    direct: bool,
    layout: BundleLayout,
    store: StoreInfo,
    /// File offset of each layer's first bundle.
    layer_offsets: Vec<u64>,
}

impl BundleFile {
    /// Opens the store `model` was loaded from, with `O_DIRECT` if `direct` and the file
    /// system accepts it. `None` when the model is not a store.
    pub fn open(path: &Path, model: &Model, direct: bool) -> std::io::Result<Option<BundleFile>> {
        let Some(store) = model.store.clone() else {
            return Ok(None);
        };
        let layer_offsets = model
            .layers
            .iter()
            .map(|l| l.bundles.as_ref().map_or(0, |r| r.start as u64))
            .collect();
        let mut opened = None;
        if direct {
            let flags = rustix::fs::OFlags::DIRECT.bits() as i32;
            // tmpfs and some others refuse O_DIRECT: fall back to the page cache.
            opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(flags)
                .open(path)
                .ok()
                .map(|f| (f, true));
        }
        let (file, direct) = match opened {
            Some(o) => o,
            None => (File::open(path)?, false),
        };
        Ok(Some(BundleFile {
            path: path.to_path_buf(),
            file,
            direct,
            layout: store.layout.clone(),
            store,
            layer_offsets,
        }))
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes one cluster's read transfers.
    pub fn read_bytes(&self) -> u64 {
        self.layout.stride
    }

    /// Reads cluster (bundle) `cluster` of `layer` into `dst` (at least the bundle stride long,
    /// aligned for `O_DIRECT`), retrying once; checks its checksum.
    pub fn load(&self, layer: u32, cluster: u32, dst: &mut [u8]) -> Result<(), LoadError> {
        let neurons = self.layout.neurons_of(cluster);
        let fail = |why: String| LoadError {
            layer,
            first: neurons.start,
            end: neurons.end,
            path: self.path.display().to_string(),
            why,
        };
        let Some(&base) = self.layer_offsets.get(layer as usize) else {
            return Err(fail(format!("the store has {} layers", self.layer_offsets.len())));
        };
        if cluster >= self.layout.n_bundles {
            return Err(fail(format!("a layer has {} bundles", self.layout.n_bundles)));
        }
        let stride = self.layout.stride as usize;
        if dst.len() < stride {
            return Err(fail(format!("slot of {} bytes < bundle stride {stride}", dst.len())));
        }
        let offset = base + u64::from(cluster) * self.layout.stride;
        let payload = self.layout.payload_bytes(neurons.len() as u32);
        let mut last = String::new();
        for _attempt in 0..2 {
            match read_full(&self.file, &mut dst[..stride], offset) {
                Ok(got) if got >= payload => {
                    return self
                        .store
                        .check_bundle(layer, cluster, &dst[..payload])
                        .map_err(|e| fail(e.to_string()));
                }
                Ok(got) => {
                    last = format!(
                        "read of {stride} bytes at offset {offset} returned {got} (file truncated?)"
                    )
                }
                Err(e) => last = format!("read of {stride} bytes at offset {offset}: {e}"),
            }
        }
        Err(fail(format!("{last}, twice")))
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
