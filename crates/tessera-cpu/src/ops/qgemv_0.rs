//! Mat-vec of q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs and the k-quants q2_K to q6_K on
//! AVX-512 VNNI: eight weight rows against one activation row (q8_0; q8_1 for q4_1 and q5_1,
//! q8_K for iq4_xs and the k-quants) per call, four rows to a 512-bit vector (q2_K and q3_K:
//! two).
//!
//! ggml's x86 `vec_dot` of these types gives each row eight f32 lanes, lane `l` summing
//! elements `4l..4l+3` of every 32-element block as an exact integer, converted and
//! fused-multiply-added with the block's scale product, the lanes summed at the end in
//! `hsum_float_8`'s order. Here a 128-bit lane of one vector holds lanes 0..4 of one row (the
//! block's first 16 elements, its low nibbles) and the same lane of a second vector holds
//! lanes 4..8 (its high nibbles), so four rows' blocks take two `vpdpbusd`, two conversions
//! and two FMAs where the 256-bit four-row kernels take eight of each. Every lane sees the
//! same integers and the same float operations in the same order as in `vec_dot`, and the
//! final sums are `hsum_float_8`'s, so each result is bit-identical to `vec_dot`'s (tests:
//! `matmul_quant`'s `eight_row_kernel_equals_vec_dot` and the mat-vec cases of
//! `tests/matmul_quant.rs`).
//!
//! The integers: q4_0's values n − 8 and the codebook values v of iq4_nl and iq4_xs are
//! signed, so the unsigned operand of `vpdpbusd` is n (or v + 128, a second codebook) and the
//! signed one the activations; each lane starts from −8·Σy (−128·Σy), computed once per block
//! for all eight rows. q4_1's codes are unsigned already. q4_0 and q4_1 take their high
//! nibbles in place, as 16·n (one mask, no shift): those lanes see 16 times ggml's integers
//! and floats, exactly, until one exact multiplication by 1/16 before the sum (`unscale16`).

use std::arch::x86_64::*;

use tessera::DType;

use super::qdot::avx2::f16;
use super::qdot::KVALUES_IQ4NL;
use super::qdot_fp::KVALUES_FP4;

/// Whether the CPU has AVX-512 VBMI (asked once): the iq4_xs kernel then looks its codes up
/// with `vpermb` (no masking of the nibbles), 8-10 % faster on Zen 4 with the weights in cache.
pub fn vbmi() -> bool {
    static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI.get_or_init(|| is_x86_feature_detected!("avx512vbmi"))
}

/// Whether this CPU has GFNI (asked once): q5_K's eight-row kernel then takes each code's
/// fifth bit and the high nibbles with `vgf2p8affineqb`, a bit matrix applied to every byte,
/// and q6_K's its two high bits.
/// `TESSERA_NO_GFNI=1` says no whatever the CPU: the Bochs emulator that runs the AVX-512
/// tests here (`dev/test-avx512.sh`) reports GFNI but returns the complement of every
/// `vgf2p8affineqb` result (0xf5 for 0x0a; the Zen 4 gives Intel's definition).
pub fn gfni() -> bool {
    static GFNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GFNI.get_or_init(|| {
        is_x86_feature_detected!("gfni")
            && std::env::var("TESSERA_NO_GFNI").map_or(true, |v| v != "1")
    })
}

/// [`vec_dot8`] of eight q5_K rows with the kernel for CPUs without GFNI, whatever this CPU
/// has (for the tests: both forms against `vec_dot`).
///
/// # Safety
/// As [`vec_dot8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q5_k8_without_gfni(w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks behind every pointer).
    unsafe { q4_k_rows::<true, false, false>(w.map(|r| r.as_ptr()), x.as_ptr(), k / 256) }
}

/// [`vec_dot8_interleaved`] of a group of eight q5_K rows with the kernel for CPUs without
/// GFNI, whatever this CPU has (for the tests).
///
/// # Safety
/// As [`vec_dot8_interleaved`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q5_k8_interleaved_without_gfni(g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks of the group at g).
    unsafe { q4_k_rows::<true, false, true>(group_rows(g.as_ptr(), 176), x.as_ptr(), k / 256) }
}

/// [`vec_dot8`] of eight q6_K rows with the kernel for CPUs without GFNI, whatever this CPU
/// has (for the tests: both forms against `vec_dot`).
///
/// # Safety
/// As [`vec_dot8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q6_k8_without_gfni(w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks behind every pointer).
    unsafe { q6_k_rows::<false, false>(w.map(|r| r.as_ptr()), x.as_ptr(), k / 256) }
}

/// [`vec_dot8_interleaved`] of a group of eight q6_K rows with the kernel for CPUs without
/// GFNI, whatever this CPU has (for the tests).
///
/// # Safety
/// As [`vec_dot8_interleaved`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q6_k8_interleaved_without_gfni(g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks of the group at g).
    unsafe { q6_k_rows::<true, false>(group_rows(g.as_ptr(), 210), x.as_ptr(), k / 256) }
}

/// `q4_k_rows` of q5_K with GFNI's bit matrices.
///
/// # Safety
/// As `q4_k_rows`; the CPU has GFNI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn q5_k_gfni<const IL: bool>(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { q4_k_rows::<true, true, IL>(wp, xp, nb) }
}

/// `q6_k_rows` with GFNI's bit matrices.
///
/// # Safety
/// As `q6_k_rows`; the CPU has GFNI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn q6_k_gfni<const IL: bool>(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { q6_k_rows::<IL, true>(wp, xp, nb) }
}

/// `q2_k_rows` with GFNI's bit matrices.
///
/// # Safety
/// As `q2_k_rows`; the CPU has GFNI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn q2_k_gfni(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { q2_k_rows::<true>(wp, xp, nb) }
}

/// `q3_k_rows` with GFNI's bit matrices.
///
/// # Safety
/// As `q3_k_rows`; the CPU has GFNI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn q3_k_gfni(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { q3_k_rows::<true>(wp, xp, nb) }
}

/// [`vec_dot8`] of eight q3_K rows with the kernel for CPUs without GFNI, whatever this CPU
/// has (for the tests: both forms against `vec_dot`).
///
/// # Safety
/// As [`vec_dot8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q3_k8_without_gfni(w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks behind every pointer).
    unsafe { q3_k_rows::<false>(w.map(|r| r.as_ptr()), x.as_ptr(), k / 256) }
}

/// [`vec_dot8`] of eight q2_K rows with the kernel for CPUs without GFNI, whatever this CPU
/// has (for the tests: both forms against `vec_dot`).
///
/// # Safety
/// As [`vec_dot8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q2_k8_without_gfni(w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks behind every pointer).
    unsafe { q2_k_rows::<false>(w.map(|r| r.as_ptr()), x.as_ptr(), k / 256) }
}

/// The first superblocks of a group of eight interleaved rows whose superblocks are `block`
/// bytes (q4_K, q5_K, q6_K: the group's superblock i is its eight rows' one after the other).
fn group_rows(g: *const u8, block: usize) -> [*const u8; 8] {
    std::array::from_fn(|r| g.wrapping_add(r * block))
}

/// [`vec_dot8`] of eight iq4_xs rows with the kernel for CPUs without VBMI, whatever this CPU
/// has (for the tests: both forms against `vec_dot`).
///
/// # Safety
/// As [`vec_dot8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn iq4_xs8_without_vbmi(w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded (k / 256 superblocks behind every pointer).
    unsafe { iq4_xs_rows::<false, _>(XsPlain(w.map(|r| r.as_ptr())), x.as_ptr(), k / 256) }
}

/// [`vec_dot8_interleaved`] of a group of eight iq4_xs rows with the kernel for CPUs without
/// VBMI, whatever this CPU has (for the tests).
///
/// # Safety
/// As [`vec_dot8_interleaved`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn iq4_xs8_interleaved_without_vbmi(g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    let src = XsGroup(g.as_ptr(), interleaved_prefetch());
    // SAFETY: forwarded (k / 256 superblocks of the group at g).
    unsafe { iq4_xs_rows::<false, _>(src, x.as_ptr(), k / 256) }
}

/// `iq4_xs_rows` with VBMI's byte permutes.
///
/// # Safety
/// As `iq4_xs_rows`; the CPU has AVX-512 VBMI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn iq4_xs_vbmi<S: XsRows>(src: S, xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { iq4_xs_rows::<true, S>(src, xp, nb) }
}

/// Types with an eight-row kernel here.
pub fn supported(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::IQ4NL
            | DType::MXFP4
            | DType::IQ4XS
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::Q2K
            | DType::Q3K
    )
}

/// `vec_dot` of eight weight rows of `t` (see [`supported`]; `k` a multiple of its block) with
/// one activation row in its
/// `vec_dot_type`, each result bit-identical to `vec_dot`'s; each row is prefetched
/// [`PREFETCH`] bytes ahead of its current block.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; every row holds `k / 32` blocks of
/// `t` and `x` as many of the activation format.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn vec_dot8(t: DType, w: [&[u8]; 8], x: &[u8], k: usize) -> [f32; 8] {
    let nb = k / 32;
    let wp = w.map(|r| r.as_ptr());
    // SAFETY: forwarded (nb blocks behind every pointer).
    unsafe {
        match t {
            DType::Q4_0 => offset_rows::<false, false, _>(Apart::<18, 2>(wp), x.as_ptr(), nb),
            DType::IQ4NL => offset_rows::<true, false, _>(Apart::<18, 2>(wp), x.as_ptr(), nb),
            DType::MXFP4 => offset_rows::<true, true, _>(Apart::<17, 1>(wp), x.as_ptr(), nb),
            DType::Q4_1 => q4_1_rows(Apart::<20, 4>(wp), x.as_ptr(), nb),
            DType::Q5_0 => q5_rows::<false, _>(Apart::<22, 6>(wp), x.as_ptr(), nb),
            DType::Q5_1 => q5_rows::<true, _>(Apart::<24, 8>(wp), x.as_ptr(), nb),
            DType::IQ4XS if vbmi() => iq4_xs_vbmi(XsPlain(wp), x.as_ptr(), k / 256),
            DType::IQ4XS => iq4_xs_rows::<false, _>(XsPlain(wp), x.as_ptr(), k / 256),
            DType::Q4K => q4_k_rows::<false, false, false>(wp, x.as_ptr(), k / 256),
            DType::Q5K if gfni() => q5_k_gfni::<false>(wp, x.as_ptr(), k / 256),
            DType::Q5K => q4_k_rows::<true, false, false>(wp, x.as_ptr(), k / 256),
            DType::Q6K if gfni() => q6_k_gfni::<false>(wp, x.as_ptr(), k / 256),
            DType::Q6K => q6_k_rows::<false, false>(wp, x.as_ptr(), k / 256),
            DType::Q2K if gfni() => q2_k_gfni(wp, x.as_ptr(), k / 256),
            DType::Q2K => q2_k_rows::<false>(wp, x.as_ptr(), k / 256),
            DType::Q3K if gfni() => q3_k_gfni(wp, x.as_ptr(), k / 256),
            DType::Q3K => q3_k_rows::<false>(wp, x.as_ptr(), k / 256),
            _ => unreachable!("no eight-row kernel for {t}"),
        }
    }
}

/// Types with an eight-row kernel on the interleaved layout (`tessera::layout`).
pub fn supports_interleaved(t: DType) -> bool {
    tessera::layout::interleave_head(t).is_some()
}

/// [`vec_dot8`] of one group of eight interleaved rows (`g`: their `8 × k / 32` blocks in
/// `tessera::layout`'s `Interleaved8` order): the same registers, so the same bits.
///
/// # Safety
/// As for [`vec_dot8`]; `t` is [`supports_interleaved`] and `g` holds the group's bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn vec_dot8_interleaved(t: DType, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    let nb = k / 32;
    let (p, pf) = (g.as_ptr(), interleaved_prefetch());
    // SAFETY: forwarded (nb blocks of eight rows at p).
    unsafe {
        match t {
            DType::Q4_0 => {
                offset_rows::<false, false, _>(Interleaved::<18, 2>(p, pf), x.as_ptr(), nb)
            }
            DType::IQ4NL => {
                offset_rows::<true, false, _>(Interleaved::<18, 2>(p, pf), x.as_ptr(), nb)
            }
            DType::MXFP4 => {
                offset_rows::<true, true, _>(Interleaved::<17, 1>(p, pf), x.as_ptr(), nb)
            }
            DType::Q4_1 => q4_1_rows(Interleaved::<20, 4>(p, pf), x.as_ptr(), nb),
            DType::Q5_0 => q5_rows::<false, _>(Interleaved::<22, 6>(p, pf), x.as_ptr(), nb),
            DType::Q5_1 => q5_rows::<true, _>(Interleaved::<24, 8>(p, pf), x.as_ptr(), nb),
            DType::IQ4XS if vbmi() => iq4_xs_vbmi(XsGroup(p, pf), x.as_ptr(), k / 256),
            DType::IQ4XS => iq4_xs_rows::<false, _>(XsGroup(p, pf), x.as_ptr(), k / 256),
            DType::Q4K => q4_k_rows::<false, false, true>(group_rows(p, 144), x.as_ptr(), k / 256),
            DType::Q5K if gfni() => q5_k_gfni::<true>(group_rows(p, 176), x.as_ptr(), k / 256),
            DType::Q5K => q4_k_rows::<true, false, true>(group_rows(p, 176), x.as_ptr(), k / 256),
            DType::Q6K if gfni() => q6_k_gfni::<true>(group_rows(p, 210), x.as_ptr(), k / 256),
            DType::Q6K => q6_k_rows::<true, false>(group_rows(p, 210), x.as_ptr(), k / 256),
            _ => unreachable!("no interleaved eight-row kernel for {t}"),
        }
    }
}

