//! Integer dot products (see `qdot`) for the 3-bit and 1-bit i-quants against q8_K activations:
//! iq3_xxs (256 points of 4 magnitudes, 7-bit even-parity signs, a 4-bit scale per 32),
//! iq3_s (512 points of 4 magnitudes, 8 explicit signs, a 4-bit scale per 32), iq1_s (2048
//! points of 8 values in -1..1, a shared ±1/8 shift and a 3-bit scale per 32) and iq1_m (the same
//! grid, a shift sign per 8, a 3-bit scale per 16 and the f16 super-scale spread over the top
//! nibbles of the scale words).
//!
//! As in `qdot`, two paths, each reproducing one of ggml's down to the last bit:
//! - scalar: ggml's portable code (`ggml-cpu/quants.c`, `ggml_vec_dot_<type>_q8_K_generic`) with
//!   C's evaluation order and no contraction of `a*b + c` into fused multiply-adds;
//! - AVX2 (`Isa::Avx2`, `Isa::AvxVnni` and `Isa::Avx512`): ggml's x86 AVX2 code (`ggml-cpu/arch/x86/quants.c`):
//!   the same exact integer sums in the same 32-bit lanes, the same fused multiply-adds per block
//!   and the same horizontal reduction. Where gcc contracts a scalar `a*b + c` of that code (iq1_s's
//!   `accum1 += d*sumi1`, iq1_m's final `hsum1 + IQ1M_DELTA*hsum2`) this does too, and where it
//!   does not (iq1_s's final `hsum + IQ1S_DELTA*accum1`) neither does this, so the result equals
//!   that of llama.cpp built by gcc for an AVX2 machine (checked against its `libggml-cpu` in
//!   `tests/qdot_iq13.rs`).
//!
//! The integer arithmetic is exact in both paths (no i16 product pair can saturate: grid
//! magnitudes are at most 62, activations at most 127); they differ only in how the per-block
//! float terms are grouped.

use tessera::DType;
use tessera_quants::iq_grids::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};

use crate::ops::qdot::{IntSums, ScalarSums, ONES8};
use crate::simd::Isa;

const QK_K: usize = 256;
/// Bytes of one q8_K block: f32 scale, 256 quants, 16 i16 sums of 16.
const Q8_K_SIZE: usize = 4 + QK_K + 2 * (QK_K / 16);

/// ggml's `IQ1S_DELTA` and `IQ1M_DELTA`: the shift of the iq1 grid values.
const IQ1_DELTA: f32 = 0.125;

/// Weight types with an integer kernel here.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::IQ3XXS | DType::IQ3S | DType::IQ1S | DType::IQ1M)
}

/// Dot of `nb` blocks of weight type `t` with `nb` q8_K blocks. The scalar path is ggml's
/// generic code, the AVX2 path (when the CPU has AVX2, FMA and F16C) what llama.cpp's AVX2
/// build computes.
///
/// Panics if `t` is not [`supported`] or a row is shorter than `nb` blocks' worth.
pub fn vec_dot(isa: Isa, t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    assert!(supported(t), "qdot_iq13: no integer kernel for {t}");
    assert!(
        w.len() >= nb * t.type_size() && x.len() >= nb * Q8_K_SIZE,
        "qdot_iq13: rows of {} and {} bytes for {nb} blocks of {t}",
        w.len(),
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); w and x hold at least nb
        // blocks of their formats (asserted above), which is all the kernels read.
        return unsafe { avx2::vec_dot(t, w, x, nb, fast_pdep(isa)) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        return scalar::vec_dot::<super::qdot_neon::NeonSums>(t, w, x, nb);
    }
    let _ = isa;
    scalar::vec_dot::<ScalarSums>(t, w, x, nb)
}

/// The AVX2 kernel [`vec_dot`] runs for `t` on `isa`, for callers that loop over rows; `None`
/// where `vec_dot` takes another path.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_kernel(isa: Isa, t: DType) -> Option<crate::ops::qdot::RowKernel> {
    (supported(t) && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available())
        .then(|| avx2::kernel(t, fast_pdep(isa)))
}

