//! Run-time choice of the instruction set, made once per process.

use std::sync::OnceLock;

/// The widest instruction set the kernels use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust; the compiler may still auto-vectorise it for the build target.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX2 + FMA + F16C with AVX-VNNI (Intel Alder Lake and later client cores, AMD
    /// Zen 5; CPUs without AVX-512): the quantized integer dot products use the VEX-encoded
    /// `vpdpbusd`/`vpdpwssd` (what ggml does with `__AVXVNNI__`); every other kernel is the
    /// AVX2 one. Where the CPU also has AVX-512 VNNI, `Isa::Avx512` is chosen instead
    /// (`TESSERA_ISA=avxvnni` forces this one, for testing).
    AvxVnni,
    /// x86_64 AVX-512 F/BW/VL with VNNI on top of AVX2: the integer dot products of the
    /// quantized types use `vpdpbusd`/`vpdpwssd` on 256-bit vectors (what ggml does with
    /// `__AVX512VNNI__`); every other kernel is the AVX2 one.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma+f16c",
            Isa::AvxVnni => "avx2+avx-vnni",
            Isa::Avx512 => "avx512+vnni",
            Isa::Neon => "neon",
        }
    }
}

fn detect() -> Isa {
    if std::env::var("TESSERA_ISA").is_ok_and(|v| v == "scalar") {
        return Isa::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        let want = std::env::var("TESSERA_ISA").ok();
        if avx512 && !matches!(want.as_deref(), Some("avx2") | Some("avxvnni")) {
            return Isa::Avx512;
        }
        if avx2 && avx_vnni_available() && want.as_deref() != Some("avx2") {
            return Isa::AvxVnni;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Isa::Neon;
        }
    }
    Isa::Scalar
}

/// Whether this CPU has AVX2/FMA/F16C and AVX-VNNI (what `Isa::AvxVnni` needs; asked once).
pub fn avx_vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
                && is_x86_feature_detected!("avxvnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU is AMD's (vendor string `AuthenticAMD`; asked once). Only defaults that
/// were measured to go opposite ways on AMD and Intel cores ask it (the interleaved rows, see
/// `crate::interleave_by_default`, and their kernels' software prefetch; the bf16 GEMM on
/// `vdpbf16ps`, `ops::matmul_bf16::gemm_available`, whose sums are that instruction's where
/// the widened path's are f32 FMAs: the one result that depends on it).
pub fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: OnceLock<bool> = OnceLock::new();
        *AMD.get_or_init(|| {
            // SAFETY: cpuid leaf 0 (the vendor string) exists on every x86_64 CPU.
            #[allow(unused_unsafe)]
            let r = unsafe { std::arch::x86_64::__cpuid(0) };
            let mut v = [0u8; 12];
            v[..4].copy_from_slice(&r.ebx.to_le_bytes());
            v[4..8].copy_from_slice(&r.edx.to_le_bytes());
            v[8..].copy_from_slice(&r.ecx.to_le_bytes());
            &v == b"AuthenticAMD"
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The instruction set chosen for this process (`TESSERA_ISA=scalar`, `=avx2` or `=avxvnni`
/// forces a narrower one, for testing every path on one machine).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect)
}
