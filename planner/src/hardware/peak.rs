//! The int8 multiply-add peak of one core: the widest integer dot product the CPU has, in a
//! loop with nothing else (independent accumulators enough to hide its latency, operands in
//! registers). No int8 GEMM can go faster, so prefill is reported as a share of it (`conductor bench`).
//!
//! On x86-64 with AVX2 the dot product is `vpmaddubsw` (32 u8 · i8 products, summed in pairs
//! into i16 lanes), measured two ways:
//! * its sums added in i16 (`vpaddw`): what a kernel reaches whose products fit i16 sums for a
//!   while (the 4- and 5-bit formats' GEMMs sum 4 to 8 of them before widening);
//! * widened at once (`vpmaddwd` by ones, `vpaddd`): an exact i32 dot product of any bytes,
//!   what VNNI's `vpdpbusd` does in one instruction.
//!
//! With AVX-512 VNNI, `vpdpbusd` on zmm registers (64 u8 · i8 products summed four by four
//! into i32 lanes, one instruction) is measured too. The peak is the best of these. AVX-VNNI
//! (the ymm form) is detected and named but not measured: no CPU it was written on had it, so
//! there the figure is a floor of the peak and the profile says so. Other architectures: not
//! measured (`None`).

use super::timing::{secs_per_call, Effort};

/// One core's int8 multiply-add rates.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Peak {
    /// The best rate, GMAC/s.
    pub gmacs: f64,
    /// The instruction sequence that reached it.
    pub how: &'static str,
    /// The exact-i32 sequence's rate, GMAC/s (`vpmaddubsw` + `vpmaddwd` + `vpaddd`).
    pub i32_gmacs: f64,
    /// `vpdpbusd` on zmm registers, GMAC/s, where the CPU has AVX-512 VNNI.
    pub vnni_gmacs: Option<f64>,
    /// Wider integer dot products this CPU has that were not measured ("avx-vnni").
    pub unmeasured: Vec<&'static str>,
}

/// Multiply-adds per iteration of the loops below: 8 `vpmaddubsw` of 32 products.
#[cfg(target_arch = "x86_64")]
const MACS_PER_ITER: u64 = 8 * 32;
/// Multiply-adds per iteration of the AVX-512 VNNI loop: 16 `vpdpbusd` of 64 products.
#[cfg(target_arch = "x86_64")]
const VNNI_MACS_PER_ITER: u64 = 16 * 64;
/// Iterations per call (about half a millisecond at 40 GMAC/s).
#[cfg(target_arch = "x86_64")]
const ITERS: u64 = 1 << 16;

/// Measures the calling thread's core's int8 peak (a full or a `quick` run; pin the thread for
/// a figure of one core); `None` where this build has no loop for the CPU (no AVX2, or not
/// x86-64).
pub fn measure_int8_peak(quick: bool) -> Option<Int8Peak> {
    int8_peak(&Effort::new(quick))
}

