//! CPU kernels of the `softmax` family: soft_max / soft_max_ext (scale, optional f16 or f32 mask
//! broadcast over dims 2 and 3, ALiBi slopes from `max_bias`) and diag_mask_inf / diag_mask_zero.
//!
//! Work split: each thread takes a contiguous range of rows; a row is reduced by one thread in
//! a fixed order, so results do not depend on the thread count.
//!
//! soft_max, per row: `w = x·scale + slope·mask` (f32, FMA on AVX2) written to the destination,
//! its max, `e = exp(w - max)` in place with the row sum accumulated in **f64** (as ggml does),
//! then `e · (1/sum)` in f32. The ALiBi slope of head `i2` is computed in f64 exactly like the
//! core's reference (`alibi_slope`) and rounded once to f32.
//!
//! exp: the scalar path uses `f32::exp`; the AVX2 path uses [`avx2::exp8`], a Cody-Waite range
//! reduction (`x = n·ln2 + r`, ln2 split in two) and Cephes' degree-6 polynomial for `e^r` on
//! `|r| ≤ ln2/2`, scaled by `2^n` built in the exponent bits (with one extra factor of 2 when
//! `n = 128`). It returns 0 below -87.33654 (where the result would be subnormal), +inf above
//! 88.72283, and NaN for NaN. Measured against f64 `exp` over 2·10⁶ points of [-87.3, 88.7]:
//! max relative error 1.2e-7 (≈ 1 ulp; see the unit test `exp8_accuracy`). A whole soft_max
//! row is within 3e-7 of the reference (relative to the row's largest probability) on rows of
//! 1 to 5000 values; the tests allow 1e-6.
//!
//! diag_mask_inf / diag_mask_zero: a strided copy of each row's kept prefix and a fill of the
//! rest; the destination may be the source's memory (in place).

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let a = graph.tensor(t.src[0]);
    let base = a.dtype == DType::F32 && t.dtype == DType::F32 && t.is_contiguous() && a.ne == t.ne;
    match t.op {
        Op::SoftMax { .. } => {
            base && a.is_contiguous()
                && t.src.get(1).is_none_or(|&m| {
                    let m = graph.tensor(m);
                    matches!(m.dtype, DType::F16 | DType::F32)
                        && m.nb[0] == m.dtype.type_size()
                        && m.ne[0] == a.ne[0]
                        && m.ne[1] >= a.ne[1]
                })
        }
        Op::DiagMaskInf { .. } | Op::DiagMaskZero { .. } => base,
        _ => false,
    }
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::SoftMax { scale, max_bias } => soft_max(ctx, scale, max_bias),
        Op::DiagMaskInf { n_past } => diag_mask(ctx, n_past, f32::NEG_INFINITY),
        Op::DiagMaskZero { n_past } => diag_mask(ctx, n_past, 0.0),
        _ => Err(ctx.err("not a softmax or mask op")),
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// The ALiBi slope of head `h` of `n_head`, computed like the core's reference (in f64): with
/// `n = 2^floor(log2 n_head)`, `m0 = 2^(-max_bias/n)`, `m1 = 2^(-max_bias/2/n)`, head `h < n`
/// gets `m0^(h+1)`, the others `m1^(2(h-n)+1)`; 1 without ALiBi (`max_bias <= 0`).
pub(crate) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head = n_head.max(1);
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let max_bias = max_bias as f64;
    let m0 = 2f64.powf(-max_bias / n_log2 as f64);
    let m1 = 2f64.powf(-(max_bias / 2.0) / n_log2 as f64);
    let s = if h < n_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_log2) as i32 + 1)
    };
    s as f32
}

/// A mask row: its first element and whether it is f16 (else f32).
#[derive(Clone, Copy)]
pub(crate) struct MaskRow {
    pub ptr: *const u8,
    pub f16: bool,
}

