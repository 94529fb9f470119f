//! [`Isa`]: the instruction sets the kernels are written for, and detecting them on this CPU.

/// The instruction set a [`Kernels`](super::Kernels) value dispatches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; what targets other than x86-64 and aarch64 use.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C + AVX-VNNI (`vpdpbusd` on 256-bit vectors).
    AvxVnni,
    /// AVX2 + FMA + F16C + AVX512 F/BW/VL/VNNI: 512-bit prefill GEMM, EVEX `vpdpbusd` elsewhere.
    Avx512Vnni,
    /// AArch64 NEON (the baseline of every aarch64 CPU): `smull`/`sadalp` integer dots.
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    Neon,
    /// AArch64 NEON + dotprod (ARMv8.2 `sdot`).
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    NeonDot,
    /// AArch64 NEON + dotprod + i8mm: the dotprod kernels, with `smmla` 4x4 matmul tiles for the
    /// 32-element formats.
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    NeonI8mm,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::Neon => "neon",
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonDot => "neon-dotprod",
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonI8mm => "neon-i8mm",
        }
    }

    /// Whether this CPU can run the ISA.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
            Isa::AvxVnni => Isa::Avx2.is_available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonDot => {
                Isa::Neon.is_available() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonI8mm => {
                Isa::NeonDot.is_available() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
