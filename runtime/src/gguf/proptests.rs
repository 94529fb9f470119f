//! Property tests: random files round-trip through writer and reader, and damaged files (byte
//! flips, truncation, insertions, deletions, huge length fields) never panic the reader, and when
//! accepted have in-bounds tensor data and re-serialize.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

use super::*;
use crate::quant::GgmlType;

fn arb_string() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..12).prop_map(|cs| cs.into_iter().collect())
}

fn arb_array() -> impl Strategy<Value = Array> {
    const N: usize = 6;
    let leaf = prop_oneof![
        vec(any::<u8>(), 0..N).prop_map(Array::U8),
        vec(any::<i8>(), 0..N).prop_map(Array::I8),
        vec(any::<u16>(), 0..N).prop_map(Array::U16),
        vec(any::<i16>(), 0..N).prop_map(Array::I16),
        vec(any::<u32>(), 0..N).prop_map(Array::U32),
        vec(any::<i32>(), 0..N).prop_map(Array::I32),
        vec(any::<u64>(), 0..N).prop_map(Array::U64),
        vec(any::<i64>(), 0..N).prop_map(Array::I64),
        vec(any::<f32>(), 0..N).prop_map(Array::F32),
        vec(any::<f64>(), 0..N).prop_map(Array::F64),
        vec(any::<bool>(), 0..N).prop_map(Array::Bool),
        vec(arb_string(), 0..N).prop_map(Array::String),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| vec(inner, 0..3).prop_map(Array::Array))
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<f32>().prop_map(Value::F32),
        any::<f64>().prop_map(Value::F64),
        any::<bool>().prop_map(Value::Bool),
        arb_string().prop_map(Value::String),
        arb_array().prop_map(Value::Array),
    ]
}

const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F64,
    GgmlType::I8,
    GgmlType::I32,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// A tensor: type, dims (row length a whole number of blocks), and a seed for its data.
fn arb_tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, u64)> {
    (
        proptest::sample::select(TYPES),
        1..3u64,
        vec(1..4u64, 0..4),
        any::<u64>(),
    )
        .prop_map(|(ty, blocks, rest, seed)| {
            let mut dims = vec![blocks * ty.block_size() as u64];
            dims.extend(rest);
            (ty, dims, seed)
        })
}