/// 16 bytes at `p[4h + j] + off` in 128-bit lane j: two 256-bit pairs joined, not three
/// 128-bit inserts into a 512-bit vector. Three shuffles either way, but on Zen 4, whose
/// 512-bit operations take two 256-bit halves, two of them are now 256-bit: with everything
/// in L1 the eight-row kernels of q4_0 and q4_1 took 11-12 % fewer cycles (q4_0 15.8 -> 14.0,
/// q4_1 17.3 -> 15.4 TSC cycles per eight-row block), q4_K 3 %; from memory q4_0 gained
/// 1-4 % (in-process alternation; the host's noise is ±10 %).
#[inline(always)]
unsafe fn quad(p: &[*const u8; 8], h: usize, off: usize) -> __m512i {
    // SAFETY: 16 readable bytes at every address (caller).
    unsafe {
        let l = |j: usize| _mm_loadu_si128(p[4 * h + j].add(off) as *const __m128i);
        let a = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l(0)), l(1));
        let b = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l(2)), l(3));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
    }
}

/// ggml's `GGML_E8M0_TO_FP32_HALF` of the byte at `p[j]` for the eight rows: 2^(e−128), as
/// the bits (e − 1) << 23, or 0x0020_0000 << e (subnormal) for e < 2.
#[inline(always)]
pub(crate) unsafe fn e8m0_half8(p: &[*const u8; 8]) -> __m256 {
    // SAFETY: one readable byte at every address (caller).
    unsafe {
        let mut bytes = 0u64;
        for (j, &r) in p.iter().enumerate() {
            bytes |= (*r as u64) << (8 * j);
        }
        e8m0_half_lanes(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64)))
    }
}

/// [`e8m0_half8`] of the eight exponent bytes at `p` (an interleaved mxfp4 block's head).
#[inline(always)]
pub(crate) unsafe fn e8m0_half_at(p: *const u8) -> __m256 {
    // SAFETY: eight readable bytes at p (caller).
    unsafe { e8m0_half_lanes(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

/// [`e8m0_half8`] of eight exponents already in the i32 lanes of `e` (each 0..=255).
#[inline(always)]
pub(crate) unsafe fn e8m0_half_lanes(e: __m256i) -> __m256 {
    // SAFETY: register arithmetic only.
    unsafe {
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
        _mm256_castsi256_ps(_mm256_blendv_epi8(tiny, normal, is_normal))
    }
}

/// The f16 at `p[j] + off` for the eight rows, as f32.
#[inline(always)]
unsafe fn halves8(p: &[*const u8; 8], off: usize) -> __m256 {
    // SAFETY: two readable bytes at every address (caller).
    unsafe {
        let r = |j: usize| (p[j].add(off) as *const u16).read_unaligned() as u64;
        let lo = r(0) | r(1) << 16 | r(2) << 32 | r(3) << 48;
        let hi = r(4) | r(5) << 16 | r(6) << 32 | r(7) << 48;
        _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
    }
}

/// The two f16 at the start of each of the eight blocks `p` (a row's scale and min), as the
/// f32 pairs `[p0.0 p0.1 p1.0 p1.1 … p7.1]`.
#[inline(always)]
unsafe fn halves_pairs8(p: &[*const u8; 8]) -> __m512 {
    // SAFETY: four readable bytes at every address (caller).
    unsafe {
        let r = |j: usize| (p[j] as *const u32).read_unaligned() as u64;
        _mm512_cvtph_ps(_mm256_setr_epi64x(
            (r(0) | r(1) << 32) as i64,
            (r(2) | r(3) << 32) as i64,
            (r(4) | r(5) << 32) as i64,
            (r(6) | r(7) << 32) as i64,
        ))
    }
}

/// Lane `STEP·(4h + j) + OFF` of `v` in all four lanes of 128-bit lane j.
#[inline(always)]
unsafe fn spread<const STEP: i32, const OFF: i32>(v: __m512, h: i32) -> __m512 {
    // SAFETY: register arithmetic only.
    unsafe {
        let b = STEP * 4 * h + OFF;
        let (b0, b1, b2, b3) = (b, b + STEP, b + 2 * STEP, b + 3 * STEP);
        let idx = _mm512_setr_epi32(
            b0, b0, b0, b0, b1, b1, b1, b1, b2, b2, b2, b2, b3, b3, b3, b3,
        );
        _mm512_permutexvar_ps(idx, v)
    }
}

/// Four rows' `hsum_float_8` of lanes `lo` (0..4 of each row) and `hi` (4..8): with
/// s_l = l_l + l_{l+4}, (s0 + s2) + (s1 + s3), in lane 4j for row j.
#[inline(always)]
unsafe fn hsum4(lo: __m512, hi: __m512) -> [f32; 4] {
    // SAFETY: register arithmetic only.
    unsafe {
        let s = _mm512_add_ps(lo, hi);
        let t = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
        let u = _mm512_add_ps(t, _mm512_permute_ps::<0b00_00_00_01>(t));
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), u);
        [out[0], out[4], out[8], out[12]]
    }
}

/// Eight rows' `hsum_float_8`: rows 0..4 from `acc[0]`, rows 4..8 from `acc[1]`, each pair
/// (lanes 0..4, lanes 4..8) as [`hsum4`] takes them.
#[inline(always)]
unsafe fn hsum8(acc: &[[__m512; 2]; 2]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for (h, a) in acc.iter().enumerate() {
        // SAFETY: register arithmetic only.
        out[4 * h..4 * h + 4].copy_from_slice(&unsafe { hsum4(a[0], a[1]) });
    }
    out
}

/// An accumulator of the high nibbles' sums, which the kernels take as 16·code (no shift):
/// every term and so every partial sum is 16 times ggml's, exactly (a power of two; the terms
/// are multiples of 2^-48, far from the subnormals, and at most about 2^64), so one exact
/// multiplication by 1/16 gives ggml's lanes.
#[inline(always)]
unsafe fn unscale16(v: __m512) -> __m512 {
    // SAFETY: register arithmetic only.
    unsafe { _mm512_mul_ps(v, _mm512_set1_ps(0.0625)) }
}

/// How far ahead of each row's current block the kernels prefetch, bytes (a constant, so
/// that it is an address displacement rather than eight more registers).
pub const PREFETCH: usize = 512;

/// How far ahead in a group of interleaved rows its kernels (these and `qgemv_avx2`'s)
/// prefetch into L2, bytes. A group is one sequential stream. On Intel Ice Lake one stream
/// without prefetches reads 8.1-9.7 GB/s where the plain rows' eight reach 13-15
/// (`bench-ops --only bandwidth`, one thread); five lines to L2 every two blocks 8 KiB ahead
/// bring it to 13.5-14.3 (4 KiB: 12.8-13.6, to L1: 11.9-12.5; 16 KiB: 13.5-14.6). On AMD Zen
/// 4, where prefetches into L1 512-2048 bytes ahead had cost (q4_0 1.28-1.53× the plain rows
/// from memory, 1.57× with none), the same L2 prefetches took one thread from 73-87 % to
/// 102-117 % of the read bandwidth (q4_0 18.3-20.0 → 25.9-27.3 GB/s, q4_1 alike; 2 KiB and
/// 4 KiB ahead: no better than none), the same within 2 % with the matrix in cache, and
/// SmolLM2's tg128 the same within its noise (four alternating rounds).
pub fn interleaved_prefetch() -> usize {
    8192
}

/// Prefetches `p[r] + PREFETCH` for the eight rows (never faults).
#[inline(always)]
unsafe fn prefetch8(p: &[*const u8; 8]) {
    for &r in p {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch(r.wrapping_add(PREFETCH) as *const i8, _MM_HINT_T0) };
    }
}

/// Where the eight rows' blocks of q4_0, q4_1, q5_0, q5_1, iq4_nl and mxfp4 are (iq4_xs's and
/// the K types' kernels find their groups their own way): eight separate rows
/// ([`Apart`]) or one group of the interleaved layout ([`Interleaved`], see
/// `tessera::layout`). The kernels below take their bytes through it, so both give the same
/// registers and so the same bits.
trait Rows8: Copy {
    /// Prefetches ahead of block `i` (called on even blocks).
    unsafe fn prefetch(self, i: usize);
    /// The eight rows' f16 `d` (each block's first two bytes) of block `i`, as f32.
    unsafe fn d8(self, i: usize) -> __m256;
    /// The eight rows' e8m0 scale bytes of block `i` (mxfp4), as `e8m0_half8` gives them.
    unsafe fn e8m0_8(self, i: usize) -> __m256;
    /// The eight rows' f16 pairs `d m` of block `i`, as [`halves_pairs8`] gives them.
    unsafe fn dm8(self, i: usize) -> __m512;
    /// Block `i`'s 16 quant bytes of rows `4h + j` in 128-bit lane j.
    unsafe fn quad(self, i: usize, h: usize) -> __m512i;
    /// Block `i`'s fifth bits (q5_0, q5_1: the little-endian u32 `qh` just before the 16 quant
    /// bytes) of rows `4h..4h + 4`, `[qh_4h, qh_4h+1, qh_4h+2, qh_4h+3]` in every 128-bit lane.
    unsafe fn qh4(self, i: usize, h: usize) -> __m512i;
    /// Block `i` of row `r` as ggml lays it out (copied into `buf` where it is not so).
    unsafe fn block(self, i: usize, r: usize, buf: &mut [u8; 32]) -> *const u8;
}

/// Eight rows anywhere, blocks of `BLOCK` bytes with the quants from byte `QS`.
#[derive(Clone, Copy)]
struct Apart<const BLOCK: usize, const QS: usize>([*const u8; 8]);

impl<const BLOCK: usize, const QS: usize> Apart<BLOCK, QS> {
    /// Block `i` of each row.
    ///
    /// # Safety
    /// Block `i` exists in every row.
    #[inline(always)]
    unsafe fn at(self, i: usize) -> [*const u8; 8] {
        // SAFETY: inside every row (caller).
        self.0.map(|r| unsafe { r.add(i * BLOCK) })
    }
}

impl<const BLOCK: usize, const QS: usize> Rows8 for Apart<BLOCK, QS> {
    #[inline(always)]
    unsafe fn prefetch(self, i: usize) {
        // SAFETY: block i exists (the kernels prefetch from their current block); prefetches
        // never fault.
        unsafe { prefetch8(&self.at(i)) }
    }
    #[inline(always)]
    unsafe fn d8(self, i: usize) -> __m256 {
        // SAFETY: block i exists in every row (caller).
        unsafe { halves8(&self.at(i), 0) }
    }
    #[inline(always)]
    unsafe fn e8m0_8(self, i: usize) -> __m256 {
        // SAFETY: as for `d8`.
        unsafe { e8m0_half8(&self.at(i)) }
    }
    #[inline(always)]
    unsafe fn dm8(self, i: usize) -> __m512 {
        // SAFETY: as for `d8`.
        unsafe { halves_pairs8(&self.at(i)) }
    }
    #[inline(always)]
    unsafe fn quad(self, i: usize, h: usize) -> __m512i {
        // SAFETY: as for `d8`.
        unsafe { quad(&self.at(i), h, QS) }
    }
    #[inline(always)]
    unsafe fn qh4(self, i: usize, h: usize) -> __m512i {
        const { assert!(QS >= 4) };
        let p = self.at(i);
        // SAFETY: as for `d8`: `qh` is the four bytes before the quants.
        unsafe {
            let r = |j: usize| (p[4 * h + j].add(QS - 4) as *const u32).read_unaligned() as u64;
            _mm512_broadcast_i32x4(_mm_set_epi64x(
                (r(2) | r(3) << 32) as i64,
                (r(0) | r(1) << 32) as i64,
            ))
        }
    }
    #[inline(always)]
    unsafe fn block(self, i: usize, r: usize, _: &mut [u8; 32]) -> *const u8 {
        self.0[r].wrapping_add(i * BLOCK)
    }
}

/// One group of eight interleaved rows: per block, the eight heads of `HEAD` bytes, then the
/// eight rows' 16 quant bytes (`BLOCK` = `HEAD` + 16 bytes a row).
#[derive(Clone, Copy)]
struct Interleaved<const BLOCK: usize, const HEAD: usize>(*const u8, usize);

