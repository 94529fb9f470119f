//! Tests of the block formats and kernels.
//!
//! * Known-answer tests build blocks by hand and check exact dequantized values, so a wrong bit
//!   layout cannot pass because quantize and dequantize agree with each other.
//! * Every optimized ISA is compared with the scalar twin **bit for bit** (integer block sums are
//!   exact and the float steps are the same operations in the same order; see `mod.rs`).
//! * Accuracy against f32/f64 references uses per-type budgets derived below.

use super::blocks::*;
use super::*;
use proptest::prelude::*;

mod coverage;
mod dequant_fixture;
mod f32_gemm;
mod gemm;
mod interleave;
mod rows;

const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::IQ4_XS,
    GgmlType::BF16,
];

fn quant(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize_row(ty, x, &mut out).unwrap();
    out
}

fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, b, &mut out).unwrap();
    out
}

fn act(k: &Kernels, weight: GgmlType, x: &[f32]) -> Vec<u8> {
    let at = activation_type(weight);
    let mut out = vec![0u8; at.bytes_for(x.len() as u64).unwrap() as usize];
    k.quantize_activations(weight, x, &mut out);
    out
}

/// Same bits, treating any two NaNs as equal (NaN payloads are not part of the contract).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Deterministic pseudo-random data in [-scale, scale), for the non-proptest tests.
fn random_data(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = crate::sample::SplitMix64::new(seed);
    (0..n).map(|_| rng.signed_unit() * scale).collect()
}

/// ggml test-quantize-fns data: 0.1 + 2 cos(i + offset).
fn ggml_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

// ---------------------------------------------------------------- sizes and API edges

#[test]
fn block_sizes_match_type_table() {
    use std::mem::size_of;
    let table = [
        (GgmlType::Q4_0, size_of::<BlockQ4_0>(), 32),
        (GgmlType::Q4_1, size_of::<BlockQ4_1>(), 32),
        (GgmlType::Q8_0, size_of::<BlockQ8_0>(), 32),
        (GgmlType::Q8_1, size_of::<BlockQ8_1>(), 32),
        (GgmlType::Q4_K, size_of::<BlockQ4K>(), 256),
        (GgmlType::Q6_K, size_of::<BlockQ6K>(), 256),
        (GgmlType::Q8_K, size_of::<BlockQ8K>(), 256),
        (GgmlType::Q5_0, size_of::<BlockQ5_0>(), 32),
        (GgmlType::Q5_1, size_of::<BlockQ5_1>(), 32),
        (GgmlType::IQ4_NL, size_of::<BlockIQ4NL>(), 32),
        (GgmlType::Q2_K, size_of::<BlockQ2K>(), 256),
        (GgmlType::Q3_K, size_of::<BlockQ3K>(), 256),
        (GgmlType::Q5_K, size_of::<BlockQ5K>(), 256),
        (GgmlType::IQ4_XS, size_of::<BlockIQ4XS>(), 256),
    ];
    for (ty, size, qk) in table {
        assert_eq!(ty.type_size(), size, "{ty}");
        assert_eq!(ty.block_size(), qk, "{ty}");
    }
}

#[test]
fn activation_types() {
    assert_eq!(activation_type(GgmlType::Q4_0), GgmlType::Q8_0);
    assert_eq!(activation_type(GgmlType::Q4_1), GgmlType::Q8_1);
    assert_eq!(activation_type(GgmlType::Q8_0), GgmlType::Q8_0);
    assert_eq!(activation_type(GgmlType::Q4_K), GgmlType::Q8_K);
    assert_eq!(activation_type(GgmlType::Q6_K), GgmlType::Q8_K);
    assert_eq!(activation_type(GgmlType::F16), GgmlType::F32);
    assert_eq!(activation_type(GgmlType::F32), GgmlType::F32);
    assert_eq!(activation_type(GgmlType::Q5_0), GgmlType::Q8_0);
    assert_eq!(activation_type(GgmlType::Q5_1), GgmlType::Q8_1);
    assert_eq!(activation_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
        GgmlType::IQ4_XS,
    ] {
        assert_eq!(activation_type(ty), GgmlType::Q8_K);
    }
    assert_eq!(activation_type(GgmlType::BF16), GgmlType::F32);
    assert!(matches!(
        try_activation_type(GgmlType::IQ2_XS),
        Err(QuantError::Unsupported {
            ty: GgmlType::IQ2_XS,
            ..
        })
    ));
}

#[test]
fn format_functions_reject_bad_input() {
    let x = vec![0.5f32; 64];
    let mut buf = vec![0u8; 40];
    assert_eq!(quantize_row(GgmlType::Q4_1, &x, &mut buf), Ok(()));
    assert!(matches!(
        quantize_row(GgmlType::Q4_1, &x[..33], &mut buf),
        Err(QuantError::NotBlockMultiple { n: 33, .. })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q4_1, &x, &mut buf[..39]),
        Err(QuantError::Length {
            expected: 40,
            got: 39,
            ..
        })
    ));
    let e = quantize_row(GgmlType::IQ2_XS, &[0.0; 256], &mut [0u8; 74]).unwrap_err();
    assert!(e.to_string().contains("IQ2_XS"), "{e}");
    let mut y = vec![0f32; 64];
    assert!(dequantize_row(GgmlType::Q4_1, &buf[..20], &mut y).is_err());
    assert!(dequantize_row(GgmlType::Q5_0, &[0u8; 43], &mut y).is_err());
    assert!(MatRef::new(GgmlType::Q4_1, &buf, 2, 32).is_ok());
    assert!(MatRef::new(GgmlType::Q4_1, &buf, 3, 32).is_err());
    assert!(MatRef::new(GgmlType::Q5_1, &[0u8; 24], 1, 32).is_ok());
    assert!(MatRef::new(GgmlType::IQ2_XS, &[0u8; 74], 1, 256).is_err());
}

