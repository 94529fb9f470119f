//! Unit tests: round trips through the writer, and one test per class of bad input, each built as
//! raw bytes (or a valid file with one field patched) and checked for its specific error.

use super::*;
use crate::quant::GgmlType;

/// Hand-assembled GGUF bytes, for inputs the writer refuses to produce.
#[derive(Clone, Default)]
pub(super) struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    pub fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(self, x: u8) -> Raw {
        self.bytes(&[x])
    }
    pub fn u32(self, x: u32) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    pub fn u64(self, x: u64) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    pub fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    pub fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(4).u32(v)
    }
    pub fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad(mut self, align: usize) -> Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn parse(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0)
    }
}

/// Asserts that `r` is an error matching `pattern`, showing the actual result otherwise.
macro_rules! assert_err {
    ($r:expr, $pattern:pat $(if $guard:expr)?) => {
        match $r {
            Err(e) => {
                assert!(matches!(e, $pattern $(if $guard)?), "unexpected error: {e}");
                let msg = e.to_string();
                assert!(!msg.contains('\n') && !msg.is_empty(), "message not one line: {msg:?}");
            }
            Ok(v) => panic!("expected an error, got Ok({v:?})"),
        }
    };
}

/// One F32 tensor `w` of 4 elements at offset 0, with a u32 key: a minimal valid file.
fn minimal() -> Raw {
    Raw::header(3, 1, 1)
        .kv_u32("a.b", 7)
        .tensor("w", &[4], 0, 0)
        .pad(32)
        .zeros(16)
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("llama.block_count", 2u32).unwrap();
    w.add_metadata("llama.rope.freq_base", 10000.0f32).unwrap();
    w.add_metadata("tokenizer.ggml.tokens", vec!["<s>", "</s>", "hé"])
        .unwrap();
    w.add_metadata("tokenizer.ggml.scores", vec![0.0f32, -1.5, 2.25])
        .unwrap();
    w.add_tensor("tok_embd", vec![32, 3], GgmlType::Q8_0, (0..102).collect())
        .unwrap();
    w.add_tensor("norm", vec![5], GgmlType::F32, vec![1; 20])
        .unwrap();
    w
}

#[test]
fn minimal_raw_file_parses() {
    let f = minimal().parse().unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_u32("a.b").unwrap(), Some(7));
    assert_eq!(f.data_offset() % 32, 0);
    let t = f.tensor("w").unwrap();
    assert_eq!((t.n_elements, t.n_bytes, t.ty), (4, 16, GgmlType::F32));
    assert_eq!(f.tensor_data(t), &[0u8; 16]);
}

#[test]
fn writer_round_trip_all_value_types() {
    let mut w = GgufWriter::new();
    let values: Vec<(&str, Value)> = vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f32", Value::F32(1.5)),
        ("f64", Value::F64(-2.25e300)),
        ("bool", Value::Bool(true)),
        ("str", Value::String("héllo\0world".into())),
        ("empty_str", Value::String(String::new())),
        ("a_u8", vec![1u8, 2, 3].into()),
        ("a_i8", vec![-1i8, 2].into()),
        ("a_u16", vec![1u16, 65535].into()),
        ("a_i16", vec![-1i16].into()),
        ("a_u32", vec![7u32].into()),
        ("a_i32", vec![-7i32, 8].into()),
        ("a_u64", vec![u64::MAX].into()),
        ("a_i64", vec![i64::MIN, 0].into()),
        ("a_f32", vec![0.5f32, -0.0].into()),
        ("a_f64", vec![1e-300f64].into()),
        ("a_bool", vec![true, false, true].into()),
        ("a_str", vec!["x", "", "ünï"].into()),
        ("a_empty", Value::Array(Array::U32(vec![]))),
        (
            "a_nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1]),
                Array::String(vec!["s".into()]),
                Array::Array(vec![Array::Bool(vec![])]),
            ])),
        ),
    ];
    for (k, v) in &values {
        w.add_metadata(*k, v.clone()).unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let got: Vec<(&str, Value)> = f
        .metadata()
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    assert_eq!(got, values);
    assert!(f.tensors().is_empty());
    assert_eq!(f.alignment(), 32);
}

