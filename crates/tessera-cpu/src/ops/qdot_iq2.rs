//! Integer dot products of the 2-bit lattice i-quants (iq2_xxs, iq2_xs, iq2_s) with q8_K
//! activations, as ggml's CPU backend computes them (`ggml_vec_dot_iq2_*_q8_K`); see `qdot`.
//!
//! Each weight group of 8 is a point of a lattice grid (bytes 8, 25 or 43 per element, as one
//! little-endian u64 per point), signed by an 8-bit pattern, and scaled by an odd sub-block
//! scale 2s+1 (per 32 elements for iq2_xxs, per 16 for iq2_xs and iq2_s); the block's f16 `d`
//! times q8_K's `d` times 1/8 makes it a float. The integer sum of a block is exact either way,
//! so the two paths differ only in how they group it into floats:
//! - scalar: ggml's generic code (`ggml-cpu/quants.c`): one integer sum per block, `sumf += d ·
//!   bsum` with no fused multiply-add (the C source's order with `-ffp-contract=off`), then
//!   `0.125 · sumf`;
//! - AVX2 (`Isa::Avx2`, `Isa::AvxVnni` and `Isa::Avx512`): ggml's AVX2 kernels (`ggml-cpu/arch/x86/quants.c`):
//!   eight 32-bit lanes per block, lane n holding elements 4n..4n+4 of every 32-element
//!   sub-block (what `maddubs` + `madd` make of them), one FMA of `d` into eight float lanes
//!   per block, ggml's `hsum_float_8` and `0.125 ·` at the end. The result equals that of
//!   llama.cpp built for an AVX2 machine (checked against its `libggml-cpu` in
//!   `tests/qdot_iq2.rs`).
//!
//! ggml negates activations in 8 bits in the AVX2 kernels, which would wrap for -128; q8_K
//! never holds -128 (its quantizer clamps to ±127), so both paths agree on every real row.

use tessera::DType;
use tessera_quants::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};

use crate::ops::qdot::{IntSums, ScalarSums};
use crate::simd::Isa;

const QK_K: usize = 256;
/// Bytes of one q8_K block: f32 d, 256 quants, 16 i16 group sums.
const Q8_K_SIZE: usize = 4 + QK_K + 2 * (QK_K / 16);
/// Bytes of one weight block of each type (read by the AVX2 kernels).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const IQ2XXS_SIZE: usize = 2 + QK_K / 4;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const IQ2XS_SIZE: usize = 2 + QK_K / 4 + QK_K / 32;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const IQ2S_SIZE: usize = 2 + QK_K / 4 + QK_K / 16;

/// Weight types with an integer kernel here.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::IQ2XXS | DType::IQ2XS | DType::IQ2S)
}

/// The AVX2 kernel [`vec_dot`] runs for `t` on `isa`, for callers that loop over rows; `None`
/// where `vec_dot` takes another path.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_kernel(isa: Isa, t: DType) -> Option<crate::ops::qdot::RowKernel> {
    (supported(t) && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available())
        .then(|| avx2::kernel(t))
}

