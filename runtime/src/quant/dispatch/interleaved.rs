//! Products over Q4_K and Q6_K rows interleaved 8 by 8 ([`Layout::X8`]): the interleaved
//! kernels where the ISA has them, each row taken back out of its group elsewhere.

use crate::quant::*;

impl Kernels {
    /// Checks an interleaved `w` and a column range of it; the range's super-blocks
    /// `(off, nb)`.
    fn x8_cols(w: &MatRef<'_>, cols: &Range<usize>) -> (usize, usize) {
        w.validate_any().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            cols.start <= cols.end && cols.end <= w.cols,
            "column range {cols:?} outside 0..{}",
            w.cols
        );
        assert!(
            cols.start.is_multiple_of(256) && cols.end.is_multiple_of(256),
            "column range {cols:?} not aligned to {} blocks of 256",
            w.ty
        );
        (cols.start / 256, cols.len() / 256)
    }

    /// `out[i]` = row `rows[i]` of an interleaved `w` (super-blocks `off..off + nb`) dotted with
    /// `act`, each row taken back out of its group: the paths without an interleaved kernel.
    fn x8_row_dots(
        &self,
        w: &MatRef<'_>,
        (off, nb): (usize, usize),
        rows: impl Iterator<Item = usize>,
        act: &[u8],
        out: &mut [f32],
    ) {
        fn go<G: interleave::Group>(
            k: &Kernels,
            m: interleave::X8<'_, G>,
            ty: GgmlType,
            rows: impl Iterator<Item = usize>,
            act: &[u8],
            out: &mut [f32],
        ) {
            let mut row = Vec::with_capacity(m.nb);
            for (r, o) in rows.zip(out.iter_mut()) {
                assert!(r < m.rows, "row {r} outside 0..{}", m.rows);
                m.row_blocks(r, &mut row);
                *o = k.dot_dispatch(ty, m.nb * 256, as_bytes(&row), act);
            }
        }
        match w.ty {
            GgmlType::Q4_K => {
                go::<BlockQ4Kx8>(self, interleave::x8_of(w, off, nb), w.ty, rows, act, out)
            }
            GgmlType::Q6_K => {
                go::<BlockQ6Kx8>(self, interleave::x8_of(w, off, nb), w.ty, rows, act, out)
            }
            ty => unreachable!("validated: {ty} has no interleaved layout"),
        }
    }

    /// [`Kernels::matvec`] of an interleaved matrix ([`Layout::X8`]): the interleaved kernel on
    /// x86-64 SIMD and NEON with dotprod, elsewhere each row taken out and dotted (the same bits
    /// either way).
    pub(in crate::quant) fn matvec_x8(
        &self,
        w: MatRef<'_>,
        cols: Range<usize>,
        act: &[u8],
        out: &mut [f32],
    ) {
        let (off, nb) = Self::x8_cols(&w, &cols);
        let ab = row_bytes(GgmlType::Q8_K, cols.len()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(act.len(), ab, "matvec activation bytes");
        assert_eq!(out.len(), w.rows, "matvec output length");
        if let Some(matvec) = self.table.matvec_x8.get(w.ty) {
            // SAFETY: the table is this CPU's (`quant/table.rs`); the geometry was validated
            // (its groups are bounds-checked slices), `act` has exactly `nb` activation blocks
            // and `out` `rows` elements.
            return unsafe { matvec(&w, (off, nb), act, out) };
        }
        audit::fallback(self.isa, "matvec_x8", w.ty);
        self.x8_row_dots(&w, (off, nb), 0..w.rows, act, out);
    }

    /// [`Kernels::matvec_rows`] of an interleaved matrix: each picked row taken out and dotted.
    pub(in crate::quant) fn matvec_rows_x8(
        &self,
        w: MatRef<'_>,
        pick: &[u32],
        act: &[u8],
        out: &mut [f32],
    ) {
        let (off, nb) = Self::x8_cols(&w, &(0..w.cols));
        let ab = row_bytes(GgmlType::Q8_K, w.cols).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(act.len(), ab, "matvec_rows activation bytes");
        assert_eq!(out.len(), pick.len(), "matvec_rows output length");
        let rows = pick.iter().map(|&r| r as usize);
        self.x8_row_dots(&w, (off, nb), rows, act, out);
    }

    /// [`Kernels::matmul`] of an interleaved matrix (its sizes checked there): the weights of
    /// each group read once for several tokens on x86-64 SIMD and NEON with dotprod, elsewhere
    /// token by token.
    pub(in crate::quant) fn matmul_x8(
        &self,
        w: MatRef<'_>,
        cols: Range<usize>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let arow = row_bytes(GgmlType::Q8_K, cols.len()).unwrap_or_else(|e| panic!("{e}"));
        if let Some(matmul) = self.table.matmul_x8.get(w.ty) {
            let (off, nb) = Self::x8_cols(&w, &cols);
            // SAFETY: the table is this CPU's (`quant/table.rs`); the geometry was validated,
            // `acts` has n_tokens * nb blocks and `out` covers every (t, r) written (checked in
            // `matmul`).
            return unsafe { matmul(&w, (off, nb), acts, n_tokens, out, out_stride) };
        }
        audit::fallback(self.isa, "matmul_x8", w.ty);
        for t in 0..n_tokens {
            let o = &mut out[t * out_stride..t * out_stride + w.rows];
            self.matvec_x8(w, cols.clone(), &acts[t * arow..(t + 1) * arow], o);
        }
    }
}