impl MaskRow {
    /// Whether element `i` is `-inf`, read from its bits (no conversion).
    ///
    /// # Safety
    /// The row has more than `i` elements.
    #[inline(always)]
    pub unsafe fn neg_inf_bits(self, i: usize) -> bool {
        // SAFETY: caller's contract.
        unsafe {
            if self.f16 {
                (self.ptr as *const u16).add(i).read_unaligned() == 0xFC00
            } else {
                (self.ptr as *const u32).add(i).read_unaligned() == 0xFF80_0000
            }
        }
    }

    /// Whether elements `i..i + 16` are all `-inf` (their bits compared eight bytes at a time:
    /// a causal or multi-sequence mask row is mostly long runs of them).
    ///
    /// # Safety
    /// The row has at least `i + 16` elements.
    #[inline(always)]
    pub unsafe fn neg_inf_run16(self, i: usize) -> bool {
        // SAFETY: caller's contract: 32 (f16) or 64 (f32) readable bytes from element i.
        unsafe {
            let (p, words, pat) = if self.f16 {
                (self.ptr.add(2 * i), 4, 0xFC00_FC00_FC00_FC00u64)
            } else {
                (self.ptr.add(4 * i), 8, 0xFF80_0000_FF80_0000u64)
            };
            (0..words).all(|w| (p as *const u64).add(w).read_unaligned() == pat)
        }
    }

    /// Element `i` as f32.
    ///
    /// # Safety
    /// The row has more than `i` elements.
    #[inline(always)]
    pub unsafe fn at(self, i: usize) -> f32 {
        // SAFETY: caller's contract.
        unsafe {
            if self.f16 {
                half::f16::from_bits(*(self.ptr as *const u16).add(i)).to_f32()
            } else {
                *(self.ptr as *const f32).add(i)
            }
        }
    }
}

fn soft_max(ctx: &NodeCtx, scale: f32, max_bias: f32) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let ne = a.ne;
    let n = ne[0];
    if n == 0 {
        return Ok(());
    }
    let mask = if ctx.t.src.len() > 1 {
        Some(ctx.s(1))
    } else {
        None
    };
    let mut slope_of: Option<(usize, f32)> = None;
    for r in ctx.share(a.nrows()) {
        let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
        let slope = match slope_of {
            Some((h, s)) if h == i2 => s,
            _ => {
                let s = alibi_slope(max_bias, ne[2], i2);
                slope_of = Some((i2, s));
                s
            }
        };
        // SAFETY: spans validated by `exec::validate`: row (i1, i2, i3) of `a` (contiguous) and
        // of the destination hold `n` f32; mask row (i1, i2 % m2, i3 % m3) holds `n` values
        // (`handles` checked its row length and row count). The destination row is this
        // thread's alone; it is only accessed through raw pointers.
        unsafe {
            let x = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]) as *const f32;
            let y = ctx.dst.add(i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32;
            let m = mask.map(|m| MaskRow {
                ptr: ctx.src[1]
                    .add(i1 * m.nb[1] + (i2 % m.ne[2]) * m.nb[2] + (i3 % m.ne[3]) * m.nb[3]),
                f16: m.dtype == DType::F16,
            });
            softmax_row(ctx.isa, x, m, scale, slope, y, n);
        }
    }
    Ok(())
}

/// Softmax of `x·scale + slope·mask` over `n` values into `y` (which may equal `x`).
///
/// # Safety
/// `x` has `n` readable f32, the mask row `n` values, `y` `n` writable f32 (equal to `x` or
/// not overlapping it).
unsafe fn softmax_row(
    isa: Isa,
    x: *const f32,
    mask: Option<MaskRow>,
    scale: f32,
    slope: f32,
    y: *mut f32,
    n: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2, FMA and F16C; caller's contract.
        unsafe { avx2::softmax_row(x, mask, scale, slope, y, n) };
        return;
    }
    let _ = isa;
    // SAFETY: all indices are below n (caller's contract); x[i] is read before y[i] is written.
    unsafe {
        let mut max = f32::NEG_INFINITY;
        for i in 0..n {
            let mut w = *x.add(i) * scale;
            if let Some(m) = mask {
                w += slope * m.at(i);
            }
            *y.add(i) = w;
            max = max.max(w);
        }
        let mut sum = 0f64;
        for i in 0..n {
            let e = (*y.add(i) - max).exp();
            *y.add(i) = e;
            sum += e as f64;
        }
        let inv = (1.0 / sum) as f32;
        for i in 0..n {
            *y.add(i) *= inv;
        }
    }
}

