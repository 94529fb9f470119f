//! Where dispatch fell back to its generic path on a SIMD ISA: row-by-row dots where a
//! matrix kernel is missing (`matvec`, `matvec_rows`, `matmul`, the interleaved ones), or the
//! scalar kernel (`vec_dot`, `axpy_rows`, `quantize_activations`, `gemm_f32`): the kernel
//! table (`table.rs`) has no entry for the pair. A kernel missing from the table would
//! otherwise go unnoticed: the generic path gives the same bits, only slower.
//! `tests/coverage.rs` runs every (operation, type) pair and holds the fallbacks to a written
//! table; outside tests the record is nothing.

use super::{GgmlType, Isa};

#[cfg(test)]
thread_local! {
    static FELL: std::cell::RefCell<Vec<(&'static str, GgmlType)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `op` on `ty` is about to take its generic path with kernels for `isa`.
#[inline(always)]
pub(super) fn fallback(isa: Isa, op: &'static str, ty: GgmlType) {
    #[cfg(test)]
    if isa != Isa::Scalar {
        FELL.with(|f| f.borrow_mut().push((op, ty)));
    }
    #[cfg(not(test))]
    let _ = (isa, op, ty);
}

/// The fallbacks recorded on this thread since the last call.
#[cfg(test)]
pub(super) fn take() -> Vec<(&'static str, GgmlType)> {
    FELL.with(|f| std::mem::take(&mut *f.borrow_mut()))
}
