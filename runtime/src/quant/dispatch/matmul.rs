//! Prefill's products: [`Kernels::matmul`] and [`Kernels::matmul_cols`], dispatched to the
//! packed GEMMs from `PACKED_MIN_TOKENS` tokens on, the 4x4 tiles below that, and the per-row
//! dots where a type has neither.

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
        #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
        {
            use avx2::kquants::entry as kq;
            use avx2::{plain, vnni};
            use avx512::narrow;
            let m = g.rows();
            let packed = n_tokens >= PACKED_MIN_TOKENS;
            // SAFETY: ISA detected at construction; geometry validated above, `acts` has
            // n_tokens * nb blocks and `out` covers every (t, r) written (checked above).
            unsafe {
                // Q4_K and Q6_K in file layout take the interleaved kernels' unpacked blocks,
                // their rows packed into groups on the way (the same bits).
                if self.isa == Isa::Avx512Vnni && n_tokens >= avx512::UNPACK_ONCE_FROM {
                    match w.ty {
                        GgmlType::Q4_K => {
                            return avx512::x8::matmul_rows::<BlockQ4Kx8>(
                                m,
                                blocks_of(acts),
                                n_tokens,
                                out,
                                out_stride,
                            )
                        }
                        GgmlType::Q6_K => {
                            return avx512::x8::matmul_rows::<BlockQ6Kx8>(
                                m,
                                blocks_of(acts),
                                n_tokens,
                                out,
                                out_stride,
                            )
                        }
                        _ => {}
                    }
                }
                if self.isa != Isa::Scalar {
                    callk!(
                        w.ty,
                        kq::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    );
                }
                match self.isa {
                    Isa::Scalar => {}
                    Isa::Avx512Vnni if packed => {
                        call32!(
                            w.ty,
                            avx512::matmul_packed16(m, blocks_of(acts), n_tokens, out, out_stride)
                        )
                    }
                    Isa::AvxVnni if packed => {
                        call32!(
                            w.ty,
                            gemm::matmul_vnni(m, blocks_of(acts), n_tokens, out, out_stride)
                        )
                    }
                    // Without VNNI the packed scheme sums in i16: 4- and 5-bit weights only
                    // (`gemm::i16_groups`); 8-bit ones take the 4x4 tiles there.
                    Isa::Avx2 if packed => {
                        call32!(
                            w.ty,
                            gemm::matmul_avx2(m, blocks_of(acts), n_tokens, out, out_stride)
                        )
                    }
                    Isa::Avx2 => call32!(
                        w.ty,
                        plain::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    ),
                    Isa::AvxVnni => call32!(
                        w.ty,
                        vnni::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    ),
                    Isa::Avx512Vnni => {
                        call32!(
                            w.ty,
                            narrow::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                        )
                    }
                }
            }
        }
        #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
        if self.isa != Isa::Scalar {
            use neon::kquants::{dot as kq_dot, mm as kq_mm, plain as kq_plain};
            use neon::{dot, mm, plain};
            let m = g.neon_rows();
            // SAFETY: ISA detected at construction (NeonI8mm implies dotprod and i8mm);
            // geometry validated above, `acts` has n_tokens * nb blocks and `out` covers every
            // (t, r) written (checked above).
            unsafe {
                if self.isa == Isa::NeonI8mm {
                    call32!(
                        w.ty,
                        mm::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    );
                    callk!(
                        w.ty,
                        kq_mm::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    );
                }
                if matches!(self.isa, Isa::NeonDot | Isa::NeonI8mm) {
                    call32!(
                        w.ty,
                        dot::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    );
                    callk!(
                        w.ty,
                        kq_dot::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                    );
                }
                call32!(
                    w.ty,
                    plain::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                );
                callk!(
                    w.ty,
                    kq_plain::matmul(m, blocks_of(acts), n_tokens, out, out_stride)
                );
            }
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
