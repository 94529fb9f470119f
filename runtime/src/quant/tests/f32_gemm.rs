//! `Kernels::gemm_f32`: every ISA against the definition (one fma chain per output, in order),
//! bit for bit, at sizes that leave partial tiles, partial panels and several slices of `k`.

use super::*;

/// The definition, written out independently of the kernels.
fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                acc = a[i * k + kk].mul_add(b[kk * n + j], acc);
            }
            c[i * n + j] = acc;
        }
    }
    c
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

#[test]
fn gemm_f32_is_the_fma_chain_on_every_isa_and_layout() {
    // m: below, at and past the tiles (6 and 12 rows) with every remainder path; n: below one
    // vector, between one and two, whole panels and a ragged last panel; k: 0, 1, one slice,
    // several slices with a ragged last one.
    let shapes = [
        (1, 1, 1),
        (5, 3, 7),
        (13, 40, 33),
        (12, 256, 32),
        (31, 257, 48),
        (7, 600, 17),
        (25, 31, 64),
        (3, 0, 5),
    ];
    for (s, &(m, k, n)) in shapes.iter().enumerate() {
        // Magnitudes far apart, so that another order of sums would round differently.
        let mut a = random_data(2 * s as u64 + 1, m * k, 1.0);
        for (i, v) in a.iter_mut().enumerate() {
            *v *= [1.0, 1e-3, 1e3, 0.5][i % 4];
        }
        let b = random_data(2 * s as u64 + 2, k * n, 1.0);
        let want = reference(&a, &b, m, k, n);
        let at = transpose(&a, m, k);
        let bt = transpose(&b, k, n);
        for kern in Kernels::available() {
            let products = [
                (F32Matrix::rows(&a, m, k), F32Matrix::rows(&b, k, n), "A·B"),
                (
                    F32Matrix::columns(&at, m, k),
                    F32Matrix::rows(&b, k, n),
                    "Aᵀᵀ·B",
                ),
                (
                    F32Matrix::rows(&a, m, k),
                    F32Matrix::columns(&bt, k, n),
                    "A·Bᵀᵀ",
                ),
            ];
            for (am, bm, what) in products {
                let mut c = vec![f32::NAN; m * n];
                kern.gemm_f32(am, bm, &mut c);
                let first_wrong = (0..m * n).find(|&o| !same(c[o], want[o]));
                assert_eq!(
                    first_wrong,
                    None,
                    "{} {what} m={m} k={k} n={n}",
                    kern.isa().name()
                );
            }
        }
    }
}

#[test]
fn gemm_f32_checks_its_sizes() {
    let k = Kernels::best();
    let a = [1f32; 6];
    let b = [1f32; 6];
    let mut c = [0f32; 4];
    let wrong_inner = std::panic::catch_unwind(|| {
        let mut c = [0f32; 4];
        k.gemm_f32(F32Matrix::rows(&a, 2, 3), F32Matrix::rows(&b, 2, 3), &mut c)
    });
    assert!(wrong_inner.is_err());
    let wrong_out = std::panic::catch_unwind(|| {
        let mut c = [0f32; 3];
        k.gemm_f32(F32Matrix::rows(&a, 2, 3), F32Matrix::rows(&b, 3, 2), &mut c)
    });
    assert!(wrong_out.is_err());
    assert!(std::panic::catch_unwind(|| F32Matrix::rows(&a, 4, 2)).is_err());
    k.gemm_f32(F32Matrix::rows(&a, 2, 3), F32Matrix::rows(&b, 3, 2), &mut c);
    assert_eq!(c, [3.0; 4]);
}
