//! Parsing a GGUF header: magic, version, metadata and tensor descriptors, each count, length
//! and offset checked against the bytes present before anything is allocated for it.

use std::collections::HashMap;

use super::reader::{MAGIC, POWERINFER_MAGIC};
use super::tensor::{align_up, check_alignment, check_shape, DEFAULT_ALIGNMENT, MAX_DIMS};
use super::value::{type_id, MAX_ARRAY_DEPTH};
use super::{Array, GgufError, TensorInfo, Value};
use crate::quant::GgmlType;

/// Fewest bytes one metadata entry can take: key length, a 1-byte key, type id, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes one tensor info can take: name length, empty name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Everything parsed from the bytes, before it is paired with its backing.
pub(super) struct Header {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, Value)>,
    pub(super) key_index: HashMap<String, usize>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) powerinfer: bool,
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

pub(super) fn parse(buf: &[u8]) -> Result<Header, GgufError> {
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
