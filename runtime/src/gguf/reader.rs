//! The GGUF reader: parses the header of a memory-mapped (or owned) file and checks every count,
//! length and offset against the bytes actually present before using it, so that tensor data can
//! later be handed out as plain slices without further checks.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::tensor::{align_up, check_alignment, check_shape, DEFAULT_ALIGNMENT, MAX_DIMS};
use super::value::{type_id, MAX_ARRAY_DEPTH};
use super::{Array, GgufError, TensorInfo, Value};
use crate::quant::GgmlType;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The magic of PowerInfer's sparse-model files: a GGUF file whose first four bytes were
/// overwritten with `PWRI` (PowerInfer's `convert-hf-to-powerinfer-gguf.py`; its ggml reader
/// accepts both magics and reads the rest identically).
pub const POWERINFER_MAGIC: [u8; 4] = *b"PWRI";

/// Fewest bytes one metadata entry can take: key length, a 1-byte key, type id, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes one tensor info can take: name length, empty name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

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

/// Everything parsed from the bytes, before it is paired with its backing.
struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    powerinfer: bool,
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
    /// matrix it holds, [`crate::model::Model::interleave_kquants`]): in place in a file held in
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

/// Reads little-endian fields from the file, never past its end. `what` describes the part being
/// read, for error messages.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: String,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let rest = &self.buf[self.pos..];
        match usize::try_from(n).ok().and_then(|n| rest.get(..n)) {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: self.what.clone(),
                offset: self.offset(),
                needed: n,
                available: self.remaining(),
            }),
        }
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        self.fixed().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        self.fixed().map(u64::from_le_bytes)
    }

    /// Reads a count of entries each taking at least `min_each` bytes, and rejects it before
    /// anything is allocated for it if the rest of the file could not hold that many.
    fn count(
        &mut self,
        what: impl FnOnce(&str) -> String,
        min_each: u64,
    ) -> Result<usize, GgufError> {
        let offset = self.offset();
        let n = self.u64()?;
        let available = self.remaining();
        match n.checked_mul(min_each) {
            Some(bytes) if bytes <= available => Ok(n as usize),
            _ => Err(GgufError::CountTooLarge {
                what: what(&self.what),
                count: n,
                offset,
                min_bytes_each: min_each,
                available,
            }),
        }
    }

    fn string(&mut self) -> Result<&'a str, GgufError> {
        let len = self.count(|ctx| format!("string length in {ctx}"), 1)?;
        let offset = self.offset();
        let bytes = self.take(len as u64)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: format!("string in {}", self.what),
            offset,
        })
    }
}

/// Bytes taken by one element of an array of this type, at the least (`None`: unknown type).
fn min_encoded_size(ty: u32) -> Option<u64> {
    use type_id::*;
    Some(match ty {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        STRING => 8,
        ARRAY => 4 + 8,
        _ => return None,
    })
}

fn le_vec<T, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    let (chunks, _) = bytes.as_chunks::<N>();
    chunks.iter().map(|c| f(*c)).collect()
}

fn read_bool(cur: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    let offset = cur.offset();
    match cur.fixed::<1>()?[0] {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::InvalidBool {
            key: key.to_owned(),
            byte,
            offset,
        }),
    }
}

fn read_value(
    cur: &mut Cursor<'_>,
    key: &str,
    ty: u32,
    ty_offset: u64,
) -> Result<Value, GgufError> {
    use type_id::*;
    Ok(match ty {
        U8 => Value::U8(cur.fixed::<1>()?[0]),
        I8 => Value::I8(i8::from_le_bytes(cur.fixed()?)),
        U16 => Value::U16(u16::from_le_bytes(cur.fixed()?)),
        I16 => Value::I16(i16::from_le_bytes(cur.fixed()?)),
        U32 => Value::U32(u32::from_le_bytes(cur.fixed()?)),
        I32 => Value::I32(i32::from_le_bytes(cur.fixed()?)),
        U64 => Value::U64(u64::from_le_bytes(cur.fixed()?)),
        I64 => Value::I64(i64::from_le_bytes(cur.fixed()?)),
        F32 => Value::F32(f32::from_le_bytes(cur.fixed()?)),
        F64 => Value::F64(f64::from_le_bytes(cur.fixed()?)),
        BOOL => Value::Bool(read_bool(cur, key)?),
        STRING => Value::String(cur.string()?.to_owned()),
        ARRAY => Value::Array(read_array(cur, key, 1)?),
        _ => {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                type_id: ty,
                offset: ty_offset,
            })
        }
    })
}

