//! [`Kernels::gemm_f32`]: `C = A · B` on f32 matrices, for training (the predictors' network in
//! `conductor profile`), not inference.
//!
//! Every output is one fused multiply-add chain over `k` in order, starting from `0.0`:
//! `c[i][j] = fma(a[i][k-1], b[k-1][j], … fma(a[i][0], b[0][j], 0.0))`. The SIMD kernels put
//! different outputs `j` in the lanes of a vector and broadcast `a[i][kk]`, so each lane runs
//! exactly the scalar chain: the bits are the same on every ISA by construction, and no
//! horizontal sum is needed (a dot-product formulation would spend most of its time in them
//! when `k` is a batch of 32).
//!
//! Kernels: AVX2 and AVX-512 on x86-64, NEON on aarch64; a transposed `B` (never asked for by
//! the trainer) takes the scalar loop.
//!
//! Blocking: `k` in slices of [`K_SLICE`] (a chain continues across slices through `C`, which
//! holds it exactly as f32), then panels of two vectors of columns, then tiles of a few rows
//! whose accumulators stay in registers.

use super::{audit, GgmlType, Kernels};

/// Rows of `k` per pass over a panel: 256 rows of a 32-column panel of `B` are 32 KiB.
const K_SLICE: usize = 256;

/// An `rows × cols` f32 matrix held row-major, or as its transpose (`cols × rows` row-major),
/// which lets a product use `Aᵀ` without copying it.
#[derive(Clone, Copy, Debug)]
pub struct F32Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl<'a> F32Matrix<'a> {
    /// `data` holds the matrix row by row.
    ///
    /// # Panics
    /// If `data.len() != rows * cols`.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(Some(data.len()), rows.checked_mul(cols), "f32 matrix size");
        F32Matrix {
            data,
            rows,
            cols,
            transposed: false,
        }
    }

    /// `data` holds the matrix column by column (its transpose row by row).
    ///
    /// # Panics
    /// If `data.len() != rows * cols`.
    pub fn columns(data: &'a [f32], rows: usize, cols: usize) -> Self {
        F32Matrix {
            transposed: true,
            ..Self::rows(data, rows, cols)
        }
    }

    /// Element steps between consecutive rows and between consecutive columns.
    fn strides(&self) -> (usize, usize) {
        if self.transposed {
            (1, self.rows)
        } else {
            (self.cols, 1)
        }
    }

    fn at(&self, i: usize, j: usize) -> f32 {
        let (si, sj) = self.strides();
        self.data[i * si + j * sj]
    }
}

impl Kernels {
    /// `c = a · b`: `c[i * n + j]` is the chain over `a`'s row `i` and `b`'s column `j` described
    /// in the module documentation, where `a` is `m × k`, `b` is `k × n` and `c` holds `m × n`.
    ///
    /// # Panics
    /// If the inner sizes differ or `c.len() != m * n`.
    pub fn gemm_f32(&self, a: F32Matrix<'_>, b: F32Matrix<'_>, c: &mut [f32]) {
        assert_eq!(a.cols, b.rows, "gemm_f32 inner sizes");
        assert_eq!(
            Some(c.len()),
            a.rows.checked_mul(b.cols),
            "gemm_f32 output size"
        );
        let shape = Shape {
            m: a.rows,
            n: b.cols,
            k: a.cols,
        };
        if shape.k == 0 {
            c.fill(0.0);
            return;
        }
        if let (false, Some(gemm)) = (b.transposed, self.table.gemm_f32) {
            // SAFETY: the table is this CPU's (`table.rs`); the sizes of `a`, `b` and `c` were
            // checked above and `shape` is taken from them.
            return unsafe { gemm(shape, a, b.data, c) };
        }
        audit::fallback(self.isa, "gemm_f32", GgmlType::F32);
        gemm_scalar(shape, a, b, c);
    }
}

#[derive(Clone, Copy)]
pub(in crate::quant) struct Shape {
    m: usize,
    n: usize,
    k: usize,
}

/// The definition, output by output.
fn gemm_scalar(s: Shape, a: F32Matrix<'_>, b: F32Matrix<'_>, c: &mut [f32]) {
    for i in 0..s.m {
        for j in 0..s.n {
            c[i * s.n + j] = (0..s.k).fold(0.0f32, |acc, kk| a.at(i, kk).mul_add(b.at(kk, j), acc));
        }
    }
}

