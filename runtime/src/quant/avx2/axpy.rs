//! AVX2 sparse-row kernels (`axpy_rows`: `out = Σ coefs[k] · row(neurons[k])` over 32-element
//! blocks and f16/f32 rows), under the safety contract of `avx2.rs`.

use super::*;

// ---------------------------------------------------------------- sparse rows (axpy_rows)

/// A 32-element weight block as `axpy_rows` reads it: its values with the float steps of
/// `scalar::axpy_rows` (exact products `d * q`; Q4_1 `fma(d, q, m)`), so every lane is the
/// scalar twin's value.
pub(crate) trait AxpyBlock: Block {
    /// The f16 scale bits, and the f16 min bits above them (0 for formats without a min).
    fn dm_bits(&self) -> u32;
    /// The 32 values in element order, 8 per vector; `d`, `m` are the converted scale and min
    /// broadcast to every lane.
    unsafe fn values(&self, d: __m256, m: __m256) -> [__m256; 4];
}

/// 8 bytes at `p[0..8]` widened to i32 lanes (zero- or sign-extended).
#[inline(always)]
unsafe fn bytes8(p: &[u8], signed: bool) -> __m256i {
    assert!(p.len() >= 8);
    // SAFETY: `_mm_loadl_epi64` reads exactly 8 bytes, inside `p` (asserted).
    let x = _mm_loadl_epi64(p.as_ptr().cast());
    if signed {
        _mm256_cvtepi8_epi32(x)
    } else {
        _mm256_cvtepu8_epi32(x)
    }
}

/// The 4-bit quants of a Q4_0/Q4_1 block as i32 lanes, 8 per vector, in element order: the low
/// nibbles of bytes 0..8 and 8..16 are elements 0..16, their high nibbles elements 16..32.
#[inline(always)]
unsafe fn nibbles8x4(qs: &[u8; 16]) -> [__m256i; 4] {
    let (a, b) = (bytes8(&qs[..8], false), bytes8(&qs[8..], false));
    let m = _mm256_set1_epi32(0x0F);
    [
        _mm256_and_si256(a, m),
        _mm256_and_si256(b, m),
        _mm256_srli_epi32(a, 4),
        _mm256_srli_epi32(b, 4),
    ]
}

impl AxpyBlock for BlockQ8_0 {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u16::from_le_bytes(self.d) as u32
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, _m: __m256) -> [__m256; 4] {
        let mut x = [d; 4];
        for (v, x) in x.iter_mut().enumerate() {
            *x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(bytes8(&self.qs[8 * v..], true)));
        }
        x
    }
}

impl AxpyBlock for BlockQ4_0 {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u16::from_le_bytes(self.d) as u32
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, _m: __m256) -> [__m256; 4] {
        let q = nibbles8x4(&self.qs);
        let eight = _mm256_set1_epi32(8);
        let mut x = [d; 4];
        for (x, q) in x.iter_mut().zip(q) {
            *x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)));
        }
        x
    }
}

impl AxpyBlock for BlockQ4_1 {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u32::from_le_bytes([self.d[0], self.d[1], self.m[0], self.m[1]])
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, m: __m256) -> [__m256; 4] {
        let q = nibbles8x4(&self.qs);
        let mut x = [d; 4];
        for (x, q) in x.iter_mut().zip(q) {
            *x = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m);
        }
        x
    }
}

/// Blocks per scale chunk: `axpy_rows` converts the f16 scales (and mins) of `AXPY_CHUNK` blocks
/// of each row with one wide F16C conversion into a small f32 buffer, then broadcasts them
/// from memory; one `vcvtph2ps` per block and row was the bottleneck (measured on Zen 4: the
/// kernel ran ~1.3x longer with it).
pub(crate) const AXPY_CHUNK: usize = 8;

/// The `dm_bits` of blocks `b0..b0 + n` (1 <= n <= AXPY_CHUNK) of a row as 8 u32 lanes; lanes
/// past `n` repeat the last block (they are converted but never used). Built in registers: small
/// stores followed by one wide load would stall on store forwarding (measured: ~1.7x slower).
#[inline(always)]
pub(crate) unsafe fn dm_chunk<B: AxpyBlock>(row: &[B], b0: usize, n: usize) -> __m256i {
    let blocks = &row[b0..b0 + n];
    let at = |i: usize| blocks[i.min(n - 1)].dm_bits() as i32;
    _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7))
}

/// Neurons per pass over `out`: each output vector is loaded once, takes `AXPY_GROUP` fmas (in
/// neuron order) and is stored once.
pub(crate) const AXPY_GROUP: usize = 4;

/// How many neurons ahead `axpy_rows` prefetches rows (they are scattered, so the hardware
/// prefetcher cannot guess them).
pub(crate) const AXPY_PREFETCH: usize = 8;

