//! Sparse FFN decode's down projection: [`Kernels::axpy_rows`], each selected neuron's row
//! scaled and added in neuron order.

use crate::quant::*;

impl Kernels {
    /// Sparse FFN decode: `out = Σ_k coefs[k] · row(neurons[k]) of w` (rows dequantized),
    /// accumulated in k order; `out` is overwritten (the sum starts from +0.0). `w` is typically
    /// a transposed down projection (one row of `n_embd` columns per FFN neuron, see
    /// [`transpose_requantize`]). Supported types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, F16,
    /// BF16, F32. A neuron may repeat (each occurrence adds its term).
    ///
    /// Numerics (`scalar::axpy_rows`): per output element, `acc = fma(coefs[k], x, acc)` for k in
    /// order, x exactly [`dequantize_row`]'s value of that weight; bit-identical across ISAs.
    ///
    /// # Panics
    /// On a malformed `w` or an unsupported type, `coefs.len() != neurons.len()`, a neuron
    /// `>= w.rows`, or `out.len() != w.cols`. (The neuron check is O(neurons); the work is
    /// O(neurons * cols).)
    pub fn axpy_rows(&self, w: MatRef<'_>, neurons: &[u32], coefs: &[f32], out: &mut [f32]) {
        out.fill(0.0);
        self.axpy_rows_add(w, neurons, coefs, out);
    }

    /// [`Kernels::axpy_rows`] added to what `out` holds (`acc` starts from `out[i]`): a compute
    /// cluster of several store bundles sums its bundles' neurons into one output, in order, as
    /// one call over all of them would (the same fmas in the same order).
    ///
    /// # Panics
    /// As [`Kernels::axpy_rows`].
    pub fn axpy_rows_add(&self, w: MatRef<'_>, neurons: &[u32], coefs: &[f32], out: &mut [f32]) {
        let g = Self::geometry(&w, 0..w.cols);
        assert!(axpy_type(w.ty), "axpy_rows: {} is not supported", w.ty);
        assert_eq!(
            coefs.len(),
            neurons.len(),
            "axpy_rows coefs/neurons lengths"
        );
        assert_eq!(out.len(), w.cols, "axpy_rows output length");
        if let Some(&max) = neurons.iter().max() {
            assert!(
                (max as usize) < w.rows,
                "axpy_rows: neuron {max} out of range 0..{}",
                w.rows
            );
        }
        if let Some(axpy) = self.table.axpy_rows.get(w.ty) {
            // SAFETY: the table is this CPU's (`quant/table.rs`); `g` describes the validated
            // matrix (rows are bounds-checked slices), `out` has `cols` elements, every neuron
            // is a row and the coefficients match the neurons.
            return unsafe { axpy(g, neurons, coefs, out) };
        }
        audit::fallback(self.isa, "axpy_rows", w.ty);
        scalar::axpy_rows(w.ty, w.data, g.stride, neurons, coefs, out)
    }
}