fn diag_mask(ctx: &NodeCtx, n_past: usize, value: f32) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let ne = a.ne;
    let n = ne[0];
    for r in ctx.share(a.nrows()) {
        let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
        // elements i0 <= n_past + i1 are kept
        let keep = (n_past.saturating_add(i1).saturating_add(1)).min(n);
        // SAFETY: spans validated; the destination row (n contiguous f32) is this thread's
        // alone. In place, the source row is the destination row (same layout), which
        // `ptr::copy` (memmove) allows.
        unsafe {
            let src = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
            let y = ctx.dst.add(i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32;
            if a.nb[0] == 4 {
                std::ptr::copy(src as *const f32, y, keep);
            } else {
                for i in 0..keep {
                    *y.add(i) = *(src.add(i * a.nb[0]) as *const f32);
                }
            }
            for i in keep..n {
                *y.add(i) = value;
            }
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::MaskRow;
    use std::arch::x86_64::*;

    /// Lowest argument with a normal result; below it exp returns 0.
    const EXP_LO: f32 = -87.336_54;
    /// Above this exp returns +inf.
    const EXP_HI: f32 = 88.722_83;

    /// `e^x` for eight lanes (see the module docs for the method and its accuracy).
    #[inline(always)]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register arithmetic; the caller enabled AVX2 and FMA.
        unsafe {
            let xc = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
                _mm256_set1_ps(EXP_HI),
            );
            let n = _mm256_round_ps(
                _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            // r = x - n·ln2, ln2 = 0.693359375 - 2.12194440e-4 (Cephes)
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm256_set1_ps(1.987_569_1e-4);
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
            let r2 = _mm256_mul_ps(r, r);
            let mut e = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
            // n = 128 (x just below EXP_HI) does not fit the exponent: use 2·2^127
            let big = _mm256_cmp_ps(n, _mm256_set1_ps(127.5), _CMP_GT_OQ);
            let one = _mm256_set1_ps(1.0);
            let n = _mm256_sub_ps(n, _mm256_and_ps(big, one));
            e = _mm256_mul_ps(e, _mm256_add_ps(one, _mm256_and_ps(big, one)));
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                23,
            ));
            e = _mm256_mul_ps(e, pow2);
            // below range: 0; above: +inf; NaN stays NaN
            e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ), e);
            e = _mm256_blendv_ps(
                e,
                _mm256_set1_ps(f32::INFINITY),
                _mm256_cmp_ps(x, _mm256_set1_ps(EXP_HI), _CMP_GT_OQ),
            );
            _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
        }
    }

    #[inline(always)]
    pub unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
            _mm_cvtss_f32(m)
        }
    }

    #[inline(always)]
    pub unsafe fn hsum_pd(v: __m256d) -> f64 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
            _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
        }
    }

    /// Eight mask values at `i` as f32.
    #[inline(always)]
    pub unsafe fn load_mask8(m: MaskRow, i: usize) -> __m256 {
        // SAFETY: the caller guarantees 8 values at i; F16C enabled by the caller.
        unsafe {
            if m.f16 {
                _mm256_cvtph_ps(_mm_loadu_si128(
                    (m.ptr as *const u16).add(i) as *const __m128i
                ))
            } else {
                _mm256_loadu_ps((m.ptr as *const f32).add(i))
            }
        }
    }

    /// `exp` of the 8 values at `p`, in place; returns their sum in f64×4 added to `acc`.
    #[inline(always)]
    unsafe fn exp_store(p: *mut f32, max: __m256, acc: __m256d) -> __m256d {
        // SAFETY: 8 values at p (caller's contract).
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), max));
            _mm256_storeu_ps(p, e);
            let s = _mm256_add_pd(
                _mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)),
            );
            _mm256_add_pd(acc, s)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax_row(
        x: *const f32,
        mask: Option<MaskRow>,
        scale: f32,
        slope: f32,
        y: *mut f32,
        n: usize,
    ) {
        // SAFETY: every access is below n (caller's contract); x[i..i+8] is loaded before
        // y[i..i+8] is stored, so x == y is fine.
        unsafe {
            let sv = _mm256_set1_ps(scale);
            let slv = _mm256_set1_ps(slope);
            let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i + 8 <= n {
                let mut w = _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv);
                if let Some(m) = mask {
                    w = _mm256_fmadd_ps(slv, load_mask8(m, i), w);
                }
                _mm256_storeu_ps(y.add(i), w);
                vmax = _mm256_max_ps(vmax, w);
                i += 8;
            }
            let mut max = hmax(vmax);
            while i < n {
                let mut w = *x.add(i) * scale;
                if let Some(m) = mask {
                    w = slope.mul_add(m.at(i), w);
                }
                *y.add(i) = w;
                max = max.max(w);
                i += 1;
            }
            let mv = _mm256_set1_ps(max);
            let mut acc = _mm256_setzero_pd();
            let mut i = 0;
            while i + 8 <= n {
                acc = exp_store(y.add(i), mv, acc);
                i += 8;
            }
            if i < n {
                // the tail through a padded block, so it gets the same exp as the body
                let mut tail = [f32::NEG_INFINITY; 8];
                for (k, t) in tail.iter_mut().enumerate().take(n - i) {
                    *t = *y.add(i + k);
                }
                acc = exp_store(tail.as_mut_ptr(), mv, acc);
                for (k, t) in tail.iter().enumerate().take(n - i) {
                    *y.add(i + k) = *t;
                }
            }
            let sum = hsum_pd(acc);
            let inv = _mm256_set1_ps((1.0 / sum) as f32);
            let mut i = 0;
            while i + 8 <= n {
                _mm256_storeu_ps(y.add(i), _mm256_mul_ps(_mm256_loadu_ps(y.add(i)), inv));
                i += 8;
            }
            let inv = (1.0 / sum) as f32;
            while i < n {
                *y.add(i) *= inv;
                i += 1;
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::arch::x86_64::*;

    #[test]
    fn exp8_accuracy() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let (lo, hi) = (-87.3f64, 88.7f64);
        let n = 2_000_000usize;
        let mut worst = 0f64;
        let mut buf = [0f32; 8];
        for k in (0..n).step_by(8) {
            for (j, b) in buf.iter_mut().enumerate() {
                *b = (lo + (hi - lo) * (k + j) as f64 / n as f64) as f32;
            }
            let mut out = [0f32; 8];
            // SAFETY: the CPU has AVX2 and FMA (checked above); 8 floats in and out.
            unsafe {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn go(x: *const f32, y: *mut f32) {
                    // SAFETY: the caller's buffers hold 8 floats.
                    unsafe { _mm256_storeu_ps(y, super::avx2::exp8(_mm256_loadu_ps(x))) }
                }
                go(buf.as_ptr(), out.as_mut_ptr());
            }
            for j in 0..8 {
                let want = (buf[j] as f64).exp();
                let rel = (out[j] as f64 - want).abs() / want;
                worst = worst.max(rel);
            }
        }
        assert!(worst < 2.5e-7, "exp8 max relative error {worst:e}");
        // the edges
        let edge = [
            -1e30f32,
            -100.0,
            -87.4,
            0.0,
            88.8,
            1e30,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let mut out = [0f32; 8];
        // SAFETY: as above.
        unsafe {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn go(x: *const f32, y: *mut f32) {
                // SAFETY: the caller's buffers hold 8 floats.
                unsafe { _mm256_storeu_ps(y, super::avx2::exp8(_mm256_loadu_ps(x))) }
            }
            go(edge.as_ptr(), out.as_mut_ptr());
        }
        assert_eq!(&out[..4], &[0.0, 0.0, 0.0, 1.0]);
        assert_eq!(&out[4..7], &[f32::INFINITY, f32::INFINITY, 0.0]);
        assert!(out[7].is_nan());
        eprintln!("exp8 max relative error on [-87.3, 88.7]: {worst:e}");
    }
}