impl<const BLOCK: usize, const HEAD: usize> Rows8 for Interleaved<BLOCK, HEAD> {
    /// The lines of two blocks of the group (five for the 17- to 20-byte blocks, six for
    /// q5_0's and q5_1's) `self.1` bytes ahead into L2, or none where that is 0 (see
    /// [`interleaved_prefetch`]).
    #[inline(always)]
    unsafe fn prefetch(self, i: usize) {
        if self.1 == 0 {
            return;
        }
        for line in 0..(16 * BLOCK).div_ceil(64) {
            let p = self.0.wrapping_add(i * 8 * BLOCK + self.1 + 64 * line);
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch(p as *const i8, _MM_HINT_T1) };
        }
    }
    #[inline(always)]
    unsafe fn d8(self, i: usize) -> __m256 {
        // (q4_0 and iq4_nl: the whole head is d; q5_0: d then qh, six bytes; q4_1 and q5_1
        // take their d m pairs through `dm8`, mxfp4 its exponents through `e8m0_8`)
        debug_assert!(HEAD == 2 || HEAD == 6);
        let g = self.0.wrapping_add(i * 8 * BLOCK);
        // SAFETY: block i of the group exists (caller): its eight heads first (q5_0: 48 of
        // the group block's 176 bytes, so 64 readable).
        unsafe {
            if HEAD == 6 {
                // word 3r: row r's d
                let pick = _mm512_zextsi128_si512(_mm_setr_epi16(0, 3, 6, 9, 12, 15, 18, 21));
                let w = _mm512_permutexvar_epi16(pick, _mm512_loadu_si512(g as *const _));
                _mm256_cvtph_ps(_mm512_castsi512_si128(w))
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(g as *const __m128i))
            }
        }
    }
    #[inline(always)]
    unsafe fn e8m0_8(self, i: usize) -> __m256 {
        // (mxfp4: the whole head is the exponent byte)
        debug_assert!(HEAD == 1);
        // SAFETY: as for `d8`: the eight exponents are the block's first eight bytes.
        unsafe { e8m0_half_at(self.0.add(i * 8 * BLOCK)) }
    }
    #[inline(always)]
    unsafe fn dm8(self, i: usize) -> __m512 {
        debug_assert!(HEAD == 4 || HEAD == 8);
        let g = self.0.wrapping_add(i * 8 * BLOCK);
        // SAFETY: as for `d8` (q4_1: eight 4-byte heads; q5_1: eight 8-byte heads, d m qh,
        // the group block's first 64 of 192 bytes).
        unsafe {
            if HEAD == 8 {
                // dwords 2r: row r's d m
                let pick = _mm512_zextsi256_si512(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
                let w = _mm512_permutexvar_epi32(pick, _mm512_loadu_si512(g as *const _));
                _mm512_cvtph_ps(_mm512_castsi512_si256(w))
            } else {
                _mm512_cvtph_ps(_mm256_loadu_si256(g as *const __m256i))
            }
        }
    }
    #[inline(always)]
    unsafe fn quad(self, i: usize, h: usize) -> __m512i {
        // SAFETY: as for `d8`: rows 4h..4h + 4's quants are 64 adjacent bytes.
        unsafe { _mm512_loadu_si512(self.0.add(i * 8 * BLOCK + 8 * HEAD + 64 * h) as *const _) }
    }
    #[inline(always)]
    unsafe fn qh4(self, i: usize, h: usize) -> __m512i {
        debug_assert!(HEAD == 6 || HEAD == 8);
        let g = self.0.wrapping_add(i * 8 * BLOCK);
        // SAFETY: as for `d8` (the eight heads are the group block's first 48 or 64 bytes,
        // and 64 are readable).
        unsafe {
            let heads = _mm512_loadu_si512(g as *const _);
            if HEAD == 6 {
                // row r's qh: words 3r + 1 and 3r + 2
                let w = |j: i64| {
                    let r = 4 * h as i64 + j;
                    (3 * r + 1) | (3 * r + 2) << 16
                };
                let lane = (w(0) | w(1) << 32, w(2) | w(3) << 32);
                let pick = _mm512_setr_epi64(
                    lane.0, lane.1, lane.0, lane.1, lane.0, lane.1, lane.0, lane.1,
                );
                _mm512_permutexvar_epi16(pick, heads)
            } else {
                // row r's qh: dword 2r + 1
                let r = 8 * h as i32;
                let pick = _mm512_broadcast_i32x4(_mm_setr_epi32(r + 1, r + 3, r + 5, r + 7));
                _mm512_permutexvar_epi32(pick, heads)
            }
        }
    }
    #[inline(always)]
    unsafe fn block(self, i: usize, r: usize, buf: &mut [u8; 32]) -> *const u8 {
        let g = self.0.wrapping_add(i * 8 * BLOCK);
        // SAFETY: as for `d8`.
        unsafe {
            std::ptr::copy_nonoverlapping(g.add(HEAD * r), buf.as_mut_ptr(), HEAD);
            std::ptr::copy_nonoverlapping(g.add(8 * HEAD + 16 * r), buf.as_mut_ptr().add(HEAD), 16);
        }
        buf.as_ptr()
    }
}

/// Block `i` of the eight rows of q4_0, iq4_nl or mxfp4 (see [`offset_rows`]) into `acc`
/// ([half][lo, hi]); `book`: the codebook + 128 in every 128-bit lane.
#[inline(always)]
unsafe fn offset_block<const CODEBOOK: bool, const MX: bool, S: Rows8>(
    src: S,
    xp: *const u8,
    i: usize,
    book: __m512i,
    acc: &mut [[__m512; 2]; 2],
) {
    // SAFETY: block i exists behind every row and xp (caller); prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let off = _mm512_set1_epi8(if CODEBOOK { -128 } else { 8 });
        // the codebooks' 128, or 16·8 for q4_0's high nibbles, which stay in place (16·code;
        // see [`unscale16`])
        let off_hi = _mm512_set1_epi8(-128);
        let xb = xp.add(i * 34);
        let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(2) as *const __m128i));
        let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(18) as *const __m128i));
        // −off·Σy per lane (exact: |Σ| ≤ 4·128·128)
        let nlo = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, ylo));
        let nhi = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off_hi, yhi));
        if i.is_multiple_of(2) {
            src.prefetch(i);
        }
        // ggml's d = d_w·d_y per row (q4_0's product order; iq4_nl's d_y·d_w and mxfp4's
        // d_y·e8m0_half(e) are the same products)
        let dw = if MX { src.e8m0_8(i) } else { src.d8(i) };
        let d8 = _mm256_mul_ps(dw, _mm256_set1_ps(f16(xb)));
        let d16 = _mm512_castps256_ps512(d8);
        for (h, a) in acc.iter_mut().enumerate() {
            let z = src.quad(i, h);
            let mut lo = _mm512_and_si512(z, m4);
            let mut hi = _mm512_andnot_si512(m4, z);
            if CODEBOOK {
                lo = _mm512_shuffle_epi8(book, lo);
                hi = _mm512_shuffle_epi8(book, _mm512_srli_epi16::<4>(hi));
            }
            let d = spread::<1, 0>(d16, h as i32);
            let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nlo, lo, ylo));
            let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nhi, hi, yhi));
            a[0] = _mm512_fmadd_ps(d, plo, a[0]);
            a[1] = _mm512_fmadd_ps(d, phi, a[1]);
        }
    }
}

/// q4_0 (`CODEBOOK` false: values nibble − 8, one accumulator), iq4_nl (true: values
/// `KVALUES_IQ4NL[nibble]`, ggml's two accumulators, even blocks in one and odd ones in the
/// other, an odd last block added after the sum, as its generic tail computes it) or, with
/// `MX`, mxfp4 (the same with `KVALUES_FP4` and its e8m0 scales, as its `vec_dot` does).
#[inline(always)]
unsafe fn offset_rows<const CODEBOOK: bool, const MX: bool, S: Rows8>(
    src: S,
    xp: *const u8,
    nb: usize,
) -> [f32; 8] {
    // mxfp4 is a codebook type: `MX` without `CODEBOOK` names no format
    const { assert!(CODEBOOK || !MX) };
    // SAFETY: nb 18-byte (mxfp4: 17-byte) blocks behind every row and nb q8_0 blocks behind
    // xp (caller).
    unsafe {
        // the unsigned operand: the nibble itself (q4_0) or its value + 128 (the codebooks)
        let book = if CODEBOOK {
            codebook_128(if MX { &KVALUES_FP4 } else { &KVALUES_IQ4NL })
        } else {
            _mm512_setzero_si512()
        };
        // [parity][half][lo, hi]
        let [mut even, mut odd] = [[[_mm512_setzero_ps(); 2]; 2]; 2];
        // (iq4_nl: whole pairs of blocks, even ones into `even` and odd ones into `odd`)
        let body = if CODEBOOK { nb / 2 * 2 } else { nb };
        let mut i = 0;
        while i + 2 <= body {
            offset_block::<CODEBOOK, MX, S>(src, xp, i, book, &mut even);
            offset_block::<CODEBOOK, MX, S>(
                src,
                xp,
                i + 1,
                book,
                if CODEBOOK { &mut odd } else { &mut even },
            );
            i += 2;
        }
        if i < body {
            offset_block::<CODEBOOK, MX, S>(src, xp, i, book, &mut even);
        }
        let acc = [even, odd];
        let mut out = [0f32; 8];
        for h in 0..2 {
            let (lo, hi) = if CODEBOOK {
                (
                    _mm512_add_ps(acc[0][h][0], acc[1][h][0]),
                    _mm512_add_ps(acc[0][h][1], acc[1][h][1]),
                )
            } else {
                (acc[0][h][0], unscale16(acc[0][h][1]))
            };
            out[4 * h..4 * h + 4].copy_from_slice(&hsum4(lo, hi));
        }
        if CODEBOOK && body < nb {
            let xb = xp.add(body * 34);
            let mut buf = [0u8; 32];
            for (r, o) in out.iter_mut().enumerate() {
                let w = src.block(body, r, &mut buf);
                *o += if MX {
                    super::qdot::avx2::mxfp4_odd_block(w, xb)
                } else {
                    super::qdot::avx2::iq4_nl_odd_block(w, xb)
                };
            }
        }
        out
    }
}

/// q4_1 against q8_1: ggml's Σ codes·y times d·d_y per lane and its fused running Σ m·s.
#[inline(always)]
unsafe fn q4_1_rows<S: Rows8>(src: S, xp: *const u8, nb: usize) -> [f32; 8] {
    // SAFETY: nb 20-byte blocks behind every row and nb q8_1 blocks behind xp (caller);
    // prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); 2]; 2];
        // lanes (2r, 2r+1) hold row r's running Σ m·s (odd lanes are the ones used)
        let mut summs = _mm512_setzero_ps();
        for i in 0..nb {
            let xb = xp.add(i * 36);
            let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(4) as *const __m128i));
            let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(20) as *const __m128i));
            // [dx sx] of the activation block in every pair of lanes
            let xs = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
            let xs = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(xs)));
            if i.is_multiple_of(2) {
                src.prefetch(i);
            }
            // [d0 m0 d1 m1 … d7 m7]: each row's adjacent f16 pair
            let dm = src.dm8(i);
            summs = _mm512_fmadd_ps(dm, xs, summs); // fused, as GCC builds ggml's
            let d16 = _mm512_mul_ps(dm, xs);
            for (h, a) in acc.iter_mut().enumerate() {
                let z = src.quad(i, h);
                let lo = _mm512_and_si512(z, m4);
                let hi = _mm512_andnot_si512(m4, z);
                let d = spread::<2, 0>(d16, h as i32);
                let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, lo, ylo));
                let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, hi, yhi));
                a[0] = _mm512_fmadd_ps(d, plo, a[0]);
                a[1] = _mm512_fmadd_ps(d, phi, a[1]);
            }
        }
        let mut s = [0f32; 16];
        _mm512_storeu_ps(s.as_mut_ptr(), summs);
        let mut out = [0f32; 8];
        for h in 0..2 {
            for (j, v) in hsum4(acc[h][0], unscale16(acc[h][1]))
                .into_iter()
                .enumerate()
            {
                out[4 * h + j] = v + s[2 * (4 * h + j) + 1];
            }
        }
        out
    }
}

/// The fifth bits of one block of rows `4h..4h + 4` (q5_0, q5_1: `v`, their little-endian
/// u32 `qh` as [`Rows8::qh4`] gives them, bit e for element e) as byte masks in [`quad`]'s
/// order: byte b of 128-bit lane j is element b (`.0`) and element 16 + b (`.1`) of row 4h + j.
#[inline(always)]
unsafe fn fifth_bits(v: __m512i) -> (__mmask64, __mmask64) {
    // SAFETY: register arithmetic only.
    unsafe {
        // lane j, byte b: byte b / 8 (low half) or 2 + b / 8 (high half) of qh_j
        let pick = |hi: i64| {
            let lane = |j: i64| {
                let b = 4 * j + 2 * hi;
                (b * 0x0101_0101_0101_0101, (b + 1) * 0x0101_0101_0101_0101)
            };
            let (a0, a1) = lane(0);
            let (b0, b1) = lane(1);
            let (c0, c1) = lane(2);
            let (d0, d1) = lane(3);
            _mm512_setr_epi64(a0, a1, b0, b1, c0, c1, d0, d1)
        };
        let bit = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
        (
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(v, pick(0)), bit),
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(v, pick(1)), bit),
        )
    }
}

