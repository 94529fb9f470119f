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
    assert_eq!(f.file_bytes(), bytes.as_slice());
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
    assert_eq!(f.file_bytes(), w.to_bytes().unwrap().as_slice());
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

// ---- Hostile input: one test per class. ----

#[test]
fn truncated_files() {
    assert_err!(
        GgufFile::from_bytes(vec![]),
        GgufError::Truncated {
            offset: 0,
            needed: 4,
            ..
        }
    );
    assert_err!(
        GgufFile::from_bytes(b"GGUF\x03\x00".to_vec()),
        GgufError::Truncated {
            offset: 4,
            needed: 4,
            available: 2,
            ..
        }
    );
    // Every prefix that cuts into the header or tensor data fails; only trailing padding after
    // the last tensor may go.
    let full = sample_writer().to_bytes().unwrap();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let last = f.tensors().last().unwrap();
    let needed = (f.data_offset() + last.offset + last.n_bytes) as usize;
    for len in 0..needed {
        assert!(
            GgufFile::from_bytes(full[..len].to_vec()).is_err(),
            "prefix of {len} bytes parsed"
        );
    }
    for len in needed..=full.len() {
        GgufFile::from_bytes(full[..len].to_vec()).unwrap();
    }
    // Cut inside a metadata value: the message names the key.
    let raw = Raw::header(3, 0, 1).str("my.key").u32(4).bytes(&[1, 2]);
    match raw.parse() {
        Err(e @ GgufError::Truncated { .. }) => assert!(e.to_string().contains("my.key"), "{e}"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn wrong_magic() {
    let mut b = minimal().0;
    b[..4].copy_from_slice(b"GGML");
    assert_err!(GgufFile::from_bytes(b), GgufError::BadMagic { found } if &found == b"GGML");
}

#[test]
fn powerinfer_magic_reads_as_gguf() {
    // PowerInfer's converter writes a GGUF file, then overwrites its first four bytes with
    // `PWRI`: the rest must parse exactly as the GGUF original does.
    let gguf = sample_writer().to_bytes().unwrap();
    let mut pwri = gguf.clone();
    pwri[..4].copy_from_slice(b"PWRI");
    let (a, b) = (
        GgufFile::from_bytes(gguf).unwrap(),
        GgufFile::from_bytes(pwri).unwrap(),
    );
    assert!(!a.is_powerinfer());
    assert!(b.is_powerinfer());
    assert_eq!(a.version(), b.version());
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(a.tensors(), b.tensors());
    assert_eq!(a.data_offset(), b.data_offset());
    for t in a.tensors() {
        assert_eq!(a.tensor_data(t), b.tensor_data(t));
    }
    // Other magics stay errors.
    let mut bad = minimal().0;
    bad[..4].copy_from_slice(b"PWRX");
    assert_err!(GgufFile::from_bytes(bad), GgufError::BadMagic { found } if &found == b"PWRX");
}

#[test]
fn big_endian_file() {
    let b = Raw::default()
        .bytes(b"GGUF")
        .bytes(&3u32.to_be_bytes())
        .bytes(&0u64.to_be_bytes())
        .bytes(&0u64.to_be_bytes());
    assert_err!(
        b.parse(),
        GgufError::BigEndian {
            raw_version: 0x0300_0000
        }
    );
}

#[test]
fn unsupported_versions() {
    for v in [0, 1, 4, 0xFFFF] {
        assert_err!(
            Raw::header(v, 0, 0).parse(),
            GgufError::UnsupportedVersion { version } if version == v
        );
    }
    Raw::header(2, 0, 0).parse().unwrap();
    Raw::header(3, 0, 0).parse().unwrap();
}

#[test]
fn absurd_counts() {
    // More metadata entries than the file could hold (including a count that overflows).
    for n in [1_000, u64::MAX, 1 << 60] {
        assert_err!(
            Raw::header(3, 0, n).kv_u32("a", 1).parse(),
            GgufError::CountTooLarge { count, offset: 16, .. } if count == n
        );
    }
    // More tensors than the file could hold.
    assert_err!(
        Raw::header(3, u64::MAX / 2, 0).zeros(64).parse(),
        GgufError::CountTooLarge { offset: 8, .. }
    );
    // An array length beyond the file, for fixed-size and string elements.
    for elem in [0u32, 6, 8, 9] {
        let raw = Raw::header(3, 0, 1)
            .str("arr")
            .u32(9)
            .u32(elem)
            .u64(1 << 40)
            .zeros(64);
        assert_err!(
            raw.parse(),
            GgufError::CountTooLarge { ref what, count, offset: 43, .. }
                if what.contains("arr") && count == 1 << 40
        );
    }
    // String lengths beyond the file: in a key, in a value, inside an array, in a tensor name.
    assert_err!(
        Raw::header(3, 0, 1).u64(u64::MAX).zeros(40).parse(),
        GgufError::CountTooLarge { offset: 24, .. }
    );
    assert_err!(
        Raw::header(3, 0, 1).str("s").u32(8).u64(1 << 50).parse(),
        GgufError::CountTooLarge { ref what, .. } if what.contains("\"s\"")
    );
    assert_err!(
        Raw::header(3, 0, 1)
            .str("s")
            .u32(9)
            .u32(8)
            .u64(2)
            .str("ok")
            .u64(99)
            .zeros(10)
            .parse(),
        GgufError::CountTooLarge { count: 99, .. }
    );
    assert_err!(
        Raw::header(3, 1, 0).u64(u64::MAX - 3).zeros(40).parse(),
        GgufError::CountTooLarge { ref what, .. } if what.contains("tensor info #0")
    );
}

#[test]
fn bad_dimension_counts() {
    for n_dims in [0u32, 5, u32::MAX] {
        let raw = Raw::header(3, 1, 0).str("w").u32(n_dims).zeros(64);
        assert_err!(
            raw.parse(),
            GgufError::BadDimCount { ref tensor, n_dims: n } if tensor == "w" && n == n_dims
        );
    }
}

#[test]
fn zero_dimension() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[4, 0, 2], 0, 0)
        .pad(32)
        .zeros(32);
    assert_err!(raw.parse(), GgufError::ZeroDim { ref tensor, dim: 1 } if tensor == "w");
}

#[test]
fn element_count_overflow() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[1 << 32, 1 << 32], 0, 0)
        .pad(32)
        .zeros(32);
    assert_err!(raw.parse(), GgufError::ElementCountOverflow { ref tensor, .. } if tensor == "w");
    // Just over i64::MAX elements.
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[1 << 63], 24, 0)
        .pad(32)
        .zeros(32);
    assert_err!(raw.parse(), GgufError::ElementCountOverflow { .. });
    // The element count fits but the byte count does not (8-byte elements).
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[1 << 62], 28, 0)
        .pad(32)
        .zeros(32);
    assert_err!(raw.parse(), GgufError::ElementCountOverflow { .. });
}

