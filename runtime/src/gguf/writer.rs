//! The GGUF writer. The header (metadata and tensor descriptors) is built in memory; tensor data
//! is either attached up front (small files, tests) or streamed through a [`TensorDataWriter`] one
//! tensor (or chunk) at a time, so converting a multi-GB model never holds it all in memory.
//!
//! The writer applies the reader's rules (shapes, alignment, unique names and keys), so whatever
//! it writes, [`GgufFile`](super::GgufFile) reads back.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::reader::MAGIC;
use super::tensor::{align_up, check_alignment, check_shape, DEFAULT_ALIGNMENT};
use super::value::MAX_ARRAY_DEPTH;
use super::{Array, GgufError, GgufFile, TensorInfo, Value};
use crate::quant::GgmlType;

const ALIGNMENT_KEY: &str = "general.alignment";

/// Builds a GGUF file: metadata, tensor descriptors, then data.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Data attached with `add_tensor`, per tensor.
    data: Vec<Option<Vec<u8>>>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            key_index: HashMap::new(),
            tensors: Vec::new(),
            tensor_index: HashMap::new(),
            data: Vec::new(),
        }
    }

    /// A copy of a parsed file: its version, metadata (in order) and tensors with their data.
    /// Tensors are laid out afresh (packed in file order), so offsets may differ from the source.
    /// Copies all tensor data into memory: meant for small files and tests.
    pub fn from_file(file: &GgufFile) -> Result<Self, GgufError> {
        let mut w = GgufWriter::new();
        w.set_version(file.version())?;
        for (k, v) in file.metadata() {
            w.add_metadata(k.clone(), v.clone())?;
        }
        for t in file.tensors() {
            w.add_tensor(
                t.name.clone(),
                t.dims.clone(),
                t.ty,
                file.tensor_data(t).to_vec(),
            )?;
        }
        Ok(w)
    }

    /// Sets the format version: 3 (the default) or 2. The two differ only in what readers accept.
    pub fn set_version(&mut self, version: u32) -> Result<&mut Self, GgufError> {
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        self.version = version;
        Ok(self)
    }

    /// Sets the alignment of the data section and of each tensor. Also sets `general.alignment`
    /// (added when the alignment is not the default; updated in place when already present).
    pub fn set_alignment(&mut self, alignment: u64) -> Result<&mut Self, GgufError> {
        check_alignment(alignment)?;
        let value = Value::U32(alignment as u32);
        match self.key_index.get(ALIGNMENT_KEY) {
            Some(&i) => self.metadata[i].1 = value,
            None if alignment != DEFAULT_ALIGNMENT => {
                self.key_index
                    .insert(ALIGNMENT_KEY.to_owned(), self.metadata.len());
                self.metadata.push((ALIGNMENT_KEY.to_owned(), value));
            }
            None => {}
        }
        self.relayout(alignment)?;
        Ok(self)
    }

    /// Adds a metadata entry. Keys must be non-empty and unique; `general.alignment` must be a
    /// valid `u32` alignment and takes effect as if by [`set_alignment`](Self::set_alignment).
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<&mut Self, GgufError> {
        let key = key.into();
        let value = value.into();
        let invalid = |reason: &str| GgufError::InvalidMetadata {
            key: key.clone(),
            reason: reason.to_owned(),
        };
        if key.is_empty() {
            return Err(invalid("keys must not be empty"));
        }
        if self.key_index.contains_key(&key) {
            return Err(invalid("key already added"));
        }
        if value.depth() > MAX_ARRAY_DEPTH {
            return Err(invalid(&format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        if key == ALIGNMENT_KEY {
            let Value::U32(a) = value else {
                return Err(GgufError::WrongType {
                    key,
                    expected: "u32",
                    found: value.type_name(),
                });
            };
            check_alignment(a.into())?;
            self.relayout(a.into())?;
        }
        self.key_index.insert(key.clone(), self.metadata.len());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Adds a tensor descriptor whose data will be streamed later (see
    /// [`write_header`](Self::write_header)). Returns the tensor's index.
    pub fn add_tensor_info(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        ty: GgmlType,
    ) -> Result<usize, GgufError> {
        self.push_tensor(name.into(), dims, ty, None)
    }

    /// Adds a tensor with its data, which must be exactly as long as its type and shape need.
    /// Returns the tensor's index.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<usize, GgufError> {
        self.push_tensor(name.into(), dims, ty, Some(data))
    }

    fn push_tensor(
        &mut self,
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        data: Option<Vec<u8>>,
    ) -> Result<usize, GgufError> {
        if self.tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let (n_elements, n_bytes) = check_shape(&name, &dims, ty)?;
        if let Some(d) = &data {
            if d.len() as u64 != n_bytes {
                return Err(GgufError::TensorDataSize {
                    tensor: name,
                    expected: n_bytes,
                    got: d.len() as u64,
                });
            }
        }
        let offset = match self.tensors.last() {
            None => 0,
            Some(p) => Self::next_offset(p.offset, p.n_bytes, self.alignment, &name)?,
        };
        self.tensor_index.insert(name.clone(), self.tensors.len());
        self.tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
        });
        self.data.push(data);
        Ok(self.tensors.len() - 1)
    }

    /// Where the tensor after one at `prev_offset` of `prev_bytes` starts, under `alignment`.
    fn next_offset(
        prev_offset: u64,
        prev_bytes: u64,
        alignment: u64,
        name: &str,
    ) -> Result<u64, GgufError> {
        prev_offset
            .checked_add(prev_bytes)
            .and_then(|end| align_up(end, alignment))
            .ok_or_else(|| GgufError::DataSectionOverflow {
                tensor: name.to_owned(),
            })
    }

    /// Recomputes tensor offsets for a new alignment, and adopts it if they all fit.
    fn relayout(&mut self, alignment: u64) -> Result<(), GgufError> {
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut prev: Option<(u64, u64)> = None;
        for t in &self.tensors {
            let offset = match prev {
                None => 0,
                Some((o, n)) => Self::next_offset(o, n, alignment, &t.name)?,
            };
            offsets.push(offset);
            prev = Some((offset, t.n_bytes));
        }
        for (t, o) in self.tensors.iter_mut().zip(offsets) {
            t.offset = o;
        }
        self.alignment = alignment;
        Ok(())
    }

    /// The format version that will be written.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment that will be used.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Metadata entries, in the order they will be written.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Tensor descriptors (with their final offsets), in the order they will be written.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The encoded header: magic, version, counts, metadata, tensor descriptors, and padding up
    /// to the data section.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut b, k);
            b.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut b, v);
        }
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.id().to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = align_up(b.len() as u64, self.alignment).unwrap_or(b.len() as u64);
        b.resize(padded as usize, 0);
        b
    }

    /// Writes the header, and returns a writer that takes the tensor data in order.
    pub fn write_header<W: Write>(&self, mut w: W) -> Result<TensorDataWriter<'_, W>, GgufError> {
        w.write_all(&self.header_bytes())
            .map_err(GgufError::Write)?;
        Ok(TensorDataWriter {
            gguf: self,
            w,
            index: 0,
            written: 0,
        })
    }

    /// Writes the whole file, using the data attached with [`add_tensor`](Self::add_tensor).
    pub fn write_to<W: Write>(&self, w: W) -> Result<W, GgufError> {
        let mut stream = self.write_header(w)?;
        self.write_attached_data(&mut stream)?;
        stream.finish()
    }

    fn write_attached_data<W: Write>(
        &self,
        stream: &mut TensorDataWriter<'_, W>,
    ) -> Result<(), GgufError> {
        for (i, (t, d)) in self.tensors.iter().zip(&self.data).enumerate() {
            let d = d.as_deref().ok_or_else(|| GgufError::MissingTensorData {
                tensor: t.name.clone(),
            })?;
            stream.write_tensor_data(i, d)?;
        }
        Ok(())
    }

    /// The whole file in memory, using the data attached with [`add_tensor`](Self::add_tensor).
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        self.write_to(Vec::new())
    }

    /// Writes the file to `path` atomically, using the data attached with
    /// [`add_tensor`](Self::add_tensor).
    pub fn write_file_atomic(&self, path: &Path) -> Result<(), GgufError> {
        self.write_file_atomic_with(path, |stream| self.write_attached_data(stream))
    }

    /// Writes the file to `path` atomically, with tensor data supplied by `fill` (which must
    /// write every tensor, in order). The file is written to a temporary file in the same
    /// directory, synced, then renamed over `path`: readers see either the old file or the whole
    /// new one, and on any error the temporary file is removed and `path` is untouched.
    pub fn write_file_atomic_with<E, F>(&self, path: &Path, fill: F) -> Result<(), E>
    where
        E: From<GgufError>,
        F: FnOnce(&mut TensorDataWriter<'_, BufWriter<StreamedFile>>) -> Result<(), E>,
    {
        let io = |op: &'static str, p: &Path| {
            let path = p.display().to_string();
            move |source| GgufError::Io { op, path, source }
        };
        let file_name = path.file_name().ok_or_else(|| {
            io("write", path)(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "path has no file name",
            ))
        })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = TempFile(Some(dir.join(tmp_name)));
        let tmp_path = tmp.path().to_path_buf();

        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_path)
            .map_err(io("create", &tmp_path))?;
        let file = StreamedFile {
            file,
            written: 0,
            synced: 0,
        };
        let mut stream = self.write_header(BufWriter::with_capacity(1 << 20, file))?;
        fill(&mut stream)?;
        let file = stream
            .finish()?
            .into_inner()
            .map_err(|e| GgufError::Write(e.into_error()))?
            .file;
        file.sync_all().map_err(io("sync", &tmp_path))?;
        drop(file);
        fs::rename(&tmp_path, path).map_err(io("rename into place", path))?;
        tmp.keep();
        // Make the rename itself durable; failing here leaves a complete file, so only try.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// The file [`GgufWriter::write_file_atomic_with`] writes: every [`StreamedFile::DRAIN_BYTES`]