/// q5_0 against q8_0 (`MIN` false: values u − 16, u = nibble + 16·fifth bit) or q5_1 against
/// q8_1 (`MIN`: unsigned u with a min, as q4_1), the eight rows' blocks from `src` (plain
/// rows: `qh` and then the 16 quant bytes after the scales; interleaved, see
/// `tessera::layout`). ggml's `vec_dot` builds each lane's u from the same bits and sums u·y
/// (q5_0: (u − 16)·y, here Σu·y − 16·Σy, the same integer) exactly; the scale products, FMAs
/// and final sums are q4_0's and q4_1's (see [`offset_rows`], [`q4_1_rows`]), so each result
/// is bit-identical to `vec_dot`'s.
#[inline(always)]
unsafe fn q5_rows<const MIN: bool, S: Rows8>(src: S, xp: *const u8, nb: usize) -> [f32; 8] {
    let xsize = if MIN { 36 } else { 34 };
    let xqs = if MIN { 4 } else { 2 };
    // SAFETY: nb blocks behind every row of `src` and nb q8_0 (q8_1) blocks behind
    // xp (caller); prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let sixteen = _mm512_set1_epi8(16);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); 2]; 2];
        // (q5_1) lanes (2r, 2r+1) hold row r's running Σ m·s (odd lanes are the ones used)
        let mut summs = _mm512_setzero_ps();
        for i in 0..nb {
            let xb = xp.add(i * xsize);
            let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(xqs) as *const __m128i));
            let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(xqs + 16) as *const __m128i));
            // q5_0: −16·Σy per lane (exact: |Σ| ≤ 4·16·128)
            let (nlo, nhi) = if MIN {
                (zero, zero)
            } else {
                (
                    _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, sixteen, ylo)),
                    _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, sixteen, yhi)),
                )
            };
            if i.is_multiple_of(2) {
                src.prefetch(i);
            }
            let d16 = if MIN {
                // [dx sx] of the activation block in every pair of lanes, [d0 m0 … d7 m7]
                let xs = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
                let xs = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(xs)));
                let dm = src.dm8(i);
                summs = _mm512_fmadd_ps(dm, xs, summs); // fused, as GCC builds ggml's
                _mm512_mul_ps(dm, xs)
            } else {
                // ggml's d = d_w·d_y per row
                _mm512_castps256_ps512(_mm256_mul_ps(src.d8(i), _mm256_set1_ps(f16(xb))))
            };
            for (h, a) in acc.iter_mut().enumerate() {
                let z = src.quad(i, h);
                let (klo, khi) = fifth_bits(src.qh4(i, h));
                let lo = _mm512_and_si512(z, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
                let lo = _mm512_mask_add_epi8(lo, klo, lo, sixteen);
                let hi = _mm512_mask_add_epi8(hi, khi, hi, sixteen);
                let d = if MIN {
                    spread::<2, 0>(d16, h as i32)
                } else {
                    spread::<1, 0>(d16, h as i32)
                };
                let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nlo, lo, ylo));
                let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nhi, hi, yhi));
                a[0] = _mm512_fmadd_ps(d, plo, a[0]);
                a[1] = _mm512_fmadd_ps(d, phi, a[1]);
            }
        }
        let mut out = hsum8(&acc);
        if MIN {
            let mut s = [0f32; 16];
            _mm512_storeu_ps(s.as_mut_ptr(), summs);
            for (r, o) in out.iter_mut().enumerate() {
                *o += s[2 * r + 1];
            }
        }
        out
    }
}

/// A 4-bit codebook (`KVALUES_IQ4NL`, `KVALUES_FP4`) + 128, as unsigned bytes, in every
/// 128-bit lane.
#[inline(always)]
unsafe fn codebook_128(table: &[i8; 16]) -> __m512i {
    let mut b = [0u8; 16];
    for (o, &v) in b.iter_mut().zip(table.iter()) {
        *o = (v as i16 + 128) as u8;
    }
    // SAFETY: 16 readable bytes.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(b.as_ptr() as *const __m128i)) }
}

/// Prefetches `LINES` lines from [`PREFETCH`] bytes ahead of each of `rows`' current
/// superblock (never faults): 3 for the 136- and 144-byte superblocks of iq4_xs and q4_K, 4
/// for q6_K's 210 bytes. The superblock kernels call it for two rows at a time, just before
/// their arithmetic, rather than for all eight rows at the top of a superblock: a burst of 24
/// or 32 prefetches left part of the memory's bandwidth unused on Zen 4 (one thread, 256 MiB
/// matrix, `bench-ops --only bandwidth`, four alternating rounds: q4_K 78-81 % of the read
/// bandwidth as a burst, 87-89 % spread; q6_K 71-75 % and 83-87 %; the same prefetches to L2
/// 4 KiB ahead, as a burst 74-84 %, spread 81-94 %).
#[inline(always)]
unsafe fn prefetch_superblocks<const LINES: usize, const N: usize>(rows: [*const u8; N]) {
    // SAFETY: prefetches never fault.
    unsafe { prefetch_ahead::<PREFETCH, _MM_HINT_T0, LINES, N>(rows) }
}

/// Prefetches with hint `HINT` `LINES` lines from `DIST` bytes ahead of each of `rows`'
/// current superblock (never faults).
#[inline(always)]
unsafe fn prefetch_ahead<const DIST: usize, const HINT: i32, const LINES: usize, const N: usize>(
    rows: [*const u8; N],
) {
    for r in rows {
        for line in 0..LINES {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch::<HINT>(r.wrapping_add(DIST + 64 * line) as *const i8) };
        }
    }
}

/// How far ahead of each row's current superblock q6_K's eight-row kernel prefetches its plain
/// rows into L2, bytes, on top of [`PREFETCH`]'s lines into L1 (and the interleaved rows into
/// L1 [`Q6_PREFETCH_L1_RUN`] bytes ahead, on top of [`interleaved_prefetch`]'s into L2). With
/// the GFNI kernel (101 cycles an eight-row superblock in L1 against 117 before) the old
/// prefetches alone left more of the memory's bandwidth unused than with the old kernel;
/// both levels together used the most (Zen 4, 256 MiB matrix, eight alternated rounds of
/// `bench-ops --only bandwidth --types q6_K -r 9`, medians: one thread 25.0 GB/s against 23.4
/// with the L2 prefetch alone and 21.0 with the L1 one alone, two threads 33.2 against 30.7
/// and 30.9; the interleaved rows one thread 21.5 against 18.6 with the L2 prefetch alone and
/// the old kernel's 20.9).
const Q6_PREFETCH_L2: usize = 2048;

/// How far ahead q6_K's interleaved rows are prefetched into L1, bytes (see
/// [`Q6_PREFETCH_L2`]).
const Q6_PREFETCH_L1_RUN: usize = 1024;

/// Prefetches into L2 the lines of the `bytes` bytes [`interleaved_prefetch`] bytes ahead of
/// `p` (two rows' superblocks of an interleaved group: the group is one sequential stream).
#[inline(always)]
unsafe fn prefetch_run(p: *const u8, bytes: usize) {
    // SAFETY: prefetches never fault.
    unsafe { prefetch_lines::<_MM_HINT_T1>(p.wrapping_add(interleaved_prefetch()), bytes) }
}

/// Prefetches with hint `HINT` the lines of the `bytes` bytes at `p` (never faults).
#[inline(always)]
unsafe fn prefetch_lines<const HINT: i32>(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<HINT>(p.wrapping_add(off) as *const i8) };
        off += 64;
    }
    // SAFETY: as above (the last line, where the run does not start on one).
    unsafe { _mm_prefetch::<HINT>(p.wrapping_add(bytes - 1) as *const i8) };
}

/// A superblock's exact per-lane sums `sum` ([quad][lanes 0-3, lanes 4-7]) into the
/// accumulators, `fma(d_w·d_y, sum, acc)` per lane as ggml's kernels do; the eight rows' scale
/// products are lanes `STEP·r` of `d`.
#[inline(always)]
unsafe fn fold_superblock<const STEP: i32>(
    acc: &mut [[__m512; 2]; 2],
    sum: [[__m512; 2]; 2],
    d: __m512,
) {
    for (h, (a, s)) in acc.iter_mut().zip(sum).enumerate() {
        // SAFETY: register arithmetic only.
        unsafe {
            let d = spread::<STEP, 0>(d, h as i32);
            a[0] = _mm512_fmadd_ps(d, s[0], a[0]);
            a[1] = _mm512_fmadd_ps(d, s[1], a[1]);
        }
    }
}

/// Where [`iq4_xs_rows`] finds the eight rows' superblocks.
trait XsRows: Copy {
    /// Superblock i's eight heads (d, scales_h, scales_l): row r's eight bytes in qword r.
    unsafe fn heads(self, i: usize) -> __m512i;
    /// Prefetches for the `jj`-th quarter of superblock i (rows 2jj and 2jj + 1 when plain).
    unsafe fn prefetch(self, i: usize, jj: usize);
    /// Sub-blocks 2jj and 2jj + 1 of superblock i, each of quads 0 and 1: vector
    /// `[js][h]` holds row 4h + q's 16 bytes of sub-block 2jj + js in 128-bit lane q.
    unsafe fn quads(self, i: usize, jj: usize) -> [[__m512i; 2]; 2];
}

/// Eight plain rows (their first superblocks).
#[derive(Clone, Copy)]
struct XsPlain([*const u8; 8]);

impl XsPlain {
    const BLOCK: usize = 136;
    #[inline(always)]
    fn at(self, i: usize) -> [*const u8; 8] {
        self.0.map(|r| r.wrapping_add(i * Self::BLOCK))
    }
}

impl XsRows for XsPlain {
    #[inline(always)]
    unsafe fn heads(self, i: usize) -> __m512i {
        let wb = self.at(i);
        // SAFETY: superblock i exists behind every row (caller).
        unsafe {
            let w = |r: usize| (wb[r] as *const i64).read_unaligned();
            _mm512_setr_epi64(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7))
        }
    }
    #[inline(always)]
    unsafe fn prefetch(self, i: usize, jj: usize) {
        let wb = self.at(i);
        // SAFETY: prefetches never fault.
        unsafe { prefetch_superblocks::<3, 2>([wb[2 * jj], wb[2 * jj + 1]]) }
    }
    #[inline(always)]
    unsafe fn quads(self, i: usize, jj: usize) -> [[__m512i; 2]; 2] {
        let wb = self.at(i);
        // SAFETY: superblock i exists behind every row (caller): 32 bytes at 8 + 32jj.
        unsafe {
            let (q0, q1) = (
                quad_pair(&wb, 0, 8 + 32 * jj),
                quad_pair(&wb, 1, 8 + 32 * jj),
            );
            [[q0[0], q1[0]], [q0[1], q1[1]]]
        }
    }
}

/// One group of eight interleaved rows (`tessera::layout`: per superblock the eight 8-byte
/// heads, then for each sub-block the eight rows' 16 bytes, 1088 bytes in all), and how far
/// ahead it prefetches into L2 ([`interleaved_prefetch`]; none where 0).
#[derive(Clone, Copy)]
struct XsGroup(*const u8, usize);

impl XsGroup {
    const GROUP: usize = 8 * 136;
}

impl XsRows for XsGroup {
    #[inline(always)]
    unsafe fn heads(self, i: usize) -> __m512i {
        // SAFETY: superblock i of the group exists (caller): its heads first.
        unsafe { _mm512_loadu_si512(self.0.add(i * Self::GROUP) as *const _) }
    }
    /// The superblock's 17 lines `self.1` bytes ahead, five a quarter (two in the last).
    #[inline(always)]
    unsafe fn prefetch(self, i: usize, jj: usize) {
        if self.1 == 0 {
            return;
        }
        for line in 5 * jj..(5 * jj + 5).min(Self::GROUP / 64) {
            let p = self.0.wrapping_add(i * Self::GROUP + self.1 + 64 * line);
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch(p as *const i8, _MM_HINT_T1) };
        }
    }
    #[inline(always)]
    unsafe fn quads(self, i: usize, jj: usize) -> [[__m512i; 2]; 2] {
        // SAFETY: superblock i of the group exists (caller): sub-block j's eight rows at
        // 64 + 128j, quad h 64h further.
        unsafe {
            let at = |js: usize, h: usize| {
                let off = i * Self::GROUP + 64 + 128 * (2 * jj + js) + 64 * h;
                _mm512_loadu_si512(self.0.add(off) as *const _)
            };
            [[at(0, 0), at(0, 1)], [at(1, 0), at(1, 1)]]
        }
    }
}

