//! q4_K weights in `RowLayout::Repacked8` (`tessera::layout`; plain rows): the arithmetic of
//! ggml's CPU repack buffer for q4_K (`block_q4_Kx8` with q8_K activations, llama.cpp's
//! default on x86 for q4_K matrices of whole groups of eight rows), so that a product's results
//! equal llama.cpp's default rather than its plain rows (`--no-repack`).
//!
//! ggml's x86 kernels (`ggml_gemv_q4_K_8x8_q8_K`, `ggml_gemm_q4_K_8x8_q8_K` and the latter's
//! AVX-512 form) give each output (row, column) two f32 accumulators, `acc` and `accm`, both
//! starting at zero, and the result `acc − accm`. Within a 256-weight superblock every integer
//! is exact: sub-block s (32 weights, nibbles 0..15) gives `scale_s · Σ q·x` and
//! `min_s · (bsum_2s + bsum_2s+1)` (the q8_K row's sums of sixteen). How often those integers
//! meet the floats depends on the kernel, and so on the column:
//! - the four-column kernel (`gemm`), which ggml runs on the columns in whole fours from the
//!   first (`n − n mod 4` of them), adds per 64 weights (two sub-blocks): `acc = fma(f32(Σ
//!   scale·dot), d·dx, acc)` and `accm = fma(f32(Σ min·bsums), dmin·dx, accm)`, four times a
//!   superblock;
//! - the one-column kernel (`gemv`), on the columns left over, adds the same once per
//!   superblock, with the superblock's integer sums.
//!
//! `d`, `dmin` are the block's f16 scales as f32, `dx` the q8_K row's f32 scale; the products
//! `d·dx`, `dmin·dx` are rounded to f32 before the FMA, and the conversion of a superblock's
//! sum rounds once it passes 2²⁴. The activations are ggml's `quantize_row_q8_K` (as for
//! the plain rows; ggml's four-column `ggml_quantize_mat_q8_K_4x8` gives the same integers and
//! scales, up to a common sign where a row's largest magnitude appears with both signs, which
//! changes no product).
//!
//! [`vec_dot_ref`] is that definition on one row and one column, and the scalar code where
//! x86's vector units are missing. [`vec_dot8`] (one-column rounding, mat-vec) keeps eight
//! plain rows in the lanes: per block the column's activations are loaded once for the eight
//! rows, each row's integer sums come from `vpmaddubsw`/`vpmaddwd` per pair of sub-blocks
//! (AVX2) or two pairs a 512-bit vector (AVX-512), gathered by a tree of `vphaddd`, and one
//! FMA per block serves the eight rows (mat-vec 4096², one thread, AVX-512: 15.6-16.0 GB/s
//! with the 256-bit kernel, 18.4-19.0 with the 512-bit one; README). [`vec_dot8x4`]
//! (four-column rounding, mat-mat) rearranges the group first ([`transpose8`]) and runs
//! [`vec_dot8x4_transposed`]; a mat-mat does that once per group for all its columns: one row
//! a lane as in ggml's `block_q4_Kx8`, so that `vpmaddwd` by the rows' scales (with AVX-512
//! VNNI: `vpdpbusd`, then `vpmulld`) leaves each row's exact integer in its lane and nothing
//! is summed across lanes (mat-mat, 512 columns, one thread: 75-80 GFLOP/s with an earlier
//! kernel that kept the four columns in the lanes, 128-134 on AVX2 and 186-193 with VNNI
//! this way; README).
//! Tests: `tests/qgemv_repack.rs` (ggml's own results, and the kernels against
//! [`vec_dot_ref`]).

use tessera_quants::f16_to_f32;

use crate::simd::Isa;

/// Bytes of one q4_K block: f16 `d` and `dmin`, 12 bytes of six-bit scales and mins, 128 of
/// nibbles.
pub const BLOCK: usize = 144;
/// Bytes of one q8_K block: f32 `d`, 256 signed bytes, sixteen i16 sums.
pub const QBLOCK: usize = 292;

