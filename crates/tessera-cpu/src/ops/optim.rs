//! CPU kernels of the `optim` family: opt_step_adamw and opt_step_sgd on f32 with any source
//! strides; the node's value is the updated parameter (contiguous f32), as in the reference.
//!
//! Arithmetic: ggml's, in f32 (`m' = m·β1 + g·(1-β1)`, `v' = v·β2 + g²·(1-β2)`,
//! `w' = w·(1 - α·wd) - α·(m'·β1h) / (sqrt(v'·β2h) + eps)`). The AVX2 path does the same
//! operations without fusing (correctly rounded mul, add, div and sqrt), so it gives the scalar
//! path's results bit for bit. Against the f64 reference the error is a few f32 ulps of the
//! terms (measured ≤ 3e-7 of the output's magnitude; the tests allow 1e-5).
//!
//! Work split: rows cut into segments of at most `SEG` values, so a long single-row parameter
//! is shared by every thread too.

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;

/// Most values per unit of work.
const SEG: usize = 4096;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let nsrc = match t.op {
        Op::OptStepAdamw => 5,
        Op::OptStepSgd => 3,
        _ => return false,
    };
    t.src.len() == nsrc
        && t.dtype == DType::F32
        && t.is_contiguous()
        && t.src.iter().all(|&s| graph.tensor(s).dtype == DType::F32)
        && t.src[..nsrc - 1]
            .iter()
            .all(|&s| graph.tensor(s).ne == t.ne)
}

/// Scratch bytes node `t` needs with `nth` threads (none).
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

#[derive(Clone, Copy)]
pub(crate) struct Hyper {
    alpha: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    beta1h: f32,
    beta2h: f32,
    keep: f32,
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let d = ctx.t;
    let adamw = match d.op {
        Op::OptStepAdamw => true,
        Op::OptStepSgd => false,
        _ => return Err(ctx.err("not an optimizer step")),
    };
    let hi = if adamw { 4 } else { 2 };
    let ht = ctx.s(hi);
    let want = if adamw { 7 } else { 2 };
    if ht.nelements() != want {
        return Err(ctx.err(format!(
            "{} hyper-parameters, {want} wanted",
            ht.nelements()
        )));
    }
    // the hyper-parameter tensor is a (possibly strided) vector-like tensor: read it in
    // logical order
    let mut h = [0f32; 7];
    for (k, v) in h.iter_mut().enumerate().take(want) {
        let [i0, i1, i2, i3] = tessera::shape::unravel(k, &ht.ne);
        let off = i0 * ht.nb[0] + i1 * ht.nb[1] + i2 * ht.nb[2] + i3 * ht.nb[3];
        // SAFETY: element k lies in the hyper-parameter tensor's validated span.
        *v = unsafe { (ctx.src[hi].add(off) as *const f32).read_unaligned() };
    }
    let hp = if adamw {
        Hyper {
            alpha: h[0],
            beta1: h[1],
            beta2: h[2],
            eps: h[3],
            beta1h: h[5],
            beta2h: h[6],
            keep: 1.0 - h[0] * h[4],
        }
    } else {
        Hyper {
            alpha: h[0],
            beta1: 0.0,
            beta2: 0.0,
            eps: 0.0,
            beta1h: 0.0,
            beta2h: 0.0,
            keep: 1.0 - h[0] * h[1],
        }
    };
    let n0 = d.ne[0];
    if n0 == 0 {
        return Ok(());
    }
    let segs = n0.div_ceil(SEG);
    let nsrc = if adamw { 4 } else { 2 };
    let dense = (0..nsrc).all(|k| ctx.s(k).nb[0] == 4) || n0 == 1;
    for u in ctx.share(d.nrows() * segs) {
        let (r, s) = (u / segs, u % segs);
        let (i0, i1) = (s * SEG, ((s + 1) * SEG).min(n0));
        let mut p = [std::ptr::null::<u8>(); 4];
        let mut nb0 = [4usize; 4];
        for k in 0..nsrc {
            let st = ctx.s(k);
            // SAFETY: row r, elements i0..i1 of source k lie inside its validated span.
            p[k] = unsafe { ctx.src[k].add(crate::ops::reduce::row_offset(st, r) + i0 * st.nb[0]) };
            nb0[k] = st.nb[0];
        }
        // SAFETY: destination row r is dense; elements i0..i1 are this thread's.
        let out = unsafe { ctx.dst.add(crate::ops::reduce::row_offset(d, r) + i0 * 4) } as *mut f32;
        let n = i1 - i0;
        #[cfg(target_arch = "x86_64")]
        if dense && crate::ops::reduce::use_avx2(ctx.isa) {
            // SAFETY: AVX2 present; every row dense with n values; `out` n writable f32.
            unsafe {
                if adamw {
                    avx2::adamw(hp, p.map(|q| q as *const f32), out, n);
                } else {
                    avx2::sgd(hp, p[0] as *const f32, p[1] as *const f32, out, n);
                }
            }
            continue;
        }
        let _ = dense;
        for i in 0..n {
            // SAFETY: i < n for every row (strides nb0).
            unsafe {
                let ld = |k: usize| (p[k].add(i * nb0[k]) as *const f32).read_unaligned();
                let (w, g) = (ld(0), ld(1));
                *out.add(i) = if adamw {
                    adamw_one(&hp, w, g, ld(2), ld(3))
                } else {
                    w * hp.keep - hp.alpha * g
                };
            }
        }
    }
    Ok(())
}