// The SIMD kernels: one loop nest for every vector width. A panel is two vectors of columns
// (the last one masked where `n` ends inside it), a tile `R` rows of the panel, `2R`
// accumulators in registers.

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
/// One panel's pointers (its first column) and the slice of `k` being run.
struct Panel<M> {
    a: *const f32,
    si: usize,
    sk: usize,
    b: *const f32,
    n: usize,
    c: *mut f32,
    k: std::ops::Range<usize>,
    masks: [M; 2],
}

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
/// Generates one ISA's GEMM, `$gemm`, over tiles of at most `$rows` rows (`$tile`), with
/// `$v` the helpers for its vectors.
macro_rules! gemm_for {
    ($gemm:ident, $tile:ident, $features:literal, $rows:literal, $v:ident) => {
        /// # Safety
        /// The CPU has the target features; `a` is `m × k`, `b` holds `k × n`, `c` `m × n`.
        #[target_feature(enable = $features)]
        pub(in crate::quant) unsafe fn $gemm(s: Shape, a: F32Matrix<'_>, b: &[f32], c: &mut [f32]) {
            const PANEL: usize = 2 * $v::LANES;
            let (si, sk) = a.strides();
            for k0 in (0..s.k).step_by(K_SLICE) {
                for j0 in (0..s.n).step_by(PANEL) {
                    let width = (s.n - j0).min(PANEL);
                    let panel = Panel {
                        a: a.data.as_ptr(),
                        si,
                        sk,
                        b: b.as_ptr().add(j0),
                        n: s.n,
                        c: c.as_mut_ptr().add(j0),
                        k: k0..(k0 + K_SLICE).min(s.k),
                        masks: [
                            $v::mask(width.min($v::LANES)),
                            $v::mask(width.saturating_sub($v::LANES)),
                        ],
                    };
                    let mut i = 0;
                    while i < s.m {
                        // Full tiles, then the last rows in tiles of 4, 2 and 1.
                        i += match s.m - i {
                            r if r >= $rows => $tile::<$rows>(&panel, i),
                            r if r >= 4 => $tile::<4>(&panel, i),
                            r if r >= 2 => $tile::<2>(&panel, i),
                            _ => $tile::<1>(&panel, i),
                        };
                    }
                }
            }
        }

        /// Rows `i..i + R` of one panel over one slice of `k`: the accumulators start at
        /// zero on the first slice and continue from `c` on later ones. Returns `R`.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn $tile<const R: usize>(p: &Panel<$v::Mask>, i: usize) -> usize {
            let mut acc = [[$v::zero(); 2]; R];
            if p.k.start > 0 {
                for (r, row) in acc.iter_mut().enumerate() {
                    for (h, v) in row.iter_mut().enumerate() {
                        // SAFETY: row i + r < m; the mask covers only columns < n.
                        *v = $v::load(
                            p.c.add((i + r) * p.n).wrapping_add(h * $v::LANES),
                            p.masks[h],
                        );
                    }
                }
            }
            for kk in p.k.clone() {
                // SAFETY: kk < k and the masked columns are < n, so every lane loaded is
                // inside `b` (the second vector's pointer may lie past the end when its
                // mask is empty, hence `wrapping_add`: masked lanes are never touched);
                // row i + r < m and kk < k keep the broadcast inside `a`.
                let brow = p.b.add(kk * p.n);
                let bv = [
                    $v::load(brow, p.masks[0]),
                    $v::load(brow.wrapping_add($v::LANES), p.masks[1]),
                ];
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = $v::splat(*p.a.add((i + r) * p.si + kk * p.sk));
                    row[0] = $v::fma(av, bv[0], row[0]);
                    row[1] = $v::fma(av, bv[1], row[1]);
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (h, v) in row.iter().enumerate() {
                    // SAFETY: as for the loads of `c` above.
                    $v::store(
                        p.c.add((i + r) * p.n).wrapping_add(h * $v::LANES),
                        p.masks[h],
                        *v,
                    );
                }
            }
            R
        }
    };
}

#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
pub(super) mod x86 {
    //! 256-bit (AVX2 + FMA) and 512-bit (AVX-512 F) vectors.

    use super::{F32Matrix, Panel, Shape, K_SLICE};