/// Whether the iq1 kernels take grid indices apart with BMI2's `pdep`, as ggml's do where it is
/// compiled for BMI2: on the CPUs of `Isa::AvxVnni` and `Isa::Avx512` (Intel's since Haswell and
/// AMD's since Zen 3 run it in one cycle; AMD's earlier AVX2 cores microcode it, tens to
/// hundreds of cycles, so `Isa::Avx2` keeps the shifts).
#[cfg(target_arch = "x86_64")]
fn fast_pdep(isa: Isa) -> bool {
    matches!(isa, Isa::AvxVnni | Isa::Avx512) && is_x86_feature_detected!("bmi2")
}

fn f16_bits(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// iq1_m's f16 super-scale: the top nibble of each of the four 16-bit scale words, low first.
fn iq1m_scale_bits(sc: &[u8]) -> u16 {
    let w = |j: usize| u16_at(sc, 2 * j);
    (w(0) >> 12) | ((w(1) >> 8) & 0x00f0) | ((w(2) >> 4) & 0x0f00) | (w(3) & 0xf000)
}

/// iq3_s grid index of element pair `j` (0..8) of a 32-element sub-block: 8 low bits from `qs`,
/// the ninth from bit j of the sub-block's `qh` byte.
fn iq3s_index(qs: u8, qh: u8, j: usize) -> usize {
    qs as usize | (((qh as usize) << (8 - j)) & 256)
}

/// iq1_s grid index of group `l` (0..4) of a 32-element sub-block: 8 low bits from `qs`, three
/// high bits from bits 3l..3l+3 of the sub-block's `qh` word.
fn iq1s_index(qs: u8, qh: u16, l: usize) -> usize {
    qs as usize | ((((qh >> (3 * l)) & 7) as usize) << 8)
}

/// iq1_m grid index of group `l` (0..4) of a 32-element sub-block: three high bits from the low
/// (l even) or high (l odd) nibble of the sub-block's `qh` byte l/2.
fn iq1m_index(qs: u8, qh: &[u8], l: usize) -> usize {
    qs as usize | (((qh[l / 2] as usize) << (8 - 4 * (l % 2))) & 0x700)
}

/// ggml's generic kernels, one function per type.
mod scalar {
    use super::*;

    pub fn vec_dot<I: IntSums>(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let ts = t.type_size();
        let blocks = w[..nb * ts]
            .chunks_exact(ts)
            .zip(x[..nb * Q8_K_SIZE].chunks_exact(Q8_K_SIZE));
        match t {
            DType::IQ3XXS => iq3_xxs::<I>(blocks),
            DType::IQ3S => iq3_s::<I>(blocks),
            DType::IQ1S => iq1_s::<I>(blocks),
            DType::IQ1M => iq1_m::<I>(blocks),
            _ => unreachable!("checked by the caller"),
        }
    }

    type Blocks<'a> =
        std::iter::Zip<std::slice::ChunksExact<'a, u8>, std::slice::ChunksExact<'a, u8>>;

    /// Two 4-element grid points (magnitudes) as one 8-element point.
    fn pair(g1: u32, g2: u32) -> u64 {
        g1 as u64 | (g2 as u64) << 32
    }

    fn iq3_xxs<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d = f16_bits(u16_at(wb, 0)) * f32_at(xb, 0);
            let (q3, gas, q8) = (&wb[2..66], &wb[66..98], &xb[4..4 + QK_K]);
            let mut bsum = 0i32;
            for ib in 0..QK_K / 32 {
                // 4 × 7 sign bits, then the 4-bit scale
                let aux = u32_at(gas, 4 * ib);
                let ls = 2 * (aux >> 28) as i32 + 1;
                let q = &q3[8 * ib..];
                let g = [0, 1, 2, 3].map(|l| {
                    pair(
                        IQ3XXS_GRID[q[2 * l] as usize],
                        IQ3XXS_GRID[q[2 * l + 1] as usize],
                    )
                });
                let s = [0, 1, 2, 3].map(|l| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize]);
                let [a, b] = I::dot32(g, s, &q8[32 * ib..]);
                bsum += (a + b) * ls;
            }
            sumf += d * bsum as f32;
        }
        0.25 * sumf
    }

    fn iq3_s<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d = f16_bits(u16_at(wb, 0)) * f32_at(xb, 0);
            let (qs, qh, signs) = (&wb[2..66], &wb[66..74], &wb[74..106]);
            let (scales, q8) = (&wb[106..110], &xb[4..4 + QK_K]);
            let mut bsum = 0i32;
            for ib in 0..QK_K / 32 {
                let ls = 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 15) as i32 + 1;
                let q = &qs[8 * ib..];
                let g = [0, 1, 2, 3].map(|l| {
                    pair(
                        IQ3S_GRID[iq3s_index(q[2 * l], qh[ib], 2 * l)],
                        IQ3S_GRID[iq3s_index(q[2 * l + 1], qh[ib], 2 * l + 1)],
                    )
                });
                let s = [0, 1, 2, 3].map(|l| signs[4 * ib + l]);
                let [a, b] = I::dot32(g, s, &q8[32 * ib..]);
                bsum += (a + b) * ls;
            }
            sumf += d * bsum as f32;
        }
        sumf
    }

    fn iq1_s<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let (qs, qh, q8) = (&wb[2..34], &wb[34..50], &xb[4..4 + QK_K]);
            let bsum = |j: usize| i16::from_le_bytes([xb[260 + 2 * j], xb[261 + 2 * j]]) as i32;
            let (mut sumi, mut sumi1) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let h = u16_at(qh, 2 * ib);
                let ls = 2 * ((h >> 12) & 7) as i32 + 1;
                let delta = if h & 0x8000 != 0 { -1 } else { 1 };
                let g = [0, 1, 2, 3].map(|l| IQ1S_GRID[iq1s_index(qs[4 * ib + l], h, l)]);
                let [a, b] = I::dot32(g, [0; 4], &q8[32 * ib..]);
                sumi += ls * (a + b);
                sumi1 += ls * delta * (bsum(2 * ib) + bsum(2 * ib + 1));
            }
            let s = sumi as f32 + IQ1_DELTA * sumi1 as f32;
            sumf += f16_bits(u16_at(wb, 0)) * f32_at(xb, 0) * s;
        }
        sumf
    }

    fn iq1_m<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let (qs, qh, sc, q8) = (&wb[0..32], &wb[32..48], &wb[48..56], &xb[4..4 + QK_K]);
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let qh = &qh[2 * ib..2 * ib + 2];
                let y = &q8[32 * ib..];
                let g = [0, 1, 2, 3].map(|l| IQ1S_GRID[iq1m_index(qs[4 * ib + l], qh, l)]);
                let sum1 = I::dot32(g, [0; 4], y);
                // the shift's sign per group of 8 (bit 3 or 7 of the group's qh nibble) times
                // the group's sum of activations
                let minus = [0, 1, 2, 3].map(|l| {
                    if qh[l / 2] & (8 << (4 * (l % 2))) != 0 {
                        0xff
                    } else {
                        0
                    }
                });
                let sum2 = I::dot32([ONES8; 4], minus, y);
                let s = u16_at(sc, 2 * (ib / 2)) >> (6 * (ib % 2));
                let ls1 = 2 * (s & 7) as i32 + 1;
                let ls2 = 2 * ((s >> 3) & 7) as i32 + 1;
                sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
                sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
            }
            let s = sumi1 as f32 + IQ1_DELTA * sumi2 as f32;
            sumf += f16_bits(iq1m_scale_bits(sc)) * f32_at(xb, 0) * s;
        }
        sumf
    }
}

