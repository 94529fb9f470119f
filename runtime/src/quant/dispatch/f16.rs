//! f16 conversions and attention's products over an f16 KV cache, from the kernel table
//! (every ISA has an entry: the scalar functions on `Scalar`).

use crate::quant::*;

impl Kernels {
    /// f32 to f16, round to nearest even (NaN payloads may differ between ISAs).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn f32_to_f16(&self, src: &[f32], dst: &mut [f16]) {
        assert_eq!(src.len(), dst.len(), "f32_to_f16 lengths");
        // SAFETY: the table is this CPU's (`quant/table.rs`); the lengths were checked.
        unsafe { (self.table.f16.f32_to_f16)(src, dst) }
    }

    /// f16 to f32 (exact).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn f16_to_f32(&self, src: &[f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "f16_to_f32 lengths");
        // SAFETY: the table is this CPU's (`quant/table.rs`); the lengths were checked.
        unsafe { (self.table.f16.f16_to_f32)(src, dst) }
    }

    /// Dot of an f32 vector with an f16 row (attention scores over an f16 K cache).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn dot_f32_f16(&self, x: &[f32], y: &[f16]) -> f32 {
        assert_eq!(x.len(), y.len(), "dot_f32_f16 lengths");
        // SAFETY: the table is this CPU's (`quant/table.rs`); the lengths were checked.
        unsafe { (self.table.f16.dot_f32_f16)(x, y) }
    }

    /// `y[i] += a * x[i]` (one fma each) for an f16 row `x` (attention over an f16 V cache).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn axpy_f16(&self, a: f32, x: &[f16], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy_f16 lengths");
        // SAFETY: the table is this CPU's (`quant/table.rs`); the lengths were checked.
        unsafe { (self.table.f16.axpy_f16)(a, x, y) }
    }
}
