//! The on-disk block layouts (ggml-common.h), as alignment-1 Rust structs.
//!
//! Every field is a byte array: f16/f32/i16 values are stored as little-endian `[u8; N]` and read
//! with `from_le_bytes`. That makes each struct alignment 1 with no padding and every bit pattern
//! valid, so any byte slice of the right length can be viewed as a slice of blocks. This matters
//! because tensor rows inside a GGUF file (and inside an mmap) carry no alignment guarantee beyond
//! what the writer chose, and ggml's own structs (2-byte aligned `ggml_half`) would make such a view
//! unsound for odd offsets.

use half::f16;

/// f16 bits (little-endian bytes) to f32. Exact.
#[cfg(not(all(target_arch = "aarch64", not(conductor_portable))))]
#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// f16 bits (little-endian bytes) to f32. Exact: the same bits as `half`'s `to_f32` for every
/// input (NaNs keep sign and payload and get the quiet bit, as `fcvt` does with the default
/// FPCR.DN = 0), checked over all 65536 patterns in `quant/tests.rs`.
///
/// On aarch64 an inline `fcvt` (half to single, base ARMv8 FP): `half` checks the CPU's fp16
/// feature at run time and calls out of line for each value, which the kernels' per-block
/// scales paid for with spilled vector registers.
#[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    let out: f32;
    // SAFETY: `fcvt` (H to S) is a base ARMv8 FP instruction, present on every aarch64 CPU; it
    // touches only the named registers (no memory, no stack) and, for an sNaN, FPSR's sticky
    // invalid bit. The u16 input is placed in the H view of a vector register (`vreg` takes
    // i16 with the baseline `fp` feature), so the compiler can load it there directly.
    unsafe {
        std::arch::asm!(
            "fcvt {o:s}, {i:h}",
            i = in(vreg) u16::from_le_bytes(b),
            o = lateout(vreg) out,
            // Not `preserves_flags`: an sNaN input sets FPSR.IOC.
            options(pure, nomem, nostack)
        );
    }
    out
}

/// f32 to f16 bytes, round to nearest even (what F16C's `vcvtps2ph` with mode 0 and ggml's
/// `GGML_FP32_TO_FP16` do for finite values).
#[inline(always)]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// A block struct that may be viewed from raw bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, no padding, and consist only of `u8`/`i8`
/// arrays, so that every byte pattern of `size_of::<Self>()` bytes is a valid value. The
/// `blocks!` macro below checks size and alignment at compile time.
pub(crate) unsafe trait Block: Copy + 'static {}

macro_rules! block_impl {
    ($t:ty, $size:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
        const _: () = assert!(std::mem::align_of::<$t>() == 1);
        // SAFETY: the struct is repr(C), made only of byte arrays (so alignment 1, no padding,
        // every bit pattern valid); size and alignment are asserted just above.
        unsafe impl Block for $t {}
    };
}

/// Views `bytes` as blocks. `None` unless the length is a whole number of blocks.
#[inline]
pub(crate) fn view<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: `B: Block` guarantees alignment 1 and that every bit pattern is valid; the length is
    // a whole number of blocks, so the new slice covers exactly the same initialized bytes, and it
    // borrows `bytes` for the same lifetime.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// The bytes of `blocks` (the inverse of [`view`]).
#[inline]
pub(crate) fn as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `B: Block` is alignment 1 with no padding, so the blocks are exactly
    // `size_of_val(blocks)` initialized bytes, borrowed for the same lifetime.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// Mutable twin of [`view`].
#[inline]
pub(crate) fn view_mut<B: Block>(bytes: &mut [u8]) -> Option<&mut [B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: as in `view`; the unique borrow of `bytes` is moved into the returned slice, and any
    // value written through it is a valid byte pattern again.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size)
    })
}

pub(crate) const QK4_0: usize = 32;
pub(crate) const QK4_1: usize = 32;
pub(crate) const QK8_0: usize = 32;
pub(crate) const QK8_1: usize = 32;
pub(crate) const QK_K: usize = 256;

/// Q4_0: x = d * (q - 8); element j < 16 in the low nibble of qs[j], j >= 16 in the high nibble
/// of qs[j - 16].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}
block_impl!(BlockQ4_0, 18);

/// Q4_1: x = d * q + m; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK4_1 / 2],
}
block_impl!(BlockQ4_1, 20);

/// Q8_0: x = d * q, q signed bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK8_0],
}
block_impl!(BlockQ8_0, 34);

/// Q8_1 (activations of Q4_1): x = d * q, and s = d * sum(q) for the Q4_1 min term.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    pub qs: [u8; QK8_1],
}
block_impl!(BlockQ8_1, 36);

/// A 32-element activation block (Q8_0 or Q8_1) as the integer kernels of every ISA read it.
pub(crate) trait ActBlock: Block {
    /// The 32 quants.
    fn qs(&self) -> &[u8; 32];
    /// The f16 bytes of d, then of s (zeros for Q8_0, which has no s).
    fn ds(&self) -> [u8; 4];
}