/// `G` neurons' rows into `out`, one block of 32 outputs at a time: per output lane,
/// `acc = fma(c_j, x_j, acc)` for j in order, as the scalar twin.
#[inline(always)]
unsafe fn axpy_group<B: AxpyBlock, const G: usize>(
    m: &Rows<'_>,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    let rows: [&[B]; G] = std::array::from_fn(|j| m.row::<B>(neurons[j] as usize));
    let c: [__m256; G] = std::array::from_fn(|j| _mm256_set1_ps(coefs[j]));
    let nb = out.len() / 32;
    let mut b0 = 0;
    while b0 < nb {
        let n = AXPY_CHUNK.min(nb - b0);
        // Scales of the chunk, as f32 pairs (d, m) per block.
        let mut f = [[0f32; 2 * AXPY_CHUNK]; G];
        for (f, row) in f.iter_mut().zip(&rows) {
            let raw = dm_chunk(row, b0, n);
            let halves = [
                _mm256_castsi256_si128(raw),
                _mm256_extracti128_si256(raw, 1),
            ];
            for (h, x) in halves.into_iter().enumerate() {
                // SAFETY: `f` has 16 floats; this stores 8 at 8 * h (h < 2).
                _mm256_storeu_ps(f.as_mut_ptr().add(8 * h), _mm256_cvtph_ps(x));
            }
        }
        for (i, o) in out[32 * b0..32 * (b0 + n)].chunks_exact_mut(32).enumerate() {
            let p = o.as_mut_ptr();
            // SAFETY: `o` has exactly 32 elements: the loads/stores cover p[0..32].
            let mut acc: [__m256; 4] = std::array::from_fn(|v| _mm256_loadu_ps(p.add(8 * v)));
            for j in 0..G {
                let (d, mn) = (_mm256_set1_ps(f[j][2 * i]), _mm256_set1_ps(f[j][2 * i + 1]));
                let x = rows[j][b0 + i].values(d, mn);
                for v in 0..4 {
                    acc[v] = _mm256_fmadd_ps(c[j], x[v], acc[v]);
                }
            }
            for (v, a) in acc.iter().enumerate() {
                // SAFETY: as above.
                _mm256_storeu_ps(p.add(8 * v), *a);
            }
        }
        b0 += n;
    }
}

/// `out += Σ_k coefs[k] · row(neurons[k])` for 32-element blocks (`m.nb` blocks per row, `out`
/// exactly `32 * m.nb` long; rows are bounds-checked by `Rows::row`).
#[inline(always)]
pub(crate) unsafe fn axpy_rows_impl<B: AxpyBlock>(
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
        axpy_group::<B, AXPY_GROUP>(&m, &neurons[ks.clone()], &coefs[ks], out);
        k += AXPY_GROUP;
    }
    for k in k..n {
        axpy_group::<B, 1>(&m, &neurons[k..k + 1], &coefs[k..k + 1], out);
    }
}

/// Element kinds of [`axpy_rows_float`].
pub(super) const F32: u8 = 0;
pub(super) const F16: u8 = 1;
pub(super) const BF16: u8 = 2;

/// F32, F16 or BF16 rows (`KIND`): `out[i] = fma(c, x_i, out[i])` per neuron, in order.
/// `data` holds rows of `stride` bytes; each indexed row must hold `out.len()` elements.
#[inline(always)]
pub(super) unsafe fn axpy_rows_float<const KIND: u8>(
    data: &[u8],
    stride: usize,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    let es = if KIND == F32 { 4 } else { 2 };
    assert!(stride >= es * n && coefs.len() == neurons.len());
    let full = n / 8 * 8;
    for (&r, &c) in neurons.iter().zip(coefs) {
        let row = &data[r as usize * stride..][..stride];
        let cv = _mm256_set1_ps(c);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= n: the 8 elements (8 * es bytes at byte es * i) are inside `row`
            // (stride >= es * n, asserted) and inside `out`.
            let x = match KIND {
                F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * i).cast())),
                BF16 => bf16x8(row.as_ptr().add(2 * i)),
                _ => _mm256_loadu_ps(row.as_ptr().add(4 * i).cast()),
            };
            let o = out.as_mut_ptr().add(i);
            _mm256_storeu_ps(o, _mm256_fmadd_ps(cv, x, _mm256_loadu_ps(o)));
            i += 8;
        }
        for (j, o) in out.iter_mut().enumerate().skip(full) {
            let x = match KIND {
                F16 => scalar::f16_at(row, j),
                BF16 => scalar::bf16_at(row, j),
                _ => scalar::f32_at(row, j),
            };
            *o = c.mul_add(x, *o);
        }
    }
}