/// Decode kernels take long rows in passes of 8192 columns (256 blocks of 32, 32 super-blocks):
/// rows longer than a pass, from a column range that starts past the first block, give the
/// scalar vec_dot's bits, dense and picked.
#[test]
fn matvec_matches_vec_dot_on_rows_longer_than_a_pass() {
    for ty in WEIGHT_TYPES {
        let (bs, nb) = if ty.block_size() == 256 {
            (256, 67)
        } else {
            (32, 261)
        };
        let (rows, cols) = (6, nb * bs);
        let w = random_data(ty as u64, rows * cols, 1.0);
        let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
        let m = MatRef::new(ty, &wq, rows, cols).unwrap();
        let s = Kernels::scalar();
        let x = random_data(11, cols - bs, 2.0);
        let a = act(&s, ty, &x);
        let (stride, off) = (m.stride(), ty.bytes_for(bs as u64).unwrap() as usize);
        let want: Vec<f32> = (0..rows)
            .map(|r| s.vec_dot(ty, cols - bs, &wq[r * stride + off..(r + 1) * stride], &a))
            .collect();
        let pick = [5u32, 0, 3, 3, 1];
        for k in Kernels::available() {
            let mut out = vec![f32::NAN; rows];
            k.matvec(m, bs..cols, &a, &mut out);
            for r in 0..rows {
                assert!(same(out[r], want[r]), "{} {ty} row {r}", k.isa());
            }
            let a_full = act(&s, ty, &random_data(12, cols, 2.0));
            let mut picked = vec![f32::NAN; pick.len()];
            k.matvec_rows(m, &pick, &a_full, &mut picked);
            for (i, &r) in pick.iter().enumerate() {
                let row = &wq[r as usize * stride..][..stride];
                let want = s.vec_dot(ty, cols, row, &a_full);
                assert!(same(picked[i], want), "{} {ty} pick {i}", k.isa());
            }
        }
    }
}

/// Prefill tiles (4 rows x 4 tokens: `smmla` 2x2 tiles on aarch64 i8mm, `sdot`/`vpdpbusd`
/// elsewhere; on aarch64 then 4 x 2 for tokens 9 and 10, token 11 alone; the K-quants' NEON
/// tiles: 2 x 2 `smmla` or 1 row x 4 tokens) with row and token remainders, and with values at
/// the ends of every format's range: every (token, row) gives the scalar vec_dot's bits.
#[test]
fn matmul_tiles_with_remainders_match_vec_dot() {
    let (rows, nb, n_tokens) = (7, 5, 11);
    for ty in WEIGHT_TYPES {
        let cols = nb * ty.block_size().max(32);
        let mut w = random_data(ty as u64 + 40, rows * cols, 1.0);
        // Saturate some blocks (extreme quants: -8/7, 0/15, -127/127, ...).
        for (i, v) in w.iter_mut().enumerate() {
            if i % 97 < 32 {
                *v = if i % 2 == 0 { 3.0 } else { -3.0 };
            }
        }
        let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
        let m = MatRef::new(ty, &wq, rows, cols).unwrap();
        let s = Kernels::scalar();
        let x = random_data(ty as u64 + 41, n_tokens * cols, 2.0);
        let acts: Vec<u8> = x.chunks(cols).flat_map(|t| act(&s, ty, t)).collect();
        let arow = acts.len() / n_tokens;
        let stride = m.stride();
        for k in Kernels::available() {
            let mut out = vec![f32::NAN; n_tokens * rows];
            k.matmul(m, &acts, n_tokens, &mut out, rows);
            for t in 0..n_tokens {
                let a = &acts[t * arow..(t + 1) * arow];
                for r in 0..rows {
                    let want = s.vec_dot(ty, cols, &wq[r * stride..][..stride], a);
                    let got = out[t * rows + r];
                    assert!(
                        same(got, want),
                        "{} {ty} t{t} r{r}: {got} vs {want}",
                        k.isa()
                    );
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "row 3 outside 0..3")]
fn matvec_rows_rejects_a_row_past_the_matrix() {
    let w = quant(GgmlType::Q8_0, &[1.0; 96]);
    let m = MatRef::new(GgmlType::Q8_0, &w, 3, 32).unwrap();
    let a = act(&Kernels::scalar(), GgmlType::Q8_0, &[1.0; 32]);
    Kernels::best().matvec_rows(m, &[0, 3], &a, &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "not aligned")]
fn matvec_rejects_unaligned_columns() {
    let w = quant(GgmlType::Q8_0, &[1.0; 64]);
    let a = act(&Kernels::scalar(), GgmlType::Q8_0, &[1.0; 32]);
    let m = MatRef::new(GgmlType::Q8_0, &w, 1, 64).unwrap();
    Kernels::best().matvec(m, 16..48, &a, &mut [0.0]);
}

#[test]
#[should_panic(expected = "activation bytes")]
fn vec_dot_rejects_short_activations() {
    let w = quant(GgmlType::Q4_1, &[1.0; 64]);
    let a = act(&Kernels::scalar(), GgmlType::Q4_1, &[1.0; 64]);
    Kernels::best().vec_dot(GgmlType::Q4_1, 64, &w, &a[..a.len() - 1]);
}

#[test]
fn best_is_detected_and_listed() {
    let best = Kernels::best();
    assert!(best.isa().is_available());
    assert!(Kernels::available().contains(&best));
    assert_eq!(Kernels::scalar().isa(), Isa::Scalar);
    #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        assert_ne!(
            best.isa(),
            Isa::Scalar,
            "an AVX2 CPU must not fall back to scalar"
        );
    }
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    {
        // NEON is the aarch64 baseline, so it is always listed (and compared with scalar by
        // every test that walks `Kernels::available()`); dotprod CPUs get the `sdot` kernels,
        // and those with i8mm too the `smmla` matmul tiles.
        let dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
        let i8mm = std::arch::is_aarch64_feature_detected!("i8mm");
        let want = match (dotprod, i8mm) {
            (true, true) => Isa::NeonI8mm,
            (true, false) => Isa::NeonDot,
            _ => Isa::Neon,
        };
        assert_eq!(best.isa(), want, "best kernels on this aarch64 CPU");
        assert!(Kernels::available().contains(&Kernels::with_isa(Isa::Neon).unwrap()));
        assert_eq!(Kernels::with_isa(Isa::NeonDot).is_some(), dotprod);
        assert_eq!(Kernels::with_isa(Isa::NeonI8mm).is_some(), dotprod && i8mm);
        let names: Vec<&str> = Kernels::available()
            .iter()
            .map(|k| k.isa().name())
            .collect();
        println!("aarch64 kernels: best {}, available {names:?}", best.isa());
    }
}

// ---------------------------------------------------------------- known answers

/// `f16_le` (an inline `fcvt` on aarch64) gives `half`'s bits for every f16, NaNs included.
#[test]
fn f16_le_matches_half_on_every_pattern() {
    for (bits, want) in [
        (0x3C00u16, 0x3F80_0000u32), // 1.0
        (0x8000, 0x8000_0000),       // -0.0
        (0x0001, 0x3380_0000),       // smallest subnormal, 2^-24
        (0x83FF, 0xB87F_C000),       // largest negative subnormal
        (0x7BFF, 0x477F_E000),       // 65504
        (0x7C00, 0x7F80_0000),       // inf
        (0xFC00, 0xFF80_0000),       // -inf
        (0x7D00, 0x7FE0_0000),       // sNaN: quieted, payload kept
        (0xFE01, 0xFFC0_2000),       // negative qNaN with payload
    ] {
        let got = f16_le(bits.to_le_bytes()).to_bits();
        assert_eq!(got, want, "f16 {bits:#06x}: {got:#010x}");
    }
    for bits in 0..=u16::MAX {
        let want = half::f16::from_bits(bits).to_f32().to_bits();
        let got = f16_le(bits.to_le_bytes()).to_bits();
        assert_eq!(
            got, want,
            "f16 {bits:#06x}: {got:#010x} vs half {want:#010x}"
        );
    }
}

fn h(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

#[test]
fn known_answer_q4_0() {
    // d = 0.5 (f16 0x3800); low nibble of byte j = j, high nibble = 15 - j.
    let mut b = vec![0x00, 0x38];
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = deq(GgmlType::Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(y[16 + j], (7.0 - j as f32) * 0.5);
    }
    assert_eq!((y[0], y[15], y[16], y[31]), (-4.0, 3.5, 3.5, -4.0));
}

#[test]
fn known_answer_q4_1() {
    // d = 0.25 (0x3400), m = -1 (0xBC00).
    let mut b = vec![0x00, 0x34, 0x00, 0xBC];
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = deq(GgmlType::Q4_1, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], j as f32 * 0.25 - 1.0);
        assert_eq!(y[16 + j], (15 - j) as f32 * 0.25 - 1.0);
    }
    assert_eq!((y[0], y[15], y[16]), (-1.0, 2.75, 2.75));
}