#[inline(always)]
fn adamw_one(h: &Hyper, w: f32, g: f32, m: f32, v: f32) -> f32 {
    let m = m * h.beta1 + g * (1.0 - h.beta1);
    let v = v * h.beta2 + g * g * (1.0 - h.beta2);
    let mh = m * h.beta1h;
    let vh = (v * h.beta2h).sqrt() + h.eps;
    w * h.keep - h.alpha * mh / vh
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Hyper;
    use std::arch::x86_64::*;

    /// AdamW over `n` dense values: `p` = [param, grad, m, v].
    ///
    /// # Safety
    /// AVX2 present; each `p[k]` holds `n` f32, `out` `n` writable f32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn adamw(h: Hyper, p: [*const f32; 4], out: *mut f32, n: usize) {
        // SAFETY: loads and stores stay below n.
        unsafe {
            let b1 = _mm256_set1_ps(h.beta1);
            let b1c = _mm256_set1_ps(1.0 - h.beta1);
            let b2 = _mm256_set1_ps(h.beta2);
            let b2c = _mm256_set1_ps(1.0 - h.beta2);
            let b1h = _mm256_set1_ps(h.beta1h);
            let b2h = _mm256_set1_ps(h.beta2h);
            let eps = _mm256_set1_ps(h.eps);
            let keep = _mm256_set1_ps(h.keep);
            let alpha = _mm256_set1_ps(h.alpha);
            let mut i = 0;
            while i + 8 <= n {
                let w = _mm256_loadu_ps(p[0].add(i));
                let g = _mm256_loadu_ps(p[1].add(i));
                let m = _mm256_loadu_ps(p[2].add(i));
                let v = _mm256_loadu_ps(p[3].add(i));
                let m = _mm256_add_ps(_mm256_mul_ps(m, b1), _mm256_mul_ps(g, b1c));
                let v = _mm256_add_ps(
                    _mm256_mul_ps(v, b2),
                    _mm256_mul_ps(_mm256_mul_ps(g, g), b2c),
                );
                let mh = _mm256_mul_ps(m, b1h);
                let vh = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(v, b2h)), eps);
                let r = _mm256_sub_ps(
                    _mm256_mul_ps(w, keep),
                    _mm256_div_ps(_mm256_mul_ps(alpha, mh), vh),
                );
                _mm256_storeu_ps(out.add(i), r);
                i += 8;
            }
            while i < n {
                *out.add(i) =
                    super::adamw_one(&h, *p[0].add(i), *p[1].add(i), *p[2].add(i), *p[3].add(i));
                i += 1;
            }
        }
    }

    /// SGD over `n` dense values.
    ///
    /// # Safety
    /// AVX2 present; `w`, `g` hold `n` f32, `out` `n` writable f32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sgd(h: Hyper, w: *const f32, g: *const f32, out: *mut f32, n: usize) {
        // SAFETY: loads and stores stay below n.
        unsafe {
            let keep = _mm256_set1_ps(h.keep);
            let alpha = _mm256_set1_ps(h.alpha);
            let mut i = 0;
            while i + 8 <= n {
                let r = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(w.add(i)), keep),
                    _mm256_mul_ps(alpha, _mm256_loadu_ps(g.add(i))),
                );
                _mm256_storeu_ps(out.add(i), r);
                i += 8;
            }
            while i < n {
                *out.add(i) = *w.add(i) * h.keep - h.alpha * *g.add(i);
                i += 1;
            }
        }
    }
}
