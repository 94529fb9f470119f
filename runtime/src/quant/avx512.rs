//! AVX512-VNNI kernels: the 16-row prefill GEMM on 512-bit vectors, and the 256-bit kernels of
//! `avx2.rs` with the EVEX `vpdpbusd` (so CPUs with AVX512-VNNI but without AVX-VNNI, e.g. Ice
//! Lake-SP or Zen 4, get VNNI too).
//!
//! Why 512 bits only for the GEMM: measured here (Sapphire Rapids VM), `vpdpbusd` on zmm does
//! ~1.7x the int8 MACs per second of ymm, and the row-interleaved GEMM is bound by exactly that
//! instruction. The 32-element formats' decode (matvec) is bound by reductions and memory, where
//! wider vectors do not help; the interleaved K-quants' matvec, which unpacks its weights for one
//! token, runs on zmm too (`q4k_x8.rs`, `q6k_x8.rs`: 1.08x / 1.21x the 1.5B's decode at 1 / 2
//! threads on an Ice Lake-class VM). Their prefill from 8 tokens on unpacks each block of two
//! groups once a call (`unpacked.rs`, `q4k_gemm.rs`, `q6k_gemm.rs`): 1.2-1.4x the passes that
//! unpack as they go, on the same VM.
//!
//! Same numerics as everywhere: exact integer block sums, then the scalar twin's float steps per
//! (row, token) lane; results are bit-identical to `scalar.rs`.
//!
//! Safety: same contract as `avx2.rs` (the only precondition of these `unsafe fn`s is CPU
//! support for their target features; all loads/stores are from fixed-size arrays or
//! bounds-checked slices).

use super::avx2::{
    dm_chunk, entry_idot, matmul_impl, matvec_impl, matvec_rows_impl, vec_dot_impl, AxpyBlock,
    IDot, Rows, WeightBlock, AXPY_CHUNK, AXPY_GROUP, AXPY_PREFETCH,
};
use super::blocks::{ActBlock, BlockQ4Kx8, BlockQ4_0, BlockQ4_1, BlockQ6Kx8, BlockQ8K, BlockQ8_0};
use super::gemm::{f16f, tables, transpose8};
use super::interleave::{matmul_groups_with, matvec_groups_with, GroupKernel, X8};
use std::arch::x86_64::*;
use unpacked::UnpackOnce;

mod blocks32;
mod q4k_gemm;
mod q4k_x8;
mod q6k_gemm;
mod q6k_x8;
mod unpacked;

/// A constant table of 64 bytes (`q4k_x8.rs`, `q6k_x8.rs`) as a vector.
#[inline(always)]
unsafe fn load_table<T: Copy, const N: usize>(t: &[T; N]) -> __m512i {
    const { assert!(std::mem::size_of::<[T; N]>() == 64) };
    // SAFETY (load): exactly the 64 bytes of `t` (asserted at compile time).
    _mm512_loadu_si512(t.as_ptr().cast())
}

/// The 8 bytes of `b` at `at`, broadcast to every 64-bit lane.
#[inline(always)]
unsafe fn bcast8(b: &[u8], at: usize) -> __m512i {
    _mm512_set1_epi64(i64::from_le_bytes(
        b[at..at + 8].try_into().expect("8 bytes"),
    ))
}

/// The 16 bsums of `y` as four vectors: bsums 4i..4i + 4 in every 64-bit lane of the i-th.
#[inline(always)]
unsafe fn bsum_words(y: &BlockQ8K) -> [__m512i; 4] {
    let bsums: &[u8; 32] = y.bsums.as_flattened().try_into().expect("32 bytes");
    let mut bs = [_mm512_setzero_si512(); 4];
    for (i, bs) in bs.iter_mut().enumerate() {
        *bs = bcast8(bsums, 8 * i);
    }
    bs
}

/// `vpdpbusd` with the AVX512-VL encoding on 256-bit vectors.
pub(crate) struct Vnni512;

impl IDot for Vnni512 {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn ss_prep(y: __m256i) -> __m256i {
        // -128 * (sum of each 4 y), as in `avx2::Vnni`.
        let c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), c)
    }
    #[inline(always)]
    unsafe fn ss(w: __m256i, y: __m256i, prep: __m256i) -> __m256i {
        let wu = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
        _mm256_dpbusd_epi32(prep, wu, y)
    }
}

