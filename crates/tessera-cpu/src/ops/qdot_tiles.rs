//! One weight row against four activation columns at once for the k-quants (q2_K, q3_K, q4_K,
//! q5_K, q6_K), iq4_xs and tq1_0: the weight-side integer work of a block (unpacking the nibbles
//! and high bits, looking up codebook values, decoding and shuffling the scales, tq1_0's base-3
//! digits) is done once and shared by the four columns.
//!
//! Each of the four results equals `qdot::vec_dot` for that column alone bit for bit: the
//! integer partial sums of a column land in the same 32-bit lanes as in the one-column AVX2
//! kernel (they are exact, so only the lane matters), and the float operations of a column (the
//! per-block `d`, `dmin`, the fused multiply-adds into its accumulators, the final horizontal
//! sums) are the same operations in the same order, just kept in four accumulators. Other ISAs
//! and types fall back to four calls of `qdot::vec_dot`.

use tessera::DType;

use crate::simd::Isa;

const QK_K: usize = 256;
/// Bytes of one q8_K block.
const Q8_K_SIZE: usize = 4 + QK_K + 2 * (QK_K / 16);

/// Weight types with a one-row, four-column kernel here.
pub fn supported(t: DType) -> bool {
    matches!(
        t,
        DType::Q2K
            | DType::Q3K
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::IQ4XS
            | DType::TQ1_0
    )
}

/// `qdot::vec_dot(isa, t, w, x[c], k)` for the four columns `x`.
///
/// Panics as `qdot::vec_dot` does: if `k` is not a multiple of `t`'s block size or a row is
/// shorter than `k` elements of its format.
pub fn vec_dot_1x4(isa: Isa, t: DType, w: &[u8], x: [&[u8]; 4], k: usize) -> [f32; 4] {
    if !supported(t) {
        return x.map(|c| super::qdot::vec_dot(isa, t, w, c, k));
    }
    let bs = t.block_size();
    assert!(
        k.is_multiple_of(bs),
        "qdot_tiles: {k} elements are not whole {t} blocks of {bs}"
    );
    let nb = k / bs;
    for c in &x {
        assert!(
            w.len() >= nb * t.type_size() && c.len() >= nb * Q8_K_SIZE,
            "qdot_tiles: rows of {} and {} bytes for {k} elements of {t}",
            w.len(),
            c.len()
        );
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available() {
        let xp = x.map(|c| c.as_ptr());
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); w holds at least nb
        // weight blocks and every column at least nb q8_K blocks (asserted above), which is all
        // the kernels read.
        return unsafe {
            if super::qdot::avx2::uses_vnni(isa) {
                avx2::tile_vnni(t, w.as_ptr(), xp, nb)
            } else if super::qdot::avx2::uses_avx_vnni(isa) {
                avx2::tile_avxvnni(t, w.as_ptr(), xp, nb)
            } else {
                avx2::tile(t, w.as_ptr(), xp, nb)
            }
        };
    }
    x.map(|c| super::qdot::vec_dot(isa, t, w, c, k))
}

#[cfg(target_arch = "x86_64")]
// the `unsafe` blocks around intrinsics date from a minimum Rust version before they were safe
#[allow(unused_unsafe)]
mod avx2 {
    //! Copies of `qdot`'s AVX2 helpers (identical arithmetic) and the four-column kernels.
    //! Every kernel reads `nb` blocks behind its pointers and nothing else; the caller
    //! guarantees they are there and that the CPU has AVX2, FMA and F16C.

    use std::arch::x86_64::*;

    // the helpers and tables the one-column kernels use, shared
    use crate::ops::qdot::avx2::{
        both_halves, f16, f32_le, hsum, iq4_values, load128, load256, pair_sums, q6k_codes, times9,
        top_trit, tq1_0_tail, SHUF_K4, SHUF_Q3K, SHUF_Q6K,
    };
    use crate::ops::qdot::q3k_scales;

    use super::{Q8_K_SIZE, QK_K};

    pub use crate::ops::qdot::avx2::available;

