//! The GGUF reader: parses the header of a memory-mapped (or owned) file and checks every count,
//! length and offset against the bytes actually present before using it, so that tensor data can
//! later be handed out as plain slices without further checks.
//!
//! This file holds the parsed file ([`GgufFile`]) and the bytes behind it (a map, a buffer or
//! parts of a file); the parsing and its checks are in `parse.rs`.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::parse::parse;
use super::{Array, GgufError, TensorInfo, Value};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The magic of PowerInfer's sparse-model files: a GGUF file whose first four bytes were
/// overwritten with `PWRI` (PowerInfer's `convert-hf-to-powerinfer-gguf.py`; its ggml reader
/// accepts both magics and reads the rest identically).
pub const POWERINFER_MAGIC: [u8; 4] = *b"PWRI";

/// A parsed GGUF file. The header is decoded into owned values; tensor data stays in the backing
/// bytes (usually a memory map) and is borrowed by [`GgufFile::tensor_data`].
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    /// The file starts with [`POWERINFER_MAGIC`] instead of [`MAGIC`].
    powerinfer: bool,
    /// A mapped file's modification time when it was mapped ([`GgufFile::check_unchanged`]).
    mapped_mtime: Option<std::time::SystemTime>,
    /// Ranges of a mapped file this process holds its own copy of ([`GgufFile::bytes_mut`]),
    /// sorted by start, not overlapping: reads of them see the copy.
    owned: Vec<(usize, Vec<u8>)>,
}

enum Backing {
    /// The whole file, mapped; the open file, for page-cache advice and for
    /// [`GgufFile::check_unchanged`].
    Mmap(Mmap, File),
    /// The whole file, in memory.
    Owned(Vec<u8>),
    /// Some byte ranges of a file of `len` bytes, each in its own buffer (sorted by start, not
    /// overlapping): what [`GgufFile::open_parts`] keeps.
    Parts {
        len: u64,
        parts: Vec<(usize, Vec<u8>)>,
    },
}

impl Backing {
    /// The whole file, when it is held whole.
    fn whole(&self) -> Option<&[u8]> {
        match self {
            Backing::Mmap(m, _) => Some(m),
            Backing::Owned(v) => Some(v),
            Backing::Parts { .. } => None,
        }
    }

    fn len(&self) -> u64 {
        match self {
            Backing::Parts { len, .. } => *len,
            b => b.whole().map_or(0, |w| w.len() as u64),
        }
    }

