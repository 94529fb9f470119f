//! Q5_0, Q5_1 and IQ4_NL rows for the 512-bit `axpy_rows`: the float steps of
//! `scalar::axpy_rows` (exact `d * (q - 16)` and `d * grid[q]`, Q5_1 `fma(d, q, m)`), so every
//! lane is the scalar twin's value. Safety contract of `avx2.rs`.

use super::super::avx2::{iq4_values_table, q5_quants};
use super::super::blocks::{BlockIQ4NL, BlockQ5_0, BlockQ5_1};
use super::{lookup4, AxpyBlock16};
use std::arch::x86_64::*;

/// The two 16-byte halves of a 32-byte vector, widened to i32 lanes.
#[inline(always)]
unsafe fn widen16x2(v: __m256i, signed: bool) -> [__m512i; 2] {
    let h = [_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)];
    if signed {
        [_mm512_cvtepi8_epi32(h[0]), _mm512_cvtepi8_epi32(h[1])]
    } else {
        [_mm512_cvtepu8_epi32(h[0]), _mm512_cvtepu8_epi32(h[1])]
    }
}

impl AxpyBlock16 for BlockQ5_0 {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, _m: __m512) -> [__m512; 2] {
        let q = _mm256_sub_epi8(q5_quants(&self.qs, self.qh), _mm256_set1_epi8(16));
        let [a, b] = widen16x2(q, true);
        [
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(a)),
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(b)),
        ]
    }
}

impl AxpyBlock16 for BlockQ5_1 {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, m: __m512) -> [__m512; 2] {
        let [a, b] = widen16x2(q5_quants(&self.qs, self.qh), false);
        [
            _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(a), m),
            _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(b), m),
        ]
    }
}

impl AxpyBlock16 for BlockIQ4NL {
    #[inline(always)]
    unsafe fn values16(&self, d: __m512, _m: __m512) -> [__m512; 2] {
        // table[q] = d * grid[q], exact, as the scalar twin.
        let grid = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(iq4_values_table()));
        lookup4(&self.qs, _mm512_mul_ps(d, grid))
    }
}