/// The 256-bit kernels (matvec, small matmul, vec_dot) with [`Vnni512`].
pub(crate) mod narrow {
    use super::*;

    entry_idot!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        Vnni512
    );
}

/// One repacked block of 16 rows: `w[g]` lane r (32-bit) = row r's unsigned quants 4g..4g+4.
#[derive(Clone, Copy)]
#[repr(C)]
struct Packed16 {
    w: [[u8; 64]; 8],
    d: [f32; 16],
    m: [f32; 16],
}

#[inline(always)]
unsafe fn pack16<W: WeightBlock>(rows: [&[W]; 16], nb: usize, dst: &mut [Packed16]) {
    for (b, p) in dst.iter_mut().enumerate().take(nb) {
        for half in 0..2 {
            // A loop, not `array::from_fn`: a closure does not inherit the caller's target
            // features, so the intrinsics inside it would be calls, not instructions.
            let mut u = [_mm256_setzero_si256(); 8];
            for (r, u) in u.iter_mut().enumerate() {
                *u = rows[8 * half + r][b].unsigned_quants();
            }
            for (g, v) in transpose8(u).into_iter().enumerate() {
                _mm256_storeu_si256(p.w[g][32 * half..].as_mut_ptr().cast(), v);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            let dm = row[b].wdm();
            p.d[r] = f16f([dm[0], dm[1]]);
            p.m[r] = f16f([dm[2], dm[3]]);
        }
    }
}

#[inline(always)]
unsafe fn bcast4(y: &[u8; 32], g: usize) -> __m512i {
    _mm512_set1_epi32(i32::from_le_bytes([
        y[4 * g],
        y[4 * g + 1],
        y[4 * g + 2],
        y[4 * g + 3],
    ]))
}

/// Row-interleaved GEMM, 16 rows x 4 tokens per step (see `gemm.rs` for the scheme).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn matmul_packed16<W: WeightBlock>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb;
    assert!(acts.len() >= n_tokens * nb && n_tokens > 0);
    let (da, sa, corr) = tables::<W>(&acts[..n_tokens * nb]);
    let empty = Packed16 {
        w: [[0; 64]; 8],
        d: [0.0; 16],
        m: [0.0; 16],
    };
    let mut packed = vec![empty; nb];
    let mut r0 = 0;
    while r0 < m.rows {
        let n = (m.rows - r0).min(16);
        // A short last group repeats its last row; lanes are independent.
        let rows: [&[W]; 16] = std::array::from_fn(|k| m.row::<W>(r0 + k.min(n - 1)));
        pack16(rows, nb, &mut packed);
        let mut t0 = 0;
        while t0 < n_tokens {
            let toks: [usize; 4] = std::array::from_fn(|j| (t0 + j).min(n_tokens - 1));
            let mut acc = [_mm512_setzero_ps(); 4];
            for (b, p) in packed.iter().enumerate() {
                let idx: [usize; 4] = std::array::from_fn(|j| toks[j] * nb + b);
                let ys = idx.map(|i| acts[i].qs());
                let mut s = [_mm512_setzero_si512(); 4];
                for (s, &i) in s.iter_mut().zip(&idx) {
                    *s = _mm512_set1_epi32(corr[i]);
                }
                for (g, wg) in p.w.iter().enumerate() {
                    let wg = _mm512_loadu_si512(wg.as_ptr().cast());
                    for j in 0..4 {
                        s[j] = _mm512_dpbusd_epi32(s[j], wg, bcast4(ys[j], g));
                    }
                }
                let dw = _mm512_loadu_ps(p.d.as_ptr());
                for j in 0..4 {
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(da[idx[j]]));
                    acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s[j]), acc[j]);
                }
            }
            if W::HAS_MIN {
                // The separate m * s chain of the scalar twin.
                let mut accm = [_mm512_setzero_ps(); 4];
                for (b, p) in packed.iter().enumerate() {
                    let mw = _mm512_loadu_ps(p.m.as_ptr());
                    for j in 0..4 {
                        let s = _mm512_set1_ps(sa[toks[j] * nb + b]);
                        accm[j] = _mm512_fmadd_ps(mw, s, accm[j]);
                    }
                }
                for j in 0..4 {
                    acc[j] = _mm512_add_ps(acc[j], accm[j]);
                }
            }
            for (j, v) in acc.iter().enumerate() {
                if t0 + j >= n_tokens {
                    break;
                }
                let mut tmp = [0f32; 16];
                _mm512_storeu_ps(tmp.as_mut_ptr(), *v);
                let o = (t0 + j) * out_stride + r0;
                out[o..o + n].copy_from_slice(&tmp[..n]);
            }
            t0 += 4;
        }
        r0 += 16;
    }
}