/// How far ahead in each of its eight rows the mat-vec kernel prefetches, bytes (about 1.3
/// blocks). 4096² from memory, one / two threads, GB/s, three rounds on an AMX Xeon: 64 ahead
/// 14.2-14.5 / 28.2-28.5, 128 15.1-16.1 / 29.4-31.3, 192 17.5-18.2 / 35.1-36.3, 256 17.0-18.0
/// / 34.6-35.8, 384 16.7-16.9 / 33.6-33.8, 512 16.1-16.6 / 32.8-33.7 (into L2 instead: 16.8-17.5
/// at 256, 16.1-16.5 at 512, worse further ahead); none: 13.7.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 192;

/// The eight sub-blocks' six-bit scales and mins of a q4_K block's 12 scale bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
fn scales_mins(sc: &[u8]) -> ([i32; 8], [i32; 8]) {
    let (mut s, mut m) = ([0i32; 8], [0i32; 8]);
    for j in 0..8 {
        if j < 4 {
            s[j] = (sc[j] & 63) as i32;
            m[j] = (sc[j + 4] & 63) as i32;
        } else {
            s[j] = ((sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4)) as i32;
            m[j] = ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) as i32;
        }
    }
    (s, m)
}

/// The q8_K block's sixteen sums.
#[inline(always)]
fn bsums(xb: &[u8]) -> [i32; 16] {
    std::array::from_fn(|i| i16::from_le_bytes([xb[260 + 2 * i], xb[261 + 2 * i]]) as i32)
}

/// The four pairs of sub-blocks' `min · bsums` terms of one block against one q8_K block.
#[inline(always)]
fn min_pairs(m: &[i32; 8], xb: &[u8]) -> [i32; 4] {
    let bs = bsums(xb);
    std::array::from_fn(|h| {
        m[2 * h] * (bs[4 * h] + bs[4 * h + 1]) + m[2 * h + 1] * (bs[4 * h + 2] + bs[4 * h + 3])
    })
}

/// The four pairs of sub-blocks' `scale · Σ q·x` of one q4_K block against one q8_K block,
/// element by element (sub-block 2h is the low nibbles of bytes 32h..32h+32, 2h+1 their high
/// nibbles).
#[inline(always)]
fn dot_pairs_scalar(s: &[i32; 8], wb: &[u8], xb: &[u8]) -> [i32; 4] {
    let (qs, xq) = (&wb[16..144], &xb[4..260]);
    std::array::from_fn(|h| {
        let (mut lo, mut hi) = (0i32, 0i32);
        for l in 0..32 {
            let q = qs[32 * h + l];
            lo += (q & 0x0F) as i32 * (xq[64 * h + l] as i8) as i32;
            hi += (q >> 4) as i32 * (xq[64 * h + 32 + l] as i8) as i32;
        }
        s[2 * h] * lo + s[2 * h + 1] * hi
    })
}

/// One superblock of ggml's two-accumulator repack rounding (q4_K, q2_K) into `(acc, accm)`:
/// its `N` exact integer sums of `scale · dot` (`dots`) and of `min · bsum` (`mins`), each
/// times `d · dx` and `dmin · dx` (`d`, `dmin` the block's f16 pair at `wb[dm..dm + 4]`, `dx`
/// the q8_K block's f32 scale), in `N` FMAs each (`quad`: the four-column kernel) or in one of
/// their sums (the one-column kernel).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn steps<const N: usize>(
    acc: &mut f32,
    accm: &mut f32,
    wb: &[u8],
    dm: usize,
    xb: &[u8],
    dots: [i32; N],
    mins: [i32; N],
    quad: bool,
) {
    let dx = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
    let d = f16_to_f32(u16::from_le_bytes([wb[dm], wb[dm + 1]])) * dx;
    let dmin = f16_to_f32(u16::from_le_bytes([wb[dm + 2], wb[dm + 3]])) * dx;
    if quad {
        for h in 0..N {
            *acc = (dots[h] as f32).mul_add(d, *acc);
            *accm = (mins[h] as f32).mul_add(dmin, *accm);
        }
    } else {
        *acc = (dots.iter().sum::<i32>() as f32).mul_add(d, *acc);
        *accm = (mins.iter().sum::<i32>() as f32).mul_add(dmin, *accm);
    }
}