#[test]
fn writer_round_trip_tensors_and_getters() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.tensors(), w.tensors());
    let e = f.tensor("tok_embd").unwrap();
    assert_eq!(e.dims, vec![32, 3]);
    assert_eq!(e.n_elements, 96);
    assert_eq!(e.n_bytes, 102);
    assert_eq!(f.tensor_data(e), (0..102).collect::<Vec<u8>>().as_slice());
    let n = f.tensor("norm").unwrap();
    assert_eq!(n.offset, 128, "102 bytes padded to 32");
    assert_eq!(f.tensor_data(n), &[1u8; 20]);
    assert!(f.tensor("missing").is_none());
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), Some(10000.0));
    let tokens = f.get_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 3);
    assert_eq!(tokens.as_strings().unwrap()[2], "hé");
    assert!(tokens.as_f32().is_none());
    assert_eq!(f.get("nope"), None);
    assert_eq!(f.get_u32("nope").unwrap(), None);
    // The file ends padded, and the writer reproduces it byte for byte.
    assert_eq!(bytes.len() % 32, 0);
    assert_eq!(
        GgufWriter::from_file(&f).unwrap().to_bytes().unwrap(),
        bytes
    );
    assert_eq!(f.file_bytes().unwrap(), bytes.as_slice());
}

#[test]
fn typed_getters_check_types_and_ranges() {
    let mut w = GgufWriter::new();
    w.add_metadata("neg", -3i32).unwrap();
    w.add_metadata("pos_i64", 5i64).unwrap();
    w.add_metadata("big", u64::MAX).unwrap();
    w.add_metadata("f64", 0.25f64).unwrap();
    w.add_metadata("s", "text").unwrap();
    w.add_metadata("b", false).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.get_u64("pos_i64").unwrap(), Some(5));
    assert_eq!(f.get_u32("pos_i64").unwrap(), Some(5));
    assert_err!(f.get_u64("neg"), GgufError::OutOfRange { ref key, .. } if key == "neg");
    assert_eq!(f.get_u64("big").unwrap(), Some(u64::MAX));
    assert_err!(
        f.get_u32("big"),
        GgufError::OutOfRange { target: "u32", .. }
    );
    assert_eq!(f.get_f32("f64").unwrap(), Some(0.25));
    assert_eq!(f.get_bool("b").unwrap(), Some(false));
    assert_err!(
        f.get_u32("s"),
        GgufError::WrongType { ref key, found: "string", .. } if key == "s"
    );
    assert_err!(
        f.get_f32("pos_i64"),
        GgufError::WrongType {
            expected: "f32",
            found: "i64",
            ..
        }
    );
    assert_err!(f.get_str("b"), GgufError::WrongType { .. });
    assert_err!(f.get_bool("s"), GgufError::WrongType { .. });
    assert_err!(f.get_array("s"), GgufError::WrongType { .. });
}

#[test]
fn custom_alignment_is_written_and_honoured() {
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    w.add_tensor("a", vec![3], GgmlType::F32, vec![9; 12])
        .unwrap();
    w.add_tensor("b", vec![1], GgmlType::F32, vec![8; 4])
        .unwrap();
    assert_eq!(w.tensors()[1].offset, 64);
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get("general.alignment"), Some(&Value::U32(64)));
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("b").unwrap().offset, 64);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &[8; 4]);

    // Changing the alignment later re-lays out tensors added before.
    w.set_alignment(32).unwrap();
    assert_eq!(w.tensors()[1].offset, 32);
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.get("general.alignment"), Some(&Value::U32(32)));
    assert_eq!(f.tensor("b").unwrap().offset, 32);

    // Alignment 1 packs tensors back to back.
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", 1u32).unwrap();
    w.add_tensor("a", vec![1], GgmlType::I8, vec![1]).unwrap();
    w.add_tensor("b", vec![1], GgmlType::I8, vec![2]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensor("b").unwrap().offset, 1);
}