// ---------------------------------------------------------------- sparse rows (axpy_rows)

/// A 32-element weight block as `axpy_rows` reads it, 16 values per zmm: the same float steps
/// as `avx2::AxpyBlock` and `scalar::axpy_rows` (exact `d * q`; Q4_1 `fma(d, q, m)`).
pub(crate) trait AxpyBlock16: AxpyBlock {
    /// The 32 values in element order; `d`, `m` the converted scale and min in every lane.
    unsafe fn values16(&self, d: __m512, m: __m512) -> [__m512; 2];
}

/// 0.0, 1.0, ..., 15.0: the 16 values of a 4-bit quant.
#[inline(always)]
unsafe fn iota16() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// The values of a 4-bit block through a 16-entry table: `table[q]` holds the value of quant q
/// (computed with the scalar twin's float steps), and `vpermps` reads only the low 4 bits of
/// each index lane, so the zero-extended bytes index their low nibble as they are.
#[inline(always)]
unsafe fn lookup4(qs: &[u8; 16], table: __m512) -> [__m512; 2] {
    // SAFETY (load): reads exactly the 16 bytes of `qs`.
    let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.as_ptr().cast()));
    [
        _mm512_permutexvar_ps(x, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table),
    ]
}

impl AxpyBlock16 for BlockQ8_0 {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, _m: __m512) -> [__m512; 2] {
        let mut x = [d; 2];
        for (h, x) in x.iter_mut().enumerate() {
            // SAFETY: h < 2, so the 16 bytes at 16 * h are inside `qs` (32 bytes).
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(self.qs.as_ptr().add(16 * h).cast()));
            *x = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
        }
        x
    }
}

impl AxpyBlock16 for BlockQ4_0 {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, _m: __m512) -> [__m512; 2] {
        // table[q] = d * (q - 8): the exact (q - 8) as f32 times d, as the scalar twin.
        let q8 = _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0));
        lookup4(&self.qs, _mm512_mul_ps(d, q8))
    }
}

impl AxpyBlock16 for BlockQ4_1 {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, m: __m512) -> [__m512; 2] {
        // table[q] = fma(d, q, m), as the scalar twin.
        lookup4(&self.qs, _mm512_fmadd_ps(d, iota16(), m))
    }
}

#[inline(always)]
unsafe fn axpy_group16<B: AxpyBlock16, const G: usize>(
    m: &Rows<'_>,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    let rows: [&[B]; G] = std::array::from_fn(|j| m.row::<B>(neurons[j] as usize));
    let c: [__m512; G] = std::array::from_fn(|j| _mm512_set1_ps(coefs[j]));
    let nb = out.len() / 32;
    let mut b0 = 0;
    while b0 < nb {
        let n = AXPY_CHUNK.min(nb - b0);
        // Scales of the chunk as f32 pairs (d, m) per block: one conversion per row (see
        // `avx2::AXPY_CHUNK`).
        let mut f = [[0f32; 2 * AXPY_CHUNK]; G];
        for (f, row) in f.iter_mut().zip(&rows) {
            let v = _mm512_cvtph_ps(dm_chunk(row, b0, n));
            // SAFETY: `f` has 16 floats. (Read back as broadcasts: a wide store then narrow
            // loads inside it forward fine.)
            _mm512_storeu_ps(f.as_mut_ptr(), v);
        }
        for (i, o) in out[32 * b0..32 * (b0 + n)].chunks_exact_mut(32).enumerate() {
            let p = o.as_mut_ptr();
            // SAFETY: `o` has exactly 32 elements: the loads/stores cover p[0..32].
            let mut acc: [__m512; 2] = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            for j in 0..G {
                let (d, mn) = (_mm512_set1_ps(f[j][2 * i]), _mm512_set1_ps(f[j][2 * i + 1]));
                let x = rows[j][b0 + i].values16(d, mn);
                for h in 0..2 {
                    acc[h] = _mm512_fmadd_ps(c[j], x[h], acc[h]);
                }
            }
            // SAFETY: as above.
            _mm512_storeu_ps(p, acc[0]);
            _mm512_storeu_ps(p.add(16), acc[1]);
        }
        b0 += n;
    }
}

