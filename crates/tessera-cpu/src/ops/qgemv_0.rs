//! Mat-vec of q4_0, q4_1 and iq4_nl on AVX-512 VNNI: eight weight rows against one activation
//! row (q8_0; q8_1 for q4_1) per call, four rows to a 512-bit vector.
//!
//! ggml's x86 `vec_dot` of these types gives each row eight f32 lanes, lane `l` summing
//! elements `4l..4l+3` of every block as an exact integer, converted and fused-multiply-added
//! with the block's scale product, the lanes summed at the end in `hsum_float_8`'s order. Here
//! a 128-bit lane of one vector holds lanes 0..4 of one row (the block's first 16 elements, its
//! low nibbles) and the same lane of a second vector holds lanes 4..8 (its high nibbles), so
//! four rows' blocks take two `vpdpbusd`, two conversions and two FMAs where the 256-bit
//! four-row kernels take eight of each. Every lane sees the same integers and the same float
//! operations in the same order as in `vec_dot`, and the final sums are `hsum_float_8`'s, so
//! each result is bit-identical to `vec_dot`'s (tests: `matmul_quant`'s
//! `eight_row_kernel_equals_vec_dot` and the mat-vec cases of `tests/matmul_quant.rs`).
//!
//! The integers: q4_0's values n − 8 and iq4_nl's codebook values v are signed, so the
//! unsigned operand of `vpdpbusd` is n (or v + 128, a second codebook) and the signed one the
//! activations; each lane starts from −8·Σy (−128·Σy), computed once per block for all eight
//! rows. q4_1's codes are unsigned already.

use std::arch::x86_64::*;

use tessera::DType;

use super::qdot::avx2::f16;
use super::qdot::KVALUES_IQ4NL;

/// Types with an eight-row kernel here.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q4_1 | DType::IQ4NL)
}

/// `vec_dot` of eight weight rows of `t` (see [`supported`]) with one activation row in its
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
            DType::Q4_0 => offset_rows::<false>(wp, x.as_ptr(), nb),
            DType::IQ4NL => offset_rows::<true>(wp, x.as_ptr(), nb),
            DType::Q4_1 => q4_1_rows(wp, x.as_ptr(), nb),
            _ => unreachable!("no eight-row kernel for {t}"),
        }
    }
}

/// 16 bytes at `p[4h + j] + off` in 128-bit lane j.
#[inline(always)]
unsafe fn quad(p: &[*const u8; 8], h: usize, off: usize) -> __m512i {
    // SAFETY: 16 readable bytes at every address (caller).
    unsafe {
        let l = |j: usize| _mm_loadu_si128(p[4 * h + j].add(off) as *const __m128i);
        let z = _mm512_castsi128_si512(l(0));
        let z = _mm512_inserti32x4::<1>(z, l(1));
        let z = _mm512_inserti32x4::<2>(z, l(2));
        _mm512_inserti32x4::<3>(z, l(3))
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

/// Lane `step·(4h + j)` of `v` in all four lanes of 128-bit lane j.
#[inline(always)]
unsafe fn spread<const STEP: i32>(v: __m512, h: i32) -> __m512 {
    // SAFETY: register arithmetic only.
    unsafe {
        let b = STEP * 4 * h;
        let idx = _mm512_setr_epi32(
            b,
            b,
            b,
            b,
            b + STEP,
            b + STEP,
            b + STEP,
            b + STEP,
            b + 2 * STEP,
            b + 2 * STEP,
            b + 2 * STEP,
            b + 2 * STEP,
            b + 3 * STEP,
            b + 3 * STEP,
            b + 3 * STEP,
            b + 3 * STEP,
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

/// How far ahead of each row's current block the kernels prefetch, bytes (a constant, so
/// that it is an address displacement rather than eight more registers).
pub const PREFETCH: usize = 512;

/// Prefetches `p[r] + PREFETCH` for the eight rows (never faults).
#[inline(always)]
unsafe fn prefetch8(p: &[*const u8; 8]) {
    for &r in p {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch(r.wrapping_add(PREFETCH) as *const i8, _MM_HINT_T0) };
    }
}

/// Block `i` of the eight rows of q4_0 or iq4_nl (see [`offset_rows`]) into `acc`
/// ([half][lo, hi]); `book`: iq4_nl's codebook + 128 in every 128-bit lane.
#[inline(always)]
unsafe fn offset_block<const CODEBOOK: bool>(
    wp: &[*const u8; 8],
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
        let xb = xp.add(i * 34);
        let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(2) as *const __m128i));
        let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(18) as *const __m128i));
        // −off·Σy per lane (exact: |Σ| ≤ 4·128·128)
        let nlo = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, ylo));
        let nhi = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, yhi));
        let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * 18));
        if i.is_multiple_of(2) {
            prefetch8(&wb);
        }
        // ggml's d = d_w·d_y per row (q4_0's product order; iq4_nl's d_y·d_w is the same)
        let d8 = _mm256_mul_ps(halves8(&wb, 0), _mm256_set1_ps(f16(xb)));
        let d16 = _mm512_castps256_ps512(d8);
        for (h, a) in acc.iter_mut().enumerate() {
            let z = quad(&wb, h, 2);
            let mut lo = _mm512_and_si512(z, m4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            if CODEBOOK {
                lo = _mm512_shuffle_epi8(book, lo);
                hi = _mm512_shuffle_epi8(book, hi);
            }
            let d = spread::<1>(d16, h as i32);
            let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nlo, lo, ylo));
            let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nhi, hi, yhi));
            a[0] = _mm512_fmadd_ps(d, plo, a[0]);
            a[1] = _mm512_fmadd_ps(d, phi, a[1]);
        }
    }
}