impl ActBlock for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> &[u8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn ds(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
}

impl ActBlock for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> &[u8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn ds(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.s[0], self.s[1]]
    }
}

/// Q4_K: 8 sub-blocks of 32; x = d * sc[j] * q - dmin * m[j], with 6-bit sc/m packed in
/// `scales` (see `scalar::q4k_scale_min`). qs byte 32c + l holds element 64c + l (low nibble)
/// and 64c + 32 + l (high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
block_impl!(BlockQ4K, 144);

/// Super-block `b` of 8 Q4_K rows, interleaved ([`super::interleave`]): the 8 rows' d, then their
/// dmin; their 12 scale bytes as three 4-byte words per row, word-major (`scales[8 * i + r]` is
/// bytes `4i..4i + 4` of row r's `scales`); their quants in 4-byte chunks, chunk-major (`qs[32
/// * q + 4 * r + i]` is row r's `qs[4 * q + i]`). The same 1152 bytes as the 8 blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4Kx8 {
    pub d: [[u8; 2]; 8],
    pub dmin: [[u8; 2]; 8],
    pub scales: [[u8; 4]; 24],
    pub qs: [[u8; 4]; 256],
}
block_impl!(BlockQ4Kx8, 8 * 144);

/// Q6_K: 16 sub-blocks of 16; x = d * scales[e / 16] * (q - 32), q 6 bits split in ql (low 4)
/// and qh (high 2); see `scalar::q6k_quant` for the element order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 16],
    pub d: [u8; 2],
}
block_impl!(BlockQ6K, 210);

/// Super-block `b` of 8 Q6_K rows, interleaved ([`super::interleave`]): the 8 rows' d; their 16
/// scale bytes as four 4-byte words per row, word-major (`scales[8 * i + r]` is bytes `4i..4i +
/// 4` of row r's `scales`); their `ql` and `qh` in 4-byte chunks, 8 rows' chunks side by side,
/// in the order the kernel reads them: for half n and k in 0..8, `ql` chunks 16n + k and 16n +
/// 8 + k and `qh` chunk 8n + k (`q[8 * (3 * (8n + k) + p) + r]`, part p of row r). The same
/// 1680 bytes as the 8 blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6Kx8 {
    pub d: [[u8; 2]; 8],
    pub scales: [[u8; 4]; 32],
    pub q: [[u8; 4]; 384],
}
block_impl!(BlockQ6Kx8, 8 * 210);

/// Q8_K (activations of the K-quants): x = d * q with an f32 d, and the sum of each 16 quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [u8; QK_K],
    pub bsums: [[u8; 2]; QK_K / 16],
}
block_impl!(BlockQ8K, 292);

impl BlockQ8K {
    #[inline(always)]
    pub(crate) fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    #[inline(always)]
    pub(crate) fn bsum(&self, j: usize) -> i32 {
        i16::from_le_bytes(self.bsums[j]) as i32
    }
}

pub(crate) const QK5_0: usize = 32;
pub(crate) const QK5_1: usize = 32;
pub(crate) const QK4_NL: usize = 32;

/// Q5_0: x = d * (q - 16), q 5 bits: the low 4 as in Q4_0 (element j < 16 in the low nibble of
/// qs[j], j >= 16 in the high nibble of qs[j - 16]), the fifth is bit j of `qh` (a little-endian
/// u32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
block_impl!(BlockQ5_0, 22);

/// Q5_1: x = d * q + m, q 5 bits laid out as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
block_impl!(BlockQ5_1, 24);

/// IQ4_NL: x = d * IQ4_VALUES[q], q 4 bits in Q4_0's nibble order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; QK4_NL / 2],
}
block_impl!(BlockIQ4NL, 18);

/// The 16 values of the non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q2_K: 16 sub-blocks of 16; x = d * (sc & 15) * q - dmin * (sc >> 4), sc = scales[e / 16],
/// q 2 bits: element 128n + 32j + l is bits 2j..2j+2 of qs[32n + l].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}
block_impl!(BlockQ2K, 84);

/// Q3_K: 16 sub-blocks of 16; x = d * (s - 32) * (q - 4 * !h), s the 6-bit scale of e / 16
/// (see `scalar::q3k_scales`), q 2 bits as in Q2_K, h bit 4n + j of hmask[l] for element
/// 128n + 32j + l.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}
block_impl!(BlockQ3K, 110);

/// Q5_K: as Q4_K (8 sub-blocks of 32, 6-bit scales and mins, the same nibble layout), plus a
/// fifth bit: bit j of qh[l] for element 32j + l.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
block_impl!(BlockQ5K, 176);

/// IQ4_XS: 8 sub-blocks of 32; x = d * (ls - 32) * IQ4_VALUES[q], ls 6 bits (low 4 in nibble
/// j % 2 of scales_l[j / 2], high 2 at bit 2j of `scales_h`), q in Q4_0's nibble order per
/// sub-block (16 bytes of qs each).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4XS {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
block_impl!(BlockIQ4XS, 136);
