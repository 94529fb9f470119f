//! Tests of Q4_K rows interleaved 8 by 8 (`interleave.rs`, `Layout::X8`): the layout round
//! trips, and every kernel over it (matvec on row and column ranges, matvec_rows, matmul) gives
//! each row's scalar `vec_dot` bits on every ISA.

use super::*;
use crate::quant::interleave::{interleave, interleave_in_place, row_bytes_of};

/// `rows` Q4_K rows of `cols` columns; rows differ in scale and offset so that d, dmin, the
/// scales and the mins all vary between rows.
fn q4k_rows(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    (0..rows)
        .flat_map(|r| {
            let scale = [1.0f32, 1e-3, 40.0, 0.0, 3.0][r % 5] * (1.0 + r as f32 * 0.1);
            let shift = [0.0f32, 0.5, -2.0][r % 3];
            let x: Vec<f32> = lcg_data(seed ^ (r as u64 * 977), cols, scale)
                .iter()
                .map(|v| v + shift * scale)
                .collect();
            quant(GgmlType::Q4_K, &x)
        })
        .collect()
}

fn x8(data: &[u8], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        ty: GgmlType::Q4_K,
        data,
        rows,
        cols,
        layout: Layout::X8 { skip: 0 },
    }
}

/// Activations of `cols` values: quantized (`None`), or raw Q8_K blocks with every quant byte
/// and bsum arbitrary (`Some(seed)`): the kernels' integer sums must be exact for any bytes.
fn activations(cols: usize, raw: Option<u64>) -> Vec<u8> {
    let bytes = GgmlType::Q8_K.bytes_for(cols as u64).unwrap() as usize;
    match raw {
        None => act(&Kernels::scalar(), GgmlType::Q4_K, &lcg_data(7, cols, 2.0)),
        Some(seed) => {
            let mut s = seed | 1;
            let mut a: Vec<u8> = (0..bytes)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 32) as u8
                })
                .collect();
            for b in a.chunks_exact_mut(292) {
                b[..4].copy_from_slice(&0.37f32.to_le_bytes());
            }
            a
        }
    }
}

/// Row r's scalar dot product in the file layout.
fn want(plain: &[u8], cols: usize, r: usize, a: &[u8]) -> f32 {
    let stride = GgmlType::Q4_K.bytes_for(cols as u64).unwrap() as usize;
    Kernels::scalar().vec_dot(
        GgmlType::Q4_K,
        cols,
        &plain[r * stride..(r + 1) * stride],
        a,
    )
}

#[test]
fn interleave_round_trips_and_in_place_is_the_same_bytes() {
    let cols = 512;
    for rows in [1, 7, 8, 9, 16, 21] {
        let plain = q4k_rows(rows, cols, rows as u64);
        let packed = interleave(MatRef::new(GgmlType::Q4_K, &plain, rows, cols).unwrap()).unwrap();
        assert_eq!(packed.len(), rows.div_ceil(8) * 8 * 288);
        let stride = 288;
        for r in 0..rows {
            assert_eq!(
                row_bytes_of(x8(&packed, rows, cols), r).unwrap(),
                &plain[r * stride..(r + 1) * stride],
                "rows {rows}, row {r}"
            );
        }
        if rows % 8 == 0 {
            let mut inplace = plain.clone();
            interleave_in_place(GgmlType::Q4_K, &mut inplace, rows, cols).unwrap();
            assert_eq!(inplace, packed, "rows {rows}");
            assert_ne!(inplace, plain, "rows {rows}: nothing moved");
        } else {
            let mut inplace = plain.clone();
            assert!(interleave_in_place(GgmlType::Q4_K, &mut inplace, rows, cols).is_err());
        }
    }
    // Other types are refused; so is an interleaved matrix where the file layout is needed.
    let q6 = quant(GgmlType::Q6_K, &lcg_data(1, 256, 1.0));
    assert!(interleave(MatRef::new(GgmlType::Q6_K, &q6, 1, 256).unwrap()).is_err());
    let plain = q4k_rows(8, 256, 3);
    let packed = interleave(MatRef::new(GgmlType::Q4_K, &plain, 8, 256).unwrap()).unwrap();
    assert!(transpose_requantize(x8(&packed, 8, 256), GgmlType::Q8_0).is_err());
}

