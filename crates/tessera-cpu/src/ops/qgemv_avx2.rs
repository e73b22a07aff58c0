//! Mat-vec of q4_0 and q4_1 rows interleaved by eight (`tessera::layout`'s `Interleaved8`) on
//! AVX2 and AVX-VNNI: one group of eight rows against one activation row (q8_0; q8_1 for q4_1)
//! per call, two rows to a 256-bit vector.
//!
//! ggml's AVX2 `vec_dot` of these types gives each row eight f32 lanes, lane `l` summing
//! elements `4l..4l+3` of every 32-element block as an exact integer, converted and
//! fused-multiply-added with the block's scale product, the lanes summed at the end in
//! `hsum_float_8`'s order (q4_1 adds its fused running Σ m·s after that). In the interleaved
//! layout the 16 quant bytes of two rows are one 32-byte load: the low nibbles of the lower
//! 128-bit lane are elements 0..16 of the first row, of the upper lane the second row's, the
//! high nibbles elements 16..32. Against the activations' halves broadcast to both lanes
//! (`vpmaddubsw` + `vpmaddwd`, or `vpdpbusd`) that gives dword lanes 0..4 of both rows (low
//! nibbles) and lanes 4..8 (high nibbles): two rows' block in two dot products, two
//! conversions and two FMAs where the one-row kernels take one of each a row, with the
//! activation's loads, q4_0's −8·Σy per lane and the eight rows' scale conversions shared by
//! the group. Every lane sees the same integers and the same float operations in the same
//! order as in `vec_dot`, so every result is bit-identical to `vec_dot`'s (tests:
//! `matmul_quant`'s `eight_row_kernel_equals_vec_dot` and `tests/matmul_quant.rs`).
//!
//! The rows of the plain layout lie apart, which is why the AVX2 path has no such kernel for
//! them: gathering two rows' 16 bytes into one vector costs what sharing saves.

use std::arch::x86_64::*;

use tessera::DType;

use super::matmul_quant::hsum8;
use super::qdot::avx2::{dot4, dpbusd, f16};

/// Types with an interleaved eight-row kernel here.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q4_1)
}

/// `vec_dot` of one group of eight interleaved rows of `t` ([`supported`]; `g`: their
/// `8 × k / 32` blocks in `tessera::layout`'s `Interleaved8` order) with one activation row in
/// its `vec_dot_type`, each result bit-identical to `vec_dot`'s, with AVX2's
/// `vpmaddubsw` + `vpmaddwd`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `g` holds the group's bytes and `x` `k / 32` blocks of the
/// activation format.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot8_interleaved(t: DType, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { rows8::<0>(t, g, x, k) }
}

/// [`vec_dot8_interleaved`] with AVX-VNNI's `vpdpbusd` (the same integers).
///
/// # Safety
/// As for [`vec_dot8_interleaved`], and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn vec_dot8_interleaved_avxvnni(t: DType, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    // SAFETY: forwarded.
    unsafe { rows8::<2>(t, g, x, k) }
}

#[inline(always)]
unsafe fn rows8<const V: u8>(t: DType, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    let nb = k / 32;
    let block = t.type_size();
    let xblock = super::matmul_quant::vec_dot_type(t).type_size();
    assert!(
        g.len() >= 8 * nb * block && x.len() >= nb * xblock,
        "qgemv_avx2: {t} group of {} bytes or activations of {} bytes short of k = {k}",
        g.len(),
        x.len()
    );
    let pf = super::qgemv_0::interleaved_prefetch();
    // SAFETY: sizes checked above; the features are the caller's.
    unsafe {
        match t {
            DType::Q4_0 => q4_0_rows::<V>(g.as_ptr(), x.as_ptr(), nb, pf),
            DType::Q4_1 => q4_1_rows::<V>(g.as_ptr(), x.as_ptr(), nb, pf),
            _ => unreachable!("no interleaved AVX2 kernel for {t}"),
        }
    }
}

/// The integer Σ a·b of each dword lane's four byte pairs (a unsigned, b signed) plus `acc`.
#[inline(always)]
unsafe fn dot4_plus<const V: u8>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register arithmetic only; V = 2 only in functions compiled for AVX-VNNI.
    unsafe {
        if V == 0 {
            _mm256_add_epi32(acc, dot4::<0>(a, b))
        } else {
            dpbusd::<V>(acc, a, b)
        }
    }
}

/// Rows `2q` and `2q + 1`'s entries of eight per-row floats `v` (lane `STEP·r + OFF` for row
/// r), each in four lanes: the first row's in the lower 128-bit lane, the second's in the upper.
#[inline(always)]
unsafe fn pair_lanes<const STEP: i32, const OFF: i32>(v: __m256, q: i32) -> __m256 {
    let (a, b) = (STEP * 2 * q + OFF, STEP * (2 * q + 1) + OFF);
    // SAFETY: register arithmetic only.
    unsafe { _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(a, a, a, a, b, b, b, b)) }
}

/// Five lines (two blocks of the group, `block` bytes each) `pf` bytes ahead of `at` into
/// L2, on even blocks `i`; none where `pf` is 0 (`qgemv_0::interleaved_prefetch`).
#[inline(always)]
unsafe fn prefetch(at: *const u8, i: usize, pf: usize) {
    if pf == 0 || !i.is_multiple_of(2) {
        return;
    }
    for line in 0..5 {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch(at.wrapping_add(pf + 64 * line) as *const i8, _MM_HINT_T1) };
    }
}