/// Dot of `nb` blocks of weight type `t` with `nb` blocks of q8_K. The caller (`qdot::vec_dot`)
/// has checked that both rows hold `nb` whole blocks.
pub fn vec_dot(isa: Isa, t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    assert!(supported(t), "qdot_iq2: no integer kernel for {t}");
    let ts = t.type_size();
    assert!(
        w.len() >= nb * ts && x.len() >= nb * Q8_K_SIZE,
        "qdot_iq2: rows of {} and {} bytes for {nb} blocks of {t}",
        w.len(),
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); w and x hold at least nb
        // blocks of their formats (asserted above), which is all the kernels read.
        return unsafe { avx2::vec_dot(t, w, x, nb) };
    }
    let blocks = w[..nb * ts]
        .chunks_exact(ts)
        .zip(x[..nb * Q8_K_SIZE].chunks_exact(Q8_K_SIZE));
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        return 0.125 * scalar::sums::<super::qdot_neon::NeonSums>(t, blocks);
    }
    let _ = isa;
    0.125 * scalar::sums::<ScalarSums>(t, blocks)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u16_at(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// ggml's generic kernels: one exact integer sum per block.
mod scalar {
    use super::*;

    type Blocks<'a> =
        std::iter::Zip<std::slice::ChunksExact<'a, u8>, std::slice::ChunksExact<'a, u8>>;

    /// The generic kernel of `t` with the integer sums of `I`.
    pub fn sums<I: IntSums>(t: DType, blocks: Blocks) -> f32 {
        match t {
            DType::IQ2XXS => sum(blocks, iq2_xxs::<I>),
            DType::IQ2XS => sum(blocks, iq2_xs::<I>),
            _ => sum(blocks, iq2_s::<I>),
        }
    }

    /// `Σ d·bsum` over the blocks in order, d = f16 d · q8_K's d (ggml's `sumf`, before the
    /// final 1/8).
    pub fn sum(blocks: Blocks, bsum: fn(&[u8], &[u8]) -> i32) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d = f16_at(wb, 0) * f32_at(xb, 0);
            sumf += d * bsum(wb, &xb[4..4 + QK_K]) as f32;
        }
        sumf
    }

    /// Per 32 elements two words: four grid indices (bytes), then four 7-bit sign indices
    /// and the 4-bit scale on top.
    pub fn iq2_xxs<I: IntSums>(wb: &[u8], q8: &[u8]) -> i32 {
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let (grids, signs) = (u32_at(wb, 2 + 8 * ib), u32_at(wb, 6 + 8 * ib));
            let g = [0, 1, 2, 3].map(|l| IQ2XXS_GRID[((grids >> (8 * l)) & 255) as usize]);
            let s = [0, 1, 2, 3].map(|l| KSIGNS_IQ2XS[((signs >> (7 * l)) & 127) as usize]);
            let [a, b] = I::dot32(g, s, &q8[32 * ib..]);
            bsum += (a + b) * (2 * (signs >> 28) as i32 + 1);
        }
        bsum
    }

    /// Per group of 8 one u16: a 9-bit grid index and a 7-bit sign index; per 32 elements a
    /// byte of two 4-bit scales (elements 0..16, 16..32).
    pub fn iq2_xs<I: IntSums>(wb: &[u8], q8: &[u8]) -> i32 {
        let sc = &wb[2 + QK_K / 4..];
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let q2 = [0, 1, 2, 3].map(|l| u16_at(wb, 2 + 8 * ib + 2 * l));
            let g = q2.map(|q| IQ2XS_GRID[(q & 511) as usize]);
            let s = q2.map(|q| KSIGNS_IQ2XS[(q >> 9) as usize]);
            let [a, b] = I::dot32(g, s, &q8[32 * ib..]);
            let ls = |half: usize| 2 * ((sc[ib] >> (4 * half)) & 15) as i32 + 1;
            bsum += a * ls(0) + b * ls(1);
        }
        bsum
    }

    /// 32 bytes of grid indices' low 8 bits, 32 sign bytes, 8 bytes of the indices' top two
    /// bits (2 per group), 8 bytes of two 4-bit scales (per 16 elements).
    pub fn iq2_s<I: IntSums>(wb: &[u8], q8: &[u8]) -> i32 {
        let (qs, signs) = (&wb[2..34], &wb[34..66]);
        let (qh, sc) = (&wb[66..74], &wb[74..82]);
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let g = [0, 1, 2, 3].map(|l| {
                IQ2S_GRID[qs[4 * ib + l] as usize | (((qh[ib] as usize) << (8 - 2 * l)) & 0x300)]
            });
            let s = [0, 1, 2, 3].map(|l| signs[4 * ib + l]);
            let [a, b] = I::dot32(g, s, &q8[32 * ib..]);
            let ls1 = 1 + 2 * (sc[ib] & 15) as i32;
            let ls2 = 1 + 2 * (sc[ib] >> 4) as i32;
            bsum += ls1 * a + ls2 * b;
        }
        bsum
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
    use crate::ops::qdot::avx2::{f16, f32_le, hsum, load128, load256};

    use super::*;

    pub use crate::ops::qdot::avx2::available;

    /// ggml's `keven_signs_q2xs`: sign index i (7 bits, the 8th making the count of minus
    /// signs even, as `KSIGNS_IQ2XS[i]`) as 8 bytes of +1 / -1.
    static KEVEN_SIGNS: [u64; 128] = {
        let mut t = [0u64; 128];
        let mut i = 0;
        while i < 128 {
            let bits = i as u32 | (((i as u32).count_ones() & 1) << 7);
            let mut v = 0u64;
            let mut j = 0;
            while j < 8 {
                let byte: u64 = if bits & (1 << j) != 0 { 0xff } else { 0x01 };
                v |= byte << (8 * j);
                j += 1;
            }
            t[i] = v;
            i += 1;
        }
        t
    };

    /// `get_scale_shuffle`: row i spreads byte 2i over bytes 0..8 and byte 2i+1 over 8..16.
    static SHUF_SCALE: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 16 {
                t[i][b] = (2 * i + b / 8) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// `get_scale_shuffle_k4`: row i broadcasts 16-bit element i of each 128-bit half.
    static SHUF_K4: [[u8; 32]; 8] = {
        let mut t = [[0u8; 32]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 32 {
                t[i][b] = (2 * i + b % 2) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// Bit j of a byte for byte j (mod 8) of 32: the bit each sign byte is tested against.
    static BIT_SELECT: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut b = 0;
        while b < 32 {
            t[b] = 1 << (b % 8);
            b += 1;
        }
        t
    };

    /// iq2_xs: the sign word's bytes 0, 2 (first half) and 4, 6 (second half), each spread
    /// over 8 bytes; the second row does the same for bytes 8..16.
    static SIGN_SPREAD: [[u8; 32]; 2] = {
        let mut t = [[0u8; 32]; 2];
        let mut r = 0;
        while r < 2 {
            let mut b = 0;
            while b < 32 {
                t[r][b] = (8 * r + 2 * (b / 8)) as u8;
                b += 1;
            }
            r += 1;
        }
        t
    };

    /// iq2_s: byte b/8 of a 32-bit word for byte b.
    static BYTE_SPREAD: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut b = 0;
        while b < 32 {
            t[b] = (b / 8) as u8;
            b += 1;
        }
        t
    };

    /// ggml's `k_bit_helper`: 0x80 where the 4-bit index has odd parity (the 8th sign bit).
    static PARITY_BIT: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut b = 0;
        while b < 32 {
            t[b] = if (b % 16).count_ones() % 2 == 1 {
                0x80
            } else {
                0
            };
            b += 1;
        }
        t
    };

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        // SAFETY: the caller guarantees nb blocks of both formats behind w and x, and the CPU
        // features every kernel is compiled for.
        unsafe { kernel(t)(w.as_ptr(), x.as_ptr(), nb) }
    }

    /// The kernel for `t` (one of [`supported`]).
    pub fn kernel(t: DType) -> crate::ops::qdot::RowKernel {
        match t {
            DType::IQ2XXS => iq2_xxs,
            DType::IQ2XS => iq2_xs,
            DType::IQ2S => iq2_s,
            _ => unreachable!("checked by the caller"),
        }
    }

    /// Four u64 table entries as one vector, the first in the lowest lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn four(a: u64, b: u64, c: u64, d: u64) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe { _mm256_set_epi64x(d as i64, c as i64, b as i64, a as i64) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq2_xxs(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); every table index is masked to its
        // table's length (8-bit grid indices into 256 entries, 7-bit sign indices into 128).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * IQ2XXS_SIZE), x.add(i * Q8_K_SIZE));
                let d = f16(wb) * f32_le(xb);
                let (mut q2, mut q8) = (wb.add(2), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                // two 32-element sub-blocks per step, into separate sums
                for _ in 0..QK_K / 64 {
                    let y1 = load256(q8);
                    let y2 = load256(q8.add(32));
                    q8 = q8.add(64);
                    let g = |j: usize| IQ2XXS_GRID[*q2.add(j) as usize];
                    let (s1, s2) = (
                        (q2.add(4) as *const u32).read_unaligned(),
                        (q2.add(12) as *const u32).read_unaligned(),
                    );
                    let sg = |s: u32, l: u32| KEVEN_SIGNS[((s >> (7 * l)) & 127) as usize];
                    let w1 = four(g(0), g(1), g(2), g(3));
                    let w2 = four(g(8), g(9), g(10), g(11));
                    let sign1 = four(sg(s1, 0), sg(s1, 1), sg(s1, 2), sg(s1, 3));
                    let sign2 = four(sg(s2, 0), sg(s2, 1), sg(s2, 2), sg(s2, 3));
                    q2 = q2.add(16);
                    let dot1 = _mm256_maddubs_epi16(w1, _mm256_sign_epi8(y1, sign1));
                    let dot2 = _mm256_maddubs_epi16(w2, _mm256_sign_epi8(y2, sign2));
                    let ls1 = 2 * (s1 >> 28) as i16 + 1;
                    let ls2 = 2 * (s2 >> 28) as i16 + 1;
                    let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1));
                    let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2));
                    sumi1 = _mm256_add_epi32(sumi1, p1);
                    sumi2 = _mm256_add_epi32(sumi2, p2);
                }
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
            }
            0.125 * hsum(acc)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq2_xs(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices are masked to 9 bits (512
        // entries); the shuffle tables index within 16 bytes.
        unsafe {
            let mone = _mm256_set1_epi8(1);
            let m4 = _mm_set1_epi8(15);
            let bit_select = load256(BIT_SELECT.as_ptr());
            let spread1 = load256(SIGN_SPREAD[0].as_ptr());
            let spread2 = load256(SIGN_SPREAD[1].as_ptr());
            let parity = load256(PARITY_BIT.as_ptr());
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * IQ2XS_SIZE), x.add(i * Q8_K_SIZE));
                let d = f16(wb) * f32_le(xb);
                // the 16 scales 2s+1 in order: low then high nibble of each byte
                let sc = _mm_set1_epi64x((wb.add(2 + QK_K / 4) as *const i64).read_unaligned());
                let sc = _mm_unpacklo_epi8(
                    _mm_and_si128(sc, m4),
                    _mm_and_si128(_mm_srli_epi16::<4>(sc), m4),
                );
                let scales = _mm_add_epi8(_mm_slli_epi16::<1>(sc), _mm_set1_epi8(1));
                let (mut q2, mut q8) = (wb.add(2), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                // four 32-element sub-blocks per step, alternately into two sums
                for step in 0..QK_K / 128 {
                    let q2v = load256(q2);
                    // the 7 stored sign bits of each group, and the 8th (their parity) on top
                    let bits7 = _mm256_srli_epi16::<9>(q2v);
                    let folded = _mm256_xor_si256(bits7, _mm256_srli_epi16::<13>(q2v));
                    let signs = _mm256_or_si256(bits7, _mm256_shuffle_epi8(parity, folded));
                    let halves = [
                        _mm256_broadcastsi128_si256(_mm256_castsi256_si128(signs)),
                        _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(signs)),
                    ];
                    // the grid indices from one u64 load per group of four, taken apart by
                    // shifts: from u16 loads LLVM's vectorizer made a vector load, a mask and
                    // four `vpextrw` (two uops each, one on the shuffle port) per group, 18 %
                    // slower (4096x4096 mat-vec, this loop behind ggml's 0.89x, ahead 1.09x)
                    let g = |a: u64, j: u32| IQ2XS_GRID[((a >> (16 * j)) & 511) as usize];
                    let mut dots = [_mm256_setzero_si256(); 4];
                    for (s, dot) in dots.iter_mut().enumerate() {
                        let a = (q2.add(8 * s) as *const u64).read_unaligned();
                        let grid = four(g(a, 0), g(a, 1), g(a, 2), g(a, 3));
                        let spread = if s % 2 == 0 { spread1 } else { spread2 };
                        let sb = _mm256_shuffle_epi8(halves[s / 2], spread);
                        let neg = _mm256_cmpeq_epi8(_mm256_and_si256(sb, bit_select), bit_select);
                        let y =
                            _mm256_sign_epi8(load256(q8.add(32 * s)), _mm256_or_si256(neg, mone));
                        *dot = _mm256_maddubs_epi16(grid, y);
                    }
                    q2 = q2.add(32);
                    q8 = q8.add(128);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for (s, v) in p.iter_mut().enumerate() {
                        let row = load128(SHUF_SCALE[4 * step + s].as_ptr());
                        let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, row));
                        *v = _mm256_madd_epi16(dots[s], scale);
                    }
                    sumi1 = _mm256_add_epi32(sumi1, p[0]);
                    sumi2 = _mm256_add_epi32(sumi2, p[1]);
                    sumi1 = _mm256_add_epi32(sumi1, p[2]);
                    sumi2 = _mm256_add_epi32(sumi2, p[3]);
                }
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
            }
            0.125 * hsum(acc)
        }
    }

    /// iq2_s: `y` with byte e negated where bit e % 8 of sign byte e / 8 at `p` is set (ggml's
    /// `y ^ m - m` with m = -1 there), `spread` and `bit_select` being [`BYTE_SPREAD`] and
    /// [`BIT_SELECT`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn apply_signs(
        p: *const u8,
        y: __m256i,
        spread: __m256i,
        bit_select: __m256i,
    ) -> __m256i {
        // SAFETY: four readable bytes at p (caller).
        unsafe {
            let s = _mm256_set1_epi32((p as *const i32).read_unaligned());
            let s = _mm256_and_si256(_mm256_shuffle_epi8(s, spread), bit_select);
            let m = _mm256_cmpeq_epi8(s, bit_select);
            _mm256_sub_epi8(_mm256_xor_si256(m, y), m)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq2_s(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); grid indices have 10 bits (1024 entries).
        unsafe {
            let m4 = _mm_set1_epi8(15);
            let spread = load256(BYTE_SPREAD.as_ptr());
            let bit_select = load256(BIT_SELECT.as_ptr());
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * IQ2S_SIZE), x.add(i * Q8_K_SIZE));
                let d = f16(wb) * f32_le(xb);
                let (qh, sc) = (wb.add(66), wb.add(74));
                // 2s+1 of the low nibbles (first halves) in 16-bit lanes 0..8, the high
                // nibbles (second halves) in 8..16
                let s64 = (sc as *const u64).read_unaligned();
                let sc8 = _mm_and_si128(_mm_set_epi64x((s64 >> 4) as i64, s64 as i64), m4);
                let sc8 = _mm_add_epi8(_mm_slli_epi16::<1>(sc8), _mm_set1_epi8(1));
                let scales16 = _mm256_cvtepi8_epi16(sc8);
                let (mut qs, mut signs, mut q8) = (wb.add(2), wb.add(34), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                // two 32-element sub-blocks per step, into separate sums
                for ib in (0..QK_K / 32).step_by(2) {
                    let y1 = load256(q8);
                    let y2 = load256(q8.add(32));
                    q8 = q8.add(64);
                    let g = |l: usize, h: u8| {
                        let hi = ((h as usize) << (8 - 2 * (l % 4))) & 0x300;
                        IQ2S_GRID[*qs.add(l) as usize | hi]
                    };
                    let (h1, h2) = (*qh.add(ib), *qh.add(ib + 1));
                    let w1 = four(g(0, h1), g(1, h1), g(2, h1), g(3, h1));
                    let w2 = four(g(4, h2), g(5, h2), g(6, h2), g(7, h2));
                    qs = qs.add(8);
                    let ys1 = apply_signs(signs, y1, spread, bit_select);
                    let ys2 = apply_signs(signs.add(4), y2, spread, bit_select);
                    signs = signs.add(8);
                    let dot1 = _mm256_maddubs_epi16(w1, ys1);
                    let dot2 = _mm256_maddubs_epi16(w2, ys2);
                    // sub-block ib's two scales for dot1, ib+1's for dot2
                    let sc1 = _mm256_shuffle_epi8(scales16, load256(SHUF_K4[ib].as_ptr()));
                    let sc2 = _mm256_shuffle_epi8(scales16, load256(SHUF_K4[ib + 1].as_ptr()));
                    let p1 = _mm256_madd_epi16(dot1, sc1);
                    let p2 = _mm256_madd_epi16(dot2, sc2);
                    sumi1 = _mm256_add_epi32(sumi1, p1);
                    sumi2 = _mm256_add_epi32(sumi2, p2);
                }
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
            }
            0.125 * hsum(acc)
        }
    }
}