#[test]
fn known_answer_q8_0_q8_1() {
    // d = 2 (0x4000); quants j - 16.
    let mut b = vec![0x00, 0x40];
    b.extend((0..32i8).map(|j| (j - 16) as u8));
    let y = deq(GgmlType::Q8_0, &b, 32);
    for (j, v) in y.iter().enumerate() {
        assert_eq!(*v, (j as f32 - 16.0) * 2.0);
    }
    // Q8_1: d then s (s is not used by dequantize).
    let mut b1 = vec![0x00, 0x40, 0x00, 0x7C];
    b1.extend((0..32i8).map(|j| (j - 16) as u8));
    assert_eq!(deq(GgmlType::Q8_1, &b1, 32), y);
}

#[test]
fn known_answer_q8_k() {
    let mut b = 0.125f32.to_le_bytes().to_vec();
    b.extend((0..256).map(|j| ((j % 255) - 127) as i8 as u8));
    b.extend([0u8; 32]); // bsums are not used by dequantize
    let y = deq(GgmlType::Q8_K, &b, 256);
    assert_eq!(y[0], -127.0 * 0.125);
    assert_eq!(y[127], 0.0);
    assert_eq!(y[254], 127.0 * 0.125);
    assert_eq!(y[255], -127.0 * 0.125);
}

#[test]
fn known_answer_q4_k() {
    // d = 1, dmin = 0.5; sub-block scales sc = [1,2,3,4,17,33,50,63], mins
    // m = [0,5,10,15,20,40,60,63], packed by hand per ggml's get_scale_min_k4:
    // bytes 0..4: sc[j] | (sc[j+4] >> 4) << 6; bytes 4..8: m[j] | (m[j+4] >> 4) << 6;
    // bytes 8..12: (sc[j+4] & 15) | (m[j+4] & 15) << 4.
    let scales = [65u8, 130, 195, 196, 64, 133, 202, 207, 65, 129, 194, 255];
    let sc = [1.0f32, 2., 3., 4., 17., 33., 50., 63.];
    let mn = [0.0f32, 5., 10., 15., 20., 40., 60., 63.];
    let qs: Vec<u8> = (0..128u32)
        .map(|i| ((i * 7 % 16) | ((i * 11 % 16) << 4)) as u8)
        .collect();
    let mut b = vec![0x00, 0x3C, 0x00, 0x38];
    b.extend(scales);
    b.extend(&qs);
    let y = deq(GgmlType::Q4_K, &b, 256);
    for (e, &v) in y.iter().enumerate() {
        // Element e: chunk c = e / 64; first 32 from low nibbles of qs[32c..], next 32 from highs.
        let (c, w) = (e / 64, e % 64);
        let q = if w < 32 {
            qs[32 * c + w] & 15
        } else {
            qs[32 * c + w - 32] >> 4
        };
        let j = e / 32;
        assert_eq!(v, sc[j] * q as f32 - 0.5 * mn[j], "element {e}");
    }
    // Spot checks written out: e=1: q = 7, j=0 -> 7. e=33: qs[1]>>4 = 11, j=1 -> 22 - 2.5.
    // e=255: qs[127]: 127*11 % 16 = 5, j=7 -> 63*5 - 31.5.
    assert_eq!((y[1], y[33], y[255]), (7.0, 19.5, 283.5));
}