/// Reads an array (element type, length, elements); `depth` is 1 for a top-level array.
fn read_array(cur: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, GgufError> {
    use type_id::*;
    let ty_offset = cur.offset();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
            offset: ty_offset,
        });
    }
    let ty = cur.u32()?;
    let min = min_encoded_size(ty).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        type_id: ty,
        offset: ty_offset,
    })?;
    let n = cur.count(|_| format!("length of array {key:?}"), min)?;
    // `count` guarantees n * min bytes are present, so every allocation below is bounded by the
    // file size. Elements of fixed-size types are taken in one slice.
    let fixed = match ty {
        BOOL | STRING | ARRAY => &[][..],
        _ => cur.take(n as u64 * min)?,
    };
    Ok(match ty {
        U8 => Array::U8(fixed.to_vec()),
        I8 => Array::I8(le_vec(fixed, i8::from_le_bytes)),
        U16 => Array::U16(le_vec(fixed, u16::from_le_bytes)),
        I16 => Array::I16(le_vec(fixed, i16::from_le_bytes)),
        U32 => Array::U32(le_vec(fixed, u32::from_le_bytes)),
        I32 => Array::I32(le_vec(fixed, i32::from_le_bytes)),
        U64 => Array::U64(le_vec(fixed, u64::from_le_bytes)),
        I64 => Array::I64(le_vec(fixed, i64::from_le_bytes)),
        F32 => Array::F32(le_vec(fixed, f32::from_le_bytes)),
        F64 => Array::F64(le_vec(fixed, f64::from_le_bytes)),
        BOOL => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_bool(cur, key)?);
            }
            Array::Bool(v)
        }
        STRING => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(cur.string()?.to_owned());
            }
            Array::String(v)
        }
        _ => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(cur, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        what: "magic".to_owned(),
    };
    let magic = cur.fixed::<4>()?;
    if magic != MAGIC && magic != POWERINFER_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let powerinfer = magic == POWERINFER_MAGIC;
    cur.what = "version".to_owned();
    let version = cur.u32()?;
    // Byte-swapped small versions have their low 16 bits clear.
    if version != 0 && version & 0xFFFF == 0 {
        return Err(GgufError::BigEndian {
            raw_version: version,
        });
    }
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    cur.what = "header".to_owned();
    let n_tensors_offset = cur.offset();
    let n_tensors = cur.u64()?;
    let n_kv = cur.count(|_| "metadata entry count".to_owned(), MIN_KV_BYTES)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_offset = cur.offset();
        cur.what = format!("metadata key #{i}");
        let key = cur.string()?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey {
                index: i as u64,
                offset: key_offset,
            });
        }
        if key_index.contains_key(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
                offset: key_offset,
            });
        }
        cur.what = format!("value of metadata key {key:?}");
        let ty_offset = cur.offset();
        let ty = cur.u32()?;
        let value = read_value(&mut cur, key, ty, ty_offset)?;
        key_index.insert(key.to_owned(), metadata.len());
        metadata.push((key.to_owned(), value));
    }

    let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) => u64::from(*a),
        Some(v) => {
            return Err(GgufError::WrongType {
                key: "general.alignment".to_owned(),
                expected: "u32",
                found: v.type_name(),
            })
        }
    };
    check_alignment(alignment)?;

    // The tensor count sits in the header but can only be judged against the bytes left now.
    let available = cur.remaining();
    let n_tensors = match n_tensors.checked_mul(MIN_TENSOR_INFO_BYTES) {
        Some(b) if b <= available => n_tensors as usize,
        _ => {
            return Err(GgufError::CountTooLarge {
                what: "tensor count".to_owned(),
                count: n_tensors,
                offset: n_tensors_offset,
                min_bytes_each: MIN_TENSOR_INFO_BYTES,
                available,
            })
        }
    };
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        cur.what = format!("tensor info #{i}");
        let name = cur.string()?;
        if tensor_index.contains_key(name) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_owned(),
            });
        }
        cur.what = format!("tensor info {name:?}");
        let n_dims = cur.u32()?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                tensor: name.to_owned(),
                n_dims,
            });
        }
        let dims = (0..n_dims)
            .map(|_| cur.u64())
            .collect::<Result<Vec<_>, _>>()?;
        let type_id = cur.u32()?;
        let offset = cur.u64()?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.to_owned(),
            type_id,
        })?;
        let (n_elements, n_bytes) = check_shape(name, &dims, ty)?;
        tensor_index.insert(name.to_owned(), tensors.len());
        tensors.push(TensorInfo {
            name: name.to_owned(),
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
        });
    }

    // pos <= len < 2^63 and alignment <= 2^24: cannot overflow, but stay checked.
    let data_offset = align_up(cur.offset(), alignment).ok_or(GgufError::Truncated {
        what: "padding before the data section".to_owned(),
        offset: cur.offset(),
        needed: alignment,
        available: cur.remaining(),
    })?;
    check_tensor_layout(&tensors, alignment, data_offset, buf.len() as u64)?;

    Ok(Header {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
        powerinfer,
    })
}

/// Each tensor's data must be aligned, lie inside the file, and not overlap another's.
fn check_tensor_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::TensorMisaligned {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|e| e > file_len) {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_offset,
                file_len,
            });
        }
    }
    // In bounds, so the ends below cannot overflow.
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_unstable_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.offset + a.n_bytes;
        if b.offset < a_end {
            return Err(GgufError::TensorOverlap {
                tensor: b.name.clone(),
                offset: b.offset,
                other: a.name.clone(),
                other_end: a_end,
            });
        }
    }
    Ok(())
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