#[derive(Clone, Debug)]
struct Spec {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

fn arb_spec(max_kv: usize, max_tensors: usize) -> impl Strategy<Value = Spec> {
    (
        2..=3u32,
        proptest::sample::select(&[1u64, 8, 32, 64, 256][..]),
        vec((arb_string(), arb_value()), 0..max_kv),
        vec((arb_string(), arb_tensor()), 0..max_tensors),
    )
        .prop_map(|(version, alignment, kvs, ts)| Spec {
            version,
            alignment,
            // Unique keys and names; the random part exercises arbitrary UTF-8.
            metadata: kvs
                .into_iter()
                .enumerate()
                .map(|(i, (k, v))| (format!("k{i}.{k}"), v))
                .collect(),
            tensors: ts
                .into_iter()
                .enumerate()
                .map(|(i, (n, (ty, dims, seed)))| {
                    let n_bytes = ty.bytes_for(dims.iter().product()).unwrap();
                    (
                        format!("t{i}.{n}"),
                        ty,
                        dims,
                        pseudo_random(seed, n_bytes as usize),
                    )
                })
                .collect(),
        })
}

fn pseudo_random(seed: u64, n: usize) -> Vec<u8> {
    let mut rng = crate::sample::SplitMix64::new(seed);
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

fn build(spec: &Spec) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set_version(spec.version).unwrap();
    w.set_alignment(spec.alignment).unwrap();
    for (k, v) in &spec.metadata {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    for (name, ty, dims, data) in &spec.tensors {
        w.add_tensor(name.clone(), dims.clone(), *ty, data.clone())
            .unwrap();
    }
    w
}

/// Equality that compares floats bit for bit (NaNs included), as a round trip must preserve.
fn same_array(a: &Array, b: &Array) -> bool {
    match (a, b) {
        (Array::F32(x), Array::F32(y)) => x
            .iter()
            .map(|v| v.to_bits())
            .eq(y.iter().map(|v| v.to_bits())),
        (Array::F64(x), Array::F64(y)) => x
            .iter()
            .map(|v| v.to_bits())
            .eq(y.iter().map(|v| v.to_bits())),
        (Array::Array(x), Array::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_array(p, q))
        }
        _ => a == b,
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => same_array(x, y),
        _ => a == b,
    }
}

fn same_metadata(a: &[(String, Value)], b: &[(String, Value)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && same_value(va, vb))
}

/// What every input must satisfy: no panic; when accepted, tensor data in bounds and the file
/// writes back out to an equivalent file.
fn check_any_input(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let len = bytes.len() as u64;
    let f = match GgufFile::from_bytes(bytes) {
        Ok(f) => f,
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.is_empty() && !msg.contains('\n'), "{msg:?}");
            return Ok(());
        }
    };
    prop_assert!(matches!(f.version(), 2 | 3));
    for t in f.tensors() {
        let d = f.tensor_data(t);
        prop_assert_eq!(d.len() as u64, t.n_bytes);
        prop_assert!(f.data_offset() + t.offset + t.n_bytes <= len);
        prop_assert_eq!(f.tensor(&t.name), Some(t));
    }
    let w = GgufWriter::from_file(&f).map_err(|e| TestCaseError::fail(format!("rewrite: {e}")))?;
    let again = GgufFile::from_bytes(
        w.to_bytes()
            .map_err(|e| TestCaseError::fail(e.to_string()))?,
    )
    .map_err(|e| TestCaseError::fail(format!("re-read: {e}")))?;
    prop_assert!(same_metadata(f.metadata(), again.metadata()));
    prop_assert_eq!(f.alignment(), again.alignment());
    prop_assert_eq!(f.tensors().len(), again.tensors().len());
    for (a, b) in f.tensors().iter().zip(again.tensors()) {
        prop_assert_eq!((&a.name, &a.dims, a.ty), (&b.name, &b.dims, b.ty));
        prop_assert_eq!(f.tensor_data(a), again.tensor_data(b));
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    /// Overwrite 8 bytes with a large little-endian value (hits length and count fields).
    Huge(Index, u64),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    let huge = prop_oneof![
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(1u64 << 32),
        Just(1u64 << 40),
        Just(u32::MAX as u64),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<Index>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), vec(any::<u8>(), 1..9)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1..9usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
        2 => (any::<Index>(), huge).prop_map(|(i, v)| Mutation::Huge(i, v)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Flip(i, x) => {
            let i = i.index(bytes.len());
            bytes[i] ^= x;
        }
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
        Mutation::Insert(i, b) => {
            let i = i.index(bytes.len() + 1);
            bytes.splice(i..i, b.iter().copied());
        }
        Mutation::Delete(i, n) => {
            let i = i.index(bytes.len());
            let end = (i + n).min(bytes.len());
            bytes.drain(i..end);
        }
        Mutation::Huge(i, v) => {
            let i = i.index(bytes.len());
            let end = (i + 8).min(bytes.len());
            bytes[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gguf_random_files_round_trip(spec in arb_spec(10, 6)) {
        let w = build(&spec);
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        prop_assert_eq!(f.version(), spec.version);
        prop_assert_eq!(f.alignment(), spec.alignment);
        prop_assert_eq!(f.data_offset() % spec.alignment, 0);
        prop_assert!(same_metadata(f.metadata(), w.metadata()));
        // What the reader sees, minus the alignment key the writer adds, is exactly the input.
        let user: Vec<_> = f
            .metadata()
            .iter()
            .filter(|(k, _)| k != "general.alignment")
            .cloned()
            .collect();
        prop_assert!(same_metadata(&user, &spec.metadata));
        for (k, v) in &spec.metadata {
            prop_assert!(same_value(f.get(k).unwrap(), v));
        }
        prop_assert_eq!(f.tensors(), w.tensors());
        prop_assert_eq!(f.tensors().len(), spec.tensors.len());
        for (t, (name, ty, dims, data)) in f.tensors().iter().zip(&spec.tensors) {
            prop_assert_eq!((&t.name, t.ty, &t.dims), (name, *ty, dims));
            prop_assert_eq!(t.offset % spec.alignment, 0);
            prop_assert_eq!(f.tensor_data(t), data.as_slice());
        }
        // Byte-exact rewrite, and streaming in small chunks gives the same bytes.
        prop_assert_eq!(&GgufWriter::from_file(&f).unwrap().to_bytes().unwrap(), &bytes);
        let mut s = w.write_header(Vec::new()).unwrap();
        for (_, _, _, data) in &spec.tensors {
            for chunk in data.chunks(7) {
                s.write_chunk(chunk).unwrap();
            }
        }
        prop_assert_eq!(s.finish().unwrap(), bytes);
    }

    #[test]
    fn gguf_mutated_files_never_panic(
        spec in arb_spec(5, 4),
        mutations in vec(arb_mutation(), 1..4),
    ) {
        let mut bytes = build(&spec).to_bytes().unwrap();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check_any_input(bytes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gguf_every_truncation_is_handled(spec in arb_spec(4, 3)) {
        let bytes = build(&spec).to_bytes().unwrap();
        for len in 0..bytes.len() {
            check_any_input(bytes[..len].to_vec())?;
        }
    }
}

/// Every 8-byte window of a small file overwritten with each of a few huge values: covers every
/// count, length, dimension and offset field deterministically.
#[test]
fn gguf_huge_values_at_every_offset() {
    let mut w = GgufWriter::new();
    w.add_metadata("s", "abc").unwrap();
    w.add_metadata("a", vec!["x", "yz"]).unwrap();
    w.add_metadata(
        "n",
        Value::Array(Array::Array(vec![Array::U16(vec![1, 2])])),
    )
    .unwrap();
    w.add_tensor("q", vec![32, 2], GgmlType::Q4_0, vec![3; 36])
        .unwrap();
    w.add_tensor("f", vec![2], GgmlType::F32, vec![4; 8])
        .unwrap();
    let bytes = w.to_bytes().unwrap();
    let mut accepted = 0;
    for i in 0..bytes.len() {
        for v in [u64::MAX, 1 << 63, 1 << 32, u32::MAX as u64, 0] {
            let mut b = bytes.clone();
            let end = (i + 8).min(b.len());
            b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            let ok = GgufFile::from_bytes(b.clone()).is_ok();
            accepted += usize::from(ok);
            check_any_input(b).unwrap();
        }
    }
    // Writing into tensor data or padding is harmless, so some variants must still parse.
    assert!(accepted > 0);
}