#[test]
fn version_2_round_trips() {
    let mut w = sample_writer();
    w.set_version(2).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 2);
    assert_err!(
        w.set_version(1),
        GgufError::UnsupportedVersion { version: 1 }
    );
    assert_err!(
        w.set_version(4),
        GgufError::UnsupportedVersion { version: 4 }
    );
}

#[test]
fn file_without_tensors_needs_no_trailing_padding() {
    // Vocabulary-only files end right after the metadata.
    let raw = Raw::header(3, 0, 1).kv_u32("a", 1);
    let len = raw.0.len() as u64;
    let f = raw.parse().unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.data_offset(), len.next_multiple_of(32));
}

#[test]
fn streaming_writer_matches_to_bytes_and_enforces_order() {
    let w = sample_writer();
    let expected = w.to_bytes().unwrap();
    let data: Vec<u8> = (0..102).collect();

    let mut s = w.write_header(Vec::new()).unwrap();
    assert_eq!(s.next_tensor().unwrap().name, "tok_embd");
    for chunk in data.chunks(40) {
        s.write_chunk(chunk).unwrap();
    }
    assert_eq!(s.next_tensor().unwrap().name, "norm");
    s.write_tensor_data(1, &[1; 20]).unwrap();
    assert!(s.next_tensor().is_none());
    assert_eq!(s.finish().unwrap(), expected);

    let mut s = w.write_header(Vec::new()).unwrap();
    assert_err!(
        s.write_tensor_data(1, &[1; 20]),
        GgufError::TensorOrder { .. }
    );
    assert_err!(
        s.write_tensor_data(0, &data[..101]),
        GgufError::TensorDataSize {
            expected: 102,
            got: 101,
            ..
        }
    );
    s.write_chunk(&data[..50]).unwrap();
    assert_err!(s.write_chunk(&data[..53]), GgufError::TensorDataSize { .. });
    assert_err!(s.write_tensor_data(0, &data), GgufError::TensorOrder { .. });
    s.write_chunk(&data[50..]).unwrap();
    assert_err!(s.finish(), GgufError::TensorOrder { .. });

    let mut s = w.write_header(Vec::new()).unwrap();
    s.write_tensor_data(0, &data).unwrap();
    s.write_tensor_data(1, &[1; 20]).unwrap();
    assert_err!(s.write_chunk(&[0]), GgufError::TensorOrder { .. });
}

#[test]
fn writer_rejects_invalid_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u8).unwrap();
    assert_err!(w.add_metadata("k", 2u8), GgufError::InvalidMetadata { .. });
    assert_err!(w.add_metadata("", 2u8), GgufError::InvalidMetadata { .. });
    assert_err!(
        w.add_metadata("general.alignment", 64u64),
        GgufError::WrongType {
            expected: "u32",
            ..
        }
    );
    assert_err!(
        w.add_metadata("general.alignment", 48u32),
        GgufError::BadAlignment { .. }
    );
    assert_err!(w.set_alignment(0), GgufError::BadAlignment { .. });
    let mut deep = Array::U8(vec![1]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    assert_err!(
        w.add_metadata("deep", deep),
        GgufError::InvalidMetadata { .. }
    );

    w.add_tensor_info("t", vec![32], GgmlType::Q4_0).unwrap();
    assert_err!(
        w.add_tensor_info("t", vec![32], GgmlType::Q4_0),
        GgufError::DuplicateTensor { .. }
    );
    assert_err!(
        w.add_tensor_info("u", vec![33], GgmlType::Q4_0),
        GgufError::RowNotBlockMultiple { .. }
    );
    assert_err!(
        w.add_tensor_info("u", vec![], GgmlType::F32),
        GgufError::BadDimCount { n_dims: 0, .. }
    );
    assert_err!(
        w.add_tensor_info("u", vec![1; 5], GgmlType::F32),
        GgufError::BadDimCount { n_dims: 5, .. }
    );
    assert_err!(
        w.add_tensor_info("u", vec![4, 0], GgmlType::F32),
        GgufError::ZeroDim { dim: 1, .. }
    );
    assert_err!(
        w.add_tensor("u", vec![4], GgmlType::F32, vec![0; 15]),
        GgufError::TensorDataSize {
            expected: 16,
            got: 15,
            ..
        }
    );
    // "t" has no data attached, so the in-memory paths refuse.
    assert_err!(w.to_bytes(), GgufError::MissingTensorData { ref tensor } if tensor == "t");
    assert_eq!(w.tensors().len(), 1, "failed adds leave no trace");
}