    /// One weight row against four columns, the kernel of type `t`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile(t: tessera::DType, w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { tile_in(t, w, x, nb) }
    }

    /// [`tile`] compiled for AVX-512 VNNI: the compiler folds each `vpmaddwd` of a scale and
    /// the `vpaddd` after it into one `vpdpwssd` (the same integers, so the same results).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile_vnni(
        t: tessera::DType,
        w: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { tile_in(t, w, x, nb) }
    }

    /// [`tile`] compiled for AVX-VNNI (the VEX `vpdpwssd`; the same results).
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn tile_avxvnni(
        t: tessera::DType,
        w: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { tile_in(t, w, x, nb) }
    }

    #[inline(always)]
    unsafe fn tile_in(t: tessera::DType, w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks of t at w and of q8_K at every x (caller).
        unsafe {
            match t {
                tessera::DType::Q2K => q2_k(w, x, nb),
                tessera::DType::Q3K => q3_k(w, x, nb),
                tessera::DType::Q4K => q4_k(w, x, nb),
                tessera::DType::Q5K => q5_k(w, x, nb),
                tessera::DType::Q6K => q6_k(w, x, nb),
                tessera::DType::IQ4XS => iq4_xs(w, x, nb),
                tessera::DType::TQ1_0 => tq1_0(w, x, nb),
                _ => unreachable!("checked by supported"),
            }
        }
    }

    /// tq1_0: a block's 256 base-3 digits (eight registers of 32, `qdot`'s groups) found once,
    /// then each column's products summed into the same eight i32 lanes as the one-column
    /// kernel's (16-bit sums, the activations' sums taken off, lanes added in pairs: exact, so
    /// any grouping gives the same integers) and scaled by the same float steps.
    #[inline(always)]
    unsafe fn tq1_0(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller).
        unsafe {
            let mut sumf = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 54);
                let q0 = load256(wb);
                let q1 = _mm256_add_epi8(q0, _mm256_add_epi8(q0, q0));
                let q2 = times9(q0);
                let q3 = times9(q1);
                let q4 = times9(q2);
                let [r01, r23, r45] = tq1_0_tail(wb);
                let mut v = [q0, q1, q2, q3, q4, r01, r23, r45];
                for q in v.iter_mut() {
                    *q = top_trit(*q);
                }
                let dw = f16(wb.add(52));
                for (c, acc) in sumf.iter_mut().enumerate() {
                    let xb = x[c].add(i * Q8_K_SIZE);
                    let q8 = xb.add(4);
                    let mut p = [_mm256_setzero_si256(); 8];
                    for (g, pg) in p.iter_mut().enumerate() {
                        *pg = _mm256_maddubs_epi16(v[g], load256(q8.add(32 * g)));
                    }
                    let s0 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), p[5]);
                    let s1 = _mm256_add_epi16(_mm256_add_epi16(p[2], p[3]), p[6]);
                    let s2 = _mm256_add_epi16(p[4], p[7]);
                    let s = _mm256_sub_epi16(s0, load256(xb.add(4 + QK_K)));
                    let s = _mm256_add_epi16(s, _mm256_add_epi16(s1, s2));
                    let d = _mm256_set1_ps(f32_le(xb) * dw);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(s)), d, *acc);
                }
            }
            let mut out = [0f32; 4];
            for (o, a) in out.iter_mut().zip(sumf) {
                *o = hsum(a);
            }
            out
        }
    }

    /// The 6-bit scales and mins of q4_K / q5_K (12 bytes at `s`) unpacked to 8 scales then 8
    /// mins as 16 u16 lanes (ggml's `utmp` shuffle, then `cvtepu8_epi16`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn k4_scales_mins(s: *const u8) -> __m256i {
        const M1: u32 = 0x3f3f_3f3f;
        const M2: u32 = 0x0f0f_0f0f;
        const M3: u32 = 0x0303_0303;
        // SAFETY: 12 readable bytes at s (caller).
        unsafe {
            let rd = |o: usize| (s.add(o) as *const u32).read_unaligned();
            let (u0, u1, u2) = (rd(0), rd(4), rd(8));
            let w0 = u0 & M1;
            let w1 = (u2 & M2) | (((u0 >> 6) & M3) << 4);
            let w2 = u1 & M1;
            let w3 = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
            _mm256_cvtepu8_epi16(_mm_set_epi32(w3 as i32, w2 as i32, w1 as i32, w0 as i32))
        }
    }

    /// A q8_K block's group sums added in pairs, one per 32 elements (8 i16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_group_sums(xb: *const u8) -> __m128i {
        // SAFETY: one q8_K block at xb (caller).
        unsafe {
            let bsums = load256(xb.add(4 + QK_K));
            _mm_hadd_epi16(
                _mm256_extracti128_si256::<0>(bsums),
                _mm256_extracti128_si256::<1>(bsums),
            )
        }
    }

    #[inline(always)]
    unsafe fn q4_k(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller); shuffle rows are < 8.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut acc_m = [_mm_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 144);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let (wd, wmin) = (f16(wb), f16(wb.add(2)));
                let sm = k4_scales_mins(wb.add(4));
                let mins = _mm256_extracti128_si256::<1>(sm);
                let mut d = [0f32; 4];
                for c in 0..4 {
                    let yd = f32_le(xb[c]);
                    d[c] = yd * wd;
                    let dmin = -yd * wmin;
                    let prod = _mm_madd_epi16(mins, q8_group_sums(xb[c]));
                    acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
                }
                let scales = both_halves::<0>(sm);
                let q4 = wb.add(16);
                let mut sumi = [_mm256_setzero_si256(); 4];
                for j in 0..QK_K / 64 {
                    let scale_l = _mm256_shuffle_epi8(scales, load256(SHUF_K4[2 * j].as_ptr()));
                    let scale_h = _mm256_shuffle_epi8(scales, load256(SHUF_K4[2 * j + 1].as_ptr()));
                    let bits = load256(q4.add(32 * j));
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 64 * j);
                        let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(lo, load256(q8)));
                        let ph = _mm256_madd_epi16(
                            scale_h,
                            _mm256_maddubs_epi16(hi, load256(q8.add(32))),
                        );
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
                    }
                }
                for c in 0..4 {
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_set1_ps(d[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                }
            }
            let mut out = [0f32; 4];
            for c in 0..4 {
                let m = acc_m[c];
                let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_add_ss(m, _mm_movehdup_ps(m));
                out[c] = hsum(acc[c]) + _mm_cvtss_f32(m);
            }
            out
        }
    }

    #[inline(always)]
    unsafe fn q5_k(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller); shuffle rows are < 8.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let zero = _mm_setzero_si128();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0f32; 4];
            for i in 0..nb {
                let wb = w.add(i * 176);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let (wd, wmin) = (f16(wb), f16(wb.add(2)));
                let sm = k4_scales_mins(wb.add(4));
                let mins = _mm256_extracti128_si256::<1>(sm);
                let mut d = [0f32; 4];
                for c in 0..4 {
                    let yd = f32_le(xb[c]);
                    d[c] = yd * wd;
                    let dmin = -yd * wmin;
                    let prod = _mm_madd_epi16(mins, q8_group_sums(xb[c]));
                    let total = _mm_hadd_epi32(_mm_hadd_epi32(prod, zero), zero);
                    // gcc fuses ggml's `summs += dmin * sum` (as qdot does)
                    summs[c] = dmin.mul_add(_mm_cvtsi128_si32(total) as f32, summs[c]);
                }
                let scales = both_halves::<0>(sm);
                let hbits = load256(wb.add(16));
                let mut hmask = _mm256_set1_epi8(1);
                let q5 = wb.add(48);
                let mut sumi = [_mm256_setzero_si256(); 4];
                for j in 0..QK_K / 64 {
                    let scale_0 = _mm256_shuffle_epi8(scales, load256(SHUF_K4[2 * j].as_ptr()));
                    let scale_1 = _mm256_shuffle_epi8(scales, load256(SHUF_K4[2 * j + 1].as_ptr()));
                    let bits = load256(q5.add(32 * j));
                    // the fifth bits of this pair of 32-element groups: bits 2j and 2j+1 of qh
                    let c0 = _mm_cvtsi32_si128(2 * j as i32);
                    let h0 = _mm256_srl_epi16(_mm256_and_si256(hbits, hmask), c0);
                    hmask = _mm256_slli_epi16::<1>(hmask);
                    let c1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                    let h1 = _mm256_srl_epi16(_mm256_and_si256(hbits, hmask), c1);
                    hmask = _mm256_slli_epi16::<1>(hmask);
                    let v0 =
                        _mm256_add_epi8(_mm256_and_si256(bits, m4), _mm256_slli_epi16::<4>(h0));
                    let lo4 = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let v1 = _mm256_add_epi8(lo4, _mm256_slli_epi16::<4>(h1));
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 64 * j);
                        let p0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(v0, load256(q8)));
                        let p1 = _mm256_madd_epi16(
                            scale_1,
                            _mm256_maddubs_epi16(v1, load256(q8.add(32))),
                        );
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p0, p1));
                    }
                }
                for c in 0..4 {
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_set1_ps(d[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                }
            }
            let mut out = [0f32; 4];
            for c in 0..4 {
                out[c] = hsum(acc[c]) + summs[c];
            }
            out
        }
    }

    #[inline(always)]
    unsafe fn q6_k(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller); shuffle rows are < 8.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 210);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let wd = f16(wb.add(208));
                let scales = load128(wb.add(192));
                let scales16 = _mm256_cvtepi8_epi16(scales);
                let mut sumi = [_mm256_setzero_si256(); 4];
                for h in 0..2 {
                    let (ql, qh) = (wb.add(64 * h), wb.add(128 + 32 * h));
                    let b1 = load256(ql);
                    let b2 = load256(ql.add(32));
                    let bh = load256(qh);
                    let v = q6k_codes(b1, b2, bh);
                    let mut sc = [_mm256_setzero_si256(); 4];
                    for s in 0..4 {
                        let row = load128(SHUF_Q6K[4 * h + s].as_ptr());
                        sc[s] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, row));
                    }
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 128 * h);
                        let mut p = [_mm256_setzero_si256(); 4];
                        for s in 0..4 {
                            let prod = _mm256_maddubs_epi16(v[s], load256(q8.add(32 * s)));
                            p[s] = _mm256_madd_epi16(sc[s], prod);
                        }
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[0], p[1]));
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p[2], p[3]));
                    }
                }
                for c in 0..4 {
                    let d = f32_le(xb[c]) * wd;
                    // 32·Σ scale·q8 over the block: the quants' -32 offset, taken out once
                    let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(
                        load256(xb[c].add(4 + QK_K)),
                        scales16,
                    ));
                    let s = _mm256_sub_epi32(sumi[c], offset);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[c]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }

    #[inline(always)]
    unsafe fn iq4_xs(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 136);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let mut sh = (wb.add(2) as *const u16).read_unaligned() as i32;
                let qs = wb.add(8);
                let mut sumi1 = [_mm256_setzero_si256(); 4];
                let mut sumi2 = [_mm256_setzero_si256(); 4];
                for ib in 0..QK_K / 64 {
                    // `mul_i8_pairs(v, y)` split: |v| once, y with v's sign per column
                    let v1 = iq4_values(qs.add(32 * ib));
                    let v2 = iq4_values(qs.add(32 * ib + 16));
                    let (a1, a2) = (_mm256_sign_epi8(v1, v1), _mm256_sign_epi8(v2, v2));
                    let sl = *wb.add(4 + ib) as i32;
                    let ls1 = ((sl & 15) | ((sh << 4) & 0x30)) - 32;
                    let ls2 = ((sl >> 4) | ((sh << 2) & 0x30)) - 32;
                    sh >>= 4;
                    let (l1, l2) = (_mm256_set1_epi16(ls1 as i16), _mm256_set1_epi16(ls2 as i16));
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 64 * ib);
                        let y1 = _mm256_sign_epi8(load256(q8), v1);
                        let y2 = _mm256_sign_epi8(load256(q8.add(32)), v2);
                        let s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(a1, y1), l1);
                        let s2 = _mm256_madd_epi16(_mm256_maddubs_epi16(a2, y2), l2);
                        sumi1[c] = _mm256_add_epi32(s1, sumi1[c]);
                        sumi2[c] = _mm256_add_epi32(s2, sumi2[c]);
                    }
                }
                let wd = f16(wb);
                for c in 0..4 {
                    let d = _mm256_set1_ps(wd * f32_le(xb[c]));
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1[c], sumi2[c]));
                    acc[c] = _mm256_fmadd_ps(d, s, acc[c]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }

    #[inline(always)]
    unsafe fn q3_k(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller); shuffle rows are < 4.
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let one = _mm256_set1_epi8(1);
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 110);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let wd = f16(wb.add(108));
                let [s0, s1, s2, s3] = q3k_scales(std::slice::from_raw_parts(wb.add(96), 12));
                let sc = _mm_set_epi32(s3 as i32, s2 as i32, s1 as i32, s0 as i32);
                let sc = _mm_sub_epi8(sc, _mm_set1_epi8(32));
                let all = _mm256_cvtepi8_epi16(sc);
                let scales = [both_halves::<0>(all), both_halves::<1>(all)];
                let hbits = load256(wb);
                let mut sumi = [_mm256_setzero_si256(); 4];
                let mut bit = 0;
                for (h, sc) in scales.into_iter().enumerate() {
                    let bits = load256(wb.add(32 + 32 * h));
                    let mut low = [_mm256_setzero_si256(); 4];
                    let mut high = [_mm256_setzero_si256(); 4];
                    let mut scs = [_mm256_setzero_si256(); 4];
                    for s in 0..4 {
                        let shift = _mm_cvtsi32_si128(2 * s as i32);
                        low[s] = _mm256_and_si256(_mm256_srl_epi16(bits, shift), m3);
                        // 4 where the high bit is clear, 0 where it is set: subtracted below
                        let count = _mm_cvtsi32_si128(bit);
                        let clear = _mm256_andnot_si256(hbits, _mm256_sll_epi16(one, count));
                        high[s] = _mm256_slli_epi16::<2>(_mm256_srl_epi16(clear, count));
                        bit += 1;
                        scs[s] = _mm256_shuffle_epi8(sc, load256(SHUF_Q3K[s].as_ptr()));
                    }
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 128 * h);
                        let mut p = [_mm256_setzero_si256(); 4];
                        for s in 0..4 {
                            let y = load256(q8.add(32 * s));
                            let sub = _mm256_maddubs_epi16(high[s], y);
                            let ps = _mm256_sub_epi16(_mm256_maddubs_epi16(low[s], y), sub);
                            p[s] = _mm256_madd_epi16(scs[s], ps);
                        }
                        let p01 = _mm256_add_epi32(p[0], p[1]);
                        let p23 = _mm256_add_epi32(p[2], p[3]);
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p01, p23));
                    }
                }
                for c in 0..4 {
                    let d = f32_le(xb[c]) * wd;
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }

    #[inline(always)]
    unsafe fn q2_k(w: *const u8, x: [*const u8; 4], nb: usize) -> [f32; 4] {
        // SAFETY: nb blocks behind w and every x[c] (caller); shuffle rows are < 4.
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(15);
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let wb = w.add(i * 84);
                let xb = x.map(|p| p.add(i * Q8_K_SIZE));
                let (wd, wmin) = (f16(wb.add(80)), f16(wb.add(82)));
                let packed = load128(wb);
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
                let mut d = [0f32; 4];
                for c in 0..4 {
                    let yd = f32_le(xb[c]);
                    d[c] = yd * wd;
                    let dmin = -yd * wmin;
                    // the mins against the group sums of the activations
                    let prod = _mm256_madd_epi16(mins, load256(xb[c].add(4 + QK_K)));
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc[c]);
                }
                let all = _mm256_cvtepi8_epi16(_mm_and_si128(packed, m4));
                let scales = [both_halves::<0>(all), both_halves::<1>(all)];
                let mut sumi = [_mm256_setzero_si256(); 4];
                for (h, sc) in scales.into_iter().enumerate() {
                    let bits = load256(wb.add(16 + 32 * h));
                    let mut q = [_mm256_setzero_si256(); 4];
                    let mut scs = [_mm256_setzero_si256(); 4];
                    for s in 0..4 {
                        let shift = _mm_cvtsi32_si128(2 * s as i32);
                        q[s] = _mm256_and_si256(_mm256_srl_epi16(bits, shift), m3);
                        scs[s] = _mm256_shuffle_epi8(sc, load256(SHUF_Q3K[s].as_ptr()));
                    }
                    for c in 0..4 {
                        let q8 = xb[c].add(4 + 128 * h);
                        let mut p = [_mm256_setzero_si256(); 4];
                        for s in 0..4 {
                            let prod = _mm256_maddubs_epi16(q[s], load256(q8.add(32 * s)));
                            p[s] = _mm256_madd_epi16(scs[s], prod);
                        }
                        let p01 = _mm256_add_epi32(p[0], p[1]);
                        let p23 = _mm256_add_epi32(p[2], p[3]);
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p01, p23));
                    }
                }
                for c in 0..4 {
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_set1_ps(d[c]), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }
}
