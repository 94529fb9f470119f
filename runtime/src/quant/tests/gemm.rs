//! The prefill GEMMs at the edges of their integer ranges: weights whose quants are all at
//! the top (or bottom) of the format's range against activations of +-127 everywhere, where a
//! sum kept in i16 one step too long would saturate. Every ISA against the scalar `vec_dot`,
//! bit for bit, at token counts that take the packed GEMMs (from 8) and odd sizes.

use super::*;
use crate::quant::interleave::interleave;

/// f16 1.0 and 0.5, little-endian.
const ONE: [u8; 2] = [0x00, 0x3c];
const HALF: [u8; 2] = [0x00, 0x38];

/// One row of `nb` 32-element blocks of `ty`, every quant byte `fill`, scale 1 (and min 0.5).
fn row32(ty: GgmlType, nb: usize, fill: u8) -> Vec<u8> {
    let size = ty.type_size();
    let mut row = vec![fill; nb * size];
    for b in row.chunks_exact_mut(size) {
        b[..2].copy_from_slice(&ONE);
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            b[2..4].copy_from_slice(&HALF);
        }
    }
    row
}

/// One activation row of `nb` blocks of `at` (Q8_0 or Q8_1), every quant `q`.
fn act32(at: GgmlType, nb: usize, q: i8) -> Vec<u8> {
    let size = at.type_size();
    let mut row = vec![q as u8; nb * size];
    for b in row.chunks_exact_mut(size) {
        b[..2].copy_from_slice(&ONE);
        if at == GgmlType::Q8_1 {
            // s = d * sum(q): +-4064, exact in f16.
            let s = half::f16::from_f32(32.0 * q as f32).to_bits().to_le_bytes();
            b[2..4].copy_from_slice(&s);
        }
    }
    row
}

/// Every (token, row) of `k.matmul(m, ..)` against the scalar `vec_dot`.
fn check(m: MatRef<'_>, plain: &[u8], acts: &[u8], n_tokens: usize, what: &str) {
    let s = Kernels::scalar();
    let arow = acts.len() / n_tokens;
    let stride = plain.len() / m.rows;
    for k in Kernels::available() {
        let mut out = vec![f32::NAN; n_tokens * m.rows];
        k.matmul(m, acts, n_tokens, &mut out, m.rows);
        for t in 0..n_tokens {
            let a = &acts[t * arow..(t + 1) * arow];
            for r in 0..m.rows {
                let want = s.vec_dot(m.ty, m.cols, &plain[r * stride..(r + 1) * stride], a);
                let got = out[t * m.rows + r];
                assert!(
                    same(got, want),
                    "{} {what} t{t} r{r}: {got} vs {want}",
                    k.isa()
                );
            }
        }
    }
}

#[test]
fn packed_gemms_are_exact_at_the_ends_of_the_ranges() {
    // Quant bytes: all bits set (the largest unsigned quants: 15, 31, IQ4_NL's 113), all
    // clear (the smallest), and for Q8_0 127 and -128.
    let types = [
        (GgmlType::Q4_0, [0xff, 0x00]),
        (GgmlType::Q4_1, [0xff, 0x00]),
        (GgmlType::Q5_0, [0xff, 0x00]),
        (GgmlType::Q5_1, [0xff, 0x00]),
        (GgmlType::Q8_0, [0x7f, 0x80]),
        (GgmlType::IQ4_NL, [0xff, 0x00]),
    ];
    let (rows, nb, n_tokens) = (13, 3, 11);
    for (ty, fills) in types {
        let at = activation_type(ty);
        for fill in fills {
            let plain: Vec<u8> = (0..rows).flat_map(|_| row32(ty, nb, fill)).collect();
            let m = MatRef::new(ty, &plain, rows, nb * 32).unwrap();
            // Tokens alternate +127 and -127 (the quantizer's range).
            let acts: Vec<u8> = (0..n_tokens)
                .flat_map(|t| act32(at, nb, if t % 2 == 0 { 127 } else { -127 }))
                .collect();
            check(m, &plain, &acts, n_tokens, &format!("{ty} fill {fill:#x}"));
        }
    }
}

/// A Q8_K activation row of `nb` super-blocks, every quant `q` (bsums 16q).
fn act_k(nb: usize, q: i8) -> Vec<u8> {
    let mut row = vec![0u8; nb * 292];
    for b in row.chunks_exact_mut(292) {
        b[..4].copy_from_slice(&1.0f32.to_le_bytes());
        b[4..260].fill(q as u8);
        for s in b[260..].chunks_exact_mut(2) {
            s.copy_from_slice(&(16 * q as i16).to_le_bytes());
        }
    }
    row
}

/// A Q4_K or Q6_K row of `nb` super-blocks with every quant at the top of its range (and
/// Q6_K's signed scales at `scale`), d = dmin = 1.
fn row_k(ty: GgmlType, nb: usize, scale: i8) -> Vec<u8> {
    let size = ty.type_size();
    let mut row = vec![0xffu8; nb * size];
    for b in row.chunks_exact_mut(size) {
        match ty {
            // d, dmin, then scales and quants: all bits set (scales and mins 63, quants 15).
            GgmlType::Q4_K => {
                b[..2].copy_from_slice(&ONE);
                b[2..4].copy_from_slice(&ONE);
            }
            // ql, qh (quants 63), scales, d.
            _ => {
                b[192..208].fill(scale as u8);
                b[208..].copy_from_slice(&ONE);
            }
        }
    }
    row
}

#[test]
fn interleaved_gemms_are_exact_at_the_ends_of_the_ranges() {
    let (rows, nb, n_tokens) = (19, 2, 13);
    for (ty, scales) in [(GgmlType::Q4_K, [0i8, 0]), (GgmlType::Q6_K, [127, -128])] {
        for scale in scales {
            let plain: Vec<u8> = (0..rows).flat_map(|_| row_k(ty, nb, scale)).collect();
            let cols = nb * 256;
            let x8 = interleave(MatRef::new(ty, &plain, rows, cols).unwrap()).unwrap();
            let m = MatRef {
                ty,
                data: &x8,
                rows,
                cols,
                layout: Layout::X8 { skip: 0 },
            };
            // And in file layout, whose rows the 512-bit GEMM packs into groups as it goes.
            let file = MatRef::new(ty, &plain, rows, cols).unwrap();
            for q in [127i8, -127] {
                let acts: Vec<u8> = (0..n_tokens)
                    .flat_map(|t| act_k(nb, if t % 3 == 0 { -q } else { q }))
                    .collect();
                for (m, layout) in [(m, "interleaved"), (file, "file layout")] {
                    let what = format!("{ty} {layout} scale {scale} q {q}");
                    check(m, &plain, &acts, n_tokens, &what);
                }
            }
        }
    }
}