#[test]
fn writer_rejects_data_section_overflow() {
    let mut w = GgufWriter::new();
    w.add_tensor_info("a", vec![1 << 61], GgmlType::F32)
        .unwrap();
    w.add_tensor_info("b", vec![1 << 61], GgmlType::F32)
        .unwrap();
    assert_err!(
        w.add_tensor_info("c", vec![1 << 61], GgmlType::F32),
        GgufError::DataSectionOverflow { ref tensor } if tensor == "c"
    );
}

#[test]
fn atomic_write_creates_file_and_cleans_up_on_failure() {
    let dir = std::env::temp_dir().join(format!("conductor-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let w = sample_writer();
    w.write_file_atomic(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.file_bytes().unwrap(), w.to_bytes().unwrap().as_slice());
    assert_eq!(f.tensors(), w.tensors());

    // A fill that fails midway leaves the old file and no temporary behind.
    let r: Result<(), GgufError> = w.write_file_atomic_with(&path, |s| {
        s.write_chunk(&[0; 10])?;
        Err(GgufError::TensorOrder {
            reason: "simulated".into(),
        })
    });
    assert_err!(r, GgufError::TensorOrder { .. });
    // A fill that stops early is caught by the writer.
    let r: Result<(), GgufError> = w.write_file_atomic_with(&path, |_| Ok(()));
    assert_err!(r, GgufError::TensorOrder { .. });
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("model.gguf")]);
    assert_eq!(std::fs::read(&path).unwrap(), w.to_bytes().unwrap());

    // Writing into a missing directory fails with the path in the message.
    let bad = dir.join("missing").join("x.gguf");
    let e = w.write_file_atomic(&bad).unwrap_err();
    assert!(
        matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn open_reports_missing_and_empty_files() {
    let dir = std::env::temp_dir().join(format!("conductor-gguf-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("nope.gguf");
    assert_err!(GgufFile::open(&missing), GgufError::Io { op: "open", .. });
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_err!(
        GgufFile::open(&empty),
        GgufError::Truncated { offset: 0, .. }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[should_panic(expected = "does not belong")]
fn tensor_data_panics_for_a_foreign_tensor_info() {
    let f = minimal().parse().unwrap();
    let mut t = f.tensor("w").unwrap().clone();
    t.offset = 1 << 40;
    let _ = f.tensor_data(&t);
}

mod hostile;

#[test]
fn bytes_mut_rewrites_a_range_in_every_backing_and_reads_see_it() {
    let dir = std::env::temp_dir().join(format!("conductor-gguf-mut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let bytes = sample_writer().to_bytes().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let len = bytes.len();
    let (a, b) = (len / 4, len / 2);
    for mut f in [
        GgufFile::open(&path).unwrap(),
        GgufFile::read(&path).unwrap(),
    ] {
        f.bytes_mut(a..b).unwrap().fill(0xA5);
        // The same range again is the same (rewritten) bytes; reads inside it see them.
        assert!(f.bytes_mut(a..b).unwrap().iter().all(|&v| v == 0xA5));
        assert!(f.bytes(a + 1..b - 1).unwrap().iter().all(|&v| v == 0xA5));
        // Around it, the file's bytes.
        assert_eq!(f.bytes(0..a).unwrap(), &bytes[..a]);
        assert_eq!(f.bytes(b..len).unwrap(), &bytes[b..]);
        // A range straddling one taken from a mapped file has no single home: refused there.
        if f.file_bytes().is_none() {
            assert!(f.bytes_mut(a - 1..a + 1).is_err());
            assert!(f.bytes(a - 1..a + 1).is_err());
            assert!(f.bytes(b - 1..b + 1).is_err());
        }
        assert!(f.bytes_mut(len..len + 1).is_err());
    }
    // The file itself is untouched.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}
