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
//! (four-column rounding) keep eight plain rows in the lanes of one 256-bit kernel (AVX2;
//! `vpdpwssd` with AVX-512 VNNI or AVX-VNNI): per block the eight rows' scale bytes are read
//! two rows a vector for the mins' sums of all eight rows at once, and per half block each
//! row's codes are unpacked once for the columns (three of the four quarters masked in place,
//! their factor of 4^j moved onto the scales), `vpmaddubsw` and `vpmaddwd` by the
//! sub-blocks' scales give its integer sums, a tree of `vphaddd` puts each row's in its lane,
//! and one FMA serves the eight rows. On the Zen 4, one thread, against ggml's `CPU_REPACK`
//! (README): mat-vec 1.0-1.1×, mat-mat about 1.25×. Tests: `tests/qgemv_repack.rs` (ggml's own
//! results, and the kernels against [`vec_dot_ref`] on every ISA).

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
        super::qgemv_repack_k::steps(&mut acc, &mut accm, wb, 80, xb, dots, mins, quad);
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
        return unsafe { avx2::rows8::<1, false>(isa, g.as_ptr(), k / 256, [x.as_ptr()]) }[0];
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
        return unsafe { avx2::rows8::<4, true>(isa, g.as_ptr(), k / 256, x.map(|x| x.as_ptr())) };
    }
    let _ = isa;
    rows8_scalar::<4>(g, x, k, true)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, QBLOCK};
    use crate::ops::qdot::avx2::{uses_avx_vnni, uses_vnni};
    use crate::simd::Isa;

    /// Eight plain q2_K rows (`g`: row after row, `nb` blocks each) against `C` q8_K rows:
    /// `out[c][r]`, with the four-column rounding (`QUAD`) or the one-column one, on the
    /// widest entry point `isa` allows (the same bits on each).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `g` points at eight rows of `nb` blocks and every `x`
    /// at `nb` q8_K blocks.
    pub unsafe fn rows8<const C: usize, const QUAD: bool>(
        isa: Isa,
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        // SAFETY: the features each entry point is compiled for are checked first; the
        // pointers as the caller promises.
        unsafe {
            if uses_vnni(isa) {
                rows8_vnni::<C, QUAD>(g, nb, x)
            } else if uses_avx_vnni(isa) {
                rows8_avx_vnni::<C, QUAD>(g, nb, x)
            } else {
                rows8_avx2::<C, QUAD>(g, nb, x)
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows8_avx2<const C: usize, const QUAD: bool>(
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        // SAFETY: as for `rows8`.
        unsafe { body::<C, QUAD, 0>(g, nb, x) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn rows8_vnni<const C: usize, const QUAD: bool>(
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        // SAFETY: as for `rows8`.
        unsafe { body::<C, QUAD, 1>(g, nb, x) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn rows8_avx_vnni<const C: usize, const QUAD: bool>(
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        // SAFETY: as for `rows8`.
        unsafe { body::<C, QUAD, 2>(g, nb, x) }
    }

    /// `acc + Σ pairs of (p · s)` per i32 lane: `vpdpwssd` with VNNI (`V` = 1: AVX-512 VL, 2:
    /// AVX-VNNI), `vpmaddwd` and an add without (the same exact integers).
    #[inline(always)]
    unsafe fn dpwssd<const V: u8>(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller is compiled with the instruction set `V` names.
        unsafe {
            match V {
                1 => _mm256_dpwssd_epi32(acc, p, s),
                2 => _mm256_dpwssd_avx_epi32(acc, p, s),
                _ => _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)),
            }
        }
    }

    /// The f16 at byte `B` (0 or 2) of each of the eight dwords of `v`, in order.
    #[inline(always)]
    unsafe fn halves8<const B: i8>(v: __m256i) -> __m128i {
        let (a, b, c, d) = (B, B + 4, B + 8, B + 12);
        // SAFETY: register arithmetic only (AVX2, the caller's).
        unsafe {
            #[rustfmt::skip]
            let pick = _mm256_setr_epi8(
                a, a + 1, b, b + 1, c, c + 1, d, d + 1, -1, -1, -1, -1, -1, -1, -1, -1,
                a, a + 1, b, b + 1, c, c + 1, d, d + 1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            // each 128-bit lane's four halves in its low qword; then the two qwords together
            let s = _mm256_shuffle_epi8(v, pick);
            _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(s))
        }
    }

    /// Quarter j's two-bit codes of 32 code bytes `q`, times 4^j for j < 3 (masked in place:
    /// 3, 12 or 48 at most, so `vpmaddubsw` pairs stay within 2·48·127) and times 1 for j = 3
    /// (shifted down; its scale carries the factor instead, see [`SCALE_X`]).
    #[inline(always)]
    unsafe fn codes(q: __m256i, j: usize) -> __m256i {
        // SAFETY: register arithmetic only (AVX2, the caller's).
        unsafe {
            match j {
                0 => _mm256_and_si256(q, _mm256_set1_epi8(0x03)),
                1 => _mm256_and_si256(q, _mm256_set1_epi8(0x0c)),
                2 => _mm256_and_si256(q, _mm256_set1_epi8(0x30)),
                _ => _mm256_and_si256(_mm256_srli_epi16::<6>(q), _mm256_set1_epi8(0x03)),
            }
        }
    }

    /// The factors of the scale bytes, a word (two sub-blocks) at a time, so that every
    /// quarter's products come out 16 times the true ones: sub-blocks 8h + 2j and 8h + 2j + 1
    /// (quarter j) times 16, 4, 1 and 16 for j = 0..4, against codes times 1, 4, 16 and 1
    /// ([`codes`]). The scaled bytes stay bytes (16·15 = 240) and each word's low byte does
    /// not reach its high one; the half block's sums are then exact multiples of 16, divided
    /// by an arithmetic shift.
    const SCALE_X: [i16; 8] = [16, 4, 1, 16, 16, 4, 1, 16];

    /// `vpshufb` indices into a row's 16 scale bytes (in both 128-bit lanes): sub-block
    /// 8h + 2j's into the low lane's words, 8h + 2j + 1's into the high lane's (index 0x80:
    /// a zero high byte). `[h][j]`.
    static PICK: [[[u8; 32]; 4]; 2] = {
        let mut t = [[[0x80u8; 32]; 4]; 2];
        let mut h = 0;
        while h < 2 {
            let mut j = 0;
            while j < 4 {
                let mut w = 0;
                while w < 16 {
                    t[h][j][2 * w] = (8 * h + 2 * j + w / 8) as u8;
                    w += 1;
                }
                j += 1;
            }
            h += 1;
        }
        t
    };

    /// The eight rows' `[r0 | r1]`, `[r2 | r3]`, `[r4 | r5]`, `[r6 | r7]` four-lane sums (row
    /// 2p in the low lane of `p[p]`) added up, row r in lane r.
    #[inline(always)]
    unsafe fn sum8x4(p: [__m256i; 4]) -> __m256i {
        // SAFETY: register arithmetic only (AVX2, the caller's).
        unsafe {
            // [r0 r2 r4 r6 | r1 r3 r5 r7]
            let t = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        }
    }

    /// The kernel (see `rows8`). Per block: the eight rows' 16 scale bytes, two rows a
    /// vector, from which the mins' sums `Σ min·bsum` of all eight rows come by `vpmaddwd`
    /// and a `vphaddd` tree, and each row's scaled scale bytes ([`SCALE_X`]) in both lanes.
    /// Then per half block, row pair by row pair, quarter j's codes ([`codes`]) of each row
    /// against the columns' activations 128h + 32j.. by `vpmaddubsw` (exact) and by sub-block
    /// 8h + 2j's scale (lanes 0-7) and 8h + 2j + 1's (lanes 8-15) into i32 lanes; each pair's
    /// lanes added by `vphaddd` as it ends, so that the eight rows' sums meet in one vector,
    /// row r in lane r, and are divided by 16.
    #[inline(always)]
    unsafe fn body<const C: usize, const QUAD: bool, const V: u8>(
        g: *const u8,
        nb: usize,
        x: [*const u8; C],
    ) -> [[f32; 8]; C] {
        let row = nb * BLOCK;
        // SAFETY: block i of each of the eight rows and of each activation row exists
        // (caller); every load below is inside one of them; the tables are 32 bytes a
        // vector.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let zero = _mm256_setzero_si256();
            let scale_x =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(SCALE_X.as_ptr() as *const _));
            let mut acc = [_mm256_setzero_ps(); C];
            let mut accm = [_mm256_setzero_ps(); C];
            for i in 0..nb {
                let wb: [*const u8; 8] = std::array::from_fn(|r| g.add(r * row + i * BLOCK));
                let xb: [*const u8; C] = x.map(|x| x.add(i * QBLOCK));
                // the rows' d and dmin as f32 (f16 pairs at 80 of each block)
                let dm: [u32; 8] = wb.map(|w| (w.add(80) as *const u32).read_unaligned());
                let dmv = _mm256_loadu_si256(dm.as_ptr() as *const __m256i);
                let d = _mm256_cvtph_ps(halves8::<0>(dmv));
                let dmin = _mm256_cvtph_ps(halves8::<2>(dmv));
                // [row 2p's 16 scale bytes | row 2p + 1's]
                let raw: [__m256i; 4] = std::array::from_fn(|p| {
                    _mm256_inserti128_si256::<1>(
                        _mm256_castsi128_si256(_mm_loadu_si128(wb[2 * p] as *const __m128i)),
                        _mm_loadu_si128(wb[2 * p + 1] as *const __m128i),
                    )
                });
                // the mins as words: sub-blocks 0-7 and 8-15, [row 2p | row 2p + 1]
                let mn = raw.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                let mlo = mn.map(|v| _mm256_unpacklo_epi8(v, zero));
                let mhi = mn.map(|v| _mm256_unpackhi_epi8(v, zero));
                let scaled = raw.map(|v| _mm256_mullo_epi16(_mm256_and_si256(v, m4), scale_x));
                let mut dots = [[zero; 2]; C];
                let mut mins = [[zero; 2]; C];
                for c in 0..C {
                    // the column's sums of sub-blocks 0-7 and 8-15, in both lanes
                    let bs = |h: usize| {
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            xb[c].add(260 + 16 * h) as *const __m128i
                        ))
                    };
                    let (b0, b1) = (bs(0), bs(1));
                    let lo: [__m256i; 4] = std::array::from_fn(|p| _mm256_madd_epi16(mlo[p], b0));
                    let hi: [__m256i; 4] = std::array::from_fn(|p| _mm256_madd_epi16(mhi[p], b1));
                    if QUAD {
                        mins[c] = [sum8x4(lo), sum8x4(hi)];
                    } else {
                        mins[c][0] =
                            sum8x4(std::array::from_fn(|p| _mm256_add_epi32(lo[p], hi[p])));
                    }
                }
                for h in 0..2 {
                    // per row pair, `vphaddd` of the pair's two row vectors
                    let mut half = [[zero; 2]; C];
                    for rp in 0..4 {
                        let mut t = [[zero; 2]; C];
                        for e in 0..2 {
                            let v = scaled[rp];
                            let sr = if e == 0 {
                                _mm256_permute2x128_si256::<0x00>(v, v)
                            } else {
                                _mm256_permute2x128_si256::<0x11>(v, v)
                            };
                            let q = _mm256_loadu_si256(
                                wb[2 * rp + e].add(16 + 32 * h) as *const __m256i
                            );
                            for (j, pick) in PICK[h].iter().enumerate() {
                                let codes = codes(q, j);
                                let pick = _mm256_loadu_si256(pick.as_ptr() as *const _);
                                let s = _mm256_shuffle_epi8(sr, pick);
                                for c in 0..C {
                                    let y = _mm256_loadu_si256(
                                        xb[c].add(4 + 128 * h + 32 * j) as *const __m256i
                                    );
                                    t[c][e] =
                                        dpwssd::<V>(t[c][e], _mm256_maddubs_epi16(codes, y), s);
                                }
                            }
                        }
                        for c in 0..C {
                            let p = _mm256_hadd_epi32(t[c][0], t[c][1]);
                            half[c][rp / 2] = if rp % 2 == 0 {
                                p
                            } else {
                                _mm256_hadd_epi32(half[c][rp / 2], p)
                            };
                        }
                    }
                    for c in 0..C {
                        // [r0 r1 r2 r3 partial | the rest] and the same for rows 4-7; the
                        // sums are 16 times the true ones (`SCALE_X`), exactly
                        let (a, b) = (half[c][0], half[c][1]);
                        dots[c][h] = _mm256_srai_epi32::<4>(_mm256_add_epi32(
                            _mm256_permute2x128_si256::<0x20>(a, b),
                            _mm256_permute2x128_si256::<0x31>(a, b),
                        ));
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
                        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), dd, acc[c]);
                        accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[c][0]), dmm, accm[c]);
                    }
                }
            }
            let mut out = [[0f32; 8]; C];
            for c in 0..C {
                _mm256_storeu_ps(out[c].as_mut_ptr(), _mm256_sub_ps(acc[c], accm[c]));
            }
            out
        }
    }
}