#[test]
fn row_not_a_multiple_of_block_size() {
    // Q4_0 (id 2) has 32-element blocks.
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[33, 2], 2, 0)
        .pad(32)
        .zeros(64);
    assert_err!(
        raw.parse(),
        GgufError::RowNotBlockMultiple { ref tensor, ty: GgmlType::Q4_0, row: 33, block: 32 }
            if tensor == "w"
    );
}

#[test]
fn unknown_tensor_type() {
    for id in [4u32, 5, 31, 1000, u32::MAX] {
        let raw = Raw::header(3, 1, 0)
            .tensor("w", &[32], id, 0)
            .pad(32)
            .zeros(64);
        assert_err!(
            raw.parse(),
            GgufError::UnknownTensorType { ref tensor, type_id } if tensor == "w" && type_id == id
        );
    }
}

#[test]
fn bad_alignment() {
    for (a, why) in [
        (0u32, "zero"),
        (3, "power of two"),
        (48, "power of two"),
        (1 << 30, "16 MiB"),
    ] {
        let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", a);
        match raw.parse() {
            Err(e @ GgufError::BadAlignment { .. }) => assert!(e.to_string().contains(why), "{e}"),
            r => panic!("alignment {a}: {r:?}"),
        }
    }
    let raw = Raw::header(3, 0, 1)
        .str("general.alignment")
        .u32(10)
        .u64(64);
    assert_err!(
        raw.parse(),
        GgufError::WrongType { ref key, expected: "u32", found: "u64" } if key == "general.alignment"
    );
}

#[test]
fn misaligned_tensor_offset() {
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[1], 0, 0)
        .tensor("b", &[1], 0, 4)
        .pad(32)
        .zeros(64);
    assert_err!(
        raw.parse(),
        GgufError::TensorMisaligned { ref tensor, offset: 4, alignment: 32 } if tensor == "b"
    );
}

#[test]
fn tensor_data_past_end_of_file() {
    // One byte short.
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[4], 0, 0)
        .pad(32)
        .zeros(15);
    assert_err!(raw.parse(), GgufError::TensorOutOfBounds { ref tensor, n_bytes: 16, .. } if tensor == "w");
    // Offsets so large that offset + size overflows.
    for off in [u64::MAX - 31, 1 << 63] {
        let raw = Raw::header(3, 1, 0)
            .tensor("w", &[4], 0, off)
            .pad(32)
            .zeros(16);
        assert_err!(raw.parse(), GgufError::TensorOutOfBounds { offset, .. } if offset == off);
    }
}

#[test]
fn overlapping_tensors() {
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(128);
    assert_err!(
        raw.parse(),
        GgufError::TensorOverlap { ref tensor, ref other, other_end: 64, .. }
            if tensor == "b" && other == "a"
    );
    // Same start, listed in the other order.
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[1], 0, 32)
        .tensor("b", &[1], 0, 32)
        .pad(32)
        .zeros(128);
    assert_err!(raw.parse(), GgufError::TensorOverlap { .. });
    // Gaps between tensors are fine.
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[1], 0, 64)
        .tensor("b", &[1], 0, 0)
        .pad(32)
        .zeros(128);
    let f = raw.parse().unwrap();
    assert_eq!(f.tensors()[0].offset, 64);
}