/// iq4_xs against q8_K. ggml's kernel sums, per 256-element superblock and lane l, the exact
/// integer Σ_j ls_j·p_jl over its eight 32-element sub-blocks j (ls_j the sub-block's 6-bit
/// scale − 32, p_jl the lane's four products), converts it and fused-multiply-adds it with
/// d_w·d_y. Here p_jl comes from `vpdpbusd` as for iq4_nl, and Σ ls_j·p_jl is accumulated in
/// f32 with FMAs: every partial sum is an integer below 2^24 in magnitude (|p| ≤ 4·127·127,
/// |ls| ≤ 32, eight sub-blocks: 16,516,096; q8_K's values are within ±127), so each FMA is
/// exact and the sum is the converted integer itself.
///
/// What the eight rows share is computed once a superblock: the activations' offset sums
/// (−128 times each four's sum, the unsigned codebook's offset, taken out of every lane by
/// starting `vpdpbusd` from them) and each quad's scales, laid out so that one sub-block's
/// are an in-lane permute away. On Zen 4, with a 4096² matrix on one thread (in L3), these
/// took the kernel from 16-17 to 19-20 GB/s, where the cross-lane `vpermt2ps` that picked
/// the scales before cost 10-12 %; `VBMI` (`vpermb` for the code lookups) gives 21-22.
#[inline(always)]
unsafe fn iq4_xs_rows<const VBMI: bool, S: XsRows>(src: S, xp: *const u8, nb: usize) -> [f32; 8] {
    const Q8K: usize = 292;
    // SAFETY: nb superblocks of the eight rows in src and nb q8_K blocks behind xp (caller);
    // prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let off = _mm512_set1_epi8(-128);
        let book = codebook_128(&KVALUES_IQ4NL);
        let mut acc = [[_mm512_setzero_ps(); 2]; 2];
        for i in 0..nb {
            let xb = xp.add(i * Q8K);
            let w64 = src.heads(i);
            // ggml's d = d_w·d_y per row
            let dw = _mm256_cvtph_ps(_mm512_cvtepi64_epi16(w64));
            let d16 = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(f32_at(xb))));
            // [quad][sub-blocks 0..4, 4..8]
            let ls = [
                [xs_scales(w64, 0, 0), xs_scales(w64, 0, 1)],
                [xs_scales(w64, 1, 0), xs_scales(w64, 1, 1)],
            ];
            // −128·(the sum of activations 4k..4k + 4) at k, for all 64 k of the superblock:
            // the offset of the unsigned codebook, taken out of every lane's products
            let mut g = [0i32; 64];
            for c in 0..4 {
                let y = _mm512_loadu_si512(xb.add(4 + 64 * c) as *const _);
                let s = _mm512_dpbusd_epi32(zero, off, y);
                _mm512_storeu_si512(
                    g.as_mut_ptr().add(16 * c) as *mut _,
                    _mm512_sub_epi32(zero, s),
                );
            }
            // Σ_j ls_j·p_jl, exact in f32 ([half][lo, hi])
            let mut sum = [[_mm512_setzero_ps(); 2]; 2];
            for jj in 0..4 {
                src.prefetch(i, jj);
                // [sub-block 2jj, 2jj + 1][quad]
                let zz = src.quads(i, jj);
                for (js, zj) in zz.iter().enumerate() {
                    let j = 2 * jj + js;
                    let y = xb.add(4 + 32 * j);
                    let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(y as *const __m128i));
                    let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(16) as *const __m128i));
                    // −128·Σy per lane
                    let gj = g.as_ptr().add(8 * j) as *const __m128i;
                    let nlo = _mm512_broadcast_i32x4(_mm_loadu_si128(gj));
                    let nhi = _mm512_broadcast_i32x4(_mm_loadu_si128(gj.add(1)));
                    for (h, s) in sum.iter_mut().enumerate() {
                        let z = zj[h];
                        // the codes: `vpermb` takes the low six bits of each byte as the
                        // index into `book`, which holds the codebook in each 16 bytes
                        let (lo, hi) = if VBMI {
                            (
                                _mm512_permutexvar_epi8(z, book),
                                _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(z), book),
                            )
                        } else {
                            (
                                _mm512_shuffle_epi8(book, _mm512_and_si512(z, m4)),
                                _mm512_shuffle_epi8(
                                    book,
                                    _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4),
                                ),
                            )
                        };
                        let l = lane_copies(ls[h][j / 4], j % 4);
                        let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nlo, lo, ylo));
                        let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nhi, hi, yhi));
                        s[0] = _mm512_fmadd_ps(l, plo, s[0]);
                        s[1] = _mm512_fmadd_ps(l, phi, s[1]);
                    }
                }
            }
            fold_superblock::<1>(&mut acc, sum, d16);
        }
        hsum8(&acc)
    }
}

/// Quad h's scales of sub-blocks 4n..4n + 4 of a superblock whose rows' first eight bytes
/// (d, scales_h, scales_l) are the qwords of `w64`: lane 4q + j holds ls_{4n+j} (the 6-bit
/// scale − 32) of row 4h + q, as f32. Dword 2r of `w64` is d | scales_h << 16 (sub-block j's
/// two high bits at 16 + 2j), dword 2r + 1 is scales_l (its four low bits at 4j).
#[inline(always)]
unsafe fn xs_scales(w64: __m512i, h: i32, n: i32) -> __m512 {
    // SAFETY: register arithmetic only.
    unsafe {
        let r = |q: i32| 2 * (4 * h + q);
        let (a, b, c, d) = (r(0), r(1), r(2), r(3));
        let idx_h = _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
        let idx_l = _mm512_add_epi32(idx_h, _mm512_set1_epi32(1));
        let (l0, h0) = (16 * n, 12 + 8 * n);
        let shift_l = _mm512_add_epi32(
            _mm512_set1_epi32(l0),
            _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12),
        );
        let shift_h = _mm512_add_epi32(
            _mm512_set1_epi32(h0),
            _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6),
        );
        let l = _mm512_permutexvar_epi32(idx_l, w64);
        let h = _mm512_permutexvar_epi32(idx_h, w64);
        let l = _mm512_and_si512(_mm512_srlv_epi32(l, shift_l), _mm512_set1_epi32(15));
        let h = _mm512_and_si512(_mm512_srlv_epi32(h, shift_h), _mm512_set1_epi32(0x30));
        _mm512_cvtepi32_ps(_mm512_sub_epi32(
            _mm512_or_si512(l, h),
            _mm512_set1_epi32(32),
        ))
    }
}

/// Lane j of every 128-bit lane of `v` in all four of its lanes (an in-lane permute:
/// on Zen 4 the cross-lane `vpermt2ps` this replaced cost the iq4_xs kernel 10-12 % of its
/// speed in cache).
#[inline(always)]
unsafe fn lane_copies(v: __m512, j: usize) -> __m512 {
    // SAFETY: register arithmetic only.
    unsafe {
        match j {
            0 => _mm512_permute_ps::<0x00>(v),
            1 => _mm512_permute_ps::<0x55>(v),
            2 => _mm512_permute_ps::<0xAA>(v),
            _ => _mm512_permute_ps::<0xFF>(v),
        }
    }
}

/// q4_K against q8_K. ggml's kernel sums, per superblock and lane l, the exact integer
/// Σ_s sc_s·p_sl over its eight 32-element sub-blocks s (sc_s the 6-bit scale, p_sl the lane's
/// four products), converts it and fused-multiply-adds it with d_w·d_y; the mins go into a
/// four-lane accumulator, dmin_w·(−d_y) times the exact Σ m·(pair sums of the activations),
/// its lanes summed and added after `hsum_float_8`. Here, as for q6_K, each row's quants are
/// read 64 bytes at a time: the low nibbles of bytes 64h..64h+64 are sub-blocks 4h (lower
/// half) and 4h + 2 (upper), the high nibbles 4h + 1 and 4h + 3; dword lane m of each holds
/// elements 4m..4m+3 of a sub-block, ggml's lane m mod 8, so the two halves of a row's sums
/// added are ggml's integers. Each vector's four-product sums come from `vpdpbusd` (below
/// 2^15 in magnitude: 4·31·128), two vectors' are made the words of one ([`PAIR_WORDS`]) and
/// their scales applied and accumulated by one `vpdpwssd`; the four rows of a quad have their
/// scales and mins unpacked in one 512-bit pass of ggml's bit shuffle. With everything in L1
/// on Zen 4 a superblock of eight rows took 175-180 cycles with four rows' pieces gathered
/// into each vector, 155-160 this way with `vpmaddubsw` and a `vpdpwssd` per vector; the word
/// pairs took q4_K from 104-109 to 96-98 TSC cycles, q5_K from 130-131 to 123 (one
/// multiply and one permute of the scales fewer per two vectors).
///
/// With `Q5`, q5_K (176-byte superblocks: the same d, dmin and scales, then 32 bytes of fifth
/// bits and the same 128 bytes of nibbles): element e of sub-block s takes bit s of byte e of
/// the fifth bits as its value's 16 (ggml's `vec_dot_q5_K_q8_K`, the same lanes and integers
/// as q4_K), and the mins are ggml's q5_K ones: per row and superblock the exact integer
/// Σ m·(pair sums), then `summs = fma(dmin_w·(−d_y), that, summs)`, added after
/// `hsum_float_8`.
#[inline(always)]
unsafe fn q4_k_rows<const Q5: bool, const GF: bool, const IL: bool>(
    wp: [*const u8; 8],
    xp: *const u8,
    nb: usize,
) -> [f32; 8] {
    let block: usize = if Q5 { 176 } else { 144 };
    const Q8K: usize = 292;
    // SAFETY: nb superblocks (144 bytes, q5_K's 176) behind every row and nb q8_K blocks
    // behind xp (caller); the tables are 64 bytes a vector; prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let pair = _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _);
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut acc_m = [_mm512_setzero_ps(); 2];
        for i in 0..nb {
            let xb = xp.add(i * Q8K);
            // (interleaved: the group's superblock i is its eight rows' one after the other)
            let step = if IL { 8 * block } else { block };
            let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * step));
            // [d0 dmin0 d1 dmin1 … d7 dmin7] times [d_y −d_y …]: ggml's d and dmin per row
            let dm = halves_pairs8(&wb);
            let yd = f32_at(xb);
            let ys = _mm512_castpd_ps(_mm512_set1_pd(f64::from_bits(
                yd.to_bits() as u64 | ((-yd).to_bits() as u64) << 32,
            )));
            let dd = _mm512_mul_ps(dm, ys);
            // the activations' sums of 32 (ggml's hadd of the 16 group sums) in every lane
            let bs = _mm256_loadu_si256(xb.add(4 + 256) as *const __m256i);
            let q8s = _mm512_broadcast_i32x4(_mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            ));
            // the activations of code vector c = 2h + n: elements 128h + 32n.. (lower half)
            // and 128h + 64 + 32n.. (upper)
            let mut y = [zero; 4];
            for (c, y) in y.iter_mut().enumerate() {
                let at = xb.add(4 + 128 * (c / 2) + 32 * (c % 2));
                *y =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(at)), load32(at.add(64)));
            }
            for (h, am) in acc_m.iter_mut().enumerate() {
                // the quad's scales and mins: lane j row 4h + j, scales in bytes 0..8
                let u = k4_scales_mins4(quad(&wb, h, 4));
                let prod = _mm512_madd_epi16(_mm512_unpackhi_epi8(u, zero), q8s);
                // q4_K: ggml's four-lane accumulator; q5_K: each row's exact total (its four
                // lanes added, in every lane of its 128-bit lane) in a scalar's FMA
                let prod = if Q5 {
                    let t = _mm512_add_epi32(prod, _mm512_shuffle_epi32::<0b01_00_11_10>(prod));
                    _mm512_add_epi32(t, _mm512_shuffle_epi32::<0b10_11_00_01>(t))
                } else {
                    prod
                };
                *am = _mm512_fmadd_ps(spread::<2, 1>(dd, h as i32), _mm512_cvtepi32_ps(prod), *am);
                let s16 = _mm512_unpacklo_epi8(u, zero);
                let k = Q4Consts {
                    m4,
                    zero,
                    pair,
                    y,
                    s16,
                    d: dd,
                };
                let quad = &wb[4 * h..4 * h + 4];
                acc[2 * h] = q4_k_pair::<0, Q5, GF, IL>(&k, quad, 4 * h, acc[2 * h]);
                acc[2 * h + 1] = q4_k_pair::<1, Q5, GF, IL>(&k, quad, 4 * h, acc[2 * h + 1]);
            }
        }
        let mut out = hsum_pairs(&acc);
        for (h, m) in acc_m.iter().enumerate() {
            if Q5 {
                let mut mv = [0f32; 16];
                _mm512_storeu_ps(mv.as_mut_ptr(), *m);
                for j in 0..4 {
                    out[4 * h + j] += mv[4 * j];
                }
                continue;
            }
            // the mins' four lanes: (m0 + m2) + (m1 + m3), as ggml's `_mm_movehl_ps` and
            // `_mm_movehdup_ps` steps
            let t = _mm512_add_ps(*m, _mm512_permute_ps::<0b01_00_11_10>(*m));
            let u = _mm512_add_ps(t, _mm512_permute_ps::<0b00_00_00_01>(t));
            let mut mv = [0f32; 16];
            _mm512_storeu_ps(mv.as_mut_ptr(), u);
            for j in 0..4 {
                out[4 * h + j] += mv[4 * j];
            }
        }
        out
    }
}