// The `unsafe` blocks around register arithmetic date from a minimum Rust version (1.85)
// before intrinsics were safe inside `#[target_feature]` functions (1.87).
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
mod avx2 {
    //! Every kernel reads `nb` blocks behind its two pointers and nothing else; the callers
    //! guarantee they are there and that the CPU has AVX2, FMA and F16C.

    use std::arch::x86_64::*;

    // the helpers the integer kernels share
    use crate::ops::qdot::avx2::{f32_le, hsum, load256, mul_i8_pairs};

    use super::*;

    pub use crate::ops::qdot::avx2::available;

    /// ggml's `keven_signs_q2xs`: for each 7-bit sign index, 8 bytes of ±1 — byte j is -1 where
    /// bit j of the even-parity sign byte (`KSIGNS_IQ2XS`: the index plus a parity bit 7) is set.
    static KEVEN_SIGNS: [u64; 128] = {
        let mut t = [0u64; 128];
        let mut i = 0;
        while i < 128 {
            let signs = i | (((i as u32).count_ones() as usize & 1) << 7);
            let mut v = 0u64;
            let mut j = 0;
            while j < 8 {
                let byte: u64 = if signs & (1 << j) != 0 { 0xff } else { 0x01 };
                v |= byte << (8 * j);
                j += 1;
            }
            t[i] = v;
            i += 1;
        }
        t
    };