/// q4_0 (`CODEBOOK` false: values nibble − 8, one accumulator) or iq4_nl (true: values
/// `KVALUES_IQ4NL[nibble]`, ggml's two accumulators, even blocks in one and odd ones in the
/// other, an odd last block added after the sum, as its generic tail computes it).
#[inline(always)]
unsafe fn offset_rows<const CODEBOOK: bool>(
    wp: [*const u8; 8],
    xp: *const u8,
    nb: usize,
) -> [f32; 8] {
    // SAFETY: nb 18-byte blocks behind every row and nb q8_0 blocks behind xp (caller).
    unsafe {
        // the unsigned operand: the nibble itself (q4_0) or its value + 128 (iq4_nl)
        let book = if CODEBOOK {
            let mut b = [0u8; 16];
            for (o, &v) in b.iter_mut().zip(KVALUES_IQ4NL.iter()) {
                *o = (v as i16 + 128) as u8;
            }
            _mm512_broadcast_i32x4(_mm_loadu_si128(b.as_ptr() as *const __m128i))
        } else {
            _mm512_setzero_si512()
        };
        // [parity][half][lo, hi]
        let [mut even, mut odd] = [[[_mm512_setzero_ps(); 2]; 2]; 2];
        // (iq4_nl: whole pairs of blocks, even ones into `even` and odd ones into `odd`)
        let body = if CODEBOOK { nb / 2 * 2 } else { nb };
        let mut i = 0;
        while i + 2 <= body {
            offset_block::<CODEBOOK>(&wp, xp, i, book, &mut even);
            offset_block::<CODEBOOK>(
                &wp,
                xp,
                i + 1,
                book,
                if CODEBOOK { &mut odd } else { &mut even },
            );
            i += 2;
        }
        if i < body {
            offset_block::<CODEBOOK>(&wp, xp, i, book, &mut even);
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
                (acc[0][h][0], acc[0][h][1])
            };
            out[4 * h..4 * h + 4].copy_from_slice(&hsum4(lo, hi));
        }
        if CODEBOOK && body < nb {
            for (r, o) in out.iter_mut().enumerate() {
                *o += super::qdot::avx2::iq4_nl_odd_block(wp[r].add(body * 18), xp.add(body * 34));
            }
        }
        out
    }
}

/// q4_1 against q8_1: ggml's Σ codes·y times d·d_y per lane and its fused running Σ m·s.
#[inline(always)]
unsafe fn q4_1_rows(wp: [*const u8; 8], xp: *const u8, nb: usize) -> [f32; 8] {
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
            let wb: [*const u8; 8] = std::array::from_fn(|r| wp[r].add(i * 20));
            if i.is_multiple_of(2) {
                prefetch8(&wb);
            }
            // [d0 m0 d1 m1 … d7 m7]: each row's adjacent f16 pair
            let r = |j: usize| (wb[j] as *const u32).read_unaligned() as u64;
            let dm = _mm512_cvtph_ps(_mm256_setr_epi64x(
                (r(0) | r(1) << 32) as i64,
                (r(2) | r(3) << 32) as i64,
                (r(4) | r(5) << 32) as i64,
                (r(6) | r(7) << 32) as i64,
            ));
            summs = _mm512_fmadd_ps(dm, xs, summs); // fused, as GCC builds ggml's
            let d16 = _mm512_mul_ps(dm, xs);
            for (h, a) in acc.iter_mut().enumerate() {
                let z = quad(&wb, h, 4);
                let lo = _mm512_and_si512(z, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
                let d = spread::<2>(d16, h as i32);
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
            for (j, v) in hsum4(acc[h][0], acc[h][1]).into_iter().enumerate() {
                out[4 * h + j] = v + s[2 * (4 * h + j) + 1];
            }
        }
        out
    }
}