#[test]
fn interleaved_matvec_is_each_rows_vec_dot_on_every_isa() {
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
        let plain = q4k_rows(rows, cols, (rows * 31 + nb) as u64);
        let packed = interleave(MatRef::new(GgmlType::Q4_K, &plain, rows, cols).unwrap()).unwrap();
        let w = x8(&packed, rows, cols);
        for raw in [None, Some(11), Some(12345)] {
            let a = activations(cols, raw);
            let expect: Vec<f32> = (0..rows).map(|r| want(&plain, cols, r, &a)).collect();
            for k in Kernels::available() {
                // Twice: nothing carries over between calls.
                for pass in 0..2 {
                    let mut out = vec![f32::NAN; rows];
                    k.matvec(w, 0..cols, &a, &mut out);
                    for r in 0..rows {
                        assert!(
                            same(out[r], expect[r]),
                            "{} {rows}x{cols} raw {raw:?} pass {pass} row {r}: {} vs {}",
                            k.isa(),
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
                                "{} rows {start}..{end} of {rows}: row {}",
                                k.isa(),
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
                    assert!(same(*o, expect[r as usize]), "{} pick {r}", k.isa());
                }
            }
        }
    }
}

#[test]
fn interleaved_column_ranges_and_matmul_match_the_file_layout() {
    let (rows, nb) = (19, 4);
    let cols = nb * 256;
    let plain = q4k_rows(rows, cols, 99);
    let packed = interleave(MatRef::new(GgmlType::Q4_K, &plain, rows, cols).unwrap()).unwrap();
    let w = x8(&packed, rows, cols);
    let file = MatRef::new(GgmlType::Q4_K, &plain, rows, cols).unwrap();
    let s = Kernels::scalar();
    for k in Kernels::available() {
        for (c0, c1) in [(0, 1), (1, 3), (3, 4), (0, 4)] {
            let range = c0 * 256..c1 * 256;
            let a = act(&s, GgmlType::Q4_K, &lcg_data(c0 as u64, range.len(), 1.0));
            let mut want = vec![f32::NAN; rows];
            s.matvec(file, range.clone(), &a, &mut want);
            let mut got = vec![f32::NAN; rows];
            k.matvec(w, range.clone(), &a, &mut got);
            for r in 0..rows {
                assert!(same(got[r], want[r]), "{} cols {range:?} row {r}", k.isa());
            }
        }
        for n in [1, 2, 5, 9] {
            let arow = GgmlType::Q8_K.bytes_for(cols as u64).unwrap() as usize;
            let mut acts = vec![0u8; n * arow];
            for t in 0..n {
                let x = lcg_data(100 + t as u64, cols, 1.5);
                k.quantize_activations(GgmlType::Q4_K, &x, &mut acts[t * arow..(t + 1) * arow]);
            }
            let stride = rows + 3;
            let mut want = vec![f32::NAN; n * stride];
            s.matmul(file, &acts, n, &mut want, stride);
            let mut got = vec![f32::NAN; n * stride];
            k.matmul(w, &acts, n, &mut got, stride);
            for t in 0..n {
                for r in 0..rows {
                    let i = t * stride + r;
                    assert!(
                        same(got[i], want[i]),
                        "{} {n} tokens: token {t} row {r}",
                        k.isa()
                    );
                }
            }
        }
    }
}

#[test]
fn interleaved_integer_sums_hold_at_the_extremes() {
    // Every quant 15, every activation -128 (or 127): the i16 sums of a sub-block reach 30720
    // in magnitude; largest scales and mins; bsums at both ends of i16.
    let cols = 512;
    let mut plain = vec![0u8; 9 * 288];
    for (i, b) in plain.chunks_exact_mut(144).enumerate() {
        b[0..2].copy_from_slice(&f16::from_f32(0.5 + i as f32).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
        b[4..16].fill(if i % 2 == 0 { 0xFF } else { 0x3F });
        b[16..].fill(if i % 3 == 0 { 0xFF } else { 0x5A });
    }
    let packed = interleave(MatRef::new(GgmlType::Q4_K, &plain, 9, cols).unwrap()).unwrap();
    for y in [-128i8, 127] {
        let mut a = vec![0u8; 2 * 292];
        for (j, b) in a.chunks_exact_mut(292).enumerate() {
            b[..4].copy_from_slice(&1.0f32.to_le_bytes());
            b[4..260].fill(y as u8);
            for s in 0..16 {
                let v = if (s + j) % 2 == 0 { i16::MAX } else { i16::MIN };
                b[260 + 2 * s..262 + 2 * s].copy_from_slice(&v.to_le_bytes());
            }
        }
        for k in Kernels::available() {
            let mut out = vec![f32::NAN; 9];
            k.matvec(x8(&packed, 9, cols), 0..cols, &a, &mut out);
            for (r, o) in out.iter().enumerate() {
                let w = want(&plain, cols, r, &a);
                assert!(same(*o, w), "{} y {y} row {r}: {o} vs {w}", k.isa());
            }
        }
    }
}