#[test]
fn known_answer_q6_k() {
    // d = 0.5; scales[j] = j - 8 (signed); ql byte i = i % 256 pattern, qh byte i = i * 37.
    let ql: Vec<u8> = (0..128u32).map(|i| (i * 29 + 3) as u8).collect();
    let qh: Vec<u8> = (0..64u32).map(|i| (i * 37) as u8).collect();
    let scales: Vec<u8> = (0..16i8).map(|j| (j - 8) as u8).collect();
    let mut b = ql.clone();
    b.extend(&qh);
    b.extend(&scales);
    b.extend([0x00, 0x38]);
    let y = deq(GgmlType::Q6_K, &b, 256);
    for (e, &v) in y.iter().enumerate() {
        // ggml: in each half n of 128, for l < 32: element l uses ql[l] low / qh[l] bits 0-1,
        // l+32: ql[l+32] low / bits 2-3, l+64: ql[l] high / bits 4-5, l+96: ql[l+32] high / 6-7.
        let (n, r) = (e / 128, e % 128);
        let (part, l) = (r / 32, r % 32);
        let qlb = ql[64 * n + l + if part % 2 == 1 { 32 } else { 0 }];
        let low = if part < 2 { qlb & 15 } else { qlb >> 4 };
        let high = (qh[32 * n + l] >> (2 * part)) & 3;
        let q = (low | (high << 4)) as i32 - 32;
        let s = (e / 16) as f32 - 8.0;
        assert_eq!(v, 0.5 * s * q as f32, "element {e}");
    }
    // e=0: ql[0]=3 -> low 3, qh[0]=0 -> q = 3 - 32 = -29, scale -8: 0.5 * -8 * -29 = 116.
    assert_eq!(y[0], 116.0);
}

#[test]
fn known_answer_q5_0_q5_1() {
    // Low nibbles as in Q4_0 (byte j: j | (15 - j) << 4); fifth bits qh = 0xA5C3_0F01: bit e is
    // element e's 16s bit.
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let qh = 0xA5C3_0F01u32;
    let q = |e: usize| {
        let lo = if e < 16 {
            e as u32
        } else {
            15 - (e as u32 - 16)
        };
        (lo | (((qh >> e) & 1) << 4)) as f32
    };
    // Q5_0: d = 0.5.
    let mut b = vec![0x00, 0x38];
    b.extend(qh.to_le_bytes());
    b.extend(&qs);
    let y = deq(GgmlType::Q5_0, &b, 32);
    for (e, v) in y.iter().enumerate() {
        assert_eq!(*v, (q(e) - 16.0) * 0.5, "Q5_0 element {e}");
    }
    // e=0: lo 0, bit 0 set -> 16 -> 0. e=8: lo 8, bit 8 set -> 24 -> 4. e=31: lo 0, bit 31 set.
    assert_eq!((y[0], y[1], y[8], y[31]), (0.0, -7.5, 4.0, 0.0));
    // Q5_1: d = 0.25, m = -1.
    let mut b = vec![0x00, 0x34, 0x00, 0xBC];
    b.extend(qh.to_le_bytes());
    b.extend(&qs);
    let y = deq(GgmlType::Q5_1, &b, 32);
    for (e, v) in y.iter().enumerate() {
        assert_eq!(*v, q(e) * 0.25 - 1.0, "Q5_1 element {e}");
    }
}

#[test]
fn known_answer_iq4_nl() {
    // d = 2; nibble j of element j (low) and 15 - j (high).
    let mut b = vec![0x00, 0x40];
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = deq(GgmlType::IQ4_NL, &b, 32);
    let grid = [
        -127.0f32, -104., -83., -65., -49., -35., -22., -10., 1., 13., 25., 38., 53., 69., 89.,
        113.,
    ];
    for j in 0..16 {
        assert_eq!(y[j], 2.0 * grid[j]);
        assert_eq!(y[16 + j], 2.0 * grid[15 - j]);
    }
}

#[test]
fn known_answer_f16_f32() {
    let b = [0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00];
    assert_eq!(deq(GgmlType::F16, &b, 3), vec![1.0, -2.0, 5.960_464_5e-8]);
    let b = 1.5f32.to_le_bytes();
    assert_eq!(deq(GgmlType::F32, &b, 1), vec![1.5]);
}

#[test]
fn known_answer_activation_quantizers() {
    // Q8_0: amax 2.54 -> d = 0.02, q = round-half-even(x * 127 / 2.54).
    let mut x = vec![0f32; 32];
    x[0] = 2.54;
    x[1] = -1.27; // -63.5 -> ties to even: -64
    x[2] = 0.01; // 0.5 -> 0
    x[3] = 0.03; // 1.5 -> 2
    for k in Kernels::available() {
        let q = act(&k, GgmlType::Q8_0, &x);
        assert_eq!(&q[..2], &h(2.54 / 127.0), "{}", k.isa());
        assert_eq!(
            &q[2..6],
            &[127u8, (-64i8) as u8, 0, 2],
            "{} quants",
            k.isa()
        );
        // Q8_1: s = d * sum(q) = 0.02 * (127 - 64 + 2) = 1.3.
        let q1 = act(&k, GgmlType::Q4_1, &x);
        assert_eq!(&q1[2..4], &h(2.54 / 127.0 * 65.0), "{}", k.isa());
        assert_eq!(&q1[4..8], &q[2..6]);
    }
    // Q8_K: max is the signed value of largest magnitude (-4 here) -> iscale = 127/4.
    let mut x = vec![0f32; 256];
    x[5] = -4.0;
    x[6] = 4.0; // same magnitude later: the first one sets the sign
    x[20] = 1.0; // 31.75 -> 32
    for k in Kernels::available() {
        let q = act(&k, GgmlType::Q4_K, &x);
        let d = f32::from_le_bytes(q[..4].try_into().unwrap());
        assert_eq!(d, 1.0 / (-127.0 / -4.0), "{}", k.isa());
        assert_eq!(q[4 + 5] as i8, -127);
        assert_eq!(q[4 + 6] as i8, 127);
        assert_eq!(q[4 + 20] as i8, 32);
        let bsum = |j: usize| i16::from_le_bytes([q[260 + 2 * j], q[261 + 2 * j]]);
        assert_eq!((bsum(0), bsum(1), bsum(2)), (0, 32, 0));
    }
}