    /// `pdep`: the CPU has BMI2 and a fast `pdep` (the caller's choice; AMD's before Zen 3
    /// microcode it).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(t: DType, w: &[u8], x: &[u8], nb: usize, pdep: bool) -> f32 {
        // SAFETY: the caller guarantees nb blocks of both formats behind w and x, and the CPU
        // features every kernel is compiled for.
        unsafe { kernel(t, pdep)(w.as_ptr(), x.as_ptr(), nb) }
    }

    /// The kernel for `t` (one of [`supported`]).
    pub fn kernel(t: DType, pdep: bool) -> crate::ops::qdot::RowKernel {
        match t {
            DType::IQ3XXS => iq3_xxs,
            DType::IQ3S => iq3_s,
            DType::IQ1S if pdep => iq1_s_bmi2,
            DType::IQ1S => iq1_s,
            DType::IQ1M if pdep => iq1_m_bmi2,
            DType::IQ1M => iq1_m,
            _ => unreachable!("checked by the caller"),
        }
    }

    /// An f16 bit pattern as f32 (F16C, in registers).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16(bits: u16) -> f32 {
        // SAFETY: register arithmetic only; F16C is enabled.
        unsafe { crate::ops::qdot::avx2::f16_bits(bits) }
    }

    /// The little-endian u16 at `p`.
    #[inline]
    unsafe fn u16_le(p: *const u8) -> u16 {
        // SAFETY: two readable bytes at p (caller).
        unsafe { u16::from_le((p as *const u16).read_unaligned()) }
    }

    /// The little-endian u32 at `p`.
    #[inline]
    unsafe fn u32_le(p: *const u8) -> u32 {
        // SAFETY: four readable bytes at p (caller).
        unsafe { u32::from_le((p as *const u32).read_unaligned()) }
    }

    /// Eight iq3 grid points (4 magnitude bytes each), point j in 32-bit lane j.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn grid8x4(g: [u32; 8]) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let g = g.map(|v| v as i32);
            _mm256_set_epi32(g[7], g[6], g[5], g[4], g[3], g[2], g[1], g[0])
        }
    }

    /// Four iq1 grid points (8 bytes in -1..1 each), point j in 64-bit lane j.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn grid4x8(g: [u64; 4]) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe { _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64) }
    }

    /// iq3_xxs's signs of 32 elements: four 7-bit indices of `a` into ±1 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn even_signs(a: u32) -> __m256i {
        // SAFETY: register arithmetic only; the indices are masked to 0..128.
        unsafe {
            let s = |l: u32| KEVEN_SIGNS[((a >> (7 * l)) & 127) as usize] as i64;
            _mm256_set_epi64x(s(3), s(2), s(1), s(0))
        }
    }

    /// The 32 bits of `s` spread to 32 bytes, as ggml's iq3_s kernel does it (byte b takes
    /// byte b/8 of `s` by a shuffle, masks bit b%8 and compares): 0xFF where the bit is set, 0
    /// where not.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bit_mask(s: u32) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let mask1 = _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            );
            let mask2 = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let v = _mm256_shuffle_epi8(_mm256_set1_epi32(s as i32), mask1);
            _mm256_cmpeq_epi8(_mm256_and_si256(v, mask2), mask2)
        }
    }

    /// iq1_m's shift signs of a 32-element sub-block (its two qh bytes): per group of 8, bytes
    /// of -1 where the group's sign bit (bit 3 of its nibble) is set, of 1 where not.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq1m_deltas(b0: u8, b1: u8) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let s = |b: u8| {
                if b & 8 != 0 {
                    -1i64
                } else {
                    0x0101_0101_0101_0101
                }
            };
            _mm256_set_epi64x(s(b1 >> 4), s(b1), s(b0 >> 4), s(b0))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq3_xxs(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); table indices are masked to their sizes.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 98), x.add(i * Q8_K_SIZE));
                let d = f16(u16_le(wb)) * f32_le(xb);
                let (mut q3, mut gas, mut q8) = (wb.add(2), wb.add(66), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                // two 32-element sub-blocks per step, into separate sums
                for _ in 0..QK_K / 64 {
                    let y1 = load256(q8);
                    let y2 = load256(q8.add(32));
                    q8 = q8.add(64);
                    let g1 = grid8x4(std::array::from_fn(|j| IQ3XXS_GRID[*q3.add(j) as usize]));
                    let g2 = grid8x4(std::array::from_fn(|j| {
                        IQ3XXS_GRID[*q3.add(8 + j) as usize]
                    }));
                    q3 = q3.add(16);
                    let (a1, a2) = (u32_le(gas), u32_le(gas.add(4)));
                    gas = gas.add(8);
                    let dot1 = _mm256_maddubs_epi16(g1, _mm256_sign_epi8(y1, even_signs(a1)));
                    let dot2 = _mm256_maddubs_epi16(g2, _mm256_sign_epi8(y2, even_signs(a2)));
                    let ls1 = 2 * (a1 >> 28) as i16 + 1;
                    let ls2 = 2 * (a2 >> 28) as i16 + 1;
                    let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1));
                    let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2));
                    sumi1 = _mm256_add_epi32(sumi1, p1);
                    sumi2 = _mm256_add_epi32(sumi2, p2);
                }
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
            }
            0.25 * hsum(acc)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq3_s(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices are < 512.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 110), x.add(i * Q8_K_SIZE));
                let d = f16(u16_le(wb)) * f32_le(xb);
                let (mut qs, qh, mut signs, mut q8) =
                    (wb.add(2), wb.add(66), wb.add(74), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for ib in (0..QK_K / 32).step_by(2) {
                    let y1 = load256(q8);
                    let y2 = load256(q8.add(32));
                    q8 = q8.add(64);
                    let (h1, h2) = (*qh.add(ib), *qh.add(ib + 1));
                    let g1 = grid8x4(std::array::from_fn(|j| {
                        IQ3S_GRID[iq3s_index(*qs.add(j), h1, j)]
                    }));
                    let g2 = grid8x4(std::array::from_fn(|j| {
                        IQ3S_GRID[iq3s_index(*qs.add(8 + j), h2, j)]
                    }));
                    qs = qs.add(16);
                    let s1 = bit_mask(u32_le(signs));
                    let s2 = bit_mask(u32_le(signs.add(4)));
                    signs = signs.add(8);
                    let y1 = _mm256_sub_epi8(_mm256_xor_si256(s1, y1), s1);
                    let y2 = _mm256_sub_epi8(_mm256_xor_si256(s2, y2), s2);
                    let dot1 = _mm256_maddubs_epi16(g1, y1);
                    let dot2 = _mm256_maddubs_epi16(g2, y2);
                    let sc = *wb.add(106 + ib / 2) as i16;
                    let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(2 * (sc & 15) + 1));
                    let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(2 * (sc >> 4) + 1));
                    sumi1 = _mm256_add_epi32(sumi1, p1);
                    sumi2 = _mm256_add_epi32(sumi2, p2);
                }
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
            }
            hsum(acc)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq1_s(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: as `iq1_s_body` (the caller's guarantees).
        unsafe { iq1_s_body::<false>(w, x, nb) }
    }

    #[target_feature(enable = "avx2,fma,f16c,bmi2")]
    unsafe fn iq1_s_bmi2(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: as `iq1_s_body`; the caller checked BMI2.
        unsafe { iq1_s_body::<true>(w, x, nb) }
    }

    /// The 8 i32 lanes of `v` summed (exact: the callers' sums are far from overflowing).
    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: register arithmetic only (AVX2 is enabled in every caller).
        unsafe {
            let r = _mm_add_epi32(_mm256_extracti128_si256::<1>(v), _mm256_castsi256_si128(v));
            let r = _mm_add_epi32(r, _mm_shuffle_epi32::<0x4e>(r));
            _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32::<0xb1>(r)))
        }
    }

    /// Four iq1 grid points whose indices are the four 16-bit words of `p`.
    ///
    /// Safety: every word of `p` is below 2048 (the callers deposit 8 + 3 or 8 + 3 of 4 bits).
    #[inline(always)]
    unsafe fn grid_words(p: u64) -> __m256i {
        // SAFETY: each word is < 2048 = IQ1S_GRID.len() (caller); no mask, so that each index
        // is one `movzwl` (or a shift) as in ggml's kernel.
        let g =
            |j: u32| unsafe { *IQ1S_GRID.get_unchecked((p >> (16 * j)) as u16 as usize) as i64 };
        // SAFETY: register arithmetic only (AVX2 is enabled in every caller).
        unsafe { _mm256_set_epi64x(g(3), g(2), g(1), g(0)) }
    }

    /// `vpshufb` rows: row j repeats 16-bit word j of each 128-bit half.
    static WORD_SHUF: [[u8; 32]; 8] = {
        let mut t = [[0u8; 32]; 8];
        let mut j = 0;
        while j < 8 {
            let mut b = 0;
            while b < 32 {
                t[j][b] = (2 * j + b % 2) as u8;
                b += 1;
            }
            j += 1;
        }
        t
    };

    /// [`WORD_SHUF`] behind a pointer the compiler cannot see through: given the constants it
    /// turns each one-instruction `vpshufb` into two shuffles (`vpshuflw`/`vpshufhw` and
    /// `vpshufd`), as in `qdot`'s k-quant kernels.
    #[inline(always)]
    fn word_shuf() -> *const u8 {
        std::hint::black_box(WORD_SHUF.as_ptr() as *const u8)
    }

    /// ggml's AVX2 iq1_s kernel, with the same 32-bit lanes and float steps (so its bits), in
    /// fewer instructions:
    /// - the shift term Σ ±ls·(the sub-block's two q8 sums) is one `vpmaddwd` of the block's 16
    ///   q8 sums against the signed scales (each lane one sub-block's two products), summed
    ///   across lanes once a block: the same exact integer ggml sums in scalar registers;
    /// - each sub-block's scale is shuffled out of a register of the block's eight scales;
    /// - with `PDEP` (BMI2, as ggml's `__BMI2__` path) the four 11-bit grid indices of a
    ///   sub-block are deposited as four 16-bit words with two `pdep`; without it they are
    ///   assembled one by one;
    /// - the four pairs of sub-blocks of a block are unrolled.
    #[inline(always)]
    unsafe fn iq1_s_body<const PDEP: bool>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices are < 2048, shuffle indices
        // < 16; BMI2 where PDEP (caller).
        unsafe {
            let one16 = _mm_set1_epi16(1);
            let e16 = _mm_set1_epi16(0xe);
            let shuf = word_shuf();
            let mut acc = _mm256_setzero_ps();
            let mut acc1 = 0f32;
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 50), x.add(i * Q8_K_SIZE));
                let (qs, qh, q8) = (wb.add(2), wb.add(34), xb.add(4));
                let h = _mm_loadu_si128(qh as *const __m128i);
                // 2·((qh >> 12) & 7) + 1, and the same negated where bit 15 is set
                let ls = _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<11>(h), e16), one16);
                let sls = _mm_sign_epi16(ls, _mm_or_si128(h, one16));
                let sls =
                    _mm256_set_m128i(_mm_unpackhi_epi16(sls, sls), _mm_unpacklo_epi16(sls, sls));
                let bsums = load256(xb.add(4 + QK_K));
                let sumi1 = hsum_i32(_mm256_madd_epi16(bsums, sls));
                let ls = _mm256_set_m128i(ls, ls);
                let mut sumi = _mm256_setzero_si256();
                macro_rules! pair {
                    ($ib:expr) => {{
                        let (h1, h2) = (u16_le(qh.add(2 * $ib)), u16_le(qh.add(2 * $ib + 2)));
                        let (g1, g2) = if PDEP {
                            let q = (qs.add(4 * $ib) as *const u64).read_unaligned();
                            let lo = 0x00ff_00ff_00ff_00ff;
                            let hi = 0x0700_0700_0700_0700;
                            (
                                grid_words(_pdep_u64(q, lo) | _pdep_u64(h1 as u64, hi)),
                                grid_words(_pdep_u64(q >> 32, lo) | _pdep_u64(h2 as u64, hi)),
                            )
                        } else {
                            (
                                grid4x8(std::array::from_fn(|l| {
                                    IQ1S_GRID[iq1s_index(*qs.add(4 * $ib + l), h1, l)]
                                })),
                                grid4x8(std::array::from_fn(|l| {
                                    IQ1S_GRID[iq1s_index(*qs.add(4 * $ib + 4 + l), h2, l)]
                                })),
                            )
                        };
                        let dot1 = mul_i8_pairs(g1, load256(q8.add(32 * $ib)));
                        let dot2 = mul_i8_pairs(g2, load256(q8.add(32 * $ib + 32)));
                        let s1 = _mm256_shuffle_epi8(ls, load256(shuf.add(32 * $ib)));
                        let s2 = _mm256_shuffle_epi8(ls, load256(shuf.add(32 * $ib + 32)));
                        let p1 = _mm256_madd_epi16(dot1, s1);
                        let p2 = _mm256_madd_epi16(dot2, s2);
                        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
                    }};
                }
                pair!(0);
                pair!(2);
                pair!(4);
                pair!(6);
                let d = f32_le(xb) * f16(u16_le(wb));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
                // gcc fuses ggml's `accum1 += d * sumi1`
                acc1 = d.mul_add(sumi1 as f32, acc1);
            }
            // ... but not the final `hsum + IQ1S_DELTA * accum1`
            hsum(acc) + IQ1_DELTA * acc1
        }
    }

    /// iq1_m's block scales from its 8 scale bytes at `sc`: the f16 super-scale, and the sixteen
    /// 3-bit scales as 2s + 1 in 16-bit words — words 0-3 of the low half the first scales of
    /// sub-blocks 0-3 (word j: sub-block j), words 4-7 their second; the high half the same
    /// for sub-blocks 4-7 (ggml's `scales_shift` of 0, 6 | 3, 9).
    #[inline(always)]
    unsafe fn iq1m_block_scales(sc: *const u8) -> (f32, __m256i) {
        // SAFETY: 8 readable bytes at sc (caller); register arithmetic; AVX2 and F16C are
        // enabled in every caller.
        unsafe {
            let scale = f16(iq1m_scale_bits(std::slice::from_raw_parts(sc, 8)));
            let sc64 = (sc as *const i64).read_unaligned();
            let shift = _mm256_set_epi64x(9, 3, 6, 0);
            let scales = _mm256_srlv_epi64(_mm256_set1_epi64x(sc64), shift);
            let scales = _mm256_and_si256(scales, _mm256_set1_epi16(7));
            let scales = _mm256_add_epi16(_mm256_slli_epi16::<1>(scales), _mm256_set1_epi16(1));
            (scale, scales)
        }
    }

    /// Two iq1_m sub-blocks (grid points `g`, shift signs `delta`, activations `y`, scales
    /// `scale` repeated per 16 elements): ggml's two lane sums, Σ scale·g·y and Σ scale·δ·y.
    #[inline(always)]
    unsafe fn iq1m_pair(
        g: [__m256i; 2],
        delta: [__m256i; 2],
        y: [__m256i; 2],
        scale: [__m256i; 2],
    ) -> (__m256i, __m256i) {
        // SAFETY: register arithmetic only (AVX2 is enabled in every caller).
        unsafe {
            let mone8 = _mm256_set1_epi8(1);
            let p1 = _mm256_madd_epi16(mul_i8_pairs(g[0], y[0]), scale[0]);
            let p2 = _mm256_madd_epi16(mul_i8_pairs(g[1], y[1]), scale[1]);
            let dot3 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(y[0], delta[0]));
            let dot4 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(y[1], delta[1]));
            let p3 = _mm256_madd_epi16(dot3, scale[0]);
            let p4 = _mm256_madd_epi16(dot4, scale[1]);
            (_mm256_add_epi32(p1, p2), _mm256_add_epi32(p3, p4))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq1_m(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices are < 2048, shuffle indices
        // < 16.
        unsafe {
            let mtwo8 = _mm256_set1_epi8(2);
            let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 56), x.add(i * Q8_K_SIZE));
                let (mut qs, mut qh, sc, mut q8) = (wb, wb.add(32), wb.add(48), xb.add(4));
                let (scale, scales) = iq1m_block_scales(sc);
                // 16-bit word it (then 4 + it) of each half, repeated
                let mut idx1 = _mm256_set1_epi16(0x0100);
                let mut idx2 = _mm256_add_epi8(idx1, _mm256_set1_epi8(8));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for _ in 0..QK_K / 64 {
                    let qh4 = std::slice::from_raw_parts(qh, 4);
                    let g1 = grid4x8(std::array::from_fn(|l| {
                        IQ1S_GRID[iq1m_index(*qs.add(l), &qh4[..2], l)]
                    }));
                    let g2 = grid4x8(std::array::from_fn(|l| {
                        IQ1S_GRID[iq1m_index(*qs.add(4 + l), &qh4[2..], l)]
                    }));
                    let (delta1, delta2) = (
                        iq1m_deltas(*qh, *qh.add(1)),
                        iq1m_deltas(*qh.add(2), *qh.add(3)),
                    );
                    let y1 = load256(q8);
                    let y2 = load256(q8.add(32));
                    q8 = q8.add(64);
                    let scale1 = _mm256_shuffle_epi8(scales, idx1);
                    let scale2 = _mm256_shuffle_epi8(scales, idx2);
                    idx1 = _mm256_add_epi8(idx1, mtwo8);
                    idx2 = _mm256_add_epi8(idx2, mtwo8);
                    let (s1, s2) =
                        iq1m_pair([g1, g2], [delta1, delta2], [y1, y2], [scale1, scale2]);
                    sumi1 = _mm256_add_epi32(sumi1, s1);
                    sumi2 = _mm256_add_epi32(sumi2, s2);
                    qs = qs.add(8);
                    qh = qh.add(4);
                }
                let d = _mm256_set1_ps(f32_le(xb) * scale);
                acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc1);
                acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc2);
            }
            // gcc fuses ggml's final `hsum1 + IQ1M_DELTA * hsum2` (the same value unless the
            // product underflows: it is exact otherwise)
            hsum(acc2).mul_add(IQ1_DELTA, hsum(acc1))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,bmi2")]
    unsafe fn iq1_m_bmi2(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: as `iq1_m_pdep`; the caller checked BMI2.
        unsafe { iq1_m_pdep(w, x, nb) }
    }

    /// ggml's AVX2 iq1_m kernel with its `__BMI2__` index path (its lanes and float steps, so
    /// its bits): the grid indices and the shift signs deposited with `pdep`, the four pairs of
    /// sub-blocks of a block unrolled, the scales shuffled with one `vpshufb` each. (`iq1_m`
    /// without BMI2 keeps its loop: unrolled, its indices assembled one by one spill.)
    #[inline(always)]
    unsafe fn iq1_m_pdep(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices are < 2048, shuffle indices
        // < 16; BMI2 (caller).
        unsafe {
            let mone8 = _mm256_set1_epi8(1);
            let shuf = word_shuf();
            let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 56), x.add(i * Q8_K_SIZE));
                let (qs, qh, sc, q8) = (wb, wb.add(32), wb.add(48), xb.add(4));
                let (scale, scales) = iq1m_block_scales(sc);
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                macro_rules! pair {
                    ($it:expr) => {{
                        let (g1, g2, delta1, delta2) = {
                            let q = (qs.add(8 * $it) as *const u64).read_unaligned();
                            let h = u32_le(qh.add(4 * $it)) as u64;
                            let lo = 0x00ff_00ff_00ff_00ff;
                            let hi = 0x0f00_0f00_0f00_0f00;
                            let sign = _pdep_u64(h & 0x8888_8888, 0xf0f0_f0f0_f0f0_f0f0);
                            let spread = |s: u64| {
                                _mm256_or_si256(
                                    mone8,
                                    _mm256_cvtepi8_epi64(_mm_set1_epi32(s as u32 as i32)),
                                )
                            };
                            (
                                grid_words(_pdep_u64(q, lo) | _pdep_u64(h & 0x7777, hi)),
                                grid_words(
                                    _pdep_u64(q >> 32, lo) | _pdep_u64((h >> 16) & 0x7777, hi),
                                ),
                                spread(sign),
                                spread(sign >> 32),
                            )
                        };
                        let y1 = load256(q8.add(64 * $it));
                        let y2 = load256(q8.add(64 * $it + 32));
                        // the sub-blocks' scales: words it and 4 + it of each half
                        let scale1 = _mm256_shuffle_epi8(scales, load256(shuf.add(32 * $it)));
                        let scale2 = _mm256_shuffle_epi8(scales, load256(shuf.add(128 + 32 * $it)));
                        let (s1, s2) =
                            iq1m_pair([g1, g2], [delta1, delta2], [y1, y2], [scale1, scale2]);
                        sumi1 = _mm256_add_epi32(sumi1, s1);
                        sumi2 = _mm256_add_epi32(sumi2, s2);
                    }};
                }
                pair!(0);
                pair!(1);
                pair!(2);
                pair!(3);
                let d = _mm256_set1_ps(f32_le(xb) * scale);
                acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc1);
                acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc2);
            }
            // gcc fuses ggml's final `hsum1 + IQ1M_DELTA * hsum2` (the same value unless the
            // product underflows: it is exact otherwise)
            hsum(acc2).mul_add(IQ1_DELTA, hsum(acc1))
        }
    }
}