/// The GF(2) matrix (for `vgf2p8affineqb`) that keeps bit `s` of a byte, at bit 4: row 4 of
/// the matrix (its byte 3) selects input bit `s`, every other row is zero.
const fn gf_bit(s: usize) -> i64 {
    1i64 << (24 + s)
}

/// The GF(2) matrix (output bit k from row k, the matrix's byte 7 − k) that takes bits `lo`,
/// `lo + 1` of a byte to bits 4-5 and bits `up`, `up + 1` to bits 0-1, clearing bits 6-7
/// (and 2-3).
const fn gf_q6_bits(lo: usize, up: usize) -> i64 {
    gf_matrix([1 << up, 1 << (up + 1), 0, 0, 1 << lo, 1 << (lo + 1), 0, 0])
}

/// The GF(2) matrix whose output bit k takes the input bits set in `rows[k]` (row k is the
/// matrix's byte 7 − k).
const fn gf_matrix(rows: [u64; 8]) -> i64 {
    let mut m = 0u64;
    let mut k = 0;
    while k < 8 {
        m |= rows[k] << (8 * (7 - k));
        k += 1;
    }
    m as i64
}

/// The GF(2) matrix that makes a q6_K code from a byte holding the code's low four bits in
/// its high nibble and its two high bits at bits 0-1: output bits 0-3 from input bits 4-7,
/// 4-5 from 0-1, bits 6-7 clear.
const GF_Q6_HIGH: i64 = gf_matrix([1 << 4, 1 << 5, 1 << 6, 1 << 7, 1, 2, 0, 0]);

/// The GF(2) matrix that moves a byte's high nibble to its low nibble (output bit k, k < 4,
/// from input bit k + 4: row k is the matrix's byte 7 − k), a shift by four within each byte.
const GF_HIGH_NIBBLE: i64 = {
    let mut m = 0u64;
    let mut k = 0;
    while k < 4 {
        m |= (1u64 << (k + 4)) << (8 * (7 - k));
        k += 1;
    }
    m as i64
};

/// What [`q4_k_pair`] shares within a quad of rows (see [`q4_k_rows`]).
struct Q4Consts {
    m4: __m512i,
    zero: __m512i,
    /// [`PAIR_WORDS`]
    pair: __m512i,
    /// the activations of the four code vectors
    y: [__m512i; 4],
    /// the quad's scales as words: row j's eight at 8j
    s16: __m512i,
    /// [d0 dmin0 d1 dmin1 …] times [d_y −d_y …]
    d: __m512,
}

/// Rows 2P and 2P + 1 of a quad (`w`, its four rows' superblocks; `r0`, its first row)
/// into `acc` (lanes 0-7 row 2P, 8-15 row 2P + 1): each row's 16 dword lanes, lanes l and
/// l + 8 added (ggml's lane l), converted and fused-multiply-added with the row's d. `Q5`:
/// q5_K superblocks, each code plus 16 where its fifth bit is set.
#[inline(always)]
unsafe fn q4_k_pair<const P: usize, const Q5: bool, const GF: bool, const IL: bool>(
    k: &Q4Consts,
    w: &[*const u8],
    r0: usize,
    acc: __m512,
) -> __m512 {
    // SAFETY: a superblock (144 bytes, q5_K's 176) behind w[2P] and w[2P + 1] (caller); the
    // table is 64 bytes a vector; prefetches never fault.
    unsafe {
        if IL {
            prefetch_run(w[2 * P], if Q5 { 2 * 176 } else { 2 * 144 });
        } else {
            prefetch_superblocks::<3, 2>([w[2 * P], w[2 * P + 1]]);
        }
        let mut s = [_mm512_setzero_si512(); 2];
        for (t, s) in s.iter_mut().enumerate() {
            let j = 2 * P + t;
            let q = w[j].add(if Q5 { 48 } else { 16 });
            // q5_K: the 32 bytes of fifth bits in both halves (byte e: element e of every
            // sub-block, bit s for sub-block s)
            let qh = if Q5 {
                _mm512_broadcast_i64x4(load32(w[j].add(16)))
            } else {
                _mm512_setzero_si512()
            };
            let mut sum = _mm512_setzero_si512();
            for (h, pick) in SCALE_PAIR_Q4[j].iter().enumerate() {
                let z = _mm512_loadu_si512(q.add(64 * h) as *const _);
                let codes = if Q5 && GF {
                    // each byte's fifth bit for sub-blocks 4h + n (lower half) and 4h + 2 + n
                    // (upper) moved to its bit 4 alone, and the high nibbles moved down, by
                    // GF(2) bit matrices (one per qword; `gf_bit`, `GF_HIGH_NIBBLE`)
                    let b = |n: usize| {
                        _mm512_gf2p8affine_epi64_epi8::<0>(
                            qh,
                            _mm512_inserti64x4::<1>(
                                _mm512_set1_epi64(gf_bit(4 * h + n)),
                                _mm256_set1_epi64x(gf_bit(4 * h + 2 + n)),
                            ),
                        )
                    };
                    let hi4 =
                        _mm512_gf2p8affine_epi64_epi8::<0>(z, _mm512_set1_epi64(GF_HIGH_NIBBLE));
                    // (z & 15) | b, and (z >> 4) | b
                    [
                        _mm512_ternarylogic_epi32::<0xF8>(b(0), z, k.m4),
                        _mm512_or_si512(hi4, b(1)),
                    ]
                } else {
                    [
                        _mm512_and_si512(z, k.m4),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(z), k.m4),
                    ]
                };
                let dots: [__m512i; 2] = std::array::from_fn(|n| {
                    let code = codes[n];
                    // sub-blocks 4h + n (lower half) and 4h + 2 + n (upper): their bits
                    let code = if Q5 && !GF {
                        let bit = _mm512_inserti64x4::<1>(
                            _mm512_set1_epi8(1 << (4 * h + n)),
                            _mm256_set1_epi8(1 << (4 * h + 2 + n)),
                        );
                        let set = _mm512_test_epi8_mask(qh, bit);
                        _mm512_mask_add_epi8(code, set, code, _mm512_set1_epi8(16))
                    } else {
                        code
                    };
                    dpbusd(k.zero, code, k.y[2 * h + n])
                });
                // lanes m and m + 8 of both as the word pairs of dwords m and 8 + m, times
                // the scales of sub-blocks 4h, 4h + 2 (dwords 0-7) and 4h + 1, 4h + 3 (8-15)
                let words = _mm512_permutex2var_epi16(dots[0], k.pair, dots[1]);
                let pick = _mm512_loadu_si512(pick.as_ptr() as *const _);
                let scale = _mm512_permutexvar_epi16(pick, k.s16);
                sum = dpwssd(sum, words, scale);
            }
            *s = sum;
        }
        let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(s[0], s[1]);
        let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(s[0], s[1]);
        let sum = _mm512_add_epi32(lo, hi);
        // d of rows r0 + 2P and r0 + 2P + 1: lanes 2r of k.d
        let (a, b) = (2 * (r0 + 2 * P) as i32, 2 * (r0 + 2 * P + 1) as i32);
        let pick = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        let d = _mm512_permutexvar_ps(pick, k.d);
        _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc)
    }
}

/// `vpermw` indices that give q2_K's code vector s of a pair of rows, its sums paired into
/// words by [`PAIR_WORDS`] (row 2P's in dwords 0..8, row 2P + 1's in 8..16), their scales:
/// the pair's 32 scales are words 0..16 (row 2P) and 16..32 of one vector. Dword m (m < 8)
/// holds row 2P's dwords m (half 0: sub-block 2s + m/4) and m + 8 (half 1: sub-block
/// 8 + 2s + m/4); dword 8 + m the same of row 2P + 1.
static SCALE_PAIR_Q2: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut s = 0;
    while s < 4 {
        let mut m = 0;
        while m < 8 {
            let c = 2 * s + m / 4;
            t[s][2 * m] = c as u16;
            t[s][2 * m + 1] = (8 + c) as u16;
            t[s][16 + 2 * m] = (16 + c) as u16;
            t[s][17 + 2 * m] = (24 + c) as u16;
            m += 1;
        }
        s += 1;
    }
    t
};

/// The GF(2) matrix that takes bits `2s`, `2s + 1` of a byte to bits 0-1, every other bit
/// clear (a q2_K code).
const fn gf_q2_code(s: usize) -> i64 {
    gf_matrix([1 << (2 * s), 1 << (2 * s + 1), 0, 0, 0, 0, 0, 0])
}

/// q2_K's and q3_K's step of a pair of rows for code vector `c`: its `vpdpbusd` sums of both
/// rows (`dots`, every dword below 2^15 in magnitude) made the words of one vector
/// ([`PAIR_WORDS`]: a row's dwords m and m + 8, one ggml lane, as the two words of dword m,
/// row 2P's in dwords 0..8 and row 2P + 1's in 8..16), scaled by the pair's scale words `sc`
/// ([`SCALE_PAIR_Q2`]) and added to `sum` by one `vpdpwssd`.
#[inline(always)]
unsafe fn pair_scaled(
    sum: __m512i,
    c: usize,
    dots: [__m512i; 2],
    pair: __m512i,
    sc: __m512i,
) -> __m512i {
    // SAFETY: register arithmetic and a 64-byte table read; the CPU has AVX-512 VNNI (caller).
    unsafe {
        let words = _mm512_permutex2var_epi16(dots[0], pair, dots[1]);
        let pick = _mm512_loadu_si512(SCALE_PAIR_Q2[c].as_ptr() as *const _);
        dpwssd(sum, words, _mm512_permutexvar_epi16(pick, sc))
    }
}

/// `fma(f, sum, acc)` for a pair of rows whose exact integer sums are `sum` (row 2P's eight
/// lanes, then row 2P + 1's) with `f` lane `lane` of `scales` for the first eight lanes and
/// lane `lane + STEP` for the others.
#[inline(always)]
unsafe fn fma_pair<const STEP: i32>(
    acc: __m512,
    scales: __m512,
    lane: i32,
    sum: __m512i,
) -> __m512 {
    // SAFETY: register arithmetic only (caller: AVX-512 F).
    unsafe {
        let step = _mm512_maskz_set1_epi32(0xff00, STEP);
        let pick = _mm512_add_epi32(_mm512_set1_epi32(lane), step);
        let f = _mm512_permutexvar_ps(pick, scales);
        _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sum), acc)
    }
}

/// The activations of q2_K's and q3_K's code vector s (a row's 64 bytes of 2-bit codes
/// shifted by 2s) from the q8_K block at `xb`: elements 32s.. in the lower half, 128 + 32s..
/// in the upper.
#[inline(always)]
unsafe fn shift_acts(xb: *const u8) -> [__m512i; 4] {
    // SAFETY: one q8_K block at xb (caller).
    unsafe {
        let mut y = [_mm512_setzero_si512(); 4];
        for (s, y) in y.iter_mut().enumerate() {
            let at = xb.add(4 + 32 * s);
            *y = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(at)), load32(at.add(128)));
        }
        y
    }
}