// ---------------------------------------------------------------- round-trip budgets

/// Per-element bound on |x - dequantize(quantize(x))| for one block of the 32-element formats,
/// from the format: the rounding step (half of it, or a full step where ggml's Q4_0 clamps the
/// value 16 -> 15), plus the f16 rounding of the stored scale/min (relative 2^-11) times the
/// largest quant magnitude.
fn element_bound(ty: GgmlType, xb: &[f32]) -> f32 {
    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (min, max) = xb
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let e16 = 1.0 / 2048.0;
    let tiny = 1e-6 * amax + 1e-30;
    // Below f16's normal range the stored scale loses relative precision; budget its absolute
    // error (half the smallest subnormal step) times the quant range instead.
    let sub = 2.0f32.powi(-25);
    match ty {
        GgmlType::Q4_0 => {
            let d = amax / 8.0;
            d + 8.0 * (d * e16 + sub) + tiny
        }
        GgmlType::Q4_1 => {
            let d = (max - min) / 15.0;
            d / 2.0 + 15.0 * (d * e16 + sub) + min.abs() * e16 + sub + tiny
        }
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let d = amax / 127.0;
            d / 2.0 + 127.0 * (d * e16 + sub) + tiny
        }
        GgmlType::Q8_K => amax / 127.0 * 0.5 + tiny,
        GgmlType::Q5_0 => {
            let d = amax / 16.0;
            d + 16.0 * (d * e16 + sub) + tiny
        }
        GgmlType::Q5_1 => {
            let d = (max - min) / 31.0;
            d / 2.0 + 31.0 * (d * e16 + sub) + min.abs() * e16 + sub + tiny
        }
        // The grid's widest gap (113 to 89, or -127 to -104: 24 units of d = amax / 127 at the
        // starting scale; the fit only keeps a scale with smaller total error, so bound by the
        // worst single element of that: the block's RMS at most the start's, times sqrt(32)).
        GgmlType::IQ4_NL => {
            let d = amax / 127.0;
            (12.0 * d + 127.0 * (d * e16 + sub)) * 32f32.sqrt() + tiny
        }
        _ => unreachable!(),
    }
}

fn rms(a: &[f32], b: &[f32]) -> f64 {
    let s: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    (s / a.len() as f64).sqrt()
}

#[test]
fn round_trip_ggml_data_budgets() {
    // ggml's test-quantize-fns data and budget (sqrt(sum sq err) / n < 0.002 for 4-bit+ types),
    // plus tighter RMS budgets from the step size: uniform rounding error has RMS step/sqrt(12).
    // With amplitude ~2.1: Q4_0 step 2.1/8 -> 0.076; Q4_1 4/15 -> 0.077; Q8 2.1/127 -> 0.005;
    // Q4_K ~ Q4_1 plus 6-bit scale/min quantization; Q6_K 2.1/32 -> 0.019. Budgets add ~30%.
    let n = 32 * 128;
    let x = ggml_data(0.0, n);
    let budgets = [
        (GgmlType::Q4_0, 0.10),
        (GgmlType::Q4_1, 0.10),
        (GgmlType::Q8_0, 0.0065),
        (GgmlType::Q8_1, 0.0065),
        (GgmlType::Q4_K, 0.11),
        (GgmlType::Q6_K, 0.025),
        (GgmlType::Q8_K, 0.0065),
        (GgmlType::Q5_0, 0.05),
        (GgmlType::Q5_1, 0.05),
        (GgmlType::IQ4_NL, 0.10),
        (GgmlType::Q5_K, 0.06),
        (GgmlType::IQ4_XS, 0.11),
        (GgmlType::BF16, 0.004),
        (GgmlType::F16, 0.0005),
        (GgmlType::F32, 0.0),
    ];
    for (ty, budget) in budgets {
        let y = deq(ty, &quant(ty, &x), n);
        let r = rms(&x, &y);
        assert!(r <= budget, "{ty}: rms {r} > {budget}");
        let ggml_metric = r * (n as f64).sqrt() / n as f64;
        assert!(ggml_metric < 0.002, "{ty}: ggml total error {ggml_metric}");
    }
}

#[test]
fn dot_ggml_data_budgets() {
    // ggml test-quantize-fns: |vec_dot - f64 dot of the f32 inputs| / n < 0.02.
    let n = 32 * 128;
    let (x1, x2) = (ggml_data(0.0, n), ggml_data(1.0, n));
    let exact: f64 = x1.iter().zip(&x2).map(|(a, b)| *a as f64 * *b as f64).sum();
    for k in Kernels::available() {
        for ty in WEIGHT_TYPES {
            let w = quant(ty, &x1);
            let a = act(&k, ty, &x2);
            let r = k.vec_dot(ty, n, &w, &a);
            let err = (r as f64 - exact).abs() / n as f64;
            // ggml's budget; for Q2_K ggml allows 0.04 with its search-based quantizer, and our
            // simple one (least-squares scale/min per 16, see `quantize_q2_k`) lands at ~0.043.
            let budget = if ty == GgmlType::Q2_K { 0.05 } else { 0.02 };
            assert!(err < budget, "{} {ty}: {err}", k.isa());
        }
    }
}

