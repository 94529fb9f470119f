//! `dequantize_row` against llama.cpp's own reference: `data/<TYPE>.bin` holds random blocks and
//! their values as gguf-py's numpy dequantizers (`gguf/quants.py`) compute them, written offline
//! by `data/make_fixtures.py` (no Python at test time). Checked bit for bit.

use super::*;

/// (type, fixture): raw blocks followed by the f32 values, little-endian.
const FIXTURES: &[(GgmlType, &[u8])] = &[
    (GgmlType::Q4_0, include_bytes!("data/Q4_0.bin")),
    (GgmlType::Q4_1, include_bytes!("data/Q4_1.bin")),
    (GgmlType::Q5_0, include_bytes!("data/Q5_0.bin")),
    (GgmlType::Q5_1, include_bytes!("data/Q5_1.bin")),
    (GgmlType::Q8_0, include_bytes!("data/Q8_0.bin")),
    (GgmlType::IQ4_NL, include_bytes!("data/IQ4_NL.bin")),
    (GgmlType::Q4_K, include_bytes!("data/Q4_K.bin")),
    (GgmlType::Q6_K, include_bytes!("data/Q6_K.bin")),
    (GgmlType::Q2_K, include_bytes!("data/Q2_K.bin")),
    (GgmlType::Q3_K, include_bytes!("data/Q3_K.bin")),
    (GgmlType::Q5_K, include_bytes!("data/Q5_K.bin")),
    (GgmlType::IQ4_XS, include_bytes!("data/IQ4_XS.bin")),
    (GgmlType::BF16, include_bytes!("data/BF16.bin")),
];

#[test]
fn dequantize_row_matches_gguf_py() {
    for &(ty, bytes) in FIXTURES {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let per_block = ts + 4 * bs;
        assert_eq!(bytes.len() % per_block, 0, "{ty} fixture size");
        let nb = bytes.len() / per_block;
        let (raw, vals) = bytes.split_at(nb * ts);
        let want: Vec<f32> = vals
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = deq(ty, raw, nb * bs);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "{ty} element {i}: {g} vs gguf-py {w}"
            );
        }
    }
}