/// [`measure_int8_peak`] with `effort`.
pub(super) fn int8_peak(effort: &Effort) -> Option<Int8Peak> {
    #[cfg(target_arch = "x86_64")]
    {
        if !is_x86_feature_detected!("avx2") {
            return None;
        }
        let rate = |macs_per_iter: u64, secs: f64| (ITERS * macs_per_iter) as f64 / secs / 1e9;
        // SAFETY: AVX2 was detected just above; the loops touch only the registers they name.
        let i16_gmacs = rate(
            MACS_PER_ITER,
            secs_per_call(effort, || unsafe { maddubs_i16(ITERS) }),
        );
        // SAFETY: as above.
        let i32_gmacs = rate(
            MACS_PER_ITER,
            secs_per_call(effort, || unsafe { maddubs_i32(ITERS) }),
        );
        let (mut gmacs, mut how) = if i16_gmacs >= i32_gmacs {
            (i16_gmacs, "vpmaddubsw + vpaddw (AVX2, i16 sums)")
        } else {
            (i32_gmacs, "vpmaddubsw + vpmaddwd + vpaddd (AVX2)")
        };
        let vnni_gmacs = (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vnni"))
        .then(|| {
            // SAFETY: AVX-512F and AVX-512 VNNI were detected just above; the loop touches only
            // the registers it names.
            let secs = secs_per_call(effort, || unsafe { dpbusd_zmm(ITERS) });
            rate(VNNI_MACS_PER_ITER, secs)
        });
        if let Some(vnni) = vnni_gmacs.filter(|&v| v > gmacs) {
            (gmacs, how) = (vnni, "vpdpbusd (AVX-512 VNNI, zmm)");
        }
        let mut unmeasured = Vec::new();
        if is_x86_feature_detected!("avxvnni") {
            unmeasured.push("avx-vnni");
        }
        Some(Int8Peak {
            gmacs,
            how,
            i32_gmacs,
            vnni_gmacs,
            unmeasured,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = effort;
        None
    }
}

/// `iters` x 8 `vpmaddubsw` into eight `vpaddw` accumulators (independent chains).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_i16(iters: u64) {
    // SAFETY: register-only AVX2 instructions (the caller checked AVX2); every register written
    // is declared clobbered; no memory or stack access; `n` counts down to zero.
    std::arch::asm!(
        "vpcmpeqb ymm14, ymm14, ymm14",
        "vpabsb ymm15, ymm14",
        "2:",
        "vpmaddubsw ymm8, ymm15, ymm14",
        "vpaddw ymm0, ymm0, ymm8",
        "vpmaddubsw ymm9, ymm15, ymm14",
        "vpaddw ymm1, ymm1, ymm9",
        "vpmaddubsw ymm10, ymm15, ymm14",
        "vpaddw ymm2, ymm2, ymm10",
        "vpmaddubsw ymm11, ymm15, ymm14",
        "vpaddw ymm3, ymm3, ymm11",
        "vpmaddubsw ymm12, ymm15, ymm14",
        "vpaddw ymm4, ymm4, ymm12",
        "vpmaddubsw ymm13, ymm15, ymm14",
        "vpaddw ymm5, ymm5, ymm13",
        "vpmaddubsw ymm8, ymm15, ymm14",
        "vpaddw ymm6, ymm6, ymm8",
        "vpmaddubsw ymm9, ymm15, ymm14",
        "vpaddw ymm7, ymm7, ymm9",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters.max(1) => _,
        out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
        out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
        out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
        out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
        options(nomem, nostack),
    );
}

/// `iters` x 8 (`vpmaddubsw`, `vpmaddwd` by ones, `vpaddd`) into eight i32 accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_i32(iters: u64) {
    // SAFETY: as in `maddubs_i16`.
    std::arch::asm!(
        "vpcmpeqb ymm14, ymm14, ymm14",
        "vpabsb ymm15, ymm14",
        "vpsrlw ymm13, ymm14, 15",
        "2:",
        "vpmaddubsw ymm8, ymm15, ymm14",
        "vpmaddwd ymm8, ymm8, ymm13",
        "vpaddd ymm0, ymm0, ymm8",
        "vpmaddubsw ymm9, ymm15, ymm14",
        "vpmaddwd ymm9, ymm9, ymm13",
        "vpaddd ymm1, ymm1, ymm9",
        "vpmaddubsw ymm10, ymm15, ymm14",
        "vpmaddwd ymm10, ymm10, ymm13",
        "vpaddd ymm2, ymm2, ymm10",
        "vpmaddubsw ymm11, ymm15, ymm14",
        "vpmaddwd ymm11, ymm11, ymm13",
        "vpaddd ymm3, ymm3, ymm11",
        "vpmaddubsw ymm12, ymm15, ymm14",
        "vpmaddwd ymm12, ymm12, ymm13",
        "vpaddd ymm4, ymm4, ymm12",
        "vpmaddubsw ymm8, ymm15, ymm14",
        "vpmaddwd ymm8, ymm8, ymm13",
        "vpaddd ymm5, ymm5, ymm8",
        "vpmaddubsw ymm9, ymm15, ymm14",
        "vpmaddwd ymm9, ymm9, ymm13",
        "vpaddd ymm6, ymm6, ymm9",
        "vpmaddubsw ymm10, ymm15, ymm14",
        "vpmaddwd ymm10, ymm10, ymm13",
        "vpaddd ymm7, ymm7, ymm10",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters.max(1) => _,
        out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
        out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
        out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
        out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
        options(nomem, nostack),
    );
}

/// `iters` x 16 `vpdpbusd` (zmm) into sixteen i32 accumulators (independent chains). Eight
/// were too few: the loop then waited on `vpdpbusd`'s latency and read 260 GMAC/s on a Xeon
/// whose ports give 353 (12 chains 346, 16 to 24 chains 352 to 355).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpbusd_zmm(iters: u64) {
    // SAFETY: register-only AVX-512 instructions (the caller checked AVX-512F and VNNI); every
    // register written is declared clobbered; no memory or stack access; `n` counts down to
    // zero.
    std::arch::asm!(
        "vpternlogd zmm14, zmm14, zmm14, 0xff",
        "vpabsb zmm15, zmm14",
        "2:",
        "vpdpbusd zmm0, zmm15, zmm14",
        "vpdpbusd zmm1, zmm15, zmm14",
        "vpdpbusd zmm2, zmm15, zmm14",
        "vpdpbusd zmm3, zmm15, zmm14",
        "vpdpbusd zmm4, zmm15, zmm14",
        "vpdpbusd zmm5, zmm15, zmm14",
        "vpdpbusd zmm6, zmm15, zmm14",
        "vpdpbusd zmm7, zmm15, zmm14",
        "vpdpbusd zmm8, zmm15, zmm14",
        "vpdpbusd zmm9, zmm15, zmm14",
        "vpdpbusd zmm10, zmm15, zmm14",
        "vpdpbusd zmm11, zmm15, zmm14",
        "vpdpbusd zmm12, zmm15, zmm14",
        "vpdpbusd zmm13, zmm15, zmm14",
        "vpdpbusd zmm16, zmm15, zmm14",
        "vpdpbusd zmm17, zmm15, zmm14",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters.max(1) => _,
        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
        out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
        out("zmm16") _, out("zmm17") _,
        options(nomem, nostack),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops run and give plausible rates: between 0.1 and 10,000 GMAC/s on a core, the
    /// i16 sequence at least as fast as the one that also widens (it does less per product).
    #[test]
    fn int8_peak_measures_where_avx2_is() {
        let effort = Effort::new(true);
        let Some(p) = int8_peak(&effort) else {
            #[cfg(target_arch = "x86_64")]
            assert!(
                !is_x86_feature_detected!("avx2"),
                "AVX2 present, not measured"
            );
            return;
        };
        assert!(p.gmacs > 0.1 && p.gmacs < 1e4, "{p:?}");
        assert!(p.i32_gmacs > 0.1 && p.i32_gmacs <= p.gmacs, "{p:?}");
        // Where AVX-512 VNNI is, it is measured, and its one instruction beats the three of
        // the exact-i32 AVX2 sequence (this Xeon: 353 against 95 GMAC/s).
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni") {
            let vnni = p.vnni_gmacs.expect("AVX-512 VNNI measured");
            assert!(vnni > p.i32_gmacs && vnni <= p.gmacs, "{p:?}");
        } else {
            assert_eq!(p.vnni_gmacs, None, "{p:?}");
        }
    }
}
