//! CPU kernel of the `loss` family: cross_entropy_loss on f32 logits and labels with any
//! strides (f32 scalar result).
//!
//! Per row: `m = max(x)` (NaN skipped, like the reference's fold), `lse = ln Σ exp(x - m)`, and
//! the row's value `Σ y·(x - m) - lse·Σ y` (= `Σ y·(x - m - lse)`). Every sum is in f64; rows
//! are split across threads, each row's value goes to the work buffer, and thread 0 adds them in
//! row order after a barrier, so the result does not depend on the thread count.
//!
//! exp: the scalar path widens `x - m` to f64 and uses `f64::exp`; the AVX2 path uses a
//! vectorised f32 exp (Cephes' range reduction by ln 2 and degree-6 polynomial) on `x - m`,
//! whose measured error against f64 `exp` is 0.99 × `|e^x|·2^-23` at most on [-87, 10] (test
//! `avx2_exp_accuracy`). The summation in f64 makes the loss far more accurate than that: in
//! every case measured (rows of 17 to 32000 values, logits spread up to ±100) the f32 result
//! was the reference's value rounded to f32, on both paths; the tests allow 1e-5.

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::ops::reduce::row_offset;
use crate::simd::Isa;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if t.op != Op::CrossEntropyLoss || t.src.len() != 2 {
        return false;
    }
    let (x, y) = (graph.tensor(t.src[0]), graph.tensor(t.src[1]));
    x.dtype == DType::F32 && y.dtype == DType::F32 && x.ne == y.ne && t.dtype == DType::F32
}

/// Scratch bytes node `t` needs with `nth` threads: one f64 per row.
pub fn work_size(graph: &Graph, t: &Tensor, _nth: usize) -> usize {
    (graph.tensor(t.src[0]).nrows() * 8).next_multiple_of(64)
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (x, y) = (ctx.s(0), ctx.s(1));
    let need = work_size(ctx.graph, ctx.t, ctx.nth);
    if ctx.wsize < need {
        return Err(ctx.err(format!("work buffer of {} bytes, {need} needed", ctx.wsize)));
    }
    let n = x.ne[0];
    let nrows = x.nrows();
    let rows = ctx.wdata as *mut f64;
    let dense = (x.nb[0] == 4 && y.nb[0] == 4) || n <= 1;
    for r in ctx.share(nrows) {
        // SAFETY: row r of both sources holds n f32 at their strides (validated spans); slot
        // r of the work buffer (nrows f64, checked above) is this thread's.
        unsafe {
            let px = ctx.src[0].add(row_offset(x, r));
            let py = ctx.src[1].add(row_offset(y, r));
            *rows.add(r) = row_loss(ctx.isa, px, x.nb[0], py, y.nb[0], n, dense);
        }
    }
    ctx.barrier();
    if ctx.ith == 0 {
        let mut total = 0f64;
        for r in 0..nrows {
            // SAFETY: every slot was written before the barrier.
            total += unsafe { *rows.add(r) };
        }
        // SAFETY: the destination is one f32.
        unsafe { (ctx.dst as *mut f32).write_unaligned((-total / nrows as f64) as f32) };
    }
    Ok(())
}

