//! q2_K weights in `RowLayout::Repacked8` (`tessera::layout`; plain rows): the arithmetic of
//! ggml's CPU repack buffer for q2_K (`block_q2_Kx8` with q8_K activations), which llama.cpp
//! takes by default for q2_K matrices of whole groups of eight rows where ggml is built with
//! AVX-512 (`ggml_cpu_has_avx512`; a build for AVX2 keeps q2_K plain), so that a product's
//! results equal that default rather than its plain rows (`--no-repack`).
//!
//! ggml's x86 kernels (`ggml_gemv_q2_K_8x8_q8_K`, `ggml_gemm_q2_K_8x8_q8_K` and the latter's
//! AVX-512 form) give each output (row, column) two f32 accumulators, `acc` and `accm`, both
//! starting at zero, and the result `acc − accm`, as for q4_K (`qgemv_repack_k`). Within a
//! 256-weight superblock every integer is exact: sub-block s (16 weights, codes 0..3) gives
//! `scale_s · Σ q·x` and `min_s · bsum_s` (the q8_K row's sum of that sub-block's sixteen
//! activations). Half h of the superblock is sub-blocks 8h..8h+8 (128 weights: its 32 code
//! bytes 16 + 32h.., two bits of each per 32-weight quarter). How often those integers meet
//! the floats depends on the kernel, and so on the column:
//! - the four-column kernel (`gemm`), which ggml runs on the columns in whole fours from the
//!   first (`n − n mod 4` of them), adds per half: `acc = fma(f32(Σ scale·dot), d·dx, acc)` and
//!   `accm = fma(f32(Σ min·bsum), dmin·dx, accm)`, twice a superblock;
//! - the one-column kernel (`gemv`), on the columns left over, adds the same once per
//!   superblock, with the superblock's integer sums.
//!
//! `d`, `dmin` are the block's f16 scales as f32, `dx` the q8_K row's f32 scale; the products
//! `d·dx`, `dmin·dx` are rounded to f32 before the FMA. Every integer is below 2²⁴ (a
//! superblock's dots at most 15·3·127·256), so each conversion is exact. The activations are
//! ggml's `quantize_row_q8_K`, as for q4_K.
//!
//! [`vec_dot_ref`] is that definition on one row and one column, and the scalar code where
//! x86's vector units are missing. [`vec_dot8`] (one-column rounding) and [`vec_dot8x4`]
//! (four-column rounding) keep eight plain rows in the lanes of one AVX2 kernel: per half of a
//! block each row's codes are unpacked once for the columns, `vpmaddubsw` and `vpmaddwd` by
//! the sub-blocks' scales give its integer sums, a tree of `vphaddd` puts each row's in its
//! lane, and one FMA serves the eight rows. Tests: `tests/qgemv_repack.rs` (ggml's own
//! results, and the kernels against [`vec_dot_ref`]).

use tessera_quants::f16_to_f32;

use crate::simd::Isa;

/// Bytes of one q2_K block: 16 scale bytes (scale in the low nibble, min in the high), 64
/// bytes of two-bit codes, f16 `d` and `dmin`.
pub const BLOCK: usize = 84;
/// Bytes of one q8_K block: f32 `d`, 256 signed bytes, sixteen i16 sums.
pub const QBLOCK: usize = 292;

/// The two halves' `(Σ scale·Σ q·x, Σ min·bsum)` of one q2_K block against one q8_K block,
/// element by element (weight 128h + 32j + l is bits 2j..2j+2 of code byte 32h + l, in
/// sub-block 8h + 2j + l / 16).
fn halves(wb: &[u8], xb: &[u8]) -> ([i32; 2], [i32; 2]) {
    let (sc, qs, xq) = (&wb[..16], &wb[16..80], &xb[4..260]);
    let bsum = |s: usize| i16::from_le_bytes([xb[260 + 2 * s], xb[261 + 2 * s]]) as i32;
    let (mut dots, mut mins) = ([0i32; 2], [0i32; 2]);
    for h in 0..2 {
        mins[h] = (8 * h..8 * h + 8)
            .map(|s| (sc[s] >> 4) as i32 * bsum(s))
            .sum();
        for j in 0..4 {
            let mut sub = [0i32; 2];
            for l in 0..32 {
                let q = (qs[32 * h + l] >> (2 * j)) & 3;
                sub[l / 16] += q as i32 * (xq[128 * h + 32 * j + l] as i8) as i32;
            }
            let s = 8 * h + 2 * j;
            dots[h] += (sc[s] & 15) as i32 * sub[0] + (sc[s + 1] & 15) as i32 * sub[1];
        }
    }
    (dots, mins)
}