    /// Bytes `range` of the file, if they are held (within one part).
    fn get(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        match self {
            Backing::Parts { parts, .. } => {
                let i = parts.partition_point(|(start, _)| *start <= range.start);
                let (start, bytes) = parts.get(i.checked_sub(1)?)?;
                bytes.get(range.start - start..range.end.checked_sub(*start)?)
            }
            b => b.whole()?.get(range),
        }
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io_err = |op: &'static str| {
            let path = path.display().to_string();
            move |source| GgufError::Io { op, path, source }
        };
        let file = File::open(path).map_err(io_err("open"))?;
        let len = file.metadata().map_err(io_err("stat"))?.len();
        let backing = if len == 0 {
            // Mapping zero bytes is an error on some platforms; an empty file is just truncated.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: `Mmap::map` is unsafe because the mapped bytes can change (or the mapping
            // fault, if the file shrinks) when another process modifies the file while it is
            // mapped. We map read-only and assume model files are not modified in place while in
            // use: Conductor itself never writes to an existing model file (its writer creates a
            // new file and renames it over the old path, which leaves existing maps intact).
            // Under that assumption the map is an ordinary immutable byte slice for its lifetime,
            // which is tied to `self`.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err("memory-map"))?;
            Backing::Mmap(map, file)
        };
        Self::with_backing(backing)
    }

    /// Reads the whole file at `path` into memory (not a map) and parses it: what the file
    /// does after this (truncated, rewritten in place) cannot reach the bytes read, where a
    /// map ([`GgufFile::open`]) would see the change or fault (`SIGBUS`) on a page past a
    /// truncated end.
    pub fn read(path: &Path) -> Result<GgufFile, GgufError> {
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            op: "read",
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(bytes)
    }

    /// For a memory-mapped file: an error when the file is shorter than the map (truncated:
    /// a read of a page past its new end would raise `SIGBUS`) or was modified since it was
    /// mapped (its mtime moved: the map may now show other bytes). `Ok` for other backings,
    /// which hold their own copy. `path` names the file in the error.
    ///
    /// It is a check between uses, not a guard: a file truncated while a step reads the map
    /// still faults. Call it before each use (the engine does, before each step).
    pub fn check_unchanged(&self, path: &Path) -> Result<(), GgufError> {
        let Backing::Mmap(map, file) = &self.backing else {
            return Ok(());
        };
        let changed = |why: String| GgufError::ChangedWhileMapped {
            path: path.display().to_string(),
            why,
        };
        let now = file.metadata().map_err(|source| GgufError::Io {
            op: "stat",
            path: path.display().to_string(),
            source,
        })?;
        if now.len() < map.len() as u64 {
            return Err(changed(format!(
                "{} bytes mapped, {} now: truncated",
                map.len(),
                now.len()
            )));
        }
        if self.mapped_mtime.is_some() && now.modified().ok() != self.mapped_mtime {
            return Err(changed("modified since it was mapped".into()));
        }
        Ok(())
    }

    /// Parses the file at `path` and reads into memory only the tensors `keep` selects, each
    /// into its own buffer: what is held is the parsed header and those tensors' bytes, never
    /// a buffer the size of the file (so a file larger than memory opens). The other tensors'
    /// bytes are not in memory: [`bytes`](Self::bytes) answers [`GgufError::NotInMemory`] for
    /// them. The file's cached pages are dropped once read (they would count against a memory
    /// limit until reclaimed).
    pub fn open_parts(
        path: &Path,
        keep: impl Fn(&TensorInfo) -> bool,
    ) -> Result<GgufFile, GgufError> {
        use std::os::unix::fs::FileExt;
        let mapped = GgufFile::open(path)?;
        let Backing::Mmap(_, file) = &mapped.backing else {
            // An empty file fails to parse, so every file that parsed is mapped.
            unreachable!("a parsed file is mapped")
        };
        let len = mapped.file_len();
        let mut ranges: Vec<std::ops::Range<u64>> = mapped
            .tensors
            .iter()
            .filter(|t| keep(t))
            .map(|t| {
                let start = mapped.data_offset + t.offset;
                start..start + t.n_bytes
            })
            .collect();
        ranges.sort_unstable_by_key(|r| r.start);
        let mut parts = Vec::with_capacity(ranges.len());
        for r in ranges {
            // In bounds (checked by the parser), so these fit in usize: the file was mapped.
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            file.read_exact_at(&mut buf, r.start)
                .map_err(|source| GgufError::Io {
                    op: "read",
                    path: path.display().to_string(),
                    source,
                })?;
            parts.push((r.start as usize, buf));
        }
        let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
        let mut parted = mapped;
        parted.backing = Backing::Parts { len, parts };
        Ok(parted)
    }

    /// Drops bytes `range` of a memory-mapped file from this process's resident memory and from
    /// the page cache: they are read from the file again if used. For reading a file larger than
    /// memory front to back (`conductor convert`); a no-op for other backings.
    pub fn release_pages(&self, range: std::ops::Range<u64>) {
        let Backing::Mmap(map, file) = &self.backing else {
            return;
        };
        let page = rustix::param::page_size() as u64;
        let start = range.start / page * page;
        let end = range.end.min(map.len() as u64);
        if end <= start {
            return;
        }
        // SAFETY: MADV_DONTNEED on a shared, read-only file mapping only drops this process's
        // page-table entries: a later access faults the same bytes back in from the file. Under
        // the assumption `open` makes (the file is not modified while mapped) every slice that
        // borrows the map keeps reading the same bytes, so no borrow can observe a change.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start as usize,
                (end - start) as usize,
            )
        };
        let _ = rustix::fs::fadvise(
            file,
            start,
            std::num::NonZeroU64::new(end - start),
            rustix::fs::Advice::DontNeed,
        );
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::with_backing(Backing::Owned(bytes))
    }

    fn with_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let h = parse(backing.whole().expect("a whole file"))?;
        let mapped_mtime = match &backing {
            Backing::Mmap(_, file) => file.metadata().and_then(|m| m.modified()).ok(),
            _ => None,
        };
        Ok(GgufFile {
            mapped_mtime,
            owned: Vec::new(),
            backing,
            version: h.version,
            metadata: h.metadata,
            key_index: h.key_index,
            tensors: h.tensors,
            tensor_index: h.tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
            powerinfer: h.powerinfer,
        })
    }

    /// Whether the file carries PowerInfer's `PWRI` magic (PowerInfer reads its
    /// `powerinfer.*` metadata only from such files).
    pub fn is_powerinfer(&self) -> bool {
        self.powerinfer
    }

    /// Empties the arrays under `keys` (they read as empty arrays of their type afterwards):
    /// frees what was parsed once its consumer copied it (the tokenizer's vocabulary, merges and
    /// scores are several MiB for a 49k-token vocabulary).
    pub fn release_arrays(&mut self, keys: &[&str]) {
        for (k, v) in &mut self.metadata {
            if let Value::Array(a) = v {
                if keys.contains(&k.as_str()) {
                    a.clear();
                }
            }
        }
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => convert(v).map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_owned(),
                expected,
                found: v.type_name(),
            }),
        }
    }

    /// An integer key of any width, as long as its value is non-negative.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            Some(v) if v.is_integer() => match v.to_u64() {
                Some(x) => Ok(Some(x)),
                None => Err(GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: v.to_string(),
                    target: "u64",
                }),
            },
            _ => self.typed(key, "integer", |_| None),
        }
    }

    /// Like [`get_u64`](Self::get_u64), and the value must fit in a `u32`.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.get_u64(key)? {
            None => Ok(None),
            Some(x) => u32::try_from(x)
                .map(Some)
                .map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: x.to_string(),
                    target: "u32",
                }),
        }
    }

    /// An `f32` key; `f64` values are accepted and rounded.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.typed(key, "f32", |v| match *v {
            Value::F32(x) => Some(x),
            Value::F64(x) => Some(x as f32),
            _ => None,
        })
    }

    /// A `bool` key.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "bool", |v| match *v {
            Value::Bool(b) => Some(b),
            _ => None,
        })
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "string", Value::as_str)
    }

    /// An array key (of any element type).
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.typed(key, "array", Value::as_array)
    }

    /// Alignment of the data section and of each tensor's data (`general.alignment`, or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the tensor data section starts. In a file without tensors this
    /// may lie past the end of the file (writers need not pad a file that has no data).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All tensor descriptors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor descriptor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file. Bounds were checked when the file was parsed.
    ///
    /// # Panics
    /// If `t` did not come from this file and its range does not fit in it, or its bytes are
    /// not in memory ([`open_parts`](Self::open_parts)).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let end = self
            .data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|e| e > self.file_len()) {
            panic!("tensor '{}' does not belong to this GGUF file", t.name);
        }
        self.try_tensor_data(t)
            .unwrap_or_else(|e| panic!("tensor '{}': {e}", t.name))
    }

    /// [`tensor_data`](Self::tensor_data), or why its bytes cannot be had.
    pub fn try_tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let start = self.data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.n_bytes);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .ok_or(GgufError::NotInMemory { start, end })
            .and_then(|(s, e)| self.bytes(s..e))
    }

    /// Bytes `range` of the file, if they are in memory: anywhere in a mapped or owned file;
    /// within one kept tensor of a file opened with [`open_parts`](Self::open_parts).
    pub fn bytes(&self, range: std::ops::Range<usize>) -> Result<&[u8], GgufError> {
        if range.start > range.end {
            return Err(GgufError::NotInMemory {
                start: range.start as u64,
                end: range.end as u64,
            });
        }
        let i = self
            .owned
            .partition_point(|(start, _)| *start <= range.start);
        if let Some((start, bytes)) = i.checked_sub(1).map(|i| &self.owned[i]) {
            if range.end <= start + bytes.len() {
                return Ok(&bytes[range.start - start..range.end - start]);
            }
            // Part in a rewritten range, part not: no one slice holds it.
            if range.start < start + bytes.len() {
                return Err(GgufError::NotInMemory {
                    start: range.start as u64,
                    end: range.end as u64,
                });
            }
        }
        if self
            .owned
            .get(i)
            .is_some_and(|(start, _)| *start < range.end)
        {
            return Err(GgufError::NotInMemory {
                start: range.start as u64,
                end: range.end as u64,
            });
        }
        self.backing
            .get(range.clone())
            .ok_or(GgufError::NotInMemory {
                start: range.start as u64,
                end: range.end as u64,
            })
    }

    /// Bytes `range` of the file as memory this process may rewrite (a model rearranging a
    /// matrix it holds, [`crate::model::Model::laid_out`]): in place in a file held in
    /// memory; for a mapped file a copy that every later read of the range sees instead of the
    /// file, the mapped pages released ([`GgufFile::release_pages`]) so the range is held once.
    /// `range` must not overlap a range taken before, except by being one of them; a read
    /// ([`GgufFile::bytes`]) of a mapped file must then lie within one such range or outside
    /// them all.
    pub fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> Result<&mut [u8], GgufError> {
        let missing = GgufError::NotInMemory {
            start: range.start as u64,
            end: range.end as u64,
        };
        if range.start > range.end {
            return Err(missing);
        }
        if let Backing::Mmap(..) = self.backing {
            let i = self
                .owned
                .partition_point(|(start, _)| *start < range.start);
            let taken = self
                .owned
                .get(i)
                .is_some_and(|(s, b)| *s == range.start && b.len() == range.len());
            if !taken {
                let overlaps = |j: usize| {
                    self.owned
                        .get(j)
                        .is_some_and(|(s, b)| *s < range.end && range.start < s + b.len())
                };
                if overlaps(i) || i.checked_sub(1).is_some_and(overlaps) {
                    return Err(missing);
                }
                let copy = self.backing.get(range.clone()).ok_or(missing)?.to_vec();
                self.release_pages(range.start as u64..range.end as u64);
                self.owned.insert(i, (range.start, copy));
            }
            return Ok(&mut self.owned[i].1);
        }
        match &mut self.backing {
            Backing::Owned(v) => v.get_mut(range).ok_or(missing),
            Backing::Parts { parts, .. } => {
                let i = parts.partition_point(|(start, _)| *start <= range.start);
                let Some((start, bytes)) = i.checked_sub(1).and_then(|i| parts.get_mut(i)) else {
                    return Err(missing);
                };
                match range.end.checked_sub(*start) {
                    Some(end) => bytes.get_mut(range.start - *start..end).ok_or(missing),
                    None => Err(missing),
                }
            }
            Backing::Mmap(..) => unreachable!("handled above"),
        }
    }

    /// The whole file, when it is in memory or mapped (`None` for [`open_parts`](Self::open_parts)).
    pub fn file_bytes(&self) -> Option<&[u8]> {
        // With ranges rewritten ([`GgufFile::bytes_mut`]) the map is no longer the file's bytes.
        if !self.owned.is_empty() {
            return None;
        }
        self.backing.whole()
    }

    /// The file's length in bytes (also when only parts of it are held).
    pub fn file_len(&self) -> u64 {
        self.backing.len()
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("len", &self.file_len())
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl fmt::Display for Value {
    /// Scalars as their value, strings quoted, arrays as their type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "{} ({} elements)", a.type_name(), a.len()),
        }
    }
}
