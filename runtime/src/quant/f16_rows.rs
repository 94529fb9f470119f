//! Attention's products over a tile of f16 cache rows: the query against each key row, and the
//! value rows summed with their weights. The same bits as [`Kernels::dot_f32_f16`] and
//! [`Kernels::axpy_f16`] called row by row (each output keeps its own chain of fmas, in row
//! order); on x86-64 the sum keeps its outputs in registers across the rows instead of storing
//! and reloading them after every row, and the dots make one call for the tile.

use super::Kernels;
use half::f16;

impl Kernels {
    /// `out[k]` = [`Kernels::dot_f32_f16`] of `q` and row k of `rows` (`out.len()` rows of
    /// `q.len()` values).
    ///
    /// # Panics
    /// If `rows.len() != out.len() * q.len()`.
    pub fn dot_f32_f16_rows(&self, q: &[f32], rows: &[f16], out: &mut [f32]) {
        let n = q.len();
        assert_eq!(rows.len(), out.len() * n, "dot_f32_f16_rows lengths");
        #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
        if self.isa() != super::Isa::Scalar {
            // SAFETY: a SIMD `Kernels` exists only where AVX2+FMA+F16C were detected; the
            // lengths were checked above.
            return unsafe { avx2_dots(q, rows, out) };
        }
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(n.max(1))) {
            *o = self.dot_f32_f16(q, row);
        }
    }

    /// `y[i] = fma(coefs[k], x_k[i], y[i])` for every row k of `rows` (`coefs.len()` rows of
    /// `y.len()` values), k in order: [`Kernels::axpy_f16`] of each row in turn, bit for bit.
    ///
    /// # Panics
    /// If `rows.len() != coefs.len() * y.len()`.
    pub fn axpy_f16_rows(&self, coefs: &[f32], rows: &[f16], y: &mut [f32]) {
        let n = y.len();
        assert_eq!(rows.len(), coefs.len() * n, "axpy_f16_rows lengths");
        #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
        if self.isa() != super::Isa::Scalar {
            // SAFETY: as above.
            return unsafe { avx2_axpys(coefs, rows, y) };
        }
        for (&c, row) in coefs.iter().zip(rows.chunks_exact(n.max(1))) {
            self.axpy_f16(c, row, y);
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_dots(q: &[f32], rows: &[f16], out: &mut [f32]) {
    let n = q.len();
    for (k, o) in out.iter_mut().enumerate() {
        *o = super::avx2::plain::dot_f32_f16(q, &rows[k * n..(k + 1) * n]);
    }
}

/// 32 outputs at a time held in four registers over all rows, then 8, then the scalar tail;
/// per output the fmas of `axpy_f16` (`_mm256_fmadd_ps(c, x, y)`, the tail `c.mul_add(x, y)`)
/// in row order.
#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_axpys(coefs: &[f32], rows: &[f16], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = y.len();
    assert!(rows.len() >= coefs.len() * n);
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY (all loads and stores): i + 32 <= n, so elements i..i + 32 of `y` and of every
        // row k (at k * n + i, k < coefs.len()) are inside the slices.
        let yp = y.as_mut_ptr().add(i);
        let mut acc: [__m256; 4] = std::array::from_fn(|v| _mm256_loadu_ps(yp.add(8 * v)));
        for (k, &c) in coefs.iter().enumerate() {
            let cv = _mm256_set1_ps(c);
            let x = rows.as_ptr().add(k * n + i);
            for (v, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.add(8 * v).cast()));
                *a = _mm256_fmadd_ps(cv, xv, *a);
            }
        }
        for (v, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(yp.add(8 * v), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: as above with 8 elements.
        let yp = y.as_mut_ptr().add(i);
        let mut acc = _mm256_loadu_ps(yp);
        for (k, &c) in coefs.iter().enumerate() {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(rows.as_ptr().add(k * n + i).cast()));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(c), xv, acc);
        }
        _mm256_storeu_ps(yp, acc);
        i += 8;
    }
    for (j, o) in y.iter_mut().enumerate().skip(i) {
        for (k, &c) in coefs.iter().enumerate() {
            *o = c.mul_add(rows[k * n + j].to_f32(), *o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every kernel set gives the bits of the row-by-row scalar calls, at lengths with every
        /// remainder of 8 and 32, with values that overflow f16 (infinities) mixed in.
        #[test]
        fn tile_products_are_the_row_by_row_bits(
            n in 1usize..80,
            n_rows in 0usize..70,
            seed in any::<u64>(),
        ) {
            let mut rng = crate::sample::SplitMix64::new(seed);
            let mut next = |scale: f32| rng.signed_unit() * scale;
            let q: Vec<f32> = (0..n).map(|_| next(3.0)).collect();
            let rows: Vec<f16> = (0..n * n_rows).map(|_| f16::from_f32(next(70000.0))).collect();
            let coefs: Vec<f32> = (0..n_rows).map(|_| next(1.0)).collect();
            let y0: Vec<f32> = (0..n).map(|_| next(2.0)).collect();
            let scalar = Kernels::scalar();
            let dots: Vec<f32> = rows.chunks_exact(n).map(|r| scalar.dot_f32_f16(&q, r)).collect();
            let mut sum = y0.clone();
            for (&c, r) in coefs.iter().zip(rows.chunks_exact(n)) {
                scalar.axpy_f16(c, r, &mut sum);
            }
            // Bits, any NaN as one (infinities of both signs can meet in a sum).
            let bits = |v: &[f32]| {
                v.iter().map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() }).collect::<Vec<_>>()
            };
            for k in Kernels::available() {
                let mut d = vec![f32::NAN; n_rows];
                k.dot_f32_f16_rows(&q, &rows, &mut d);
                prop_assert_eq!(bits(&d), bits(&dots), "{} dots", k.isa());
                let mut y = y0.clone();
                k.axpy_f16_rows(&coefs, &rows, &mut y);
                prop_assert_eq!(bits(&y), bits(&sum), "{} sums", k.isa());
            }
        }
    }
}