/// The reference: one plain q2_K row (`k / 256` blocks) against one q8_K activation row, with
/// the rounding of ggml's four-column repack kernel (`quad`) or of its one-column kernel (see
/// the module's documentation).
pub fn vec_dot_ref(w: &[u8], x: &[u8], k: usize, quad: bool) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (wb, xb) in w
        .chunks_exact(BLOCK)
        .zip(x.chunks_exact(QBLOCK))
        .take(k / 256)
    {
        let (dots, mins) = halves(wb, xb);
        let dx = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let d = f16_to_f32(u16::from_le_bytes([wb[80], wb[81]])) * dx;
        let dmin = f16_to_f32(u16::from_le_bytes([wb[82], wb[83]])) * dx;
        if quad {
            for h in 0..2 {
                acc = (dots[h] as f32).mul_add(d, acc);
                accm = (mins[h] as f32).mul_add(dmin, accm);
            }
        } else {
            acc = ((dots[0] + dots[1]) as f32).mul_add(d, acc);
            accm = ((mins[0] + mins[1]) as f32).mul_add(dmin, accm);
        }
    }
    acc - accm
}

fn check(g: &[u8], x: &[&[u8]], k: usize, what: &str) {
    super::qgemv_repack_k::check_superblocks("q2_K", BLOCK, g, x, k, what);
}

/// Eight plain q2_K rows (`g`, `8 × k / 256` blocks, row after row) against `C` q8_K
/// activation rows, in scalar code: `out[c][r]` as [`vec_dot_ref`] gives it with rounding
/// `quad`.
fn rows8_scalar<const C: usize>(g: &[u8], x: [&[u8]; C], k: usize, quad: bool) -> [[f32; 8]; C] {
    super::qgemv_repack_k::rows8_with(g, x, k / 256 * BLOCK, |w, x| vec_dot_ref(w, x, k, quad))
}

/// Whether the AVX2 kernel runs for `isa` (every x86 ISA but the scalar one).
pub fn has_kernel(isa: Isa) -> bool {
    super::qgemv_repack::has_four_column_kernel(isa)
}

/// Eight plain q2_K rows against one activation row, with the one-column rounding (ggml's
/// `gemv`: mat-vec, and the columns after the last whole four).
pub fn vec_dot8(isa: Isa, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    check(g, &[x], k, "vec_dot8");
    #[cfg(target_arch = "x86_64")]
    if has_kernel(isa) {
        // SAFETY: the CPU has AVX2, FMA and F16C (`has_kernel`); g holds eight rows of
        // k / 256 blocks and x k / 256 q8_K blocks (checked).
        return unsafe { avx2::rows8::<1, false>(g.as_ptr(), k / 256, [x.as_ptr()]) }[0];
    }
    let _ = isa;
    rows8_scalar::<1>(g, [x], k, false)[0]
}