/// q2_K against q8_K. ggml's kernel (`vec_dot_q2_K_q8_K`, AVX2) per superblock and lane l:
/// first `fma(dmin_w·(−d_y), Σ m·bsums, acc)` with the exact pair sums of the 4-bit mins
/// times the activations' group sums (`vpmaddwd`), then `fma(d_w·d_y, sumi, acc)` with the
/// exact Σ sc·(four products) of the lane's elements 4l..4l + 3 of every 32-element piece,
/// and `hsum_float_8` at the end. Here a row's 64 bytes of 2-bit codes are one vector:
/// shift s of its half j (bytes 32j..32j + 32) is elements 128j + 32s.., so code vector s
/// (`(z >> 2s) & 3`, or one GF(2) bit matrix) against the activations of those elements
/// gives in dword m ggml's lane m mod 8 of sub-block 8j + 2s + (m mod 8)/4 (j = m/8). The
/// sums (below 2^15: 4·3·127) of code vector s of two rows are paired into words
/// ([`PAIR_WORDS`]: a dword's two words are a row's two halves, the same ggml lane) and
/// scaled and accumulated by one `vpdpwssd`, so a pair of rows sums into row 2P's eight lanes
/// then row 2P + 1's, the accumulators' layout, with no shuffles. A pair's mins are one
/// vector too (`vpmaddwd` against the group sums in both halves). With everything in L1 on
/// Zen 4: 87 TSC cycles an eight-row superblock (95 with each row's two code vectors paired
/// as q4_K's and a shuffle to add a row's halves).
#[inline(always)]
unsafe fn q2_k_rows<const GF: bool>(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    const BLOCK: usize = 84;
    const Q8K: usize = 292;
    // SAFETY: nb superblocks (84 bytes) behind every row and nb q8_K blocks behind xp
    // (caller); the tables are 64 bytes a vector; prefetches never fault.
    unsafe {
        let m3 = _mm512_set1_epi8(3);
        let m4 = _mm256_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let pair = _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _);
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in 0..nb {
            let xb = xp.add(i * Q8K);
            let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * BLOCK));
            // [d0 dmin0 d1 dmin1 … d7 dmin7] times [d_y −d_y …]: ggml's d and dmin per row
            let dm = halves_pairs8(&wb.map(|p| p.add(80)));
            let yd = f32_at(xb);
            let ys = _mm512_castpd_ps(_mm512_set1_pd(f64::from_bits(
                yd.to_bits() as u64 | ((-yd).to_bits() as u64) << 32,
            )));
            let dd = _mm512_mul_ps(dm, ys);
            // the activations' 16 group sums in both 256-bit halves
            let bs = _mm512_broadcast_i64x4(load32(xb.add(4 + 256)));
            let y = shift_acts(xb);
            for (p, acc) in acc.iter_mut().enumerate() {
                let (a, b) = (wb[2 * p], wb[2 * p + 1]);
                prefetch_superblocks::<2, 2>([a, b]);
                // both rows' scale bytes: the 4-bit scales and mins as words, row 2p's first
                let v = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
                    _mm_loadu_si128(b as *const __m128i),
                );
                let sc = _mm512_cvtepu8_epi16(_mm256_and_si256(v, m4));
                let mn = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                // the mins first, as ggml: fma(dmin, Σ m·bsums, acc) (dd's lanes 2r + 1)
                let prod = _mm512_madd_epi16(mn, bs);
                *acc = fma_pair::<2>(*acc, dd, 4 * p as i32 + 1, prod);
                let z = [a, b].map(|r| _mm512_loadu_si512(r.add(16) as *const _));
                let mut sum = zero;
                for (c, &y) in y.iter().enumerate() {
                    let mut dots = [zero; 2];
                    for (dot, &z) in dots.iter_mut().zip(&z) {
                        let code = if c == 0 {
                            _mm512_and_si512(z, m3)
                        } else if GF {
                            _mm512_gf2p8affine_epi64_epi8::<0>(z, _mm512_set1_epi64(gf_q2_code(c)))
                        } else {
                            let sh = _mm512_srl_epi16(z, _mm_cvtsi32_si128(2 * c as i32));
                            _mm512_and_si512(sh, m3)
                        };
                        *dot = dpbusd(zero, code, y);
                    }
                    sum = pair_scaled(sum, c, dots, pair, sc);
                }
                *acc = fma_pair::<2>(*acc, dd, 4 * p as i32, sum);
            }
        }
        hsum_pairs(&acc)
    }
}

/// The GF(2) matrix that takes bit `k` of a byte to bit 2, every other bit clear (q3_K's
/// high bit of a code).
const fn gf_q3_high(k: usize) -> i64 {
    gf_matrix([0, 0, 1 << k, 0, 0, 0, 0, 0])
}

/// q3_K's scales of two rows (12 bytes at `a` and at `b`) re-centred (−32..31) as the words of
/// one vector: row a's 16, then row b's (ggml's `q3k_scales` unpacking, both rows at once).
#[inline(always)]
unsafe fn q3k_scales_pair(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: 12 readable bytes at a and at b (caller).
    unsafe {
        let q = |p: *const u8| (p as *const i64).read_unaligned();
        let d = |p: *const u8| (p.add(8) as *const i32).read_unaligned();
        // [a0 a1 a0 a1] >> [0 0 4 4] & 0x0f per row: the low four bits of each scale
        let a01 = _mm256_setr_epi64x(q(a), q(a), q(b), q(b));
        let low = _mm256_srlv_epi32(a01, _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4));
        let low = _mm256_and_si256(low, _mm256_set1_epi32(0x0f0f_0f0f));
        // ([a2 a2 a2 a2] >> [0 2 4 6] & 0x03) << 4: the two high bits
        let (da, db) = (d(a), d(b));
        let a2 = _mm256_setr_epi32(da, da, da, da, db, db, db, db);
        let high = _mm256_srlv_epi32(a2, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
        let high = _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(0x0303_0303)));
        let sc = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
        _mm512_cvtepi8_epi16(sc)
    }
}

/// q3_K against q8_K. ggml's kernel (`vec_dot_q3_K_q8_K`, AVX2) sums per superblock and lane
/// l the exact Σ sc·(four products) of the lane's elements 4l..4l + 3 of every 32-element
/// piece, each value (the 2-bit low part) − 4 where its bit in `hmask` is clear, and
/// fused-multiply-adds it with d_w·d_y; `hsum_float_8` at the end. Here as for q2_K
/// ([`q2_k_rows`]): a row's 64 bytes of low bits are one vector, code vector s of half j
/// takes its third bit from bit 4j + s of the 32 `hmask` bytes (both halves of a vector
/// holding them; with GFNI one bit matrix per half), so the unsigned code is value + 4 and
/// each `vpdpbusd` starts from −4·(the four activations' sum), shared by the eight rows; the
/// sums (below 2^15: 4·4·127) of code vector s of two rows are paired into words and one
/// `vpdpwssd` applies both rows' signed scales, into row 2P's eight lanes then row 2P + 1's.
#[inline(always)]
unsafe fn q3_k_rows<const GF: bool>(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
    const BLOCK: usize = 110;
    const Q8K: usize = 292;
    // SAFETY: nb superblocks (110 bytes) behind every row and nb q8_K blocks behind xp
    // (caller); the tables are 64 bytes a vector; prefetches never fault.
    unsafe {
        let m3 = _mm512_set1_epi8(3);
        let zero = _mm512_setzero_si512();
        let pair = _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _);
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in 0..nb {
            let xb = xp.add(i * Q8K);
            let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * BLOCK));
            // ggml's d = d_y·d_w per row, in lanes 0..8
            let h = |r: usize| (wb[r].add(108) as *const i16).read_unaligned();
            let dw = _mm256_cvtph_ps(_mm_setr_epi16(
                h(0),
                h(1),
                h(2),
                h(3),
                h(4),
                h(5),
                h(6),
                h(7),
            ));
            let dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(f32_at(xb)), dw));
            // −4 times the sums of the fours of each code vector's activations
            let y = shift_acts(xb);
            let mut neg4 = [zero; 4];
            for (n, y) in neg4.iter_mut().zip(&y) {
                *n = _mm512_sub_epi32(zero, dpbusd(zero, _mm512_set1_epi8(4), *y));
            }
            for (p, acc) in acc.iter_mut().enumerate() {
                let (a, b) = (wb[2 * p], wb[2 * p + 1]);
                prefetch_superblocks::<2, 2>([a, b]);
                let sc = q3k_scales_pair(a.add(96), b.add(96));
                let z = [a, b].map(|r| _mm512_loadu_si512(r.add(32) as *const _));
                let hm = [a, b].map(|r| _mm512_broadcast_i64x4(load32(r)));
                let mut sum = zero;
                for (c, (&y, &neg4)) in y.iter().zip(&neg4).enumerate() {
                    let mut dots = [zero; 2];
                    for t in 0..2 {
                        let (z, hm) = (z[t], hm[t]);
                        let code = if GF {
                            // bit c (lower half) or 4 + c (upper) of hmask at bit 2
                            let hb = _mm512_gf2p8affine_epi64_epi8::<0>(
                                hm,
                                _mm512_inserti64x4::<1>(
                                    _mm512_set1_epi64(gf_q3_high(c)),
                                    _mm256_set1_epi64x(gf_q3_high(4 + c)),
                                ),
                            );
                            if c == 0 {
                                // (z & 3) | hb
                                _mm512_ternarylogic_epi32::<0xEA>(z, m3, hb)
                            } else {
                                let lo = _mm512_gf2p8affine_epi64_epi8::<0>(
                                    z,
                                    _mm512_set1_epi64(gf_q2_code(c)),
                                );
                                _mm512_or_si512(lo, hb)
                            }
                        } else {
                            let lo = if c == 0 {
                                z
                            } else {
                                _mm512_srl_epi16(z, _mm_cvtsi32_si128(2 * c as i32))
                            };
                            let lo = _mm512_and_si512(lo, m3);
                            let bit = _mm512_inserti64x4::<1>(
                                _mm512_set1_epi8(1 << c),
                                _mm256_set1_epi8(1 << (4 + c)),
                            );
                            let set = _mm512_test_epi8_mask(hm, bit);
                            _mm512_mask_add_epi8(lo, set, lo, _mm512_set1_epi8(4))
                        };
                        dots[t] = dpbusd(neg4, code, y);
                    }
                    sum = pair_scaled(sum, c, dots, pair, sc);
                }
                *acc = fma_pair::<1>(*acc, dd, 2 * p as i32, sum);
            }
        }
        hsum_pairs(&acc)
    }
}

/// `vpermw` indices for q6_K's half h2 as [`PAIR_WORDS`] pairs the sums of its vectors c = 2h2
/// and 2h2 + 1 (a 64-element vector's 128-bit lane j takes scale word 4c + j): dword m (m < 8)
/// scales 4c + m/4 and 4c + 2 + m/4 of c = 2h2, dword 8 + m the same of c = 2h2 + 1.
static SCALE_PAIR_Q6: [[u16; 32]; 2] = {
    let mut t = [[0u16; 32]; 2];
    let mut h2 = 0;
    while h2 < 2 {
        let mut m = 0;
        while m < 8 {
            let (c0, c1) = (4 * (2 * h2) + m / 4, 4 * (2 * h2 + 1) + m / 4);
            t[h2][2 * m] = c0 as u16;
            t[h2][2 * m + 1] = (c0 + 2) as u16;
            t[h2][16 + 2 * m] = c1 as u16;
            t[h2][17 + 2 * m] = (c1 + 2) as u16;
            m += 1;
        }
        h2 += 1;
    }
    t
};

/// `vpermt2w` indices that make word pairs of two vectors of dword sums `a` and `b` whose
/// lanes m and m + 8 are one ggml lane (sums that fit in 16 bits): dword m of the result
/// holds a's lanes m and m + 8 as its low and high word, dword 8 + m b's. One `vpdpwssd` then
/// scales and adds both vectors' sums (two `vpdpbusd` and this, where `vpmaddubsw` and
/// `vpdpwssd` for each took one more multiply and one more permute of the scales).
static PAIR_WORDS: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut m = 0;
    while m < 8 {
        t[2 * m] = (2 * m) as u16;
        t[2 * m + 1] = (16 + 2 * m) as u16;
        t[16 + 2 * m] = (32 + 2 * m) as u16;
        t[17 + 2 * m] = (48 + 2 * m) as u16;
        m += 1;
    }
    t
};

/// `vpermw` indices into a quad's scales (row j's eight words at 8j) for row j's half h as
/// [`PAIR_WORDS`] pairs its sums: sub-blocks 4h (low words of dwords 0-7), 4h + 2 (their high
/// words), 4h + 1 and 4h + 3 (dwords 8-15).
static SCALE_PAIR_Q4: [[[u16; 32]; 2]; 4] = {
    let mut t = [[[0u16; 32]; 2]; 4];
    let mut j = 0;
    while j < 4 {
        let mut h = 0;
        while h < 2 {
            let mut m = 0;
            while m < 8 {
                let s = 8 * j + 4 * h;
                t[j][h][2 * m] = s as u16;
                t[j][h][2 * m + 1] = (s + 2) as u16;
                t[j][h][16 + 2 * m] = (s + 1) as u16;
                t[j][h][17 + 2 * m] = (s + 3) as u16;
                m += 1;
            }
            h += 1;
        }
        j += 1;
    }
    t
};

/// ggml's q4_K scale/min unpacking for four rows at once: 16 bytes a 128-bit lane (a row's 12
/// scale bytes first) to its eight 6-bit scales (bytes 0..8) and eight mins (bytes 8..16).
#[inline(always)]
unsafe fn k4_scales_mins4(v: __m512i) -> __m512i {
    // SAFETY: register arithmetic only.
    unsafe {
        // words u0 u1 u2 (and one ignored) in the four dwords of each lane
        let low6 = _mm512_and_si512(v, _mm512_set1_epi32(0x3f3f_3f3f));
        // ((u >> 6) & 0x03030303) << 4 for u0, u1
        let top2 = _mm512_and_si512(_mm512_srli_epi32::<2>(v), _mm512_set1_epi32(0x3030_3030));
        // u2 & 0x0f0f0f0f, (u2 >> 4) & 0x0f0f0f0f
        let u2 = _mm512_srlv_epi32(
            _mm512_shuffle_epi32::<0xAA>(v),
            _mm512_setr_epi32(0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0),
        );
        let mixed = _mm512_or_si512(_mm512_and_si512(u2, _mm512_set1_epi32(0x0f0f_0f0f)), top2);
        _mm512_unpacklo_epi32(low6, mixed)
    }
}