    /// 256-bit vectors (AVX2 + FMA); masks are lane vectors for `vmaskmovps`.
    mod v256 {
        use std::arch::x86_64::*;
        pub(super) type Mask = __m256i;
        pub(super) const LANES: usize = 8;
        #[inline(always)]
        pub(super) unsafe fn mask(w: usize) -> Mask {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(w.min(LANES) as i32), lane)
        }
        #[inline(always)]
        pub(super) unsafe fn zero() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        pub(super) unsafe fn splat(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        pub(super) unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }
        /// SAFETY (callers): the lanes `m` selects are readable.
        #[inline(always)]
        pub(super) unsafe fn load(p: *const f32, m: Mask) -> __m256 {
            _mm256_maskload_ps(p, m)
        }
        /// SAFETY (callers): the lanes `m` selects are writable.
        #[inline(always)]
        pub(super) unsafe fn store(p: *mut f32, m: Mask, v: __m256) {
            _mm256_maskstore_ps(p, m, v)
        }
    }

    /// 512-bit vectors (AVX-512 F); masks are `k` registers.
    mod v512 {
        use std::arch::x86_64::*;
        pub(super) type Mask = __mmask16;
        pub(super) const LANES: usize = 16;
        #[inline(always)]
        pub(super) unsafe fn mask(w: usize) -> Mask {
            ((1u32 << w.min(LANES)) - 1) as Mask
        }
        #[inline(always)]
        pub(super) unsafe fn zero() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        pub(super) unsafe fn splat(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        pub(super) unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        /// SAFETY (callers): the lanes `m` selects are readable (masked lanes are not touched).
        #[inline(always)]
        pub(super) unsafe fn load(p: *const f32, m: Mask) -> __m512 {
            _mm512_maskz_loadu_ps(m, p)
        }
        /// SAFETY (callers): the lanes `m` selects are writable.
        #[inline(always)]
        pub(super) unsafe fn store(p: *mut f32, m: Mask, v: __m512) {
            _mm512_mask_storeu_ps(p, m, v)
        }
    }

    gemm_for!(gemm_avx2, tile_avx2, "avx2,fma", 6, v256);
    gemm_for!(gemm_avx512, tile_avx512, "avx2,fma,avx512f", 12, v512);
}

#[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
pub(super) mod arm {
    //! 128-bit NEON vectors (the aarch64 baseline). NEON has no masked loads: a panel's
    //! ragged last columns go through a 4-lane buffer.

    use super::{F32Matrix, Panel, Shape, K_SLICE};

    mod v128 {
        use std::arch::aarch64::*;
        /// How many of the 4 lanes are columns of the matrix.
        pub(super) type Mask = usize;
        pub(super) const LANES: usize = 4;
        #[inline(always)]
        pub(super) unsafe fn mask(w: usize) -> Mask {
            w.min(LANES)
        }
        #[inline(always)]
        pub(super) unsafe fn zero() -> float32x4_t {
            vdupq_n_f32(0.0)
        }
        #[inline(always)]
        pub(super) unsafe fn splat(x: f32) -> float32x4_t {
            vdupq_n_f32(x)
        }
        /// `a · b + c`, fused.
        #[inline(always)]
        pub(super) unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
            vfmaq_f32(c, a, b)
        }
        /// SAFETY (callers): the first `m` lanes at `p` are readable.
        #[inline(always)]
        pub(super) unsafe fn load(p: *const f32, m: Mask) -> float32x4_t {
            if m == LANES {
                return vld1q_f32(p);
            }
            let mut lanes = [0f32; LANES];
            for (i, v) in lanes.iter_mut().enumerate().take(m) {
                *v = *p.add(i);
            }
            vld1q_f32(lanes.as_ptr())
        }
        /// SAFETY (callers): the first `m` lanes at `p` are writable.
        #[inline(always)]
        pub(super) unsafe fn store(p: *mut f32, m: Mask, v: float32x4_t) {
            if m == LANES {
                return vst1q_f32(p, v);
            }
            let mut lanes = [0f32; LANES];
            vst1q_f32(lanes.as_mut_ptr(), v);
            for (i, &x) in lanes.iter().enumerate().take(m) {
                *p.add(i) = x;
            }
        }
    }

    gemm_for!(gemm_neon, tile_neon, "neon", 8, v128);
}