/// `Σ y·log_softmax(x)` over one row.
///
/// # Safety
/// `px`, `py` hold `n` f32 at strides `sx`, `sy` bytes (both 4 when `dense`).
unsafe fn row_loss(
    isa: Isa,
    px: *const u8,
    sx: usize,
    py: *const u8,
    sy: usize,
    n: usize,
    dense: bool,
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if dense && crate::ops::reduce::use_avx2(isa) {
        // SAFETY: AVX2/FMA present; both rows dense.
        return unsafe { avx2::row_loss(px as *const f32, py as *const f32, n) };
    }
    let _ = (isa, dense);
    // SAFETY: every index is below n.
    unsafe {
        let ld = |p: *const u8, s: usize, i: usize| (p.add(i * s) as *const f32).read_unaligned();
        let mut m = f32::NEG_INFINITY;
        for i in 0..n {
            m = m.max(ld(px, sx, i));
        }
        let m = m as f64;
        let (mut se, mut sxy, mut sy_) = (0f64, 0f64, 0f64);
        for i in 0..n {
            let (xv, yv) = (ld(px, sx, i) as f64 - m, ld(py, sy, i) as f64);
            se += xv.exp();
            sxy += yv * xv;
            sy_ += yv;
        }
        sxy - se.ln() * sy_
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use crate::ops::reduce::avx2::{hmax_ps, hsum_pd};

    /// e^x for 8 lanes, x ≤ 88.38 (below -87.3 the result is flushed towards 0; NaN lanes are
    /// not preserved).
    ///
    /// # Safety
    /// AVX2 and FMA present.
    #[inline(always)]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register arithmetic, features enabled by the caller.
        unsafe {
            let x = _mm256_min_ps(x, _mm256_set1_ps(88.376_26));
            let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
            let fx = _mm256_round_ps(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
            let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm256_set1_ps(1.987_569_1e-4);
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
            let r2 = _mm256_mul_ps(r, r);
            p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
            // 2^fx, fx in [-126, 128]: split in two factors so that 2^128 and 2^-126 work
            let n = _mm256_cvtps_epi32(fx);
            let h = _mm256_srai_epi32(n, 1);
            let pow = |e: __m256i| {
                _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_add_epi32(e, _mm256_set1_epi32(127)),
                    23,
                ))
            };
            _mm256_mul_ps(_mm256_mul_ps(p, pow(h)), pow(_mm256_sub_epi32(n, h)))
        }
    }

    /// `Σ y·(x - m) - ln(Σ e^(x - m))·Σ y` over dense rows.
    ///
    /// # Safety
    /// AVX2/FMA present; `x`, `y` hold `n` f32.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row_loss(x: *const f32, y: *const f32, n: usize) -> f64 {
        // SAFETY: loads stay below n.
        unsafe {
            let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i + 8 <= n {
                acc = _mm256_max_ps(_mm256_loadu_ps(x.add(i)), acc);
                i += 8;
            }
            let mut m = hmax_ps(acc);
            for j in i..n {
                m = m.max(*x.add(j));
            }
            let mv = _mm256_set1_ps(m);
            let md = m as f64;
            let mdv = _mm256_set1_pd(md);
            let (mut se, mut sxy, mut sy) = (
                [_mm256_setzero_pd(); 2],
                [_mm256_setzero_pd(); 2],
                [_mm256_setzero_pd(); 2],
            );
            let mut i = 0;
            while i + 8 <= n {
                let xv = _mm256_loadu_ps(x.add(i));
                let yv = _mm256_loadu_ps(y.add(i));
                let e = exp8(_mm256_sub_ps(xv, mv));
                let halves = [
                    (
                        _mm256_castps256_ps128(e),
                        _mm256_castps256_ps128(xv),
                        _mm256_castps256_ps128(yv),
                    ),
                    (
                        _mm256_extractf128_ps(e, 1),
                        _mm256_extractf128_ps(xv, 1),
                        _mm256_extractf128_ps(yv, 1),
                    ),
                ];
                for (h, &(e4, x4, y4)) in halves.iter().enumerate() {
                    let yd = _mm256_cvtps_pd(y4);
                    let xd = _mm256_sub_pd(_mm256_cvtps_pd(x4), mdv);
                    se[h] = _mm256_add_pd(se[h], _mm256_cvtps_pd(e4));
                    sxy[h] = _mm256_fmadd_pd(yd, xd, sxy[h]);
                    sy[h] = _mm256_add_pd(sy[h], yd);
                }
                i += 8;
            }
            let mut se_s = hsum_pd(_mm256_add_pd(se[0], se[1]));
            let mut sxy_s = hsum_pd(_mm256_add_pd(sxy[0], sxy[1]));
            let mut sy_s = hsum_pd(_mm256_add_pd(sy[0], sy[1]));
            while i < n {
                let xv = *x.add(i) as f64 - md;
                let yv = *y.add(i) as f64;
                se_s += xv.exp();
                sxy_s += yv * xv;
                sy_s += yv;
                i += 1;
            }
            sxy_s - se_s.ln() * sy_s
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::arch::x86_64::*;

    /// The vectorised exp against f64 exp on [-87, 10]: within 2 × `|e^x|·2^-23` (measured 0.99).
    #[test]
    fn avx2_exp_accuracy() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run(v: &[f32; 8]) -> [f32; 8] {
            let mut out = [0f32; 8];
            // SAFETY: features checked by the caller; 8 values each.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr(),
                    super::avx2::exp8(_mm256_loadu_ps(v.as_ptr())),
                )
            };
            out
        }
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 10.0 {
            let v: [f32; 8] = std::array::from_fn(|k| x + k as f32 * 1.3e-3);
            // SAFETY: the features were detected above.
            let got = unsafe { run(&v) };
            for k in 0..8 {
                let want = (v[k] as f64).exp();
                let ulp = (want as f32).abs() * f32::EPSILON;
                let err = (got[k] as f64 - want).abs() / ulp as f64;
                worst = worst.max(err);
            }
            x += 0.0107;
        }
        println!("avx2 exp: worst error {worst:.3} ulp");
        assert!(worst <= 2.0, "worst {worst} ulp");
    }
}