/// it syncs what was written and drops it from the page cache, so that writing a file larger
/// than memory holds at most that many dirty bytes (which a memory cgroup would charge).
pub struct StreamedFile {
    file: File,
    written: u64,
    synced: u64,
}

impl StreamedFile {
    pub const DRAIN_BYTES: u64 = 64 << 20;
}

impl Write for StreamedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.synced >= Self::DRAIN_BYTES {
            self.file.sync_data()?;
            let _ = rustix::fs::fadvise(
                &self.file,
                0,
                std::num::NonZeroU64::new(self.written),
                rustix::fs::Advice::DontNeed,
            );
            self.synced = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A temporary file removed on drop unless kept.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

/// Takes tensor data after the header, in file order, inserting the alignment padding. A tensor
/// can be written whole ([`write_tensor_data`](Self::write_tensor_data)) or in pieces
/// ([`write_chunk`](Self::write_chunk)).
pub struct TensorDataWriter<'a, W: Write> {
    gguf: &'a GgufWriter,
    w: W,
    /// The tensor being written.
    index: usize,
    /// Bytes of it written so far.
    written: u64,
}

impl<W: Write> TensorDataWriter<'_, W> {
    /// The tensor whose data comes next, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.gguf.tensors.get(self.index)
    }

    /// Writes all of tensor `index`'s data, which must be the next tensor and exactly its size.
    pub fn write_tensor_data(&mut self, index: usize, data: &[u8]) -> Result<(), GgufError> {
        if index != self.index || self.written != 0 {
            return Err(GgufError::TensorOrder {
                reason: format!("got tensor #{index}, expected {}", self.describe_position()),
            });
        }
        let t = &self.gguf.tensors[index];
        if data.len() as u64 != t.n_bytes {
            return Err(GgufError::TensorDataSize {
                tensor: t.name.clone(),
                expected: t.n_bytes,
                got: data.len() as u64,
            });
        }
        self.write_chunk(data)
    }

    /// Writes the next `data.len()` bytes of the current tensor; moves to the next tensor (after
    /// padding) once this one is complete. A chunk may not run past the current tensor's end.
    pub fn write_chunk(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let Some(t) = self.gguf.tensors.get(self.index) else {
            return Err(GgufError::TensorOrder {
                reason: format!("{} bytes written after the last tensor", data.len()),
            });
        };
        let left = t.n_bytes - self.written;
        if data.len() as u64 > left {
            return Err(GgufError::TensorDataSize {
                tensor: t.name.clone(),
                expected: t.n_bytes,
                got: self.written + data.len() as u64,
            });
        }
        self.w.write_all(data).map_err(GgufError::Write)?;
        self.written += data.len() as u64;
        if self.written == t.n_bytes {
            let pad = align_up(t.n_bytes, self.gguf.alignment).unwrap_or(t.n_bytes) - t.n_bytes;
            const ZEROS: [u8; 256] = [0; 256];
            let mut pad = pad as usize;
            while pad > 0 {
                let n = pad.min(ZEROS.len());
                self.w.write_all(&ZEROS[..n]).map_err(GgufError::Write)?;
                pad -= n;
            }
            self.index += 1;
            self.written = 0;
        }
        Ok(())
    }

    fn describe_position(&self) -> String {
        match self.next_tensor() {
            None => "no more tensors".to_owned(),
            Some(t) if self.written == 0 => format!("tensor #{} {:?}", self.index, t.name),
            Some(t) => format!(
                "the rest of tensor #{} {:?} ({} of {} bytes written)",
                self.index, t.name, self.written, t.n_bytes
            ),
        }
    }

    /// Checks that every tensor was written, flushes, and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if self.index < self.gguf.tensors.len() {
            return Err(GgufError::TensorOrder {
                reason: format!("finished before {}", self.describe_position()),
            });
        }
        self.w.flush().map_err(GgufError::Write)?;
        Ok(self.w)
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// Encodes a value without its type id.
fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
    }
}

/// Encodes an array: element type id, length, elements.
fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&a.element_type_id().to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::F64(v) => le!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => {
            for s in v {
                put_str(b, s);
            }
        }
        Array::Array(v) => {
            for inner in v {
                put_array(b, inner);
            }
        }
    }
}