/// The activation block's two 16-byte halves, each in both 128-bit lanes.
#[inline(always)]
unsafe fn halves(y: *const u8) -> (__m256i, __m256i) {
    // SAFETY: 32 readable bytes at y (caller).
    unsafe {
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(y as *const __m128i)),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(y.add(16) as *const __m128i)),
        )
    }
}

/// The eight rows' sums from the accumulators ([pair][lanes 0..4, lanes 4..8]), each in
/// `hsum_float_8`'s order.
#[inline(always)]
unsafe fn finish(acc: &[[__m256; 2]; 4]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for (q, a) in acc.iter().enumerate() {
        let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
        // SAFETY: 8 floats each.
        unsafe {
            _mm256_storeu_ps(lo.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(hi.as_mut_ptr(), a[1]);
        }
        for h in 0..2 {
            let l = std::array::from_fn(|j| {
                if j < 4 {
                    lo[4 * h + j]
                } else {
                    hi[4 * h + j - 4]
                }
            });
            out[2 * q + h] = hsum8(l);
        }
    }
    out
}

/// q4_0 against q8_0: per lane Σ n·y − 8·Σy (ggml's Σ(n − 8)·y), times d_w·d_y.
#[inline(always)]
unsafe fn q4_0_rows<const V: u8>(g: *const u8, xp: *const u8, nb: usize, pf: usize) -> [f32; 8] {
    const GROUP_BLOCK: usize = 8 * 18;
    // SAFETY: nb blocks of the group at g and of q8_0 at xp (caller); prefetches never fault.
    unsafe {
        let m4 = _mm256_set1_epi8(15);
        let eight = _mm256_set1_epi8(8);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for i in 0..nb {
            let gb = g.add(i * GROUP_BLOCK);
            prefetch(gb, i, pf);
            let xb = xp.add(i * 34);
            let (ylo, yhi) = halves(xb.add(2));
            // −8·Σy per lane (exact)
            let nlo = _mm256_sub_epi32(zero, dot4::<V>(eight, ylo));
            let nhi = _mm256_sub_epi32(zero, dot4::<V>(eight, yhi));
            // the eight heads are the rows' d: ggml's d_w·d_y per row
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
            let d8 = _mm256_mul_ps(dw, _mm256_set1_ps(f16(xb)));
            for (q, a) in acc.iter_mut().enumerate() {
                let z = _mm256_loadu_si256(gb.add(16 + 32 * q) as *const __m256i);
                let lo = _mm256_and_si256(z, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(z), m4);
                let d = pair_lanes::<1, 0>(d8, q as i32);
                let plo = _mm256_cvtepi32_ps(dot4_plus::<V>(nlo, lo, ylo));
                let phi = _mm256_cvtepi32_ps(dot4_plus::<V>(nhi, hi, yhi));
                a[0] = _mm256_fmadd_ps(d, plo, a[0]);
                a[1] = _mm256_fmadd_ps(d, phi, a[1]);
            }
        }
        finish(&acc)
    }
}

/// q4_1 against q8_1: per lane Σ n·y times d_w·d_y, and each row's fused running Σ m·s added
/// after the lanes' sum.
#[inline(always)]
unsafe fn q4_1_rows<const V: u8>(g: *const u8, xp: *const u8, nb: usize, pf: usize) -> [f32; 8] {
    const GROUP_BLOCK: usize = 8 * 20;
    // SAFETY: nb blocks of the group at g and of q8_1 at xp (caller); prefetches never fault.
    unsafe {
        let m4 = _mm256_set1_epi8(15);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        // lanes (2j, 2j + 1) of half h: row 4h + j's (unused, running Σ m·s)
        let mut summs = [_mm256_setzero_ps(); 2];
        for i in 0..nb {
            let gb = g.add(i * GROUP_BLOCK);
            prefetch(gb, i, pf);
            let xb = xp.add(i * 36);
            let (ylo, yhi) = halves(xb.add(4));
            // [d_y s_y] in every pair of lanes
            let xs = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
            let xs = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(xs)));
            // the heads [d m] of rows 0..4 and 4..8
            let dm = [
                _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16) as *const __m128i)),
            ];
            let mut dd = [_mm256_setzero_ps(); 2];
            for h in 0..2 {
                summs[h] = _mm256_fmadd_ps(dm[h], xs, summs[h]); // fused, as GCC builds ggml's
                dd[h] = _mm256_mul_ps(dm[h], xs);
            }
            for (q, a) in acc.iter_mut().enumerate() {
                let z = _mm256_loadu_si256(gb.add(32 + 32 * q) as *const __m256i);
                let lo = _mm256_and_si256(z, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(z), m4);
                // rows 2q, 2q + 1 are rows 2(q mod 2), 2(q mod 2) + 1 of half q / 2
                let d = pair_lanes::<2, 0>(dd[q / 2], (q % 2) as i32);
                let plo = _mm256_cvtepi32_ps(dot4_plus::<V>(zero, lo, ylo));
                let phi = _mm256_cvtepi32_ps(dot4_plus::<V>(zero, hi, yhi));
                a[0] = _mm256_fmadd_ps(d, plo, a[0]);
                a[1] = _mm256_fmadd_ps(d, phi, a[1]);
            }
        }
        let mut out = finish(&acc);
        for (h, s) in summs.iter().enumerate() {
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), *s);
            for j in 0..4 {
                out[4 * h + j] += v[2 * j + 1];
            }
        }
        out
    }
}