/// `out += Σ_k coefs[k] · row(neurons[k])`, 512-bit twin of `avx2::axpy_rows_impl` (same lanes,
/// same operations; bit-identical). Measured on Zen 4 (768 of 1536 rows of 576, hot): Q4_1
/// 27 vs 31 us, Q4_0 25 vs 37 us, Q8_0 32 vs 33 us against the AVX2 path; the 4-bit gain is
/// the table lookup (no int->float conversion and scale fma per element).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn axpy_rows<B: AxpyBlock16>(
    m: Rows<'_>,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    assert!(out.len() == 32 * m.nb && coefs.len() == neurons.len());
    let n = neurons.len();
    let mut k = 0;
    while k + AXPY_GROUP <= n {
        for &r in neurons.iter().skip(k + AXPY_PREFETCH).take(AXPY_GROUP) {
            m.prefetch::<B>(r as usize, 1);
        }
        let ks = k..k + AXPY_GROUP;
        axpy_group16::<B, AXPY_GROUP>(&m, &neurons[ks.clone()], &coefs[ks], out);
        k += AXPY_GROUP;
    }
    for k in k..n {
        axpy_group16::<B, 1>(&m, &neurons[k..k + 1], &coefs[k..k + 1], out);
    }
}

/// The 512-bit kernels of each interleaved K-quant type: passes that unpack as they go
/// (`q4k_x8.rs`, `q6k_x8.rs`), and prefill's blocks unpacked once a call (`unpacked.rs`,
/// `q4k_gemm.rs`, `q6k_gemm.rs`).
pub(crate) trait WideX8: UnpackOnce {
    type Kernel: GroupKernel<Self>;

    /// Prefill: from [`UNPACK_ONCE_FROM`] tokens on, each block of groups is unpacked once for
    /// all of them; fewer take passes of 4 tokens.
    #[inline(always)]
    unsafe fn matmul(
        m: X8<'_, Self>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        if n_tokens >= UNPACK_ONCE_FROM {
            unpacked::matmul::<Self, _>(m, acts, n_tokens, out, out_stride)
        } else {
            matmul_groups_with::<Self, Self::Kernel, 4>(m, acts, n_tokens, out, out_stride)
        }
    }
}

/// Tokens from which prefill unpacks its weights once a call (`unpacked.rs`): below, the
/// unpacking costs more than the passes save (measured on the Xeon VM: Q4_K's 4 tokens slower,
/// 8 even).
pub(crate) const UNPACK_ONCE_FROM: usize = 8;

impl WideX8 for BlockQ4Kx8 {
    type Kernel = q4k_x8::Q4KVnni512;
}

impl WideX8 for BlockQ6Kx8 {
    type Kernel = q6k_x8::Q6KVnni512;
}

/// The entries of the interleaved 512-bit kernels.
pub(crate) mod x8 {
    use super::*;

    /// `out[r]` = row r of `m` times `act`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn matvec<G: WideX8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
        matvec_groups_with::<G, G::Kernel>(m, act, out)
    }

    /// `out[t * out_stride + r]` = row r of `m` times token t of `acts`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn matmul<G: WideX8>(
        m: X8<'_, G>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        G::matmul(m, acts, n_tokens, out, out_stride)
    }

    /// [`matmul`] of a matrix in file layout (rows of `G::Row`), its rows packed into groups
    /// as they are unpacked (`unpacked::FileRows`): for [`UNPACK_ONCE_FROM`] tokens or more.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn matmul_rows<G: WideX8>(
        m: Rows<'_>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        unpacked::matmul::<G, _>(unpacked::FileRows(m), acts, n_tokens, out, out_stride)
    }
}
