//! Tests of the sparse-row kernels (`axpy_rows`: known answers, every ISA bit for bit against
//! the scalar path, refusals) and of `transpose_requantize`.

use super::*;

// ---------------------------------------------------------------- sparse rows (axpy_rows)

const AXPY_TYPES: [GgmlType; 9] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// A `rows x cols` matrix of `ty` from `w` (row-major f32).
fn quant_rows(ty: GgmlType, w: &[f32], cols: usize) -> Vec<u8> {
    w.chunks(cols).flat_map(|r| quant(ty, r)).collect()
}

/// The straightforward definition: dequantize each row with `dequantize_row`, one f32 fma per
/// element per neuron, in neuron order, from +0.0.
fn axpy_rows_reference(m: MatRef<'_>, neurons: &[u32], coefs: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; m.cols];
    let stride = m.stride();
    for (&n, &c) in neurons.iter().zip(coefs) {
        let row = deq(m.ty, &m.data[n as usize * stride..][..stride], m.cols);
        for (o, x) in out.iter_mut().zip(row) {
            *o = c.mul_add(x, *o);
        }
    }
    out
}

/// Checks every ISA against the scalar twin bit for bit, and the scalar twin against the
/// reference, for one problem.
fn check_axpy_rows(m: MatRef<'_>, neurons: &[u32], coefs: &[f32]) -> Result<(), String> {
    let want = axpy_rows_reference(m, neurons, coefs);
    let s = Kernels::scalar();
    let mut got = vec![f32::NAN; m.cols];
    s.axpy_rows(m, neurons, coefs, &mut got);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if !same(*g, *w) {
            return Err(format!("scalar {} elem {i}: {g} vs reference {w}", m.ty));
        }
    }
    for k in std::iter::once(s).chain(Kernels::available()) {
        let mut out = vec![f32::NAN; m.cols];
        k.axpy_rows(m, neurons, coefs, &mut out);
        for (i, (o, g)) in out.iter().zip(&got).enumerate() {
            if !same(*o, *g) {
                return Err(format!("{} {} elem {i}: {o} vs scalar {g}", k.isa(), m.ty));
            }
        }
        // A compute cluster of several bundles: the neurons in two accumulating calls give the
        // bits of one call over all of them.
        let half = neurons.len() / 2;
        let mut split = vec![0f32; m.cols];
        k.axpy_rows_add(m, &neurons[..half], &coefs[..half], &mut split);
        k.axpy_rows_add(m, &neurons[half..], &coefs[half..], &mut split);
        for (i, (o, g)) in split.iter().zip(&got).enumerate() {
            if !same(*o, *g) {
                return Err(format!(
                    "{} {} split at {half}, elem {i}: {o} vs {g}",
                    k.isa(),
                    m.ty
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn axpy_rows_known_answer() {
    // Q8_0 row 1: d = 0.5, q = j - 16; Q4_1 row 0: d = 0.25, m = -1, q = j % 16.
    let mut q8 = [BlockQ8_0 {
        d: h(0.0),
        qs: [0; 32],
    }; 2];
    q8[1].d = h(0.5);
    for j in 0..32 {
        q8[1].qs[j] = (j as i8 - 16) as u8;
    }
    let mut q41 = [BlockQ4_1 {
        d: h(0.25),
        m: h(-1.0),
        qs: [0; 16],
    }; 2];
    for j in 0..16 {
        q41[0].qs[j] = (j as u8) | ((15 - j as u8) << 4);
    }
    let b8: Vec<u8> = q8
        .iter()
        .flat_map(|b| b.d.into_iter().chain(b.qs))
        .collect();
    let b41: Vec<u8> = q41
        .iter()
        .flat_map(|b| b.d.into_iter().chain(b.m).chain(b.qs))
        .collect();
    for k in Kernels::available() {
        let mut out = vec![f32::NAN; 32];
        let m = MatRef::new(GgmlType::Q8_0, &b8, 2, 32).unwrap();
        k.axpy_rows(m, &[1, 0, 1], &[2.0, 7.0, -0.5], &mut out);
        for (j, o) in out.iter().enumerate() {
            assert_eq!(*o, 1.5 * 0.5 * (j as f32 - 16.0), "{} Q8_0 {j}", k.isa());
        }
        let m = MatRef::new(GgmlType::Q4_1, &b41, 2, 32).unwrap();
        k.axpy_rows(m, &[0], &[4.0], &mut out);
        for (j, o) in out.iter().enumerate() {
            let q = if j < 16 { j } else { 15 - (j - 16) } as f32;
            assert_eq!(*o, 4.0 * (0.25 * q - 1.0), "{} Q4_1 {j}", k.isa());
        }
    }
}

#[test]
fn axpy_rows_empty_neuron_list_gives_zeros() {
    let (rows, cols) = (3, 64);
    let w = random_data(3, rows * cols, 1.0);
    for ty in AXPY_TYPES {
        let wq = quant_rows(ty, &w, cols);
        let m = MatRef::new(ty, &wq, rows, cols).unwrap();
        for k in Kernels::available() {
            let mut out = vec![f32::NAN; cols];
            k.axpy_rows(m, &[], &[], &mut out);
            assert!(out.iter().all(|v| v.to_bits() == 0), "{} {ty}", k.isa());
        }
    }
}

#[test]
fn axpy_rows_decode_shape_bit_identical() {
    // The expected case: n_embd = 576, n_ff = 1536, ~half the neurons active, unsorted with
    // repeats; 771 neurons so the groups of 4 leave a remainder.
    let (rows, cols) = (1536, 576);
    let w = random_data(11, rows * cols, 0.2);
    let mut rng = crate::sample::SplitMix64::new(0x1234_5678_9abc_def1);
    let neurons: Vec<u32> = (0..771).map(|_| rng.below(rows as u64) as u32).collect();
    let coefs = random_data(12, neurons.len(), 3.0);
    for ty in AXPY_TYPES {
        let wq = quant_rows(ty, &w, cols);
        let m = MatRef::new(ty, &wq, rows, cols).unwrap();
        check_axpy_rows(m, &neurons, &coefs).unwrap();
    }
}

#[test]
fn axpy_rows_non_finite_agree() {
    // Scales that overflow f16 (inf), and inf/NaN coefficients: identical bits (NaNs as NaN).
    let (rows, cols) = (6, 96);
    let mut w = random_data(5, rows * cols, 1.0);
    for v in &mut w[cols..2 * cols] {
        *v *= 1e30;
    }
    let neurons = [0u32, 1, 2, 3, 4, 5, 1, 0];
    let coefs = [1.0, 0.5, f32::INFINITY, 0.0, f32::NAN, -2.0, 1e-30, 3.0];
    for ty in AXPY_TYPES {
        let wq = quant_rows(ty, &w, cols);
        let m = MatRef::new(ty, &wq, rows, cols).unwrap();
        check_axpy_rows(m, &neurons[..4], &coefs[..4]).unwrap();
        check_axpy_rows(m, &neurons, &coefs).unwrap();
        check_axpy_rows(m, &[5, 0, 2], &[1.0, 2.0, 3.0]).unwrap();
    }
}

#[test]
#[should_panic(expected = "out of range")]
fn axpy_rows_rejects_out_of_range_neuron() {
    let w = quant(GgmlType::Q8_0, &[1.0; 64]);
    let m = MatRef::new(GgmlType::Q8_0, &w, 2, 32).unwrap();
    Kernels::best().axpy_rows(m, &[0, 2], &[1.0, 1.0], &mut [0.0; 32]);
}

#[test]
#[should_panic(expected = "coefs/neurons")]
fn axpy_rows_rejects_length_mismatch() {
    let w = quant(GgmlType::Q4_1, &[1.0; 64]);
    let m = MatRef::new(GgmlType::Q4_1, &w, 2, 32).unwrap();
    Kernels::best().axpy_rows(m, &[0, 1], &[1.0], &mut [0.0; 32]);
}

#[test]
#[should_panic(expected = "output length")]
fn axpy_rows_rejects_short_output() {
    let w = quant(GgmlType::Q4_0, &[1.0; 64]);
    let m = MatRef::new(GgmlType::Q4_0, &w, 1, 64).unwrap();
    Kernels::best().axpy_rows(m, &[0], &[1.0], &mut [0.0; 32]);
}

#[test]
#[should_panic(expected = "not supported")]
fn axpy_rows_rejects_unsupported_type() {
    let w = quant(GgmlType::Q4_K, &[1.0; 256]);
    let m = MatRef::new(GgmlType::Q4_K, &w, 1, 256).unwrap();
    Kernels::best().axpy_rows(m, &[0], &[1.0], &mut [0.0; 256]);
}

// ---------------------------------------------------------------- transpose_requantize

#[test]
fn transpose_requantize_f32_is_exact_and_quantized_within_bounds() {
    let (rows, cols) = (64, 96);
    let w = random_data(21, rows * cols, 1.5);
    for src_ty in [GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0] {
        let wq = quant_rows(src_ty, &w, cols);
        let m = MatRef::new(src_ty, &wq, rows, cols).unwrap();
        let wd = deq(src_ty, &wq, rows * cols);
        // The transpose of the dequantized matrix: row c holds column c.
        let tr: Vec<f32> = (0..cols)
            .flat_map(|c| (0..rows).map(|r| wd[r * cols + c]).collect::<Vec<_>>())
            .collect();
        for ty in AXPY_TYPES {
            let t = transpose_requantize(m, ty).unwrap();
            let tm = MatRef::new(ty, &t, cols, rows).unwrap();
            let td = deq(ty, tm.data, rows * cols);
            for (c, (want, got)) in tr.chunks(rows).zip(td.chunks(rows)).enumerate() {
                // Each new row must equal quantize_row of the transposed column, hence be within
                // the format's per-element bound of it.
                for (b, (xb, yb)) in want.chunks(32).zip(got.chunks(32)).enumerate() {
                    let bound = match ty {
                        GgmlType::F32 => 0.0,
                        GgmlType::F16 => xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 2048.0,
                        GgmlType::BF16 => xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 256.0,
                        _ => element_bound(ty, xb),
                    };
                    for (j, (x, y)) in xb.iter().zip(yb).enumerate() {
                        assert!(
                            (x - y).abs() <= bound,
                            "{src_ty}->{ty} row {c} block {b} elem {j}: {x} vs {y} ({bound})"
                        );
                    }
                }
                assert_eq!(
                    &t[c * tm.stride()..][..tm.stride()],
                    quant(ty, want),
                    "{ty} row {c}"
                );
            }
        }
    }
}

#[test]
fn transpose_requantize_k_quant_source_and_errors() {
    // A Q4_K source (block 256) goes through strips of 256 columns.
    let (rows, cols) = (32, 512);
    let w = random_data(22, rows * cols, 1.0);
    let wq = quant_rows(GgmlType::Q4_K, &w, cols);
    let m = MatRef::new(GgmlType::Q4_K, &wq, rows, cols).unwrap();
    let wd = deq(GgmlType::Q4_K, &wq, rows * cols);
    let t = transpose_requantize(m, GgmlType::F32).unwrap();
    let td = deq(GgmlType::F32, &t, rows * cols);
    for c in 0..cols {
        for r in 0..rows {
            assert_eq!(td[c * rows + r].to_bits(), wd[r * cols + c].to_bits());
        }
    }
    // 48 rows are not whole Q8_0 blocks; F16 rows may have any length.
    let w48 = quant_rows(GgmlType::F32, &random_data(1, 48 * 32, 1.0), 32);
    let m48 = MatRef::new(GgmlType::F32, &w48, 48, 32).unwrap();
    assert!(matches!(
        transpose_requantize(m48, GgmlType::Q8_0),
        Err(QuantError::NotBlockMultiple { n: 48, .. })
    ));
    assert_eq!(
        transpose_requantize(m48, GgmlType::F16).unwrap().len(),
        32 * 48 * 2
    );
    assert!(matches!(
        transpose_requantize(m48, GgmlType::Q4_K),
        Err(QuantError::Unsupported { .. })
    ));
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn axpy_rows_bit_identical_and_exact(
        rows in 1usize..24,
        nb in 1usize..21,
        extra in 0usize..9,
        n in 0usize..40,
        w in data(32, 4),
        seed in any::<u64>(),
        cscale in prop_oneof![Just(0.0f32), Just(1e-3f32), Just(1.0f32), Just(1e4f32)],
    ) {
        for ty in AXPY_TYPES {
            // Float types take any column count; block types whole blocks.
            let cols = 32 * nb + if ty.block_size() == 1 { extra } else { 0 };
            // Tile the strategy's values (with their scale kind) over the matrix.
            let vals: Vec<f32> = (0..rows * cols).map(|i| w[i % w.len()] * (1.0 + (i / w.len()) as f32 * 0.01)).collect();
            let wq = quant_rows(ty, &vals, cols);
            let m = MatRef::new(ty, &wq, rows, cols).unwrap();
            let neurons: Vec<u32> = random_data(seed, n, 1.0)
                .iter()
                .map(|v| ((v.abs() * 1000.0) as usize % rows) as u32)
                .collect();
            let coefs = random_data(seed ^ 5, n, cscale);
            if let Err(e) = check_axpy_rows(m, &neurons, &coefs) {
                prop_assert!(false, "{} (rows {rows} cols {cols} n {n})", e);
            }
        }
    }
}
