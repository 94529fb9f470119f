//! Q5_0, Q5_1 and IQ4_NL in the shared 32-element machinery of `avx2.rs`: their
//! [`WeightBlock`] (matvec / matmul tiles, vec_dot, the repacked GEMM) and [`AxpyBlock`]
//! (sparse rows) forms, under the safety contract of `avx2.rs`.
//!
//! Each reproduces its `scalar::blocks32` twin: the integer block sums are exact, the float steps
//! are those of the shared tile loop (`acc = fma(dw * da, isum, acc)`).

use super::*;

/// The 32 fifth bits of a Q5 block (`qh`, bit j for element j) as bytes 0x10 / 0x00 in element
/// order: byte j of the broadcast picks qh byte j / 8, then tests its bit j % 8.
#[inline(always)]
unsafe fn q5_high(qh: [u8; 4]) -> __m256i {
    let x = _mm256_set1_epi32(i32::from_le_bytes(qh));
    let pick = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let x = _mm256_shuffle_epi8(x, pick);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 five-bit quants (0..=31) of a Q5 block in element order.
#[inline(always)]
pub(crate) unsafe fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    _mm256_or_si256(unpack_nibbles(qs), q5_high(qh))
}

/// The 16 IQ4 grid values as signed bytes.
#[inline(always)]
pub(crate) unsafe fn iq4_values_table() -> __m128i {
    // SAFETY (for callers): reads exactly the 16 bytes of the table.
    _mm_loadu_si128(IQ4_VALUES.as_ptr().cast())
}

/// The IQ4 grid values (signed bytes) of 16 nibble bytes, in element order.
#[inline(always)]
pub(crate) unsafe fn iq4_values(qs: &[u8; 16]) -> __m256i {
    let table = _mm256_broadcastsi128_si256(iq4_values_table());
    _mm256_shuffle_epi8(table, unpack_nibbles(qs))
}

impl WeightBlock for BlockQ5_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = -16;
    const UNSIGNED_MAX: i32 = 31;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        q5_quants(&self.qs, self.qh)
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(y: __m256i) -> __m256i {
        // -16 * sum(y) per lane, so that dp(prep, q, y) = sum((q - 16) * y).
        let c = V::dp(_mm256_setzero_si256(), _mm256_set1_epi8(16), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), c)
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, prep: __m256i) -> __m256i {
        // q <= 31, |y| <= 128: pair sums <= 7936, no i16 saturation in `vpmaddubsw`.
        V::dp(prep, q5_quants(&self.qs, self.qh), y)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
}

impl WeightBlock for BlockQ5_1 {
    type Act = BlockQ8_1;
    const HAS_MIN: bool = true;
    const CORR: i32 = 0;
    const UNSIGNED_MAX: i32 = 31;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        q5_quants(&self.qs, self.qh)
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(_y: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, _prep: __m256i) -> __m256i {
        V::dp(_mm256_setzero_si256(), q5_quants(&self.qs, self.qh), y)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.m[0], self.m[1]]
    }
}

impl WeightBlock for BlockIQ4NL {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = -128;
    const UNSIGNED_MAX: i32 = 255;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        // grid value xor 0x80 read as u8 is the value + 128.
        _mm256_xor_si256(iq4_values(&self.qs), _mm256_set1_epi8(-128))
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(y: __m256i) -> __m256i {
        V::ss_prep(y)
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, prep: __m256i) -> __m256i {
        // Signed times signed, as Q8_0 (grid values lie in -127..=113).
        V::ss(iq4_values(&self.qs), y, prep)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
}

/// 32 bytes (a vector) as 4 vectors of 8 i32 lanes, sign- or zero-extended, element order.
#[inline(always)]
unsafe fn widen32(v: __m256i, signed: bool) -> [__m256i; 4] {
    let halves = [_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)];
    let mut out = [_mm256_setzero_si256(); 4];
    for (h, x) in halves.into_iter().enumerate() {
        let parts = [x, _mm_srli_si128(x, 8)];
        for (k, p) in parts.into_iter().enumerate() {
            out[2 * h + k] = if signed {
                _mm256_cvtepi8_epi32(p)
            } else {
                _mm256_cvtepu8_epi32(p)
            };
        }
    }
    out
}

impl AxpyBlock for BlockQ5_0 {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u16::from_le_bytes(self.d) as u32
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, _m: __m256) -> [__m256; 4] {
        let q = _mm256_sub_epi8(q5_quants(&self.qs, self.qh), _mm256_set1_epi8(16));
        // d * (q - 16): exact, as the scalar twin.
        let mut x = [d; 4];
        for (x, q) in x.iter_mut().zip(widen32(q, true)) {
            *x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        }
        x
    }
}

impl AxpyBlock for BlockQ5_1 {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u32::from_le_bytes([self.d[0], self.d[1], self.m[0], self.m[1]])
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, m: __m256) -> [__m256; 4] {
        let q = q5_quants(&self.qs, self.qh);
        let mut x = [d; 4];
        for (x, q) in x.iter_mut().zip(widen32(q, false)) {
            *x = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m);
        }
        x
    }
}

impl AxpyBlock for BlockIQ4NL {
    #[inline(always)]
    fn dm_bits(&self) -> u32 {
        u16::from_le_bytes(self.d) as u32
    }
    #[inline(always)]
    unsafe fn values(&self, d: __m256, _m: __m256) -> [__m256; 4] {
        let mut x = [d; 4];
        for (x, q) in x.iter_mut().zip(widen32(iq4_values(&self.qs), true)) {
            // d * grid[q]: exact, as the scalar twin.
            *x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        }
        x
    }
}