/// The reference: one plain q4_K row (`k / 256` blocks) against one q8_K activation row, with
/// the rounding of ggml's four-column repack kernel (`quad`) or of its one-column kernel (see
/// the module's documentation).
pub fn vec_dot_ref(w: &[u8], x: &[u8], k: usize, quad: bool) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (wb, xb) in w
        .chunks_exact(BLOCK)
        .zip(x.chunks_exact(QBLOCK))
        .take(k / 256)
    {
        let (s, m) = scales_mins(&wb[4..16]);
        let dots = dot_pairs_scalar(&s, wb, xb);
        steps(
            &mut acc,
            &mut accm,
            wb,
            0,
            xb,
            dots,
            min_pairs(&m, xb),
            quad,
        );
    }
    acc - accm
}

/// Asserts that `g` holds eight rows of `k / 256` superblocks of `block` bytes and every `x`
/// `k / 256` q8_K blocks (`t`, `what`: the type and the entry point, for the message).
pub(super) fn check_superblocks(
    t: &str,
    block: usize,
    g: &[u8],
    x: &[&[u8]],
    k: usize,
    what: &str,
) {
    let nb = k / 256;
    assert!(
        k.is_multiple_of(256)
            && g.len() >= 8 * nb * block
            && x.iter().all(|x| x.len() >= nb * QBLOCK),
        "repack {t} {what}: k={k}, eight rows in {} bytes, activations of {:?} bytes",
        g.len(),
        x.iter().map(|x| x.len()).collect::<Vec<_>>()
    );
}

fn check(g: &[u8], x: &[&[u8]], k: usize, what: &str) {
    check_superblocks("q4_K", BLOCK, g, x, k, what);
}

/// Eight plain rows of `row` bytes (`g`, row after row) against `C` activation rows, in
/// scalar code: `out[c][r] = dot(row r, x[c])`.
pub(super) fn rows8_with<const C: usize>(
    g: &[u8],
    x: [&[u8]; C],
    row: usize,
    dot: impl Fn(&[u8], &[u8]) -> f32,
) -> [[f32; 8]; C] {
    let mut out = [[0f32; 8]; C];
    for r in 0..8 {
        for c in 0..C {
            out[c][r] = dot(&g[r * row..(r + 1) * row], x[c]);
        }
    }
    out
}

/// Eight plain q4_K rows (`g`, `8 × k / 256` blocks, row after row) against `C` q8_K
/// activation rows, in scalar code: `out[c][r]` as [`vec_dot_ref`] gives it with rounding
/// `quad`.
fn rows8_scalar<const C: usize>(g: &[u8], x: [&[u8]; C], k: usize, quad: bool) -> [[f32; 8]; C] {
    rows8_with(g, x, k / 256 * BLOCK, |w, x| vec_dot_ref(w, x, k, quad))
}