#[test]
fn duplicate_and_empty_keys() {
    let raw = Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2);
    assert_err!(raw.parse(), GgufError::DuplicateKey { ref key, offset: 41 } if key == "k");
    let raw = Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("", 2);
    assert_err!(
        raw.parse(),
        GgufError::EmptyKey {
            index: 1,
            offset: 41
        }
    );
}

#[test]
fn duplicate_tensor_names() {
    let raw = Raw::header(3, 2, 0)
        .tensor("w", &[1], 0, 0)
        .tensor("w", &[1], 0, 32)
        .pad(32)
        .zeros(64);
    assert_err!(raw.parse(), GgufError::DuplicateTensor { ref name } if name == "w");
}

#[test]
fn non_utf8_strings() {
    let bad = [b'a', 0xFF, b'b'];
    // In a key.
    let raw = Raw::header(3, 0, 1).u64(3).bytes(&bad).u32(4).u32(0);
    assert_err!(raw.parse(), GgufError::InvalidUtf8 { offset: 32, .. });
    // In a string value.
    let raw = Raw::header(3, 0, 1).str("k").u32(8).u64(3).bytes(&bad);
    assert_err!(
        raw.parse(),
        GgufError::InvalidUtf8 { ref what, offset: 45 } if what.contains("\"k\"")
    );
    // Inside a string array.
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .u64(3)
        .bytes(&bad);
    assert_err!(raw.parse(), GgufError::InvalidUtf8 { .. });
    // In a tensor name.
    let raw = Raw::header(3, 1, 0)
        .u64(3)
        .bytes(&bad)
        .u32(1)
        .u64(1)
        .u32(0)
        .u64(0)
        .pad(32)
        .zeros(4);
    assert_err!(raw.parse(), GgufError::InvalidUtf8 { ref what, .. } if what.contains("tensor info #0"));
}

#[test]
fn array_nesting_too_deep() {
    // `depth` arrays, each holding the next, around an empty u8 array.
    let nested = |depth: usize| {
        let mut r = Raw::header(3, 0, 1).str("deep").u32(9);
        for _ in 1..depth {
            r = r.u32(9).u64(1);
        }
        r.u32(0).u64(0)
    };
    let f = nested(MAX_ARRAY_DEPTH).parse().unwrap();
    assert_eq!(f.get("deep").unwrap().depth(), MAX_ARRAY_DEPTH);
    assert_err!(
        nested(MAX_ARRAY_DEPTH + 1).parse(),
        GgufError::NestingTooDeep { ref key, .. } if key == "deep"
    );
    // Very deep nesting does not overflow the stack.
    assert_err!(nested(100_000).parse(), GgufError::NestingTooDeep { .. });
}

#[test]
fn unknown_value_type_ids() {
    let raw = Raw::header(3, 0, 1).str("k").u32(13).u32(0);
    assert_err!(
        raw.parse(),
        GgufError::UnknownValueType { ref key, type_id: 13, offset: 33 } if key == "k"
    );
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(u32::MAX)
        .u64(1)
        .zeros(8);
    assert_err!(
        raw.parse(),
        GgufError::UnknownValueType {
            type_id: u32::MAX,
            offset: 37,
            ..
        }
    );
    // Element type inside a nested array.
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(9)
        .u64(1)
        .u32(77)
        .u64(0);
    assert_err!(
        raw.parse(),
        GgufError::UnknownValueType {
            type_id: 77,
            offset: 49,
            ..
        }
    );
}

#[test]
fn invalid_bool_bytes() {
    let raw = Raw::header(3, 0, 1).str("b").u32(7).u8(2);
    assert_err!(raw.parse(), GgufError::InvalidBool { ref key, byte: 2, offset: 37 } if key == "b");
    let raw = Raw::header(3, 0, 1)
        .str("b")
        .u32(9)
        .u32(7)
        .u64(3)
        .bytes(&[1, 0, 0xFF]);
    assert_err!(
        raw.parse(),
        GgufError::InvalidBool {
            byte: 0xFF,
            offset: 51,
            ..
        }
    );
}

#[test]
fn error_messages_name_the_place() {
    let e = Raw::header(3, 1, 0)
        .tensor("blk.0.attn_q.weight", &[33], 2, 0)
        .pad(32)
        .zeros(64)
        .parse()
        .unwrap_err();
    assert!(
        e.to_string().contains("blk.0.attn_q.weight") && e.to_string().contains("Q4_0"),
        "{e}"
    );
    let e = Raw::header(3, 0, 5000).parse().unwrap_err();
    assert!(e.to_string().contains("byte offset 16"), "{e}");
}

#[test]
fn reader_and_errors_can_cross_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<GgufFile>();
    send_sync::<GgufError>();
    send_sync::<GgufWriter>();
    // And a parsed file is usable from another thread.
    let f = std::sync::Arc::new(GgufFile::from_bytes(sample_writer().to_bytes().unwrap()).unwrap());
    let g = f.clone();
    let n = std::thread::spawn(move || g.tensors().len())
        .join()
        .unwrap();
    assert_eq!(n, 2);
}