/// Eight plain q2_K rows against four activation rows, with the four-column rounding (ggml's
/// `gemm`): `out[c][r]`.
pub fn vec_dot8x4(isa: Isa, g: &[u8], x: [&[u8]; 4], k: usize) -> [[f32; 8]; 4] {
    check(g, &x, k, "vec_dot8x4");
    #[cfg(target_arch = "x86_64")]
    if has_kernel(isa) {
        // SAFETY: as in `vec_dot8`, for each of the four activation rows.
        return unsafe { avx2::rows8::<4, true>(g.as_ptr(), k / 256, x.map(|x| x.as_ptr())) };
    }
    let _ = isa;
    rows8_scalar::<4>(g, x, k, true)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, QBLOCK};

    /// The eight vectors' sums of their eight i32 lanes, vector r's in lane r (a tree of
    /// `vphaddd`; exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum8(v: &[__m256i; 8]) -> __m256i {
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        // a: rows 0-3 of lanes 0-3 | rows 0-3 of lanes 4-7; b the same for rows 4-7
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }

    /// The eight vectors' sums of their four i32 lanes, vector r's in lane r.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum8x4(v: &[__m128i; 8]) -> __m256i {
        let q = |o: usize| {
            _mm_hadd_epi32(
                _mm_hadd_epi32(v[o], v[o + 1]),
                _mm_hadd_epi32(v[o + 2], v[o + 3]),
            )
        };
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(0)), q(4))
    }

    /// The f16 at byte `B` (0 or 2) of each of the eight dwords of `v`, in order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn halves8<const B: i8>(v: __m256i) -> __m128i {
        let (a, b, c, d) = (B, B + 4, B + 8, B + 12);
        #[rustfmt::skip]
        let pick = _mm256_setr_epi8(
            a, a + 1, b, b + 1, c, c + 1, d, d + 1, -1, -1, -1, -1, -1, -1, -1, -1,
            a, a + 1, b, b + 1, c, c + 1, d, d + 1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        // each 128-bit lane's four halves in its low qword; then the two qwords together
        let s = _mm256_shuffle_epi8(v, pick);
        _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(s))
    }

    /// Each 16-bit lane of `q` shifted right by 2j bits (j < 4).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn shift2(q: __m256i, j: usize) -> __m256i {
        match j {
            0 => q,
            1 => _mm256_srli_epi16::<2>(q),
            2 => _mm256_srli_epi16::<4>(q),
            _ => _mm256_srli_epi16::<6>(q),
        }
    }

    /// Eight plain q2_K rows (`g`: row after row, `nb` blocks each) against `C` q8_K rows:
    /// `out[c][r]`, with the four-column rounding (`QUAD`: an FMA per half block) or the
    /// one-column one (an FMA per block). Per half block and row the codes are unpacked once
    /// for the `C` columns: quarter j's two bits of each of the 32 code bytes against the
    /// column's activations 32j.. by `vpmaddubsw` (codes ≤ 3: pairs at most 2·3·127, exact),
    /// `vpmaddwd` by sub-block 2j's scale (lanes 0-7) and 2j + 1's (lanes 8-15).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `g` points at eight rows of `nb` blocks and every `x`
    /// at `nb` q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows8<const C: usize, const QUAD: bool>(
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        let row = nb * BLOCK;
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(15);
        // vpshufb indices: sub-block 2j's scale byte into the low 128-bit lane's words,
        // 2j + 1's into the high lane's (index 0x80: a zero high byte)
        let pick: [__m256i; 4] = std::array::from_fn(|j| {
            let lo = (0x8000u16 | (2 * j) as u16) as i16;
            let hi = (0x8000u16 | (2 * j + 1) as u16) as i16;
            _mm256_setr_epi16(
                lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
            )
        });
        let mut acc = [_mm256_setzero_ps(); C];
        let mut accm = [_mm256_setzero_ps(); C];
        for i in 0..nb {
            // SAFETY: block i of each of the eight rows and of each activation row exists
            // (caller); every load below is inside one of them.
            unsafe {
                let wb: [*const u8; 8] = std::array::from_fn(|r| g.add(r * row + i * BLOCK));
                let xb: [*const u8; C] = x.map(|x| x.add(i * QBLOCK));
                // the rows' d and dmin as f32 (f16 pairs at 80 of each block)
                let dm: [u32; 8] = wb.map(|w| (w.add(80) as *const u32).read_unaligned());
                let dmv = _mm256_loadu_si256(dm.as_ptr() as *const __m256i);
                let d = _mm256_cvtph_ps(halves8::<0>(dmv));
                let dmin = _mm256_cvtph_ps(halves8::<2>(dmv));
                let mut dots = [[_mm256_setzero_si256(); 2]; C];
                let mut mins = [[_mm256_setzero_si256(); 2]; C];
                for h in 0..2 {
                    let mut tot = [[_mm256_setzero_si256(); 8]; C];
                    let mut mn = [[_mm_setzero_si128(); 8]; C];
                    // the columns' sums of sub-blocks 8h..8h+8 (i16)
                    let bs: [__m128i; C] =
                        xb.map(|x| _mm_loadu_si128(x.add(260 + 16 * h) as *const __m128i));
                    for r in 0..8 {
                        let q = _mm256_loadu_si256(wb[r].add(16 + 32 * h) as *const __m256i);
                        let sc = _mm_loadl_epi64(wb[r].add(8 * h) as *const __m128i);
                        let s8 = _mm256_broadcastsi128_si256(_mm_and_si128(sc, m4));
                        let m16 = _mm_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
                        for c in 0..C {
                            mn[c][r] = _mm_madd_epi16(m16, bs[c]);
                        }
                        for (j, pick) in pick.iter().enumerate() {
                            let codes = _mm256_and_si256(shift2(q, j), m3);
                            let s = _mm256_shuffle_epi8(s8, *pick);
                            for c in 0..C {
                                let y = _mm256_loadu_si256(
                                    xb[c].add(4 + 128 * h + 32 * j) as *const __m256i
                                );
                                tot[c][r] = _mm256_add_epi32(
                                    tot[c][r],
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(codes, y), s),
                                );
                            }
                        }
                    }
                    for c in 0..C {
                        dots[c][h] = sum8(&tot[c]);
                        mins[c][h] = sum8x4(&mn[c]);
                    }
                }
                for c in 0..C {
                    let dx = _mm256_set1_ps(f32::from_le_bytes(
                        (xb[c] as *const [u8; 4]).read_unaligned(),
                    ));
                    let (dd, dmm) = (_mm256_mul_ps(d, dx), _mm256_mul_ps(dmin, dx));
                    if QUAD {
                        for h in 0..2 {
                            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[c][h]), dd, acc[c]);
                            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[c][h]), dmm, accm[c]);
                        }
                    } else {
                        let t = _mm256_add_epi32(dots[c][0], dots[c][1]);
                        let m = _mm256_add_epi32(mins[c][0], mins[c][1]);
                        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), dd, acc[c]);
                        accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dmm, accm[c]);
                    }
                }
            }
        }
        let mut out = [[0f32; 8]; C];
        for c in 0..C {
            // SAFETY: eight f32 of room in out[c].
            unsafe { _mm256_storeu_ps(out[c].as_mut_ptr(), _mm256_sub_ps(acc[c], accm[c])) };
        }
        out
    }
}
