//! Hostile input: one test per class of bad file (truncation, bad magic, versions, counts,
//! dimensions, types, alignment, offsets, overlaps, keys, strings, nesting), each checked for
//! its specific error.

use super::*;

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