/// sum over blocks of m * (s - d_a * sum(q)): the difference between Q4_1 (or Q5_1) . Q8_1 as
/// the format defines it and the plain dot of the dequantized operands.
fn q4_1_min_term_correction(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    let f = |b: &[u8]| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64();
    w.chunks(ty.type_size())
        .zip(a.chunks(36))
        .map(|(bw, ba)| {
            let sum: i32 = ba[4..].iter().map(|&q| q as i8 as i32).sum();
            f(&bw[2..]) * (f(&ba[2..]) - f(ba) * sum as f64)
        })
        .sum()
}

// ---------------------------------------------------------------- property tests

/// Vectors of `blocks * bs` values at one of several scales.
fn data(bs: usize, max_blocks: usize) -> impl Strategy<Value = Vec<f32>> {
    (1..=max_blocks, 0u8..7, any::<u64>()).prop_map(move |(nb, kind, seed)| {
        let n = nb * bs;
        let base = random_data(seed, n, 1.0);
        match kind {
            0 => vec![0.0; n],
            1 => base.iter().map(|v| v * 1e-6).collect(),
            2 => base.iter().map(|v| v * 3e4).collect(),
            3 => base.iter().map(|v| -v.abs() - 0.25).collect(),
            4 => base.iter().map(|v| v.abs() * 10.0 + 1.0).collect(),
            // a few outliers in a block of small values
            5 => base
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 37 == 3 { v * 100.0 } else { *v })
                .collect(),
            _ => base,
        }
    })
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn round_trip_element_bounds(x in data(32, 6)) {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q8_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::IQ4_NL,
        ] {
            let y = deq(ty, &quant(ty, &x), x.len());
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let bound = element_bound(ty, xb);
                for (j, (a, c)) in xb.iter().zip(yb).enumerate() {
                    prop_assert!((a - c).abs() <= bound,
                        "{ty} block {b} elem {j}: {a} vs {c}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn round_trip_k_formats(x in data(256, 3)) {
        // Q8_K: per-element half step (f32 scale). Q4_K/Q6_K (simple quantizers): RMS within the
        // step-size model times a margin for the 6/8-bit scale quantization.
        let y = deq(GgmlType::Q8_K, &quant(GgmlType::Q8_K, &x), x.len());
        for (xb, yb) in x.chunks(256).zip(y.chunks(256)) {
            let bound = element_bound(GgmlType::Q8_K, xb);
            for (a, c) in xb.iter().zip(yb) {
                prop_assert!((a - c).abs() <= bound, "Q8_K {a} vs {c}");
            }
        }
        for (ty, levels) in [
            (GgmlType::Q4_K, 15.0f32),
            (GgmlType::Q6_K, 31.0),
            (GgmlType::Q5_K, 31.0),
            (GgmlType::Q3_K, 3.5),
            (GgmlType::Q2_K, 3.0),
            (GgmlType::IQ4_XS, 12.0),
        ] {
            let y = deq(ty, &quant(ty, &x), x.len());
            for (xb, yb) in x.chunks(256).zip(y.chunks(256)) {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                // Range of a sub-block is at most 2*amax; step = range / levels; RMS of
                // uniform rounding step/sqrt(12); 2.5x for scale rounding and clipping,
                // plus f16 subnormal floor.
                let budget = 2.5 * (2.0 * amax / levels) / 12f32.sqrt() + 1e-6;
                let r = rms(xb, yb) as f32;
                prop_assert!(r <= budget, "{ty} rms {r} > {budget} (amax {amax})");
            }
        }
    }

    #[test]
    fn activation_quantization_bit_identical(x in data(256, 3)) {
        let s = Kernels::scalar();
        for k in Kernels::available() {
            for w in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::F16, GgmlType::BF16] {
                prop_assert_eq!(act(&k, w, &x), act(&s, w, &x), "{} {}", k.isa(), w);
            }
        }
    }

    #[test]
    fn vec_dot_bit_identical_and_accurate(
        w in data(256, 3),
        seed in any::<u64>(),
        scale in prop_oneof![Just(0.0f32), Just(1e-3f32), Just(1.0f32), Just(50.0f32)],
    ) {
        let n = w.len();
        let x = random_data(seed, n, scale);
        let s = Kernels::scalar();
        for ty in WEIGHT_TYPES {
            let wq = quant(ty, &w);
            let a = act(&s, ty, &x);
            let reference = s.vec_dot(ty, n, &wq, &a);
            // Accuracy of the scalar definition against f64 over the dequantized operands: only
            // f32 rounding separates them; each block term carries ~3 roundings (product of
            // scales, int->f32 for K-quant sums > 2^24, fma) and the running sum one per block,
            // so |err| <= (nblocks + 4) * 2^-23 * sum|terms| (a standard summation bound).
            let wd = deq(ty, &wq, n);
            let xd = deq(activation_type(ty), &a, n);
            let mut exact: f64 = wd.iter().zip(&xd).map(|(p, q)| *p as f64 * *q as f64).sum();
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                // Q8_1 stores s = d * sum(q) rounded to f16 on its own; the format's dot uses
                // m * s, not m * sum(dequantized activations). Use the format's value.
                exact += q4_1_min_term_correction(ty, &wq, &a);
            }
            let mut mag: f64 = wd.iter().zip(&xd).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K) {
                // These keep the blocks' minimums in a second chain, which cancels against the
                // first: each rounds relative to its own size, which outliers can make larger
                // than the result's terms. A block's offset is at most its largest |w|, so
                // each chain's terms are within |w| + 2 amax per element.
                let bs = ty.block_size();
                mag += wd.chunks(bs).zip(xd.chunks(bs)).map(|(wb, xb)| {
                    let amax = wb.iter().fold(0f64, |m, v| m.max((*v as f64).abs()));
                    2.0 * amax * xb.iter().map(|q| (*q as f64).abs()).sum::<f64>()
                }).sum::<f64>();
            }
            let blocks = (n / ty.block_size()).min(n / 32 + 1) as f64;
            let tol = (blocks + 4.0) * 2f64.powi(-23) * mag + 1e-30;
            prop_assert!((reference as f64 - exact).abs() <= tol,
                "{ty}: {reference} vs {exact} (tol {tol})");
            // Against the unquantized activations: Cauchy-Schwarz bounds the activation
            // quantization's contribution by |w| * |x - deq(q(x))|.
            let ex: f64 = x.iter().zip(&xd).map(|(p, q)| (*p as f64 - *q as f64).powi(2)).sum();
            let nw: f64 = wd.iter().map(|p| (*p as f64).powi(2)).sum();
            let f32ref: f64 = wd.iter().zip(&x).map(|(p, q)| *p as f64 * *q as f64).sum();
            let tol2 = (nw * ex).sqrt() * 1.0001 + tol;
            prop_assert!((reference as f64 - f32ref).abs() <= tol2,
                "{ty}: {reference} vs f32 ref {f32ref} (tol {tol2})");
            for k in Kernels::available() {
                let r = k.vec_dot(ty, n, &wq, &a);
                prop_assert!(same(r, reference), "{} {ty}: {r} vs scalar {reference}", k.isa());
            }
        }
    }

    #[test]
    fn matvec_matches_vec_dot_on_column_ranges(
        rows in 1usize..11,
        nb in 1usize..5,
        lo in 0usize..5,
        len in 1usize..5,
        seed in any::<u64>(),
    ) {
        for ty in WEIGHT_TYPES {
            let bs = if ty.block_size() == 256 { 256 } else { 32 };
            let cols = nb * bs * 2;
            let c0 = (lo % (2 * nb)) * bs;
            let c1 = (c0 + len * bs).min(cols);
            let w = random_data(seed, rows * cols, 1.0);
            let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
            let m = MatRef::new(ty, &wq, rows, cols).unwrap();
            let x = random_data(seed ^ 7, c1 - c0, 2.0);
            let s = Kernels::scalar();
            let a = act(&s, ty, &x);
            let stride = m.stride();
            let off = ty.bytes_for(c0 as u64).unwrap() as usize;
            let rb = ty.bytes_for((c1 - c0) as u64).unwrap() as usize;
            let want: Vec<f32> = (0..rows)
                .map(|r| s.vec_dot(ty, c1 - c0, &wq[r * stride + off..][..rb], &a))
                .collect();
            for k in Kernels::available() {
                let mut out = vec![f32::NAN; rows];
                k.matvec(m, c0..c1, &a, &mut out);
                for r in 0..rows {
                    prop_assert!(same(out[r], want[r]), "{} {ty} row {r}", k.isa());
                }
                // Determinism: computing rows [0, split) and [split, rows) separately.
                let split = (seed as usize) % rows;
                let mut parts = vec![0f32; rows];
                let (top, bottom) = wq.split_at(split * stride);
                k.matvec(MatRef::new(ty, top, split, cols).unwrap(), c0..c1, &a,
                    &mut parts[..split]);
                k.matvec(MatRef::new(ty, bottom, rows - split, cols).unwrap(), c0..c1, &a,
                    &mut parts[split..]);
                for r in 0..rows {
                    prop_assert!(same(parts[r], out[r]), "{} {ty} split row {r}", k.isa());
                }
            }
        }
    }

    #[test]
    fn matvec_rows_matches_vec_dot_of_each_picked_row(
        rows in 1usize..40,
        nb in 1usize..5,
        picks in proptest::collection::vec(any::<u32>(), 0..23),
        seed in any::<u64>(),
    ) {
        for ty in WEIGHT_TYPES {
            let bs = if ty.block_size() == 256 { 256 } else { 32 };
            let cols = nb * bs;
            let w = random_data(seed, rows * cols, 1.0);
            let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
            let m = MatRef::new(ty, &wq, rows, cols).unwrap();
            let s = Kernels::scalar();
            let a = act(&s, ty, &random_data(seed ^ 7, cols, 2.0));
            // Any order, repeats allowed (the kernel groups picks four at a time).
            let pick: Vec<u32> = picks.iter().map(|p| p % rows as u32).collect();
            let stride = m.stride();
            let want: Vec<f32> = pick
                .iter()
                .map(|&r| s.vec_dot(ty, cols, &wq[r as usize * stride..][..stride], &a))
                .collect();
            for k in Kernels::available() {
                let mut out = vec![f32::NAN; pick.len()];
                k.matvec_rows(m, &pick, &a, &mut out);
                for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                    prop_assert!(same(o, w), "{} {ty} pick {i} (row {})", k.isa(), pick[i]);
                }
            }
        }
    }

    #[test]
    fn matmul_matches_vec_dot(
        rows in 1usize..20,
        nb in 1usize..4,
        n_tokens in 1usize..20,
        pad in 0usize..3,
        seed in any::<u64>(),
    ) {
        for ty in WEIGHT_TYPES {
            let cols = nb * if ty.block_size() == 256 { 256 } else { 32 };
            let w = random_data(seed, rows * cols, 1.0);
            let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
            let m = MatRef::new(ty, &wq, rows, cols).unwrap();
            let s = Kernels::scalar();
            let x = random_data(seed ^ 3, n_tokens * cols, 1.5);
            let acts: Vec<u8> = x.chunks(cols).flat_map(|t| act(&s, ty, t)).collect();
            let arow = acts.len() / n_tokens;
            let stride = m.stride();
            let out_stride = rows + pad;
            for k in Kernels::available() {
                let mut out = vec![-7.0f32; n_tokens * out_stride];
                k.matmul(m, &acts, n_tokens, &mut out, out_stride);
                for t in 0..n_tokens {
                    let a = &acts[t * arow..(t + 1) * arow];
                    for r in 0..rows {
                        let want = s.vec_dot(ty, cols, &wq[r * stride..][..stride], a);
                        let got = out[t * out_stride + r];
                        prop_assert!(same(got, want), "{} {ty} t{t} r{r}: {got} vs {want}",
                            k.isa());
                    }
                    for p in rows..out_stride {
                        prop_assert_eq!(out[t * out_stride + p], -7.0, "padding written");
                    }
                }
                // Token-count independence: the last token alone gives the same bits.
                let last = &acts[(n_tokens - 1) * arow..];
                let mut one = vec![0f32; rows];
                k.matmul(m, last, 1, &mut one, rows);
                for r in 0..rows {
                    prop_assert!(same(one[r], out[(n_tokens - 1) * out_stride + r]));
                }
            }
        }
    }

    /// Prefill's partial down projections (`exec/rows.rs`): a GEMM over a column range gives
    /// each token the bits decode's matvec of those columns gives, on every ISA, for token
    /// counts on both sides of the packed GEMMs' threshold.
    #[test]
    fn matmul_cols_matches_matvec_on_the_same_columns(
        rows in 1usize..20,
        nb in 1usize..4,
        lo in 0usize..4,
        n_tokens in 1usize..20,
        seed in any::<u64>(),
    ) {
        for ty in WEIGHT_TYPES {
            let bs = if ty.block_size() == 256 { 256 } else { 32 };
            let cols = (nb + 3) * bs;
            let c0 = (lo % (nb + 3)) * bs;
            let c1 = (c0 + nb * bs).min(cols);
            let w = random_data(seed, rows * cols, 1.0);
            let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
            let m = MatRef::new(ty, &wq, rows, cols).unwrap();
            let s = Kernels::scalar();
            let x = random_data(seed ^ 5, n_tokens * (c1 - c0), 1.5);
            let acts: Vec<u8> = x.chunks(c1 - c0).flat_map(|t| act(&s, ty, t)).collect();
            let arow = acts.len() / n_tokens;
            for k in Kernels::available() {
                let mut out = vec![f32::NAN; n_tokens * rows];
                k.matmul_cols(m, c0..c1, &acts, n_tokens, &mut out, rows);
                for t in 0..n_tokens {
                    let mut want = vec![f32::NAN; rows];
                    s.matvec(m, c0..c1, &acts[t * arow..(t + 1) * arow], &mut want);
                    for r in 0..rows {
                        let got = out[t * rows + r];
                        prop_assert!(same(got, want[r]), "{} {ty} cols {c0}..{c1} t{t} r{r}",
                            k.isa());
                    }
                }
            }
        }
    }

    #[test]
    fn f16_helpers_bit_identical(n in 0usize..100, seed in any::<u64>(), a in -4f32..4.0) {
        let s = Kernels::scalar();
        let x = random_data(seed, n, 3.0);
        let yf = random_data(seed ^ 1, n, 70000.0); // includes values that overflow f16
        let mut h_ref = vec![half::f16::ZERO; n];
        s.f32_to_f16(&yf, &mut h_ref);
        for (v, hv) in yf.iter().zip(&h_ref) {
            prop_assert_eq!(*hv, half::f16::from_f32(*v));
        }
        let mut back_ref = vec![0f32; n];
        s.f16_to_f32(&h_ref, &mut back_ref);
        let small: Vec<half::f16> = x.iter().map(|v| half::f16::from_f32(*v)).collect();
        let dot_ref = s.dot_f32_f16(&x, &small);
        let exact: f64 = x.iter().zip(&small).map(|(p, q)| *p as f64 * q.to_f64()).sum();
        let mag: f64 = x.iter().zip(&small).map(|(p, q)| (*p as f64 * q.to_f64()).abs()).sum();
        prop_assert!((dot_ref as f64 - exact).abs() <= (n as f64 + 4.0) * 2f64.powi(-23) * mag);
        let mut axpy_ref = x.clone();
        s.axpy_f16(a, &small, &mut axpy_ref);
        for k in Kernels::available() {
            let mut hk = vec![half::f16::ZERO; n];
            k.f32_to_f16(&yf, &mut hk);
            prop_assert_eq!(&hk, &h_ref, "{}", k.isa());
            let mut back = vec![0f32; n];
            k.f16_to_f32(&hk, &mut back);
            prop_assert!(back.iter().zip(&back_ref).all(|(p, q)| p.to_bits() == q.to_bits()));
            prop_assert!(same(k.dot_f32_f16(&x, &small), dot_ref), "{}", k.isa());
            let mut ax = x.clone();
            k.axpy_f16(a, &small, &mut ax);
            prop_assert!(ax.iter().zip(&axpy_ref).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
    }
}

#[test]
fn huge_values_do_not_panic_and_agree() {
    // Scales overflow f16 here (amax / 127 > 65504): results are inf/NaN, identically per ISA.
    let x = random_data(9, 512, 1e30);
    let s = Kernels::scalar();
    for ty in WEIGHT_TYPES {
        let wq = quant(ty, &x);
        let a = act(&s, ty, &x);
        let want = s.vec_dot(ty, 512, &wq, &a);
        for k in Kernels::available() {
            assert_eq!(act(&k, ty, &x), a, "{} {ty}", k.isa());
            assert!(same(k.vec_dot(ty, 512, &wq, &a), want), "{} {ty}", k.isa());
        }
    }
}

#[test]
fn unaligned_rows_are_fine() {
    // A matrix starting at an odd address (as inside a GGUF mmap) gives the same results.
    let (rows, cols) = (5, 64);
    let w = random_data(1, rows * cols, 1.0);
    let x = random_data(2, cols, 1.0);
    for ty in WEIGHT_TYPES {
        if ty.block_size() > cols {
            continue;
        }
        let wq: Vec<u8> = w.chunks(cols).flat_map(|r| quant(ty, r)).collect();
        let mut shifted = vec![0u8; wq.len() + 1];
        shifted[1..].copy_from_slice(&wq);
        for k in Kernels::available() {
            let a = act(&k, ty, &x);
            let (mut o1, mut o2) = (vec![0f32; rows], vec![0f32; rows]);
            k.matvec(
                MatRef::new(ty, &wq, rows, cols).unwrap(),
                0..cols,
                &a,
                &mut o1,
            );
            k.matvec(
                MatRef::new(ty, &shifted[1..], rows, cols).unwrap(),
                0..cols,
                &a,
                &mut o2,
            );
            assert_eq!(o1, o2, "{} {ty}", k.isa());
        }
    }
}