/// 32 bytes at `p[4h + j] + off` for the four rows of quad `h`: bytes 0..16 of row 4h + j in
/// 128-bit lane j of the first vector, bytes 16..32 in the same lane of the second.
#[inline(always)]
unsafe fn quad_pair(p: &[*const u8; 8], h: usize, off: usize) -> [__m512i; 2] {
    // SAFETY: 32 readable bytes at every address (caller).
    unsafe {
        let a = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(load32(p[4 * h].add(off))),
            load32(p[4 * h + 1].add(off)),
        );
        let b = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(load32(p[4 * h + 2].add(off))),
            load32(p[4 * h + 3].add(off)),
        );
        [
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        ]
    }
}

/// The 32 bytes at `p`.
#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: 32 readable bytes at p (caller).
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// q6_K against q8_K. ggml's kernel multiplies the unsigned 6-bit codes (value + 32) by the
/// activations in pairs (`vpmaddubsw`), applies each 16-element group's signed scale to the
/// pair sums (`vpmaddwd`) and sums, per superblock and lane l, the exact integer
/// Σ scale·(products of the lane's four elements of every 32) − 32·(sc_2l·bs_2l +
/// sc_2l+1·bs_2l+1) (bs: the activations' group sums; the second term takes out the codes'
/// offset), converts it and fused-multiply-adds it with d_w·d_y. Here each row is taken 64
/// contiguous elements at a time, so its bytes are plain loads (no gathering of four rows
/// into one vector): dword lane m of a 64-element vector holds elements 4m..4m+3, which ggml
/// puts in lane m mod 8, so the two 256-bit halves of a row's sums added give ggml's lanes
/// (the same integers; converted and accumulated as ggml does, the same bits). The scale is
/// one word repeated across each 128-bit lane (one 16-element group); each vector's sums come
/// from `vpdpbusd` (|4·63·128| < 2^15), two vectors' are made the words of one
/// ([`PAIR_WORDS`]) and their scales applied and accumulated by one `vpdpwssd` (with
/// everything in L1 on Zen 4, 124 TSC cycles an eight-row superblock with `vpmaddubsw` and
/// a `vpdpwssd` per vector, 117 this way). With `GF` (the CPU has GFNI) the codes' two high
/// bits are placed by `vgf2p8affineqb` bit matrices (four operations for a 128-element half
/// where shifts and masks took five), and the offset term takes two operations instead of
/// three: 101 cycles. The earlier layout, 16 elements of four rows a vector, took two
/// loads, an insert and a shuffle for every 64 bytes: on Zen 4 an eight-row superblock with
/// everything in L1 took 230-270 cycles that way, 185-210 this way (q6_K 4096² mat-vec, one
/// thread: 0.94-0.96x ggml before, 1.09x after).
#[inline(always)]
unsafe fn q6_k_rows<const IL: bool, const GF: bool>(
    wp: [*const u8; 8],
    xp: *const u8,
    nb: usize,
) -> [f32; 8] {
    const BLOCK: usize = 210;
    const Q8K: usize = 292;
    // SAFETY: nb 210-byte superblocks behind every row and nb q8_K blocks behind xp (caller);
    // the tables are 64 bytes each; prefetches never fault.
    unsafe {
        let m4 = _mm512_set1_epi8(15);
        let m30 = _mm512_set1_epi8(0x30);
        // the high bits of elements 0-31 of a half are bits 0-1 of its 32 qh bytes, of 32-63
        // bits 2-3, of 64-95 bits 4-5 and of 96-127 bits 6-7: with qh in both 256-bit halves,
        // word shifts left by 4 | 2 and right by 0 | 2 bring them to bits 4-5
        let shl = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
        let shr = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
        // with GFNI, one bit matrix that takes the low nibbles' two high bits (qh bits 0-1 |
        // 2-3) to bits 4-5 and the high nibbles' (4-5 | 6-7) to bits 0-1, clearing bits 6-7;
        // and one that turns (high nibble, two bits at 0-1) into a code
        let gf = [
            _mm512_inserti64x4::<1>(
                _mm512_set1_epi64(gf_q6_bits(0, 4)),
                _mm256_set1_epi64x(gf_q6_bits(2, 6)),
            ),
            _mm512_set1_epi64(GF_Q6_HIGH),
        ];
        let pick = SCALE_PAIR_Q6.map(|t| _mm512_loadu_si512(t.as_ptr() as *const _));
        let pair = _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _);
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in 0..nb {
            let xb = xp.add(i * Q8K);
            let step = if IL { 8 * BLOCK } else { BLOCK };
            let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * step));
            // ggml's d = d_y·d_w per row
            let d = _mm256_mul_ps(_mm256_set1_ps(f32_at(xb)), halves8(&wb, 208));
            let d = _mm512_castps256_ps512(d);
            let y = [
                _mm512_loadu_si512(xb.add(4) as *const _),
                _mm512_loadu_si512(xb.add(68) as *const _),
                _mm512_loadu_si512(xb.add(132) as *const _),
                _mm512_loadu_si512(xb.add(196) as *const _),
            ];
            let bs = _mm256_sub_epi16(_mm256_setzero_si256(), load32(xb.add(260)));
            // two rows at a time (written out, so the accumulators stay in registers)
            let k = Q6Consts {
                m4,
                m30,
                shl,
                shr,
                gf,
                pick,
                pair,
                y,
                bs,
                d,
            };
            acc[0] = q6_k_pair::<0, IL, GF>(&k, &wb, acc[0]);
            acc[1] = q6_k_pair::<1, IL, GF>(&k, &wb, acc[1]);
            acc[2] = q6_k_pair::<2, IL, GF>(&k, &wb, acc[2]);
            acc[3] = q6_k_pair::<3, IL, GF>(&k, &wb, acc[3]);
        }
        hsum_pairs(&acc)
    }
}

/// What [`q6_k_pair`] shares across rows within a superblock (see [`q6_k_rows`]).
struct Q6Consts {
    m4: __m512i,
    m30: __m512i,
    shl: __m512i,
    shr: __m512i,
    /// GF(2) matrices: [`gf_q6_bits`] (qh's bits to both nibbles' places) and [`GF_Q6_HIGH`]
    gf: [__m512i; 2],
    pick: [__m512i; 2],
    /// [`PAIR_WORDS`]
    pair: __m512i,
    /// the superblock's 256 activations, 64 a vector
    y: [__m512i; 4],
    /// its 16 group sums, negated
    bs: __m256i,
    /// d_y·d_w of the eight rows in lanes 0-7
    d: __m512,
}

/// One q6_K superblock of one row: its 16 dword lanes, whose lanes l and l + 8 added are
/// ggml's lane l, the codes' offset −32·(sc_2l·bs_2l + sc_2l+1·bs_2l+1) included.
#[inline(always)]
unsafe fn q6_k_row<const GF: bool>(k: &Q6Consts, w: *const u8) -> __m512i {
    // SAFETY: a 210-byte superblock at w (caller).
    unsafe {
        let scw = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(192) as *const __m128i));
        let scz = _mm512_castsi256_si512(scw);
        // the two halves of the superblock into two sums, the first starting from
        // −32·(sc_2l·bs_2l + sc_2l+1·bs_2l+1) in lanes 0-7: the negated group sums times the
        // scales · 32 (|32·sc| ≤ 4096, so words). (One chain through both halves took 96
        // cycles in L1 instead of 101, but from memory its mat-vec was slower: 256 MiB, one
        // thread, eight alternated rounds, medians 22.3 GB/s plain and 19.3 interleaved
        // against 22.9 and 21.6.)
        let off = _mm256_madd_epi16(k.bs, _mm256_slli_epi16::<5>(scw));
        let mut sum = [_mm512_castsi256_si512(off), _mm512_setzero_si512()];
        for (h2, sum) in sum.iter_mut().enumerate() {
            let ql = _mm512_loadu_si512(w.add(64 * h2) as *const _);
            let qh = _mm512_broadcast_i64x4(load32(w.add(128 + 32 * h2)));
            // code = low four bits | two high bits << 4
            let (lo, up) = if GF {
                // h: the low nibbles' high bits at 4-5, the high nibbles' at 0-1, 6-7 clear;
                // lo = m4 ? ql : h; u = m4 ? h : ql, whose high nibble and bits 0-1 one more
                // matrix rearranges into the code
                let h = _mm512_gf2p8affine_epi64_epi8::<0>(qh, k.gf[0]);
                let lo = _mm512_ternarylogic_epi32::<0xE4>(ql, h, k.m4);
                let u = _mm512_ternarylogic_epi32::<0xE4>(h, ql, k.m4);
                (lo, _mm512_gf2p8affine_epi64_epi8::<0>(u, k.gf[1]))
            } else {
                // (A & 15) | B
                let hi = _mm512_and_si512(_mm512_sllv_epi16(qh, k.shl), k.m30);
                let lo = _mm512_ternarylogic_epi32::<0xEC>(ql, hi, k.m4);
                let hi = _mm512_and_si512(_mm512_srlv_epi16(qh, k.shr), k.m30);
                let up = _mm512_srli_epi16::<4>(ql);
                (lo, _mm512_ternarylogic_epi32::<0xEC>(up, hi, k.m4))
            };
            let zero = _mm512_setzero_si512();
            let dots = [
                dpbusd(zero, lo, k.y[2 * h2]),
                dpbusd(zero, up, k.y[2 * h2 + 1]),
            ];
            let words = _mm512_permutex2var_epi16(dots[0], k.pair, dots[1]);
            let scale = _mm512_permutexvar_epi16(k.pick[h2], scz);
            *sum = dpwssd(*sum, words, scale);
        }
        _mm512_add_epi32(sum[0], sum[1])
    }
}

/// Rows 2P and 2P + 1 of a q6_K superblock into `acc` (lanes 0-7 row 2P, 8-15 row 2P + 1):
/// lane l + lane l + 8 of each row's sums, converted and fused-multiply-added with the row's
/// d.
#[inline(always)]
unsafe fn q6_k_pair<const P: usize, const IL: bool, const GF: bool>(
    k: &Q6Consts,
    wb: &[*const u8; 8],
    acc: __m512,
) -> __m512 {
    // SAFETY: a 210-byte superblock behind every row (caller); prefetches never fault.
    unsafe {
        // into L2 far ahead and into L1 near (see `Q6_PREFETCH_L2`)
        if IL {
            prefetch_run(wb[2 * P], 2 * 210);
            prefetch_lines::<_MM_HINT_T0>(wb[2 * P].wrapping_add(Q6_PREFETCH_L1_RUN), 2 * 210);
        } else {
            prefetch_ahead::<Q6_PREFETCH_L2, _MM_HINT_T1, 4, 2>([wb[2 * P], wb[2 * P + 1]]);
            prefetch_superblocks::<4, 2>([wb[2 * P], wb[2 * P + 1]]);
        }
        let s0 = q6_k_row::<GF>(k, wb[2 * P]);
        let s1 = q6_k_row::<GF>(k, wb[2 * P + 1]);
        let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(s0, s1);
        let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(s0, s1);
        let sum = _mm512_add_epi32(lo, hi);
        let (a, b) = (2 * P as i32, 2 * P as i32 + 1);
        let pick = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        let d = _mm512_permutexvar_ps(pick, k.d);
        _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc)
    }
}

/// ggml's `hsum_float_8` of each row's eight lanes, two rows a vector (lanes 0-7, 8-15):
/// with s_l = l_l + l_{l+4}, (s0 + s2) + (s1 + s3).
#[inline(always)]
unsafe fn hsum_pairs(acc: &[__m512; 4]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for (p, a) in acc.iter().enumerate() {
        let mut l = [0f32; 16];
        // SAFETY: 16 writable f32.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *a) };
        for (s, o) in out[2 * p..2 * p + 2].iter_mut().enumerate() {
            let v = &l[8 * s..8 * s + 8];
            let t: [f32; 4] = std::array::from_fn(|j| v[j] + v[j + 4]);
            *o = (t[0] + t[2]) + (t[1] + t[3]);
        }
    }
    out
}

/// `acc + a·b` by word pairs into dwords (`vpdpwssd`), as one instruction: the compiler
/// otherwise splits the intrinsic into `vpmaddwd` and `vpaddd`.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: register arithmetic only; the CPU has AVX-512 VNNI (caller).
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// `acc + a·b` by unsigned × signed byte quads into dwords (`vpdpbusd`), as one instruction.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpbusd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: register arithmetic only; the CPU has AVX-512 VNNI (caller).
    unsafe {
        std::arch::asm!(
            "vpdpbusd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// The little-endian f32 at `p`.
#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    // SAFETY: four readable bytes at p (caller).
    unsafe { (p as *const f32).read_unaligned() }
}
