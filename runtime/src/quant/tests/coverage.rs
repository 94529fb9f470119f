//! Which (operation, type) pairs run a kernel of their own, per ISA: every pair is run on every
//! ISA this CPU has, and the pairs whose dispatch fell back to its generic path (`audit.rs`:
//! row-by-row dots, or scalar code, where the kernel table has no entry) must be exactly the ones
//! written here. A kernel missing from the table fails this test instead of making a model silently slower; a new kernel shortens its list.

use super::*;
use crate::quant::interleave::{interleavable, interleave};
use std::collections::BTreeSet;

/// Rows and columns of the test matrices: every block size divides the columns, and the rows
/// fill an interleaved group and a remainder.
const ROWS: usize = 16;
const COLS: usize = 512;

/// Runs every operation on `ty` with `k` and returns those that fell back: the operation run,
/// and `>inner` where an operation inside it fell back (`matmul_x8_3>matvec_x8`).
fn fallbacks(k: &Kernels, ty: GgmlType) -> BTreeSet<String> {
    let data: Vec<u8> = (0..ROWS)
        .flat_map(|r| quant(ty, &random_data(r as u64 + 1, COLS, 1.0)))
        .collect();
    let w = MatRef::new(ty, &data, ROWS, COLS).expect("a matrix");
    let x = random_data(99, COLS, 1.0);
    let mut fell = BTreeSet::new();
    let mut note = |run: &str| {
        for (op, t) in audit::take() {
            assert_eq!(t, ty, "{run} recorded another type");
            fell.insert(if run.starts_with(op) {
                run.to_string()
            } else {
                format!("{run}>{op}")
            });
        }
    };
    audit::take();
    let a = act(k, ty, &x);
    note("quantize_activations");
    let mut out = vec![0f32; ROWS];
    k.vec_dot(ty, COLS, &data[..w.stride()], &a);
    note("vec_dot");
    k.matvec(w, 0..COLS, &a, &mut out);
    note("matvec");
    k.matvec_rows(w, &[3, 0, 9], &a, &mut out[..3]);
    note("matvec_rows");
    for n_tokens in [3, 16] {
        let acts: Vec<u8> = (0..n_tokens)
            .flat_map(|t| act(k, ty, &random_data(t as u64 + 7, COLS, 1.0)))
            .collect();
        audit::take();
        let mut out = vec![0f32; ROWS * n_tokens];
        k.matmul(w, &acts, n_tokens, &mut out, ROWS);
        note(&format!("matmul{n_tokens}"));
        if interleavable(ty) {
            let packed = interleave(w).expect("interleaved");
            let x8 = MatRef {
                layout: Layout::X8 { skip: 0 },
                data: &packed,
                ..w
            };
            k.matmul(x8, &acts, n_tokens, &mut out, ROWS);
            note(&format!("matmul_x8_{n_tokens}"));
        }
    }
    if ty == GgmlType::F32 {
        let (a, b) = (random_data(5, 7 * 9, 1.0), random_data(6, 9 * 40, 1.0));
        let mut c = vec![0f32; 7 * 40];
        k.gemm_f32(
            F32Matrix::rows(&a, 7, 9),
            F32Matrix::rows(&b, 9, 40),
            &mut c,
        );
        note("gemm_f32");
    }
    if format::axpy_type(ty) {
        let (neurons, coefs) = ([2u32, 7, 2], [0.5f32, -1.0, 2.0]);
        let t = MatRef::new(ty, &data, ROWS, COLS).expect("a matrix");
        let mut out = vec![0f32; COLS];
        k.axpy_rows(t, &neurons, &coefs, &mut out);
        note("axpy_rows");
    }
    fell
}

/// Where each ISA takes a generic path, as `(type, operations)`; every pair not listed runs a
/// kernel of its own. `matmulN` is a matmul of N tokens (16 takes the packed GEMMs where there
/// are some).
fn expected(isa: Isa) -> Vec<(GgmlType, &'static [&'static str])> {
    use GgmlType::*;
    // Float weights (F32, F16, BF16: norms, some embeddings and heads) have SIMD dots but no
    // matrix kernels: their matrix products go row by row.
    const FLOAT_ROWS: &[&str] = &["matmul16", "matmul3", "matvec", "matvec_rows"];
    let floats = [F32, F16, BF16].map(|t| (t, FLOAT_ROWS));
    match isa {
        Isa::Scalar => unreachable!("scalar is the reference"),
        // Every x86-64 ISA has every kernel but the float matrices'.
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => floats.to_vec(),
        #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
        Isa::Neon | Isa::NeonDot | Isa::NeonI8mm => {
            // NEON: K-quant matvecs go row by row (the 32-element formats have matrix
            // kernels), float rows are scaled and added in scalar code, and plain NEON (no
            // dotprod) has no interleaved kernels.
            const K_ROWS: &[&str] = &["matvec", "matvec_rows"];
            const FLOAT_ROWS_AXPY: &[&str] =
                &["axpy_rows", "matmul16", "matmul3", "matvec", "matvec_rows"];
            const X8_ROWS: &[&str] = &[
                "matmul_x8_16",
                "matmul_x8_16>matvec_x8",
                "matmul_x8_3",
                "matmul_x8_3>matvec_x8",
                "matvec",
                "matvec_rows",
            ];
            let x8 = if isa == Isa::Neon { X8_ROWS } else { K_ROWS };
            let mut table: Vec<_> = [F32, F16, BF16].map(|t| (t, FLOAT_ROWS_AXPY)).to_vec();
            table.extend([(Q4_K, x8), (Q6_K, x8)]);
            table.extend([Q2_K, Q3_K, Q5_K, IQ4_XS].map(|t| (t, K_ROWS)));
            table
        }
    }
}

#[test]
fn simd_kernels_cover_the_table_and_nothing_falls_to_scalar_unlisted() {
    let mut report = String::new();
    let mut wrong = Vec::new();
    for k in Kernels::available() {
        if k.isa() == Isa::Scalar {
            continue;
        }
        let want: std::collections::BTreeMap<GgmlType, BTreeSet<String>> = expected(k.isa())
            .into_iter()
            .map(|(ty, ops)| (ty, ops.iter().map(|s| s.to_string()).collect()))
            .collect();
        for ty in WEIGHT_TYPES {
            let fell = fallbacks(&k, ty);
            report.push_str(&format!("{} {ty}: {fell:?}\n", k.isa().name()));
            if fell != want.get(&ty).cloned().unwrap_or_default() {
                wrong.push(format!("{} {ty}", k.isa().name()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{wrong:?} differ from the table:\n{report}"
    );
}

#[test]
fn each_isa_builds_its_kernel_table_once_and_the_f16_helpers_are_in_it() {
    for k in Kernels::available() {
        let again = Kernels::with_isa(k.isa()).expect("available");
        assert!(
            std::ptr::eq(k.table, again.table),
            "{}: a second table",
            k.isa().name()
        );
        // Attention's f16 helpers come from the same table: the SIMD ISAs' are not the
        // scalar functions.
        let scalar = Kernels::scalar().table.f16.dot_f32_f16 as usize;
        let own = k.table.f16.dot_f32_f16 as usize;
        assert_eq!(own == scalar, k.isa() == Isa::Scalar, "{}", k.isa().name());
    }
    let best = Kernels::best();
    assert!(std::ptr::eq(
        best.table,
        Kernels::with_isa(best.isa()).unwrap().table
    ));
}
