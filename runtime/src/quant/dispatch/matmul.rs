//! Prefill's products: [`Kernels::matmul`] and [`Kernels::matmul_cols`], dispatched to the
//! kernel table's entry of the type (on x86-64 the packed GEMMs from `PACKED_MIN_TOKENS`
//! tokens on, the 4x4 tiles below that), and the per-row dots where a type has none.

use crate::quant::*;

impl Kernels {
    /// Prefill: `out[t * out_stride + r]` = dot(row r of `w`, token t of `acts`), where `acts`
    /// holds `n_tokens` activation rows of `w.cols` elements back to back.
    ///
    /// # Panics
    /// On a malformed `w`, `acts.len()` not `n_tokens` activation rows, `out_stride < w.rows`, or
    /// `out` too short for the last token's rows.
    pub fn matmul(
        &self,
        w: MatRef<'_>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        self.matmul_cols(w, 0..w.cols, acts, n_tokens, out, out_stride)
    }

    /// [`Kernels::matmul`] over the columns `cols` of `w` (block aligned): `acts` holds
    /// `n_tokens` activation rows of `cols.len()` elements. Each output is the bits
    /// [`Kernels::matvec`] of the same columns gives: prefill's partial down projections over
    /// decode's neuron clusters (`exec/rows.rs`).
    ///
    /// # Panics
    /// As [`Kernels::matmul`], and on an unaligned or out-of-range `cols`.
    pub fn matmul_cols(
        &self,
        w: MatRef<'_>,
        cols: Range<usize>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let at = activation_type(w.ty);
        let arow = row_bytes(at, cols.len()).unwrap_or_else(|e| panic!("{e}"));
        let total = arow
            .checked_mul(n_tokens)
            .expect("activation size overflows");
        assert_eq!(acts.len(), total, "matmul activation bytes");
        assert!(
            out_stride >= w.rows,
            "out_stride {out_stride} < rows {}",
            w.rows
        );
        if n_tokens == 0 {
            return;
        }
        let need = (n_tokens - 1)
            .checked_mul(out_stride)
            .and_then(|v| v.checked_add(w.rows))
            .expect("output size overflows");
        assert!(
            out.len() >= need,
            "matmul output holds {} < {need}",
            out.len()
        );
        if let Layout::X8 { .. } = w.layout {
            return self.matmul_x8(w, cols, acts, n_tokens, out, out_stride);
        }
        let g = Self::geometry(&w, cols);
        if let Some(matmul) = self.table.matmul.get(w.ty) {
            // SAFETY: the table is this CPU's (`quant/table.rs`); the geometry was validated
            // above, `acts` has n_tokens * nb blocks and `out` covers every (t, r) written
            // (checked above).
            return unsafe { matmul(g, acts, n_tokens, out, out_stride) };
        }
        audit::fallback(self.isa, "matmul", w.ty);
        for t in 0..n_tokens {
            let a = &acts[t * arow..(t + 1) * arow];
            for r in 0..w.rows {
                out[t * out_stride + r] = self.dot_dispatch(w.ty, g.ncols, g.row(r), a);
            }
        }
    }
}