/// Whether the AVX2 kernels run for `isa`.
fn simd(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa != Isa::Scalar && super::qdot::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Eight plain q4_K rows against one activation row, with the one-column rounding (ggml's
/// `gemv`: mat-vec, and the columns after the last whole four); the 512-bit kernel where
/// `isa` is AVX-512 (F/BW/VL with VNNI, as every `Isa::Avx512` kernel takes it).
pub fn vec_dot8(isa: Isa, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    check(g, &[x], k, "vec_dot8");
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        // SAFETY: the CPU has AVX2, FMA and F16C (`simd`), AVX-512 F/BW/VL where `uses_vnni`
        // says so; g holds eight rows of k / 256 blocks and x k / 256 q8_K blocks (checked).
        return unsafe {
            if super::qdot::avx2::uses_vnni(isa) {
                return avx2::gemv8_512(g.as_ptr(), k / 256 * BLOCK, x.as_ptr(), k / 256);
            }
            avx2::gemv8(g.as_ptr(), k / 256 * BLOCK, x.as_ptr(), k / 256)
        };
    }
    let _ = isa;
    rows8_scalar::<1>(g, [x], k, false)[0]
}

/// Eight plain q4_K rows against four activation rows, with the four-column rounding (ggml's
/// `gemm`): `out[c][r]`. With AVX2 the rows are rearranged first ([`transpose8`], into a
/// buffer of its own; a mat-mat rearranges each group once into its thread's scratch and
/// calls [`vec_dot8x4_transposed`] for every four columns).
pub fn vec_dot8x4(isa: Isa, g: &[u8], x: [&[u8]; 4], k: usize) -> [[f32; 8]; 4] {
    check(g, &x, k, "vec_dot8x4");
    if has_transposed_kernel(isa) {
        let mut t = vec![0u8; transposed_bytes(k)];
        transpose8(g, k, &mut t);
        return vec_dot8x4_transposed(isa, &t, x, k);
    }
    rows8_scalar::<4>(g, x, k, true)
}

/// Bytes of one block of eight rows in [`transpose8`]'s layout: the rows' `d` and `dmin` as
/// f32 (64), per sub-block the rows' scales as i16 pairs (256), per sub-block pair the rows'
/// two mins as i16 pairs (128), per sub-block pair and four-byte chunk the eight rows' four
/// nibble bytes (1024).
pub const TBLOCK: usize = 1472;

/// Bytes [`transpose8`] writes for rows of `k` weights.
pub fn transposed_bytes(k: usize) -> usize {
    k / 256 * TBLOCK
}

/// Whether [`vec_dot8x4_transposed`] runs here (AVX2); else the caller keeps
/// [`vec_dot8x4`].
pub fn has_transposed_kernel(isa: Isa) -> bool {
    simd(isa)
}

/// Eight plain q4_K rows (`g`, `8 × k / 256` blocks) rearranged for
/// [`vec_dot8x4_transposed`], which keeps one row per lane, as ggml's `block_q4_Kx8`
/// kernels do (see [`TBLOCK`]); a mat-mat does it once per group for all its columns.
pub fn transpose8(g: &[u8], k: usize, out: &mut [u8]) {
    let nb = k / 256;
    let row = nb * BLOCK;
    assert!(
        k.is_multiple_of(256) && g.len() >= 8 * row && out.len() >= nb * TBLOCK,
        "repack q4_K transpose8: k={k}, {} bytes of rows, room for {}",
        g.len(),
        out.len()
    );
    for b in 0..nb {
        let o = &mut out[b * TBLOCK..(b + 1) * TBLOCK];
        for r in 0..8 {
            let wb = &g[r * row + b * BLOCK..r * row + (b + 1) * BLOCK];
            let d = f16_to_f32(u16::from_le_bytes([wb[0], wb[1]]));
            let dmin = f16_to_f32(u16::from_le_bytes([wb[2], wb[3]]));
            o[4 * r..4 * r + 4].copy_from_slice(&d.to_le_bytes());
            o[32 + 4 * r..36 + 4 * r].copy_from_slice(&dmin.to_le_bytes());
            let (sc, mn) = scales_mins(&wb[4..16]);
            for (sb, &v) in sc.iter().enumerate() {
                let at = 64 + 32 * sb + 4 * r;
                o[at..at + 2].copy_from_slice(&(v as i16).to_le_bytes());
                o[at + 2..at + 4].copy_from_slice(&(v as i16).to_le_bytes());
            }
            for h in 0..4 {
                let at = 320 + 32 * h + 4 * r;
                o[at..at + 2].copy_from_slice(&(mn[2 * h] as i16).to_le_bytes());
                o[at + 2..at + 4].copy_from_slice(&(mn[2 * h + 1] as i16).to_le_bytes());
            }
            for h in 0..4 {
                for j in 0..8 {
                    let at = 448 + 256 * h + 32 * j + 4 * r;
                    o[at..at + 4].copy_from_slice(&wb[16 + 32 * h + 4 * j..20 + 32 * h + 4 * j]);
                }
            }
        }
    }
}

/// [`vec_dot8x4`] from eight rows in [`transpose8`]'s layout (`t`), the same bits: each
/// (row, column) result with ggml's four-column rounding.
pub fn vec_dot8x4_transposed(isa: Isa, t: &[u8], x: [&[u8]; 4], k: usize) -> [[f32; 8]; 4] {
    let nb = k / 256;
    assert!(
        has_transposed_kernel(isa)
            && k.is_multiple_of(256)
            && t.len() >= nb * TBLOCK
            && x.iter().all(|x| x.len() >= nb * QBLOCK),
        "repack q4_K vec_dot8x4_transposed: {isa:?}, k={k}, {} transposed bytes",
        t.len()
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX2, FMA and F16C (`has_transposed_kernel`), AVX-512 F/BW/VL and
    // VNNI where `uses_vnni` says so; t holds nb transposed blocks and every x nb q8_K blocks
    // (asserted above).
    return unsafe {
        let (t, x) = (t.as_ptr(), x.map(|x| x.as_ptr()));
        if super::qdot::avx2::uses_vnni(isa) {
            avx2::gemm_transposed_vnni(t, x, nb)
        } else {
            avx2::gemm_transposed(t, x, nb)
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no transposed kernel off x86")
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, QBLOCK};

    /// The q8_K block's sixteen sums added in pairs (one per sub-block; each at most
    /// 2·16·127 in magnitude, so exact in i16).
    ///
    /// # Safety
    /// The CPU has AVX2; `xb` points at a whole q8_K block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bsum_pairs(xb: *const u8) -> __m128i {
        // SAFETY: the block's 32 bytes of sums (caller).
        let s = unsafe { _mm256_loadu_si256(xb.add(260) as *const __m256i) };
        _mm_hadd_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))
    }

    /// A block's eight six-bit scales and eight mins (ggml's q4_K unpacking with 32-bit
    /// masks, as its `vec_dot_q4_K_q8_K`), each as i16x8; the scales also in both 128-bit
    /// lanes of a 256-bit vector, for [`scale`].
    ///
    /// # Safety
    /// The CPU has AVX2; `wb` points at a whole q4_K block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales_mins16(wb: *const u8) -> (__m256i, __m128i) {
        // SAFETY: the block's 12 scale bytes (caller).
        let [u0, u1, u2] =
            [4, 8, 12].map(|o| unsafe { (wb.add(o) as *const u32).read_unaligned() });
        let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        let scales = (u0 & k1) as u64 | (((u2 & k2) | (((u0 >> 6) & k3) << 4)) as u64) << 32;
        let mins = (u1 & k1) as u64 | ((((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) as u64) << 32;
        let s16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64));
        (
            _mm256_broadcastsi128_si256(s16),
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)),
        )
    }

    /// Scale `j` (0..8) of [`scales_mins16`]'s vector in every i16 lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scale(s: __m256i, j: usize) -> __m256i {
        _mm256_shuffle_epi8(s, _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16))
    }

    /// One sub-block pair's `scale · Σ q·x` partial sums in eight i32 lanes: the low nibbles
    /// `lo` against `xl` times scale `sl`, the high ones against `xh` times `sh`
    /// (`vpmaddubsw`: nibble × byte pairs at most 2·15·127, no saturation; `vpmaddwd` by the
    /// scale, < 64: exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn pair(
        lo: __m256i,
        hi: __m256i,
        xl: __m256i,
        xh: __m256i,
        sl: __m256i,
        sh: __m256i,
    ) -> __m256i {
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl),
            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh),
        )
    }

    /// The sums of four vectors' eight lanes each, as four lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum4(v0: __m256i, v1: __m256i, v2: __m256i, v3: __m256i) -> __m128i {
        let ab = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
        _mm_add_epi32(_mm256_castsi256_si128(ab), _mm256_extracti128_si256(ab, 1))
    }

    /// The four sub-block pairs' nibbles of a block: (low, high) per pair.
    ///
    /// # Safety
    /// The CPU has AVX2; `wb` points at a whole q4_K block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles(wb: *const u8) -> [(__m256i, __m256i); 4] {
        let m4 = _mm256_set1_epi8(0x0F);
        std::array::from_fn(|h| {
            // SAFETY: inside the block's 128 nibble bytes (caller).
            let q = unsafe { _mm256_loadu_si256(wb.add(16 + 32 * h) as *const __m256i) };
            (
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
            )
        })
    }

    /// The end of a block in both mat-vec kernels: the eight rows' integer sums (`tot`: eight
    /// lanes a row, `mn`: four) each gathered into its row's lane by a tree of `vphaddd`, the
    /// rows' f16 `d` and `dmin` (`heads`) converted, and one FMA into `acc` with `d · dx` and
    /// one into `accm` with `dmin · dx`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn block_step(
        tot: &[__m256i; 8],
        mn: &[__m128i; 8],
        heads: &[u32; 8],
        dx: __m256,
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        // the eight (d, dmin) f16 pairs: d from the low halves, dmin from the high
        // SAFETY: `heads` is eight u32, 32 readable bytes.
        let hv = unsafe { _mm256_loadu_si256(heads.as_ptr() as *const __m256i) };
        let lo16 = _mm256_and_si256(hv, _mm256_set1_epi32(0xffff));
        let hi16 = _mm256_srli_epi32(hv, 16);
        let packed = _mm256_packus_epi32(lo16, hi16); // d0-3 dm0-3 | d4-7 dm4-7
        let packed = _mm256_permute4x64_epi64(packed, 0b11_01_10_00); // d0-7 | dm0-7
        let d = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
        let dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
        let isum = _mm256_set_m128i(
            sum4(tot[4], tot[5], tot[6], tot[7]),
            sum4(tot[0], tot[1], tot[2], tot[3]),
        );
        let msum = _mm256_set_m128i(
            _mm_hadd_epi32(_mm_hadd_epi32(mn[4], mn[5]), _mm_hadd_epi32(mn[6], mn[7])),
            _mm_hadd_epi32(_mm_hadd_epi32(mn[0], mn[1]), _mm_hadd_epi32(mn[2], mn[3])),
        );
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), *acc);
        *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx), *accm);
    }

    /// [`super::vec_dot8`] on AVX2, ggml's one-column rounding, the eight rows in the eight
    /// lanes: per block each row's integer sums (the column's activations loaded once for
    /// the eight rows), gathered into one vector by a tree of `vphaddd`, converted, and one
    /// FMA into `acc` with the rows' `d · dx`; the same for the mins into `accm`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `g` points at eight rows of `row` bytes (`nb` blocks
    /// each), `x` at `nb` q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gemv8(g: *const u8, row: usize, x: *const u8, nb: usize) -> [f32; 8] {
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for b in 0..nb {
            // SAFETY: block b of the eight rows and of x are readable (caller).
            unsafe {
                let xb = x.add(b * QBLOCK);
                let dx = _mm256_set1_ps((xb as *const f32).read_unaligned());
                let xv: [__m256i; 8] = std::array::from_fn(|i| {
                    _mm256_loadu_si256(xb.add(4 + 32 * i) as *const __m256i)
                });
                let bp = bsum_pairs(xb);
                let mut tot = [_mm256_setzero_si256(); 8];
                let mut mn = [_mm_setzero_si128(); 8];
                let mut heads = [0u32; 8];
                for r in 0..8 {
                    let wb = g.add(r * row + b * BLOCK);
                    // eight rows are eight streams: each row's lines PREFETCH bytes ahead
                    for line in [0, 64] {
                        _mm_prefetch(
                            wb.wrapping_add(super::PREFETCH + line) as *const i8,
                            _MM_HINT_T0,
                        );
                    }
                    let (s, m) = scales_mins16(wb);
                    let q = nibbles(wb);
                    let mut v = _mm256_setzero_si256();
                    for (h, &(lo, hi)) in q.iter().enumerate() {
                        let (sl, sh) = (scale(s, 2 * h), scale(s, 2 * h + 1));
                        v = _mm256_add_epi32(v, pair(lo, hi, xv[2 * h], xv[2 * h + 1], sl, sh));
                    }
                    tot[r] = v;
                    mn[r] = _mm_madd_epi16(m, bp);
                    heads[r] = (wb as *const u32).read_unaligned();
                }
                block_step(&tot, &mn, &heads, dx, &mut acc, &mut accm);
            }
        }
        let mut out = [0f32; 8];
        // SAFETY: out is eight f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, accm)) };
        out
    }

    /// `vpshufb` controls that spread a block's eight i16 scales (in every 128-bit lane) as
    /// two sub-blocks' scales per 512-bit vector: scale `a` in lanes 0 and 1, `b` in lanes 2
    /// and 3, for (a, b) = (0, 2), (1, 3), (4, 6), (5, 7).
    const SCALES512: [[u8; 64]; 4] = {
        let mut c = [[0u8; 64]; 4];
        let pairs = [(0, 2), (1, 3), (4, 6), (5, 7)];
        let mut j = 0;
        while j < 4 {
            let mut i = 0;
            while i < 64 {
                let s = if i < 32 { pairs[j].0 } else { pairs[j].1 };
                c[j][i] = (2 * s + (i & 1)) as u8;
                i += 1;
            }
            j += 1;
        }
        c
    };

    /// [`gemv8`] with 512-bit vectors (AVX-512 F/BW): the same integers and float operations,
    /// two sub-block pairs a vector. Per block the column's activations are arranged once
    /// for the eight rows as the nibbles fall in a 64-byte load (sub-blocks 0 and 2 against
    /// the low nibbles of bytes 0..64, 1 and 3 against their high nibbles, then 4, 6 and
    /// 5, 7), so each row's block takes two loads and four `vpmaddubsw` + `vpmaddwd`.
    ///
    /// # Safety
    /// As for [`gemv8`], and the CPU has AVX-512 F, BW and VL.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub unsafe fn gemv8_512(g: *const u8, row: usize, x: *const u8, nb: usize) -> [f32; 8] {
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        let m4 = _mm512_set1_epi8(0x0F);
        // SAFETY: SCALES512 holds four 64-byte controls.
        let ctl: [__m512i; 4] = std::array::from_fn(|j| unsafe {
            _mm512_loadu_si512(SCALES512[j].as_ptr() as *const _)
        });
        for b in 0..nb {
            // SAFETY: block b of the eight rows and of x are readable (caller).
            unsafe {
                let xb = x.add(b * QBLOCK);
                let dx = _mm256_set1_ps((xb as *const f32).read_unaligned());
                let half = |s: usize| _mm256_loadu_si256(xb.add(4 + 32 * s) as *const __m256i);
                let xv = [(0, 2), (1, 3), (4, 6), (5, 7)].map(|(a, c)| {
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(a)), half(c))
                });
                let bp = bsum_pairs(xb);
                let mut tot = [_mm256_setzero_si256(); 8];
                let mut mn = [_mm_setzero_si128(); 8];
                let mut heads = [0u32; 8];
                for r in 0..8 {
                    let wb = g.add(r * row + b * BLOCK);
                    for line in [0, 64] {
                        _mm_prefetch(
                            wb.wrapping_add(super::PREFETCH + line) as *const i8,
                            _MM_HINT_T0,
                        );
                    }
                    let (s, m) = scales_mins16(wb);
                    let sb = _mm512_broadcast_i32x4(_mm256_castsi256_si128(s));
                    let mut v = _mm512_setzero_si512();
                    for half in 0..2 {
                        let q = _mm512_loadu_si512(wb.add(16 + 64 * half) as *const _);
                        let lo = _mm512_and_si512(q, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                        for (k, n) in [(0, lo), (1, hi)] {
                            let j = 2 * half + k;
                            let sc = _mm512_shuffle_epi8(sb, ctl[j]);
                            v = _mm512_add_epi32(
                                v,
                                _mm512_madd_epi16(_mm512_maddubs_epi16(n, xv[j]), sc),
                            );
                        }
                    }
                    tot[r] = _mm256_add_epi32(
                        _mm512_castsi512_si256(v),
                        _mm512_extracti64x4_epi64::<1>(v),
                    );
                    mn[r] = _mm_madd_epi16(m, bp);
                    heads[r] = (wb as *const u32).read_unaligned();
                }
                block_step(&tot, &mn, &heads, dx, &mut acc, &mut accm);
            }
        }
        let mut out = [0f32; 8];
        // SAFETY: out is eight f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, accm)) };
        out
    }

    /// [`super::vec_dot8x4_transposed`] on AVX2: the eight rows in the lanes. Per block,
    /// sub-block pair and column: for each of the eight four-byte chunks the nibbles of the
    /// eight rows (one 32-byte load; low nibbles sub-block 2h, high 2h + 1) against the
    /// column's four bytes broadcast, `vpmaddubsw` into i16 per row (at most 16 products of
    /// 15·127 a lane: exact) and `vpmaddwd` by the rows' scales, which leaves each row's exact
    /// integer in its lane, so nothing is summed across lanes; the mins likewise by one
    /// `vpmaddwd` of the rows' min pairs and the column's two bsum pairs. Two columns a pass
    /// (AVX2's sixteen registers).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `t` points at `nb` blocks of `super::transpose8`'s
    /// layout, every `x` at `nb` q8_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gemm_transposed(t: *const u8, x: [*const u8; 4], nb: usize) -> [[f32; 8]; 4] {
        // SAFETY: forwarded.
        unsafe { gemm_transposed_in::<0, 2>(t, x, nb) }
    }

    /// [`gemm_transposed`] with AVX-512 VNNI: one `vpdpbusd` per chunk and column sums the
    /// row's four products into its i32 lane (the same integers), then `vpmulld` by the
    /// rows' scales; four columns a pass (32 registers).
    ///
    /// # Safety
    /// As for [`gemm_transposed`], and the CPU has AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn gemm_transposed_vnni(
        t: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [[f32; 8]; 4] {
        // SAFETY: forwarded.
        unsafe { gemm_transposed_in::<1, 4>(t, x, nb) }
    }

    /// The body of both: `V` 0 (AVX2) or 1 (AVX-512 VNNI), `CP` columns a pass (2 or 4).
    #[inline(always)]
    unsafe fn gemm_transposed_in<const V: u8, const CP: usize>(
        t: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [[f32; 8]; 4] {
        use super::super::qdot::avx2::dpbusd;
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut accm = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            // SAFETY: block b of t and of every x are readable (caller); V = 1 only in the
            // function compiled for AVX-512 VNNI.
            unsafe {
                let tb = t.add(b * super::TBLOCK);
                let xb = x.map(|x| x.add(b * QBLOCK));
                let d = _mm256_loadu_ps(tb as *const f32);
                let dmin = _mm256_loadu_ps(tb.add(32) as *const f32);
                // each column's bsum pairs, as four i32 of two i16 (pairs 2h, 2h + 1)
                // (column c's pair h at 4c + h)
                let mut bp = [0i32; 16];
                for (bp, &xb) in bp.chunks_exact_mut(4).zip(&xb) {
                    _mm_storeu_si128(bp.as_mut_ptr() as *mut __m128i, bsum_pairs(xb));
                }
                for h in 0..4 {
                    let scl = _mm256_loadu_si256(tb.add(64 + 64 * h) as *const __m256i);
                    let sch = _mm256_loadu_si256(tb.add(96 + 64 * h) as *const __m256i);
                    let mins = _mm256_loadu_si256(tb.add(320 + 32 * h) as *const __m256i);
                    let q = tb.add(448 + 256 * h);
                    for c0 in (0..4).step_by(CP) {
                        // per column of the pass: low-nibble and high-nibble sums (i16 pairs
                        // per row on AVX2, i32 per row with VNNI)
                        let mut s = [[_mm256_setzero_si256(); 2]; CP];
                        for j in 0..8 {
                            let v = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                            let lo = _mm256_and_si256(v, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                            for (i, s) in s.iter_mut().enumerate() {
                                let at = |off: usize| {
                                    _mm256_set1_epi32(
                                        (xb[c0 + i].add(4 + 64 * h + off + 4 * j) as *const i32)
                                            .read_unaligned(),
                                    )
                                };
                                if V != 0 {
                                    s[0] = dpbusd::<V>(s[0], lo, at(0));
                                    s[1] = dpbusd::<V>(s[1], hi, at(32));
                                } else {
                                    s[0] = _mm256_add_epi16(s[0], _mm256_maddubs_epi16(lo, at(0)));
                                    s[1] = _mm256_add_epi16(s[1], _mm256_maddubs_epi16(hi, at(32)));
                                }
                            }
                        }
                        for (i, s) in s.iter().enumerate() {
                            let c = c0 + i;
                            let isum = if V != 0 {
                                // the scale pairs' low halves: each row's scale as i32
                                let low = _mm256_set1_epi32(0xffff);
                                _mm256_add_epi32(
                                    _mm256_mullo_epi32(s[0], _mm256_and_si256(scl, low)),
                                    _mm256_mullo_epi32(s[1], _mm256_and_si256(sch, low)),
                                )
                            } else {
                                _mm256_add_epi32(
                                    _mm256_madd_epi16(s[0], scl),
                                    _mm256_madd_epi16(s[1], sch),
                                )
                            };
                            let dx = _mm256_set1_ps((xb[c] as *const f32).read_unaligned());
                            acc[c] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(isum),
                                _mm256_mul_ps(d, dx),
                                acc[c],
                            );
                            let m = _mm256_madd_epi16(mins, _mm256_set1_epi32(bp[4 * c + h]));
                            accm[c] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(m),
                                _mm256_mul_ps(dmin, dx),
                                accm[c],
                            );
                        }
                    }
                }
            }
        }
        let mut out = [[0f32; 8]; 4];
        for c in 0..4 {
            // SAFETY: out[c] is eight f32.
            unsafe { _mm256_storeu_ps(out[c].as_mut_ptr(), _mm256_sub_ps(acc[c], accm[c])) };
        }
        out
    }
}
