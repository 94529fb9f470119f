//! Tests of Q4_K and Q6_K rows interleaved 8 by 8 (`interleave.rs`, `Layout::X8`): the layout
//! round trips, and every kernel over it (matvec on row and column ranges, matvec_rows, matmul)
//! gives each row's scalar `vec_dot` bits on every ISA.

use super::*;
use crate::quant::interleave::{interleave, interleave_in_place, row_bytes_of};

/// The interleaved types.
const TYPES: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q6_K];

/// `rows` rows of `ty` of `cols` columns; rows differ in scale and offset so that d, dmin, the
/// scales and the mins all vary between rows.
fn kq_rows(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    (0..rows)
        .flat_map(|r| {
            let scale = [1.0f32, 1e-3, 40.0, 0.0, 3.0][r % 5] * (1.0 + r as f32 * 0.1);
            let shift = [0.0f32, 0.5, -2.0][r % 3];
            let x: Vec<f32> = random_data(seed ^ (r as u64 * 977), cols, scale)
                .iter()
                .map(|v| v + shift * scale)
                .collect();
            quant(ty, &x)
        })
        .collect()
}

fn x8(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        ty,
        data,
        rows,
        cols,
        layout: Layout::X8 { skip: 0 },
    }
}

/// Activations of `cols` values: quantized (`None`), or raw Q8_K blocks with every quant byte
/// and bsum arbitrary (`Some(seed)`): the kernels' integer sums must be exact for any bytes.
/// For Q6_K the bsums stay within +-8192, where its scalar twin's i32 sum cannot overflow.
fn activations(ty: GgmlType, cols: usize, raw: Option<u64>) -> Vec<u8> {
    let bytes = GgmlType::Q8_K.bytes_for(cols as u64).unwrap() as usize;
    match raw {
        None => act(&Kernels::scalar(), ty, &random_data(7, cols, 2.0)),
        Some(seed) => {
            let mut rng = crate::sample::SplitMix64::new(seed);
            let mut a: Vec<u8> = (0..bytes).map(|_| (rng.next_u64() >> 32) as u8).collect();
            for b in a.chunks_exact_mut(292) {
                b[..4].copy_from_slice(&0.37f32.to_le_bytes());
                if ty == GgmlType::Q6_K {
                    for s in b[260..].chunks_exact_mut(2) {
                        let v = i16::from_le_bytes([s[0], s[1]]) / 4;
                        s.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            a
        }
    }
}

/// Row r's scalar dot product in the file layout.
fn want(ty: GgmlType, plain: &[u8], cols: usize, r: usize, a: &[u8]) -> f32 {
    let stride = ty.bytes_for(cols as u64).unwrap() as usize;
    Kernels::scalar().vec_dot(ty, cols, &plain[r * stride..(r + 1) * stride], a)
}

#[test]
fn interleave_round_trips_and_in_place_is_the_same_bytes() {
    let cols = 512;
    for ty in TYPES {
        let stride = ty.bytes_for(cols as u64).unwrap() as usize;
        for rows in [1, 7, 8, 9, 16, 21] {
            let plain = kq_rows(ty, rows, cols, rows as u64);
            let packed = interleave(MatRef::new(ty, &plain, rows, cols).unwrap()).unwrap();
            assert_eq!(packed.len(), rows.div_ceil(8) * 8 * stride);
            for r in 0..rows {
                assert_eq!(
                    row_bytes_of(x8(ty, &packed, rows, cols), r).unwrap(),
                    &plain[r * stride..(r + 1) * stride],
                    "{ty} rows {rows}, row {r}"
                );
            }
            let mut inplace = plain.clone();
            if rows % 8 == 0 {
                interleave_in_place(ty, &mut inplace, rows, cols).unwrap();
                assert_eq!(inplace, packed, "{ty} rows {rows}");
                assert_ne!(inplace, plain, "{ty} rows {rows}: nothing moved");
            } else {
                assert!(interleave_in_place(ty, &mut inplace, rows, cols).is_err());
            }
        }
        // An interleaved matrix is refused where the file layout is needed.
        let plain = kq_rows(ty, 8, 256, 3);
        let packed = interleave(MatRef::new(ty, &plain, 8, 256).unwrap()).unwrap();
        assert!(transpose_requantize(x8(ty, &packed, 8, 256), GgmlType::Q8_0).is_err());
    }
    // Other types are refused, and have no interleaved view.
    let q5 = quant(GgmlType::Q5_K, &random_data(1, 256, 1.0));
    assert!(interleave(MatRef::new(GgmlType::Q5_K, &q5, 1, 256).unwrap()).is_err());
    let mut q5x = q5.repeat(8);
    assert!(interleave_in_place(GgmlType::Q5_K, &mut q5x, 8, 256).is_err());
    assert!(row_bytes_of(x8(GgmlType::Q5_K, &q5x, 8, 256), 0).is_err());
}

#[test]
fn interleaved_matvec_is_each_rows_vec_dot_on_every_isa() {
    for ty in TYPES {
        for (rows, nb) in [
            (1, 1),
            (3, 2),
            (8, 1),
            (9, 3),
            (13, 2),
            (16, 8),
            (23, 1),
            (40, 5),
        ] {
            let cols = nb * 256;
            let plain = kq_rows(ty, rows, cols, (rows * 31 + nb) as u64);
            let packed = interleave(MatRef::new(ty, &plain, rows, cols).unwrap()).unwrap();
            let w = x8(ty, &packed, rows, cols);
            for raw in [None, Some(11), Some(12345)] {
                let a = activations(ty, cols, raw);
                let expect: Vec<f32> = (0..rows).map(|r| want(ty, &plain, cols, r, &a)).collect();
                for k in Kernels::available() {
                    let isa = k.isa();
                    // Twice: nothing carries over between calls.
                    for pass in 0..2 {
                        let mut out = vec![f32::NAN; rows];
                        k.matvec(w, 0..cols, &a, &mut out);
                        for r in 0..rows {
                            assert!(
                                same(out[r], expect[r]),
                                "{ty} {isa} {rows}x{cols} raw {raw:?} pass {pass} row {r}: {} vs {}",
                                out[r],
                                expect[r]
                            );
                        }
                    }
                    // Every row range (a cluster of rows): offsets within a group, short ends.
                    for start in 0..rows {
                        for end in [start + 1, (start + 5).min(rows), rows] {
                            if end <= start {
                                continue;
                            }
                            let sub = w.sub_rows(start..end);
                            let mut out = vec![f32::NAN; end - start];
                            k.matvec(sub, 0..cols, &a, &mut out);
                            for (i, o) in out.iter().enumerate() {
                                assert!(
                                    same(*o, expect[start + i]),
                                    "{ty} {isa} rows {start}..{end} of {rows}: row {}",
                                    start + i
                                );
                            }
                        }
                    }
                    // matvec_rows: any picks, repeated, in any order.
                    let pick: Vec<u32> = (0..rows as u32).rev().chain([0, 0]).collect();
                    let mut out = vec![f32::NAN; pick.len()];
                    k.matvec_rows(w, &pick, &a, &mut out);
                    for (o, &r) in out.iter().zip(&pick) {
                        assert!(same(*o, expect[r as usize]), "{ty} {isa} pick {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_column_ranges_and_matmul_match_the_file_layout() {
    let (rows, nb) = (19, 4);
    let cols = nb * 256;
    let s = Kernels::scalar();
    for ty in TYPES {
        let plain = kq_rows(ty, rows, cols, 99);
        let packed = interleave(MatRef::new(ty, &plain, rows, cols).unwrap()).unwrap();
        let file = MatRef::new(ty, &plain, rows, cols).unwrap();
        for k in Kernels::available() {
            let isa = k.isa();
            for (c0, c1) in [(0, 1), (1, 3), (3, 4), (0, 4)] {
                let range = c0 * 256..c1 * 256;
                let a = act(&s, ty, &random_data(c0 as u64, range.len(), 1.0));
                let mut want = vec![f32::NAN; rows];
                s.matvec(file, range.clone(), &a, &mut want);
                // The whole matrix and a row range starting mid-group.
                for (r0, r1) in [(0, rows), (3, 17)] {
                    let w = x8(ty, &packed, rows, cols).sub_rows(r0..r1);
                    let mut got = vec![f32::NAN; r1 - r0];
                    k.matvec(w, range.clone(), &a, &mut got);
                    for r in r0..r1 {
                        assert!(
                            same(got[r - r0], want[r]),
                            "{ty} {isa} cols {range:?} row {r}"
                        );
                    }
                }
                // Prefill's partial down projections: a GEMM over the column range.
                for n in [1, 2, 3, 5, 7, 9, 10] {
                    let acts = a.repeat(n);
                    let w = x8(ty, &packed, rows, cols);
                    let mut got = vec![f32::NAN; n * rows];
                    k.matmul_cols(w, range.clone(), &acts, n, &mut got, rows);
                    for t in 0..n {
                        for r in 0..rows {
                            assert!(
                                same(got[t * rows + r], want[r]),
                                "{ty} {isa} {n} tokens, cols {range:?}: token {t} row {r}"
                            );
                        }
                    }
                }
            }
            // (From 8 tokens on, AVX-512's Q4_K takes `q4k_gemm.rs`: passes of 4, then 3, 2, 1.)
            for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 19] {
                let arow = GgmlType::Q8_K.bytes_for(cols as u64).unwrap() as usize;
                let mut acts = vec![0u8; n * arow];
                for t in 0..n {
                    let x = random_data(100 + t as u64, cols, 1.5);
                    k.quantize_activations(ty, &x, &mut acts[t * arow..(t + 1) * arow]);
                }
                let stride = rows + 3;
                let mut want = vec![f32::NAN; n * stride];
                s.matmul(file, &acts, n, &mut want, stride);
                // The whole matrix and a row range starting mid-group (`skip`).
                for (r0, r1) in [(0, rows), (5, 14)] {
                    let w = x8(ty, &packed, rows, cols).sub_rows(r0..r1);
                    let mut got = vec![f32::NAN; n * stride];
                    k.matmul(w, &acts, n, &mut got, stride);
                    for t in 0..n {
                        for r in r0..r1 {
                            assert!(
                                same(got[t * stride + r - r0], want[t * stride + r]),
                                "{ty} {isa} {n} tokens: token {t} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Q4_K extremes: every quant 15, every activation -128 (or 127): the i16 sums of a sub-block
/// reach 30720 in magnitude; largest scales and mins; bsums at both ends of i16.
fn q4k_extremes() -> Vec<u8> {
    let mut plain = vec![0u8; 9 * 288];
    for (i, b) in plain.chunks_exact_mut(144).enumerate() {
        b[0..2].copy_from_slice(&f16::from_f32(0.5 + i as f32).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
        b[4..16].fill(if i % 2 == 0 { 0xFF } else { 0x3F });
        b[16..].fill(if i % 3 == 0 { 0xFF } else { 0x5A });
    }
    plain
}

/// Q6_K extremes: quants all 63 (or all 0, or mixed), scales -128 and 127: with activations of
/// -128 two `vpmaddubsw` pair sums add up to 32256 in i16.
fn q6k_extremes() -> Vec<u8> {
    let mut plain = vec![0u8; 9 * 420];
    for (i, b) in plain.chunks_exact_mut(210).enumerate() {
        b[..192].fill([0xFF, 0x00, 0x5A][i % 3]);
        for (j, s) in b[192..208].iter_mut().enumerate() {
            *s = if (i + j) % 2 == 0 { 0x80 } else { 0x7F };
        }
        b[208..].copy_from_slice(&f16::from_f32(0.5 + i as f32).to_bits().to_le_bytes());
    }
    plain
}

#[test]
fn interleaved_integer_sums_hold_at_the_extremes() {
    let cols = 512;
    for ty in TYPES {
        let plain = match ty {
            GgmlType::Q4_K => q4k_extremes(),
            _ => q6k_extremes(),
        };
        let packed = interleave(MatRef::new(ty, &plain, 9, cols).unwrap()).unwrap();
        // Q6_K's scalar sum overflows i32 past bsums of about +-28000; true bsums are within
        // +-2048.
        let bsum = match ty {
            GgmlType::Q4_K => i16::MAX,
            _ => 2048,
        };
        for y in [-128i8, 127] {
            let mut a = vec![0u8; 2 * 292];
            for (j, b) in a.chunks_exact_mut(292).enumerate() {
                b[..4].copy_from_slice(&1.0f32.to_le_bytes());
                b[4..260].fill(y as u8);
                for s in 0..16 {
                    let v = if (s + j) % 2 == 0 { bsum } else { -bsum - 1 };
                    b[260 + 2 * s..262 + 2 * s].copy_from_slice(&v.to_le_bytes());
                }
            }
            for k in Kernels::available() {
                let w = x8(ty, &packed, 9, cols);
                let mut out = vec![f32::NAN; 9];
                k.matvec(w, 0..cols, &a, &mut out);
                // And as the tokens of a matmul: 5 (a 4-token pass and a single one), 9 (from
                // 8 on, AVX-512's Q4_K unpacks its weights once a call: two passes of 4, then
                // one).
                let mut mm = Vec::new();
                let mut file = Vec::new();
                for n in [5, 9] {
                    let mut got = vec![f32::NAN; n * 9];
                    k.matmul(w, &a.repeat(n), n, &mut got, 9);
                    mm.push(got);
                    // The file layout's matmul too (NEON: 2 x 2 `smmla` tiles and their odd
                    // row and token).
                    let mut got = vec![f32::NAN; n * 9];
                    let m = MatRef::new(ty, &plain, 9, cols).unwrap();
                    k.matmul(m, &a.repeat(n), n, &mut got, 9);
                    file.push(got);
                }
                for (r, o) in out.iter().enumerate() {
                    let w = want(ty, &plain, cols, r, &a);
                    assert!(same(*o, w), "{ty} {} y {y} row {r}: {o} vs {w}", k.isa());
                    for (mm, file) in mm.iter().zip(&file) {
                        for t in 0..mm.len() / 9 {
                            let m = mm[9 * t + r];
                            assert!(same(m, w), "{ty} {} matmul {t} {r}: {m}", k.isa());
                            let f = file[9 * t + r];
                            assert!(same(f, w), "{ty} {} file matmul {t} {r}: {f}", k.isa());
                        }
                    }
                }
            }
        }
    }
}

/// The engine interleaves Q4_K and Q6_K at load only for kernels with an interleaved kernel:
/// every SIMD ISA but plain NEON (which would take each row back out, slower than the file's
/// layout). On aarch64 with dotprod (qemu `-cpu max`) the kernels above are `neon/x8.rs`'s.
#[test]
fn interleaving_is_for_the_kernels_that_read_it() {
    for k in Kernels::available() {
        let reads = !matches!(k.isa().name(), "scalar" | "neon");
        assert_eq!(k.has_interleaved_kernels(), reads, "{}", k.isa().name());
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        assert!(Kernels::best().has_interleaved_kernels());
    }
}
